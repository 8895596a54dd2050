//! The Python package as a user without Rust gets it: the wheel maturin
//! builds from this checkout (the `pagefold` command with the preload
//! library inside), built once, then installed with pip, with its `dask`
//! extra (dask[array,distributed]), into a fresh virtualenv on a PATH
//! without cargo or rustc, where python/tests run with pytest: the command,
//! `python -m pagefold`, the Python API, a notebook executed by nbclient on
//! the Jupyter kernel `python -m pagefold kernel install` registers, and
//! pagefold.dask on a LocalCluster of two worker processes.
//!
//! Needs python3 with venv and pip, and PyPI (maturin, pytest, ipykernel,
//! nbclient, nbformat, dask and its dependencies are installed into the
//! virtualenv). Cargo builds into
//! this workspace's target directory, so only what the wheel adds is built.
//! `PAGEFOLD_PYTHON_SKIP=1` skips it explicitly (printed).

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

#[test]
fn pip_install_then_command_api_and_jupyter_kernel() {
    if std::env::var_os("PAGEFOLD_PYTHON_SKIP").is_some_and(|v| v == "1") {
        eprintln!("python package test SKIPPED because PAGEFOLD_PYTHON_SKIP=1");
        return;
    }
    let target = pagefold_testkit::profile_dir()
        .parent()
        .expect("target dir")
        .to_path_buf();
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pagefold-venv");
    let _ = std::fs::remove_dir_all(&venv);
    run(
        "creating a virtualenv",
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
    );
    let py = venv.join("bin/python");
    run(
        "installing the test tools",
        Command::new(&py).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "pytest",
            "ipykernel",
            "jupyter_client",
            "nbclient",
            "nbformat",
        ]),
    );
    // The wheel maturin builds (what `maturin build --release` makes), built
    // with cargo at hand; then installed, and used, as a user without Rust does.
    let pip = |args: &[&str]| {
        let mut c = Command::new(&py);
        c.args([
            "-m",
            "pip",
            args[0],
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(&args[1..])
        .env("CARGO_TARGET_DIR", &target);
        c
    };
    let wheels = venv.join("wheels");
    run(
        "building the wheel",
        pip(&["wheel", "--no-deps", "--wheel-dir"])
            .arg(&wheels)
            .arg(repo()),
    );
    let wheel = std::fs::read_dir(&wheels)
        .expect("wheel directory")
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("a .whl file");
    let no_rust = path_without_rust();
    let with_dask_extra = format!("{}[dask]", wheel.display());
    run(
        "pip install of the wheel (with the dask extra) without Rust",
        pip(&["install"])
            .arg(&with_dask_extra)
            .env("PATH", &no_rust)
            .env_remove("CARGO_TARGET_DIR"),
    );
    // Outside the checkout, so `import pagefold` finds the installed package.
    let out = Command::new(&py)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs"])
        .arg(repo().join("python/tests"))
        .current_dir(&venv)
        // As a user's shell has it: no library path cargo set for its tests.
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .env_remove("PAGEFOLD_PRELOAD")
        .env("PATH", &no_rust)
        .output()
        .expect("running pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    match out.status.code() {
        Some(0) => assert!(!text.contains(" skipped"), "a test was skipped:\n{text}"),
        Some(5) => panic!("pytest collected no tests:\n{text}"),
        c => panic!("pytest failed ({c:?}):\n{text}"),
    }
}

/// This process's PATH without the directories that hold cargo or rustc
/// (the virtualenv's Python is run by its full path).
fn path_without_rust() -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|d| !d.join("cargo").exists() && !d.join("rustc").exists())
        .collect();
    std::env::join_paths(kept).expect("a PATH")
}
