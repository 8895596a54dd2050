//! Recycling freed blocks, as glibc's heap recycles freed chunks.
//!
//! A program that frees a block and soon allocates one of the same size (an
//! interpreter's loop does this all the time) would otherwise pay, per block,
//! an munmap, a hole punched in the memfd, an mmap and a page fault for every
//! page touched again; glibc instead hands back memory that is still mapped
//! and resident. So a freed block whose pages are all its own (owned frames,
//! or plain anonymous memory: nothing shared, nothing another block depends
//! on) is kept mapped as it is, up to `Config::recycle_bytes` in total but
//! never more than 16 MiB plus `Config::recycle_live_percent` of the live
//! blocks' bytes (so freed memory held for reuse stays small beside what the
//! program holds: a program of 250 MiB keeps at most 46 MiB), and
//! given out again to an allocation that does not need zeroed memory
//! (`Hint::Uninit`, i.e. malloc, not calloc) that would start on the same
//! kind of memory (frames or anonymous, fresh.rs), so recycling never
//! changes where a block lives: whole if it has the same page count, else
//! cut from one up to four times larger. When none fits but
//! smaller ones add up to the request, several are laid side by side into
//! one block (`gather`; state.rs moves their mappings with mremap, which
//! moves page tables and faults nothing), as glibc's heap coalesces freed
//! neighbours: an interpreter whose vectors grow a little from one
//! iteration to the next would otherwise never fit a freed one and fault in
//! fresh memory every time.
//!
//! Memory kept for reuse never raises the process's peak. glibc reuses a
//! freed chunk in place, so its peak is about what the program holds at
//! once; a kept block that no allocation fits would instead stack on top
//! of the fresh memory mapped beside it, and on top of the freed chunks
//! glibc's heap keeps (scikit-learn's pipeline reached 1.10-1.12 of plain's
//! peak resident memory that way, 1.07 with this). So before fresh memory
//! is mapped while blocks are kept (by the engine, or by the caller's
//! allocator for an allocation the engine leaves to it), the process's
//! resident bytes now and at their highest are read, and the oldest kept
//! blocks are given back until what is resident, less them, plus the fresh
//! block is within that highest (`make_room`): a program that grows keeps
//! nothing, one that shrank keeps up to the budget. A kept block reused does
//! not count as an allocation of its size class (fresh.rs): a class served
//! by reuse stays within the first allocations the engine takes to learn.
//!
//! Recycled blocks are not blocks: no scan, copy or lookup sees them. They
//! are released for good when the budget overflows (oldest first), when they
//! waited longer than `Config::recycle_age` (checked on every allocation and
//! free, and by each scan for a program that stopped allocating), and before
//! fork (a recycled block maps shared frames the child would inherit). The
//! age is short by default (250 ms): an interpreter allocates again right
//! after its collector frees, and memory idle longer should go back.

use std::time::{Duration, Instant};

use crate::config::Config;
use crate::space::{Block, Page};
use crate::sys;

/// Most recycled blocks laid side by side into one allocation (each costs a
/// system call and may cost a mapping).
pub(crate) const MAX_PIECES: usize = 16;

/// A freed block kept for reuse.
struct Recycled {
    block: Block,
    freed_at: Instant,
}

/// The freed blocks kept for reuse, oldest first, and their total length.
/// The engine gives back (unmaps) whatever blocks this hands out of its
/// list: this module only decides which.
#[derive(Default)]
pub(crate) struct Recycler {
    list: Vec<Recycled>,
    bytes: usize,
    /// The process's resident bytes (`make_room`); None where the file
    /// cannot be opened (then nothing is given back for the peak's sake).
    resident: Option<sys::Resident>,
}

/// A block taken for reuse, and the mappings the blocks count before and
/// after cutting it (both 0 if it was not cut).
pub(crate) struct Reused {
    pub block: Block,
    pub vmas_before: usize,
    pub vmas_after: usize,
}

