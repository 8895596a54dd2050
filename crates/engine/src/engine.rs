//! The engine's public face and its state: allocation, free, virtual copy and
//! statistics. Scanning lives in scan.rs, fork handling in fork.rs.
//!
//! All state sits behind one mutex. Operations are short (a few system calls
//! per run of pages), and the scanner takes the lock per chunk, so program
//! threads interleave with a running scan.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use crate::config::Config;
use crate::fault::Evictions;
use crate::frames::{FrameId, Pool};
use crate::index::ContentIndex;
use crate::protect::Protector;
use crate::space::{runs, unit_runs, Block, Page, Restores};
use crate::stats::Stats;
use crate::{fork, sys, PAGE};

/// How a block will be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    None,
    /// The caller writes every page at once: populate now instead of one fault per page.
    FullWrite,
    /// The caller needs no zeroed memory (malloc): a recently freed block of
    /// the same size may come back as it was (see recycle.rs).
    Uninit,
}

/// What one scan did.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ScanReport {
    pub pages_scanned: u64,
    pub zero_folded: u64,
    pub merged: u64,
    pub diverged_released: u64,
    /// Merges or folds skipped because the VMA budget was spent.
    pub skipped_vma: u64,
    /// Planned folds and merges dropped because the page changed during the pin grace.
    pub changed_while_planned: u64,
    /// Pages left alone because they changed since the previous scan.
    pub volatile: u64,
    /// Pages not looked at: earlier looks found nothing to do (smart scan).
    pub skipped_idle: u64,
    /// Owned pages frozen, and diverged and owned zero pages held (hold.rs),
    /// to be folded or merged once the pin age has passed.
    pub frozen: u64,
    /// Blocks handed to kernel KSM after this scan (ksm.rs).
    pub ksm_handed: u64,
    /// This scan was a clock pass (clock.rs); what it classified and evicted.
    pub pass: bool,
    pub clock: crate::clock::PassCounts,
    pub wall_ns: u64,
    pub cpu_ns: u64,
}

/// A handle to one engine; clones share it.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub cfg: Config,
    pub state: Mutex<State>,
    pub bg_stop: AtomicBool,
    pub bg: Mutex<Option<std::thread::JoinHandle<()>>>,
}

pub(crate) struct State {
    /// Frame pools; the last one takes new allocations unless retired.
    pub pools: Vec<Pool>,
    pub blocks: BTreeMap<usize, Block>,
    /// Freed blocks kept for reuse, oldest first, and their total length (recycle.rs).
    pub recycled: Vec<crate::recycle::Recycled>,
    pub recycled_bytes: usize,
    /// The engine's userfaultfd (shared with the fault thread).
    pub protector: Option<Arc<Protector>>,
    /// Where the pin guard moves pages (detach.rs); made on first use.
    pub scratch: Option<crate::detach::Scratch>,
    /// The kernel refused the pin guard's first move: not tried again.
    pub pin_guard_missing: bool,
    /// Frames a scan froze from owned pages less than `pin_age` ago, and when.
    pub young_frames: HashMap<FrameId, std::time::Instant>,
    /// Pages that diverged less than `pin_age` ago (by address), and when.
    pub young_pages: HashMap<usize, std::time::Instant>,
    /// Pages held write-protected (hold.rs), and since when; the
    /// fault thread's table says which holds no write has ended yet.
    pub holds: crate::hold::Holds,
    /// Holds were wanted without a fault thread: counted once.
    pub hold_missing: bool,
    /// A scan told the fault thread it works on a chunk with holds.
    pub hold_scanning: bool,
    /// Evicted pages and their store (evict.rs, fault.rs); made on first use.
    pub evictions: Option<Arc<Evictions>>,
    /// `evictions` has a real page store (not `NoStore`, made for holds).
    pub has_store: bool,
    /// Similarity detection and reference pins (patching.rs); made on first use.
    pub patching: Option<crate::patching::Patching>,
    /// The thread restoring evicted pages, once eviction was used.
    pub fault_thread: Option<std::thread::JoinHandle<()>>,
    pub pagemap: Option<sys::Pagemap>,
    /// Mappings kept to be given up when the process runs out (advice.rs).
    pub spare_mappings: Option<usize>,
    /// Counts the process's mappings; kept open so no scan opens a file.
    pub proc_maps: Option<sys::ProcMaps>,
    /// Frozen frames by content (kernel KSM's stable tree).
    pub stable: ContentIndex<FrameId>,
    /// Mappings used by all blocks.
    pub vmas: usize,
    /// Mappings the rest of the process used at the last look.
    pub other_maps: usize,
    pub max_map: usize,
    /// Most mappings the engine's blocks may use (`Config::vma_budget_for`).
    pub vma_budget: usize,
    /// Remaps since `other_maps` was read; our count can drift from the kernel's.
    pub remaps_since_count: usize,
    /// A scan has blocks registered with userfaultfd.
    pub scanning: bool,
    /// This scan may hand blocks to kernel KSM: the handoff is on and ksmd
    /// runs (ksm.rs).
    pub ksm_ready: bool,
    /// The tiering clock's state between passes.
    pub clock: crate::clock::Clock,
    /// What copies taught about where fresh blocks should start (fresh.rs).
    pub placement: crate::fresh::Placement,
    pub stats: Stats,
    pub cfg: Config,
}

