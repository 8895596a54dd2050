//! Restoring evicted pages: the fault thread and the table it shares with
//! eviction.
//!
//! An evicted page (evict.rs) is not present and its range is registered with
//! userfaultfd in MISSING mode, so any touch — by the program, by another
//! thread, by a signal handler, by the kernel inside read(2), write(2),
//! process_vm_readv or send — stops in the kernel and queues a fault on the
//! engine's descriptor. A dedicated thread reads those faults and answers
//! each with UFFDIO_COPY of the page's content — from the store, or rebuilt
//! from a patch and its reference frame (patching.rs) — which maps the page
//! and wakes every thread waiting on it. This is not SIGBUS mode: there a
//! system call touching the page fails with EFAULT instead of waiting.
//!
//! The table maps page addresses to records, under its own mutex:
//! - `Evicted { handle, at }`: the store (or the table's patch store) holds the content since `at`;
//! - `Restored { handle }`: the fault thread put it back; the engine has not
//!   looked yet (the page is still `Page::Evicted` and still registered, and
//!   the store copy is removed when the engine reconciles, on its own threads).
//!
//! A record exists only while its page is registered MISSING with the
//! mapping it had when evicted, and only once its memory is freed (so a
//! restore never finds the page still there, evict.rs `arm_and_free`): the
//! engine removes records after a mapping change (a new mapping is
//! unregistered, so a late UFFDIO_COPY into it fails with ENOENT instead of
//! landing) and before it registers anything there.
//! So a fault on an address without a record is only woken (the thread
//! faults again, and the kernel handles it as usual); on a restored page it
//! is answered with the zero page (it was dropped again: MADV_DONTNEED on
//! anonymous memory, or a hole of its frame), which fails harmlessly if the
//! page is present.
//!
//! Deadlocks. The faulting thread may hold any lock: the program's, malloc's,
//! the engine's state lock (the engine copies and reads program memory under
//! it). So the fault thread takes only the table lock and the store's own
//! lock, never the engine's, and never allocates (malloc may be locked by the
//! faulter; the stack holds the page buffer). Whoever holds the table lock
//! never touches engine memory and, on program threads, has signals blocked
//! (a handler touching an evicted page would otherwise wait for its own
//! thread). Lock order: engine state, then table, then store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::held::Held;
use crate::patches::{Content, Patches};
use crate::protect::{Fault, Protector};
use crate::stats::LIFETIME_BUCKETS;
use crate::store::PageStore;
use crate::sys::{self, PAGE};

#[derive(Clone, Copy, Debug)]
pub(crate) enum Record {
    Evicted { handle: Content, at: Instant },
    Restored { handle: Content },
}

/// What restoring has done since the engine began.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counts {
    /// Pages brought back because something touched them.
    pub restored: u64,
    /// Pages the engine brought back itself (before fork, exempting a block).
    pub restored_by_engine: u64,
    /// Evicted pages whose block was freed or whose mapping was replaced.
    pub dropped: u64,
    /// A restore that found the page present, or a stored copy lost (poisoned).
    pub errors: u64,
    /// Time from eviction to the touch that restored it (Difference Engine's Figure 4).
    pub lifetime_ms_log2: [u64; LIFETIME_BUCKETS],
    /// Pages restored within `Table::young` of their eviction (governor.rs).
    pub restored_young: u64,
}

pub(crate) struct Table {
    records: HashMap<usize, Record>,
    /// Records in state `Evicted`.
    pub evicted_now: u64,
    pub counts: Counts,
    /// A restore within this time of the page's eviction counts as young.
    young: Duration,
    pub store: Arc<dyn PageStore>,
    /// Pages evicted as patches against a reference frame (patching.rs).
    pub patches: Patches,
    /// Pages held write-protected for the pin age (hold.rs).
    pub held: Held,
}

/// The engine's side of restoring (in `State`): the table it shares with
/// the fault thread, and that thread; made on first use (restore.rs).
#[derive(Default)]
pub(crate) struct Restoring {
    /// Evicted pages, held pages and patches, and the page store.
    pub evictions: Option<Arc<Evictions>>,
    /// `evictions` has a real page store (not `NoStore`, made for holds).
    pub has_store: bool,
    /// The thread restoring evicted pages and ending holds, once started.
    pub fault_thread: Option<std::thread::JoinHandle<()>>,
}

