//! `pagefold demo`: one interpreter-like workload run four ways, side by
//! side, with measured footprints.
//!
//! The workload imitates an interpreter with pass-by-value semantics (R is
//! the model, as in the page-sharing paper): large f64 vectors are
//! - copied on every "function call" that modifies an argument and then
//!   changed in a few places (`y <- x; y[i] <- v`),
//! - created as `numeric(n)` (zero-filled, as the interpreter does) and
//!   written in a few places,
//! - created as results of vector arithmetic that fill a fresh vector
//!   (`y <- a * x + b`, `cumsum(x)`, `ifelse(x > t, x, 0)`),
//! - modified in place when nothing else refers to them.
//!
//! A few "data set" vectors live for the whole run; the temporaries survive
//! until a "garbage collection" frees the oldest of them once the live data
//! exceeds `--size-mb`. At the end a checksum over all live data is taken.
//! The workload is driven by one seeded generator, so every variant performs
//! exactly the same operations and must produce the same checksum.
//!
//! Variants, each in its own forked child so that footprints do not mix:
//! - plain: vectors come from glibc's malloc (calloc where zeroes are read),
//!   copies are memcpy: what the interpreter gets without pagefold;
//! - engine: the engine as the preload serves the interpreter: the malloc
//!   configuration (`Config::malloc_from_env`), vectors of at least
//!   `PAGEFOLD_THRESHOLD` (1 MiB) offered to it and the others glibc's, the
//!   engine taking a vector where its size is copied from (or to learn) and
//!   leaving it to glibc otherwise, every copy through `Engine::copy`;
//! - engine, all: the engine taking every vector (`Engine::alloc`), every
//!   copy mapped: what sharing reaches on this workload and what it costs.
//!   A vector the interpreter writes whole (a result, `numeric(n)`) may
//!   reuse a freed one (`Hint::UninitFullWrite`); a copy's destination is
//!   fresh and mapped by the copy. Configuration: `PAGEFOLD_*` over the
//!   library's defaults, with freed blocks kept as the malloc configuration
//!   keeps them;
//!   in both engine variants every garbage collection wakes the engine's
//!   background scanner (the R paper folded zero pages after GC; here the
//!   scan runs beside the program, within the scanner's CPU cap);
//! - KSM (root only, unless `--no-ksm`): plain, with the child opted into the
//!   kernel's KSM by prctl(PR_SET_MEMORY_MERGE) and ksmd running at
//!   pages_to_scan=1000, sleep_millisecs=20; the knobs are restored afterwards
//!   by `pagefold_bench::ksm::KsmGuard`, also on panic or SIGINT/SIGTERM.
//!
//! The parent samples each child's footprint (distinct physical pages, as
//! `pagefold measure`) with `pagefold_measure::Sampler` and reports peak and
//! time-weighted average, wall and CPU time (the child's own, plus ksmd's for
//! KSM), ratios to plain and the engine's own statistics, which the child
//! sends as JSON over a pipe. Nothing is estimated.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::time::{Duration, Instant};

use pagefold_engine::{Config, Engine, Hint, MALLOC_THRESHOLD};
use pagefold_measure::{Sampler, Series};
use serde::Serialize;
use serde_json::{json, Value};

const PAGE: usize = 4096;
const MIB: f64 = 1024.0 * 1024.0;
/// prctl(PR_SET_MEMORY_MERGE): opt every mapping of the process into KSM (Linux 6.4).
const PR_SET_MEMORY_MERGE: libc::c_int = 67;
/// The engine variant's background scan period; a collection wakes the
/// scanner at once.
const SCAN_INTERVAL: Duration = Duration::from_secs(1);
/// The `"schema"` of `pagefold demo --json`.
const SCHEMA: &str = "pagefold-demo/1";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Working set: live vector data (MiB) above which a garbage collection
    /// frees the oldest temporaries, down to 60%.
    #[arg(long, default_value_t = 192)]
    pub size_mb: u64,
    /// Interpreter statements to run.
    #[arg(long, default_value_t = 2000)]
    pub iterations: u64,
    /// Print one JSON document instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Skip the kernel KSM variant (it needs root and changes machine-wide knobs while it runs).
    #[arg(long)]
    pub no_ksm: bool,
    /// Seed of the workload's generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Footprint sampling interval, in ms.
    #[arg(long, default_value_t = 25)]
    pub sample_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Variant {
    Plain,
    Engine,
    #[serde(rename = "engine_all")]
    EngineAll,
    Ksm,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain",
            Variant::Engine => "engine",
            Variant::EngineAll => "engine, all",
            Variant::Ksm => "KSM",
        }
    }
}

