//! Holding pages write-protected for the pin age before folding them:
//! diverged pages, and owned zero pages.
//!
//! Folding or merging a page drops the physical page behind its address; a
//! write through a pin the kernel took earlier (an O_DIRECT read in flight,
//! process_vm_writev) then lands in a page nobody maps. Anonymous pages are
//! taken off with the kernel's own pin test (detach.rs), and owned pages are
//! frozen in place first (a later write pin makes the kernel copy the page).
//! A diverged page, the private copy the kernel made inside a file mapping
//! when the program wrote a shared page, can be neither moved nor frozen.
//!
//! What can be known of such a page is when a write pin could last have been
//! taken on it: pinning a page for writing goes through the page table, and a
//! page write-protected with userfaultfd makes the pinning call fault first.
//! So before a scan folds or merges a diverged page it *holds* it (and an
//! owned zero page too, rather than freezing it: its fold punches the frame
//! and needs no mapping, where a freeze splits the block's mapping for
//! good; a hold's registration splits it only while the hold lasts): the page
//! stays write-protected and registered after its chunk is unprotected, and
//! the time is noted. A write, or a pin for writing, faults; the fault thread
//! ends the hold (and those of the held run around the page, so that a
//! program writing a range pays one fault for it) and unprotects the
//! pages, and the write goes on. A page held
//! for `pin_age` without a fault has taken no write pin since the hold began,
//! so only pins older than the hold, which the age assumes finished, could
//! still write it: the scan then acts on it, as it acts on an owned page
//! frozen that long.
//!
//! Invariant: a page in the table's `Held` has been write-protected without a
//! break since the time stored with it. Everything that protects, unprotects,
//! unregisters, replaces or unmaps a range first drops the holds in it
//! (`drop_holds`; a change of mapping through `changing_mapping`, so that
//! the fault thread, ending the holds of a run around a written page, never
//! meets a hold whose mapping is gone), and while a scan works on a chunk
//! (`scanning`) the fault thread leaves that chunk's holds alone: the scan
//! decides which go on, and wakes the writers of those that do, which then
//! fault again.
//!
//! Cost: a run of held pages stays registered, which splits the mapping
//! around it, so each run counts two mappings against the budget; at most
//! `MAX_HELD` pages are held at once. Holds need the fault thread; without it (no userfaultfd
//! MISSING mode) diverged pages get the pin grace and owned zero pages are
//! frozen, counted as `fallbacks.pin_hold`.

use std::collections::HashMap;
use std::time::Instant;

use crate::frames::FrameId;
use crate::protect::Protector;
use crate::space::Page;
use crate::state::State;
use crate::sys::PAGE;

/// Pages held at most at once (256 MiB).
pub const MAX_HELD: usize = 1 << 16;

impl State {
    /// Diverged and owned zero pages are held before they are folded or
    /// merged: holds are asked for, there is a pin age, the pin guard, and a
    /// fault thread to end holds.
    pub fn holds_on(&mut self) -> bool {
        if !self.holds_wanted() {
            return false;
        }
        if self.start_fault_thread(false) {
            return true;
        }
        if !self.holds.missing {
            self.holds.missing = true;
            self.stats.fallbacks.pin_hold += 1;
        }
        false
    }

    /// Holds are asked for: a pin age under the pin guard, and `pin_hold`.
    pub fn holds_wanted(&self) -> bool {
        self.freeze_first() && self.cfg.pin_hold
    }

    /// Without holds, takes out of `zero` and `plan` the diverged pages of
    /// block `base` that diverged less than the pin age ago.
    pub fn drop_young_diverged(
        &self,
        base: usize,
        zero: &mut Vec<usize>,
        plan: &mut HashMap<usize, FrameId>,
    ) {
        let block = &self.blocks[&base];
        let young = |k: usize| {
            matches!(block.pages[k], Page::Diverged(_))
                && self.young_page(block.page_addr(k) as usize)
        };
        zero.retain(|&k| !young(k));
        plan.retain(|&k, _| !young(k));
    }

    /// Holds decide when diverged and owned zero pages may be folded or merged (after
    /// `holds_on` said so; the fault thread, once started, stays).
    pub fn holding(&self) -> bool {
        self.holds_wanted() && self.restoring.fault_thread.is_some()
    }

    /// Takes out of `zero` and `plan` the pages of block `base` that must be
    /// held first and are not yet held unbroken for the pin age (`held`: the
    /// chunk's holds as the scan began): diverged pages, and owned zero
    /// pages (held instead of frozen, their fold needs no new mapping).
    /// Returns them, sorted: they are to be held.
    pub fn unready_held(
        &self,
        base: usize,
        zero: &mut Vec<usize>,
        plan: &mut HashMap<usize, FrameId>,
        held: &HashMap<usize, Instant>,
    ) -> Vec<usize> {
        let block = &self.blocks[&base];
        let age = self.cfg.pin_age;
        let unready = |k: usize| {
            let addr = block.page_addr(k) as usize;
            matches!(block.pages[k], Page::Diverged(_) | Page::Owned(_))
                && !(self.holds.contains(addr)
                    && held.get(&addr).is_some_and(|t| t.elapsed() >= age))
        };
        let mut out: Vec<usize> = zero.iter().copied().filter(|&k| unready(k)).collect();
        zero.retain(|&k| !unready(k));
        out.extend(plan.keys().copied().filter(|&k| unready(k)));
        plan.retain(|&k, _| !unready(k));
        out.sort_unstable();
        out
    }