/// Shared by the engine and its fault thread.
pub(crate) struct Evictions {
    table: Mutex<Table>,
    /// The engine is gone: the fault thread ends once nothing is evicted.
    pub stop: AtomicBool,
}

/// The table, locked; on program threads with signals blocked until dropped.
pub(crate) struct Locked<'a> {
    guard: Option<MutexGuard<'a, Table>>,
    mask: Option<libc::sigset_t>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Table;
    fn deref(&self) -> &Table {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Table {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // The lock goes first: a signal handler may touch an evicted page.
        self.guard.take();
        if let Some(m) = self.mask.take() {
            sys::restore_signals(&m);
        }
    }
}

impl Evictions {
    /// Evictions into `store`; a restore within `young` of its page's
    /// eviction counts in `Counts::restored_young`.
    pub fn new(store: Arc<dyn PageStore>, young: Duration) -> Evictions {
        let table = Table {
            records: HashMap::new(),
            evicted_now: 0,
            counts: Counts::default(),
            young,
            store,
            patches: Patches::default(),
            held: Held::new(),
        };
        Evictions {
            table: Mutex::new(table),
            stop: AtomicBool::new(false),
        }
    }

    /// The table, with this thread's signals blocked while it is held.
    pub fn lock(&self) -> Locked<'_> {
        let mask = sys::block_signals();
        Locked {
            guard: Some(self.table.lock().unwrap_or_else(|e| e.into_inner())),
            mask: Some(mask),
        }
    }

    /// The table's mutex itself (fork holds it across the fork).
    pub fn raw_lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The table, on the fault thread (its signals are blocked for good).
    fn lock_here(&self) -> Locked<'_> {
        Locked {
            guard: Some(self.table.lock().unwrap_or_else(|e| e.into_inner())),
            mask: None,
        }
    }

    /// A write or write pin faulted on the page at `addr`: if it is held,
    /// its hold ends (with the held run around it) and the pages are
    /// unprotected, waking their writers.
    fn end_hold(&self, uffd: &Protector, addr: usize) {
        let mut l = self.lock_here();
        if let Some((start, len)) = l.held.end_by_write(addr) {
            let _ = uffd.unprotect(start as *const u8, len);
        }
    }

    /// Answers one missing-page fault at `addr`.
    fn serve(&self, uffd: &Protector, addr: usize, buf: &mut [u8; PAGE]) {
        crate::race::pause();
        let mut l = self.lock_here();
        match l.records.get(&addr).copied() {
            Some(Record::Evicted { handle, at }) => {
                if l.restore(uffd, addr, handle, buf) {
                    let lifetime = at.elapsed();
                    let young = lifetime < l.young;
                    let c = &mut l.counts;
                    c.restored += 1;
                    c.restored_young += young as u64;
                    c.lifetime_ms_log2[lifetime_bucket(lifetime.as_millis() as u64)] += 1;
                }
            }
            Some(Record::Restored { .. }) => {
                if uffd.zeropage(addr).is_err() {
                    uffd.wake(addr as *const u8, PAGE);
                }
            }
            None => uffd.wake(addr as *const u8, PAGE),
        }
    }
}

/// The histogram bucket of a lifetime of `ms` milliseconds.
pub fn lifetime_bucket(ms: u64) -> usize {
    if ms == 0 {
        return 0;
    }
    ((64 - ms.leading_zeros()) as usize).min(LIFETIME_BUCKETS - 1)
}

impl Table {
    /// Records that the page at `addr` is evicted with content `handle`.
    pub fn insert(&mut self, addr: usize, handle: Content) {
        self.records.insert(
            addr,
            Record::Evicted {
                handle,
                at: Instant::now(),
            },
        );
        self.evicted_now += 1;
    }

    /// The page's record, if it is registered as evicted: Some(true) if its
    /// content is still in the store, Some(false) if restored.
    pub fn evicted(&self, addr: usize) -> Option<bool> {
        self.records
            .get(&addr)
            .map(|r| matches!(r, Record::Evicted { .. }))
    }

