//! Eviction: cold pages leave memory for the page store and come back when
//! touched (Difference Engine's compression and paging, in user space).
//!
//! `Engine::evict(ptr, len)` is a hint, like DE's swap-out requests: every
//! page in the range that may be evicted is, the rest is left alone. It walks
//! the range in chunks under the engine lock, as a scan does, and protects
//! each by the protocol the scan follows too (chunk.rs). For each chunk:
//!
//! 1. reconcile: pages the fault thread restored since the last look become
//!    ordinary pages again (their records and stored copies go, their
//!    MISSING registration too);
//! 2. register the chunk and write-protect it: writers sleep, so nothing
//!    written after the page is read can be lost;
//! 3. refresh divergence and ask mincore which pages hold content;
//! 4. read each eligible, resident, non-zero page that is still
//!    write-protected (a page the scan remapped in this chunk, frozen or a
//!    merge partner, is on a fresh mapping the protection does not cover)
//!    and, if patching is allowed and a similar page serves as reference,
//!    keep it as a patch (patching.rs); else, if compression is allowed,
//!    `put` it in the store, which may refuse (incompressible, full): that
//!    page stays;
//! 5. give writes through pages the kernel pinned earlier (O_DIRECT) the pin
//!    grace to land, and keep only the pages that still equal what was stored;
//! 6. register each run MISSING|WP, free its memory (MADV_DONTNEED for
//!    anonymous memory and diverged pages, a hole punched in the frame for
//!    owned and sole shared pages), then record its pages in the table, so
//!    that a restore always finds a hole (`arm_and_free`);
//! 7. unprotect: sleeping writers wake, fault on the missing page, and the
//!    fault thread (fault.rs) puts the content back before their write lands.
//!
//! Which pages: those whose content this page alone holds, so that freeing
//! it frees memory and nothing else can bring a stale copy back:
//! - anonymous pages (restored anonymous);
//! - owned pages of a live pool (restored into their frame, still owned);
//! - shared pages whose frame has no other user, and diverged pages whose
//!   frame no other page maps and is a hole (restored as diverged: the
//!   kernel makes a private copy for UFFDIO_COPY into a private mapping).
//!
//! Pins. Anonymous pages leave through the pin guard's test (UFFDIO_MOVE
//! refuses a page the kernel may have pinned). The others live in mappings
//! of the frames' memfd, which UFFDIO_MOVE cannot move, and have no pin
//! test: they wait the pin grace and are compared again (step 5), which
//! narrows the race with a write through a pin taken earlier but does not
//! close it. With `evict_untested` off they are not evicted at all, nor are
//! anonymous pages when the pin guard is unavailable.
//!
//! Not: shared frames with several users (evicting one user frees nothing),
//! frames of retired (pre-fork) pools, which the other process may map,
//! exempt blocks, all-zero pages (zero folding frees those for nothing),
//! pages never touched (nothing to free).
//!
//! Mappings. A range registered with userfaultfd is its own VMA (measured:
//! registering a run inside a mapping adds two), so an evicted run costs up to
//! two mappings until restored and reconciled, under the same budget as remaps.
//!
//! Scans evict too (clock.rs): a clock pass (pass.rs) hands the pages its
//! policy chose, each with what it may become (`Allow`), to `tier_chunk`,
//! the function the engine gives the scan, and so to `evict_pages`, which
//! runs steps 4-6 inside the chunk the scan has already registered and
//! write-protected.
//!
//! Everything else copes with evicted pages: scans skip them (nothing to
//! fold or merge, and reading would restore them); copies restore them
//! first (so they can share them) and replace them when they are the destination;
//! free, shrink, discard and remaps forget their records and stored copies;
//! fork and exempt restore them first (fork.rs, advice.rs).

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use crate::chunk::{ChunkHolds, ChunkWork, Protected};
use crate::clock::Allow;
use crate::fault::Evictions;
use crate::frames::FrameId;
use crate::pass::Pass;
use crate::patches::Content;
use crate::patching::{Chunk, Taken};
use crate::space::{Page, Restores};
use crate::state::{Inner, State};
use crate::stats::EvictReport;
use crate::store::{PageStore, StoreError};
use crate::sys::{self, PAGE};

