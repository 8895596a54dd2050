//! LZ4 (block format) through the `lz4_flex` crate.
//!
//! LZ4 is the fast end of today's LZ family and the codec Linux's zram and
//! zswap commonly use for pages, so it is the baseline a memory-compression
//! design has to beat. `lz4_flex` is a maintained pure-Rust implementation;
//! we use its safe encoder and decoder. The raw LZ4 block format does not
//! carry the original length, so we frame it like our own codecs: a LEB128
//! varint with the original length, then the LZ4 block. The decoder refuses a
//! length LZ4 could not have produced from the payload (LZ4 expands at most
//! about 255 bytes per input byte) before allocating anything.

use crate::bits::{get_header, put_header};
use crate::{Codec, CodecError};

/// LZ4 block compression (`lz4_flex`), name "lz4".
#[derive(Clone, Copy, Debug, Default)]
pub struct Lz4;

impl Codec for Lz4 {
    fn name(&self) -> &'static str {
        "lz4"
    }

    fn compress(&self, input: &[u8], out: &mut Vec<u8>) {
        put_header(out, input.len());
        let start = out.len();
        out.resize(
            start + lz4_flex::block::get_maximum_output_size(input.len()),
            0,
        );
        let n = lz4_flex::block::compress_into(input, &mut out[start..])
            .expect("buffer sized by get_maximum_output_size");
        out.truncate(start + n);
    }

    fn decompress(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        let (len, payload) = get_header(input)?;
        if len as u64 > payload.len() as u64 * 256 + 16 {
            return Err(CodecError::Corrupt(
                "lz4: length header larger than payload allows",
            ));
        }
        let start = out.len();
        out.resize(start + len, 0);
        match lz4_flex::block::decompress_into(payload, &mut out[start..]) {
            Ok(n) if n == len => Ok(()),
            Ok(_) => Err(CodecError::Corrupt(
                "lz4: decoded length differs from header",
            )),
            Err(_) => Err(CodecError::Corrupt("lz4: malformed block")),
        }
    }
}
