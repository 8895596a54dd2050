//! Patching: a page evicted as the few bytes that rebuild it from a similar
//! page kept in memory (Difference Engine's patching, in user space).
//!
//! When eviction (evict.rs) takes a page and patching is allowed, it asks the
//! similarity detector (pagefold-tier's `Detector`, DE's
//! HashSimilarityDetector) for candidate reference pages: pages the engine
//! has seen whose sampled blocks hash like this page's. A candidate must be
//! resident and backed by a frame that cannot change: a frozen frame
//! (`Page::Shared`), or an owned page, which is frozen for the purpose
//! (remapped privately onto its own frame, as a virtual copy does: later
//! writes make the kernel copy the page, the frame keeps its bytes). The
//! page is encoded against the frame's content with pagefold-tier's
//! `Patcher` (its `runs` encoder, zstd with the reference as prefix as the
//! fallback) and kept as a patch only if that is at most half a page; else
//! the next candidate is tried, then the page store (if allowed).
//! A page that finds no reference becomes a candidate itself. If it was
//! already taken into the store in the same chunk and a later page chooses
//! it, it is put back (its stored copy dropped) to serve as the reference.
//!
//! Protecting the reference: every patch holds one reference on its frame
//! (`Pool::pin`), so the frame outlives writes (copy-on-write breaks) and
//! frees of the pages that map it, and nothing punches or reuses it — every
//! punch path looks at the frame's reference count, and eviction takes only
//! frames with a single reference. Patches are checked once more after the
//! pin grace, as stored copies are: decoded against the frame as it is then,
//! they must give the page's bytes, or the page stays in memory.
//!
//! Restoring: the fault thread (fault.rs) may not take the engine lock nor
//! allocate. A patch record holds its frame's slot and the patch store its own
//! descriptor of the frame's memfd (a dup, so a patch outlives the engine's
//! handles: the fault thread serves pages even after the engine is dropped,
//! and a closed descriptor's number reused by the program can never be read
//! as a reference), so the thread reads the reference with pread(2) into a stack buffer, the patch from the
//! patch store (a pagefold-tier slab store, counted in the footprint) and
//! decodes with a preallocated decoder, all under the eviction table's lock.
//! A patch that does not decode poisons the page (SIGBUS), never wrong bytes.
//! Dropping a patch (its page restored and reconciled, freed or replaced)
//! happens under the table lock, where the frame pool is out of reach: the
//! frame goes to a queue, and the engine releases the pin under its own lock
//! (`State::settle_pins`, after every path that forgets evicted pages).

use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

use pagefold_tier::patch::{Encoder, Patcher};
use pagefold_tier::similar::{Detector, SimilarityParams, MAX_BLOCKS};
use pagefold_tier::store::{Handle as SlabHandle, Store, StoreConfig};

use crate::engine::State;
use crate::evict::Taken;
use crate::fds::Fd;
use crate::frames::FrameId;
use crate::space::Page;
use crate::store::Handle;
use crate::{sys, PAGE};

/// Candidates a page is encoded against at most (each try costs an encode).
const MAX_TRIES: usize = 4;

/// Where an evicted page's content is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Content {
    /// In the page store.
    Stored(Handle),
    /// A patch in the table's patch store.
    Patch(u32),
}

/// One patch: its bytes in the slab store and the frame it applies to.
#[derive(Clone, Copy)]
struct PatchEntry {
    bytes: SlabHandle,
    frame: FrameId,
}

/// The patches, kept with the eviction table (under its lock) because the
/// fault thread reads them.
pub(crate) struct Patches {
    /// Made on the first patch (it reserves address space).
    slab: Option<Store>,
    entries: Vec<Option<PatchEntry>>,
    free: Vec<u32>,
    /// Decodes on the fault thread; made and warmed up on an engine thread.
    decoder: Patcher,
    /// Per pool: our duplicate of its memfd and the patches using it (closed at zero).
    fds: Vec<(Option<Fd>, u32)>,
    /// Frames whose patch is gone; the engine unpins them (`settle_pins`).
    unpinned: Vec<FrameId>,
    /// Forced decode failure (`Inject::fail_patch`).
    pub fail_decode: bool,
    /// Patches read back to restore a page, and the time that took
    /// (reference read, patch read, decode; the fault round trip excluded).
    reads: u64,
    read_ns: u64,
}

