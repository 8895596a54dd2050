//! Suite `micro`: what each engine mechanism costs per page, next to the
//! reference it has to be judged against, measured side by side in one run:
//!
//! - virtual copy (share): `engine.copy` of 1..16384 pages versus allocating
//!   fresh memory and memcpy'ing into it (page faults included), also with a
//!   first read of every page afterwards (a copy that is never read is not the
//!   whole story), from a freshly written block (the copy must freeze it) and
//!   from a block that is itself a copy;
//! - CoW break: writing one byte per page of a virtual copy versus the
//!   kernel's own copy-on-write fault on a memfd MAP_PRIVATE mapping and a
//!   first-touch anonymous write fault;
//! - zero fold, merge, and scan throughput: `engine.scan()` over blocks of
//!   zero, duplicate and unique pages.
//!
//! Each figure is the median over samples; the Difference Engine's Table 2
//! (share 6.2 us, cow_break 25.1 us per page) is printed as a reference column.
//! Every mechanism is also checked for correctness on the way (the copied and
//! folded bytes are read back), since a fast wrong answer is no result.

use crate::mem::{Block, Memfd, Pages, Region};
use crate::plan::Plan;
use crate::timing::{median, micros, timed, timed_with_cpu};
use pagefold_engine::{Config, Engine, Hint, Stats, PAGE};
use serde::Serialize;
use std::hint::black_box;

/// Block sizes, in pages, of the virtual copy comparison.
pub const COPY_SIZES: [usize; 4] = [1, 64, 1024, 16384];
/// Pages written in the CoW-break comparison.
const COW_PAGES: usize = 16384;
/// Pages of the zero-fold and merge micro-benchmarks (256 MiB).
const FOLD_PAGES: usize = 65536;
/// Distinct contents in the merge micro-benchmark.
const MERGE_DISTINCT: u64 = 64;
/// Pages of the scan throughput runs (1 GiB).
const GIB_PAGES: usize = (1 << 30) / PAGE;

#[derive(Serialize, Clone, Copy, PartialEq, Debug)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// A block just written by the program: the copy has to freeze it first.
    Fresh,
    /// A block that is itself a virtual copy (its pages already shared frames).
    CopyOfCopy,
}

#[derive(Serialize, Debug)]
pub struct CopyRow {
    pub source: Source,
    pub pages: usize,
    pub samples: usize,
    /// engine.alloc of the destination.
    pub alloc_us: f64,
    /// engine.copy alone.
    pub copy_us: f64,
    pub share_us_per_page: f64,
    /// alloc + copy: what replaces "allocate fresh memory and memcpy".
    pub vcopy_us: f64,
    pub vcopy_read_us: f64,
    /// mmap fresh anonymous memory + memcpy into it.
    pub memcpy_us: f64,
    pub memcpy_read_us: f64,
    /// memcpy_us / vcopy_us: how many times faster the virtual copy is.
    pub speedup: f64,
    pub speedup_with_read: f64,
    /// The kernel's floor for the same copy: mmap of a memfd range MAP_PRIVATE
    /// (no freeze, no bookkeeping), and with a first read of every page.
    pub kernel_view_us: f64,
    pub kernel_view_read_us: f64,
    /// Pages the engine reports it shared in one copy (should equal `pages`).
    pub pages_shared_by_copy: u64,
    /// Copy reads back the source bytes, and writes to either side stay on that side.
    pub verified: bool,
}

#[derive(Serialize, Debug)]
pub struct CowRow {
    pub pages: usize,
    pub samples: usize,
    /// One byte written per page of a virtual copy whose pages were read first.
    pub engine_us: f64,
    /// Same, pages written without a read first.
    pub engine_cold_us: f64,
    /// Kernel CoW: memfd MAP_PRIVATE, read-faulted, then written.
    pub kernel_us: f64,
    pub kernel_cold_us: f64,
    /// Anonymous first-touch write fault.
    pub first_touch_us: f64,
    /// engine_us / kernel_us.
    pub ratio: f64,
    pub ratio_cold: f64,
}

#[derive(Serialize, Clone, Copy, Debug)]
#[serde(rename_all = "kebab-case")]
pub enum Content {
    Zero,
    Duplicates(u64),
    Unique,
}

impl Content {
    /// Content ids per page; None means all-zero pages.
    fn ids(self, pages: usize) -> Option<Vec<u64>> {
        match self {
            Content::Zero => None,
            Content::Duplicates(distinct) => {
                Some((0..pages as u64).map(|i| i % distinct).collect())
            }
            Content::Unique => Some((0..pages as u64).map(|i| 1_000_000 + i).collect()),
        }
    }
}