impl Recycler {
    /// Bytes of the blocks kept now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Keeps `block` for reuse if it may be; returns what is to be given
    /// back: `block` itself if it may not be kept, else the oldest blocks
    /// the budget no longer holds.
    /// `live_bytes` is asked for only when what is kept passes the floor.
    pub fn keep(
        &mut self,
        block: Block,
        cfg: &Config,
        live_bytes: impl FnOnce() -> usize,
    ) -> Vec<Block> {
        if !recyclable(&block, cfg) {
            return vec![block];
        }
        self.bytes += block.len();
        self.list.push(Recycled {
            freed_at: Instant::now(),
            block,
        });
        let budget = if self.bytes <= BUDGET_FLOOR {
            cfg.recycle_bytes
        } else {
            budget(cfg, live_bytes())
        };
        let mut out = Vec::new();
        while self.bytes > budget {
            out.push(self.remove(0));
        }
        out
    }

    /// Opens what `make_room` reads, when it is to be used.
    pub fn new(cfg: &Config) -> Recycler {
        let used = cfg.recycle_bytes > 0 && cfg.recycle_under_peak;
        Recycler {
            resident: used.then(|| sys::Resident::open().ok()).flatten(),
            ..Default::default()
        }
    }

    /// In a child right after fork: the inherited status file describes the
    /// parent.
    pub fn after_fork_in_child(&mut self) {
        if self.resident.is_some() {
            self.resident = sys::Resident::open().ok();
        }
    }

    /// The oldest kept blocks to give back before `fresh_bytes` of fresh
    /// memory are mapped, so that what the process has resident (kept
    /// blocks included, counted whole) plus the fresh block stays within
    /// the most it ever had resident.
    pub fn make_room(&mut self, fresh_bytes: usize) -> Vec<Block> {
        let mut out = Vec::new();
        let Some((now, peak)) = self.resident.as_ref().and_then(sys::Resident::read) else {
            return out;
        };
        let mut after = now + fresh_bytes;
        while after > peak && !self.list.is_empty() {
            let b = self.remove(0);
            after = after.saturating_sub(b.len());
            out.push(b);
        }
        out
    }

    fn remove(&mut self, i: usize) -> Block {
        let r = self.list.remove(i);
        self.bytes -= r.block.len();
        r.block
    }

