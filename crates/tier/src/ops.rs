//! Op costs, measured as Difference Engine's Table 2 (compress, uncompress,
//! patch, unpatch, swap_out, swap_in; share and cow_break are the engine's
//! and measured there), over the page kinds of [`crate::kinds`], plus the
//! comparisons the tier's choices rest on: codecs per page kind, delta
//! encoders per page kind, and the store's fragmentation under churn.
//!
//! Each op is what the engine pays in this layer, not the codec alone.
//! compress: choose and run the codec, insert into the store. uncompress:
//! decode from the store slot, remove the object. patch: look the page up
//! in the similarity detector, encode against each candidate (the smaller
//! patch wins), insert into the store, pin the reference. unpatch: decode,
//! remove, unpin. swap_out: write to a slot (with a checksum). swap_in:
//! read, verify, free the slot. Page-table work (mapping, faults) is the
//! engine's and not included.
//!
//! Timing: a round runs the op on `pages` distinct pages and takes the
//! mean per op; the figure is the median over `rounds` rounds (p10/p90
//! beside it), so one descheduled round on a noisy 2-core machine moves
//! nothing. [`run`] returns everything as markdown tables; the bench
//! binary `cargo bench -p pagefold-tier --bench ops` prints them.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use crate::compress::{CompressConfig, Compressor, ZstdPolicy};
use crate::kinds::{page, pair, Kind};
use crate::patch::{DeltaDecoder, DeltaEncoder, Encoder, Patcher, References, PATCH_CUTOFF};
use crate::similar::{Detector, SimilarityParams};
use crate::store::{Handle, Store, StoreConfig};
use crate::swap::{SwapConfig, SwapFile};
use crate::PAGE;

/// Difference Engine's Table 2: its cost of each op, in µs.
pub const DE_TABLE2: [(&str, f64); 8] = [
    ("share", 6.2),
    ("cow_break", 25.1),
    ("compress", 29.7),
    ("uncompress", 10.4),
    ("patch", 338.1),
    ("unpatch", 18.6),
    ("swap_out", 48.9),
    ("swap_in", 7151.6),
];

/// The tier's targets (µs), set at about a fifth of DE's Table 2
/// (uncompress excepted): compress 6, uncompress 6, patch 60, unpatch 4,
/// swap_out 10.
pub const TARGETS: [(&str, f64); 5] = [
    ("compress", 6.0),
    ("uncompress", 6.0),
    ("patch", 60.0),
    ("unpatch", 4.0),
    ("swap_out", 10.0),
];

/// Stricter targets (µs), a fifth of [`TARGETS`]: compress 1.2,
/// uncompress 1.2, patch 12, unpatch 0.8, swap_out 2.
pub const STRICT_TARGETS: [(&str, f64); 5] = [
    ("compress", 1.2),
    ("uncompress", 1.2),
    ("patch", 12.0),
    ("unpatch", 0.8),
    ("swap_out", 2.0),
];

fn lookup(t: &[(&str, f64)], op: &str) -> Option<f64> {
    t.iter().find(|(o, _)| *o == op).map(|x| x.1)
}

/// The target for `op` (None for swap_in: bounded by the device).
pub fn target_us(op: &str) -> Option<f64> {
    lookup(&TARGETS, op)
}

#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
}

/// Runs `round(n)` `rounds` times (after one warm-up round); each call does
/// `n` ops and the per-op time is the round's time / n.
pub fn time_rounds(rounds: usize, n: usize, mut round: impl FnMut()) -> Timing {
    round();
    let mut t: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            let s = Instant::now();
            round();
            s.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64
        })
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |f: f64| t[((t.len() - 1) as f64 * f).round() as usize];
    Timing {
        median_us: q(0.5),
        p10_us: q(0.1),
        p90_us: q(0.9),
    }
}

