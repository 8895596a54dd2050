//! Difference Engine's Table 2 op costs, measured in the engine, for
//! docs/BENCHMARKS.md ("Op costs, DE Table 2").
//!
//! Run: `cargo run --release -p pagefold-engine --example ops [pages] [rounds]`
//! (default 2,048 pages, 9 rounds; figures are medians over rounds of the
//! mean per page in a round). Each op is what the engine pays, system calls
//! and faults included:
//!
//! - share: a scan that merges `pages` pages identical to pages of another
//!   block (hash, full compare, write-protect, remap), time per merged page;
//!   the scan before it, which saw the pages for the first time (the
//!   volatility check merges only what two scans saw unchanged), is not
//!   counted.
//! - cow_break: the first write to a merged page (the kernel's copy-on-write fault).
//! - compress: `Engine::evict_with` of a block of one page kind, patching
//!   off (compress, store, register, free), per page; then the store's `put` alone (codec and slab store).
//! - uncompress: a thread touches the evicted pages one after another
//!   (fault, fault thread, decompress, UFFDIO_COPY, wake), per page.
//! - swap_out: `PageStore::spill` of the evicted block to the swap file
//!   (one buffered write per object), per page.
//! - swap_in: touches of swapped pages, with the file in the page cache and
//!   after `POSIX_FADV_DONTNEED` (read from the device), per page.
//! - patch, unpatch: the tier crate's `Patcher` on DE's 95%-similar pages
//!   (detector lookup, encode, store, pin; decode, remove, unpin); the
//!   engine's patch path has its own measurement (tests/patch.rs,
//!   `measure_patching`).
//!
//! Every round checks the bytes it reads back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pagefold_engine::{
    Allow, Config, Engine, Hint, PageStore, SwapSettings, TierConfig, TierStore, PAGE,
};
use pagefold_tier::compress::{CompressConfig, ZstdPolicy};
use pagefold_tier::kinds::{page, Kind};
use pagefold_tier::ops::{patch_ops, OpsConfig, DE_TABLE2};
use pagefold_tier::patch::Encoder;

/// compress is the page store's op: eviction with patching off.
const STORE_ONLY: Allow = Allow {
    patch: false,
    compress: true,
};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn per_page(t: Instant, n: u64) -> f64 {
    t.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64
}

/// `n` pages of `kind`; `None`: pages of one repeated non-zero word (the
/// store keeps 9 bytes; restoring them costs the fault path and a fill).
fn content(kind: Option<Kind>, n: usize, salt: u64) -> Vec<u8> {
    match kind {
        Some(kind) => (0..n as u64)
            .flat_map(|k| page(kind, k * 7919 + salt + 1))
            .collect(),
        None => (0..n as u64)
            .flat_map(|k| (k + salt + 1).to_le_bytes().repeat(PAGE / 8))
            .collect(),
    }
}

fn block(e: &Engine, data: &[u8]) -> *mut u8 {
    let p = e.alloc(data.len(), Hint::FullWrite);
    assert!(!p.is_null());
    // SAFETY: p is a fresh, non-null block of at least data.len() bytes from e.alloc, separate
    // from data.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
    p
}

fn same(p: *const u8, want: &[u8]) -> bool {
    // SAFETY: every caller passes a live block made by `block` from data of want.len() bytes;
    // it is only read.
    unsafe { std::slice::from_raw_parts(p, want.len()) == want }
}

/// share and cow_break, one round: (share us per merged page, a scan with
/// nothing left to merge us per page scanned, cow_break us).
fn share_round(n: usize, grace: Duration, salt: u64) -> (f64, f64, f64) {
    let e = Engine::new(Config {
        pin_grace: grace,
        smart_scan: false,
        ..Config::default()
    });
    let data = content(Some(Kind::Text), n, salt);
    let (a, b) = (block(&e, &data), block(&e, &data));
    e.scan(); // first sight: the volatility check remembers the pages
    let t = Instant::now();
    let r = e.scan();
    let share = per_page(t, r.merged);
    assert!(r.merged >= n as u64, "merged {} of {n}", r.merged);
    let t = Instant::now();
    let idle = e.scan();
    let rescan = per_page(t, idle.pages_scanned);
    let t = Instant::now();
    for k in 0..n {
        // SAFETY: b is a live block of data.len() = n * PAGE bytes and k < n.
        unsafe { b.add(k * PAGE + 5).write_volatile(data[k * PAGE + 5]) };
    }
    let cow = per_page(t, n as u64);
    assert!(same(a, &data) && same(b, &data));
    // SAFETY: a and b came from e.alloc (via block) and are not used after this.
    unsafe { (e.free(a), e.free(b)) };
    (share, rescan, cow)
}

struct TierRound {
    evict: f64,
    codec: f64,
    /// The codec with LZ4 only (zstd never): the time zstd costs on numeric pages.
    lz4_only: f64,
    put: f64,
    restore: f64,
    swap_out: f64,
    swap_in_cached: f64,
    swap_in_device: f64,
}