    /// Removes the page's record and its stored content (restored, freed or
    /// replaced). The caller has changed or is about to unregister its mapping.
    pub fn forget(&mut self, addr: usize) {
        match self.records.remove(&addr) {
            Some(Record::Evicted { handle, .. }) => {
                self.evicted_now -= 1;
                self.counts.dropped += 1;
                self.drop_content(handle);
            }
            Some(Record::Restored { handle }) => self.drop_content(handle),
            None => {}
        }
    }

    /// Removes stored content: a page store's copy, or a patch (whose
    /// reference the engine unpins later, patching.rs).
    pub fn drop_content(&mut self, c: Content) {
        match c {
            Content::Stored(h) => self.store.remove(h),
            Content::Patch(id) => self.patches.remove(id),
        }
    }

    /// Reads content back into `buf` (on the fault thread: no allocation); false if it is lost.
    fn read_content(&mut self, c: Content, buf: &mut [u8; PAGE]) -> bool {
        match c {
            Content::Stored(h) => self.store.get(h, buf).is_ok(),
            Content::Patch(id) => self.patches.read(id, buf),
        }
    }

    /// Nothing evicted and nothing held: the fault thread may end once the engine has.
    fn idle(&self) -> bool {
        self.evicted_now == 0 && self.held.is_empty()
    }

    /// No records: no page is evicted or awaits reconciling.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Restores the page at `addr` from the engine's side (before fork, or
    /// before a block is exempted); true if it was evicted.
    pub fn restore_by_engine(&mut self, uffd: &Protector, addr: usize) -> bool {
        let Some(Record::Evicted { handle, .. }) = self.records.get(&addr).copied() else {
            return false;
        };
        let mut buf = [0u8; PAGE];
        let done = self.restore(uffd, addr, handle, &mut buf);
        self.counts.restored_by_engine += done as u64;
        done
    }

    /// Puts the stored content back at `addr` (mapping it and waking its
    /// faulters) and marks the record restored. False if the mapping is no
    /// longer registered (being replaced by the engine, which then forgets the record).
    fn restore(
        &mut self,
        uffd: &Protector,
        addr: usize,
        handle: Content,
        buf: &mut [u8; PAGE],
    ) -> bool {
        crate::race::pause();
        if !self.read_content(handle, buf) {
            self.lose(uffd, addr);
        } else if let Err(e) = uffd.copy(addr, buf) {
            if e.raw_os_error() != Some(libc::EEXIST) {
                uffd.wake(addr as *const u8, PAGE);
                return false;
            }
            // Present although evicted: something filled the hole behind our back.
            self.counts.errors += 1;
        }
        self.records.insert(addr, Record::Restored { handle });
        self.evicted_now -= 1;
        true
    }

    /// The stored copy is gone: the page must never read wrong bytes, so it
    /// is poisoned (touching it raises SIGBUS) or, without that, the process ends.
    fn lose(&mut self, uffd: &Protector, addr: usize) {
        self.counts.errors += 1;
        if uffd.poison && uffd.poison(addr).is_ok() {
            return;
        }
        let msg = b"pagefold: the stored copy of an evicted page is lost; aborting\n";
        // SAFETY: msg is a live static byte string of msg.len() bytes; write to fd 2 and abort
        // take no Rust-visible state.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::abort();
        }
    }

    pub fn records_bytes(&self) -> usize {
        self.records.capacity() * (std::mem::size_of::<(usize, Record)>() + 1)
    }
}

/// The fault thread: reads faults from `uffd` and restores evicted pages
/// until the engine is gone and nothing is evicted any more.
pub(crate) fn run(uffd: Arc<Protector>, ev: Arc<Evictions>) {
    // Process signals go to the program's threads, never to this one.
    let _ = sys::block_signals();
    crate::threads::ENGINE_THREAD.with(|t| t.set(true));
    let mut faults = [Fault { addr: 0, wp: false }; 16];
    let mut buf = [0u8; PAGE];
    loop {
        let n = uffd.read_faults(&mut faults, 200);
        // A write-protect fault on a held page ends its hold (hold.rs); any
        // other write-protect fault belongs to a scan, which wakes it when it
        // unprotects; a missing-page fault restores an evicted page.
        for f in &faults[..n] {
            if f.wp {
                ev.end_hold(&uffd, f.addr);
            } else {
                ev.serve(&uffd, f.addr, &mut buf);
            }
        }
        if n == 0 && ev.stop.load(Ordering::SeqCst) && ev.lock_here().idle() {
            return;
        }
    }
}
