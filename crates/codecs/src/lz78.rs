//! LZ78: phrases from a growing dictionary (trie), reset when full.
//!
//! LZ78 parses the input into phrases, each the longest phrase already in the
//! dictionary plus one more byte, and adds every new phrase to the
//! dictionary; Deng et al. found it the best balance of ratio and time among
//! the classic codecs on memory. Unlike LZ77 it needs no window search: the
//! encoder walks a trie (here a hash map from (phrase, byte) to phrase, see
//! `dict`), the decoder only copies.
//!
//! Format after the length header: a bit stream (most significant bit first,
//! zero-padded) of tokens `(index, byte)`: `index` is the code of the
//! longest known phrase (0 = the empty phrase) in `width(n)` bits, where `n`
//! is the current dictionary size including the empty phrase and `width(n)`
//! the bits needed for `0..n` (0 bits while only the empty phrase exists, at
//! most 16); `byte` is 8 bits. Each token adds phrase `n`. When the
//! dictionary reaches [`MAX_PHRASES`] entries both sides reset it to the
//! empty phrase alone. If the input ends inside a known phrase, the last
//! token names that phrase's parent and its last byte (adding a phrase that
//! is never used).
//!
//! The decoder keeps each phrase as (start, length) into the output it has
//! already produced: a new phrase is an old one plus the byte just written,
//! and it lies contiguously in the output.

use crate::bits::{get_header, put_header, width, BitReader, BitWriter};
use crate::dict::PairTable;
use crate::{Codec, CodecError};

/// Dictionary size (including the empty phrase) at which it resets.
pub const MAX_PHRASES: u32 = 1 << 16;

/// LZ78 with a dictionary of up to 65,536 phrases, name "lz78".
#[derive(Clone, Copy, Debug, Default)]
pub struct Lz78;

impl Codec for Lz78 {
    fn name(&self) -> &'static str {
        "lz78"
    }

    fn compress(&self, input: &[u8], out: &mut Vec<u8>) {
        put_header(out, input.len());
        let mut table = PairTable::with_entries(input.len().min(MAX_PHRASES as usize));
        let mut w = BitWriter::new(out);
        let mut next = 1u32;
        // Current trie node, the node before it, and the byte between them.
        let (mut node, mut parent, mut last) = (0u32, 0u32, 0u8);
        for &c in input {
            if let Some(child) = table.get(node, c) {
                (parent, last, node) = (node, c, child);
                continue;
            }
            w.put(node, width(next));
            w.put(u32::from(c), 8);
            table.insert(node, c, next);
            next += 1;
            if next == MAX_PHRASES {
                table.clear();
                next = 1;
            }
            node = 0;
        }
        if node != 0 {
            w.put(parent, width(next));
            w.put(u32::from(last), 8);
        }
        w.finish();
    }

    fn decompress(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        let (len, payload) = get_header(input)?;
        let base = out.len();
        let end = base + len;
        let mut r = BitReader::new(payload);
        // (start relative to base, length) of each phrase; phrase 0 is empty.
        let mut phrases: Vec<(usize, usize)> = vec![(0, 0)];
        out.reserve(len.min(1 << 20));
        while out.len() < end {
            let n = phrases.len() as u32;
            let index = r.get(width(n))? as usize;
            let byte = r.get(8)? as u8;
            let &(start, plen) = phrases
                .get(index)
                .ok_or(CodecError::Corrupt("lz78: phrase index beyond dictionary"))?;
            if plen + 1 > end - out.len() {
                return Err(CodecError::Corrupt("lz78: phrase runs past header length"));
            }
            let at = out.len() - base;
            out.extend_from_within(base + start..base + start + plen);
            out.push(byte);
            phrases.push((at, plen + 1));
            if phrases.len() as u32 == MAX_PHRASES {
                phrases.truncate(1);
            }
        }
        r.check_end()
    }
}