impl Engine {
    /// Never fails: without memfd, mmap or userfaultfd the engine degrades to
    /// plain memory or fewer mechanisms and says so in its statistics.
    pub fn new(cfg: Config) -> Engine {
        sys::set_mmap_allowance(cfg.inject.fail_mmap_after);
        crate::race::set(cfg.inject.race_pause_us);
        let state = State::new(cfg.clone());
        let inner = Arc::new(Inner {
            cfg,
            state: Mutex::new(state),
            bg_stop: AtomicBool::new(false),
            bg: Mutex::new(None),
        });
        fork::register(Arc::downgrade(&inner));
        let e = Engine { inner };
        if let Some(iv) = e.inner.cfg.scan_interval {
            e.start_background(iv);
        }
        e
    }

    /// A zero-filled, page-aligned block of at least `len` bytes; null only if
    /// even plain anonymous memory cannot be had.
    pub fn alloc(&self, len: usize, hint: Hint) -> *mut u8 {
        self.inner.lock().alloc(len, hint)
    }

    /// Frees a block returned by `alloc`. False if `ptr` is not one.
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
        if !st.virtual_copy(dst, src, len) {
            let engine_memory =
                st.find(src as usize, len).is_some() || st.find(dst as usize, len).is_some();
            if engine_memory {
                st.stats.bytes_copied_plain += len as u64;
            }
            // Other threads need not wait for a plain copy.
            drop(st);
            std::ptr::copy_nonoverlapping(src, dst, len);
        }
    }

    /// Folds zero pages and merges identical pages now.
    pub fn scan(&self) -> crate::ScanReport {
        crate::scan::scan(&self.inner)
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
            .spawn(move || crate::scan::background(weak, interval, budget))
            .ok();
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
}

impl Inner {
    /// The state, even if a panic poisoned the lock: the state is updated
    /// only after the system calls it describes succeeded.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.bg_stop.store(true, Ordering::SeqCst);
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        // The fault thread stays while anything is still evicted; held pages
        // are let go, as no scan will come back for them.
        if let Some(ev) = &st.evictions {
            let held = ev.lock().held.take_all();
            if let Some(p) = &st.protector {
                for a in held {
                    let _ = p.unprotect(a as *const u8, crate::PAGE);
                }
            }
            ev.stop.store(true, Ordering::SeqCst);
        }
    }
}

