//! Forced failures (Config.inject) and spent budgets: the engine must fall
//! back to plain copies and plain memory, never lose or corrupt a byte, and
//! say so in `stats().fallbacks`.
//!
//! `fail_mmap_after` is a process-global counter and the VMA tests count the
//! whole process's mappings, so every test here takes one lock: they run one
//! after the other, each starting from a fresh Engine (which resets the
//! injection), and the last thing each does is reset it again.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pagefold_engine::{Config, Engine, Hint, Inject, Stats, PAGE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the lock; on the way out (pass or fail) turns mmap injection off.
struct Serial(#[allow(dead_code)] MutexGuard<'static, ()>);

fn serial() -> Serial {
    Serial(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

impl Drop for Serial {
    fn drop(&mut self) {
        drop(Engine::new(Config::default()));
    }
}

fn seed() -> u64 {
    std::env::var("PAGEFOLD_FALLBACK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: the pointer and length describe a live block of this test, which outlives every use
    // of the slice.
    unsafe { std::slice::from_raw_parts(p, len) }
}

fn pattern(p: usize) -> Vec<u8> {
    (0..PAGE)
        .map(|i| ((i * (2 * p + 9)) as u8) ^ (p as u8).wrapping_mul(53) | 0x10)
        .collect()
}

fn unique(k: usize) -> Vec<u8> {
    let mut v = pattern(1000 + k);
    v[..8].copy_from_slice(&(k as u64 + 1).to_le_bytes());
    v
}

struct Blk {
    ptr: *mut u8,
    shadow: Vec<u8>,
}

impl Blk {
    fn len(&self) -> usize {
        self.shadow.len()
    }
    fn write(&mut self, off: usize, data: &[u8]) {
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
        self.shadow[off..off + data.len()].copy_from_slice(data);
    }
    fn check(&self, ctx: &str) {
        let got = bytes(self.ptr, self.len());
        if got != &self.shadow[..] {
            let first = (0..self.len()).find(|&i| got[i] != self.shadow[i]).unwrap();
            let bad = (0..self.len())
                .filter(|&i| got[i] != self.shadow[i])
                .count();
            panic!(
                "{ctx}: block at {:p} differs from plain memory: first at byte {first} (page {} + {}), \
                 {bad} bytes differ; got {:02x?} want {:02x?}",
                self.ptr,
                first / PAGE,
                first % PAGE,
                &got[first..(first + 8).min(self.len())],
                &self.shadow[first..(first + 8).min(self.len())]
            );
        }
    }
}

/// Allocates (None if the engine returned null, which it may only do when
/// even plain anonymous memory cannot be had).
fn alloc(e: &Engine, pages: usize, hint: Hint) -> Option<Blk> {
    let ptr = e.alloc(pages * PAGE, hint);
    (!ptr.is_null()).then(|| Blk {
        ptr,
        shadow: vec![0; pages * PAGE],
    })
}

/// A seeded single-threaded workload of every operation, each checked against
/// the shadows; with `scanner`, another thread scans all along. Frees
/// everything at the end and checks the engine is empty.
fn workload(
    e: &Engine,
    seed: u64,
    ops: usize,
    may_fail_alloc: bool,
    scanner: bool,
    ctx: &str,
) -> Stats {
    let mut rng = StdRng::seed_from_u64(seed);
    let stop = Arc::new(AtomicBool::new(false));
    let bg = scanner.then(|| {
        let (e, stop) = (e.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                e.scan();
                // A breath between scans: std's Mutex is not fair, and a
                // thread rescanning back to back starves the workload.
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        })
    });
    let mut blocks: Vec<Blk> = Vec::new();
    let mut null_allocs = 0;
    for op in 0..ops {
        let ctx = format!("{ctx} seed {seed} op {op}");
        if blocks.len() < 2 || (blocks.len() < 10 && rng.gen_bool(0.08)) {
            let pages = rng.gen_range(1..=48);
            let hint = if rng.gen_bool(0.3) {
                Hint::FullWrite
            } else {
                Hint::None
            };
            match alloc(e, pages, hint) {
                Some(b) => {
                    b.check(&format!("{ctx}: fresh block"));
                    blocks.push(b)
                }
                None if may_fail_alloc => null_allocs += 1,
                None => panic!("{ctx}: alloc returned null without any mmap failure"),
            }
            continue;
        }
        let bi = rng.gen_range(0..blocks.len());
        match rng.gen_range(0..12) {
            0 if blocks.len() > 2 => {
                blocks[bi].check(&format!("{ctx}: before free"));
                let b = blocks.swap_remove(bi);
                // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing
                // uses it after this free.
                assert!(unsafe { e.free(b.ptr) }, "{ctx}: free returned false");
            }
            1 | 2 => {
                // Whole pages: duplicates, zeros, unique content.
                let np = blocks[bi].len() / PAGE;
                for _ in 0..rng.gen_range(1..=np) {
                    let p = rng.gen_range(0..np);
                    let content = match rng.gen_range(0..4) {
                        0 => vec![0u8; PAGE],
                        1 | 2 => pattern(rng.gen_range(0..3)),
                        _ => unique(rng.gen_range(0..1_000_000)),
                    };
                    blocks[bi].write(p * PAGE, &content);
                }
            }
            3 => {
                let off = rng.gen_range(0..blocks[bi].len());
                let len = rng.gen_range(1..=(blocks[bi].len() - off).min(3 * PAGE));
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                blocks[bi].write(off, &data);
            }
            4..=7 => {
                let di = rng.gen_range(0..blocks.len());
                let max = blocks[bi].len().min(blocks[di].len());
                let len = if max >= PAGE && rng.gen_bool(0.5) {
                    rng.gen_range(1..=max / PAGE) * PAGE
                } else {
                    rng.gen_range(1..=max)
                };
                let soff = if len % PAGE == 0 && rng.gen_bool(0.5) {
                    rng.gen_range(0..=(blocks[bi].len() - len) / PAGE) * PAGE
                } else {
                    rng.gen_range(0..=blocks[bi].len() - len)
                };
                let r = soff % PAGE;
                let doff = if rng.gen_bool(0.8) && r + len <= blocks[di].len() {
                    rng.gen_range(0..=(blocks[di].len() - len - r) / PAGE) * PAGE + r
                } else {
                    rng.gen_range(0..=blocks[di].len() - len)
                };
                let (s, d) = (blocks[bi].ptr, blocks[di].ptr);
                // SAFETY: both ranges lie inside live blocks this test allocated, each at least the
                // length copied.
                unsafe { e.copy(d.add(doff), s.add(soff), len) };
                if bi == di {
                    blocks[bi].shadow.copy_within(soff..soff + len, doff);
                } else {
                    let tmp = blocks[bi].shadow[soff..soff + len].to_vec();
                    blocks[di].shadow[doff..doff + len].copy_from_slice(&tmp);
                    blocks[bi].check(&format!("{ctx}: copy source"));
                }
                blocks[di].check(&format!("{ctx}: copy destination"));
            }
            8 | 9 => {
                e.scan();
                let s = e.stats();
                assert!(
                    s.frames_in_use <= s.block_bytes / PAGE as u64,
                    "{ctx}: more frames than pages: {s:?}"
                );
            }
            _ => blocks[bi].check(&ctx),
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = bg {
        h.join().expect("scanner thread panicked");
    }
    for b in &blocks {
        b.check(&format!("{ctx} seed {seed}: at the end"));
    }
    let s = e.stats();
    for b in blocks.drain(..) {
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        assert!(unsafe { e.free(b.ptr) });
    }
    let end = e.stats();
    assert_eq!(end.blocks, 0, "{ctx}: {end:?}");
    assert_eq!(
        end.frames_in_use, 0,
        "{ctx}: frames still in use after freeing everything: {end:?}"
    );
    assert_eq!(end.vmas_used, 0, "{ctx}: mapping count drifted: {end:?}");
    eprintln!("{ctx}: {null_allocs} null allocations; {s:?}");
    s
}

#[test]
fn memfd_refused_runs_on_plain_memory() {
    let _g = serial();
    let seed = seed();
    let cfg = Config {
        inject: Inject {
            fail_memfd: true,
            ..Inject::default()
        },
        ..Config::default()
    };
    let e = Engine::new(cfg);
    let s0 = e.stats();
    assert!(!s0.frames_active, "memfd refused but frames_active: {s0:?}");
    assert!(s0.fallbacks.memfd > 0, "memfd fallback not counted: {s0:?}");
    let s = workload(&e, seed, 1500, false, true, "fail_memfd");
    assert!(!s.frames_active, "{s:?}");
    assert_eq!(s.frames_in_use, 0, "no memfd, yet frames in use: {s:?}");
    assert_eq!(
        s.pages_shared_by_copy, 0,
        "no memfd, yet pages shared by copy: {s:?}"
    );
}

#[test]
fn userfaultfd_refused_scans_only_safe_steps() {
    let _g = serial();
    let seed = seed();
    let cfg = Config {
        inject: Inject {
            fail_uffd: true,
            ..Inject::default()
        },
        ..Config::default()
    };
    let e = Engine::new(cfg);
    assert!(!e.stats().protected_scan);
    let s = workload(&e, seed, 1500, false, true, "fail_uffd");
    assert!(
        s.fallbacks.uffd > 0,
        "scans without userfaultfd not counted: {s:?}"
    );
    assert!(
        s.pages_shared_by_copy > 0,
        "virtual copy needs no userfaultfd, but none happened: {s:?}"
    );
    // Folding and merging race with writers unless pages are write-protected.
    assert_eq!(
        s.zero_folded, 0,
        "pages folded without write protection: {s:?}"
    );
    assert_eq!(s.merged, 0, "pages merged without write protection: {s:?}");
}

#[test]
fn mmap_failing_after_n_calls() {
    let _g = serial();
    let seed = seed();
    for n in [0u64, 1, 2, 3, 4, 5, 7, 10, 15, 25, 40, 70, 120, 250] {
        let cfg = Config {
            inject: Inject {
                fail_mmap_after: Some(n),
                ..Inject::default()
            },
            ..Config::default()
        };
        let e = Engine::new(cfg);
        // No background scanner: the op sequence, and so the n-th mmap, is reproducible.
        let s = workload(
            &e,
            seed ^ n,
            600,
            true,
            false,
            &format!("fail_mmap_after({n})"),
        );
        assert!(
            s.fallbacks.mmap > 0,
            "fail_mmap_after({n}): no mmap fallback counted: {s:?}"
        );
    }
}

#[test]
fn mmap_failing_under_a_concurrent_scanner() {
    let _g = serial();
    let seed = seed();
    for n in [3u64, 20, 60, 200] {
        let cfg = Config {
            inject: Inject {
                fail_mmap_after: Some(n),
                ..Inject::default()
            },
            ..Config::default()
        };
        let e = Engine::new(cfg);
        let s = workload(
            &e,
            seed ^ n,
            800,
            true,
            true,
            &format!("fail_mmap_after({n}) + scanner"),
        );
        assert!(s.fallbacks.mmap > 0, "{s:?}");
    }
}

#[test]
fn tiny_vma_budget() {
    let _g = serial();
    let seed = seed();
    for budget in [1usize, 4, 16] {
        let e = Engine::new(Config {
            vma_budget: Some(budget),
            ..Config::default()
        });
        let s = workload(
            &e,
            seed ^ budget as u64,
            1200,
            false,
            true,
            &format!("vma_budget {budget}"),
        );
        assert!(
            s.fallbacks.vma_budget > 0,
            "vma_budget {budget}: never hit: {s:?}"
        );
    }
}

#[test]
fn small_pretend_max_map_count() {
    let _g = serial();
    let seed = seed();
    let limit = count_maps() + 60;
    let cfg = Config {
        vma_reserve: 0,
        inject: Inject {
            max_map_count: Some(limit),
            ..Inject::default()
        },
        ..Config::default()
    };
    let e = Engine::new(cfg);
    let s = workload(
        &e,
        seed,
        1200,
        false,
        true,
        &format!("max_map_count {limit}"),
    );
    assert!(
        s.fallbacks.vma_budget > 0,
        "max_map_count {limit}: never hit: {s:?}"
    );
}

/// Lines of /proc/self/maps: the kernel's mapping count.
fn count_maps() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// Mappings overlapping `[lo, hi)`.
fn maps_in(ranges: &[(usize, usize)]) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| {
            let r = l.split_whitespace().next().unwrap();
            let (a, b) = r.split_once('-').unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            ranges.iter().any(|&(lo, hi)| a < hi && lo < b)
        })
        .count()
}

/// Blocks whose pages are made to merge and to be copied one page at a time,
/// all over: every merge or copy of a lone page splits mappings.
struct Scatter {
    e: Engine,
    blocks: Vec<Blk>,
    rng: StdRng,
}

impl Scatter {
    fn new(e: Engine, seed: u64, pages: usize) -> Scatter {
        let mut blocks: Vec<Blk> = (0..3)
            .map(|_| alloc(&e, pages, Hint::None).expect("alloc"))
            .collect();
        // A scan of untouched blocks does nothing but count the process's
        // mappings afresh, the shadows' buffers included.
        e.scan();
        for (bi, b) in blocks.iter_mut().enumerate() {
            for p in 0..pages {
                // Every other page one of two contents (merge targets), the rest unique.
                let content = if p % 2 == 0 {
                    pattern(p / 2 % 2)
                } else {
                    unique(bi * pages + p)
                };
                b.write(p * PAGE, &content);
            }
        }
        Scatter {
            e,
            blocks,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    fn ranges(&self) -> Vec<(usize, usize)> {
        self.blocks
            .iter()
            .map(|b| (b.ptr as usize, b.ptr as usize + b.len()))
            .collect()
    }

    /// Virtual copies of single pages to scattered places.
    fn scatter_copies(&mut self, n: usize, mut after_each: impl FnMut(&Scatter)) {
        for _ in 0..n {
            let (si, di) = (self.rng.gen_range(0..3), self.rng.gen_range(0..3));
            let np = self.blocks[si].len() / PAGE;
            let (sp, dp) = (self.rng.gen_range(0..np), self.rng.gen_range(0..np));
            if si == di && sp == dp {
                continue;
            }
            let (s, d) = (self.blocks[si].ptr, self.blocks[di].ptr);
            // SAFETY: both ranges lie inside live blocks this test allocated, each at least the
            // length copied.
            unsafe { self.e.copy(d.add(dp * PAGE), s.add(sp * PAGE), PAGE) };
            let tmp = self.blocks[si].shadow[sp * PAGE..(sp + 1) * PAGE].to_vec();
            self.blocks[di].shadow[dp * PAGE..(dp + 1) * PAGE].copy_from_slice(&tmp);
            after_each(self);
        }
    }

    /// Gives the scan fresh duplicates again (written pages diverge).
    fn refresh_duplicates(&mut self) {
        for bi in 0..3 {
            let np = self.blocks[bi].len() / PAGE;
            for p in (0..np).step_by(4) {
                let c = pattern(self.rng.gen_range(0..2));
                self.blocks[bi].write(p * PAGE, &c);
            }
        }
    }

    fn check(&self, ctx: &str) {
        for b in &self.blocks {
            b.check(ctx);
        }
    }

    fn free(mut self) {
        for b in self.blocks.drain(..) {
            // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing
            // uses it after this free.
            assert!(unsafe { self.e.free(b.ptr) });
        }
        assert_eq!(self.e.stats().frames_in_use, 0);
    }
}

/// Runs `f` while another thread samples the process's mapping count; returns
/// the largest count seen.
fn max_maps_during(f: impl FnOnce()) -> usize {
    let stop = Arc::new(AtomicBool::new(false));
    let max = Arc::new(AtomicUsize::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = {
        let (stop, max) = (stop.clone(), max.clone());
        std::thread::spawn(move || {
            // The first read sets this thread's malloc arena up (new mappings):
            // before the scan starts, so the engine sees them.
            count_maps();
            ready_tx.send(()).unwrap();
            while !stop.load(Ordering::Relaxed) {
                max.fetch_max(count_maps(), Ordering::Relaxed);
            }
        })
    };
    ready_rx.recv().unwrap();
    f();
    max.fetch_max(count_maps(), Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    max.load(Ordering::Relaxed)
}

/// Real exhaustion: the engine is told vm.max_map_count is the present count
/// plus 200, then made to merge and copy pages all over. The process must
/// never hold more mappings than that limit, and the engine must say it
/// stopped because of the budget.
#[test]
fn vma_exhaustion_stops_below_max_map_count() {
    let _g = serial();
    let seed = seed();
    for reserve in [8usize, 32] {
        let limit = count_maps() + 200;
        let cfg = Config {
            vma_reserve: reserve,
            inject: Inject {
                max_map_count: Some(limit),
                ..Inject::default()
            },
            ..Config::default()
        };
        let e = Engine::new(cfg);
        let mut sc = Scatter::new(e.clone(), seed, 1024);
        let ctx = format!("seed {seed}, reserve {reserve}, pretend max_map_count {limit}");
        // Copies and scans both run into the limit: one round gives the
        // budget to the scan's merges first, the other to the copies.
        let scan_first = reserve == 8;
        let mut peak = Peak::default();
        if scan_first {
            // Two scans: the first only records what it saw (volatility check).
            peak.scan(&sc, "first look");
            peak.scan(&sc, "first scan");
        }
        sc.scatter_copies(300, |sc| peak.look(sc, "scattered copies"));
        let first = e.stats();
        peak.scan(&sc, "scan after copies");
        sc.refresh_duplicates();
        sc.scatter_copies(300, |sc| peak.look(sc, "scattered copies after a scan"));
        peak.scan(&sc, "last scan");
        sc.check(&ctx);
        let s = e.stats();
        eprintln!("{ctx}: {peak:?}; {s:?}");
        assert!(
            peak.maps <= limit,
            "{ctx}: the process went over the limit: {peak:?}; {s:?}"
        );
        // The reserve is left to the program (slack: a thread the harness may start meanwhile).
        assert!(
            peak.maps <= limit - reserve + 4,
            "{ctx}: the engine used mappings reserved for the program: {peak:?}; {s:?}"
        );
        if scan_first {
            assert!(
                first.merged > 0,
                "{ctx}: the first scan merged nothing, with room: {first:?}"
            );
        } else {
            assert!(
                first.pages_shared_by_copy > 0,
                "{ctx}: no page copied virtually, with room: {first:?}"
            );
        }
        assert!(
            s.fallbacks.vma_budget > 0,
            "{ctx}: the budget never stopped a remap: {s:?}"
        );
        sc.free();
    }
}

/// The most mappings the process had, and the engine's and the kernel's
/// count of the blocks' mappings at that moment.
#[derive(Debug, Default)]
#[allow(dead_code)] // read through Debug
struct Peak {
    maps: usize,
    during: &'static str,
    engine_counts: u64,
    kernel_counts: usize,
}

impl Peak {
    fn look(&mut self, sc: &Scatter, during: &'static str) {
        let n = count_maps();
        if n > self.maps {
            let kernel_counts = maps_in(&sc.ranges());
            *self = Peak {
                maps: n,
                during,
                engine_counts: sc.e.stats().vmas_used,
                kernel_counts,
            };
        }
    }

    fn scan(&mut self, sc: &Scatter, during: &'static str) {
        let n = max_maps_during(|| {
            sc.e.scan();
        });
        if n > self.maps {
            *self = Peak {
                maps: n,
                during,
                engine_counts: sc.e.stats().vmas_used,
                kernel_counts: maps_in(&sc.ranges()),
            };
        }
    }
}

/// The budget bounds the mappings the blocks really use, as the kernel
/// counts them (not only as the engine counts them).
#[test]
fn vma_budget_bounds_real_mappings() {
    let _g = serial();
    let seed = seed();
    let budget = 150;
    let e = Engine::new(Config {
        vma_budget: Some(budget),
        ..Config::default()
    });
    let mut sc = Scatter::new(e.clone(), seed, 768);
    let ctx = format!("seed {seed}, vma_budget {budget}");
    let mut worst = 0;
    sc.scatter_copies(200, |sc| worst = worst.max(maps_in(&sc.ranges())));
    e.scan();
    worst = worst.max(maps_in(&sc.ranges()));
    sc.scatter_copies(200, |sc| worst = worst.max(maps_in(&sc.ranges())));
    sc.refresh_duplicates();
    e.scan();
    worst = worst.max(maps_in(&sc.ranges()));
    // Divergence and zero folding of diverged pages, then another scan.
    for bi in 0..3 {
        for p in (1..768).step_by(6) {
            sc.blocks[bi].write(p * PAGE, &vec![0u8; PAGE]);
        }
    }
    e.scan();
    worst = worst.max(maps_in(&sc.ranges()));
    sc.check(&ctx);
    let s = e.stats();
    eprintln!(
        "{ctx}: blocks' mappings at most {worst}, engine counts {}: {s:?}",
        s.vmas_used
    );
    assert!(s.fallbacks.vma_budget > 0, "{ctx}: budget never hit: {s:?}");
    assert!(
        worst <= budget,
        "{ctx}: the blocks used {worst} mappings (per /proc/self/maps), over the budget (engine counts {}): {s:?}",
        s.vmas_used
    );
    sc.free();
}

/// A block computed twice (its pages equal, page for page, to another
/// block's) merges as runs: one freeze of the first block's frames and one
/// remap of the second, not a system call per page. An engine allowed only
/// 16 mmaps in all merges all 256 pages without a failed one.
#[test]
fn a_block_computed_twice_merges_as_runs() {
    let _s = serial();
    let inject = Inject {
        fail_mmap_after: Some(16),
        ..Default::default()
    };
    let e = Engine::new(Config {
        inject,
        ..Config::default()
    });
    let n = 256 * PAGE;
    let a = e.alloc(n, Hint::None);
    let b = e.alloc(n, Hint::None);
    let content: Vec<u8> = (0..256).flat_map(unique).collect();
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe {
        std::ptr::copy_nonoverlapping(content.as_ptr(), a, n);
        std::ptr::copy_nonoverlapping(content.as_ptr(), b, n);
    }
    let want = bytes(a, n).to_vec();
    e.scan();
    e.scan();
    let st = e.stats();
    assert_eq!((st.merged, st.fallbacks.mmap), (256, 0), "{st:?}");
    assert_eq!(st.frames_resident, 256, "one copy of the content left");
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { *b.add(7 * PAGE + 1) ^= 0xff };
    assert_eq!(bytes(a, n), &want[..]);
    assert_eq!(bytes(b, 7 * PAGE), &want[..7 * PAGE]);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert_eq!(unsafe { *b.add(7 * PAGE + 1) }, want[7 * PAGE + 1] ^ 0xff);
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(a) && e.free(b) });
}

/// The mappings overlapping `[lo, hi)`, in address order: anonymous (no
/// file behind it) or not.
fn anonymous_maps_in(lo: usize, hi: usize) -> Vec<bool> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (a, b) = f.next().unwrap().split_once('-').unwrap();
            let (a, b) = (
                usize::from_str_radix(a, 16).unwrap(),
                usize::from_str_radix(b, 16).unwrap(),
            );
            (a < hi && lo < b).then(|| f.nth(4).is_none())
        })
        .collect()
}

/// A block taken out of the engine's hands moves onto one anonymous mapping
/// 2 MiB at a time (a temporary mapping, then a move per piece). Each call
/// is refused in turn (injected ENOMEM): the temporary mapping, the first
/// move, a move part way. The pieces moved stay anonymous, the rest on its
/// frames, and every byte stays right and every page writable.
#[test]
fn a_move_onto_anonymous_memory_refused_part_way() {
    let _g = serial();
    let pages = 3 * 512 + 100;
    let mut partial = 0;
    for n in 0u64..7 {
        let e = Engine::new(Config::default());
        let ctx = format!("mapping calls refused after {n}");
        let mut b = alloc(&e, pages, Hint::FullWrite).unwrap();
        // Owned pages, shared pages (a copy of the first 300 pages), zero pages.
        for k in 0..pages {
            if k % 7 != 3 {
                b.write(k * PAGE, &unique(k));
            }
        }
        let src = b.shadow[..300 * PAGE].to_vec();
        // SAFETY: both ranges lie inside the live block, 300 pages apart at least.
        unsafe { e.copy(b.ptr.add(1000 * PAGE), b.ptr, 300 * PAGE) };
        b.shadow[1000 * PAGE..1300 * PAGE].copy_from_slice(&src);
        b.check(&format!("{ctx}: before"));
        // From here on only n more mapping calls succeed, process-wide.
        drop(Engine::new(Config {
            inject: Inject {
                fail_mmap_after: Some(n),
                ..Inject::default()
            },
            ..Config::default()
        }));
        assert!(e.exempt(b.ptr, b.len()), "{ctx}");
        b.check(&format!("{ctx}: after the move"));
        let (lo, hi) = (b.ptr as usize, b.ptr as usize + b.len());
        let anon = anonymous_maps_in(lo, hi);
        eprintln!("{ctx}: anonymous mappings in the block, in order: {anon:?}");
        if anon.first() == Some(&true) && anon.last() == Some(&false) {
            partial += 1;
        }
        for k in (0..pages).step_by(5) {
            b.write(k * PAGE + 17, &unique(k + 7)[..64]);
        }
        b.check(&format!("{ctx}: after writes"));
        let s = e.stats();
        assert!(n >= 5 || s.fallbacks.mmap > 0, "{ctx}: {s:?}");
        // SAFETY: the block is this test's, and nothing uses it after this free.
        unsafe { e.free(b.ptr) };
        assert_eq!(e.stats().frames_in_use, 0, "{ctx}");
    }
    assert!(partial >= 2, "no move stopped part way ({partial})");
}

/// Recycled blocks laid side by side into one allocation take a fresh range
/// and then a move per block. Each of those calls is refused in turn
/// (injected ENOMEM): the allocation then gets no recycled memory (here no
/// memory at all, as every later mapping is refused too), and no frame,
/// recycled byte or mapping is lost or miscounted on the way.
#[test]
fn laying_recycled_blocks_side_by_side_refused_part_way() {
    let _g = serial();
    for n in 0u64..6 {
        let e = Engine::new(Config {
            recycle_bytes: 32 << 20,
            ..Config::default()
        });
        let ctx = format!("mapping calls refused after {n}");
        let freed: Vec<Blk> = (0..3)
            .map(|k| {
                let mut b = alloc(&e, 8, Hint::Uninit).unwrap();
                for p in 0..8 {
                    b.write(p * PAGE, &unique(8 * k + p));
                }
                b
            })
            .collect();
        for b in &freed {
            // SAFETY: the block is this test's, and nothing uses it after this free.
            unsafe { e.free(b.ptr) };
        }
        drop(Engine::new(Config {
            inject: Inject {
                fail_mmap_after: Some(n),
                ..Inject::default()
            },
            ..Config::default()
        }));
        // Reservation, three moves (the last one cuts its block): four calls.
        let p = e.alloc(20 * PAGE, Hint::Uninit);
        let s = e.stats();
        assert_eq!(s.recycled_joined, u64::from(n >= 4), "{ctx}: {s:?}");
        if n >= 4 {
            assert!(!p.is_null(), "{ctx}");
            assert_eq!(s.recycled_bytes, 4 * PAGE as u64, "{ctx}: the cut tail");
            let (lo, hi) = (p as usize, p as usize + 20 * PAGE);
            assert!(maps_in(&[(lo, hi)]) <= s.vmas_used as usize, "{ctx}: {s:?}");
            let mut b = Blk {
                ptr: p,
                shadow: bytes(p, 20 * PAGE).to_vec(),
            };
            for k in 0..20 {
                b.write(k * PAGE + 5, &unique(100 + k)[..64]);
            }
            b.check(&ctx);
        } else {
            assert_eq!(s.recycled_bytes, 0, "{ctx}: {s:?}");
            assert_eq!(
                (s.frames_in_use, s.vmas_used),
                (0, 0),
                "{ctx}: pieces given back: {s:?}"
            );
        }
        drop(Engine::new(Config::default()));
        if !p.is_null() {
            // SAFETY: the block is this test's, and nothing uses it after this free.
            unsafe { e.free(p) };
        }
        common::assert_all_given_back(&e, &ctx);
    }
}

/// Holds end before a mapping changes; should the change fail (here an
/// injected mmap failure as a discard remaps held diverged pages onto fresh
/// frames), the pages that were held are still write-protected with no hold
/// left to end: they are unprotected, or the discard's fallback (zeroing
/// them in place, under the engine lock) would wait for good.
#[test]
fn a_failed_remap_over_held_pages_unprotects_them() {
    let _s = serial();
    let e = Arc::new(Engine::new(Config {
        pin_age: std::time::Duration::from_millis(500),
        ..Config::default()
    }));
    let src = e.alloc(16 * PAGE, Hint::None);
    let dst = e.alloc(16 * PAGE, Hint::None);
    // SAFETY: both blocks are live, 16 pages long and distinct; the copy and
    // the writes stay inside them.
    unsafe {
        std::ptr::write_bytes(src, 0x5a, 16 * PAGE);
        e.copy(dst, src, 16 * PAGE);
        // Diverged: zeros, then the content they had (to be folded and merged).
        std::ptr::write_bytes(dst, 0, 8 * PAGE);
        std::ptr::write_bytes(dst.add(8 * PAGE), 0x5a, 8 * PAGE);
    }
    for _ in 0..3 {
        e.scan();
    }
    assert!(e.stats().pin_held >= 16, "not held: {:?}", e.stats());
    // A fresh engine sets the process-wide allowance: every mmap fails now.
    drop(Engine::new(Config {
        inject: Inject {
            fail_mmap_after: Some(0),
            ..Default::default()
        },
        ..Config::default()
    }));
    let (tx, rx) = std::sync::mpsc::channel();
    let (e2, at) = (e.clone(), dst as usize);
    std::thread::spawn(move || {
        e2.discard(at as *mut u8, 8 * PAGE);
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("the discard waited for good on a page left write-protected");
    let s = e.stats();
    assert!(s.fallbacks.mmap >= 1, "the remap did not fail: {s:?}");
    assert!(bytes(dst, 8 * PAGE).iter().all(|&b| b == 0));
    assert!(bytes(dst, 16 * PAGE)[8 * PAGE..].iter().all(|&b| b == 0x5a));
    // SAFETY: both blocks were allocated above and are freed once.
    unsafe { assert!(e.free(src) && e.free(dst)) };
}
