//! Byte- and bit-level plumbing shared by our own codecs.
//!
//! Every own codec starts its output with the original length as a LEB128
//! varint ([`put_header`] / [`get_header`]), so its decoder knows when to stop,
//! can refuse absurd sizes before allocating, and can tell a truncated stream
//! from a complete one. Huffman, LZ78 and LZW write variable-width codes with
//! [`BitWriter`] (most significant bit first, the last byte padded with zero
//! bits) and read them back with [`BitReader`], which reports the end of input
//! as an error instead of inventing bits.

use crate::{CodecError, MAX_BLOCK_LEN};

/// Append `v` as a LEB128 varint (7 bits a byte, low bits first).
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Read a LEB128 varint; returns the value and the bytes it took.
pub(crate) fn get_varint(input: &[u8]) -> Result<(u64, usize), CodecError> {
    let mut v = 0u64;
    for (i, &b) in input.iter().enumerate().take(10) {
        let shift = 7 * i as u32;
        if shift == 63 && b > 1 {
            return Err(CodecError::Corrupt("varint overflows 64 bits"));
        }
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok((v, i + 1));
        }
    }
    Err(CodecError::Corrupt("truncated or overlong varint"))
}

/// Write the original-length header of an own codec.
pub(crate) fn put_header(out: &mut Vec<u8>, len: usize) {
    put_varint(out, len as u64);
}

/// Read the original-length header; returns the length and the payload after it.
pub(crate) fn get_header(input: &[u8]) -> Result<(usize, &[u8]), CodecError> {
    let (len, used) = get_varint(input)?;
    if len > MAX_BLOCK_LEN || usize::try_from(len).is_err() {
        return Err(CodecError::Corrupt("length header exceeds MAX_BLOCK_LEN"));
    }
    Ok((len as usize, &input[used..]))
}

/// Bits needed to write any value in `0..n` (0 when `n <= 1`).
pub(crate) fn width(n: u32) -> u32 {
    32 - n.saturating_sub(1).leading_zeros()
}

/// Writes codes of up to 32 bits, most significant bit first.
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    nbits: u32,
}

impl<'a> BitWriter<'a> {
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter {
            out,
            acc: 0,
            nbits: 0,
        }
    }

    /// Write the low `bits` bits of `value` (`bits <= 32`).
    #[inline]
    pub(crate) fn put(&mut self, value: u32, bits: u32) {
        debug_assert!(bits <= 32);
        if bits == 0 {
            return;
        }
        // At most 7 pending bits + 32 new ones: the low 39 bits of `acc` are
        // meaningful, higher ones are stale and never read.
        self.acc = (self.acc << bits) | (u64::from(value) & ((1u64 << bits) - 1));
        self.nbits += bits;
        while self.nbits >= 8 {
            self.nbits -= 8;
            self.out.push((self.acc >> self.nbits) as u8);
        }
    }

    /// Flush the last partial byte, padded with zero bits.
    pub(crate) fn finish(self) {
        if self.nbits > 0 {
            self.out.push((self.acc << (8 - self.nbits)) as u8);
        }
    }
}

/// Reads what [`BitWriter`] wrote.
pub(crate) struct BitReader<'a> {
    data: &'a [u8],
    pos: usize,
    acc: u64,
    nbits: u32,
}

impl<'a> BitReader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        BitReader {
            data,
            pos: 0,
            acc: 0,
            nbits: 0,
        }
    }

    /// Read a `bits`-bit code (`bits <= 32`); error at the end of input.
    #[inline]
    pub(crate) fn get(&mut self, bits: u32) -> Result<u32, CodecError> {
        debug_assert!(bits <= 32);
        if bits == 0 {
            return Ok(0);
        }
        while self.nbits < bits {
            let b = *self
                .data
                .get(self.pos)
                .ok_or(CodecError::Corrupt("bit stream ends early"))?;
            self.pos += 1;
            self.acc = (self.acc << 8) | u64::from(b);
            self.nbits += 8;
        }
        self.nbits -= bits;
        Ok(((self.acc >> self.nbits) & ((1u64 << bits) - 1)) as u32)
    }

    /// Bytes not yet touched.
    pub(crate) fn remaining_bytes(&self) -> usize {
        self.data.len() - self.pos
    }

    /// Succeeds only if every byte was consumed and the padding bits are zero,
    /// as [`BitWriter::finish`] leaves them.
    pub(crate) fn check_end(&self) -> Result<(), CodecError> {
        if self.pos != self.data.len() || self.nbits >= 8 {
            return Err(CodecError::Corrupt("trailing bytes after bit stream"));
        }
        if self.acc & ((1u64 << self.nbits) - 1) != 0 {
            return Err(CodecError::Corrupt("non-zero padding bits"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trip() {
        for v in [0u64, 1, 127, 128, 300, 1 << 32, u64::MAX] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(get_varint(&b).unwrap(), (v, b.len()));
            assert!(get_varint(&b[..b.len() - 1]).is_err());
        }
        assert!(get_varint(&[0xff; 11]).is_err());
    }

    #[test]
    fn bits_round_trip() {
        let codes = [
            (1u32, 1u32),
            (0, 3),
            (0x1ff, 9),
            (0xdead_beef, 32),
            (5, 0),
            (3, 2),
        ];
        let mut buf = Vec::new();
        let mut w = BitWriter::new(&mut buf);
        for &(v, n) in &codes {
            w.put(v, n);
        }
        w.finish();
        let mut r = BitReader::new(&buf);
        for &(v, n) in &codes {
            let mask = if n == 0 { 0 } else { (1u64 << n) - 1 } as u32;
            assert_eq!(r.get(n).unwrap(), v & mask);
        }
        r.check_end().unwrap();
        assert!(r.get(8).is_err());
    }

    #[test]
    fn widths() {
        assert_eq!(width(0), 0);
        assert_eq!(width(1), 0);
        assert_eq!(width(2), 1);
        assert_eq!(width(256), 8);
        assert_eq!(width(257), 9);
        assert_eq!(width(65536), 16);
    }
}