impl State {
    fn new(cfg: Config) -> State {
        let mut stats = Stats::default();
        let pools = match Self::open_pool(&cfg) {
            Ok(p) => vec![p],
            Err(_) => {
                if cfg.frames {
                    stats.fallbacks.memfd += 1;
                }
                Vec::new()
            }
        };
        let protector = State::open_protector(&cfg);
        let max_map = cfg.inject.max_map_count.unwrap_or_else(sys::max_map_count);
        let proc_maps = sys::ProcMaps::open().ok();
        let other_maps = proc_maps.as_ref().map_or(0, sys::ProcMaps::count);
        State {
            pools,
            blocks: BTreeMap::new(),
            recycled: Vec::new(),
            recycled_bytes: 0,
            protector,
            scratch: None,
            pin_guard_missing: false,
            young_frames: HashMap::new(),
            young_pages: HashMap::new(),
            holds: crate::hold::Holds::default(),
            hold_missing: false,
            hold_scanning: false,
            evictions: None,
            has_store: false,
            patching: None,
            fault_thread: None,
            pagemap: sys::Pagemap::open().ok(),
            proc_maps,
            spare_mappings: sys::map_spares().map(|p| p as usize),
            stable: ContentIndex::default(),
            vmas: 0,
            other_maps,
            max_map,
            vma_budget: cfg.vma_budget_for(max_map),
            remaps_since_count: 0,
            scanning: false,
            ksm_ready: false,
            clock: Default::default(),
            placement: Default::default(),
            stats,
            cfg,
        }
    }

    /// The userfaultfd, with MISSING mode unless injected away.
    pub fn open_protector(cfg: &Config) -> Option<Arc<Protector>> {
        if cfg.inject.fail_uffd {
            return None;
        }
        Protector::open_with(!cfg.inject.fail_uffd_missing)
            .ok()
            .map(Arc::new)
    }

    pub fn open_pool(cfg: &Config) -> std::io::Result<Pool> {
        if !cfg.frames {
            return Err(std::io::Error::other("frames disabled"));
        }
        if cfg.inject.fail_memfd {
            return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
        }
        Pool::create()
    }

    /// The pool taking new allocations, if any.
    pub(crate) fn current_pool(&self) -> Option<usize> {
        self.pools
            .last()
            .filter(|p| !p.retired)
            .map(|_| self.pools.len() - 1)
    }

    /// The block containing `[addr, addr+len)`, by its base.
    pub fn find(&self, addr: usize, len: usize) -> Option<usize> {
        let (&base, b) = self.blocks.range(..=addr).next_back()?;
        b.contains(addr, len).then_some(base)
    }

    pub fn alloc(&mut self, len: usize, hint: Hint) -> *mut u8 {
        let npages = len.max(1).div_ceil(PAGE);
        self.expire_recycled();
        if hint == Hint::Uninit {
            if let Some(block) = self.reuse(npages) {
                let ptr = block.base;
                self.blocks.insert(ptr as usize, block);
                return ptr;
            }
        }
        let on_frames = !crate::fds::lost() && self.placement.on_frames(self.cfg.fresh, npages);
        let (ptr, pages) = match on_frames.then(|| self.alloc_frames(npages)).flatten() {
            Some(x) => x,
            None => match self.map_anonymous(npages) {
                Some(p) => (p, vec![Page::Anon; npages]),
                None => return std::ptr::null_mut(),
            },
        };
        if hint == Hint::FullWrite {
            let _ = sys::madvise(ptr, npages * PAGE, libc::MADV_POPULATE_WRITE);
        }
        let block = Block::new(ptr, pages);
        self.stats.fresh_pages += npages as u64;
        self.vmas += block.vmas;
        self.blocks.insert(ptr as usize, block);
        ptr
    }

    /// `npages` of fresh anonymous memory. If memory or address space ran out
    /// while freed blocks are kept for reuse, they are given back first (as
    /// glibc trims its heap) and the mapping is tried again: the program must
    /// not fail where plain memory would not.
    fn map_anonymous(&mut self, npages: usize) -> Option<*mut u8> {
        let map = || sys::map(std::ptr::null_mut(), npages * PAGE, None, 0, false, false);
        match map() {
            Ok(p) => Some(p),
            Err(_) if !self.recycled.is_empty() => {
                self.flush_recycled();
                map().ok()
            }
            Err(_) => None,
        }
    }

