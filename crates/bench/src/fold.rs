//! Suite `fold`: the 1 GiB fold, pagefold against the kernel's KSM on the same
//! data. A 1 GiB region (262,144 pages) holds 50% copies of 1,000 distinct
//! contents and 50% unique pages, placed at random with a fixed seed (see
//! `fold_data`). The
//! engine folds it with two on-demand `engine.scan()`s (the first looks, the
//! second folds what did not change; both timed) (wall time and process
//! CPU from getrusage, pages merged, frames left); then the same bytes in
//! plain anonymous memory are left to KSM (see `kernel_ksm`) at several scan
//! rates, and we report how long it takes to settle and what ksmd spent.
//!
//! Then, as root, the engine folds the same bytes again with
//! `vm.max_map_count` raised (`max_map`, restored afterwards): each scattered
//! merged page costs two mappings, so at the default limit the merges stop at
//! the engine's mapping budget, and the raised run shows what they cost when
//! they can go on, including the kernel's memory for the mappings (growth of
//! the `vm_area_struct` and `maple_node` slabs).
//!
//! Footprint is the engine's own count (frames in use plus its metadata), and
//! cross-checked from outside with the Shmem line of /proc/meminfo, which
//! counts the memfd frames the kernel really holds: a fold that only updated
//! counters would show up there. Every byte is read back after the fold.

use crate::fold_data::{fold_ids, DISTINCT, FOLD_PAGES, SEED};
use crate::kernel_ksm::{self, KsmFold, KsmSetting};
use crate::ksm::KsmGuard;
use crate::max_map::{self, MaxMapGuard};
use crate::mem::{self, Block, Pages};
use crate::plan::Plan;
use crate::timing::{median, timed_with_cpu};
use pagefold_engine::{Config, Engine, Hint, PAGE};
use serde::Serialize;
use std::time::Duration;

const MIB: f64 = (1 << 20) as f64;
/// `vm.max_map_count` for the raised run: four mappings per page of the
/// region, so the engine's automatic budget (half) covers two per page.
const RAISED_MAX_MAP: u64 = 4 * FOLD_PAGES as u64;
/// The slabs a mapping is made of.
const VMA_SLABS: [&str; 2] = ["vm_area_struct", "maple_node"];

#[derive(Serialize, Debug)]
pub struct EngineFold {
    pub pages: usize,
    pub duplicate_pages: usize,
    pub distinct_duplicates: u64,
    pub samples: usize,
    pub wall_s: f64,
    /// Process CPU during the scan (getrusage, all threads).
    pub cpu_s: f64,
    /// CPU the engine reports for the scan.
    pub engine_cpu_s: f64,
    pub merged: u64,
    pub zero_folded: u64,
    pub pages_scanned: u64,
    /// Merges skipped because the engine's VMA budget was spent (scan report),
    /// the budget fallbacks counted in its stats, and the mappings in use after.
    pub skipped_vma: u64,
    pub vma_budget_fallbacks: u64,
    pub vmas_used: u64,
    pub frames_before: u64,
    pub frames_after: u64,
    /// Frames a perfect fold leaves: the unique pages plus one per distinct duplicate.
    pub frames_ideal: u64,
    pub metadata_bytes: u64,
    /// (frames_after * 4 KiB + metadata) in MiB.
    pub footprint_mib: f64,
    /// `vm.max_map_count` during the run.
    pub max_map_count: u64,
    /// Growth of the kernel's mapping slabs (vm_area_struct, maple_node) from
    /// before the fill to after the scans, in KiB; None where unreadable.
    pub vma_slab_kib: Option<u64>,
    /// Shmem growth (/proc/meminfo) over the run's start: after filling, after the scan.
    pub shmem_filled_mib: f64,
    pub shmem_folded_mib: f64,
    pub verified: bool,
}

#[derive(Serialize, Debug)]
pub struct FoldResults {
    pub engine: EngineFold,
    /// The same fold with `vm.max_map_count` raised to `RAISED_MAX_MAP`.
    pub engine_raised: Option<EngineFold>,
    /// Why the raised run did not happen, if it did not.
    pub raised_skipped: Option<String>,
    pub ksm: Vec<KsmFold>,
    /// Why the KSM side did not run, if it did not.
    pub ksm_skipped: Option<String>,
}

pub fn run(plan: &Plan) -> FoldResults {
    let ids = fold_ids(FOLD_PAGES, SEED);
    eprintln!("fold: engine scan of 1 GiB, {} runs", plan.runs);
    let engine = engine_fold(&ids, plan.runs);
    let (engine_raised, raised_skipped) = match MaxMapGuard::raise(RAISED_MAX_MAP) {
        Ok(_guard) => {
            eprintln!("fold: engine scan of 1 GiB with vm.max_map_count {RAISED_MAX_MAP}");
            (Some(engine_fold(&ids, plan.runs)), None)
        }
        Err(why) => {
            eprintln!("fold: raised vm.max_map_count skipped: {why}");
            (None, Some(why))
        }
    };
    let (ksm, ksm_skipped) = match KsmGuard::acquire() {
        Ok(guard) => (ksm_folds(&guard, &ids, plan), None),
        Err(why) => {
            eprintln!("fold: kernel KSM skipped: {why}");
            (Vec::new(), Some(why))
        }
    };
    FoldResults {
        engine,
        engine_raised,
        raised_skipped,
        ksm,
        ksm_skipped,
    }
}