/// Eviction's work on one protected chunk (chunk.rs): the pages that hold
/// content, each allowed `allow`.
struct EvictChunk<'a> {
    allow: Allow,
    rep: &'a mut EvictReport,
}

impl ChunkWork for EvictChunk<'_> {
    const HOLDS: ChunkHolds = ChunkHolds::End;

    fn work(
        &mut self,
        st: &mut State,
        base: usize,
        i: usize,
        c: usize,
        chunk: &Protected,
    ) -> Vec<(usize, Instant)> {
        if let Some(resident) = &chunk.resident {
            let pages = st.holding_content(base, i, resident, self.allow, self.rep);
            st.evict_pages(base, i..i + c, &pages, self.rep);
        }
        Vec::new()
    }
}

/// `Engine::evict_with`: walks the blocks overlapping `[ptr, ptr+len)` in
/// chunks under the engine lock, evicting what `allow` permits.
pub(crate) fn evict_with(inner: &Inner, ptr: *const u8, len: usize, allow: Allow) -> EvictReport {
    let t0 = Instant::now();
    let (start, end) = (ptr as usize, (ptr as usize).saturating_add(len));
    let mut rep = EvictReport::default();
    let bases = {
        let mut st = inner.lock();
        if !st.cfg.evict || len == 0 {
            return rep;
        }
        if !st.fault_thread_ready() {
            st.stats.fallbacks.evict += 1;
            rep.unavailable = true;
            return rep;
        }
        st.overlapping(start, end)
    };
    let chunk = inner.cfg.scan_chunk_pages.max(1);
    for base in bases {
        let mut i = None;
        loop {
            let mut st = inner.lock();
            let Some(b) = st.blocks.get(&base).filter(|b| !b.exempt) else {
                break;
            };
            let lo = (start.max(base) - base) / PAGE;
            let hi = (end.min(base + b.len()) - base).div_ceil(PAGE);
            let k = *i.get_or_insert(lo);
            if k >= hi {
                break;
            }
            let c = chunk.min(hi - k);
            st.evict_range(base, k, c, allow, &mut rep);
            i = Some(k + c);
        }
    }
    rep.wall_ns = t0.elapsed().as_nanos() as u64;
    rep
}

impl State {
    /// `Engine::set_store`.
    pub(crate) fn set_store(&mut self, store: Arc<dyn PageStore>) -> bool {
        let set = match &self.restoring.evictions {
            None => {
                self.restoring.evictions = Some(Arc::new(Evictions::new(
                    store,
                    crate::governor::young(&self.cfg),
                )));
                true
            }
            Some(ev) => {
                let mut t = ev.lock();
                if t.is_empty() {
                    t.store = store;
                }
                t.is_empty()
            }
        };
        self.restoring.has_store |= set;
        set
    }

    /// Evicts what it may of pages `[i, i+c)` of a block.
    pub(crate) fn evict_range(
        &mut self,
        base: usize,
        i: usize,
        c: usize,
        allow: Allow,
        rep: &mut EvictReport,
    ) {
        self.in_protected_chunk(base, i, c, &mut EvictChunk { allow, rep });
        crate::race::pause();
        self.settle_pins();
    }

    /// The pages of the chunk starting at page `i` that hold content (not
    /// evicted, resident), each allowed `allow`; counts the others.
    fn holding_content(
        &self,
        base: usize,
        i: usize,
        resident: &[u8],
        allow: Allow,
        rep: &mut EvictReport,
    ) -> Vec<(usize, Allow)> {
        let pages = &self.blocks[&base].pages;
        let (holding, not): (Vec<usize>, Vec<usize>) = (i..i + resident.len())
            .partition(|&k| !pages[k].is_evicted() && resident[k - i] & 1 != 0);
        rep.not_resident += not.len() as u64;
        holding.into_iter().map(|k| (k, allow)).collect()
    }

