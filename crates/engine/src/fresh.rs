//! Where a fresh block's pages start: plain anonymous memory or memfd frames.
//!
//! Anonymous memory is what the program would have had without the engine:
//! the kernel's anonymous faults, transparent huge pages where the program
//! asks for them (shmem gets none on the machines we measure), the zero page
//! for reads. Frames cost more: every first touch is a shmem fault on a 4 KiB
//! page, so an array that plain memory faults in 2 MiB at a time takes 512
//! times as many faults. What frames buy is the copy: a copy of owned frames
//! only remaps (freezes) the source and maps the destination onto the same
//! frames, while a copy of anonymous memory must first write the pages into
//! frames (about what the plain copy costs) before anything can be shared.
//!
//! So under `Fresh::Adaptive` a block starts anonymous unless blocks of its
//! size have recently been the source of copies: the engine learns it per
//! size class (the exact page count, as interpreters copy whole objects of the
//! same size), from two decaying counters: blocks allocated and blocks copied
//! from. A class whose blocks are copied at least once per `COPIED_EVERY`
//! allocations starts on frames. Classes are forgotten when the table is full,
//! which only makes the engine start anonymous again.
//!
//! Below `Config::plain_below` the engine may also leave an allocation to
//! the caller's own allocator (placement.rs, `take`): glibc's heap hands back
//! freed memory that is still mapped and resident, where any engine block
//! is a fresh mapping faulted in page by page, which recycling freed blocks
//! (recycle.rs) only partly makes up for. R's glm fits allocate 4 MiB and
//! 2 MiB vectors about 1,300 times, one in four copied from: taking them all
//! cost 1.3 million minor faults against plain's 0.78 million. So a class is
//! taken for its first `Config::take_first` allocations (the first block of a size
//! may be the source of many copies) and afterwards only while one block in
//! `TAKEN_EVERY` is copied from; copies out of the caller's memory count for
//! the class of their length, so a class can come back.
//!
//! A block the caller asked zeroed (`Hint::Zeroed`, calloc) follows its own
//! policy, adaptive by default: such blocks are often tables sized for the
//! worst case and read in full while only a few pages are ever written. On
//! anonymous memory those reads map the kernel's zero page, as they would
//! plain; on frames each one allocates a page, and the block can end larger
//! than plain memory would have been.
//!
//! The same table learns whether a virtual copy pays off. A copy shares its
//! pages only until one side writes them; a copy that the program then writes
//! in full cost a copy-on-write fault per page on top of what the copy saved
//! (and, out of anonymous memory, the write-through as well). So for the
//! destination's size class the engine counts pages shared by copies and the
//! pages of those found written (at a scan, or when the block is freed). When
//! at least half were written, copies into that class are made plainly, but
//! for one in `PROBE_EVERY` (of at most `PROBE_PAGES` pages: the rest of
//! that copy is plain), which keeps measuring, so a class whose copies
//! stop being written is shared again. A class with too little evidence of
//! its own follows what copies into all classes did (a program whose copies
//! are written over tends to write over copies of every size), probing one
//! copy in `PRIOR_PROBE_EVERY`; and a class whose copies are written over is
//! not moved to frames by them: only copies that pay count as copied from.
//!
//! A copy the program frees young does not pay either, when its size is
//! below `Config::plain_below` (the sizes glibc serves from its heap): it
//! shared pages for a moment, but it cost the mappings, the faults of first
//! touch on its view, and its block, holding shared frames, cannot be
//! recycled, so the program's next allocation of that size faults in fresh
//! memory where glibc would have reused its heap. So the pages still
//! unwritten when such a block is freed less than `Config::copy_young`
//! after the copy count against the class as written pages do, and a class
//! whose copies mostly die young gets plain copies (into memory that the
//! caller's allocator, or the recycler, reuses), with the same probes, so a
//! class whose copies come to live long is shared again while its blocks
//! are the engine's. Its blocks seldom stay so: plain copies do not count
//! the class as copied from, so `worth_taking` leaves it to the caller's
//! allocator, where copies are plain memcpys that probe nothing. Above
//! `plain_below` the rule does not judge: glibc maps such blocks fresh, so
//! a plain copy faults in every page too and a virtual copy of any lifetime
//! costs no more. Copies freed young do not move the prior over all
//! classes, as their waste depends on the size. R's naiveBayes fit copies
//! 4 and 8 MiB columns about 230 times and frees them 0.2 to 1.6 s later
//! (on a machine loaded four times over, its wall time three times its CPU),
//! nearly unwritten: sharing them cost 1.81 times plain's minor faults and
//! 7% more peak footprint. With the rule (a 1 s window, which holds 87% of
//! those pages even on the loaded machine) the classes are judged after one
//! copy, their blocks go back to glibc, and the fit takes 1.04 times plain's
//! faults at 0.99 of its peak; what it gives back is the memory those
//! copies saved while they lived (average footprint 0.98 of plain against
//! 0.93 in one measurement, 0.95 against 0.96 in another).
//! A 40 MiB vector passed by value and freed 70 to 550 ms later
//! (passbyvalue_lm) stays virtual, as it is above `plain_below`.

