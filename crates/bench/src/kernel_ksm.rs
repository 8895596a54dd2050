//! The kernel's KSM on the fold data: the peer pagefold has to beat. A forked
//! child maps 1 GiB of plain anonymous memory, fills it with exactly the pages
//! the engine folded, marks it MADV_MERGEABLE and waits. The parent sets the
//! scan rate under the `KsmGuard`, switches ksmd on, and polls
//! /sys/kernel/mm/ksm (pages_sharing, full_scans) every 50 ms together with
//! ksmd's CPU time from /proc/PID/stat.
//!
//! "Settled" = pages_sharing grew and then did not change while full_scans
//! advanced by two (the pass in which the last change happened, and one more
//! full pass); the settle time reported is when the last change was seen.
//! A cap bounds the wait: at the default rate one pass over 1 GiB takes close
//! to a minute, so the confirmation may not fit and is then reported as not
//! confirmed. A child process (rather than madvise in the harness itself)
//! keeps the engine's memory out of KSM's way and lets its exit tear down
//! KSM's state; it dies with the parent (PR_SET_PDEATHSIG) on any exit.

use crate::ksm::{read_counter, KsmGuard};
use crate::mem;
use crate::timing::{find_pid_by_comm, pid_cpu};
use anyhow::{bail, Context, Result};
use pagefold_engine::PAGE;
use serde::Serialize;
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(50);
const MIB: f64 = (1 << 20) as f64;

pub struct KsmSetting {
    pub pages_to_scan: u64,
    pub sleep_ms: u64,
    pub cap: Duration,
}

#[derive(Serialize, Debug)]
pub struct KsmFold {
    pub pages_to_scan: u64,
    pub sleep_ms: u64,
    pub cap_s: f64,
    /// First time pages_sharing reached half its final gain.
    pub half_merged_s: Option<f64>,
    /// When pages_sharing last changed.
    pub settled_s: f64,
    /// Whether two more full scans passed without a change before the cap.
    pub confirmed: bool,
    pub observed_s: f64,
    /// ksmd CPU from ksmd on until the settle time, and until the end of observation.
    pub ksmd_cpu_s: Option<f64>,
    pub ksmd_cpu_observed_s: Option<f64>,
    pub pages_sharing: u64,
    pub pages_shared: u64,
    /// A perfect merge: duplicates minus distinct contents.
    pub pages_sharing_ideal: u64,
    pub full_scans: u64,
    pub pages_scanned: u64,
    /// ksmd CPU per scanned page up to the settle time, in us.
    pub cpu_per_scanned_page_us: Option<f64>,
    /// (pages - pages_sharing) * 4 KiB, in MiB; KSM's own metadata is not included.
    pub footprint_mib: f64,
    /// Growth of the slab caches KSM allocates from, baseline to end of observation.
    pub ksm_metadata_kib: Option<u64>,
    /// pages_sharing before ksmd was switched on: non-zero means another KSM user.
    pub baseline_pages_sharing: u64,
    /// Set if a poll found run/pages_to_scan/sleep_millisecs other than we set
    /// them: another process drove KSM during the run, the timing is not ours.
    pub knobs_disturbed: Option<String>,
}

/// One counter reading.
#[derive(Clone, Copy, Debug)]
struct Sample {
    t: f64,
    sharing: u64,
    shared: u64,
    full_scans: u64,
    scanned: u64,
    ksmd_cpu: Option<f64>,
    /// run, pages_to_scan, sleep_millisecs as read at this poll.
    knobs: [u64; 3],
}

