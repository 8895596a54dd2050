//! The engine's side of restoring evicted pages: starting the fault thread
//! (fault.rs) with a page store, reconciling pages it restored, and
//! restoring pages from the engine's own thread (before fork, before a copy
//! shares them, before a block leaves the engine's hands).

use std::sync::Arc;

use crate::fault::Evictions;
use crate::space::Page;
use crate::state::State;
use crate::store::NoStore;
use crate::sys::PAGE;
use crate::tier_store::{TierConfig, TierStore};

impl State {
    /// The fault thread runs (started on first use) with a page store for
    /// evicted content; false if userfaultfd MISSING mode is unavailable,
    /// the store cannot reserve its address space or the thread cannot start.
    pub(crate) fn fault_thread_ready(&mut self) -> bool {
        self.start_fault_thread(true)
    }

    /// The fault thread runs; `with_store`: with a store for evicted
    /// content. Holds (hold.rs) need none, and a process under a low
    /// RLIMIT_AS would lose the store's address space to them.
    pub(crate) fn start_fault_thread(&mut self, with_store: bool) -> bool {
        let Some(uffd) = self.protector.clone().filter(|p| p.missing) else {
            return false;
        };
        if with_store && !self.restoring.has_store {
            // No address space for the store's slabs: no eviction.
            let Ok(store) = TierStore::new(TierConfig::from_engine(&self.cfg)) else {
                return false;
            };
            match &self.restoring.evictions {
                // Nothing was evicted into the empty store it replaces.
                Some(ev) => ev.lock().store = Arc::new(store),
                None => {
                    self.restoring.evictions = Some(Arc::new(Evictions::new(
                        Arc::new(store),
                        crate::governor::young(&self.cfg),
                    )))
                }
            }
            self.restoring.has_store = true;
        }
        if self.restoring.fault_thread.is_some() {
            return true;
        }
        let ev = self
            .restoring
            .evictions
            .get_or_insert_with(|| {
                Arc::new(Evictions::new(
                    Arc::new(NoStore),
                    crate::governor::young(&self.cfg),
                ))
            })
            .clone();
        ev.lock().patches.fail_decode = self.cfg.inject.fail_patch;
        let spawned = std::thread::Builder::new()
            .name("pagefold-fault".into())
            .stack_size(256 << 10)
            .spawn(move || crate::fault::run(uffd, ev));
        self.restoring.fault_thread = spawned.ok();
        self.restoring.fault_thread.is_some()
    }

    /// Pages of `[i, i+n)` the fault thread restored become what they were
    /// restored as: their records and stored copies go, and so does their
    /// MISSING registration. Called outside any registered chunk (unregistering
    /// would drop a scan's write protection).
    pub(crate) fn reconcile(&mut self, base: usize, i: usize, n: usize) {
        if self.blocks[&base].evicted == 0 {
            return;
        }
        let Some(ev) = self.restoring.evictions.clone() else {
            return;
        };
        let mut restored = Vec::new();
        {
            let mut t = ev.lock();
            let block = &self.blocks[&base];
            for k in (i..i + n).filter(|&k| block.pages[k].is_evicted()) {
                let addr = block.page_addr(k) as usize;
                if t.evicted(addr) != Some(true) {
                    t.forget(addr);
                    restored.push(k);
                }
            }
        }
        for (a, b) in crate::space::consecutive(&restored) {
            let addr = self.blocks[&base].page_addr(a);
            crate::race::pause();
            self.unregister(addr, (b - a) * PAGE);
            let block = self
                .blocks
                .get_mut(&base)
                .expect("block vanished under the lock");
            let before = block.boundaries(a, b - a);
            for k in a..b {
                let Page::Evicted(kind) = block.pages[k] else {
                    unreachable!()
                };
                block.set(k, kind.page());
                // Touched since it was evicted: recently accessed for the clock.
                block.seen[k] = crate::seen::accessed(block.seen[k]);
            }
            let after = block.boundaries(a, b - a);
            block.vmas = block.vmas + after - before;
            self.mappings.changed(before, after);
        }
        self.settle_pins();
    }

    /// Brings every evicted page of `[i, i+n)` back now, from this thread
    /// (before fork, before a block leaves the engine's hands).
    pub(crate) fn restore_evicted(&mut self, base: usize, i: usize, n: usize) {
        if self.blocks[&base].evicted == 0 {
            return;
        }
        if let (Some(ev), Some(uffd)) = (self.restoring.evictions.clone(), self.protector.clone()) {
            let mut t = ev.lock();
            let block = &self.blocks[&base];
            for k in (i..i + n).filter(|&k| block.pages[k].is_evicted()) {
                t.restore_by_engine(&uffd, block.page_addr(k) as usize);
            }
        }
        self.reconcile(base, i, n);
    }

    /// Every evicted page of every block, back (before fork).
    pub(crate) fn restore_all_evicted(&mut self) {
        let bases: Vec<usize> = self
            .blocks
            .iter()
            .filter(|(_, b)| b.evicted > 0)
            .map(|(&b, _)| b)
            .collect();
        for base in bases {
            let n = self.blocks[&base].pages.len();
            self.restore_evicted(base, 0, n);
        }
    }
}
