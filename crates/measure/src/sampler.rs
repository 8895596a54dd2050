//! Footprint over time. A sampler measures a process (or its tree) at a fixed
//! interval until the process exits, a sample count or a duration is reached,
//! or it is stopped, and sums the series up as peak and average, as the
//! papers report a run.
//!
//! Samples are due at start + k * interval. A measurement that overruns the
//! interval (large processes) skips the slots it missed instead of sampling
//! back to back, so the sampler never takes more than one core's share it was
//! given. Because of such skips the average is time-weighted: each sample
//! stands for the time until the next one, the last for one interval. With no
//! skips this equals the plain mean, also reported.
//!
//! `Sampler::spawn` runs the loop on its own thread, so a program can measure
//! a child it is waiting for, or itself between phases; `stop` ends it at once
//! (no final sample) and returns the series. A PID reused by a new process is
//! noticed by its start time and ends the series like an exit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::Error;
use crate::footprint::{measure, Footprint, Method};
use crate::procfs;

/// Longest wait between two looks at the stop flag (a signal handler can set
/// it but cannot wake the thread).
const STOP_POLL: Duration = Duration::from_millis(50);

/// Why a series ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SeriesEnd {
    /// The process (the root, for a tree) exited or its PID was reused.
    ProcessExited,
    CountReached,
    DurationReached,
    /// `stop` was called or the stop flag was set.
    Stopped,
    /// A measurement failed for another reason; see `Series::error`.
    Failed,
}

/// Peak and average of a series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub samples: u64,
    pub peak_bytes: u64,
    /// Time-weighted mean footprint (each sample holds until the next).
    pub average_bytes: u64,
    /// Plain mean of the samples.
    pub mean_bytes: u64,
    /// Time from the first to the last sample.
    pub span_ms: u64,
    pub interval_ms: u64,
    /// "pss-proxy" if any sample was a proxy; None without samples.
    pub method: Option<Method>,
    /// Time-weighted mean of the sharing limit, when every sample read it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub average_limit_bytes: Option<u64>,
}

impl Summary {
    pub fn of(samples: &[Footprint], interval: Duration) -> Summary {
        let interval_ms = interval.as_millis() as u64;
        let count = samples.len() as u64;
        let total: u128 = samples.iter().map(|s| s.footprint_bytes as u128).sum();
        let method =
            samples.first().map(
                |_| match samples.iter().any(|s| s.method == Method::PssProxy) {
                    true => Method::PssProxy,
                    false => Method::Pfn,
                },
            );
        Summary {
            samples: count,
            peak_bytes: samples.iter().map(|s| s.footprint_bytes).max().unwrap_or(0),
            average_bytes: time_weighted_average(samples, interval_ms, |s| s.footprint_bytes),
            average_limit_bytes: (count > 0 && samples.iter().all(|s| s.sharing_limit.is_some()))
                .then(|| {
                    time_weighted_average(samples, interval_ms, |s| {
                        s.sharing_limit.as_ref().map_or(0, |l| l.limit_bytes)
                    })
                }),
            mean_bytes: if count == 0 {
                0
            } else {
                (total / count as u128) as u64
            },
            span_ms: match (samples.first(), samples.last()) {
                (Some(first), Some(last)) => last.timestamp_ms.saturating_sub(first.timestamp_ms),
                _ => 0,
            },
            interval_ms,
            method,
        }
    }
}

/// The time-weighted mean of `value` over the samples: each sample weighs
/// the time until the next one (the last: one interval), at least 1 ms so
/// that no sample is dropped.
fn time_weighted_average(
    samples: &[Footprint],
    interval_ms: u64,
    value: impl Fn(&Footprint) -> u64,
) -> u64 {
    let (mut weighted, mut total_weight) = (0u128, 0u128);
    for (i, sample) in samples.iter().enumerate() {
        let until = samples
            .get(i + 1)
            .map_or(sample.timestamp_ms.saturating_add(interval_ms), |n| {
                n.timestamp_ms
            });
        let weight = until.saturating_sub(sample.timestamp_ms).max(1) as u128;
        weighted += value(sample) as u128 * weight;
        total_weight += weight;
    }
    weighted.checked_div(total_weight).unwrap_or(0) as u64
}

/// The samples of one run and their summary.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    pub pid: u32,
    pub tree: bool,
    pub samples: Vec<Footprint>,
    pub summary: Summary,
    pub end: SeriesEnd,
    /// The failure that ended the series, when `end` is Failed.
    pub error: Option<String>,
}

