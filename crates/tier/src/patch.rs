//! Patches: a page stored as the bytes needed to rebuild it from a similar
//! reference page, and the rule that keeps the reference alive and unchanged
//! while patches depend on it.
//!
//! Difference Engine used xdelta and kept a patch only if it was at most half
//! a page ([`PATCH_CUTOFF`], 2048 bytes). Four encoders are here, all with a
//! decoder, all rebuilding any page from any reference exactly (property
//! tests), all refusing corrupt input with an error instead of panicking:
//!
//! - `zstd-ref`: zstd level 1 with the reference page as a raw prefix
//!   (`ZSTD_CCtx_refPrefix`), i.e. the page is compressed as if it followed
//!   the reference. Like xdelta it finds copies at any offset, so shifted
//!   content patches well. The analyzer's default (its patch sizes are the
//!   closest cheap analogue of DE's xdelta).
//! - `xor-lz4`: XOR with the reference, then LZ4 (zero runs where the pages
//!   agree). Only sees changes in place.
//! - `xor-zstd`: the XOR compressed with zstd level 1.
//! - `runs` (ours): the changed byte runs themselves, each as a varint gap
//!   from the end of the previous run, a varint length and the new bytes;
//!   runs closer than 3 bytes are merged (a run header costs at least 2).
//!   Finding the runs is one pass of 8-byte XORs; rebuilding is a copy of the
//!   reference plus one small copy per run, with no decompressor at all. The
//!   encoder gives up as soon as its output passes the limit, so a page that
//!   does not patch is rejected cheaply.
//!
//! The engine's encoder ([`Patcher`]) is chosen by measurement (docs/BENCHMARKS.md,
//! "Tier operation costs"): `runs` first — the smallest patch for pages
//! changed in place (DE's 16-byte write: 63 bytes against zstd-ref's 77 and
//! xor-lz4's 134; numeric and record pages with 5% of their words updated:
//! 85-242 bytes, the smallest of the four) and 3-10x cheaper to encode and
//! 3-30x cheaper to decode than the zstd encoders — and `zstd-ref` when
//! `runs` fails or is above [`GOOD_ENOUGH`] (a quarter page), keeping the
//! smaller: that catches shifted content (edited text: 97 bytes where
//! `runs` alone needs 2812 or fails).
//! A [`Patcher`] patch carries its encoder in a one-byte tag, so it decodes
//! on its own; the analyzer's [`DeltaEncoder`] returns bare patches (their
//! sizes are what it reports).
//!
//! Reference protection: [`References`] counts, per reference id, the
//! patches that depend on it. The engine must not free or change a reference
//! page while [`References::may_change`] says no (it keeps it write-protected
//! and refuses to evict it); a patch is counted from [`References::pin`] to
//! [`References::unpin`], and unpinning more than was pinned is an error, so
//! a counting bug shows up instead of silently exposing a reference.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use zstd::zstd_safe::{self, CCtx, CParameter, DCtx, ResetDirective};

use crate::{Error, PAGE};

/// Patches larger than this are not kept (half a page, as in DE).
pub const PATCH_CUTOFF: usize = PAGE / 2;

/// A delta encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Encoder {
    #[default]
    ZstdRef,
    XorLz4,
    XorZstd,
    Runs,
}

impl Encoder {
    pub const ALL: [Encoder; 4] = [
        Encoder::ZstdRef,
        Encoder::XorLz4,
        Encoder::XorZstd,
        Encoder::Runs,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Encoder::ZstdRef => "zstd-ref",
            Encoder::XorLz4 => "xor-lz4",
            Encoder::XorZstd => "xor-zstd",
            Encoder::Runs => "runs",
        }
    }

    pub fn parse(s: &str) -> Option<Encoder> {
        Encoder::ALL.into_iter().find(|e| e.name() == s)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Encoder::ZstdRef => "zstd level 1 with the reference page as prefix",
            Encoder::XorLz4 => "XOR against the reference, then LZ4",
            Encoder::XorZstd => "XOR against the reference, then zstd level 1",
            Encoder::Runs => "changed byte runs (gap, length, bytes)",
        }
    }

    fn tag(self) -> u8 {
        match self {
            Encoder::ZstdRef => 1,
            Encoder::XorLz4 => 2,
            Encoder::XorZstd => 3,
            Encoder::Runs => 4,
        }
    }

    fn from_tag(t: u8) -> Option<Encoder> {
        Encoder::ALL.into_iter().find(|e| e.tag() == t)
    }
}