use std::collections::HashMap;
use std::time::Duration;

/// The memory a fresh block starts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fresh {
    /// Memfd frames, always: every copy can be virtual at once.
    Frames,
    /// Plain anonymous memory, always: fresh memory costs what it costs plain.
    Anon,
    /// Anonymous memory unless blocks of this size are often copied.
    Adaptive,
}

impl Fresh {
    /// `frames`, `anon` or `adaptive`.
    pub fn parse(s: &str) -> Option<Fresh> {
        match s.trim() {
            "frames" => Some(Fresh::Frames),
            "anon" => Some(Fresh::Anon),
            "adaptive" => Some(Fresh::Adaptive),
            _ => None,
        }
    }
}

/// A class starts on frames when at least one block in this many was copied from.
const COPIED_EVERY: u32 = 4;
/// A class is taken from the program's own allocator (`worth_taking`) when
/// at least one block in this many was copied from, once
/// `Config::take_first` of its allocations were seen.
const TAKEN_EVERY: u32 = 2;
/// Both counters of a class are halved when its allocations reach this, so
/// the class follows what the program does now.
const DECAY_AT: u32 = 64;
/// Most size classes remembered.
const MAX_CLASSES: usize = 4096;
/// Pages shared by copies into a class before its copies are judged.
const JUDGE_AFTER: u32 = 64;
/// Shared and written page counts are halved when the shared ones reach this.
const DECAY_PAGES_AT: u32 = 1 << 16;
/// A class whose copies are made plainly still gets one virtual copy in this many...
const PROBE_EVERY: u32 = 16;
/// ... of at most this many pages (the rest of that copy is plain): enough
/// to judge by, where a whole probe of a 38 MB array the program then
/// writes in full costs 9,400 copy-on-write faults.
pub const PROBE_PAGES: usize = 512;
/// ... or in this many while it follows all classes, having no evidence of its own.
const PRIOR_PROBE_EVERY: u32 = 4;

#[derive(Clone, Copy, Default)]
struct Class {
    allocs: u32,
    copied: u32,
    /// Pages shared by copies into blocks of this class, and of those, the
    /// pages found written and the pages freed young.
    copies: Outcome,
    /// Copies into this class decided plainly since the last probe.
    plain_streak: u32,
}

/// Pages shared by copies and, of those, found written or freed young:
/// per class, and over all classes together (written only: see `Placement::all`).
#[derive(Clone, Copy, Default)]
struct Outcome {
    shared: u32,
    written: u32,
    young: u32,
}

impl Outcome {
    fn add_shared(&mut self, pages: usize) {
        self.shared = self.shared.saturating_add(pages as u32);
        if self.shared >= DECAY_PAGES_AT {
            self.shared /= 2;
            self.written /= 2;
            self.young /= 2;
        }
    }

    fn add_written(&mut self, pages: usize) {
        self.written = self
            .written
            .saturating_add(pages as u32)
            .min(self.shared.saturating_sub(self.young));
    }

    fn add_young(&mut self, pages: usize) {
        self.young = self
            .young
            .saturating_add(pages as u32)
            .min(self.shared.saturating_sub(self.written));
    }

    /// Enough evidence to judge.
    fn judged(&self) -> bool {
        self.shared >= JUDGE_AFTER
    }

    /// At least half of what copies shared was written over or freed young.
    fn mostly_wasted(&self) -> bool {
        self.judged() && (self.written + self.young) * 2 >= self.shared
    }
}

/// How a copy is made (`Placement::decide_copy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyDecision {
    /// Every whole page it can share.
    Share,
    /// At most `PROBE_PAGES` shared, to keep measuring; the rest plainly.
    Probe,
    /// Plainly.
    Plain,
}