#[derive(Debug, Clone)]
pub struct OpsConfig {
    /// Distinct pages per kind and round.
    pub pages: usize,
    pub rounds: usize,
    /// Directory for the swap files.
    pub swap_dir: PathBuf,
}

impl Default for OpsConfig {
    fn default() -> Self {
        OpsConfig {
            pages: 256,
            rounds: 31,
            swap_dir: std::env::temp_dir(),
        }
    }
}

/// One measured op on one page kind.
#[derive(Debug, Clone)]
pub struct OpRow {
    pub op: &'static str,
    pub kind: String,
    pub timing: Timing,
    /// Mean stored bytes per page (0: refused / not stored).
    pub bytes: f64,
    /// Pages of the kind the op stored (of `pages`).
    pub stored: usize,
}

const COMPRESS_KINDS: [Kind; 8] = [
    Kind::Zero,
    Kind::Random,
    Kind::Text,
    Kind::Doubles,
    Kind::IntDoubles,
    Kind::Heap,
    Kind::Sparse,
    Kind::Similar95,
];
const PATCH_KINDS: [Kind; 8] = [
    Kind::Identical,
    Kind::Write16,
    Kind::Similar95,
    Kind::Random,
    Kind::Text,
    Kind::Doubles,
    Kind::IntDoubles,
    Kind::Heap,
];

fn pages_of(kind: Kind, n: usize) -> Vec<Vec<u8>> {
    (0..n as u64).map(|s| page(kind, s + 1)).collect()
}

/// compress / uncompress with `cfg_c` on `kind`: each round compresses
/// and stores every page (time per page attempted: a refused page costs
/// its attempt), then decodes and removes every stored one (time per
/// stored page).
pub fn compress_ops(cfg: &OpsConfig, kind: Kind, cfg_c: CompressConfig) -> Vec<OpRow> {
    let pages = pages_of(kind, cfg.pages);
    let mut c = Compressor::new(cfg_c);
    let mut store = Store::new(StoreConfig {
        reserve_bytes: 256 << 20,
        ..StoreConfig::default()
    })
    .expect("store");
    let mut handles: Vec<Option<Handle>> = vec![None; pages.len()];
    let mut out = vec![0u8; PAGE];
    let (mut cs, mut us) = (Vec::new(), Vec::new());
    let (mut stored, mut bytes) = (0, 0);
    for round in 0..cfg.rounds.max(1) + 1 {
        let s = Instant::now();
        for (p, h) in pages.iter().zip(handles.iter_mut()) {
            if let Some(d) = c.compress(p) {
                *h = Some(store.insert(d).unwrap());
            }
        }
        let t = s.elapsed().as_secs_f64() * 1e6 / pages.len() as f64;
        stored = store.len();
        bytes = store.stats().payload_bytes as usize;
        let s = Instant::now();
        for (p, h) in pages.iter().zip(handles.iter_mut()) {
            if let Some(h) = h.take() {
                c.decompress(store.get(h).unwrap(), &mut out).unwrap();
                store.remove(h).unwrap();
                debug_assert_eq!(&out[..], &p[..]);
            }
        }
        let u = s.elapsed().as_secs_f64() * 1e6 / stored.max(1) as f64;
        if round > 0 {
            cs.push(t);
            us.push(u);
        }
    }
    let mean = if stored > 0 {
        bytes as f64 / stored as f64
    } else {
        0.0
    };
    vec![
        OpRow {
            op: "compress",
            kind: kind.name().into(),
            timing: timing_of(cs),
            bytes: mean,
            stored,
        },
        OpRow {
            op: "uncompress",
            kind: kind.name().into(),
            timing: if stored > 0 {
                timing_of(us)
            } else {
                Timing::default()
            },
            bytes: mean,
            stored,
        },
    ]
}

fn timing_of(mut t: Vec<f64>) -> Timing {
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |f: f64| t[((t.len() - 1) as f64 * f).round() as usize];
    Timing {
        median_us: q(0.5),
        p10_us: q(0.1),
        p90_us: q(0.9),
    }
}

