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
use pagefold_banks::pfn::Pagemap;

use crate::frames::Pool;
use crate::{sys, PAGE};

/// Slots `[first, first + n)` of a pool, filled through its window.
struct Slots<'a> {
    pool: &'a Pool,
    first: u64,
    pagemap: Option<Pagemap>,
    hide_pfns: bool,
}

impl Pages for Slots<'_> {
    fn fill(&mut self, which: &[usize], pfns: &mut [u64]) -> bool {
        let mut k = 0;
        for run in consecutive(which) {
            let addr = self.pool.frame_ptr(self.first + run.0 as u64) as *mut u8;
            if sys::madvise(addr, run.1 * PAGE, libc::MADV_POPULATE_READ).is_err() {
                return false;
            }
            let out = &mut pfns[k..k + run.1];
            match &self.pagemap {
                Some(m) if !self.hide_pfns => {
                    if !m.pfns(addr as usize, out) {
                        out.fill(0);
                    }
                }
                _ => out.fill(0),
            }
            k += run.1;
        }
        true
    }

    fn give_back(&mut self, i: usize) {
        let _ = self.pool.punch(self.first + i as u64, 1);
    }
}

/// Runs of consecutive indices in a sorted list, as (start, length).
fn consecutive(sorted: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &i in sorted {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == i => *len += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}

/// Backs slots `[slot, slot + n)` of `pool` (fresh, unmapped by anyone but
/// the block about to be handed out) with pages of the colouring's banks.
pub fn colour_slots(pool: &Pool, slot: u64, n: usize, c: &Colouring, hide_pfns: bool) -> Outcome {
    let mut slots = Slots {
        pool,
        first: slot,
        pagemap: Pagemap::open(),
        hide_pfns,
    };
    colour_run(&mut slots, n, &|pfn| c.fits(pfn))
}

#[cfg(test)]
mod tests {
    use super::consecutive;

    #[test]
    fn consecutive_runs() {
        assert_eq!(
            consecutive(&[0, 1, 2, 5, 7, 8]),
            vec![(0, 3), (5, 1), (7, 2)]
        );
        assert!(consecutive(&[]).is_empty());
    }
}
