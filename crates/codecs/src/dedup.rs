//! Deduplication of a buffer under three chunking schemes.
//!
//! Deduplication keeps one copy of each distinct chunk and replaces every
//! chunk by a reference to its copy. How the buffer is cut into chunks decides
//! what can be found; Deng et al. compared three schemes on memory and found
//! fixed-size 4 KiB pages best (memory duplicates are whole pages at page
//! offsets), content-defined chunking nearly useless, and sliding block in
//! between:
//!
//! - [`Chunking::Fixed`] (FSP): chunks of `n` bytes at offsets `0, n, 2n, ..`
//!   (the last one may be shorter). This is what page sharing (KSM, pagefold's
//!   engine) does with `n` = 4096.
//! - [`Chunking::Cdc`]: content-defined chunking with FastCDC (the `fastcdc`
//!   crate, 2020 variant, normalization level 1): a gear rolling hash cuts a
//!   chunk where the hash matches a mask, so boundaries move with the content
//!   and an insertion only disturbs the chunks around it. Sizes are clamped to
//!   what `fastcdc` accepts (min 64 B..1 MiB, avg 256 B..4 MiB,
//!   max 1 KiB..16 MiB) and ordered min <= avg <= max.
//! - [`Chunking::SlidingBlock`] (SB), our exact definition: with block size
//!   `b`, the scheme lays down *stored blocks* of `b` bytes, one every `b`
//!   bytes of data that matched nothing, counted from the end of the last
//!   match (so, in data without matches, at `b`-aligned offsets, exactly as
//!   FSP). At every byte offset a Buzhash rolling hash of the `b`-byte window
//!   is looked up among the stored blocks' rolling hashes; on a hit the
//!   window's 128-bit hash is compared with the stored blocks' 128-bit hashes.
//!   On a match, the unmatched bytes before the window (fewer than `b`)
//!   become a *fragment* chunk, the window becomes a duplicate chunk, and the
//!   scan jumps past it. Otherwise the window slides by one byte, and once `b`
//!   unmatched bytes have accumulated they become a new stored block (which
//!   later windows can match). At the end, the leftover bytes become one
//!   stored block (if `b` long) and a fragment. Fragments are deduplicated
//!   among all chunks by their 128-bit hash, but only full `b`-byte stored
//!   blocks are candidates for the sliding match.
//!
//! Chunks are identified by their 128-bit xxh3 hash alone: two chunks with the
//! same hash are taken to be equal without comparing bytes (a collision is
//! astronomically unlikely; the rebuilt buffer is compared with the input,
//! which would catch one). Each distinct chunk is copied into a store, each
//! chunk appends a reference to the restore recipe, and the restore pass
//! rebuilds the buffer from recipe and store. `stored_bytes` counts the
//! distinct chunks' bytes plus [`CHUNK_REF_BYTES`] per chunk (the recipe
//! entry: where the chunk is in the store). The index of hashes is not
//! counted: it is needed only while deduplicating, not to restore.
//! `dedup_ns` times chunking, hashing, indexing and copying distinct chunks
//! into the store; `restore_ns` times rebuilding the buffer. Both need memory
//! about the size of the input.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Instant;

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_128;

/// Metadata bytes counted per chunk (a reference into the chunk store: 64 bits
/// packing offset and length).
pub const CHUNK_REF_BYTES: u64 = 8;

/// How a buffer is cut into chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunking {
    /// Fixed-size chunks of this many bytes at multiples of the size (FSP).
    Fixed(usize),
    /// Content-defined chunks (FastCDC) with these average, minimum and
    /// maximum sizes.
    Cdc { avg: usize, min: usize, max: usize },
    /// Sliding block (SB) with blocks of this many bytes; see the module docs.
    SlidingBlock(usize),
}

impl Chunking {
    /// Content-defined chunking around `avg` bytes, with min `avg / 4` and
    /// max `avg * 4`.
    pub fn cdc(avg: usize) -> Self {
        Chunking::Cdc {
            avg,
            min: avg / 4,
            max: avg * 4,
        }
    }

    /// Short name: "fsp-4k", "cdc-8k" (by average size), "sb-4k"; sizes that
    /// are not whole KiB are written in bytes ("fsp-100").
    pub fn name(&self) -> String {
        match *self {
            Chunking::Fixed(n) => format!("fsp-{}", size_name(n)),
            Chunking::Cdc { avg, .. } => format!("cdc-{}", size_name(avg)),
            Chunking::SlidingBlock(n) => format!("sb-{}", size_name(n)),
        }
    }
}

fn size_name(n: usize) -> String {
    if n > 0 && n.is_multiple_of(1024) {
        format!("{}k", n / 1024)
    } else {
        n.to_string()
    }
}

