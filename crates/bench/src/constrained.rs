//! Memory-constrained runs, as in the R page-sharing paper's Table 5: the
//! workloads run with less memory than plain execution needs, so plain (and
//! KSM, which merges only after the pages exist) must swap while pagefold,
//! whose footprint is smaller, may not. What that costs in time is the
//! result: runtime under the limit relative to plain under the same limit,
//! next to the footprint and the swap traffic.
//!
//! For each workload the limit is `--limit-fraction` of plain's peak
//! footprint, measured by a reference run of plain without a limit made
//! first in the same invocation. It is not counted among the `none` runs: it
//! is also the workload's first run, with a cold page cache (passbyvalue_lm
//! took twice as long in it). Then, repetition by repetition, every
//! configuration runs with each device, interleaved:
//! `none` (no limit), `swapfile` (a swap file on disk), `zram` (compressed
//! swap in RAM). Each run gets a fresh memory cgroup (see `cgroup`) and each
//! device is set up for one workload's configurations and removed before the
//! next (see `swap`), so exactly one of our swap devices is active at a
//! time. All of it is undone on drop, panic and SIGINT/SIGTERM (`teardown`).
//!
//! A run killed by the OOM killer or the time limit is reported as such, and
//! is not a correctness failure: a limit can do that. A completed run whose
//! output differs from the unconstrained plain run's, or that fails any
//! other way, is one (exit code 2).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

use serde::Serialize;

use crate::cgroup::{self, MemoryCgroup, Usage};
use crate::ksm::KsmGuard;
use crate::program::{self, Config, Invocation, Outcome};
use crate::swap::{self, ActiveSwap, SwapDevice, SwapLock, ZramStats};
use crate::workloads::Workload;

/// Where a configuration runs: without a limit, or limited with this swap.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// No limit (the reference for the limit and the runtimes).
    None,
    /// Limited, swapping to a swap file in --swap-dir.
    Swapfile,
    /// Limited, swapping to a zram device (compressed, in RAM).
    Zram,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::None => "none",
            Device::Swapfile => "swapfile",
            Device::Zram => "zram",
        }
    }
}

/// The options of `pagefold bench` for memory-constrained runs.
#[derive(clap::Args, Debug, Clone)]
pub struct LimitArgs {
    /// Run the workload suites under a memory limit instead (the R paper's Table 5): each workload
    /// in a memory cgroup limited to --limit-fraction of plain's peak footprint, once per device
    /// listed: none (no limit), swapfile (swap file in --swap-dir), zram (zram device as swap).
    /// Needs root and the cgroup v1 memory controller; everything set up is removed afterwards.
    /// Writes results/constrained-SUITE.{json,md,png} and the "constrained" section of
    /// --results-doc ("constrained-python" for python).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "DEVICES")]
    pub limit: Vec<Device>,
    /// The memory limit as a fraction of plain's unconstrained peak footprint (0 < F <= 1).
    #[arg(long, default_value_t = 0.7, value_name = "F")]
    pub limit_fraction: f64,
    /// Directory for the swap file of --limit swapfile (a disk filesystem, not tmpfs).
    #[arg(long, default_value = "/var/tmp", value_name = "DIR")]
    pub swap_dir: PathBuf,
    /// zram's compression algorithm (see /sys/block/zram0/comp_algorithm).
    #[arg(long, default_value = "lzo-rle", value_name = "ALG")]
    pub zram_algorithm: String,
}

/// Smallest limit we set: below it the interpreter alone would not fit.
pub const MIN_LIMIT: u64 = 16 << 20;
/// Smallest swap device.
const MIN_SWAP: u64 = 256 << 20;
/// How long to wait for another harness's swap device to go.
const LOCK_WAIT: Duration = Duration::from_secs(1800);

/// The peak a reference run sets the limit from: its sampled footprint,
/// or, where the sampler saw too little of the run to give a limit (a run
/// over before its first samples on a busy machine), the cgroup's peak usage,
/// which counts the page cache too and so is the larger.
fn reference_peak(sampled: u64, cgroup_peak: u64, fraction: f64) -> u64 {
    match limit_for(sampled, fraction) {
        Ok(_) => sampled,
        Err(_) => sampled.max(cgroup_peak),
    }
}

