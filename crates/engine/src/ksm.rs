//! Handing scattered duplicates to kernel KSM.
//!
//! The engine merges a page by mapping it onto another page's frame, and a
//! mapping covers consecutive frames only: a duplicate page among unique ones
//! is a mapping of its own and splits its neighbour's, two mappings a page.
//! So merging scattered duplicates stops at the mapping budget (about 15,000
//! pages at the kernel's default `vm.max_map_count`), and each further scan
//! finds the same duplicates and is refused again. Kernel KSM merges at the
//! level of page-table entries, with no mapping per page, and checks for pins
//! under the page lock before each merge; it works only on private anonymous
//! memory of ranges marked `MADV_MERGEABLE`, and its scan rate is the
//! administrator's (`/sys/kernel/mm/ksm`).
//!
//! So with `Config::ksm_handoff` (`PAGEFOLD_KSM=1`; off by default, since
//! ksmd merges a handed block's pages with equal pages of any other mergeable
//! process, see docs/MECHANISMS.md's threat model), a block in which the
//! budget refused at least `HANDOFF_PAGES` merges is handed over after the scan: the block is
//! taken out of the engine's hands as an exempt block is (its content moved
//! onto one anonymous mapping under write protection, behind the pin grace),
//! the whole block is marked mergeable with one `madvise` (one mapping, no
//! split), and the engine never scans it again: KSM folds its duplicates,
//! zero pages included, at its own pace. The engine hands over only blocks
//! whose duplicates it found and could not merge, so KSM scans those and
//! nothing else of the program.
//!
//! Once the budget has no room left for a merge, a scan no longer plans
//! merges; while KSM runs it still hashes the pages it looks at and counts
//! those that duplicate a page seen before (no system call, no mapping), so
//! a block full of scattered duplicates reaches `HANDOFF_PAGES` in one scan.
//!
//! When KSM is not running (`/sys/kernel/mm/ksm/run` is not 1, or the kernel
//! has no KSM; read once a scan, ksm_link.rs), nothing is handed over and
//! nothing more is hashed: moving a block off its frames would give up the
//! sharing the engine has and gain nothing. Each scan counts in
//! `fallbacks.ksm` the blocks in which the budget refused merges.

use crate::state::State;
use crate::sys::{self, PAGE};

/// Merges the mapping budget must refuse in one block before it is handed
/// to KSM: 1 MiB of duplicates the engine could not fold itself.
pub const HANDOFF_PAGES: usize = 256;

impl State {
    /// Hands to KSM every block whose refused merges reached `HANDOFF_PAGES`;
    /// returns how many were handed over. While ksmd does not run, a block
    /// in which the budget refused merges this scan is counted in
    /// `fallbacks.ksm` instead.
    pub(crate) fn hand_to_ksm(&mut self) -> u64 {
        if !self.cfg.ksm_handoff {
            return 0;
        }
        if self.blocks.values().all(|b| b.merges_refused == 0) {
            return 0;
        }
        let ready = self.ksm.ready();
        let least = if ready { HANDOFF_PAGES } else { 1 };
        let due: Vec<usize> = self
            .blocks
            .iter()
            .filter(|(_, b)| !b.exempt && b.merges_refused >= least)
            .map(|(&base, _)| base)
            .collect();
        let mut handed = 0;
        for base in due {
            self.blocks
                .get_mut(&base)
                .expect("listed block")
                .merges_refused = 0;
            if !ready {
                self.stats.fallbacks.ksm += 1;
            } else if self.hand_block(base) {
                handed += 1;
            }
        }
        handed
    }

    /// Takes block `base` out of the engine's hands and marks it mergeable.
    /// False if it could not be moved onto anonymous memory (it stays exempt
    /// on its frames, frozen, as an exempt block does) or the kernel refused
    /// the advice.
    fn hand_block(&mut self, base: usize) -> bool {
        if !self.take_out_of_hands(base) {
            return false;
        }
        let len = self.blocks[&base].pages.len() * PAGE;
        if self.cfg.inject.ksm_refuse
            || sys::madvise(base as *mut u8, len, libc::MADV_MERGEABLE).is_err()
        {
            self.stats.fallbacks.ksm += 1;
            return false;
        }
        self.stats.ksm_blocks += 1;
        self.stats.ksm_bytes += len as u64;
        true
    }
}
