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
//!
//! Where the kernel refuses the system call (an unprivileged user while
//! `vm.unprivileged_userfaultfd` is 0, the default), the descriptor comes
//! from /dev/userfaultfd (Linux 6.1), whose file mode says who may have one.
//! The system call with `UFFD_USER_MODE_ONLY` is never refused, but such a
//! descriptor makes a kernel access to a protected or missing page (a
//! `read(2)` into it) fail with EFAULT instead of waiting (the tests below
//! show it): every mechanism here protects pages the program may hand to
//! the kernel, so the engine does not use it, and runs without write
//! protection instead. `probe` tells `pagefold doctor` what this kernel and
//! this user allow, and `Refuse` forces each refusal for the tests.

use crate::fds::{self, Fd};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

const UFFD_API: u64 = 0xAA;
const FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const FEATURE_MISSING_SHMEM: u64 = 1 << 5;
const FEATURE_WP_SHMEM: u64 = 1 << 12;
const FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const FEATURE_POISON: u64 = 1 << 14;
const FEATURE_MOVE: u64 = 1 << 16;
/// The system call's flag for a descriptor that handles user-mode faults only.
const USER_MODE_ONLY: libc::c_int = 1;
/// `_IO(0xAA, 0x00)` on /dev/userfaultfd: a new userfaultfd, its argument the flags.
const USERFAULTFD_IOC_NEW: u64 = 0xAA << 8;
const DEVICE: &std::ffi::CStr = c"/dev/userfaultfd";
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

/// Refusals forced for tests (config.rs `Inject`): each makes the kernel
/// answer as one without that permission or feature answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refuse {
    /// The system call fails with EPERM, as for an unprivileged user while
    /// `vm.unprivileged_userfaultfd` is 0.
    pub syscall: bool,
    /// /dev/userfaultfd cannot be opened (EACCES), as when its mode keeps
    /// the user out.
    pub device: bool,
    /// No write protection of anonymous and shmem memory (before Linux 6.1).
    pub wp: bool,
    /// No write protection of never-touched anonymous pages (before Linux 6.4).
    pub wp_unpopulated: bool,
    /// No MISSING mode on shmem.
    pub missing: bool,
    /// No UFFDIO_POISON (before Linux 6.6).
    pub poison: bool,
    /// UFFDIO_MOVE fails with EINVAL, as before Linux 6.8.
    pub move_pages: bool,
}

impl Refuse {
    /// The UFFDIO_API features this refusal takes away.
    fn features(&self) -> u64 {
        let mut f = 0;
        if self.wp {
            f |= FEATURE_PAGEFAULT_FLAG_WP | FEATURE_WP_SHMEM | FEATURE_WP_UNPOPULATED;
        }
        if self.wp_unpopulated {
            f |= FEATURE_WP_UNPOPULATED;
        }
        if self.missing {
            f |= FEATURE_MISSING_SHMEM;
        }
        if self.poison {
            f |= FEATURE_POISON;
        }
        if self.move_pages {
            f |= FEATURE_MOVE;
        }
        f
    }
}

/// Where a userfaultfd came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The userfaultfd system call.
    Syscall,
    /// /dev/userfaultfd (`USERFAULTFD_IOC_NEW`).
    Device,
}

/// Flags of every descriptor the engine opens.
const FD_FLAGS: libc::c_int = libc::O_CLOEXEC | libc::O_NONBLOCK;

/// A new userfaultfd handling kernel faults too: the system call, else,
/// where the kernel's own rule refused it, /dev/userfaultfd. Both refusals
/// when neither gives one.
fn new_fd(refuse: &Refuse) -> Result<(i32, Source), (io::Error, io::Error)> {
    let syscall_err = match syscall_unless(refuse) {
        Ok(fd) => return Ok((fd, Source::Syscall)),
        Err(e) => e,
    };
    if !kernel_rule_refused() {
        let filtered = io::Error::from_raw_os_error(libc::EPERM);
        return Err((syscall_err, filtered));
    }
    device_unless(refuse)
        .map(|fd| (fd, Source::Device))
        .map_err(|e| (syscall_err, e))
}