    /// Steps 4-6 for `pages` (sorted, resident, not evicted) of a chunk the
    /// caller has registered and write-protected, each as its `Allow` permits.
    pub(crate) fn evict_pages(
        &mut self,
        base: usize,
        chunk: Range<usize>,
        pages: &[(usize, Allow)],
        rep: &mut EvictReport,
    ) {
        let mut copies = Vec::new();
        let taken = self.take_pages(base, chunk, pages, &mut copies, rep);
        let taken = self.unchanged_after_grace(base, taken, &copies, rep);
        self.arm_and_free(base, taken, &copies, rep);
    }

    /// How page `k` would be evicted, if it may be (see the module comment).
    fn evictable(&self, base: usize, k: usize) -> Option<Restores> {
        let live = |f: FrameId| !self.pools[f.pool()].retired;
        let pool = |f: FrameId| &self.pools[f.pool()];
        match self.blocks[&base].pages[k] {
            Page::Anon => Some(Restores::Anon),
            Page::Owned(f)
                if live(f) && !self.is_held(self.blocks[&base].page_addr(k) as usize) =>
            {
                Some(Restores::Owned(f))
            }
            // A young frame may still take a write through a pin older than
            // its freeze, and is about to be folded or shared anyway.
            Page::Shared(f)
                if live(f)
                    && pool(f).maps(f.slot()) == 1
                    && pool(f).refs(f.slot()) == 1
                    && !self.young(f) =>
            {
                Some(Restores::Diverged(f))
            }
            Page::Diverged(f)
                if live(f)
                    && pool(f).maps(f.slot()) == 1
                    && pool(f).refs(f.slot()) == 0
                    && sys::is_hole(pool(f).fd, f.slot())
                    && !self.young_page(self.blocks[&base].page_addr(k) as usize)
                    && !self.is_held(self.blocks[&base].page_addr(k) as usize) =>
            {
                Some(Restores::Diverged(f))
            }
            _ => None,
        }
    }

    /// Takes the eligible, non-zero ones of `pages` (resident, in the protected
    /// chunk `chunk`) as allowed: as a patch if one fits, else into the store;
    /// their bytes go to `copies`.
    fn take_pages(
        &mut self,
        base: usize,
        chunk: Range<usize>,
        pages: &[(usize, Allow)],
        copies: &mut Vec<u8>,
        rep: &mut EvictReport,
    ) -> Vec<Taken> {
        let store = match &self.restoring.evictions {
            Some(ev) => ev.lock().store.clone(),
            None => return Vec::new(),
        };
        let mut taken = Vec::new();
        let mut buf = [0u8; PAGE];
        let protected = self.write_protected(base, &chunk);
        let guard = self.pin_guard();
        for &(k, allow) in pages {
            if !allow.patch && !allow.compress {
                rep.not_allowed += 1;
                continue;
            }
            let Some(kind) = self.evictable(base, k) else {
                rep.not_eligible += 1;
                continue;
            };
            let tested = guard && kind == Restores::Anon;
            if !(tested || self.cfg.evict_untested) {
                rep.untested += 1;
                continue;
            }
            if !protected[k - chunk.start] {
                rep.unprotected += 1;
                continue;
            }
            let page = self.blocks[&base].page_addr(k);
            if sys::is_zero(page) {
                rep.zero += 1;
                continue;
            }
            // SAFETY: page is page k of the live block at base, readable for PAGE bytes while
            // the engine lock is held; buf is a local array of PAGE bytes, distinct from it.
            unsafe { std::ptr::copy_nonoverlapping(page, buf.as_mut_ptr(), PAGE) };
            crate::race::pause();
            let punch = match self.blocks[&base].pages[k] {
                Page::Owned(f) | Page::Shared(f) => Some(f),
                _ => None,
            };
            let patch = match allow.patch {
                true => self.patch_page(
                    base,
                    k,
                    &buf,
                    &mut Chunk {
                        pages: chunk.clone(),
                        taken: &mut taken,
                        copies,
                    },
                ),
                false => None,
            };
            if allow.patch && patch.is_none() {
                // The clock offers it a patch again only once it is written (clock.rs).
                let seen = &mut self
                    .blocks
                    .get_mut(&base)
                    .expect("block vanished under the lock")
                    .seen[k];
                *seen = crate::seen::no_reference(*seen);
            }
            let handle = match (patch, allow.compress) {
                (Some(p), _) => p,
                (None, true) => match self.store_page(base, k, &store, &buf, rep) {
                    Some(h) => Content::Stored(h),
                    None => continue,
                },
                (None, false) => {
                    rep.unpatched += 1;
                    continue;
                }
            };
            taken.push(Taken {
                k,
                kind,
                punch,
                handle,
                copy: copies.len() / PAGE,
            });
            copies.extend_from_slice(&buf);
        }
        taken
    }

