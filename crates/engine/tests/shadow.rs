//! Shadow-model property test: every byte read from engine memory must equal
//! what plain memory would hold after the same operations.
//!
//! Several worker threads each own a set of blocks and run a seeded random
//! sequence of alloc / write / plain page duplication / engine copy (equal and
//! unequal page offsets, odd lengths, sub-ranges, copies of copies, same-block
//! disjoint and overlapping) / compare / free / scan, mirroring every write in
//! a `Vec<u8>` per block. A background thread scans the whole engine in a
//! loop meanwhile (or the engine's own `scan_interval` scanner does), so
//! merges, zero folds and divergence releases happen under the workers' feet.
//! Workers write the same few page patterns, and zero whole pages, so the
//! scanner always has pages to merge (across threads too) and to fold.
//!
//! The eviction variants (`shadow_evict*`) mix in `Engine::evict` of random
//! page ranges by the workers and of all engine memory by the background
//! thread between its scans, so pages leave memory and come back (on a touch,
//! a copy, a system call of the scanner...) under every other operation.
//!
//! Scale and reproduce with the environment:
//! - `PAGEFOLD_SHADOW_OPS`: operations per test (split over the workers);
//!   default 6000, sized for CI in a debug build. Long run for the docs:
//!   `PAGEFOLD_SHADOW_OPS=10000000 cargo test --release -p pagefold-engine --test shadow`.
//! - `PAGEFOLD_SHADOW_SEED`: the seed (printed by every test and in every
//!   failure message). The op sequence is reproduced exactly; the
//!   interleaving with the scanner is not, so rerun a few times.
//! - `PAGEFOLD_SHADOW_THREADS`: worker threads (default 3).

#![allow(dead_code)] // Op fields are read through Debug in failure reports.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagefold_engine::{Config, Engine, Hint, Stats, Tier, PAGE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const MAX_BLOCKS: usize = 8;
const MAX_PAGES: usize = 64;
const PATTERNS: usize = 6;
const LOG: usize = 48;
/// A worker that makes no progress for this long is reported as hung
/// (a page left write-protected, a lost wake-up).
const STALL: Duration = Duration::from_secs(60);

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.trim().parse().ok())
}

/// Content of pattern `p` (one page); the same in every thread so the
/// scanner merges across blocks and threads.
fn pattern(p: usize) -> Vec<u8> {
    (0..PAGE)
        .map(|i| {
            ((i as u32).wrapping_mul(2 * p as u32 + 7) ^ (i as u32 >> 8) ^ (p as u32 * 0x5b)) as u8
                | 1
        })
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        blk: u64,
        len: usize,
        hint: Hint,
        ptr: usize,
    },
    Free {
        blk: u64,
    },
    WriteByte {
        blk: u64,
        off: usize,
        val: u8,
    },
    WriteRun {
        blk: u64,
        off: usize,
        len: usize,
    },
    FillPages {
        blk: u64,
        page: usize,
        n: usize,
        pat: usize,
    },
    ZeroPages {
        blk: u64,
        page: usize,
        n: usize,
    },
    /// memset to zero as the preload makes it: offered to the engine
    /// (`Engine::zero`), set plainly if it declines.
    ZeroRange {
        blk: u64,
        off: usize,
        len: usize,
    },
    DupPage {
        src: u64,
        spage: usize,
        dst: u64,
        dpage: usize,
    },
    Copy {
        kind: &'static str,
        dst: u64,
        doff: usize,
        src: u64,
        soff: usize,
        len: usize,
    },
    Compare {
        blk: u64,
        off: usize,
        len: usize,
    },
    CopyOut {
        blk: u64,
        off: usize,
        len: usize,
    },
    CopyIn {
        blk: u64,
        off: usize,
        len: usize,
    },
    BogusFree {
        blk: u64,
    },
    Discard {
        blk: u64,
        page: usize,
        n: usize,
    },
    Shrink {
        blk: u64,
        len: usize,
    },
    Exempt {
        blk: u64,
    },
    Evict {
        blk: u64,
        page: usize,
        n: usize,
    },
    Scan,
}

impl Op {
    fn touches(&self, id: u64) -> bool {
        match *self {
            Op::Alloc { blk, .. }
            | Op::Free { blk }
            | Op::WriteByte { blk, .. }
            | Op::WriteRun { blk, .. }
            | Op::FillPages { blk, .. }
            | Op::ZeroPages { blk, .. }
            | Op::ZeroRange { blk, .. }
            | Op::Compare { blk, .. }
            | Op::CopyOut { blk, .. }
            | Op::CopyIn { blk, .. }
            | Op::BogusFree { blk }
            | Op::Discard { blk, .. }
            | Op::Shrink { blk, .. }
            | Op::Evict { blk, .. }
            | Op::Exempt { blk } => blk == id,
            Op::DupPage { src, dst, .. } | Op::Copy { src, dst, .. } => src == id || dst == id,
            Op::Scan => false,
        }
    }
}

struct Blk {
    id: u64,
    ptr: *mut u8,
    len: usize,
    shadow: Vec<u8>,
    log: VecDeque<(u64, Op)>,
}

#[derive(Clone)]
struct Opts {
    name: &'static str,
    threads: usize,
    ops: u64,
    /// A thread calling engine.scan() in a loop (else rely on cfg.scan_interval).
    scanner_thread: bool,
    /// Workers evict random ranges, and the scanner thread evicts all engine memory between scans.
    evict: bool,
    seed: u64,
}

impl Opts {
    fn new(name: &'static str) -> Opts {
        let seed = env_u64("PAGEFOLD_SHADOW_SEED").unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
        });
        Opts {
            name,
            threads: env_u64("PAGEFOLD_SHADOW_THREADS").unwrap_or(3).max(1) as usize,
            ops: env_u64("PAGEFOLD_SHADOW_OPS").unwrap_or(6000),
            scanner_thread: true,
            evict: false,
            seed,
        }
    }
}

