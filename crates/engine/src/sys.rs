//! Thin wrappers over the system calls the engine uses, each returning
//! `io::Result`, plus the fault injection that lets tests force the failure
//! of any of them. Nothing here allocates on the heap, so the preload can call
//! these from inside malloc.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::fds::Fd;

/// The page size the engine works in.
pub const PAGE: usize = 4096;

/// How many more engine mmaps may succeed before injected ENOMEM (u64::MAX: unlimited).
static MMAP_ALLOWANCE: AtomicU64 = AtomicU64::new(u64::MAX);

pub fn set_mmap_allowance(n: Option<u64>) {
    MMAP_ALLOWANCE.store(n.unwrap_or(u64::MAX), Ordering::SeqCst);
}

fn take_mmap_allowance() -> bool {
    MMAP_ALLOWANCE
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
            u64::MAX => Some(u64::MAX),
            0 => None,
            n => Some(n - 1),
        })
        .is_ok()
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

pub fn memfd_create(name: &std::ffi::CStr) -> io::Result<i32> {
    // SAFETY: name is a valid NUL-terminated C string borrowed for the call; memfd_create only
    // reads it.
    check(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })
}

pub fn ftruncate(fd: i32, len: u64) -> io::Result<()> {
    // SAFETY: ftruncate takes plain integers; a bad fd is reported as an error, not undefined
    // behaviour.
    check(unsafe { libc::ftruncate(fd, len as libc::off_t) }).map(|_| ())
}

/// Frees the frames `[frame, frame + n)`: afterwards they read as zero.
pub fn punch(fd: Fd, frame: u64, n: u64) -> io::Result<()> {
    fd.with(|fd| punch_raw(fd, frame, n))
}

fn punch_raw(fd: i32, frame: u64, n: u64) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let off = (frame * PAGE as u64) as libc::off_t;
    // SAFETY: fallocate takes plain integers; a bad fd or range is reported as an error.
    check(unsafe { libc::fallocate(fd, mode, off, (n * PAGE as u64) as libc::off_t) }).map(|_| ())
}

/// Reads frame `frame` of a memfd into `out` (no allocation: the fault
/// thread uses it). A hole reads as zero; false on any error or short read.
pub fn pread_frame(fd: Fd, frame: u64, out: &mut [u8; PAGE]) -> bool {
    fd.with(|fd| Ok(pread_frame_raw(fd, frame, out)))
        .unwrap_or(false)
}

fn pread_frame_raw(fd: i32, frame: u64, out: &mut [u8; PAGE]) -> bool {
    let off = (frame * PAGE as u64) as libc::off_t;
    let mut done = 0usize;
    while done < PAGE {
        // SAFETY: out[done..] is a live, exclusively borrowed buffer of PAGE - done bytes, the
        // length passed to pread.
        let r = unsafe {
            libc::pread(
                fd,
                out[done..].as_mut_ptr().cast(),
                PAGE - done,
                off + done as libc::off_t,
            )
        };
        match r {
            n if n > 0 => done += n as usize,
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => return false,
        }
    }
    true
}

/// Writes `len` bytes from `buf` at offset `off` of `fd`.
///
/// `buf` must be valid for reads of `len` bytes.
pub fn pwrite_all(fd: Fd, buf: *const u8, len: usize, off: u64) -> io::Result<()> {
    fd.with(|fd| pwrite_all_raw(fd, buf, len, off))
}

