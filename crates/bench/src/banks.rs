//! `pagefold bench --suite banks`: two memory-intensive programs running at
//! once, a streaming one and a random-access one, with their frames from all
//! banks (shared) and from disjoint halves of the banks (partitioned, through
//! the engine's page colouring), side by side in one run.
//!
//! Measured, interleaved over the runs, medians: each program's throughput
//! together and alone; what colouring costs (time to get and touch N frames
//! coloured against plain, pages refused per page kept); the row-conflict
//! probe's times of address pairs the bank map puts in the same bank and a
//! different row against pairs in different banks (if the map is right and
//! the addresses real, the first are slower). A control runs both programs
//! coloured to the same half of the banks: colouring without partitioning,
//! so that an effect of colouring itself (which pages, allocated when) is
//! not taken for one of banks. Simulated: the row-buffer
//! model's hit rates for the same two access patterns, shared and
//! partitioned. The report says which numbers are which.
//!
//! The two programs are threads of this process, each with its own engine
//! (so each has its own frames and its own bank set), each given a buffer
//! larger than it could keep in cache: the stream reads one word per cache
//! line in order, the random reader follows a dependent chain of loads
//! (each address depends on the last value read), so its rate is its latency.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use pagefold_banks::colour::Colouring;
use pagefold_banks::machine::Machine;
use pagefold_banks::map::{self, BankMap};
use pagefold_banks::mem::{Huge, Populated};
use pagefold_banks::model::{self, Pattern, Program};
use pagefold_banks::probe::{self, ProbeConfig};
use pagefold_banks::BankSet;
use pagefold_engine::{Config, Engine, Hint, PAGE};
use serde::Serialize;

use crate::stats::Spread;

/// What the suite is asked to do.
pub struct BanksPlan {
    pub runs: usize,
    /// MiB of each program's buffer.
    pub mib: usize,
    /// Seconds each measurement runs.
    pub seconds: f64,
    /// MiB of frames timed for the colouring cost.
    pub cost_mib: usize,
}

/// Where the two programs' frames come from.
#[derive(Clone, Copy)]
enum Layout {
    /// Any page (no colouring).
    Shared,
    /// Disjoint halves of the banks.
    Partitioned,
    /// Both coloured to the same half: colouring without partitioning, the
    /// control that tells an effect of colouring itself from one of banks.
    SameBanks,
}

/// Throughput of both programs in one configuration, one run.
#[derive(Clone, Copy, Debug, Default, Serialize)]
struct Pair {
    /// GB/s of cache lines the stream read.
    stream_gbs: f64,
    /// Million dependent loads per second of the random reader.
    random_mops: f64,
}

#[derive(Serialize)]
pub struct BanksResult {
    pub machine: Machine,
    pub addresses_real: bool,
    pub map: BankMap,
    pub map_why: String,
    pub stream_banks: String,
    pub random_banks: String,
    pub runs: usize,
    pub mib: usize,
    pub seconds: f64,
    pub shared_stream_gbs: Spread,
    pub shared_random_mops: Spread,
    pub partitioned_stream_gbs: Spread,
    pub partitioned_random_mops: Spread,
    /// Both coloured to the stream's half (the control).
    pub same_banks_stream_gbs: Spread,
    pub same_banks_random_mops: Spread,
    pub alone_stream_gbs: Spread,
    pub alone_random_mops: Spread,
    /// Pages of the two buffers whose banks lay in their program's set, of all (partitioned runs).
    pub partitioned_pages_in_set: f64,
    pub cost_mib: usize,
    pub plain_frames_ms: Spread,
    pub coloured_frames_ms: Spread,
    pub refused_per_kept: Spread,
    pub colour_unmet_pages: u64,
    pub probe: Option<ProbeSplit>,
    pub model: ModelResult,
    pub verified: bool,
}

/// The probe's pairs split by what the bank map says about them.
#[derive(Serialize)]
pub struct ProbeSplit {
    pub pairs: usize,
    pub bimodal: bool,
    pub same_bank_pairs: usize,
    pub same_bank_cycles: f64,
    pub other_bank_cycles: f64,
}

/// Simulated row-buffer hit rates and mean access times.
#[derive(Serialize)]
pub struct ModelResult {
    pub accesses: u64,
    pub shared: [model::Counts; 2],
    pub partitioned: [model::Counts; 2],
    pub stream_alone: model::Counts,
    pub stream_alone_partitioned: model::Counts,
}