/// Invariants visible from outside, checked after every scan.
fn check_stats(s: &Stats, ctx: &str) {
    // Recycled blocks keep their frames while they wait for reuse, and
    // patches keep their reference frames after every page let go of them.
    let live_pages = (s.block_bytes + s.recycled_bytes + s.reference_bytes) / PAGE as u64;
    assert!(
        s.frames_in_use <= live_pages,
        "{ctx}: frames_in_use {} exceeds live pages {live_pages}: {s:?}",
        s.frames_in_use
    );
    assert!(
        s.pages_sharing <= live_pages,
        "{ctx}: pages_sharing {} exceeds live pages {live_pages}: {s:?}",
        s.pages_sharing
    );
    assert!(
        s.frames_resident <= s.frames_in_use,
        "{ctx}: {} frames resident but only {} in use (leaked frames): {s:?}",
        s.frames_resident,
        s.frames_in_use
    );
    assert!(
        s.vmas_used >= s.blocks,
        "{ctx}: fewer mappings than blocks: {s:?}"
    );
}

struct Worker {
    tid: usize,
    seed: u64,
    rng: StdRng,
    engine: Engine,
    blocks: Vec<Blk>,
    next_id: u64,
    op_no: u64,
    log: VecDeque<(u64, Op)>,
    patterns: Arc<Vec<Vec<u8>>>,
    scratch: Vec<u8>,
    test: &'static str,
    evict: bool,
    /// Lowest and highest address of any block so far (what the scanner thread evicts).
    span: Arc<(AtomicU64, AtomicU64)>,
}

fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: the pointer and length describe a live block of this test, which outlives every use
    // of the slice.
    unsafe { std::slice::from_raw_parts(p, len) }
}

impl Worker {
    fn record(&mut self, op: Op) {
        let n = self.op_no;
        for b in self.blocks.iter_mut().filter(|b| op.touches(b.id)) {
            if b.log.len() == LOG {
                b.log.pop_front();
            }
            b.log.push_back((n, op.clone()));
        }
        if self.log.len() == LOG {
            self.log.pop_front();
        }
        self.log.push_back((n, op));
    }