fn swap_dir() -> std::path::PathBuf {
    std::env::var_os("PAGEFOLD_OPS_SWAP_DIR")
        .map(Into::into)
        .unwrap_or_else(std::env::temp_dir)
}

/// compress, uncompress, swap_out, swap_in of `kind`, one round.
fn tier_round(kind: Option<Kind>, n: usize, grace: Duration, salt: u64) -> TierRound {
    let data = content(kind, n, salt);
    // The codec alone, then the store alone (compress and insert).
    let mut codec = pagefold_tier::compress::Compressor::default();
    let t = Instant::now();
    for p in data.chunks_exact(PAGE) {
        std::hint::black_box(codec.compress(p));
    }
    let codec = per_page(t, n as u64);
    let mut lz4 = pagefold_tier::compress::Compressor::new(CompressConfig {
        zstd: ZstdPolicy::Never,
        ..CompressConfig::default()
    });
    let t = Instant::now();
    for p in data.chunks_exact(PAGE) {
        std::hint::black_box(lz4.compress(p));
    }
    let lz4_only = per_page(t, n as u64);
    let alone = TierStore::new(TierConfig {
        capacity: u64::MAX,
        swap: None,
    })
    .unwrap();
    let t = Instant::now();
    for p in data.chunks_exact(PAGE) {
        let _ = std::hint::black_box(alone.put(p.try_into().unwrap()));
    }
    let put = per_page(t, n as u64);

    let prefix = swap_dir().join(format!("pagefold-ops-{}", std::process::id()));
    let store = Arc::new(
        TierStore::new(TierConfig {
            capacity: u64::MAX,
            swap: Some(SwapSettings {
                path: prefix.clone(),
                max_bytes: 1 << 30,
            }),
        })
        .unwrap(),
    );
    let e = Engine::new(Config {
        pin_grace: grace,
        ..Config::default()
    });
    assert!(e.set_store(store.clone()));
    let touch_all = |p: *mut u8| {
        let t = Instant::now();
        let mut sum = 0u64;
        for k in 0..n {
            // SAFETY: touch_all is only called with p, a live block of data.len() = n * PAGE
            // bytes, and k < n.
            sum = sum.wrapping_add(unsafe { p.add(k * PAGE + 8).read_volatile() } as u64);
        }
        std::hint::black_box(sum);
        per_page(t, n as u64)
    };
    let p = block(&e, &data);
    let t = Instant::now();
    let r = e.evict_with(p, data.len(), STORE_ONLY);
    let evict = per_page(t, r.evicted);
    assert_eq!(r.evicted, n as u64, "{kind:?}: {r:?}");
    let restore = touch_all(p);
    assert!(same(p, &data), "{kind:?}: wrong bytes after uncompress");

    e.scan(); // reconcile, so the pages can be evicted again
    assert_eq!(e.evict_with(p, data.len(), STORE_ONLY).evicted, n as u64);
    let t = Instant::now();
    store.spill(u64::MAX);
    let swap_out = per_page(t, store.bytes().swapped);
    assert_eq!(store.bytes().swapped, n as u64);
    let swap_in_cached = touch_all(p);
    assert!(same(p, &data), "{kind:?}: wrong bytes after swap_in");

    e.scan();
    assert_eq!(e.evict_with(p, data.len(), STORE_ONLY).evicted, n as u64);
    store.spill(u64::MAX);
    drop_swap_cache(&prefix);
    let swap_in_device = touch_all(p);
    assert!(
        same(p, &data),
        "{kind:?}: wrong bytes after swap_in from the device"
    );
    // SAFETY: p came from e.alloc (via block) and is not used after this.
    unsafe { e.free(p) };
    TierRound {
        evict,
        codec,
        lz4_only,
        put,
        restore,
        swap_out,
        swap_in_cached,
        swap_in_device,
    }
}