/// Result of deduplicating a buffer with one chunking scheme.
#[derive(Clone, Debug, Serialize)]
pub struct DedupMeasurement {
    /// [`Chunking::name`] of the scheme.
    pub scheme: String,
    /// Bytes deduplicated.
    pub input_bytes: u64,
    /// Chunks the buffer was cut into.
    pub chunks: u64,
    /// Distinct chunks (by 128-bit hash).
    pub unique_chunks: u64,
    /// Distinct chunks' bytes plus [`CHUNK_REF_BYTES`] per chunk.
    pub stored_bytes: u64,
    /// Wall time to chunk, hash, index and store.
    pub dedup_ns: u64,
    /// Wall time to rebuild the buffer from the store.
    pub restore_ns: u64,
}

impl DedupMeasurement {
    /// Stored bytes over input bytes (smaller is better; 1.0 for no input).
    pub fn ratio(&self) -> f64 {
        if self.input_bytes == 0 {
            1.0
        } else {
            self.stored_bytes as f64 / self.input_bytes as f64
        }
    }

    /// Bytes of distinct chunks, without the per-chunk metadata.
    pub fn unique_bytes(&self) -> u64 {
        self.stored_bytes - self.chunks * CHUNK_REF_BYTES
    }

    /// Deduplication time per 4 KiB of input, in ns.
    pub fn dedup_ns_per_page(&self) -> f64 {
        crate::measure::per_page(self.dedup_ns, self.input_bytes)
    }

    /// Restore time per 4 KiB of input, in ns.
    pub fn restore_ns_per_page(&self) -> f64 {
        crate::measure::per_page(self.restore_ns, self.input_bytes)
    }
}

/// Hasher for keys that are already uniform hashes: keeps their low 64 bits.
#[derive(Default)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
    fn write_u128(&mut self, v: u128) {
        self.0 ^= v as u64;
    }
}

type PreHashedBuild = BuildHasherDefault<PreHashed>;

/// Distinct chunks, and the recipe to rebuild the buffer from them.
struct Store {
    index: HashMap<u128, (usize, usize), PreHashedBuild>,
    bytes: Vec<u8>,
    recipe: Vec<(usize, usize)>,
}

impl Store {
    fn new(input_len: usize) -> Self {
        Store {
            index: HashMap::default(),
            bytes: Vec::with_capacity(input_len),
            recipe: Vec::new(),
        }
    }

    /// Add a chunk whose 128-bit hash is `h`; returns whether it was new.
    fn add_hashed(&mut self, h: u128, chunk: &[u8]) -> bool {
        let mut new = false;
        let bytes = &mut self.bytes;
        let &mut entry = self.index.entry(h).or_insert_with(|| {
            new = true;
            let at = bytes.len();
            bytes.extend_from_slice(chunk);
            (at, chunk.len())
        });
        self.recipe.push(entry);
        new
    }

    fn add(&mut self, chunk: &[u8]) -> bool {
        self.add_hashed(xxh3_128(chunk), chunk)
    }

    fn restore(&self, input_len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(input_len);
        for &(at, len) in &self.recipe {
            out.extend_from_slice(&self.bytes[at..at + len]);
        }
        out
    }
}

/// Deduplicate `data` with `scheme`: cut it into chunks, keep one copy of each
/// distinct chunk (identified by its 128-bit xxh3 hash), rebuild the buffer
/// from the copies, and report counts, sizes and times. See the module docs
/// for the exact definition of each scheme and of `stored_bytes`.
///
/// # Panics
/// If a chunk size is 0, or if the rebuilt buffer differs from `data` (a bug,
/// or a 128-bit hash collision).
pub fn dedup(data: &[u8], scheme: &Chunking) -> DedupMeasurement {
    let mut store = Store::new(data.len());
    let t = Instant::now();
    match *scheme {
        Chunking::Fixed(n) => {
            assert!(n > 0, "chunk size must be positive");
            for c in data.chunks(n) {
                store.add(c);
            }
        }
        Chunking::Cdc { avg, min, max } => {
            use fastcdc::v2020 as f;
            let avg =
                (avg as u64).clamp(u64::from(f::AVERAGE_MIN), u64::from(f::AVERAGE_MAX)) as u32;
            let min =
                (min as u64).clamp(u64::from(f::MINIMUM_MIN), u64::from(f::MINIMUM_MAX)) as u32;
            let max =
                (max as u64).clamp(u64::from(f::MAXIMUM_MIN), u64::from(f::MAXIMUM_MAX)) as u32;
            let (min, max) = (min.min(avg), max.max(avg));
            for c in f::FastCDC::new(data, min, avg, max) {
                store.add(&data[c.offset..c.offset + c.length]);
            }
        }
        Chunking::SlidingBlock(b) => {
            assert!(b > 0, "block size must be positive");
            sliding_block(data, b, &mut store);
        }
    }
    let dedup_ns = t.elapsed().as_nanos() as u64;

    let t = Instant::now();
    let restored = store.restore(data.len());
    let restore_ns = t.elapsed().as_nanos() as u64;
    assert!(
        restored == data,
        "dedup restore differs from the input ({})",
        scheme.name()
    );

    let chunks = store.recipe.len() as u64;
    DedupMeasurement {
        scheme: scheme.name(),
        input_bytes: data.len() as u64,
        chunks,
        unique_chunks: store.index.len() as u64,
        stored_bytes: store.bytes.len() as u64 + chunks * CHUNK_REF_BYTES,
        dedup_ns,
        restore_ns,
    }
}