/// Runs the suite; Err on setup failures only.
pub fn run(plan: &BanksPlan) -> Result<BanksResult, String> {
    let machine = Machine::probe();
    let (bank_map, map_why) = map::assumed_for_this_cpu();
    let half = BankSet::parse(
        &format!("0-{}", bank_map.bank_count() / 2 - 1),
        bank_map.bank_count(),
    )
    .map_err(|e| e.to_string())?;
    let stream_set = colouring(&bank_map, half);
    let random_set = colouring(&bank_map, half.complement(bank_map.bank_count()));
    let mut shared = Vec::new();
    let mut split = Vec::new();
    let mut same = Vec::new();
    let mut alone = Vec::new();
    let mut in_set = (0u64, 0u64);
    let mut verified = true;
    for run in 0..plan.runs {
        eprintln!("bench: banks run {}/{}", run + 1, plan.runs);
        let mut order = [Layout::Shared, Layout::Partitioned, Layout::SameBanks];
        order.rotate_left(run % 3);
        for layout in order {
            let sets = match layout {
                Layout::Shared => None,
                Layout::Partitioned => Some((stream_set.clone(), random_set.clone())),
                Layout::SameBanks => Some((stream_set.clone(), stream_set.clone())),
            };
            let (pair, ok, fit) = together(plan, sets)?;
            verified &= ok;
            match layout {
                Layout::Shared => shared.push(pair),
                Layout::Partitioned => {
                    split.push(pair);
                    in_set = (in_set.0 + fit.0, in_set.1 + fit.1);
                }
                Layout::SameBanks => same.push(pair),
            }
        }
        alone.push(each_alone(plan)?);
    }
    let (plain_ms, coloured_ms, refused, unmet) = colouring_cost(plan, [&stream_set, &random_set])?;
    let probe = probe_split(&bank_map);
    let model = simulate(&bank_map, half);
    let spread = |v: &[Pair], f: fn(&Pair) -> f64| Spread::of(&v.iter().map(f).collect::<Vec<_>>());
    Ok(BanksResult {
        addresses_real: machine.addresses_real(),
        machine,
        stream_banks: half.to_string(),
        random_banks: half.complement(bank_map.bank_count()).to_string(),
        map: bank_map,
        map_why,
        runs: plan.runs,
        mib: plan.mib,
        seconds: plan.seconds,
        shared_stream_gbs: spread(&shared, |p| p.stream_gbs),
        shared_random_mops: spread(&shared, |p| p.random_mops),
        partitioned_stream_gbs: spread(&split, |p| p.stream_gbs),
        partitioned_random_mops: spread(&split, |p| p.random_mops),
        same_banks_stream_gbs: spread(&same, |p| p.stream_gbs),
        same_banks_random_mops: spread(&same, |p| p.random_mops),
        alone_stream_gbs: spread(&alone, |p| p.stream_gbs),
        alone_random_mops: spread(&alone, |p| p.random_mops),
        partitioned_pages_in_set: in_set.0 as f64 / in_set.1.max(1) as f64,
        cost_mib: plan.cost_mib,
        plain_frames_ms: Spread::of(&plain_ms),
        coloured_frames_ms: Spread::of(&coloured_ms),
        refused_per_kept: Spread::of(&refused),
        colour_unmet_pages: unmet,
        probe,
        model,
        verified,
    })
}

fn colouring(map: &BankMap, set: BankSet) -> Colouring {
    Colouring {
        map: map.clone(),
        set,
    }
}

/// An engine, colouring its frames with `banks` if given.
fn engine(banks: Option<Colouring>) -> Engine {
    Engine::new(Config {
        banks,
        ..Config::default()
    })
}

/// A buffer of `mib` MiB from `e`, every word written with its index mixed.
struct Buffer<'a> {
    e: &'a Engine,
    ptr: *mut u64,
    words: usize,
}

