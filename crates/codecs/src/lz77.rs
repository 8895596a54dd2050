//! LZ77 with a 4 KiB sliding window (LZSS token format).
//!
//! LZ77 replaces a string that occurred within the last [`WINDOW`] bytes by a
//! (distance, length) reference to it; Deng et al. found the LZ family the
//! best classic compressors for memory. This is the textbook form: a hash of
//! the next three bytes leads to a chain of earlier positions with the same
//! hash (at most [`MAX_CHAIN`] are tried, greedy parsing, no lazy matching),
//! and the longest match of at least [`MIN_MATCH`] bytes wins.
//!
//! Format after the length header: groups of up to eight items, each group
//! led by a flag byte whose bit `k` (least significant first) tells whether
//! item `k` is a match (1) or a literal (0).
//!
//! - Literal: the byte itself.
//! - Match: a little-endian `u16` `v`, distance `(v >> 4) + 1` (1..=4096) and
//!   length code `v & 15`: lengths 3..=17 are coded as 0..=14; code 15 means
//!   18 plus extension bytes that follow, each added to the length, where a
//!   byte of 255 means another extension byte follows (as in LZ4). So a
//!   4 KiB zero page is one literal and one match of 4095 bytes.
//!
//! A match may overlap the bytes it produces (distance < length), which is how
//! runs are coded. The decoder stops when the header's length is reached and
//! checks that every input byte was used.

use crate::bits::{get_header, put_header};
use crate::{Codec, CodecError};

/// Sliding window size (largest match distance).
pub const WINDOW: usize = 4096;
/// Shortest match worth a reference.
pub const MIN_MATCH: usize = 3;
/// Most earlier positions compared per match search.
pub const MAX_CHAIN: usize = 32;
/// Stop searching once a match is this long.
const NICE_MATCH: usize = 258;
const HASH_BITS: u32 = 13;
const NONE: u32 = u32::MAX;

/// LZ77 with a 4 KiB window and hash-chain match finder, name "lz77".
#[derive(Clone, Copy, Debug, Default)]
pub struct Lz77;

#[inline]
fn hash3(b: &[u8]) -> usize {
    let v = u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
    (v.wrapping_mul(0x9E37_79B1) >> (32 - HASH_BITS)) as usize
}

/// Hash chains over the last [`WINDOW`] positions.
struct Chains {
    head: Vec<u32>,
    prev: Vec<u32>,
}

impl Chains {
    fn insert(&mut self, input: &[u8], pos: usize) {
        if pos + MIN_MATCH <= input.len() {
            let h = hash3(&input[pos..]);
            self.prev[pos % WINDOW] = self.head[h];
            self.head[h] = pos as u32;
        }
    }

    /// Longest match (distance, length) for `input[pos..]`, length 0 if none.
    fn find(&self, input: &[u8], pos: usize) -> (usize, usize) {
        if pos + MIN_MATCH > input.len() {
            return (0, 0);
        }
        let target = &input[pos..];
        let (mut best_dist, mut best_len) = (0, 0);
        let mut cand = self.head[hash3(target)];
        for _ in 0..MAX_CHAIN {
            if cand == NONE || pos - cand as usize > WINDOW {
                break;
            }
            let c = cand as usize;
            let len = input[c..]
                .iter()
                .zip(target)
                .take_while(|(a, b)| a == b)
                .count();
            if len > best_len {
                (best_dist, best_len) = (pos - c, len);
                if len >= NICE_MATCH {
                    break;
                }
            }
            let next = self.prev[c % WINDOW];
            // A slot overwritten by a newer position would point forward.
            if next == NONE || next >= cand {
                break;
            }
            cand = next;
        }
        (best_dist, best_len)
    }
}

impl Codec for Lz77 {
    fn name(&self) -> &'static str {
        "lz77"
    }

    fn compress(&self, input: &[u8], out: &mut Vec<u8>) {
        put_header(out, input.len());
        let mut chains = Chains {
            head: vec![NONE; 1 << HASH_BITS],
            prev: vec![NONE; WINDOW],
        };
        let (mut flag_at, mut items) = (0usize, 8u32);
        let mut i = 0;
        while i < input.len() {
            if items == 8 {
                flag_at = out.len();
                out.push(0);
                items = 0;
            }
            let (dist, len) = chains.find(input, i);
            if len >= MIN_MATCH {
                out[flag_at] |= 1 << items;
                let code = (len - MIN_MATCH).min(15);
                let v = ((dist - 1) << 4 | code) as u16;
                out.extend_from_slice(&v.to_le_bytes());
                if code == 15 {
                    let mut rest = len - MIN_MATCH - 15;
                    while rest >= 255 {
                        out.push(255);
                        rest -= 255;
                    }
                    out.push(rest as u8);
                }
                for p in i..i + len {
                    chains.insert(input, p);
                }
                i += len;
            } else {
                out.push(input[i]);
                chains.insert(input, i);
                i += 1;
            }
            items += 1;
        }
    }

    fn decompress(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        const EOF: CodecError = CodecError::Corrupt("lz77: input ends early");
        let (len, p) = get_header(input)?;
        let base = out.len();
        let end = base + len;
        out.reserve(len.min(p.len().saturating_mul(256)));
        let mut pos = 0;
        let mut next = || -> Result<u8, CodecError> {
            let b = *p.get(pos).ok_or(EOF)?;
            pos += 1;
            Ok(b)
        };
        while out.len() < end {
            let flags = next()?;
            for k in 0..8 {
                if out.len() == end {
                    break;
                }
                if flags & (1 << k) == 0 {
                    out.push(next()?);
                    continue;
                }
                let v = usize::from(u16::from_le_bytes([next()?, next()?]));
                let dist = (v >> 4) + 1;
                let mut n = (v & 15) + MIN_MATCH;
                if v & 15 == 15 {
                    loop {
                        let e = next()?;
                        n += usize::from(e);
                        if n > end - out.len() {
                            return Err(CodecError::Corrupt("lz77: match runs past header length"));
                        }
                        if e != 255 {
                            break;
                        }
                    }
                }
                if dist > out.len() - base {
                    return Err(CodecError::Corrupt(
                        "lz77: match distance before block start",
                    ));
                }
                if n > end - out.len() {
                    return Err(CodecError::Corrupt("lz77: match runs past header length"));
                }
                let from = out.len() - dist;
                if dist >= n {
                    out.extend_from_within(from..from + n);
                } else {
                    for j in 0..n {
                        let b = out[from + j];
                        out.push(b);
                    }
                }
            }
        }
        if pos != p.len() {
            return Err(CodecError::Corrupt("lz77: trailing bytes"));
        }
        Ok(())
    }
}