    /// A recycled block of `npages` on frames (`on_frames`) or anonymous:
    /// one of exactly that size, the most recently freed first (its pages
    /// are the likeliest to be in the CPU's cache), else the smallest one up
    /// to four times larger, whose tail is split off and stays recycled. Its
    /// `seen` words start afresh.
    pub fn take(&mut self, npages: usize, on_frames: bool) -> Option<Reused> {
        let len = |r: &Recycled| r.block.pages.len();
        let kind = |r: &Recycled| is_on_frames(&r.block) == on_frames;
        let i = self
            .list
            .iter()
            .rposition(|r| kind(r) && len(r) == npages)
            .or_else(|| {
                let larger = self
                    .list
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| kind(r) && len(r) > npages && len(r) <= 4 * npages);
                larger.min_by_key(|(_, r)| len(r)).map(|(i, _)| i)
            })?;
        let freed_at = self.list[i].freed_at;
        let mut block = self.remove(i);
        let (mut vmas_before, mut vmas_after) = (0, 0);
        if block.pages.len() > npages {
            vmas_before = block.vmas;
            let tail = split(&mut block, npages);
            vmas_after = block.vmas + tail.vmas;
            self.bytes += tail.len();
            self.list.insert(
                i,
                Recycled {
                    block: tail,
                    freed_at,
                },
            );
        }
        block.seen.fill(0);
        Some(Reused {
            block,
            vmas_before,
            vmas_after,
        })
    }

    /// Recycled blocks smaller than `npages`, all on frames (`on_frames`)
    /// or all anonymous, that together hold `npages`, for an allocation no
    /// single one fits: the most recently freed first, at most `MAX_PIECES`
    /// of them, skipping those `usable` refuses; the last one is cut, its
    /// tail staying recycled. None, and nothing taken, if they do not add
    /// up. The pieces come in the order they are to be laid out, with the
    /// mappings the cut block counted before and after it (0, 0 if none was
    /// cut).
    pub fn gather(
        &mut self,
        npages: usize,
        on_frames: bool,
        usable: impl Fn(&Block) -> bool,
    ) -> Option<(Vec<Block>, usize, usize)> {
        let mut chosen = Vec::new();
        let mut total = 0;
        for (i, r) in self.list.iter().enumerate().rev() {
            if total >= npages || chosen.len() == MAX_PIECES {
                break;
            }
            // Larger blocks are take's to cut (at most four times larger).
            if r.block.pages.len() < npages
                && is_on_frames(&r.block) == on_frames
                && usable(&r.block)
            {
                chosen.push(i);
                total += r.block.pages.len();
            }
        }
        if total < npages {
            return None;
        }
        // The last chosen is the oldest, at the smallest index. Removing
        // from the highest index down keeps the others' indices valid, and
        // the oldest one's tail goes back where it was.
        let last = *chosen.last()?;
        let freed_at = self.list[last].freed_at;
        let mut pieces: Vec<Block> = chosen.iter().map(|&i| self.remove(i)).collect();
        let (mut vmas_before, mut vmas_after) = (0, 0);
        let excess = total - npages;
        if excess > 0 {
            let cut = pieces.last_mut()?;
            vmas_before = cut.vmas;
            let keep = cut.pages.len() - excess;
            let tail = split(cut, keep);
            vmas_after = cut.vmas + tail.vmas;
            self.bytes += tail.len();
            self.list.insert(
                last,
                Recycled {
                    block: tail,
                    freed_at,
                },
            );
        }
        for b in &mut pieces {
            b.seen.fill(0);
        }
        Some((pieces, vmas_before, vmas_after))
    }

    /// Whether `take` would find a block for `npages` of this kind.
    pub fn fits(&self, npages: usize, on_frames: bool) -> bool {
        self.list.iter().any(|r| {
            let n = r.block.pages.len();
            is_on_frames(&r.block) == on_frames && n >= npages && n <= npages * 4
        })
    }

    /// Takes out the blocks that waited longer than `max_age` (oldest first
    /// in the list, so this usually looks at one entry).
    pub fn expired(&mut self, max_age: Duration) -> Vec<Block> {
        let mut out = Vec::new();
        if self.list.is_empty() {
            return out;
        }
        let now = Instant::now();
        while self
            .list
            .first()
            .is_some_and(|r| now.duration_since(r.freed_at) > max_age)
        {
            out.push(self.remove(0));
        }
        out
    }

    /// Takes out every block (before fork).
    pub fn drain(&mut self) -> Vec<Block> {
        self.bytes = 0;
        std::mem::take(&mut self.list)
            .into_iter()
            .map(|r| r.block)
            .collect()
    }
}

/// Most bytes kept for reuse while the program's live blocks hold
/// `live_bytes`: the configured budget, but no more than 16 MiB plus the
/// configured percentage of the live bytes.
pub(crate) fn budget(cfg: &Config, live_bytes: usize) -> usize {
    if cfg.recycle_live_percent == 0 {
        return cfg.recycle_bytes;
    }
    let share = (live_bytes as u128 * cfg.recycle_live_percent as u128 / 100) as usize;
    cfg.recycle_bytes.min(BUDGET_FLOOR + share)
}

/// The recycling budget no program's size takes below (recycle.rs `budget`).
const BUDGET_FLOOR: usize = 16 << 20;

fn recyclable(block: &Block, cfg: &Config) -> bool {
    let own = |p: &Page| matches!(p, Page::Owned(_));
    let anon = |p: &Page| matches!(p, Page::Anon);
    !block.exempt
        && block.len() <= cfg.recycle_bytes / 4
        && (block.pages.iter().all(own) || block.pages.iter().all(anon))
}

/// Whether a recycled block is on frames; a recycled block's pages are all
/// owned frames or all anonymous (`recyclable`).
fn is_on_frames(block: &Block) -> bool {
    matches!(block.pages.first(), Some(Page::Owned(_)))
}

/// Cuts `block` after `n` pages; returns the tail. The kernel's mapping
/// is not split, but each part counts its own (an overcount by one
/// keeps the VMA budget on the safe side).
fn split(block: &mut Block, n: usize) -> Block {
    // SAFETY: callers split at n below the block's page count, so base + n * PAGE is inside
    // the block's mapping.
    let tail_base = unsafe { block.base.add(n * crate::sys::PAGE) };
    let tail = Block::new(tail_base, block.pages.split_off(n));
    block.seen.truncate(n);
    block.vmas = block.count_vmas();
    tail
}
