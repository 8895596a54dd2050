//! Recycling freed blocks, as glibc's heap recycles freed chunks.
//!
//! A program that frees a block and soon allocates one of the same size (an
//! interpreter's loop does this all the time) would otherwise pay, per block,
//! an munmap, a hole punched in the memfd, an mmap and a page fault for every
//! page touched again; glibc instead hands back memory that is still mapped
//! and resident. So a freed block whose pages are all its own (owned frames,
//! or plain anonymous memory: nothing shared, nothing another block depends
//! on) is kept mapped as it is, up to `Config::recycle_bytes` in total, and
//! given out again to an allocation that does not need zeroed memory
//! (`Hint::Uninit`, i.e. malloc, not calloc): whole if it has the same page
//! count, else cut from one up to four times larger.
//!
//! Recycled blocks are not blocks: no scan, copy or lookup sees them. They
//! are released for good when the budget overflows (oldest first), when they
//! waited longer than `Config::recycle_age` (checked on every allocation and
//! free, and by each scan for a program that stopped allocating), and before
//! fork (a recycled block maps shared frames the child would inherit). The
//! age is short by default (250 ms): an interpreter allocates again right
//! after its collector frees, and memory idle longer should go back.

use std::time::Instant;

use crate::engine::State;
use crate::space::{Block, Page};

/// A freed block kept for reuse.
pub(crate) struct Recycled {
    pub block: Block,
    pub freed_at: Instant,
}

impl State {
    /// Keeps `block` for reuse if it may be; otherwise gives it back.
    pub(crate) fn free_block(&mut self, block: Block) {
        self.expire_recycled();
        if self.recyclable(&block) {
            self.recycled_bytes += block.len();
            self.recycled.push(Recycled {
                freed_at: Instant::now(),
                block,
            });
            while self.recycled_bytes > self.cfg.recycle_bytes {
                let oldest = self.recycled.remove(0);
                self.release_recycled(oldest.block);
            }
        } else {
            self.release_block(block);
        }
    }

    fn recyclable(&self, block: &Block) -> bool {
        let own = |p: &Page| matches!(p, Page::Owned(_));
        let anon = |p: &Page| matches!(p, Page::Anon);
        !block.exempt
            && block.len() <= self.cfg.recycle_bytes / 4
            && (block.pages.iter().all(own) || block.pages.iter().all(anon))
    }

    /// A recycled block of `npages`: one of exactly that size, the most
    /// recently freed first (its pages are the likeliest to be in the CPU's
    /// cache), else the smallest one up to four times larger, whose tail is
    /// split off and stays recycled.
    pub(crate) fn reuse(&mut self, npages: usize) -> Option<Block> {
        let len = |r: &Recycled| r.block.pages.len();
        let i = self
            .recycled
            .iter()
            .rposition(|r| len(r) == npages)
            .or_else(|| {
                let larger = self
                    .recycled
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| len(r) > npages && len(r) <= 4 * npages);
                larger.min_by_key(|(_, r)| len(r)).map(|(i, _)| i)
            })?;
        let Recycled {
            mut block,
            freed_at,
        } = self.recycled.remove(i);
        self.recycled_bytes -= block.len();
        if block.pages.len() > npages {
            let tail = self.split(&mut block, npages);
            self.recycled_bytes += tail.len();
            self.recycled.insert(
                i,
                Recycled {
                    block: tail,
                    freed_at,
                },
            );
        }
        block.seen.fill(0);
        self.stats.recycled += 1;
        Some(block)
    }

    /// Cuts `block` after `n` pages; returns the tail. The kernel's mapping
    /// is not split, but each part counts its own (an overcount by one
    /// keeps the VMA budget on the safe side).
    fn split(&mut self, block: &mut Block, n: usize) -> Block {
        // SAFETY: callers split at n below the block's page count, so base + n * PAGE is inside
        // the block's mapping.
        let tail_base = unsafe { block.base.add(n * crate::PAGE) };
        let tail = Block::new(tail_base, block.pages.split_off(n));
        block.seen.truncate(n);
        let before = block.vmas;
        block.vmas = block.count_vmas();
        self.vmas = self.vmas + block.vmas + tail.vmas - before;
        tail
    }

    /// Releases recycled blocks older than the configured age (oldest first in the list,
    /// so this usually looks at one entry). Scans call it too, for a program
    /// that stopped allocating.
    pub(crate) fn expire_recycled(&mut self) {
        if self.recycled.is_empty() {
            return;
        }
        let now = Instant::now();
        let max_age = self.cfg.recycle_age;
        while self
            .recycled
            .first()
            .is_some_and(|r| now.duration_since(r.freed_at) > max_age)
        {
            let old = self.recycled.remove(0);
            self.release_recycled(old.block);
        }
    }

    /// Releases every recycled block (before fork).
    pub(crate) fn flush_recycled(&mut self) {
        for r in std::mem::take(&mut self.recycled) {
            self.release_recycled(r.block);
        }
    }

    fn release_recycled(&mut self, block: Block) {
        self.recycled_bytes -= block.len();
        self.release_block(block);
    }
}
