//! Similarity detection: which stored page might a new page be patched
//! against? Difference Engine's HashSimilarityDetector(k, s): hash k*s
//! 64-byte blocks at fixed pseudo-random offsets of the page, group them
//! into k indices of s hashes each, and keep c candidate pages per bucket.
//! DE chose (2, 1) with c = 1: two blocks, each its own index, one page per
//! bucket, so a page is compared with at most two candidates, and a page
//! that shares either block with an indexed page finds it.
//!
//! [`SimilarityParams`] holds (k, s, block, seed) and computes the block
//! offsets and a page's k keys; the analyzer (`pagefold analyze`) uses the
//! same functions for its offline walk, so its numbers and the engine's
//! decisions come from identical keys. [`Detector`] is the online index the
//! engine keeps: insert a page as a candidate reference under an id, remove
//! it (the page changed or was freed), look up the candidates of a page,
//! clear it (DE clears the table each full clock cycle). A bucket keeps its
//! c most recent pages; a page pushed out of all its buckets is forgotten.
//! The detector is plain data (Send + Sync); the engine serialises access
//! (one scanner thread, or a mutex). Its own memory is reported by
//! [`Detector::metadata_bytes`] so it can be counted in the footprint.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::PAGE;

/// HashSimilarityDetector(k, s) with c candidates per bucket. Defaults are
/// Difference Engine's: (2, 1), c = 1, 64-byte blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimilarityParams {
    pub k: usize,
    pub s: usize,
    pub candidates: usize,
    pub block: usize,
    /// Seed of the block offsets (fixed so runs are comparable).
    pub seed: u64,
}

/// The most indices * blocks a detector may use.
pub const MAX_BLOCKS: usize = 64;

/// The default seed: "pagefold".
pub const DEFAULT_SEED: u64 = 0x7061_6765_666f_6c64;

impl Default for SimilarityParams {
    fn default() -> Self {
        SimilarityParams {
            k: 2,
            s: 1,
            candidates: 1,
            block: 64,
            seed: DEFAULT_SEED,
        }
    }
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The k*s block offsets of HashSimilarityDetector(k, s) with `block`-byte
/// blocks in a page of `page` bytes: index i uses offsets[i*s .. i*s+s].
/// Blocks do not overlap while k*s*block fits in the page.
pub fn block_offsets(k: usize, s: usize, block: usize, seed: u64, page: usize) -> Vec<usize> {
    let n = k * s;
    let slots = (page - block + 1) as u64;
    let mut state = seed;
    let mut out: Vec<usize> = Vec::with_capacity(n);
    let may_separate = n * block <= page;
    let clash = |o: usize, out: &Vec<usize>| out.iter().any(|&p| o < p + block && p < o + block);
    while out.len() < n {
        let mut o = (splitmix(&mut state) % slots) as usize;
        let mut tries = 0;
        while may_separate && clash(o, &out) && tries < 1000 {
            o = (splitmix(&mut state) % slots) as usize;
            tries += 1;
        }
        out.push(o);
    }
    out
}

/// The k keys of `page`: key i is the chained xxh3 of the s blocks of
/// index i. `keys.len()` is k; `offsets` come from [`block_offsets`].
#[inline]
pub fn page_keys(page: &[u8], offsets: &[usize], s: usize, block: usize, keys: &mut [u64]) {
    for (i, key_out) in keys.iter_mut().enumerate() {
        let mut key = 0u64;
        for b in 0..s {
            let o = offsets[i * s + b];
            key = xxh3_64_with_seed(&page[o..o + block], key ^ (b as u64 + 1));
        }
        *key_out = key;
    }
}

impl SimilarityParams {
    /// The block offsets for 4 KiB pages.
    pub fn offsets(&self) -> Vec<usize> {
        block_offsets(self.k, self.s, self.block, self.seed, PAGE)
    }

    pub fn label(&self) -> String {
        format!("HashSimilarityDetector({},{})", self.k, self.s)
    }

    pub fn check(&self) -> Result<(), String> {
        if self.k == 0 || self.s == 0 || self.candidates == 0 {
            return Err("similarity parameters k, s and c must be at least 1".into());
        }
        if self.k * self.s > MAX_BLOCKS {
            return Err(format!(
                "similarity detector: k*s must be at most {MAX_BLOCKS}"
            ));
        }
        if self.block == 0 || self.block > PAGE {
            return Err(format!("similarity block size must be 1..{PAGE}"));
        }
        if self.candidates > u16::MAX as usize {
            return Err("similarity detector: at most 65535 candidates per bucket".into());
        }
        Ok(())
    }
}

/// Keys are already hashes.
#[derive(Default)]
struct Identity(u64);
impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
}
type Map<V> = HashMap<u64, V, BuildHasherDefault<Identity>>;