    fn fail(&self, what: &str, bi: Option<usize>) -> ! {
        let mut m = String::new();
        let _ = writeln!(
            m,
            "[{}] thread {} op #{}: {what}\n  reproduce: PAGEFOLD_SHADOW_SEED={} (thread seed {:#x})",
            self.test,
            self.tid,
            self.op_no,
            self.seed,
            self.seed ^ self.tid as u64
        );
        let _ = writeln!(m, "  engine stats: {:?}", self.engine.stats());
        if let Some(bi) = bi {
            let b = &self.blocks[bi];
            let _ = writeln!(
                m,
                "  block #{} at {:p}, len {} ({} pages); its last ops:",
                b.id,
                b.ptr,
                b.len,
                b.len.div_ceil(PAGE)
            );
            for (n, op) in &b.log {
                let _ = writeln!(m, "    #{n}: {op:?}");
            }
        }
        let _ = writeln!(m, "  thread's last ops:");
        for (n, op) in self
            .log
            .iter()
            .rev()
            .take(16)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            let _ = writeln!(m, "    #{n}: {op:?}");
        }
        panic!("{m}");
    }

    /// Compares `[off, off+len)` of block `bi` with its shadow.
    fn compare(&self, bi: usize, off: usize, len: usize, why: &str) {
        let b = &self.blocks[bi];
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        let got = bytes(unsafe { b.ptr.add(off) }, len);
        let want = &b.shadow[off..off + len];
        if got == want {
            return;
        }
        let first = (0..len).find(|&i| got[i] != want[i]).unwrap() + off;
        let bad = (0..len).filter(|&i| got[i] != want[i]).count();
        let pg = first / PAGE;
        let pstart = pg * PAGE;
        let pend = (pstart + PAGE).min(b.len);
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        let page_now = bytes(unsafe { b.ptr.add(pstart) }, pend - pstart);
        let page_zero = page_now.iter().all(|&x| x == 0);
        let page_pat = (0..PATTERNS).find(|&p| page_now == &self.patterns[p][..pend - pstart]);
        let lo = first.saturating_sub(4).max(off);
        let hi = (first + 12).min(off + len);
        let msg = format!(
            "{why}: block #{} differs from plain memory in range [{off}, {}): first at byte {first} \
             (page {pg} + {}), {bad} bytes differ; got {:02x?} want {:02x?} at [{lo}, {hi}); \
             that page now reads all-zero: {page_zero}, as pattern: {page_pat:?}; shadow page all-zero: {}",
            b.id,
            off + len,
            first % PAGE,
            &bytes(b.ptr, b.len)[lo..hi],
            &b.shadow[lo..hi],
            b.shadow[pstart..pend].iter().all(|&x| x == 0),
        );
        self.fail(&msg, Some(bi));
    }

    fn verify_all(&self, why: &str) {
        for bi in 0..self.blocks.len() {
            self.compare(bi, 0, self.blocks[bi].len, why);
        }
    }

    fn alloc(&mut self) {
        let pages = self.rng.gen_range(1..=MAX_PAGES);
        let len = match self.rng.gen_range(0..4) {
            0 => pages * PAGE,
            1 => pages * PAGE - self.rng.gen_range(1..PAGE),
            _ => (pages * PAGE - self.rng.gen_range(0..PAGE)) | 1,
        };
        let hint = match self.rng.gen_range(0..10) {
            0..=2 => Hint::FullWrite,
            // Uninit may return a recycled block holding what it held when freed.
            3..=5 => Hint::Uninit,
            6..=7 => Hint::Zeroed,
            _ => Hint::None,
        };
        let ptr = self.engine.alloc(len, hint);
        let id = self.next_id;
        self.next_id += 1;
        self.record(Op::Alloc {
            blk: id,
            len,
            hint,
            ptr: ptr as usize,
        });
        if ptr.is_null() {
            self.fail(&format!("alloc({len}, {hint:?}) returned null"), None);
        }
        if !(ptr as usize).is_multiple_of(PAGE) {
            self.fail(&format!("alloc returned unaligned {ptr:p}"), None);
        }
        match self.engine.block_len(ptr) {
            Some(l) if l >= len => {}
            other => self.fail(
                &format!("block_len({ptr:p}) = {other:?} for a block of {len} bytes"),
                None,
            ),
        }
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        if !self.engine.owns(unsafe { ptr.add(len - 1) }) {
            self.fail(
                &format!("engine does not own the last byte of block {ptr:p}+{len}"),
                None,
            );
        }
        self.span.0.fetch_min(ptr as u64, Ordering::Relaxed);
        self.span
            .1
            .fetch_max(ptr as u64 + len as u64, Ordering::Relaxed);
        let mut log = VecDeque::new();
        log.push_back((self.op_no, self.log.back().unwrap().1.clone()));
        let shadow = match hint {
            Hint::Uninit => bytes(ptr, len).to_vec(),
            _ => vec![0u8; len],
        };
        self.blocks.push(Blk {
            id,
            ptr,
            len,
            shadow,
            log,
        });
        let bi = self.blocks.len() - 1;
        self.compare(bi, 0, len, "fresh block not zero-filled");
    }

    fn free(&mut self, bi: usize) {
        self.compare(bi, 0, self.blocks[bi].len, "before free");
        let id = self.blocks[bi].id;
        self.record(Op::Free { blk: id });
        let b = self.blocks.swap_remove(bi);
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        if !unsafe { self.engine.free(b.ptr) } {
            self.blocks.push(b);
            let last = self.blocks.len() - 1;
            self.fail("free() returned false for a live block", Some(last));
        }
    }

    fn pick(&mut self) -> usize {
        self.rng.gen_range(0..self.blocks.len())
    }

    /// A random sub-range `[off, off+len)` of a block of `blen` bytes, len >= 1.
    fn range(&mut self, blen: usize, max: usize) -> (usize, usize) {
        let len = self.rng.gen_range(1..=max.min(blen));
        let off = self.rng.gen_range(0..=blen - len);
        (off, len)
    }

    fn write_byte(&mut self) {
        let bi = self.pick();
        let b = &self.blocks[bi];
        let off = self.rng.gen_range(0..b.len);
        let val: u8 = if self.rng.gen_bool(0.2) {
            0
        } else {
            self.rng.gen()
        };
        self.record(Op::WriteByte {
            blk: self.blocks[bi].id,
            off,
            val,
        });
        let b = &mut self.blocks[bi];
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe { b.ptr.add(off).write(val) };
        b.shadow[off] = val;
    }

    fn write_run(&mut self) {
        let bi = self.pick();
        let (off, len) = self.range(self.blocks[bi].len, 3 * PAGE);
        self.scratch.clear();
        if self.rng.gen_bool(0.5) {
            let v: u8 = self.rng.gen();
            self.scratch.resize(len, v);
        } else {
            let rng = &mut self.rng;
            self.scratch.extend((0..len).map(|_| rng.gen::<u8>()));
        }
        self.record(Op::WriteRun {
            blk: self.blocks[bi].id,
            off,
            len,
        });
        let b = &mut self.blocks[bi];
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(self.scratch.as_ptr(), b.ptr.add(off), len) };
        b.shadow[off..off + len].copy_from_slice(&self.scratch);
    }

    /// Whole pages `[page, page+n)` of a block, clipped to its length.
    fn pages(&mut self, bi: usize) -> (usize, usize) {
        let np = self.blocks[bi].len.div_ceil(PAGE);
        let n = self.rng.gen_range(1..=np.min(16));
        let page = self.rng.gen_range(0..=np - n);
        (page, n)
    }

    fn fill_pages(&mut self) {
        let bi = self.pick();
        let (page, n) = self.pages(bi);
        let pat = self.rng.gen_range(0..PATTERNS);
        self.record(Op::FillPages {
            blk: self.blocks[bi].id,
            page,
            n,
            pat,
        });
        let b = &mut self.blocks[bi];
        for p in page..page + n {
            let end = ((p + 1) * PAGE).min(b.len);
            let src = &self.patterns[pat][..end - p * PAGE];
            // SAFETY: source and destination are distinct live buffers of this test, each at least
            // the length copied.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), b.ptr.add(p * PAGE), src.len()) };
            b.shadow[p * PAGE..end].copy_from_slice(src);
        }
    }

    fn zero_pages(&mut self) {
        if self.rng.gen_range(0..2) == 0 {
            return self.zero_range();
        }
        let bi = self.pick();
        let (page, n) = self.pages(bi);
        self.record(Op::ZeroPages {
            blk: self.blocks[bi].id,
            page,
            n,
        });
        let b = &mut self.blocks[bi];
        let (s, e) = (page * PAGE, ((page + n) * PAGE).min(b.len));
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        unsafe { std::ptr::write_bytes(b.ptr.add(s), 0, e - s) };
        b.shadow[s..e].fill(0);
    }

    /// memset(0) of any byte range as the preload routes it: the engine
    /// leaves out the pages that read zero already, or declines.
    fn zero_range(&mut self) {
        let bi = self.pick();
        let blen = self.blocks[bi].len;
        let len = self.rng.gen_range(1..=blen);
        let off = self.rng.gen_range(0..=blen - len);
        self.record(Op::ZeroRange {
            blk: self.blocks[bi].id,
            off,
            len,
        });
        let b = &mut self.blocks[bi];
        // SAFETY: the range lies inside a live block this test allocated, and
        // no reference to those bytes exists during the access.
        unsafe {
            if !self.engine.zero(b.ptr.add(off), len) {
                std::ptr::write_bytes(b.ptr.add(off), 0, len);
            }
        }
        b.shadow[off..off + len].fill(0);
    }

    /// madvise(MADV_DONTNEED) as the preload does it: the engine discards its
    /// pages and hands back the rest (plain anonymous pages) for the kernel.
    fn discard(&mut self) {
        let bi = self.pick();
        let (page, n) = self.pages(bi);
        self.record(Op::Discard {
            blk: self.blocks[bi].id,
            page,
            n,
        });
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        let addr = unsafe { self.blocks[bi].ptr.add(page * PAGE) };
        for (s, l) in self.engine.discard(addr, n * PAGE) {
            if s < addr as usize || s + l > addr as usize + n * PAGE {
                self.fail(
                    &format!("discard handed back [{s:#x}, +{l}) outside its range"),
                    Some(bi),
                );
            }
            // SAFETY: the range is a live block of this test; the call changes or reads only that
            // range (a mincore vector has one byte per page).
            unsafe { libc::madvise(s as *mut libc::c_void, l, libc::MADV_DONTNEED) };
        }
        let b = &mut self.blocks[bi];
        let (s, e) = (page * PAGE, ((page + n) * PAGE).min(b.len));
        b.shadow[s..e].fill(0);
        self.compare(bi, s, e - s, "after discard (must read zero)");
    }

    /// realloc to a smaller size: the block keeps the pages covering `len`.
    fn shrink(&mut self) {
        let bi = self.pick();
        if self.blocks[bi].len < 2 {
            return;
        }
        let len = self.rng.gen_range(1..self.blocks[bi].len);
        self.record(Op::Shrink {
            blk: self.blocks[bi].id,
            len,
        });
        let b = &mut self.blocks[bi];
        if !self.engine.shrink(b.ptr, len) {
            self.fail("shrink refused", Some(bi));
        }
        b.len = len;
        b.shadow.truncate(len);
        let want = len.div_ceil(PAGE) * PAGE;
        let got = self.engine.block_len(self.blocks[bi].ptr);
        if got != Some(want) {
            self.fail(
                &format!("block_len {got:?} after shrink to {len}, want {want}"),
                Some(bi),
            );
        }
        self.compare(bi, 0, len, "after shrink");
    }

    /// What mprotect or MADV_DONTFORK through the preload does first.
    fn exempt(&mut self) {
        let bi = self.pick();
        self.record(Op::Exempt {
            blk: self.blocks[bi].id,
        });
        if !self.engine.exempt(self.blocks[bi].ptr, 1) {
            self.fail("exempt found no block", Some(bi));
        }
        self.compare(bi, 0, self.blocks[bi].len, "after exempt");
    }

    /// A plain memcpy of one page onto another (the scan then has identical
    /// pages to merge).
    fn dup_page(&mut self) {
        let (si, di) = (self.pick(), self.pick());
        let (full_s, full_d) = (self.blocks[si].len / PAGE, self.blocks[di].len / PAGE);
        if full_s == 0 || full_d == 0 {
            return;
        }
        let sp = self.rng.gen_range(0..full_s);
        let dp = self.rng.gen_range(0..full_d);
        if si == di && sp == dp {
            return;
        }
        self.record(Op::DupPage {
            src: self.blocks[si].id,
            spage: sp,
            dst: self.blocks[di].id,
            dpage: dp,
        });
        let (s, d) = (self.blocks[si].ptr, self.blocks[di].ptr);
        // SAFETY: source and destination are distinct live buffers of this test, each at least the
        // length copied.
        unsafe { std::ptr::copy_nonoverlapping(s.add(sp * PAGE), d.add(dp * PAGE), PAGE) };
        let tmp = self.blocks[si].shadow[sp * PAGE..(sp + 1) * PAGE].to_vec();
        self.blocks[di].shadow[dp * PAGE..(dp + 1) * PAGE].copy_from_slice(&tmp);
    }

    /// engine.copy between two (possibly equal) blocks, mirrored with memmove semantics.
    fn do_copy(
        &mut self,
        kind: &'static str,
        si: usize,
        soff: usize,
        di: usize,
        doff: usize,
        len: usize,
    ) {
        self.record(Op::Copy {
            kind,
            dst: self.blocks[di].id,
            doff,
            src: self.blocks[si].id,
            soff,
            len,
        });
        let (s, d) = (self.blocks[si].ptr, self.blocks[di].ptr);
        // SAFETY: both ranges lie inside live blocks this test allocated, each at least the length
        // copied.
        unsafe { self.engine.copy(d.add(doff), s.add(soff), len) };
        if si == di {
            self.blocks[si].shadow.copy_within(soff..soff + len, doff);
        } else {
            let tmp = self.blocks[si].shadow[soff..soff + len].to_vec();
            self.blocks[di].shadow[doff..doff + len].copy_from_slice(&tmp);
        }
        // The destination range right away, and the source (it may have been frozen).
        self.compare(di, doff, len, "copy destination right after copy");
        if si != di {
            self.compare(si, soff, len, "copy source right after copy");
        }
    }

    fn copy_between(&mut self, equal: bool) {
        let (si, di) = (self.pick(), self.pick());
        let (slen, dlen) = (self.blocks[si].len, self.blocks[di].len);
        if si == di {
            return self.copy_same_block(si, false);
        }
        let max = slen.min(dlen);
        let (soff, len) = match self.rng.gen_range(0..4) {
            // Whole pages at page-aligned offsets.
            0 if max >= PAGE => {
                let n = self.rng.gen_range(1..=max / PAGE);
                let sp = self.rng.gen_range(0..=slen / PAGE - n);
                (sp * PAGE, n * PAGE)
            }
            // Whole-page length at an odd offset.
            1 if max > PAGE => {
                let n = self.rng.gen_range(1..=(max - 1) / PAGE);
                let soff = self.rng.gen_range(0..=slen - n * PAGE);
                (soff, n * PAGE)
            }
            // Sub-page.
            2 => {
                let (o, l) = self.range(slen, PAGE - 1);
                (o, l.min(dlen))
            }
            // Anything up to the whole block, odd.
            _ => {
                let (o, l) = self.range(slen, max);
                (o, l)
            }
        };
        if len > dlen || soff + len > slen {
            return;
        }
        let doff = if equal {
            let r = soff % PAGE;
            if r + len > dlen {
                return;
            }
            self.rng.gen_range(0..=(dlen - len - r) / PAGE) * PAGE + r
        } else {
            let mut d = self.rng.gen_range(0..=dlen - len);
            if d % PAGE == soff % PAGE {
                if d < dlen - len {
                    d += 1;
                } else if d > 0 {
                    d -= 1;
                } else {
                    return;
                }
            }
            d
        };
        self.do_copy(
            if equal {
                "equal-offset"
            } else {
                "unequal-offset"
            },
            si,
            soff,
            di,
            doff,
            len,
        );
    }

    fn copy_same_block(&mut self, bi: usize, overlap: bool) {
        let blen = self.blocks[bi].len;
        if blen < 2 {
            return;
        }
        if overlap {
            let (soff, len) = self.range(blen, blen.min(6 * PAGE));
            let lo = soff.saturating_sub(len - 1);
            let hi = (soff + len - 1).min(blen - len);
            let doff = if self.rng.gen_bool(0.5) && soff >= PAGE && soff - PAGE >= lo {
                soff - PAGE // overlapping by whole pages at an equal page offset
            } else {
                self.rng.gen_range(lo..=hi)
            };
            return self.do_copy("same-block-overlapping", bi, soff, bi, doff, len);
        }
        let len = self.rng.gen_range(1..=blen / 2);
        let soff = self.rng.gen_range(0..=blen - len);
        // Disjoint destinations: before the source or after it.
        let mut cands = Vec::new();
        if soff >= len {
            cands.push((0, soff - len));
        }
        if soff + 2 * len <= blen {
            cands.push((soff + len, blen - len));
        }
        if cands.is_empty() {
            return;
        }
        let (lo, hi) = cands[self.rng.gen_range(0..cands.len())];
        let mut doff = self.rng.gen_range(lo..=hi);
        if self.rng.gen_bool(0.6) {
            // Prefer an equal page offset, so whole pages can be shared.
            let r = soff % PAGE;
            let aligned = doff - doff % PAGE + r;
            if aligned >= lo && aligned <= hi {
                doff = aligned;
            }
        }
        self.do_copy("same-block-disjoint", bi, soff, bi, doff, len);
    }

    /// engine.copy to or from plain (non-engine) memory: always a plain copy.
    fn copy_external(&mut self) {
        let bi = self.pick();
        let (off, len) = self.range(self.blocks[bi].len, 6 * PAGE);
        let ptr = self.blocks[bi].ptr;
        if self.rng.gen_bool(0.5) {
            self.record(Op::CopyOut {
                blk: self.blocks[bi].id,
                off,
                len,
            });
            let mut out = vec![0u8; len];
            // SAFETY: both ranges lie inside live blocks this test allocated, each at least the
            // length copied.
            unsafe { self.engine.copy(out.as_mut_ptr(), ptr.add(off), len) };
            if out[..] != self.blocks[bi].shadow[off..off + len] {
                self.compare(bi, off, len, "source of a copy out to plain memory");
                self.fail(
                    "a copy out to plain memory produced other bytes than the block holds",
                    Some(bi),
                );
            }
        } else {
            self.record(Op::CopyIn {
                blk: self.blocks[bi].id,
                off,
                len,
            });
            let rng = &mut self.rng;
            // Half the time the destination's even pages get zeros, which a
            // sparse copy leaves out where the page reads zero already.
            let sparse = rng.gen_bool(0.5);
            let data: Vec<u8> = (0..len)
                .map(|i| {
                    if sparse && ((off + i) / PAGE).is_multiple_of(2) {
                        0
                    } else {
                        rng.gen()
                    }
                })
                .collect();
            // SAFETY: both ranges lie inside live blocks this test allocated, each at least the
            // length copied.
            unsafe { self.engine.copy(ptr.add(off), data.as_ptr(), len) };
            self.blocks[bi].shadow[off..off + len].copy_from_slice(&data);
            self.compare(bi, off, len, "copy in from plain memory");
        }
    }

    /// free() of an address that is not a block's start must refuse and change nothing.
    fn bogus_free(&mut self) {
        let bi = self.pick();
        let b = &self.blocks[bi];
        if b.len <= PAGE {
            return;
        }
        // SAFETY: the address lies inside a live block this test allocated, and no reference to
        // those bytes exists during the access.
        let inside = unsafe {
            b.ptr
                .add(PAGE * self.rng.gen_range(1..b.len.div_ceil(PAGE)))
        };
        self.record(Op::BogusFree {
            blk: self.blocks[bi].id,
        });
        // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
        // after this free.
        if unsafe { self.engine.free(inside) } {
            self.fail(
                "free() of an address inside a block returned true",
                Some(bi),
            );
        }
        if self.engine.block_len(self.blocks[bi].ptr).is_none() {
            self.fail(
                "the block vanished after a refused free() of an inner address",
                Some(bi),
            );
        }
    }

    fn compare_random(&mut self) {
        let bi = self.pick();
        let (off, len) = if self.rng.gen_bool(0.3) {
            (0, self.blocks[bi].len)
        } else {
            self.range(self.blocks[bi].len, 5 * PAGE)
        };
        self.record(Op::Compare {
            blk: self.blocks[bi].id,
            off,
            len,
        });
        self.compare(bi, off, len, "read");
    }

    /// Evicts some pages of a block (a hint: nothing may change for the program).
    fn evict(&mut self) {
        let bi = self.pick();
        let (page, n) = self.pages(bi);
        self.record(Op::Evict {
            blk: self.blocks[bi].id,
            page,
            n,
        });
        let r = self
            .engine
            // SAFETY: the address lies inside a live block this test allocated, and no reference to
            // those bytes exists during the access.
            .evict(unsafe { self.blocks[bi].ptr.add(page * PAGE) }, n * PAGE);
        if r.unavailable {
            self.fail(&format!("evict unavailable: {r:?}"), Some(bi));
        }
        if self.rng.gen_bool(0.5) {
            let b = &self.blocks[bi];
            let (s, e) = (page * PAGE, ((page + n) * PAGE).min(b.len));
            self.compare(bi, s, e - s, "right after evict");
        }
    }

    fn scan(&mut self) {
        self.record(Op::Scan);
        self.engine.scan();
        check_stats(
            &self.engine.stats(),
            &format!("[{}] thread {} after its scan", self.test, self.tid),
        );
    }

    fn step(&mut self) {
        let r = self.rng.gen_range(0..104);
        match r {
            _ if self.blocks.is_empty() => self.alloc(),
            0..=5 if self.blocks.len() < MAX_BLOCKS => self.alloc(),
            0..=9 if self.blocks.len() > 1 => {
                let bi = self.pick();
                self.free(bi)
            }
            0..=9 => self.alloc(),
            10..=17 => self.write_byte(),
            18..=25 => self.write_run(),
            26..=35 => self.fill_pages(),
            36..=41 => self.zero_pages(),
            42..=47 => self.dup_page(),
            48..=61 => self.copy_between(true),
            62..=67 => self.copy_between(false),
            68..=71 => {
                let bi = self.pick();
                self.copy_same_block(bi, false)
            }
            72..=74 => {
                let bi = self.pick();
                self.copy_same_block(bi, true)
            }
            75..=79 => self.copy_external(),
            80 => self.bogus_free(),
            81..=92 => self.compare_random(),
            93..=96 if self.evict => self.evict(),
            100..=101 => self.discard(),
            102 => self.shrink(),
            103 if self.rng.gen_bool(0.5) => self.exempt(),
            103 => self.discard(),
            _ => self.scan(),
        }
        self.op_no += 1;
        if self.op_no.is_multiple_of(200) {
            self.verify_all("periodic full check");
        }
    }
}

