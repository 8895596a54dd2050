//! Where the content of evicted pages is kept while their memory is free.
//!
//! Eviction (evict.rs) hands each page it takes to a `PageStore` and keeps
//! only the returned handle; the fault thread (fault.rs) asks the store for
//! the bytes back when the page is touched. The trait is deliberately small
//! (put, get, remove, how many bytes) so that other stores — patches against
//! a reference page, a swap file, the tier crate's compressed store — plug in
//! through `Engine::set_store` without the engine knowing what they do.
//!
//! Contract, because of who calls it and when:
//! - `put` runs under the engine lock, with the page write-protected: it may
//!   refuse (incompressible, full), and the page then simply stays in memory.
//! - `get` runs on the fault thread while a program thread waits in the
//!   kernel, possibly holding any lock of its own (malloc's, the engine's).
//!   So `get` must not allocate through malloc, must not take a lock that
//!   anyone holds while touching engine memory, and must not touch engine
//!   memory itself. An error means the content is gone: the page is poisoned
//!   (the program gets SIGBUS on it, as with a swap read error), never filled
//!   with wrong bytes.
//! - `remove` is called on engine threads only (never by the fault thread),
//!   after the page was restored or its block freed.
//! - After fork the child inherits the store (the engine restores every page
//!   before fork, so it is empty then); a store holding file descriptors or
//!   offsets shared with the parent must start afresh in `after_fork_in_child`.
//!
//! The built-in store compresses with LZ4 (lz4_flex; 1-6 us per page,
//! KERNEL-NOTES) and keeps each compressed page in its own heap allocation.
//! It refuses a page that does not compress to `max_compressed` bytes (3/4 of
//! a page by default: less would not pay for the fault that brings it back)
//! and any page beyond its capacity.

use std::sync::Mutex;

use crate::PAGE;

/// A stored page, as the store names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle(pub u64);

/// Why a store did not take or give back a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The page would not get smaller enough: it stays in memory.
    Incompressible,
    /// The store is at its capacity: the page stays in memory.
    Full,
    /// The content could not be read back (a bug, or an I/O error of a disk store).
    Lost,
}

/// What a store holds, for the footprint: `payload` is the stored bytes,
/// `overhead` the store's own bookkeeping and allocation slack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreBytes {
    pub pages: u64,
    pub payload: u64,
    pub overhead: u64,
}

/// A place for the content of evicted pages (see the module comment for who calls what).
pub trait PageStore: Send + Sync {
    fn put(&self, page: &[u8; PAGE]) -> Result<Handle, StoreError>;
    fn get(&self, h: Handle, out: &mut [u8; PAGE]) -> Result<(), StoreError>;
    fn remove(&self, h: Handle);
    fn bytes(&self) -> StoreBytes;
    /// Called in a forked child before it uses the store.
    fn after_fork_in_child(&self) {}
    /// Moves at least `bytes` of in-memory content to a lower tier (disk);
    /// returns the memory bytes released. Called by the policy above the
    /// high watermark (clock.rs), on an engine thread without the engine lock.
    fn spill(&self, _bytes: u64) -> u64 {
        0
    }
}

/// LZ4-compressed pages in memory.
pub struct Lz4Store {
    slots: Mutex<Slots>,
    capacity: u64,
    max_compressed: usize,
}

#[derive(Default)]
struct Slots {
    slots: Vec<Option<Box<[u8]>>>,
    free: Vec<u64>,
    pages: u64,
    payload: u64,
}

/// malloc's per-allocation header and rounding, counted as overhead.
const ALLOC_SLACK: u64 = 16;

impl Lz4Store {
    /// A store of at most `capacity` bytes (payload and overhead) that keeps
    /// pages compressing to at most `max_compressed` bytes.
    pub fn new(capacity: u64, max_compressed: usize) -> Lz4Store {
        Lz4Store { slots: Mutex::new(Slots::default()), capacity, max_compressed: max_compressed.min(PAGE) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Slots {
    fn overhead(&self) -> u64 {
        let table = self.slots.capacity() * std::mem::size_of::<Option<Box<[u8]>>>() + self.free.capacity() * 8;
        table as u64 + self.pages * ALLOC_SLACK
    }
}

impl PageStore for Lz4Store {
    fn put(&self, page: &[u8; PAGE]) -> Result<Handle, StoreError> {
        // lz4_flex wants room for the worst case up front.
        let mut buf = [0u8; lz4_flex::block::get_maximum_output_size(PAGE)];
        let n = match lz4_flex::block::compress_into(page, &mut buf) {
            Ok(n) if n <= self.max_compressed => n,
            _ => return Err(StoreError::Incompressible),
        };
        let mut s = self.lock();
        if s.payload + s.overhead() + n as u64 + ALLOC_SLACK + 16 > self.capacity {
            return Err(StoreError::Full);
        }
        let data: Box<[u8]> = buf[..n].into();
        let slot = match s.free.pop() {
            Some(i) => i,
            None => {
                s.slots.push(None);
                s.slots.len() as u64 - 1
            }
        };
        s.slots[slot as usize] = Some(data);
        s.pages += 1;
        s.payload += n as u64;
        Ok(Handle(slot))
    }

    fn get(&self, h: Handle, out: &mut [u8; PAGE]) -> Result<(), StoreError> {
        let s = self.lock();
        let Some(Some(data)) = s.slots.get(h.0 as usize) else { return Err(StoreError::Lost) };
        match lz4_flex::block::decompress_into(data, out) {
            Ok(PAGE) => Ok(()),
            _ => Err(StoreError::Lost),
        }
    }

    fn remove(&self, h: Handle) {
        let mut s = self.lock();
        let Some(slot) = s.slots.get_mut(h.0 as usize) else { return };
        if let Some(data) = slot.take() {
            s.pages -= 1;
            s.payload -= data.len() as u64;
            s.free.push(h.0);
        }
    }

    fn bytes(&self) -> StoreBytes {
        let s = self.lock();
        StoreBytes { pages: s.pages, payload: s.payload, overhead: s.overhead() }
    }
}
