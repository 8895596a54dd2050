//! Holding diverged pages write-protected for the pin age.
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
//! So before a scan folds or merges a diverged page it *holds* it: the page
//! stays write-protected and registered after its chunk is unprotected, and
//! the time is noted. A write, or a pin for writing, faults; the fault thread
//! ends the hold and unprotects the page, and the write goes on. A page held
//! for `pin_age` without a fault has taken no write pin since the hold began,
//! so only pins older than the hold, which the age assumes finished, could
//! still write it: the scan then acts on it, as it acts on an owned page
//! frozen that long.
//!
//! Invariant: a page in the table's `Held` has been write-protected without a
//! break since the time stored with it. Everything that protects, unprotects,
//! unregisters or replaces a range first drops the holds in it
//! (`drop_holds`), and while a scan works on a chunk (`scanning`) the fault
//! thread leaves that chunk's holds alone: the scan decides which go on, and
//! wakes the writers of those that do, which then fault again.
//!
//! Cost: a held page's registration may split the mapping around it, so each
//! counts two mappings against the budget, and at most `MAX_HELD` pages are
//! held at once. Holds need the fault thread; without it (no userfaultfd
//! MISSING mode) diverged pages get the pin grace, counted as
//! `fallbacks.pin_hold`.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::engine::State;
use crate::frames::FrameId;
use crate::protect::Protector;
use crate::space::Page;
use crate::PAGE;

/// Pages held at most at once.
pub const MAX_HELD: usize = 1024;

/// The held pages, in the table the fault thread shares (fault.rs).
pub(crate) struct Held {
    /// Held page address -> when its hold began.
    pages: HashMap<usize, Instant>,
    /// The range a scan is working on: its holds are the scan's.
    scanning: Option<(usize, usize)>,
    /// Holds a write ended.
    pub broken: u64,
}

impl Held {
    pub fn new() -> Held {
        Held {
            // The fault thread removes entries and must never allocate.
            pages: HashMap::with_capacity(MAX_HELD),
            scanning: None,
            broken: 0,
        }
    }

