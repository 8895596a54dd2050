//! The count of the process's mappings (VMAs) and the engine's budget of them.
//!
//! The kernel lets a process have at most `vm.max_map_count` mappings
//! (65,530 by default); beyond it mmap, mprotect and munmap of a middle part
//! fail, the program's own malloc included. A mapping covers consecutive
//! offsets of one file, so each remap of a run of pages onto other frames may
//! split a block's mapping: a run remapped inside it becomes a mapping of its
//! own and cuts the one around it in two, two mappings more. The engine
//! therefore counts the mappings its blocks use (each block reckons its own
//! from its pages, space.rs) and remaps only while the count stays under a
//! limit: its budget (`Config::vma_budget_for`), and what `vm.max_map_count`
//! leaves after the program's own mappings and a reserve always kept free
//! for the program (`Config::vma_reserve`). A remap that does not fit is not
//! made; its caller falls back (a plain copy, a skipped merge) and counts it
//! in `fallbacks.vma_budget`.
//!
//! The program's own mappings are the lines of `/proc/self/maps` less the
//! engine's, read through a descriptor kept open so that no scan opens a
//! file. The engine's count is reckoned, not read, and can drift from the
//! kernel's, so the file is read again in each scan that may remap (every
//! scan once the process holds a quarter of the limit, else when the last
//! read is `RECOUNT_AGE` old: the read costs time in proportion to the
//! mappings; a scan marks it due and the read waits for the scan's first
//! question that its own budget would answer yes, so an idle program at its
//! budget reads nothing), whenever `vm.max_map_count` (not the engine's own
//! budget) would say no after remaps, and otherwise at intervals that grow
//! with the count, once the remaps since the last read could have brought
//! the process within two reserves of the limit: one reserve for what the
//! program may map of its own until the next read, one for what the
//! engine's count may lag the kernel's. (A bound at a quarter of the limit
//! would make an interpreter holding 13,000 mappings for its copies read
//! the 1.3 MB file every 1,600 remaps: 12% of its CPU.) A few spare
//! mappings are kept too, to be given up when the process has none left, so
//! that the engine can make the temporary mappings it needs to give its own
//! back (advice.rs, `give_back_mappings`).

use std::num::NonZeroUsize;

use crate::config::Config;
use crate::sys;

/// How close to `vm.max_map_count` a failed call must find the process for
/// the engine to count it a shortage of mappings (a call may need a few).
const MAPPINGS_SLACK: usize = 16;

/// Remaps between two reads of `/proc/self/maps` at the least.
const RECOUNT_REMAPS: usize = 1024;

/// Most mappings one remap can add beyond what the engine reckons.
const DRIFT_PER_REMAP: usize = 2;

/// Oldest count a scan starts from while the process holds less than a
/// quarter of `vm.max_map_count`.
const RECOUNT_AGE: std::time::Duration = std::time::Duration::from_secs(2);

pub(crate) struct Mappings {
    /// Mappings used by all blocks.
    used: usize,
    /// Mappings the rest of the process used at the last look.
    others: usize,
    /// The kernel's limit, `vm.max_map_count`.
    max_map_count: usize,
    /// Most mappings the engine's blocks may use (`Config::vma_budget_for`).
    budget: usize,
    /// Mappings always left to the program (`Config::vma_reserve`).
    reserve: usize,
    /// Remaps since `others` was read; our count can drift from the kernel's.
    remaps_since_count: usize,
    /// The first of the spare mappings (`sys::map_spares`), while kept.
    spares: Option<NonZeroUsize>,
    /// Counts the process's mappings; kept open so no scan opens a file.
    proc_maps: Option<sys::ProcMaps>,
    /// When `others` was read.
    counted_at: std::time::Instant,
    /// A read is due before the next remap (`mark_due_for_scan`).
    stale: bool,
}

impl Mappings {
    /// The limit and the process's mappings as they are now, with no
    /// spares yet (`make_spares`).
    pub(crate) fn new(cfg: &Config) -> Mappings {
        let max_map_count = cfg.inject.max_map_count.unwrap_or_else(sys::max_map_count);
        let proc_maps = sys::ProcMaps::open().ok();
        let others = proc_maps.as_ref().map_or(0, sys::ProcMaps::count);
        Mappings {
            used: 0,
            others,
            max_map_count,
            budget: cfg.vma_budget_for(max_map_count),
            reserve: cfg.vma_reserve,
            remaps_since_count: 0,
            spares: None,
            proc_maps,
            counted_at: std::time::Instant::now(),
            stale: false,
        }
    }

