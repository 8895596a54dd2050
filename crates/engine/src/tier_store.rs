//! The engine's default page store: evicted pages compressed into the tier
//! crate's slab store, and moved on to a swap file when memory is short.
//!
//! `put` compresses a page with pagefold-tier's `Compressor` (LZ4 by
//! default, zstd-1 on numeric and zero-rich pages, 9 bytes for a page of
//! one repeated word) and refuses pages that would not save an eighth of a
//! page: they stay in memory. The object goes into the tier's `Store`
//! (size-classed slabs in one reserved mapping), whose memory is counted
//! exactly: slabs, their fragmentation, cached empty slabs, every table,
//! and the codecs' buffers and zstd contexts are all in `bytes()`, so the
//! footprint the engine reports includes what eviction costs.
//!
//! Engine handles are indirect (an index and a generation into this store's
//! own table), so an object can move between memory and disk behind them.
//! With a swap file configured (`Config::swap_file`), `spill` writes the
//! oldest objects in memory — compressed pages, and any other object the
//! store holds — to the tier's `SwapFile` (one slot and one write each,
//! with a checksum), then compacts the slabs and gives emptied ones back; a
//! `put` that finds the store at its capacity spills instead of refusing.
//! The file is created on first use as `<path>.<pid>.<n>` (several stores,
//! processes and forked children never share one) and unlinked at once, so
//! it goes when the process does, however it ends. A failed write (ENOSPC, EIO) keeps the object in memory: no data
//! is at stake until a write succeeded. A failed read or a bad checksum is
//! `StoreError::Lost`: the engine poisons the page (SIGBUS), never fills it
//! with wrong bytes.
//!
//! The fault thread's contract (store.rs): `get` takes only this store's
//! inner lock, which no one holds while touching engine memory (`put` is
//! handed a copy), and allocates nothing: the decoders (lz4_flex decodes
//! into the caller's buffer, the zstd DCtx is made and warmed up here at
//! creation) live under that lock, and a swapped object is read with pread
//! into a stack buffer. tests/tier_store.rs checks this with a counting
//! global allocator. `spill` keeps the inner lock for one batch of writes
//! at a time, so a fault waits for at most one batch. A policy may spill
//! outside the engine lock, so a fork can find the inner lock held by a
//! thread the child does not have: the child's store is then given up
//! (`after_fork_in_child`), never waited for.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::mem::ManuallyDrop;
use std::os::unix::io::{FromRawFd, IntoRawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use pagefold_tier::compress::{Compressor, Method};
use pagefold_tier::store::{Handle as SlabHandle, Store, StoreConfig};
use pagefold_tier::swap::{Slot, SwapConfig, SwapDescriptor, SwapFile};

use crate::store::{Handle, PageStore, StoreBytes, StoreError};
use crate::sys::PAGE;

/// A `put` that finds the store full spills at least this much first, so
/// the slab compaction after a spill is paid once per megabyte, not per page.
const SPILL_STEP: u64 = 1 << 20;
/// Swap file growth step in slots (256 KiB): `fallocate` per step reports a
/// full disk before any data is at stake.
const SWAP_GROW_SLOTS: u32 = 64;
/// Objects written per hold of the inner lock: a fault waits for at most this many writes.
const SPILL_BATCH: usize = 32;

/// The swap file's descriptor, adopted like every engine descriptor
/// (fds.rs): out of the program's range, identity checked before each use.
struct AdoptedSwap(crate::fds::Fd);

impl SwapDescriptor for AdoptedSwap {
    fn with_file(&self, f: &mut dyn FnMut(&File) -> io::Result<()>) -> io::Result<()> {
        self.0.with(|n| {
            // SAFETY: n is the engine's open swap file descriptor for this call (checked
            // by `with`); ManuallyDrop keeps the borrowed File from closing it.
            let file = ManuallyDrop::new(unsafe { File::from_raw_fd(n) });
            f(&file)
        })
    }
}

impl Drop for AdoptedSwap {
    fn drop(&mut self) {
        // Adopted in `adopt_swap` and owned by this value only: closed once, here.
        self.0.close();
    }
}

fn adopt_swap(file: File) -> io::Result<Box<dyn SwapDescriptor>> {
    Ok(Box::new(AdoptedSwap(crate::fds::adopt(
        file.into_raw_fd(),
    )?)))
}

/// Where a swap file goes and how large it may grow.
#[derive(Clone, Debug)]
pub struct SwapSettings {
    /// Prefix of the file's path (`<path>.<pid>.<n>` is created).
    pub path: PathBuf,
    pub max_bytes: u64,
}

/// Parameters of a [`TierStore`].
#[derive(Clone, Debug)]
pub struct TierConfig {
    /// Most bytes of memory the store may hold: objects, slabs and their
    /// slack, tables, codecs.
    pub capacity: u64,
    pub swap: Option<SwapSettings>,
}

impl TierConfig {
    /// The engine's configuration of its default store.
    pub fn from_engine(cfg: &crate::config::Config) -> TierConfig {
        TierConfig {
            capacity: cfg.evict_store_bytes,
            swap: cfg.swap_file.clone().map(|path| SwapSettings {
                path,
                max_bytes: cfg.swap_bytes,
            }),
        }
    }
}

/// What the store did since it began (for tests and reports).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierCounts {
    /// Pages stored by method: one repeated word, LZ4, zstd.
    pub same: u64,
    pub lz4: u64,
    pub zstd: u64,
    /// Objects written to the swap file.
    pub spilled: u64,
    /// Writes to the swap file that failed (the objects stayed in memory).
    pub swap_write_errors: u64,
    /// Reads from the swap file that failed or did not match their checksum.
    pub swap_read_errors: u64,
}

