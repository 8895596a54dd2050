//! The memory-constrained harness on real cgroups and swap devices (root and
//! the cgroup v1 memory controller needed, else skipped): a program that
//! needs more than its limit swaps and still prints what it prints without
//! one; nothing we set up survives a run that fails, one killed at its time
//! limit, or the harness dying of SIGTERM or a panic. Programs are small
//! python3 scripts, so the tests do not depend on R.
//!
//! Tests that need swap take turns on the swap lock (inside the harness),
//! so they never see each other's devices. Nothing here times the programs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pagefold_bench::constrained::{self, Device, LimitPlan, LimitResult, Verdict};
use pagefold_bench::program::parse_config;
use pagefold_bench::workloads::Workload;
use pagefold_bench::{cgroup, swap};

/// Touches `MIB` MiB page by page, reads it back, prints a checksum.
const TOUCH: &str = r#"
import hashlib, os, sys
n = int(os.environ["MIB"]) << 20
b = bytearray(n)
for i in range(0, n, 4096):
    b[i:i + 8] = (i * 2654435761 % (1 << 64)).to_bytes(8, "little")
print(sum(b[::4096]), hashlib.sha256(b).hexdigest())
"#;

/// True inside a cgroup with a memory limit (how a test program knows it is constrained).
const LIMITED: &str = r#"
def limited():
    for line in open("/proc/self/cgroup"):
        _, ctrl, path = line.strip().split(":", 2)
        if "memory" in ctrl.split(","):
            return int(open("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes").read()) < 1 << 50
    return False
"#;

fn skip() -> bool {
    if let Err(why) = cgroup::check_available() {
        eprintln!("skipped: {why}");
        return true;
    }
    false
}

fn python(name: &str, script: &str, mib: u64) -> Workload {
    Workload {
        name: name.into(),
        cmd: vec![
            "env".into(),
            format!("MIB={mib}"),
            "python3".into(),
            "-c".into(),
            script.into(),
        ],
    }
}

/// A directory for swap files of one test, removed (with anything left in it) on drop.
struct SwapDir(PathBuf);

impl SwapDir {
    fn new(tag: &str) -> SwapDir {
        let dir =
            Path::new("/var/tmp").join(format!("pagefold-limit-test-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        SwapDir(dir)
    }

    fn is_empty(&self) -> bool {
        std::fs::read_dir(&self.0).unwrap().next().is_none()
    }
}

impl Drop for SwapDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn plan<'a>(
    workloads: &'a [Workload],
    devices: &'a [Device],
    fraction: f64,
    timeout: u64,
    dir: &'a Path,
    configs: &'a [pagefold_bench::program::Config],
) -> LimitPlan<'a> {
    LimitPlan {
        suite: "test",
        workloads,
        configs,
        devices,
        fraction,
        runs: 1,
        preload: Path::new("/nonexistent"),
        interval: Duration::from_millis(20),
        timeout: Some(Duration::from_secs(timeout)),
        swap_dir: dir,
        zram_algorithm: "lz4",
    }
}

/// Nothing of this process left: no cgroup, no active swap, no swap file, zram reset.
fn assert_nothing_left(dir: &SwapDir) {
    let me = format!("{}{}-", cgroup::PREFIX, std::process::id());
    let groups: Vec<String> = std::fs::read_dir(cgroup::MEMORY_ROOT)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&me))
        .collect();
    assert!(groups.is_empty(), "cgroups left: {groups:?}");
    let label = format!("pagefold-{}", std::process::id());
    let ours: Vec<_> = swap::active_swaps()
        .into_iter()
        .filter(|s| s.path.starts_with(&dir.0) || swap::read_label(&s.path) == label)
        .collect();
    assert!(ours.is_empty(), "swap left active: {ours:?}");
    assert!(dir.is_empty(), "swap file left in {}", dir.0.display());
}

fn zram_disksizes() -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("zram") {
            out.push(
                std::fs::read_to_string(e.path().join("disksize"))
                    .unwrap()
                    .trim()
                    .to_string(),
            );
        }
    }
    out
}