impl Default for Patches {
    fn default() -> Self {
        Patches {
            slab: None,
            entries: Vec::new(),
            free: Vec::new(),
            decoder: warm_decoder(),
            fds: Vec::new(),
            unpinned: Vec::new(),
            fail_decode: false,
            reads: 0,
            read_ns: 0,
        }
    }
}

/// A decoder that has decoded once, so that its zstd context has every
/// buffer it needs before the fault thread uses it.
fn warm_decoder() -> Patcher {
    let mut d = Patcher::new();
    let reference: Vec<u8> = (0..PAGE).map(|i| (i * 7 / 3) as u8).collect();
    let mut page = reference.clone();
    page[100..1400].iter_mut().for_each(|b| *b ^= 0x5a);
    let mut zstd = Patcher::with(Encoder::ZstdRef, None, PAGE);
    let mut out = vec![0u8; PAGE];
    if let Some(p) = zstd.make(&page, &reference) {
        let _ = d.apply(p, &reference, &mut out);
    }
    d
}

impl Drop for Patches {
    fn drop(&mut self) {
        // Each held duplicate is this table's own; the table is going, so each closes once.
        self.fds
            .iter_mut()
            .filter_map(|(fd, _)| fd.take())
            .for_each(Fd::close);
    }
}

impl Patches {
    /// Stores `patch` against `frame` (of memfd `fd`); None if the store is
    /// unavailable or full (the page then goes elsewhere).
    fn insert(&mut self, patch: &[u8], frame: FrameId, fd: Fd) -> Option<u32> {
        if self.slab.is_none() {
            self.slab = Store::new(StoreConfig {
                reserve_bytes: 16 << 30,
                ..StoreConfig::default()
            })
            .ok();
        }
        self.hold_fd(frame.pool(), fd)?;
        let Ok(bytes) = self.slab.as_mut()?.insert(patch) else {
            self.release_fd(frame.pool());
            return None;
        };
        let entry = Some(PatchEntry { bytes, frame });
        Some(match self.free.pop() {
            Some(id) => {
                self.entries[id as usize] = entry;
                id
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        })
    }

    /// Rebuilds the page of patch `id` into `out` to restore it; false if
    /// it cannot (the caller poisons the page). Runs on the fault thread: no allocation.
    pub fn read(&mut self, id: u32, out: &mut [u8; PAGE]) -> bool {
        let t0 = Instant::now();
        let ok = !self.fail_decode && self.decode(id, out);
        self.reads += 1;
        self.read_ns += t0.elapsed().as_nanos() as u64;
        ok
    }

    /// As `read`, without injected failures.
    fn decode(&mut self, id: u32, out: &mut [u8; PAGE]) -> bool {
        let Some(Some(e)) = self.entries.get(id as usize).copied() else {
            return false;
        };
        let Some(slab) = &self.slab else { return false };
        let Ok(patch) = slab.get(e.bytes) else {
            return false;
        };
        let mut reference = [0u8; PAGE];
        let Some(&(Some(fd), _)) = self.fds.get(e.frame.pool()) else {
            return false;
        };
        if !sys::pread_frame(fd, e.frame.slot(), &mut reference) {
            return false;
        }
        self.decoder.apply(patch, &reference, out).is_ok()
    }

    /// Drops patch `id`; its frame's pin is released by the engine later.
    pub fn remove(&mut self, id: u32) {
        let Some(e) = self.entries.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        if let Some(slab) = self.slab.as_mut() {
            let _ = slab.remove(e.bytes);
        }
        self.free.push(id);
        self.release_fd(e.frame.pool());
        self.unpinned.push(e.frame);
    }

    /// One more patch reads pool `pool` (memfd `fd`): our duplicate of it.
    fn hold_fd(&mut self, pool: usize, fd: Fd) -> Option<()> {
        if self.fds.len() <= pool {
            self.fds.resize(pool + 1, (None, 0));
        }
        let slot = &mut self.fds[pool];
        if slot.1 == 0 {
            slot.0 = Some(fd.duplicate().ok()?);
        }
        slot.1 += 1;
        Some(())
    }

    fn release_fd(&mut self, pool: usize) {
        let slot = &mut self.fds[pool];
        slot.1 -= 1;
        if slot.1 == 0 {
            if let Some(fd) = slot.0.take() {
                fd.close();
            }
        }
    }

    /// Patches stored now, their bytes, the patch store's footprint (slabs,
    /// cached slabs, its tables and ours) and restore counts, into `s`.
    pub fn stats(&self, s: &mut crate::Stats) {
        let ours = (self.entries.capacity() * std::mem::size_of::<Option<PatchEntry>>()
            + self.free.capacity() * 4) as u64;
        let (n, payload, footprint) = match &self.slab {
            Some(st) => {
                let st = st.stats();
                (st.objects, st.payload_bytes, st.footprint_bytes() + ours)
            }
            None => (0, 0, ours),
        };
        s.patched_now = n;
        s.patch_bytes = payload;
        s.patch_store_bytes = footprint;
        s.patch_restores = self.reads;
        s.patch_restore_ns = self.read_ns;
    }
}

/// The engine side of patching (under the engine lock): the detector, the
/// encoder, and how many patches pin each frame.
pub(crate) struct Patching {
    detector: Detector,
    encoder: Patcher,
    pins: HashMap<FrameId, u32>,
    /// Where the detector samples its blocks (index i: one block at offsets[i]).
    offsets: Vec<usize>,
    max_candidates: usize,
    /// Time spent looking for references and encoding (all pages tried).
    work_ns: u64,
}

impl Patching {
    fn new(cfg: &crate::Config) -> Patching {
        let params = SimilarityParams {
            k: cfg.patch_blocks,
            s: 1,
            candidates: 1,
            block: cfg.patch_block_bytes,
            ..SimilarityParams::default()
        };
        // Bad parameters from the environment fall back to DE's.
        let detector = Detector::new(params).unwrap_or_else(|_| {
            Detector::new(SimilarityParams::default()).expect("DE's parameters are valid")
        });
        let offsets = detector.params().offsets();
        Patching {
            detector,
            encoder: Patcher::new(),
            pins: HashMap::new(),
            offsets,
            max_candidates: cfg.patch_candidates.max(1),
            work_ns: 0,
        }
    }
}

impl Patching {
    /// Indexes `page` (at `addr`) as a candidate reference.
    fn index(&mut self, page: &[u8; PAGE], addr: u64) {
        let mut keys = [0u64; MAX_BLOCKS];
        let kn = self.detector.params().k;
        self.keys(page, addr, &mut keys[..kn]);
        self.insert(addr, &keys[..kn]);
    }

