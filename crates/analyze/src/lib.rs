//! pagefold-analyze: what could sharing, patching, compression and
//! deduplication save on this process or memory image — answered without
//! changing the target, with the breakdowns of the papers pagefold builds on.
//!
//! `read` turns live PIDs (one or several, optionally twice some time apart),
//! raw memory images and ELF core files into an [`Image`]: a list of 4 KiB
//! pages with their origin. The analyses, each switchable, then run over it:
//!
//! - [`sharing`] + [`similarity`]: Difference Engine's Table 1 — zero,
//!   sharable (and distinct), unique pages, pages after sharing, patchable
//!   pages found by HashSimilarityDetector(k, s) with c candidates and real
//!   patches ([`delta`]), pages after patching; per input and across inputs;
//! - [`characterize`]: Deng et al.'s Table 3 and its two distributions;
//! - [`study`]: Deng et al.'s compression (pagefold-codecs) and chunking
//!   deduplication studies, on a stated sample;
//! - [`comparisons`]: comparisons needed to find the duplicates by KSM's
//!   trees, a hash index and CMDP's behaviour-classified trees;
//! - [`fingerprints`]: a fixed 1/N sample of page hashes, from which the
//!   sharing between processes read at different times or places is
//!   estimated (Memory Buddies).
//!
//! [`analyze`] runs the selected analyses and returns a [`Report`] that
//! prints as tables ([`report::text`]), serialises to JSON, and plots to PNG
//! ([`plot`]). [`cli`] is `pagefold analyze`. Everything parallel runs on
//! rayon's pool (all cores); stages longer than a second show a progress bar.

/// The patch encoders live in pagefold-tier (shared with the engine).
pub use pagefold_tier::patch as delta;

pub mod characterize;
pub mod cli;
pub mod comparisons;
pub mod error;
pub mod fingerprints;
pub mod image;
pub mod plot;
pub mod progress;
pub mod read;
pub mod report;
pub mod scan;
pub mod sharing;
pub mod similarity;
pub mod study;

use std::time::Instant;

use serde::Serialize;

pub use error::{Error, Result};
pub use image::{Image, PAGE};
pub use progress::Progress;
pub use read::{FileFormat, Filter, Target};
pub use scan::SimilarityConfig;

use characterize::Characterization;
use comparisons::Comparisons;
use fingerprints::Fingerprints;
use image::{Change, InputInfo};
use sharing::{Counts, Cross, Frames};
use similarity::Patching;
use study::{CodecStudy, DedupStudy};

/// Which analyses to run, and their parameters.
#[derive(Debug, Clone)]
pub struct Options {
    /// Zero / sharing breakdown (Table 1 up to "after sharing").
    pub sharing: bool,
    /// Similarity detection and patching (needs `sharing`).
    pub patching: bool,
    pub characterize: bool,
    pub comparisons: bool,
    pub codecs: bool,
    pub dedup: bool,
    /// Sample page fingerprints at this rate (one page in N), if set.
    pub fingerprints: Option<u64>,
    pub similarity: SimilarityConfig,
    /// Bytes of the image the codec study samples.
    pub codec_sample: usize,
    pub codec_blocks: Vec<usize>,
    /// Bytes of the image the dedup study samples.
    pub dedup_sample: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            sharing: true,
            patching: true,
            characterize: true,
            comparisons: true,
            codecs: true,
            dedup: true,
            fingerprints: None,
            similarity: SimilarityConfig::default(),
            codec_sample: 8 << 20,
            codec_blocks: vec![4096, 8192, 16384, 32768, 65536, 131072],
            dedup_sample: 256 << 20,
        }
    }
}