impl CopyDecision {
    /// Whether the copy shares pages at all.
    pub fn shares(self) -> bool {
        self != CopyDecision::Plain
    }
}

/// When a copy's unwritten pages count as freed young (`Placement::freed_after_copy`).
#[derive(Clone, Copy, Debug)]
pub struct Lifetime {
    /// A copy freed sooner than this after it shared its pages is young
    /// (`Duration::ZERO`: none is).
    pub young: Duration,
    /// Only blocks of fewer pages than this are judged by their lifetime:
    /// the sizes the caller's own allocator serves from memory it reuses.
    pub below_pages: usize,
}

/// What the engine has learnt about copies, per size class (pages). The
/// placement decisions that read and count in it are placement.rs's.
#[derive(Default)]
pub struct Placement {
    classes: HashMap<usize, Class>,
    /// Over all classes: the prior of a class with too little evidence of
    /// its own, so that a program whose copies are written over pays for
    /// one judged copy, not for one in every size it copies. Copies freed
    /// young are not counted here: whether that wastes a copy depends on
    /// the size (`Lifetime::below_pages`).
    all: Outcome,
}

impl Placement {
    /// Whether a fresh block of `npages` starts on frames; counts the allocation.
    pub fn on_frames(&mut self, policy: Fresh, npages: usize) -> bool {
        let on_frames = self.would_be_on_frames(policy, npages);
        if self.classes.len() >= MAX_CLASSES && !self.classes.contains_key(&npages) {
            self.classes.clear();
        }
        let c = self.classes.entry(npages).or_default();
        c.allocs += 1;
        if c.allocs >= DECAY_AT {
            c.allocs /= 2;
            c.copied /= 2;
        }
        on_frames
    }

    /// Whether a fresh block of `npages` would start on frames now, without
    /// counting an allocation (a recycled block of the same kind may serve it).
    pub fn would_be_on_frames(&self, policy: Fresh, npages: usize) -> bool {
        match policy {
            Fresh::Frames => true,
            Fresh::Anon => false,
            Fresh::Adaptive => self
                .classes
                .get(&npages)
                .is_some_and(|c| c.copied > 0 && c.copied * COPIED_EVERY >= c.allocs),
        }
    }

    /// Whether the engine should take a block of `npages` from the program's
    /// own allocator (placement.rs, `take`): there a block costs a fault per
    /// page that the allocator's reused heap would not, and only blocks that
    /// share pay it back. A class is taken until `take_first` allocations
    /// of it were seen (the first block of a size may be the source of many
    /// copies), and afterwards while one block in `TAKEN_EVERY` is copied
    /// from, which means about every block of the class is a copy's source
    /// or destination.
    pub fn worth_taking(&self, npages: usize, take_first: u32) -> bool {
        self.classes
            .get(&npages)
            .is_none_or(|c| c.allocs < take_first)
            || self.copied_often(npages)
    }

    /// Whether one block of `npages` in `TAKEN_EVERY` is copied from.
    pub fn copied_often(&self, npages: usize) -> bool {
        self.classes
            .get(&npages)
            .is_some_and(|c| c.copied > 0 && c.copied * TAKEN_EVERY >= c.allocs)
    }

    /// A block of `npages` was the source of a copy.
    pub fn copied_from(&mut self, npages: usize) {
        if let Some(c) = self.classes.get_mut(&npages) {
            c.copied = (c.copied + 1).min(c.allocs.max(1));
        }
    }

    /// A copy out of a block of `npages` that counted it as copied from
    /// shared pages and died young: the count is taken back,
    /// so that one short-lived copy does not put the class's next blocks on
    /// frames, where every first touch is a 4 KiB fault (numpy's arrays of
    /// 48 MB, whose huge pages fault 2 MiB at a time on anonymous memory,
    /// would take 25 times the faults each for the next three allocations
    /// after one slice of one is copied and freed at once).
    pub fn uncopied(&mut self, npages: usize) {
        if let Some(c) = self.classes.get_mut(&npages) {
            c.copied = c.copied.saturating_sub(1);
        }
    }

