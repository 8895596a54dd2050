//! Virtual copy: whole pages between engine blocks at equal page offsets
//! become copy-on-write views of the same frames (lib.rs describes the
//! mechanism); the rest is copied plainly.
//!
//! A plain copy into an engine block skips the zero pages of its source
//! where the destination page reads zero already: an anonymous page that
//! pagemap shows neither mapped nor swapped (never touched since the block
//! was mapped, or discarded), or an owned page whose frame is a hole in the
//! memfd (SEEK_DATA, which counts a swapped frame as data). Writing zeros
//! there would fault the page in, clear it, copy 4 KiB of zeros over it, and
//! leave the scan to read it and fold it again; numpy's `.copy()` of an
//! array that is mostly zero is made of such pages. Shared, diverged and
//! evicted pages are always written: their content lies where no page table
//! or hole shows it.

use crate::frames::FrameId;
use crate::fresh::{CopyDecision, PROBE_PAGES};
use crate::space::{runs, unit_runs, Page};
use crate::state::State;
use crate::sys::{self, PAGE};

impl State {
    /// The copy proper. Returns how many bytes from the start it copied: 0
    /// if nothing in it can be or should be virtual, fewer than `len` for a
    /// probe (fresh.rs, `CopyDecision::Probe`); the caller copies the rest
    /// plainly.
    ///
    /// # Safety
    /// As for `Engine::copy`: `src` valid for reads and `dst` for writes of
    /// `len` bytes, and the two ranges do not overlap.
    pub(crate) unsafe fn virtual_copy(
        &mut self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
    ) -> usize {
        let (Some(sb), Some(db)) = (self.find(src as usize, len), self.find(dst as usize, len))
        else {
            return 0;
        };
        if src as usize % PAGE != dst as usize % PAGE
            || self.blocks[&sb].exempt
            || self.blocks[&db].exempt
        {
            return 0;
        }
        let head = (PAGE - src as usize % PAGE) % PAGE;
        let whole = (len - head) / PAGE;
        if whole == 0 {
            return 0;
        }
        let src_block_pages = self.blocks[&sb].pages.len();
        let dst_block_pages = self.blocks[&db].pages.len();
        let decision = match self.cfg.copy_learn {
            true => self.placement.decide_copy(dst_block_pages),
            false => CopyDecision::Share,
        };
        if !decision.shares() {
            // The caller copies plainly, as glibc's memcpy would, without
            // the lock. Such a copy does not count its source's class as
            // copied from (fresh.rs).
            self.stats.copies_made_plain += 1;
            return 0;
        }
        // A probe shares its first pages only; the caller copies the rest
        // plainly, outside the lock.
        let (whole, len) = match decision {
            CopyDecision::Probe if whole > PROBE_PAGES => {
                self.stats.copies_probed += 1;
                (PROBE_PAGES, head + PROBE_PAGES * PAGE)
            }
            _ => (whole, len),
        };
        // Only a copy that is expected to pay makes its source's size
        // worth placing on frames.
        let credited = decision == CopyDecision::Share && whole * 2 >= src_block_pages;
        if credited {
            self.placement.copied_from(src_block_pages);
        }
        let tail = len - head - whole * PAGE;
        let (s0, d0) = (src.add(head), dst.add(head));
        std::ptr::copy_nonoverlapping(src, dst, head);
        std::ptr::copy_nonoverlapping(s0.add(whole * PAGE), d0.add(whole * PAGE), tail);
        self.stats.bytes_copied_plain += (head + tail) as u64;

        let si = (s0 as usize - sb) / PAGE;
        let di = (d0 as usize - db) / PAGE;
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
            // Anonymous source pages are adopted onto frames (adopt.rs); what
            // it leaves (zero or untouched pages) is copied plainly, and so
            // are diverged pages: a copy the program wrote over is likely
            // written over again. Without the pin guard the copy writes
            // anonymous and diverged pages through.
            let adopting = self.pin_guard();
            if adopting {
                let anon = |k: usize| (src_pages[k] == Page::Anon && plain[k]).then_some(());
                for (a, b) in unit_runs(0..whole, anon) {
                    let mapped = self.adopt_source(sb, si + a, db, di + a, b - a);
                    for (k, m) in mapped.into_iter().enumerate() {
                        plain[a + k] &= !m;
                    }
                }
            }
            let in_anon = |k: usize| match src_pages[k] {
                Page::Anon | Page::Diverged(_) if !adopting => plain[k].then_some(()),
                _ => None,
            };
            for (a, b) in unit_runs(0..whole, in_anon) {
                if self.copy_through(db, di + a, b - a, s0.add(a * PAGE)) {
                    plain[a..b].iter_mut().for_each(|p| *p = false);
                }
            }
        }
        let shared = plain.iter().filter(|p| !**p).count();
        if let Some(b) = self.blocks.get_mut(&db).filter(|_| shared > 0) {
            b.copy_shared += shared;
            b.shared_at = Some(std::time::Instant::now());
            if credited {
                b.copied_from_class = Some(src_block_pages);
            }
        }
        if shared > 0 && sb != db {
            if let Some(b) = self.blocks.get_mut(&sb) {
                b.note_copy_out(db);
            }
        }
        if self.cfg.copy_learn {
            self.placement.shared_by_copy(dst_block_pages, shared);
        }
        for (k, _) in plain.iter().enumerate().filter(|(_, p)| **p) {
            std::ptr::copy_nonoverlapping(s0.add(k * PAGE), d0.add(k * PAGE), PAGE);
            self.stats.bytes_copied_plain += PAGE as u64;
        }
        len
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

