//! The data of patching (patching.rs says how pages become patches): the
//! patch store that the fault thread reads under the eviction table's lock,
//! where an evicted page's content is, and the engine's similarity detector,
//! encoder and pin counts, under the engine lock. The frames a patch pins go
//! to the `unpinned` queue when it is dropped; the engine settles them.

use std::collections::HashMap;
use std::time::Instant;

use pagefold_tier::patch::{Encoder, Patcher};
use pagefold_tier::similar::{Detector, SimilarityParams, MAX_BLOCKS};
use pagefold_tier::store::{Handle as SlabHandle, Store, StoreConfig};

use crate::fds::Fd;
use crate::frames::FrameId;
use crate::store::Handle;
use crate::sys::{self, PAGE};

/// Where an evicted page's content is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Content {
    /// In the page store.
    Stored(Handle),
    /// A patch in the table's patch store.
    Patch(u32),
}

/// One patch: its bytes in the slab store and the frame it applies to.
#[derive(Clone, Copy)]
struct PatchEntry {
    bytes: SlabHandle,
    frame: FrameId,
}

/// The patches, kept with the eviction table (under its lock) because the
/// fault thread reads them.
pub(crate) struct Patches {
    /// Made on the first patch (it reserves address space).
    slab: Option<Store>,
    entries: Vec<Option<PatchEntry>>,
    free: Vec<u32>,
    /// Decodes on the fault thread; made and warmed up on an engine thread.
    decoder: Patcher,
    /// Per pool: our duplicate of its memfd and the patches using it (closed at zero).
    fds: Vec<(Option<Fd>, u32)>,
    /// Frames whose patch is gone; the engine unpins them (`settle_pins`).
    pub(crate) unpinned: Vec<FrameId>,
    /// Forced decode failure (`Inject::fail_patch`).
    pub fail_decode: bool,
    /// Patches read back to restore a page, and the time that took
    /// (reference read, patch read, decode; the fault round trip excluded).
    reads: u64,
    read_ns: u64,
}

impl Default for Patches {
    fn default() -> Self {
        Patches {
            slab: None,
            entries: Vec::new(),
            free: Vec::new(),
            decoder: warm_decoder(),
            fds: Vec::new(),
            unpinned: Vec::new(),
            fail_decode: false,
            reads: 0,
            read_ns: 0,
        }
    }
}

/// A decoder that has decoded once, so that its zstd context has every
/// buffer it needs before the fault thread uses it.
fn warm_decoder() -> Patcher {
    let mut d = Patcher::new();
    let reference: Vec<u8> = (0..PAGE).map(|i| (i * 7 / 3) as u8).collect();
    let mut page = reference.clone();
    page[100..1400].iter_mut().for_each(|b| *b ^= 0x5a);
    let mut zstd = Patcher::with(Encoder::ZstdRef, None, PAGE);
    let mut out = vec![0u8; PAGE];
    if let Some(p) = zstd.make(&page, &reference) {
        let _ = d.apply(p, &reference, &mut out);
    }
    d
}

impl Drop for Patches {
    fn drop(&mut self) {
        // Each held duplicate is this table's own; the table is going, so each closes once.
        self.fds
            .iter_mut()
            .filter_map(|(fd, _)| fd.take())
            .for_each(Fd::close);
    }
}

