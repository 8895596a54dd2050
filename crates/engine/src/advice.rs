//! What a program does to its blocks besides writing and copying them:
//! discarding pages (madvise MADV_DONTNEED / MADV_FREE), changing their
//! protection or per-mapping flags (mprotect, mlock, MADV_DONTFORK, ...), and
//! shrinking them (realloc). The preload routes those calls here.
//!
//! On private anonymous memory MADV_DONTNEED makes pages read zero and frees
//! them. On engine pages the kernel would not do that: an owned page
//! (MAP_SHARED) only loses its page table entry while the frame keeps the
//! bytes, and a diverged page reverts to its frame. So the engine discards
//! itself: owned frames are punched (the page stays owned, reads zero, costs
//! nothing), shared and diverged pages are remapped onto fresh owned frames
//! (their old frames lose a reference and are freed with the last one), so
//! the block stays one the engine can share by copy. Pages that already are
//! plain anonymous memory go back to the caller, for the kernel to treat
//! exactly as it treats plain memory (MADV_FREE stays lazy there).
//!
//! Protection and flags such as VM_DONTCOPY live in the kernel's mappings,
//! which the engine replaces whenever it remaps (copies, merges, folds, fork).
//! Scanning a PROT_NONE page would kill the process; remapping a read-only
//! page would silently undo a garbage collector's write barrier. So a block
//! whose protection or flags the program changes is *exempted* first: its
//! content moves onto one plain anonymous mapping (writers sleep under write
//! protection meanwhile), and the engine never scans, remaps or shares it again.
//!
//! Evicted pages (evict.rs): a discard remaps them onto fresh frames (their
//! stored copies are dropped, nothing is restored); shrinking drops those cut
//! off; exempting restores them first, since the block leaves the engine's hands.

use crate::frames::FrameId;
use crate::space::{runs, Page};
use crate::state::State;
use crate::sys::{self, PAGE};

/// How one page is discarded.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Discard {
    /// Plain anonymous memory: the kernel's madvise, under the engine lock.
    Kernel,
    /// An owned frame of a live pool: punch it, keep the mapping.
    Punch,
    /// Shared or diverged (or owned in a retired pool): remap anonymous.
    Remap,
}

/// Pages a block moving onto anonymous memory moves at a time (2 MiB).
const MOVE_PIECE: usize = 512;

/// End of `[start, start+len)` rounded up to a page, as the kernel's madvise
/// does; None if `start` is not page-aligned, `len` is 0 or the range wraps.
pub(crate) fn page_range(start: usize, len: usize) -> Option<usize> {
    if !start.is_multiple_of(PAGE) || len == 0 {
        return None;
    }
    let rounded = len.checked_add(PAGE - 1)? & !(PAGE - 1);
    start.checked_add(rounded)
}

/// Appends `[a, b)` to a list of ranges, joining it to the last one if they touch.
fn push(ranges: &mut Vec<(usize, usize)>, a: usize, b: usize) {
    if a >= b {
        return;
    }
    match ranges.last_mut() {
        Some((s, l)) if *s + *l == a => *l += b - a,
        _ => ranges.push((a, b - a)),
    }
}

impl State {
    pub(crate) fn discard(&mut self, start: usize, end: usize) -> Vec<(usize, usize)> {
        let mut pass = Vec::new();
        let mut at = start;
        for base in self.overlapping(start, end) {
            let lo = start.max(base);
            let hi = end.min(base + self.blocks[&base].len());
            push(&mut pass, at, lo);
            self.discard_pages(base, (lo - base) / PAGE, (hi - lo) / PAGE, &mut pass);
            at = hi;
        }
        push(&mut pass, at, end);
        pass
    }

    fn discard_kind(&self, base: usize, k: usize) -> Discard {
        match self.blocks[&base].pages[k] {
            Page::Anon => Discard::Kernel,
            Page::Owned(f) if !self.pools[f.pool()].retired => Discard::Punch,
            _ => Discard::Remap,
        }
    }

    /// Discards pages `[i, i+n)` of a block.
    fn discard_pages(&mut self, base: usize, i: usize, n: usize, pass: &mut Vec<(usize, usize)>) {
        let mut a = i;
        while a < i + n {
            let kind = self.discard_kind(base, a);
            let b = (a + 1..i + n)
                .find(|&k| self.discard_kind(base, k) != kind)
                .unwrap_or(i + n);
            let addr = self.blocks[&base].page_addr(a) as usize;
            match kind {
                Discard::Kernel => self.discard_anon(addr, (b - a) * PAGE, pass),
                Discard::Punch => self.punch_owned(base, a, b),
                Discard::Remap => self.remap_zero(base, a, b),
            }
            if kind != Discard::Kernel {
                self.stats.discarded += (b - a) as u64;
            }
            a = b;
        }
    }

