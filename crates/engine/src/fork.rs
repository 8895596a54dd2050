//! Fork safety.
//!
//! Owned pages are mapped MAP_SHARED: after a plain fork, parent and child
//! would write into the same frames. So before fork (pthread_atfork prepare)
//! every engine's lock is taken and every owned page frozen (remapped
//! MAP_PRIVATE in place, which adds no mapping); the kernel's own
//! copy-on-write then keeps the two processes apart.
//!
//! Both processes now map the pre-fork frames, and neither knows what the
//! other still uses, so after the fork each side retires its pools (no punch,
//! no reuse; they stay readable and mappable) and starts a fresh one. The
//! child also needs its own userfaultfd and pagemap: the inherited ones
//! belong to the parent's address space (fork leaves no range registered:
//! scans register only while they run, under the lock). The background scanner thread does
//! not survive fork; the child scans on demand only.
//!
//! Evicted pages: without UFFD_FEATURE_EVENT_FORK the child's mappings are
//! not registered, so it would read an evicted page as zero. So prepare
//! restores every evicted page first (the forking thread answers them itself)
//! and holds the table lock across fork, so the fault thread is known not to
//! hold it. The fault thread does not survive fork; the child starts its own
//! when it evicts, on its own userfaultfd.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, Once, Weak};

use crate::space::Page;
use crate::state::{Inner, State};
use crate::sys;

static ENGINES: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());
static ATFORK: Once = Once::new();

/// Locks held by the forking thread from prepare until parent/child.
struct Held {
    _registry: MutexGuard<'static, Vec<Weak<Inner>>>,
    /// Each engine's lock and what keeps it alive: a tuple drops its fields in
    /// order, so the guard unlocks before the Arc may free the mutex.
    engines: Vec<(MutexGuard<'static, State>, Arc<Inner>)>,
    /// Eviction tables, locked (after their engines'), and what keeps them alive.
    tables: Vec<(
        MutexGuard<'static, crate::fault::Table>,
        Arc<crate::fault::Evictions>,
    )>,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
    /// Whether the forking thread counted as an engine thread before prepare.
    static WAS_ENGINE_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

pub fn register(engine: Weak<Inner>) {
    // SAFETY: prepare, parent and child are extern "C" functions with no arguments, as
    // pthread_atfork requires, and live for the whole program.
    ATFORK.call_once(|| unsafe {
        libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
    });
    let mut list = ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|w| w.strong_count() > 0);
    list.push(engine);
}

extern "C" fn prepare() {
    // From here to parent/child this thread holds every engine lock, and the
    // code below copies and allocates: through a preload those calls would
    // come back into the engine and wait for the lock this thread holds.
    // Marked as an engine thread, it gets glibc's functions instead.
    WAS_ENGINE_THREAD.with(|w| w.set(crate::threads::on_engine_thread()));
    crate::threads::ENGINE_THREAD.with(|t| t.set(true));
    let registry = ENGINES.lock().unwrap_or_else(|e| e.into_inner());
    let engines = registry
        .iter()
        .filter_map(Weak::upgrade)
        .map(|inner| {
            let guard = inner.lock();
            // The guard borrows from `inner`, which `Held` keeps alive beside it.
            // SAFETY: only the lifetime is changed: the guard borrows the Mutex inside `inner`,
            // and `Held` stores that Arc right after the guard in one tuple, which drops the
            // guard first: the mutex outlives the guard even if this is the last reference.
            let guard: MutexGuard<'static, State> = unsafe { std::mem::transmute(guard) };
            (guard, inner)
        })
        .collect::<Vec<_>>();
    let mut held = Held {
        _registry: registry,
        engines,
        tables: Vec::new(),
    };
    for (st, _) in held.engines.iter_mut() {
        // A recycled block maps frames MAP_SHARED and would be the child's too.
        st.flush_recycled();
        st.restore_all_evicted();
        st.freeze_all();
        if let Some(ev) = st.restoring.evictions.clone() {
            let guard = ev.raw_lock();
            // The guard borrows from the Evictions, which `Held` keeps alive beside it.
            let guard: MutexGuard<'static, crate::fault::Table> =
                // SAFETY: only the lifetime is changed: the guard borrows the Table inside
                // `ev`, and `Held` stores that Arc next to the guard until the guard is dropped
                // in parent/child.
                unsafe { std::mem::transmute(guard) };
            held.tables.push((guard, ev));
        }
    }
    HELD.with(|h| *h.borrow_mut() = Some(held));
}

extern "C" fn parent() {
    release(false);
}

extern "C" fn child() {
    crate::fds::after_fork_child();
    release(true);
}

fn release(in_child: bool) {
    release_locks(in_child);
    crate::threads::ENGINE_THREAD.with(|t| t.set(WAS_ENGINE_THREAD.with(|w| w.get())));
}

fn release_locks(in_child: bool) {
    let Some(mut held) = HELD.with(|h| h.borrow_mut().take()) else {
        return;
    };
    // Tables first: the child's engine reads its own below.
    held.tables.clear();
    for (st, inner) in held.engines.iter_mut() {
        st.retire_pools(in_child);
        if in_child {
            st.reopen_process_handles();
            inner.after_fork_in_child();
            // The scanner thread does not exist here: forget its handle, never join it.
            if let Ok(mut bg) = inner.bg.try_lock() {
                std::mem::forget(bg.take());
            }
        }
    }
    // Guards drop here, in this order: engines first, then the registry.
    held.engines.clear();
}

impl State {
    /// Freezes every owned page of every block. An owned run is a mapping of
    /// its own, so this replaces whole mappings: no new VMA, nothing for
    /// injected mmap failures to model. Should the kernel still refuse, the
    /// run stays shared with the child; that is counted (`fallbacks.mmap`).
    fn freeze_all(&mut self) {
        let bases: Vec<usize> = self.blocks.keys().copied().collect();
        for base in bases {
            let owned_runs = {
                let pages = &self.blocks[&base].pages;
                crate::space::runs(0..pages.len(), |k| match pages[k] {
                    Page::Owned(f) => Some(f),
                    _ => None,
                })
            };
            for (a, b) in owned_runs {
                let Page::Owned(first) = self.blocks[&base].pages[a] else {
                    continue;
                };
                let addr = self.blocks[&base].page_addr(a);
                let fd = self.pools[first.pool()].fd;
                let len = (b - a) * crate::sys::PAGE;
                let mapped = self.changing_mapping(addr as usize, len, |_| {
                    sys::map_uninjected(addr, len, Some(fd), first.slot(), false, true).is_ok()
                });
                if !mapped {
                    self.stats.fallbacks.mmap += 1;
                    continue;
                }
                self.record_remap(base, a, b - a, Some(first));
                for k in 0..(b - a) as u64 {
                    self.pools[first.pool()].freeze(first.slot() + k);
                }
            }
        }
    }