const EMPTY: u64 = u64::MAX;

/// One indexed page: where its keys are, and in how many buckets it is.
#[derive(Clone, Copy)]
struct Member {
    key_slot: u32,
    buckets: u32,
}

/// The online HashSimilarityDetector: see the module documentation. Page
/// ids are the caller's (any u64 but `u64::MAX`).
pub struct Detector {
    params: SimilarityParams,
    offsets: Vec<usize>,
    /// Per index: key -> first slot of its bucket in `slab`.
    maps: Vec<Map<u32>>,
    /// Buckets of c ids each, most recent first, EMPTY-padded.
    slab: Vec<u64>,
    free_buckets: Vec<u32>,
    members: Map<Member>,
    /// k keys per member.
    keys: Vec<u64>,
    free_keys: Vec<u32>,
}

impl Detector {
    /// A detector with `params`; invalid parameters are an error.
    pub fn new(params: SimilarityParams) -> Result<Detector, String> {
        params.check()?;
        Ok(Detector {
            offsets: params.offsets(),
            maps: (0..params.k).map(|_| Map::default()).collect(),
            params,
            slab: Vec::new(),
            free_buckets: Vec::new(),
            members: Map::default(),
            keys: Vec::new(),
            free_keys: Vec::new(),
        })
    }

    pub fn params(&self) -> &SimilarityParams {
        &self.params
    }

    /// Computes the k keys of `page` (4 KiB) into `keys` (length k).
    pub fn keys_into(&self, page: &[u8], keys: &mut [u64]) {
        page_keys(page, &self.offsets, self.params.s, self.params.block, keys)
    }

    fn with_keys<R>(&self, page: &[u8], f: impl FnOnce(&[u64]) -> R) -> R {
        let mut buf = [0u64; MAX_BLOCKS];
        let keys = &mut buf[..self.params.k];
        self.keys_into(page, keys);
        f(keys)
    }

    /// Indexes `page` as a candidate reference under `id` (replacing an
    /// earlier insert of the same id).
    pub fn insert(&mut self, id: u64, page: &[u8]) {
        let mut buf = [0u64; MAX_BLOCKS];
        let k = self.params.k;
        self.keys_into(page, &mut buf[..k]);
        self.insert_keys(id, &buf[..k]);
    }

    /// As [`Detector::insert`], with keys computed by [`Detector::keys_into`].
    pub fn insert_keys(&mut self, id: u64, keys: &[u64]) {
        assert!(id != EMPTY, "page id u64::MAX is reserved");
        let k = self.params.k;
        let c = self.params.candidates;
        self.remove(id);
        let key_slot = match self.free_keys.pop() {
            Some(s) => s,
            None => {
                let s = (self.keys.len() / k) as u32;
                self.keys.extend(std::iter::repeat_n(0, k));
                s
            }
        };
        self.keys[key_slot as usize * k..key_slot as usize * k + k].copy_from_slice(&keys[..k]);
        self.members.insert(
            id,
            Member {
                key_slot,
                buckets: k as u32,
            },
        );
        for (i, &key) in keys.iter().enumerate().take(k) {
            let slot = match self.maps[i].get(&key) {
                Some(&s) => s,
                None => {
                    let s = match self.free_buckets.pop() {
                        Some(s) => s,
                        None => {
                            let s = (self.slab.len() / c) as u32;
                            self.slab.extend(std::iter::repeat_n(EMPTY, c));
                            s
                        }
                    };
                    self.slab[s as usize * c..s as usize * c + c].fill(EMPTY);
                    self.maps[i].insert(key, s);
                    s
                }
            } as usize
                * c;
            let bucket = &mut self.slab[slot..slot + c];
            let evicted = bucket[c - 1];
            bucket.copy_within(0..c - 1, 1);
            bucket[0] = id;
            if evicted != EMPTY {
                self.drop_bucket_ref(evicted);
            }
        }
    }

    /// `id` left one of its buckets; forget it when it is in none.
    fn drop_bucket_ref(&mut self, id: u64) {
        if let Some(m) = self.members.get_mut(&id) {
            m.buckets -= 1;
            if m.buckets == 0 {
                let slot = m.key_slot;
                self.members.remove(&id);
                self.free_keys.push(slot);
            }
        }
    }