/// patch / unpatch with the engine's [`Patcher`] on `kind`: the
/// references are indexed in a detector (ids = page numbers), each page
/// is looked up, patched against its candidates, stored and its reference
/// pinned; unpatch reverses it.
pub fn patch_ops(
    cfg: &OpsConfig,
    kind: Kind,
    first: Encoder,
    fallback: Option<Encoder>,
) -> Vec<OpRow> {
    let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..cfg.pages as u64).map(|s| pair(kind, s + 1)).collect();
    let mut det = Detector::new(SimilarityParams::default()).unwrap();
    for (i, (r, _)) in pairs.iter().enumerate() {
        det.insert(i as u64, r);
    }
    let refs = References::new();
    let mut patcher = Patcher::with(first, fallback, PATCH_CUTOFF);
    let mut store = Store::new(StoreConfig {
        reserve_bytes: 256 << 20,
        ..StoreConfig::default()
    })
    .expect("store");
    let mut stored: Vec<Option<(Handle, u64)>> = vec![None; pairs.len()];
    let mut cands = Vec::new();
    let mut best: Vec<u8> = Vec::with_capacity(PAGE);
    let mut out = vec![0u8; PAGE];
    let mut bytes = 0usize;
    let mut patch_samples = Vec::new();
    let mut unpatch_samples = Vec::new();
    let mut n_stored = 0;
    for round in 0..cfg.rounds.max(1) + 1 {
        let s = Instant::now();
        let mut round_bytes = 0;
        for (i, (_, p)) in pairs.iter().enumerate() {
            det.candidates(p, &mut cands);
            let mut best_ref = None;
            best.clear();
            for &c in &cands {
                if let Some(patch) = patcher.make(p, &pairs[c as usize].0) {
                    if best_ref.is_none() || patch.len() < best.len() {
                        best.clear();
                        best.extend_from_slice(patch);
                        best_ref = Some(c);
                    }
                }
            }
            if let Some(r) = best_ref {
                let h = store.insert(&best).unwrap();
                refs.pin(r);
                stored[i] = Some((h, r));
                round_bytes += best.len();
            }
        }
        let t = s.elapsed().as_secs_f64() * 1e6 / pairs.len() as f64;
        n_stored = stored.iter().filter(|x| x.is_some()).count();
        bytes = round_bytes;
        let s = Instant::now();
        for (i, st) in stored.iter_mut().enumerate() {
            if let Some((h, r)) = st.take() {
                patcher
                    .apply(store.get(h).unwrap(), &pairs[r as usize].0, &mut out)
                    .unwrap();
                store.remove(h).unwrap();
                refs.unpin(r).unwrap();
                debug_assert_eq!(out, pairs[i].1);
            }
        }
        let u = s.elapsed().as_secs_f64() * 1e6 / n_stored.max(1) as f64;
        if round > 0 {
            patch_samples.push(t);
            unpatch_samples.push(u);
        }
    }
    let mean = if n_stored > 0 {
        bytes as f64 / n_stored as f64
    } else {
        0.0
    };
    vec![
        OpRow {
            op: "patch",
            kind: kind.name().into(),
            timing: timing_of(patch_samples),
            bytes: mean,
            stored: n_stored,
        },
        OpRow {
            op: "unpatch",
            kind: kind.name().into(),
            timing: if n_stored > 0 {
                timing_of(unpatch_samples)
            } else {
                Timing::default()
            },
            bytes: mean,
            stored: n_stored,
        },
    ]
}

