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
//!
//! A block learns only from its own scans, and a program that keeps making
//! fresh arrays of the same size (R's glm fits allocate a new 140 MB design
//! matrix at every re-weighting, a few seconds apart) has each one read and
//! hashed in full, twice, before it is sampled: on glm that was most of a
//! second of scanner CPU, 6% of the program's, for 1% of its memory saved.
//! So blocks also learn per size class (the exact page count, as in
//! fresh.rs). A block gives its class a verdict: fruitless after its first
//! scan that found nothing (no page acted on, none turned zero), fruitful
//! when a scan first acts on it (a fruitless verdict can be followed by a
//! fruitful one, never the other way). After `CLASS_FRUITLESS` fruitless
//! verdicts in a row, a new block of the class starts sampled, as if two
//! scans had found nothing in it. The first sampled look that acts on it
//! (or finds a page turned zero) looks at it whole again, and its fruitful
//! verdict makes the class's next blocks start whole. Blocks already there
//! keep their own count: two blocks of one size, equal page for page, are
//! both fruitless at their first look (a first look never acts) and must
//! meet whole at their second.
//! What this can miss beyond what per-block sampling misses: in a new
//! block of a sampled class, zero or duplicate runs all shorter than
//! `SAMPLE_EVERY` pages, and (until an aligned sample meets them) the
//! duplicates of pages that are themselves sampled.

use std::collections::HashMap;

/// Consecutive fruitless scans of a block before it is sampled.
pub const SAMPLE_AFTER: u8 = 2;
/// A sampled block's pages due a look: one in this many.
pub const SAMPLE_EVERY: usize = 16;
/// Fruitless verdicts in a row after which a class's blocks are sampled.
pub const CLASS_FRUITLESS: u8 = 2;
/// Most size classes remembered; the table is forgotten when full, which
/// only makes blocks be looked at whole again.
const CLASSES: usize = 1024;

/// What scans found in one block.
#[derive(Clone, Copy, Debug, Default)]
pub struct Yield {
    /// Scans in a row that acted on none of the block's pages (saturating).
    fruitless: u8,
    /// The verdict the block gave its class: None yet, Some(fruitful).
    verdict: Option<bool>,
    /// Pages acted on in the scan under way.
    acted: usize,
    /// Pages that turned all-zero since their previous look, in the scan
    /// under way: the next look folds them, so it must not be sampled.
    turned_zero: usize,
    /// Pages looked at in the scan under way.
    looked: usize,
}

impl Yield {
    /// How a new block starts: sampled when its size class is
    /// (`ClassYields::sampled`), as if two scans had found nothing in it
    /// and it had given its verdict.
    pub fn start(class_sampled: bool) -> Yield {
        Yield {
            fruitless: if class_sampled { SAMPLE_AFTER } else { 0 },
            verdict: class_sampled.then_some(false),
            ..Yield::default()
        }
    }

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

    /// The scan looked at `n` of the block's pages.
    pub fn looked(&mut self, n: usize) {
        self.looked += n;
    }

    /// The scan found `n` of the block's pages all-zero where the previous
    /// look saw other content.
    pub fn turned_zero(&mut self, n: usize) {
        self.turned_zero += n;
    }

    /// The scan is done with the block of `npages`; returns the block's
    /// verdict for its class when this scan gave it one (fruitless:
    /// `Some(false)`, only after a look at half its pages or more: a block
    /// not yet written says nothing of its class).
    pub fn scan_done(&mut self, npages: usize) -> Option<bool> {
        let acted = self.acted > 0;
        let judged_whole = 2 * self.looked >= npages;
        self.looked = 0;
        self.fruitless = if acted || self.turned_zero > 0 {
            0
        } else {
            self.fruitless.saturating_add(1)
        };
        self.acted = 0;
        self.turned_zero = 0;
        let verdict = match self.verdict {
            Some(true) => return None,
            _ if acted => true,
            None if self.fruitless > 0 && judged_whole => false,
            _ => return None,
        };
        self.verdict = Some(verdict);
        Some(verdict)
    }
}

/// What the blocks of each size class yielded: fruitless verdicts in a row
/// since the last fruitful one (0: the last verdict was fruitful; no entry:
/// no verdict yet).
#[derive(Default)]
pub struct ClassYields {
    fruitless: HashMap<usize, u8>,
}

impl ClassYields {
    /// Whether new blocks of `npages` start sampled: the class's last
    /// `CLASS_FRUITLESS` verdicts were fruitless.
    pub fn sampled(&self, npages: usize) -> bool {
        self.fruitless
            .get(&npages)
            .is_some_and(|&n| n >= CLASS_FRUITLESS)
    }

