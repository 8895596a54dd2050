//! Paging to disk: a swap file of page-sized slots, and the watermarks that
//! decide how much to evict.
//!
//! [`SwapFile`] creates its file (never an existing one), grows it in steps
//! of [`SwapConfig::grow_slots`] slots with `fallocate` — so a full disk is
//! reported when the file grows, before any data is at stake — and deletes
//! it on drop. Slots are found in a bitmap (first free, lowest first, so
//! the file stays dense). A slot holds one page or one compressed object
//! (compressed and patched pages are candidates too); its length and xxh3
//! checksum stay in memory, so `swap_in` verifies what it read: a slot
//! overwritten or truncated behind the store's back is an error, not wrong
//! data.
//!
//! Errors never lose data: `swap_out` returns the error (ENOSPC on a full
//! disk, EIO, a short write) with the slot released, and the caller still
//! has the page and keeps it; `swap_in` returns the error with the slot
//! still allocated, so the caller may retry or report. `O_DIRECT`
//! ([`SwapConfig::direct`]) bypasses the page cache: swapped pages then
//! really leave memory, at the device's cost per write — so evict in
//! batches ([`SwapFile::swap_out_batch`]: one write per run of consecutive
//! slots, 2.7 us per page instead of 21-51 us here); buffered writes
//! cost a copy into the page cache, which the kernel writes back and frees
//! later (the process footprint drops at once, the machine's memory only
//! after writeback). Both measured in docs/BENCHMARKS.md.
//!
//! [`Watermarks`]: Difference Engine's swapd policy on the process's
//! footprint. Above HIGH, evict until the footprint is at LOW, and not
//! again until it exceeds HIGH (hysteresis: no evict/restore oscillation
//! around one threshold). Swap-out requests (from a user, a cgroup memory
//! event) are hints: they add to the next eviction, bounded, and the engine
//! may satisfy them with any candidate page.
//!
//! The file's descriptor is reached only through [`SwapDescriptor`]: by
//! default the `File` itself; an embedder that must keep its descriptors out
//! of a program's way ([`SwapConfig::adopt`]) moves it to a number of its
//! choosing and checks it before each use.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use crate::{Error, PAGE};

/// A slot in the swap file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot(pub u32);

/// How every read, write and resize reaches the swap file.
pub trait SwapDescriptor: Send {
    /// Calls `f` with the open file, or returns an error without calling it
    /// (the descriptor is no longer the swap file's).
    fn with_file(&self, f: &mut dyn FnMut(&File) -> io::Result<()>) -> io::Result<()>;
}

impl SwapDescriptor for File {
    fn with_file(&self, f: &mut dyn FnMut(&File) -> io::Result<()>) -> io::Result<()> {
        f(self)
    }
}

/// Runs `f` on the file behind `d`; EBADF if `d` refused to call it.
fn on<R>(d: &dyn SwapDescriptor, mut f: impl FnMut(&File) -> io::Result<R>) -> io::Result<R> {
    let mut out = None;
    d.with_file(&mut |file| {
        out = Some(f(file)?);
        Ok(())
    })?;
    out.ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
}

/// Takes the newly created file and returns what every later use goes
/// through (see [`SwapConfig::adopt`]).
pub type AdoptSwap = fn(File) -> io::Result<Box<dyn SwapDescriptor>>;

#[derive(Debug, Clone)]
pub struct SwapConfig {
    pub path: PathBuf,
    /// Most slots the file may have (its largest size / 4 KiB).
    pub max_slots: u32,
    /// Slots added per growth of the file.
    pub grow_slots: u32,
    /// Open with O_DIRECT (falls back to buffered if refused).
    pub direct: bool,
    /// Where the descriptor goes once the file is created (None: the `File`
    /// is kept as it is). Failure to adopt fails the creation; the file is
    /// deleted.
    pub adopt: Option<AdoptSwap>,
}