#[derive(Clone, Copy, Debug)]
enum Place {
    Free,
    Memory(SlabHandle),
    Swap(Slot),
    /// In the parent's swap file (this is a forked child): never readable here.
    Gone,
}

#[derive(Clone, Copy, Debug)]
struct Object {
    place: Place,
    generation: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SwapState {
    /// Not configured, or creating the file failed.
    Off,
    /// Configured; the file is made on first spill.
    NotYet,
    Open,
}

struct Inner {
    slabs: Store,
    /// Decodes for `get` (its zstd context made at creation).
    codec: Compressor,
    objects: Vec<Object>,
    free: Vec<u32>,
    /// Objects in memory as (index, generation), oldest first: spill order.
    /// Entries of objects since removed or spilled are skipped when met.
    oldest: VecDeque<(u32, u32)>,
    in_memory: u64,
    swapped: u64,
    swap: Option<SwapFile>,
    swap_state: SwapState,
    counts: TierCounts,
}

/// Compressed pages in slabs, with a swap file below: see the module comment.
pub struct TierStore {
    cfg: TierConfig,
    /// Compresses for `put` (engine lock held): outside the inner lock so a
    /// fault never waits for a compression.
    put_codec: Mutex<Compressor>,
    put_codec_bytes: AtomicU64,
    inner: Mutex<Inner>,
    /// Forked child whose parent held `inner` at the fork: never lock it.
    orphaned: AtomicBool,
}

static SWAP_FILES: AtomicU64 = AtomicU64::new(0);

fn handle(index: u32, generation: u32) -> Handle {
    Handle((generation as u64) << 32 | index as u64)
}

fn split(h: Handle) -> (usize, u32) {
    ((h.0 & 0xffff_ffff) as usize, (h.0 >> 32) as u32)
}

impl TierStore {
    /// A store; fails only if no address space can be reserved for slabs.
    pub fn new(cfg: TierConfig) -> Result<TierStore, StoreError> {
        let reserve = cfg.capacity.clamp(16 << 20, 64 << 30) as usize;
        let slabs = Store::new(StoreConfig {
            reserve_bytes: reserve,
            ..StoreConfig::default()
        })
        .map_err(|_| StoreError::Full)?;
        let put_codec = Compressor::default();
        let inner = Inner {
            slabs,
            codec: warmed_decoder(),
            objects: Vec::new(),
            free: Vec::new(),
            oldest: VecDeque::new(),
            in_memory: 0,
            swapped: 0,
            swap: None,
            swap_state: if cfg.swap.is_some() {
                SwapState::NotYet
            } else {
                SwapState::Off
            },
            counts: TierCounts::default(),
        };
        Ok(TierStore {
            cfg,
            put_codec_bytes: AtomicU64::new(put_codec.memory_bytes() as u64),
            put_codec: Mutex::new(put_codec),
            inner: Mutex::new(inner),
            orphaned: AtomicBool::new(false),
        })
    }