    /// Indexes keys under `addr`, starting afresh when the index is full.
    fn insert(&mut self, addr: u64, keys: &[u64]) {
        if self.detector.len() >= self.max_candidates {
            self.detector.clear();
        }
        self.detector.insert_keys(addr, keys);
    }

    /// The detector's keys of `page` (at `addr`). A sampled block of one
    /// repeated byte (zeros, padding) says nothing about similarity — small
    /// blocks would pair every page holding zeros there — so its key is
    /// made unique to the page: it matches nothing.
    fn keys(&self, page: &[u8; PAGE], addr: u64, keys: &mut [u64]) {
        self.detector.keys_into(page, keys);
        let block = self.detector.params().block;
        for (i, (&o, key)) in self.offsets.iter().zip(keys.iter_mut()).enumerate() {
            let b = &page[o..o + block];
            if b.iter().all(|&x| x == b[0]) {
                *key =
                    xxhash_rust::xxh3::xxh3_64_with_seed(&addr.to_le_bytes(), i as u64) | 1 << 63;
            }
        }
    }
}

/// Whether a page with these bytes may be a reference. Not if it starts with
/// zstd's dictionary magic: a zstd-ref patch against it would need a one-off
/// decoder context, i.e. an allocation on the fault thread.
fn may_serve(bytes: &[u8; PAGE]) -> bool {
    bytes[..4] != 0xEC30_A437u32.to_le_bytes()
}

/// Why a candidate is no reference for a page.
enum Unusable {
    /// It cannot serve any page now (forget it).
    Stale,
    /// It is too different from this page.
    TooFar,
}

/// The protected chunk eviction works on: its pages, those taken so far and
/// their bytes (one page each, in order).
pub(crate) struct Chunk<'a> {
    pub pages: Range<usize>,
    pub taken: &'a mut Vec<Taken>,
    pub copies: &'a mut Vec<u8>,
}