/// The limit for a workload whose unconstrained plain run peaked at
/// `plain_peak` bytes: `fraction` of it, down to a whole page.
pub fn limit_for(plain_peak: u64, fraction: f64) -> Result<u64, String> {
    check_fraction(fraction)?;
    let page = 4096;
    let limit = (plain_peak as f64 * fraction) as u64 / page * page;
    if limit < MIN_LIMIT {
        return Err(format!(
            "a limit of {:.1} MiB ({fraction} x {:.1} MiB) is below the minimum of 16 MiB",
            mib(limit),
            mib(plain_peak)
        ));
    }
    Ok(limit)
}

pub fn check_fraction(fraction: f64) -> Result<(), String> {
    if fraction > 0.0 && fraction <= 1.0 {
        Ok(())
    } else {
        Err(format!(
            "--limit-fraction must be above 0 and at most 1 (got {fraction})"
        ))
    }
}

/// Swap for a workload: twice plain's peak (so even plain could swap
/// everything), at least 256 MiB, in whole MiB.
pub fn swap_size_for(plain_peak: u64) -> u64 {
    (plain_peak.saturating_mul(2).max(MIN_SWAP) + (1 << 20) - 1) >> 20 << 20
}

/// What to run under a limit, and how.
pub struct LimitPlan<'a> {
    pub suite: &'a str,
    pub workloads: &'a [Workload],
    /// Plain first (see `plain_first`).
    pub configs: &'a [Config],
    /// Sorted: none, swapfile, zram.
    pub devices: &'a [Device],
    pub fraction: f64,
    pub runs: usize,
    pub preload: &'a Path,
    pub interval: Duration,
    pub timeout: Option<Duration>,
    pub swap_dir: &'a Path,
    pub zram_algorithm: &'a str,
}

/// One measured run under a device.
#[derive(Clone, Debug, Serialize)]
pub struct LimitedRun {
    pub device: Device,
    /// The unconstrained plain run made first, which set the limit (not
    /// counted among the `none` runs).
    pub reference: bool,
    pub rep: usize,
    pub limit_bytes: Option<u64>,
    pub outcome: Outcome,
    pub cgroup: Usage,
    /// Most swap the group used at once: memory.stat `swap`, sampled (or our device's use in /proc/swaps).
    pub peak_swap_bytes: u64,
    /// /proc/vmstat pswpout and pswpin over the run, machine-wide, in bytes.
    pub swapped_out_bytes: u64,
    pub swapped_in_bytes: u64,
    /// zram's counters at the end of the run; pool_peak_bytes since it started.
    pub zram: Option<ZramStats>,
    pub verdict: Verdict,
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Ok,
    /// Killed by the OOM killer in its cgroup: the limit and the swap were not enough.
    OomKilled,
    /// Killed at the time limit.
    TimedOut,
    /// Exited non-zero (or died of a signal) for another reason.
    Failed,
    /// Completed, but printed something else than plain without a limit.
    Differs,
}

impl Verdict {
    /// `reference`: the unconstrained plain run's output (None: this run is it).
    pub fn of(o: &Outcome, usage: &Usage, reference: Option<&Outcome>) -> Verdict {
        if o.timed_out {
            Verdict::TimedOut
        } else if o.exit_code != 0 && usage.oom_kills > 0 {
            Verdict::OomKilled
        } else if o.exit_code != 0 {
            Verdict::Failed
        } else if reference.is_some_and(|r| r.stdout != o.stdout || r.exit_code != 0) {
            Verdict::Differs
        } else {
            Verdict::Ok
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::OomKilled => "OOM-killed",
            Verdict::TimedOut => "timed out",
            Verdict::Failed => "FAILED",
            Verdict::Differs => "DIFFERS",
        }
    }

    /// A wrong result, not just a limit the run could not live with.
    pub fn is_error(self) -> bool {
        matches!(self, Verdict::Failed | Verdict::Differs)
    }
}

/// One workload's limit and runs.
#[derive(Clone, Debug, Serialize)]
pub struct LimitedWorkload {
    pub name: String,
    pub cmd: Vec<String>,
    pub plain_peak_bytes: u64,
    pub limit_bytes: u64,
    pub swap_size_bytes: u64,
    pub runs: Vec<LimitedRun>,
}

