//! Taking anonymous pages off their addresses only when no pin holds them.
//!
//! Folding or merging a page drops the physical page behind an address.
//! Write protection stops writes through the page table, not writes through
//! a reference the kernel took earlier (FOLL_PIN: O_DIRECT reads in flight,
//! process_vm_writev, io_uring fixed buffers, RDMA): a page dropped under
//! such a write loses it. Kernel KSM guards against this by comparing a
//! page's reference and map counts under the page lock. User space cannot
//! read those counts, but UFFDIO_MOVE (Linux 6.8) applies the same guard: it
//! clears the page table entry, flushes the TLB, and refuses (EBUSY) a page
//! that may be pinned or is not this process's alone, putting the entry back.
//! Once the entry is gone, nothing can pin the page through the program's
//! address any more.
//!
//! So for a run of anonymous pages a scan has compared, under write
//! protection, and decided to fold or merge:
//! 1. the run is registered for MISSING faults as well: between the move and
//!    the new mapping its addresses are holes, and a touch there must wait
//!    (in the kernel, as a write to a protected page does), not read zeros;
//! 2. the pages are moved to the engine's scratch range, one ioctl per run;
//!    a page the kernel refuses stays where it is and the move goes on after it;
//! 3. every moved page is compared again with what the caller expects: a
//!    write through a pin released before the move landed after the first
//!    comparison. A page that changed is moved back;
//! 4. the caller maps frames over the holes (a merge) or leaves them (a zero
//!    fold: an untouched anonymous page reads as zero) and moves back any
//!    page it could not map; then the scratch copies are freed and waiting
//!    threads are woken.
//!
//! Only private anonymous memory can be moved. Pages of the frames' memfd
//! (owned pages mapped shared, the private copies of diverged pages) have no
//! such test, so scans leave them alone while the guard is on. A kernel
//! without UFFDIO_MOVE falls back to the pin grace (scan.rs), which narrows
//! the race but does not close it.

use crate::frames::FrameId;
use crate::guard::{moves_pages, Detached, Scratch};
use crate::state::State;
use crate::sys::{self, PAGE};

impl State {
    /// Whether scans take pages off with the pin test: the kernel has
    /// UFFDIO_MOVE and the scratch range exists (made on first use).
    pub fn pin_guard(&mut self) -> bool {
        if !self.cfg.pin_guard {
            return false;
        }
        if self.guard.scratch.is_some() {
            return true;
        }
        if self.guard.missing {
            return false;
        }
        let Some(p) = self.protector.clone() else {
            return false;
        };
        match Scratch::open(&p, self.cfg.scan_chunk_pages.max(2)) {
            Ok(s) if moves_pages(&p, &s) => self.guard.scratch = Some(s),
            _ => {
                self.guard.missing = true;
                self.stats.fallbacks.pin_guard += 1;
            }
        }
        self.guard.scratch.is_some()
    }

    /// The pin guard is on (after `pin_guard` said so once).
    pub fn guard_on(&self) -> bool {
        self.cfg.pin_guard && self.guard.scratch.is_some()
    }

    /// Owned pages are frozen before they are folded or merged (the guard is
    /// on and `pin_age` is not zero).
    pub fn freeze_first(&self) -> bool {
        self.guard_on() && !self.cfg.pin_age.is_zero()
    }

    /// Under the guard, a frame a scan froze from an owned page less than
    /// `pin_age` ago.
    pub fn young(&self, f: crate::frames::FrameId) -> bool {
        self.guard_on()
            && self
                .guard
                .young_frames
                .get(&f)
                .is_some_and(|t| t.elapsed() < self.cfg.pin_age)
    }

    /// Freezes the owned pages of `[i, i+n)` (state.rs `freeze`); with a
    /// pin age their frames are young from now.
    pub fn freeze_young(&mut self, base: usize, i: usize, n: usize) {
        let owned: Vec<(usize, crate::frames::FrameId)> = (i..i + n)
            .filter_map(|k| match self.blocks[&base].pages[k] {
                crate::space::Page::Owned(f) => Some((k, f)),
                _ => None,
            })
            .collect();
        self.freeze(base, i, n);
        // Pages still owned: the mapping budget refused their freeze.
        let refused = owned
            .iter()
            .filter(|&&(k, f)| self.blocks[&base].pages[k] == crate::space::Page::Owned(f))
            .count();
        self.refused_merges(base, refused);
        if !self.freeze_first() {
            return;
        }
        let now = std::time::Instant::now();
        for (k, f) in owned {
            if self.blocks[&base].pages[k] == crate::space::Page::Shared(f) {
                self.guard.young_frames.insert(f, now);
            }
        }
    }

    /// Under the guard with a pin age, a page at `addr` that diverged less
    /// than `pin_age` ago (a write pin forces the copy: the pin is younger).
    pub fn young_page(&self, addr: usize) -> bool {
        self.freeze_first()
            && self
                .guard
                .young_pages
                .get(&addr)
                .is_some_and(|t| t.elapsed() < self.cfg.pin_age)
    }

    /// Forgets frames and pages that are young no more.
    pub fn prune_young(&mut self) {
        let age = self.cfg.pin_age;
        self.guard.young_frames.retain(|_, t| t.elapsed() < age);
        self.guard.young_pages.retain(|_, t| t.elapsed() < age);
    }