    /// Which pages of the protected `chunk` are write-protected now
    /// (pagemap's uffd-wp bit, set on present pages and on the markers of
    /// absent ones). A page remapped while a scan works on the chunk (frozen
    /// onto its frame, or a merge partner) sits on a fresh mapping that the
    /// chunk's protection does not cover: a write between its read and the
    /// release of its memory would be lost, or, for a frame mapped
    /// privately, stay behind as a private copy the engine does not know.
    /// If pagemap cannot be read, no page counts as protected.
    fn write_protected(&self, base: usize, chunk: &Range<usize>) -> Vec<bool> {
        let mut entries = vec![0u64; chunk.len()];
        let read = self.pagemap.as_ref().is_some_and(|pm| {
            pm.read(self.blocks[&base].page_addr(chunk.start), &mut entries)
                .is_ok()
        });
        entries
            .iter()
            .map(|&e| read && e & sys::PM_UFFD_WP != 0)
            .collect()
    }

    /// Puts the bytes of page `k` in the store; None: it stays in memory.
    fn store_page(
        &mut self,
        base: usize,
        k: usize,
        store: &Arc<dyn PageStore>,
        page: &[u8; PAGE],
        rep: &mut EvictReport,
    ) -> Option<crate::store::Handle> {
        let err = match store.put(page) {
            Ok(handle) => return Some(handle),
            Err(e) => e,
        };
        rep.refused += 1;
        self.stats.evict_refused += 1;
        if err == StoreError::Incompressible {
            // The clock offers it again once it is written (clock.rs).
            let seen = &mut self
                .blocks
                .get_mut(&base)
                .expect("block vanished under the lock")
                .seen[k];
            *seen = crate::seen::refused(*seen);
        }
        None
    }

    /// Waits the pin grace (writes through pages the kernel pinned before
    /// the chunk was protected) and keeps the pages that still hold what was stored.
    fn unchanged_after_grace(
        &mut self,
        base: usize,
        taken: Vec<Taken>,
        copies: &[u8],
        rep: &mut EvictReport,
    ) -> Vec<Taken> {
        if taken.is_empty() {
            return taken;
        }
        // Anonymous pages go through the pin guard instead (`evict_anon_run`).
        let guarded = self.pin_guard() && taken.iter().all(|t| t.kind == Restores::Anon);
        if !guarded && !self.cfg.pin_grace.is_zero() {
            std::thread::sleep(self.cfg.pin_grace);
        }
        let block = &self.blocks[&base];
        type Numbered = Vec<(usize, Taken)>;
        let (keep, changed): (Numbered, Numbered) =
            taken.into_iter().enumerate().partition(|(n, t)| {
                crate::index::page_eq(block.page_addr(t.k), copies[n * PAGE..].as_ptr())
                    && self.patch_still_exact(t.handle, &copies[n * PAGE..])
            });
        rep.changed += changed.len() as u64;
        self.unstore(changed.into_iter().map(|(_, t)| t));
        keep.into_iter().map(|(_, t)| t).collect()
    }

    /// Removes stored copies of pages that stay in memory after all.
    fn unstore(&self, pages: impl Iterator<Item = Taken>) {
        if let Some(ev) = &self.restoring.evictions {
            let mut t = ev.lock();
            pages.for_each(|p| t.drop_content(p.handle));
        }
    }