fn ksm_settings(plan: &Plan) -> Vec<KsmSetting> {
    let (rates, cap): (&[u64], u64) = if plan.quick {
        (&[10_000], 30)
    } else {
        (&[10_000, 1_000, 100], 200)
    };
    rates
        .iter()
        .map(|&pages_to_scan| KsmSetting {
            pages_to_scan,
            sleep_ms: 20,
            cap: Duration::from_secs(cap),
        })
        .collect()
}

fn ksm_folds(guard: &KsmGuard, ids: &[u64], plan: &Plan) -> Vec<KsmFold> {
    let mut results = Vec::new();
    for setting in ksm_settings(plan) {
        eprintln!(
            "fold: kernel KSM, pages_to_scan {} (cap {} s)",
            setting.pages_to_scan,
            setting.cap.as_secs()
        );
        match kernel_ksm::fold(guard, ids, &setting) {
            Ok(result) => results.push(result),
            Err(e) => eprintln!(
                "fold: kernel KSM at pages_to_scan {} failed: {e:#}",
                setting.pages_to_scan
            ),
        }
    }
    results
}

struct EngineSample {
    wall_s: f64,
    cpu_s: f64,
    engine_cpu_s: f64,
    merged: u64,
    zero_folded: u64,
    pages_scanned: u64,
    skipped_vma: u64,
    vma_budget_fallbacks: u64,
    vmas_used: u64,
    frames_before: u64,
    frames_after: u64,
    metadata_bytes: u64,
    shmem_filled_kib: u64,
    shmem_folded_kib: u64,
    vma_slab_kib: Option<u64>,
    verified: bool,
}

fn engine_fold(ids: &[u64], runs: usize) -> EngineFold {
    let samples: Vec<EngineSample> = (0..runs).map(|_| engine_fold_sample(ids)).collect();
    let med = |f: fn(&EngineSample) -> f64| median(&samples.iter().map(f).collect::<Vec<_>>());
    let first = &samples[0];
    let duplicate_pages = ids.len() / 2;
    let frames_ideal = (ids.len() - duplicate_pages) as u64 + DISTINCT;
    EngineFold {
        pages: ids.len(),
        duplicate_pages,
        distinct_duplicates: DISTINCT,
        samples: runs,
        wall_s: med(|s| s.wall_s),
        cpu_s: med(|s| s.cpu_s),
        engine_cpu_s: med(|s| s.engine_cpu_s),
        merged: first.merged,
        zero_folded: first.zero_folded,
        pages_scanned: first.pages_scanned,
        skipped_vma: first.skipped_vma,
        vma_budget_fallbacks: first.vma_budget_fallbacks,
        vmas_used: first.vmas_used,
        frames_before: first.frames_before,
        frames_after: first.frames_after,
        frames_ideal,
        metadata_bytes: first.metadata_bytes,
        footprint_mib: (first.frames_after as f64 * PAGE as f64 + first.metadata_bytes as f64)
            / MIB,
        shmem_filled_mib: med(|s| s.shmem_filled_kib as f64 / 1024.0),
        shmem_folded_mib: med(|s| s.shmem_folded_kib as f64 / 1024.0),
        max_map_count: max_map::current().unwrap_or(0),
        vma_slab_kib: first.vma_slab_kib,
        verified: samples.iter().all(|s| s.verified),
    }
}

fn engine_fold_sample(ids: &[u64]) -> EngineSample {
    let shmem_start = mem::meminfo_kib("Shmem");
    let slab_start = mem::slab_bytes(&VMA_SLABS);
    let engine = Engine::new(Config::default());
    let block = Block::new(&engine, ids.len(), Hint::FullWrite);
    block.fill(ids);
    let shmem_filled = mem::meminfo_kib("Shmem");
    let before = engine.stats();
    // Two scans, both timed: the first records what it sees, the second
    // folds pages that did not change in between (the engine's volatility
    // check, as kernel KSM needs two passes too).
    let (report, wall, cpu) = timed_with_cpu(|| {
        let look = engine.scan();
        let mut fold = engine.scan();
        fold.cpu_ns += look.cpu_ns;
        fold
    });
    let after = engine.stats();
    let shmem_folded = mem::meminfo_kib("Shmem");
    let vma_slab_kib = mem::slab_bytes(&VMA_SLABS)
        .zip(slab_start)
        .map(|(end, start)| end.saturating_sub(start) / 1024);
    let verified = block.first_mismatch(ids).is_none();
    if !verified {
        eprintln!("ENGINE CHECK FAILED: the 1 GiB fold reads back wrong");
    }
    EngineSample {
        wall_s: wall.as_secs_f64(),
        cpu_s: cpu.as_secs_f64(),
        engine_cpu_s: report.cpu_ns as f64 / 1e9,
        merged: report.merged,
        zero_folded: report.zero_folded,
        pages_scanned: report.pages_scanned,
        skipped_vma: report.skipped_vma,
        vma_budget_fallbacks: after.fallbacks.vma_budget,
        vmas_used: after.vmas_used,
        frames_before: before.frames_in_use,
        frames_after: after.frames_in_use,
        metadata_bytes: after.metadata_bytes,
        shmem_filled_kib: shmem_filled.saturating_sub(shmem_start),
        shmem_folded_kib: shmem_folded.saturating_sub(shmem_start),
        vma_slab_kib,
        verified,
    }
}
