//! The row-conflict timing probe (the DRAMA method) and the solver that turns
//! its conflicting pairs into bank functions.
//!
//! Two addresses in the same bank but different rows take longer to read one
//! after the other than two in different banks (or the same row): the second
//! read must close the first one's row. The probe reads a base address and a
//! candidate address alternately, flushing both from the cache each time,
//! and keeps the median time of many rounds per candidate. If the times
//! split into two groups, the slow group is the set of addresses in the
//! base's bank. Every bank function has the same value on all of them, so
//! the functions are the masks whose parity is zero on every XOR of a slow
//! address with the base: the null space of those differences over GF(2),
//! restricted to the address bits the sample varies.
//!
//! If the times do not split, the probe says so and finds nothing: then the
//! caller falls back to the table (map.rs). Physical addresses come from
//! pagemap and are only readable as root.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::mem::{Huge, Populated};
use crate::pfn::Pagemap;

/// How thorough the probe is.
#[derive(Clone, Copy, Debug)]
pub struct ProbeConfig {
    /// Buffer the candidates are drawn from, MiB.
    pub buffer_mib: usize,
    /// Candidate addresses timed against the base.
    pub candidates: usize,
    /// Timed rounds per candidate (the median is kept).
    pub rounds: usize,
    pub seed: u64,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            buffer_mib: 256,
            candidates: 2000,
            rounds: 60,
            seed: 0x5eed,
        }
    }
}

/// One timed pair: the candidate's physical address and the median cycles.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Sample {
    pub pa: u64,
    pub cycles: u64,
}

/// How much the probe's answer can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Confidence {
    /// Two clear groups, and functions consistent with the slow group's size.
    High,
    /// Two groups, but the functions found do not fit them well.
    Low,
    /// No second group of slow pairs: nothing measured.
    None,
}

/// What the probe measured.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeResult {
    pub base_pa: u64,
    pub samples: Vec<Sample>,
    /// Median cycles of the fast group and of the slow group (if any).
    pub fast_cycles: u64,
    pub slow_cycles: Option<u64>,
    /// Cycles separating the groups (Otsu's threshold over the medians).
    pub threshold: u64,
    /// Share of candidates in the slow group.
    pub slow_share: f64,
    pub bimodal: bool,
    /// Bank functions recovered (empty unless bimodal).
    pub functions: Vec<u64>,
    pub confidence: Confidence,
    /// Why the confidence is what it is.
    pub reason: String,
}

/// Why the probe could not run.
#[derive(Debug)]
pub enum ProbeError {
    NotX86,
    NoMemory,
    PfnsHidden,
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::NotX86 => write!(f, "the timing probe needs x86-64 (clflush, rdtscp)"),
            ProbeError::NoMemory => write!(f, "could not map the probe's buffer"),
            ProbeError::PfnsHidden => {
                write!(
                    f,
                    "pagemap hides physical addresses (needs root / CAP_SYS_ADMIN)"
                )
            }
        }
    }
}

/// Median cycles to read `a` then `b`, both flushed first, over `rounds`.
#[cfg(target_arch = "x86_64")]
fn pair_cycles(a: *const u8, b: *const u8, rounds: usize) -> u64 {
    use core::arch::x86_64::{__rdtscp, _mm_clflush, _mm_mfence};
    let mut times = Vec::with_capacity(rounds);
    let mut aux = 0u32;
    for _ in 0..rounds {
        // SAFETY: a and b point into a live, populated mapping (the probe's
        // buffer); clflush, mfence, rdtscp and volatile reads have no other
        // preconditions.
        let t = unsafe {
            _mm_clflush(a);
            _mm_clflush(b);
            _mm_mfence();
            let t0 = __rdtscp(&mut aux);
            std::ptr::read_volatile(a);
            std::ptr::read_volatile(b);
            let t1 = __rdtscp(&mut aux);
            t1.saturating_sub(t0)
        };
        times.push(t);
    }
    median(&mut times)
}

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Times `cfg.candidates` addresses against a base and solves for functions.
pub fn run(cfg: &ProbeConfig) -> Result<ProbeResult, ProbeError> {
    if !cfg!(target_arch = "x86_64") {
        return Err(ProbeError::NotX86);
    }
    // Huge pages: physical addresses run on in 2 MiB pieces.
    let buf = Populated::new(cfg.buffer_mib << 20, Huge::Asked).ok_or(ProbeError::NoMemory)?;
    let map = Pagemap::open().ok_or(ProbeError::PfnsHidden)?;
    let pa_of = |addr: usize| {
        map.pfn(addr)
            .map(|pfn| pfn << crate::PAGE_SHIFT | (addr as u64 & (crate::PAGE - 1)))
    };
    let base = buf.ptr() as usize;
    let base_pa = pa_of(base).ok_or(ProbeError::PfnsHidden)?;
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut samples = Vec::with_capacity(cfg.candidates);
    let mut addrs = Vec::with_capacity(cfg.candidates);
    while samples.len() < cfg.candidates {
        let offset = (rng.gen_range(0..(buf.len() as u64 / 64).max(1)) * 64) as usize;
        if offset < crate::PAGE as usize {
            continue;
        }
        let addr = base + offset;
        let Some(pa) = pa_of(addr) else { continue };
        let cycles = timed(base, addr, cfg.rounds);
        samples.push(Sample { pa, cycles });
        addrs.push(addr);
    }
    retime_slow(&mut samples, &addrs, base, cfg.rounds);
    Ok(analyse(base_pa, samples))
}

