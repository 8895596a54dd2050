//! The page codec: how a cold page is compressed, and when it is not.
//!
//! Three representations, chosen per page and named by the first byte of
//! the compressed object (so an object decodes on its own):
//!
//! - `same`: the page is one 8-byte word repeated (zero pages never get
//!   here — the engine folds them — but pages filled with 0xff, a constant,
//!   or one double are common): 9 bytes, detected in one pass that stops at
//!   the first differing word, rebuilt by a fill. Linux's zram does the same.
//! - `lz4` (default): LZ4 block format (lz4_flex). The fastest to rebuild,
//!   which is what a fault waits for.
//! - `zstd`: zstd level 1 ([`CompressConfig::zstd_level`]) with a 4 KiB
//!   window, used *instead of* LZ4 on pages that look numeric: at least a
//!   quarter of their bytes are zero (the high bytes of small integers and
//!   pointers, the low mantissa bytes of integer-valued doubles, padding in
//!   records, sparse vectors). There zstd's entropy coding pays:
//!   integer-valued doubles 1582 -> 639 bytes, heap records 1966 -> 965,
//!   for about 2-4x LZ4's compress time and 2-8x its decompress time; on
//!   sparse pages (15/16 zero words) zstd is both smaller (169 vs 231
//!   bytes) and faster to decompress than lz4_flex (1.5 vs 2.2-4.7 us:
//!   lz4_flex's decoder is slow on many short overlapping matches, where
//!   liblz4 takes 0.9 us). On text zstd also saves (2448 -> 1480 bytes)
//!   but costs 2x to compress and 3-7x to decompress, so text stays LZ4.
//!   Level 1 by measurement: levels 3 and 6 were no smaller on single
//!   pages (int-doubles 828 and 771 bytes) and slower, negative levels
//!   lost a third of the gain. Counting the zero bytes costs ~0.1 us, and
//!   compressing numeric pages with zstd alone (not LZ4, then zstd) saves
//!   LZ4's time on them. The numbers: docs/BENCHMARKS.md, "Tier operation
//!   costs".
//!
//! A page whose best form is longer than `PAGE - min_saving` bytes
//! (default 512, 1/8 of a page) is incompressible: [`Compressor::compress`]
//! returns `None` and the caller leaves the page alone. Below 1/8 the store's
//! size-class rounding and metadata eat most of the saving, and the fault
//! costs the same as for a page that saved 7/8.
//!
//! [`Compressor`] holds the zstd contexts and an output buffer: one per
//! thread (scanner, fault handler), no allocation per page after warm-up.
//! Decompression checks everything it reads and returns an error on any
//! corrupt or truncated input.

use zstd::zstd_safe::{CCtx, CParameter, DCtx};

use crate::{Error, PAGE};

/// How a page was compressed (the object's first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Same = 1,
    Lz4 = 2,
    Zstd = 3,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Method::Same => "same",
            Method::Lz4 => "lz4",
            Method::Zstd => "zstd",
        }
    }

    fn from_tag(t: u8) -> Option<Method> {
        match t {
            1 => Some(Method::Same),
            2 => Some(Method::Lz4),
            3 => Some(Method::Zstd),
            _ => None,
        }
    }
}

/// When to use zstd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZstdPolicy {
    /// LZ4 only.
    Never,
    /// zstd (alone) on numeric-looking pages — at least 1/4 of the bytes
    /// zero — LZ4 on the others (the default; see the module
    /// documentation).
    Numeric,
    /// LZ4, then zstd on every page LZ4 left at `zstd_min_lz4` bytes or
    /// more; zstd kept if it saves `zstd_min_gain` and a quarter.
    Always,
    /// zstd only (for measurement).
    Only,
}

#[derive(Debug, Clone)]
pub struct CompressConfig {
    /// A page must shrink by at least this many bytes to be stored.
    pub min_saving: usize,
    pub zstd: ZstdPolicy,
    pub zstd_level: i32,
    /// zstd is not tried when LZ4 already made the page this small.
    pub zstd_min_lz4: usize,
    /// zstd is kept only when it saves this many bytes over LZ4, and at
    /// least a quarter of LZ4's size.
    pub zstd_min_gain: usize,
    /// Detect pages of one repeated 8-byte word.
    pub same_filled: bool,
}

impl Default for CompressConfig {
    fn default() -> Self {
        CompressConfig {
            min_saving: PAGE / 8,
            zstd: ZstdPolicy::Numeric,
            zstd_level: 1,
            zstd_min_lz4: 256,
            zstd_min_gain: 256,
            same_filled: true,
        }
    }
}

