//! The engine's public face: allocation, free, virtual copy, scans,
//! eviction, what a program does to its blocks besides writing them, and
//! statistics. Each call takes the state's lock (state.rs) and hands the
//! work to the module that does it; this is the top of the crate, the one
//! place that ties the scan to tiering (`evict::tier_chunk`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::clock::Allow;
use crate::config::Config;
use crate::fork;
use crate::placement::Hint;
use crate::state::Inner;
use crate::stats::{EvictReport, Stats};
use crate::store::PageStore;
use crate::sys::{self, PAGE};

/// A handle to one engine; clones share it.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl Engine {
    /// Never fails: without memfd, mmap or userfaultfd the engine degrades to
    /// plain memory or fewer mechanisms and says so in its statistics.
    pub fn new(cfg: Config) -> Engine {
        sys::set_mmap_allowance(cfg.inject.fail_mmap_after);
        crate::race::set(cfg.inject.race_pause_us);
        let inner = Arc::new(Inner::new(cfg));
        fork::register(Arc::downgrade(&inner));
        let e = Engine { inner };
        // With no mechanism a scan serves (folding, merging, releasing the
        // frames of written copies, tiering), there is nothing to scan for.
        let cfg = &e.inner.cfg;
        let scans_serve = cfg.zero || cfg.merge || cfg.copy || cfg.tier != crate::config::Tier::Off;
        if let Some(iv) = cfg.scan_interval.filter(|_| scans_serve) {
            e.start_background(iv);
        }
        e
    }

    /// A zero-filled, page-aligned block of at least `len` bytes; null only if
    /// even plain anonymous memory cannot be had.
    pub fn alloc(&self, len: usize, hint: Hint) -> *mut u8 {
        self.inner.lock().alloc(len, hint)
    }

    /// A block for `len` bytes if the engine takes this allocation; None
    /// leaves it to the caller's own allocator (`Config::plain_below`), or
    /// means that not even plain anonymous memory could be had.
    pub fn take(&self, len: usize, hint: Hint) -> Option<*mut u8> {
        self.inner.lock().take(len, hint, 0)
    }

    /// As `take`, for a caller whose own allocator holds `heap_free` bytes
    /// freed and still resident: a malloc that fits in them is left to it
    /// unless blocks of its size are copied from or yield pages
    /// (`Config::heap_first`).
    pub fn take_beside_heap(&self, len: usize, hint: Hint, heap_free: usize) -> Option<*mut u8> {
        self.inner.lock().take(len, hint, heap_free)
    }

    /// Whether `take_beside_heap` would look at `heap_free` for this
    /// allocation, so a caller can skip counting its heap when not.
    pub fn heap_matters(&self, len: usize, hint: Hint) -> bool {
        crate::placement::heap_first_applies(&self.inner.cfg, len, hint)
    }

    /// Frees a block returned by `alloc` or `take`. False if `ptr` is not one.
    ///
    /// # Safety
    /// No one may use the block afterwards.
    pub unsafe fn free(&self, ptr: *mut u8) -> bool {
        self.inner.lock().free(ptr)
    }

    /// True if `ptr` lies in one of this engine's blocks.
    pub fn owns(&self, ptr: *const u8) -> bool {
        self.inner.lock().find(ptr as usize, 1).is_some()
    }

    /// Start and length in bytes of the block holding `ptr`, if one does.
    pub fn block_of(&self, ptr: *const u8) -> Option<(*mut u8, usize)> {
        let st = self.inner.lock();
        let base = st.find(ptr as usize, 1)?;
        Some((base as *mut u8, st.blocks[&base].len()))
    }

    /// Length in bytes of the block starting at `ptr`.
    pub fn block_len(&self, ptr: *const u8) -> Option<usize> {
        self.inner
            .lock()
            .blocks
            .get(&(ptr as usize))
            .map(|b| b.len())
    }

    /// Copies `len` bytes with memmove semantics. Whole pages between engine
    /// blocks at equal page offsets become copy-on-write views; the rest is
    /// copied plainly.
    ///
    /// # Safety
    /// As for `memmove`: both ranges valid for `len` bytes.
    pub unsafe fn copy(&self, dst: *mut u8, src: *const u8, len: usize) {
        let overlap = (dst as usize) < src as usize + len && (src as usize) < dst as usize + len;
        if !self.inner.cfg.copy || len < PAGE || overlap || crate::fds::lost() {
            std::ptr::copy(src, dst, len);
            return;
        }
        let mut st = self.inner.lock();
        let done = st.virtual_copy(dst, src, len);
        let (dst, src, len) = (dst.add(done), src.add(done), len - done);
        if len > 0 {
            let src_engine = st.find(src as usize, len).is_some();
            let dst_engine = st.find(dst as usize, len).is_some();
            if src_engine || dst_engine {
                st.stats.bytes_copied_plain += len as u64;
            }
            let state = &mut *st;
            if !src_engine {
                state.placement.copied_from_plain(&state.cfg, len);
            } else if !dst_engine {
                state.placement.copied_into_plain(&state.cfg, len);
            }
            let cfg = &self.inner.cfg;
            let untouched = if dst_engine {
                (cfg.zero && cfg.sparse_copy)
                    .then(|| st.untouched_pages(dst as usize, len))
                    .flatten()
            } else {
                let st = &mut *st;
                (cfg.zero && cfg.sparse_heap)
                    .then(|| {
                        st.heap
                            .untouched(st.pagemap.as_ref(), &mut st.stats, dst as usize, len)
                    })
                    .flatten()
            };
            // Other threads need not wait for a plain copy.
            drop(st);
            match untouched {
                Some((first, mut pages)) => {
                    let skipped = crate::copy::copy_skipping_zero(dst, src, len, first, &mut pages);
                    if skipped > 0 {
                        let st = &mut *self.inner.lock();
                        match dst_engine {
                            true => st.stats.zero_pages_not_copied += skipped,
                            false => st.heap.left_out(&mut st.stats, first, &pages),
                        }
                    }
                }
                None => std::ptr::copy_nonoverlapping(src, dst, len),
            }
        }
    }

    /// Sets `len` bytes from `dst` to zero, as memset does, but leaves out
    /// the whole pages that read zero already without being written: in an
    /// engine block an anonymous page never touched (or discarded) and an
    /// owned page whose frame is a hole (copy.rs, as sparse copies do), in
    /// the caller's heap a page never touched (heap.rs). A program that
    /// clears a fresh array it then fills only in part keeps the rest on the
    /// kernel's zero page instead of a page of zeros per 4 KiB, and pays no
    /// fault for it. Returns false, having written nothing, when the range
    /// lies in neither or holds no such page: the caller then sets it itself.
    ///
    /// # Safety
    /// As for memset: `dst` is valid for writes of `len` bytes.
    pub unsafe fn zero(&self, dst: *mut u8, len: usize) -> bool {
        let cfg = &self.inner.cfg;
        if !(cfg.zero && cfg.sparse_zero) || len < PAGE || crate::fds::lost() {
            return false;
        }
        let (untouched, in_block) = {
            let mut st = self.inner.lock();
            let st = &mut *st;
            match st.untouched_pages(dst as usize, len) {
                Some(u) => (Some(u), true),
                None if cfg.sparse_heap && st.find(dst as usize, len).is_none() => (
                    st.heap
                        .untouched(st.pagemap.as_ref(), &mut st.stats, dst as usize, len),
                    false,
                ),
                None => (None, true),
            }
        };
        let Some((first, pages)) = untouched else {
            return false;
        };
        // Outside the lock, as a plain copy is: a page that reads zero stays
        // so whatever a scan does meanwhile (it folds zeros, merges only
        // non-zero content), until the program writes it.
        let skipped = crate::copy::zero_skipping(dst, len, first, &pages);
        let st = &mut *self.inner.lock();
        match in_block {
            true => st.stats.zero_pages_not_written += skipped,
            false => st.heap.left_out(&mut st.stats, first, &pages),
        }
        true
    }

    /// Folds zero pages and merges identical pages now.
    pub fn scan(&self) -> crate::stats::ScanReport {
        crate::scan::scan(&self.inner, crate::evict::tier_chunk)
    }

    /// Scans every `interval`, never using more than the configured fraction of a core.
    pub fn start_background(&self, interval: Duration) {
        let mut bg = self.inner.bg.lock().unwrap_or_else(|e| e.into_inner());
        if bg.is_some() {
            return;
        }
        self.inner.bg_stop.store(false, Ordering::SeqCst);
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        let budget = self.inner.cfg.scan_cpu_budget;
        *bg = std::thread::Builder::new()
            .name("pagefold-scan".into())
            .spawn(move || {
                crate::scan::background(weak, interval, budget, crate::evict::tier_chunk)
            })
            .ok();
    }

    /// Gives the engine the caller's way to give memory back while memory is
    /// short: the preload trims glibc's heap, whose freed chunks stay
    /// resident (or in swap) until reused. With pressure-driven tiering the
    /// background scanner calls `relief` on its own thread, outside the
    /// engine's lock, at most once a clock interval while memory is short
    /// (pressure.rs); `clock.reliefs` counts the calls and
    /// `clock.reliefs_released` those that released memory. Only the first
    /// call sets it.
    pub fn on_memory_short(&self, relief: fn() -> bool) {
        let _ = self.inner.relief.set(relief);
    }

    /// Wakes the background scanner now (e.g. after a burst of frees, when
    /// an interpreter's garbage collector has just run). No effect without one.
    pub fn request_scan(&self) {
        if let Some(h) = self
            .inner
            .bg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            h.thread().unpark();
        }
    }

    pub fn stop_background(&self) {
        self.inner.bg_stop.store(true, Ordering::SeqCst);
        if let Some(h) = self
            .inner
            .bg
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            h.thread().unpark();
            let _ = h.join();
        }
    }

    pub fn stats(&self) -> Stats {
        self.inner.lock().snapshot()
    }

    /// Evicts what it may of the pages overlapping `[ptr, ptr+len)`: their
    /// content goes to the page store and their memory is freed; any later
    /// touch restores them. A hint: never changes what the program reads.
    pub fn evict(&self, ptr: *const u8, len: usize) -> EvictReport {
        self.evict_with(ptr, len, Allow::ALL)
    }

    /// As `evict`, with only the mechanisms `allow` names: a page neither
    /// may take stays in memory.
    pub fn evict_with(&self, ptr: *const u8, len: usize, allow: Allow) -> EvictReport {
        crate::evict::evict_with(&self.inner, ptr, len, allow)
    }

    /// Replaces the page store (e.g. with the tier crate's). Refused (false)
    /// while any page is evicted or awaits reconciling.
    pub fn set_store(&self, store: Arc<dyn PageStore>) -> bool {
        self.inner.lock().set_store(store)
    }

    /// Indexes the pages overlapping `[ptr, ptr+len)` as candidate references
    /// for patching (pages the program or a policy expects to stay in memory
    /// while similar ones are evicted). Only pages on frames qualify (owned or
    /// shared); returns how many were indexed. A hint: changes no page.
    pub fn note_references(&self, ptr: *const u8, len: usize) -> u64 {
        let (start, end) = (ptr as usize, (ptr as usize).saturating_add(len));
        self.inner.lock().note_references(start, end)
    }

    /// Makes the engine pages of `[ptr, ptr+len)` read zero and releases their
    /// memory, as MADV_DONTNEED does on private anonymous memory. `ptr` must be
    /// page-aligned; `len` is rounded up to whole pages. Returns the parts of
    /// the range the engine left alone, as (start, len): outside its blocks
    /// (or, should the kernel refuse, plain anonymous memory inside them). The
    /// caller passes those to the kernel.
    pub fn discard(&self, ptr: *mut u8, len: usize) -> Vec<(usize, usize)> {
        let start = ptr as usize;
        match crate::advice::page_range(start, len) {
            Some(end) => self.inner.lock().discard(start, end),
            None => vec![(start, len)],
        }
    }

    /// True if `[ptr, ptr+len)` overlaps one of this engine's blocks.
    pub fn overlaps(&self, ptr: *const u8, len: usize) -> bool {
        let start = ptr as usize;
        let end = start.saturating_add(len.max(1));
        !self.inner.lock().overlapping(start, end).is_empty()
    }

    /// Takes the blocks overlapping `[ptr, ptr+len)` out of the engine's hands
    /// before the program changes their protection or per-mapping flags:
    /// their content moves onto plain anonymous memory and they are never
    /// scanned, remapped or shared again (until freed). True if any block overlapped.
    pub fn exempt(&self, ptr: *const u8, len: usize) -> bool {
        let start = ptr as usize;
        let end = start.saturating_add(len.max(1));
        let mut st = self.inner.lock();
        let bases = st.overlapping(start, end);
        for &base in &bases {
            st.exempt_block(base);
        }
        !bases.is_empty()
    }

    /// The program ran out of mappings (a call of its own failed with
    /// ENOMEM at `vm.max_map_count`): the engine gives back the mappings it
    /// added. Recycled blocks are released, then blocks split into several
    /// mappings move onto one anonymous mapping each, most split first (their
    /// sharing is given up: they cost what plain memory would). The program's
    /// mappings are counted afresh, and from then on the engine's blocks use
    /// no more mappings than they hold after giving back (a scan splitting
    /// them again would take back what the program was given).
    /// Returns how many mappings were given back (0: retrying cannot help).
    pub fn give_back_mappings(&self) -> usize {
        let mut st = self.inner.lock();
        st.give_back_mappings()
    }

    /// Cuts the block at `ptr` down to the pages covering `len` bytes; the
    /// pages beyond are unmapped and their frames released (realloc to a
    /// smaller size). False if `ptr` is not a block or the kernel refused.
    pub fn shrink(&self, ptr: *mut u8, len: usize) -> bool {
        self.inner
            .lock()
            .shrink(ptr as usize, len.max(1).div_ceil(PAGE))
    }
}
