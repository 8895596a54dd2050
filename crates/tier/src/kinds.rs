//! Page kinds for tests and measurements: Difference Engine's generator
//! types (zero, random, identical, 95%-similar) and the write DE's
//! benchmark makes afterwards (a constant byte at 16 fixed offsets), plus
//! kinds real programs are full of: text, doubles of a smooth function,
//! integer-valued doubles (R's and numpy's numeric vectors of counts and
//! factors), and a "heap" page of small records with pointers and small
//! integers. Every page is a deterministic function of (kind, seed).
//!
//! "95% similar" follows DE's description: the page is its reference with
//! 5% of the bytes (205 of 4096), at random offsets, replaced by random
//! bytes. For the real kinds the similar page is a plausible later version
//! of the reference: a few words of the text rewritten (shifting the rest
//! of the line), 5% of the doubles updated.

use crate::PAGE;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Zero,
    Random,
    /// A copy of a random page (for a patch: against itself).
    Identical,
    /// A random page with 5% of its bytes replaced at random offsets.
    Similar95,
    /// A random page with a constant byte written at 16 fixed offsets.
    Write16,
    Text,
    /// sin() of a ramp, as f64.
    Doubles,
    /// Small integers stored as f64.
    IntDoubles,
    /// 32-byte records: a pointer, a length, a small tag, a counter.
    Heap,
    /// Mostly zero: 1 word in 16 holds a small value (a sparse vector,
    /// a freshly grown buffer).
    Sparse,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Zero,
        Kind::Random,
        Kind::Identical,
        Kind::Similar95,
        Kind::Write16,
        Kind::Text,
        Kind::Doubles,
        Kind::IntDoubles,
        Kind::Heap,
        Kind::Sparse,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Zero => "zero",
            Kind::Random => "random",
            Kind::Identical => "identical",
            Kind::Similar95 => "95%-similar",
            Kind::Write16 => "16-byte-write",
            Kind::Text => "text",
            Kind::Doubles => "doubles",
            Kind::IntDoubles => "int-doubles",
            Kind::Heap => "heap",
            Kind::Sparse => "sparse",
        }
    }
}

/// A small deterministic generator (xorshift64*).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "memory", "page", "is", "that", "for", "value", "it", "with",
    "as", "was", "on", "function", "data", "frame", "be", "at", "by", "this", "from", "model",
    "vector", "result", "are", "or", "list", "which", "an", "not", "have", "matrix", "all",
    "print", "copy", "return", "if", "else", "while", "mean", "sum",
];

fn text(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(PAGE + 16);
    let mut col = 0;
    while out.len() < PAGE {
        let w = WORDS[rng.below(WORDS.len() as u64) as usize];
        out.extend_from_slice(w.as_bytes());
        col += w.len() + 1;
        if col > 72 {
            out.push(b'\n');
            col = 0;
        } else if rng.below(12) == 0 {
            out.extend_from_slice(b", ");
        } else {
            out.push(b' ');
        }
    }
    out.truncate(PAGE);
    out
}

fn words_f64(f: impl Fn(usize) -> f64) -> Vec<u8> {
    (0..PAGE / 8).flat_map(|i| f(i).to_le_bytes()).collect()
}

/// The page of `kind` for `seed`.
pub fn page(kind: Kind, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ 0x5eed);
    match kind {
        Kind::Zero => vec![0; PAGE],
        Kind::Random | Kind::Identical => {
            let mut p = vec![0; PAGE];
            rng.fill(&mut p);
            p
        }
        Kind::Similar95 | Kind::Write16 => pair(kind, seed).1,
        Kind::Text => text(&mut rng),
        Kind::Doubles => {
            let phase = (seed % 1000) as f64;
            words_f64(|i| (phase + i as f64 * 0.01).sin())
        }
        Kind::IntDoubles => {
            let base = rng.below(100) as f64;
            let vals: Vec<f64> = (0..PAGE / 8).map(|_| base + rng.below(50) as f64).collect();
            words_f64(|i| vals[i])
        }
        Kind::Sparse => {
            let mut p = vec![0u8; PAGE];
            for w in p.chunks_exact_mut(8) {
                if rng.below(16) == 0 {
                    w.copy_from_slice(&(1 + rng.below(1000)).to_le_bytes());
                }
            }
            p
        }
        Kind::Heap => {
            let mut p = vec![0u8; PAGE];
            let base = 0x5600_0000_0000u64 + (rng.below(1 << 20) << 12);
            for (i, rec) in p.chunks_exact_mut(32).enumerate() {
                let ptr = base + rng.below(1 << 16) * 16;
                rec[0..8].copy_from_slice(&ptr.to_le_bytes());
                rec[8..16].copy_from_slice(&(rng.below(200)).to_le_bytes());
                rec[16..20].copy_from_slice(&(rng.below(8) as u32).to_le_bytes());
                rec[24..32].copy_from_slice(&(i as u64).to_le_bytes());
            }
            p
        }
    }
}