/// Table 1 and its companions.
#[derive(Debug, Clone, Serialize)]
pub struct Breakdown {
    #[serde(flatten)]
    pub counts: Counts,
    pub sharing_saved_pct: f64,
    pub patching: Option<Patching>,
    /// Per input (in-process sharing only), when there are several.
    pub per_input: Vec<InputCounts>,
    pub cross: Option<Cross>,
    pub frames: Option<Frames>,
    pub verify_compares: u64,
    pub hash_collisions: u64,
    /// Scan + sharing + similarity (wall time), and the bytes per second
    /// that makes. The input's read time is not included (see the inputs).
    pub seconds: f64,
    pub gb_per_s: f64,
    /// CPU time (all threads) of the same stages: on a busy machine
    /// bytes / (cpu_seconds / threads) is the throughput an idle one gives.
    pub cpu_seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct InputCounts {
    pub input: String,
    #[serde(flatten)]
    pub counts: Counts,
}

/// Two-snapshot behaviour per mapping permission.
#[derive(Debug, Clone, Serialize)]
pub struct BehaviourRow {
    pub perms: String,
    pub unchanged: u64,
    pub changed: u64,
    pub new: u64,
    pub gone: u64,
}

/// One technique's result, for the savings summary and chart.
#[derive(Debug, Clone, Serialize)]
pub struct Saving {
    pub technique: String,
    /// Pages (or page equivalents) needed after the technique.
    pub pages_after: f64,
    pub saved_pct: f64,
    /// "measured" on every page, or "sampled".
    pub basis: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub inputs: Vec<InputInfo>,
    pub pages: u64,
    pub bytes: u64,
    pub breakdown: Option<Breakdown>,
    pub behaviour: Option<Vec<BehaviourRow>>,
    pub characterization: Option<Characterization>,
    pub comparisons: Option<Comparisons>,
    pub compression: Option<CodecStudy>,
    pub dedup: Option<DedupStudy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fingerprints: Option<Fingerprints>,
    pub savings: Vec<Saving>,
    pub threads: usize,
    pub seconds: f64,
}

/// Runs the selected analyses over `image`.
pub fn analyze(image: &Image, opts: &Options, progress: &Progress) -> Result<Report> {
    opts.similarity.check().map_err(Error::Usage)?;
    if image.pages() == 0 {
        return Err(Error::NothingToAnalyze("the input has no pages".into()));
    }
    if image.pages() >= u32::MAX as usize {
        return Err(Error::Usage(
            "inputs larger than 16 TiB are not supported".into(),
        ));
    }
    let start = Instant::now();
    let n = image.pages() as u64;
    let need_scan = opts.sharing || opts.comparisons || opts.fingerprints.is_some();
    let patching = opts.sharing && opts.patching;
    let cpu_before_scan = cpu_seconds();
    let scan = need_scan.then(|| scan::scan(image, patching.then_some(&opts.similarity), progress));
    let scan_cpu = cpu_seconds() - cpu_before_scan;

    let mut breakdown = None;
    if opts.sharing {
        let t = Instant::now();
        let cpu0 = cpu_seconds();
        let scan_ref = scan.as_ref().expect("scan");
        let sh = sharing::share(image, scan_ref, progress);
        let patch =
            patching.then(|| similarity::patch(image, scan_ref, &sh, &opts.similarity, progress));
        let secs = scan_ref.seconds + t.elapsed().as_secs_f64();
        let cpu = scan_cpu + cpu_seconds() - cpu0;
        let per_input = if image.inputs.len() > 1 {
            image
                .inputs
                .iter()
                .zip(&sh.per_input)
                .map(|(i, c)| InputCounts {
                    input: i.name.clone(),
                    counts: c.clone(),
                })
                .collect()
        } else {
            Vec::new()
        };
        breakdown = Some(Breakdown {
            sharing_saved_pct: sh.total.saved_pct(),
            counts: sh.total.clone(),
            patching: patch,
            per_input,
            cross: sh.cross.clone(),
            frames: sh.frames.clone(),
            verify_compares: sh.verify_compares,
            hash_collisions: sh.hash_collisions,
            seconds: secs,
            gb_per_s: image.bytes() as f64 / secs.max(1e-9) / 1e9,
            cpu_seconds: cpu,
        });
    }
    let behaviour = image.changes.as_ref().map(|ch| behaviour(image, ch));
    let characterization = opts
        .characterize
        .then(|| characterize::characterize(image, progress));
    let comparisons = if opts.comparisons {
        Some(comparisons::compare(
            image,
            scan.as_ref().expect("scan"),
            progress,
        ))
    } else {
        None
    };
    let compression = opts
        .codecs
        .then(|| study::codec_study(image, opts.codec_sample, &opts.codec_blocks, progress));
    let dedup = opts.dedup.then(|| {
        study::dedup_study(
            image,
            opts.dedup_sample,
            &study::default_schemes(),
            progress,
        )
    });
    let fingerprints = opts
        .fingerprints
        .map(|rate| fingerprints::sample(image, scan.as_ref().expect("scan"), rate));
    let savings = savings(n, breakdown.as_ref(), compression.as_ref(), dedup.as_ref());
    Ok(Report {
        inputs: image.inputs.clone(),
        pages: n,
        bytes: image.bytes(),
        breakdown,
        behaviour,
        characterization,
        comparisons,
        compression,
        dedup,
        fingerprints,
        savings,
        threads: rayon::current_num_threads(),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// User + system CPU time of this process so far.
pub fn cpu_seconds() -> f64 {
    // SAFETY: rusage is a C struct of integers and timevals, for which all
    // zero bytes is a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a live, writable rusage of this frame; getrusage writes
    // only into it.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn behaviour(image: &Image, changes: &[Change]) -> Vec<BehaviourRow> {
    use std::collections::BTreeMap;
    fn row(rows: &mut BTreeMap<String, BehaviourRow>, perms: String) -> &mut BehaviourRow {
        rows.entry(perms.clone()).or_insert(BehaviourRow {
            perms,
            unchanged: 0,
            changed: 0,
            new: 0,
            gone: 0,
        })
    }
    let mut rows: BTreeMap<String, BehaviourRow> = BTreeMap::new();
    for (i, c) in changes.iter().enumerate() {
        let r = row(&mut rows, image.region(i).perms.label());
        match c {
            Change::Unchanged => r.unchanged += 1,
            Change::Changed => r.changed += 1,
            Change::New => r.new += 1,
        }
    }
    for input in &image.inputs {
        if let Some(s) = &input.snapshot {
            for (perms, g) in &s.gone_by_perms {
                row(&mut rows, perms.clone()).gone += g;
            }
        }
    }
    rows.into_values().collect()
}

fn savings(
    n: u64,
    b: Option<&Breakdown>,
    c: Option<&CodecStudy>,
    d: Option<&DedupStudy>,
) -> Vec<Saving> {
    let mut out = Vec::new();
    let pct = |after: f64| {
        if n == 0 {
            0.0
        } else {
            100.0 * (1.0 - after / n as f64)
        }
    };
    if let Some(b) = b {
        let zero_after = (n - b.counts.zero_pages + (b.counts.zero_pages > 0) as u64) as f64;
        out.push(Saving {
            technique: "zero pages folded".into(),
            pages_after: zero_after,
            saved_pct: pct(zero_after),
            basis: "measured",
        });
        out.push(Saving {
            technique: "zero + identical sharing".into(),
            pages_after: b.counts.after_sharing as f64,
            saved_pct: pct(b.counts.after_sharing as f64),
            basis: "measured",
        });
        if let Some(p) = &b.patching {
            out.push(Saving {
                technique: "sharing + patching".into(),
                pages_after: p.after_patching as f64,
                saved_pct: pct(p.after_patching as f64),
                basis: "measured",
            });
        }
    }
    if let Some(c) = c {
        let pages: Vec<_> = c
            .rows
            .iter()
            .filter(|r| r.block == PAGE && r.ratio.is_finite())
            .collect();
        if let Some(best) = pages.iter().min_by(|a, b| a.ratio.total_cmp(&b.ratio)) {
            out.push(Saving {
                technique: format!("compression {} (4 KiB pages)", best.codec),
                pages_after: n as f64 * best.ratio,
                saved_pct: pct(n as f64 * best.ratio),
                basis: "sampled",
            });
        }
        if let Some(lz4) = pages.iter().find(|r| r.codec == "lz4") {
            out.push(Saving {
                technique: "compression lz4 (4 KiB pages)".into(),
                pages_after: n as f64 * lz4.ratio,
                saved_pct: pct(n as f64 * lz4.ratio),
                basis: "sampled",
            });
        }
    }
    if let Some(d) = d {
        if let Some(r) = d.rows.iter().find(|r| r.scheme == "fsp-4k") {
            let basis = if d.sample.sample_bytes == d.sample.image_bytes {
                "measured"
            } else {
                "sampled"
            };
            out.push(Saving {
                technique: "dedup fsp-4k (chunk refs counted)".into(),
                pages_after: n as f64 * r.ratio,
                saved_pct: pct(n as f64 * r.ratio),
                basis,
            });
        }
    }
    out
}