/// Whether a refused system call was the kernel's privilege rule, which
/// never refuses a user-mode-only descriptor, rather than a sandbox's
/// filter (seccomp, an LSM), which refuses the call whatever its flags:
/// the device would go around such a filter, so it is used only in the
/// first case.
fn kernel_rule_refused() -> bool {
    match syscall_fd(FD_FLAGS | USER_MODE_ONLY) {
        Ok(fd) => {
            // SAFETY: fd was opened just above and is used by nothing else.
            unsafe { libc::close(fd) };
            true
        }
        Err(_) => false,
    }
}

/// The system call, or EPERM where `refuse` says so.
fn syscall_unless(refuse: &Refuse) -> io::Result<i32> {
    if refuse.syscall {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    syscall_fd(FD_FLAGS)
}

/// The device, or EACCES where `refuse` says so.
fn device_unless(refuse: &Refuse) -> io::Result<i32> {
    if refuse.device {
        return Err(io::Error::from_raw_os_error(libc::EACCES));
    }
    device_fd(FD_FLAGS)
}

fn syscall_fd(flags: libc::c_int) -> io::Result<i32> {
    // SAFETY: the userfaultfd system call takes only an integer flag argument.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as i32;
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A userfaultfd from /dev/userfaultfd; the device's own descriptor is
/// closed before this returns.
fn device_fd(flags: libc::c_int) -> io::Result<i32> {
    // SAFETY: DEVICE is a NUL-terminated C string that outlives the call.
    let dev = unsafe { libc::open(DEVICE.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if dev < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: USERFAULTFD_IOC_NEW takes its flags as the integer argument and
    // touches no memory of ours.
    let fd = unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW as _, flags) };
    let r = if fd < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(fd)
    };
    // SAFETY: dev was opened above and is used by nothing else.
    unsafe { libc::close(dev) };
    r
}

/// What this kernel and this user allow of userfaultfd, for `pagefold doctor`.
#[derive(Debug)]
pub struct Probe {
    /// The system call (kernel faults handled): Ok, or why it was refused.
    pub syscall: io::Result<()>,
    /// /dev/userfaultfd: Ok, or why it could not give a descriptor.
    pub device: io::Result<()>,
    /// The system call with `UFFD_USER_MODE_ONLY` (unused by the engine;
    /// refused only by a sandbox's filter, and then the device is not used either).
    pub user_mode_only: io::Result<()>,
    /// The features the kernel offers (as any of the three could ask
    /// UFFDIO_API for them), less those refused; None if none opened.
    pub features: Option<Features>,
}

impl Probe {
    /// Whether the engine gets a userfaultfd here (as `Protector::open` would).
    pub fn engine_can_open(&self) -> bool {
        self.syscall.is_ok() || (self.device.is_ok() && self.user_mode_only.is_ok())
    }
}

/// The userfaultfd features the engine asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Write protection of anonymous and shmem memory (Linux 6.1).
    pub wp: bool,
    /// Write protection of never-touched anonymous pages (Linux 6.4).
    pub wp_unpopulated: bool,
    /// MISSING mode on shmem (Linux 4.11).
    pub missing: bool,
    /// UFFDIO_POISON (Linux 6.6).
    pub poison: bool,
    /// UFFDIO_MOVE (Linux 6.8).
    pub move_pages: bool,
}