fn pwrite_all_raw(fd: i32, buf: *const u8, len: usize, off: u64) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: the caller passes a buf valid for reads of len bytes (this function's
        // contract); buf.add(done) with done < len stays inside it, and len - done bytes from
        // there are readable.
        let r = unsafe {
            libc::pwrite(
                fd,
                buf.add(done).cast(),
                len - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += r as usize;
    }
    Ok(())
}

/// Maps `len` bytes; `fixed` replaces whatever is mapped at `addr`.
/// No `fd` maps anonymous memory.
pub fn map(
    addr: *mut u8,
    len: usize,
    fd: Option<Fd>,
    frame: u64,
    shared: bool,
    fixed: bool,
) -> io::Result<*mut u8> {
    if !take_mmap_allowance() {
        return Err(io::Error::from_raw_os_error(libc::ENOMEM));
    }
    map_uninjected(addr, len, fd, frame, shared, fixed)
}

/// `map` without fault injection: for replacing a whole existing mapping,
/// which needs no new VMA and so has no ENOMEM to simulate.
pub fn map_uninjected(
    addr: *mut u8,
    len: usize,
    fd: Option<Fd>,
    frame: u64,
    shared: bool,
    fixed: bool,
) -> io::Result<*mut u8> {
    match fd {
        Some(f) => f.with(|fd| map_raw(addr, len, fd, frame, shared, fixed)),
        None => map_raw(addr, len, -1, frame, shared, fixed),
    }
}

fn map_raw(
    addr: *mut u8,
    len: usize,
    fd: i32,
    frame: u64,
    shared: bool,
    fixed: bool,
) -> io::Result<*mut u8> {
    let mut flags = if shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    if fd < 0 {
        flags |= libc::MAP_ANONYMOUS;
    }
    if fixed {
        flags |= libc::MAP_FIXED;
    }
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let off = (frame * PAGE as u64) as libc::off_t;
    // SAFETY: mmap with these arguments creates a new mapping or (MAP_FIXED) replaces the
    // caller's own mapping at addr, which the caller owns; no Rust reference points into it
    // here.
    let p = unsafe { libc::mmap(addr.cast(), len, prot, flags, fd, off) };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p.cast())
    }
}

/// A read-only shared view of the frame pool, for the scanner.
pub fn map_window(fd: i32, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a fresh read-only shared mapping at an address the kernel picks: it touches no
    // existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(p.cast())
    }
}

pub fn unmap(addr: *mut u8, len: usize) {
    // SAFETY: the caller passes a range it mapped and no longer uses; munmap of other addresses
    // fails with an error and is ignored here by design.
    unsafe { libc::munmap(addr.cast(), len) };
}

/// Spare mappings the engine can give up when the process has none left to
/// make (`vm.max_map_count`), so that it can make the few it needs (a
/// temporary mapping, malloc's) to give more back. `SPARE_MAPPINGS`
/// inaccessible pages with a hole between each two, so that no two merge and
/// unmapping each frees one mapping. Returns the first page; page `2i` is
/// spare `i`.
pub fn map_spares() -> Option<*mut u8> {
    let len = 2 * SPARE_MAPPINGS * PAGE;
    // SAFETY: a new private anonymous mapping at an address the kernel picks;
    // no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    let p: *mut u8 = p.cast();
    for i in 0..SPARE_MAPPINGS {
        // SAFETY: the odd pages of the mapping just made, which nothing uses.
        unsafe { libc::munmap(p.add((2 * i + 1) * PAGE).cast(), PAGE) };
    }
    Some(p)
}

/// Gives up the spares `map_spares` made at `p`.
pub fn unmap_spares(p: *mut u8) {
    for i in 0..SPARE_MAPPINGS {
        // SAFETY: the spare pages made by map_spares at p, used by nothing.
        unsafe { libc::munmap(p.add(2 * i * PAGE).cast(), PAGE) };
    }
}

pub const SPARE_MAPPINGS: usize = 8;

pub fn try_unmap(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller passes a range it mapped and no longer uses; errors are returned.
    check(unsafe { libc::munmap(addr.cast(), len) }).map(|_| ())
}

/// True if frame `frame` of `fd` holds no data (a hole: reads zero). Unlike
/// mincore, a frame swapped out still counts as data (and so does any frame
/// of a descriptor that is no longer ours).
pub fn is_hole(fd: Fd, frame: u64) -> bool {
    fd.with(|fd| Ok(is_hole_raw(fd, frame))).unwrap_or(false)
}

fn is_hole_raw(fd: i32, frame: u64) -> bool {
    let off = (frame * PAGE as u64) as libc::off_t;
    // SAFETY: lseek takes plain integers; a bad fd is reported as an error.
    let next = unsafe { libc::lseek(fd, off, libc::SEEK_DATA) };
    // ENXIO: no data at or after `off`. Any other error: assume data.
    next >= off + PAGE as libc::off_t
        || (next < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO))
}

