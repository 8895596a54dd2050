//! Placement: whether the engine takes an allocation or leaves it to the
//! caller's own allocator, whether a fresh block starts on memfd frames or
//! anonymous memory, and what plain copies teach the size classes about both.
//!
//! The decisions read what the engine learnt per size class from copies
//! (fresh.rs, `Placement`, in whose table they also count allocations and
//! copies), what scans found in blocks of a size (sample.rs, `ClassYields`),
//! the freed blocks kept for reuse (recycle.rs) and the configuration, all
//! passed in. They only decide: the page table (state.rs) gathers their
//! inputs, asks, and acts on the answer (maps the memory, counts the
//! statistics).

use crate::config::{Config, HeapFirst};
use crate::fresh::{Fresh, Lifetime, Placement};
use crate::recycle::Recycler;
use crate::sample::ClassYields;
use crate::space::Block;
use crate::sys::PAGE;

/// How a block will be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    None,
    /// The caller writes every page at once: populate now instead of one fault per page.
    FullWrite,
    /// The caller needs no zeroed memory (malloc): a recently freed block of
    /// the same size may come back as it was (see recycle.rs).
    Uninit,
    /// Both: the caller writes every byte before it reads one (the result of
    /// a computation into a new buffer). A recently freed block may come
    /// back as it was; fresh memory is populated at once.
    UninitFullWrite,
    /// The caller asked for zeroed memory (calloc) and may read pages it never
    /// writes: the block starts where `Config::fresh_zeroed` says (fresh.rs).
    Zeroed,
}

/// What the engine does with an allocation offered to it (`Placement::take`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Taking {
    /// Left to the caller's heap, which holds enough freed memory to serve
    /// it (`Placement::leave_to_heap`).
    LeftToHeap,
    /// Below `Config::plain_below`, of a class not worth taking: left to
    /// the caller's own allocator.
    Declined,
    /// The engine allocates a block for it.
    Taken,
}

/// Whether `Config::heap_first` covers a `len`-byte allocation asked with
/// `hint` (`Placement::leave_to_heap`): mallocs only, of the configured
/// sizes. With `plain_below` 0 (the engine takes every allocation) `Large`
/// covers none.
pub(crate) fn heap_first_applies(cfg: &Config, len: usize, hint: Hint) -> bool {
    let sized = match cfg.heap_first {
        HeapFirst::Off => false,
        HeapFirst::Large => cfg.plain_below > 0 && len >= cfg.plain_below,
        HeapFirst::Every => true,
    };
    sized && hint == Hint::Uninit
}

/// Where a fresh block asked for with `hint` starts (fresh.rs).
fn fresh_policy(cfg: &Config, hint: Hint) -> Fresh {
    match hint {
        Hint::Zeroed => cfg.fresh_zeroed,
        _ => cfg.fresh,
    }
}

impl Placement {
    /// Whether the engine takes a `len`-byte allocation asked with `hint`,
    /// or leaves it to the caller's own allocator (`Config::plain_below`):
    /// below that size, a block of a class that is seldom copied from gains
    /// little from being the engine's, and costs a fresh mapping where the
    /// caller's heap would reuse memory it has already faulted in (fresh.rs,
    /// `worth_taking`). The allocation not taken is still counted for its
    /// class, so that copies of blocks of that size (`copied_from_plain`)
    /// can bring the class back to the engine.
    ///
    /// At `plain_below` and above, a malloc that fits in the `heap_free`
    /// bytes the caller's allocator holds freed is left to it
    /// (`leave_to_heap`).
    pub(crate) fn take(
        &mut self,
        cfg: &Config,
        len: usize,
        hint: Hint,
        heap_free: usize,
        yields: &ClassYields,
        recycler: &Recycler,
    ) -> Taking {
        let npages = len.max(1).div_ceil(PAGE);
        if self.leave_to_heap(cfg, len, hint, heap_free, yields, recycler) {
            self.on_frames(Fresh::Adaptive, npages);
            return Taking::LeftToHeap;
        }
        if len < cfg.plain_below
            && fresh_policy(cfg, hint) == Fresh::Adaptive
            && (crate::fds::lost() || !self.worth_taking(npages, cfg.take_first))
        {
            self.on_frames(Fresh::Adaptive, npages);
            return Taking::Declined;
        }
        Taking::Taken
    }