#[derive(Serialize, Debug)]
pub struct ScanRow {
    pub content: Content,
    pub pages: usize,
    pub samples: usize,
    pub wall_ms: f64,
    /// Process CPU (getrusage) during the scan.
    pub cpu_ms: f64,
    /// CPU the engine reports for the scan.
    pub engine_cpu_ms: f64,
    pub us_per_page: f64,
    /// Bytes scanned per CPU second, in GB (1e9 bytes).
    pub gb_per_cpu_s: f64,
    pub gb_per_wall_s: f64,
    /// A second scan right after the first, nothing changed in between.
    pub rescan_ms: f64,
    pub zero_folded: u64,
    pub merged: u64,
    /// Merges or folds skipped because the VMA budget was spent, and mappings in use after.
    pub skipped_vma: u64,
    pub vmas_after: u64,
    pub frames_before: u64,
    pub frames_after: u64,
    /// Frames resident after the scan, and after every page was read back.
    pub resident_after: u64,
    pub resident_after_read: u64,
    pub verified: bool,
}

#[derive(Serialize, Debug)]
pub struct MicroResults {
    pub copy: Vec<CopyRow>,
    pub cow: CowRow,
    pub zero_fold: ScanRow,
    pub merge: ScanRow,
    pub scan_unique: ScanRow,
    pub scan_zero: ScanRow,
}

pub fn run(plan: &Plan) -> MicroResults {
    let mut copy = Vec::new();
    for source in [Source::Fresh, Source::CopyOfCopy] {
        for pages in COPY_SIZES {
            eprintln!("micro: virtual copy, {source:?} source, {pages} pages");
            copy.push(copy_row(source, pages, plan));
        }
    }
    eprintln!("micro: CoW break");
    let cow = cow_row(plan);
    eprintln!("micro: zero fold, merge, scan throughput");
    MicroResults {
        copy,
        cow,
        zero_fold: scan_row(Content::Zero, FOLD_PAGES, plan),
        merge: scan_row(Content::Duplicates(MERGE_DISTINCT), FOLD_PAGES, plan),
        scan_unique: scan_row(Content::Unique, GIB_PAGES, plan),
        scan_zero: scan_row(Content::Zero, GIB_PAGES, plan),
    }
}

// ---------------------------------------------------------------- virtual copy

/// One measurement of both ways to copy, in microseconds.
struct CopySample {
    alloc: f64,
    copy: f64,
    read: f64,
    memcpy: f64,
    memcpy_read: f64,
    view: f64,
    view_read: f64,
}

fn copy_row(source: Source, pages: usize, plan: &Plan) -> CopyRow {
    let engine = Engine::new(Config::default());
    let (verified, pages_shared_by_copy) = copy_check(&engine, source, pages);
    let samples_per_run = (4096 / pages).clamp(3, 64);
    let view_source = written_memfd(pages);
    let samples: Vec<CopySample> = (0..plan.runs * samples_per_run)
        .map(|s| copy_sample(&engine, &view_source, source, pages, (s * pages) as u64))
        .collect();
    let med = |f: fn(&CopySample) -> f64| median(&samples.iter().map(f).collect::<Vec<_>>());
    let vcopy_us = med(|s| s.alloc + s.copy);
    let vcopy_read_us = med(|s| s.alloc + s.copy + s.read);
    let memcpy_us = med(|s| s.memcpy);
    let memcpy_read_us = med(|s| s.memcpy + s.memcpy_read);
    CopyRow {
        source,
        pages,
        samples: samples.len(),
        alloc_us: med(|s| s.alloc),
        copy_us: med(|s| s.copy),
        share_us_per_page: med(|s| s.copy) / pages as f64,
        vcopy_us,
        vcopy_read_us,
        memcpy_us,
        memcpy_read_us,
        speedup: memcpy_us / vcopy_us,
        speedup_with_read: memcpy_read_us / vcopy_read_us,
        kernel_view_us: med(|s| s.view),
        kernel_view_read_us: med(|s| s.view + s.view_read),
        pages_shared_by_copy,
        verified,
    }
}

/// The blocks that make up a source: a written block, and for a copy of a copy
/// also its virtual copy. The last block is the one to copy from.
fn make_source<'e>(engine: &'e Engine, source: Source, ids: &[u64]) -> Vec<Block<'e>> {
    let written = Block::new(engine, ids.len(), Hint::FullWrite);
    written.fill(ids);
    match source {
        Source::Fresh => vec![written],
        Source::CopyOfCopy => {
            let copy = written.copy_to_new();
            vec![written, copy]
        }
    }
}