/// swap_out / swap_in (+ free) of whole pages, buffered or O_DIRECT;
/// swap_out one page per call (`batch` 1) or `batch` pages per
/// [`SwapFile::swap_out_batch`] call.
pub fn swap_ops(cfg: &OpsConfig, direct: bool, batch: usize) -> Result<Vec<OpRow>, crate::Error> {
    let pages = pages_of(Kind::Random, cfg.pages);
    let path = cfg.swap_dir.join(format!(
        "pagefold-tier-ops-{}-{}-{batch}.swap",
        std::process::id(),
        direct as u8
    ));
    let mut sc = SwapConfig::new(&path);
    sc.direct = direct;
    sc.grow_slots = cfg.pages as u32;
    let mut swap = SwapFile::create(&sc)?;
    let mut out = vec![0u8; PAGE];
    let mut slots = Vec::with_capacity(pages.len());
    let (mut so, mut si) = (Vec::new(), Vec::new());
    for round in 0..cfg.rounds.max(1) + 1 {
        let s = Instant::now();
        if batch <= 1 {
            for p in &pages {
                slots.push(swap.swap_out(p)?);
            }
        } else {
            for chunk in pages.chunks(batch) {
                let refs: Vec<&[u8]> = chunk.iter().map(|p| &p[..]).collect();
                slots.extend(swap.swap_out_batch(&refs)?);
            }
        }
        let t = s.elapsed().as_secs_f64() * 1e6 / pages.len() as f64;
        let s = Instant::now();
        for (slot, p) in slots.drain(..).zip(&pages) {
            swap.swap_in(slot, &mut out)?;
            swap.free(slot)?;
            debug_assert_eq!(&out, p);
        }
        let u = s.elapsed().as_secs_f64() * 1e6 / pages.len() as f64;
        if round > 0 {
            so.push(t);
            si.push(u);
        }
    }
    let mode = if swap.is_direct() {
        "O_DIRECT"
    } else {
        "buffered"
    };
    let mode = if batch > 1 {
        format!("{mode}, batches of {batch}")
    } else {
        mode.to_string()
    };
    let mut rows = vec![
        OpRow {
            op: "swap_out",
            kind: format!("page, {mode}"),
            timing: timing_of(so),
            bytes: PAGE as f64,
            stored: pages.len(),
        },
        OpRow {
            op: "swap_in",
            kind: format!("page, {mode}"),
            timing: timing_of(si),
            bytes: PAGE as f64,
            stored: pages.len(),
        },
    ];
    if batch > 1 {
        rows.pop(); // swap_in is per page either way
    }
    Ok(rows)
}

/// The Table 2 ops with the tier's defaults, over every kind.
pub fn measure_ops(cfg: &OpsConfig) -> Vec<OpRow> {
    let mut rows = Vec::new();
    for kind in COMPRESS_KINDS {
        rows.extend(compress_ops(cfg, kind, CompressConfig::default()));
    }
    for kind in PATCH_KINDS {
        rows.extend(patch_ops(cfg, kind, Encoder::Runs, Some(Encoder::ZstdRef)));
    }
    for (direct, batch) in [(false, 1), (true, 1), (false, 64), (true, 64)] {
        match swap_ops(cfg, direct, batch) {
            Ok(r) => rows.extend(r),
            Err(e) => eprintln!(
                "swap ({}): {e}",
                if direct { "O_DIRECT" } else { "buffered" }
            ),
        }
    }
    rows
}

/// One codec or encoder on one kind: mean size, encode and decode medians.
#[derive(Debug, Clone)]
pub struct CodecRow {
    pub kind: &'static str,
    pub codec: String,
    pub bytes: f64,
    /// Pages (of `pages`) the codec stored (within its size limit).
    pub stored: usize,
    pub encode: Timing,
    pub decode: Timing,
}

