//! Placing large allocations so that the copies a program makes line up.
//!
//! The engine can map a copy only where source and destination sit at the
//! same offset within a page. A program that copies between objects whose
//! data starts at different offsets from their allocation never gets a
//! virtual copy, however large: Python's `bytes(a_bytearray)` copies from the
//! bytearray's buffer (an allocation of its own, data at offset 0) into a
//! bytes object (data after a 32-byte header). So the copy hook notes, per
//! size class (the destination's length in pages), the offset within a page
//! at which the destination's allocation would have had to start for the
//! copy to line up, and once two misaligned copies in a row taught a class
//! the same offset, later allocations of that class start there: at
//! `base + offset` of an engine block one page longer. Their copies map.
//! One lesson is not enough: a class whose copies mostly line up already
//! (from other objects of its own kind) must not be moved by one odd copy.
//!
//! A placed pointer is not page-aligned, so free, realloc and
//! malloc_usable_size must tell it from glibc's chunks without taking the
//! engine's lock: live placed pointers are kept in a lock-free set (open
//! addressing over atomics), looked at only while it is not empty. A placed
//! pointer's block starts at the page it lies in. When the set is full, or
//! too crowded around a pointer, allocations are simply not placed.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use pagefold_engine::PAGE;

/// Size classes whose offset is remembered (a class maps to one entry; a
/// later class on the same entry replaces it).
const CLASSES: usize = 64;
/// Learned offsets: `class << 16 | offset`, 0 for none.
static LEARNED: [AtomicU64; CLASSES] = [const { AtomicU64::new(0) }; CLASSES];
/// The last lesson of each entry, not yet repeated: `class << 16 | offset`.
static TAUGHT: [AtomicU64; CLASSES] = [const { AtomicU64::new(0) }; CLASSES];

/// Live placed pointers: 0 empty, `GONE` a removed entry, else a pointer.
const SLOTS: usize = 1 << 14;
/// Slots looked at from a pointer's home slot before giving up.
const PROBES: usize = 64;
const GONE: usize = 1;
static SET: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// The size class of an allocation of `n` bytes: its length in pages.
pub fn class_of(n: usize) -> usize {
    n.div_ceil(PAGE)
}

fn index(class: usize) -> usize {
    class.wrapping_mul(0x9e37_79b9) % CLASSES
}

/// Where in its first page an allocation of `n` bytes should start (0: at
/// the page's start, as every engine block does unless taught otherwise).
pub fn offset_for(n: usize) -> usize {
    let class = class_of(n);
    let e = LEARNED[index(class)].load(Ordering::Relaxed);
    if e >> 16 == class as u64 {
        (e & 0xffff) as usize
    } else {
        0
    }
}

/// A copy taught that allocations of `class` should start at `offset`
/// within a page; the second such lesson in a row is learned.
pub fn learn(class: usize, offset: usize) {
    debug_assert!(offset < PAGE);
    let lesson = (class as u64) << 16 | offset as u64;
    let i = index(class);
    if TAUGHT[i].swap(lesson, Ordering::Relaxed) == lesson {
        LEARNED[i].store(lesson, Ordering::Relaxed);
        TAUGHT[i].store(0, Ordering::Relaxed);
    }
}

fn home(p: usize) -> usize {
    (p >> 4).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOTS.trailing_zeros())
}

fn slots(p: usize) -> impl Iterator<Item = &'static AtomicUsize> {
    (0..PROBES).map(move |i| &SET[(home(p) + i) % SLOTS])
}

/// Records a placed pointer; false if there is no room (then it must not be
/// handed out placed).
pub fn insert(p: usize) -> bool {
    for s in slots(p) {
        let cur = s.load(Ordering::Relaxed);
        if (cur == 0 || cur == GONE)
            && s.compare_exchange(cur, p, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            LIVE.fetch_add(1, Ordering::AcqRel);
            return true;
        }
    }
    false
}

/// Whether `p` is a live placed pointer.
pub fn contains(p: usize) -> bool {
    if LIVE.load(Ordering::Acquire) == 0 || p.is_multiple_of(PAGE) {
        return false;
    }
    for s in slots(p) {
        match s.load(Ordering::Acquire) {
            0 => return false,
            x if x == p => return true,
            _ => {}
        }
    }
    false
}

/// Forgets a placed pointer (its block was freed).
pub fn remove(p: usize) {
    for s in slots(p) {
        match s.load(Ordering::Acquire) {
            0 => return,
            x if x == p => {
                if s.compare_exchange(p, GONE, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    LIVE.fetch_sub(1, Ordering::AcqRel);
                }
                return;
            }
            _ => {}
        }
    }
}

/// The offset a copy of `n` bytes from `src` to `dst` (at different offsets
/// within their pages) teaches, and the class it teaches it to: `dst` lies
/// in the engine block `[dst_base, dst_base + dst_len)`, whose allocation
/// started at `dst_base` or, if placed, at the offset its class has now.
pub fn lesson(dst: usize, src: usize, dst_base: usize, dst_len: usize) -> (usize, usize) {
    let pages = dst_len / PAGE;
    // A placed allocation of class c took c or c + 1 pages (its offset added).
    let placed = [pages, pages.saturating_sub(1)]
        .into_iter()
        .filter(|&c| c > 0)
        .map(|c| (c, offset_for(c * PAGE)))
        .find(|&(_, o)| o > 0 && contains(dst_base + o));
    let (class, start) = match placed {
        Some((c, o)) => (c, dst_base + o),
        None => (pages, dst_base),
    };
    let into_object = dst - start;
    (class, (src % PAGE + PAGE - into_object % PAGE) % PAGE)
}