/// Samples one process (tree) at a fixed interval. Built with `new` and the
/// limit setters, run with `run`/`run_with` or on a thread with `start`.
#[derive(Debug, Clone)]
pub struct Sampler {
    pid: u32,
    interval: Duration,
    tree: bool,
    max_samples: Option<u64>,
    max_duration: Option<Duration>,
    sharing_limit: bool,
}

impl Sampler {
    /// An interval under 1 ms is raised to 1 ms.
    pub fn new(pid: u32, interval: Duration) -> Sampler {
        let interval = interval.max(Duration::from_millis(1));
        Sampler {
            pid,
            interval,
            tree: false,
            max_samples: None,
            max_duration: None,
            sharing_limit: false,
        }
    }

    /// Read the sharing limit with every sample (limit.rs: it reads every
    /// anonymous page, so samples take longer and the program runs slower).
    pub fn sharing_limit(mut self, on: bool) -> Sampler {
        self.sharing_limit = on;
        self
    }

    /// Measure the process together with its descendants.
    pub fn tree(mut self, tree: bool) -> Sampler {
        self.tree = tree;
        self
    }

    /// Stop after this many samples.
    pub fn max_samples(mut self, count: u64) -> Sampler {
        self.max_samples = Some(count);
        self
    }

    /// Take samples only while less than this much time has passed.
    pub fn max_duration(mut self, duration: Duration) -> Sampler {
        self.max_duration = Some(duration);
        self
    }

    /// Samples on a new thread until the process exits; see `SamplerHandle`.
    pub fn spawn(pid: u32, interval: Duration, tree: bool) -> SamplerHandle {
        Sampler::new(pid, interval).tree(tree).start()
    }

    /// Runs this sampler on a new thread.
    pub fn start(self) -> SamplerHandle {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            self.run_with(&flag, |_| {})
                .unwrap_or_else(|e| self.failed_before_first_sample(e))
        });
        SamplerHandle { stop, thread }
    }

    /// Samples on this thread until the process exits or a limit is reached.
    /// Err only when not even one sample could be taken.
    pub fn run(&self) -> Result<Series, Error> {
        self.run_with(&AtomicBool::new(false), |_| {})
    }

    /// `run`, also ending when `stop` becomes true, and calling `on_sample`
    /// with each sample as it is taken (to print a live series).
    pub fn run_with(
        &self,
        stop: &AtomicBool,
        mut on_sample: impl FnMut(&Footprint),
    ) -> Result<Series, Error> {
        let start = Instant::now();
        let mut samples = Vec::new();
        let mut start_time = None;
        let mut error = None;
        let end = loop {
            if stop.load(Ordering::Relaxed) {
                break SeriesEnd::Stopped;
            }
            match self.sample(start, &mut start_time) {
                Ok(sample) => {
                    on_sample(&sample);
                    samples.push(sample);
                }
                Err(e) if samples.is_empty() => return Err(e),
                Err(e) if e.is_gone() => break SeriesEnd::ProcessExited,
                Err(e) => {
                    error = Some(e.to_string());
                    break SeriesEnd::Failed;
                }
            }
            if self
                .max_samples
                .is_some_and(|max| samples.len() as u64 >= max)
            {
                break SeriesEnd::CountReached;
            }
            if let Some(end) = self.wait_for_next_slot(start, stop) {
                break end;
            }
        };
        Ok(self.series(samples, end, error))
    }

    /// One sample, stamped with its time since `start`. `start_time` pins the
    /// process identity to the one seen at the first sample.
    fn sample(&self, start: Instant, start_time: &mut Option<u64>) -> Result<Footprint, Error> {
        let at = start.elapsed();
        let stat = procfs::read_stat(self.pid)?;
        if *start_time.get_or_insert(stat.start_time) != stat.start_time {
            return Err(Error::ProcessExited(self.pid));
        }
        let mut sample = measure(self.pid, self.tree, self.sharing_limit)?;
        sample.timestamp_ms = at.as_millis() as u64;
        Ok(sample)
    }

    /// Sleeps until the next due slot; Some(end) if the series ends instead.
    fn wait_for_next_slot(&self, start: Instant, stop: &AtomicBool) -> Option<SeriesEnd> {
        let slots_done = start.elapsed().as_nanos() / self.interval.as_nanos() + 1;
        let due = self
            .interval
            .saturating_mul(slots_done.min(u32::MAX as u128) as u32);
        if self.max_duration.is_some_and(|max| due >= max) {
            return Some(SeriesEnd::DurationReached);
        }
        loop {
            if stop.load(Ordering::Relaxed) {
                return Some(SeriesEnd::Stopped);
            }
            let left = due.saturating_sub(start.elapsed());
            if left.is_zero() {
                return None;
            }
            thread::park_timeout(left.min(STOP_POLL)); // `stop()` unparks
        }
    }

    fn series(&self, samples: Vec<Footprint>, end: SeriesEnd, error: Option<String>) -> Series {
        let summary = Summary::of(&samples, self.interval);
        Series {
            pid: self.pid,
            tree: self.tree,
            samples,
            summary,
            end,
            error,
        }
    }

    /// The empty series a spawned sampler returns when the process could not
    /// be measured even once (a process already gone counts as exited).
    fn failed_before_first_sample(&self, e: Error) -> Series {
        match e.is_gone() {
            true => self.series(Vec::new(), SeriesEnd::ProcessExited, Some(e.to_string())),
            false => self.series(Vec::new(), SeriesEnd::Failed, Some(e.to_string())),
        }
    }
}