    /// Mappings used by all blocks.
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// `vmas` more mappings are the engine's (a block mapped or laid out).
    pub(crate) fn add(&mut self, vmas: usize) {
        self.used += vmas;
    }

    /// `vmas` of the engine's mappings are gone (a block unmapped or moved).
    pub(crate) fn remove(&mut self, vmas: usize) {
        self.used -= vmas;
    }

    /// Mappings of a block went from `before` to `after`.
    pub(crate) fn changed(&mut self, before: usize, after: usize) {
        self.used = self.used + after - before;
    }

    /// A remap took mappings of a block from `before` to `after`.
    pub(crate) fn remapped(&mut self, before: usize, after: usize) {
        self.changed(before, after);
        self.remaps_since_count += 1;
    }

    /// Whether `cost` more mappings fit under the limit, with the reserve
    /// left free for the program. Looks at the real mapping count once more
    /// before saying no.
    pub(crate) fn room(&mut self, cost: usize) -> bool {
        // Reading /proc/self/maps costs milliseconds at tens of thousands of
        // mappings, and a fresh count cannot lift the engine's own budget.
        if self.used + cost > self.budget {
            return false;
        }
        if self.stale {
            self.recount();
        }
        if self.fits(cost) {
            return true;
        }
        // Read again only when our own count has changed since the last
        // read: the program's mappings are what stands in the way.
        if self.remaps_since_count == 0 {
            return false;
        }
        self.recount();
        self.fits(cost)
    }

    fn fits(&self, cost: usize) -> bool {
        let left = self
            .max_map_count
            .saturating_sub(self.reserve + self.others);
        self.used + cost <= self.budget.min(left)
    }

    /// Reads the program's own mappings from `/proc/self/maps` again.
    pub(crate) fn recount(&mut self) {
        self.stale = false;
        self.remaps_since_count = 0;
        self.counted_at = std::time::Instant::now();
        let maps = self.proc_maps.as_ref().map_or(0, sys::ProcMaps::count);
        self.others = maps.saturating_sub(self.used);
    }

    /// At a scan's start, marks a read due before its first remap when the
    /// process holds a quarter of the limit or more, or the last count is
    /// `RECOUNT_AGE` old (`room` reads it): between scans the program makes
    /// and drops mappings of its own, which no remap count bounds.
    pub(crate) fn mark_due_for_scan(&mut self) {
        if 4 * (self.others + self.used) >= self.max_map_count
            || self.counted_at.elapsed() >= RECOUNT_AGE
        {
            self.stale = true;
        }
    }

    /// Re-counts after a remap when it is due. The read costs time in
    /// proportion to the mappings: every `RECOUNT_REMAPS` remaps, or every
    /// eighth of the engine's mappings when it holds more, so the reads stay
    /// a small share of the remaps at any count; and only when the count
    /// could be near the limit (`far_from_limit`): an interpreter mapping
    /// its copies spent 8% of its time reading the file otherwise.
    pub(crate) fn recount_if_due(&mut self) {
        if self.remaps_since_count >= (self.used / 8).max(RECOUNT_REMAPS) && !self.far_from_limit()
        {
            self.recount();
        }
    }

    /// Whether the process stays more than two reserves below the limit
    /// even if every remap since the last read added `DRIFT_PER_REMAP`
    /// mappings the engine did not reckon: a remap maps one range over part
    /// of a mapping, which splits it in three at most.
    fn far_from_limit(&self) -> bool {
        let worst = self.others + self.used + DRIFT_PER_REMAP * self.remaps_since_count;
        worst + 2 * self.reserve < self.max_map_count
    }

    /// Whether the process is within `MAPPINGS_SLACK` of the kernel's limit
    /// at the last count: a failed call is then a shortage of mappings.
    pub(crate) fn near_limit(&self) -> bool {
        self.others + self.used + MAPPINGS_SLACK >= self.max_map_count
    }