/// A reference the encoder may use: the frame and a copy of its bytes.
struct Reference {
    frame: FrameId,
    bytes: [u8; PAGE],
}

impl crate::Engine {
    /// Indexes the pages overlapping `[ptr, ptr+len)` as candidate references
    /// for patching (pages the program or a policy expects to stay in memory
    /// while similar ones are evicted). Only pages on frames qualify (owned or
    /// shared); returns how many were indexed. A hint: changes no page.
    pub fn note_references(&self, ptr: *const u8, len: usize) -> u64 {
        let (start, end) = (ptr as usize, (ptr as usize).saturating_add(len));
        let mut st = self.inner.lock();
        let mut noted = 0;
        for base in st.overlapping(start, end) {
            let b = &st.blocks[&base];
            let (lo, hi) = (
                (start.max(base) - base) / PAGE,
                (end.min(base + b.len()) - base).div_ceil(PAGE),
            );
            noted += (lo..hi).filter(|&k| st.note_reference(base, k)).count() as u64;
        }
        noted
    }
}

impl State {
    /// Indexes page `k` of a block as a candidate reference (its frame's
    /// bytes, read with pread: no program memory is touched); false if it
    /// has no frame or holds nothing. The policy offers its C2 pages here.
    pub(crate) fn note_reference(&mut self, base: usize, k: usize) -> bool {
        let b = &self.blocks[&base];
        let frame = match b.pages[k] {
            Page::Owned(f) | Page::Shared(f) if !b.exempt && !self.pools[f.pool()].retired => f,
            _ => return false,
        };
        let mut bytes = [0u8; PAGE];
        if !sys::pread_frame(self.pools[frame.pool()].fd, frame.slot(), &mut bytes)
            || !may_serve(&bytes)
            || bytes.iter().all(|&x| x == 0)
        {
            return false;
        }
        let addr = b.page_addr(k) as u64;
        let p = self
            .patching
            .get_or_insert_with(|| Patching::new(&self.cfg));
        p.index(&bytes, addr);
        true
    }

    /// Tries to evict page `k` of block `base` (bytes `page`, read in the
    /// protected chunk `chunk`) as a patch; on success returns its content.
    /// A candidate among the chunk's pages already taken that becomes a
    /// reference is put back. Without a reference the page becomes a candidate.
    pub(crate) fn patch_page(
        &mut self,
        base: usize,
        k: usize,
        page: &[u8; PAGE],
        chunk: &mut Chunk,
    ) -> Option<Content> {
        let t0 = Instant::now();
        let c = self.find_patch(base, k, page, chunk);
        if let Some(p) = self.patching.as_mut() {
            p.work_ns += t0.elapsed().as_nanos() as u64;
        }
        c
    }