pub fn fold(guard: &KsmGuard, ids: &[u64], setting: &KsmSetting) -> Result<KsmFold> {
    guard.set("run", "0")?;
    guard.set("pages_to_scan", &setting.pages_to_scan.to_string())?;
    guard.set("sleep_millisecs", &setting.sleep_ms.to_string())?;
    let ksmd = find_pid_by_comm("ksmd");
    let child = Workload::spawn(ids).context("starting the KSM workload child")?;
    let t0 = Instant::now();
    let base = sample(t0, ksmd)?;
    let slab_base = ksm_slab_bytes();
    guard.set("run", "1")?;
    let samples = watch(t0, base, ksmd, setting.cap)?;
    let ksm_metadata_kib = ksm_slab_bytes()
        .zip(slab_base)
        .map(|(now, base)| now.saturating_sub(base) / 1024);
    drop(child);
    clean_up(guard)?;
    let mut result = summarise(setting, ids.len(), &samples, ksm_metadata_kib);
    result.knobs_disturbed = disturbance(setting, &samples[1..]);
    if let Some(what) = &result.knobs_disturbed {
        eprintln!("fold: WARNING: {what}");
    }
    Ok(result)
}

/// The first poll at which the knobs were not as this run set them.
fn disturbance(setting: &KsmSetting, polls: &[Sample]) -> Option<String> {
    let wanted = [1, setting.pages_to_scan, setting.sleep_ms];
    let s = polls.iter().find(|s| s.knobs != wanted)?;
    Some(format!(
        "another process changed the KSM knobs: at {:.1} s run/pages_to_scan/sleep_millisecs were {:?}, not {:?}",
        s.t, s.knobs, wanted
    ))
}

fn sample(t0: Instant, ksmd: Option<i32>) -> Result<Sample> {
    Ok(Sample {
        t: t0.elapsed().as_secs_f64(),
        sharing: read_counter("pages_sharing")?,
        shared: read_counter("pages_shared")?,
        full_scans: read_counter("full_scans")?,
        scanned: read_counter("pages_scanned").unwrap_or(0),
        ksmd_cpu: ksmd.and_then(pid_cpu).map(|d| d.as_secs_f64()),
        knobs: [
            read_counter("run")?,
            read_counter("pages_to_scan")?,
            read_counter("sleep_millisecs")?,
        ],
    })
}

/// Polls until settled or the cap; the first sample is the baseline.
fn watch(t0: Instant, base: Sample, ksmd: Option<i32>, cap: Duration) -> Result<Vec<Sample>> {
    let mut samples = vec![base];
    while !is_settled(&samples) && t0.elapsed() < cap {
        std::thread::sleep(POLL);
        samples.push(sample(t0, ksmd)?);
    }
    Ok(samples)
}

/// Index of the sample at which pages_sharing last changed (0 if never).
fn last_change(samples: &[Sample]) -> usize {
    (1..samples.len())
        .rev()
        .find(|&i| samples[i].sharing != samples[i - 1].sharing)
        .unwrap_or(0)
}

fn is_settled(samples: &[Sample]) -> bool {
    let (base, last) = (samples[0], samples[samples.len() - 1]);
    let change = samples[last_change(samples)];
    last.sharing > base.sharing && last.full_scans >= change.full_scans + 2
}

fn summarise(
    setting: &KsmSetting,
    pages: usize,
    samples: &[Sample],
    ksm_metadata_kib: Option<u64>,
) -> KsmFold {
    let (base, last) = (samples[0], samples[samples.len() - 1]);
    let settled = samples[last_change(samples)];
    let gain = settled.sharing.saturating_sub(base.sharing);
    let half = samples
        .iter()
        .find(|s| gain > 0 && s.sharing.saturating_sub(base.sharing) * 2 >= gain);
    let cpu_since_base = |s: &Sample| Some(s.ksmd_cpu? - base.ksmd_cpu?);
    let ksmd_cpu_s = cpu_since_base(&settled);
    let scanned = settled.scanned.saturating_sub(base.scanned);
    KsmFold {
        pages_to_scan: setting.pages_to_scan,
        sleep_ms: setting.sleep_ms,
        cap_s: setting.cap.as_secs_f64(),
        half_merged_s: half.map(|s| s.t),
        settled_s: settled.t,
        confirmed: is_settled(samples),
        observed_s: last.t,
        ksmd_cpu_s,
        ksmd_cpu_observed_s: cpu_since_base(&last),
        pages_sharing: gain,
        pages_shared: settled.shared.saturating_sub(base.shared),
        pages_sharing_ideal: (pages / 2) as u64 - crate::fold_data::DISTINCT,
        full_scans: settled.full_scans - base.full_scans,
        pages_scanned: scanned,
        cpu_per_scanned_page_us: ksmd_cpu_s
            .filter(|_| scanned > 0)
            .map(|c| c * 1e6 / scanned as f64),
        footprint_mib: (pages as u64 - gain) as f64 * PAGE as f64 / MIB,
        ksm_metadata_kib,
        baseline_pages_sharing: base.sharing,
        knobs_disturbed: None,
    }
}

