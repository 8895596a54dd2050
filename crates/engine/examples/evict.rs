//! Measures eviction and restore on this machine, for docs/MECHANISMS.md
//! ("Eviction and restore").
//!
//! Run: `cargo run --release -p pagefold-engine --example evict [pages] [runs]`
//! (default 16,384 pages = 64 MiB, 5 runs; medians). For each kind of page
//! the engine evicts, prints: evict cost per page (compression, stores,
//! registration, freeing; with the default 1 ms pin grace per 512-page chunk
//! and without it), restore cost per page when a thread touches the pages
//! one after another (fault -> fault thread -> decompress -> UFFDIO_COPY ->
//! wake), and the footprint: resident pages before and after, bytes the store
//! holds per page and the engine's metadata per evicted page.

use std::time::{Duration, Instant};

use pagefold_engine::{Config, Engine, Hint, PAGE};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Anon,
    Owned,
    SoleShared,
    SoleDiverged,
}

/// Text-like content (words from a small vocabulary), as compressible as the
/// "text" row of KERNEL-NOTES (LZ4 ~1.7 KB per page).
fn text_page(k: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "the ", "model ", "value ", "of ", "frame ", "page ", "residual ", "in ", "variance ", "coefficient ",
        "estimate ", "and ", "error ", "for ", "data ", "matrix\n",
    ];
    let mut x = (k as u64).wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut v = Vec::with_capacity(PAGE + 16);
    while v.len() < PAGE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(WORDS[(x % 16) as usize].as_bytes());
        if x % 7 == 0 {
            v.extend_from_slice(format!("{} ", x % 1000).as_bytes());
        }
    }
    v.truncate(PAGE);
    v
}

fn resident(p: *const u8, n: usize) -> usize {
    let mut v = vec![0u8; n];
    unsafe { libc::mincore(p as *mut _, n * PAGE, v.as_mut_ptr()) };
    v.iter().filter(|&&b| b & 1 != 0).count()
}

/// A block of `n` pages of `kind` filled with text; returns it and its content.
fn block(e: &Engine, kind: Kind, n: usize, content: &[u8]) -> *mut u8 {
    let fresh = || e.alloc(n * PAGE, Hint::FullWrite);
    match kind {
        Kind::Anon | Kind::Owned => {
            let p = fresh();
            unsafe { std::ptr::copy_nonoverlapping(content.as_ptr(), p, content.len()) };
            p
        }
        Kind::SoleShared | Kind::SoleDiverged => {
            let (src, dst) = (fresh(), fresh());
            unsafe {
                std::ptr::copy_nonoverlapping(content.as_ptr(), src, content.len());
                e.copy(dst, src, n * PAGE);
                if kind == Kind::SoleDiverged {
                    // Every page written once: each holds its own copy.
                    for k in 0..n {
                        let q = dst.add(k * PAGE);
                        q.write_volatile(q.read_volatile());
                    }
                }
                e.free(src);
            }
            dst
        }
    }
}

struct Run {
    evict_us: f64,
    restore_us: f64,
    resident_before: usize,
    resident_after: usize,
    stored_per_page: f64,
    overhead_per_page: f64,
    metadata_per_page: f64,
    evicted: u64,
}

fn one(kind: Kind, n: usize, content: &[u8], grace: Duration) -> Run {
    let cfg = Config { frames: kind != Kind::Anon, pin_grace: grace, ..Config::default() };
    let e = Engine::new(cfg);
    let p = block(&e, kind, n, content);
    let resident_before = resident(p, n);
    let meta_before = e.stats().metadata_bytes;
    let t = Instant::now();
    let r = e.evict(p, n * PAGE);
    let evict_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    let resident_after = resident(p, n);
    let s = e.stats();
    let ev = r.evicted.max(1) as f64;
    let t = Instant::now();
    let mut sum = 0u64;
    for k in 0..n {
        sum = sum.wrapping_add(unsafe { p.add(k * PAGE + 8).read_volatile() } as u64);
    }
    let restore_us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    std::hint::black_box(sum);
    assert!(unsafe { std::slice::from_raw_parts(p, n * PAGE) } == content, "{kind:?}: wrong bytes after restore");
    unsafe { e.free(p) };
    Run {
        evict_us,
        restore_us,
        resident_before,
        resident_after,
        stored_per_page: s.store.payload as f64 / ev,
        overhead_per_page: s.store.overhead as f64 / ev,
        metadata_per_page: (s.metadata_bytes - meta_before) as f64 / ev,
        evicted: r.evicted,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let n = args.first().copied().unwrap_or(16_384);
    let runs = args.get(1).copied().unwrap_or(5);
    let content: Vec<u8> = (0..n).flat_map(text_page).collect();

    // Compression alone, for reference.
    let (mut c_ns, mut d_ns, mut bytes) = (0u128, 0u128, 0usize);
    let mut out = vec![0u8; lz4_flex::block::get_maximum_output_size(PAGE)];
    let mut back = [0u8; PAGE];
    for page in content.chunks(PAGE).take(4096) {
        let t = Instant::now();
        let m = lz4_flex::block::compress_into(page, &mut out).unwrap();
        c_ns += t.elapsed().as_nanos();
        let t = Instant::now();
        lz4_flex::block::decompress_into(&out[..m], &mut back).unwrap();
        d_ns += t.elapsed().as_nanos();
        bytes += m;
    }
    let m = n.min(4096) as f64;
    println!(
        "LZ4 (lz4_flex) on this content: {:.0} B/page, compress {:.2} us, decompress {:.2} us\n",
        bytes as f64 / m,
        c_ns as f64 / 1e3 / m,
        d_ns as f64 / 1e3 / m
    );
    println!("{n} pages, medians of {runs} runs, us per page");
    println!();
    println!("| kind | evict (1 ms grace/chunk) | evict (no grace) | restore on touch | resident before -> after | stored B/page | store overhead B/page | engine metadata B/page |");
    println!("|---|---:|---:|---:|---|---:|---:|---:|");
    for kind in [Kind::Anon, Kind::Owned, Kind::SoleShared, Kind::SoleDiverged] {
        let with: Vec<Run> = (0..runs).map(|_| one(kind, n, &content, Duration::from_micros(1000))).collect();
        let without: Vec<Run> = (0..runs).map(|_| one(kind, n, &content, Duration::ZERO)).collect();
        let all = || with.iter().chain(&without);
        assert!(all().all(|r| r.evicted == n as u64), "{kind:?}: not every page was evicted");
        let last = &without[0];
        println!(
            "| {kind:?} | {:.2} | {:.2} | {:.2} | {} -> {} | {:.0} | {:.0} | {:.0} |",
            median(with.iter().map(|r| r.evict_us).collect()),
            median(without.iter().map(|r| r.evict_us).collect()),
            median(all().map(|r| r.restore_us).collect()),
            last.resident_before,
            last.resident_after,
            last.stored_per_page,
            last.overhead_per_page,
            last.metadata_per_page,
        );
    }
}
