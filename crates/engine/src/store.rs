//! Where the content of evicted pages is kept while their memory is free.
//!
//! Eviction (evict.rs) hands each page it takes to a `PageStore` and keeps
//! only the returned handle; the fault thread (fault.rs) asks the store for
//! the bytes back when the page is touched. The trait is deliberately small
//! (put, get, remove, how many bytes, spill to a lower tier) so that other stores — patches against
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
//! - `spill` is called by a policy above its HIGH watermark, possibly outside
//!   the engine lock (it may write to disk), so a fork may happen while it
//!   holds a lock of the store: `after_fork_in_child` must not wait for it.
//!
//! The default store is `TierStore` (tier_store.rs): pages compressed into
//! the tier crate's slab store, a swap file below it when configured.

use crate::sys::PAGE;

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

/// What a store holds. Memory (counted in the footprint): `payload` is the
/// stored bytes in memory, `overhead` everything else the store's memory
/// holds (tables, allocation slack and fragmentation, codecs). Disk:
/// `swapped` of the `pages` are in a swap file of `swap_file_bytes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreBytes {
    pub pages: u64,
    pub payload: u64,
    pub overhead: u64,
    pub swapped: u64,
    pub swap_file_bytes: u64,
}

impl StoreBytes {
    /// The store's memory: what it adds to the process footprint.
    pub fn memory(&self) -> u64 {
        self.payload + self.overhead
    }
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
    /// returns the memory bytes released (0: nothing to move, or nowhere to
    /// move it). Called by the policy above the high watermark (clock.rs), on
    /// an engine thread without the engine lock.
    fn spill(&self, _bytes: u64) -> u64 {
        0
    }
}

/// A store that keeps nothing: the fault thread's while it only ends holds
/// (hold.rs) and nothing was evicted, so that no address space is reserved
/// for content that may never come.
pub struct NoStore;

impl PageStore for NoStore {
    fn put(&self, _page: &[u8; PAGE]) -> Result<Handle, StoreError> {
        Err(StoreError::Full)
    }
    fn get(&self, _h: Handle, _out: &mut [u8; PAGE]) -> Result<(), StoreError> {
        Err(StoreError::Lost)
    }
    fn remove(&self, _h: Handle) {}
    fn bytes(&self) -> StoreBytes {
        StoreBytes::default()
    }
}
