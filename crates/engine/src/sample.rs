//! Sampled looks at blocks that yield nothing (a smart scan per block).
//!
//! Idle levels (idle.rs) make each page that a scan left alone cheaper to
//! keep looking at, but every page of a fresh block is still read and hashed
//! at least twice before its level rises (the volatility check needs two
//! looks), and on a program with little to share that is most of the
//! scanner's CPU: a pandas or scikit-learn session allocates millions of
//! fresh pages, nearly none of them zero or duplicate. Zero and duplicate
//! content in real programs comes in runs (a zeroed table, a copied array),
//! so a sample of a block finds it as surely as a full look does.
//!
//! So each block keeps a count of consecutive scans that folded, merged or
//! froze none of its pages. Once `SAMPLE_AFTER` scans in a row found
//! nothing, the block is sampled: only every `SAMPLE_EVERY`-th page is due a
//! look (always the same pages, so the volatility check still sees each of
//! them twice), on top of its idle level. A zeroed or duplicated run of
//! `SAMPLE_EVERY` pages or more always covers a sampled page; the first
//! scan that acts on any page of the block ends the sampling (a page another
//! block's page merged with counts: its neighbours are likely duplicates of
//! that block's too), and from then on the whole block is looked at again.
//! A scan that finds pages turned all-zero since their previous look counts
//! as fruitful too: their neighbours in the run have just been looked at
//! once, and the volatility check folds them only at the next look, which
//! must not be sampled away. What sampling can miss: zero or
//! duplicate pages in runs shorter than `SAMPLE_EVERY` in a block where
//! nothing else is found; tiering's clock passes look at every page anyway.

/// Consecutive fruitless scans of a block before it is sampled.
pub const SAMPLE_AFTER: u8 = 2;
/// A sampled block's pages due a look: one in this many.
pub const SAMPLE_EVERY: usize = 16;

/// What scans found in one block.
#[derive(Clone, Copy, Debug, Default)]
pub struct Yield {
    /// Scans in a row that acted on none of the block's pages (saturating).
    fruitless: u8,
    /// Pages acted on in the scan under way.
    acted: usize,
    /// Pages that turned all-zero since their previous look, in the scan
    /// under way: the next look folds them, so it must not be sampled.
    turned_zero: usize,
}

impl Yield {
    /// Whether the scan looks only at a sample of the block: not once any
    /// of its pages was acted on in the scan under way (a merge partner
    /// included: its neighbours are likely duplicates too).
    pub fn sampling(&self) -> bool {
        self.fruitless >= SAMPLE_AFTER && self.acted == 0
    }

    /// Whether page `k` is due a look at all (before its idle level decides).
    pub fn due(&self, k: usize) -> bool {
        !self.sampling() || k.is_multiple_of(SAMPLE_EVERY)
    }

    /// The scan acted on `n` of the block's pages (folded, merged or froze them).
    pub fn acted(&mut self, n: usize) {
        self.acted += n;
    }

    /// The scan found `n` of the block's pages all-zero where the previous
    /// look saw other content.
    pub fn turned_zero(&mut self, n: usize) {
        self.turned_zero += n;
    }

    /// The scan is done with the block.
    pub fn scan_done(&mut self) {
        self.fruitless = if self.acted > 0 || self.turned_zero > 0 {
            0
        } else {
            self.fruitless.saturating_add(1)
        };
        self.acted = 0;
        self.turned_zero = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_that_yields_nothing_is_sampled_until_a_scan_acts() {
        let mut y = Yield::default();
        for _ in 0..SAMPLE_AFTER {
            assert!(!y.sampling());
            assert!((0..40).all(|k| y.due(k)));
            y.scan_done();
        }
        assert!(y.sampling());
        let due: Vec<usize> = (0..40).filter(|&k| y.due(k)).collect();
        assert_eq!(due, [0, 16, 32]);
        y.acted(1);
        y.scan_done();
        assert!(!y.sampling(), "a scan that acted ends the sampling");
        assert!((0..40).all(|k| y.due(k)));
        for _ in 0..SAMPLE_AFTER {
            y.turned_zero(1);
            y.scan_done();
        }
        assert!(!y.sampling(), "pages turning zero keep the whole block due");
    }
}