    /// The program ran out of mappings and the engine gave back what it
    /// could: from now on its blocks may use no more mappings than they
    /// hold. The program needs the rest, and a scan that splits blocks again
    /// would take back, between the program's calls, what it was given.
    pub(crate) fn keep_to_what_is_held(&mut self) {
        self.budget = self.budget.min(self.used);
    }

    /// Maps the spares to give up when the process runs out of mappings.
    pub(crate) fn make_spares(&mut self) {
        // A mapping the kernel places itself never starts at address 0.
        self.spares = sys::map_spares().and_then(|p| NonZeroUsize::new(p as usize));
    }

    /// Gives up the spares, if kept: the mappings the first move back needs.
    pub(crate) fn give_up_spares(&mut self) {
        if let Some(first) = self.spares.take() {
            sys::unmap_spares(first.get() as *mut u8);
        }
    }

    /// In a child right after fork: the inherited maps file describes the parent.
    pub(crate) fn reopen(&mut self) {
        self.proc_maps = sys::ProcMaps::open().ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mappings_under(max_map_count: usize) -> Mappings {
        let mut cfg = Config::default();
        cfg.inject.max_map_count = Some(max_map_count);
        Mappings::new(&cfg)
    }

    /// Remaps enough for a read, `RECOUNT_REMAPS`, each reckoned as one
    /// mapping more; whether `recount_if_due` then read the file.
    fn read_after_due_remaps(m: &mut Mappings) -> bool {
        for _ in 0..RECOUNT_REMAPS {
            m.remapped(1, 2);
        }
        m.recount_if_due();
        m.remaps_since_count == 0
    }

    #[test]
    fn far_from_the_limit_remaps_do_not_read_the_maps_file() {
        let mut m = mappings_under(1 << 30);
        assert!(!read_after_due_remaps(&mut m));
        assert_eq!(m.remaps_since_count, RECOUNT_REMAPS);
    }

    #[test]
    fn a_scan_reads_the_maps_file_only_once_its_own_budget_leaves_room() {
        let mut m = mappings_under(1 << 30);
        (m.budget, m.used) = (10, 10);
        m.counted_at = std::time::Instant::now()
            .checked_sub(RECOUNT_AGE)
            .expect("an instant two seconds ago");
        m.mark_due_for_scan();
        assert!(m.stale, "the last read is old: a read is due");
        assert!(!m.room(1));
        assert!(m.stale, "at its own budget the engine reads nothing");
        m.used = 5;
        assert!(m.room(1));
        assert!(
            !m.stale,
            "the first question it could answer yes read the file"
        );
    }

    #[test]
    fn thirteen_thousand_mappings_under_the_default_limit_are_far_from_it() {
        // An interpreter's copies: 13,000 mappings of the engine's, and
        // the remaps of a while since the last read.
        let mut m = mappings_under(65_530);
        m.used = 13_000;
        m.remaps_since_count = 2_000;
        m.recount_if_due();
        assert_eq!(m.remaps_since_count, 2_000, "the maps file was read");
        m.mark_due_for_scan();
        assert!(
            !m.stale,
            "a scan a moment after the last read reads nothing"
        );
    }

    #[test]
    fn after_a_shortage_the_engine_takes_no_more_mappings() {
        let mut m = mappings_under(1 << 30);
        m.used = 3;
        assert!(m.room(100));
        m.keep_to_what_is_held();
        assert!(!m.room(1), "no split beyond what the engine holds");
        m.remove(2);
        assert!(m.room(2), "what it gave up since, it may take again");
        assert!(!m.room(3));
    }

    #[test]
    fn remaps_that_could_near_the_limit_read_the_maps_file() {
        // The process's own mappings plus the drift the remaps may have
        // caused come within two reserves of the limit.
        let mut m = mappings_under(1 << 30);
        m.max_map_count =
            m.others + RECOUNT_REMAPS + DRIFT_PER_REMAP * RECOUNT_REMAPS + 2 * m.reserve;
        assert!(read_after_due_remaps(&mut m));
        // Remaps that are not due never read, near or not.
        m.remapped(1, 2);
        m.recount_if_due();
        assert_eq!(m.remaps_since_count, 1);
    }
}
