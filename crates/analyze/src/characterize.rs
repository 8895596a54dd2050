//! Characterisation of memory contents as in Deng et al.'s Table 3: the
//! share of zero bytes, of bytes inside zero runs longer than 32 bytes, of
//! such runs that touch a page boundary, of low byte values (1-9) and of
//! powers of two (1, 2, 4, ..., 128), the zero-order entropy in bits per
//! byte, and two distributions: zero-run lengths (1..4096) and byte values.
//!
//! Zero runs are counted inside pages (a run ends at a page boundary), so a
//! run's length is 1..4096 and "touches a page boundary" means it starts at
//! the first or ends at the last byte of its page; a zero page is one run of
//! 4096. Every page is independent, so pages are split over all cores and
//! the per-core tallies summed.

use rayon::prelude::*;
use serde::Serialize;

use crate::image::{Image, PAGE};
use crate::progress::Progress;

/// Runs longer than this count as "long" zero runs (Deng et al.: 32 B).
pub const LONG_RUN: usize = 32;

#[derive(Debug, Clone, Serialize)]
pub struct Characterization {
    pub bytes: u64,
    pub zero_bytes_pct: f64,
    pub zero_bytes_in_long_runs_pct: f64,
    pub long_runs: u64,
    pub long_runs_touching_page_boundary_pct: f64,
    pub low_values_1_9_pct: f64,
    pub powers_of_two_pct: f64,
    /// Zero-order (byte-frequency) entropy, bits per byte.
    pub entropy_bits_per_byte: f64,
    pub zero_runs: u64,
    /// (length, count) for every zero-run length that occurs.
    pub zero_run_lengths: Vec<(u32, u64)>,
    /// Count of each byte value 0..255.
    pub byte_histogram: Vec<u64>,
    pub seconds: f64,
}

#[derive(Clone)]
struct Tally {
    hist: [u64; 256],
    runs: Vec<u64>, // index = run length, 1..=PAGE
    long_run_bytes: u64,
    long_runs: u64,
    long_touching: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            hist: [0; 256],
            runs: vec![0; PAGE + 1],
            long_run_bytes: 0,
            long_runs: 0,
            long_touching: 0,
        }
    }

    fn merge(mut self, o: Tally) -> Tally {
        for (a, b) in self.hist.iter_mut().zip(o.hist.iter()) {
            *a += b;
        }
        for (a, b) in self.runs.iter_mut().zip(o.runs.iter()) {
            *a += b;
        }
        self.long_run_bytes += o.long_run_bytes;
        self.long_runs += o.long_runs;
        self.long_touching += o.long_touching;
        self
    }

    #[inline]
    fn run(&mut self, start: usize, len: usize, page_len: usize) {
        self.runs[len] += 1;
        if len > LONG_RUN {
            self.long_runs += 1;
            self.long_run_bytes += len as u64;
            if start == 0 || start + len == page_len {
                self.long_touching += 1;
            }
        }
    }

    fn page(&mut self, page: &[u8], h: &mut [[u32; 256]; 4]) {
        // Four sub-histograms break the store-to-load dependency on equal
        // consecutive bytes; u32 cannot overflow within one page.
        let mut chunks = page.chunks_exact(4);
        for c in &mut chunks {
            h[0][c[0] as usize] += 1;
            h[1][c[1] as usize] += 1;
            h[2][c[2] as usize] += 1;
            h[3][c[3] as usize] += 1;
        }
        for &b in chunks.remainder() {
            h[0][b as usize] += 1;
        }
        // Zero runs: skip non-zero words quickly.
        let n = page.len();
        let mut i = 0;
        while i < n {
            if page[i] != 0 {
                i += 1;
                // Fast skip over 8-byte words without any zero byte.
                while i + 8 <= n {
                    let w = u64::from_le_bytes(page[i..i + 8].try_into().unwrap());
                    let has_zero =
                        w.wrapping_sub(0x0101_0101_0101_0101) & !w & 0x8080_8080_8080_8080;
                    if has_zero != 0 {
                        break;
                    }
                    i += 8;
                }
                continue;
            }
            let s = i;
            while i < n && page[i] == 0 {
                i += 1;
            }
            self.run(s, i - s, n);
        }
    }
}