impl<'a> Buffer<'a> {
    fn new(e: &'a Engine, mib: usize) -> Result<Buffer<'a>, String> {
        let bytes = mib << 20;
        let ptr = e.alloc(bytes, Hint::None) as *mut u64;
        if ptr.is_null() {
            return Err(format!("the engine could not allocate {mib} MiB"));
        }
        let words = bytes / 8;
        for i in 0..words {
            // SAFETY: i < words, inside the block just allocated.
            unsafe { ptr.add(i).write(mix(i as u64)) };
        }
        Ok(Buffer { e, ptr, words })
    }

    fn words(&self) -> &[u64] {
        // SAFETY: the block holds `words` initialised u64s and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.words) }
    }

    /// Whether every word still holds what was written.
    fn intact(&self) -> bool {
        self.words()
            .iter()
            .enumerate()
            .all(|(i, &w)| w == mix(i as u64))
    }

    /// Of its pages, how many lie wholly in `c`'s set (needs readable PFNs).
    fn pages_in_set(&self, c: &Colouring) -> (u64, u64) {
        let Some(map) = pagefold_banks::pfn::Pagemap::open() else {
            return (0, 0);
        };
        let pages = self.words * 8 / PAGE;
        let fit = (0..pages)
            .filter_map(|i| map.pfn(self.ptr as usize + i * PAGE))
            .filter(|&pfn| c.fits(pfn))
            .count();
        (fit as u64, pages as u64)
    }
}

impl Drop for Buffer<'_> {
    fn drop(&mut self) {
        // SAFETY: ptr came from this engine's alloc and nothing refers to it any more.
        unsafe { self.e.free(self.ptr as *mut u8) };
    }
}

fn mix(i: u64) -> u64 {
    i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i >> 7)
}

/// Seconds of CPU time the calling thread has used. Rates are per second of
/// the thread's own CPU time, so that sharing the CPUs with other work (the
/// machine is shared) does not count as slowness of the memory.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the local it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Lines per CPU-second the stream reads until `stop`.
fn stream(words: &[u64], stop: &AtomicBool) -> f64 {
    let start = thread_cpu_s();
    let mut lines = 0u64;
    let mut sum = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for chunk in words.chunks(1 << 15) {
            for line in chunk.iter().step_by(8) {
                sum = sum.wrapping_add(*line);
            }
            lines += chunk.len().div_ceil(8) as u64;
            if stop.load(Ordering::Relaxed) {
                break;
            }
        }
    }
    std::hint::black_box(sum);
    lines as f64 * 64.0 / (thread_cpu_s() - start) / 1e9
}

/// Million dependent random loads per CPU-second until `stop`.
fn random(words: &[u64], stop: &AtomicBool) -> f64 {
    let start = thread_cpu_s();
    let mask = (1usize << (usize::BITS - 1 - words.len().leading_zeros())) - 1;
    let mut x = 0x1234_5678u64;
    let mut loads = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..4096 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = words[x as usize & mask];
            x ^= v & 0xff;
        }
        loads += 4096;
    }
    std::hint::black_box(x);
    loads as f64 / (thread_cpu_s() - start) / 1e6
}

/// Both programs at once; their rates, whether their bytes were intact, and
/// (partitioned) their pages in set of all pages.
fn together(
    plan: &BanksPlan,
    sets: Option<(Colouring, Colouring)>,
) -> Result<(Pair, bool, (u64, u64)), String> {
    let (s_set, r_set) = match &sets {
        Some((s, r)) => (Some(s.clone()), Some(r.clone())),
        None => (None, None),
    };
    let (es, er) = (engine(s_set), engine(r_set));
    let (bs, br) = (Buffer::new(&es, plan.mib)?, Buffer::new(&er, plan.mib)?);
    let fit = match &sets {
        Some((s, r)) => {
            let (a, b) = (bs.pages_in_set(s), br.pages_in_set(r));
            (a.0 + b.0, a.1 + b.1)
        }
        None => (0, 0),
    };
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(3);
    let (stream_words, random_words) = (bs.words(), br.words());
    let (gbs, mops) = std::thread::scope(|scope| {
        let s = scope.spawn(|| {
            barrier.wait();
            stream(stream_words, &stop)
        });
        let r = scope.spawn(|| {
            barrier.wait();
            random(random_words, &stop)
        });
        barrier.wait();
        std::thread::sleep(Duration::from_secs_f64(plan.seconds));
        stop.store(true, Ordering::Relaxed);
        (s.join().unwrap_or(0.0), r.join().unwrap_or(0.0))
    });
    let ok = bs.intact() && br.intact();
    Ok((
        Pair {
            stream_gbs: gbs,
            random_mops: mops,
        },
        ok,
        fit,
    ))
}

/// Each program alone, unpartitioned.
fn each_alone(plan: &BanksPlan) -> Result<Pair, String> {
    let e = engine(None);
    let b = Buffer::new(&e, plan.mib)?;
    let words = b.words();
    let timed = |f: fn(&[u64], &AtomicBool) -> f64| {
        let stop = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let h = scope.spawn(|| f(words, &stop));
            std::thread::sleep(Duration::from_secs_f64(plan.seconds));
            stop.store(true, Ordering::Relaxed);
            h.join().unwrap_or(0.0)
        })
    };
    Ok(Pair {
        stream_gbs: timed(stream),
        random_mops: timed(random),
    })
}

