//! The preload library in real processes. Each program (C under tests/c,
//! Python under tests/py) runs plain and with LD_PRELOAD; its output must be
//! identical, and the engine's exit report (PAGEFOLD_REPORT) must show that
//! the mechanism under test really engaged — or, for a fallback, that it was
//! really off. The C programs check the engine's counters themselves too,
//! mid-run, through the preload's `pagefold_stat` (found with dlsym).
//!
//! The background scanner runs every 1-2 ms at a full core's budget, so
//! scans happen during copies, system calls, signals and forks.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

/// target/<profile>/libpagefold_preload.so, built for this test (see pagefold-testkit).
fn library() -> PathBuf {
    pagefold_testkit::build_into(
        &pagefold_testkit::profile_dir(),
        &["pagefold-preload"],
        &["libpagefold_preload.so"],
    )
    .join("libpagefold_preload.so")
}

/// tests/c/NAME.c compiled (once per test run) into the target's tmp dir.
fn c_program(name: &str) -> PathBuf {
    static BUILT: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("pagefold-preload-{name}"));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if built
        .get_or_insert_with(HashSet::new)
        .insert(name.to_string())
    {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        let st = Command::new("cc")
            .args(["-O1", "-fno-builtin", "-pthread", "-Wall", "-I"])
            .arg(&dir)
            .arg("-o")
            .arg(&exe)
            .arg(dir.join(format!("{name}.c")))
            .arg("-ldl")
            .args(libraries(name))
            .status()
            .expect("cc");
        assert!(st.success(), "compiling {name}.c failed");
    }
    exe
}

/// Libraries a test program links beyond libc and libdl.
fn libraries(name: &str) -> &'static [&'static str] {
    match name {
        "uring_pins" => &["-luring"],
        _ => &[],
    }
}

/// A command for `program` (args included) with no PAGEFOLD_* variable of
/// the caller's environment: each run sets exactly what it tests.
fn command(program: &[&str]) -> Command {
    let mut cmd = Command::new(program[0]);
    cmd.args(&program[1..]);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("PAGEFOLD_")) {
        cmd.env_remove(k);
    }
    cmd
}