/// Drops the page cache of this process's swap files (unlinked: found in /proc/self/fd).
fn drop_swap_cache(prefix: &std::path::Path) {
    let want = prefix.to_string_lossy().to_string();
    for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(link) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if link.to_string_lossy().starts_with(&want) {
            let fd: i32 = entry.file_name().to_string_lossy().parse().unwrap();
            // SAFETY: fd is an open descriptor of this process (listed in /proc/self/fd, one of
            // the store's swap files); fdatasync and posix_fadvise only take integers.
            unsafe {
                libc::fdatasync(fd);
                libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
}

/// Per-operation cost targets (about a fifth of DE's Table 2);
/// swap_in has none: bounded by the device.
const TARGETS: [(&str, f64); 7] = [
    ("share", 1.2),
    ("cow_break", 5.0),
    ("compress", 6.0),
    ("uncompress", 6.0),
    ("patch", 60.0),
    ("unpatch", 4.0),
    ("swap_out", 10.0),
];

fn row(op: &str, what: &str, us: f64) {
    let target = TARGETS.iter().find(|(o, _)| *o == op).map(|t| t.1);
    let verdict = match target {
        Some(t) if us <= t => format!("{t} (met)"),
        Some(t) => format!("{t} (MISSED, {:.1}x)", us / t),
        None if op == "swap_in" => "device-bound".into(),
        None => "-".into(),
    };
    let de = DE_TABLE2
        .iter()
        .find(|(o, _)| *o == op)
        .map_or("-".into(), |d| format!("{:.1}", d.1));
    println!("| {op} | {what} | {us:.2} | {de} | {verdict} |");
}

/// XXH3 of one page, median of 41 rounds of 1,000: how loaded the machine is.
fn xxh3_us() -> f64 {
    let p = page(Kind::Text, 1);
    median(
        (0..41)
            .map(|_| {
                let t = Instant::now();
                for i in 0..1000u64 {
                    std::hint::black_box(xxhash_rust::xxh3::xxh3_64_with_seed(
                        std::hint::black_box(&p),
                        i,
                    ));
                }
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    )
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let n = args.first().copied().unwrap_or(2048);
    let rounds = args.get(1).copied().unwrap_or(9);
    let grace = Config::default().pin_grace;
    println!("{n} pages per round, medians of {rounds} rounds, us per page\n");
    println!(
        "Calibration (idle machine: 0.21 us, see docs/MECHANISMS.md): XXH3 of a page {:.2} us\n",
        xxh3_us()
    );
    println!("| op | what is measured | median us | DE us | target us |");
    println!("|---|---|---:|---:|---|");

    for (label, g) in [
        ("pin grace 1 ms/chunk", grace),
        ("no pin grace", Duration::ZERO),
    ] {
        let rs: Vec<(f64, f64, f64)> = (0..rounds).map(|r| share_round(n, g, r as u64)).collect();
        row(
            "share",
            &format!("merging scan, text pages, {label}"),
            median(rs.iter().map(|r| r.0).collect()),
        );
        row(
            "(scan)",
            &format!("the next scan, nothing left to merge, per page scanned, {label}"),
            median(rs.iter().map(|r| r.1).collect()),
        );
        if g.is_zero() {
            row(
                "cow_break",
                "first write to a merged page",
                median(rs.iter().map(|r| r.2).collect()),
            );
        }
    }
    let kinds = [
        (Some(Kind::Text), "lz4"),
        (Some(Kind::IntDoubles), "zstd"),
        (Some(Kind::Heap), "zstd"),
        (Some(Kind::Sparse), "zstd"),
        (None, "same"),
    ];
    for (kind, codec) in kinds {
        let rs: Vec<TierRound> = (0..rounds)
            .map(|r| tier_round(kind, n, Duration::ZERO, r as u64))
            .collect();
        let m = |f: fn(&TierRound) -> f64| median(rs.iter().map(f).collect());
        let name = kind.map_or("same-filled", Kind::name);
        row(
            "compress",
            &format!("{name} ({codec}): Engine::evict, no pin grace"),
            m(|r| r.evict),
        );
        row(
            "compress",
            &format!("{name} ({codec}): TierStore::put alone"),
            m(|r| r.put),
        );
        row(
            "compress",
            &format!("{name} ({codec}): the codec alone"),
            m(|r| r.codec),
        );
        if codec == "zstd" {
            row(
                "compress",
                &format!("{name}: the codec alone, LZ4 only (ZstdPolicy::Never)"),
                m(|r| r.lz4_only),
            );
        }
        row(
            "uncompress",
            &format!("{name} ({codec}): touch -> fault thread -> UFFDIO_COPY"),
            m(|r| r.restore),
        );
        row(
            "swap_out",
            &format!("{name} ({codec}): spill to the swap file, buffered"),
            m(|r| r.swap_out),
        );
        row(
            "swap_in",
            &format!("{name} ({codec}): touch, swap file in the page cache"),
            m(|r| r.swap_in_cached),
        );
        row(
            "swap_in",
            &format!("{name} ({codec}): touch, swap file read from the device"),
            m(|r| r.swap_in_device),
        );
    }
    let rs: Vec<TierRound> = (0..rounds)
        .map(|r| tier_round(Some(Kind::Text), n, grace, r as u64))
        .collect();
    row(
        "compress",
        "text (lz4): Engine::evict, pin grace 1 ms/chunk",
        median(rs.iter().map(|r| r.evict).collect()),
    );

    let cfg = OpsConfig {
        pages: n.min(512),
        rounds,
        ..OpsConfig::default()
    };
    for r in patch_ops(&cfg, Kind::Similar95, Encoder::Runs, Some(Encoder::ZstdRef)) {
        assert!(r.stored > 0, "no 95%-similar page was patched");
        row(
            r.op,
            &format!(
                "95%-similar: tier Patcher ({} B/patch, {}/{} stored)",
                r.bytes.round(),
                r.stored,
                cfg.pages
            ),
            r.timing.median_us,
        );
    }
}