/// A sampler running on its own thread.
#[derive(Debug)]
pub struct SamplerHandle {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Series>,
}

impl SamplerHandle {
    /// Ends sampling now and returns the series so far.
    pub fn stop(self) -> Series {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.thread().unpark();
        self.join()
    }

    /// Waits until the series ends by itself (exit or limit).
    pub fn join(self) -> Series {
        self.thread.join().unwrap_or_else(|_| Series {
            pid: 0,
            tree: false,
            samples: Vec::new(),
            summary: Summary::of(&[], Duration::ZERO),
            end: SeriesEnd::Failed,
            error: Some("sampler thread panicked".into()),
        })
    }

    /// True once the series has ended by itself.
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at_ms: u64, bytes: u64) -> Footprint {
        Footprint {
            pids: vec![1],
            footprint_bytes: bytes,
            distinct_pages: Some(bytes / 4096),
            memfd_bytes: 0,
            method: Method::Pfn,
            rss_bytes: 0,
            pss_bytes: 0,
            uss_bytes: 0,
            swap_bytes: 0,
            vm_hwm_bytes: 0,
            ksm: None,
            timestamp_ms: at_ms,
            sharing_limit: None,
        }
    }

    #[test]
    fn summary_weights_by_time() {
        // 100 bytes for 300 ms (a slow sample made it skip two slots), then
        // 400 bytes for one 100 ms interval.
        let samples = [sample(0, 100), sample(300, 400)];
        let s = Summary::of(&samples, Duration::from_millis(100));
        assert_eq!(s.peak_bytes, 400);
        assert_eq!(s.average_bytes, (100 * 300 + 400 * 100) / 400);
        assert_eq!(s.mean_bytes, 250);
        assert_eq!(s.span_ms, 300);
        assert_eq!(s.samples, 2);
        assert_eq!(s.method, Some(Method::Pfn));
    }

    #[test]
    fn summary_of_nothing() {
        let s = Summary::of(&[], Duration::from_millis(100));
        assert_eq!(
            (s.samples, s.peak_bytes, s.average_bytes, s.method),
            (0, 0, 0, None)
        );
    }

    #[test]
    fn count_limit_and_timestamps() {
        let me = std::process::id();
        let series = Sampler::new(me, Duration::from_millis(10))
            .max_samples(3)
            .run()
            .unwrap();
        assert_eq!(series.end, SeriesEnd::CountReached);
        assert_eq!(series.samples.len(), 3);
        let times: Vec<u64> = series.samples.iter().map(|s| s.timestamp_ms).collect();
        // One sample per 10 ms slot at most: a late wake-up may shorten the
        // gap to the next slot, but never puts two samples in one slot.
        let slots: Vec<u64> = times.iter().map(|t| t / 10).collect();
        assert!(slots.windows(2).all(|w| w[1] > w[0]), "{times:?}");
    }

    #[test]
    fn duration_limit() {
        let me = std::process::id();
        let series = Sampler::new(me, Duration::from_millis(20))
            .max_duration(Duration::from_millis(100))
            .run()
            .unwrap();
        assert_eq!(series.end, SeriesEnd::DurationReached);
        // Slots at 0, 20, 40, 60, 80 ms; fewer if a measurement overran.
        assert!(
            (1..=5).contains(&series.samples.len()),
            "{}",
            series.samples.len()
        );
    }

    #[test]
    fn stop_is_prompt() {
        let handle = Sampler::spawn(std::process::id(), Duration::from_secs(3600), false);
        thread::sleep(Duration::from_millis(100));
        let begun = Instant::now();
        let series = handle.stop();
        assert!(begun.elapsed() < Duration::from_secs(2));
        assert_eq!(series.end, SeriesEnd::Stopped);
        assert_eq!(series.samples.len(), 1);
    }
}
