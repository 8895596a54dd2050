//! The compressed store: where compressed pages and patches live, in the
//! process's own memory, with every byte of it accounted for.
//!
//! Objects (1..=4096 bytes) go into size classes 16 bytes apart (16, 32,
//! ..., 4096), like Linux's zsmalloc: the slot an object gets is at most 15
//! bytes larger than the object. A class's slots are carved from slabs of
//! 1-4 pages, the count chosen per class so that a slab wastes the least at
//! its end (a 1,376-byte class uses 3-page slabs: 8 slots, 16 bytes left).
//! All slabs come from one mapping reserved at start (`MAP_NORESERVE`, so
//! it costs address space, not memory, and one VMA however many slabs there
//! are — the engine's VMA budget is precious). A slab whose last object is
//! removed is kept resident for the next slab of its size while the cache
//! of empty slabs is under [`StoreConfig::cache_bytes`] (256 KiB: a store
//! that churns then pays no `madvise` and page faults per slab), and given
//! back to the kernel (`MADV_DONTNEED`) beyond that or on [`Store::trim`]. Within a slab, free
//! slots form a list threaded through the slots themselves, and slots never
//! used are taken in order, so a new slab needs no initialisation.
//!
//! Handles are indirect (an index into a handle table plus a generation),
//! so [`Store::compact`] can move objects: it empties the least-used slabs
//! of each class into the free slots of the others and releases them. A
//! stale or forged handle is an error, never a read of another object.
//!
//! Accounting is exact and incremental ([`StoreStats`]): payload bytes (the
//! objects), slot bytes (what their classes hold), slab bytes (pages the
//! store holds, i.e. its memory), metadata bytes (the capacity of every
//! table the store allocates: handle table, slab table, lists), and
//! fragmentation = slab bytes - payload bytes, split into internal
//! (slot rounding) and external (free slots in slabs), and the cached
//! empty slabs. The engine counts [`StoreStats::footprint_bytes`] (slabs +
//! cache + metadata) in the process footprint.
//! [`Store::audit`] recomputes all of it from scratch (the tests compare).
//!
//! Mutation takes `&mut self`, reads `&self`: the engine shares a store
//! between its scanner and fault-handler threads behind a lock (reads are
//! a bounds-checked slice of the mapping, decoded in place).

use crate::{Error, PAGE};

/// Class granularity (bytes).
pub const GRAIN: usize = 16;
/// Classes: GRAIN, 2*GRAIN, ..., PAGE.
pub const CLASSES: usize = PAGE / GRAIN;
/// The largest object.
pub const MAX_OBJECT: usize = PAGE;
const MAX_SLAB_PAGES: usize = 4;
const NONE: u32 = u32::MAX;
const NO_SLOT: u16 = u16::MAX;

/// A stored object: index into the handle table and its generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(u64);

impl Handle {
    pub fn to_raw(self) -> u64 {
        self.0
    }
    pub fn from_raw(raw: u64) -> Handle {
        Handle(raw)
    }
    fn index(self) -> usize {
        (self.0 & 0xffff_ffff) as usize
    }
    fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Slab of the object, NONE if the entry is free.
    slab: u32,
    slot: u16,
    len: u16,
    generation: u32,
}

#[derive(Debug, Clone, Copy)]
struct Slab {
    /// First page of the slab within the mapping.
    page: u32,
    /// Position in its class's partial list, NONE if not there.
    partial_pos: u32,
    class: u16,
    used: u16,
    /// Slots below this were handed out at some time.
    fresh: u16,
    /// Head of the free-slot list threaded through the slots.
    free_head: u16,
}

#[derive(Debug, Clone)]
struct Class {
    size: u32,
    pages: u32,
    slots: u32,
    /// Slabs of this class with a free slot.
    partial: Vec<u32>,
}