impl fmt::Display for Encoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

const LEVEL: i32 = 1;
const HASH_LOG: u32 = 14;
/// The first bytes of a zstd dictionary: a reference page starting with them
/// would be read as a formatted dictionary by `ZSTD_decompress_usingDict`.
const ZSTD_DICT_MAGIC: [u8; 4] = 0xEC30_A437u32.to_le_bytes();

fn configure(cctx: &mut CCtx<'static>) {
    let _ = cctx.set_parameter(CParameter::CompressionLevel(LEVEL));
    // Patches are kept in memory, never transmitted: no frame checksum.
    let _ = cctx.set_parameter(CParameter::ChecksumFlag(false));
    // Reference + page fit in an 8 KiB window; small tables keep the
    // per-patch table reset cheap (level 1's defaults size them for inputs
    // up to 16 KiB without a prefix).
    let _ = cctx.set_parameter(CParameter::WindowLog(13));
    let _ = cctx.set_parameter(CParameter::HashLog(HASH_LOG));
}

/// Per-thread encoder state: a zstd context and scratch buffers, reused
/// for every patch (creating a zstd context costs more than a patch).
pub struct DeltaEncoder {
    encoder: Encoder,
    cctx: CCtx<'static>,
    xor: Vec<u8>,
    out: Vec<u8>,
}

impl DeltaEncoder {
    pub fn new(encoder: Encoder) -> DeltaEncoder {
        let mut cctx = CCtx::create();
        configure(&mut cctx);
        DeltaEncoder {
            encoder,
            cctx,
            xor: vec![0; PAGE],
            out: Vec::with_capacity(zstd_safe::compress_bound(PAGE) + 64),
        }
    }

    pub fn encoder(&self) -> Encoder {
        self.encoder
    }

    /// Encodes `page` against `reference` (of the same length) and returns
    /// the patch. When no patch can be made (lengths differ, or an encoder
    /// error) the result is a copy of the page: no better than the page.
    pub fn encode(&mut self, page: &[u8], reference: &[u8]) -> &[u8] {
        if self.encode_limited(page, reference, usize::MAX).is_none() {
            self.out.clear();
            self.out.extend_from_slice(page);
        }
        &self.out
    }

    /// Size of the patch of `page` against `reference`.
    pub fn patch_size(&mut self, page: &[u8], reference: &[u8]) -> usize {
        self.encode(page, reference).len()
    }

    /// The patch, or `None` if it would be longer than `limit` bytes or
    /// cannot be made (the lengths differ).
    pub fn encode_within(&mut self, page: &[u8], reference: &[u8], limit: usize) -> Option<&[u8]> {
        self.encode_limited(page, reference, limit)?;
        Some(&self.out)
    }