    /// A fresh run of owned frames mapped shared; None (counted) on any failure.
    fn alloc_frames(&mut self, npages: usize) -> Option<(*mut u8, Vec<Page>)> {
        let pi = self.current_pool()?;
        let Some(slot) = self.pools[pi].alloc(npages as u64) else {
            self.stats.fallbacks.frames += 1;
            return None;
        };
        match sys::map(
            std::ptr::null_mut(),
            npages * PAGE,
            Some(self.pools[pi].fd),
            slot,
            true,
            false,
        ) {
            Ok(p) => {
                self.colour(pi, slot, npages);
                let pool = &mut self.pools[pi];
                let pages = (0..npages as u64)
                    .map(|i| {
                        pool.map(slot + i);
                        Page::Owned(FrameId::new(pi, slot + i))
                    })
                    .collect();
                Some((p, pages))
            }
            Err(_) => {
                self.pools[pi].abandon(slot, npages as u64);
                self.stats.fallbacks.mmap += 1;
                None
            }
        }
    }

    /// With page colouring on, backs the fresh slots `[slot, slot + n)` with
    /// pages of the bank set and counts what that cost (colour.rs).
    fn colour(&mut self, pi: usize, slot: u64, n: usize) {
        let Some(c) = &self.cfg.banks else { return };
        let out = crate::colour::colour_slots(
            &self.pools[pi],
            slot,
            n,
            c,
            self.pagemap.as_ref(),
            self.cfg.inject.hide_pfns,
        );
        self.stats.coloured_pages += out.coloured;
        self.stats.colour_rejected += out.rejected;
        self.stats.colour_unmet += out.unmet;
        self.stats.colour_ns += out.ns;
        if !out.met() {
            self.stats.fallbacks.banks += 1;
        }
    }

    /// Registers a range for write protection. Ranges are registered only
    /// while a scan works on them: a registered range loses the kernel's
    /// fault-around (a first read costs 1.0 instead of 0.16 us per page).
    pub fn register(&self, addr: *mut u8, len: usize) -> bool {
        self.protector
            .as_ref()
            .is_some_and(|p| p.register(addr, len).is_ok())
    }

    pub fn unregister(&mut self, addr: *mut u8, len: usize) {
        self.drop_holds(addr as usize, len);
        if let Some(p) = &self.protector {
            let _ = p.unregister(addr, len);
        }
    }

    pub fn free(&mut self, ptr: *mut u8) -> bool {
        if self
            .blocks
            .get(&(ptr as usize))
            .is_some_and(|b| b.copy_shared > 0)
        {
            // What the program wrote of a copy decides how its next copies are made.
            let n = self.blocks[&(ptr as usize)].pages.len();
            self.refresh_divergence(ptr as usize, 0, n);
        }
        let Some(block) = self.blocks.remove(&(ptr as usize)) else {
            return false;
        };
        self.free_block(block);
        true
    }

    /// Unmaps a block and lets go of its frames.
    pub(crate) fn release_block(&mut self, block: Block) {
        sys::unmap(block.base, block.len());
        self.drop_holds(block.base as usize, block.len());
        self.forget_evicted(&block, 0, block.pages.len());
        self.vmas -= block.vmas;
        self.drop_pages(&block.pages);
    }

    /// Pages that no longer map what they mapped: frames whose content
    /// nobody needs are punched, slots nothing maps go back for reuse.
    pub fn drop_pages(&mut self, old: &[Page]) {
        let mut punch = Vec::new();
        let mut reuse = Vec::new();
        for p in old {
            let (f, content) = match *p {
                Page::Owned(f) | Page::Shared(f) | Page::Evicted(Restores::Owned(f)) => (f, true),
                Page::Diverged(f) | Page::Evicted(Restores::Diverged(f)) => (f, false),
                Page::Anon | Page::Evicted(Restores::Anon) => continue,
            };
            match self.pools[f.pool()].unmap(f.slot(), content) {
                (_, true) => reuse.push(f),
                (true, false) => punch.push(f),
                _ => {}
            }
        }
        self.release(punch, false);
        self.release(reuse, true);
        // Forgotten evicted pages may have been patches.
        self.settle_pins();
    }