/// Buzhash (cyclic polynomial) rolling hash over a window of `b` bytes.
struct Buzhash {
    table: [u64; 256],
    /// Rotation of the byte leaving the window.
    out_rot: u32,
}

impl Buzhash {
    fn new(b: usize) -> Self {
        // Fixed pseudo-random table (splitmix64), so results are reproducible.
        let mut s = 0x005E_ED0F_B10C_u64;
        let mut table = [0u64; 256];
        for t in table.iter_mut() {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            *t = z ^ (z >> 31);
        }
        Buzhash {
            table,
            out_rot: (b % 64) as u32,
        }
    }

    fn hash(&self, window: &[u8]) -> u64 {
        window
            .iter()
            .fold(0u64, |h, &x| h.rotate_left(1) ^ self.table[usize::from(x)])
    }

    #[inline]
    fn roll(&self, h: u64, out: u8, inb: u8) -> u64 {
        h.rotate_left(1)
            ^ self.table[usize::from(out)].rotate_left(self.out_rot)
            ^ self.table[usize::from(inb)]
    }
}

/// The stored blocks the sliding window is matched against.
struct StoredBlocks {
    bz: Buzhash,
    /// Rolling hashes of the stored blocks (a fast first filter).
    weak: HashSet<u64, PreHashedBuild>,
    /// 128-bit hashes of the stored blocks.
    strong: HashSet<u128, PreHashedBuild>,
}

impl StoredBlocks {
    /// Lay down a stored block (deduplicated like any chunk).
    fn store(&mut self, store: &mut Store, block: &[u8]) {
        let h = xxh3_128(block);
        store.add_hashed(h, block);
        if self.strong.insert(h) {
            self.weak.insert(self.bz.hash(block));
        }
    }
}

fn sliding_block(data: &[u8], b: usize, store: &mut Store) {
    let mut sb = StoredBlocks {
        bz: Buzhash::new(b),
        weak: HashSet::default(),
        strong: HashSet::default(),
    };
    let n = data.len();
    let mut lit = 0; // start of the bytes not yet in any chunk
    let mut pos = 0; // start of the current window
    let mut h = if b <= n { sb.bz.hash(&data[..b]) } else { 0 };
    while pos + b <= n {
        if pos - lit == b {
            sb.store(store, &data[lit..pos]);
            lit = pos;
        }
        let window = &data[pos..pos + b];
        if sb.weak.contains(&h) {
            let sh = xxh3_128(window);
            if sb.strong.contains(&sh) {
                if lit < pos {
                    store.add(&data[lit..pos]);
                }
                store.add_hashed(sh, window);
                pos += b;
                lit = pos;
                if pos + b <= n {
                    h = sb.bz.hash(&data[pos..pos + b]);
                }
                continue;
            }
        }
        if pos + b < n {
            h = sb.bz.roll(h, data[pos], data[pos + b]);
        }
        pos += 1;
    }
    // Leftover: fewer than 2b bytes.
    if n - lit >= b {
        sb.store(store, &data[lit..lit + b]);
        lit += b;
    }
    if lit < n {
        store.add(&data[lit..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(Chunking::Fixed(4096).name(), "fsp-4k");
        assert_eq!(Chunking::Fixed(32768).name(), "fsp-32k");
        assert_eq!(Chunking::cdc(8192).name(), "cdc-8k");
        assert_eq!(Chunking::SlidingBlock(4096).name(), "sb-4k");
        assert_eq!(Chunking::Fixed(100).name(), "fsp-100");
    }

    #[test]
    fn buzhash_rolls() {
        let data: Vec<u8> = (0..300u32).map(|i| (i * 37 % 251) as u8).collect();
        for b in [1usize, 7, 64, 65, 100] {
            let bz = Buzhash::new(b);
            let mut h = bz.hash(&data[..b]);
            for p in 1..data.len() - b {
                h = bz.roll(h, data[p - 1], data[p + b - 1]);
                assert_eq!(h, bz.hash(&data[p..p + b]), "b={b} p={p}");
            }
        }
    }

    #[test]
    fn empty_and_tiny() {
        for s in [
            Chunking::Fixed(4096),
            Chunking::cdc(4096),
            Chunking::SlidingBlock(4096),
        ] {
            let d = dedup(&[], &s);
            assert_eq!((d.chunks, d.unique_chunks, d.stored_bytes), (0, 0, 0));
            let d = dedup(b"abc", &s);
            assert_eq!((d.chunks, d.unique_chunks), (1, 1));
            assert_eq!(d.stored_bytes, 3 + CHUNK_REF_BYTES);
        }
    }
}
