//! The preload library in real processes: a C program calling every
//! interposed function, and Python copying large buffers. Each runs plain and
//! with LD_PRELOAD; outputs must be identical, and the engine's exit report
//! must show it actually served the large blocks and copies.

use std::path::{Path, PathBuf};
use std::process::Command;

/// target/<profile>/libpagefold_preload.so, beside this test's deps/
/// directory. Cargo does not build a cdylib-only package's library before its
/// integration tests, so the test builds it (same profile, same target dir).
fn library() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    BUILT.call_once(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.args(["build", "-p", "pagefold-preload"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cargo.arg("--release");
        }
        cargo.env("CARGO_TARGET_DIR", dir.parent().unwrap());
        let st = cargo.current_dir(env!("CARGO_MANIFEST_DIR")).status().expect("running cargo");
        assert!(st.success(), "building the preload library failed");
    });
    let lib = dir.join("libpagefold_preload.so");
    assert!(lib.is_file(), "{} not built", lib.display());
    lib
}

fn run(cmd: &mut Command, preload: Option<(&Path, &Path)>) -> (String, i32) {
    if let Some((lib, report)) = preload {
        cmd.env("LD_PRELOAD", lib).env("PAGEFOLD_REPORT", report);
    }
    let out = cmd.output().expect("spawn");
    assert!(out.status.success(), "{:?} failed: {}", cmd, String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), out.status.code().unwrap_or(-1))
}

/// The engine reports left by processes that ran with the preload.
fn reports(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|s| serde_json::from_str(&s).ok())
        .collect()
}

fn total(reports: &[serde_json::Value], key: &str) -> u64 {
    reports.iter().map(|r| r["stats"][key].as_u64().unwrap_or(0)).sum()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagefold-preload-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn c_program_same_output_with_engine_serving_it() {
    let dir = scratch("c");
    let exe = dir.join("alloc_copy");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/alloc_copy.c");
    let cc = Command::new("cc").args(["-O1", "-fno-builtin", "-o"]).arg(&exe).arg(&src).status().expect("cc");
    assert!(cc.success());
    let (plain, _) = run(&mut Command::new(&exe), None);
    let lib = library();
    let (with, _) = run(&mut Command::new(&exe), Some((&lib, &dir.join("report"))));
    assert_eq!(plain, with, "output differs under the preload");
    let r = reports(&dir);
    assert_eq!(r.len(), 1, "one exit report expected: {r:?}");
    assert!(total(&r, "pages_shared_by_copy") > 0, "no copy was virtual: {r:?}");
    assert_eq!(total(&r, "blocks"), 0, "blocks leaked at exit: {r:?}");
}

#[test]
fn python_copies_become_virtual() {
    if Command::new("python3").arg("-c").arg("1").output().is_err() {
        eprintln!("python3 missing: skipped");
        return;
    }
    let dir = scratch("py");
    let script = "a = bytearray(16_000_000)\n\
                  for i in range(0, len(a), 4096): a[i] = i % 251\n\
                  b = [bytearray(a) for _ in range(6)]\n\
                  b[3][12345] = 7\n\
                  print(sum(x[12345] for x in b), sum(len(x) for x in b), a[4096 * 17])\n";
    let (plain, _) = run(Command::new("python3").args(["-c", script]), None);
    let lib = library();
    let (with, _) = run(Command::new("python3").args(["-c", script]), Some((&lib, &dir.join("report"))));
    assert_eq!(plain, with);
    let r = reports(&dir);
    assert!(total(&r, "pages_shared_by_copy") >= 5 * 3900, "{r:?}");
}
