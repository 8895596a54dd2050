//! Run-length encoding, PackBits style.
//!
//! RLE is the simplest codec Deng et al. measured; it only wins on runs, and
//! memory has many (zero runs above all), so it is a useful floor. Format
//! after the length header: a sequence of tokens, each starting with a
//! control byte `c`:
//!
//! - `c < 128`: a literal run; the next `c + 1` bytes (1..=128) are copied.
//! - `c >= 128`: a repeat run; the next byte is repeated `c - 128 + 3` times
//!   (3..=130).
//!
//! The encoder turns every run of 3 or more equal bytes into repeat tokens
//! (longer runs into several) and gathers everything else into literal
//! tokens. A 4 KiB zero page becomes 32 tokens, 64 bytes.

use crate::bits::{get_header, put_header};
use crate::{Codec, CodecError};

const MIN_RUN: usize = 3;
const MAX_RUN: usize = 127 + MIN_RUN;
const MAX_LITERAL: usize = 128;

/// Run-length encoding, name "rle".
#[derive(Clone, Copy, Debug, Default)]
pub struct Rle;

fn flush_literals(out: &mut Vec<u8>, mut lit: &[u8]) {
    while !lit.is_empty() {
        let n = lit.len().min(MAX_LITERAL);
        out.push((n - 1) as u8);
        out.extend_from_slice(&lit[..n]);
        lit = &lit[n..];
    }
}

impl Codec for Rle {
    fn name(&self) -> &'static str {
        "rle"
    }

    fn compress(&self, input: &[u8], out: &mut Vec<u8>) {
        put_header(out, input.len());
        let mut lit_start = 0;
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            let run = input[i..]
                .iter()
                .take(MAX_RUN)
                .take_while(|&&x| x == b)
                .count();
            if run >= MIN_RUN {
                flush_literals(out, &input[lit_start..i]);
                out.push((128 + run - MIN_RUN) as u8);
                out.push(b);
                i += run;
                lit_start = i;
            } else {
                i += 1;
            }
        }
        flush_literals(out, &input[lit_start..]);
    }

    fn decompress(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        let (len, mut p) = get_header(input)?;
        // Two input bytes yield at most MAX_RUN output bytes.
        out.reserve(len.min(p.len().saturating_mul(MAX_RUN)));
        let mut left = len;
        while let Some((&c, rest)) = p.split_first() {
            let c = usize::from(c);
            if c < 128 {
                let n = c + 1;
                if n > rest.len() {
                    return Err(CodecError::Corrupt("rle: literal run past end of input"));
                }
                if n > left {
                    return Err(CodecError::Corrupt("rle: output longer than header says"));
                }
                out.extend_from_slice(&rest[..n]);
                left -= n;
                p = &rest[n..];
            } else {
                let n = c - 128 + MIN_RUN;
                let Some((&b, rest)) = rest.split_first() else {
                    return Err(CodecError::Corrupt("rle: repeat run past end of input"));
                };
                if n > left {
                    return Err(CodecError::Corrupt("rle: output longer than header says"));
                }
                out.resize(out.len() + n, b);
                left -= n;
                p = rest;
            }
        }
        if left != 0 {
            return Err(CodecError::Corrupt("rle: input ends before header length"));
        }
        Ok(())
    }
}