    /// Records, registers and frees the taken pages, run by run.
    fn arm_and_free(
        &mut self,
        base: usize,
        taken: Vec<Taken>,
        copies: &[u8],
        rep: &mut EvictReport,
    ) {
        let Some(ev) = self.restoring.evictions.clone() else {
            return;
        };
        let guard = self.pin_guard();
        let mut runs: Vec<Vec<Taken>> = Vec::new();
        for t in taken {
            match runs.last_mut() {
                Some(run)
                    if run
                        .last()
                        .is_some_and(|l| l.k + 1 == t.k && same_free(l, &t)) =>
                {
                    run.push(t)
                }
                _ => runs.push(vec![t]),
            }
        }
        for run in runs {
            let (a, n) = (run[0].k, run.len());
            if !self.vma_room(self.blocks[&base].remap_cost(a, n)) {
                self.stats.fallbacks.vma_budget += 1;
                rep.skipped_vma += n as u64;
                self.unstore(run.into_iter());
                continue;
            }
            if guard && run[0].kind == Restores::Anon {
                self.evict_anon_run(base, run, copies, &ev, rep);
                continue;
            }
            crate::race::pause();
            if !self.arm(base, a, n) {
                // Still in memory and right; the chunk's end unregisters the run.
                self.unstore(run.into_iter());
                continue;
            }
            crate::race::pause();
            self.free_run(base, &run);
            crate::race::pause();
            // Recorded only once freed: a fault answered before this (one
            // queued before the page was last restored, or by a touch of the
            // fresh hole) finds no record and is only woken. Recorded
            // earlier, a late fault's UFFDIO_COPY would meet the page still
            // present (EEXIST) and mark it restored; the hole punched next
            // would then be answered with the zero page, into the frame.
            // Evicted even if freeing failed (part of) the run: a page still
            // present reads what was stored, and one freed faults and is restored.
            {
                let mut t = ev.lock();
                run.iter()
                    .for_each(|p| t.insert(self.blocks[&base].page_addr(p.k) as usize, p.handle));
            }
            self.mark_evicted(base, &run, rep);
        }
    }

    /// Under the pin guard a run of anonymous pages leaves its addresses
    /// through the pin test (detach.rs) rather than MADV_DONTNEED: a page
    /// the kernel may have pinned, or that a write through an earlier pin
    /// changed since it was stored, stays in memory, and its stored copy goes.
    fn evict_anon_run(
        &mut self,
        base: usize,
        run: Vec<Taken>,
        copies: &[u8],
        ev: &Arc<Evictions>,
        rep: &mut EvictReport,
    ) {
        let a = run[0].k;
        let mut gone = vec![false; run.len()];
        for (p, len) in self.scratch_pieces(a, run.len()) {
            let stored = |_: &State, j: usize| Some(copies[run[p - a + j].copy * PAGE..].as_ptr());
            let d = self.detach(base, p, len, &stored);
            {
                // The holes are registered MISSING: from now on a touch restores.
                let mut t = ev.lock();
                for j in (0..len).filter(|&j| d.taken[j]) {
                    let tk = &run[p - a + j];
                    t.insert(self.blocks[&base].page_addr(tk.k) as usize, tk.handle);
                    gone[p - a + j] = true;
                }
            }
            self.finish_detach(d);
        }
        let mut out = Vec::new();
        let mut stay = Vec::new();
        for (g, t) in gone.into_iter().zip(run) {
            if g {
                out.push(t)
            } else {
                stay.push(t)
            }
        }
        // Counted by the pin test: `pin_refused`, `pin_changed`.
        self.unstore(stay.into_iter());
        let ks: Vec<usize> = out.iter().map(|t| t.k).collect();
        let mut rest = out.into_iter();
        for (x, y) in crate::space::consecutive(&ks) {
            let part: Vec<Taken> = rest.by_ref().take(y - x).collect();
            self.mark_evicted(base, &part, rep);
        }
    }

    /// Registers pages `[a, a+n)` for MISSING faults (and WP, as the chunk is).
    fn arm(&self, base: usize, a: usize, n: usize) -> bool {
        let addr = self.blocks[&base].page_addr(a);
        self.protector
            .as_ref()
            .is_some_and(|p| p.register_missing(addr, n * PAGE).is_ok())
    }

