//! Compiles tests/c/test_capi.c against include/pagefold.h and the library
//! cargo built for this package (the cdylib, and the staticlib), runs it, and
//! fails if the C program fails.
//!
//! Cargo builds the package's library (all its crate types in one rustc run)
//! before its integration tests, so `libpagefold.so` and `libpagefold.a` exist
//! by now; they sit next to this test binary's directory (target/<profile>/deps
//! and target/<profile>).

use std::path::{Path, PathBuf};
use std::process::Command;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding `file`: beside this test (deps/ and its parent), then
/// $CARGO_TARGET_DIR/debug, then the workspace's target/debug.
fn find_lib(file: &str) -> PathBuf {
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(deps) = exe.parent() {
            dirs.push(deps.to_path_buf());
            if let Some(profile) = deps.parent() {
                dirs.push(profile.to_path_buf());
            }
        }
    }
    if let Ok(t) = std::env::var("CARGO_TARGET_DIR") {
        dirs.push(Path::new(&t).join("debug"));
    }
    dirs.push(manifest_dir().join("../../target/debug"));
    for d in &dirs {
        if d.join(file).is_file() {
            return d.canonicalize().unwrap();
        }
    }
    panic!("{file} not found in {dirs:?}: build the package first (cargo build -p pagefold-capi)");
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pagefold-capi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn compile(args: &[&std::ffi::OsStr], exe: &Path) {
    let src = manifest_dir().join("tests/c/test_capi.c");
    let inc = manifest_dir().join("include");
    let out = Command::new(cc())
        .args([
            "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-g", "-pthread",
        ])
        .arg("-I")
        .arg(&inc)
        .arg(&src)
        .arg("-o")
        .arg(exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", cc()));
    assert!(
        out.status.success(),
        "compiling test_capi.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn run(exe: &Path) {
    // Without cargo's LD_LIBRARY_PATH: the rpath alone must find the library.
    let out = Command::new(exe)
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "test_capi failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("checks passed"),
        "test_capi did not finish:\n{stdout}"
    );
}

#[test]
fn c_program_against_shared_library() {
    let dir = find_lib("libpagefold.so");
    let exe = scratch("shared").join("test_capi");
    let rpath = format!("-Wl,-rpath,{}", dir.display());
    compile(
        &[
            "-L".as_ref(),
            dir.as_os_str(),
            "-lpagefold".as_ref(),
            rpath.as_ref(),
        ],
        &exe,
    );
    // The program must use this library, not another one on the system.
    let ldd = Command::new("ldd")
        .arg(&exe)
        .env_remove("LD_LIBRARY_PATH")
        .output();
    if let Ok(ldd) = ldd {
        let text = String::from_utf8_lossy(&ldd.stdout);
        assert!(
            text.contains(&dir.join("libpagefold.so").display().to_string()),
            "ldd:\n{text}"
        );
    }
    run(&exe);
    let _ = std::fs::remove_dir_all(exe.parent().unwrap());
}

#[test]
fn c_program_against_static_library() {
    let lib = find_lib("libpagefold.a").join("libpagefold.a");
    let exe = scratch("static").join("test_capi");
    let libs = [
        "-lgcc_s",
        "-lutil",
        "-lrt",
        "-lpthread",
        "-lm",
        "-ldl",
        "-lc",
    ];
    let mut args: Vec<&std::ffi::OsStr> = vec![lib.as_os_str()];
    args.extend(libs.iter().map(std::ffi::OsStr::new));
    compile(&args, &exe);
    run(&exe);
    let _ = std::fs::remove_dir_all(exe.parent().unwrap());
}