    fn encode_limited(&mut self, page: &[u8], reference: &[u8], limit: usize) -> Option<()> {
        self.out.clear();
        if page.len() != reference.len() {
            return None;
        }
        match self.encoder {
            Encoder::ZstdRef => {
                // SAFETY: a prefix set by ZSTD_CCtx_refPrefix is single-use:
                // ZSTD_compress2 consumes it when it starts the frame (it
                // clears the context's prefix before compressing), and no
                // later frame reads a previous frame's window. The prefix is
                // therefore only read inside the compress2 call below, while
                // `reference` is borrowed. If compress2 is not reached or
                // fails, the context's dictionaries are cleared (reset of the
                // parameters) before returning.
                let prefix: &'static [u8] =
                    unsafe { std::mem::transmute::<&[u8], &'static [u8]>(reference) };
                let ok = self.cctx.ref_prefix(prefix).is_ok()
                    && self.cctx.compress2(&mut self.out, page).is_ok();
                if !ok {
                    let _ = self.cctx.reset(ResetDirective::Parameters);
                    configure(&mut self.cctx);
                    return None;
                }
            }
            Encoder::XorLz4 | Encoder::XorZstd => {
                self.xor.resize(page.len(), 0);
                xor_into(&mut self.xor, page, reference);
                if self.encoder == Encoder::XorLz4 {
                    self.out
                        .resize(lz4_flex::block::get_maximum_output_size(page.len()), 0);
                    let n = lz4_flex::block::compress_into(&self.xor, &mut self.out).ok()?;
                    self.out.truncate(n);
                } else if self.cctx.compress2(&mut self.out, &self.xor).is_err() {
                    return None;
                }
            }
            Encoder::Runs => {
                return runs_encode(page, reference, limit, &mut self.xor, &mut self.out)
            }
        }
        (self.out.len() <= limit).then_some(())
    }
}

fn xor_into(x: &mut [u8], a: &[u8], b: &[u8]) {
    for ((x, a), b) in x
        .chunks_exact_mut(8)
        .zip(a.chunks_exact(8))
        .zip(b.chunks_exact(8))
    {
        let v =
            u64::from_ne_bytes(a.try_into().unwrap()) ^ u64::from_ne_bytes(b.try_into().unwrap());
        x.copy_from_slice(&v.to_ne_bytes());
    }
    let done = a.len() / 8 * 8;
    for i in done..a.len() {
        x[i] = a[i] ^ b[i];
    }
}

fn get_varint(input: &[u8], pos: &mut usize) -> Option<usize> {
    let mut v = 0usize;
    for shift in (0..28).step_by(7) {
        let b = *input.get(*pos)?;
        *pos += 1;
        v |= ((b & 0x7f) as usize) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

/// Largest gap between two changed bytes that still joins them in one run.
const MERGE_GAP: usize = 2;

/// Writes runs into a buffer sized for the worst case (no capacity checks
/// per byte).
struct RunWriter<'p> {
    page: &'p [u8],
    buf: &'p mut [u8],
    pos: usize,
    limit: usize,
    /// End of the last emitted run.
    prev_end: usize,
    /// The open run (start, end), not yet emitted.
    run_start: usize,
    run_end: usize,
}

#[inline(always)]
fn write_varint(buf: &mut [u8], pos: &mut usize, mut v: usize) {
    while v >= 0x80 {
        buf[*pos] = v as u8 | 0x80;
        *pos += 1;
        v >>= 7;
    }
    buf[*pos] = v as u8;
    *pos += 1;
}

impl RunWriter<'_> {
    #[inline]
    fn emit(&mut self) -> bool {
        let (s, e) = (self.run_start, self.run_end);
        write_varint(self.buf, &mut self.pos, s - self.prev_end);
        write_varint(self.buf, &mut self.pos, e - s - 1);
        self.buf[self.pos..self.pos + (e - s)].copy_from_slice(&self.page[s..e]);
        self.pos += e - s;
        self.prev_end = e;
        self.pos <= self.limit
    }

    /// Byte `pos` differs (positions come in increasing order).
    #[inline(always)]
    fn diff(&mut self, pos: usize) -> bool {
        if self.run_end != usize::MAX && pos - self.run_end <= MERGE_GAP {
            self.run_end = pos + 1;
            return true;
        }
        let ok = self.run_end == usize::MAX || self.emit();
        self.run_start = pos;
        self.run_end = pos + 1;
        ok
    }

    fn finish(&mut self) -> bool {
        self.run_end == usize::MAX || self.emit()
    }
}

/// The `runs` encoder: see the module documentation.
fn runs_encode(
    page: &[u8],
    reference: &[u8],
    limit: usize,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Option<()> {
    // Every changed byte is in the output: more changed bytes than the
    // limit allows is a refusal after one cheap pass.
    if limit < page.len() && changed_bytes(page, reference) > limit {
        return None;
    }
    // Worst case: 1-byte runs 3 bytes apart, 3 bytes per 4; the scratch
    // buffer keeps its size between calls (no zeroing per patch).
    let need = 2 * page.len() + 16;
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    let mut w = RunWriter {
        page,
        buf: &mut scratch[..],
        pos: 0,
        limit,
        prev_end: 0,
        run_start: 0,
        run_end: usize::MAX,
    };
    let words = page.len() / 8;
    let mut ok = true;
    for (i, (a, b)) in page
        .chunks_exact(8)
        .zip(reference.chunks_exact(8))
        .enumerate()
    {
        let mut x =
            u64::from_le_bytes(a.try_into().unwrap()) ^ u64::from_le_bytes(b.try_into().unwrap());
        while x != 0 {
            let j = (x.trailing_zeros() / 8) as usize;
            x &= !(0xffu64 << (j * 8));
            ok &= w.diff(i * 8 + j);
        }
        if !ok {
            return None;
        }
    }
    for i in words * 8..page.len() {
        if page[i] != reference[i] && !w.diff(i) {
            return None;
        }
    }
    if !w.finish() {
        return None;
    }
    let n = w.pos;
    out.clear();
    out.extend_from_slice(&scratch[..n]);
    Some(())
}

/// Bytes that differ between `a` and `b` (same length).
fn changed_bytes(a: &[u8], b: &[u8]) -> usize {
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut n = 0usize;
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        let d =
            u64::from_le_bytes(x.try_into().unwrap()) ^ u64::from_le_bytes(y.try_into().unwrap());
        // High bit of each nonzero byte of d (exact).
        let nz = (((d & !HI) + !HI) | d) & HI;
        n += nz.count_ones() as usize;
    }
    let done = a.len() / 8 * 8;
    n + a[done..]
        .iter()
        .zip(&b[done..])
        .filter(|(x, y)| x != y)
        .count()
}

fn runs_apply(patch: &[u8], out: &mut [u8]) -> Result<(), Error> {
    let mut pos = 0usize;
    let mut at = 0usize;
    while pos < patch.len() {
        let gap = get_varint(patch, &mut pos).ok_or(Error::Corrupt("runs: truncated gap"))?;
        let len = get_varint(patch, &mut pos).ok_or(Error::Corrupt("runs: truncated length"))? + 1;
        at = at
            .checked_add(gap)
            .ok_or(Error::Corrupt("runs: offset overflow"))?;
        if at + len > out.len() || pos + len > patch.len() {
            return Err(Error::Corrupt("runs: run outside the page or the patch"));
        }
        out[at..at + len].copy_from_slice(&patch[pos..pos + len]);
        pos += len;
        at += len;
    }
    Ok(())
}

/// Per-thread decoder state (a zstd decompression context).
pub struct DeltaDecoder {
    dctx: DCtx<'static>,
}

impl Default for DeltaDecoder {
    fn default() -> Self {
        DeltaDecoder::new()
    }
}

impl DeltaDecoder {
    pub fn new() -> DeltaDecoder {
        DeltaDecoder {
            dctx: DCtx::create(),
        }
    }

