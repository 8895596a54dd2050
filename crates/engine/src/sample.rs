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
//!
//! Blocks whose folds and merges do not last rest (kernel KSM meets the
//! same program through its slow full scans; a scan here comes every few
//! hundred milliseconds). R's random forest rewrites the same arrays tree
//! after tree: a scan merges a few hundred of their pages, the program
//! writes them, the next scan releases the frames and merges the rewritten
//! ones again, each round a remap, a copy-on-write fault and a release, and
//! nothing saved for longer than a scan interval. So a block counts the pages
//! its looks acted on and how many acts the program undid (a merged page's
//! frame released by divergence, a folded zero page found written again),
//! both halved at every look so that recent looks weigh most. When half or
//! more of what was acted on recently was undone, the block rests:
//! it is looked at only every 2nd scan, then every 4th, at most every 8th
//! (`MAX_REST`), aligned to the scan number as idle levels are, so that the
//! volatility check (two looks that agree) spans that many scan intervals and
//! only pages that stay put are acted on. When less than a quarter was
//! undone, or nothing was acted on or undone, the spacing halves again.
//! Divergence is still read at every scan (frames of written pages are
//! released on time), and clock passes look at every block.

use std::collections::HashMap;

/// Consecutive fruitless scans of a block before it is sampled.
pub const SAMPLE_AFTER: u8 = 2;
/// A sampled block's pages due a look: one in this many.
pub const SAMPLE_EVERY: usize = 16;
/// Fruitless verdicts in a row after which a class's blocks are sampled.
pub const CLASS_FRUITLESS: u8 = 2;
/// A resting block is looked at every `2^rest`-th scan, `rest` at most this.
pub const MAX_REST: u8 = 3;
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
    /// Pages the block's looks acted on, halved at every look.
    acted_recently: usize,
    /// Pages whose act the program undid, halved at every look.
    undone_recently: usize,
    /// Of those, undone since the block's last look.
    undone: usize,
    /// The block is looked at every `2^rest`-th scan.
    rest: u8,
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

    /// Whether scan number `scan_no` looks at the block at all (a resting
    /// block's scans are spaced).
    pub fn due_in(&self, scan_no: u64) -> bool {
        scan_no.is_multiple_of(1 << self.rest)
    }

    /// The program undid the act on `n` of the block's pages: wrote merged
    /// pages (their frames released) or folded zero pages.
    pub fn undone(&mut self, n: usize) {
        self.undone += n;
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
    /// A scan that did not look at the block (it rests) changes nothing.
    pub fn scan_done(&mut self, npages: usize, looked_at: bool) -> Option<bool> {
        if !looked_at {
            return None;
        }
        self.rest_after_look();
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

    /// Spaces the block's looks further when the program undid half or more
    /// of what recent looks acted on (both counts halved at every look, so
    /// the last few looks weigh most); brings them closer when less than a
    /// quarter was undone, or when there was nothing to act on or undo.
    /// This look's own acts count from the next look on.
    fn rest_after_look(&mut self) {
        let undone = self.undone_recently / 2 + std::mem::take(&mut self.undone);
        let acted = self.acted_recently;
        if acted > 0 && 2 * undone >= acted {
            self.rest = (self.rest + 1).min(MAX_REST);
        } else if 4 * undone < acted || acted == 0 {
            self.rest = self.rest.saturating_sub(1);
        }
        self.undone_recently = undone;
        self.acted_recently = acted / 2 + self.acted;
    }

    /// The block's looks are spaced (every `2^rest`-th scan).
    pub fn rest(&self) -> u8 {
        self.rest
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
    /// scan folded, merged or froze pages of it (the engine takes such sizes
    /// even where the caller's heap could serve them: placement.rs).
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
            y.scan_done(0, true);
        }
        assert!(y.sampling());
        let due: Vec<usize> = (0..40).filter(|&k| y.due(k)).collect();
        assert_eq!(due, [0, 16, 32]);
        y.acted(1);
        y.scan_done(0, true);
        assert!(!y.sampling(), "a scan that acted ends the sampling");
        assert!((0..40).all(|k| y.due(k)));
        for _ in 0..SAMPLE_AFTER {
            y.turned_zero(1);
            y.scan_done(0, true);
        }
        assert!(!y.sampling(), "pages turning zero keep the whole block due");
    }

    /// Runs scans `from..to` over a block whose due looks act on `acts`
    /// pages and find `undo` of the previous look's undone; returns the
    /// scans that looked.
    fn looks(y: &mut Yield, from: u64, to: u64, acts: usize, undo: usize) -> Vec<u64> {
        let mut looked = Vec::new();
        for n in from..to {
            let due = y.due_in(n);
            if due {
                y.undone(undo);
                y.looked(10);
                y.acted(acts);
                looked.push(n);
            }
            y.scan_done(10, due);
        }
        looked
    }

    #[test]
    fn a_block_whose_acts_are_undone_rests_up_to_every_8th_scan_and_comes_back() {
        let mut y = Yield::default();
        assert_eq!(looks(&mut y, 0, 3, 4, 0), [0, 1, 2], "acts that last");
        assert_eq!(y.rest(), 0);
        assert_eq!(
            looks(&mut y, 3, 40, 4, 3),
            [3, 4, 6, 8, 16, 24, 32],
            "three in four undone: every 2nd, 4th, then 8th scan"
        );
        assert_eq!(y.rest(), MAX_REST);
        assert_eq!(
            looks(&mut y, 40, 58, 4, 0),
            [40, 48, 52, 54, 55, 56, 57],
            "acts that last: closer again"
        );
        let mut written_late = Yield {
            rest: 2,
            ..Yield::default()
        };
        assert_eq!(
            looks(&mut written_late, 0, 6, 0, 3),
            [0, 2, 3, 4, 5],
            "undone long after the acts (none recent) is no churn"
        );
        let mut quiet = Yield::default();
        assert_eq!(
            quiet.scan_done(10, false),
            None,
            "a scan that did not look changes nothing"
        );
    }

    /// Scans a new block of `npages` once, acting on a page or not, and
    /// records its verdict.
    fn judge(classes: &mut ClassYields, npages: usize, acts: bool) -> Yield {
        let mut y = Yield::start(classes.sampled(npages));
        y.looked(npages);
        y.acted(acts as usize);
        let verdict = y
            .scan_done(npages, true)
            .expect("a first scan gives a verdict");
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
        assert!((0..5).all(|_| quiet.scan_done(100, true).is_none()));
        assert!(quiet.sampling());
        // ... one whose sample is acted on is whole again, and so is its class.
        let mut y = new;
        y.acted(1);
        assert!(!y.sampling(), "acted on in the scan under way");
        assert_eq!(y.scan_done(100, true), Some(true));
        assert!(!y.sampling(), "a block found fruitful is whole");
        classes.judged(100, true);
        assert!(!classes.sampled(100));
        assert!(
            y.scan_done(100, true).is_none(),
            "a fruitful verdict is given once"
        );
    }

    #[test]
    fn a_verdict_needs_a_look_at_half_the_block_and_no_page_turned_zero() {
        let mut y = Yield::default();
        y.looked(7);
        assert_eq!(
            y.scan_done(100, true),
            None,
            "a look at 7 of 100 pages judges nothing"
        );
        y.looked(10);
        y.turned_zero(3);
        assert_eq!(
            y.scan_done(10, true),
            None,
            "no verdict while zero pages wait"
        );
        assert!(!y.sampling());
        y.looked(10);
        y.acted(3);
        assert_eq!(y.scan_done(10, true), Some(true));
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
