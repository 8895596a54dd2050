//! The engine's userfaultfd: write protection for scans, and MISSING mode
//! for evicted pages (evict.rs, fault.rs).
//!
//! A scan must not fold or remap a page while a thread writes it: the write
//! would land in memory that the remap then discards. Kernel KSM write-protects
//! the PTE before comparing; from user space the equivalent is
//! UFFDIO_WRITEPROTECT. A writer (a thread, or the kernel inside read(2)) then
//! sleeps in the kernel until the range is unprotected: no signal handler, no
//! new mapping, no EFAULT. We run no fault-handling thread at all: the scanner
//! unprotects (which wakes sleepers) as soon as its chunk is done.
//!
//! Ranges are registered only while a scan works on them: registration turns
//! off the kernel's fault-around for the range, and a first read of a copy
//! would cost a fault per page. mmap(MAP_FIXED) creates fresh, unregistered
//! mappings, so a range remapped during a scan is registered again; sleepers
//! in a replaced range are woken and fault again on the new mapping.
//!
//! The same descriptor serves evicted pages: a VMA can be registered with one
//! userfaultfd only, so a range holding evicted pages is registered MISSING|WP
//! here, and a scan's WP registration of a chunk leaves it so (registering
//! adds modes, it never removes one). MISSING faults are read and answered by
//! the fault thread (fault.rs); WP faults it reads too, and ignores: the scan
//! that protected the page wakes its writers when it unprotects.

use crate::fds::{self, Fd};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

const UFFD_API: u64 = 0xAA;
const FEATURE_MISSING_SHMEM: u64 = 1 << 5;
const FEATURE_WP_SHMEM: u64 = 1 << 12;
const FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const FEATURE_POISON: u64 = 1 << 14;
const MODE_MISSING: u64 = 1;
const MODE_WP: u64 = 2;
const WP_MODE_WP: u64 = 1;
/// `uffd_msg.event` of a page fault, and its flag for a write-protect fault.
const EVENT_PAGEFAULT: u8 = 0x12;
const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

const fn iowr(nr: u64, size: u64) -> u64 {
    (3 << 30) | (size << 16) | (0xAA << 8) | nr
}
const fn ior(nr: u64, size: u64) -> u64 {
    (2 << 30) | (size << 16) | (0xAA << 8) | nr
}
const UFFDIO_API: u64 = iowr(0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
const UFFDIO_UNREGISTER: u64 = ior(0x01, 16);
const UFFDIO_WAKE: u64 = ior(0x02, 16);
const UFFDIO_COPY: u64 = iowr(0x03, 40);
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, 32);
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);
const UFFDIO_POISON: u64 = iowr(0x08, 32);
const UFFDIO_MOVE: u64 = iowr(0x05, 40);

#[repr(C)]
struct ApiArg {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
struct Range {
    start: u64,
    len: u64,
}
#[repr(C)]
struct RegisterArg {
    range: Range,
    mode: u64,
    ioctls: u64,
}
#[repr(C)]
struct WriteProtectArg {
    range: Range,
    mode: u64,
}
#[repr(C)]
struct CopyArg {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copied: i64,
}
#[repr(C)]
struct MoveArg {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}
/// UFFDIO_ZEROPAGE and UFFDIO_POISON take the same layout.
#[repr(C)]
struct FillArg {
    range: Range,
    mode: u64,
    done: i64,
}
/// `struct uffd_msg`, as far as page faults go.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Msg {
    event: u8,
    _reserved: [u8; 7],
    flags: u64,
    address: u64,
    _rest: u64,
}

/// A page fault read from the descriptor.
#[derive(Clone, Copy, Debug)]
pub struct Fault {
    pub addr: usize,
    /// A write-protect fault (a scan's), not a missing page.
    pub wp: bool,
}