    /// Rebuilds into `out` (as long as `reference`) the page that `patch`
    /// (made by `encoder`) encodes against `reference`.
    pub fn apply_into(
        &mut self,
        encoder: Encoder,
        patch: &[u8],
        reference: &[u8],
        out: &mut [u8],
    ) -> Result<(), Error> {
        if out.len() != reference.len() {
            return Err(Error::Length);
        }
        match encoder {
            Encoder::ZstdRef => {
                let n = if reference.starts_with(&ZSTD_DICT_MAGIC) {
                    // Rare: force "raw content" with a one-off context.
                    let mut d = DCtx::create();
                    d.ref_prefix(reference)
                        .map_err(|_| Error::Corrupt("zstd-ref: prefix"))?;
                    d.decompress(out, patch)
                } else {
                    self.dctx.decompress_using_dict(out, patch, reference)
                };
                match n {
                    Ok(n) if n == reference.len() => Ok(()),
                    _ => Err(Error::Corrupt("zstd-ref: malformed patch")),
                }
            }
            Encoder::XorLz4 => match lz4_flex::block::decompress_into(patch, out) {
                Ok(n) if n == reference.len() => {
                    xor_in_place(out, reference);
                    Ok(())
                }
                _ => Err(Error::Corrupt("xor-lz4: malformed patch")),
            },
            Encoder::XorZstd => match self.dctx.decompress(out, patch) {
                Ok(n) if n == reference.len() => {
                    xor_in_place(out, reference);
                    Ok(())
                }
                _ => Err(Error::Corrupt("xor-zstd: malformed patch")),
            },
            Encoder::Runs => {
                out.copy_from_slice(reference);
                runs_apply(patch, out)
            }
        }
    }
}

fn xor_in_place(out: &mut [u8], reference: &[u8]) {
    for (o, r) in out.chunks_exact_mut(8).zip(reference.chunks_exact(8)) {
        let v = u64::from_ne_bytes((&*o).try_into().unwrap())
            ^ u64::from_ne_bytes(r.try_into().unwrap());
        o.copy_from_slice(&v.to_ne_bytes());
    }
    let done = out.len() / 8 * 8;
    for i in done..out.len() {
        out[i] ^= reference[i];
    }
}

/// Rebuilds a page from its patch and reference (convenience, allocates a
/// decoder; the engine keeps a [`DeltaDecoder`]).
pub fn apply(encoder: Encoder, patch: &[u8], reference: &[u8]) -> Option<Vec<u8>> {
    let mut out = vec![0; reference.len()];
    DeltaDecoder::new()
        .apply_into(encoder, patch, reference, &mut out)
        .ok()?;
    Some(out)
}

/// A `runs` patch at most this long is kept without trying the fallback.
pub const GOOD_ENOUGH: usize = PAGE / 4;

/// The engine's patch maker: `runs`, then `zstd-ref` if `runs` does not fit
/// or is above [`GOOD_ENOUGH`] (the smaller wins; see the module
/// documentation), patches at most [`PATCH_CUTOFF`] bytes, tagged with their
/// encoder. One per thread.
pub struct Patcher {
    runs: DeltaEncoder,
    fallback: Option<DeltaEncoder>,
    decoder: DeltaDecoder,
    cutoff: usize,
    out: Vec<u8>,
}

impl Default for Patcher {
    fn default() -> Self {
        Patcher::new()
    }
}

impl Patcher {
    /// `runs` with `zstd-ref` fallback, cut-off 2048 bytes.
    pub fn new() -> Patcher {
        Patcher::with(Encoder::Runs, Some(Encoder::ZstdRef), PATCH_CUTOFF)
    }