    /// Frees the memory of a run of stored pages freed the same way.
    fn free_run(&mut self, base: usize, run: &[Taken]) {
        let addr = self.blocks[&base].page_addr(run[0].k);
        let n = run.len();
        // A frame a patch pins as its reference must never be punched (patching.rs).
        debug_assert!(run.iter().all(|t| t
            .punch
            .is_none_or(|f| self.pools[f.pool()].refs(f.slot()) == 1)));
        let _ = match run[0].punch {
            Some(f) => sys::punch(self.pools[f.pool()].fd, f.slot(), n as u64),
            None => sys::madvise(addr, n * PAGE, libc::MADV_DONTNEED),
        };
    }

    /// Page states, frame references, mapping count and counts after a run was evicted.
    fn mark_evicted(&mut self, base: usize, run: &[Taken], rep: &mut EvictReport) {
        let (a, n) = (run[0].k, run.len());
        let patched = run
            .iter()
            .filter(|p| matches!(p.handle, Content::Patch(_)))
            .count() as u64;
        rep.evicted += n as u64;
        rep.patched += patched;
        self.stats.evicted += n as u64;
        self.stats.patched += patched;
        for t in run {
            // A sole shared page's frame (punched) now holds nothing anyone needs.
            if let Page::Shared(f) = self.blocks[&base].pages[t.k] {
                self.pools[f.pool()].diverge(f.slot());
            }
        }
        let block = self
            .blocks
            .get_mut(&base)
            .expect("block vanished under the lock");
        let before = block.boundaries(a, n);
        for t in run {
            block.set(t.k, Page::Evicted(t.kind));
            block.seen[t.k] = crate::seen::on_evict(block.seen[t.k]);
        }
        let after = block.boundaries(a, n);
        block.vmas = block.vmas + after - before;
        self.mappings.changed(before, after);
    }
}

/// Neighbouring pages `b` after `a` that one system call frees together
/// and one registration covers as one mapping.
fn same_free(a: &Taken, b: &Taken) -> bool {
    let next = |x: FrameId, y: FrameId| x.pool() == y.pool() && y.0 == x.0 + 1;
    let same_kind = match (a.kind, b.kind) {
        (Restores::Anon, Restores::Anon) => true,
        (Restores::Owned(x), Restores::Owned(y))
        | (Restores::Diverged(x), Restores::Diverged(y)) => next(x, y),
        _ => false,
    };
    same_kind
        && match (a.punch, b.punch) {
            (None, None) => true,
            (Some(x), Some(y)) => next(x, y),
            _ => false,
        }
}

/// A clock pass's pages of a protected chunk (`Tiering`, pass.rs): the
/// references are noted for patching, then the chosen pages are evicted
/// as each one's `Allow` permits.
pub(crate) fn tier_chunk(
    st: &mut State,
    base: usize,
    chunk: Range<usize>,
    chosen: &[(usize, Allow)],
    references: &[usize],
    pass: &mut Pass,
) {
    for &k in references {
        st.note_reference(base, k);
    }
    if pass.evict && !chosen.is_empty() {
        st.evict_chosen(base, chunk, chosen, pass);
    }
}

impl State {
    /// Evicts the chosen pages; what they freed counts against the excess.
    fn evict_chosen(
        &mut self,
        base: usize,
        chunk: Range<usize>,
        chosen: &[(usize, Allow)],
        pass: &mut Pass,
    ) {
        let stored = |st: &State| {
            st.restoring.evictions.as_ref().map_or(0, |ev| {
                let b = ev.lock().store.bytes();
                b.payload + b.overhead
            })
        };
        let before = stored(self);
        let mut rep = EvictReport::default();
        self.evict_pages(base, chunk, chosen, &mut rep);
        pass.counts.evicted += rep.evicted;
        pass.counts.not_eligible += rep.not_eligible + rep.unprotected + rep.untested;
        pass.counts.refused += rep.refused;
        // Only a patch was allowed and none applied (or nothing was allowed).
        pass.counts.not_allowed += rep.not_allowed + rep.unpatched;
        let freed = (rep.evicted * PAGE as u64).saturating_sub(stored(self).saturating_sub(before));
        pass.shed = pass.shed.saturating_sub(freed);
    }
}