/// A userfaultfd set up for write protection of anonymous and shmem memory
/// and, where the kernel allows, MISSING mode on both.
pub struct Protector {
    /// Adopted (crate::fds): out of the program's way, identity checked at each use.
    fd: Fd,
    /// MISSING mode is available (eviction can work).
    pub missing: bool,
    /// UFFDIO_POISON is available (a page whose stored copy is lost faults with SIGBUS).
    pub poison: bool,
    /// Pages an unprotect found not registered.
    gaps: AtomicU64,
}

impl Protector {
    /// With `missing`, asks for MISSING mode on shmem and for poisoning too,
    /// falling back to write protection alone if the kernel refuses them.
    pub fn open_with(missing: bool) -> io::Result<Protector> {
        let wp = FEATURE_WP_SHMEM | FEATURE_WP_UNPOPULATED;
        let attempts: &[u64] = if missing {
            &[
                wp | FEATURE_MISSING_SHMEM | FEATURE_POISON,
                wp | FEATURE_MISSING_SHMEM,
                wp,
            ]
        } else {
            &[wp]
        };
        let mut last = io::Error::from_raw_os_error(libc::EINVAL);
        // A second UFFDIO_API on one descriptor fails: a fresh one per attempt.
        for &features in attempts {
            let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
            // SAFETY: the userfaultfd system call takes only an integer flag argument.
            let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as i32;
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = fds::adopt(fd)?;
            let missing = features & FEATURE_MISSING_SHMEM != 0;
            let p = Protector {
                fd,
                missing,
                poison: features & FEATURE_POISON != 0,
                gaps: AtomicU64::new(0),
            };
            let mut api = ApiArg {
                api: UFFD_API,
                features,
                ioctls: 0,
            };
            match p.ioctl(UFFDIO_API, &mut api) {
                Ok(()) => return Ok(p),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Write protection and, if available, MISSING mode.
    pub fn open() -> io::Result<Protector> {
        Protector::open_with(true)
    }

    fn ioctl<T>(&self, req: u64, arg: &mut T) -> io::Result<()> {
        loop {
            let r = self.fd.with(|fd| {
                // SAFETY: arg is an exclusively borrowed T, and callers pass the request number
                // whose argument struct is T, so the kernel reads and writes only within it.
                if unsafe { libc::ioctl(fd, req as _, &mut *arg as *mut T) } == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            });
            let Err(e) = r else { return Ok(()) };
            // EAGAIN: the mm changed under the call (a concurrent mmap); try again.
            if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
                return Err(e);
            }
        }
    }

    /// Registers `[addr, addr+len)` (whole mappings of ours) for write protection.
    pub fn register(&self, addr: *const u8, len: usize) -> io::Result<()> {
        let mut arg = RegisterArg {
            range: range(addr, len),
            mode: MODE_WP,
            ioctls: 0,
        };
        self.ioctl(UFFDIO_REGISTER, &mut arg)
    }

    /// Registers `[addr, addr+len)` for MISSING faults and write protection
    /// (a range holding evicted pages; see the module comment).
    pub fn register_missing(&self, addr: *const u8, len: usize) -> io::Result<()> {
        let mut arg = RegisterArg {
            range: range(addr, len),
            mode: MODE_MISSING | MODE_WP,
            ioctls: 0,
        };
        self.ioctl(UFFDIO_REGISTER, &mut arg)
    }

    /// Moves the anonymous pages of `[src, src+len)` to the empty,
    /// registered `[dst, dst+len)`, stopping at the first page the kernel
    /// refuses: returns the bytes moved and, if it stopped short, why (EBUSY:
    /// the page may be pinned or is shared with another process; ENOENT: no
    /// page there; EINVAL: the mappings differ or the kernel has no UFFDIO_MOVE).
    pub fn move_pages(
        &self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
    ) -> (usize, Option<io::Error>) {
        let mut arg = MoveArg {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: 0,
            moved: 0,
        };
        let r = self.fd.with(|fd| {
            // SAFETY: arg is a live MoveArg, the layout UFFDIO_MOVE reads and writes.
            if unsafe { libc::ioctl(fd, UFFDIO_MOVE as _, &mut arg as *mut MoveArg) } == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
        match r {
            Ok(()) => (len, None),
            // EAGAIN with progress: a short move; the next call says why it stopped.
            Err(e) if arg.moved > 0 => (
                arg.moved as usize,
                (e.raw_os_error() != Some(libc::EAGAIN)).then_some(e),
            ),
            Err(e) => (0, Some(e)),
        }
    }

    /// Ends registration; wakes any sleeper in the range.
    pub fn unregister(&self, addr: *const u8, len: usize) -> io::Result<()> {
        let mut arg = range(addr, len);
        self.ioctl(UFFDIO_UNREGISTER, &mut arg)
    }

    pub fn protect(&self, addr: *const u8, len: usize) -> io::Result<()> {
        let mut arg = WriteProtectArg {
            range: range(addr, len),
            mode: WP_MODE_WP,
        };
        self.ioctl(UFFDIO_WRITEPROTECT, &mut arg)
    }

    /// Removes protection from every registered mapping of the range and
    /// wakes every writer sleeping in it.
    ///
    /// The kernel walks the range mapping by mapping and stops with ENOENT
    /// at the first one not registered, leaving those after it protected: a
    /// page left so would put its next writer to sleep for good. So a range
    /// the kernel refuses is halved and each half unprotected again, down to
    /// single pages; the pages it still refuses are not registered and so
    /// not protected either. Each such page is counted in `gaps`: the
    /// engine keeps whole ranges registered while it protects them, so a
    /// gap shows a step that broke that rule.
    pub fn unprotect(&self, addr: *const u8, len: usize) -> io::Result<()> {
        let r = self.unprotect_registered(addr as usize, len);
        self.wake(addr, len);
        r
    }

    /// Unprotects every registered page of `[addr, addr+len)`; the first
    /// error other than a gap.
    fn unprotect_registered(&self, addr: usize, len: usize) -> io::Result<()> {
        let mut arg = WriteProtectArg {
            range: range(addr as *const u8, len),
            mode: 0,
        };
        match self.ioctl(UFFDIO_WRITEPROTECT, &mut arg) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            r => return r,
        }
        let pages = len / crate::sys::PAGE;
        if pages <= 1 {
            self.gaps.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let half = pages / 2 * crate::sys::PAGE;
        let first = self.unprotect_registered(addr, half);
        let second = self.unprotect_registered(addr + half, len - half);
        first.and(second)
    }

    /// Pages an unprotect found not registered (see `unprotect`).
    pub fn gaps(&self) -> u64 {
        self.gaps.load(Ordering::Relaxed)
    }

    /// Wakes sleepers even where the mapping was replaced (no longer registered).
    pub fn wake(&self, addr: *const u8, len: usize) {
        let mut arg = range(addr, len);
        let _ = self.ioctl(UFFDIO_WAKE, &mut arg);
    }

    /// Fills the missing page at `addr` with `page` and wakes its faulters.
    /// EEXIST: the page is present already; ENOENT: the range is no longer
    /// registered (its mapping was replaced).
    pub fn copy(&self, addr: usize, page: &[u8; crate::sys::PAGE]) -> io::Result<()> {
        let mut arg = CopyArg {
            dst: addr as u64,
            src: page.as_ptr() as u64,
            len: crate::sys::PAGE as u64,
            mode: 0,
            copied: 0,
        };
        self.ioctl(UFFDIO_COPY, &mut arg)
    }

    /// Maps the zero page at `addr` if nothing is mapped there (EEXIST otherwise) and wakes.
    pub fn zeropage(&self, addr: usize) -> io::Result<()> {
        let mut arg = FillArg {
            range: Range {
                start: addr as u64,
                len: crate::sys::PAGE as u64,
            },
            mode: 0,
            done: 0,
        };
        self.ioctl(UFFDIO_ZEROPAGE, &mut arg)
    }

    /// Marks the missing page at `addr` poisoned: its faulters get SIGBUS,
    /// as a process does when the kernel cannot read a page back from swap.
    pub fn poison(&self, addr: usize) -> io::Result<()> {
        let mut arg = FillArg {
            range: Range {
                start: addr as u64,
                len: crate::sys::PAGE as u64,
            },
            mode: 0,
            done: 0,
        };
        self.ioctl(UFFDIO_POISON, &mut arg)
    }

    /// Waits up to `timeout_ms` for faults and reads them into `out`; returns how many.
    pub fn read_faults(&self, out: &mut [Fault], timeout_ms: i32) -> usize {
        let mut msgs = [Msg::default(); 16];
        let want = out.len().min(msgs.len()) * std::mem::size_of::<Msg>();
        let read = self.fd.with(|fd| {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: pfd is a live local pollfd and the count passed is 1.
            if unsafe { libc::poll(&mut pfd, 1, timeout_ms) } <= 0 {
                return Ok(0);
            }
            // SAFETY: msgs is a local array of 16 Msg and want is at most
            // 16 * size_of::<Msg>() bytes, so read writes only within it; Msg is plain old data.
            Ok(unsafe { libc::read(fd, msgs.as_mut_ptr().cast(), want) })
        });
        let r = match read {
            Ok(r) if r > 0 => r,
            Ok(_) => return 0,
            Err(_) => {
                // Not ours any more: wait as poll would have, rather than spin.
                std::thread::sleep(std::time::Duration::from_millis(timeout_ms.max(0) as u64));
                return 0;
            }
        };
        let mut n = 0;
        for m in &msgs[..r as usize / std::mem::size_of::<Msg>()] {
            if m.event == EVENT_PAGEFAULT {
                out[n] = Fault {
                    addr: m.address as usize & !(crate::sys::PAGE - 1),
                    wp: m.flags & PAGEFAULT_FLAG_WP != 0,
                };
                n += 1;
            }
        }
        n
    }
}

fn range(addr: *const u8, len: usize) -> Range {
    Range {
        start: addr as u64,
        len: len as u64,
    }
}

impl Drop for Protector {
    fn drop(&mut self) {
        // This Protector owns the descriptor alone; Drop runs once.
        self.fd.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{self, Pagemap, PAGE, PM_UFFD_WP};

    /// The kernel stops unprotecting at the first mapping not registered;
    /// `unprotect` must reach every registered page past it, and count it.
    #[test]
    fn unprotect_reaches_past_a_mapping_not_registered() {
        let Ok(p) = Protector::open() else {
            eprintln!("skipped: no userfaultfd");
            return;
        };
        let n = 8;
        let base = sys::map(std::ptr::null_mut(), n * PAGE, None, 0, false, false).unwrap();
        // SAFETY: base is a fresh private mapping of n pages, readable and writable.
        unsafe { std::ptr::write_bytes(base, 1, n * PAGE) };
        p.register(base, n * PAGE).unwrap();
        p.protect(base, n * PAGE).unwrap();
        // Page 2 leaves the registration (a mapping of its own, unprotected).
        // SAFETY: page 2 lies inside the n-page mapping.
        p.unregister(unsafe { base.add(2 * PAGE) }, PAGE).unwrap();
        let wp = |pm: &Pagemap| {
            let mut e = vec![0u64; n];
            pm.read(base, &mut e).unwrap();
            e.iter().map(|e| e & PM_UFFD_WP != 0).collect::<Vec<bool>>()
        };
        let pm = Pagemap::open().unwrap();
        let mut protected = vec![true; n];
        protected[2] = false;
        assert_eq!(wp(&pm), protected);
        p.unprotect(base, n * PAGE).unwrap();
        assert_eq!(
            wp(&pm),
            vec![false; n],
            "a page past the gap stayed protected"
        );
        assert_eq!(p.gaps(), 1);
        // SAFETY: every page is writable again; a protected one would hang here.
        unsafe { std::ptr::write_bytes(base, 2, n * PAGE) };
        sys::unmap(base, n * PAGE);
    }
}
