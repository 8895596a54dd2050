//! Recycling freed blocks, as glibc's heap recycles freed chunks.
//!
//! A program that frees a block and soon allocates one of the same size (an
//! interpreter's loop does this all the time) would otherwise pay, per block,
//! an munmap, a hole punched in the memfd, an mmap and a page fault for every
//! page touched again; glibc instead hands back memory that is still mapped
//! and resident. So a freed block whose pages are all its own (owned frames,
//! or plain anonymous memory: nothing shared, nothing another block depends
//! on) is kept mapped as it is, up to `Config::recycle_bytes` in total, and
//! given out again whole to an allocation of the same page count that does
//! not need zeroed memory (`Hint::Uninit`, i.e. malloc, not calloc).
//!
//! Recycled blocks are not blocks: no scan, copy or lookup sees them. They
//! are released for good when the budget overflows (oldest first), when a
//! scan finds them older than the previous scan (so memory a program stopped
//! reusing returns within about two scan intervals), and before fork (a
//! recycled block maps shared frames the child would inherit).

use crate::engine::State;
use crate::space::{Block, Page};

/// A freed block kept for reuse.
pub(crate) struct Recycled {
    pub block: Block,
    /// `Stats::scans` when it was freed.
    pub freed_at_scan: u64,
}

impl State {
    /// Keeps `block` for reuse if it may be; otherwise gives it back.
    pub(crate) fn free_block(&mut self, block: Block) {
        if self.recyclable(&block) {
            self.recycled_bytes += block.len();
            self.recycled.push(Recycled { freed_at_scan: self.stats.scans, block });
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

    /// A recycled block of exactly `npages`, the most recently freed first
    /// (its pages are the likeliest to be in the cache).
    pub(crate) fn reuse(&mut self, npages: usize) -> Option<Block> {
        let i = self.recycled.iter().rposition(|r| r.block.pages.len() == npages)?;
        let mut block = self.recycled.remove(i).block;
        self.recycled_bytes -= block.len();
        block.seen.fill(0);
        self.stats.recycled += 1;
        Some(block)
    }

    /// Releases recycled blocks a whole scan has passed since they were freed.
    pub(crate) fn trim_recycled(&mut self) {
        let now = self.stats.scans;
        let (old, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.recycled).into_iter().partition(|r| r.freed_at_scan < now);
        self.recycled = keep;
        for r in old {
            self.release_recycled(r.block);
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
