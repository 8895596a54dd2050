//! The exported descriptor calls: close, close_range, closefrom, dup, dup2,
//! dup3, fcntl, fcntl64 and the fstat family (fstat, fstat64, and fstatat,
//! fstatat64, statx on a descriptor itself). The engine's own descriptors (memfd pools, its
//! userfaultfd, pagemap) sit above the program's descriptor limit, where a
//! plain program has nothing open (the engine's fds.rs); these hooks make
//! every call the program makes through libc answer as it would plain:
//!
//! - a call on an engine descriptor (close, dup, fcntl, fstat) fails with
//!   EBADF, as on a number that is not open, and leaves the descriptor to the
//!   engine: a program that walks its descriptors with fstat or fcntl (as
//!   CPython's tests and close-everything loops do) does not meet them, even
//!   where they must sit below its limit;
//! - close_range and closefrom close everything in the range but the engine's
//!   descriptors;
//! - dup2 and dup3 onto an engine descriptor's number (possible only once the
//!   program raised its limit) first move the engine's descriptor to another
//!   number, then give the program the number it asked for.
//!
//! Every other call goes straight to glibc's own function (found with dlsym,
//! so a cancellation point stays one). A program that bypasses libc with
//! raw system calls is caught by the engine instead: it checks each
//! descriptor's identity before use and stops taking work if one was replaced.
//!
//! Each hook is called by C code in place of glibc's function of the same
//! name; its `# Safety` section is that function's contract, which the C
//! caller keeps.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::sync::atomic::AtomicUsize;

use pagefold_engine::fds::{is_engine, relocate};

use crate::real::{next, set_errno};

/// Looks every hooked function up as soon as the library is loaded: a hook
/// first called in a child between fork and exec (subprocess modules close
/// and dup2 there) must not call dlsym, which may wait for a loader lock some
/// other thread of the parent held at fork.
#[used]
#[link_section = ".init_array"]
static RESOLVE_AT_LOAD: extern "C" fn() = {
    extern "C" fn init() {
        for (cache, name) in [
            (&CLOSE, c"close"),
            (&DUP, c"dup"),
            (&DUP2, c"dup2"),
            (&DUP3, c"dup3"),
            (&FCNTL, c"fcntl"),
            (&FCNTL64, c"fcntl64"),
            (&CLOSE_RANGE, c"close_range"),
            (&FSTAT, c"fstat"),
            (&FSTAT64, c"fstat64"),
            (&FSTATAT, c"fstatat"),
            (&FSTATAT64, c"fstatat64"),
            (&STATX, c"statx"),
        ] {
            next(cache, name);
        }
    }
    init
};

/// Fails the call as libc does: errno `e`, result -1.
fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

static CLOSE: AtomicUsize = AtomicUsize::new(0);
static DUP: AtomicUsize = AtomicUsize::new(0);
static DUP2: AtomicUsize = AtomicUsize::new(0);
static DUP3: AtomicUsize = AtomicUsize::new(0);
static FCNTL: AtomicUsize = AtomicUsize::new(0);
static FCNTL64: AtomicUsize = AtomicUsize::new(0);
static CLOSE_RANGE: AtomicUsize = AtomicUsize::new(0);

type Fd1 = unsafe extern "C" fn(c_int) -> c_int;
type Fd2 = unsafe extern "C" fn(c_int, c_int) -> c_int;
type Fd3 = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
type Fcntl = unsafe extern "C" fn(c_int, c_int, ...) -> c_int;
type CloseRange = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;

/// # Safety
/// As for C close: `fd` is the caller's to close.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if is_engine(fd) {
        return fail(libc::EBADF);
    }
    match next(&CLOSE, c"close") {
        0 => fail(libc::ENOSYS),
        // SAFETY: a non-zero address is glibc's close (dlsym's next definition
        // after this hook), of type Fd1; the caller's guarantee is close's.
        f => unsafe { std::mem::transmute::<usize, Fd1>(f)(fd) },
    }
}

/// # Safety
/// As for C dup: none.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if is_engine(fd) {
        return fail(libc::EBADF);
    }
    match next(&DUP, c"dup") {
        0 => fail(libc::ENOSYS),
        // SAFETY: glibc's dup, of type Fd1; dup has no precondition.
        f => unsafe { std::mem::transmute::<usize, Fd1>(f)(fd) },
    }
}