fn codec_variants() -> Vec<(String, CompressConfig)> {
    let lz4 = CompressConfig {
        zstd: ZstdPolicy::Never,
        ..CompressConfig::default()
    };
    let z = |l: i32| CompressConfig {
        zstd: ZstdPolicy::Only,
        zstd_level: l,
        ..CompressConfig::default()
    };
    vec![
        ("lz4".into(), lz4),
        ("zstd--5".into(), z(-5)),
        ("zstd--1".into(), z(-1)),
        ("zstd-1".into(), z(1)),
        ("zstd-3".into(), z(3)),
        ("zstd-6".into(), z(6)),
        (
            "lz4, then zstd-1 if 1/4 smaller".into(),
            CompressConfig {
                zstd: ZstdPolicy::Always,
                ..CompressConfig::default()
            },
        ),
        (
            "default: zstd-1 if >= 1/4 zero bytes, else lz4".into(),
            CompressConfig::default(),
        ),
    ]
}

/// Page codecs per kind (sizes without the 1/8 cut-off, codec time only).
pub fn compare_codecs(cfg: &OpsConfig) -> Vec<CodecRow> {
    let mut rows = Vec::new();
    for kind in COMPRESS_KINDS {
        let pages = pages_of(kind, cfg.pages);
        for (name, mut cc) in codec_variants() {
            cc.min_saving = 0;
            cc.same_filled = false;
            let mut c = Compressor::new(cc);
            let objs: Vec<Option<Vec<u8>>> = pages
                .iter()
                .map(|p| c.compress(p).map(|d| d.to_vec()))
                .collect();
            let stored = objs
                .iter()
                .filter(|o| o.as_ref().is_some_and(|d| d.len() <= PAGE - PAGE / 8))
                .count();
            let bytes =
                objs.iter().flatten().map(|d| d.len()).sum::<usize>() as f64 / pages.len() as f64;
            let enc = time_rounds(cfg.rounds, pages.len(), || {
                for p in &pages {
                    std::hint::black_box(c.compress(p));
                }
            });
            let mut out = vec![0u8; PAGE];
            let dec = time_rounds(cfg.rounds, pages.len(), || {
                for d in objs.iter().flatten() {
                    c.decompress(d, &mut out).unwrap();
                }
            });
            rows.push(CodecRow {
                kind: kind.name(),
                codec: name,
                bytes,
                stored,
                encode: enc,
                decode: dec,
            });
        }
    }
    rows
}

/// Delta encoders per kind (bare encoder, no lookup or store). Sizes are
/// the full patch over all pages; times are encoding with the cut-off
/// (an encoder may give up early) and decoding the stored patches.
pub fn compare_encoders(cfg: &OpsConfig) -> Vec<CodecRow> {
    let mut rows = Vec::new();
    for kind in PATCH_KINDS {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> =
            (0..cfg.pages as u64).map(|s| pair(kind, s + 1)).collect();
        let mut variants: Vec<(String, Option<Encoder>)> = Encoder::ALL
            .iter()
            .map(|e| (e.name().to_string(), Some(*e)))
            .collect();
        variants.push(("runs, else zstd-ref (Patcher)".into(), None));
        for (name, enc) in variants {
            let mut out = vec![0u8; PAGE];
            let (bytes, stored, encode, decode) = match enc {
                Some(enc) => {
                    let mut e = DeltaEncoder::new(enc);
                    let mut d = DeltaDecoder::new();
                    let patches: Vec<Vec<u8>> =
                        pairs.iter().map(|(r, p)| e.encode(p, r).to_vec()).collect();
                    let stored = patches.iter().filter(|p| p.len() <= PATCH_CUTOFF).count();
                    let bytes =
                        patches.iter().map(|p| p.len()).sum::<usize>() as f64 / pairs.len() as f64;
                    // Timed as the engine calls it: refused above the cut-off.
                    let encode = time_rounds(cfg.rounds, pairs.len(), || {
                        for (r, p) in &pairs {
                            std::hint::black_box(e.encode_within(p, r, PATCH_CUTOFF));
                        }
                    });
                    let decode = time_rounds(cfg.rounds, stored.max(1), || {
                        for ((r, _), patch) in pairs.iter().zip(&patches) {
                            if patch.len() <= PATCH_CUTOFF {
                                d.apply_into(enc, patch, r, &mut out).unwrap();
                            }
                        }
                    });
                    (bytes, stored, encode, decode)
                }
                None => {
                    let mut pt = Patcher::new();
                    let patches: Vec<Option<Vec<u8>>> = pairs
                        .iter()
                        .map(|(r, p)| pt.make(p, r).map(|x| x.to_vec()))
                        .collect();
                    let stored = patches.iter().flatten().count();
                    let bytes = patches
                        .iter()
                        .map(|p| p.as_ref().map_or(PAGE, |p| p.len()))
                        .sum::<usize>() as f64
                        / pairs.len() as f64;
                    let encode = time_rounds(cfg.rounds, pairs.len(), || {
                        for (r, p) in &pairs {
                            std::hint::black_box(pt.make(p, r));
                        }
                    });
                    let decode = time_rounds(cfg.rounds, stored.max(1), || {
                        for ((r, _), patch) in pairs.iter().zip(&patches) {
                            if let Some(patch) = patch {
                                pt.apply(patch, r, &mut out).unwrap();
                            }
                        }
                    });
                    (bytes, stored, encode, decode)
                }
            };
            rows.push(CodecRow {
                kind: kind.name(),
                codec: name,
                bytes,
                stored,
                encode,
                decode,
            });
        }
    }
    rows
}