/// Times every slow-looking pair again and keeps the faster of the two: a
/// row conflict is slow every time, an interrupt or a neighbour's burst of
/// traffic is not.
fn retime_slow(samples: &mut [Sample], addrs: &[usize], base: usize, rounds: usize) {
    let mut cycles: Vec<u64> = samples.iter().map(|s| s.cycles).collect();
    cycles.sort_unstable();
    let threshold = otsu(&cycles);
    for (s, &addr) in samples.iter_mut().zip(addrs) {
        if s.cycles > threshold {
            s.cycles = s.cycles.min(timed(base, addr, rounds));
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn timed(a: usize, b: usize, rounds: usize) -> u64 {
    pair_cycles(a as *const u8, b as *const u8, rounds)
}

#[cfg(not(target_arch = "x86_64"))]
fn timed(_: usize, _: usize, _: usize) -> u64 {
    0
}

/// Splits the samples into fast and slow and solves for functions.
pub fn analyse(base_pa: u64, samples: Vec<Sample>) -> ProbeResult {
    let mut cycles: Vec<u64> = samples.iter().map(|s| s.cycles).collect();
    cycles.sort_unstable();
    let threshold = otsu(&cycles);
    let (mut fast, mut slow): (Vec<u64>, Vec<u64>) = cycles.iter().partition(|&&c| c <= threshold);
    let slow_share = slow.len() as f64 / cycles.len().max(1) as f64;
    let fast_cycles = median(&mut fast);
    let slow_cycles = (!slow.is_empty()).then(|| median(&mut slow));
    let spread = mad(&fast, fast_cycles).max(1);
    let bimodal = slow_cycles.is_some_and(|s| {
        (0.01..=0.4).contains(&slow_share)
            && s as f64 > fast_cycles as f64 * 1.15
            && s - fast_cycles > 4 * spread
    });
    let mut result = ProbeResult {
        base_pa,
        samples,
        fast_cycles,
        slow_cycles,
        threshold,
        slow_share,
        bimodal,
        functions: Vec::new(),
        confidence: Confidence::None,
        reason: String::new(),
    };
    if !bimodal {
        let slow = slow_cycles.map_or("none".to_string(), |c| format!("median {c} cycles"));
        result.reason = format!(
            "no separate group of slow pairs: fast median {fast_cycles} cycles, slow {slow} ({:.1}% of pairs), spread {spread}",
            slow_share * 100.0
        );
        return result;
    }
    let conflicts: Vec<u64> = result
        .samples
        .iter()
        .filter(|s| s.cycles > threshold)
        .map(|s| s.pa ^ base_pa)
        .collect();
    let varied = result
        .samples
        .iter()
        .fold(0u64, |acc, s| acc | (s.pa ^ base_pa))
        & !0x3f;
    result.functions = null_space(&conflicts, varied);
    let n = result.functions.len();
    let expected_share = 1.0 / (1u64 << n.min(20)) as f64;
    let fits = (2..=6).contains(&n)
        && slow_share > expected_share / 2.0
        && slow_share < expected_share * 2.0;
    result.confidence = if fits {
        Confidence::High
    } else {
        Confidence::Low
    };
    result.reason = format!(
        "{n} functions over the bits the sample varies; slow pairs {:.1}% (1/{} expected from {n} functions)",
        slow_share * 100.0,
        1u64 << n.min(20)
    );
    result
}

/// Otsu's threshold: the cut maximising the between-group variance.
fn otsu(sorted: &[u64]) -> u64 {
    let n = sorted.len();
    if n < 2 {
        return sorted.first().copied().unwrap_or(0);
    }
    let total: f64 = sorted.iter().map(|&c| c as f64).sum();
    let mut below = 0.0;
    let mut best = (f64::MIN, sorted[n - 1]);
    for i in 0..n - 1 {
        below += sorted[i] as f64;
        if sorted[i] == sorted[i + 1] {
            continue;
        }
        let w0 = (i + 1) as f64;
        let w1 = (n - i - 1) as f64;
        let m0 = below / w0;
        let m1 = (total - below) / w1;
        let between = w0 * w1 * (m0 - m1) * (m0 - m1);
        if between > best.0 {
            best = (between, sorted[i]);
        }
    }
    best.1
}

/// Median absolute deviation from `centre`.
fn mad(v: &[u64], centre: u64) -> u64 {
    let mut d: Vec<u64> = v.iter().map(|&c| c.abs_diff(centre)).collect();
    median(&mut d)
}

/// A basis of the masks `m` over the bits in `varied` with parity(m & d) = 0
/// for every `d` in `diffs` (the orthogonal complement of their span).
pub fn null_space(diffs: &[u64], varied: u64) -> Vec<u64> {
    // Row-reduce the differences (restricted to the varied bits).
    let mut rows: Vec<u64> = Vec::new();
    let mut pivots: Vec<u32> = Vec::new();
    for &d in diffs {
        let mut r = d & varied;
        for (&row, &p) in rows.iter().zip(&pivots) {
            if r >> p & 1 == 1 {
                r ^= row;
            }
        }
        if r == 0 {
            continue;
        }
        let p = 63 - r.leading_zeros();
        for row in rows.iter_mut() {
            if *row >> p & 1 == 1 {
                *row ^= r;
            }
        }
        rows.push(r);
        pivots.push(p);
    }
    // Every free bit gives one basis vector: itself plus the pivots whose row has it.
    (0..64)
        .filter(|&b| varied >> b & 1 == 1 && !pivots.contains(&b))
        .map(|free| {
            rows.iter()
                .zip(&pivots)
                .filter(|(row, _)| *row >> free & 1 == 1)
                .fold(1u64 << free, |m, (_, &p)| m | 1 << p)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::BankMap;

    #[test]
    fn null_space_recovers_known_functions_from_same_bank_addresses() {
        let map = BankMap::known("coffee-lake-ddr4-1rank").unwrap();
        let mut rng = StdRng::seed_from_u64(11);
        let base = 0x1234_5000u64;
        let bank = map.bank_of(base);
        let same: Vec<u64> = std::iter::from_fn(|| Some(rng.gen_range(0..1u64 << 30) & !0x3f))
            .filter(|&pa| map.bank_of(pa) == bank)
            .take(400)
            .map(|pa| pa ^ base)
            .collect();
        let varied = ((1u64 << 30) - 1) & !0x3f;
        let found = null_space(&same, varied);
        assert_eq!(found.len(), 4, "{found:x?}");
        // Every found mask is a combination of the real ones: constant on the set.
        for f in &found {
            assert!(same.iter().all(|d| (d & f).count_ones() % 2 == 0));
        }
        // And every real function is in the span of the found ones.
        for &real in &map.functions {
            assert!(in_span(&found, real), "{real:#x} not in span of {found:x?}");
        }
    }

    fn in_span(basis: &[u64], v: u64) -> bool {
        (0u32..1 << basis.len()).any(|pick| {
            basis
                .iter()
                .enumerate()
                .filter(|(i, _)| pick >> i & 1 == 1)
                .fold(0, |acc, (_, &b)| acc ^ b)
                == v
        })
    }

    #[test]
    fn analyse_sees_two_groups_and_rejects_one() {
        let map = BankMap::known("coffee-lake-ddr4-1rank").unwrap();
        let mut rng = StdRng::seed_from_u64(5);
        let base = 0x4000_0000u64;
        let samples: Vec<Sample> = (0..3000)
            .map(|_| {
                let pa = rng.gen_range(0..1u64 << 30) & !0x3f;
                let slow = map.bank_of(pa) == map.bank_of(base) && pa >> 17 != base >> 17;
                let cycles = if slow { 420 } else { 300 } + rng.gen_range(0..10u64);
                Sample { pa, cycles }
            })
            .collect();
        let r = analyse(base, samples.clone());
        assert!(r.bimodal, "{}", r.reason);
        assert_eq!(r.confidence, Confidence::High, "{}", r.reason);
        assert_eq!(r.functions.len(), 4);
        let flat: Vec<Sample> = samples
            .iter()
            .map(|s| Sample {
                pa: s.pa,
                cycles: 300 + s.cycles % 10,
            })
            .collect();
        let r = analyse(base, flat);
        assert!(!r.bimodal);
        assert_eq!(r.confidence, Confidence::None);
        assert!(r.functions.is_empty());
    }

    #[test]
    fn otsu_splits_two_clusters() {
        let v = [100, 101, 102, 103, 200, 201];
        assert_eq!(otsu(&v), 103);
    }
}