/// Whether the program may take number `newfd` for a copy of `oldfd`; sets
/// errno and returns false where the call must fail.
fn may_take(oldfd: c_int, newfd: c_int) -> bool {
    if is_engine(oldfd) {
        set_errno(libc::EBADF);
        return false;
    }
    if !relocate(newfd) {
        set_errno(libc::EBUSY);
        return false;
    }
    true
}

/// # Safety
/// As for C dup2: `newfd`, if open, is the caller's to close.
#[no_mangle]
pub unsafe extern "C" fn dup2(oldfd: c_int, newfd: c_int) -> c_int {
    if !may_take(oldfd, newfd) {
        return -1;
    }
    match next(&DUP2, c"dup2") {
        0 => fail(libc::ENOSYS),
        // SAFETY: glibc's dup2, of type Fd2; the caller's guarantee is dup2's.
        f => unsafe { std::mem::transmute::<usize, Fd2>(f)(oldfd, newfd) },
    }
}

/// # Safety
/// As for C dup3: `newfd`, if open, is the caller's to close.
#[no_mangle]
pub unsafe extern "C" fn dup3(oldfd: c_int, newfd: c_int, flags: c_int) -> c_int {
    if !may_take(oldfd, newfd) {
        return -1;
    }
    match next(&DUP3, c"dup3") {
        0 => fail(libc::ENOSYS),
        // SAFETY: glibc's dup3, of type Fd3; the caller's guarantee is dup3's.
        f => unsafe { std::mem::transmute::<usize, Fd3>(f)(oldfd, newfd, flags) },
    }
}

/// fcntl and fcntl64: EBADF on an engine descriptor, glibc's otherwise.
///
/// # Safety
/// `arg` is the variadic argument `cmd` takes (or anything, for commands
/// without one), as for C fcntl.
unsafe fn fcntl_via(cache: &AtomicUsize, name: &CStr, fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if is_engine(fd) {
        return fail(libc::EBADF);
    }
    match next(cache, name) {
        0 => fail(libc::ENOSYS),
        // SAFETY: glibc's fcntl (variadic, type Fcntl), given the caller's
        // argument in the register a variadic integer or pointer travels in;
        // the caller's guarantee is fcntl's.
        f => unsafe { std::mem::transmute::<usize, Fcntl>(f)(fd, cmd, arg) },
    }
}

/// C's `fcntl(fd, cmd, ...)`: on x86-64 and AArch64 Linux a variadic integer
/// or pointer is passed where a third fixed argument would be, so `arg` holds
/// it (and garbage for commands that take none, which fcntl ignores).
///
/// # Safety
/// As for C fcntl.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { fcntl_via(&FCNTL, c"fcntl", fd, cmd, arg) }
}

/// # Safety
/// As for C fcntl64.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: the caller's guarantee, passed on.
    unsafe { fcntl_via(&FCNTL64, c"fcntl64", fd, cmd, arg) }
}

/// close_range(2) on `[first, last]` but around the engine's descriptors.
fn close_range_around(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let real = next(&CLOSE_RANGE, c"close_range");
    let call = |a: c_uint, b: c_uint| -> c_int {
        if real == 0 {
            // SAFETY: the raw system call takes plain integers.
            return unsafe { libc::syscall(libc::SYS_close_range, a, b, flags) } as c_int;
        }
        // SAFETY: glibc's close_range, of type CloseRange.
        unsafe { std::mem::transmute::<usize, CloseRange>(real)(a, b, flags) }
    };
    let mut ours = [0 as c_uint; pagefold_engine::fds::MAX_HELD];
    let n = pagefold_engine::fds::numbers_in(first as i32, last, &mut ours);
    let mut from = first;
    for &fd in &ours[..n] {
        if fd > from {
            let r = call(from, fd - 1);
            if r != 0 {
                return r;
            }
        }
        from = fd + 1;
    }
    if from > last {
        return 0;
    }
    call(from, last)
}

/// # Safety
/// As for C close_range: the descriptors in the range are the caller's to close.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if first > last {
        return fail(libc::EINVAL);
    }
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0 {
        // Marking close-on-exec changes nothing for the engine's descriptors.
        let real = next(&CLOSE_RANGE, c"close_range");
        if real != 0 {
            // SAFETY: glibc's close_range, of type CloseRange; the caller's guarantee.
            return unsafe { std::mem::transmute::<usize, CloseRange>(real)(first, last, flags) };
        }
    }
    close_range_around(first, last, flags)
}

