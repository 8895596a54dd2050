//! A fixed sample of page fingerprints, for estimating how much several
//! processes (or machines) share without moving their pages: the approach of
//! Memory Buddies (Wood et al., VEE 2009). A page is sampled when its content
//! hash (the scan's xxh3) is a multiple of `rate`, so the sample is a fixed
//! 1/`rate` slice of the hash space: the same content is sampled in every
//! process, and the duplicates among the samples of several processes,
//! multiplied by `rate`, estimate the duplicates among all their pages.
//!
//! Zero pages are not sampled (one hash would stand for all of them); they
//! are counted exactly. Each sampled content lists how many pages hold it and
//! on how many distinct physical frames (when the reader saw frame numbers),
//! per input, so a reader can tell sharing that exists already (several pages
//! on one frame) from sharing still to be had.

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use crate::image::Image;
use crate::scan::Scan;

/// Largest sampling rate accepted (one page in 2^20).
pub const MAX_RATE: u64 = 1 << 20;

/// The sample of one input.
#[derive(Debug, Clone, Serialize)]
pub struct InputFingerprints {
    pub input: String,
    pub pages: u64,
    pub zero_pages: u64,
    /// Non-zero pages whose hash fell in the sample.
    pub sampled_pages: u64,
    /// One entry per sampled content, by hash: `[hash as 16 hex digits,
    /// pages holding it, distinct frames among them (0: frames unknown)]`.
    pub sampled: Vec<(String, u64, u64)>,
}

/// The samples of all inputs.
#[derive(Debug, Clone, Serialize)]
pub struct Fingerprints {
    /// A page is sampled when its xxh3 hash is a multiple of `rate`.
    pub rate: u64,
    pub hash: &'static str,
    pub inputs: Vec<InputFingerprints>,
}

/// True if a page with this hash belongs to the sample.
pub fn sampled(hash: u64, rate: u64) -> bool {
    hash.is_multiple_of(rate)
}

/// The sample of every input of `image`, from its scan.
pub fn sample(image: &Image, scan: &Scan, rate: u64) -> Fingerprints {
    let rate = rate.max(1);
    // Per input: hash -> (pages, frames seen).
    let mut per_input: Vec<BTreeMap<u64, (u64, HashSet<u64>)>> =
        vec![BTreeMap::new(); image.inputs.len().max(1)];
    let mut pages = vec![0u64; per_input.len()];
    let mut zero = vec![0u64; per_input.len()];
    for page in 0..image.pages() {
        let input = image.input_of(page).min(per_input.len() - 1);
        pages[input] += 1;
        if scan.zero[page] {
            zero[input] += 1;
            continue;
        }
        let hash = scan.hash[page];
        if !sampled(hash, rate) {
            continue;
        }
        let entry = per_input[input].entry(hash).or_default();
        entry.0 += 1;
        if let Some(&frame) = image.frames.get(page).filter(|&&f| f != 0) {
            entry.1.insert(frame);
        }
    }
    let inputs = per_input
        .into_iter()
        .enumerate()
        .map(|(i, hashes)| InputFingerprints {
            input: image
                .inputs
                .get(i)
                .map(|x| x.name.clone())
                .unwrap_or_default(),
            pages: pages[i],
            zero_pages: zero[i],
            sampled_pages: hashes.values().map(|(n, _)| n).sum(),
            sampled: hashes
                .into_iter()
                .map(|(h, (n, frames))| (format!("{h:016x}"), n, frames.len() as u64))
                .collect(),
        })
        .collect();
    Fingerprints {
        rate,
        hash: "xxh3-64 of the 4 KiB page",
        inputs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Progress;

    fn page_of(seed: u64) -> Vec<u8> {
        let mut p = vec![0u8; crate::PAGE];
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for b in p.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        p
    }

    #[test]
    fn sample_is_a_fixed_slice_of_the_hash_space() {
        // 4000 distinct pages, each present three times, plus 100 zero pages.
        let mut data = Vec::new();
        for copy in 0..3 {
            for i in 0..4000 {
                data.extend(page_of(i + 1));
            }
            if copy == 0 {
                data.extend(vec![0u8; 100 * crate::PAGE]);
            }
        }
        let image = Image::in_memory(data);
        let scan = crate::scan::scan(&image, None, &Progress::new(true));
        let all = sample(&image, &scan, 1);
        assert_eq!(all.inputs[0].pages, 12_100);
        assert_eq!(all.inputs[0].zero_pages, 100);
        assert_eq!(all.inputs[0].sampled.len(), 4000);
        assert!(all.inputs[0]
            .sampled
            .iter()
            .all(|(_, n, f)| *n == 3 && *f == 0));
        let some = sample(&image, &scan, 16);
        let distinct = some.inputs[0].sampled.len() as f64;
        // Expected 250; the binomial's standard deviation is about 15.
        assert!((170.0..330.0).contains(&distinct), "{distinct}");
        assert_eq!(some.inputs[0].sampled_pages, 3 * distinct as u64);
        for (h, _, _) in &some.inputs[0].sampled {
            assert!(sampled(u64::from_str_radix(h, 16).unwrap(), 16));
        }
    }
}