pub fn characterize(image: &Image, progress: &Progress) -> Characterization {
    let start = std::time::Instant::now();
    let n = image.pages();
    let bar = progress.stage("characterize", n as u64, false);
    let t = (0..n)
        .into_par_iter()
        .with_min_len(256)
        .fold(
            || (Tally::new(), Box::new([[0u32; 256]; 4]), 0usize),
            |(mut t, mut h, mut count), i| {
                t.page(image.page(i), &mut h);
                count += 1;
                if count % 256 == 0 {
                    // Flush the u32 sub-histograms before they could overflow.
                    flush(&mut t, &mut h);
                    bar.inc(256);
                }
                (t, h, count)
            },
        )
        .map(|(mut t, mut h, count)| {
            flush(&mut t, &mut h);
            bar.inc((count % 256) as u64);
            t
        })
        .reduce(Tally::new, Tally::merge);
    bar.finish();
    summarize(t, start)
}

fn flush(t: &mut Tally, h: &mut [[u32; 256]; 4]) {
    for sub in h.iter_mut() {
        for (a, b) in t.hist.iter_mut().zip(sub.iter_mut()) {
            *a += *b as u64;
            *b = 0;
        }
    }
}

fn summarize(t: Tally, start: std::time::Instant) -> Characterization {
    let bytes: u64 = t.hist.iter().sum();
    let p = |x: u64| {
        if bytes == 0 {
            0.0
        } else {
            100.0 * x as f64 / bytes as f64
        }
    };
    let low: u64 = t.hist[1..=9].iter().sum();
    let pow2: u64 = (0..8).map(|k| t.hist[1 << k]).sum();
    let entropy = if bytes == 0 {
        0.0
    } else {
        t.hist
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let q = c as f64 / bytes as f64;
                -q * q.log2()
            })
            .sum()
    };
    let zero_runs = t.runs.iter().sum();
    Characterization {
        bytes,
        zero_bytes_pct: p(t.hist[0]),
        zero_bytes_in_long_runs_pct: p(t.long_run_bytes),
        long_runs: t.long_runs,
        long_runs_touching_page_boundary_pct: if t.long_runs == 0 {
            0.0
        } else {
            100.0 * t.long_touching as f64 / t.long_runs as f64
        },
        low_values_1_9_pct: p(low),
        powers_of_two_pct: p(pow2),
        entropy_bits_per_byte: entropy,
        zero_runs,
        zero_run_lengths: t
            .runs
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(l, &c)| (l as u32, c))
            .collect(),
        byte_histogram: t.hist.to_vec(),
        seconds: start.elapsed().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally_of(page: &[u8]) -> Tally {
        let mut t = Tally::new();
        let mut h = Box::new([[0u32; 256]; 4]);
        t.page(page, &mut h);
        flush(&mut t, &mut h);
        t
    }

    #[test]
    fn runs_and_boundaries() {
        let mut page = vec![0xffu8; PAGE];
        page[0..40].fill(0); // long, touches start
        page[100..110].fill(0); // short
        page[200..300].fill(0); // long, inside
        page[PAGE - 33..].fill(0); // long (33), touches end
        page[500] = 0; // single
        let t = tally_of(&page);
        assert_eq!(t.runs[40], 1);
        assert_eq!(t.runs[10], 1);
        assert_eq!(t.runs[100], 1);
        assert_eq!(t.runs[33], 1);
        assert_eq!(t.runs[1], 1);
        assert_eq!(t.long_runs, 3);
        assert_eq!(t.long_touching, 2);
        assert_eq!(t.long_run_bytes, 40 + 100 + 33);
        assert_eq!(t.hist[0], 40 + 10 + 100 + 33 + 1);
        assert_eq!(t.hist.iter().sum::<u64>(), PAGE as u64);
    }

    #[test]
    fn zero_page_is_one_run() {
        let t = tally_of(&vec![0u8; PAGE]);
        assert_eq!(t.runs[PAGE], 1);
        assert_eq!(t.long_touching, 1);
    }
}