/// The store's byte counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    pub objects: u64,
    /// Bytes of the objects themselves.
    pub payload_bytes: u64,
    /// Bytes of the slots they occupy (payload rounded up to the class).
    pub slot_bytes: u64,
    /// Bytes of the slabs the store holds (its memory for objects).
    pub slab_bytes: u64,
    pub slabs: u64,
    /// Bytes of empty slabs kept resident for reuse (see
    /// [`StoreConfig::cache_bytes`]; [`Store::trim`] gives them back).
    pub cached_bytes: u64,
    /// Bytes of the store's own tables.
    pub metadata_bytes: u64,
}

impl StoreStats {
    /// slab_bytes - payload_bytes.
    pub fn fragmentation_bytes(&self) -> u64 {
        self.slab_bytes - self.payload_bytes
    }
    /// Slot rounding: slot_bytes - payload_bytes.
    pub fn internal_fragmentation(&self) -> u64 {
        self.slot_bytes - self.payload_bytes
    }
    /// Free slots in held slabs (and slab tails): slab_bytes - slot_bytes.
    pub fn external_fragmentation(&self) -> u64 {
        self.slab_bytes - self.slot_bytes
    }
    /// What the store adds to the process footprint.
    pub fn footprint_bytes(&self) -> u64 {
        self.slab_bytes + self.cached_bytes + self.metadata_bytes
    }
}

/// Store parameters.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Address space reserved for slabs; the store cannot hold more. If the
    /// kernel refuses it, halves are tried down to 16 MiB.
    pub reserve_bytes: usize,
    /// Empty slabs up to this many bytes stay resident for reuse instead
    /// of being given back at once: a store that churns (the scanner
    /// inserts while the fault handler removes) then does not pay a
    /// madvise and page faults per slab. Counted in the footprint.
    pub cache_bytes: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            reserve_bytes: 64 << 30,
            cache_bytes: 256 << 10,
        }
    }
}

/// The compressed store: see the module documentation.
pub struct Store {
    base: *mut u8,
    reserved_pages: u32,
    /// Pages below this were handed to slabs at some time.
    bump: u32,
    /// Released slab page runs, by length (index = pages - 1).
    free_runs: [Vec<u32>; MAX_SLAB_PAGES],
    /// Released slab runs kept resident for reuse (not yet given back),
    /// by length; at most `cache_pages` pages in all.
    cached_runs: [Vec<u32>; MAX_SLAB_PAGES],
    cached_pages: u32,
    cache_pages: u32,
    classes: Vec<Class>,
    slabs: Vec<Slab>,
    free_slabs: Vec<u32>,
    entries: Vec<Entry>,
    free_entries: Vec<u32>,
    stats: StoreStats,
}

// SAFETY: `base` is the store's own anonymous mapping: no other value
// points into it, it is valid from any thread, and the store unmaps it only
// when dropped. The other fields are plain owned data.
unsafe impl Send for Store {}
// SAFETY: every write into the mapping goes through a `&mut self` method;
// `&self` methods (get, stats, audit, ...) only read it, so threads sharing
// a `&Store` only read.
unsafe impl Sync for Store {}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `Store::new` with this size.
        unsafe {
            libc::munmap(
                self.base as *mut libc::c_void,
                self.reserved_pages as usize * PAGE,
            );
        }
    }
}

fn class_of(len: usize) -> usize {
    len.div_ceil(GRAIN).max(1) - 1
}