pub fn run(a: Args) -> i32 {
    if a.size_mb == 0 || a.iterations == 0 || a.sample_ms == 0 {
        eprintln!("demo: --size-mb, --iterations and --sample-ms must be positive");
        return 1;
    }
    let mut variants = vec![Variant::Plain, Variant::Engine, Variant::EngineAll];
    let mut notes: Vec<String> = Vec::new();
    let guard = if a.no_ksm {
        notes.push("KSM variant skipped (--no-ksm)".into());
        None
    } else {
        match pagefold_bench::ksm::KsmGuard::acquire() {
            Ok(g) => {
                variants.push(Variant::Ksm);
                Some(g)
            }
            Err(why) => {
                notes.push(format!("KSM variant skipped: {why}"));
                None
            }
        }
    };
    if !a.json {
        println!(
            "pagefold demo: interpreter-like workload, {} statements, live data <= {} MiB, seed {}",
            a.iterations, a.size_mb, a.seed
        );
        println!(
            "running {} (each in its own process) ...",
            variants
                .iter()
                .map(|v| v.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    let mut results = Vec::new();
    let mut failed = false;
    for &v in &variants {
        let r = match v {
            Variant::Ksm => {
                let g = guard.as_ref().expect("KSM variant only with a guard");
                configure_ksm(g).and_then(|()| run_variant(v, &a))
            }
            _ => run_variant(v, &a),
        };
        match r {
            Ok(r) => {
                if !a.json {
                    println!(
                        "  {:<6} done: {:.2} s, peak {:.1} MiB",
                        v.name(),
                        r.wall_s,
                        r.series.summary.peak_bytes as f64 / MIB
                    );
                }
                results.push(r);
            }
            Err(e) => {
                eprintln!("demo: {} variant failed: {e}", v.name());
                failed = true;
            }
        }
    }
    drop(guard); // restores the KSM knobs (also restored on panic/SIGINT/SIGTERM)

    let checksums: Vec<&str> = results.iter().map(|r| r.child.checksum.as_str()).collect();
    let checksums_match = !checksums.is_empty() && checksums.iter().all(|c| *c == checksums[0]);
    if a.json {
        print_json(&a, &results, &notes, checksums_match);
    } else {
        print_table(&a, &results, &notes, checksums_match);
    }
    if !checksums_match && !results.is_empty() {
        eprintln!("demo: CHECKSUMS DIFFER between variants: {checksums:?}");
        return 2;
    }
    if failed {
        1
    } else {
        0
    }
}

fn configure_ksm(g: &pagefold_bench::ksm::KsmGuard) -> Result<(), String> {
    for (knob, value) in [
        ("pages_to_scan", "1000"),
        ("sleep_millisecs", "20"),
        ("run", "1"),
    ] {
        g.set(knob, value)
            .map_err(|e| format!("setting KSM {knob}={value}: {e}"))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Parent side: fork, sample, collect.

/// What the child reports over its pipe.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
struct ChildReport {
    checksum: String,
    wall_ns: u64,
    cpu_ns: u64,
    /// Peak of the live vector data (what the program holds logically).
    peak_live_bytes: u64,
    /// Total bytes of vectors allocated over the run.
    allocated_bytes: u64,
    gcs: u64,
    /// Engine statistics at the end (engine variant).
    engine: Option<Value>,
    /// How the KSM child opted in ("prctl" or "madvise").
    ksm_mode: Option<String>,
    error: Option<String>,
}

struct VariantResult {
    variant: Variant,
    series: Series,
    child: ChildReport,
    wall_s: f64,
    cpu_s: f64,
    ksmd_cpu_s: Option<f64>,
}

fn pipe() -> Result<(i32, i32), String> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`, a local array of two.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    Ok((fds[0], fds[1]))
}

fn ksmd_cpu() -> Option<Duration> {
    let pid = pagefold_bench::timing::find_pid_by_comm("ksmd")?;
    pagefold_bench::timing::pid_cpu(pid)
}

fn run_variant(v: Variant, a: &Args) -> Result<VariantResult, String> {
    let (report_r, report_w) = pipe()?;
    let (release_r, release_w) = pipe()?;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let ksmd0 = (v == Variant::Ksm).then(ksmd_cpu).flatten();
    // SAFETY: no other thread runs here (the previous variant's sampler
    // has been joined, this one's starts after the fork), so the child may
    // allocate and run the workload; it leaves through _exit below and never
    // returns into this function.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: the parent's ends of the two pipes, inherited by this
        // child, which never uses them; each is closed once.
        unsafe {
            libc::close(report_r);
            libc::close(release_w);
        }
        let code = child_main(v, a, report_w, release_r);
        // SAFETY: _exit has no precondition; it ends the child without
        // running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: the child's ends of the two pipes, which the parent never
    // uses; each is closed once.
    unsafe {
        libc::close(report_w);
        libc::close(release_r);
    }
    let sampler = Sampler::spawn(pid as u32, Duration::from_millis(a.sample_ms), false);
    let mut line = String::new();
    // SAFETY: report_r is the open read end of the report pipe, used by
    // nothing else in the parent; the File owns it from here and closes it.
    let read = BufReader::new(unsafe { File::from_raw_fd(report_r) }).read_line(&mut line);
    // The child waits for the release pipe: it is still alive, with its data, until now.
    let series = sampler.stop();
    let ksmd1 = (v == Variant::Ksm).then(ksmd_cpu).flatten();
    // SAFETY: the parent's write end of the release pipe, closed once (the
    // child then sees end of file and exits).
    unsafe { libc::close(release_w) };
    let mut status = 0;
    // SAFETY: `status` is a local int for waitpid to fill.
    unsafe { libc::waitpid(pid, &mut status, 0) };

    let child: ChildReport = match read {
        Ok(n) if n > 0 => {
            serde_json::from_str(line.trim()).map_err(|e| format!("bad report from child: {e}"))?
        }
        _ => {
            return Err(format!(
                "child exited without a report (wait status {status:#x})"
            ))
        }
    };
    if let Some(e) = &child.error {
        return Err(e.clone());
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(format!("child ended with wait status {status:#x}"));
    }
    if series.samples.is_empty() {
        return Err(format!(
            "no footprint sample of the child: {:?}",
            series.error
        ));
    }
    Ok(VariantResult {
        variant: v,
        wall_s: child.wall_ns as f64 / 1e9,
        cpu_s: child.cpu_ns as f64 / 1e9,
        ksmd_cpu_s: match (ksmd0, ksmd1) {
            (Some(x), Some(y)) => Some(y.saturating_sub(x).as_secs_f64()),
            _ => None,
        },
        series,
        child,
    })
}

// ---------------------------------------------------------------------------
// Child side.

fn child_main(v: Variant, a: &Args, report_fd: i32, release_fd: i32) -> i32 {
    let mut report = match v {
        Variant::Plain => run_workload(
            &mut Plain {
                madvise_mergeable: false,
            },
            a,
        ),
        Variant::Engine => {
            // The malloc configuration starts the engine's scanner thread,
            // which scans beside the program, as under the preload.
            let threshold = std::env::var("PAGEFOLD_THRESHOLD")
                .ok()
                .and_then(|t| t.trim().parse::<usize>().ok())
                .map_or(MALLOC_THRESHOLD, |t| t.max(PAGE));
            let mut backend = EngineMem {
                engine: Engine::new(Config::malloc_from_env()),
                threshold,
            };
            let mut r = run_workload(&mut backend, a);
            r.engine = serde_json::to_value(backend.engine.stats()).ok();
            r
        }
        Variant::EngineAll => {
            let cfg = Config {
                recycle_bytes: Config::malloc_from_env().recycle_bytes,
                ..Config::from_env()
            };
            let engine = Engine::new(cfg);
            // The scan after a collection runs on the engine's scanner
            // thread, beside the program.
            engine.start_background(SCAN_INTERVAL);
            let mut backend = EngineAllMem { engine };
            let mut r = run_workload(&mut backend, a);
            r.engine = serde_json::to_value(backend.engine.stats()).ok();
            r
        }
        Variant::Ksm => {
            // SAFETY: PR_SET_MEMORY_MERGE takes integers only and changes
            // nothing but this child's KSM setting.
            let prctl_ok = unsafe { libc::prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) } == 0;
            let mut r = run_workload(
                &mut Plain {
                    madvise_mergeable: !prctl_ok,
                },
                a,
            );
            r.ksm_mode = Some(if prctl_ok { "prctl" } else { "madvise" }.into());
            r
        }
    };
    if report.checksum.is_empty() && report.error.is_none() {
        report.error = Some("workload produced no checksum".into());
    }
    // SAFETY: report_fd is the open write end of the report pipe, owned by
    // this child alone; the File owns it from here and closes it.
    let mut out = unsafe { File::from_raw_fd(report_fd) };
    let mut text = serde_json::to_string(&report).unwrap_or_default();
    text.push('\n');
    if out.write_all(text.as_bytes()).is_err() {
        return 3;
    }
    // Stay alive, memory intact, until the parent has stopped sampling.
    let mut buf = [0u8; 1];
    // SAFETY: reads at most one byte into `buf`, a local one-byte buffer.
    while unsafe { libc::read(release_fd, buf.as_mut_ptr().cast(), 1) } > 0 {}
    0
}

fn cpu_now() -> Duration {
    pagefold_bench::timing::process_cpu()
}

/// How the interpreter fills a new vector before it reads it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// Written in places only: the rest must read zero.
    Sparse,
    /// Every byte written at once, by a computation or by the interpreter's
    /// own zeroing (`numeric(n)`); what the memory held before is never read.
    Whole,
    /// The destination of `Mem::copy`, which fills it.
    CopyTarget,
}

/// Where vectors live. `alloc` returns memory of `bytes` (page-aligned
/// where it is the engine's), zero-filled unless `fill` says every byte is
/// written before it is read (an interpreter's malloc).
trait Mem {
    fn alloc(&mut self, bytes: usize, fill: Fill) -> Option<*mut u8>;
    /// # Safety
    /// Both ranges valid for `bytes`, not overlapping.
    unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, bytes: usize);
    /// # Safety
    /// `p` came from `alloc(bytes)` and is not used again.
    unsafe fn free(&mut self, p: *mut u8, bytes: usize);
    fn after_gc(&mut self) {}
}

/// glibc's malloc, as an interpreter's vectors get it: freed memory is
/// reused from its heap (glibc raises its mmap threshold to the size of a
/// freed mapped chunk, up to 32 MiB, so vectors of these sizes come from
/// the heap after the first free).
struct Plain {
    madvise_mergeable: bool,
}

impl Plain {
    fn malloc(bytes: usize, fill: Fill) -> Option<*mut u8> {
        // SAFETY: calloc and malloc have no preconditions; a null result is
        // handled below.
        let p = unsafe {
            if fill == Fill::Sparse {
                libc::calloc(1, bytes)
            } else {
                libc::malloc(bytes)
            }
        };
        (!p.is_null()).then_some(p.cast())
    }
}

impl Mem for Plain {
    fn alloc(&mut self, bytes: usize, fill: Fill) -> Option<*mut u8> {
        let p = Plain::malloc(bytes, fill)?;
        if self.madvise_mergeable {
            // The whole pages inside the chunk.
            let start = (p as usize).next_multiple_of(PAGE);
            let end = (p as usize + bytes) / PAGE * PAGE;
            if end > start {
                // SAFETY: [start, end) lies inside the chunk just allocated;
                // MADV_MERGEABLE changes no contents.
                unsafe {
                    libc::madvise(
                        start as *mut libc::c_void,
                        end - start,
                        libc::MADV_MERGEABLE,
                    )
                };
            }
        }
        Some(p)
    }
    /// # Safety
    /// As for [`Mem::copy`].
    unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, bytes: usize) {
        // SAFETY: the caller's guarantee: both ranges valid, no overlap.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
    }
    /// # Safety
    /// As for [`Mem::free`].
    unsafe fn free(&mut self, p: *mut u8, _bytes: usize) {
        // SAFETY: p came from malloc or calloc (`alloc`), not used again
        // (the caller's guarantee).
        unsafe { libc::free(p.cast()) };
    }
}

/// The engine as the preload serves an interpreter: vectors of at least
/// `threshold` bytes are offered to it (`Engine::take`), with its malloc
/// configuration (`Config::malloc_from_env`), and what it leaves goes to
/// glibc; every copy goes through `Engine::copy` (the preload offers copies
/// of 128 KiB and more; every vector here is larger), which maps it where
/// both sides are its blocks and learns from the others.
struct EngineMem {
    engine: Engine,
    threshold: usize,
}

impl Mem for EngineMem {
    fn alloc(&mut self, bytes: usize, fill: Fill) -> Option<*mut u8> {
        let hint = match fill {
            Fill::Sparse => Hint::Zeroed,
            Fill::Whole | Fill::CopyTarget => Hint::Uninit,
        };
        let taken = (bytes >= self.threshold)
            .then(|| self.engine.take(bytes, hint))
            .flatten();
        taken.or_else(|| Plain::malloc(bytes, fill))
    }
    /// # Safety
    /// As for [`Mem::copy`].
    unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, bytes: usize) {
        // SAFETY: both ranges valid for `bytes` (the caller's guarantee),
        // which is the engine copy's contract.
        unsafe { self.engine.copy(dst, src, bytes) };
    }
    /// # Safety
    /// As for [`Mem::free`].
    unsafe fn free(&mut self, p: *mut u8, _bytes: usize) {
        // SAFETY: p came from `alloc`, not used again (the caller's
        // guarantee): an engine block or else glibc's chunk.
        if !unsafe { self.engine.free(p) } {
            // SAFETY: not the engine's, so glibc's (`Plain::malloc`).
            unsafe { libc::free(p.cast()) };
        }
    }
    fn after_gc(&mut self) {
        self.engine.request_scan();
    }
}

/// The engine taking every vector (`Engine::alloc`): what sharing reaches
/// when every copy is mapped and every block scanned, and what that costs.
/// A vector the interpreter writes whole may reuse a freed one
/// (`Hint::UninitFullWrite`, with freed vectors kept as the malloc
/// configuration keeps them); a copy's destination is fresh, never
/// faulted, and mapped by the copy.
struct EngineAllMem {
    engine: Engine,
}

impl Mem for EngineAllMem {
    fn alloc(&mut self, bytes: usize, fill: Fill) -> Option<*mut u8> {
        let hint = match fill {
            // Zero-filled and populated at once: the data set is written
            // right after.
            Fill::Sparse => Hint::FullWrite,
            Fill::Whole => Hint::UninitFullWrite,
            Fill::CopyTarget => Hint::None,
        };
        let p = self.engine.alloc(bytes, hint);
        (!p.is_null()).then_some(p)
    }
    /// # Safety
    /// As for [`Mem::copy`].
    unsafe fn copy(&mut self, dst: *mut u8, src: *const u8, bytes: usize) {
        // SAFETY: both ranges valid for `bytes` (the caller's guarantee),
        // which is the engine copy's contract.
        unsafe { self.engine.copy(dst, src, bytes) };
    }
    /// # Safety
    /// As for [`Mem::free`].
    unsafe fn free(&mut self, p: *mut u8, _bytes: usize) {
        // SAFETY: p is a block from `alloc`, not used again (the caller's
        // guarantee).
        unsafe { self.engine.free(p) };
    }
    fn after_gc(&mut self) {
        self.engine.request_scan();
    }
}

/// splitmix64: small, seeded, the same sequence in every variant.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One interpreter vector: `n` doubles at `p`.
///
/// Invariant: `p` is a live allocation of the workload's `Mem` holding `n`
/// initialised doubles (zero-filled by `alloc`, or bytes of an earlier
/// vector, which the statement making this one overwrites before anything
/// reads them; every bit pattern is a double), freed only by `Interp::gc`,
/// which consumes the vector.
struct Vector {
    p: *mut f64,
    n: usize,
}

impl Vector {
    fn bytes(&self) -> usize {
        self.n * 8
    }
    fn slice(&self) -> &[f64] {
        // SAFETY: `n` initialised doubles at `p` (the invariant), live while
        // `self` is; no mutable slice of them exists meanwhile, as
        // `slice_mut` needs `&mut self`.
        unsafe { std::slice::from_raw_parts(self.p, self.n) }
    }
    fn slice_mut(&mut self) -> &mut [f64] {
        // SAFETY: `n` initialised doubles at `p` (the invariant), borrowed
        // exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.p, self.n) }
    }
}

/// Vector lengths in doubles: 0.5, 1, 2 and 4 MiB.
const LENGTHS: [usize; 4] = [64 << 10, 128 << 10, 256 << 10, 512 << 10];

struct Interp<'m, M: Mem> {
    mem: &'m mut M,
    rng: Rng,
    /// The data set: lives for the whole run.
    data: Vec<Vector>,
    /// Temporaries, oldest first.
    temps: std::collections::VecDeque<Vector>,
    live_bytes: usize,
    peak_live_bytes: usize,
    allocated_bytes: u64,
    gcs: u64,
    cap_bytes: usize,
}

impl<M: Mem> Interp<'_, M> {
    fn new_vector(&mut self, n: usize, fill: Fill) -> Result<Vector, String> {
        let p = self
            .mem
            .alloc(n * 8, fill)
            .ok_or_else(|| format!("allocation of {} bytes failed", n * 8))?;
        self.live_bytes += n * 8;
        self.peak_live_bytes = self.peak_live_bytes.max(self.live_bytes);
        self.allocated_bytes += (n * 8) as u64;
        Ok(Vector { p: p.cast(), n })
    }

    /// A vector to work on: the data set half of the time, else a temporary.
    fn pick(&mut self) -> &Vector {
        if self.temps.is_empty() || self.rng.below(2) == 0 {
            let i = self.rng.below(self.data.len() as u64) as usize;
            &self.data[i]
        } else {
            let i = self.rng.below(self.temps.len() as u64) as usize;
            &self.temps[i]
        }
    }

    fn load_data_set(&mut self) -> Result<(), String> {
        for k in 0..8 {
            let n = LENGTHS[self.rng.below(LENGTHS.len() as u64) as usize];
            let mut v = self.new_vector(n, Fill::Sparse)?;
            let s = v.slice_mut();
            match k % 4 {
                // Measurements: every page different.
                0 => s
                    .iter_mut()
                    .for_each(|x| *x = 100.0 + 15.0 * (self.rng.unit() - 0.5)),
                // seq_len(n)
                1 => s
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = (i + 1) as f64),
                // rep(c(1, 2, 3), length.out = n): pages repeat every 3 pages.
                2 => s
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, x)| *x = (i % 3 + 1) as f64),
                // Sparse: mostly zero, a value in every 64th page.
                _ => {
                    for i in (0..n).step_by(64 * PAGE / 8) {
                        s[i] = self.rng.unit();
                    }
                }
            }
            self.data.push(v);
        }
        Ok(())
    }

    /// One statement of the interpreted program.
    fn statement(&mut self) -> Result<(), String> {
        let r = self.rng.below(100);
        if r < 50 {
            // f(x) modifies its argument: y <- x; y[i] <- v
            let (src, n) = {
                let x = self.pick();
                (x.p, x.n)
            };
            let mut y = self.new_vector(n, Fill::CopyTarget)?;
            // SAFETY: `src` belongs to a live vector of n doubles (picked
            // above) and `y` is a new one of the same length, a different
            // allocation: both valid for n * 8 bytes, not overlapping.
            unsafe { self.mem.copy(y.p.cast(), src.cast(), n * 8) };
            let s = y.slice_mut();
            for _ in 0..1 + self.rng.below(8) {
                let i = self.rng.below(n as u64) as usize;
                s[i] = self.rng.unit();
            }
            self.temps.push_back(y);
        } else if r < 65 {
            // y <- numeric(n); y[i] <- v for a few i. The interpreter zero-fills.
            let n = LENGTHS[self.rng.below(LENGTHS.len() as u64) as usize];
            let mut y = self.new_vector(n, Fill::Whole)?;
            // SAFETY: `y` is a new vector of n doubles, not yet borrowed.
            unsafe { std::ptr::write_bytes(y.p, 0, n) };
            let s = y.slice_mut();
            for _ in 0..1 + self.rng.below(4) {
                let i = self.rng.below(n as u64) as usize;
                s[i] = self.rng.unit();
            }
            self.temps.push_back(y);
        } else if r < 90 {
            // A result filling a fresh vector.
            let (src, n) = {
                let x = self.pick();
                (x.p, x.n)
            };
            let op = self.rng.below(3);
            let (m, b) = (self.rng.unit() * 2.0, (self.rng.below(3) as f64) - 1.0);
            let mut y = self.new_vector(n, Fill::Whole)?;
            // SAFETY: `src` belongs to a live vector of n initialised doubles
            // (picked above; only gc frees, and it runs after this slice's
            // last use). `y` is a new allocation, so the mutable slice of it
            // below does not alias this one.
            let x = unsafe { std::slice::from_raw_parts(src as *const f64, n) };
            let out = y.slice_mut();
            match op {
                0 => out.iter_mut().zip(x).for_each(|(o, &v)| *o = m * v + b),
                1 => {
                    let mut acc = 0.0;
                    out.iter_mut().zip(x).for_each(|(o, &v)| {
                        acc += v;
                        *o = acc
                    });
                }
                _ => {
                    let t = m * 50.0;
                    out.iter_mut()
                        .zip(x)
                        .for_each(|(o, &v)| *o = if v > t { v } else { 0.0 });
                }
            }
            self.temps.push_back(y);
        } else if let Some(i) =
            (!self.temps.is_empty()).then(|| self.rng.below(self.temps.len() as u64) as usize)
        {
            // x[i] <- v on a vector nothing else refers to: in place.
            let n = self.temps[i].n;
            for _ in 0..1 + self.rng.below(8) {
                let k = self.rng.below(n as u64) as usize;
                let v = self.rng.unit();
                self.temps[i].slice_mut()[k] = v;
            }
        }
        if self.live_bytes > self.cap_bytes {
            self.gc();
        }
        Ok(())
    }

    /// Frees the oldest temporaries until the live data is at 60% of the cap.
    fn gc(&mut self) {
        let target = self.cap_bytes / 10 * 6;
        while self.live_bytes > target {
            let Some(v) = self.temps.pop_front() else {
                break;
            };
            self.live_bytes -= v.bytes();
            // SAFETY: `v` was allocated by this Mem with v.bytes() bytes and is
            // consumed here (popped from the temporaries), so never used again.
            unsafe { self.mem.free(v.p.cast(), v.bytes()) };
        }
        self.gcs += 1;
        self.mem.after_gc();
    }

    /// FNV-1a over the bits of every live double, data set first.
    fn checksum(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in self.data.iter().chain(self.temps.iter()) {
            h = (h ^ v.n as u64).wrapping_mul(0x100_0000_01b3);
            for &x in v.slice() {
                h = (h ^ x.to_bits()).wrapping_mul(0x100_0000_01b3);
            }
        }
        h
    }
}

fn run_workload<M: Mem>(mem: &mut M, a: &Args) -> ChildReport {
    let (t0, c0) = (Instant::now(), cpu_now());
    let mut it = Interp {
        mem,
        rng: Rng(a.seed),
        data: Vec::new(),
        temps: Default::default(),
        live_bytes: 0,
        peak_live_bytes: 0,
        allocated_bytes: 0,
        gcs: 0,
        cap_bytes: (a.size_mb as usize) << 20,
    };
    let outcome = it
        .load_data_set()
        .and_then(|()| (0..a.iterations).try_for_each(|_| it.statement()));
    let checksum = match &outcome {
        Ok(()) => format!("{:016x}", it.checksum()),
        Err(_) => String::new(),
    };
    let (wall, cpu) = (t0.elapsed(), cpu_now().saturating_sub(c0));
    let report = ChildReport {
        checksum,
        wall_ns: wall.as_nanos() as u64,
        cpu_ns: cpu.as_nanos() as u64,
        peak_live_bytes: it.peak_live_bytes as u64,
        allocated_bytes: it.allocated_bytes,
        gcs: it.gcs,
        engine: None,
        ksm_mode: None,
        error: outcome.err(),
    };
    // Freed only after the parent has its report; the footprint is sampled until then.
    std::mem::forget(it);
    report
}

// ---------------------------------------------------------------------------
// Reports.

fn mib(b: u64) -> f64 {
    b as f64 / MIB
}

fn stat(e: &Option<Value>, path: &[&str]) -> Option<u64> {
    let mut v = e.as_ref()?;
    for k in path {
        v = v.get(k)?;
    }
    v.as_u64().or_else(|| v.as_bool().map(u64::from))
}

fn print_table(a: &Args, results: &[VariantResult], notes: &[String], checksums_match: bool) {
    if results.is_empty() {
        println!("no variant completed");
        return;
    }
    let plain = results.iter().find(|r| r.variant == Variant::Plain);
    let method = match results[0].series.summary.method {
        Some(pagefold_measure::Method::Pfn) => "pfn: exact",
        Some(pagefold_measure::Method::PssProxy) => "PSS proxy: PFNs hidden, not root",
        None => "-",
    };
    println!();
    println!(
        "footprint = distinct physical pages of the child ({method}), sampled every {} ms; lower is better",
        a.sample_ms
    );
    let head: Vec<String> = results
        .iter()
        .map(|r| format!("{:>18}", r.variant.name()))
        .collect();
    println!("{:<28}{}", "", head.join(""));
    let row = |label: &str, f: &dyn Fn(&VariantResult) -> String| {
        let cells: Vec<String> = results.iter().map(|r| format!("{:>18}", f(r))).collect();
        println!("{label:<28}{}", cells.join(""));
    };
    row("peak footprint (MiB)", &|r| {
        format!("{:.1}", mib(r.series.summary.peak_bytes))
    });
    row("average footprint (MiB)", &|r| {
        format!("{:.1}", mib(r.series.summary.average_bytes))
    });
    if let Some(p) = plain {
        let (pp, pa) = (
            p.series.summary.peak_bytes as f64,
            p.series.summary.average_bytes as f64,
        );
        row("peak vs plain", &|r| {
            format!("{:.2}", r.series.summary.peak_bytes as f64 / pp)
        });
        row("average vs plain", &|r| {
            format!("{:.2}", r.series.summary.average_bytes as f64 / pa)
        });
    }
    row("wall time (s)", &|r| format!("{:.2}", r.wall_s));
    row("CPU time (s)", &|r| format!("{:.2}", r.cpu_s));
    row("  + ksmd CPU (s)", &|r| {
        r.ksmd_cpu_s.map_or("-".into(), |c| format!("{c:.2}"))
    });
    if let Some(p) = plain {
        row("wall vs plain", &|r| format!("{:.2}", r.wall_s / p.wall_s));
        row("CPU (+ksmd) vs plain", &|r| {
            format!("{:.2}", (r.cpu_s + r.ksmd_cpu_s.unwrap_or(0.0)) / p.cpu_s)
        });
    }
    row("samples", &|r| r.series.summary.samples.to_string());
    row("checksum", &|r| r.child.checksum.clone());
    let c = &results[0].child;
    println!(
        "workload: {} statements, {} garbage collections, {:.0} MiB allocated in total, live data peak {:.0} MiB",
        a.iterations,
        c.gcs,
        mib(c.allocated_bytes),
        mib(c.peak_live_bytes)
    );
    for (name, e) in results
        .iter()
        .filter(|r| matches!(r.variant, Variant::Engine | Variant::EngineAll))
        .map(|r| (r.variant.name(), &r.child.engine))
    {
        let g = |p: &[&str]| stat(e, p).unwrap_or(0);
        let fb = ["memfd", "mmap", "vma_budget", "uffd", "frames"]
            .iter()
            .filter(|k| g(&["fallbacks", k]) > 0)
            .map(|k| format!("{k}={}", g(&["fallbacks", k])))
            .collect::<Vec<_>>();
        println!(
            "{name}: {} pages shared by copy, {} zero pages folded, {} pages merged, {} frames released after divergence",
            g(&["pages_shared_by_copy"]),
            g(&["zero_folded"]),
            g(&["merged"]),
            g(&["diverged_released"])
        );
        println!(
            "        {} allocations left to glibc, {} blocks reused, {} scans ({:.2} s CPU), {:.0} MiB copied plainly, {} VMAs, {:.1} KiB metadata at the end, fallbacks: {}",
            g(&["allocs_declined"]) + g(&["allocs_left_to_heap"]),
            g(&["recycled"]),
            g(&["scans"]),
            g(&["scan_cpu_ns"]) as f64 / 1e9,
            mib(g(&["bytes_copied_plain"])),
            g(&["vmas_used"]),
            g(&["metadata_bytes"]) as f64 / 1024.0,
            if fb.is_empty() { "none".into() } else { fb.join(", ") }
        );
        if g(&["frames_active"]) == 0 || g(&["protected_scan"]) == 0 {
            println!(
                "        degraded: frames {}, write-protected scans {}",
                if g(&["frames_active"]) == 1 {
                    "on"
                } else {
                    "OFF"
                },
                if g(&["protected_scan"]) == 1 {
                    "on"
                } else {
                    "OFF"
                }
            );
        }
    }
    if let Some(k) = results.iter().find(|r| r.variant == Variant::Ksm) {
        let merging = k
            .series
            .samples
            .iter()
            .filter_map(|s| s.ksm.as_ref().map(|k| k.merging_pages));
        let (peak, last) = merging.fold((None, None), |(p, _), m| {
            (Some(p.unwrap_or(0).max(m)), Some(m))
        });
        let show = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
        println!(
            "KSM: opted in by {}, ksmd at pages_to_scan=1000 sleep_millisecs=20; pages merged: peak {}, at the end {}",
            k.child.ksm_mode.as_deref().unwrap_or("?"),
            show(peak),
            show(last)
        );
    }
    for n in notes {
        println!("note: {n}");
    }
    println!(
        "checksums {}",
        if checksums_match {
            "match: every variant computed the same data"
        } else {
            "DIFFER"
        }
    );
}

fn print_json(a: &Args, results: &[VariantResult], notes: &[String], checksums_match: bool) {
    let plain = results.iter().find(|r| r.variant == Variant::Plain);
    let variants: Vec<Value> = results
        .iter()
        .map(|r| {
            let s = &r.series.summary;
            let ratio = |x: u64, p: Option<u64>| p.filter(|&p| p > 0).map(|p| x as f64 / p as f64);
            json!({
                "variant": r.variant,
                "footprint": {
                    "peak_bytes": s.peak_bytes,
                    "average_bytes": s.average_bytes,
                    "mean_bytes": s.mean_bytes,
                    "samples": s.samples,
                    "interval_ms": s.interval_ms,
                    "method": s.method,
                    "peak_vs_plain": ratio(s.peak_bytes, plain.map(|p| p.series.summary.peak_bytes)),
                    "average_vs_plain": ratio(s.average_bytes, plain.map(|p| p.series.summary.average_bytes)),
                },
                "wall_s": r.wall_s,
                "cpu_s": r.cpu_s,
                "ksmd_cpu_s": r.ksmd_cpu_s,
                "wall_vs_plain": plain.map(|p| r.wall_s / p.wall_s),
                "cpu_with_ksmd_vs_plain": plain.map(|p| (r.cpu_s + r.ksmd_cpu_s.unwrap_or(0.0)) / p.cpu_s),
                "checksum": r.child.checksum,
                "gcs": r.child.gcs,
                "allocated_bytes": r.child.allocated_bytes,
                "peak_live_bytes": r.child.peak_live_bytes,
                "engine_stats": r.child.engine,
                "ksm_mode": r.child.ksm_mode,
                "ksm_at_end": r.series.samples.iter().rev().find_map(|s| s.ksm.as_ref()),
                "ksm_merging_pages_peak": r.series.samples.iter().filter_map(|s| s.ksm.as_ref().map(|k| k.merging_pages)).max(),
            })
        })
        .collect();
    let doc = json!({
        "workload": {
            "iterations": a.iterations,
            "size_mb": a.size_mb,
            "seed": a.seed,
            "sample_ms": a.sample_ms,
        },
        "variants": variants,
        "checksums_match": checksums_match,
        "notes": notes,
    });
    println!(
        "{}",
        pagefold_measure::schema::pretty(SCHEMA, &doc).unwrap_or_default()
    );
}
