//! Deng et al.'s two studies, run with pagefold-codecs on the image:
//!
//! - compression: every codec (LZ4, zstd levels, and the classic RLE,
//!   Huffman, arithmetic, LZ77, LZ78, LZW) on independent blocks of 4 KiB
//!   (pages) up to 128 KiB: size ratio (compressed / original, smaller is
//!   better) and compress + decompress time per 4 KiB page;
//! - deduplication: fixed-size chunking (FSP) of 4-32 KiB, content-defined
//!   chunking (FastCDC) and sliding block (SB): ratio (stored bytes, chunk
//!   references included, / original) and time per page to deduplicate and
//!   to restore.
//!
//! The classic codecs run at tens of MB/s, so both studies work on a sample
//! stated in the report: whole 128 KiB windows of consecutive pages, evenly
//! spaced over the image, up to the sample budget (the whole image when it
//! is smaller). Every codec and block size sees the same bytes. The
//! (codec, block) measurements run in parallel, one per core; each is timed
//! on its own thread, so with two cores two measurements share the memory
//! bus, which the times include.

use rayon::prelude::*;
use serde::Serialize;

use pagefold_codecs::{
    all_codecs, dedup, try_measure, Chunking, CodecMeasurement, DedupMeasurement,
};

use crate::image::{Image, PAGE};
use crate::progress::Progress;

pub const WINDOW: usize = 128 * 1024;

#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub image_bytes: u64,
    pub sample_bytes: u64,
    /// Windows of consecutive pages taken, and their size.
    pub windows: u64,
    pub window_bytes: u64,
    pub description: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct CodecRow {
    pub codec: String,
    pub block: usize,
    pub ratio: f64,
    pub compress_ns_per_page: f64,
    pub decompress_ns_per_page: f64,
    #[serde(skip)]
    pub raw: Option<CodecMeasurement>,
    /// Set when the codec failed to round-trip (a codec bug).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CodecStudy {
    pub sample: Sample,
    pub rows: Vec<CodecRow>,
    pub seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DedupRow {
    pub scheme: String,
    pub chunks: u64,
    pub unique_chunks: u64,
    pub ratio: f64,
    pub dedup_ns_per_page: f64,
    pub restore_ns_per_page: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct DedupStudy {
    pub sample: Sample,
    pub rows: Vec<DedupRow>,
    pub seconds: f64,
}

/// Evenly spaced windows of `window` bytes (whole pages) up to `budget`.
pub fn sample(image: &Image, budget: usize, window: usize) -> (Vec<u8>, Sample) {
    let n = image.pages();
    let wp = (window / PAGE).max(1);
    let total = image.bytes();
    if (total as usize) <= budget {
        let data = image.concat(0, total as usize);
        let s = Sample {
            image_bytes: total,
            sample_bytes: data.len() as u64,
            windows: 1,
            window_bytes: data.len() as u64,
            description: "whole image".into(),
        };
        return (data, s);
    }
    let windows = (budget / (wp * PAGE)).max(1);
    let slots = n / wp; // whole windows in the image
    let windows = windows.min(slots.max(1));
    let mut data = Vec::with_capacity(windows * wp * PAGE);
    for w in 0..windows {
        // Window w starts at slot floor(w * slots / windows).
        let slot = w * slots / windows;
        data.extend_from_slice(&image.concat(slot * wp, wp * PAGE));
    }
    let s = Sample {
        image_bytes: total,
        sample_bytes: data.len() as u64,
        windows: windows as u64,
        window_bytes: (wp * PAGE) as u64,
        description: format!(
            "{} windows of {} KiB evenly spaced ({:.1}% of the image)",
            windows,
            wp * PAGE / 1024,
            100.0 * data.len() as f64 / total as f64
        ),
    };
    (data, s)
}

pub fn codec_study(
    image: &Image,
    budget: usize,
    blocks: &[usize],
    progress: &Progress,
) -> CodecStudy {
    let start = std::time::Instant::now();
    let window = blocks.iter().copied().max().unwrap_or(WINDOW).max(PAGE);
    let (data, sample) = sample(image, budget, window);
    let codecs = all_codecs();
    let jobs: Vec<(usize, usize)> = (0..codecs.len())
        .flat_map(|c| blocks.iter().map(move |&b| (c, b)))
        .collect();
    let bar = progress.stage("compress", jobs.len() as u64, false);
    let rows: Vec<CodecRow> = jobs
        .par_iter()
        .with_max_len(1)
        .map(|&(c, block)| {
            let codec = codecs[c].as_ref();
            let row = match try_measure(codec, &data, block) {
                Ok(m) => CodecRow {
                    codec: m.codec.clone(),
                    block,
                    ratio: m.ratio(),
                    compress_ns_per_page: m.compress_ns_per_page(),
                    decompress_ns_per_page: m.decompress_ns_per_page(),
                    raw: Some(m),
                    error: None,
                },
                Err(e) => CodecRow {
                    codec: codec.name().to_string(),
                    block,
                    ratio: f64::NAN,
                    compress_ns_per_page: f64::NAN,
                    decompress_ns_per_page: f64::NAN,
                    raw: None,
                    error: Some(e.to_string()),
                },
            };
            bar.inc(1);
            row
        })
        .collect();
    bar.finish();
    CodecStudy {
        sample,
        rows,
        seconds: start.elapsed().as_secs_f64(),
    }
}

/// The chunking schemes of Deng et al.: FSP 4-32 KiB, CDC (FastCDC, average
/// 4 and 8 KiB), SB with 4 KiB blocks.
pub fn default_schemes() -> Vec<Chunking> {
    vec![
        Chunking::Fixed(4096),
        Chunking::Fixed(8192),
        Chunking::Fixed(16384),
        Chunking::Fixed(32768),
        Chunking::cdc(4096),
        Chunking::cdc(8192),
        Chunking::SlidingBlock(4096),
    ]
}

pub fn dedup_study(
    image: &Image,
    budget: usize,
    schemes: &[Chunking],
    progress: &Progress,
) -> DedupStudy {
    let start = std::time::Instant::now();
    // Larger windows keep more of the image's own duplication structure.
    let (data, sample) = sample(image, budget, 1 << 20);
    let bar = progress.stage("dedup", schemes.len() as u64, false);
    let rows: Vec<DedupRow> = schemes
        .par_iter()
        .with_max_len(1)
        .map(|s| {
            let m: DedupMeasurement = dedup(&data, s);
            bar.inc(1);
            DedupRow {
                scheme: m.scheme.clone(),
                chunks: m.chunks,
                unique_chunks: m.unique_chunks,
                ratio: m.ratio(),
                dedup_ns_per_page: m.dedup_ns_per_page(),
                restore_ns_per_page: m.restore_ns_per_page(),
            }
        })
        .collect();
    bar.finish();
    DedupStudy {
        sample,
        rows,
        seconds: start.elapsed().as_secs_f64(),
    }
}
