//! Other people's test suites under `pagefold run`: a subset of numpy's own
//! tests, of CPython's regression tests and the examples of a few R
//! packages, each run plain and under
//! pagefold by the scripts in bench/compat/ (docs/COMPAT.md has the full
//! runs). Fails if pagefold adds a failing test, a failing package or a
//! difference in the R examples' output.
//!
//! Python 3 with numpy, pytest and hypothesis, and R (Rscript) are required:
//! `.ci/run` installs them. When they are missing the tests fail and say what
//! to install; they never skip silently. `PAGEFOLD_COMPAT_SKIP=1` skips them
//! explicitly (printed), for a machine where that is intended.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The numpy test modules run by CI: array creation and copies (`np.array`,
/// `astype`, `copyto`), numeric basics, take/put, indexing, einsum, records,
/// memmap, memory overlap (memmove), threads working on shared arrays,
/// function_base and shape_base (concatenate, stack, split), and a fork
/// (multiprocessing): about 3,800
/// tests, under a minute plain and one to two under pagefold on a 2-core
/// machine. test_multiarray (the natural pick) takes 4-5 times as long under
/// pagefold as plain: it runs in the full suite (docs/COMPAT.md).
const NUMPY_SUBSET: &[&str] = &[
    "numpy._core.tests.test_api",
    "numpy._core.tests.test_numeric",
    "numpy._core.tests.test_item_selection",
    "numpy._core.tests.test_indexing",
    "numpy._core.tests.test_einsum",
    "numpy._core.tests.test_records",
    "numpy._core.tests.test_memmap",
    "numpy._core.tests.test_mem_overlap",
    "numpy._core.tests.test_multithreading",
    "numpy.lib.tests.test_function_base",
    "numpy.lib.tests.test_shape_base",
    // Forks (ProcessPoolExecutor). R's parallel examples are the sharper
    // fork check: other atfork handlers copy through the preload while the
    // engine's prepare handler holds its lock, which must not deadlock.
    // This module covers forks from Python.
    "numpy._core.tests.test_multiprocessing",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The pagefold binary of this build, with libpagefold_preload.so beside it
/// (where `pagefold run` looks for it), built for this test (see pagefold-testkit).
fn pagefold() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pagefold"));
    pagefold_testkit::build_into(
        bin.parent().unwrap(),
        &["pagefold-preload"],
        &["libpagefold_preload.so"],
    );
    bin
}

fn skipped(what: &str) -> bool {
    if std::env::var_os("PAGEFOLD_COMPAT_SKIP").is_some_and(|v| v == "1") {
        eprintln!("compat: {what} SKIPPED because PAGEFOLD_COMPAT_SKIP=1");
        return true;
    }
    false
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagefold-compat-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs a bench/compat script; its report is printed, and on failure also
/// where the logs are.
fn run_script(script: &str, args: &[&str], out: &Path) {
    let path = repo().join("bench/compat").join(script);
    let output = Command::new("bash")
        .arg(&path)
        .arg("--out")
        .arg(out)
        .args(args)
        .env("PAGEFOLD", pagefold())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path.display()));
    report_script(script, &output, out);
}

/// Prints a bench/compat script's report; panics unless it passed (logs kept).
fn report_script(script: &str, output: &std::process::Output, out: &Path) {
    let text = String::from_utf8_lossy(&output.stdout);
    println!("{text}");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    match output.status.code() {
        Some(0) => {
            let _ = std::fs::remove_dir_all(out);
        }
        Some(1) => panic!("{script}: pagefold adds failures or differences (logs and outputs kept in {}):\n{text}", out.display()),
        c => panic!("{script} could not complete (exit {c:?}; logs in {}):\n{text}", out.display()),
    }
}

#[test]
fn numpy_test_subset_under_pagefold_adds_no_failure() {
    if skipped("numpy subset") {
        return;
    }
    let probe = Command::new("python3")
        .args(["-c", "import numpy, pytest, hypothesis"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "python3 lacks numpy, pytest or hypothesis: install them with \
             `python3 -m pip install numpy pytest hypothesis` (.ci/run does):\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("python3 not found ({e}): install Python 3 with numpy, pytest and hypothesis (.ci/run does)"),
    }
    // A hang (a deadlock under pagefold) ends the run and fails the test.
    let mut args = vec!["--timeout", "900", "--pyargs"];
    args.extend_from_slice(NUMPY_SUBSET);
    run_script("numpy_suite.sh", &args, &scratch("numpy"));
}

#[test]
fn r_examples_subset_under_pagefold_add_no_failure_or_difference() {
    if skipped("R examples subset") {
        return;
    }
    match Command::new("Rscript")
        .args(["-e", "invisible(0)"])
        .output()
    {
        Ok(o) if o.status.success() => {}
        r => panic!(
            "Rscript not found or not working ({:?}): install R with \
             `apt-get install r-base-core r-recommended` (.ci/run does)",
            r.map(|o| o.status)
        ),
    }
    if !Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        panic!("python3 not found: bench/compat/r_examples.sh uses it to compare outputs (.ci/run installs it)");
    }
    run_script(
        "r_examples.sh",
        &["--timeout", "300", "--fast"],
        &scratch("r"),
    );
}

/// CPython's regression tests that exercise what the engine must stay out of
/// the way of: descriptors passed to and closed in children (test_subprocess,
/// test_os), mappings and buffers (test_mmap, test_array, test_memoryview,
/// test_bytes), fork and threads (test_fork1, test_threading).
const CPYTHON_SUBSET: &[&str] = &[
    "test_subprocess",
    "test_os",
    "test_mmap",
    "test_array",
    "test_memoryview",
    "test_bytes",
    "test_fork1",
    "test_threading",
];

#[test]
fn cpython_test_subset_under_pagefold_adds_no_failure() {
    if skipped("CPython subset") {
        return;
    }
    match Command::new("python3")
        .args([
            "-c",
            "import importlib.util as u; assert u.find_spec('test.test_subprocess')",
        ])
        .output()
    {
        Ok(o) if o.status.success() => {}
        r => panic!(
            "python3 has no regression tests ({:?}): install them (Debian: \
             `apt-get install libpython3.X-testsuite`; .ci/run does)",
            r.map(|o| o.status)
        ),
    }
    let mut args = vec!["--timeout", "1200", "--", "-j2", "--timeout", "300"];
    args.extend_from_slice(CPYTHON_SUBSET);
    let out = scratch("cpython");
    let path = repo().join("bench/compat/cpython_suite.sh");
    let output = Command::new("bash")
        .arg(&path)
        .arg("--out")
        .arg(&out)
        .args(&args)
        .env("PAGEFOLD", pagefold())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", path.display()));
    report_script("cpython_suite.sh", &output, &out);
}
