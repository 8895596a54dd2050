//! Static Huffman coding: one canonical code per block.
//!
//! Huffman coding exploits only the byte-value distribution of a block
//! (zero-order entropy), which is what Deng et al. characterise memory with,
//! so it shows how much of a block's redundancy is skewed byte values rather
//! than repeated strings. Each block gets its own optimal code, limited to 15
//! bits, and only the code lengths are stored; the code itself is the
//! canonical one (shorter codes first, equal lengths in byte order), so
//! encoder and decoder derive the same codes from the lengths.
//!
//! Format after the length header (nothing follows for an empty block), as
//! one bit stream, most significant bit first:
//!
//! 1. 256 bits: which byte values occur (bit `v` set for value `v`);
//! 2. 4 bits per occurring value, in value order: its code length (1..=15);
//! 3. the codes of the block's bytes; zero bits pad the last byte.
//!
//! A block of one distinct value codes it with one bit. Code lengths are
//! limited by halving the counts (keeping them at least 1) and rebuilding
//! until the longest code fits in 15 bits; this is slightly suboptimal but
//! only matters for very skewed blocks. The decoder walks the canonical code
//! one bit at a time (as zlib's `puff` does): short and clear, not fast.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::bits::{get_header, put_header, BitReader, BitWriter};
use crate::{Codec, CodecError};

const MAX_LEN: usize = 15;

/// Static canonical Huffman coding, name "huffman".
#[derive(Clone, Copy, Debug, Default)]
pub struct Huffman;

/// Code lengths (0 = value absent) of an optimal prefix code for `freq`,
/// limited to [`MAX_LEN`] bits.
fn code_lengths(freq: &[u64; 256]) -> [u8; 256] {
    let mut freq = *freq;
    loop {
        let lens = unlimited_lengths(&freq);
        if lens.iter().all(|&l| usize::from(l) <= MAX_LEN) {
            return lens;
        }
        for f in freq.iter_mut().filter(|f| **f > 0) {
            *f = (*f / 2).max(1);
        }
    }
}

fn unlimited_lengths(freq: &[u64; 256]) -> [u8; 256] {
    let mut lens = [0u8; 256];
    // Nodes 0..256 are leaves; internal nodes follow. parent[n] links upward.
    let mut parent: Vec<usize> = vec![usize::MAX; 256];
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = freq
        .iter()
        .enumerate()
        .filter(|(_, &f)| f > 0)
        .map(|(v, &f)| Reverse((f, v)))
        .collect();
    match heap.len() {
        0 => return lens,
        1 => {
            let Reverse((_, v)) = heap.pop().unwrap();
            lens[v] = 1;
            return lens;
        }
        _ => {}
    }
    while heap.len() > 1 {
        let Reverse((fa, a)) = heap.pop().unwrap();
        let Reverse((fb, b)) = heap.pop().unwrap();
        let n = parent.len();
        parent.push(usize::MAX);
        parent[a] = n;
        parent[b] = n;
        heap.push(Reverse((fa + fb, n)));
    }
    for v in 0..256 {
        if freq[v] > 0 {
            let (mut depth, mut n) = (0u32, v);
            while parent[n] != usize::MAX {
                n = parent[n];
                depth += 1;
            }
            lens[v] = depth.min(255) as u8;
        }
    }
    lens
}

/// Canonical codes for the given lengths.
fn canonical_codes(lens: &[u8; 256]) -> [u32; 256] {
    let mut count = [0u32; MAX_LEN + 1];
    for &l in lens {
        count[usize::from(l)] += 1;
    }
    count[0] = 0;
    let mut next = [0u32; MAX_LEN + 1];
    let mut code = 0u32;
    for len in 1..=MAX_LEN {
        code = (code + count[len - 1]) << 1;
        next[len] = code;
    }
    let mut codes = [0u32; 256];
    for v in 0..256 {
        let l = usize::from(lens[v]);
        if l > 0 {
            codes[v] = next[l];
            next[l] += 1;
        }
    }
    codes
}

/// Decoding tables of a canonical code (zlib `puff` layout).
struct Decoder {
    /// Number of codes of each length.
    count: [u16; MAX_LEN + 1],
    /// Values ordered by (code length, value).
    symbols: Vec<u8>,
}