    /// Punches frames (in runs); with `reuse` their slots are free again.
    pub(crate) fn release(&mut self, mut frames: Vec<FrameId>, reuse: bool) {
        frames.sort_unstable();
        let mut i = 0;
        while i < frames.len() {
            let mut j = i + 1;
            while j < frames.len() && frames[j].0 == frames[i].0 + (j - i) as u64 {
                j += 1;
            }
            self.pools[frames[i].pool()].release(frames[i].slot(), (j - i) as u64, reuse);
            i = j;
        }
        self.pools.iter_mut().for_each(Pool::close_if_idle);
    }

    /// Whether `cost` more mappings fit in the budget. Looks at the real
    /// mapping count once more before saying no.
    pub fn vma_room(&mut self, cost: usize) -> bool {
        let fits = |s: &State| {
            let limit = s
                .vma_budget
                .min(s.max_map.saturating_sub(s.cfg.vma_reserve + s.other_maps));
            s.vmas + s.hold_vmas() + cost <= limit
        };
        if fits(self) {
            return true;
        }
        // Reading /proc/self/maps costs milliseconds at tens of thousands of
        // mappings: only when our own count has changed since the last read.
        if self.remaps_since_count == 0 {
            return false;
        }
        self.refresh_other_maps();
        fits(self)
    }

    pub fn refresh_other_maps(&mut self) {
        self.remaps_since_count = 0;
        let maps = self.proc_maps.as_ref().map_or(0, sys::ProcMaps::count);
        self.other_maps = maps.saturating_sub(self.vmas);
    }

    /// Maps pages `[i, i+n)` of block `base` privately onto frames from `first`
    /// (or anonymous memory if `first` is None), replacing what was there, and
    /// updates page states, frame counts and the mapping count.
    pub fn remap(&mut self, base: usize, i: usize, n: usize, first: Option<FrameId>) -> bool {
        let cost = self.blocks[&base].remap_growth(i, n, first);
        if !self.vma_room(cost) {
            self.stats.fallbacks.vma_budget += 1;
            return false;
        }
        let addr = self.blocks[&base].page_addr(i);
        let (fd, slot) = match first {
            Some(f) => (Some(self.pools[f.pool()].fd), f.slot()),
            None => (None, 0),
        };
        if sys::map(addr, n * PAGE, fd, slot, false, true).is_err() {
            self.stats.fallbacks.mmap += 1;
            return false;
        }
        self.record_remap(base, i, n, first);
        true
    }

    /// Page states, frame counts and mapping count after pages `[i, i+n)`
    /// were remapped onto frames from `first` (or anonymous memory).
    pub fn record_remap(&mut self, base: usize, i: usize, n: usize, first: Option<FrameId>) {
        // New mappings are counted before old ones are dropped: a page frozen
        // onto its own frame must not see it reach zero in between.
        if let Some(f) = first {
            for k in 0..n as u64 {
                self.pools[f.pool()].map(f.slot() + k);
            }
        }
        let old: Vec<Page> = self.blocks[&base].pages[i..i + n].to_vec();
        self.forget_evicted(&self.blocks[&base], i, n);
        self.drop_pages(&old);
        let addr = self.blocks[&base].page_addr(i);
        self.drop_holds(addr as usize, n * PAGE);
        // A fresh mapping is not registered: inside a scan it must be, or
        // unprotecting its chunk would stop at it.
        if self.scanning {
            self.register(addr, n * PAGE);
        }
        let block = self
            .blocks
            .get_mut(&base)
            .expect("block vanished under the lock");
        let before = block.boundaries(i, n);
        for k in 0..n {
            let page = match first {
                Some(f) => Page::Shared(f.offset(k as u64)),
                None => Page::Anon,
            };
            block.set(i + k, page);
        }
        let after = block.boundaries(i, n);
        block.vmas = block.vmas + after - before;
        self.vmas = self.vmas + after - before;
        self.remaps_since_count += 1;
        // The program's own mappings are re-counted from /proc/self/maps,
        // whose read costs time in proportion to the mappings: every 1,024
        // remaps, or every eighth of the engine's mappings when it holds
        // more, so the reads stay a small share of the remaps at any count.
        if self.remaps_since_count >= (self.vmas / 8).max(1024) {
            self.refresh_other_maps();
        }
    }