    /// Retires every pool the other process may map or allocate from. The
    /// parent keeps a pool with no references (the child maps none of it and
    /// allocates only from its own); the child never allocates from an
    /// inherited memfd. Opens a fresh pool if the current one retired.
    fn retire_pools(&mut self, in_child: bool) {
        if self.pools.is_empty() {
            return;
        }
        for p in self
            .pools
            .iter_mut()
            .filter(|p| !p.retired && (in_child || p.live() > 0))
        {
            p.retired = true;
            p.close_if_idle();
        }
        if self.pools.last().is_some_and(|p| p.retired) {
            match State::open_pool(&self.cfg) {
                Ok(p) => self.pools.push(p),
                Err(_) => self.stats.fallbacks.memfd += 1,
            }
        }
    }

    /// The inherited userfaultfd, pagemap and maps describe the parent.
    fn reopen_process_handles(&mut self) {
        self.pagemap = sys::Pagemap::open().ok();
        self.mappings.reopen();
        self.recycler.after_fork_in_child();
        if let Some(thread) = self.restoring.fault_thread.take() {
            // The fault thread is not here: its handle must not be joined or
            // detached, and the references it held will never be dropped.
            std::mem::forget(thread);
            if let Some(p) = &self.protector {
                // SAFETY: the forgotten fault thread held one strong reference to the protector
                // that it will never drop in this child; this releases that one reference,
                // while `p` keeps another alive.
                unsafe { Arc::decrement_strong_count(Arc::as_ptr(p)) };
            }
            if let Some(ev) = &self.restoring.evictions {
                // SAFETY: the forgotten fault thread held one strong reference to the evictions
                // that it will never drop in this child; this releases that one reference,
                // while `ev` keeps another alive.
                unsafe { Arc::decrement_strong_count(Arc::as_ptr(ev)) };
            }
        }
        if let Some(ev) = &self.restoring.evictions {
            ev.lock().store.after_fork_in_child();
        }
        self.forget_holds();
        self.protector = State::open_protector(&self.cfg);
        // The scratch range was not inherited (MADV_DONTFORK): its address
        // may be anyone's now, so it must not be unmapped.
        if let Some(s) = self.guard.scratch.take() {
            std::mem::forget(s);
        }
        self.guard.missing = false;
    }
}
