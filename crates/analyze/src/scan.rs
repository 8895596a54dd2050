//! The one parallel pass over every page that the sharing and similarity
//! analyses start from: is the page all zero, its 64-bit content hash
//! (xxh3), and the k similarity keys of Difference Engine's
//! HashSimilarityDetector(k, s) — each key is the hash of s 64-byte blocks
//! at fixed pseudo-random offsets. The pass reads each page once (the blocks
//! are read again from cache) and is split over all cores in chunks of 1024
//! pages; it is the part of the breakdown whose speed is bounded by memory
//! bandwidth.

use pagefold_tier::similar::{page_keys, SimilarityParams};
use rayon::prelude::*;
use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

use crate::delta::Encoder;
use crate::image::{is_zero, Image};
use crate::progress::Progress;

/// HashSimilarityDetector(k, s) with c candidates per bucket, and the patch
/// rules. Defaults are Difference Engine's: (2, 1), c = 1, 64-byte blocks,
/// patches above 2 KiB (half a page) are not worth keeping.
#[derive(Debug, Clone, Serialize)]
pub struct SimilarityConfig {
    pub k: usize,
    pub s: usize,
    pub candidates: usize,
    pub block: usize,
    pub cutoff: usize,
    #[serde(serialize_with = "ser_encoder")]
    pub encoder: Encoder,
    /// Seed of the block offsets (fixed so runs are comparable).
    pub seed: u64,
}

fn ser_encoder<S: serde::Serializer>(e: &Encoder, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(e.name())
}

impl Default for SimilarityConfig {
    fn default() -> Self {
        SimilarityConfig {
            k: 2,
            s: 1,
            candidates: 1,
            block: 64,
            cutoff: 2048,
            encoder: Encoder::default(),
            seed: 0x7061_6765_666f_6c64, // "pagefold"
        }
    }
}

impl SimilarityConfig {
    /// The detector part, as pagefold-tier defines it, so the analyzer and
    /// the engine's online detector use the same blocks and the same rules.
    pub fn params(&self) -> SimilarityParams {
        SimilarityParams {
            k: self.k,
            s: self.s,
            candidates: self.candidates,
            block: self.block,
            seed: self.seed,
        }
    }

    /// The k*s block offsets: index i uses offsets[i*s .. i*s+s].
    pub fn offsets(&self) -> Vec<usize> {
        self.params().offsets()
    }

    pub fn label(&self) -> String {
        self.params().label()
    }

    pub fn check(&self) -> Result<(), String> {
        self.params().check()
    }
}

/// Per-page results of the scan.
pub struct Scan {
    pub zero: Vec<bool>,
    /// xxh3 of the page (0 for zero pages).
    pub hash: Vec<u64>,
    /// k keys per page (unset for zero pages); empty without similarity.
    pub keys: Vec<u64>,
    pub k: usize,
    pub seconds: f64,
}

impl Scan {
    pub fn keys_of(&self, page: usize) -> &[u64] {
        &self.keys[page * self.k..page * self.k + self.k]
    }
}

const CHUNK: usize = 1024;

/// Scans every page; `sim` adds the similarity keys.
pub fn scan(image: &Image, sim: Option<&SimilarityConfig>, progress: &Progress) -> Scan {
    let start = std::time::Instant::now();
    let n = image.pages();
    let (k, s, block, offsets) = match sim {
        Some(c) => (c.k, c.s, c.block, c.offsets()),
        None => (0, 0, 0, Vec::new()),
    };
    let mut zero = vec![false; n];
    let mut hash = vec![0u64; n];
    let mut keys = vec![0u64; n * k];
    let bar = progress.stage("scan", n as u64, false);
    let kk = k.max(1);
    let mut dummy = vec![0u64; if k == 0 { n } else { 0 }];
    let keys_slice: &mut [u64] = if k == 0 { &mut dummy } else { &mut keys };
    zero.par_chunks_mut(CHUNK)
        .zip(hash.par_chunks_mut(CHUNK))
        .zip(keys_slice.par_chunks_mut(CHUNK * kk))
        .enumerate()
        .for_each(|(ci, ((z, h), ks))| {
            let base = ci * CHUNK;
            for j in 0..z.len() {
                let page = image.page(base + j);
                if is_zero(page) {
                    z[j] = true;
                    continue;
                }
                h[j] = xxh3_64(page);
                page_keys(page, &offsets, s, block, &mut ks[j * k..j * k + k]);
            }
            bar.inc(z.len() as u64);
        });
    bar.finish();
    Scan {
        zero,
        hash,
        keys,
        k,
        seconds: start.elapsed().as_secs_f64(),
    }
}