// SAFETY: Worker holds raw pointers into blocks the test owns; every thread that gets it only
// touches those blocks while the test keeps them alive.
unsafe impl Send for Worker {}

/// Runs the shadow workload; returns the engine's stats after every block
/// was freed and every scanner stopped.
fn run(cfg: Config, o: Opts) -> (Stats, Stats) {
    eprintln!(
        "[{}] PAGEFOLD_SHADOW_SEED={} ops={} threads={} cfg={cfg:?}",
        o.name, o.seed, o.ops, o.threads
    );
    let engine = Engine::new(cfg);
    let stop = Arc::new(AtomicBool::new(false));
    let patterns = Arc::new((0..PATTERNS).map(pattern).collect::<Vec<_>>());
    let progress: Arc<Vec<AtomicU64>> =
        Arc::new((0..o.threads).map(|_| AtomicU64::new(0)).collect());

    let span = Arc::new((AtomicU64::new(u64::MAX), AtomicU64::new(0)));
    let scanner = o.scanner_thread.then(|| {
        let (e, stop, name, seed) = (engine.clone(), stop.clone(), o.name, o.seed);
        let (evict, span) = (o.evict, span.clone());
        std::thread::spawn(move || {
            let mut scans = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let (lo, hi) = (
                    span.0.load(Ordering::Relaxed),
                    span.1.load(Ordering::Relaxed),
                );
                if evict && lo < hi {
                    e.evict(lo as *const u8, (hi - lo) as usize);
                }
                e.scan();
                scans += 1;
                // Let program threads at the engine lock between scans (std's Mutex is not fair).
                std::thread::yield_now();
                check_stats(
                    &e.stats(),
                    &format!("[{name}] seed {seed}: background scan #{scans}"),
                );
            }
            scans
        })
    });

    let per_thread = o.ops.div_ceil(o.threads as u64);
    let workers: Vec<_> = (0..o.threads)
        .map(|tid| {
            let mut w = Worker {
                tid,
                seed: o.seed,
                rng: StdRng::seed_from_u64(o.seed ^ tid as u64),
                engine: engine.clone(),
                blocks: Vec::new(),
                next_id: 0,
                op_no: 0,
                log: VecDeque::new(),
                patterns: patterns.clone(),
                scratch: Vec::new(),
                test: o.name,
                evict: o.evict,
                span: span.clone(),
            };
            let (stop, progress) = (stop.clone(), progress.clone());
            std::thread::spawn(move || {
                for _ in 0..per_thread {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    w.step();
                    progress[tid].fetch_add(1, Ordering::Relaxed);
                }
                w.verify_all("final check");
                while !w.blocks.is_empty() {
                    w.free(w.blocks.len() - 1);
                }
                w.op_no
            })
        })
        .collect();

    // Watch for failures and for workers that stop making progress (a page
    // left write-protected would put a writer to sleep for good).
    let mut last: Vec<(u64, Instant)> = (0..o.threads).map(|_| (0, Instant::now())).collect();
    let mut failures = Vec::new();
    let mut handles: Vec<Option<_>> = workers.into_iter().map(Some).collect();
    while handles.iter().any(Option::is_some) {
        std::thread::sleep(Duration::from_millis(20));
        for tid in 0..o.threads {
            let Some(h) = &handles[tid] else { continue };
            if h.is_finished() {
                if let Err(p) = handles[tid].take().unwrap().join() {
                    stop.store(true, Ordering::Relaxed);
                    failures.push(panic_text(&p));
                }
                continue;
            }
            let now = progress[tid].load(Ordering::Relaxed);
            if now != last[tid].0 {
                last[tid] = (now, Instant::now());
            } else if last[tid].1.elapsed() > STALL {
                stop.store(true, Ordering::Relaxed);
                // No engine call here: the stuck worker may hold the engine lock.
                panic!(
                    "[{}] seed {}: worker {tid} made no progress for {STALL:?} after {now} ops: \
                     it is stuck (a write to engine memory never returns?)",
                    o.name, o.seed,
                );
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(s) = scanner {
        if let Err(p) = s.join() {
            failures.push(panic_text(&p));
        }
    }
    if !failures.is_empty() {
        panic!("{}", failures.join("\n----\n"));
    }
    let before_stop = engine.stats();
    engine.stop_background();
    // Recycled blocks go at the first scan after their age limit.
    std::thread::sleep(Duration::from_millis(300));
    engine.scan();
    let s = engine.stats();
    eprintln!("[{}] final stats: {s:?}", o.name);
    let ctx = format!("[{}] seed {}: after freeing every block", o.name, o.seed);
    assert_eq!(s.blocks, 0, "{ctx}: {s:?}");
    assert_eq!(s.block_bytes, 0, "{ctx}: {s:?}");
    assert_eq!(s.frames_in_use, 0, "{ctx}: frames still referenced: {s:?}");
    assert_eq!(
        s.frames_resident, 0,
        "{ctx}: frames still resident (not punched): {s:?}"
    );
    assert_eq!(s.pages_sharing, 0, "{ctx}: {s:?}");
    assert_eq!(
        s.vmas_used, 0,
        "{ctx}: the engine's mapping count drifted: {s:?}"
    );
    assert_eq!(
        (s.evicted_now, s.store.pages, s.restore_errors),
        (0, 0, 0),
        "{ctx}: evicted pages or stored copies left, or a restore went wrong: {s:?}"
    );
    assert_eq!(
        s.unprotect_gaps, 0,
        "{ctx}: a range was unprotected past a mapping not registered, so \
         protection could outlive it: {s:?}"
    );
    (before_stop, s)
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into())
}

fn exercised(s: &Stats, name: &str) {
    assert!(
        s.pages_shared_by_copy > 0,
        "[{name}] no page was ever shared by copy: {s:?}"
    );
    assert!(s.merged > 0, "[{name}] the scan never merged a page: {s:?}");
    assert!(
        s.zero_folded > 0,
        "[{name}] the scan never folded a zero page: {s:?}"
    );
    assert!(
        s.diverged_released > 0,
        "[{name}] no diverged page was ever released: {s:?}"
    );
    assert!(s.scans > 0, "[{name}] no scan completed: {s:?}");
    assert!(
        s.discarded > 0,
        "[{name}] no engine page was ever discarded: {s:?}"
    );
    assert!(s.exempted > 0, "[{name}] no block was ever exempted: {s:?}");
}

#[test]
fn shadow_default() {
    let (_, s) = run(Config::default(), Opts::new("default"));
    exercised(&s, "default");
    assert!(s.protected_scan && s.frames_active, "{s:?}");
}

fn evicting(name: &'static str) -> Opts {
    let mut o = Opts::new(name);
    o.evict = true;
    o
}

fn exercised_eviction(s: &Stats, name: &str) {
    exercised(s, name);
    assert!(s.evicted > 0, "[{name}] nothing was evicted: {s:?}");
    assert!(
        s.restored > 0,
        "[{name}] no evicted page was ever touched: {s:?}"
    );
    assert!(
        s.evicted_dropped > 0,
        "[{name}] no evicted page was ever freed or overwritten: {s:?}"
    );
}

#[test]
fn shadow_evict() {
    let (_, s) = run(Config::default(), evicting("evict"));
    exercised_eviction(&s, "evict");
}

#[test]
fn shadow_evict_small_chunks_recycling() {
    // Chunks of 3 pages: evicted runs, scan chunks and registrations cut
    // each other everywhere; recycled blocks come back to Uninit allocations.
    let cfg = Config {
        scan_chunk_pages: 3,
        recycle_bytes: 2 << 20,
        ..Config::default()
    };
    let (_, s) = run(cfg, evicting("evict_chunk3"));
    exercised_eviction(&s, "evict_chunk3");
}

#[test]
fn shadow_evict_small_vma_budget() {
    // Evicted runs cost mappings: some evictions must be refused by the budget.
    let cfg = Config {
        vma_budget: Some(40),
        ..Config::default()
    };
    let (_, s) = run(cfg, evicting("evict_vma40"));
    assert!(s.evicted > 0 && s.fallbacks.vma_budget > 0, "{s:?}");
}

#[test]
fn shadow_tier() {
    // Every scan a clock pass, C4 after one quiet pass: the policy evicts
    // pages under the workers' feet, and their touches restore them.
    let cfg = Config {
        tier: Tier::On,
        clock_interval: Duration::ZERO,
        cold_passes: 1,
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("tier"));
    exercised(&s, "tier");
    assert!(
        s.clock.total.evicted > 0,
        "[tier] the policy evicted nothing: {:?}",
        s.clock
    );
    assert!(s.restored > 0, "[tier] no evicted page was touched: {s:?}");
}

#[test]
fn shadow_tier_pin_age() {
    // As the preload runs: a pin age, so owned pages are frozen and diverged
    // and owned zero pages held write-protected before they are folded or
    // merged, while the policy evicts under the workers' feet.
    let cfg = Config {
        tier: Tier::On,
        clock_interval: Duration::ZERO,
        cold_passes: 1,
        pin_age: Duration::from_millis(5),
        pin_grace: Duration::from_micros(200),
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("tier_pin_age"));
    exercised(&s, "tier_pin_age");
    assert!(s.pin_held > 0, "[tier_pin_age] no page was held: {s:?}");
    assert_eq!(
        (s.unprotect_gaps, s.restore_errors),
        (0, 0),
        "[tier_pin_age] an unprotect met a mapping not registered, or a restore found \
         its page present: {s:?}"
    );
    assert!(
        s.clock.total.evicted > 0 && s.restored > 0,
        "[tier_pin_age] the policy evicted nothing, or nothing was touched: {s:?}"
    );
}

#[test]
fn shadow_small_scan_chunks() {
    let cfg = Config {
        scan_chunk_pages: 3,
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("chunk3"));
    exercised(&s, "chunk3");
}

#[test]
fn shadow_recycling() {
    // Freed blocks come back to Uninit allocations (as under the preload);
    // a small budget makes them turn over often.
    let cfg = Config {
        recycle_bytes: 2 << 20,
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("recycle"));
    exercised(&s, "recycle");
    assert!(
        s.recycled > 0,
        "no allocation was served by a recycled block: {s:?}"
    );
    assert!(
        s.recycled_joined > 0,
        "no allocation was served by recycled blocks laid side by side: {s:?}"
    );
}

#[test]
fn shadow_single_page_chunks() {
    let cfg = Config {
        scan_chunk_pages: 1,
        ..Config::default()
    };
    let mut o = Opts::new("chunk1");
    o.ops /= 2;
    let (_, s) = run(cfg, o);
    exercised(&s, "chunk1");
}

#[test]
fn shadow_background_interval_scanner() {
    // The engine's own scanner thread, at full CPU budget, instead of ours.
    let cfg = Config {
        scan_interval: Some(Duration::from_millis(1)),
        scan_cpu_budget: 1.0,
        ..Config::default()
    };
    let mut o = Opts::new("scan_interval");
    o.scanner_thread = false;
    let (s, _) = run(cfg, o);
    assert!(s.scans > 0, "the background scanner never ran: {s:?}");
}

#[test]
fn shadow_tiny_vma_budget() {
    // Fewer mappings than the blocks alone need: every remap must fall back.
    let cfg = Config {
        vma_budget: Some(12),
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("vma_budget12"));
    assert!(
        s.fallbacks.vma_budget > 0,
        "tiny VMA budget never hit: {s:?}"
    );
}

#[test]
fn shadow_small_vma_budget() {
    // Room for some remaps but not all: fallbacks in the middle of copies and scans.
    let cfg = Config {
        vma_budget: Some(40),
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("vma_budget40"));
    assert!(
        s.fallbacks.vma_budget > 0,
        "small VMA budget never hit: {s:?}"
    );
}

#[test]
fn shadow_merge_disabled() {
    let cfg = Config {
        merge: false,
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("no_merge"));
    assert_eq!(s.merged, 0, "merge is off but pages were merged: {s:?}");
    assert!(s.zero_folded > 0 && s.pages_shared_by_copy > 0, "{s:?}");
}

#[test]
fn shadow_zero_disabled() {
    let cfg = Config {
        zero: false,
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("no_zero"));
    assert_eq!(
        s.zero_folded, 0,
        "zero folding is off but pages were folded: {s:?}"
    );
    assert!(s.merged > 0 && s.pages_shared_by_copy > 0, "{s:?}");
}

#[test]
fn shadow_copy_disabled() {
    let cfg = Config {
        copy: false,
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("no_copy"));
    assert_eq!(
        s.pages_shared_by_copy, 0,
        "virtual copy is off but pages were shared by copy: {s:?}"
    );
    assert!(s.merged > 0 && s.zero_folded > 0, "{s:?}");
}

#[test]
fn shadow_frames_disabled() {
    // Plain anonymous blocks: only zero folding has anything to do.
    let cfg = Config {
        frames: false,
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("no_frames"));
    assert!(!s.frames_active, "{s:?}");
    assert_eq!(s.pages_shared_by_copy, 0, "{s:?}");
    assert!(s.zero_folded > 0, "{s:?}");
}

#[test]
fn zero_length_alloc_is_one_page() {
    let e = Engine::new(Config::default());
    let p = e.alloc(0, Hint::None);
    assert!(!p.is_null());
    assert_eq!(e.block_len(p), Some(PAGE));
    assert!(bytes(p, PAGE).iter().all(|&b| b == 0));
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { p.write(7) };
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(unsafe { e.free(p) });
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    assert!(!unsafe { e.free(p) }, "double free accepted");
    let s = e.stats();
    assert_eq!((s.blocks, s.frames_in_use), (0, 0), "{s:?}");
}

/// Pages that agree on every byte the scan samples for its first-level index
/// but differ elsewhere (sparse pages, one byte apart): none may merge with
/// another, and each must still merge with its exact duplicate.
#[test]
fn near_duplicates_merge_only_with_exact_duplicates() {
    let e = Engine::new(Config::default());
    let n = 128;
    let a = e.alloc(2 * n * PAGE, Hint::FullWrite);
    let page = |k: usize| {
        // All zero but one byte at 100 + k: outside the lines starting at
        // multiples of 576, so every such page has the same sample.
        let mut v = vec![0u8; PAGE];
        v[100 + k] = 0xAB;
        v[PAGE - 1 - k] = k as u8 | 1;
        v
    };
    let mut want = vec![0u8; 2 * n * PAGE];
    for k in 0..n {
        let v = page(k);
        want[k * PAGE..(k + 1) * PAGE].copy_from_slice(&v);
        want[(n + k) * PAGE..(n + k + 1) * PAGE].copy_from_slice(&v);
    }
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), a, want.len()) };
    // The first scan only looks (volatility check); the second merges.
    e.scan();
    let r = e.scan();
    assert!(
        bytes(a, want.len()) == &want[..],
        "contents changed by the scan: {r:?}"
    );
    assert_eq!(
        r.merged, n as u64,
        "each of {n} pages has exactly one duplicate: {r:?}"
    );
    // A second block with the same contents merges onto the stable frames.
    let b = e.alloc(n * PAGE, Hint::FullWrite);
    // SAFETY: source and destination are distinct live buffers of this test, each at least the
    // length copied.
    unsafe { std::ptr::copy_nonoverlapping(want.as_ptr(), b, n * PAGE) };
    e.scan();
    let r2 = e.scan();
    assert!(bytes(b, n * PAGE) == &want[..n * PAGE], "{r2:?}");
    assert_eq!(
        r2.merged, n as u64,
        "the second block should merge page for page: {r2:?}"
    );
    // The merged pages stay independent.
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    unsafe { *a.add(5 * PAGE + 100 + 5) = 0 };
    want[5 * PAGE + 100 + 5] = 0;
    assert!(bytes(a, want.len()) == &want[..]);
    // SAFETY: the address lies inside a live block this test allocated, and no reference to those
    // bytes exists during the access.
    assert_eq!(unsafe { *b.add(5 * PAGE + 105) }, 0xAB);
    let s = e.stats();
    assert!(
        s.frames_in_use <= (n + 2) as u64,
        "about one frame per distinct page: {s:?}"
    );
    // SAFETY: the pointer is a block this test got from the engine's alloc, and nothing uses it
    // after this free.
    unsafe {
        e.free(a);
        e.free(b);
    }
    assert_eq!(e.stats().frames_in_use, 0);
}