/// A memfd holding `pages` written pages, for the kernel-view floor.
fn written_memfd(pages: usize) -> Memfd {
    let fd = Memfd::new(pages * PAGE).expect("memfd for the kernel view");
    let writer = Region::of_memfd(&fd, true).expect("mmap memfd shared");
    writer.fill(&(0..pages as u64).collect::<Vec<_>>());
    fd
}

fn copy_sample(
    engine: &Engine,
    view_source: &Memfd,
    source: Source,
    pages: usize,
    first_id: u64,
) -> CopySample {
    let ids: Vec<u64> = (first_id..first_id + pages as u64).collect();
    let blocks = make_source(engine, source, &ids);
    let src = blocks.last().expect("a source block");
    let len = src.byte_len();
    // the source is mapped in before either copy, so neither pays its faults
    black_box(src.read_byte_per_page());
    let (fresh, memcpy) = timed(|| {
        let fresh = Region::anon(len).expect("mmap for memcpy baseline");
        fresh.copy_from(src);
        fresh
    });
    let (_, memcpy_read) = timed(|| black_box(fresh.read_byte_per_page()));
    drop(fresh);
    let (dst, alloc) = timed(|| Block::new(engine, pages, Hint::None));
    let (_, copy) = timed(|| src.copy_into(&dst));
    let (_, read) = timed(|| black_box(dst.read_byte_per_page()));
    let (view, view_time) =
        timed(|| Region::of_memfd(view_source, false).expect("mmap memfd private"));
    let (_, view_read) = timed(|| black_box(view.read_byte_per_page()));
    CopySample {
        alloc: micros(alloc),
        copy: micros(copy),
        read: micros(read),
        memcpy: micros(memcpy),
        memcpy_read: micros(memcpy_read),
        view: micros(view_time),
        view_read: micros(view_read),
    }
}

/// One untimed copy, checked: the destination reads as the source, a write to
/// the destination leaves the source alone and vice versa. Also tells how many
/// pages the engine shared instead of copying.
fn copy_check(engine: &Engine, source: Source, pages: usize) -> (bool, u64) {
    let ids: Vec<u64> = (0..pages as u64).map(|i| 7_000_000 + i).collect();
    let blocks = make_source(engine, source, &ids);
    let src = blocks.last().expect("a source block");
    let shared_before = engine.stats().pages_shared_by_copy;
    let dst = src.copy_to_new();
    let shared = engine.stats().pages_shared_by_copy - shared_before;
    let copied = dst.first_mismatch(&ids).is_none();
    dst.write_byte_per_page(0xd5);
    let src_kept = src.first_mismatch(&ids).is_none();
    let dst_written = dst.byte_at(17) == 0xd5;
    src.write_byte_per_page(0x5d);
    let dst_kept = dst.byte_at((pages - 1) * PAGE + 17) == 0xd5;
    if !(copied && src_kept && dst_written && dst_kept) {
        eprintln!(
            "ENGINE CHECK FAILED: copy {source:?} {pages} pages: copied {copied} src_kept {src_kept} \
             dst_written {dst_written} dst_kept {dst_kept}"
        );
    }
    (copied && src_kept && dst_written && dst_kept, shared)
}

// ---------------------------------------------------------------- CoW break

fn cow_row(plan: &Plan) -> CowRow {
    let engine = Engine::new(Config::default());
    let mut samples: [Vec<f64>; 5] = Default::default();
    for _ in 0..plan.runs {
        samples[0].push(engine_cow_us(&engine, COW_PAGES, true));
        samples[1].push(engine_cow_us(&engine, COW_PAGES, false));
        samples[2].push(kernel_cow_us(COW_PAGES, true));
        samples[3].push(kernel_cow_us(COW_PAGES, false));
        samples[4].push(first_touch_us(COW_PAGES));
    }
    let [engine_us, engine_cold_us, kernel_us, kernel_cold_us, first_touch_us] =
        samples.map(|s| median(&s));
    CowRow {
        pages: COW_PAGES,
        samples: plan.runs,
        engine_us,
        engine_cold_us,
        kernel_us,
        kernel_cold_us,
        first_touch_us,
        ratio: engine_us / kernel_us,
        ratio_cold: engine_cold_us / kernel_cold_us,
    }
}

/// Per-page cost of writing one byte into every page of a virtual copy.
fn engine_cow_us(engine: &Engine, pages: usize, read_first: bool) -> f64 {
    let ids: Vec<u64> = (0..pages as u64).collect();
    let blocks = make_source(engine, Source::Fresh, &ids);
    let dst = blocks[0].copy_to_new();
    if read_first {
        black_box(dst.read_byte_per_page());
    }
    let (_, write) = timed(|| dst.write_byte_per_page(0xab));
    micros(write) / pages as f64
}