/// Per-thread compressor: see the module documentation.
pub struct Compressor {
    cfg: CompressConfig,
    cctx: CCtx<'static>,
    dctx: DCtx<'static>,
    out: Vec<u8>,
    alt: Vec<u8>,
}

/// Whether the page looks like numeric or record data rather than text:
/// at least a quarter of its bytes are zero (the high bytes of small
/// integers and pointers, the low mantissa bytes of integer-valued doubles,
/// padding). Text has next to none, and compressed or random data 1/256.
pub fn looks_numeric(page: &[u8]) -> bool {
    zero_bytes(page) * 4 >= page.len()
}

/// Number of zero bytes in `page` (8 bytes at a time).
pub fn zero_bytes(page: &[u8]) -> usize {
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut n = 0usize;
    let mut words = page.chunks_exact(8);
    for w in &mut words {
        let x = u64::from_le_bytes(w.try_into().unwrap());
        // A byte's high bit is set in `y` iff the byte is zero (exact).
        let y = !(((x & !HI) + !HI) | x) & HI;
        n += y.count_ones() as usize;
    }
    n + words.remainder().iter().filter(|&&b| b == 0).count()
}

/// The repeated word if `page` is one 8-byte word repeated.
pub fn same_filled(page: &[u8]) -> Option<[u8; 8]> {
    if !page.len().is_multiple_of(8) || page.is_empty() {
        return None;
    }
    let first: [u8; 8] = page[..8].try_into().unwrap();
    page.chunks_exact(8).all(|w| w == first).then_some(first)
}

impl Default for Compressor {
    fn default() -> Self {
        Compressor::new(CompressConfig::default())
    }
}

impl Compressor {
    pub fn new(cfg: CompressConfig) -> Compressor {
        let mut cctx = CCtx::create();
        let _ = cctx.set_parameter(CParameter::CompressionLevel(cfg.zstd_level));
        let _ = cctx.set_parameter(CParameter::ChecksumFlag(false));
        let _ = cctx.set_parameter(CParameter::ContentSizeFlag(true));
        // One page is the whole input: a 4 KiB window, tables to match.
        let _ = cctx.set_parameter(CParameter::WindowLog(12));
        let _ = cctx.set_parameter(CParameter::HashLog(12));
        let _ = cctx.set_parameter(CParameter::ChainLog(12));
        Compressor {
            cfg,
            cctx,
            dctx: DCtx::create(),
            out: Vec::with_capacity(2 * PAGE),
            alt: Vec::with_capacity(2 * PAGE),
        }
    }

    pub fn config(&self) -> &CompressConfig {
        &self.cfg
    }