    /// Moves the anonymous pages `[i, i+n)` of a block (n at most the
    /// scratch size; the pages compared equal to `expected` under write
    /// protection) off their addresses, keeping those that still hold what
    /// `expected(state, j)` says (None: zeros) and that no pin may write.
    /// Every page not taken is as it was.
    pub fn detach(
        &mut self,
        base: usize,
        i: usize,
        n: usize,
        expected: &dyn Fn(&State, usize) -> Option<*const u8>,
    ) -> Detached {
        let mut d = Detached {
            base,
            i,
            taken: vec![false; n],
        };
        let (Some(p), Some(s)) = (self.protector.clone(), self.guard.scratch.as_ref()) else {
            return d;
        };
        debug_assert!(n <= s.pages());
        let addr = self.blocks[&base].page_addr(i);
        if p.register_missing(addr, n * PAGE).is_err() {
            self.stats.fallbacks.uffd += 1;
            return d;
        }
        let mut j = 0;
        while j < n {
            // SAFETY: j < n and the run lies inside the block.
            let src = unsafe { addr.add(j * PAGE) };
            let (moved, err) = p.move_pages(s.page(j), src, (n - j) * PAGE);
            let m = moved / PAGE;
            d.taken[j..j + m].iter_mut().for_each(|t| *t = true);
            j += m;
            match err.and_then(|e| e.raw_os_error()) {
                None => {}
                Some(libc::EBUSY) => {
                    self.stats.pin_refused += 1;
                    j += 1;
                }
                // The mappings differ (mlock, protection): nothing here can move.
                Some(libc::EINVAL) => break,
                Some(_) => j += 1,
            }
        }
        let changed: Vec<usize> = (0..n)
            .filter(|&j| d.taken[j] && !holds(s.page(j), expected(self, j)))
            .collect();
        for j in changed {
            self.stats.pin_changed += 1;
            self.reattach(&d, j);
            d.taken[j] = false;
        }
        d
    }

    /// Puts scratch page `j` back at its address (its hole).
    pub fn reattach(&mut self, d: &Detached, j: usize) {
        let (Some(p), Some(s)) = (self.protector.clone(), self.guard.scratch.as_ref()) else {
            return;
        };
        let addr = self.blocks[&d.base].page_addr(d.i + j);
        if p.move_pages(addr, s.page(j), PAGE).1.is_none() {
            return;
        }
        // SAFETY: scratch page j holds a moved page: PAGE readable bytes.
        let page = unsafe { &*(s.page(j) as *const [u8; PAGE]) };
        if p.copy(addr as usize, page).is_err() {
            // The content exists only in scratch now and cannot be put back:
            // stop before the program reads a wrong byte.
            let msg = b"pagefold: a page taken off for a merge cannot be put back; stopping\n";
            // SAFETY: msg is a live byte string; write(2) to stderr only reads it.
            unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
            std::process::abort();
        }
    }

    /// Remaps anonymous pages `[a, a+n)` onto frames `first..`, each one the
    /// pin guard takes off: returns how many it remapped, and how many it
    /// took off but could not remap (no mapping to spare).
    pub fn merge_anon(
        &mut self,
        base: usize,
        a: usize,
        n: usize,
        first: FrameId,
    ) -> (usize, usize) {
        let (mut merged, mut unmapped) = (0, 0);
        for (p, len) in self.scratch_pieces(a, n) {
            let f0 = first.offset((p - a) as u64);
            let frame = move |st: &State, j: usize| {
                Some(st.pools[f0.pool()].frame_ptr(f0.slot() + j as u64))
            };
            let d = self.detach(base, p, len, &frame);
            for (x, y) in d.taken_runs() {
                if self.remap(base, p + x, y - x, Some(f0.offset(x as u64))) {
                    merged += y - x;
                } else {
                    unmapped += y - x;
                    (x..y).for_each(|j| self.reattach(&d, j));
                }
            }
            self.finish_detach(d);
        }
        (merged, unmapped)
    }

    /// `[a, a+n)` in pieces the scratch range holds.
    pub fn scratch_pieces(&self, a: usize, n: usize) -> Vec<(usize, usize)> {
        let most = self.guard.scratch.as_ref().map_or(n, |s| s.pages()).max(1);
        (a..a + n)
            .step_by(most)
            .map(|p| (p, most.min(a + n - p)))
            .collect()
    }

    /// Ends a detach: frees the moved pages and wakes threads that touched
    /// the holes (they fault again on whatever the caller mapped there).
    pub fn finish_detach(&mut self, d: Detached) {
        let n = d.taken.len();
        if let Some(s) = &self.guard.scratch {
            s.clear(n);
        }
        if let Some(p) = &self.protector {
            p.wake(self.blocks[&d.base].page_addr(d.i), n * PAGE);
        }
    }
}

/// True if the page at `page` holds `expected` (None: all zeros).
fn holds(page: *const u8, expected: Option<*const u8>) -> bool {
    match expected {
        None => sys::is_zero(page),
        Some(e) => crate::index::page_eq(page, e),
    }
}