/// DE's 95%-similar page for `seed`: `reference` with 5% of its bytes
/// (205 of a page), at random offsets, replaced by random bytes.
pub fn similar95(reference: &[u8], seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ 0xd1ff);
    let mut p = reference.to_vec();
    for _ in 0..PAGE * 5 / 100 {
        let o = rng.below(p.len() as u64) as usize;
        p[o] = rng.next_u64() as u8;
    }
    p
}

/// The byte DE's micro-benchmark writes (see [`write16`]).
pub const WRITE16_BYTE: u8 = 0xab;

/// DE's micro-benchmark write: the constant [`WRITE16_BYTE`] at 16 fixed
/// offsets of the page, one in each 256-byte sixteenth.
pub fn write16(page: &mut [u8]) {
    for i in 0..16 {
        page[i * (PAGE / 16) + 7] = WRITE16_BYTE;
    }
}

/// A (reference, page) pair for patching: the page is a similar version
/// of the reference (see the module documentation).
pub fn pair(kind: Kind, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Rng::new(seed ^ 0xd1ff);
    match kind {
        Kind::Zero | Kind::Identical => {
            let r = page(
                if kind == Kind::Zero {
                    Kind::Zero
                } else {
                    Kind::Random
                },
                seed,
            );
            (r.clone(), r)
        }
        Kind::Random => (page(Kind::Random, seed), page(Kind::Random, seed ^ 0xffff)),
        Kind::Similar95 => {
            let r = page(Kind::Random, seed);
            let p = similar95(&r, seed);
            (r, p)
        }
        Kind::Write16 => {
            let r = page(Kind::Random, seed);
            let mut p = r.clone();
            write16(&mut p);
            (r, p)
        }
        Kind::Text => {
            let r = page(Kind::Text, seed);
            // Rewrite a few words: replace 3 spans with words of other
            // lengths, shifting what follows within the page.
            let mut p = r.clone();
            for _ in 0..3 {
                let at = rng.below(PAGE as u64 - 64) as usize;
                let w = WORDS[rng.below(WORDS.len() as u64) as usize].as_bytes();
                let cut = rng.below(8) as usize + 1;
                let mut q = p[..at].to_vec();
                q.extend_from_slice(w);
                q.extend_from_slice(&p[at + cut..]);
                q.resize(PAGE, b' ');
                p = q;
            }
            (r, p)
        }
        Kind::Doubles | Kind::IntDoubles | Kind::Heap | Kind::Sparse => {
            let r = page(kind, seed);
            let mut p = r.clone();
            for _ in 0..PAGE / 8 * 5 / 100 {
                let w = rng.below(PAGE as u64 / 8) as usize * 8;
                let old: [u8; 8] = p[w..w + 8].try_into().unwrap();
                let new = if matches!(kind, Kind::Heap | Kind::Sparse) {
                    u64::from_le_bytes(old).wrapping_add(1).to_le_bytes()
                } else {
                    (f64::from_le_bytes(old) + 1.0).to_le_bytes()
                };
                p[w..w + 8].copy_from_slice(&new);
            }
            (r, p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn similar_and_written_pages_are_what_de_describes() {
        let (reference, similar) = pair(Kind::Similar95, 3);
        assert_eq!(similar, similar95(&reference, 3));
        let differ = reference
            .iter()
            .zip(&similar)
            .filter(|(a, b)| a != b)
            .count();
        assert!(
            (150..=PAGE * 5 / 100).contains(&differ),
            "{differ} bytes differ"
        );
        assert_ne!(
            similar95(&reference, 4),
            similar,
            "the seed chooses the bytes"
        );
        let mut written = reference.clone();
        write16(&mut written);
        let changed: Vec<usize> = (0..PAGE)
            .filter(|&i| written[i] != reference[i] || (i % (PAGE / 16) == 7))
            .collect();
        assert_eq!(
            changed,
            (0..16).map(|i| i * (PAGE / 16) + 7).collect::<Vec<_>>()
        );
        assert!(changed.iter().all(|&i| written[i] == WRITE16_BYTE));
        assert_eq!(pair(Kind::Write16, 3).1, written);
    }
}