/// Per-page cost of the kernel's own copy-on-write: a memfd written through a
/// shared mapping, then mapped MAP_PRIVATE and written.
fn kernel_cow_us(pages: usize, read_first: bool) -> f64 {
    let fd = Memfd::new(pages * PAGE).expect("memfd for the kernel CoW baseline");
    {
        let writer = Region::of_memfd(&fd, true).expect("mmap memfd shared");
        let ids: Vec<u64> = (0..pages as u64).collect();
        writer.fill(&ids);
    }
    let private = Region::of_memfd(&fd, false).expect("mmap memfd private");
    if read_first {
        black_box(private.read_byte_per_page());
    }
    let (_, write) = timed(|| private.write_byte_per_page(0xab));
    micros(write) / pages as f64
}

fn first_touch_us(pages: usize) -> f64 {
    let fresh = Region::anon(pages * PAGE).expect("mmap anon");
    let (_, write) = timed(|| fresh.write_byte_per_page(0xab));
    micros(write) / pages as f64
}

// ---------------------------------------------------------------- scans

struct ScanSample {
    wall_ms: f64,
    cpu_ms: f64,
    engine_cpu_ms: f64,
    rescan_ms: f64,
    zero_folded: u64,
    merged: u64,
    skipped_vma: u64,
    before: Stats,
    after: Stats,
    after_read: Stats,
    verified: bool,
}

fn scan_row(content: Content, pages: usize, plan: &Plan) -> ScanRow {
    let samples: Vec<ScanSample> = (0..plan.runs)
        .map(|_| scan_sample(content, pages))
        .collect();
    let med = |f: fn(&ScanSample) -> f64| median(&samples.iter().map(f).collect::<Vec<_>>());
    let first = &samples[0];
    let bytes = (pages * PAGE) as f64;
    let (wall_ms, cpu_ms) = (med(|s| s.wall_ms), med(|s| s.cpu_ms));
    ScanRow {
        content,
        pages,
        samples: samples.len(),
        wall_ms,
        cpu_ms,
        engine_cpu_ms: med(|s| s.engine_cpu_ms),
        us_per_page: wall_ms * 1e3 / pages as f64,
        gb_per_cpu_s: bytes / (cpu_ms * 1e-3) / 1e9,
        gb_per_wall_s: bytes / (wall_ms * 1e-3) / 1e9,
        rescan_ms: med(|s| s.rescan_ms),
        zero_folded: first.zero_folded,
        merged: first.merged,
        skipped_vma: first.skipped_vma,
        vmas_after: first.after.vmas_used,
        frames_before: first.before.frames_in_use,
        frames_after: first.after.frames_in_use,
        resident_after: first.after.frames_resident,
        resident_after_read: first.after_read.frames_resident,
        verified: samples.iter().all(|s| s.verified),
    }
}

/// A fresh engine, one block filled with `content`, one scan timed, a second
/// scan timed, then every byte read back and checked.
fn scan_sample(content: Content, pages: usize) -> ScanSample {
    let engine = Engine::new(Config::default());
    let block = Block::new(&engine, pages, Hint::FullWrite);
    let ids = content.ids(pages);
    fill(&block, ids.as_deref());
    // The first scan only records what it sees (volatility check); the one
    // timed is the second, which folds and merges.
    engine.scan();
    let before = engine.stats();
    let (report, wall, cpu) = timed_with_cpu(|| engine.scan());
    let after = engine.stats();
    let (_, rescan) = timed(|| engine.scan());
    let verified = content_is(&block, ids.as_deref());
    if !verified {
        eprintln!(
            "ENGINE CHECK FAILED: {content:?} block of {pages} pages reads back wrong after scan"
        );
    }
    ScanSample {
        wall_ms: wall.as_secs_f64() * 1e3,
        cpu_ms: cpu.as_secs_f64() * 1e3,
        engine_cpu_ms: report.cpu_ns as f64 / 1e6,
        rescan_ms: rescan.as_secs_f64() * 1e3,
        zero_folded: report.zero_folded,
        merged: report.merged,
        skipped_vma: report.skipped_vma,
        before,
        after,
        after_read: engine.stats(),
        verified,
    }
}

fn fill(block: &Block, ids: Option<&[u64]>) {
    match ids {
        Some(ids) => block.fill(ids),
        None => block.fill_zero(),
    }
}

fn content_is(block: &Block, ids: Option<&[u64]>) -> bool {
    match ids {
        Some(ids) => block.first_mismatch(ids).is_none(),
        None => block.first_nonzero_page().is_none(),
    }
}