    /// Plain anonymous pages: MADV_DONTNEED here, under the engine lock, not
    /// by the caller after it: a scan in between could merge such a page
    /// onto a frame, and MADV_DONTNEED on a private frame mapping brings the
    /// frame's bytes back instead of zeros. What the kernel refuses goes to
    /// `pass`, for the caller to try and report.
    fn discard_anon(&mut self, addr: usize, len: usize, pass: &mut Vec<(usize, usize)>) {
        if sys::madvise(addr as *mut u8, len, libc::MADV_DONTNEED).is_err() {
            push(pass, addr, addr + len);
        }
    }

    /// Owned pages `[a, b)`: their frames are punched; the mapping stays and reads zero.
    fn punch_owned(&mut self, base: usize, a: usize, b: usize) {
        let owned = |s: &State, k: usize| match s.blocks[&base].pages[k] {
            Page::Owned(f) => Some(f),
            _ => None,
        };
        for (x, y) in runs(a..b, |k| owned(self, k)) {
            let f = owned(self, x).expect("run starts owned");
            if sys::punch(self.pools[f.pool()].fd, f.slot(), (y - x) as u64).is_err() {
                // The bytes must go even if the memory stays.
                // SAFETY: pages x..y of the block at base lie inside that live block (page_addr
                // of an index below its page count), mapped read-write by the engine and held
                // under the engine lock.
                unsafe {
                    std::ptr::write_bytes(self.blocks[&base].page_addr(x), 0, (y - x) * PAGE)
                };
            }
        }
    }

    /// Shared or diverged pages `[a, b)`: remapped onto fresh owned frames
    /// (holes: zero, free until written, and the block stays the engine's to
    /// share by copy), their old frames released. Without a pool they are
    /// remapped anonymous; beyond the VMA budget (or if mmap fails) zeroed in
    /// place: right bytes, memory freed later by a scan's zero folding.
    fn remap_zero(&mut self, base: usize, a: usize, b: usize) {
        let done = match self.pools.last().filter(|p| !p.retired) {
            Some(_) => self.remap_fresh(base, a, b - a),
            None => self.remap(base, a, b - a, None),
        };
        if !done {
            // SAFETY: pages a..b are pages of the live block at base, mapped read-write, and
            // the engine lock is held, so the block cannot be unmapped meanwhile.
            unsafe { std::ptr::write_bytes(self.blocks[&base].page_addr(a), 0, (b - a) * PAGE) };
        }
    }

    /// Maps pages `[i, i+n)` of a block shared onto a fresh run of frames.
    fn remap_fresh(&mut self, base: usize, i: usize, n: usize) -> bool {
        let pi = self.pools.len() - 1;
        if !self.vma_room(self.blocks[&base].remap_cost(i, n)) {
            self.stats.fallbacks.vma_budget += 1;
            return false;
        }
        let Some(slot) = self.pools[pi].alloc(n as u64) else {
            self.stats.fallbacks.frames += 1;
            return false;
        };
        let (addr, fd) = (self.blocks[&base].page_addr(i), self.pools[pi].fd);
        let mapped = self.changing_mapping(addr as usize, n * PAGE, |_| {
            sys::map(addr, n * PAGE, Some(fd), slot, true, true).is_ok()
        });
        if !mapped {
            self.pools[pi].abandon(slot, n as u64);
            self.stats.fallbacks.mmap += 1;
            return false;
        }
        self.record_fresh(base, i, n, FrameId::new(pi, slot));
        true
    }

    /// Page states, frame counts and mapping count after pages `[i, i+n)`
    /// were mapped onto fresh frames from `first` (as `record_remap` does for
    /// shared frames; never inside a scan, so nothing to register).
    fn record_fresh(&mut self, base: usize, i: usize, n: usize, first: FrameId) {
        for k in 0..n as u64 {
            self.pools[first.pool()].map(first.slot() + k);
        }
        let old: Vec<Page> = self.blocks[&base].pages[i..i + n].to_vec();
        self.forget_evicted(&self.blocks[&base], i, n);
        self.drop_pages(&old);
        self.set_remapped(base, i, n, |k| Page::Owned(first.offset(k as u64)));
        if let Some(block) = self.blocks.get_mut(&base) {
            block.seen[i..i + n].fill(0);
        }
    }