impl SwapConfig {
    pub fn new(path: impl Into<PathBuf>) -> SwapConfig {
        SwapConfig {
            path: path.into(),
            max_slots: 1 << 22, // 16 GiB
            grow_slots: 256,    // 1 MiB
            direct: false,
            adopt: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct SlotMeta {
    len: u16,
    sum: u64,
}

/// A page-aligned buffer of whole pages for O_DIRECT I/O and batches.
struct AlignedPage(*mut u8, usize);

impl AlignedPage {
    fn new() -> io::Result<AlignedPage> {
        AlignedPage::pages(1)
    }
    fn pages(n: usize) -> io::Result<AlignedPage> {
        // SAFETY: anonymous mapping of n pages.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(AlignedPage(p as *mut u8, n * PAGE))
    }
    fn buf(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is self.1 bytes, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.0, self.1) }
    }
}

impl Drop for AlignedPage {
    fn drop(&mut self) {
        // SAFETY: mapped in `pages` with this length.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, self.1) };
    }
}

/// Most slots one write of [`SwapFile::swap_out_batch`] covers.
pub const BATCH_PAGES: usize = 64;

/// Counts of a swap file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwapStats {
    pub slots_used: u64,
    /// Slots the file has room for (allocated on disk).
    pub slots_allocated: u64,
    /// Bytes of data in used slots.
    pub data_bytes: u64,
    /// Bytes of the in-memory tables (bitmap, lengths and checksums) and
    /// staging buffers.
    pub metadata_bytes: u64,
}

/// Injected failures, for testing the error paths (EIO cannot be produced
/// on demand on every machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOn {
    Write,
    Read,
    Grow,
}

/// A swap file: see the module documentation.
pub struct SwapFile {
    file: Box<dyn SwapDescriptor>,
    path: PathBuf,
    direct: bool,
    max_slots: u32,
    grow_slots: u32,
    allocated: u32,
    bitmap: Vec<u64>,
    /// No free slot below this bitmap word.
    first_free_word: usize,
    meta: Vec<SlotMeta>,
    used: u32,
    data_bytes: u64,
    aligned: Option<AlignedPage>,
    /// Staging buffer of batches (BATCH_PAGES pages), made on first use.
    batch: Option<AlignedPage>,
    fail: Option<(FailOn, i32)>,
    /// Not deleted on drop (see [`SwapFile::abandon`]).
    keep_file: bool,
}

// SAFETY: the aligned buffer is owned and only used through `&mut self`.
unsafe impl Send for SwapFile {}

