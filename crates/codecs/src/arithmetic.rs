//! Order-0 adaptive arithmetic coding with a 32-bit range coder.
//!
//! Arithmetic coding reaches the zero-order entropy of a block to a fraction
//! of a bit per byte, so next to Huffman it shows what coding byte values
//! alone can achieve; the adaptive model needs no header, which matters for
//! small blocks. The model starts with every byte value at frequency 1, adds
//! [`INCREMENT`] to a value's frequency after coding it, and halves all
//! frequencies (keeping them at least 1) when the total exceeds 2^16. A
//! Fenwick tree keeps cumulative frequencies, so coding a byte costs
//! O(log 256) rather than a scan of the table.
//!
//! The coder is Subbotin's carry-less range coder: `low` and `range` are 32
//! bits; a byte of `low` is shifted out whenever its top byte is settled, and
//! when the range gets small (< 2^16) while still straddling a top-byte
//! boundary it is cut down to the boundary, which wastes a little coding
//! space but means no carry ever has to propagate into bytes already written.
//! The decoder mirrors the encoder step for step and reads exactly as many
//! bytes as the encoder wrote.
//!
//! Format after the length header: the range coder's bytes, ending with the
//! four flushed bytes of `low` (nothing at all for an empty block). The
//! decoder reports an error if it would read beyond the input, if a decoded
//! frequency is out of range, or if input is left over.

use crate::bits::{get_header, put_header};
use crate::{Codec, CodecError};

const TOP: u32 = 1 << 24;
const BOT: u32 = 1 << 16;
/// Frequency added to a byte value each time it is coded.
const INCREMENT: u32 = 32;

/// Adaptive order-0 arithmetic (range) coding, name "arithmetic".
#[derive(Clone, Copy, Debug, Default)]
pub struct Arithmetic;

/// Adaptive frequencies of the 256 byte values.
struct Model {
    freq: [u32; 256],
    /// Fenwick tree over `freq`, 1-based.
    tree: [u32; 257],
    total: u32,
}

impl Model {
    fn new() -> Self {
        let mut m = Model {
            freq: [1; 256],
            tree: [0; 257],
            total: 256,
        };
        m.rebuild();
        m
    }

    fn rebuild(&mut self) {
        self.tree = [0; 257];
        for i in 1..=256usize {
            self.tree[i] += self.freq[i - 1];
            let j = i + (i & i.wrapping_neg());
            if j <= 256 {
                self.tree[j] += self.tree[i];
            }
        }
        self.total = self.freq.iter().sum();
    }

    /// Sum of the frequencies of values below `sym`.
    fn cum(&self, sym: usize) -> u32 {
        let (mut i, mut s) = (sym, 0);
        while i > 0 {
            s += self.tree[i];
            i &= i - 1;
        }
        s
    }

    /// The value `v` with `cum(v) <= target < cum(v + 1)`, and `cum(v)`.
    /// `target` must be below `total`.
    fn find(&self, target: u32) -> (usize, u32) {
        let (mut pos, mut rem) = (0usize, target);
        let mut step = 256;
        while step > 0 {
            if pos + step <= 256 && self.tree[pos + step] <= rem {
                pos += step;
                rem -= self.tree[pos];
            }
            step >>= 1;
        }
        (pos, target - rem)
    }

    fn update(&mut self, sym: usize) {
        self.freq[sym] += INCREMENT;
        self.total += INCREMENT;
        if self.total > BOT {
            for f in self.freq.iter_mut() {
                *f = f.div_ceil(2);
            }
            self.rebuild();
        } else {
            let mut i = sym + 1;
            while i <= 256 {
                self.tree[i] += INCREMENT;
                i += i & i.wrapping_neg();
            }
        }
    }
}

/// `true` while the coder must shift a byte out (or in): the top byte of
/// `low` is settled, or the range is too small (then cut to the boundary).
#[inline]
fn must_shift(low: u32, range: &mut u32) -> bool {
    if (low ^ low.wrapping_add(*range)) < TOP {
        return true;
    }
    if *range < BOT {
        *range = low.wrapping_neg() & (BOT - 1);
        return true;
    }
    false
}

impl Codec for Arithmetic {
    fn name(&self) -> &'static str {
        "arithmetic"
    }

    fn compress(&self, input: &[u8], out: &mut Vec<u8>) {
        put_header(out, input.len());
        if input.is_empty() {
            return;
        }
        let mut model = Model::new();
        let (mut low, mut range) = (0u32, u32::MAX);
        for &b in input {
            let sym = usize::from(b);
            let r = range / model.total;
            low = low.wrapping_add(model.cum(sym) * r);
            range = model.freq[sym] * r;
            while must_shift(low, &mut range) {
                out.push((low >> 24) as u8);
                low <<= 8;
                range <<= 8;
            }
            model.update(sym);
        }
        for _ in 0..4 {
            out.push((low >> 24) as u8);
            low <<= 8;
        }
    }

    fn decompress(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        let (len, payload) = get_header(input)?;
        if len == 0 {
            return if payload.is_empty() {
                Ok(())
            } else {
                Err(CodecError::Corrupt(
                    "arithmetic: trailing bytes after empty block",
                ))
            };
        }
        // The model never gives a value more than (2^16 - 255) / 2^16 of the
        // range, so one input byte can stand for at most ~1,400 output bytes;
        // allow far more than that.
        if len as u64 > (payload.len() as u64 + 1) * 16384 {
            return Err(CodecError::Corrupt(
                "arithmetic: length header larger than payload allows",
            ));
        }
        if payload.len() < 4 {
            return Err(CodecError::Corrupt(
                "arithmetic: input shorter than the coder's flush",
            ));
        }
        let mut model = Model::new();
        let (mut low, mut range) = (0u32, u32::MAX);
        let mut code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
        let mut pos = 4;
        out.reserve(len.min(1 << 20));
        for _ in 0..len {
            let r = range / model.total;
            let target = code.wrapping_sub(low) / r;
            if target >= model.total {
                return Err(CodecError::Corrupt(
                    "arithmetic: code outside the coding range",
                ));
            }
            let (sym, cum) = model.find(target);
            low = low.wrapping_add(cum * r);
            range = model.freq[sym] * r;
            while must_shift(low, &mut range) {
                let b = *payload
                    .get(pos)
                    .ok_or(CodecError::Corrupt("arithmetic: input ends early"))?;
                pos += 1;
                code = (code << 8) | u32::from(b);
                low <<= 8;
                range <<= 8;
            }
            out.push(sym as u8);
            model.update(sym);
        }
        if pos != payload.len() {
            return Err(CodecError::Corrupt("arithmetic: trailing bytes"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenwick_matches_scan() {
        let mut m = Model::new();
        for i in 0..5000usize {
            m.update((i * 7919) % 251);
            if i % 97 == 0 {
                for s in [0usize, 1, 100, 255, 256] {
                    assert_eq!(m.cum(s), m.freq[..s].iter().sum::<u32>());
                }
                for t in [0, 1, m.total / 3, m.total - 1] {
                    let (s, c) = m.find(t);
                    assert_eq!(c, m.cum(s));
                    assert!(c <= t && t < c + m.freq[s]);
                }
                assert!(m.total <= BOT);
            }
        }
    }
}