    /// Which whole pages of `[dst, dst + len)` read zero without being
    /// written: plain anonymous pages of one engine block that the kernel
    /// has neither mapped nor swapped, and owned pages whose frame is a
    /// hole. Returns the first whole page's address and a flag per whole
    /// page; None when the range holds no whole page of either kind.
    pub(crate) fn untouched_pages(&self, dst: usize, len: usize) -> Option<(usize, Vec<bool>)> {
        let base = self.find(dst, len)?;
        let block = &self.blocks[&base];
        let (first, end) = (dst.next_multiple_of(PAGE), (dst + len) / PAGE * PAGE);
        if block.exempt || end <= first {
            return None;
        }
        let (i, n) = ((first - base) / PAGE, (end - first) / PAGE);
        let mut untouched = vec![false; n];
        self.untouched_anon(block, i, &mut untouched);
        let owned = |k: usize| match block.pages[k] {
            Page::Owned(f) => Some(f),
            _ => None,
        };
        for (a, b) in runs(i..i + n, owned) {
            let f = owned(a).expect("a run of owned pages");
            let holes = sys::holes(self.pools[f.pool()].fd, f.slot(), b - a);
            untouched[a - i..b - i].copy_from_slice(&holes);
        }
        untouched.contains(&true).then_some((first, untouched))
    }

    /// Marks in `untouched` the anonymous pages of `block` from page `i`
    /// that the kernel has neither mapped nor swapped (pagemap).
    fn untouched_anon(&self, block: &crate::space::Block, i: usize, untouched: &mut [bool]) {
        let anon = &block.pages[i..i + untouched.len()];
        if !anon.iter().any(|p| matches!(p, Page::Anon)) {
            return;
        }
        let Some(pm) = self.pagemap.as_ref() else {
            return;
        };
        let mut entries = vec![0u64; untouched.len()];
        if pm.read(block.page_addr(i), &mut entries).is_err() {
            return;
        }
        for ((u, p), e) in untouched.iter_mut().zip(anon).zip(&entries) {
            *u = matches!(p, Page::Anon) && sys::never_touched(*e);
        }
    }

    /// Maps dst pages `[i, i+n)` onto the frozen frames from `first`.
    fn share_run(&mut self, db: usize, i: usize, n: usize, first: FrameId) -> bool {
        if !self.remap(db, i, n, Some(first)) {
            return false;
        }
        self.stats.pages_shared_by_copy += n as u64;
        true
    }
}

/// Copies `len` bytes from `src` to `dst` as memcpy does, but leaves out
/// each whole destination page from `first` that `untouched` marks (it
/// reads zero already) where the source's bytes are all zero. Returns the
/// pages left out; their flags stay set, the others' are cleared.
///
/// # Safety
/// As for memcpy: `src` valid for reads and `dst` for writes of `len` bytes,
/// not overlapping; `first` page-aligned within `[dst, dst + len]`, with
/// `untouched.len()` whole pages from it inside the range.
pub(crate) unsafe fn copy_skipping_zero(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    first: usize,
    untouched: &mut [bool],
) -> u64 {
    let head = first - dst as usize;
    std::ptr::copy_nonoverlapping(src, dst, head);
    let mut skipped = 0;
    for (k, reads_zero) in untouched.iter_mut().enumerate() {
        let (s, d) = (src.add(head + k * PAGE), dst.add(head + k * PAGE));
        if *reads_zero && all_zero(std::slice::from_raw_parts(s, PAGE)) {
            skipped += 1;
        } else {
            *reads_zero = false;
            std::ptr::copy_nonoverlapping(s, d, PAGE);
        }
    }
    let done = head + untouched.len() * PAGE;
    std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), len - done);
    skipped
}

/// Sets `len` bytes from `dst` to zero as memset does, but leaves out each
/// whole page from `first` that `untouched` marks (it reads zero already).
/// Returns the pages left out.
///
/// # Safety
/// As for memset: `dst` valid for writes of `len` bytes; `first`
/// page-aligned within `[dst, dst + len]`, with `untouched.len()` whole
/// pages from it inside the range.
pub(crate) unsafe fn zero_skipping(
    dst: *mut u8,
    len: usize,
    first: usize,
    untouched: &[bool],
) -> u64 {
    let head = first - dst as usize;
    std::ptr::write_bytes(dst, 0, head);
    let mut skipped = 0;
    let mut a = 0;
    while a < untouched.len() {
        let b = (a..untouched.len())
            .find(|&k| untouched[k] != untouched[a])
            .unwrap_or(untouched.len());
        if untouched[a] {
            skipped += (b - a) as u64;
        } else {
            std::ptr::write_bytes(dst.add(head + a * PAGE), 0, (b - a) * PAGE);
        }
        a = b;
    }
    let done = head + untouched.len() * PAGE;
    std::ptr::write_bytes(dst.add(done), 0, len - done);
    skipped
}

/// Whether every byte of `bytes` (any alignment) is zero; stops at the first
/// word that is not.
fn all_zero(bytes: &[u8]) -> bool {
    // SAFETY: any bit pattern is a valid u64; align_to only splits the slice.
    let (pre, words, post) = unsafe { bytes.align_to::<u64>() };
    pre.iter().all(|&b| b == 0)
        && words.chunks(8).all(|c| c.iter().fold(0, |a, w| a | w) == 0)
        && post.iter().all(|&b| b == 0)
}