    /// The inner state; None in a forked child whose parent had it locked
    /// at the fork (see `after_fork_in_child`).
    fn lock(&self) -> Option<MutexGuard<'_, Inner>> {
        if self.orphaned.load(Ordering::Relaxed) {
            return None;
        }
        Some(self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn counts(&self) -> TierCounts {
        self.lock().map(|s| s.counts).unwrap_or_default()
    }

    /// Runs `f` with the store's inner lock held, as a spill in another
    /// thread holds it (for tests of fork at that moment).
    #[doc(hidden)]
    pub fn with_lock_held<R>(&self, f: impl FnOnce() -> R) -> R {
        let _held = self.lock();
        f()
    }

    /// `bytes()` recomputed from the tables rather than the counters, with
    /// the invariants checked (every object in exactly one place, the slab
    /// store's own audit, the swap file's used slots); for tests.
    pub fn audit(&self) -> Result<StoreBytes, String> {
        let s = self
            .lock()
            .ok_or("the store was locked by another thread at fork")?;
        let slabs = s.slabs.audit()?;
        let (mut in_memory, mut swapped, mut gone, mut payload) = (0u64, 0u64, 0u64, 0u64);
        for o in &s.objects {
            match o.place {
                Place::Memory(sh) => {
                    in_memory += 1;
                    payload += s
                        .slabs
                        .len_of(sh)
                        .map_err(|e| format!("object in memory without a slab slot: {e}"))?
                        as u64;
                }
                Place::Swap(slot) => {
                    swapped += 1;
                    s.swap
                        .as_ref()
                        .and_then(|f| f.len_of(slot).ok())
                        .ok_or("swapped object without a slot")?;
                }
                Place::Gone => gone += 1,
                Place::Free => {}
            }
        }
        let free = s
            .objects
            .iter()
            .filter(|o| matches!(o.place, Place::Free))
            .count();
        let swapped_here = swapped;
        swapped += gone;
        if (in_memory, swapped, free) != (s.in_memory, s.swapped, s.free.len())
            || payload != slabs.payload_bytes
        {
            return Err(format!("counted {in_memory} in memory, {swapped} swapped, {free} free, {payload} B; kept {} / {} / {} / {} B", s.in_memory, s.swapped, s.free.len(), slabs.payload_bytes));
        }
        let swap = s.swap.as_ref().map(|f| f.stats()).unwrap_or_default();
        if s.swap.is_some() && swap.slots_used != swapped_here {
            return Err(format!(
                "{swapped_here} swapped objects but {} slots used",
                swap.slots_used
            ));
        }
        let memory =
            self.memory_bytes(&s) - s.slabs.stats().footprint_bytes() + slabs.footprint_bytes();
        Ok(StoreBytes {
            pages: in_memory + swapped,
            payload,
            overhead: memory - payload,
            swapped,
            swap_file_bytes: swap.slots_allocated * PAGE as u64,
        })
    }

    /// Bytes of memory the store holds (what `bytes()` splits into payload and overhead).
    fn memory_bytes(&self, s: &Inner) -> u64 {
        s.memory_bytes() + self.put_codec_bytes.load(Ordering::Relaxed)
    }

    /// Stores `obj` (a compressed page), spilling to the swap file first if
    /// the store is at its capacity and has one.
    fn insert(&self, obj: &[u8]) -> Result<Handle, StoreError> {
        let mut spilled = false;
        loop {
            let Some(mut s) = self.lock() else {
                return Err(StoreError::Full);
            };
            let extra = self.put_codec_bytes.load(Ordering::Relaxed);
            match s.try_insert(obj, self.cfg.capacity.saturating_sub(extra)) {
                Err(StoreError::Full) if !spilled && s.swap_state != SwapState::Off => {
                    drop(s);
                    if self.spill(SPILL_STEP.max(obj.len() as u64)) == 0 {
                        return Err(StoreError::Full);
                    }
                    spilled = true;
                }
                r => return r,
            }
        }
    }

    /// Moves objects to the swap file, oldest first, until at least
    /// `payload` bytes of them moved or nothing more can; returns the bytes moved.
    fn swap_out_oldest(&self, payload: u64) -> u64 {
        let mut moved = 0;
        while moved < payload {
            let Some(mut s) = self.lock() else { break };
            if !s.swap_ready(&self.cfg) {
                break;
            }
            let batch = s.take_oldest(SPILL_BATCH);
            if batch.is_empty() {
                break;
            }
            let (n, done) = s.swap_out(&batch);
            moved += n;
            if !done {
                break;
            }
        }
        moved
    }
}

/// A decoder whose zstd context has decoded once, so that nothing in it is
/// allocated later, on the fault thread.
fn warmed_decoder() -> Compressor {
    let mut c = Compressor::default();
    let mut numeric = [0u8; PAGE];
    for (i, w) in numeric.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(i as u64 * 7919 % 1021).to_le_bytes());
    }
    let mut out = [0u8; PAGE];
    if let Some(obj) = c.compress(&numeric).map(|o| o.to_vec()) {
        let _ = c.decompress(&obj, &mut out);
    }
    c
}