    /// A patcher trying `first`, then `fallback`; patches (with their tag
    /// byte) above `cutoff` bytes are refused.
    pub fn with(first: Encoder, fallback: Option<Encoder>, cutoff: usize) -> Patcher {
        Patcher {
            runs: DeltaEncoder::new(first),
            fallback: fallback.filter(|&f| f != first).map(DeltaEncoder::new),
            decoder: DeltaDecoder::new(),
            cutoff,
            out: Vec::with_capacity(PAGE + 64),
        }
    }

    /// The tagged patch of `page` against `reference`, or `None` when no
    /// encoder makes one of at most the cut-off (the page is then not
    /// patched) or the lengths differ.
    pub fn make(&mut self, page: &[u8], reference: &[u8]) -> Option<&[u8]> {
        let limit = self.cutoff.checked_sub(1)?;
        self.out.clear();
        let tag = self.runs.encoder().tag();
        if let Some(p) = self.runs.encode_within(page, reference, limit) {
            self.out.push(tag);
            self.out.extend_from_slice(p);
            if p.len() <= GOOD_ENOUGH {
                return Some(&self.out);
            }
        }
        if let Some(f) = self.fallback.as_mut() {
            // The fallback must beat what we have.
            let limit = if self.out.is_empty() {
                limit
            } else {
                self.out.len() - 2
            };
            let tag = f.encoder().tag();
            if let Some(p) = f.encode_within(page, reference, limit) {
                self.out.clear();
                self.out.push(tag);
                self.out.extend_from_slice(p);
            }
        }
        (!self.out.is_empty()).then_some(&self.out[..])
    }

    /// Rebuilds the page of a tagged patch into `out`.
    pub fn apply(&mut self, patch: &[u8], reference: &[u8], out: &mut [u8]) -> Result<(), Error> {
        let (&tag, body) = patch.split_first().ok_or(Error::Corrupt("patch: empty"))?;
        let enc = Encoder::from_tag(tag).ok_or(Error::Corrupt("patch: unknown encoder tag"))?;
        self.decoder.apply_into(enc, body, reference, out)
    }

    /// The encoder a tagged patch was made with.
    pub fn encoder_of(patch: &[u8]) -> Option<Encoder> {
        patch.first().and_then(|&t| Encoder::from_tag(t))
    }
}

/// Reference protection: per reference id, the number of patches that
/// depend on it. Shared by the scanner (pins when it stores a patch) and
/// the fault handler (unpins when it rebuilds a page and drops its patch).
#[derive(Default)]
pub struct References {
    counts: Mutex<HashMap<u64, u32>>,
}

impl References {
    pub fn new() -> References {
        References::default()
    }