/// Everything measured, with the setting it was measured in.
#[derive(Debug, Serialize)]
pub struct LimitResult {
    pub suite: String,
    pub machine: crate::report::Machine,
    pub configs: Vec<String>,
    pub devices: Vec<Device>,
    pub fraction: f64,
    pub runs: usize,
    pub interval_ms: u64,
    pub swap_dir: String,
    pub zram_algorithm: String,
    /// memory.stat reports swap per cgroup (else swap is our device's use).
    pub swap_accounted: bool,
    /// Swap areas active from elsewhere when the runs started.
    pub foreign_swaps: Vec<ActiveSwap>,
    /// Leftovers of an earlier, killed harness removed before the runs.
    pub swept: Vec<String>,
    pub workloads: Vec<LimitedWorkload>,
}

/// Moves plain to the front: every ratio is to it, and the tables show it first.
pub fn plain_first(configs: &mut [Config]) {
    if let Some(i) = configs.iter().position(|c| c.name == "plain") {
        configs[..=i].rotate_right(1);
    }
}

/// Fails before any run if something the plan needs is missing.
pub fn preflight(plan: &LimitPlan) -> Result<(), String> {
    cgroup::check_available()?;
    check_fraction(plan.fraction)?;
    if plan.devices.is_empty() {
        return Err("--limit needs at least one of none, swapfile, zram".into());
    }
    if plan.devices.iter().any(|d| *d != Device::None) && !Path::new("/proc/swaps").exists() {
        return Err("this kernel has no swap support (/proc/swaps missing)".into());
    }
    if plan.devices.contains(&Device::Swapfile) {
        swap::check_swap_dir(plan.swap_dir)?;
    }
    if plan.devices.contains(&Device::Zram) {
        swap::check_zram_algorithm(plan.zram_algorithm)?;
    }
    Ok(())
}

/// Runs the plan. Errors stop it (after removing whatever was set up).
pub fn run(plan: &LimitPlan) -> Result<LimitResult, String> {
    preflight(plan)?;
    let lock = match plan.devices.iter().any(|d| *d != Device::None) {
        true => Some(SwapLock::acquire(LOCK_WAIT)?),
        false => None,
    };
    let mut swept = cgroup::sweep_leftovers();
    swept.extend(lock.as_ref().map(swap::sweep_leftovers).unwrap_or_default());
    for s in &swept {
        eprintln!("bench: removed a leftover of a killed harness: {s}");
    }
    if let (Some(lock), true) = (&lock, plan.devices.contains(&Device::Zram)) {
        swap::check_zram_free(lock)?;
    }
    let foreign_swaps = swap::foreign_swaps();
    for s in &foreign_swaps {
        eprintln!("bench: note: swap already active from elsewhere: {} ({} MiB); ours gets a higher priority", s.path.display(), s.size_bytes >> 20);
    }
    let needs_ksm = plan.configs.iter().any(|c| c.setup.runs_ksmd());
    let ksm = if needs_ksm {
        Some(KsmGuard::acquire().map_err(|e| {
            format!(
                "KSM configurations need root and {}: {e}",
                crate::ksm::KSM_DIR
            )
        })?)
    } else {
        None
    };
    let machine = crate::report::Machine::probe(&crate::plan::Plan {
        runs: plan.runs,
        quick: false,
    });
    let mut runner = Runner {
        plan,
        ksm: ksm.as_ref(),
        lock: lock.as_ref(),
        bar: crate::suite::progress(total_runs(plan)),
        workloads: Vec::new(),
    };
    for rep in 0..plan.runs {
        for (w, wl) in plan.workloads.iter().enumerate() {
            runner.workload(rep, w, wl)?;
        }
    }
    runner.bar.finish_and_clear();
    Ok(LimitResult {
        suite: plan.suite.to_string(),
        machine,
        configs: plan.configs.iter().map(|c| c.name.clone()).collect(),
        devices: plan.devices.to_vec(),
        fraction: plan.fraction,
        runs: plan.runs,
        interval_ms: plan.interval.as_millis() as u64,
        swap_dir: plan.swap_dir.display().to_string(),
        zram_algorithm: plan.zram_algorithm.to_string(),
        swap_accounted: cgroup::swap_accounted(),
        foreign_swaps,
        swept,
        workloads: runner.workloads,
    })
}