    fn find_patch(
        &mut self,
        base: usize,
        k: usize,
        page: &[u8; PAGE],
        chunk: &mut Chunk,
    ) -> Option<Content> {
        let addr = self.blocks[&base].page_addr(k) as u64;
        let mut keys = [0u64; MAX_BLOCKS];
        let mut candidates = Vec::new();
        {
            let p = self
                .patching
                .get_or_insert_with(|| Patching::new(&self.cfg));
            let kn = p.detector.params().k;
            p.keys(page, addr, &mut keys[..kn]);
            p.detector.candidates_keys(&keys[..kn], &mut candidates);
        }
        for cand in candidates
            .into_iter()
            .filter(|&c| c != addr)
            .take(MAX_TRIES)
        {
            match self.reference(cand as usize, base, chunk, page) {
                Ok(r) => {
                    if let Some(c) = self.store_patch(page, &r) {
                        return Some(c);
                    }
                }
                Err(Unusable::Stale) => {
                    self.patching.as_mut().map(|p| p.detector.remove(cand));
                }
                Err(Unusable::TooFar) => {}
            }
        }
        let p = self.patching.as_mut().expect("made above");
        let kn = p.detector.params().k;
        p.insert(addr, &keys[..kn]);
        None
    }

    /// The candidate page at `addr` as a reference for `page`: resident and
    /// on a frozen frame (an owned page is frozen now, and put back if this
    /// chunk had taken it). None if it cannot serve (gone, evicted, anonymous,
    /// diverged, exempt, pre-fork: stale) or its patch would not fit (too
    /// far; then nothing changed).
    fn reference(
        &mut self,
        addr: usize,
        base: usize,
        chunk: &mut Chunk,
        page: &[u8; PAGE],
    ) -> Result<Reference, Unusable> {
        let cb = self
            .find(addr, PAGE)
            .filter(|b| !self.blocks[b].exempt)
            .ok_or(Unusable::Stale)?;
        let ck = (addr - cb) / PAGE;
        let frame = match self.blocks[&cb].pages[ck] {
            Page::Shared(f)
                if self.pools[f.pool()].is_stable(f.slot()) && !self.pools[f.pool()].retired =>
            {
                f
            }
            Page::Owned(f) if !self.pools[f.pool()].retired => f,
            _ => return Err(Unusable::Stale),
        };
        let mut r = Reference {
            frame,
            bytes: [0u8; PAGE],
        };
        if !sys::pread_frame(self.pools[frame.pool()].fd, frame.slot(), &mut r.bytes)
            || !may_serve(&r.bytes)
        {
            return Err(Unusable::Stale);
        }
        let inside = cb == base && chunk.pages.contains(&ck);
        // Taken in this chunk, its frame is about to be punched.
        let in_taken = inside && chunk.taken.iter().any(|t| t.k == ck);
        let owned = matches!(self.blocks[&cb].pages[ck], Page::Owned(_));
        if owned || in_taken {
            // Freezing and putting back have costs: only for a patch that fits.
            let encoder = &mut self.patching.as_mut().expect("made by patch_page").encoder;
            encoder.make(page, &r.bytes).ok_or(Unusable::TooFar)?;
        }
        if in_taken {
            self.untake(ck, chunk);
        }
        if owned {
            // A page outside the chunk must not stay registered once frozen.
            let was = std::mem::replace(&mut self.scanning, inside);
            self.freeze(cb, ck, 1);
            self.scanning = was;
            if self.blocks[&cb].pages[ck] != Page::Shared(frame) {
                return Err(Unusable::Stale);
            }
            // Frozen now: what the frame holds from here on is the reference.
            if !sys::pread_frame(self.pools[frame.pool()].fd, frame.slot(), &mut r.bytes)
                || !may_serve(&r.bytes)
            {
                return Err(Unusable::Stale);
            }
        }
        Ok(r)
    }

    /// Page `k` of this chunk, taken into the store, stays in memory after all.
    fn untake(&mut self, k: usize, chunk: &mut Chunk) {
        let Some(n) = chunk.taken.iter().position(|t| t.k == k) else {
            return;
        };
        let t = chunk.taken.remove(n);
        chunk.copies.drain(n * PAGE..(n + 1) * PAGE);
        if let Some(ev) = &self.evictions {
            ev.lock().drop_content(t.handle);
        }
    }

