//! Content index: finds an earlier page or frame with the same content.
//!
//! Hashing whole pages made the scan memory-bandwidth bound (xxh3 of every
//! byte was a third of its time). So the first level keys on a *sample*: eight
//! 64-byte lines spread over the page, 1/8 of its bytes. Pages that agree on
//! the sample but differ elsewhere (sparse pages whose samples are all zero,
//! arrays of similar records) would crowd one bucket, so on such a collision
//! both sides move to a second level keyed by the hash of the whole page. A
//! hit at either level is only a candidate: the caller's byte comparison
//! decides, as it always must.

use std::collections::HashMap;

use xxhash_rust::xxh3::xxh3_64;

use crate::sys::PAGE;

/// Start of each sampled 64-byte line: stride 576 (nine lines), so the
/// samples fall on different offsets within 512-byte structures.
const SAMPLES: [usize; 8] = [0, 576, 1152, 1728, 2304, 2880, 3456, 4032];

pub fn sample_hash(page: *const u8) -> u64 {
    let mut buf = [0u8; 512];
    for (i, off) in SAMPLES.iter().enumerate() {
        // SAFETY: callers pass the start of a readable page of PAGE bytes; every offset in
        // SAMPLES is at most PAGE - 64, so the 64-byte line lies in that page.
        let line = unsafe { std::slice::from_raw_parts(page.add(*off), 64) };
        buf[i * 64..(i + 1) * 64].copy_from_slice(line);
    }
    xxh3_64(&buf)
}

pub fn full_hash(page: *const u8) -> u64 {
    // SAFETY: callers pass the start of a mapped, readable page of PAGE bytes (a page of an
    // engine block or a frame of a pool window); it is only read.
    xxh3_64(unsafe { std::slice::from_raw_parts(page, PAGE) })
}

pub fn page_eq(a: *const u8, b: *const u8) -> bool {
    // SAFETY: callers pass two readable pages of PAGE bytes each; both slices are only read.
    unsafe { std::slice::from_raw_parts(a, PAGE) == std::slice::from_raw_parts(b, PAGE) }
}

/// Entries `V` by content. `content(v)` gives an entry's bytes, or None if
/// the entry is gone (freed, no longer eligible); such entries are dropped.
pub struct ContentIndex<V> {
    sampled: HashMap<u64, V>,
    full: HashMap<u64, V>,
}

impl<V> Default for ContentIndex<V> {
    fn default() -> Self {
        ContentIndex {
            sampled: HashMap::new(),
            full: HashMap::new(),
        }
    }
}

impl<V: Copy> ContentIndex<V> {
    /// An entry whose content equals `page` right now.
    pub fn find(&mut self, page: *const u8, content: impl Fn(V) -> Option<*const u8>) -> Option<V> {
        let s = sample_hash(page);
        let v = *self.sampled.get(&s)?;
        let Some(c) = content(v) else {
            self.sampled.remove(&s);
            return self.find_full(page, &content);
        };
        if page_eq(c, page) {
            return Some(v);
        }
        // Same sample, other content: the occupant also lives at the full level.
        self.full.entry(full_hash(c)).or_insert(v);
        self.find_full(page, &content)
    }

    fn find_full(
        &mut self,
        page: *const u8,
        content: &impl Fn(V) -> Option<*const u8>,
    ) -> Option<V> {
        if self.full.is_empty() {
            return None;
        }
        let f = full_hash(page);
        let v = *self.full.get(&f)?;
        match content(v) {
            Some(c) if page_eq(c, page) => Some(v),
            Some(_) => None,
            None => {
                self.full.remove(&f);
                None
            }
        }
    }

    /// Records `v` as holding `page`'s content (after `find` came back empty).
    pub fn insert(&mut self, page: *const u8, v: V, content: impl Fn(V) -> Option<*const u8>) {
        let s = sample_hash(page);
        match self.sampled.get(&s).copied() {
            Some(old) if content(old).is_some() => {
                self.full.insert(full_hash(page), v);
            }
            _ => {
                self.sampled.insert(s, v);
            }
        }
    }

    /// Makes `v` the entry for `page`'s content, in place of the one `find`
    /// returned (which could not serve).
    pub fn replace(&mut self, page: *const u8, v: V, content: impl Fn(V) -> Option<*const u8>) {
        let s = sample_hash(page);
        match self.sampled.get(&s).copied().and_then(&content) {
            Some(c) if page_eq(c, page) => {
                self.sampled.insert(s, v);
            }
            _ => {
                self.full.insert(full_hash(page), v);
            }
        }
    }

    pub fn bytes(&self) -> usize {
        (self.sampled.capacity() + self.full.capacity()) * (8 + std::mem::size_of::<V>() + 1)
    }
}