/// Every run: the reference run of each workload, then the grid.
fn total_runs(plan: &LimitPlan) -> u64 {
    (plan.workloads.len() * (1 + plan.runs * plan.devices.len() * plan.configs.len())) as u64
}

struct Runner<'a> {
    plan: &'a LimitPlan<'a>,
    ksm: Option<&'a KsmGuard>,
    lock: Option<&'a SwapLock>,
    bar: indicatif::ProgressBar,
    workloads: Vec<LimitedWorkload>,
}

impl Runner<'_> {
    /// One repetition of one workload: every device, every configuration.
    fn workload(&mut self, rep: usize, w: usize, wl: &Workload) -> Result<(), String> {
        if rep == 0 {
            let plain = program::parse_config("plain")?;
            let run = self.run_one(rep, wl, &plain, Device::None, None, None)?;
            self.start_workload(
                wl,
                LimitedRun {
                    reference: true,
                    ..run
                },
            )?;
        }
        for &device in self.plan.devices {
            let limit = (device != Device::None).then(|| self.workloads[w].limit_bytes);
            let dev = self.swap_device(device, w)?;
            for cfg in self.plan.configs {
                let run = self.run_one(rep, wl, cfg, device, limit, dev.as_ref())?;
                self.workloads[w].runs.push(run);
            }
            if let Some(d) = dev {
                d.remove()?;
            }
        }
        Ok(())
    }

    /// Records the workload with the limit its reference run sets.
    fn start_workload(&mut self, wl: &Workload, first: LimitedRun) -> Result<(), String> {
        if first.verdict != Verdict::Ok {
            return Err(format!(
                "{}: plain failed without a limit ({}), so no limit can be derived",
                wl.name,
                first.verdict.label()
            ));
        }
        let peak = reference_peak(
            first.outcome.peak_bytes,
            first.cgroup.max_usage_bytes,
            self.plan.fraction,
        );
        let limit = limit_for(peak, self.plan.fraction).map_err(|e| format!("{}: {e}", wl.name))?;
        crate::suite::log(
            &self.bar,
            format!(
                "  {}: plain peak {:.1} MiB without a limit: limit {:.1} MiB",
                wl.name,
                mib(peak),
                mib(limit)
            ),
        );
        self.workloads.push(LimitedWorkload {
            name: wl.name.clone(),
            cmd: wl.cmd.clone(),
            plain_peak_bytes: peak,
            limit_bytes: limit,
            swap_size_bytes: swap_size_for(peak),
            runs: vec![first],
        });
        Ok(())
    }

    fn swap_device(&self, device: Device, w: usize) -> Result<Option<SwapDevice>, String> {
        if device == Device::None {
            return Ok(None);
        }
        let size = self.workloads[w].swap_size_bytes;
        let lock = self
            .lock
            .ok_or("internal: a swap device without the swap lock")?;
        Ok(Some(match device {
            Device::Zram => SwapDevice::zram(lock, size, self.plan.zram_algorithm)?,
            _ => SwapDevice::file(lock, self.plan.swap_dir, size)?,
        }))
    }

    /// One run in a fresh cgroup, its swap sampled meanwhile.
    fn run_one(
        &self,
        rep: usize,
        wl: &Workload,
        cfg: &Config,
        device: Device,
        limit: Option<u64>,
        dev: Option<&SwapDevice>,
    ) -> Result<LimitedRun, String> {
        self.bar.set_message(format!(
            "run {}/{} {} under {} ({})",
            rep + 1,
            self.plan.runs,
            wl.name,
            cfg.name,
            device.name()
        ));
        let group = MemoryCgroup::create(limit)?;
        if let Some(d) = dev {
            d.reset_zram_peak();
        }
        let inv = Invocation {
            cmd: &wl.cmd,
            preload: self.plan.preload,
            input: Some(&[]),
            interval: self.plan.interval,
            timeout: self.plan.timeout,
        };
        let before = vmstat_swaps();
        let stop = AtomicBool::new(false);
        let (outcome, peak_swap_bytes) = std::thread::scope(|s| {
            let poller = s.spawn(|| peak_swap(&group, dev, self.plan.interval, &stop));
            let outcome = program::run_in(&inv, cfg, self.ksm, Some(&group));
            stop.store(true, SeqCst);
            (outcome, poller.join().unwrap_or(0))
        });
        let after = vmstat_swaps();
        let usage = group.usage();
        let zram = dev.and_then(SwapDevice::zram_stats);
        group.remove()?;
        let mut outcome = outcome?;
        if rep > 0 {
            outcome.timeline = Vec::new();
        }
        let verdict = Verdict::of(&outcome, &usage, self.reference(wl));
        let page = 4096;
        let run = LimitedRun {
            device,
            reference: false,
            rep,
            limit_bytes: limit,
            cgroup: usage,
            peak_swap_bytes,
            swapped_out_bytes: after.0.saturating_sub(before.0) * page,
            swapped_in_bytes: after.1.saturating_sub(before.1) * page,
            zram,
            verdict,
            outcome,
        };
        self.log_run(wl, &run);
        Ok(run)
    }

    /// The unconstrained plain run's outcome, once there is one.
    fn reference(&self, wl: &Workload) -> Option<&Outcome> {
        self.workloads
            .iter()
            .find(|w| w.name == wl.name)
            .map(|w| &w.runs[0].outcome)
    }

    fn log_run(&self, wl: &Workload, r: &LimitedRun) {
        let o = &r.outcome;
        let line = format!(
            "  {:<16} {:<9} {:<10} run {}: wall {:>6.2} s, cpu {:>6.2} s, resident peak {:>7.1} MiB, swap peak {:>7.1} MiB, out/in {:.0}/{:.0} MiB, major faults {}: {}",
            wl.name,
            r.device.name(),
            o.config,
            r.rep + 1,
            o.wall_s,
            o.cpu_s + o.ksmd_cpu_s.unwrap_or(0.0),
            mib(r.cgroup.max_usage_bytes),
            mib(r.peak_swap_bytes),
            mib(r.swapped_out_bytes),
            mib(r.swapped_in_bytes),
            r.cgroup.major_faults,
            r.verdict.label()
        );
        crate::suite::log(&self.bar, line);
        if r.verdict != Verdict::Ok {
            crate::suite::log(&self.bar, crate::suite::failure_tail(o));
        }
        self.bar.inc(1);
    }
}

