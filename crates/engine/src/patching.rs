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

use std::ops::Range;
use std::time::Instant;

use pagefold_tier::similar::MAX_BLOCKS;

use crate::frames::FrameId;
use crate::patches::{Content, Patching};
use crate::space::{Page, Restores};
use crate::state::State;
use crate::sys::{self, PAGE};

/// Candidates a page is encoded against at most (each try costs an encode).
const MAX_TRIES: usize = 4;

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

/// A page taken into the store in this chunk, not yet armed.
pub(crate) struct Taken {
    pub k: usize,
    pub kind: Restores,
    /// Its memory is freed by punching this frame (owned, sole shared), else by MADV_DONTNEED.
    pub punch: Option<FrameId>,
    pub handle: Content,
    /// Which page of the chunk's copies holds what was stored.
    pub copy: usize,
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

impl State {
    /// `Engine::note_references` over `[start, end)`.
    pub(crate) fn note_references(&mut self, start: usize, end: usize) -> u64 {
        let mut noted = 0;
        for base in self.overlapping(start, end) {
            let b = &self.blocks[&base];
            let (lo, hi) = (
                (start.max(base) - base) / PAGE,
                (end.min(base + b.len()) - base).div_ceil(PAGE),
            );
            noted += (lo..hi).filter(|&k| self.note_reference(base, k)).count() as u64;
        }
        noted
    }

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
        if let Some(ev) = &self.restoring.evictions {
            ev.lock().drop_content(t.handle);
        }
    }

    /// Encodes `page` against the reference and stores the patch, pinning
    /// the reference frame; None if it does not fit or cannot be stored.
    fn store_patch(&mut self, page: &[u8; PAGE], r: &Reference) -> Option<Content> {
        let ev = self.restoring.evictions.clone()?;
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
        let Some(ev) = &self.restoring.evictions else {
            return false;
        };
        let mut out = [0u8; PAGE];
        ev.lock().patches.decode(id, &mut out) && out[..] == copy[..PAGE]
    }
}

#[cfg(test)]
mod tests {
    use crate::{Allow, EvictReport};
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
