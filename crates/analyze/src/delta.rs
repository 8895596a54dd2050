//! Patch (delta) encoders: the bytes needed to rebuild a page from a similar
//! reference page. Difference Engine used xdelta; the analyzer computes every
//! patch for real with one of three encoders and reports its size:
//!
//! - `zstd-ref` (default): zstd level 1 with the reference page as a raw
//!   prefix (ZSTD_CCtx_refPrefix), i.e. the page is compressed as if it
//!   followed the reference. Like xdelta it finds copies at any offset, so
//!   shifted content patches well; about 5-10 us per patch here.
//! - `xor-lz4`: XOR the page with the reference and compress the XOR with
//!   LZ4 (runs of zero bytes where the pages agree). Fastest, but only sees
//!   changes in place.
//! - `xor-zstd`: the XOR compressed with zstd level 1.
//!
//! Every encoder has a decoder ([`apply`]) so tests can check that a patch
//! really rebuilds its page.

use std::fmt;

use crate::image::PAGE;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoder {
    #[default]
    ZstdRef,
    XorLz4,
    XorZstd,
}

impl Encoder {
    pub fn name(self) -> &'static str {
        match self {
            Encoder::ZstdRef => "zstd-ref",
            Encoder::XorLz4 => "xor-lz4",
            Encoder::XorZstd => "xor-zstd",
        }
    }

    pub fn parse(s: &str) -> Option<Encoder> {
        match s {
            "zstd-ref" => Some(Encoder::ZstdRef),
            "xor-lz4" => Some(Encoder::XorLz4),
            "xor-zstd" => Some(Encoder::XorZstd),
            _ => None,
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Encoder::ZstdRef => "zstd level 1 with the reference page as prefix",
            Encoder::XorLz4 => "XOR against the reference, then LZ4",
            Encoder::XorZstd => "XOR against the reference, then zstd level 1",
        }
    }
}

impl fmt::Display for Encoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

const LEVEL: i32 = 1;
const HASH_LOG: u32 = 14;

/// Per-thread encoder state; references must outlive it (they are pages of
/// the image being analysed).
pub struct DeltaEncoder<'a> {
    encoder: Encoder,
    cctx: zstd::zstd_safe::CCtx<'a>,
    xor: Vec<u8>,
    out: Vec<u8>,
}

impl<'a> DeltaEncoder<'a> {
    pub fn new(encoder: Encoder) -> DeltaEncoder<'a> {
        let mut cctx = zstd::zstd_safe::CCtx::create();
        let _ = cctx.set_parameter(zstd::zstd_safe::CParameter::CompressionLevel(LEVEL));
        // Patches are stored by the analysis, never transmitted: no frame
        // checksum, no content size.
        let _ = cctx.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(false));
        // Reference + page fit in an 8 KiB window; small tables keep the
        // per-patch table reset cheap (level 1's defaults size them for
        // inputs up to 16 KiB without a prefix).
        let _ = cctx.set_parameter(zstd::zstd_safe::CParameter::WindowLog(13));
        let _ = cctx.set_parameter(zstd::zstd_safe::CParameter::HashLog(HASH_LOG));
        DeltaEncoder {
            encoder,
            cctx,
            xor: vec![0; PAGE],
            out: Vec::with_capacity(zstd::zstd_safe::compress_bound(PAGE) + 64),
        }
    }

    /// Encodes `page` against `reference` and returns the patch.
    pub fn encode(&mut self, page: &[u8], reference: &'a [u8]) -> &[u8] {
        self.out.clear();
        match self.encoder {
            Encoder::ZstdRef => {
                if self.cctx.ref_prefix(reference).is_err() || self.cctx.compress2(&mut self.out, page).is_err() {
                    // Cannot happen with a bounded output buffer; report a
                    // patch no better than the page itself.
                    self.out.clear();
                    self.out.extend_from_slice(page);
                }
            }
            Encoder::XorLz4 | Encoder::XorZstd => {
                self.xor.resize(page.len(), 0);
                for ((x, a), b) in self.xor.iter_mut().zip(page).zip(reference) {
                    *x = a ^ b;
                }
                if self.encoder == Encoder::XorLz4 {
                    self.out.resize(lz4_flex::block::get_maximum_output_size(page.len()), 0);
                    let n = lz4_flex::block::compress_into(&self.xor, &mut self.out).unwrap_or(page.len());
                    self.out.truncate(n);
                } else if self.cctx.compress2(&mut self.out, &self.xor).is_err() {
                    self.out.clear();
                    self.out.extend_from_slice(page);
                }
            }
        }
        &self.out
    }

    /// Size of the patch of `page` against `reference`.
    pub fn patch_size(&mut self, page: &[u8], reference: &'a [u8]) -> usize {
        self.encode(page, reference).len()
    }
}

/// Rebuilds a page from its patch and reference.
pub fn apply(encoder: Encoder, patch: &[u8], reference: &[u8]) -> Option<Vec<u8>> {
    match encoder {
        Encoder::ZstdRef => {
            let mut dctx = zstd::zstd_safe::DCtx::create();
            dctx.ref_prefix(reference).ok()?;
            let mut out = Vec::with_capacity(PAGE);
            dctx.decompress(&mut out, patch).ok()?;
            Some(out)
        }
        Encoder::XorLz4 => {
            let mut x = lz4_flex::block::decompress(patch, reference.len()).ok()?;
            x.iter_mut().zip(reference).for_each(|(a, b)| *a ^= b);
            Some(x)
        }
        Encoder::XorZstd => {
            let mut x = zstd::bulk::decompress(patch, reference.len()).ok()?;
            x.iter_mut().zip(reference).for_each(|(a, b)| *a ^= b);
            Some(x)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages() -> (Vec<u8>, Vec<u8>) {
        let mut x = 0x1234_5678_9abc_def0u64;
        let reference: Vec<u8> = (0..PAGE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut page = reference.clone();
        for i in [5, 700, 1500, 3000, 4095] {
            page[i] ^= 0x5a;
        }
        (reference, page)
    }

    #[test]
    fn patches_round_trip_and_are_small() {
        let (reference, page) = pages();
        for enc in [Encoder::ZstdRef, Encoder::XorLz4, Encoder::XorZstd] {
            let mut e = DeltaEncoder::new(enc);
            let patch = e.encode(&page, &reference).to_vec();
            assert!(patch.len() < 200, "{enc}: {} bytes", patch.len());
            assert_eq!(apply(enc, &patch, &reference).unwrap(), page, "{enc}");
        }
    }

    #[test]
    fn shifted_content_patches_with_zstd_ref() {
        let (reference, _) = pages();
        let mut page = vec![7u8; 16];
        page.extend_from_slice(&reference[..PAGE - 16]);
        let mut e = DeltaEncoder::new(Encoder::ZstdRef);
        let n = e.patch_size(&page, &reference);
        assert!(n < 100, "{n}");
        let mut x = DeltaEncoder::new(Encoder::XorLz4);
        assert!(x.patch_size(&page, &reference) > 2048);
    }
}