    /// One more patch depends on `reference`; returns the new count.
    pub fn pin(&self, reference: u64) -> u32 {
        let mut m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let c = m.entry(reference).or_insert(0);
        *c += 1;
        *c
    }

    /// One patch of `reference` is gone; returns the remaining count.
    /// Unpinning a reference with no dependants is an error (a counting
    /// bug in the caller) and changes nothing.
    pub fn unpin(&self, reference: u64) -> Result<u32, Error> {
        let mut m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(&reference) {
            Some(c) if *c > 1 => {
                *c -= 1;
                Ok(*c)
            }
            Some(_) => {
                m.remove(&reference);
                Ok(0)
            }
            None => Err(Error::NotPinned(reference)),
        }
    }

    /// Patches depending on `reference`.
    pub fn dependants(&self, reference: u64) -> u32 {
        let m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&reference).copied().unwrap_or(0)
    }

    /// May the page `reference` be written, freed, evicted or moved? Only
    /// when no patch depends on it.
    pub fn may_change(&self, reference: u64) -> bool {
        self.dependants(reference) == 0
    }

    /// `Ok` if `reference` may change, else [`Error::Protected`] with the
    /// number of dependants.
    pub fn check_change(&self, reference: u64) -> Result<(), Error> {
        match self.dependants(reference) {
            0 => Ok(()),
            n => Err(Error::Protected(reference, n)),
        }
    }

    /// Distinct protected references.
    pub fn protected(&self) -> usize {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Bytes of this table's own memory (hash map capacity).
    pub fn metadata_bytes(&self) -> usize {
        let m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        m.capacity() * (std::mem::size_of::<(u64, u32)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages() -> (Vec<u8>, Vec<u8>) {
        let reference = crate::kinds::page(crate::kinds::Kind::Random, 0x1234);
        let mut page = reference.clone();
        for i in [5, 700, 1500, 3000, 4095] {
            page[i] ^= 0x5a;
        }
        (reference, page)
    }

    #[test]
    fn patches_round_trip_and_are_small() {
        let (reference, page) = pages();
        for enc in Encoder::ALL {
            let mut e = DeltaEncoder::new(enc);
            let patch = e.encode(&page, &reference).to_vec();
            assert!(patch.len() < 200, "{enc}: {} bytes", patch.len());
            assert_eq!(apply(enc, &patch, &reference).unwrap(), page, "{enc}");
        }
    }

    #[test]
    fn runs_are_tiny_for_scattered_bytes() {
        let (reference, page) = pages();
        let mut e = DeltaEncoder::new(Encoder::Runs);
        // 5 runs of 1 byte: gap (1-2 B) + length (1 B) + byte.
        assert!(e.patch_size(&page, &reference) <= 5 * 4);
        assert_eq!(e.patch_size(&reference, &reference), 0);
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
        // The patcher falls back to zstd-ref for it.
        let mut p = Patcher::new();
        let patch = p.make(&page, &reference).unwrap().to_vec();
        assert_eq!(Patcher::encoder_of(&patch), Some(Encoder::ZstdRef));
        let mut out = vec![0; PAGE];
        p.apply(&patch, &reference, &mut out).unwrap();
        assert_eq!(out, page);
    }

    #[test]
    fn reference_starting_with_dictionary_magic_round_trips() {
        let (mut reference, mut page) = pages();
        reference[..4].copy_from_slice(&ZSTD_DICT_MAGIC);
        page[..4].copy_from_slice(&ZSTD_DICT_MAGIC);
        let mut e = DeltaEncoder::new(Encoder::ZstdRef);
        let patch = e.encode(&page, &reference).to_vec();
        assert_eq!(apply(Encoder::ZstdRef, &patch, &reference).unwrap(), page);
    }

    #[test]
    fn references_count_and_refuse_extra_unpins() {
        let r = References::new();
        assert!(r.may_change(7));
        assert_eq!(r.pin(7), 1);
        assert_eq!(r.pin(7), 2);
        assert!(!r.may_change(7));
        assert!(matches!(r.check_change(7), Err(Error::Protected(7, 2))));
        assert_eq!(r.unpin(7).unwrap(), 1);
        assert_eq!(r.unpin(7).unwrap(), 0);
        assert!(r.may_change(7));
        assert!(matches!(r.unpin(7), Err(Error::NotPinned(7))));
        assert_eq!(r.protected(), 0);
    }
}
