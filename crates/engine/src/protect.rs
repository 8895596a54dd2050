//! Write protection for scans, with userfaultfd in write-protect mode.
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

use std::io;

const UFFD_API: u64 = 0xAA;
const FEATURE_WP_SHMEM: u64 = 1 << 12;
const FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const MODE_WP: u64 = 2;
const WP_MODE_WP: u64 = 1;

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
const UFFDIO_WRITEPROTECT: u64 = iowr(0x06, 24);

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

/// A userfaultfd set up for write protection of anonymous and shmem memory.
pub struct Protector {
    fd: i32,
}

impl Protector {
    pub fn open() -> io::Result<Protector> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as i32;
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let p = Protector { fd };
        let mut api = ApiArg { api: UFFD_API, features: FEATURE_WP_SHMEM | FEATURE_WP_UNPOPULATED, ioctls: 0 };
        p.ioctl(UFFDIO_API, &mut api)?;
        Ok(p)
    }

    fn ioctl<T>(&self, req: u64, arg: &mut T) -> io::Result<()> {
        loop {
            let r = unsafe { libc::ioctl(self.fd, req as _, arg as *mut T) };
            if r == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            // EAGAIN: the mm changed under the call (a concurrent mmap); try again.
            if !matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)) {
                return Err(e);
            }
        }
    }

    /// Registers `[addr, addr+len)` (whole mappings of ours) for write protection.
    pub fn register(&self, addr: *const u8, len: usize) -> io::Result<()> {
        let mut arg = RegisterArg { range: range(addr, len), mode: MODE_WP, ioctls: 0 };
        self.ioctl(UFFDIO_REGISTER, &mut arg)
    }

    /// Ends registration; wakes any sleeper in the range.
    pub fn unregister(&self, addr: *const u8, len: usize) -> io::Result<()> {
        let mut arg = range(addr, len);
        self.ioctl(UFFDIO_UNREGISTER, &mut arg)
    }

    pub fn protect(&self, addr: *const u8, len: usize) -> io::Result<()> {
        let mut arg = WriteProtectArg { range: range(addr, len), mode: WP_MODE_WP };
        self.ioctl(UFFDIO_WRITEPROTECT, &mut arg)
    }

    /// Removes protection and wakes every writer sleeping in the range.
    pub fn unprotect(&self, addr: *const u8, len: usize) -> io::Result<()> {
        let mut arg = WriteProtectArg { range: range(addr, len), mode: 0 };
        let r = self.ioctl(UFFDIO_WRITEPROTECT, &mut arg);
        self.wake(addr, len);
        r
    }

    /// Wakes sleepers even where the mapping was replaced (no longer registered).
    pub fn wake(&self, addr: *const u8, len: usize) {
        let mut arg = range(addr, len);
        let _ = self.ioctl(UFFDIO_WAKE, &mut arg);
    }
}

fn range(addr: *const u8, len: usize) -> Range {
    Range { start: addr as u64, len: len as u64 }
}

impl Drop for Protector {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}
