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

#[derive(Clone, Copy, Default)]
struct Class {
    allocs: u32,
    copied: u32,
}

/// What the engine has learnt about copies, per size class (pages).
#[derive(Default)]
pub struct Placement {
    classes: HashMap<usize, Class>,
}

impl Placement {
    /// Whether a fresh block of `npages` starts on frames; counts the allocation.
    pub fn on_frames(&mut self, policy: Fresh, npages: usize) -> bool {
        match policy {
            Fresh::Frames => return true,
            Fresh::Anon => return false,
            Fresh::Adaptive => {}
        }
        if self.classes.len() >= MAX_CLASSES && !self.classes.contains_key(&npages) {
            self.classes.clear();
        }
        let c = self.classes.entry(npages).or_default();
        let frames = c.copied > 0 && c.copied * COPIED_EVERY >= c.allocs;
        c.allocs += 1;
        if c.allocs >= DECAY_AT {
            c.allocs /= 2;
            c.copied /= 2;
        }
        frames
    }

    /// A block of `npages` was the source of a copy.
    pub fn copied_from(&mut self, npages: usize) {
        if let Some(c) = self.classes.get_mut(&npages) {
            c.copied = (c.copied + 1).min(c.allocs.max(1));
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
    fn copies_of_unknown_classes_are_not_counted() {
        let mut p = Placement::default();
        p.copied_from(7);
        assert!(!p.on_frames(Fresh::Adaptive, 7));
    }
}