impl Inner {
    fn memory_bytes(&self) -> u64 {
        use std::mem::size_of;
        let tables = self.objects.capacity() * size_of::<Object>()
            + self.free.capacity() * 4
            + self.oldest.capacity() * size_of::<(u32, u32)>()
            + size_of::<TierStore>();
        let swap = self.swap.as_ref().map_or(0, |f| {
            f.stats().metadata_bytes as usize + size_of::<SwapFile>()
        });
        self.slabs.stats().footprint_bytes() + (tables + swap + self.codec.memory_bytes()) as u64
    }

    /// Inserts `obj` if the store then holds at most `capacity` bytes.
    fn try_insert(&mut self, obj: &[u8], capacity: u64) -> Result<Handle, StoreError> {
        let sh = self.slabs.insert(obj).map_err(|_| StoreError::Full)?;
        if capacity != u64::MAX && self.memory_bytes() > capacity {
            let _ = self.slabs.remove(sh);
            // A slab made for this object would stay cached, and counted.
            self.slabs.trim();
            return Err(StoreError::Full);
        }
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.objects.push(Object {
                    place: Place::Free,
                    generation: 0,
                });
                self.objects.len() as u32 - 1
            }
        };
        let o = &mut self.objects[index as usize];
        o.generation = o.generation.wrapping_add(1);
        o.place = Place::Memory(sh);
        let generation = o.generation;
        self.oldest.push_back((index, generation));
        self.in_memory += 1;
        Ok(handle(index, generation))
    }

    fn object(&self, h: Handle) -> Option<Object> {
        let (i, g) = split(h);
        self.objects
            .get(i)
            .copied()
            .filter(|o| o.generation == g && !matches!(o.place, Place::Free))
    }

    /// Rebuilds the page of `h` into `out`; allocates nothing (see the module comment).
    fn read(&mut self, h: Handle, out: &mut [u8; PAGE]) -> Result<(), StoreError> {
        let o = self.object(h).ok_or(StoreError::Lost)?;
        match o.place {
            Place::Memory(sh) => {
                let data = self.slabs.get(sh).map_err(|_| StoreError::Lost)?;
                self.codec
                    .decompress(data, out)
                    .map_err(|_| StoreError::Lost)
            }
            Place::Swap(slot) => {
                let mut buf = [0u8; PAGE];
                let read = self
                    .swap
                    .as_mut()
                    .ok_or(StoreError::Lost)
                    .and_then(|f| f.swap_in(slot, &mut buf).map_err(|_| StoreError::Lost));
                let n = read.inspect_err(|_| self.counts.swap_read_errors += 1)?;
                self.codec
                    .decompress(&buf[..n], out)
                    .map_err(|_| StoreError::Lost)
            }
            Place::Free | Place::Gone => Err(StoreError::Lost),
        }
    }

    fn remove(&mut self, h: Handle) {
        let Some(o) = self.object(h) else { return };
        match o.place {
            Place::Memory(sh) => {
                let _ = self.slabs.remove(sh);
                self.in_memory -= 1;
            }
            Place::Swap(slot) => {
                if let Some(f) = self.swap.as_mut() {
                    let _ = f.free(slot);
                }
                self.swapped -= 1;
            }
            Place::Gone => self.swapped -= 1,
            Place::Free => return,
        }
        let (i, _) = split(h);
        self.objects[i].place = Place::Free;
        self.free.push(i as u32);
        self.forget_stale_order();
    }

    /// Drops spill-order entries of objects no longer in memory once they
    /// outnumber the live ones (bounds the queue under churn).
    fn forget_stale_order(&mut self) {
        if self.oldest.len() as u64 > 2 * self.in_memory + 64 {
            let objects = &self.objects;
            self.oldest.retain(|&(i, g)| {
                let o = objects[i as usize];
                o.generation == g && matches!(o.place, Place::Memory(_))
            });
            self.oldest.shrink_to(2 * self.oldest.len() + 64);
        }
    }

    /// Opens the swap file if it is configured and not open yet; false if
    /// there is none.
    fn swap_ready(&mut self, cfg: &TierConfig) -> bool {
        if self.swap_state == SwapState::NotYet {
            let settings = cfg.swap.as_ref().expect("NotYet only with swap settings");
            let n = SWAP_FILES.fetch_add(1, Ordering::Relaxed);
            let mut path = settings.path.clone().into_os_string();
            path.push(format!(".{}.{n}", std::process::id()));
            let mut sc = SwapConfig::new(PathBuf::from(path));
            sc.max_slots = (settings.max_bytes / PAGE as u64).min(u32::MAX as u64) as u32;
            sc.grow_slots = SWAP_GROW_SLOTS;
            sc.adopt = Some(adopt_swap);
            match SwapFile::create(&sc) {
                Ok(f) => {
                    // Open descriptors keep it; nothing is left behind on exit.
                    let _ = std::fs::remove_file(f.path());
                    self.swap = Some(f);
                    self.swap_state = SwapState::Open;
                }
                Err(_) => {
                    self.counts.swap_write_errors += 1;
                    self.swap_state = SwapState::Off;
                }
            }
        }
        self.swap_state == SwapState::Open
    }

    /// Takes up to `n` of the oldest objects in memory out of the spill order.
    fn take_oldest(&mut self, n: usize) -> Vec<(u32, SlabHandle)> {
        let mut batch = Vec::with_capacity(n);
        while batch.len() < n {
            let Some((i, g)) = self.oldest.pop_front() else {
                break;
            };
            let o = self.objects[i as usize];
            if let (true, Place::Memory(sh)) = (o.generation == g, o.place) {
                batch.push((i, sh));
            }
        }
        batch
    }

    /// Writes `batch` to the swap file, one object per slot and write (a
    /// batched write would need a staging buffer of its own, memory the
    /// spill is meant to release), until one fails. Objects not written go
    /// back to the front of the spill order. Returns the payload bytes
    /// moved and whether all were.
    fn swap_out(&mut self, batch: &[(u32, SlabHandle)]) -> (u64, bool) {
        let Inner {
            slabs,
            swap,
            counts,
            ..
        } = self;
        let file = swap.as_mut().expect("swap_out with the file open");
        let mut slots = Vec::with_capacity(batch.len());
        for &(_, sh) in batch {
            let item = slabs.get(sh).expect("objects in the order are in memory");
            match file.swap_out(item) {
                Ok(s) => slots.push(s),
                Err(_) => {
                    counts.swap_write_errors += 1;
                    break;
                }
            }
        }
        let mut moved = 0;
        for (&(i, sh), &slot) in batch.iter().zip(&slots) {
            moved += self.slabs.len_of(sh).unwrap_or(0) as u64;
            let _ = self.slabs.remove(sh);
            self.objects[i as usize].place = Place::Swap(slot);
            self.in_memory -= 1;
            self.swapped += 1;
        }
        self.counts.spilled += slots.len() as u64;
        for &(i, _) in batch[slots.len()..].iter().rev() {
            self.oldest
                .push_front((i, self.objects[i as usize].generation));
        }
        (moved, slots.len() == batch.len())
    }
}