    /// How a copy into a block of `npages` is made: shared, unless copies
    /// into the class have mostly been written over or freed young (see the
    /// module comment); then plainly, but for a probe now and then, which
    /// shares at most `PROBE_PAGES` of the copy.
    pub fn decide_copy(&mut self, npages: usize) -> CopyDecision {
        if !self.copies_wasted(npages) {
            return CopyDecision::Share;
        }
        let Some(c) = self.classes.get_mut(&npages) else {
            return CopyDecision::Plain;
        };
        let every = if c.copies.judged() {
            PROBE_EVERY
        } else {
            PRIOR_PROBE_EVERY
        };
        c.plain_streak += 1;
        if c.plain_streak >= every {
            c.plain_streak = 0;
            return CopyDecision::Probe;
        }
        CopyDecision::Plain
    }

    /// Whether copies into blocks of `npages` have mostly been written over
    /// or freed young (what `decide_copy` judges, without counting a decision).
    /// A class with too little evidence of its own follows all classes.
    pub fn copies_wasted(&self, npages: usize) -> bool {
        match self.classes.get(&npages).map(|c| c.copies) {
            Some(own) if own.judged() => own.mostly_wasted(),
            _ => self.all.mostly_wasted(),
        }
    }

    /// A copy into a block of `npages` shared `pages` pages.
    pub fn shared_by_copy(&mut self, npages: usize, pages: usize) {
        self.all.add_shared(pages);
        if let Some(c) = self.classes.get_mut(&npages) {
            c.copies.add_shared(pages);
        }
    }

    /// `pages` pages a copy shared into a block of `npages` were found written.
    pub fn written_after_copy(&mut self, npages: usize, pages: usize) {
        self.all.add_written(pages);
        if let Some(c) = self.classes.get_mut(&npages) {
            c.copies.add_written(pages);
        }
    }

    /// A block of `npages` was freed `age` after a copy last shared pages
    /// into it, `unwritten` of which were never written: if the block is of
    /// a size the rule judges and the copy died young, those pages count
    /// against the class as written ones do. Returns whether they counted.
    pub fn freed_after_copy(
        &mut self,
        npages: usize,
        unwritten: usize,
        age: Duration,
        rule: Lifetime,
    ) -> bool {
        if unwritten == 0 || npages >= rule.below_pages || age >= rule.young {
            return false;
        }
        let Some(c) = self.classes.get_mut(&npages) else {
            return false;
        };
        c.copies.add_young(unwritten);
        true
    }