/// Opens each kind of userfaultfd once and asks the kernel for its features.
pub fn probe(refuse: &Refuse) -> Probe {
    let syscall = syscall_unless(refuse);
    let device = device_unless(refuse);
    let user_mode_only = syscall_fd(FD_FLAGS | USER_MODE_ONLY);
    let mut features = None;
    for fd in [&syscall, &device, &user_mode_only].into_iter().flatten() {
        if features.is_none() {
            features = offered_features(*fd).map(|f| f & !refuse.features());
        }
        // SAFETY: fd was opened above and is used by nothing else.
        unsafe { libc::close(*fd) };
    }
    Probe {
        syscall: syscall.map(drop),
        device: device.map(drop),
        user_mode_only: user_mode_only.map(drop),
        features: features.map(|f| Features {
            wp: f & (FEATURE_PAGEFAULT_FLAG_WP | FEATURE_WP_SHMEM)
                == FEATURE_PAGEFAULT_FLAG_WP | FEATURE_WP_SHMEM,
            wp_unpopulated: f & FEATURE_WP_UNPOPULATED != 0,
            missing: f & FEATURE_MISSING_SHMEM != 0,
            poison: f & FEATURE_POISON != 0,
            move_pages: f & FEATURE_MOVE != 0,
        }),
    }
}

/// The features UFFDIO_API offers on a fresh descriptor (asked with none,
/// the kernel answers with all it has).
fn offered_features(fd: i32) -> Option<u64> {
    let mut api = ApiArg {
        api: UFFD_API,
        features: 0,
        ioctls: 0,
    };
    // SAFETY: api is a live ApiArg, the layout UFFDIO_API reads and writes.
    let r = unsafe { libc::ioctl(fd, UFFDIO_API as _, &mut api as *mut ApiArg) };
    (r == 0).then_some(api.features)
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
    /// Where the descriptor came from.
    pub source: Source,
    /// UFFDIO_MOVE is refused as on a kernel without it (tests).
    refuse_move: bool,
    /// Pages an unprotect found not registered.
    gaps: AtomicU64,
}

impl Protector {
    /// With `missing`, asks for MISSING mode on shmem and for poisoning too,
    /// falling back to write protection alone if the kernel refuses them.
    pub fn open_with(missing: bool) -> io::Result<Protector> {
        Protector::open_refusing(missing, &Refuse::default())
    }