/// For each of the `n` frames of `fd` from `first`, whether it is a hole
/// (as `is_hole`, swapped frames count as data): a SEEK_DATA and a SEEK_HOLE
/// per run of data, so a run of fresh frames costs one call.
pub fn holes(fd: Fd, first: u64, n: usize) -> Vec<bool> {
    let mut out = vec![false; n];
    let _ = fd.with(|fd| {
        let seek = |off: u64, whence: i32| {
            // SAFETY: lseek takes plain integers; a bad fd is reported as an error.
            let r = unsafe { libc::lseek(fd, (off * PAGE as u64) as libc::off_t, whence) };
            let enxio = r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO);
            // ENXIO: no data at or after `off`; any other error: data.
            match r {
                r if r >= 0 => Some(r as u64 / PAGE as u64),
                _ if enxio => None,
                _ => Some(off),
            }
        };
        let end = first + n as u64;
        let mut at = first;
        while at < end {
            let data = seek(at, libc::SEEK_DATA).unwrap_or(end).min(end);
            out[(at - first) as usize..(data - first) as usize].fill(true);
            if data >= end {
                break;
            }
            // The data runs to the next hole (or the end of the file).
            at = seek(data, libc::SEEK_HOLE).unwrap_or(end).max(data + 1);
        }
        Ok(())
    });
    out
}

/// The system call itself, not libc's `madvise`: a preload that interposes
/// `madvise` must not see the engine's own calls.
pub fn madvise(addr: *mut u8, len: usize, advice: i32) -> io::Result<()> {
    // SAFETY: madvise only changes how the kernel backs the caller's own range (the caller owns
    // addr..addr+len); a bad range is an error.
    let r = unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice as libc::c_long) };
    check(r as libc::c_int).map(|_| ())
}

