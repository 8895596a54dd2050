//! The engine's state and the operations every layer above builds on.
//!
//! All state sits behind one mutex (`Inner::lock`). Operations are short (a
//! few system calls per run of pages), and the scanner takes the lock per
//! chunk, so program threads interleave with a running scan. `State` holds
//! each part under its owner's type: the frame pools (frames.rs), the blocks
//! and their pages (space.rs), the recycled blocks (recycle.rs), the pin
//! guard's scratch range (guard.rs), the held pages (held.rs), the
//! eviction table shared with the fault thread (fault.rs), the patching data
//! (patches.rs), the clock (clock.rs), the count of the process's mappings
//! and the engine's budget of them (mappings.rs), whether ksmd runs
//! (ksm_link.rs), and what copies taught about size classes (fresh.rs), on
//! which placement.rs decides whether an allocation is the engine's and
//! where a fresh block starts.
//!
//! Here are the page table's own operations: allocating and freeing blocks,
//! remapping pages onto frames, freezing, refreshing divergence, the mapping
//! budget, registering ranges with userfaultfd. Whatever a change of
//! mapping invalidates below the mechanisms is settled here, where it
//! happens: the holds in the range end (held.rs), the records of evicted
//! pages there go (fault.rs), and the pins of patches dropped meanwhile are
//! released (patches.rs). The modules above (the pin guard, holds, copies,
//! restoring, patching, eviction, the scan) add their operations on `State`
//! and call only this and what lies below them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::Clock;
use crate::config::Config;
use crate::fault::{Restoring, Table};
use crate::frames::{FrameId, Pool};
use crate::guard::Guard;
use crate::held::Holds;
use crate::index::ContentIndex;
use crate::ksm_link::KsmLink;
use crate::mappings::Mappings;
use crate::patches::Patching;
use crate::placement::{Hint, Taking};
use crate::protect::Protector;
use crate::recycle::Recycler;
use crate::space::{runs, Block, Page, Restores};
use crate::stats::Stats;
use crate::sys::{self, PAGE};

pub(crate) struct Inner {
    pub cfg: Config,
    pub state: Mutex<State>,
    pub bg_stop: AtomicBool,
    pub bg: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// What pressure-driven tiering reads (pressure.rs): made, and its files
    /// opened, here at engine start, when tiering is driven by pressure.
    gauge: Option<crate::pressure::Gauge>,
    /// The caller's way to give memory back while memory is short
    /// (`Engine::on_memory_short`): called on the scanner thread, outside
    /// the lock; answers whether it released anything.
    pub relief: std::sync::OnceLock<fn() -> bool>,
}

pub(crate) struct State {
    /// Frame pools; the last one takes new allocations unless retired.
    pub pools: Vec<Pool>,
    pub blocks: BTreeMap<usize, Block>,
    /// Freed blocks kept for reuse, oldest first, and their total length (recycle.rs).
    pub recycler: Recycler,
    /// The engine's userfaultfd (shared with the fault thread).
    pub protector: Option<Arc<Protector>>,
    /// The pin guard's scratch range and young frames and pages (guard.rs, detach.rs).
    pub guard: Guard,
    /// Pages held write-protected (held.rs, hold.rs), and since when; the
    /// fault thread's table says which holds no write has ended yet.
    pub holds: Holds,
    /// The table shared with the fault thread, and that thread (fault.rs, restore.rs).
    pub restoring: Restoring,
    /// Similarity detection and reference pins (patching.rs); made on first use.
    pub patching: Option<Patching>,
    pub pagemap: Option<sys::Pagemap>,
    /// Where the caller's heap lies, whose untouched pages read zero (heap.rs).
    pub heap: crate::heap::Heap,
    /// Whether ksmd runs, for the KSM handoff (ksm_link.rs, ksm.rs).
    pub ksm: KsmLink,
    /// Frozen frames by content (kernel KSM's stable tree).
    pub stable: ContentIndex<FrameId>,
    /// The process's mappings, the engine's budget of them and the spares (mappings.rs).
    pub mappings: Mappings,
    /// A scan has blocks registered with userfaultfd.
    pub scanning: bool,
    /// The tiering clock's state between passes.
    pub clock: Clock,
    /// What copies taught about where fresh blocks should start (fresh.rs),
    /// and the placement decisions made on it (placement.rs).
    pub placement: crate::fresh::Placement,
    /// What scans of each size class yielded: whether new blocks start sampled (sample.rs).
    pub class_yields: crate::sample::ClassYields,
    pub stats: Stats,
    pub cfg: Config,
}