    /// Removes `id` from every bucket; returns whether it was indexed.
    pub fn remove(&mut self, id: u64) -> bool {
        let Some(m) = self.members.remove(&id) else {
            return false;
        };
        let k = self.params.k;
        let c = self.params.candidates;
        for i in 0..k {
            let key = self.keys[m.key_slot as usize * k + i];
            let Some(&slot) = self.maps[i].get(&key) else {
                continue;
            };
            let b = slot as usize * c;
            let bucket = &mut self.slab[b..b + c];
            if let Some(pos) = bucket.iter().position(|&x| x == id) {
                bucket.copy_within(pos + 1..c, pos);
                bucket[c - 1] = EMPTY;
            }
            if bucket[0] == EMPTY {
                self.maps[i].remove(&key);
                self.free_buckets.push(slot);
            }
        }
        self.free_keys.push(m.key_slot);
        true
    }

    /// The candidate references of `page` (at most k*c distinct ids, index
    /// order, most recent first within a bucket) into `out`.
    pub fn candidates(&self, page: &[u8], out: &mut Vec<u64>) {
        self.with_keys(page, |keys| self.candidates_keys(keys, out))
    }

    /// As [`Detector::candidates`], with precomputed keys.
    pub fn candidates_keys(&self, keys: &[u64], out: &mut Vec<u64>) {
        out.clear();
        let c = self.params.candidates;
        for (m, key) in self.maps.iter().zip(keys) {
            if let Some(&slot) = m.get(key) {
                for &p in &self.slab[slot as usize * c..slot as usize * c + c] {
                    if p != EMPTY && !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
    }

    /// Whether `id` is indexed (in at least one bucket).
    pub fn contains(&self, id: u64) -> bool {
        self.members.contains_key(&id)
    }

    /// Indexed pages.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Forgets every page (DE: once per full clock cycle). Keeps the
    /// memory for reuse.
    pub fn clear(&mut self) {
        self.maps.iter_mut().for_each(|m| m.clear());
        self.slab.clear();
        self.free_buckets.clear();
        self.members.clear();
        self.keys.clear();
        self.free_keys.clear();
    }

    /// Bytes of the detector's own memory (capacities of its tables; hash
    /// maps count one control byte per slot, as hashbrown has).
    pub fn metadata_bytes(&self) -> usize {
        let map = |cap: usize, entry: usize| cap * (entry + 1);
        self.maps
            .iter()
            .map(|m| map(m.capacity(), 12))
            .sum::<usize>()
            + map(self.members.capacity(), 16)
            + self.slab.capacity() * 8
            + self.keys.capacity() * 8
            + self.free_buckets.capacity() * 4
            + self.free_keys.capacity() * 4
            + self.offsets.capacity() * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(seed: u64) -> Vec<u8> {
        crate::kinds::page(crate::kinds::Kind::Random, seed)
    }

    #[test]
    fn offsets_are_the_analyzers() {
        // Printed in docs/ANALYSIS.md for the default parameters.
        assert_eq!(SimilarityParams::default().offsets(), vec![1994, 2399]);
    }

    #[test]
    fn one_matching_block_finds_the_reference() {
        let mut d = Detector::new(SimilarityParams::default()).unwrap();
        let offs = d.params().offsets();
        let r = page(1);
        d.insert(10, &r);
        let mut one = r.clone();
        one[offs[0] + 3] ^= 0xff;
        let mut both = one.clone();
        both[offs[1] + 60] ^= 0xff;
        let mut c = Vec::new();
        d.candidates(&one, &mut c);
        assert_eq!(c, vec![10]);
        d.candidates(&both, &mut c);
        assert!(c.is_empty());
        assert!(d.remove(10));
        d.candidates(&r, &mut c);
        assert!(c.is_empty());
        assert!(d.is_empty());
        assert!(!d.remove(10));
    }

    #[test]
    fn buckets_keep_c_most_recent_and_forget_pushed_out_pages() {
        let p = SimilarityParams {
            candidates: 2,
            ..SimilarityParams::default()
        };
        let mut d = Detector::new(p).unwrap();
        let r = page(2);
        for id in 0..3 {
            d.insert(id, &r);
        }
        let mut c = Vec::new();
        d.candidates(&r, &mut c);
        assert_eq!(c, vec![2, 1]);
        assert!(!d.contains(0), "pushed out of both buckets");
        assert_eq!(d.len(), 2);
        d.remove(2);
        d.candidates(&r, &mut c);
        assert_eq!(c, vec![1]);
        // Re-inserting an id replaces it.
        d.insert(1, &page(5));
        d.candidates(&r, &mut c);
        assert!(c.is_empty());
        assert_eq!(d.len(), 1);
        d.clear();
        assert!(d.is_empty());
    }
}