    /// Marks a block exempt and moves its content onto one anonymous mapping.
    /// Should that fail (no write protection, no room for the temporary
    /// mapping), it stays exempt on its frames, frozen so that fork has nothing
    /// to remap: never scanned or shared, but a discard still remaps it (counted).
    pub fn exempt_block(&mut self, base: usize) {
        if !self.blocks[&base].exempt {
            self.stats.exempted += 1;
            self.take_out_of_hands(base);
        }
    }

    /// Marks a block exempt and moves its content onto one anonymous mapping
    /// (see `exempt_block`). True if the block is plain anonymous memory now;
    /// false if it stayed on its frames, frozen.
    pub(crate) fn take_out_of_hands(&mut self, base: usize) -> bool {
        let block = self.blocks.get_mut(&base).expect("overlapping block");
        block.exempt = true;
        let n = block.pages.len();
        self.restore_evicted(base, 0, n);
        if self.blocks[&base].pages.iter().all(|p| *p == Page::Anon) {
            return true;
        }
        if self.move_block_to_anon(base) {
            return true;
        }
        // Freezing loses no concurrent write, unlike a copy without protection.
        self.freeze(base, 0, n);
        false
    }

    /// See `Engine::give_back_mappings`.
    pub(crate) fn give_back_mappings(&mut self) -> usize {
        self.stats.mapping_shortages += 1;
        let before = self.mappings.used();
        self.flush_recycled();
        self.mappings.recount();
        // Only a shortage of mappings is worth giving up sharing for: were
        // memory or address space short, it would only cost memory.
        if self.mappings.near_limit() {
            // The spares are the mappings the first move needs; each move
            // gives back more.
            self.mappings.give_up_spares();
            self.move_split_blocks_to_anon();
            self.mappings.make_spares();
            self.mappings.recount();
            self.mappings.keep_to_what_is_held();
        }
        let given = before.saturating_sub(self.mappings.used());
        self.stats.mappings_given_back += given as u64;
        given
    }

    /// Moves the blocks (not exempt) split into more than one mapping onto
    /// one anonymous mapping each, their evicted pages restored first, the
    /// most split first, until the kernel refuses.
    fn move_split_blocks_to_anon(&mut self) {
        let mut split: Vec<(usize, usize)> = self
            .blocks
            .iter()
            .filter(|(_, b)| !b.exempt && b.vmas > 1)
            .map(|(&base, b)| (b.vmas, base))
            .collect();
        split.sort_unstable_by(|a, b| b.cmp(a));
        for (_, base) in split {
            let n = self.blocks[&base].pages.len();
            self.restore_evicted(base, 0, n);
            // The temporary mapping is the one the program could not get:
            // once the kernel refuses it, nothing more can be given back.
            if !self.move_unbudgeted(base) {
                break;
            }
        }
    }

    fn move_block_to_anon(&mut self, base: usize) -> bool {
        if !self.vma_room(1) {
            self.stats.fallbacks.vma_budget += 1;
            return false;
        }
        self.move_unbudgeted(base)
    }

    /// `move_block_to_anon` without asking the mapping budget (the kernel
    /// answers for the one temporary mapping).
    fn move_unbudgeted(&mut self, base: usize) -> bool {
        let (n, len) = (self.blocks[&base].pages.len(), self.blocks[&base].len());
        if self.protector.is_none() {
            self.stats.fallbacks.uffd += 1;
            return false;
        }
        let Ok(tmp) = sys::map(std::ptr::null_mut(), len, None, 0, false, false) else {
            self.stats.fallbacks.mmap += 1;
            return false;
        };
        let moved = self.with_registered(base, 0, n, |st| st.move_to_anon(base, tmp));
        if moved < n {
            // SAFETY: pages moved..n of tmp are still the temporary mapping's;
            // the moved ones left it (another mapping may sit there now).
            sys::unmap(unsafe { tmp.add(moved * PAGE) }, (n - moved) * PAGE);
        }
        if moved == n {
            self.record_anon(base);
        }
        moved == n
    }

