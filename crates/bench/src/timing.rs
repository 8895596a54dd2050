//! Clocks and statistics for the harness. The machine is a small shared VM, so
//! a single measurement means little: every number reported is a median over
//! samples, and every comparison is a ratio of two medians taken in the same
//! run. CPU time comes from getrusage(RUSAGE_SELF), which covers every thread
//! of the process (an engine helper thread included), and the kernel's ksmd
//! thread is read from /proc/PID/stat.

use std::time::{Duration, Instant};

/// Median of the samples (mean of the middle two for an even count); NaN if empty.
pub fn median(samples: &[f64]) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// Runs `f` and returns its result with the wall time it took.
pub fn timed<R>(f: impl FnOnce() -> R) -> (R, Duration) {
    let start = Instant::now();
    let result = f();
    (result, start.elapsed())
}

/// User + system CPU time of this whole process so far.
pub fn process_cpu() -> Duration {
    let usage = crate::sys::rusage_self();
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Wall and CPU time of `f`, CPU measured for the whole process.
pub fn timed_with_cpu<R>(f: impl FnOnce() -> R) -> (R, Duration, Duration) {
    let cpu_before = process_cpu();
    let (result, wall) = timed(f);
    (result, wall, process_cpu().saturating_sub(cpu_before))
}

pub fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// CPU time (user + system) the kernel thread with this comm has used, and its pid.
pub fn kernel_thread_cpu(comm: &str) -> Option<(i32, Duration)> {
    let pid = find_pid_by_comm(comm)?;
    Some((pid, pid_cpu(pid)?))
}

pub fn find_pid_by_comm(comm: &str) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(entry.path().join("comm")).ok()?;
            (name.trim() == comm).then_some(pid)
        })
}

/// utime + stime of a pid from /proc/PID/stat (fields 14 and 15, after the comm).
pub fn pid_cpu(pid: i32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let hz = crate::sys::sysconf(libc::_SC_CLK_TCK).max(1) as u64;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn own_cpu_time_from_proc_stat() {
        let pid = std::process::id() as i32;
        let spin_until = std::time::Instant::now() + Duration::from_millis(50);
        while std::time::Instant::now() < spin_until {}
        assert!(pid_cpu(pid).unwrap() > Duration::ZERO);
    }
}
