//! LZW: LZ78 without the explicit byte, 9-16 bit codes, reset when full.
//!
//! LZW (Welch 1984, the `compress` and GIF codec) starts with a dictionary
//! holding all 256 single bytes, so every token is just a phrase code; the
//! phrase added after each token is the previous phrase plus the first byte
//! of the current one. It is the third LZ78-family codec Deng et al. measured.
//!
//! Format after the length header: a bit stream (most significant bit first,
//! zero-padded) of codes. Each code is written in `width(n)` bits, where `n`
//! is the number of codes the encoder has defined when it writes it (8 bits
//! for the first code, then 9, growing to at most 16). The decoder runs one
//! phrase behind, so it reads with `width(m + 1)`, `m` being the codes it has
//! defined, except for the first code after a start or reset. When the
//! encoder's dictionary reaches [`MAX_CODES`] it resets to the 256 single
//! bytes (no clear code is sent: the decoder resets at the same point). The
//! special case of a code not yet known to the decoder (the "KwKwK" case) is
//! the previous phrase plus its own first byte.

use crate::bits::{get_header, put_header, width, BitReader, BitWriter};
use crate::dict::PairTable;
use crate::{Codec, CodecError};

/// Number of codes at which the dictionary resets.
pub const MAX_CODES: u32 = 1 << 16;

/// LZW with 9-16 bit codes, name "lzw".
#[derive(Clone, Copy, Debug, Default)]
pub struct Lzw;

impl Codec for Lzw {
    fn name(&self) -> &'static str {
        "lzw"
    }

    fn compress(&self, input: &[u8], out: &mut Vec<u8>) {
        put_header(out, input.len());
        let Some((&first, rest)) = input.split_first() else {
            return;
        };
        let mut table = PairTable::with_entries(input.len().min((MAX_CODES - 256) as usize));
        let mut w = BitWriter::new(out);
        let mut next = 256u32;
        let mut code = u32::from(first);
        for &c in rest {
            if let Some(longer) = table.get(code, c) {
                code = longer;
                continue;
            }
            w.put(code, width(next));
            table.insert(code, c, next);
            next += 1;
            if next == MAX_CODES {
                table.clear();
                next = 256;
            }
            code = u32::from(c);
        }
        w.put(code, width(next));
        w.finish();
    }

    fn decompress(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        let (len, payload) = get_header(input)?;
        let base = out.len();
        let end = base + len;
        let mut r = BitReader::new(payload);
        // (start relative to base, length) of codes 256.. .
        let mut phrases: Vec<(usize, usize)> = Vec::new();
        // The previous phrase as (start relative to base, length); None right
        // after a start or reset.
        let mut prev: Option<(usize, usize)> = None;
        out.reserve(len.min(1 << 20));
        while out.len() < end {
            let defined = 256 + phrases.len() as u32;
            let at = out.len() - base;
            let Some((pstart, plen)) = prev else {
                let code = r.get(width(defined))?;
                out.push(code as u8);
                prev = Some((at, 1));
                continue;
            };
            let code = r.get(width(defined + 1))?;
            let cur_len = if code < 256 {
                out.push(code as u8);
                1
            } else if code < defined {
                let (s, l) = phrases[(code - 256) as usize];
                if l > end - out.len() {
                    return Err(CodecError::Corrupt("lzw: phrase runs past header length"));
                }
                out.extend_from_within(base + s..base + s + l);
                l
            } else if code == defined {
                if plen + 1 > end - out.len() {
                    return Err(CodecError::Corrupt("lzw: phrase runs past header length"));
                }
                out.extend_from_within(base + pstart..base + pstart + plen);
                out.push(out[base + pstart]);
                plen + 1
            } else {
                return Err(CodecError::Corrupt("lzw: code not yet defined"));
            };
            // New phrase: previous phrase + first byte of this one, which
            // directly follows it in the output.
            phrases.push((pstart, plen + 1));
            prev = Some((at, cur_len));
            if 256 + phrases.len() as u32 + 1 == MAX_CODES {
                phrases.clear();
                prev = None;
            }
        }
        r.check_end()
    }
}
