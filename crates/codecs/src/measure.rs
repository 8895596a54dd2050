//! Block-wise compression measurement.
//!
//! Memory compression works on independent blocks (a page, or a few), since
//! any block must be decompressible on its own when it is touched; Deng et
//! al. measured 8 KiB blocks and varied the block size from 4 to 128 KiB.
//! [`measure`] cuts a buffer into blocks, compresses each one on its own,
//! then decompresses them all and checks the result equals the input, timing
//! the two passes separately. The reported size is the sum of the compressed
//! blocks, with no per-block framing counted (our own codecs carry their
//! length inside the block; a store of compressed pages would also need an
//! index, which is left to the caller).

use std::time::Instant;

use serde::Serialize;

use crate::{Codec, CodecError};

/// Page size used by the per-page helpers.
pub const PAGE_SIZE: u64 = 4096;

/// Result of compressing a buffer block by block with one codec.
#[derive(Clone, Debug, Serialize)]
pub struct CodecMeasurement {
    /// [`Codec::name`] of the codec.
    pub codec: String,
    /// Block size in bytes (the last block may be shorter).
    pub block: usize,
    /// Bytes compressed.
    pub input_bytes: u64,
    /// Sum of the compressed sizes of all blocks.
    pub output_bytes: u64,
    /// Wall time to compress all blocks.
    pub compress_ns: u64,
    /// Wall time to decompress all blocks.
    pub decompress_ns: u64,
    /// Number of blocks.
    pub blocks: u64,
}

impl CodecMeasurement {
    /// Compressed size over original size (smaller is better; 1.0 for no input).
    pub fn ratio(&self) -> f64 {
        if self.input_bytes == 0 {
            1.0
        } else {
            self.output_bytes as f64 / self.input_bytes as f64
        }
    }

    /// Compression plus decompression time per 4 KiB of input, in ns.
    pub fn ns_per_page(&self) -> f64 {
        self.compress_ns_per_page() + self.decompress_ns_per_page()
    }

    /// Compression time per 4 KiB of input, in ns.
    pub fn compress_ns_per_page(&self) -> f64 {
        per_page(self.compress_ns, self.input_bytes)
    }

    /// Decompression time per 4 KiB of input, in ns.
    pub fn decompress_ns_per_page(&self) -> f64 {
        per_page(self.decompress_ns, self.input_bytes)
    }
}

pub(crate) fn per_page(ns: u64, bytes: u64) -> f64 {
    if bytes == 0 {
        0.0
    } else {
        ns as f64 * PAGE_SIZE as f64 / bytes as f64
    }
}

/// Compress `data` in blocks of `block` bytes (0 = the whole buffer as one
/// block) with `codec`, decompress every block again and verify the result.
///
/// # Panics
/// If the codec fails to round-trip (a bug in the codec); use
/// [`try_measure`] to get an error instead.
pub fn measure(codec: &dyn Codec, data: &[u8], block: usize) -> CodecMeasurement {
    match try_measure(codec, data, block) {
        Ok(m) => m,
        Err(e) => panic!("codec {} failed to round-trip: {e}", codec.name()),
    }
}

/// [`measure`], returning an error if a block does not decode to its input.
pub fn try_measure(
    codec: &dyn Codec,
    data: &[u8],
    block: usize,
) -> Result<CodecMeasurement, CodecError> {
    let block = if block == 0 { data.len().max(1) } else { block };
    let nblocks = data.len().div_ceil(block);
    let mut packed = Vec::with_capacity(data.len() + data.len() / 8 + 64 * nblocks);
    let mut ends = Vec::with_capacity(nblocks);

    let t = Instant::now();
    for b in data.chunks(block) {
        codec.compress(b, &mut packed);
        ends.push(packed.len());
    }
    let compress_ns = t.elapsed().as_nanos() as u64;

    let mut unpacked = Vec::with_capacity(data.len());
    let t = Instant::now();
    let mut start = 0;
    for &end in &ends {
        codec.decompress(&packed[start..end], &mut unpacked)?;
        start = end;
    }
    let decompress_ns = t.elapsed().as_nanos() as u64;

    if unpacked != data {
        return Err(CodecError::Corrupt(
            "decompressed data differs from the input",
        ));
    }
    Ok(CodecMeasurement {
        codec: codec.name().to_string(),
        block,
        input_bytes: data.len() as u64,
        output_bytes: packed.len() as u64,
        compress_ns,
        decompress_ns,
        blocks: nblocks as u64,
    })
}