/// Milliseconds to allocate and touch `cost_mib` of frames plain and
/// coloured (interleaved; coloured by each of the two sets in turn, as the
/// pages one set refused are the next one's), refused pages per kept page,
/// pages left unmet.
#[allow(clippy::type_complexity)]
fn colouring_cost(
    plan: &BanksPlan,
    sets: [&Colouring; 2],
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>, u64), String> {
    let (mut plain, mut coloured, mut refused) = (Vec::new(), Vec::new(), Vec::new());
    let mut unmet = 0;
    for i in 0..plan.runs.max(3) * 2 {
        for banks in [None, Some(sets[i % 2].clone())] {
            let on = banks.is_some();
            let e = engine(banks);
            churn(plan.cost_mib * 2);
            let start = Instant::now();
            let p = e.alloc(plan.cost_mib << 20, Hint::None);
            if p.is_null() {
                return Err("the engine could not allocate".into());
            }
            for i in (0..plan.cost_mib << 20).step_by(PAGE) {
                // SAFETY: inside the block just allocated.
                unsafe { p.add(i).write(1) };
            }
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let s = e.stats();
            // SAFETY: p came from e.alloc and is not used after.
            unsafe { e.free(p) };
            if on {
                coloured.push(ms);
                refused.push(s.colour_rejected as f64 / s.coloured_pages.max(1) as f64);
                unmet += s.colour_unmet;
            } else {
                plain.push(ms);
            }
        }
    }
    Ok((plain, coloured, refused, unmet))
}

/// Writes and unmaps `mib` MiB of plain 4 KiB pages, so that the next
/// allocation draws from freshly freed pages of every colour, not from the
/// pages the previous measurement (coloured or not) just gave back: the
/// kernel hands out the most recently freed pages first.
fn churn(mib: usize) {
    drop(Populated::new(mib << 20, Huge::Refused));
}

/// The probe's pairs split by the map: same bank and different row, or different bank.
fn probe_split(map: &BankMap) -> Option<ProbeSplit> {
    let r = probe::run(&ProbeConfig::default()).ok()?;
    let base_bank = map.bank_of(r.base_pa);
    let (mut same, mut other) = (Vec::new(), Vec::new());
    for s in &r.samples {
        if map.bank_of(s.pa) != base_bank {
            other.push(s.cycles as f64);
        } else if s.pa >> 17 != r.base_pa >> 17 {
            same.push(s.cycles as f64);
        }
    }
    Some(ProbeSplit {
        pairs: r.samples.len(),
        bimodal: r.bimodal,
        same_bank_pairs: same.len(),
        same_bank_cycles: crate::timing::median(&same),
        other_bank_cycles: crate::timing::median(&other),
    })
}

/// The row-buffer model on the same two patterns: 16 MiB each (the pattern
/// matters, not the size), a million accesses each.
fn simulate(map: &BankMap, half: BankSet) -> ModelResult {
    let accesses = 1_000_000;
    let programs = [
        Program {
            pattern: Pattern::Stream,
            pages: 4096,
            banks: half,
        },
        Program {
            pattern: Pattern::Random,
            pages: 4096,
            banks: half.complement(map.bank_count()),
        },
    ];
    let run = |p: &[Program], part: bool| model::simulate(map, 17, p, accesses, part, 42);
    let two = |v: Vec<model::Counts>| [v[0], v[1]];
    ModelResult {
        accesses,
        shared: two(run(&programs, false)),
        partitioned: two(run(&programs, true)),
        stream_alone: run(&programs[..1], false)[0],
        stream_alone_partitioned: run(&programs[..1], true)[0],
    }
}