    pub fn bytes(&self) -> usize {
        self.classes.capacity() * (std::mem::size_of::<(usize, Class)>() + 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_policies_ignore_history() {
        let mut p = Placement::default();
        assert!(p.on_frames(Fresh::Frames, 10));
        assert!(!p.on_frames(Fresh::Anon, 10));
    }

    #[test]
    fn a_class_copied_from_moves_to_frames_and_back() {
        let mut p = Placement::default();
        assert!(!p.on_frames(Fresh::Adaptive, 100), "unknown: anonymous");
        p.copied_from(100);
        assert!(p.on_frames(Fresh::Adaptive, 100), "copied once in one");
        // Another size is unaffected.
        assert!(!p.on_frames(Fresh::Adaptive, 101));
        // Allocations of the class that are never copied again: back to anonymous.
        let mut last = true;
        for _ in 0..200 {
            last = p.on_frames(Fresh::Adaptive, 100);
        }
        assert!(!last);
    }

    #[test]
    fn copies_that_get_written_are_made_plainly_with_probes() {
        let mut p = Placement::default();
        p.on_frames(Fresh::Adaptive, 10);
        assert!(p.decide_copy(10).shares(), "nothing learnt yet");
        p.shared_by_copy(10, 100);
        p.written_after_copy(10, 40);
        assert!(p.decide_copy(10).shares(), "less than half written");
        p.written_after_copy(10, 20);
        let decisions: Vec<bool> = (0..2 * PROBE_EVERY)
            .map(|_| p.decide_copy(10).shares())
            .collect();
        let virtual_copies = decisions.iter().filter(|&&v| v).count();
        assert_eq!(
            virtual_copies, 2,
            "one probe per {PROBE_EVERY}: {decisions:?}"
        );
        // Probes that stay unwritten bring the class back.
        p.shared_by_copy(10, 200);
        assert!(p.decide_copy(10).shares());
    }

    #[test]
    fn a_class_is_worth_taking_until_known_then_while_copied_from() {
        let mut p = Placement::default();
        assert!(p.worth_taking(300, 4), "unknown");
        for _ in 0..4 {
            assert!(p.worth_taking(300, 4), "not yet known");
            p.on_frames(Fresh::Adaptive, 300);
        }
        assert!(!p.worth_taking(300, 4), "known, never copied from");
        p.copied_from(300);
        assert!(!p.worth_taking(300, 4), "one copy in four blocks");
        p.copied_from(300);
        assert!(p.worth_taking(300, 4), "one copy in two blocks");
    }

    #[test]
    fn a_class_without_evidence_follows_all_classes() {
        let mut p = Placement::default();
        p.on_frames(Fresh::Adaptive, 10);
        p.on_frames(Fresh::Adaptive, 20);
        p.shared_by_copy(10, 100);
        p.written_after_copy(10, 90);
        assert!(p.copies_wasted(10));
        assert!(p.copies_wasted(20), "no evidence of its own: the prior");
        let virtual_copies = (0..2 * PRIOR_PROBE_EVERY)
            .filter(|_| p.decide_copy(20).shares())
            .count();
        assert_eq!(virtual_copies, 2, "a probe in {PRIOR_PROBE_EVERY}");
        p.shared_by_copy(20, 100);
        assert!(!p.copies_wasted(20), "judged on its own");
        assert!(p.decide_copy(20).shares());
    }

    const RULE: Lifetime = Lifetime {
        young: Duration::from_millis(1000),
        below_pages: 1000,
    };

    #[test]
    fn copies_freed_young_are_made_plainly_with_probes() {
        let mut p = Placement::default();
        p.on_frames(Fresh::Adaptive, 10);
        p.shared_by_copy(10, 100);
        let young = Duration::from_millis(50);
        assert!(p.freed_after_copy(10, 40, young, RULE));
        assert!(p.decide_copy(10).shares(), "less than half freed young");
        // Written and young pages add up.
        p.written_after_copy(10, 9);
        assert!(p.decide_copy(10).shares(), "half less one");
        assert!(p.freed_after_copy(10, 1, young, RULE));
        assert!(p.copies_wasted(10));
        let virtual_copies = (0..2 * PROBE_EVERY)
            .filter(|_| p.decide_copy(10).shares())
            .count();
        assert_eq!(virtual_copies, 2, "one probe per {PROBE_EVERY}");
        // Probes that live long bring the class back.
        p.shared_by_copy(10, 200);
        assert!(!p.freed_after_copy(10, 200, Duration::from_secs(2), RULE));
        assert!(p.decide_copy(10).shares());
    }

    #[test]
    fn copies_that_live_long_keep_a_class_virtual() {
        let mut p = Placement::default();
        p.on_frames(Fresh::Adaptive, 10);
        for _ in 0..10 {
            p.shared_by_copy(10, 100);
            assert!(!p.freed_after_copy(10, 100, RULE.young, RULE));
        }
        assert!(!p.copies_wasted(10));
        assert!((0..2 * PROBE_EVERY).all(|_| p.decide_copy(10).shares()));
    }

    #[test]
    fn lifetime_is_judged_only_below_the_size_and_when_asked() {
        let mut p = Placement::default();
        let young = Duration::from_millis(1);
        for npages in [RULE.below_pages, 10] {
            p.on_frames(Fresh::Adaptive, npages);
            p.shared_by_copy(npages, 100);
        }
        assert!(
            !p.freed_after_copy(RULE.below_pages, 100, young, RULE),
            "the caller's allocator would not reuse memory for this size"
        );
        let off = Lifetime {
            young: Duration::ZERO,
            ..RULE
        };
        assert!(!p.freed_after_copy(10, 100, young, off), "judging off");
        assert!(!p.freed_after_copy(10, 0, young, RULE), "nothing unwritten");
        assert!(!p.copies_wasted(10));
        assert!(!p.copies_wasted(RULE.below_pages));
    }

    #[test]
    fn copies_freed_young_do_not_move_the_prior() {
        let mut p = Placement::default();
        p.on_frames(Fresh::Adaptive, 10);
        p.on_frames(Fresh::Adaptive, 5000);
        p.shared_by_copy(10, 100);
        assert!(p.freed_after_copy(10, 100, Duration::ZERO, RULE));
        assert!(p.copies_wasted(10));
        assert!(
            !p.copies_wasted(5000),
            "a class without evidence of its own: the prior counts written pages only"
        );
    }

    #[test]
    fn copies_of_unknown_classes_are_not_counted() {
        let mut p = Placement::default();
        p.copied_from(7);
        assert!(!p.on_frames(Fresh::Adaptive, 7));
    }
}