    /// Encodes `page` against the reference and stores the patch, pinning
    /// the reference frame; None if it does not fit or cannot be stored.
    fn store_patch(&mut self, page: &[u8; PAGE], r: &Reference) -> Option<Content> {
        let ev = self.evictions.clone()?;
        let fd = self.pools[r.frame.pool()].fd;
        let p = self.patching.as_mut().expect("made by patch_page");
        let patch = p.encoder.make(page, &r.bytes)?;
        let id = ev.lock().patches.insert(patch, r.frame, fd)?;
        *p.pins.entry(r.frame).or_default() += 1;
        self.pools[r.frame.pool()].pin(r.frame.slot());
        Some(Content::Patch(id))
    }

    /// Whether `content` still rebuilds `copy` exactly (checked after the pin
    /// grace: the reference frame may have taken a late write through a
    /// kernel pin). Stored content is compared by the caller.
    pub(crate) fn patch_still_exact(&self, content: Content, copy: &[u8]) -> bool {
        let Content::Patch(id) = content else {
            return true;
        };
        let Some(ev) = &self.evictions else {
            return false;
        };
        let mut out = [0u8; PAGE];
        ev.lock().patches.decode(id, &mut out) && out[..] == copy[..PAGE]
    }

    /// Releases the pins of patches dropped since the last call: frames no
    /// page and no patch needs any more are punched (and reused if unmapped).
    pub(crate) fn settle_pins(&mut self) {
        let Some(ev) = &self.evictions else { return };
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

    /// Patching's part of the statistics (the patch store's with the eviction table's).
    pub(crate) fn patch_stats(&self, s: &mut crate::Stats) {
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
}

#[cfg(test)]
mod tests {
    use crate::evict::{Allow, EvictReport};
    use crate::{Config, Engine, Hint, PAGE};

    /// Patch-only eviction page by page: even pages may be patched, odd
    /// ones are not offered; all pages are one reference's variants.
    #[test]
    fn patch_only_eviction_takes_the_pages_offered() {
        let e = Engine::new(Config {
            pin_grace: std::time::Duration::ZERO,
            ..Config::default()
        });
        let n = 16;
        let reference: Vec<u8> = (0..PAGE).map(|i| (i * 31 % 251) as u8 | 1).collect();
        let p = e.alloc(n * PAGE, Hint::None);
        for k in 0..n {
            let mut page = reference.clone();
            page[k * 7] ^= 0x55;
            // SAFETY: p is a live block of n * PAGE bytes from e.alloc above and k < n, so p +
            // k * PAGE has PAGE writable bytes; page is a separate Vec of PAGE bytes.
            unsafe { std::ptr::copy_nonoverlapping(page.as_ptr(), p.add(k * PAGE), PAGE) };
        }
        assert_eq!(e.note_references(p, PAGE), 1);
        let mut rep = EvictReport::default();
        for k in (0..n).step_by(2) {
            let r = e.evict_with(
                // SAFETY: k < n, so p + k * PAGE stays inside the n-page block p returned by
                // e.alloc.
                unsafe { p.add(k * PAGE) },
                PAGE,
                Allow {
                    patch: true,
                    compress: false,
                },
            );
            rep.patched += r.patched;
            rep.unpatched += r.unpatched;
        }
        // Page 0 is the reference; pages 2, 4, .. 14 are patched; odd pages are left.
        assert_eq!(
            (rep.patched, rep.unpatched),
            (7, 1),
            "the reference itself finds no other reference: {rep:?}"
        );
        for k in 0..n {
            // SAFETY: k < n: page k of the live block p (n * PAGE bytes from e.alloc), read
            // only while no other code writes it.
            let got = unsafe { std::slice::from_raw_parts(p.add(k * PAGE), PAGE) };
            assert_eq!(got[k * 7], reference[k * 7] ^ 0x55);
        }
        // SAFETY: p is the block from e.alloc above and is not used after this.
        assert!(unsafe { e.free(p) });
        assert_eq!(e.stats().references_pinned, 0);
    }
}
