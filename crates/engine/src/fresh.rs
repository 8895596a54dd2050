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
//! for one in `PROBE_EVERY`, which keeps measuring, so a class whose copies
//! stop being written is shared again.

use std::collections::HashMap;

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
/// Both counters of a class are halved when its allocations reach this, so
/// the class follows what the program does now.
const DECAY_AT: u32 = 64;
/// Most size classes remembered.
const MAX_CLASSES: usize = 4096;
/// Pages shared by copies into a class before its copies are judged.
const JUDGE_AFTER: u32 = 64;
/// Shared and written page counts are halved when the shared ones reach this.
const DECAY_PAGES_AT: u32 = 1 << 16;
/// A class whose copies are made plainly still gets one virtual copy in this many.
const PROBE_EVERY: u32 = 16;

#[derive(Clone, Copy, Default)]
struct Class {
    allocs: u32,
    copied: u32,
    /// Pages shared by copies into blocks of this class.
    shared: u32,
    /// Of those, pages found written.
    written: u32,
    /// Copies into this class decided plainly since the last probe.
    plain_streak: u32,
}

/// What the engine has learnt about copies, per size class (pages).
#[derive(Default)]
pub struct Placement {
    classes: HashMap<usize, Class>,
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

    /// A block of `npages` was the source of a copy.
    pub fn copied_from(&mut self, npages: usize) {
        if let Some(c) = self.classes.get_mut(&npages) {
            c.copied = (c.copied + 1).min(c.allocs.max(1));
        }
    }

    /// Whether a copy into a block of `npages` should share pages: false when
    /// copies into the class have mostly been written (see the module comment).
    pub fn copy_pays(&mut self, npages: usize) -> bool {
        let Some(c) = self.classes.get_mut(&npages) else {
            return true;
        };
        if c.shared < JUDGE_AFTER || c.written * 2 < c.shared {
            return true;
        }
        c.plain_streak += 1;
        if c.plain_streak >= PROBE_EVERY {
            c.plain_streak = 0;
            return true;
        }
        false
    }

    /// A copy into a block of `npages` shared `pages` pages.
    pub fn shared_by_copy(&mut self, npages: usize, pages: usize) {
        if let Some(c) = self.classes.get_mut(&npages) {
            c.shared = c.shared.saturating_add(pages as u32);
            if c.shared >= DECAY_PAGES_AT {
                c.shared /= 2;
                c.written /= 2;
            }
        }
    }

    /// `pages` pages a copy shared into a block of `npages` were found written.
    pub fn written_after_copy(&mut self, npages: usize, pages: usize) {
        if let Some(c) = self.classes.get_mut(&npages) {
            c.written = c.written.saturating_add(pages as u32).min(c.shared);
        }
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
        assert!(p.copy_pays(10), "nothing learnt yet");
        p.shared_by_copy(10, 100);
        p.written_after_copy(10, 40);
        assert!(p.copy_pays(10), "less than half written");
        p.written_after_copy(10, 20);
        let decisions: Vec<bool> = (0..2 * PROBE_EVERY).map(|_| p.copy_pays(10)).collect();
        let virtual_copies = decisions.iter().filter(|&&v| v).count();
        assert_eq!(
            virtual_copies, 2,
            "one probe per {PROBE_EVERY}: {decisions:?}"
        );
        // Probes that stay unwritten bring the class back.
        p.shared_by_copy(10, 200);
        assert!(p.copy_pays(10));
    }

    #[test]
    fn copies_of_unknown_classes_are_not_counted() {
        let mut p = Placement::default();
        p.copied_from(7);
        assert!(!p.on_frames(Fresh::Adaptive, 7));
    }
}