impl Store {
    pub fn new(cfg: StoreConfig) -> Result<Store, Error> {
        let mut size = cfg
            .reserve_bytes
            .clamp(16 << 20, (u32::MAX as usize) * PAGE)
            / PAGE
            * PAGE;
        let base = loop {
            // SAFETY: a fresh anonymous mapping, no fixed address.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                break p as *mut u8;
            }
            if size <= 16 << 20 {
                return Err(Error::Io(std::io::Error::last_os_error()));
            }
            size /= 2;
        };
        let classes = (0..CLASSES)
            .map(|c| {
                let size = (c + 1) * GRAIN;
                let pages = (1..=MAX_SLAB_PAGES)
                    .min_by_key(|&p| {
                        // Wasted bytes per 1000 of slab, then fewer pages.
                        let waste = (p * PAGE) % size;
                        (waste * 1000 / (p * PAGE), p)
                    })
                    .unwrap();
                Class {
                    size: size as u32,
                    pages: pages as u32,
                    slots: (pages * PAGE / size) as u32,
                    partial: Vec::new(),
                }
            })
            .collect();
        let s = Store {
            base,
            reserved_pages: (size / PAGE) as u32,
            bump: 0,
            free_runs: Default::default(),
            cached_runs: Default::default(),
            cached_pages: 0,
            cache_pages: (cfg.cache_bytes / PAGE) as u32,
            classes,
            slabs: Vec::new(),
            free_slabs: Vec::new(),
            entries: Vec::new(),
            free_entries: Vec::new(),
            stats: StoreStats::default(),
        };
        Ok(s)
    }

    /// Bytes of address space reserved.
    pub fn reserved_bytes(&self) -> usize {
        self.reserved_pages as usize * PAGE
    }

    /// The counts: objects, payload, slots and slabs are kept per
    /// operation; metadata is summed from the tables' capacities here (so
    /// inserts and removes do not pay for it).
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            metadata_bytes: self.metadata_bytes(),
            ..self.stats
        }
    }

    /// Slot size and slab pages of the class holding `len`-byte objects.
    pub fn class_for(&self, len: usize) -> Option<(usize, usize)> {
        (1..=MAX_OBJECT).contains(&len).then(|| {
            let c = &self.classes[class_of(len)];
            (c.size as usize, c.pages as usize)
        })
    }

    fn metadata_bytes(&self) -> u64 {
        use std::mem::size_of;
        let v = |cap: usize, sz: usize| (cap * sz) as u64;
        v(self.entries.capacity(), size_of::<Entry>())
            + v(self.free_entries.capacity(), 4)
            + v(self.slabs.capacity(), size_of::<Slab>())
            + v(self.free_slabs.capacity(), 4)
            + self
                .free_runs
                .iter()
                .map(|r| v(r.capacity(), 4))
                .sum::<u64>()
            + self
                .cached_runs
                .iter()
                .map(|r| v(r.capacity(), 4))
                .sum::<u64>()
            + v(self.classes.capacity(), size_of::<Class>())
            + self
                .classes
                .iter()
                .map(|c| v(c.partial.capacity(), 4))
                .sum::<u64>()
            + size_of::<Store>() as u64
    }

    #[inline]
    fn slot_ptr(&self, slab: &Slab, slot: u16) -> *mut u8 {
        let size = self.classes[slab.class as usize].size as usize;
        // SAFETY: a slab's pages lie inside the mapping (new_slab hands out
        // only pages below reserved_pages) and every slot passed here is
        // below the class's slot count, so page * PAGE + slot * size stays
        // inside the slab, and so inside the mapping.
        unsafe {
            self.base
                .add(slab.page as usize * PAGE + slot as usize * size)
        }
    }

    fn new_slab(&mut self, class: usize) -> Result<u32, Error> {
        let pages = self.classes[class].pages;
        let cached = self.cached_runs[pages as usize - 1].pop();
        if cached.is_some() {
            self.cached_pages -= pages;
            self.stats.cached_bytes -= pages as u64 * PAGE as u64;
        }
        let page = match cached.or_else(|| self.free_runs[pages as usize - 1].pop()) {
            Some(p) => p,
            None => {
                if self.bump + pages > self.reserved_pages {
                    return Err(Error::Full("compressed store reservation exhausted"));
                }
                self.bump += pages;
                self.bump - pages
            }
        };
        let slab = Slab {
            page,
            partial_pos: NONE,
            class: class as u16,
            used: 0,
            fresh: 0,
            free_head: NO_SLOT,
        };
        let id = match self.free_slabs.pop() {
            Some(id) => {
                self.slabs[id as usize] = slab;
                id
            }
            None => {
                self.slabs.push(slab);
                (self.slabs.len() - 1) as u32
            }
        };
        self.stats.slabs += 1;
        self.stats.slab_bytes += pages as u64 * PAGE as u64;
        self.partial_push(id);
        Ok(id)
    }

    fn partial_push(&mut self, id: u32) {
        let class = self.slabs[id as usize].class as usize;
        let list = &mut self.classes[class].partial;
        self.slabs[id as usize].partial_pos = list.len() as u32;
        list.push(id);
    }

    fn partial_remove(&mut self, id: u32) {
        let s = self.slabs[id as usize];
        if s.partial_pos == NONE {
            return;
        }
        let list = &mut self.classes[s.class as usize].partial;
        list.swap_remove(s.partial_pos as usize);
        if let Some(&moved) = list.get(s.partial_pos as usize) {
            self.slabs[moved as usize].partial_pos = s.partial_pos;
        }
        self.slabs[id as usize].partial_pos = NONE;
    }

    fn release_slab(&mut self, id: u32) {
        self.partial_remove(id);
        let s = self.slabs[id as usize];
        let pages = self.classes[s.class as usize].pages;
        if self.cached_pages + pages <= self.cache_pages {
            // Keep it resident: the next slab of this size needs no faults.
            self.cached_runs[pages as usize - 1].push(s.page);
            self.cached_pages += pages;
            self.stats.cached_bytes += pages as u64 * PAGE as u64;
        } else {
            self.give_back(s.page, pages);
        }
        self.free_slabs.push(id);
        self.slabs[id as usize].used = 0;
        self.stats.slabs -= 1;
        self.stats.slab_bytes -= pages as u64 * PAGE as u64;
    }

    fn give_back(&mut self, page: u32, pages: u32) {
        // SAFETY: the run lies inside the mapping and holds no object.
        unsafe {
            libc::madvise(
                self.base.add(page as usize * PAGE) as *mut libc::c_void,
                pages as usize * PAGE,
                libc::MADV_DONTNEED,
            );
        }
        self.free_runs[pages as usize - 1].push(page);
    }

    /// Gives the cached empty slabs back to the kernel (under memory
    /// pressure); returns the bytes released.
    pub fn trim(&mut self) -> u64 {
        let before = self.stats.cached_bytes;
        for i in 0..MAX_SLAB_PAGES {
            while let Some(p) = self.cached_runs[i].pop() {
                self.give_back(p, i as u32 + 1);
            }
        }
        self.cached_pages = 0;
        self.stats.cached_bytes = 0;
        before
    }

    /// Takes a free slot of slab `id` (which has one).
    fn take_slot(&mut self, id: u32) -> u16 {
        let s = self.slabs[id as usize];
        let slots = self.classes[s.class as usize].slots as u16;
        let slot = if s.free_head != NO_SLOT {
            let p = self.slot_ptr(&s, s.free_head);
            // SAFETY: a free slot holds the next free slot's index in its
            // first two bytes (slots are at least 16 bytes).
            let next = unsafe { std::ptr::read_unaligned(p as *const u16) };
            self.slabs[id as usize].free_head = next;
            s.free_head
        } else {
            self.slabs[id as usize].fresh += 1;
            s.fresh
        };
        let s = &mut self.slabs[id as usize];
        s.used += 1;
        if s.used == slots {
            self.partial_remove(id);
        }
        slot
    }

    fn put_slot(&mut self, id: u32, slot: u16) {
        let s = self.slabs[id as usize];
        let p = self.slot_ptr(&s, slot);
        // SAFETY: the slot is inside the slab and no longer holds an object.
        unsafe { std::ptr::write_unaligned(p as *mut u16, s.free_head) };
        let was_full = s.partial_pos == NONE;
        let s = &mut self.slabs[id as usize];
        s.free_head = slot;
        s.used -= 1;
        if s.used == 0 {
            self.release_slab(id);
        } else if was_full {
            self.partial_push(id);
        }
    }

    /// Stores a copy of `data` (1..=4096 bytes) and returns its handle.
    pub fn insert(&mut self, data: &[u8]) -> Result<Handle, Error> {
        if data.is_empty() || data.len() > MAX_OBJECT {
            return Err(Error::TooLarge(data.len()));
        }
        let class = class_of(data.len());
        let id = match self.classes[class].partial.last() {
            Some(&id) => id,
            None => self.new_slab(class)?,
        };
        let slot = self.take_slot(id);
        let p = self.slot_ptr(&self.slabs[id as usize], slot);
        // SAFETY: the slot is inside the slab and at least data.len() long.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
        let entry = Entry {
            slab: id,
            slot,
            len: data.len() as u16,
            generation: 0,
        };
        let index = match self.free_entries.pop() {
            Some(i) => {
                let g = self.entries[i as usize].generation.wrapping_add(1);
                self.entries[i as usize] = Entry {
                    generation: g,
                    ..entry
                };
                i
            }
            None => {
                if self.entries.len() >= u32::MAX as usize {
                    self.put_slot(id, slot);
                    return Err(Error::Full("handle table"));
                }
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        self.stats.objects += 1;
        self.stats.payload_bytes += data.len() as u64;
        self.stats.slot_bytes += self.classes[class].size as u64;
        let g = self.entries[index as usize].generation;
        Ok(Handle((g as u64) << 32 | index as u64))
    }

    fn entry(&self, h: Handle) -> Result<Entry, Error> {
        match self.entries.get(h.index()) {
            Some(e) if e.slab != NONE && e.generation == h.generation() => Ok(*e),
            _ => Err(Error::BadHandle),
        }
    }

    /// The bytes of the object `h`.
    pub fn get(&self, h: Handle) -> Result<&[u8], Error> {
        let e = self.entry(h)?;
        let p = self.slot_ptr(&self.slabs[e.slab as usize], e.slot);
        // SAFETY: the object lies in its slot; the slice borrows `self`, so
        // no `&mut self` method can change or move it meanwhile.
        Ok(unsafe { std::slice::from_raw_parts(p, e.len as usize) })
    }

    /// Length of the object `h`.
    pub fn len_of(&self, h: Handle) -> Result<usize, Error> {
        Ok(self.entry(h)?.len as usize)
    }

    /// Removes the object `h`.
    pub fn remove(&mut self, h: Handle) -> Result<(), Error> {
        let e = self.entry(h)?;
        let class = self.slabs[e.slab as usize].class as usize;
        self.put_slot(e.slab, e.slot);
        self.entries[h.index()].slab = NONE;
        self.free_entries.push(h.index() as u32);
        self.stats.objects -= 1;
        self.stats.payload_bytes -= e.len as u64;
        self.stats.slot_bytes -= self.classes[class].size as u64;
        Ok(())
    }

    /// Objects stored.
    pub fn len(&self) -> usize {
        self.stats.objects as usize
    }

    pub fn is_empty(&self) -> bool {
        self.stats.objects == 0
    }

    /// Moves objects out of the least-used slabs of each class into free
    /// slots of the others and releases the emptied slabs; handles stay
    /// valid. Returns the slab bytes released. Cost: one pass over the
    /// handle table plus a copy per moved object.
    pub fn compact(&mut self) -> u64 {
        let before = self.stats.slab_bytes;
        // Per class: which slabs to empty (least used first) while the
        // others' free slots can take their objects.
        let mut victim = vec![false; self.slabs.len()];
        let mut any = false;
        for c in 0..CLASSES {
            let class = &self.classes[c];
            if class.partial.len() < 2 {
                continue;
            }
            let mut by_use: Vec<u32> = class.partial.clone();
            by_use.sort_by_key(|&id| self.slabs[id as usize].used);
            let mut free_elsewhere: u64 = by_use
                .iter()
                .map(|&id| (class.slots - self.slabs[id as usize].used as u32) as u64)
                .sum();
            for &id in &by_use {
                let s = &self.slabs[id as usize];
                let own_free = (class.slots - s.used as u32) as u64;
                // Emptying `id` removes its free slots from the pool and
                // needs `used` slots elsewhere.
                if free_elsewhere >= own_free + s.used as u64 {
                    free_elsewhere -= own_free + s.used as u64;
                    victim[id as usize] = true;
                    any = true;
                } else {
                    break;
                }
            }
        }
        if !any {
            return 0;
        }
        // Victims leave the partial lists so moved objects go elsewhere.
        for id in 0..self.slabs.len() as u32 {
            if victim[id as usize] {
                self.partial_remove(id);
            }
        }
        for i in 0..self.entries.len() {
            let e = self.entries[i];
            if e.slab == NONE || !victim[e.slab as usize] {
                continue;
            }
            let class = self.slabs[e.slab as usize].class as usize;
            let Some(&dst) = self.classes[class].partial.last() else {
                continue; // cannot happen: capacity was counted
            };
            let slot = self.take_slot(dst);
            let from = self.slot_ptr(&self.slabs[e.slab as usize], e.slot);
            let to = self.slot_ptr(&self.slabs[dst as usize], slot);
            // SAFETY: two distinct slots inside the mapping.
            unsafe { std::ptr::copy_nonoverlapping(from, to, e.len as usize) };
            // Free the old slot; the victim is released when it empties
            // (it is not in a partial list, so it is not refilled).
            self.put_slot_victim(e.slab, e.slot);
            self.entries[i].slab = dst;
            self.entries[i].slot = slot;
        }
        before - self.stats.slab_bytes
    }

    /// `put_slot` for a slab being emptied by `compact`: never re-enters
    /// the partial list.
    fn put_slot_victim(&mut self, id: u32, slot: u16) {
        let s = self.slabs[id as usize];
        let p = self.slot_ptr(&s, slot);
        // SAFETY: as in `put_slot`.
        unsafe { std::ptr::write_unaligned(p as *mut u16, s.free_head) };
        let s = &mut self.slabs[id as usize];
        s.free_head = slot;
        s.used -= 1;
        if s.used == 0 {
            self.release_slab(id);
        }
    }

    /// Recomputes the statistics from the tables (not from the counters)
    /// and checks the store's invariants; the tests compare the result
    /// with [`Store::stats`]. Cost: a pass over every table.
    pub fn audit(&self) -> Result<StoreStats, String> {
        let mut st = StoreStats::default();
        let mut used = vec![0u32; self.slabs.len()];
        for e in &self.entries {
            if e.slab == NONE {
                continue;
            }
            let s = &self.slabs[e.slab as usize];
            let class = &self.classes[s.class as usize];
            if e.len as u32 > class.size
                || e.len == 0
                || (e.slot as u32) >= class.slots
                || e.slot >= s.fresh
            {
                return Err(format!("entry {e:?} does not fit slab {s:?}"));
            }
            used[e.slab as usize] += 1;
            st.objects += 1;
            st.payload_bytes += e.len as u64;
            st.slot_bytes += class.size as u64;
        }
        let free_slab: std::collections::HashSet<u32> = self.free_slabs.iter().copied().collect();
        for (id, s) in self.slabs.iter().enumerate() {
            if free_slab.contains(&(id as u32)) {
                if used[id] != 0 {
                    return Err(format!("released slab {id} holds objects"));
                }
                continue;
            }
            let class = &self.classes[s.class as usize];
            if used[id] != s.used as u32 || s.used == 0 {
                return Err(format!(
                    "slab {id}: used {} but {} objects",
                    s.used, used[id]
                ));
            }
            let in_partial = s.partial_pos != NONE
                && class.partial.get(s.partial_pos as usize) == Some(&(id as u32));
            if in_partial != ((s.used as u32) < class.slots) {
                return Err(format!("slab {id}: partial list membership wrong"));
            }
            st.slabs += 1;
            st.slab_bytes += class.pages as u64 * PAGE as u64;
        }
        st.metadata_bytes = self.metadata_bytes();
        let cached: usize = self
            .cached_runs
            .iter()
            .enumerate()
            .map(|(i, r)| r.len() * (i + 1))
            .sum();
        st.cached_bytes = (cached * PAGE) as u64;
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Store {
        Store::new(StoreConfig {
            reserve_bytes: 64 << 20,
            ..StoreConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn classes_waste_little() {
        let s = small();
        for len in [1, 16, 17, 100, 1376, 2048, 3584, 4096] {
            let (size, pages) = s.class_for(len).unwrap();
            assert!(size >= len && size - len < GRAIN, "{len}");
            let waste = (pages * PAGE) % size;
            assert!(
                waste * 100 <= pages * PAGE * 13,
                "{len}: {waste} of {pages} pages"
            );
        }
        assert!(s.class_for(0).is_none() && s.class_for(4097).is_none());
    }

    #[test]
    fn insert_get_remove_reuse() {
        let mut s = small();
        let a = s.insert(b"hello").unwrap();
        let b = s.insert(&[7u8; 1000]).unwrap();
        assert_eq!(s.get(a).unwrap(), b"hello");
        assert_eq!(s.get(b).unwrap(), &[7u8; 1000][..]);
        let st = s.stats();
        assert_eq!(
            (st.objects, st.payload_bytes, st.slot_bytes),
            (2, 1005, 16 + 1008)
        );
        s.remove(a).unwrap();
        assert!(matches!(s.get(a), Err(Error::BadHandle)));
        assert!(matches!(s.remove(a), Err(Error::BadHandle)));
        // The entry is reused with a new generation: the old handle stays dead.
        let c = s.insert(b"again").unwrap();
        assert_eq!(c.index(), a.index());
        assert!(s.get(a).is_err());
        assert_eq!(s.get(c).unwrap(), b"again");
        s.remove(b).unwrap();
        s.remove(c).unwrap();
        let st = s.stats();
        assert_eq!(
            (st.objects, st.slabs, st.slab_bytes, st.payload_bytes),
            (0, 0, 0, 0)
        );
        // The two empty slabs (1 page each) stay cached until trimmed.
        assert_eq!(st.cached_bytes, 2 * PAGE as u64);
        assert_eq!(s.audit().unwrap(), st);
        assert_eq!(s.trim(), 2 * PAGE as u64);
        assert_eq!(s.stats().footprint_bytes(), s.stats().metadata_bytes);
        assert!(matches!(s.insert(&[]), Err(Error::TooLarge(0))));
        assert!(matches!(s.insert(&[0; 4097]), Err(Error::TooLarge(4097))));
        assert!(s.get(Handle::from_raw(12345)).is_err());
    }

    #[test]
    fn full_reservation_is_an_error() {
        let mut s = small();
        let mut n = 0;
        loop {
            match s.insert(&[1u8; 4096]) {
                Ok(_) => n += 1,
                Err(Error::Full(_)) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(n, (64 << 20) / PAGE);
        assert_eq!(s.audit().unwrap(), s.stats());
    }
}

#[cfg(test)]
mod compact_tests {
    use super::*;
    use crate::kinds::Rng;

    #[test]
    fn compaction_reaches_the_fewest_slabs() {
        let mut s = Store::new(StoreConfig {
            reserve_bytes: 256 << 20,
            ..StoreConfig::default()
        })
        .unwrap();
        let mut rng = Rng::new(5);
        let mut hs = Vec::new();
        for i in 0..20_000u32 {
            let len = 1 + rng.below(3000) as usize;
            let h = s.insert(&vec![i as u8; len]).unwrap();
            hs.push((h, len, i as u8));
        }
        for j in (1..hs.len()).rev() {
            hs.swap(j, rng.below(j as u64 + 1) as usize);
        }
        assert_eq!(s.audit().unwrap(), s.stats());
        for (h, _, _) in hs.drain(..10_000) {
            s.remove(h).unwrap();
        }
        assert_eq!(s.audit().unwrap(), s.stats());
        s.compact();
        assert_eq!(s.audit().unwrap(), s.stats());
        // Per class: slabs held == ceil(objects / slots).
        let mut objs = vec![0u64; CLASSES];
        for (_, len, _) in &hs {
            objs[class_of(*len)] += 1;
        }
        let ideal: u64 = (0..CLASSES)
            .map(|c| {
                objs[c].div_ceil(s.classes[c].slots as u64)
                    * s.classes[c].pages as u64
                    * PAGE as u64
            })
            .sum();
        assert_eq!(s.stats().slab_bytes, ideal);
        for (h, len, b) in &hs {
            assert_eq!(s.get(*h).unwrap(), &vec![*b; *len][..]);
        }
    }
}
