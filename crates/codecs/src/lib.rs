//! pagefold-codecs: how far do classic compressors and chunk deduplication
//! shrink a memory image?
//!
//! Deng et al. (JISE 2017) compared compression of memory blocks (arithmetic
//! coding, Huffman, LZ77, LZ78, LZW, RLE) with deduplication under several
//! chunking schemes (fixed-size pages, content-defined chunking, sliding
//! block) and found deduplication of 4 KiB pages both smaller and far faster.
//! This crate gives the memory analyzer (`pagefold analyze`) the pieces to
//! ask the same questions of today's memory, with today's codecs next to the
//! classic ones:
//!
//! - [`Codec`]: one block compressor. [`all_codecs`] lists them: LZ4 and zstd
//!   (levels 1, 3, 9) from well-kept crates, and our own short, plain
//!   implementations of the classic codecs Deng et al. measured (RLE, static
//!   Huffman, adaptive arithmetic coding, LZ77, LZ78, LZW), for which no
//!   well-kept crate exists. Every codec round-trips any input exactly, and
//!   decompression of corrupt or truncated input returns an error instead of
//!   panicking.
//! - [`measure`]: compress a buffer block by block with one codec, decompress
//!   it again, verify, and report sizes and times ([`CodecMeasurement`]).
//! - [`dedup`]: chunk a buffer with a [`Chunking`] scheme, keep one copy of
//!   each distinct chunk, rebuild the buffer from the chunk list, and report
//!   sizes and times ([`DedupMeasurement`]).
//!
//! Our own codecs frame their output the same way: a LEB128 varint holding
//! the original length, then the codec's payload (each module documents its
//! payload). A block therefore needs no outside length to be decoded, and the
//! decoder can tell a truncated stream from a complete one. Blocks are limited
//! to [`MAX_BLOCK_LEN`] bytes.
//!
//! # Example
//!
//! ```
//! use pagefold_codecs::{all_codecs, codec_by_name, dedup, measure, Chunking};
//!
//! // Four pages: two of zeros, two copies of a text page.
//! let text: Vec<u8> = b"the quick brown fox ".iter().copied().cycle().take(4096).collect();
//! let mut image = vec![0u8; 8192];
//! image.extend_from_slice(&text);
//! image.extend_from_slice(&text);
//!
//! // Compression: every codec round-trips, LZ4 shrinks the image a lot.
//! let lz4 = codec_by_name("lz4").unwrap();
//! let mut packed = Vec::new();
//! lz4.compress(&image, &mut packed);
//! let mut unpacked = Vec::new();
//! lz4.decompress(&packed, &mut unpacked).unwrap();
//! assert_eq!(unpacked, image);
//! for codec in all_codecs() {
//!     let m = measure(codec.as_ref(), &image, 4096);
//!     assert_eq!(m.blocks, 4);
//!     assert!(m.ratio() < 0.9, "{} ratio {}", m.codec, m.ratio());
//! }
//!
//! // Deduplication with 4 KiB fixed-size pages: two distinct pages out of four.
//! let d = dedup(&image, &Chunking::Fixed(4096));
//! assert_eq!((d.chunks, d.unique_chunks), (4, 2));
//! assert_eq!(d.scheme, "fsp-4k");
//! ```

mod arithmetic;
mod bits;
mod dedup;
mod dict;
mod huffman;
mod lz4;
mod lz77;
mod lz78;
mod lzw;
mod measure;
mod rle;
mod zstd_codec;

pub use arithmetic::Arithmetic;
pub use dedup::{dedup, Chunking, DedupMeasurement, CHUNK_REF_BYTES};
pub use huffman::Huffman;
pub use lz4::Lz4;
pub use lz77::Lz77;
pub use lz78::Lz78;
pub use lzw::Lzw;
pub use measure::{measure, try_measure, CodecMeasurement, PAGE_SIZE};
pub use rle::Rle;
pub use zstd_codec::Zstd;

/// The largest block our own codecs accept (their decoders reject a header
/// claiming more). zstd and LZ4 blocks are limited the same way.
pub const MAX_BLOCK_LEN: u64 = 1 << 32;

/// A block compressor.
///
/// `compress` appends the compressed form of `input` to `out`; `decompress`
/// appends the original bytes to `out`. `input` to `decompress` must be exactly
/// what one `compress` call appended. Decompression never panics: corrupt or
/// truncated input returns [`CodecError`] (and may leave partial output
/// appended to `out`).
pub trait Codec: Send + Sync {
    /// Stable short name: "lz4", "zstd-1", "zstd-3", "zstd-9", "rle",
    /// "huffman", "arithmetic", "lz77", "lz78", "lzw".
    fn name(&self) -> &'static str;
    /// Compress `input`, appending to `out`.
    fn compress(&self, input: &[u8], out: &mut Vec<u8>);
    /// Decompress `input`, appending to `out`.
    fn decompress(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError>;
}

/// Why a compressed block could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The compressed input is malformed or truncated; the text says where.
    #[error("corrupt compressed data: {0}")]
    Corrupt(&'static str),
}

/// Every codec, in a fixed order: lz4, zstd-1, zstd-3, zstd-9, rle, huffman,
/// arithmetic, lz77, lz78, lzw.
pub fn all_codecs() -> Vec<Box<dyn Codec>> {
    vec![
        Box::new(Lz4),
        Box::new(Zstd::new(1)),
        Box::new(Zstd::new(3)),
        Box::new(Zstd::new(9)),
        Box::new(Rle),
        Box::new(Huffman),
        Box::new(Arithmetic),
        Box::new(Lz77),
        Box::new(Lz78),
        Box::new(Lzw),
    ]
}

/// The codec whose [`Codec::name`] is `name`, if any.
pub fn codec_by_name(name: &str) -> Option<Box<dyn Codec>> {
    all_codecs().into_iter().find(|c| c.name() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_order() {
        let names: Vec<_> = all_codecs().iter().map(|c| c.name()).collect();
        assert_eq!(
            names,
            [
                "lz4",
                "zstd-1",
                "zstd-3",
                "zstd-9",
                "rle",
                "huffman",
                "arithmetic",
                "lz77",
                "lz78",
                "lzw"
            ]
        );
        for n in names {
            assert_eq!(codec_by_name(n).unwrap().name(), n);
        }
        assert!(codec_by_name("lzo").is_none());
    }
}