    /// Re-reads divergence of the shared pages `[i, i+n)` of a block from
    /// pagemap; frames of diverged pages lose their reference.
    pub fn refresh_divergence(&mut self, base: usize, i: usize, n: usize) -> u64 {
        let block = &self.blocks[&base];
        if !block.pages[i..i + n]
            .iter()
            .any(|p| matches!(p, Page::Shared(_)))
        {
            return 0;
        }
        let Some(pm) = &self.pagemap else { return 0 };
        let mut entries = vec![0u64; n];
        if pm.read(block.page_addr(i), &mut entries).is_err() {
            return 0;
        }
        let block = self
            .blocks
            .get_mut(&base)
            .expect("block vanished under the lock");
        let mut released = Vec::new();
        let mut diverged_now = Vec::new();
        for (k, e) in entries.iter().enumerate() {
            if let Page::Shared(f) = block.pages[i + k] {
                if sys::is_diverged(*e) {
                    block.set(i + k, Page::Diverged(f));
                    // A copy forced by a pin is a write to come: not settled
                    // before a scan has seen the page diverged.
                    let seen = crate::idle::with_look(block.seen[i + k], 0);
                    block.seen[i + k] = crate::clock::written(seen);
                    released.push(f);
                    diverged_now.push(block.page_addr(i + k) as usize);
                }
            }
        }
        let n_released = released.len() as u64;
        if block.copy_shared > 0 {
            let written = block.copy_shared.min(released.len());
            block.copy_shared -= written;
            let npages = block.pages.len();
            self.placement.written_after_copy(npages, written);
        }
        let punch: Vec<FrameId> = released
            .into_iter()
            .filter(|f| self.pools[f.pool()].diverge(f.slot()))
            .collect();
        self.release(punch, false);
        self.stats.diverged_released += n_released;
        if !self.cfg.pin_age.is_zero() {
            let now = std::time::Instant::now();
            self.young_pages
                .extend(diverged_now.into_iter().map(|a| (a, now)));
        }
        n_released
    }

    /// Makes the owned pages in `[i, i+n)` shared (frozen) by remapping them
    /// privately in place; their content stays in the frames.
    pub fn freeze(&mut self, base: usize, i: usize, n: usize) {
        let owned = |s: &State, k: usize| match s.blocks[&base].pages[k] {
            Page::Owned(f) => Some(f),
            _ => None,
        };
        for (a, b) in runs(i..i + n, |k| owned(self, k)) {
            let first = owned(self, a).expect("run starts owned");
            if self.remap(base, a, b - a, Some(first)) {
                for k in 0..(b - a) as u64 {
                    self.pools[first.pool()].freeze(first.slot() + k);
                }
            }
        }
    }