    /// Whether the last verdict a block of `npages` gave was fruitful: a
    /// scan folded, merged or froze pages of it (state.rs takes such sizes
    /// even where the caller's heap could serve them).
    pub fn fruitful(&self, npages: usize) -> bool {
        self.fruitless.get(&npages) == Some(&0)
    }

    /// A block of `npages` gave its verdict (`scan_done`).
    pub fn judged(&mut self, npages: usize, fruitful: bool) {
        if self.fruitless.len() >= CLASSES && !self.fruitless.contains_key(&npages) {
            self.fruitless.clear();
        }
        let n = self.fruitless.entry(npages).or_insert(0);
        *n = if fruitful { 0 } else { n.saturating_add(1) };
    }

    /// Bytes the table holds (engine metadata).
    pub fn bytes(&self) -> usize {
        self.fruitless.capacity() * (std::mem::size_of::<(usize, u8)>() + 1)
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
            y.scan_done(0);
        }
        assert!(y.sampling());
        let due: Vec<usize> = (0..40).filter(|&k| y.due(k)).collect();
        assert_eq!(due, [0, 16, 32]);
        y.acted(1);
        y.scan_done(0);
        assert!(!y.sampling(), "a scan that acted ends the sampling");
        assert!((0..40).all(|k| y.due(k)));
        for _ in 0..SAMPLE_AFTER {
            y.turned_zero(1);
            y.scan_done(0);
        }
        assert!(!y.sampling(), "pages turning zero keep the whole block due");
    }

    /// Scans a new block of `npages` once, acting on a page or not, and
    /// records its verdict.
    fn judge(classes: &mut ClassYields, npages: usize, acts: bool) -> Yield {
        let mut y = Yield::start(classes.sampled(npages));
        y.looked(npages);
        y.acted(acts as usize);
        let verdict = y.scan_done(npages).expect("a first scan gives a verdict");
        assert_eq!(verdict, acts);
        classes.judged(npages, verdict);
        y
    }

    #[test]
    fn a_size_whose_blocks_yield_nothing_starts_new_blocks_sampled() {
        let mut classes = ClassYields::default();
        let mut judged = Vec::new();
        for _ in 0..CLASS_FRUITLESS {
            assert!(!classes.sampled(100));
            judged.push(judge(&mut classes, 100, false));
        }
        assert!(
            classes.sampled(100),
            "after {CLASS_FRUITLESS} fruitless blocks"
        );
        assert!(!classes.sampled(101), "other sizes start whole");
        assert!(
            judged.iter().all(|y| !y.sampling()),
            "blocks already there keep their own count: their second look is whole"
        );
        let new = Yield::start(true);
        assert!(new.sampling(), "a new block is sampled from its first look");

        // A sampled block that yields nothing gives no further verdict ...
        let mut quiet = new;
        quiet.looked(7);
        assert!((0..5).all(|_| quiet.scan_done(100).is_none()));
        assert!(quiet.sampling());
        // ... one whose sample is acted on is whole again, and so is its class.
        let mut y = new;
        y.acted(1);
        assert!(!y.sampling(), "acted on in the scan under way");
        assert_eq!(y.scan_done(100), Some(true));
        assert!(!y.sampling(), "a block found fruitful is whole");
        classes.judged(100, true);
        assert!(!classes.sampled(100));
        assert!(
            y.scan_done(100).is_none(),
            "a fruitful verdict is given once"
        );
    }

    #[test]
    fn a_verdict_needs_a_look_at_half_the_block_and_no_page_turned_zero() {
        let mut y = Yield::default();
        y.looked(7);
        assert_eq!(
            y.scan_done(100),
            None,
            "a look at 7 of 100 pages judges nothing"
        );
        y.looked(10);
        y.turned_zero(3);
        assert_eq!(y.scan_done(10), None, "no verdict while zero pages wait");
        assert!(!y.sampling());
        y.looked(10);
        y.acted(3);
        assert_eq!(y.scan_done(10), Some(true));
    }

    #[test]
    fn one_fruitful_block_between_fruitless_ones_keeps_the_class_whole() {
        let mut classes = ClassYields::default();
        judge(&mut classes, 7, false);
        judge(&mut classes, 7, true);
        judge(&mut classes, 7, false);
        assert!(!classes.sampled(7));
        judge(&mut classes, 7, false);
        assert!(classes.sampled(7));
    }

    #[test]
    fn a_class_is_fruitful_until_its_next_fruitless_verdict() {
        let mut classes = ClassYields::default();
        assert!(!classes.fruitful(7), "no verdict yet");
        judge(&mut classes, 7, true);
        assert!(classes.fruitful(7));
        assert!(!classes.fruitful(8));
        judge(&mut classes, 7, false);
        assert!(!classes.fruitful(7));
    }
}