/// Moves the mapping at `from` over `[to, to+len)`, replacing what was there.
/// Counts against the injected mmap allowance as `map` does (a move that
/// splits the source mapping needs a new one).
pub fn mremap_fixed(from: *mut u8, len: usize, to: *mut u8) -> io::Result<()> {
    if !take_mmap_allowance() {
        return Err(io::Error::from_raw_os_error(libc::ENOMEM));
    }
    let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
    // SAFETY: the caller owns both ranges; mremap moves its mapping over `to`, where nothing
    // else holds references.
    let p = unsafe { libc::mremap(from.cast(), len, len, flags, to as *mut libc::c_void) };
    if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Residency of the frames behind `len` bytes of a file mapping (mincore looks
/// into the page cache even for pages this mapping has never touched).
pub fn mincore(addr: *mut u8, len: usize, out: &mut [u8]) -> io::Result<()> {
    // SAFETY: out is a live, exclusively borrowed buffer; the callers size it to one byte per
    // page of len.
    check(unsafe { libc::mincore(addr.cast(), len, out.as_mut_ptr()) }).map(|_| ())
}

pub fn max_map_count() -> usize {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65_530)
}

/// Opens a file read-only and moves the descriptor into the engine's range.
/// Only ever called at engine start or in a child right after fork: every
/// later read goes through the kept descriptor, so the engine's background
/// threads never hold a descriptor at a number the program could see.
/// A descriptor the engine can do without (`spare`) is not kept where it
/// would take one of the program's numbers (`fds::adopt_spare`).
fn open_own(path: &std::ffi::CStr, spare: bool) -> io::Result<crate::fds::Fd> {
    // SAFETY: path is a NUL-terminated C string that outlives the call.
    let fd = check(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    if spare {
        crate::fds::adopt_spare(fd)
    } else {
        crate::fds::adopt(fd)
    }
}

fn c_path(path: &std::path::Path) -> io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A file the engine reads again and again (a /proc or cgroup file) through
/// one descriptor in the engine's range (`open_own`), opened once: each read
/// from offset 0 asks the kernel afresh, and no read opens a file.
pub struct KeptFile {
    fd: crate::fds::Fd,
}

impl KeptFile {
    /// Opens `path` (at engine start, or in a child right after fork).
    pub fn open(path: &std::path::Path) -> io::Result<KeptFile> {
        Ok(KeptFile {
            fd: open_own(&c_path(path)?, false)?,
        })
    }

    /// As `open`, for a file the engine can do without: refused (EMFILE)
    /// where its descriptor would take one of the program's numbers.
    pub fn open_spare(path: &std::path::Path) -> io::Result<KeptFile> {
        Ok(KeptFile {
            fd: open_own(&c_path(path)?, true)?,
        })
    }

    /// The descriptor's number (for tests).
    #[cfg(test)]
    pub fn number(&self) -> i32 {
        self.fd.number()
    }

    /// pread(2) of the kept descriptor into `buf` at `off`; the bytes read.
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.fd.with(|fd| loop {
            // SAFETY: buf is a live, exclusively borrowed buffer of buf.len() bytes.
            let r =
                unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off as libc::off_t) };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        })
    }

    /// The whole file as text, as the kernel writes it now.
    pub fn text(&self) -> Option<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = self.read_at(&mut buf, out.len() as u64).ok()?;
            if n == 0 {
                return String::from_utf8(out).ok();
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    /// In a child right after fork, while no other thread exists: points the
    /// kept descriptor at `path` opened afresh (a /proc/self file opened by
    /// the parent still describes the parent). On an error the descriptor
    /// stays as it was and the caller stops reading it.
    pub fn reopen_in_child(&self, path: &std::path::Path) -> io::Result<()> {
        let c = c_path(path)?;
        // SAFETY: c is a NUL-terminated C string that outlives the call.
        let n = check(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
        self.fd.replace_in_child(n)
    }
}

impl Drop for KeptFile {
    fn drop(&mut self) {
        // Opened in KeptFile::open and owned by this KeptFile only: closed once, here.
        self.fd.close();
    }
}

/// Counts the process's mappings (lines of /proc/self/maps) through one
/// descriptor kept for the engine's life.
pub struct ProcMaps {
    file: KeptFile,
}

impl ProcMaps {
    pub fn open() -> io::Result<ProcMaps> {
        Ok(ProcMaps {
            file: KeptFile::open(std::path::Path::new("/proc/self/maps"))?,
        })
    }

    /// Mappings the process has now; 0 if the file cannot be read. Allocates
    /// nothing: it is asked when the process may be out of mappings, and so
    /// out of the mappings malloc would need.
    pub fn count(&self) -> usize {
        let mut buf = [0u8; 4096];
        let (mut lines, mut off) = (0, 0u64);
        while let Ok(n) = self.file.read_at(&mut buf, off) {
            if n == 0 {
                break;
            }
            lines += buf[..n].iter().filter(|&&b| b == b'\n').count();
            off += n as u64;
        }
        lines
    }
}

/// The process's resident memory, now and at its highest: `VmRSS` and
/// `VmHWM` of `/proc/self/status`, one read through one descriptor kept for
/// the engine's life.
///
/// The highest is the address space's own. getrusage's maxrss is not: the
/// kernel carries it across execve, so a program started by a large
/// process would start with that process's peak as its own.
pub struct Resident {
    status: KeptFile,
}

impl Resident {
    /// Opens the status file; refused where its descriptor would take one
    /// of the program's numbers (the engine can do without it).
    pub fn open() -> io::Result<Resident> {
        Ok(Resident {
            status: KeptFile::open_spare(std::path::Path::new("/proc/self/status"))?,
        })
    }

    /// Bytes resident now and at the highest; None if the file cannot be
    /// read. Allocates nothing (it is asked from inside malloc).
    pub fn read(&self) -> Option<(usize, usize)> {
        let mut buf = [0u8; 4096];
        let n = self.status.read_at(&mut buf, 0).ok()?;
        status_resident(std::str::from_utf8(&buf[..n]).ok()?)
    }
}

/// `VmRSS` and `VmHWM` of a /proc/PID/status text, in bytes.
pub fn status_resident(text: &str) -> Option<(usize, usize)> {
    let kib = |key: &str| -> Option<usize> {
        let line = text.lines().find_map(|l| l.strip_prefix(key))?;
        line.split_whitespace().next()?.parse().ok()
    };
    Some((kib("VmRSS:")? * 1024, kib("VmHWM:")? * 1024))
}

/// Reads whether ksmd runs (`/sys/kernel/mm/ksm/run` is 1) through one
/// descriptor kept for the engine's life: each read at offset 0 asks the
/// kernel afresh, and no scan opens a file (a descriptor opened at the
/// moment a program forks would show in its child).
pub struct KsmRun {
    file: KeptFile,
}

impl KsmRun {
    pub fn open() -> io::Result<KsmRun> {
        Ok(KsmRun {
            file: KeptFile::open(std::path::Path::new("/sys/kernel/mm/ksm/run"))?,
        })
    }

    /// Whether ksmd merges now; false if the file cannot be read.
    pub fn running(&self) -> bool {
        let mut buf = [0u8; 8];
        self.file
            .read_at(&mut buf, 0)
            .is_ok_and(|r| r > 0 && buf[0] == b'1' && (r == 1 || buf[1] == b'\n'))
    }
}

pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a live local timespec that clock_gettime fills in.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time of the whole process (every thread), in nanoseconds.
pub fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec the call writes into.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The program break now (the end of glibc's main heap; heap.rs). glibc
/// keeps the value it last set, so asking costs no system call.
pub fn program_break() -> usize {
    // SAFETY: sbrk(0) moves nothing; it returns the current break.
    unsafe { libc::sbrk(0) as usize }
}

/// Pagemap flags for a range of our own pages.
pub struct Pagemap {
    fd: Fd,
}

pub const PM_PRESENT: u64 = 1 << 63;
pub const PM_SWAP: u64 = 1 << 62;
pub const PM_FILE: u64 = 1 << 61;
/// Mapped by this page table alone: a page of its own, not the shared zero page.
pub const PM_MMAP_EXCLUSIVE: u64 = 1 << 56;

impl Pagemap {
    pub fn open() -> io::Result<Pagemap> {
        Ok(Pagemap {
            fd: open_own(c"/proc/self/pagemap", false)?,
        })
    }

    /// Fills `out[i]` with the pagemap entry of page `addr + i * PAGE`.
    pub fn read(&self, addr: *const u8, out: &mut [u64]) -> io::Result<()> {
        let off = (addr as u64 / PAGE as u64) * 8;
        let bytes = out.len() * 8;
        self.fd.with(|fd| {
            // SAFETY: out is exclusively borrowed and is bytes = out.len() * 8 bytes long, the
            // length passed to pread.
            let r = unsafe { libc::pread(fd, out.as_mut_ptr().cast(), bytes, off as libc::off_t) };
            if r as usize != bytes {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

impl Drop for Pagemap {
    fn drop(&mut self) {
        // Opened in Pagemap::open and owned by this Pagemap only: closed once, here.
        self.fd.close();
    }
}

pub const PM_UFFD_WP: u64 = 1 << 57;

/// A pagemap entry of an anonymous page the kernel has neither mapped nor
/// swapped: it reads zero until written.
pub fn never_touched(entry: u64) -> bool {
    entry & (PM_PRESENT | PM_SWAP) == 0
}

/// A page of a MAP_PRIVATE file mapping has its own anonymous copy: present
/// and not file-backed, or swapped out. A write-protected page that was never
/// faulted in shows as a swap entry too (a uffd-wp PTE marker) with the
/// uffd-wp bit: that is no copy. (A diverged page swapped out while protected
/// looks the same; the scan never trusts page state for content — see scan.rs.)
pub fn is_diverged(entry: u64) -> bool {
    (entry & PM_PRESENT != 0 && entry & PM_FILE == 0)
        || (entry & PM_SWAP != 0 && entry & PM_UFFD_WP == 0)
}

pub fn is_zero(page: *const u8) -> bool {
    // Word-wise with an early exit: the R paper's cheap content check.
    // SAFETY: the caller passes the start of a readable, page-aligned page of PAGE bytes (every
    // caller hands in a page of an engine block or of the frame window), so it is valid and
    // aligned for PAGE / 8 u64 reads.
    let words = unsafe { std::slice::from_raw_parts(page as *const u64, PAGE / 8) };
    words
        .chunks_exact(8)
        .all(|c| c.iter().fold(0, |a, w| a | w) == 0)
}

/// Blocks every signal in this thread; returns the mask to restore.
pub fn block_signals() -> libc::sigset_t {
    // SAFETY: both sigsets are live locals, zero-initialised (a valid all-empty sigset_t)
    // before sigfillset and pthread_sigmask write them.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    }
}

pub fn restore_signals(mask: &libc::sigset_t) {
    // SAFETY: mask points to a live sigset_t, as filled in by block_signals; the old-mask
    // pointer may be null.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_bytes_and_their_peak_are_read_from_the_status_text() {
        let text = "Name:\tx\nVmPeak:\t  9000 kB\nVmHWM:\t    1234 kB\nVmRSS:\t  1000 kB\n";
        assert_eq!(status_resident(text), Some((1000 * 1024, 1234 * 1024)));
        assert_eq!(status_resident("Name:\tx\nVmRSS:\t 1 kB\n"), None);
    }

    #[test]
    fn the_peak_of_this_address_space_is_at_least_what_is_resident() {
        let r = Resident::open().expect("status");
        let (now, peak) = r.read().expect("resident now and at the highest");
        assert!(peak >= now, "{peak} < {now}");
    }
}