fn runs_of(r: &LimitResult, device: Device) -> Vec<&constrained::LimitedRun> {
    r.workloads[0]
        .runs
        .iter()
        .filter(|x| !x.reference && x.device == device)
        .collect()
}

#[test]
fn a_program_over_its_limit_swaps_and_prints_what_it_prints_without_one() {
    if skip() {
        return;
    }
    let dir = SwapDir::new("swaps");
    let zram_before = zram_disksizes();
    let workloads = [python("touch", TOUCH, 128)];
    let configs = [parse_config("plain").unwrap()];
    let devices = [Device::None, Device::Swapfile, Device::Zram];
    let r = constrained::run(&plan(&workloads, &devices, 0.5, 600, &dir.0, &configs)).unwrap();
    let w = &r.workloads[0];
    let reference = &w.runs[0];
    assert!(reference.reference && reference.verdict == Verdict::Ok);
    assert_eq!(w.plain_peak_bytes, reference.outcome.peak_bytes);
    assert_eq!(
        w.limit_bytes,
        constrained::limit_for(w.plain_peak_bytes, 0.5).unwrap()
    );
    assert!(
        w.plain_peak_bytes > 64 << 20,
        "the program's pages were counted: {}",
        w.plain_peak_bytes
    );
    for device in [Device::Swapfile, Device::Zram] {
        let run = runs_of(&r, device)[0];
        assert_eq!(run.verdict, Verdict::Ok, "{device:?}: {:?}", run.outcome);
        assert_eq!(
            run.outcome.stdout, reference.outcome.stdout,
            "{device:?}: same output as without a limit"
        );
        assert!(run.peak_swap_bytes > 0, "{device:?}: it swapped");
        assert!(
            run.cgroup.max_usage_bytes <= w.limit_bytes,
            "{device:?}: {} over the limit {}",
            run.cgroup.max_usage_bytes,
            w.limit_bytes
        );
        assert_eq!(run.limit_bytes, Some(w.limit_bytes));
    }
    assert!(
        runs_of(&r, Device::Zram)[0]
            .zram
            .is_some_and(|z| z.pool_peak_bytes > 0),
        "zram held the swapped pages"
    );
    let unlimited = runs_of(&r, Device::None)[0];
    assert!(unlimited.limit_bytes.is_none() && unlimited.peak_swap_bytes == 0);
    assert_nothing_left(&dir);
    assert_eq!(zram_disksizes(), zram_before, "zram reset");
    let md = pagefold_bench::constrained_report::markdown(&r);
    assert!(
        md.contains("| touch |") && md.contains("swapfile: plain"),
        "{md}"
    );
}

#[test]
fn nothing_is_left_after_a_run_that_fails_or_is_killed_at_its_time_limit() {
    if skip() {
        return;
    }
    let dir = SwapDir::new("failing");
    let zram_before = zram_disksizes();
    // Under a limit: swap, then exit 3 (with its pages still swapped out).
    let fails = format!("{LIMITED}\n{TOUCH}\nimport sys\nif limited(): sys.exit(3)\n");
    // Under a limit: leave a process outside the process group, then hang.
    // Sleeps far longer than the runs take: if it held the output pipes, the test would wait for it.
    let marker = format!("{}.{}", 1000 + std::process::id() % 100, std::process::id());
    let escape = format!("import subprocess, time\nif limited():\n    subprocess.Popen(['setsid', 'sleep', '{marker}'])\n");
    let hangs = format!("{LIMITED}\n{escape}{TOUCH}\nif limited(): time.sleep(300)\n");
    let configs = [parse_config("plain").unwrap()];
    let devices = [Device::Swapfile, Device::Zram];
    // The time limit applies to the reference run too: room for a loaded machine.
    for (name, script, timeout) in [
        ("fails", fails.as_str(), 600),
        ("hangs", hangs.as_str(), 20),
    ] {
        let workloads = [python(name, script, 48)];
        let started = std::time::Instant::now();
        let r =
            constrained::run(&plan(&workloads, &devices, 0.5, timeout, &dir.0, &configs)).unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "{name}: a leftover process held a run's pipes open"
        );
        for device in devices {
            let run = runs_of(&r, device)[0];
            let expected = if name == "fails" {
                Verdict::Failed
            } else {
                Verdict::TimedOut
            };
            assert_eq!(
                run.verdict, expected,
                "{name} {device:?}: {:?}",
                run.outcome
            );
            let code = if name == "fails" {
                3
            } else {
                128 + libc::SIGKILL
            };
            assert_eq!(run.outcome.exit_code, code, "{name} {device:?}");
        }
        assert_nothing_left(&dir);
        assert_eq!(zram_disksizes(), zram_before, "{name}: zram reset");
    }
    let survivors: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).contains(&marker))
        .collect();
    assert!(
        survivors.is_empty(),
        "the process that left the process group survived its cgroup"
    );
}