    /// The holds that go on after this chunk: the pages of `to_hold`
    /// (sorted, still diverged or owned) with the start of their hold, if it
    /// was unbroken all through the chunk, else from now, once protected
    /// again (something may have unprotected the page during the scan).
    pub fn hold_pages(
        &mut self,
        base: usize,
        to_hold: &[usize],
        held: &HashMap<usize, Instant>,
        protector: &Protector,
        rep: &mut crate::stats::ScanReport,
    ) -> Vec<(usize, Instant)> {
        let mut keep = Vec::new();
        let mut fresh: Vec<usize> = Vec::new();
        for &k in to_hold {
            let block = &self.blocks[&base];
            if !matches!(block.pages[k], Page::Diverged(_) | Page::Owned(_)) {
                continue;
            }
            let addr = block.page_addr(k) as usize;
            match held.get(&addr).filter(|_| self.holds.contains(addr)) {
                Some(&since) => keep.push((addr, since)),
                None if self.holds.len() + fresh.len() < MAX_HELD => fresh.push(k),
                None => {}
            }
        }
        // Each new run may split a mapping in three.
        let runs = crate::space::consecutive(&fresh);
        let mut protected = Vec::new();
        for (a, b) in runs {
            if !self.vma_room(2 * (protected.len() + 1)) {
                break;
            }
            let addr = self.blocks[&base].page_addr(a);
            if protector.protect(addr, (b - a) * PAGE).is_ok() {
                protected.push((addr as usize, b - a));
            }
        }
        let now = Instant::now();
        for &(addr, n) in &protected {
            keep.extend((0..n).map(|j| (addr + j * PAGE, now)));
        }
        self.stats.pin_held += protected.iter().map(|&(_, n)| n as u64).sum::<u64>();
        rep.frozen += keep.len() as u64;
        keep
    }

    /// Unprotects `[addr, addr+len)` but its held pages, and wakes those:
    /// a writer whose fault came while a scan worked here faults again.
    pub fn unprotect_unheld(&self, protector: &Protector, addr: usize, len: usize) {
        let held: Vec<usize> = self
            .holds
            .within(addr, len)
            .into_iter()
            .map(|(a, _)| (a - addr) / PAGE)
            .collect();
        let mut from = 0;
        for (a, b) in crate::space::consecutive(&held) {
            if a > from {
                let _ = protector.unprotect((addr + from * PAGE) as *const u8, (a - from) * PAGE);
            }
            protector.wake((addr + a * PAGE) as *const u8, (b - a) * PAGE);
            from = b;
        }
        if from * PAGE < len {
            let _ = protector.unprotect((addr + from * PAGE) as *const u8, len - from * PAGE);
        }
    }

    /// Starts a scan's work on `[addr, addr+len)`: from now on the fault
    /// thread leaves the holds there alone. Returns those still unbroken,
    /// with when they began.
    pub fn begin_chunk_holds(&mut self, addr: usize, len: usize) -> HashMap<usize, Instant> {
        let mut out = HashMap::new();
        let mine = self.holds.within(addr, len);
        let Some(ev) = self
            .restoring
            .evictions
            .clone()
            .filter(|_| !mine.is_empty())
        else {
            return out;
        };
        let mut t = ev.lock();
        t.held.scanning = Some((addr, addr + len));
        self.holds.scanning = true;
        for (a, since) in mine {
            if t.held.pages.get(&a) == Some(&since) {
                out.insert(a, since);
            } else {
                self.holds.remove(a);
            }
        }
        out
    }

    /// Ends a scan's work on `[addr, addr+len)`: the pages of `keep`
    /// (address, start of the hold) are held from now on, every other hold
    /// there ends. The caller unprotects the rest of the range and wakes
    /// the held pages (a writer whose fault came during the scan faults again).
    pub fn end_chunk_holds(&mut self, addr: usize, len: usize, keep: &[(usize, Instant)]) {
        let kept: std::collections::HashSet<usize> = keep.iter().map(|&(a, _)| a).collect();
        let ended: Vec<usize> = self
            .holds
            .within(addr, len)
            .into_iter()
            .map(|(a, _)| a)
            .filter(|a| !kept.contains(a))
            .collect();
        if ended.is_empty() && keep.is_empty() && !self.holds.scanning {
            return;
        }
        self.holds.scanning = false;
        let Some(ev) = self.restoring.evictions.clone() else {
            return;
        };
        let mut t = ev.lock();
        for a in ended {
            self.holds.remove(a);
            t.held.pages.remove(&a);
        }
        for &(a, since) in keep {
            self.holds.insert(a, since);
            t.held.pages.insert(a, since);
        }
        t.held.scanning = None;
    }

    /// Forgets the holds a write has ended since (the fault thread's table
    /// no longer has them), so they count against no budget.
    pub fn prune_holds(&mut self) {
        let Some(ev) = self
            .restoring
            .evictions
            .clone()
            .filter(|_| !self.holds.is_empty())
        else {
            return;
        };
        let stale: Vec<usize> = {
            let t = ev.lock();
            let all = self.holds.within(0, usize::MAX);
            all.into_iter()
                .filter(|(a, since)| t.held.pages.get(a) != Some(since))
                .map(|(a, _)| a)
                .collect()
        };
        for a in stale {
            self.holds.remove(a);
        }
    }
}