    /// On the fault thread: a write-protect fault at `addr` ends its hold,
    /// unless a scan is working there. True if it did: the caller unprotects.
    pub fn end_by_write(&mut self, addr: usize) -> bool {
        if self
            .scanning
            .is_some_and(|(a, end)| (a..end).contains(&addr))
        {
            return false;
        }
        let ended = self.pages.remove(&addr).is_some();
        self.broken += ended as u64;
        ended
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Memory the table of holds takes (a hash map entry and its control byte).
    pub fn bytes(&self) -> usize {
        self.pages.capacity() * (std::mem::size_of::<(usize, Instant)>() + 1)
    }

    /// Forgets every hold (in a forked child nothing is registered).
    pub fn clear(&mut self) {
        self.pages.clear();
        self.scanning = None;
    }

    /// Every held page, for unprotecting them all when the engine goes.
    pub fn take_all(&mut self) -> Vec<usize> {
        self.pages.drain().map(|(a, _)| a).collect()
    }
}

impl State {
    /// Diverged pages are held before they are folded or merged: holds are
    /// asked for, there is a pin age, the pin guard, and a fault thread to
    /// end holds.
    pub fn holds_on(&mut self) -> bool {
        if !self.holds_wanted() {
            return false;
        }
        if self.start_fault_thread(false) {
            return true;
        }
        if !self.hold_missing {
            self.hold_missing = true;
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

    /// Holds decide when diverged pages may be folded or merged (after
    /// `holds_on` said so; the fault thread, once started, stays).
    pub fn holding(&self) -> bool {
        self.holds_wanted() && self.fault_thread.is_some()
    }

    /// Takes out of `zero` and `plan` the diverged pages of block `base` not
    /// yet held unbroken for the pin age (`held`: the chunk's holds as the
    /// scan began), and returns them, sorted: they are to be held.
    pub fn unready_diverged(
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
            matches!(block.pages[k], Page::Diverged(_))
                && !(self.holds.contains_key(&addr)
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
    /// (sorted, still diverged) with the start of their hold, if it was
    /// unbroken all through the chunk, else from now, once protected
    /// again (something may have unprotected the page during the scan).
    pub fn hold_pages(
        &mut self,
        base: usize,
        to_hold: &[usize],
        held: &HashMap<usize, Instant>,
        protector: &Protector,
        rep: &mut crate::engine::ScanReport,
    ) -> Vec<(usize, Instant)> {
        let mut keep = Vec::new();
        let mut fresh = 0;
        for &k in to_hold {
            let addr = self.blocks[&base].page_addr(k);
            if !matches!(self.blocks[&base].pages[k], Page::Diverged(_)) {
                continue;
            }
            let going_on = held
                .get(&(addr as usize))
                .filter(|_| self.holds.contains_key(&(addr as usize)));
            if let Some(&since) = going_on {
                keep.push((addr as usize, since));
                continue;
            }
            let room = self.holds.len() + fresh < MAX_HELD && self.vma_room(2 * (fresh + 1));
            if room && protector.protect(addr, PAGE).is_ok() {
                keep.push((addr as usize, Instant::now()));
                fresh += 1;
            }
        }
        self.stats.pin_held += fresh as u64;
        rep.frozen += keep.len() as u64;
        keep
    }

    /// Unprotects `[addr, addr+len)` but its held pages, and wakes those:
    /// a writer whose fault came while a scan worked here faults again.
    pub fn unprotect_unheld(&self, protector: &Protector, addr: usize, len: usize) {
        let mut from = addr;
        for (&a, _) in self.holds.range(addr..addr + len) {
            if a > from {
                let _ = protector.unprotect(from as *const u8, a - from);
            }
            protector.wake(a as *const u8, PAGE);
            from = a + PAGE;
        }
        if from < addr + len {
            let _ = protector.unprotect(from as *const u8, addr + len - from);
        }
    }

    /// Starts a scan's work on `[addr, addr+len)`: from now on the fault
    /// thread leaves the holds there alone. Returns those still unbroken,
    /// with when they began.
    pub fn begin_chunk_holds(&mut self, addr: usize, len: usize) -> HashMap<usize, Instant> {
        let mut out = HashMap::new();
        let mine: Vec<(usize, Instant)> = self
            .holds
            .range(addr..addr + len)
            .map(|(&a, &t)| (a, t))
            .collect();
        let Some(ev) = self.evictions.clone().filter(|_| !mine.is_empty()) else {
            return out;
        };
        let mut t = ev.lock();
        t.held.scanning = Some((addr, addr + len));
        self.hold_scanning = true;
        for (a, since) in mine {
            if t.held.pages.get(&a) == Some(&since) {
                out.insert(a, since);
            } else {
                self.holds.remove(&a);
            }
        }
        out
    }

    /// Ends a scan's work on `[addr, addr+len)`: the pages of `keep`
    /// (address, start of the hold) are held from now on, every other hold
    /// there ends. The caller unprotects the rest of the range and wakes
    /// the held pages (a writer whose fault came during the scan faults again).
    pub fn end_chunk_holds(&mut self, addr: usize, len: usize, keep: &[(usize, Instant)]) {
        let ended: Vec<usize> = self
            .holds
            .range(addr..addr + len)
            .map(|(&a, _)| a)
            .filter(|a| !keep.iter().any(|(k, _)| k == a))
            .collect();
        if ended.is_empty() && keep.is_empty() && !self.hold_scanning {
            return;
        }
        self.hold_scanning = false;
        let Some(ev) = self.evictions.clone() else {
            return;
        };
        let mut t = ev.lock();
        for a in ended {
            self.holds.remove(&a);
            t.held.pages.remove(&a);
        }
        for &(a, since) in keep {
            self.holds.insert(a, since);
            t.held.pages.insert(a, since);
        }
        t.held.scanning = None;
    }

    /// Ends the holds in `[addr, addr+len)`, which is about to be protected,
    /// unprotected, unregistered or replaced, and wakes their writers.
    pub fn drop_holds(&mut self, addr: usize, len: usize) {
        let Some((&first, _)) = self.holds.range(addr..addr + len).next() else {
            return;
        };
        let ended: Vec<usize> = self
            .holds
            .range(first..addr + len)
            .map(|(&a, _)| a)
            .collect();
        if let Some(ev) = self.evictions.clone() {
            let mut t = ev.lock();
            for a in &ended {
                t.held.pages.remove(a);
            }
        }
        for a in ended {
            self.holds.remove(&a);
            if let Some(p) = &self.protector {
                p.wake(a as *const u8, PAGE);
            }
        }
    }

    /// Forgets the holds a write has ended since (the fault thread's table
    /// no longer has them), so they count against no budget.
    pub fn prune_holds(&mut self) {
        let Some(ev) = self.evictions.clone().filter(|_| !self.holds.is_empty()) else {
            return;
        };
        let t = ev.lock();
        self.holds
            .retain(|a, since| t.held.pages.get(a) == Some(since));
    }

    /// The page at `addr` is held.
    pub fn is_held(&self, addr: usize) -> bool {
        self.holds.contains_key(&addr)
    }

    /// Mappings the holds may cost.
    pub fn hold_vmas(&self) -> usize {
        2 * self.holds.len()
    }

    /// In a forked child: nothing is registered any more.
    pub fn forget_holds(&mut self) {
        self.holds = BTreeMap::new();
        self.hold_scanning = false;
        if let Some(ev) = &self.evictions {
            ev.lock().held.clear();
        }
    }
}
