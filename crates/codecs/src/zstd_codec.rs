//! zstd through the `zstd` crate (the reference C library), at a fixed level.
//!
//! zstd is the modern ratio/speed compromise (zswap and btrfs offer it); three
//! levels show the trade-off: 1 (fast), 3 (the library default) and 9
//! (slower, smaller). Each block is one self-contained zstd frame with its
//! content size, as `ZSTD_compressCCtx` writes it. Creating a zstd context
//! costs more than compressing a 4 KiB page, so each thread keeps one
//! compression and one decompression context and reuses them. The decoder
//! reads the content size from the frame header, refuses frames without one
//! or claiming more than [`crate::MAX_BLOCK_LEN`] bytes, and checks that the
//! frame decodes to exactly that many bytes.

use std::cell::RefCell;
use std::io::Cursor;

use zstd::zstd_safe::{self, CCtx, DCtx};

use crate::{Codec, CodecError, MAX_BLOCK_LEN};

thread_local! {
    static CCTX: RefCell<CCtx<'static>> = RefCell::new(CCtx::create());
    static DCTX: RefCell<DCtx<'static>> = RefCell::new(DCtx::create());
}

/// zstd at one compression level, named `zstd-<level>`.
#[derive(Clone, Copy, Debug)]
pub struct Zstd {
    level: i32,
    name: &'static str,
}

impl Zstd {
    /// zstd at `level`; the name is "zstd-1", "zstd-3", "zstd-9" for those
    /// levels and "zstd" for any other.
    pub fn new(level: i32) -> Self {
        let name = match level {
            1 => "zstd-1",
            3 => "zstd-3",
            9 => "zstd-9",
            _ => "zstd",
        };
        Zstd { level, name }
    }

    /// The compression level.
    pub fn level(&self) -> i32 {
        self.level
    }
}

impl Codec for Zstd {
    fn name(&self) -> &'static str {
        self.name
    }

    fn compress(&self, input: &[u8], out: &mut Vec<u8>) {
        out.reserve(zstd_safe::compress_bound(input.len()));
        let pos = out.len() as u64;
        let mut cursor = Cursor::new(out);
        cursor.set_position(pos);
        CCTX.with(|c| c.borrow_mut().compress(&mut cursor, input, self.level))
            .expect("zstd compression into a compress_bound buffer");
    }

    fn decompress(&self, input: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
        let len = match zstd_safe::get_frame_content_size(input) {
            Ok(Some(n)) if n <= MAX_BLOCK_LEN => n as usize,
            Ok(Some(_)) => return Err(CodecError::Corrupt("zstd: content size too large")),
            Ok(None) => return Err(CodecError::Corrupt("zstd: frame without content size")),
            Err(_) => return Err(CodecError::Corrupt("zstd: malformed frame header")),
        };
        let start = out.len();
        out.reserve(len);
        let mut cursor = Cursor::new(&mut *out);
        cursor.set_position(start as u64);
        let res = DCTX.with(|d| d.borrow_mut().decompress(&mut cursor, input));
        match res {
            Ok(n) if n == len && out.len() == start + len => Ok(()),
            Ok(_) => Err(CodecError::Corrupt(
                "zstd: decoded length differs from frame header",
            )),
            Err(_) => Err(CodecError::Corrupt("zstd: malformed frame")),
        }
    }
}