#[test]
fn shadow_fresh_anonymous() {
    // Every block starts anonymous: copies adopt their sources onto frames,
    // merges materialize anonymous partners as runs.
    let cfg = Config {
        fresh: pagefold_engine::Fresh::Anon,
        copy_through: true,
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("fresh_anon"));
    exercised(&s, "fresh_anon");
    assert!(s.pages_adopted > 0, "{s:?}");
    assert!(
        s.zero_pages_not_copied > 0,
        "no sparse copy left a page out: {s:?}"
    );
    assert!(
        s.zero_pages_not_written > 0,
        "no zeroing left a page out: {s:?}"
    );
}

#[test]
fn shadow_fresh_anonymous_without_pin_guard() {
    // As above, without UFFDIO_MOVE: no source is adopted, every copy out of
    // anonymous memory is written through.
    let cfg = Config {
        fresh: pagefold_engine::Fresh::Anon,
        copy_through: true,
        pin_guard: false,
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("fresh_anon_no_guard"));
    exercised(&s, "fresh_anon_no_guard");
    assert_eq!(s.pages_adopted, 0, "{s:?}");
    assert!(s.pages_copied_through > 0, "{s:?}");
}

#[test]
fn shadow_fresh_adaptive() {
    let cfg = Config {
        fresh: pagefold_engine::Fresh::Adaptive,
        copy_through: true,
        copy_learn: true,
        ..Config::default()
    };
    let (_, s) = run(cfg, Opts::new("fresh_adaptive"));
    exercised(&s, "fresh_adaptive");
}