impl Decoder {
    fn new(lens: &[u8; 256]) -> Result<Self, CodecError> {
        let mut count = [0u16; MAX_LEN + 1];
        for &l in lens.iter().filter(|&&l| l > 0) {
            count[usize::from(l)] += 1;
        }
        // Kraft: the code must not be over-subscribed (an incomplete code,
        // such as the one-bit code of a single value, is fine).
        let kraft: u32 = (1..=MAX_LEN)
            .map(|l| u32::from(count[l]) << (MAX_LEN - l))
            .sum();
        if kraft > 1 << MAX_LEN {
            return Err(CodecError::Corrupt("huffman: over-subscribed code lengths"));
        }
        let mut symbols = Vec::with_capacity(256);
        for len in 1..=MAX_LEN as u8 {
            symbols.extend((0..=255u8).filter(|&v| lens[usize::from(v)] == len));
        }
        Ok(Decoder { count, symbols })
    }

    #[inline]
    fn decode(&self, r: &mut BitReader) -> Result<u8, CodecError> {
        let (mut code, mut first, mut index) = (0i32, 0i32, 0i32);
        for len in 1..=MAX_LEN {
            code |= r.get(1)? as i32;
            let count = i32::from(self.count[len]);
            if code - first < count {
                return Ok(self.symbols[(index + code - first) as usize]);
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        Err(CodecError::Corrupt("huffman: invalid code"))
    }
}

impl Codec for Huffman {
    fn name(&self) -> &'static str {
        "huffman"
    }

    fn compress(&self, input: &[u8], out: &mut Vec<u8>) {
        put_header(out, input.len());
        if input.is_empty() {
            return;
        }
        let mut freq = [0u64; 256];
        for &b in input {
            freq[usize::from(b)] += 1;
        }
        let lens = code_lengths(&freq);
        let codes = canonical_codes(&lens);
        let mut w = BitWriter::new(out);
        for &l in &lens {
            w.put(u32::from(l > 0), 1);
        }
        for &l in lens.iter().filter(|&&l| l > 0) {
            w.put(u32::from(l), 4);
        }
        for &b in input {
            w.put(codes[usize::from(b)], u32::from(lens[usize::from(b)]));
        }
        w.finish();
    }

    fn decompress(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        let (len, payload) = get_header(input)?;
        if len == 0 {
            return if payload.is_empty() {
                Ok(())
            } else {
                Err(CodecError::Corrupt(
                    "huffman: trailing bytes after empty block",
                ))
            };
        }
        let mut r = BitReader::new(payload);
        let mut present = [false; 256];
        for p in present.iter_mut() {
            *p = r.get(1)? == 1;
        }
        let mut lens = [0u8; 256];
        for v in 0..256 {
            if present[v] {
                lens[v] = r.get(4)? as u8;
                if lens[v] == 0 {
                    return Err(CodecError::Corrupt("huffman: zero code length"));
                }
            }
        }
        let dec = Decoder::new(&lens)?;
        if dec.symbols.is_empty() {
            return Err(CodecError::Corrupt("huffman: no symbols"));
        }
        // Every code takes at least one bit.
        if len > r.remaining_bytes().saturating_mul(8) + 8 {
            return Err(CodecError::Corrupt(
                "huffman: length header larger than payload allows",
            ));
        }
        out.reserve(len);
        for _ in 0..len {
            out.push(dec.decode(&mut r)?);
        }
        r.check_end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_limited_and_complete() {
        // Fibonacci counts force a very deep unlimited tree.
        let mut freq = [0u64; 256];
        let (mut a, mut b) = (1u64, 1u64);
        for f in freq.iter_mut().take(40) {
            *f = a;
            (a, b) = (b, a + b);
        }
        let lens = code_lengths(&freq);
        assert!(lens.iter().all(|&l| usize::from(l) <= MAX_LEN));
        let kraft: u64 = lens
            .iter()
            .filter(|&&l| l > 0)
            .map(|&l| 1u64 << (MAX_LEN - usize::from(l)))
            .sum();
        assert_eq!(kraft, 1 << MAX_LEN);
    }
}
