//! The system calls the harness makes outside the engine, as small safe
//! functions, so that each unsafe call is justified once, here, rather than
//! at every place that uses it: file descriptors opened, read, written and
//! closed without allocating ([`Fd`], for code that runs between fork and
//! exec or in a signal handler: `cgroup`, `swap`, `ksm`, `teardown`), signals,
//! flock, file-system statistics, resource usage, and the paths and pids
//! those calls take. Every module that touches the system sits above this
//! one; it uses none of them.

use std::ffi::{CStr, CString};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::null_mut;

/// A path as the NUL-terminated string system calls take.
pub fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL in a path we built")
}

/// Whether a process with this pid exists.
pub fn pid_alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// errno of the last failed call.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Sleeps without allocating (usable from a signal handler).
pub fn sleep_ms(ms: u64) {
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: `ts` is a valid timespec on this frame, only read; the
    // remaining-time pointer is null, which nanosleep allows.
    unsafe { libc::nanosleep(&ts, null_mut()) };
}

/// Whether this process runs with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid takes no arguments, touches no memory and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// kill(2): sends `sig` to `pid` (to process group -`pid` when negative);
/// returns its result (0, or -1 with errno set).
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> libc::c_int {
    // SAFETY: kill takes no pointers; which process it may signal is a
    // question of correctness for the caller, not of memory safety.
    unsafe { libc::kill(pid, sig) }
}

/// sysconf(3) for `name`; -1 if the system does not know it.
pub fn sysconf(name: libc::c_int) -> libc::c_long {
    // SAFETY: sysconf takes no pointers and only reads system limits.
    unsafe { libc::sysconf(name) }
}

/// getrusage(RUSAGE_SELF): this process's resource usage so far.
pub fn rusage_self() -> libc::rusage {
    // SAFETY: rusage is a C struct of integers and timevals, for which all
    // zero bytes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a live, writable rusage on this frame; getrusage
    // writes only into it (and cannot fail for RUSAGE_SELF).
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage
}

/// Tries once, without waiting, to take an exclusive flock on `file`.
pub fn try_lock_exclusive(file: &impl AsRawFd) -> bool {
    // SAFETY: the descriptor belongs to `file`, which the borrow keeps open
    // for the call; flock takes no pointers.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// statfs(2) of the file system holding `path`.
pub fn statfs(path: &Path) -> std::io::Result<libc::statfs> {
    let c = c_path(path);
    // SAFETY: statfs is a C struct of integers, for which all zero bytes is
    // a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path alive for the call and `fs` a
    // writable statfs on this frame, the only memory the call writes.
    if unsafe { libc::statfs(c.as_ptr(), &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fs)
}

/// statvfs(3) of the file system holding `path`.
pub fn statvfs(path: &Path) -> std::io::Result<libc::statvfs> {
    let c = c_path(path);
    // SAFETY: statvfs is a C struct of integers, for which all zero bytes is
    // a valid value.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path alive for the call and `fs` a
    // writable statvfs on this frame, the only memory the call writes.
    if unsafe { libc::statvfs(c.as_ptr(), &mut fs) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fs)
}

/// A file descriptor from open(2), closed when dropped. Nothing here
/// allocates or locks (open, read, write and close are async-signal-safe),
/// so it may be used between fork and exec and inside a signal handler.
pub struct Fd(libc::c_int);

impl Fd {
    /// open(2) of `path` with `flags`; None on failure, with errno set (the
    /// caller reads it next).
    pub fn open(path: &CStr, flags: libc::c_int) -> Option<Fd> {
        // SAFETY: `path` is a NUL-terminated string borrowed for the call;
        // open only reads it.
        let fd = unsafe { libc::open(path.as_ptr(), flags) };
        (fd >= 0).then_some(Fd(fd))
    }

    /// read(2) into `buf`: bytes read, 0 at the end, -1 on error.
    pub fn read(&self, buf: &mut [u8]) -> isize {
        // SAFETY: `buf` is writable for `buf.len()` bytes and borrowed
        // exclusively for the call; the descriptor is ours and open.
        unsafe { libc::read(self.0, buf.as_mut_ptr().cast(), buf.len()) }
    }

    /// write(2) of `data`: bytes written, -1 on error.
    pub fn write(&self, data: &[u8]) -> isize {
        // SAFETY: `data` is readable for `data.len()` bytes for the call; the
        // descriptor is ours and open.
        unsafe { libc::write(self.0, data.as_ptr().cast(), data.len()) }
    }
}

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor was opened by Fd::open for this value alone
        // and is closed only here, once.
        unsafe { libc::close(self.0) };
    }
}