    /// The copy proper; false if nothing in it can be virtual (caller copies plainly).
    ///
    /// # Safety
    /// As for `Engine::copy`: `src` valid for reads and `dst` for writes of
    /// `len` bytes, and the two ranges do not overlap.
    unsafe fn virtual_copy(&mut self, dst: *mut u8, src: *const u8, len: usize) -> bool {
        let (Some(sb), Some(db)) = (self.find(src as usize, len), self.find(dst as usize, len))
        else {
            return false;
        };
        if src as usize % PAGE != dst as usize % PAGE
            || self.blocks[&sb].exempt
            || self.blocks[&db].exempt
        {
            return false;
        }
        let head = (PAGE - src as usize % PAGE) % PAGE;
        let whole = (len - head) / PAGE;
        if whole == 0 {
            return false;
        }
        let tail = len - head - whole * PAGE;
        let (s0, d0) = (src.add(head), dst.add(head));
        std::ptr::copy_nonoverlapping(src, dst, head);
        std::ptr::copy_nonoverlapping(s0.add(whole * PAGE), d0.add(whole * PAGE), tail);
        self.stats.bytes_copied_plain += (head + tail) as u64;

        let si = (s0 as usize - sb) / PAGE;
        let di = (d0 as usize - db) / PAGE;
        let src_block_pages = self.blocks[&sb].pages.len();
        if whole * 2 >= src_block_pages {
            self.placement.copied_from(src_block_pages);
        }
        let dst_block_pages = self.blocks[&db].pages.len();
        if self.cfg.copy_learn && !self.placement.copy_pays(dst_block_pages) {
            self.stats.copies_made_plain += 1;
            self.copy_plain_pages(s0, d0, whole);
            return true;
        }
        // Evicted source pages come back first (from this thread, no fault),
        // so the copy can share them instead of copying them plainly.
        self.restore_evicted(sb, si, whole);
        self.refresh_divergence(sb, si, whole);
        self.freeze(sb, si, whole);
        let src_pages: Vec<Page> = self.blocks[&sb].pages[si..si + whole].to_vec();
        let shared_frame = |k: usize| match src_pages[k] {
            Page::Shared(f) => Some(f),
            _ => None,
        };
        let mut plain = vec![true; whole];
        for (a, b) in runs(0..whole, shared_frame) {
            if self.share_run(
                db,
                di + a,
                b - a,
                shared_frame(a).expect("run starts shared"),
            ) {
                plain[a..b].iter_mut().for_each(|p| *p = false);
            }
        }
        if self.cfg.copy_through {
            let in_anon = |k: usize| match src_pages[k] {
                Page::Anon | Page::Diverged(_) => plain[k].then_some(()),
                _ => None,
            };
            for (a, b) in unit_runs(0..whole, in_anon) {
                if self.copy_through(db, di + a, b - a, s0.add(a * PAGE)) {
                    plain[a..b].iter_mut().for_each(|p| *p = false);
                }
            }
        }
        if self.cfg.copy_learn {
            let shared = plain.iter().filter(|p| !**p).count();
            if let Some(b) = self.blocks.get_mut(&db) {
                b.copy_shared += shared;
            }
            self.placement.shared_by_copy(dst_block_pages, shared);
        }
        for (k, _) in plain.iter().enumerate().filter(|(_, p)| **p) {
            std::ptr::copy_nonoverlapping(s0.add(k * PAGE), d0.add(k * PAGE), PAGE);
            self.stats.bytes_copied_plain += PAGE as u64;
        }
        true
    }

    /// Copies `whole` pages plainly (a copy judged not to pay).
    ///
    /// # Safety
    /// Both ranges valid for `whole` pages, not overlapping.
    unsafe fn copy_plain_pages(&mut self, s0: *const u8, d0: *mut u8, whole: usize) {
        std::ptr::copy_nonoverlapping(s0, d0, whole * PAGE);
        self.stats.bytes_copied_plain += (whole * PAGE) as u64;
    }