/// The report: which numbers are measured and which simulated.
pub fn markdown(r: &BanksResult) -> String {
    let m = &r.machine;
    let mut s = String::new();
    let addresses = if !m.pfns_visible {
        "hidden (not root): nothing was coloured"
    } else if m.hypervisor {
        "guest-physical (a virtual machine): the bank map cannot be checked against the memory controller"
    } else {
        "host-physical"
    };
    s += &format!(
        "Machine: {} (family {} model {:#x}){}; physical addresses {addresses}.\n\
         Bank map: `{}` ({} banks, functions {}), a table entry ASSUMED for this CPU: {}.\n\
         The stream gets banks {}, the random reader banks {} when partitioned; {} MiB each, {:.1} s per measurement, {} runs, medians (min-max).\n\n",
        m.model_name,
        m.family,
        m.model,
        if m.hypervisor { ", under a hypervisor" } else { "" },
        r.map.name,
        r.map.bank_count(),
        r.map.describe().join(" "),
        r.map_why,
        r.stream_banks,
        r.random_banks,
        r.mib,
        r.seconds,
        r.runs
    );
    let f = |x: &Spread, d: usize| format!("{:.d$} ({:.d$}-{:.d$})", x.median, x.min, x.max);
    let ratio = |a: &Spread, b: &Spread| b.median / a.median;
    s += &format!(
        "| measured | shared banks | partitioned | partitioned / shared | both coloured to banks {} (control) | control / shared | alone |\n|---|---|---|---|---|---|---|\n",
        r.stream_banks
    );
    s += &format!(
        "| stream, GB of lines read per CPU-second | {} | {} | {:.3} | {} | {:.3} | {} |\n",
        f(&r.shared_stream_gbs, 2),
        f(&r.partitioned_stream_gbs, 2),
        ratio(&r.shared_stream_gbs, &r.partitioned_stream_gbs),
        f(&r.same_banks_stream_gbs, 2),
        ratio(&r.shared_stream_gbs, &r.same_banks_stream_gbs),
        f(&r.alone_stream_gbs, 2)
    );
    s += &format!(
        "| random reader, M dependent loads per CPU-second | {} | {} | {:.3} | {} | {:.3} | {} |\n",
        f(&r.shared_random_mops, 2),
        f(&r.partitioned_random_mops, 2),
        ratio(&r.shared_random_mops, &r.partitioned_random_mops),
        f(&r.same_banks_random_mops, 2),
        ratio(&r.shared_random_mops, &r.same_banks_random_mops),
        f(&r.alone_random_mops, 2)
    );
    s += &format!(
        "\nPartitioned runs: {:.1}% of the two buffers' pages lay in their program's banks (by the assumed map).\n\n",
        r.partitioned_pages_in_set * 100.0
    );
    s += &format!(
        "| measured: colouring cost, {} MiB of fresh frames allocated and touched | plain | coloured | coloured / plain |\n|---|---|---|---|\n",
        r.cost_mib
    );
    s += &format!(
        "| ms | {} | {} | {:.2} |\n| pages refused per page kept | - | {} | - |\n| pages left uncoloured | - | {} | - |\n",
        f(&r.plain_frames_ms, 1),
        f(&r.coloured_frames_ms, 1),
        ratio(&r.plain_frames_ms, &r.coloured_frames_ms),
        f(&r.refused_per_kept, 2),
        r.colour_unmet_pages
    );
    if let Some(p) = &r.probe {
        s += &format!(
            "\n| measured: row-conflict probe, {} pairs (base read then candidate, both flushed) | median cycles |\n|---|---|\n\
             | same bank, other row (by the assumed map), {} pairs | {:.0} |\n| other banks | {:.0} |\n\
             | two groups of times (a row-conflict signal)? | {} |\n",
            p.pairs,
            p.same_bank_pairs,
            p.same_bank_cycles,
            p.other_bank_cycles,
            if p.bimodal { "yes" } else { "no" }
        );
    }
    let mm = &r.model;
    s += &format!(
        "\n| simulated: row-buffer model, {} accesses each, same patterns | stream hit rate | stream mean ns | random hit rate | random mean ns |\n|---|---|---|---|---|\n",
        mm.accesses
    );
    for (name, c) in [
        ("shared banks", &mm.shared),
        ("partitioned", &mm.partitioned),
    ] {
        s += &format!(
            "| {name} | {:.3} | {:.1} | {:.3} | {:.1} |\n",
            c[0].hit_rate(),
            c[0].mean_ns(),
            c[1].hit_rate(),
            c[1].mean_ns()
        );
    }
    s += &format!(
        "| stream alone, shared / partitioned | {:.3} / {:.3} | {:.1} / {:.1} | - | - |\n",
        mm.stream_alone.hit_rate(),
        mm.stream_alone_partitioned.hit_rate(),
        mm.stream_alone.mean_ns(),
        mm.stream_alone_partitioned.mean_ns()
    );
    s += &format!(
        "\nBytes read back intact in every run: {}.\n",
        if r.verified { "yes" } else { "NO" }
    );
    s
}