impl Inner {
    pub fn new(cfg: Config) -> Inner {
        let mut state = State::new(cfg.clone());
        let gauge =
            (cfg.tier == crate::config::Tier::Pressure).then(|| crate::pressure::Gauge::new(&cfg));
        state.stats.fallbacks.pressure = gauge.as_ref().map_or(0, |g| g.refused());
        Inner {
            state: Mutex::new(state),
            bg_stop: AtomicBool::new(false),
            bg: Mutex::new(None),
            gauge,
            relief: std::sync::OnceLock::new(),
            cfg,
        }
    }

    /// A look at memory, if tiering is driven by pressure (read without the lock).
    pub fn read_pressure(&self) -> Option<crate::pressure::Reading> {
        self.gauge.as_ref().map(crate::pressure::Gauge::read)
    }

    /// In a child right after fork: the gauge's /proc/self files name the parent.
    pub fn after_fork_in_child(&self) {
        if let Some(g) = &self.gauge {
            g.after_fork_in_child();
        }
    }

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
        if let Some(ev) = &st.restoring.evictions {
            let held = ev.lock().held.take_all();
            if let Some(p) = &st.protector {
                for a in held {
                    let _ = p.unprotect(a as *const u8, crate::sys::PAGE);
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
        let mut mappings = Mappings::new(&cfg);
        let pagemap = sys::Pagemap::open().ok();
        mappings.make_spares();
        State {
            pools,
            blocks: BTreeMap::new(),
            recycler: Recycler::new(&cfg),
            protector,
            guard: Default::default(),
            holds: Holds::default(),
            restoring: Restoring::default(),
            patching: None,
            pagemap,
            heap: crate::heap::Heap::new(),
            ksm: KsmLink::new(&cfg),
            stable: ContentIndex::default(),
            mappings,
            scanning: false,
            clock: Default::default(),
            placement: Default::default(),
            class_yields: Default::default(),
            stats,
            cfg,
        }
    }

    /// The userfaultfd, with MISSING mode unless injected away.
    pub fn open_protector(cfg: &Config) -> Option<Arc<Protector>> {
        if cfg.inject.fail_uffd {
            return None;
        }
        Protector::open_refusing(true, &cfg.inject.uffd_refusals())
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

    /// A block for `len` bytes if the engine takes the allocation, None if
    /// it leaves it to the caller's own allocator (placement.rs,
    /// `Placement::take`), or not even plain anonymous memory could be had.
    pub fn take(&mut self, len: usize, hint: Hint, heap_free: usize) -> Option<*mut u8> {
        let taking = self.placement.take(
            &self.cfg,
            len,
            hint,
            heap_free,
            &self.class_yields,
            &self.recycler,
        );
        // The caller's allocator may map fresh memory for what the engine
        // leaves to it: kept blocks must not raise the peak either way.
        if taking != Taking::Taken {
            self.make_room_for_fresh(len.max(1).div_ceil(PAGE));
        }
        match taking {
            Taking::LeftToHeap => {
                self.stats.allocs_left_to_heap += 1;
                None
            }
            Taking::Declined => {
                self.stats.allocs_declined += 1;
                None
            }
            Taking::Taken => {
                let p = self.alloc(len, hint);
                (!p.is_null()).then_some(p)
            }
        }
    }

    pub fn alloc(&mut self, len: usize, hint: Hint) -> *mut u8 {
        let npages = len.max(1).div_ceil(PAGE);
        self.expire_recycled();
        let frames_usable = !crate::fds::lost();
        let recycled = self
            .placement
            .recycled_kind(&self.cfg, hint, npages, frames_usable);
        if let Some(on_frames) = recycled {
            if let Some(block) = self.reuse(npages, on_frames) {
                let ptr = block.base;
                self.blocks.insert(ptr as usize, block);
                return ptr;
            }
        }
        self.make_room_for_fresh(npages);
        let on_frames = self
            .placement
            .fresh_on_frames(&self.cfg, hint, npages, frames_usable);
        let (ptr, pages) = match on_frames.then(|| self.alloc_frames(npages)).flatten() {
            Some(x) => x,
            None => match self.map_anonymous(npages) {
                Some(p) => (p, vec![Page::Anon; npages]),
                None => return std::ptr::null_mut(),
            },
        };
        if matches!(hint, Hint::FullWrite | Hint::UninitFullWrite) {
            let _ = sys::madvise(ptr, npages * PAGE, libc::MADV_POPULATE_WRITE);
        }
        let mut block = Block::new(ptr, pages);
        if self.cfg.sample_scan && self.class_yields.sampled(npages) {
            block.found = crate::sample::Yield::start(true);
            self.stats.blocks_started_sampled += 1;
        }
        self.stats.fresh_pages += npages as u64;
        self.mappings.add(block.vmas);
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
            Err(_) if !self.recycler.is_empty() => {
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
        let Some(mut block) = self.blocks.remove(&(ptr as usize)) else {
            return false;
        };
        let freed_young = self.placement.judge_copy_lifetime(&self.cfg, &block);
        self.stats.copy_pages_freed_young += freed_young as u64;
        if let Some(class) = block.copied_from_class.filter(|_| freed_young > 0) {
            self.placement.uncopied(class);
        }
        let copies = std::mem::take(&mut block.copies_out);
        self.free_block(block);
        self.refresh_copies(&copies);
        true
    }

    /// A freed block's frames may now be needed only by copies of it that
    /// the program has since written over: their divergence is read now, so
    /// that such frames are punched at once rather than at the next scan
    /// (an R vector copied, the copy rewritten in full, the original freed:
    /// without this, both stay in memory until the scan, seconds later).
    fn refresh_copies(&mut self, copies: &[usize]) {
        for &base in copies {
            let Some(n) = self
                .blocks
                .get(&base)
                .filter(|b| b.copy_shared > 0)
                .map(|b| b.pages.len())
            else {
                continue;
            };
            self.refresh_divergence(base, 0, n);
        }
    }

    /// Unmaps a block and lets go of its frames.
    pub(crate) fn release_block(&mut self, block: Block) {
        self.changing_mapping(block.base as usize, block.len(), |_| {
            sys::unmap(block.base, block.len());
            true
        });
        self.forget_evicted(&block, 0, block.pages.len());
        self.mappings.remove(block.vmas);
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

    /// Whether `cost` more mappings fit in the budget, besides those the
    /// holds may cost (mappings.rs, `Mappings::room`).
    pub fn vma_room(&mut self, cost: usize) -> bool {
        let held = self.hold_vmas();
        self.mappings.room(held + cost)
    }

    /// Notes that the mapping budget refused `n` merges in block `base`
    /// (ksm.rs hands blocks with many such to kernel KSM).
    pub(crate) fn refused_merges(&mut self, base: usize, n: usize) {
        if let Some(b) = self.blocks.get_mut(&base) {
            b.merges_refused += n;
        }
    }

    /// Maps pages `[i, i+n)` of block `base` privately onto frames from `first`
    /// (or anonymous memory if `first` is None), replacing what was there, and
    /// updates page states, frame counts and the mapping count.
    pub fn remap(&mut self, base: usize, i: usize, n: usize, first: Option<FrameId>) -> bool {
        let cost = self.blocks[&base].remap_cost(i, n);
        if !self.vma_room(cost) {
            self.stats.fallbacks.vma_budget += 1;
            return false;
        }
        let addr = self.blocks[&base].page_addr(i);
        let (fd, slot) = match first {
            Some(f) => (Some(self.pools[f.pool()].fd), f.slot()),
            None => (None, 0),
        };
        let mapped = self.changing_mapping(addr as usize, n * PAGE, |_| {
            sys::map(addr, n * PAGE, fd, slot, false, true).is_ok()
        });
        if !mapped {
            self.stats.fallbacks.mmap += 1;
            return false;
        }
        self.record_remap(base, i, n, first);
        true
    }

    /// Pages `[i, i+n)` of a block become `page(k)` for k in 0..n after a
    /// remap: their states, and the block's and the engine's mapping counts.
    pub fn set_remapped(&mut self, base: usize, i: usize, n: usize, page: impl Fn(usize) -> Page) {
        let block = self
            .blocks
            .get_mut(&base)
            .expect("block vanished under the lock");
        let before = block.boundaries(i, n);
        for k in 0..n {
            block.set(i + k, page(k));
        }
        let after = block.boundaries(i, n);
        block.vmas = block.vmas + after - before;
        self.mappings.remapped(before, after);
    }

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
        // A fresh mapping is not registered: inside a scan it must be, or
        // unprotecting its chunk would stop at it.
        if self.scanning {
            self.register(addr, n * PAGE);
        }
        self.set_remapped(base, i, n, |k| match first {
            Some(f) => Page::Shared(f.offset(k as u64)),
            None => Page::Anon,
        });
        self.mappings.recount_if_due();
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
                    let seen = crate::seen::with_look(block.seen[i + k], 0);
                    block.seen[i + k] = crate::seen::written(seen);
                    released.push(f);
                    diverged_now.push(block.page_addr(i + k) as usize);
                }
            }
        }
        let n_released = released.len() as u64;
        let written_copies = block.copy_shared.min(released.len());
        // The rest were merged by scans: their merges are undone.
        block.found.undone(released.len() - written_copies);
        if written_copies > 0 {
            block.copy_shared -= written_copies;
            let npages = block.pages.len();
            self.placement.written_after_copy(npages, written_copies);
        }
        let punch: Vec<FrameId> = released
            .into_iter()
            .filter(|f| self.pools[f.pool()].diverge(f.slot()))
            .collect();
        self.release(punch, false);
        self.stats.diverged_released += n_released;
        if !self.cfg.pin_age.is_zero() {
            let now = std::time::Instant::now();
            self.guard
                .young_pages
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

    pub fn snapshot(&self) -> Stats {
        let mut s = self.stats;
        s.blocks = self.blocks.len() as u64;
        s.block_bytes = self.blocks.values().map(|b| b.len() as u64).sum();
        s.frames_in_use = self.pools.iter().map(|p| p.in_use()).sum();
        (s.pages_sharing, s.pages_saved_by_sharing) = self.pages_sharing();
        s.vmas_used = self.mappings.used() as u64;
        s.recycled_bytes = self.recycler.bytes() as u64;
        s.protected_scan = self.protector.is_some();
        s.descriptor_replaced = crate::fds::lost();
        s.unprotect_gaps = self.protector.as_ref().map_or(0, |p| p.gaps());
        let t = self.restoring.evictions.as_ref().map(|ev| ev.lock());
        if let Some(t) = &t {
            s.evicted_now = t.evicted_now;
            s.restored = t.counts.restored;
            s.restored_young = t.counts.restored_young;
            s.restored_by_engine = t.counts.restored_by_engine;
            s.evicted_dropped = t.counts.dropped;
            s.restore_errors = t.counts.errors;
            s.evict_lifetime_ms_log2 = t.counts.lifetime_ms_log2;
            s.pin_hold_broken = t.held.broken;
        }
        self.memory(&mut s, t.as_deref());
        drop(t);
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

    /// What the engine's own memory is made of, into `s`: resident frames,
    /// what the page store holds, the patches and their store, and the
    /// engine's bookkeeping (the eviction table `t`'s included). The
    /// statistics and the clock's footprint both count it so.
    fn memory(&self, s: &mut Stats, t: Option<&Table>) {
        s.frames_resident = self.pools.iter().map(|p| p.resident_frames()).sum();
        s.metadata_bytes = self.metadata_bytes() as u64;
        if let Some(t) = t {
            s.store = t.store.bytes();
            s.metadata_bytes += (t.records_bytes() + t.held.bytes()) as u64;
            t.patches.stats(s);
        }
        self.patch_stats(s);
    }

    /// What the engine can see of its own memory (clock.rs): its memory as
    /// the statistics count it, with the resident private pages the last
    /// complete clock pass counted.
    pub(crate) fn footprint(&self) -> u64 {
        let mut s = Stats::default();
        let t = self.restoring.evictions.as_ref().map(|ev| ev.lock());
        self.memory(&mut s, t.as_deref());
        drop(t);
        (s.frames_resident + self.clock.private_resident) * PAGE as u64
            + s.store.memory()
            + s.patch_store_bytes
            + s.metadata_bytes
    }

    /// Patching's part of the statistics (the patch store's with the eviction table's).
    pub(crate) fn patch_stats(&self, s: &mut crate::stats::Stats) {
        let Some(p) = &self.patching else { return };
        s.references_pinned = p.pins.len() as u64;
        s.patch_work_ns = p.work_ns;
        // Frames no page holds any more: patches alone keep them.
        let orphan = p
            .pins
            .iter()
            .filter(|(f, &n)| self.pools[f.pool()].refs(f.slot()) == n)
            .count();
        s.reference_bytes = (orphan * PAGE) as u64;
        s.metadata_bytes += (p.detector.metadata_bytes() + p.pins.capacity() * 17) as u64;
    }

    pub fn metadata_bytes(&self) -> usize {
        let blocks: usize = self.blocks.values().map(|b| b.metadata_bytes() + 48).sum();
        let pools: usize = self.pools.iter().map(|p| p.metadata_bytes()).sum();
        let young = self.guard.bytes() + self.holds.bytes();
        blocks
            + pools
            + self.stable.bytes()
            + self.placement.bytes()
            + self.class_yields.bytes()
            + young
            + std::mem::size_of::<State>()
    }

    /// Ends the holds in `[addr, addr+len)`, which is about to be protected,
    /// unprotected, unregistered or replaced, and wakes their writers.
    pub fn drop_holds(&mut self, addr: usize, len: usize) {
        if !self.holds.any_within(addr, len) {
            return;
        }
        let ended = self.holds.within(addr, len);
        if let Some(ev) = self.restoring.evictions.clone() {
            let mut t = ev.lock();
            for (a, _) in &ended {
                t.held.pages.remove(a);
            }
        }
        for (a, _) in ended {
            self.holds.remove(a);
        }
        if let Some(p) = &self.protector {
            p.wake(addr as *const u8, len);
        }
    }

    /// Runs `change`, which unmaps or replaces the mapping of
    /// `[addr, addr+len)` and says whether it did, with the holds there
    /// ended first: a hold the fault thread still knew once the mapping is
    /// gone would have it unprotect a range that is not registered (or is
    /// another block's by then). Should the change fail, the pages that were
    /// held, still registered and write-protected, are unprotected; either
    /// way their writers are woken, to fault again on what is there now.
    pub fn changing_mapping(
        &mut self,
        addr: usize,
        len: usize,
        change: impl FnOnce(&mut State) -> bool,
    ) -> bool {
        let held = self.holds.within(addr, len);
        self.drop_holds(addr, len);
        let changed = change(self);
        if let (Some(p), false) = (&self.protector, held.is_empty()) {
            if !changed {
                for (a, _) in &held {
                    let _ = p.unprotect(*a as *const u8, PAGE);
                }
            }
            p.wake(addr as *const u8, len);
        }
        changed
    }

    /// The page at `addr` is held.
    pub fn is_held(&self, addr: usize) -> bool {
        self.holds.contains(addr)
    }

    /// Mappings the holds may cost: their registration splits the mapping
    /// around each run.
    pub fn hold_vmas(&self) -> usize {
        2 * self.holds.runs
    }

    /// In a forked child: nothing is registered any more.
    pub fn forget_holds(&mut self) {
        self.holds.clear();
        if let Some(ev) = &self.restoring.evictions {
            ev.lock().held.clear();
        }
    }

    /// Pages `[i, i+n)` of `block` lost their mapping (freed, cut off or
    /// replaced): their records and stored copies go. Called after the
    /// mapping change and before anything is registered there.
    pub(crate) fn forget_evicted(&self, block: &Block, i: usize, n: usize) {
        if block.evicted == 0 {
            return;
        }
        let Some(ev) = &self.restoring.evictions else {
            return;
        };
        let mut t = ev.lock();
        for k in (i..i + n).filter(|&k| block.pages[k].is_evicted()) {
            t.forget(block.page_addr(k) as usize);
        }
    }

    /// Releases the pins of patches dropped since the last call: frames no
    /// page and no patch needs any more are punched (and reused if unmapped).
    pub(crate) fn settle_pins(&mut self) {
        let Some(ev) = &self.restoring.evictions else {
            return;
        };
        let frames = std::mem::take(&mut ev.lock().patches.unpinned);
        if frames.is_empty() {
            return;
        }
        let (mut punch, mut reuse) = (Vec::new(), Vec::new());
        for f in frames {
            if let Some(p) = self.patching.as_mut() {
                if let Some(n) = p.pins.get_mut(&f) {
                    *n -= 1;
                    if *n == 0 {
                        p.pins.remove(&f);
                    }
                }
            }
            match self.pools[f.pool()].unpin(f.slot()) {
                (_, true) => reuse.push(f),
                (true, false) => punch.push(f),
                _ => {}
            }
        }
        self.release(punch, false);
        self.release(reuse, true);
    }

    /// Runs `f` with pages `[i, i+n)` of a block registered for write
    /// protection, and unregistered again afterwards (remaps inside `f`
    /// register their new mappings).
    pub fn with_registered<T>(
        &mut self,
        base: usize,
        i: usize,
        n: usize,
        f: impl FnOnce(&mut State) -> T,
    ) -> T {
        let addr = self.blocks[&base].page_addr(i);
        let was = std::mem::replace(&mut self.scanning, true);
        self.register(addr, n * PAGE);
        crate::race::pause();
        let r = f(self);
        self.unregister_unevicted(base, i, n);
        self.scanning = was;
        r
    }

    /// Unregisters pages `[i, i+n)` of a block except evicted ones, which
    /// must keep their MISSING registration, and held ones (hold.rs), which
    /// must stay write-protected.
    fn unregister_unevicted(&mut self, base: usize, i: usize, n: usize) {
        let Some(block) = self.blocks.get(&base) else {
            return;
        };
        let addr = block.page_addr(i);
        let any_held = self.holds.any_within(addr as usize, n * PAGE);
        if block.evicted == 0 && !any_held {
            return self.unregister(addr, n * PAGE);
        }
        let kept = |k: usize| {
            block.pages[k].is_evicted() || self.holds.contains(block.page_addr(k) as usize)
        };
        let mut plain = Vec::new();
        let mut k = i;
        while k < i + n {
            let keep = kept(k);
            let end = (k..i + n).find(|&j| kept(j) != keep).unwrap_or(i + n);
            if !keep {
                plain.push((block.page_addr(k), (end - k) * PAGE));
            }
            k = end;
        }
        for (a, len) in plain {
            self.unregister(a, len);
        }
        // Unregistering wakes only MISSING sleepers: wake write-protect ones too.
        if let Some(p) = &self.protector {
            p.wake(addr, n * PAGE);
        }
    }

    /// Bases of the blocks overlapping `[start, end)`, in address order.
    pub fn overlapping(&self, start: usize, end: usize) -> Vec<usize> {
        let first = self
            .blocks
            .range(..=start)
            .next_back()
            .filter(|(&b, blk)| b + blk.len() > start)
            .map(|(&b, _)| b);
        let rest = self
            .blocks
            .range(start.saturating_add(1)..end.max(start.saturating_add(1)))
            .map(|(&b, _)| b);
        first.into_iter().chain(rest).collect()
    }

    /// Keeps `block` for reuse if it may be (recycle.rs); otherwise gives it back.
    pub(crate) fn free_block(&mut self, block: Block) {
        self.expire_recycled();
        let blocks = &self.blocks;
        let live = || blocks.values().map(|b| b.len()).sum();
        for b in self.recycler.keep(block, &self.cfg, live) {
            self.release_block(b);
        }
    }

    /// Gives back the recycled blocks that would raise the process's peak
    /// once `npages` of fresh memory are mapped (recycle.rs `make_room`).
    fn make_room_for_fresh(&mut self, npages: usize) {
        if self.recycler.is_empty() {
            return;
        }
        for b in self.recycler.make_room(npages * PAGE) {
            self.release_block(b);
        }
    }

    /// A recycled block of `npages` on frames or anonymous (as a fresh block
    /// would start), if one fits, else recycled blocks of that kind laid side
    /// by side into one (recycle.rs).
    pub(crate) fn reuse(&mut self, npages: usize, on_frames: bool) -> Option<Block> {
        if let Some(r) = self.recycler.take(npages, on_frames) {
            self.mappings.changed(r.vmas_before, r.vmas_after);
            self.stats.recycled += 1;
            return Some(r.block);
        }
        if !self.cfg.recycle_join {
            return None;
        }
        // A piece with holds has write-protected pages registered at its
        // address; it stays where it is.
        let holds = &self.holds;
        let (pieces, before, after) = self.recycler.gather(npages, on_frames, |b| {
            !holds.any_within(b.base as usize, b.len())
        })?;
        self.mappings.changed(before, after);
        let block = self.lay_side_by_side(pieces, npages)?;
        self.stats.recycled += 1;
        self.stats.recycled_joined += 1;
        Some(block)
    }

    /// Moves `pieces` (recycled blocks of `npages` in all) next to one
    /// another into a fresh range, as one block. Moving a mapping moves its
    /// page tables: no page is faulted, copied or zeroed. If a move is
    /// refused, the pieces moved so far and the range are given back, the
    /// others too, and None is returned (the caller maps fresh memory).
    fn lay_side_by_side(&mut self, pieces: Vec<Block>, npages: usize) -> Option<Block> {
        let Ok(range) = sys::map(std::ptr::null_mut(), npages * PAGE, None, 0, false, false) else {
            for b in pieces {
                self.release_block(b);
            }
            return None;
        };
        let mut pages = Vec::with_capacity(npages);
        let mut rest = pieces.into_iter();
        for b in rest.by_ref() {
            // SAFETY: the pieces add up to npages, so every piece lands inside the range.
            let to = unsafe { range.add(pages.len() * PAGE) };
            if sys::mremap_fixed(b.base, b.len(), to).is_err() {
                self.release_block(b);
                break;
            }
            self.mappings.remove(b.vmas);
            pages.extend(b.pages);
        }
        let complete = pages.len() == npages;
        pages.resize(npages, Page::Anon);
        let block = Block::new(range, pages);
        self.mappings.add(block.vmas);
        if complete {
            return Some(block);
        }
        self.release_block(block);
        for b in rest {
            self.release_block(b);
        }
        None
    }

    /// Gives back recycled blocks older than the configured age. Scans call
    /// it too, for a program that stopped allocating.
    pub(crate) fn expire_recycled(&mut self) {
        for b in self.recycler.expired(self.cfg.recycle_age) {
            self.release_block(b);
        }
    }

    /// Gives back every recycled block (before fork).
    pub(crate) fn flush_recycled(&mut self) {
        for b in self.recycler.drain() {
            self.release_block(b);
        }
    }
}