/// Stops ksmd and drops what it still holds of the (now dead) workload, so the
/// next setting starts from zero: run=2 unmerges and removes every rmap item
/// synchronously; then run=0. The guard restores the original value later.
fn clean_up(guard: &KsmGuard) -> Result<()> {
    guard.set("run", "2")?;
    guard.set("run", "0")?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while read_counter("pages_sharing")? != 0 {
        if Instant::now() > deadline {
            bail!(
                "pages_sharing still {} after cleanup",
                read_counter("pages_sharing")?
            );
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// Bytes in use in the slab caches KSM allocates from (rmap items, stable nodes,
/// mm slots); see `mem::slab_bytes`.
fn ksm_slab_bytes() -> Option<u64> {
    crate::mem::slab_bytes(&["ksm_rmap_item", "ksm_stable_node", "ksm_mm_slot"])
}

/// The child holding the mergeable copy of the data; killed and reaped on drop.
struct Workload {
    pid: libc::pid_t,
}

impl Workload {
    fn spawn(ids: &[u64]) -> Result<Workload> {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a writable [c_int; 2] on this frame, exactly what
        // pipe2 fills.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            bail!("pipe2: {}", std::io::Error::last_os_error());
        }
        // SAFETY: the child runs only child_main, which makes system calls
        // and plain loops (no allocation, no lock) and never returns, as a
        // child forked from a multi-threaded process must.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: this is the freshly forked child; `ids` is its copy of
            // the parent's slice and `fds[1]` the pipe's write end.
            unsafe { child_main(ids, fds[1]) }
        }
        let workload = Workload { pid };
        let mut ready = [0u8; 1];
        // SAFETY: `fds` are the two ends pipe2 opened above, each closed once
        // here (the child has its own copies); `ready` is a writable byte on
        // this frame, the only memory read writes.
        let n = unsafe {
            libc::close(fds[1]);
            let n = libc::read(fds[0], ready.as_mut_ptr().cast(), 1);
            libc::close(fds[0]);
            n
        };
        if n != 1 {
            bail!("the workload child died before it was ready");
        }
        Ok(workload)
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        crate::sys::kill(self.pid, libc::SIGKILL);
        // SAFETY: the status pointer is null, which waitpid allows; `pid` is
        // our child, reaped only here.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
    }
}

/// Runs in the forked child of a possibly multi-threaded parent: system calls
/// and plain loops only, no allocation, no locks, never returns.
///
/// # Safety
/// Call only in a process just forked by `Workload::spawn`: `ids` must be
/// readable (the child's copy of the parent's slice) and `ready_fd` the
/// write end of the pipe the parent reads from.
unsafe fn child_main(ids: &[u64], ready_fd: libc::c_int) -> ! {
    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    libc::signal(libc::SIGINT, libc::SIG_DFL);
    libc::signal(libc::SIGTERM, libc::SIG_DFL);
    let len = ids.len() * PAGE;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let region = libc::mmap(
        std::ptr::null_mut(),
        len,
        prot,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
        0,
    );
    if region == libc::MAP_FAILED {
        libc::_exit(2);
    }
    mem::fill_pages(region.cast(), ids);
    if libc::madvise(region, len, libc::MADV_MERGEABLE) != 0 {
        libc::_exit(3);
    }
    libc::write(ready_fd, b"r".as_ptr().cast(), 1);
    loop {
        libc::pause();
    }
}