/// # Safety
/// As for C closefrom: every descriptor from `lowfd` up is the caller's to close.
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    // glibc's closefrom ends the process if it cannot close; so does this.
    if close_range_around(lowfd.max(0) as c_uint, c_uint::MAX, 0) != 0 {
        // SAFETY: abort has no precondition.
        unsafe { libc::abort() };
    }
}

static FSTAT: AtomicUsize = AtomicUsize::new(0);
static FSTAT64: AtomicUsize = AtomicUsize::new(0);
static FSTATAT: AtomicUsize = AtomicUsize::new(0);
static FSTATAT64: AtomicUsize = AtomicUsize::new(0);
static STATX: AtomicUsize = AtomicUsize::new(0);

type Fstat = unsafe extern "C" fn(c_int, *mut libc::stat) -> c_int;
type Fstat64 = unsafe extern "C" fn(c_int, *mut libc::stat64) -> c_int;
type Fstatat = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
type Fstatat64 = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat64, c_int) -> c_int;
type Statx = unsafe extern "C" fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int;

/// Whether a *at call with (`fd`, `path`, `flags`) looks at `fd` itself (an
/// empty path with AT_EMPTY_PATH) and `fd` is the engine's.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string.
unsafe fn at_engine_fd(fd: c_int, path: *const c_char, flags: c_int) -> bool {
    // SAFETY: the caller's guarantee; only the first byte is read.
    flags & libc::AT_EMPTY_PATH != 0 && (path.is_null() || unsafe { *path } == 0) && is_engine(fd)
}

/// # Safety
/// As for C fstat: `st` is valid for writing a struct stat.
#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat) -> c_int {
    if is_engine(fd) {
        return fail(libc::EBADF);
    }
    match next(&FSTAT, c"fstat") {
        0 => fail(libc::ENOSYS),
        // SAFETY: glibc's fstat, of type Fstat; the caller's guarantee is fstat's.
        f => unsafe { std::mem::transmute::<usize, Fstat>(f)(fd, st) },
    }
}

/// # Safety
/// As for C fstat64: `st` is valid for writing a struct stat64.
#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat64) -> c_int {
    if is_engine(fd) {
        return fail(libc::EBADF);
    }
    match next(&FSTAT64, c"fstat64") {
        0 => fail(libc::ENOSYS),
        // SAFETY: glibc's fstat64, of type Fstat64; the caller's guarantee is fstat64's.
        f => unsafe { std::mem::transmute::<usize, Fstat64>(f)(fd, st) },
    }
}

/// # Safety
/// As for C fstatat: `path` is a NUL-terminated string (or NULL with
/// AT_EMPTY_PATH), `st` valid for writing a struct stat.
#[no_mangle]
pub unsafe extern "C" fn fstatat(
    fd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's guarantee on path.
    if unsafe { at_engine_fd(fd, path, flags) } {
        return fail(libc::EBADF);
    }
    match next(&FSTATAT, c"fstatat") {
        0 => fail(libc::ENOSYS),
        // SAFETY: glibc's fstatat, of type Fstatat; the caller's guarantee is fstatat's.
        f => unsafe { std::mem::transmute::<usize, Fstatat>(f)(fd, path, st, flags) },
    }
}

/// # Safety
/// As for C fstatat64.
#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    fd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's guarantee on path.
    if unsafe { at_engine_fd(fd, path, flags) } {
        return fail(libc::EBADF);
    }
    match next(&FSTATAT64, c"fstatat64") {
        0 => fail(libc::ENOSYS),
        // SAFETY: glibc's fstatat64, of type Fstatat64; the caller's guarantee is fstatat64's.
        f => unsafe { std::mem::transmute::<usize, Fstatat64>(f)(fd, path, st, flags) },
    }
}

/// # Safety
/// As for C statx: `path` is a NUL-terminated string (or NULL with
/// AT_EMPTY_PATH), `out` valid for writing a struct statx.
#[no_mangle]
pub unsafe extern "C" fn statx(
    fd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    out: *mut libc::statx,
) -> c_int {
    // SAFETY: the caller's guarantee on path.
    if unsafe { at_engine_fd(fd, path, flags) } {
        return fail(libc::EBADF);
    }
    match next(&STATX, c"statx") {
        0 => fail(libc::ENOSYS),
        // SAFETY: glibc's statx, of type Statx; the caller's guarantee is statx's.
        f => unsafe { std::mem::transmute::<usize, Statx>(f)(fd, path, flags, mask, out) },
    }
}
