//! `pagefold run --memory`: a bad size is refused in one line; a Python
//! job larger than its memory cgroup's limit runs to the end under
//! pressure-driven tiering (compressed as usage nears the limit, every byte
//! read back as written); without a limit tiering makes no clock pass.

#[allow(dead_code)]
mod common;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// Fills N blocks of MiB each with compressible pages, distinct per page,
/// pausing after each; then checks every page, one block at a time with a
/// pause after each, so pages compressed earlier are restored a block at a
/// time. Prints the number of wrong pages; exits 1 if any.
const FILL: &str = r#"
import sys, time
PAGE = 4096
n, mib, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
pages = mib * 256
def page(b, i):
    head = b'block %d page %08d ' % (b, i)
    return (head * (PAGE // len(head) + 1))[:PAGE]
blocks = []
for b in range(n):
    a = bytearray(pages * PAGE)
    for i in range(pages):
        a[i*PAGE:(i+1)*PAGE] = page(b, i)
    blocks.append(a)
    time.sleep(pause)
bad = 0
for b, a in enumerate(blocks):
    bad += sum(a[i*PAGE:(i+1)*PAGE] != page(b, i) for i in range(pages))
    time.sleep(pause)
print("bad pages", bad)
sys.exit(1 if bad else 0)
"#;

fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    std::fs::write(dir.join("fill.py"), FILL).unwrap();
    Command::new(common::pagefold())
        .arg("run")
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .output()
        .unwrap()
}

/// The engine's statistics summed over the run's processes.
fn engine(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stderr);
    let doc: Value = serde_json::from_str(&text[text.find('{').expect("a report")..]).unwrap();
    doc["runs"][0]["engine_total"].clone()
}

#[test]
fn a_bad_memory_size_is_refused_in_one_line() {
    let dir = common::scratch("pressure-junk");
    for (args, env) in [
        (&["--memory", "junk"][..], &[][..]),
        (&["--memory", "12Q"][..], &[][..]),
        (&[][..], &[("PAGEFOLD_MEMORY", "lots")][..]),
    ] {
        let mut all = args.to_vec();
        all.extend(["--", "true"]);
        let out = run(&dir, &all, env);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("pagefold run: ") && !err.contains("panicked"),
            "{err}"
        );
    }
}

#[test]
fn without_a_limit_tiering_makes_no_pass() {
    let dir = common::scratch("pressure-idle");
    let out = run(
        &dir,
        &["--json", "--", "python3", "fill.py", "2", "40", "0.6"],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("bad pages 0"));
    let e = engine(&out);
    assert!(e["scans"].as_u64().unwrap_or(0) > 0, "the engine ran: {e}");
    assert_eq!(e["clock"]["passes"].as_u64().unwrap_or(0), 0, "{e}");
    assert_eq!(e["clock"]["total"]["evicted"].as_u64().unwrap_or(0), 0);
}

/// 5 blocks of 34 MiB (over glibc's largest mmap threshold, so the
/// engine's) and the interpreter: about 180 MiB in a group of 160 MiB
/// without swap, which plain Python does not survive. Passes run in the
/// background and lag behind a job that writes faster than they compress
/// (more so on a machine loaded by builds), so the job pauses 3 s after each
/// block.
#[test]
fn a_job_over_its_cgroup_limit_runs_compressed_and_reads_back_right() {
    if let Err(why) = pagefold_bench::cgroup::check_available() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = common::scratch("pressure-limit");
    let out = run(
        &dir,
        &[
            "--json", "--memory", "160M", "--", "python3", "fill.py", "5", "34", "3",
        ],
        // As on a machine without swap (a swap file another test made may
        // be active): passes are all that keeps the job alive.
        &[
            ("PAGEFOLD_CLOCK_MS", "200"),
            ("PAGEFOLD_INJECT_SWAP_FREE_MB", "0"),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("bad pages 0"));
    let e = engine(&out);
    let clock = &e["clock"];
    assert!(clock["pressure_passes"].as_u64().unwrap_or(0) > 0, "{e}");
    assert!(
        clock["total"]["evicted"].as_u64().unwrap_or(0) > 8704,
        "more than a block compressed: {e}"
    );
    assert_eq!(clock["pressure"]["limit"].as_u64(), Some(160 << 20), "{e}");
}