impl SwapFile {
    /// Creates the file at `cfg.path` (which must not exist).
    pub fn create(cfg: &SwapConfig) -> Result<SwapFile, Error> {
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.read(true).write(true).create_new(true).mode(0o600);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(&cfg.path)
        };
        let (file, direct) = match open(cfg.direct) {
            Ok(f) => (f, cfg.direct),
            // Filesystems without O_DIRECT refuse it with EINVAL.
            Err(e) if cfg.direct && e.raw_os_error() == Some(libc::EINVAL) => {
                let _ = std::fs::remove_file(&cfg.path);
                (open(false)?, false)
            }
            Err(e) => return Err(e.into()),
        };
        let adopted = match cfg.adopt {
            Some(adopt) => adopt(file),
            None => Ok(Box::new(file) as Box<dyn SwapDescriptor>),
        };
        let aligned = adopted.and_then(|file| {
            let aligned = if direct {
                Some(AlignedPage::new()?)
            } else {
                None
            };
            Ok((file, aligned))
        });
        let (file, aligned) = match aligned {
            Ok(x) => x,
            Err(e) => {
                let _ = std::fs::remove_file(&cfg.path);
                return Err(e.into());
            }
        };
        Ok(SwapFile {
            file,
            path: cfg.path.clone(),
            direct,
            max_slots: cfg.max_slots,
            grow_slots: cfg.grow_slots.max(1),
            allocated: 0,
            bitmap: Vec::new(),
            first_free_word: 0,
            meta: Vec::new(),
            used: 0,
            data_bytes: 0,
            aligned,
            batch: None,
            fail: None,
            keep_file: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file is really open with O_DIRECT.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Makes the next read, write or growth fail with `errno` (testing).
    pub fn fail_next(&mut self, on: FailOn, errno: i32) {
        self.fail = Some((on, errno));
    }

    fn injected(&mut self, on: FailOn) -> io::Result<()> {
        match self.fail {
            Some((f, errno)) if f == on => {
                self.fail = None;
                Err(io::Error::from_raw_os_error(errno))
            }
            _ => Ok(()),
        }
    }

    pub fn stats(&self) -> SwapStats {
        SwapStats {
            slots_used: self.used as u64,
            slots_allocated: self.allocated as u64,
            data_bytes: self.data_bytes,
            metadata_bytes: (self.bitmap.capacity() * 8
                + self.meta.capacity() * std::mem::size_of::<SlotMeta>()
                + self.aligned.as_ref().map_or(0, |a| a.1)
                + self.batch.as_ref().map_or(0, |a| a.1)) as u64,
        }
    }

    fn grow(&mut self) -> Result<(), Error> {
        if self.allocated >= self.max_slots {
            return Err(Error::Full("swap file at its maximum size"));
        }
        let add = self.grow_slots.min(self.max_slots - self.allocated);
        self.injected(FailOn::Grow)?;
        let off = self.allocated as i64 * PAGE as i64;
        let len = add as i64 * PAGE as i64;
        let r = on(&*self.file, |file| {
            // SAFETY: fallocate takes no pointer; it only extends the swap file
            // behind our own open descriptor.
            match unsafe { libc::fallocate(file.as_raw_fd(), 0, off, len) } {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            }
        });
        if let Err(e) = r {
            if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                // Give back what a partial fallocate may have taken.
                let keep = self.allocated as u64 * PAGE as u64;
                let _ = on(&*self.file, |file| file.set_len(keep));
                return Err(e.into());
            }
            // No fallocate here: extend the size; writes will tell.
            on(&*self.file, |file| file.set_len((off + len) as u64))?;
        }
        self.allocated += add;
        self.bitmap
            .resize((self.allocated as usize).div_ceil(64), 0);
        self.meta
            .resize(self.allocated as usize, SlotMeta::default());
        Ok(())
    }

    fn alloc_slot(&mut self) -> Result<u32, Error> {
        if self.used == self.allocated {
            self.grow()?;
        }
        let start = self.first_free_word;
        for (i, w) in self.bitmap.iter_mut().enumerate().skip(start) {
            if *w != u64::MAX {
                self.first_free_word = i;
                let b = (!*w).trailing_zeros();
                let s = i as u32 * 64 + b;
                if s < self.allocated {
                    *w |= 1 << b;
                    self.used += 1;
                    return Ok(s);
                }
            }
        }
        Err(Error::Full("swap bitmap"))
    }

    fn release_slot(&mut self, s: u32) {
        self.bitmap[s as usize / 64] &= !(1u64 << (s % 64));
        self.first_free_word = self.first_free_word.min(s as usize / 64);
        self.used -= 1;
    }

    fn is_used(&self, s: Slot) -> bool {
        s.0 < self.allocated && self.bitmap[s.0 as usize / 64] & (1 << (s.0 % 64)) != 0
    }

    /// Writes `data` (1..=4096 bytes: a page or a compressed object) to a
    /// free slot. On error nothing is kept: the caller still owns its page.
    pub fn swap_out(&mut self, data: &[u8]) -> Result<Slot, Error> {
        if data.is_empty() || data.len() > PAGE {
            return Err(Error::Length);
        }
        let s = self.alloc_slot()?;
        match self.write_slot(s, data) {
            Ok(()) => {
                self.meta[s as usize] = SlotMeta {
                    len: data.len() as u16,
                    sum: xxh3_64(data),
                };
                self.data_bytes += data.len() as u64;
                Ok(Slot(s))
            }
            Err(e) => {
                self.release_slot(s);
                Err(e)
            }
        }
    }

    /// Writes several pages or objects (each 1..=4096 bytes), one write
    /// per run of consecutive slots (at most [`BATCH_PAGES`] per write):
    /// with O_DIRECT the device's per-write latency is paid once per run,
    /// not per page. All or nothing: on any error no slot is kept and the
    /// caller still owns every page.
    pub fn swap_out_batch(&mut self, items: &[&[u8]]) -> Result<Vec<Slot>, Error> {
        if items.iter().any(|d| d.is_empty() || d.len() > PAGE) {
            return Err(Error::Length);
        }
        let mut slots: Vec<u32> = Vec::with_capacity(items.len());
        let mut result = Ok(());
        for _ in items {
            match self.alloc_slot() {
                Ok(s) => slots.push(s),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        let mut i = 0;
        while result.is_ok() && i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] == slots[j - 1] + 1 && j - i < BATCH_PAGES {
                j += 1;
            }
            result = if j - i == 1 {
                self.write_slot(slots[i], items[i])
            } else {
                self.write_run(slots[i], &items[i..j])
            };
            i = j;
        }
        if let Err(e) = result {
            for &s in &slots {
                self.release_slot(s);
            }
            return Err(e);
        }
        for (&s, d) in slots.iter().zip(items) {
            self.meta[s as usize] = SlotMeta {
                len: d.len() as u16,
                sum: xxh3_64(d),
            };
            self.data_bytes += d.len() as u64;
        }
        Ok(slots.into_iter().map(Slot).collect())
    }

    fn write_run(&mut self, first: u32, items: &[&[u8]]) -> Result<(), Error> {
        self.injected(FailOn::Write)?;
        let mut b = match self.batch.take() {
            Some(b) => b,
            None => AlignedPage::pages(BATCH_PAGES)?,
        };
        let buf = b.buf();
        for (k, d) in items.iter().enumerate() {
            let slot = &mut buf[k * PAGE..(k + 1) * PAGE];
            slot[..d.len()].copy_from_slice(d);
            slot[d.len()..].fill(0);
        }
        let data = &buf[..items.len() * PAGE];
        let r = on(&*self.file, |file| {
            file.write_all_at(data, first as u64 * PAGE as u64)
        });
        self.batch = Some(b);
        Ok(r?)
    }

    fn write_slot(&mut self, s: u32, data: &[u8]) -> Result<(), Error> {
        self.injected(FailOn::Write)?;
        let off = s as u64 * PAGE as u64;
        match self.aligned.as_mut() {
            Some(a) => {
                let buf = a.buf();
                buf[..data.len()].copy_from_slice(data);
                buf[data.len()..].fill(0);
                on(&*self.file, |file| file.write_all_at(buf, off))?;
            }
            None => on(&*self.file, |file| file.write_all_at(data, off))?,
        }
        Ok(())
    }

    /// Length of the data in `slot`.
    pub fn len_of(&self, slot: Slot) -> Result<usize, Error> {
        if !self.is_used(slot) {
            return Err(Error::BadHandle);
        }
        Ok(self.meta[slot.0 as usize].len as usize)
    }

    /// Reads `slot` into `out` (at least its length) and returns the
    /// length. The slot stays allocated (free it when the page is back).
    pub fn swap_in(&mut self, slot: Slot, out: &mut [u8]) -> Result<usize, Error> {
        let len = self.len_of(slot)?;
        if out.len() < len {
            return Err(Error::Length);
        }
        self.injected(FailOn::Read)?;
        let off = slot.0 as u64 * PAGE as u64;
        let m = self.meta[slot.0 as usize];
        match self.aligned.as_mut() {
            Some(a) => {
                let buf = a.buf();
                on(&*self.file, |file| file.read_exact_at(buf, off))?;
                out[..len].copy_from_slice(&buf[..len]);
            }
            None => on(&*self.file, |file| file.read_exact_at(&mut out[..len], off))?,
        }
        if xxh3_64(&out[..len]) != m.sum {
            return Err(Error::Corrupt("swap slot checksum mismatch"));
        }
        Ok(len)
    }

    /// Frees `slot`.
    pub fn free(&mut self, slot: Slot) -> Result<(), Error> {
        if !self.is_used(slot) {
            return Err(Error::BadHandle);
        }
        self.data_bytes -= self.meta[slot.0 as usize].len as u64;
        self.release_slot(slot.0);
        Ok(())
    }

    /// Closes the file without deleting it or touching its slots: in a
    /// forked child, whose copy of the swap file is its parent's file.
    pub fn abandon(mut self) {
        self.keep_file = true;
    }

    /// Gives the disk blocks of free slots at the end of the file back
    /// (truncate to the last used slot, rounded up to a growth step).
    pub fn shrink(&mut self) -> Result<(), Error> {
        let last = (0..self.allocated)
            .rev()
            .find(|&s| self.is_used(Slot(s)))
            .map_or(0, |s| s + 1);
        let keep = last.div_ceil(self.grow_slots) * self.grow_slots;
        if keep < self.allocated {
            on(&*self.file, |file| file.set_len(keep as u64 * PAGE as u64))?;
            self.allocated = keep;
            self.bitmap.truncate((keep as usize).div_ceil(64));
            self.first_free_word = self.first_free_word.min(self.bitmap.len());
            self.meta.truncate(keep as usize);
        }
        Ok(())
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if !self.keep_file {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// HIGH/LOW watermarks on the process footprint: see the module
/// documentation.
#[derive(Debug, Clone)]
pub struct Watermarks {
    high: u64,
    low: u64,
    evicting: bool,
    hinted: u64,
    max_hint: u64,
}

impl Watermarks {
    /// Watermarks in bytes; `low` must not exceed `high`.
    pub fn new(high: u64, low: u64) -> Result<Watermarks, String> {
        if low > high {
            return Err(format!("LOW watermark {low} above HIGH {high}"));
        }
        Ok(Watermarks {
            high,
            low,
            evicting: false,
            hinted: 0,
            max_hint: high.saturating_sub(low).max(PAGE as u64 * 256) / PAGE as u64,
        })
    }

    pub fn high(&self) -> u64 {
        self.high
    }

    pub fn low(&self) -> u64 {
        self.low
    }

    /// Whether the last call found the footprint above HIGH and it has
    /// not yet come down to LOW.
    pub fn is_evicting(&self) -> bool {
        self.evicting
    }

    /// A swap-out request for `pages` pages: added to the next eviction
    /// (at most max(HIGH - LOW, 1 MiB) worth of pages pending).
    pub fn hint(&mut self, pages: u64) {
        self.hinted = (self.hinted + pages).min(self.max_hint);
    }

    /// Pages to evict now, given the current footprint in bytes: while
    /// evicting (entered above HIGH), enough to reach LOW; otherwise only
    /// the pending hints. Consumes the hints.
    pub fn pages_to_evict(&mut self, footprint: u64) -> usize {
        if !self.evicting && footprint > self.high {
            self.evicting = true;
        } else if self.evicting && footprint <= self.low {
            self.evicting = false;
        }
        let need = if self.evicting {
            (footprint - self.low).div_ceil(PAGE as u64)
        } else {
            0
        };
        let hint = std::mem::take(&mut self.hinted);
        need.max(hint) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("pagefold-tier-{}-{name}", std::process::id()))
    }

    #[test]
    fn watermarks_have_hysteresis() {
        let mb = 1u64 << 20;
        let mut w = Watermarks::new(100 * mb, 80 * mb).unwrap();
        assert_eq!(w.pages_to_evict(90 * mb), 0, "below HIGH, not evicting");
        assert_eq!(w.pages_to_evict(101 * mb), (21 * mb / 4096) as usize);
        assert!(w.is_evicting());
        // Between LOW and HIGH while evicting: keep going down to LOW.
        assert_eq!(w.pages_to_evict(90 * mb), (10 * mb / 4096) as usize);
        assert_eq!(w.pages_to_evict(80 * mb), 0);
        assert!(!w.is_evicting());
        // Between LOW and HIGH after reaching LOW: nothing.
        assert_eq!(w.pages_to_evict(95 * mb), 0);
        w.hint(10);
        assert_eq!(w.pages_to_evict(95 * mb), 10);
        assert_eq!(w.pages_to_evict(95 * mb), 0, "hints are consumed");
        w.hint(u64::MAX / 2);
        assert_eq!(
            w.pages_to_evict(0),
            (20 * mb / 4096) as usize,
            "hints are bounded"
        );
        assert!(Watermarks::new(1, 2).is_err());
    }

    #[test]
    fn swap_round_trip_reuse_and_delete_on_drop() {
        let path = tmp("rt");
        let mut cfg = SwapConfig::new(&path);
        cfg.grow_slots = 4;
        let mut s = SwapFile::create(&cfg).unwrap();
        assert!(SwapFile::create(&cfg).is_err(), "never an existing file");
        let pages: Vec<Vec<u8>> = (0..10u8)
            .map(|i| vec![i; if i % 2 == 0 { PAGE } else { 100 + i as usize }])
            .collect();
        let slots: Vec<Slot> = pages.iter().map(|p| s.swap_out(p).unwrap()).collect();
        assert_eq!(s.stats().slots_allocated, 12);
        let mut out = vec![0u8; PAGE];
        for (p, &sl) in pages.iter().zip(&slots) {
            let n = s.swap_in(sl, &mut out).unwrap();
            assert_eq!(&out[..n], &p[..]);
        }
        s.free(slots[3]).unwrap();
        assert!(s.free(slots[3]).is_err());
        assert!(s.swap_in(slots[3], &mut out).is_err());
        assert_eq!(
            s.swap_out(b"x").unwrap(),
            slots[3],
            "lowest free slot reused"
        );
        for &sl in &slots {
            let _ = s.free(sl);
        }
        s.shrink().unwrap();
        assert_eq!(s.stats().slots_allocated, 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        drop(s);
        assert!(!path.exists());
    }

    #[test]
    fn injected_errors_keep_everything_consistent() {
        let path = tmp("inj");
        let mut s = SwapFile::create(&SwapConfig::new(&path)).unwrap();
        let a = s.swap_out(&[1u8; PAGE]).unwrap();
        s.fail_next(FailOn::Write, libc::EIO);
        let e = s.swap_out(&[2u8; PAGE]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert_eq!(s.stats().slots_used, 1, "failed write released its slot");
        s.fail_next(FailOn::Read, libc::EIO);
        let mut out = vec![0u8; PAGE];
        assert_eq!(
            s.swap_in(a, &mut out).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        // The slot is still there: retry works.
        s.swap_in(a, &mut out).unwrap();
        assert_eq!(out, vec![1u8; PAGE]);
    }

    #[test]
    fn batches_round_trip_and_fail_whole() {
        let path = tmp("batch");
        let mut cfg = SwapConfig::new(&path);
        cfg.grow_slots = 50;
        let mut s = SwapFile::create(&cfg).unwrap();
        let pages: Vec<Vec<u8>> = (0..150u32)
            .map(|i| vec![i as u8; 1 + (i as usize * 37) % PAGE])
            .collect();
        let refs: Vec<&[u8]> = pages.iter().map(|p| &p[..]).collect();
        let slots = s.swap_out_batch(&refs).unwrap();
        assert_eq!(slots.len(), 150);
        let mut out = vec![0u8; PAGE];
        for (p, &sl) in pages.iter().zip(&slots) {
            let n = s.swap_in(sl, &mut out).unwrap();
            assert_eq!(&out[..n], &p[..]);
        }
        // Holes: freed slots are reused, runs split around used slots.
        for &sl in slots.iter().step_by(3) {
            s.free(sl).unwrap();
        }
        let more = s.swap_out_batch(&refs[..60]).unwrap();
        for (p, &sl) in pages.iter().zip(&more) {
            let n = s.swap_in(sl, &mut out).unwrap();
            assert_eq!(&out[..n], &p[..]);
        }
        let used = s.stats().slots_used;
        s.fail_next(FailOn::Write, libc::EIO);
        assert_eq!(
            s.swap_out_batch(&refs).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        assert_eq!(s.stats().slots_used, used, "a failed batch keeps no slot");
        assert!(matches!(s.swap_out_batch(&[&[][..]]), Err(Error::Length)));
    }

    #[test]
    fn tampered_slot_is_detected() {
        let path = tmp("tamper");
        let mut s = SwapFile::create(&SwapConfig::new(&path)).unwrap();
        let a = s.swap_out(&[5u8; PAGE]).unwrap();
        let b = s.swap_out(&[6u8; 300]).unwrap();
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(b"!", a.0 as u64 * PAGE as u64 + 17).unwrap();
        let mut out = vec![0u8; PAGE];
        assert!(matches!(s.swap_in(a, &mut out), Err(Error::Corrupt(_))));
        // Truncated behind our back: a short read is an error too.
        f.set_len(b.0 as u64 * PAGE as u64 + 10).unwrap();
        assert!(s.swap_in(b, &mut out).is_err());
    }
}