    /// Copies the block into `tmp` and moves it over the block piece by
    /// piece, with the block write-protected so that no write lands between
    /// a page's copy and its move; each piece's frames are released as soon
    /// as it has moved, so the block's memory is never held twice over more
    /// than `MOVE_PIECE` pages. Returns the pages moved (from the start).
    fn move_to_anon(&mut self, base: usize, tmp: *mut u8) -> usize {
        let (addr, n) = (base as *mut u8, self.blocks[&base].pages.len());
        let len = n * PAGE;
        self.drop_holds(base, len);
        let Some(p) = self.protector.clone() else {
            return 0;
        };
        if p.protect(addr, len).is_err() {
            let _ = p.unprotect(addr, len);
            self.stats.fallbacks.uffd += 1;
            return 0;
        }
        // Writes through pages the kernel pinned before the protection (I/O
        // in flight) land in the frames, not in the copy: let them land first.
        if !self.cfg.pin_grace.is_zero() {
            std::thread::sleep(self.cfg.pin_grace);
        }
        // A shared page the program wrote holds its own copy, whatever its
        // frame holds (a folded zero frame is a hole): learn of those writes
        // now, under protection, before holes are skipped.
        self.refresh_divergence(base, 0, n);
        let mut moved = 0;
        while moved < n {
            let m = MOVE_PIECE.min(n - moved);
            for k in moved..moved + m {
                self.copy_page_out(base, k, tmp);
            }
            // SAFETY: pages moved..moved+m lie inside both the block and tmp (n pages each).
            let (from, to) = unsafe { (tmp.add(moved * PAGE), addr.add(moved * PAGE)) };
            if sys::mremap_fixed(from, m * PAGE, to).is_err() {
                self.stats.fallbacks.mmap += 1;
                break;
            }
            // The piece's pages are anonymous now: their frames go, and
            // writers asleep on the replaced mapping fault again on the new one.
            self.record_moved(base, moved, m);
            p.wake(to, m * PAGE);
            moved += m;
        }
        // Pages a failed move left on their frames are unprotected; the
        // moved ones are not registered any more, so the call covers only the rest.
        if moved < n {
            // SAFETY: page `moved` lies inside the block (moved < n).
            let rest = unsafe { addr.add(moved * PAGE) };
            let _ = p.unprotect(rest, (n - moved) * PAGE);
        }
        p.wake(addr, len);
        moved
    }

    /// Copies page `k` of block `base` to the same page of `tmp` (a mapping
    /// as long as the block), skipping pages that read zero.
    fn copy_page_out(&self, base: usize, k: usize, tmp: *mut u8) {
        let page = self.blocks[&base].page_addr(k);
        // Reading a hole of a frame would allocate it; it reads zero anyway.
        if !self.frame_is_hole(self.blocks[&base].pages[k]) && !sys::is_zero(page) {
            // SAFETY: page is page k of the live block at base, readable for PAGE bytes; tmp
            // is a fresh anonymous mapping as long as the block, so tmp + k * PAGE has PAGE
            // writable bytes; the two mappings are distinct, so they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(page, tmp.add(k * PAGE), PAGE) };
        }
    }

    /// True if the page's content is a frame with no data (reads zero).
    fn frame_is_hole(&self, page: Page) -> bool {
        match page {
            Page::Owned(f) | Page::Shared(f) => sys::is_hole(self.pools[f.pool()].fd, f.slot()),
            _ => false,
        }
    }

    /// Page states and frame counts after pages `[i, i+m)` of a block moved
    /// onto anonymous memory.
    fn record_moved(&mut self, base: usize, i: usize, m: usize) {
        let old: Vec<Page> = self.blocks[&base].pages[i..i + m].to_vec();
        self.set_remapped(base, i, m, |_| Page::Anon);
        self.drop_pages(&old);
    }

    /// Bookkeeping after a whole block became one anonymous mapping.
    fn record_anon(&mut self, base: usize) {
        let n = self.blocks[&base].pages.len();
        self.forget_evicted(&self.blocks[&base], 0, n);
        let block = self
            .blocks
            .get_mut(&base)
            .expect("block vanished under the lock");
        let old = std::mem::replace(&mut block.pages, vec![Page::Anon; block.seen.len()]);
        block.evicted = 0;
        let before = std::mem::replace(&mut block.vmas, 1);
        self.mappings.remapped(before, 1);
        self.drop_pages(&old);
    }

    pub(crate) fn shrink(&mut self, base: usize, keep: usize) -> bool {
        let Some(block) = self.blocks.get(&base) else {
            return false;
        };
        let n = block.pages.len();
        if keep >= n {
            return true;
        }
        // Cutting a mapping's tail needs no new mapping, but the kernel can
        // still refuse at vm.max_map_count: then the block keeps its length.
        let tail = block.page_addr(keep);
        let cut = self.changing_mapping(tail as usize, (n - keep) * PAGE, |_| {
            sys::try_unmap(tail, (n - keep) * PAGE).is_ok()
        });
        if !cut {
            return false;
        }
        self.forget_evicted(&self.blocks[&base], keep, n - keep);
        let block = self
            .blocks
            .get_mut(&base)
            .expect("block vanished under the lock");
        let old = block.cut(keep);
        let before = std::mem::replace(&mut block.vmas, 0);
        block.vmas = block.count_vmas();
        self.mappings.changed(before, block.vmas);
        self.drop_pages(&old);
        true
    }
}