/// Samples the group's swap use until `stop`; returns the largest seen.
fn peak_swap(
    group: &MemoryCgroup,
    dev: Option<&SwapDevice>,
    interval: Duration,
    stop: &AtomicBool,
) -> u64 {
    let read = || {
        group
            .swap_bytes()
            .or_else(|| dev.and_then(SwapDevice::used_bytes))
            .unwrap_or(0)
    };
    let mut peak = 0;
    while !stop.load(SeqCst) {
        peak = peak.max(read());
        let mut slept = Duration::ZERO;
        while slept < interval && !stop.load(SeqCst) {
            let step = Duration::from_millis(5).min(interval - slept);
            std::thread::sleep(step);
            slept += step;
        }
    }
    peak.max(read())
}

/// (pswpout, pswpin) from /proc/vmstat, in pages.
fn vmstat_swaps() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    };
    (get("pswpout"), get("pswpin"))
}

pub(crate) fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_run_the_sampler_missed_takes_the_cgroups_peak() {
        let mib = |n: u64| n << 20;
        // Sampled well: the sampled footprint sets the limit.
        assert_eq!(reference_peak(mib(48), mib(56), 0.5), mib(48));
        // No sample, or one taken before the program grew: the cgroup's peak.
        assert_eq!(reference_peak(0, mib(56), 0.5), mib(56));
        assert_eq!(reference_peak(mib(1), mib(56), 0.5), mib(56));
        // Neither is enough: the limit still fails, with the larger.
        assert!(limit_for(reference_peak(mib(1), mib(20), 0.5), 0.5).is_err());
    }
}