fn output(mut cmd: Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn plain(program: &[&str]) -> String {
    output(command(program))
}

/// Output and exit reports of `program` run with the preload and `env` (on
/// top of a 2 ms background scan at a full core, a short pin grace, and every
/// block on frames with no scan share and every copy virtual, so each
/// mechanism acts on every block whatever the engine learns).
fn preloaded(program: &[&str], env: &[(&str, &str)]) -> (String, Vec<Value>) {
    let mut all = vec![
        ("PAGEFOLD_FRESH", "frames"),
        ("PAGEFOLD_SCAN_SHARE", "0"),
        ("PAGEFOLD_COPY_LEARN", "0"),
    ];
    all.extend_from_slice(env);
    preloaded_as_set(program, &all)
}

/// As `preloaded`, with only `env` on top of the scan settings and a
/// threshold of 8 KiB (the test programs' blocks are 40 to 256 pages).
fn preloaded_as_set(program: &[&str], env: &[(&str, &str)]) -> (String, Vec<Value>) {
    static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = scratch(&format!("run{n}"));
    let mut cmd = command(program);
    cmd.env("LD_PRELOAD", library())
        .env("PAGEFOLD_THRESHOLD", "8192")
        .env("PAGEFOLD_REPORT", dir.join("report"))
        .env("PAGEFOLD_SCAN_INTERVAL_MS", "2")
        .env("PAGEFOLD_SCAN_CPU", "1")
        .env("PAGEFOLD_PIN_GRACE_US", "200")
        // The preload's pin age scaled down with its scan interval: owned
        // pages go through the freeze and the wait, as they do by default.
        .env("PAGEFOLD_PIN_AGE_MS", "5");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = output(cmd);
    let reports = reports(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    (out, reports)
}

/// The engine reports left by processes that ran with the preload; each
/// is a JSON document with its schema.
fn reports(dir: &Path) -> Vec<Value> {
    let reports: Vec<Value> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|s| serde_json::from_str(&s).ok())
        .collect();
    for r in &reports {
        assert_eq!(r["schema"], "pagefold-preload-report/1", "{r}");
    }
    reports
}

/// A statistic summed over reports; "fallbacks.mmap" reaches into objects,
/// booleans count 0/1.
fn stat(reports: &[Value], key: &str) -> u64 {
    reports
        .iter()
        .map(|r| {
            let v = key.split('.').fold(&r["stats"], |v, k| &v[k]);
            v.as_u64()
                .or_else(|| v.as_bool().map(u64::from))
                .unwrap_or_else(|| panic!("no statistic {key} in {r}"))
        })
        .sum()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "pagefold-preload-test-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs a C program plain and preloaded; outputs must agree. Returns the reports.
fn same_output(name: &str, env: &[(&str, &str)]) -> Vec<Value> {
    let exe = c_program(name);
    let exe = exe.to_str().unwrap();
    let want = plain(&[exe]);
    let (got, r) = preloaded(&[exe], env);
    assert_eq!(
        want, got,
        "{name} with {env:?}: output differs under the preload"
    );
    r
}

#[test]
fn c_program_same_output_with_engine_serving_it() {
    let r = same_output("alloc_copy", &[]);
    assert_eq!(r.len(), 1, "one exit report expected: {r:?}");
    assert!(
        stat(&r, "pages_shared_by_copy") > 0,
        "no copy was virtual: {r:?}"
    );
    assert_eq!(stat(&r, "blocks"), 0, "blocks leaked at exit: {r:?}");
}

/// A buffer registered with io_uring as fixed buffers is pinned by the
/// kernel until unregistered: READ_FIXED into it after the engine has
/// scanned it must land where the program reads. The registration takes the
/// block out of the engine's hands first; without that the engine folds and
/// merges the pinned pages and most of the read is lost.
#[test]
fn io_uring_fixed_buffers_are_never_folded_or_merged() {
    let r = same_output("uring_pins", &[]);
    assert!(
        stat(&r, "exempted") >= 1,
        "the buffer was not exempted: {r:?}"
    );
    assert!(stat(&r, "scans") > 0, "no scan ran beside it: {r:?}");
}

/// `pagefold_stats_json` (the Python package's `engine_stats()`) hands out
/// the running engine's statistics as a JSON document with its schema: the
/// exit report's `stats` and `"schema"`.
#[test]
fn stats_json_is_a_document_with_its_schema() {
    let exe = c_program("stats_json");
    let exe = exe.to_str().unwrap();
    assert_eq!(plain(&[exe]), "");
    let (out, r) = preloaded(&[exe], &[]);
    let stats: Value = serde_json::from_str(out.trim()).expect("one JSON document");
    assert_eq!(stats["schema"], "pagefold-engine-stats/1", "{stats}");
    assert!(stats["pages_shared_by_copy"].as_u64() > Some(0), "{stats}");
    assert_eq!(r.len(), 1, "one exit report expected: {r:?}");
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    let mut want = keys(&r[0]["stats"]);
    want.push("schema".into());
    want.sort();
    assert_eq!(keys(&stats), want);
}

/// madvise DONTNEED/FREE/DONTNEED_LOCKED on owned, copied, diverged and
/// merged pages read zero and free frames (checked mid-run by the program);
/// REMOVE, misaligned ranges and posix_madvise answer as on plain memory;
/// advice the kernel keeps in the mapping (DONTFORK, WIPEONFORK, DONTDUMP,
/// mlock) survives copies, scans and fork.
#[test]
fn madvise_answers_as_private_memory_and_frees_frames() {
    // The program scans synchronously and expects merges at once: no pin age.
    let r = same_output("madvise", &[("PAGEFOLD_PIN_AGE_MS", "0")]);
    assert!(stat(&r, "discarded") >= 4 + 2 * 40 + 40 + 2 * 40, "{r:?}");
    assert!(
        stat(&r, "merged") >= 40 && stat(&r, "exempted") >= 4,
        "{r:?}"
    );
    // Without an engine every call is the kernel's.
    let r = same_output("madvise", &[("PAGEFOLD_DISABLE", "1")]);
    assert!(r.is_empty(), "a disabled preload reported: {r:?}");
}

/// memset to zero on engine blocks and on the heap's fresh pages, and
/// memcpy into those, leave out the pages never touched and write every
/// other one (checked by the program against the engine's counts); other
/// values, small ranges and the rest of glibc's memory are glibc's. With
/// sparse zeroing or its heap part off every page is written.
#[test]
fn zeroing_leaves_out_untouched_pages_and_writes_the_rest() {
    let r = same_output("zeroing", &[]);
    assert!(stat(&r, "zero_pages_not_written") >= 300, "{r:?}");
    assert!(stat(&r, "heap_pages_left_zero") >= 2 * 198, "{r:?}");
    let r = same_output("zeroing", &[("PAGEFOLD_SPARSE_HEAP", "0")]);
    assert!(stat(&r, "zero_pages_not_written") >= 300, "{r:?}");
    assert_eq!(stat(&r, "heap_pages_left_zero"), 0, "{r:?}");
    let r = same_output("zeroing", &[("PAGEFOLD_SPARSE_ZERO", "0")]);
    assert_eq!(stat(&r, "zero_pages_not_written"), 0, "{r:?}");
}

/// realloc across the threshold both ways, aligned allocations beyond a page,
/// usable sizes, calloc, copies, zero and duplicate pages — under every
/// mechanism switched off and every fault injected. The output never changes;
/// the report shows the mechanism off or the fallback taken.
#[test]
fn every_fallback_and_switch_keeps_the_output() {
    type Check = fn(&[Value]) -> bool;
    let cases: &[(&[(&str, &str)], Check)] = &[
        (&[], |r| {
            stat(r, "pages_shared_by_copy") > 0
                && stat(r, "zero_folded") > 0
                && stat(r, "merged") > 0
                && stat(r, "frames_active") == 1
                && stat(r, "protected_scan") == 1
                && ["memfd", "mmap", "vma_budget", "uffd", "frames"]
                    .iter()
                    .all(|f| stat(r, &format!("fallbacks.{f}")) == 0)
        }),
        (&[("PAGEFOLD_DISABLE", "1")], |r| r.is_empty()),
        // The engine starts (at the first block of the default threshold) but serves nothing.
        (&[("PAGEFOLD_THRESHOLD", "1099511627776")], |r| {
            [
                "pages_shared_by_copy",
                "bytes_copied_plain",
                "merged",
                "zero_folded",
            ]
            .iter()
            .all(|k| stat(r, k) == 0)
        }),
        (&[("PAGEFOLD_COPY", "0")], |r| {
            stat(r, "pages_shared_by_copy") == 0
                && stat(r, "zero_folded") > 0
                && stat(r, "merged") > 0
        }),
        (&[("PAGEFOLD_ZERO", "0")], |r| {
            stat(r, "zero_folded") == 0
                && stat(r, "pages_shared_by_copy") > 0
                && stat(r, "merged") > 0
        }),
        (&[("PAGEFOLD_MERGE", "0")], |r| {
            stat(r, "merged") == 0
                && stat(r, "pages_shared_by_copy") > 0
                && stat(r, "zero_folded") > 0
        }),
        (&[("PAGEFOLD_FRAMES", "0")], |r| {
            stat(r, "frames_active") == 0
                && stat(r, "pages_shared_by_copy") == 0
                && stat(r, "merged") == 0
        }),
        (&[("PAGEFOLD_INJECT_FAIL_MEMFD", "1")], |r| {
            stat(r, "fallbacks.memfd") >= 1
                && stat(r, "frames_active") == 0
                && stat(r, "pages_shared_by_copy") == 0
        }),
        (&[("PAGEFOLD_INJECT_FAIL_UFFD", "1")], |r| {
            stat(r, "protected_scan") == 0
                && stat(r, "fallbacks.uffd") >= 1
                && stat(r, "zero_folded") + stat(r, "merged") == 0
                && stat(r, "pages_shared_by_copy") > 0
        }),
        // No mmap at all: every block is glibc's.
        (&[("PAGEFOLD_INJECT_MMAP_AFTER", "0")], |r| {
            stat(r, "fallbacks.mmap") >= 1 && stat(r, "pages_shared_by_copy") == 0
        }),
        (&[("PAGEFOLD_INJECT_MMAP_AFTER", "3")], |r| {
            stat(r, "fallbacks.mmap") >= 1
        }),
        (&[("PAGEFOLD_INJECT_MMAP_AFTER", "12")], |r| {
            stat(r, "fallbacks.mmap") >= 1
        }),
        // Recycled blocks need no mmap: without them the 40th call comes.
        (
            &[
                ("PAGEFOLD_INJECT_MMAP_AFTER", "40"),
                ("PAGEFOLD_RECYCLE_MB", "0"),
            ],
            |r| stat(r, "fallbacks.mmap") >= 1,
        ),
        (&[("PAGEFOLD_RECYCLE_MB", "0")], |r| {
            stat(r, "recycled") == 0 && stat(r, "recycled_bytes") == 0
        }),
        (&[("PAGEFOLD_COPY_MIN", "8192")], |r| {
            stat(r, "pages_shared_by_copy") > 0
        }),
        // A pretend vm.max_map_count that the reserve for the program (4,096) uses up.
        (&[("PAGEFOLD_INJECT_MAX_MAP_COUNT", "4100")], |r| {
            stat(r, "fallbacks.vma_budget") >= 1
                && stat(r, "pages_shared_by_copy") + stat(r, "merged") == 0
        }),
        (&[("PAGEFOLD_VMA_BUDGET", "3")], |r| {
            stat(r, "fallbacks.vma_budget") >= 1
        }),
    ];
    let exe = c_program("workload");
    let exe = exe.to_str().unwrap();
    let want = plain(&[exe]);
    for (env, check) in cases {
        // A short program: owned pages fold and merge at once (no pin age),
        // so every switch shows in its report.
        let env: Vec<(&str, &str)> = [("PAGEFOLD_PIN_AGE_MS", "0")]
            .into_iter()
            .chain(env.iter().copied())
            .collect();
        let env = &env[..];
        let (got, r) = preloaded(&[exe], env);
        assert_eq!(want, got, "output differs with {env:?}");
        assert!(check(&r), "with {env:?} the report does not show it: {r:?}");
        assert!(
            r.len() <= 1 && stat(&r, "blocks") == 0,
            "with {env:?}: {r:?}"
        );
    }
}

/// The program's own SIGSEGV write barrier on a large block keeps working
/// while copies and scans happen (every write faults exactly once), a
/// PROT_NONE block is never scanned, SIGBUS reaches the program, a timer
/// handler writes blocks, a thread with all signals blocked copies them.
/// Also with userfaultfd failing (blocks exempted on their frames).
#[test]
fn program_signal_handlers_and_protections_under_scans() {
    let r = same_output("signals", &[("PAGEFOLD_SCAN_INTERVAL_MS", "1")]);
    assert!(
        stat(&r, "exempted") >= 1 && stat(&r, "scans") >= 48,
        "{r:?}"
    );
    assert!(
        stat(&r, "merged") + stat(&r, "zero_folded") > 0 && stat(&r, "pages_shared_by_copy") > 0,
        "{r:?}"
    );
    let r = same_output(
        "signals",
        &[
            ("PAGEFOLD_SCAN_INTERVAL_MS", "1"),
            ("PAGEFOLD_INJECT_FAIL_UFFD", "1"),
        ],
    );
    assert!(
        stat(&r, "exempted") >= 1 && stat(&r, "fallbacks.uffd") >= 1,
        "{r:?}"
    );
}

/// read, pread, preadv, write, send and recv on large blocks whose pages the
/// scanner merges and folds between rounds: no EFAULT, no byte lost.
#[test]
fn kernel_reads_and_writes_blocks_inside_syscalls_under_scans() {
    let r = same_output("kernel_io", &[("PAGEFOLD_SCAN_INTERVAL_MS", "1")]);
    assert!(
        stat(&r, "scans") >= 60 && stat(&r, "merged") >= 64 && stat(&r, "zero_folded") >= 21,
        "{r:?}"
    );
    assert_eq!(stat(&r, "fallbacks.uffd"), 0, "{r:?}");
}

/// Tiering under real programs: every scan a clock pass and pages cold after
/// one quiet pass, so the policy evicts under kernel I/O into and out of the
/// blocks, signal handlers, fork and plain copies; every byte must come back.
#[test]
fn tiering_evicts_under_real_programs_and_keeps_every_byte() {
    let tier = [
        ("PAGEFOLD_TIER", "1"),
        ("PAGEFOLD_CLOCK_MS", "1"),
        ("PAGEFOLD_COLD_PASSES", "1"),
        ("PAGEFOLD_SCAN_INTERVAL_MS", "1"),
    ];
    let (mut evicted, mut restored) = (0, 0);
    // Not `workload`: it checks frames_resident drops by a shrink, which a
    // page evicted in between has already done.
    for program in ["kernel_io", "fork_threads", "signals", "alloc_copy"] {
        let r = same_output(program, &tier);
        assert!(
            stat(&r, "clock.passes") > 0,
            "{program}: no clock pass: {r:?}"
        );
        assert_eq!(stat(&r, "restore_errors"), 0, "{program}: {r:?}");
        evicted += stat(&r, "clock.total.evicted");
        restored += stat(&r, "restored");
    }
    assert!(
        evicted > 0 && restored > 0,
        "the policy never evicted, or nothing touched what it evicted: {evicted} {restored}"
    );
}

/// The mixed soak (tests/c/soak.c: threads copying, writing, discarding and
/// checking pages against a shadow, the kernel reading and writing them,
/// fork with exec, a timer signal) for its default 10 s with tiering and the
/// pin age on: no mismatch, the same output as plain, and every mechanism
/// at work (holds of diverged pages, folds, merges, evictions and restores).
/// The documented 30-minute run is the same program (docs/TESTING.md).
#[test]
fn soak_keeps_every_byte() {
    let r = same_output(
        "soak",
        &[
            ("PAGEFOLD_TIER", "1"),
            ("PAGEFOLD_CLOCK_MS", "50"),
            ("PAGEFOLD_COLD_PASSES", "1"),
        ],
    );
    for key in [
        "pin_held",
        "zero_folded",
        "merged",
        "pages_shared_by_copy",
        "clock.total.evicted",
    ] {
        assert!(stat(&r, key) > 0, "soak: no {key}: {r:?}");
    }
    assert_eq!(stat(&r, "restore_errors"), 0, "{r:?}");
}

/// Python data left cold is evicted by the policy, then written to a file by
/// the kernel (write(2) reading the evicted pages) and read back into a fresh
/// buffer (read(2)): same bytes as plain Python.
#[test]
fn tiering_evicts_cold_python_data_and_syscalls_read_it_back() {
    if !python() {
        return;
    }
    let dir = scratch("tier-py");
    let script = format!(
        "import hashlib, os, time\n\
         a = bytearray(16_000_000)\n\
         for i in range(0, len(a), 4096): a[i:i + 8] = (i // 4096 + 1).to_bytes(8, 'little')\n\
         time.sleep(0.5)\n\
         path = '{}'\n\
         with open(path, 'wb') as f: f.write(a)\n\
         b = bytearray(len(a))\n\
         with open(path, 'rb') as f: f.readinto(b)\n\
         print(hashlib.sha256(a).hexdigest(), b == a)\n",
        dir.join("cold.bin").display()
    );
    let cmd = ["python3", "-c", script.as_str()];
    let tier = [
        ("PAGEFOLD_TIER", "1"),
        ("PAGEFOLD_CLOCK_MS", "20"),
        ("PAGEFOLD_SCAN_INTERVAL_MS", "20"),
    ];
    let (got, r) = preloaded(&cmd, &tier);
    assert_eq!(plain(&cmd), got);
    assert!(got.trim_end().ends_with("True"), "{got}");
    assert!(
        stat(&r, "clock.total.evicted") >= 3000 && stat(&r, "restored") >= 3000,
        "{r:?}"
    );
    assert_eq!(stat(&r, "restore_errors"), 0, "{r:?}");
}

/// Pressure-driven tiering, the default, under a user's limit far below
/// the usage: only pages with a pin test leave memory. A Python copy's
/// frames, sole-shared once the original is gone, stay (a write through a
/// pin to them could be lost); a large anonymous bytearray leaves through
/// the pin guard. `PAGEFOLD_EVICT_UNTESTED=1` evicts both. Same bytes as plain.
#[test]
fn under_pressure_only_pages_with_a_pin_test_are_evicted() {
    if !python() {
        return;
    }
    let script = "import hashlib, time\n\
         n = 16_000_000\n\
         a = bytearray(n)\n\
         for i in range(0, n, 4096): a[i:i + 8] = (i // 4096 + 1).to_bytes(8, 'little')\n\
         b = bytearray(a)\n\
         del a\n\
         c = bytearray(40_000_000)\n\
         for i in range(0, len(c), 4096): c[i + 8:i + 16] = (i // 4096 + 7).to_bytes(8, 'little')\n\
         time.sleep(3)\n\
         print(hashlib.sha256(b).hexdigest(), hashlib.sha256(c).hexdigest())\n";
    let cmd = ["python3", "-c", script];
    let want = plain(&cmd);
    let pressure = [
        ("PAGEFOLD_MEMORY", "1M"),
        ("PAGEFOLD_CLOCK_MS", "20"),
        ("PAGEFOLD_SCAN_INTERVAL_MS", "20"),
        // No swap: passes shed what the shortage asks from the first.
        ("PAGEFOLD_INJECT_SWAP_FREE_MB", "0"),
    ];
    // The preload's own placement: fresh blocks start anonymous.
    let (got, tested) = preloaded_as_set(&cmd, &pressure);
    assert_eq!(want, got);
    let with_untested = [pressure.as_slice(), &[("PAGEFOLD_EVICT_UNTESTED", "1")]].concat();
    let (got, untested) = preloaded_as_set(&cmd, &with_untested);
    assert_eq!(want, got);
    for r in [&tested, &untested] {
        assert!(stat(r, "pages_shared_by_copy") >= 3000, "{r:?}");
        assert_eq!(stat(r, "restore_errors"), 0, "{r:?}");
    }
    let evicted = |r: &[Value]| stat(r, "clock.total.evicted");
    let refused = |r: &[Value]| stat(r, "clock.total.not_eligible");
    // The copy's 3,906 pages are refused at every pass; the 40 MB
    // bytearray's 9,766 (above the size left to glibc) leave.
    assert!(refused(&tested) >= 3906, "{tested:?}");
    assert!(evicted(&tested) >= 9000, "{} {tested:?}", evicted(&tested));
    assert!(refused(&untested) < refused(&tested) / 2, "{untested:?}");
    assert!(evicted(&untested) >= 9000 + 3000, "{untested:?}");
}

/// fork while three threads copy and the scanner runs: children see the
/// fork-time data and write their copies, parents' blocks stay untouched.
#[test]
fn fork_while_threads_copy() {
    let r = same_output("fork_threads", &[]);
    assert!(
        stat(&r, "pages_shared_by_copy") >= 68 * 40 && stat(&r, "scans") > 0,
        "{r:?}"
    );
}

fn python() -> bool {
    let ok = Command::new("python3")
        .arg("-c")
        .arg("1")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("python3 missing: skipped");
    }
    ok
}

#[test]
fn python_copies_become_virtual() {
    if !python() {
        return;
    }
    let script = "a = bytearray(16_000_000)\n\
                  for i in range(0, len(a), 4096): a[i] = i % 251\n\
                  b = [bytearray(a) for _ in range(6)]\n\
                  b[3][12345] = 7\n\
                  print(sum(x[12345] for x in b), sum(len(x) for x in b), a[4096 * 17])\n";
    let cmd = ["python3", "-c", script];
    let (got, r) = preloaded(&cmd, &[("PAGEFOLD_SCAN_INTERVAL_MS", "1000")]);
    assert_eq!(plain(&cmd), got);
    assert!(stat(&r, "pages_shared_by_copy") >= 5 * 3900, "{r:?}");
}

/// fork() runs the engine's atfork handlers with every engine lock held;
/// what they copy and allocate must not come back into the engine through
/// the preload's own memcpy (a block of >= ~1,000 pages made the page list
/// copy large enough: the process hung in fork, found by numpy's and R's
/// test suites).
#[test]
fn fork_with_large_blocks_does_not_deadlock() {
    if !python() {
        return;
    }
    let script = "import os\n\
                  b = bytearray(b'x' * (64 << 20))\n\
                  c = bytearray(b)\n\
                  for _ in range(4):\n\
                  \x20   pid = os.fork()\n\
                  \x20   if pid == 0:\n\
                  \x20       os._exit(0 if b[12345] == 120 and c[-1] == 120 else 1)\n\
                  \x20   assert os.waitpid(pid, 0)[1] == 0\n\
                  print('ok', len(b) + len(c))\n";
    let cmd = ["timeout", "60", "python3", "-c", script];
    // No background scan: merging b's identical pages before the copy would
    // split its mapping past the budget and make the copy plain.
    let (got, r) = preloaded(&cmd, &[("PAGEFOLD_SCAN_INTERVAL_MS", "0")]);
    assert_eq!(
        got.trim(),
        "ok 134217728",
        "hung or failed (timeout exits 124)"
    );
    assert!(stat(&r, "pages_shared_by_copy") >= 16_000, "{r:?}");
}

/// numpy copies (copy, np.array, astype, assignment, concatenate), zero and
/// duplicate pages, and numpy's own MADV_HUGEPAGE on large arrays.
/// Adaptive placement, copy learning and a scan share together: blocks
/// start anonymous, copies out of them are written through or learnt, scans
/// keep to their account, and every output is the plain one.
const ADAPTIVE: [(&str, &str); 4] = [
    ("PAGEFOLD_FRESH", "adaptive"),
    ("PAGEFOLD_COPY_THROUGH", "1"),
    ("PAGEFOLD_COPY_LEARN", "1"),
    ("PAGEFOLD_SCAN_SHARE", "0.02"),
];

#[test]
fn adaptive_placement_and_scan_share_keep_every_output() {
    // The C programs check that the kernel's reads and writes reach merged,
    // folded and copied pages: the engine takes every block of theirs.
    let mut every_block = ADAPTIVE.to_vec();
    every_block.push(("PAGEFOLD_PLAIN_BELOW", "0"));
    for name in ["alloc_copy", "kernel_io"] {
        let exe = c_program(name);
        let exe = exe.to_str().unwrap();
        let (got, r) = preloaded_as_set(&[exe], &every_block);
        assert_eq!(plain(&[exe]), got, "{name} with adaptive placement");
        assert!(!r.is_empty(), "{name}: no exit report");
    }
    if !python()
        || !Command::new("python3")
            .args(["-c", "import numpy"])
            .status()
            .is_ok_and(|s| s.success())
    {
        eprintln!("numpy missing: the Python part skipped");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/numpy_copies.py");
    let cmd = ["python3", script.to_str().unwrap()];
    let mut env = ADAPTIVE.to_vec();
    env.push(("PAGEFOLD_SCAN_INTERVAL_MS", "5"));
    let (got, r) = preloaded_as_set(&cmd, &env);
    assert_eq!(plain(&cmd), got);
    assert!(
        stat(&r, "pages_copied_through") + stat(&r, "pages_shared_by_copy") >= 5 * 3900,
        "copies were neither written through nor shared: {r:?}"
    );
}

/// Under the preload's defaults, a size the program allocates again and
/// again without copying from it is left to glibc after a few allocations
/// (its heap reuses the memory), whether asked zeroed (`bytes(n)` is a
/// calloc) or not (`bytearray(n)` is a malloc and a memset); same output.
/// No buffer is built by copying (as `bytearray(b'x') * n` would, doubling
/// within itself), so no size is ever copied from.
#[test]
fn sizes_never_copied_from_are_left_to_glibc() {
    if !python() {
        return;
    }
    let script = "import hashlib\n\
                  h = hashlib.sha256()\n\
                  for i in range(40):\n\
                  \x20   if i % 2:\n\
                  \x20       b = bytes(3 << 20)\n\
                  \x20   else:\n\
                  \x20       b = bytearray(3 << 20)\n\
                  \x20       b[::4096] = bytes([i % 251]) * len(b[::4096])\n\
                  \x20   h.update(b)\n\
                  print(h.hexdigest())\n";
    let cmd = ["python3", "-c", script];
    let (got, r) = preloaded_as_set(&cmd, &[]);
    assert_eq!(plain(&cmd), got);
    assert!(stat(&r, "allocs_declined") >= 30, "{r:?}");
}

/// A malloc that glibc can serve from memory freed into its heap is left to
/// glibc at any size, as plain (the block comes out of the heap, below the
/// program break); with `PAGEFOLD_HEAP_FIRST=0` the engine maps it, and the
/// bytes written through it are the same either way.
#[test]
fn a_malloc_the_freed_heap_can_serve_is_left_to_glibc() {
    let exe = c_program("heap_reuse");
    let cmd = [exe.to_str().unwrap()];
    let want = plain(&cmd);
    assert!(want.starts_with("heap "), "glibc reuses its heap: {want}");
    let (got, r) = preloaded_as_set(&cmd, &[]);
    assert_eq!(got, want);
    assert_eq!(stat(&r, "allocs_left_to_heap"), 1, "{r:?}");
    let (off, r) = preloaded_as_set(&cmd, &[("PAGEFOLD_HEAP_FIRST", "0")]);
    assert_eq!(off.replace("mapped ", "heap "), want, "{off}");
    assert!(off.starts_with("mapped "), "the engine takes it: {off}");
    assert_eq!(stat(&r, "allocs_left_to_heap"), 0, "{r:?}");
}

/// A heap so fragmented that counting its free chunks costs more than the
/// block it is counted for would in faults is counted once, never again:
/// of two 16 KiB mallocs (at `PAGEFOLD_PLAIN_BELOW`; a count may take 16 µs
/// for them, where 50,000 free chunks take milliseconds), only the first is
/// left to glibc, the second the engine takes uncounted; same output as plain.
#[test]
fn a_heap_too_fragmented_to_count_cheaply_is_not_counted_again() {
    let exe = c_program("heap_reuse");
    let cmd = [exe.to_str().unwrap(), "fragmented"];
    let (got, r) = preloaded_as_set(&cmd, &[("PAGEFOLD_PLAIN_BELOW", "16384")]);
    assert_eq!(got, plain(&cmd));
    assert_eq!(stat(&r, "allocs_left_to_heap"), 1, "{r:?}");
}

#[test]
fn numpy_copies_under_the_preload() {
    if !python()
        || !Command::new("python3")
            .args(["-c", "import numpy"])
            .status()
            .is_ok_and(|s| s.success())
    {
        eprintln!("numpy missing: skipped");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/numpy_copies.py");
    let cmd = ["python3", script.to_str().unwrap()];
    let (got, r) = preloaded(&cmd, &[("PAGEFOLD_SCAN_INTERVAL_MS", "5")]);
    assert_eq!(plain(&cmd), got);
    // Six 16 MB copies (3,907 pages each), a page-alike array, a zeroed one.
    assert!(stat(&r, "pages_shared_by_copy") >= 5 * 3900, "{r:?}");
    assert!(
        stat(&r, "merged") >= 1000 && stat(&r, "zero_folded") >= 1000,
        "{r:?}"
    );
    assert_eq!(
        stat(&r, "exempted"),
        0,
        "MADV_HUGEPAGE must not take arrays from the engine: {r:?}"
    );
}

#[test]
fn descriptors_stay_out_of_the_programs_way() {
    let r = same_output("descriptors", &[]);
    assert_eq!(stat(&r, "descriptor_replaced"), 1, "{r:?}");
    assert!(stat(&r, "pages_shared_by_copy") > 0);
}

/// A child of a preloaded Python under the engine itself sees no descriptor a
/// plain child would not (CPython's test_pass_fds_redirected in small).
#[test]
fn python_children_see_only_their_own_descriptors() {
    if !python() {
        return;
    }
    // Under the limits this test inherits, whatever they are: with a soft limit
    // below the hard one the engine's descriptors sit above it; with equal
    // limits they sit at the top of the range and the preload's fstat and
    // fcntl hide them (fds.rs).
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/pass_fds.py");
    let cmd = ["python3", script.to_str().unwrap()];
    let want = plain(&cmd);
    assert!(want.contains("child sees exactly its own: True"), "{want}");
    let (got, r) = preloaded(&cmd, &[]);
    assert_eq!(want, got);
    assert!(stat(&r, "blocks") + stat(&r, "fresh_pages") > 0, "{r:?}");
    assert_eq!(stat(&r, "descriptor_replaced"), 0, "{r:?}");
}

/// The count a `limits` run printed on its line starting with `what`.
fn count_after(out: &str, what: &str) -> i64 {
    out.lines()
        .find_map(|l| l.strip_prefix(what))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{what}' in {out}"))
}

/// Copies between objects at different offsets within their pages (Python's
/// bytes(a_bytearray)): after two of them the engine places later objects of
/// that size so that the copies line up and are mapped; every byte right.
#[test]
fn copies_at_mismatched_offsets_are_mapped_once_learned() {
    if !python() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/offsets.py");
    let cmd = ["python3", script.to_str().unwrap()];
    let want = plain(&cmd);
    assert!(want.starts_with("ok "), "{want}");
    let (got, r) = preloaded(&cmd, &[("PAGEFOLD_SCAN_INTERVAL_MS", "0")]);
    assert_eq!(want, got);
    // Of the six bytes copies of 16 MiB, the first two teach; the rest map.
    assert!(stat(&r, "pages_shared_by_copy") >= 4 * 4096, "{r:?}");
}

/// The engine starts at the first allocation of at least the threshold
/// (1 MiB unless `PAGEFOLD_THRESHOLD` says otherwise, read as the library
/// loads): a shell building a 100 KiB string never starts it by default,
/// and does with the threshold at 8 KiB. Same output both ways.
#[test]
fn the_engine_starts_only_at_its_threshold() {
    let script = ["sh", "-c", "x=$(seq 1 20000 | tr '\\n' ' '); echo ${#x}"];
    let want = plain(&script);
    for (threshold, starts) in [(None, false), (Some("8192"), true)] {
        let dir = scratch(&format!("threshold-{}", threshold.unwrap_or("default")));
        let mut cmd = command(&script);
        cmd.env("LD_PRELOAD", library())
            .env("PAGEFOLD_REPORT", dir.join("report"));
        if let Some(t) = threshold {
            cmd.env("PAGEFOLD_THRESHOLD", t);
        }
        assert_eq!(output(cmd), want);
        let reports = reports(&dir);
        assert_eq!(
            !reports.is_empty(),
            starts,
            "threshold {threshold:?}: {} engine reports",
            reports.len()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Memory freed into glibc's heap below a chunk in use stays resident plain;
/// preloaded, while memory is short (a user's limit far below the usage) the
/// engine has glibc trim its heap and the program's resident memory drops by
/// the 64 MiB it checks (heap_trim.c); the output is plain's. With room to
/// spare the engine does not ask for a trim.
#[test]
fn while_memory_is_short_glibcs_freed_heap_goes_back() {
    let exe = c_program("heap_trim");
    let exe = exe.to_str().unwrap();
    let want = plain(&[exe, "drop"]);
    let (got, r) = preloaded(&[exe, "drop"], &[("PAGEFOLD_MEMORY", "1M")]);
    assert_eq!(want, got);
    assert!(stat(&r, "clock.reliefs_released") >= 1, "{r:?}");
    let (got, r) = preloaded(&[exe], &[]);
    assert_eq!(want, got);
    assert_eq!(stat(&r, "clock.reliefs"), 0, "{r:?}");
    // A trim that took too long is not made again (forced: every trim is
    // too long); the engine still calls, 50 ms apart, and nothing more
    // is released.
    let slow = [
        ("PAGEFOLD_MEMORY", "1M"),
        ("PAGEFOLD_CLOCK_MS", "50"),
        ("PAGEFOLD_INJECT_SLOW_TRIM", "1"),
    ];
    let (got, r) = preloaded(&[exe], &slow);
    assert_eq!(want, got);
    assert!(stat(&r, "clock.reliefs") >= 3, "{r:?}");
    assert!(stat(&r, "clock.reliefs_released") <= 1, "{r:?}");
    // Off: no call.
    let off = [("PAGEFOLD_MEMORY", "1M"), ("PAGEFOLD_HEAP_TRIM", "0")];
    let (got, r) = preloaded(&[exe], &off);
    assert_eq!(want, got);
    assert_eq!(stat(&r, "clock.reliefs"), 0, "{r:?}");
}

/// A program that needs every mapping `vm.max_map_count` allows, after
/// thousands of copies that split the engine's blocks: it gets as many as it
/// does plain (the preload's own library and threads take a few), because
/// the engine gives back the mappings it added when the program runs out.
#[test]
fn a_program_gets_every_mapping_it_would_plain() {
    let exe = c_program("mappings");
    let exe = exe.to_str().unwrap();
    let want = plain(&[exe]);
    let (got, r) = preloaded(&[exe], &[]);
    let what = "single-page mappings until ENOMEM:";
    let (w, g) = (count_after(&want, what), count_after(&got, what));
    // Either side may end a few mappings apart (the preload's own library
    // and threads take some; the engine, once it gave its own back, may hold
    // fewer than plain glibc's heap does).
    assert!(w.abs_diff(g) <= 64, "plain {w}, preloaded {g}: {r:?}");
    let last = |s: &str| s.lines().last().unwrap_or("").to_string();
    assert_eq!(last(&want), last(&got));
    assert!(stat(&r, "mapping_shortages") >= 1, "{r:?}");
    assert!(stat(&r, "mappings_given_back") >= 4000, "{r:?}");
}

/// Resource limits the program set itself. Below 1024 descriptors the engine
/// takes none of the program's (it runs without frames); at or above, with
/// soft and hard limits equal, it takes four at the top; under RLIMIT_AS it
/// runs without frames (its pool reserves 256 GiB of address space) and its
/// scanner thread's malloc arena costs about 70 MiB of address space. In every
/// case every byte is right and the program fails nowhere plain does not.
#[test]
fn resource_limits_the_program_set_itself() {
    let exe = c_program("limits");
    let exe = exe.to_str().unwrap();
    type Case<'a> = (&'a [&'a str], &'a str, i64, &'a str);
    let cases: &[Case] = &[
        // No report here: the program leaves no descriptor to write it with.
        (&["nofile", "64"], "descriptors opened until EMFILE:", 0, ""),
        (
            &["nofile", "2000"],
            "descriptors opened until EMFILE:",
            4,
            "",
        ),
        (
            &["as", "1024"],
            "1 MiB blocks allocated until ENOMEM:",
            80,
            "fallbacks.memfd",
        ),
        (
            &["as", "300"],
            "1 MiB blocks allocated until ENOMEM:",
            80,
            "fallbacks.memfd",
        ),
    ];
    for &(args, what, slack, fallback) in cases {
        let cmd: Vec<&str> = std::iter::once(exe).chain(args.iter().copied()).collect();
        let want = plain(&cmd);
        let (got, r) = preloaded(&cmd, &[]);
        let checksum = |s: &str| s.lines().last().unwrap_or("").to_string();
        assert_eq!(checksum(&want), checksum(&got), "{args:?}");
        let (w, g) = (count_after(&want, what), count_after(&got, what));
        assert!(
            g <= w && w - g <= slack,
            "{args:?}: plain {w}, preloaded {g}"
        );
        if !fallback.is_empty() {
            assert!(stat(&r, fallback) >= 1, "{args:?}: {r:?}");
        }
    }
}

/// A seccomp filter the program installs itself makes memfd_create,
/// userfaultfd or both fail: the output is a plain run's, and the engine
/// reports the fallback (no frames: nothing shared; no write protection: no
/// folds or merges, copies still shared).
#[test]
fn seccomp_denied_memfd_or_userfaultfd() {
    let exe = c_program("seccomp");
    let exe = exe.to_str().unwrap();
    for (mode, check) in [
        (
            "memfd",
            (|r| stat(r, "fallbacks.memfd") >= 1 && stat(r, "frames_active") == 0)
                as fn(&[Value]) -> bool,
        ),
        ("uffd", |r| {
            stat(r, "fallbacks.uffd") >= 1
                && stat(r, "protected_scan") == 0
                && stat(r, "pages_shared_by_copy") > 0
                && stat(r, "zero_folded") + stat(r, "merged") == 0
        }),
        ("both", |r| {
            stat(r, "fallbacks.memfd") >= 1 && stat(r, "protected_scan") == 0
        }),
    ] {
        let want = plain(&[exe, mode]);
        let (got, r) = preloaded(&[exe, mode], &[]);
        assert_eq!(want, got, "{mode}");
        assert!(!r.is_empty() && check(&r), "{mode}: {r:?}");
    }
}