impl Patches {
    /// Stores `patch` against `frame` (of memfd `fd`); None if the store is
    /// unavailable or full (the page then goes elsewhere).
    pub(crate) fn insert(&mut self, patch: &[u8], frame: FrameId, fd: Fd) -> Option<u32> {
        if self.slab.is_none() {
            self.slab = Store::new(StoreConfig {
                reserve_bytes: 16 << 30,
                ..StoreConfig::default()
            })
            .ok();
        }
        self.hold_fd(frame.pool(), fd)?;
        let Ok(bytes) = self.slab.as_mut()?.insert(patch) else {
            self.release_fd(frame.pool());
            return None;
        };
        let entry = Some(PatchEntry { bytes, frame });
        Some(match self.free.pop() {
            Some(id) => {
                self.entries[id as usize] = entry;
                id
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        })
    }

    /// Rebuilds the page of patch `id` into `out` to restore it; false if
    /// it cannot (the caller poisons the page). Runs on the fault thread: no allocation.
    pub fn read(&mut self, id: u32, out: &mut [u8; PAGE]) -> bool {
        let t0 = Instant::now();
        let ok = !self.fail_decode && self.decode(id, out);
        self.reads += 1;
        self.read_ns += t0.elapsed().as_nanos() as u64;
        ok
    }

    /// As `read`, without injected failures.
    pub(crate) fn decode(&mut self, id: u32, out: &mut [u8; PAGE]) -> bool {
        let Some(Some(e)) = self.entries.get(id as usize).copied() else {
            return false;
        };
        let Some(slab) = &self.slab else { return false };
        let Ok(patch) = slab.get(e.bytes) else {
            return false;
        };
        let mut reference = [0u8; PAGE];
        let Some(&(Some(fd), _)) = self.fds.get(e.frame.pool()) else {
            return false;
        };
        if !sys::pread_frame(fd, e.frame.slot(), &mut reference) {
            return false;
        }
        self.decoder.apply(patch, &reference, out).is_ok()
    }

    /// Drops patch `id`; its frame's pin is released by the engine later.
    pub fn remove(&mut self, id: u32) {
        let Some(e) = self.entries.get_mut(id as usize).and_then(Option::take) else {
            return;
        };
        if let Some(slab) = self.slab.as_mut() {
            let _ = slab.remove(e.bytes);
        }
        self.free.push(id);
        self.release_fd(e.frame.pool());
        self.unpinned.push(e.frame);
    }

    /// One more patch reads pool `pool` (memfd `fd`): our duplicate of it.
    fn hold_fd(&mut self, pool: usize, fd: Fd) -> Option<()> {
        if self.fds.len() <= pool {
            self.fds.resize(pool + 1, (None, 0));
        }
        let slot = &mut self.fds[pool];
        if slot.1 == 0 {
            slot.0 = Some(fd.duplicate().ok()?);
        }
        slot.1 += 1;
        Some(())
    }

    fn release_fd(&mut self, pool: usize) {
        let slot = &mut self.fds[pool];
        slot.1 -= 1;
        if slot.1 == 0 {
            if let Some(fd) = slot.0.take() {
                fd.close();
            }
        }
    }

    /// Patches stored now, their bytes, the patch store's footprint (slabs,
    /// cached slabs, its tables and ours) and restore counts, into `s`.
    pub fn stats(&self, s: &mut crate::stats::Stats) {
        let ours = (self.entries.capacity() * std::mem::size_of::<Option<PatchEntry>>()
            + self.free.capacity() * 4) as u64;
        let (n, payload, footprint) = match &self.slab {
            Some(st) => {
                let st = st.stats();
                (st.objects, st.payload_bytes, st.footprint_bytes() + ours)
            }
            None => (0, 0, ours),
        };
        s.patched_now = n;
        s.patch_bytes = payload;
        s.patch_store_bytes = footprint;
        s.patch_restores = self.reads;
        s.patch_restore_ns = self.read_ns;
    }
}

/// The engine side of patching (under the engine lock): the detector, the
/// encoder, and how many patches pin each frame.
pub(crate) struct Patching {
    pub(crate) detector: Detector,
    pub(crate) encoder: Patcher,
    pub(crate) pins: HashMap<FrameId, u32>,
    /// Where the detector samples its blocks (index i: one block at offsets[i]).
    pub(crate) offsets: Vec<usize>,
    pub(crate) max_candidates: usize,
    /// Time spent looking for references and encoding (all pages tried).
    pub(crate) work_ns: u64,
}

impl Patching {
    pub(crate) fn new(cfg: &crate::config::Config) -> Patching {
        let params = SimilarityParams {
            k: cfg.patch_blocks,
            s: 1,
            candidates: 1,
            block: cfg.patch_block_bytes,
            ..SimilarityParams::default()
        };
        // Bad parameters from the environment fall back to DE's.
        let detector = Detector::new(params).unwrap_or_else(|_| {
            Detector::new(SimilarityParams::default()).expect("DE's parameters are valid")
        });
        let offsets = detector.params().offsets();
        Patching {
            detector,
            encoder: Patcher::new(),
            pins: HashMap::new(),
            offsets,
            max_candidates: cfg.patch_candidates.max(1),
            work_ns: 0,
        }
    }
}

impl Patching {
    /// Indexes `page` (at `addr`) as a candidate reference.
    pub(crate) fn index(&mut self, page: &[u8; PAGE], addr: u64) {
        let mut keys = [0u64; MAX_BLOCKS];
        let kn = self.detector.params().k;
        self.keys(page, addr, &mut keys[..kn]);
        self.insert(addr, &keys[..kn]);
    }

    /// Indexes keys under `addr`, starting afresh when the index is full.
    pub(crate) fn insert(&mut self, addr: u64, keys: &[u64]) {
        if self.detector.len() >= self.max_candidates {
            self.detector.clear();
        }
        self.detector.insert_keys(addr, keys);
    }

    /// The detector's keys of `page` (at `addr`). A sampled block of one
    /// repeated byte (zeros, padding) says nothing about similarity — small
    /// blocks would pair every page holding zeros there — so its key is
    /// made unique to the page: it matches nothing.
    pub(crate) fn keys(&self, page: &[u8; PAGE], addr: u64, keys: &mut [u64]) {
        self.detector.keys_into(page, keys);
        let block = self.detector.params().block;
        for (i, (&o, key)) in self.offsets.iter().zip(keys.iter_mut()).enumerate() {
            let b = &page[o..o + block];
            if b.iter().all(|&x| x == b[0]) {
                *key =
                    xxhash_rust::xxh3::xxh3_64_with_seed(&addr.to_le_bytes(), i as u64) | 1 << 63;
            }
        }
    }
}
