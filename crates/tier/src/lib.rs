//! pagefold-tier: the storage layer below pagefold's engine for pages it
//! takes out of plain memory — compressed, patched against a similar page,
//! or written to disk — as Difference Engine (OSDI 2008) does, measured
//! against DE's Table 2 op costs.
//!
//! - [`compress`]: the page codec: LZ4 by default, zstd where it pays,
//!   same-filled pages in 9 bytes, incompressible pages refused.
//! - [`store`]: the compressed store: objects in size-classed slabs carved
//!   from one reserved mapping, handles, reuse of freed slots, compaction,
//!   and exact accounting of payload, metadata and fragmentation.
//! - [`similar`]: HashSimilarityDetector(k, s) with c candidates per bucket
//!   (shared with the analyzer) and the online detector the engine keeps.
//! - [`patch`]: delta encoders (zstd-ref, xor-lz4, xor-zstd, runs), the
//!   engine's [`patch::Patcher`] and the reference protection rule.
//! - [`swap`]: a swap file with a slot bitmap and checksums, errors that
//!   leave the caller's page intact, and HIGH/LOW watermarks.
//! - [`ops`]: per-op cost measurement (DE's Table 2 ops) over page kinds
//!   ([`kinds`]), run by `cargo bench -p pagefold-tier --bench ops`.
//!
//! Nothing here touches the engine's mappings: the engine hands pages in
//! and gets bytes back; which page goes where, and when, is its policy.
//!
//! # What the engine calls
//!
//! ```
//! use pagefold_tier::{compress::Compressor, patch::{Patcher, References},
//!     similar::{Detector, SimilarityParams}, store::{Store, StoreConfig},
//!     swap::{SwapConfig, SwapFile, Watermarks}, kinds::{page, pair, Kind}, PAGE};
//!
//! // One store (behind a lock), one reference table, one detector; a
//! // Compressor and a Patcher per thread.
//! let mut store = Store::new(StoreConfig::default()).unwrap();
//! let refs = References::new();
//! let mut det = Detector::new(SimilarityParams::default()).unwrap();
//! let (mut c, mut pt) = (Compressor::default(), Patcher::new());
//! let mut out = vec![0u8; PAGE];
//!
//! // Compress a cold page; None = incompressible, leave it alone.
//! let cold = page(Kind::Text, 1);
//! let h = store.insert(c.compress(&cold).unwrap()).unwrap();
//! // ... on a touch: rebuild it, drop the object.
//! c.decompress(store.get(h).unwrap(), &mut out).unwrap();
//! store.remove(h).unwrap();
//! assert_eq!(out, cold);
//!
//! // Patch a page against a similar indexed page (id 7).
//! let (reference, similar) = pair(Kind::Write16, 1);
//! det.insert(7, &reference);
//! let mut cands = Vec::new();
//! det.candidates(&similar, &mut cands);
//! assert_eq!(cands, [7]);
//! let h = store.insert(pt.make(&similar, &reference).unwrap()).unwrap();
//! refs.pin(7); // page 7 must now stay unchanged (write-protect it)
//! assert!(!refs.may_change(7));
//! pt.apply(store.get(h).unwrap(), &reference, &mut out).unwrap();
//! store.remove(h).unwrap();
//! refs.unpin(7).unwrap();
//! assert_eq!(out, similar);
//!
//! // The footprint counts the store: slabs + its tables.
//! let extra = store.stats().footprint_bytes() + refs.metadata_bytes() as u64
//!     + det.metadata_bytes() as u64;
//! assert!(extra > 0);
//!
//! // Swap: how many pages to evict, and where they go.
//! let mut wm = Watermarks::new(64 << 20, 48 << 20).unwrap();
//! assert_eq!(wm.pages_to_evict(80 << 20), (32 << 20) / PAGE);
//! let path = std::env::temp_dir().join(format!("doc-{}.swap", std::process::id()));
//! let mut swap = SwapFile::create(&SwapConfig::new(&path)).unwrap();
//! let slot = swap.swap_out(&cold).unwrap(); // on Err: keep the page
//! swap.swap_in(slot, &mut out).unwrap();
//! swap.free(slot).unwrap();
//! assert_eq!(out, cold);
//! ```

pub mod compress;
pub mod kinds;
pub mod ops;
pub mod patch;
pub mod similar;
pub mod store;
pub mod swap;

/// The page size everything here works with.
pub const PAGE: usize = 4096;

/// Errors of the tier. No operation panics on bad data: corrupt input,
/// missing handles and I/O failures come back as one of these.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("corrupt data: {0}")]
    Corrupt(&'static str),
    #[error("buffer length does not match the page")]
    Length,
    #[error("no such handle or slot")]
    BadHandle,
    #[error("reference {0} is not pinned")]
    NotPinned(u64),
    #[error("reference {0} has {1} dependent patches and must not change")]
    Protected(u64, u32),
    #[error("store full: {0}")]
    Full(&'static str),
    #[error("object of {0} bytes is larger than the store's largest class")]
    TooLarge(usize),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// The OS error number behind an I/O error, if any (ENOSPC, EIO, ...).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Error::Io(e) => e.raw_os_error(),
            _ => None,
        }
    }
}