    /// Whether a malloc of `len` bytes, at least `Config::plain_below`, is
    /// better left to the caller's heap, which holds `heap_free` bytes freed
    /// (`Config::heap_first`). glibc maps such a request only when no freed
    /// chunk fits it: R frees its 42 MiB design matrices into glibc's heap
    /// and the next one of that size is carved out of memory that is still
    /// resident. An engine block faults in every page afresh, and the freed
    /// heap stays resident beside it: taking those blocks cost glm 79 MB of
    /// peak and 50,000 faults. So the engine leaves such a malloc to the
    /// heap unless blocks of its size are copied from (a copy of an engine
    /// block is virtual), the last block of its size a scan judged was
    /// fruitful (its zero or duplicate pages fold; `yields`, sample.rs), or
    /// a recycled block of its own fits it. Below `plain_below`, `take`'s own
    /// rule decides: its first blocks of a size are taken to learn what the
    /// size yields, heap or not (they hold most of what R's random forest
    /// folds), unless `HeapFirst::Every` leaves those to the heap too.
    /// Only malloc: calloc from the heap must clear what it reuses, where a
    /// fresh block reads as zero for free.
    fn leave_to_heap(
        &self,
        cfg: &Config,
        len: usize,
        hint: Hint,
        heap_free: usize,
        yields: &ClassYields,
        recycler: &Recycler,
    ) -> bool {
        if !heap_first_applies(cfg, len, hint) || heap_free < len {
            return false;
        }
        let npages = len.max(1).div_ceil(PAGE);
        fresh_policy(cfg, hint) == Fresh::Adaptive
            && !self.copied_often(npages)
            && !yields.fruitful(npages)
            && !recycler.fits(npages, self.would_be_on_frames(Fresh::Adaptive, npages))
    }

    /// The kind of recycled block that may serve an allocation of `npages`
    /// asked with `hint`: Some(on frames or not, as a fresh block would
    /// start now) for a malloc, None for any other hint (recycled memory is
    /// not zeroed). Counts nothing.
    pub(crate) fn recycled_kind(
        &self,
        cfg: &Config,
        hint: Hint,
        npages: usize,
        frames_usable: bool,
    ) -> Option<bool> {
        matches!(hint, Hint::Uninit | Hint::UninitFullWrite)
            .then(|| frames_usable && self.would_be_on_frames(fresh_policy(cfg, hint), npages))
    }

    /// Whether a fresh block of `npages` asked with `hint` starts on frames;
    /// counts the allocation for its class while frames are usable.
    pub(crate) fn fresh_on_frames(
        &mut self,
        cfg: &Config,
        hint: Hint,
        npages: usize,
        frames_usable: bool,
    ) -> bool {
        frames_usable && self.on_frames(fresh_policy(cfg, hint), npages)
    }

    /// A plain copy of `len` bytes out of memory that is not the engine's:
    /// if allocations of its size were declined (`take`), the size classes
    /// its source block may have (the copy's length in pages, or one more
    /// for an allocation header) count a copy, as an engine block's would,
    /// unless copies into the class were mostly written over.
    pub(crate) fn copied_from_plain(&mut self, cfg: &Config, len: usize) {
        let heap_first = cfg.heap_first != HeapFirst::Off;
        if cfg.plain_below == 0 || (len >= cfg.plain_below && !heap_first) {
            return;
        }
        self.count_copy_of_length(cfg, len);
    }

    /// A plain copy of `len` bytes out of an engine block into memory that
    /// is not the engine's. At or above `plain_below` under heap first the
    /// destination was likely left to the caller's heap (`leave_to_heap`),
    /// and the copy could not map: numpy's `x.copy()` of a 64 MB vector
    /// allocates its destination just before. So the size classes of its
    /// length count a copy, and the next allocations of that size are the
    /// engine's, whose copies map.
    pub(crate) fn copied_into_plain(&mut self, cfg: &Config, len: usize) {
        if cfg.heap_first == HeapFirst::Off || len < cfg.plain_below {
            return;
        }
        self.count_copy_of_length(cfg, len);
    }

    /// The size classes a block copied in full for `len` bytes may have (the
    /// length in pages, or one more for an allocation header) count a copy,
    /// unless copies into the class were mostly written over.
    fn count_copy_of_length(&mut self, cfg: &Config, len: usize) {
        for npages in [len.div_ceil(PAGE), len.div_ceil(PAGE) + 1] {
            if !(cfg.copy_learn && self.copies_wasted(npages)) {
                self.copied_from(npages);
            }
        }
    }

    /// A freed block into which a copy shared pages still unwritten: if the
    /// copy died young, its class learns it (fresh.rs, `freed_after_copy`).
    /// Returns the pages that counted as freed young (0 if none did).
    pub(crate) fn judge_copy_lifetime(&mut self, cfg: &Config, block: &Block) -> usize {
        let Some(at) = block.shared_at.filter(|_| cfg.copy_learn) else {
            return 0;
        };
        let rule = Lifetime {
            young: cfg.copy_young,
            below_pages: cfg.plain_below.div_ceil(PAGE),
        };
        let unwritten = block.copy_shared;
        if self.freed_after_copy(block.pages.len(), unwritten, at.elapsed(), rule) {
            unwritten
        } else {
            0
        }
    }
}