#[test]
fn a_failed_reference_run_stops_the_plan_and_leaves_nothing() {
    if skip() {
        return;
    }
    let dir = SwapDir::new("reference");
    let workloads = [Workload {
        name: "broken".into(),
        cmd: vec!["sh".into(), "-c".into(), "exit 7".into()],
    }];
    let configs = [parse_config("plain").unwrap()];
    let err = constrained::run(&plan(
        &workloads,
        &[Device::Swapfile],
        0.5,
        60,
        &dir.0,
        &configs,
    ))
    .unwrap_err();
    assert!(
        err.contains("broken: plain failed without a limit"),
        "{err}"
    );
    assert_nothing_left(&dir);
}

/// The harness killed by SIGTERM, or panicking with its guards leaked (no
/// Drop: what the release build's panic=abort amounts to), in a child process.
#[test]
fn sigterm_or_a_panic_mid_run_tears_down_the_cgroup_and_the_swap_devices() {
    if skip() {
        return;
    }
    for mode in ["sigterm", "panic"] {
        for device in ["swapfile", "zram"] {
            let dir = SwapDir::new(&format!("child-{mode}-{device}"));
            let zram_before = zram_disksizes();
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["child_helper", "--exact", "--nocapture", "--test-threads=1"])
                .env("PAGEFOLD_LIMIT_CHILD", format!("{mode},{device}"))
                .env("PAGEFOLD_LIMIT_DIR", &dir.0)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                stdout.contains("set up"),
                "{mode} {device}: the child did not get going: {stdout} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(!out.status.success());
            let pid = stdout
                .lines()
                .find_map(|l| l.split("child pid ").nth(1))
                .unwrap()
                .trim()
                .to_string();
            let prefix = format!("{}{pid}-", cgroup::PREFIX);
            let groups = std::fs::read_dir(cgroup::MEMORY_ROOT)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .count();
            assert_eq!(groups, 0, "{mode} {device}: cgroup left");
            let label = format!("pagefold-{pid}");
            assert!(
                !swap::active_swaps()
                    .iter()
                    .any(|s| s.path.starts_with(&dir.0) || swap::read_label(&s.path) == label),
                "{mode} {device}: swap left active"
            );
            assert!(dir.is_empty(), "{mode} {device}: swap file left");
            assert_eq!(
                zram_disksizes(),
                zram_before,
                "{mode} {device}: zram not reset"
            );
        }
    }
}