    /// Copies `n` pages of anonymous memory at `src` into fresh frames and
    /// maps dst pages `[i, i+n)` privately onto them, frozen: the copy costs
    /// about what a plain one does, and further copies of the destination are
    /// virtual. The source is left as it is (a scan may fold it onto the same
    /// frames later). False (nothing changed) if frames or mappings run out.
    ///
    /// # Safety
    /// `src` is valid for reading `n` pages.
    unsafe fn copy_through(&mut self, db: usize, i: usize, n: usize, src: *const u8) -> bool {
        let Some(pi) = self.current_pool() else {
            return false;
        };
        let Some(slot) = self.pools[pi].alloc(n as u64) else {
            self.stats.fallbacks.frames += 1;
            return false;
        };
        let fd = self.pools[pi].fd;
        if sys::pwrite_all(fd, src, n * PAGE, slot * PAGE as u64).is_err()
            || !self.remap(db, i, n, Some(FrameId::new(pi, slot)))
        {
            self.pools[pi].abandon(slot, n as u64);
            return false;
        }
        for k in 0..n as u64 {
            self.pools[pi].freeze(slot + k);
        }
        self.stats.pages_copied_through += n as u64;
        true
    }

    /// Maps dst pages `[i, i+n)` onto the frozen frames from `first`.
    fn share_run(&mut self, db: usize, i: usize, n: usize, first: FrameId) -> bool {
        if !self.remap(db, i, n, Some(first)) {
            return false;
        }
        self.stats.pages_shared_by_copy += n as u64;
        true
    }

    pub fn snapshot(&self) -> Stats {
        let mut s = self.stats;
        s.blocks = self.blocks.len() as u64;
        s.block_bytes = self.blocks.values().map(|b| b.len() as u64).sum();
        s.frames_in_use = self.pools.iter().map(|p| p.in_use()).sum();
        s.frames_resident = self.pools.iter().map(|p| p.resident_frames()).sum();
        (s.pages_sharing, s.pages_saved_by_sharing) = self.pages_sharing();
        s.vmas_used = self.vmas as u64;
        s.recycled_bytes = self.recycled_bytes as u64;
        s.metadata_bytes = self.metadata_bytes() as u64;
        s.protected_scan = self.protector.is_some();
        s.descriptor_replaced = crate::fds::lost();
        if let Some(ev) = &self.evictions {
            let t = ev.lock();
            s.evicted_now = t.evicted_now;
            s.restored = t.counts.restored;
            s.restored_by_engine = t.counts.restored_by_engine;
            s.evicted_dropped = t.counts.dropped;
            s.restore_errors = t.counts.errors;
            s.evict_lifetime_ms_log2 = t.counts.lifetime_ms_log2;
            s.pin_hold_broken = t.held.broken;
            s.store = t.store.bytes();
            s.metadata_bytes += (t.records_bytes() + t.held.bytes()) as u64;
            t.patches.stats(&mut s);
        }
        self.patch_stats(&mut s);
        s.frames_active = self.current_pool().is_some();
        s.clock = self.clock.stats;
        s
    }

    /// Pages mapping a frame another page maps too, and the pages of memory
    /// that sharing saves now (each shared frame stands for all its pages).
    fn pages_sharing(&self) -> (u64, u64) {
        let mut per_frame: HashMap<FrameId, u64> = HashMap::new();
        for b in self.blocks.values() {
            for p in &b.pages {
                if let Page::Shared(f) = p {
                    *per_frame.entry(*f).or_default() += 1;
                }
            }
        }
        let shared = per_frame.values().filter(|&&n| n > 1);
        (shared.clone().sum(), shared.map(|n| n - 1).sum())
    }

    pub fn metadata_bytes(&self) -> usize {
        let blocks: usize = self.blocks.values().map(|b| b.metadata_bytes() + 48).sum();
        let pools: usize = self.pools.iter().map(|p| p.metadata_bytes()).sum();
        // A hash map entry: key, value and a control byte, over its capacity.
        let young = self.young_frames.capacity()
            * (std::mem::size_of::<(FrameId, std::time::Instant)>() + 1)
            + self.young_pages.capacity()
                * (std::mem::size_of::<(usize, std::time::Instant)>() + 1)
            + self.holds.bytes();
        blocks
            + pools
            + self.stable.bytes()
            + self.placement.bytes()
            + young
            + std::mem::size_of::<State>()
    }
}
