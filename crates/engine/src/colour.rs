//! Page colouring of fresh frames: with `PAGEFOLD_BANKS` set, every frame of
//! a fresh block is backed, before the program sees it, by a physical page
//! whose DRAM banks lie in the set (pagefold-banks decides what a page's
//! banks are and runs the keep-or-retry loop).
//!
//! A slot is filled by reading it through the pool's read-only window
//! (MADV_POPULATE_READ: shmem allocates a zeroed page for a hole), its PFN is
//! read from pagemap, and a page outside the set is punched out again while a
//! holder takes the freed page, so the next fill gets another. Only
//! still-empty slots of a block nobody has seen yet are filled, so no byte the
//! program reads changes: every page reads as zero, as a hole would.
//!
//! What is coloured: frames of fresh blocks, at allocation. What is not:
//! blocks on anonymous memory (fresh blocks when `PAGEFOLD_FRESH` is not
//! `frames`, and fallbacks), frames a copy writes through, and pages the
//! kernel allocates later (a copy-on-write copy, a folded zero page faulted
//! in again, a restored evicted page). When PFNs cannot be read (not root,
//! or `PAGEFOLD_INJECT_HIDE_PFNS`), a fill fails, or the bounds run out, the
//! block keeps the pages it got and the shortfall is counted in
//! `fallbacks.banks`.

use pagefold_banks::colour::{colour_run, Colouring, Outcome, Pages};

use crate::frames::Pool;
use crate::sys::{self, PAGE};

/// Slots `[first, first + n)` of a pool, filled through its window.
struct Slots<'a> {
    pool: &'a Pool,
    first: u64,
    /// The engine's own /proc/self/pagemap (opened once, as every engine
    /// descriptor is: an allocation opens no file).
    pagemap: Option<&'a sys::Pagemap>,
    hide_pfns: bool,
}

impl Pages for Slots<'_> {
    fn fill(&mut self, which: &[usize], pfns: &mut [u64]) -> bool {
        let mut k = 0;
        for (start, end) in crate::space::consecutive(which) {
            let len = end - start;
            let addr = self.pool.frame_ptr(self.first + start as u64) as *mut u8;
            if sys::madvise(addr, len * PAGE, libc::MADV_POPULATE_READ).is_err() {
                return false;
            }
            let out = &mut pfns[k..k + len];
            match self.pagemap {
                Some(m) if !self.hide_pfns && m.read(addr, out).is_ok() => {
                    out.iter_mut()
                        .for_each(|e| *e = pagefold_banks::pfn::from_entry(*e));
                }
                _ => out.fill(0),
            }
            k += len;
        }
        true
    }

    fn give_back(&mut self, i: usize) {
        let _ = self.pool.punch(self.first + i as u64, 1);
    }
}

/// Backs slots `[slot, slot + n)` of `pool` (fresh, unmapped by anyone but
/// the block about to be handed out) with pages of the colouring's banks.
pub fn colour_slots(
    pool: &Pool,
    slot: u64,
    n: usize,
    c: &Colouring,
    pagemap: Option<&sys::Pagemap>,
    hide_pfns: bool,
) -> Outcome {
    let mut slots = Slots {
        pool,
        first: slot,
        pagemap,
        hide_pfns,
    };
    colour_run(&mut slots, n, &|pfn| c.fits(pfn))
}