/// Not a test on its own: the child of the test above. Its python child is
/// never waited for: this process dies first, and the cgroup teardown kills it.
#[test]
#[allow(clippy::zombie_processes)]
fn child_helper() {
    let Ok(spec) = std::env::var("PAGEFOLD_LIMIT_CHILD") else {
        return;
    };
    let dir = PathBuf::from(std::env::var("PAGEFOLD_LIMIT_DIR").unwrap());
    let (mode, device) = spec.split_once(',').unwrap();
    let lock = swap::SwapLock::acquire(Duration::from_secs(1800)).unwrap();
    let dev = match device {
        "zram" => swap::SwapDevice::zram(&lock, 64 << 20, "lz4").unwrap(),
        _ => swap::SwapDevice::file(&lock, &dir, 64 << 20).unwrap(),
    };
    let group = cgroup::MemoryCgroup::create(Some(32 << 20)).unwrap();
    let procs = group.procs_file().to_owned();
    let mut cmd = std::process::Command::new("python3");
    cmd.args(["-c", "b = bytearray(48 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('swapping', flush=True)\nimport time; time.sleep(300)"]);
    cmd.stdout(std::process::Stdio::piped());
    cgroup::join_before_exec(&mut cmd, procs);
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "swapping");
    assert!(group.swap_bytes().unwrap_or(1) > 0);
    println!("child pid {}\nset up", std::process::id());
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    if mode == "sigterm" {
        // SAFETY: raise takes no pointers; the process dies of SIGTERM here
        // (after the teardown handler), which is what this test checks.
        unsafe { libc::raise(libc::SIGTERM) };
        unreachable!("SIGTERM should have ended this process");
    }
    std::mem::forget((dev, group, lock));
    panic!("deliberate panic with the guards leaked");
}

#[test]
fn the_limit_is_a_page_rounded_fraction_of_plains_peak() {
    assert_eq!(
        constrained::limit_for(1000 << 20, 0.7).unwrap(),
        (700u64 << 20) / 4096 * 4096
    );
    assert_eq!(
        constrained::limit_for((100 << 20) + 4095, 1.0).unwrap(),
        100 << 20
    );
    assert!(constrained::limit_for(1 << 30, 0.0)
        .unwrap_err()
        .contains("--limit-fraction"));
    assert!(constrained::limit_for(1 << 30, 1.5)
        .unwrap_err()
        .contains("at most 1"));
    assert!(constrained::limit_for(1 << 30, f64::NAN).is_err());
    assert!(constrained::limit_for(20 << 20, 0.5)
        .unwrap_err()
        .contains("below the minimum"));
    assert_eq!(constrained::swap_size_for(100 << 20), 256 << 20);
    assert_eq!(
        constrained::swap_size_for((1 << 30) + 1),
        (2 << 30) + (1 << 20)
    );
    let mut configs = ["pagefold", "ksm-100", "plain"]
        .map(|c| parse_config(c).unwrap())
        .to_vec();
    constrained::plain_first(&mut configs);
    assert_eq!(
        configs.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
        ["plain", "pagefold", "ksm-100"]
    );
}

/// Under a limit the report says what the engine did in each cell that ran
/// it (passes under pressure, evictions, restores, sharing, scanner CPU),
/// from the exit reports of the runs; plain's cells have no row.
#[test]
fn under_a_limit_the_report_says_what_the_engine_did() {
    if skip() {
        return;
    }
    let preload = pagefold_testkit::build_into(
        &pagefold_testkit::profile_dir(),
        &["pagefold-preload"],
        &["libpagefold_preload.so"],
    )
    .join("libpagefold_preload.so");
    let dir = SwapDir::new("engine");
    let workloads = [python("touch", TOUCH, 128)];
    let configs = [
        parse_config("plain").unwrap(),
        parse_config("pagefold").unwrap(),
    ];
    let devices = [Device::Swapfile];
    let mut p = plan(&workloads, &devices, 0.5, 600, &dir.0, &configs);
    p.preload = &preload;
    let r = constrained::run(&p).unwrap();
    let run = r.workloads[0]
        .runs
        .iter()
        .find(|x| x.device == Device::Swapfile && x.outcome.config == "pagefold")
        .unwrap();
    assert_eq!(run.verdict, Verdict::Ok, "{:?}", run.outcome);
    assert!(!run.outcome.engine.is_empty(), "the engine reported");
    let md = pagefold_bench::constrained_report::markdown(&r);
    let engine = md.split("**What the engine did**").nth(1).unwrap_or("");
    assert!(
        engine.contains("| touch | swapfile | pagefold |")
            && !engine.contains("| touch | swapfile | plain |"),
        "{md}"
    );
    assert_nothing_left(&dir);
}