    /// `open_with`, on a kernel that refuses what `refuse` says.
    pub fn open_refusing(missing: bool, refuse: &Refuse) -> io::Result<Protector> {
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
            let (fd, source) = new_fd(refuse).map_err(|(syscall, _device)| syscall)?;
            let fd = fds::adopt(fd)?;
            let missing = features & FEATURE_MISSING_SHMEM != 0;
            let p = Protector {
                fd,
                missing,
                poison: features & FEATURE_POISON != 0,
                source,
                refuse_move: refuse.move_pages,
                gaps: AtomicU64::new(0),
            };
            let mut api = ApiArg {
                api: UFFD_API,
                features,
                ioctls: 0,
            };
            // The kernel refuses a feature it lacks with EINVAL.
            let r = if features & refuse.features() != 0 {
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            } else {
                p.ioctl(UFFDIO_API, &mut api)
            };
            match r {
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
        if self.refuse_move {
            return (0, Some(io::Error::from_raw_os_error(libc::EINVAL)));
        }
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

    /// A Protector on a descriptor that handles user-mode faults only (the
    /// system call with UFFD_USER_MODE_ONLY, which no user is refused).
    fn user_mode_only() -> Protector {
        let fd = syscall_fd(FD_FLAGS | USER_MODE_ONLY).unwrap();
        let p = Protector {
            fd: fds::adopt(fd).unwrap(),
            missing: true,
            poison: false,
            source: Source::Syscall,
            refuse_move: false,
            gaps: AtomicU64::new(0),
        };
        let mut api = ApiArg {
            api: UFFD_API,
            features: FEATURE_WP_SHMEM | FEATURE_WP_UNPOPULATED | FEATURE_MISSING_SHMEM,
            ioctls: 0,
        };
        p.ioctl(UFFDIO_API, &mut api).unwrap();
        p
    }

    /// A pipe holding `b"kernel write"`.
    fn pipe_with_data() -> [i32; 2] {
        let mut fds = [0i32; 2];
        // SAFETY: fds is a live array of two ints that pipe fills in.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the buffer is a live static byte string of the length given.
        let written = unsafe { libc::write(fds[1], b"kernel write".as_ptr().cast(), 12) };
        assert_eq!(written, 12);
        fds
    }

    /// The kernel writing into `page` for a read(2) from the pipe.
    fn kernel_write(fds: [i32; 2], page: usize) -> io::Result<usize> {
        // SAFETY: page is a live, writable page of this test; the kernel writes 12 bytes.
        let r = unsafe { libc::read(fds[0], page as *mut libc::c_void, 12) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    fn close_pipe(fds: [i32; 2]) {
        // SAFETY: both descriptors were opened by pipe_with_data and are closed once.
        unsafe { libc::close(fds[0]) };
        // SAFETY: as above.
        unsafe { libc::close(fds[1]) };
    }

    /// Why the engine never uses a user-mode-only userfaultfd: the kernel's
    /// own write into a write-protected page (read(2) into a buffer being
    /// scanned) fails with EFAULT, where the program expects it to wait.
    #[test]
    fn user_mode_only_protection_fails_kernel_writes_with_efault() {
        let p = user_mode_only();
        let base = sys::map(std::ptr::null_mut(), PAGE, None, 0, false, false).unwrap();
        // SAFETY: base is a fresh private mapping of one page, readable and writable.
        unsafe { base.write(7) };
        p.register(base, PAGE).unwrap();
        p.protect(base, PAGE).unwrap();
        let fds = pipe_with_data();
        let r = kernel_write(fds, base as usize);
        assert_eq!(r.map_err(|e| e.raw_os_error()), Err(Some(libc::EFAULT)));
        p.unprotect(base, PAGE).unwrap();
        assert_eq!(
            kernel_write(fds, base as usize).unwrap(),
            12,
            "the data stayed in the pipe"
        );
        close_pipe(fds);
        sys::unmap(base, PAGE);
    }

    /// The same for MISSING mode (evicted pages, and the holes the pin
    /// guard leaves): a kernel access to the missing page fails with EFAULT.
    #[test]
    fn user_mode_only_missing_pages_fail_kernel_writes_with_efault() {
        let p = user_mode_only();
        let base = sys::map(std::ptr::null_mut(), PAGE, None, 0, false, false).unwrap();
        p.register_missing(base, PAGE).unwrap();
        let fds = pipe_with_data();
        let r = kernel_write(fds, base as usize);
        assert_eq!(r.map_err(|e| e.raw_os_error()), Err(Some(libc::EFAULT)));
        close_pipe(fds);
        p.unregister(base, PAGE).unwrap();
        sys::unmap(base, PAGE);
    }

    /// With the engine's descriptor the same kernel write waits until the
    /// page is unprotected, then lands.
    #[test]
    fn full_protection_makes_kernel_writes_wait() {
        let Ok(p) = Protector::open() else {
            eprintln!("skipped: no userfaultfd");
            return;
        };
        let base = sys::map(std::ptr::null_mut(), PAGE, None, 0, false, false).unwrap();
        // SAFETY: base is a fresh private mapping of one page, readable and writable.
        unsafe { base.write(7) };
        p.register(base, PAGE).unwrap();
        p.protect(base, PAGE).unwrap();
        let fds = pipe_with_data();
        let page = base as usize;
        let reader =
            std::thread::spawn(move || kernel_write(fds, page).map_err(|e| e.raw_os_error()));
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!reader.is_finished(), "the kernel write did not wait");
        p.unprotect(base, PAGE).unwrap();
        assert_eq!(reader.join().unwrap(), Ok(12));
        // SAFETY: 12 bytes were written at base.
        let got = unsafe { std::slice::from_raw_parts(base, 12) };
        assert_eq!(got, b"kernel write");
        close_pipe(fds);
        sys::unmap(base, PAGE);
    }
}