impl PageStore for TierStore {
    fn put(&self, page: &[u8; PAGE]) -> Result<Handle, StoreError> {
        let mut codec = self.put_codec.lock().unwrap_or_else(|e| e.into_inner());
        let obj = codec.compress(page).ok_or(StoreError::Incompressible)?;
        let method = Compressor::method_of(obj);
        let r = self.insert(obj);
        self.put_codec_bytes
            .store(codec.memory_bytes() as u64, Ordering::Relaxed);
        if let (true, Some(mut s)) = (r.is_ok(), self.lock()) {
            match method {
                Some(Method::Same) => s.counts.same += 1,
                Some(Method::Lz4) => s.counts.lz4 += 1,
                Some(Method::Zstd) => s.counts.zstd += 1,
                None => {}
            }
        }
        r
    }

    fn get(&self, h: Handle, out: &mut [u8; PAGE]) -> Result<(), StoreError> {
        self.lock().ok_or(StoreError::Lost)?.read(h, out)
    }

    fn remove(&self, h: Handle) {
        if let Some(mut s) = self.lock() {
            s.remove(h)
        }
    }

    fn bytes(&self) -> StoreBytes {
        let Some(s) = self.lock() else {
            return StoreBytes::default();
        };
        let payload = s.slabs.stats().payload_bytes;
        let swap = s.swap.as_ref().map(|f| f.stats()).unwrap_or_default();
        StoreBytes {
            pages: s.in_memory + s.swapped,
            payload,
            overhead: self.memory_bytes(&s) - payload,
            swapped: s.swapped,
            swap_file_bytes: swap.slots_allocated * PAGE as u64,
        }
    }