    /// Bytes this compressor holds: its buffers and both zstd contexts
    /// (for a store that counts its codecs in the footprint).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Compressor>()
            + self.out.capacity()
            + self.alt.capacity()
            + self.cctx.sizeof()
            + self.dctx.sizeof()
    }

    /// The largest object a page may compress to.
    pub fn max_len(&self) -> usize {
        PAGE.saturating_sub(self.cfg.min_saving)
    }

    /// Compresses one page (any length up to 4 KiB works; the engine
    /// passes whole pages). `None`: incompressible, leave the page alone.
    pub fn compress(&mut self, page: &[u8]) -> Option<&[u8]> {
        let max = page.len().saturating_sub(self.cfg.min_saving);
        self.out.clear();
        if self.cfg.same_filled {
            if let Some(w) = same_filled(page) {
                self.out.push(Method::Same as u8);
                self.out.extend_from_slice(&w);
                return (self.out.len() <= max).then_some(&self.out[..]);
            }
        }
        let zstd_first = match self.cfg.zstd {
            ZstdPolicy::Only => true,
            ZstdPolicy::Numeric => looks_numeric(page),
            ZstdPolicy::Never | ZstdPolicy::Always => false,
        };
        // If zstd does not make the cut (not seen on the measured kinds),
        // LZ4 decides.
        if zstd_first && (self.zstd_into_out(page) <= max || self.cfg.zstd == ZstdPolicy::Only) {
            return (!self.out.is_empty() && self.out.len() <= max).then_some(&self.out[..]);
        }
        let lz4_len = self.lz4_into_out(page);
        if self.cfg.zstd == ZstdPolicy::Always && (self.cfg.zstd_min_lz4..=max).contains(&lz4_len) {
            std::mem::swap(&mut self.out, &mut self.alt);
            let zstd_len = self.zstd_into_out(page);
            let gain = self.cfg.zstd_min_gain.max(lz4_len / 4);
            if zstd_len + gain > lz4_len {
                std::mem::swap(&mut self.out, &mut self.alt);
            }
        }
        (!self.out.is_empty() && self.out.len() <= max).then_some(&self.out[..])
    }

    /// LZ4 into `out` (tagged); returns its length, usize::MAX on failure.
    fn lz4_into_out(&mut self, page: &[u8]) -> usize {
        self.out.clear();
        self.out.push(Method::Lz4 as u8);
        self.out
            .resize(1 + lz4_flex::block::get_maximum_output_size(page.len()), 0);
        let written = lz4_flex::block::compress_into(page, &mut self.out[1..]).ok();
        self.settle_out(written)
    }

    /// zstd into `out` (tagged); returns its length, usize::MAX on failure.
    fn zstd_into_out(&mut self, page: &[u8]) -> usize {
        self.out.clear();
        self.out
            .resize(1 + zstd::zstd_safe::compress_bound(page.len()), 0);
        self.out[0] = Method::Zstd as u8;
        let written = self.cctx.compress2(&mut self.out[1..], page).ok();
        self.settle_out(written)
    }

    /// `out` cut to the tag and the `written` bytes after it; its length, or
    /// usize::MAX (and `out` empty) if the codec failed.
    fn settle_out(&mut self, written: Option<usize>) -> usize {
        match written {
            Some(n) => {
                self.out.truncate(1 + n);
                1 + n
            }
            None => {
                self.out.clear();
                usize::MAX
            }
        }
    }

    /// The method of a compressed object.
    pub fn method_of(data: &[u8]) -> Option<Method> {
        data.first().and_then(|&t| Method::from_tag(t))
    }

    /// Rebuilds the page of `data` into `out` (the page's length).
    pub fn decompress(&mut self, data: &[u8], out: &mut [u8]) -> Result<(), Error> {
        let (&tag, body) = data
            .split_first()
            .ok_or(Error::Corrupt("compressed page: empty"))?;
        match Method::from_tag(tag).ok_or(Error::Corrupt("compressed page: unknown method"))? {
            Method::Same => {
                let w: [u8; 8] = body
                    .try_into()
                    .map_err(|_| Error::Corrupt("same: not 8 bytes"))?;
                if !out.len().is_multiple_of(8) {
                    return Err(Error::Length);
                }
                for c in out.chunks_exact_mut(8) {
                    c.copy_from_slice(&w);
                }
                Ok(())
            }
            Method::Lz4 => match lz4_flex::block::decompress_into(body, out) {
                Ok(n) if n == out.len() => Ok(()),
                _ => Err(Error::Corrupt("lz4: malformed block")),
            },
            Method::Zstd => match self.dctx.decompress(out, body) {
                Ok(n) if n == out.len() => Ok(()),
                _ => Err(Error::Corrupt("zstd: malformed frame")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{page, Kind};

    #[test]
    fn kinds_round_trip_with_expected_methods() {
        let mut c = Compressor::default();
        let mut out = vec![0u8; PAGE];
        for kind in Kind::ALL {
            let p = page(kind, 1);
            match c.compress(&p).map(|d| d.to_vec()) {
                Some(d) => {
                    c.decompress(&d, &mut out).unwrap();
                    assert_eq!(out, p, "{kind:?}");
                    let m = Compressor::method_of(&d).unwrap();
                    match kind {
                        Kind::Zero => assert_eq!(m, Method::Same),
                        Kind::Text => assert_eq!(m, Method::Lz4, "{kind:?}"),
                        Kind::IntDoubles | Kind::Heap | Kind::Sparse => {
                            assert_eq!(m, Method::Zstd, "{kind:?}")
                        }
                        _ => {}
                    }
                }
                None => assert!(
                    matches!(
                        kind,
                        Kind::Random
                            | Kind::Identical
                            | Kind::Similar95
                            | Kind::Write16
                            | Kind::Doubles
                    ),
                    "{kind:?} refused"
                ),
            }
        }
    }

    #[test]
    fn corrupt_input_is_an_error() {
        let mut c = Compressor::default();
        let mut out = vec![0u8; PAGE];
        for bad in [
            &[][..],
            &[9, 1, 2][..],
            &[1, 2, 3][..],
            &[2, 0xff, 0xff, 0xff][..],
            &[3, 0x28, 0xb5, 0x2f, 0xfd, 0][..],
        ] {
            assert!(c.decompress(bad, &mut out).is_err(), "{bad:?}");
        }
    }
}