/// The store under churn: fill with the compressed forms of a mix of
/// kinds and patches, remove a random half, compact.
pub fn store_churn(objects: usize) -> Vec<(String, crate::store::StoreStats)> {
    let mut c = Compressor::default();
    let mut pt = Patcher::new();
    let mut store = Store::new(StoreConfig {
        reserve_bytes: 1 << 30,
        ..StoreConfig::default()
    })
    .expect("store");
    let mut rng = crate::kinds::Rng::new(42);
    let kinds = [Kind::Text, Kind::IntDoubles, Kind::Heap, Kind::Zero];
    let pkinds = [Kind::Write16, Kind::Similar95, Kind::Doubles];
    let mut handles = Vec::new();
    let mut i = 0u64;
    while handles.len() < objects {
        i += 1;
        let obj = if rng.below(3) == 0 {
            let (r, p) = pair(pkinds[rng.below(3) as usize], i);
            pt.make(&p, &r).map(|x| x.to_vec())
        } else {
            c.compress(&page(kinds[rng.below(4) as usize], i))
                .map(|x| x.to_vec())
        };
        if let Some(o) = obj {
            handles.push(store.insert(&o).unwrap());
        }
    }
    let mut out = vec![("filled".to_string(), store.stats())];
    for j in (1..handles.len()).rev() {
        handles.swap(j, rng.below(j as u64 + 1) as usize);
    }
    for h in handles.drain(..objects / 2) {
        store.remove(h).unwrap();
    }
    out.push(("half removed at random".into(), store.stats()));
    store.compact();
    out.push(("after compact()".into(), store.stats()));
    out
}

