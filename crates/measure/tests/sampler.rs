//! Time series: ending when the process exits (also while nobody has reaped
//! it yet), sampling from another thread while the program waits, and the
//! summary's peak and average.

mod common;

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::{is_root, Helper, MIB};
use pagefold_measure::{Error, Sampler, SeriesEnd};

#[test]
fn helper_entry() {
    common::run_helper_if_requested();
}

const INTERVAL: Duration = Duration::from_millis(20);

#[test]
fn exit_of_unreaped_child_ends_series_cleanly() {
    // Nobody waits for `sleep` while it is sampled, so it turns into a
    // zombie: the sampler must see that as the end, not sample it forever.
    let mut child = Command::new("sleep").arg("0.3").spawn().unwrap();
    let begun = Instant::now();
    let series = Sampler::new(child.id(), INTERVAL)
        .run()
        .expect("first sample");
    let took = begun.elapsed();
    child.wait().unwrap();
    assert_eq!(series.end, SeriesEnd::ProcessExited);
    assert_eq!(series.error, None);
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // ~15 slots in 300 ms; a loaded machine may skip some.
    assert!(
        series.samples.len() >= 3,
        "{} samples",
        series.samples.len()
    );
    assert_eq!(series.summary.samples, series.samples.len() as u64);
    assert!(series.samples.iter().all(|s| s.pids == vec![child.id()]));
}

#[test]
fn tree_series_ends_when_root_exits() {
    let mut child = Command::new("sh")
        .args(["-c", "sleep 0.3 & sleep 0.2; wait"])
        .spawn()
        .unwrap();
    let series = Sampler::new(child.id(), INTERVAL).tree(true).run().unwrap();
    child.wait().unwrap();
    assert_eq!(series.end, SeriesEnd::ProcessExited);
    assert!(
        series.samples.iter().any(|s| s.pids.len() >= 2),
        "sh's children are in the tree"
    );
    assert!(series.samples.iter().all(|s| s.pids[0] == child.id()));
}

#[test]
fn spawned_sampler_while_parent_waits() {
    let mut child = Command::new("sleep").arg("0.2").spawn().unwrap();
    let sampler = Sampler::spawn(child.id(), INTERVAL, false);
    child.wait().unwrap(); // reaped: the PID disappears from /proc
    let series = sampler.join();
    assert_eq!(series.end, SeriesEnd::ProcessExited);
    assert!(!series.samples.is_empty());
}

fn unused_pid() -> u32 {
    let pid_max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    pid_max + 1
}

#[test]
fn series_of_missing_process() {
    let pid = unused_pid();
    assert!(matches!(Sampler::new(pid, INTERVAL).run(), Err(Error::NoSuchProcess(p)) if p == pid));
    let series = Sampler::spawn(pid, INTERVAL, true).join();
    assert!(series.samples.is_empty());
    assert_eq!(
        series.error.as_deref(),
        Some(format!("no such process {pid}").as_str())
    );
    assert!(pagefold_measure::cli::series_failure(&series).is_some());
}

#[test]
fn peak_is_at_least_average_and_sees_growth() {
    let mut helper = Helper::spawn();
    let sampler = Sampler::spawn(helper.pid(), Duration::from_millis(10), false);
    thread::sleep(Duration::from_millis(60));
    for _ in 0..3 {
        assert_eq!(helper.send("anon 16"), "ok");
        thread::sleep(Duration::from_millis(60));
    }
    let series = sampler.stop();
    assert_eq!(series.end, SeriesEnd::Stopped);
    let summary = &series.summary;
    let bytes: Vec<u64> = series.samples.iter().map(|s| s.footprint_bytes).collect();
    assert_eq!(summary.samples, bytes.len() as u64);
    assert!(bytes.len() >= 4, "{} samples", bytes.len());
    assert_eq!(summary.peak_bytes, *bytes.iter().max().unwrap());
    assert!(summary.peak_bytes >= summary.average_bytes);
    assert!(summary.average_bytes >= *bytes.iter().min().unwrap());
    assert!(summary.peak_bytes >= summary.mean_bytes);
    if is_root() {
        // 48 MiB were added while sampling; allow the last 16 to be missed.
        assert!(summary.peak_bytes >= bytes[0] + 32 * MIB, "{bytes:?}");
        assert!(
            summary.average_bytes < summary.peak_bytes,
            "growth makes the average lower"
        );
    }
    let stamps: Vec<u64> = series.samples.iter().map(|s| s.timestamp_ms).collect();
    assert!(stamps.windows(2).all(|w| w[0] < w[1]), "{stamps:?}");
    helper.finish();
}