    /// Moves the oldest objects to the swap file until at least `bytes` of
    /// memory are released or nothing more can move: each round writes what
    /// should cover the rest, then compacts the slabs and gives emptied and
    /// cached ones back.
    fn spill(&self, bytes: u64) -> u64 {
        let Some(before) = self.lock().map(|s| self.memory_bytes(&s)) else {
            return 0;
        };
        let mut released = 0;
        while released < bytes {
            if self.swap_out_oldest(bytes - released) == 0 {
                break;
            }
            let Some(mut s) = self.lock() else { break };
            s.slabs.compact();
            s.slabs.trim();
            released = before.saturating_sub(self.memory_bytes(&s));
        }
        released
    }

    fn after_fork_in_child(&self) {
        // Another thread of the parent (a policy spilling outside the engine
        // lock) may have held the lock at the fork: it never unlocks here, and
        // what it was changing may be half done. The store is then given up:
        // puts refuse (pages stay in memory), spills move nothing. Nothing the
        // child needs is lost: fork restored every evicted page first.
        let mut s = match self.inner.try_lock() {
            Ok(s) => s,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                self.orphaned.store(true, Ordering::Relaxed);
                return;
            }
        };
        // The parent's file: neither read, written, freed nor deleted here.
        if let Some(f) = s.swap.take() {
            f.abandon();
        }
        for o in s
            .objects
            .iter_mut()
            .filter(|o| matches!(o.place, Place::Swap(_)))
        {
            o.place = Place::Gone;
        }
        if s.swap_state == SwapState::Open {
            s.swap_state = SwapState::NotYet;
        }
    }
}