fn f(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// Everything as markdown: Table 2 ops with targets, codecs, encoders,
/// store churn.
pub fn run(cfg: &OpsConfig) -> String {
    ["ops", "codecs", "encoders", "store"]
        .iter()
        .map(|p| run_part(cfg, p))
        .collect()
}

/// One part of [`run`]: "ops", "codecs", "encoders" or "store".
pub fn run_part(cfg: &OpsConfig, part: &str) -> String {
    let mut s = String::new();
    if part != "ops" {
        return run_rest(cfg, part);
    }
    // Calibration in the same run: what the machine gives right now for
    // work of known cost (on an idle machine: XXH3 of a page 0.21 µs,
    // memcmp of two equal pages 0.09-0.11 µs).
    let pages = pages_of(Kind::Random, cfg.pages);
    let copy = pages.clone();
    let xxh = time_rounds(cfg.rounds, pages.len(), || {
        for p in &pages {
            std::hint::black_box(xxhash_rust::xxh3::xxh3_64(p));
        }
    });
    let cmp = time_rounds(cfg.rounds, pages.len(), || {
        for (a, b) in pages.iter().zip(&copy) {
            std::hint::black_box(a == b);
        }
    });
    let rows = measure_ops(cfg);
    let _ = writeln!(
        s,
        "Calibration (same run): XXH3 of a page {} µs, memcmp of two equal pages {} µs (idle machine: 0.21 and 0.09-0.11).\n",
        f(xxh.median_us),
        f(cmp.median_us)
    );
    let _ = writeln!(
        s,
        "Table 2 ops (median µs per op over {} rounds of {} pages; p10-p90):\n",
        cfg.rounds, cfg.pages
    );
    let _ = writeln!(
        s,
        "| op | page kind | median µs | p10-p90 | stored | mean bytes | DE µs | target (met) | strict target (met) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let de = lookup(&DE_TABLE2, r.op).unwrap_or(0.0);
        let na = (r.op == "uncompress" || r.op == "unpatch") && r.stored == 0;
        let met = |t: Option<f64>| match t {
            _ if na => "n/a".to_string(),
            None => "device".to_string(),
            Some(t) => format!(
                "{} ({})",
                f(t),
                if r.timing.median_us <= t { "yes" } else { "NO" }
            ),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {}-{} | {}/{} | {} | {} | {} | {} |",
            r.op,
            r.kind,
            if na {
                "-".into()
            } else {
                f(r.timing.median_us)
            },
            f(r.timing.p10_us),
            f(r.timing.p90_us),
            r.stored,
            cfg.pages,
            f(r.bytes),
            de,
            met(lookup(&TARGETS, r.op)),
            met(lookup(&STRICT_TARGETS, r.op)),
        );
    }
    s
}

fn run_rest(cfg: &OpsConfig, part: &str) -> String {
    let mut s = String::new();
    let table = |s: &mut String, title: &str, rows: &[CodecRow]| {
        let _ = writeln!(s, "\n{title}\n");
        let _ = writeln!(
            s,
            "| page kind | codec | mean bytes | stored | encode µs | decode µs |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|");
        for r in rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {}/{} | {} | {} |",
                r.kind,
                r.codec,
                f(r.bytes),
                r.stored,
                cfg.pages,
                f(r.encode.median_us),
                f(r.decode.median_us)
            );
        }
    };
    if part == "codecs" {
        table(
            &mut s,
            "Page codecs (codec alone; stored = at most 7/8 page):",
            &compare_codecs(cfg),
        );
    }
    if part == "encoders" {
        table(
            &mut s,
            "Delta encoders (encoder alone; stored = patch at most 2048 B):",
            &compare_encoders(cfg),
        );
    }
    if part != "store" {
        return s;
    }
    let _ = writeln!(s, "\nCompressed store under churn (20,000 objects: compressed text/int-doubles/heap/zero-ish pages and patches):\n");
    let _ = writeln!(s, "| state | objects | payload KiB | slot KiB | slab KiB | metadata KiB | fragmentation (internal + external) |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for (name, st) in store_churn(20_000) {
        let k = |b: u64| format!("{:.0}", b as f64 / 1024.0);
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} | {} | {} | {:.1}% ({:.1}% + {:.1}%) of slab bytes |",
            st.objects,
            k(st.payload_bytes),
            k(st.slot_bytes),
            k(st.slab_bytes),
            k(st.metadata_bytes),
            100.0 * st.fragmentation_bytes() as f64 / st.slab_bytes.max(1) as f64,
            100.0 * st.internal_fragmentation() as f64 / st.slab_bytes.max(1) as f64,
            100.0 * st.external_fragmentation() as f64 / st.slab_bytes.max(1) as f64,
        );
    }
    s
}
