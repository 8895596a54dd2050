//! The exported memory-management calls: madvise, posix_madvise, mprotect,
//! pkey_mprotect, mlock and mlock2. Engine blocks must behave like the private
//! anonymous memory glibc would have handed out, and the kernel's answer on
//! memfd mappings differs:
//!
//! - MADV_DONTNEED / MADV_DONTNEED_LOCKED / MADV_FREE: the engine discards its
//!   pages (they read zero, their frames are released; MADV_FREE is served as
//!   DONTNEED, which private memory may also do). The kernel gets the rest.
//! - MADV_REMOVE: private anonymous memory refuses it (EINVAL, nothing
//!   changes); on an engine block the kernel would punch frames behind the
//!   engine's back. So EINVAL, as plain memory answers.
//! - protection changes, mlock, and advice the kernel keeps in the mapping
//!   (MADV_DONTFORK, MADV_WIPEONFORK, MADV_DONTDUMP, guard regions): the block
//!   is exempted first (moved onto plain anonymous memory, never remapped or
//!   scanned again), then the kernel applies the call to it as to plain memory.
//!   Otherwise a PROT_NONE page would kill the scanner and the engine's next
//!   remap would silently drop the protection or flag.
//! - anything else goes straight to the kernel (harmless on engine memory).
//!
//! And mmap, munmap, mremap and mprotect that fail with ENOMEM: the process
//! may have run out of mappings (`vm.max_map_count`), some of which are the
//! engine's (a copy or merge into the middle of a block splits its mapping).
//! The engine gives its own back (`Engine::give_back_mappings`) and the call
//! is made once more, so a program gets as many mappings as it would plain.
//!
//! The kernel is reached with syscall(2), never through a symbol lookup that
//! could find these hooks again. Calls from inside the engine (its scanner, or
//! a handler interrupting it) go straight to the kernel: `with_busy` refuses
//! them, so the engine is never re-entered.
//!
//! Each hook is called by C code in place of glibc's function of the same
//! name; its `# Safety` section is that function's contract, which the C
//! caller keeps: the range is the caller's to change as the call does.

use std::ffi::{c_int, c_long, c_void};

use crate::global::{running, with_busy};
use crate::real::{errno, set_errno};

/// Not yet in every libc crate version: guard regions (Linux 6.13).
const MADV_GUARD_INSTALL: c_int = 102;
const POSIX_MADV_DONTNEED: c_int = 4;

/// The raw system call `nr` on `[a, a+len)`, bypassing every symbol (and so
/// these hooks).
///
/// # Safety
/// `nr` is madvise, mprotect, mlock or mlock2 and `x` its third argument, as
/// a C caller of that call passed them: the caller may change the range as
/// the call does (madvise may discard its contents, mprotect may make it
/// inaccessible).
unsafe fn sys(nr: c_long, a: *mut c_void, len: usize, x: c_long) -> c_int {
    // SAFETY: the caller's guarantee; the kernel checks the range itself.
    unsafe { libc::syscall(nr, a, len, x) as c_int }
}

/// madvise(2) from the kernel.
///
/// # Safety
/// As for C madvise: the caller may change `[addr, addr+len)` as `advice` does.
unsafe fn kernel_madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: the caller's guarantee, for madvise.
    unsafe { sys(libc::SYS_madvise, addr, len, advice as c_long) }
}

/// Moves engine blocks in the range onto plain memory before the kernel
/// changes their mappings' protection or flags.
pub(crate) fn exempt(addr: *const c_void, len: usize) {
    if len == 0 {
        return; // the kernel changes nothing either
    }
    if let Some(e) = running() {
        let _ = with_busy(|| e.exempt(addr.cast(), len));
    }
}

fn overlaps_engine(addr: *const c_void, len: usize) -> bool {
    running()
        .and_then(|e| with_busy(|| e.overlaps(addr.cast(), len)))
        .unwrap_or(false)
}

/// # Safety
/// As for C madvise: the caller may change `[addr, addr+len)` as `advice` does.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: every arm passes on the C caller's range and advice as they
    // came, which is discard's and kernel_madvise's contract.
    unsafe {
        match advice {
            libc::MADV_DONTNEED | libc::MADV_DONTNEED_LOCKED | libc::MADV_FREE => {
                discard(addr, len, advice)
            }
            libc::MADV_REMOVE if overlaps_engine(addr, len) => {
                set_errno(libc::EINVAL);
                -1
            }
            libc::MADV_DONTFORK
            | libc::MADV_WIPEONFORK
            | libc::MADV_DONTDUMP
            | MADV_GUARD_INSTALL => {
                exempt(addr, len);
                kernel_madvise(addr, len, advice)
            }
            _ => kernel_madvise(addr, len, advice),
        }
    }
}

/// The engine discards its pages; every other part of the range gets the
/// program's advice from the kernel. Like the kernel, carries on past a failed
/// part and reports the first failure.
///
/// # Safety
/// As for C madvise with a discarding `advice`: the caller may lose the
/// contents of `[addr, addr+len)`.
unsafe fn discard(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // Misaligned, empty or wrapping ranges: the kernel gives its own answer.
    let Some(e) = running() else {
        // SAFETY: the caller's range and advice.
        return unsafe { kernel_madvise(addr, len, advice) };
    };
    let Some(rest) = with_busy(|| e.discard(addr.cast(), len)) else {
        // SAFETY: the caller's range and advice.
        return unsafe { kernel_madvise(addr, len, advice) };
    };
    if rest.len() == 1 && rest[0] == (addr as usize, len) {
        // SAFETY: the caller's range and advice.
        return unsafe { kernel_madvise(addr, len, advice) };
    }
    let mut ret = 0;
    let mut err = 0;
    for (start, n) in rest {
        // SAFETY: the engine returns parts of the caller's range (those it
        // left alone), which the caller may discard.
        if unsafe { kernel_madvise(start as *mut c_void, n, advice) } != 0 && ret == 0 {
            ret = -1;
            err = errno();
        }
    }
    if ret != 0 {
        set_errno(err);
    }
    ret
}

/// glibc ignores POSIX_MADV_DONTNEED on Linux (MADV_DONTNEED would discard
/// data, which POSIX does not allow); so do we. Returns an error number and
/// leaves errno alone.
///
/// # Safety
/// As for C posix_madvise: the caller may change `[addr, addr+len)` as
/// `advice` does.
#[no_mangle]
pub unsafe extern "C" fn posix_madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    if advice == POSIX_MADV_DONTNEED {
        return 0;
    }
    let saved = errno();
    // SAFETY: the C caller's range and advice (the remaining POSIX_MADV_*
    // values equal the MADV_* ones and only hint).
    let r = match unsafe { kernel_madvise(addr, len, advice) } {
        0 => 0,
        _ => errno(),
    };
    set_errno(saved);
    r
}

/// Makes `call`; if it failed with ENOMEM and the engine gave mappings back,
/// makes it once more. `call` answers with its result and whether it failed.
fn with_mappings<T>(call: impl Fn() -> (T, bool)) -> T {
    let (r, failed) = call();
    if !failed || errno() != libc::ENOMEM {
        return r;
    }
    let given = running()
        .and_then(|e| with_busy(|| e.give_back_mappings()))
        .unwrap_or(0);
    if given == 0 {
        set_errno(libc::ENOMEM);
        return r;
    }
    call().0
}

/// # Safety
/// As for C mprotect: the caller may change the protection of
/// `[addr, addr+len)`.
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    if prot != libc::PROT_READ | libc::PROT_WRITE {
        exempt(addr, len);
    }
    with_mappings(|| {
        // SAFETY: the C caller's range and protection, passed on.
        let r = unsafe { sys(libc::SYS_mprotect, addr, len, prot as c_long) };
        (r, r != 0)
    })
}

/// # Safety
/// As for C mmap: a MAP_FIXED mapping replaces what the caller had there.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    with_mappings(|| {
        // SAFETY: the C caller's arguments, passed on; the kernel checks them.
        let p = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
        (p as *mut c_void, p == -1)
    })
}

/// # Safety
/// As for C mmap64 (the same call on 64-bit Linux).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: the C caller's contract for mmap64, which is mmap's.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// As for C munmap: the caller gives up `[addr, addr+len)`.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    with_mappings(|| {
        // SAFETY: the C caller's range, passed on.
        let r = unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int };
        (r, r != 0)
    })
}

/// C's mremap takes the new address as a variadic fifth argument, read only
/// with MREMAP_FIXED; on x86-64 and arm64 it arrives in the register of a
/// fifth fixed argument, so this fixed signature receives it.
///
/// # Safety
/// As for C mremap: the caller's mapping at `old` may move or change size.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let fixed = flags & libc::MREMAP_FIXED != 0;
    let new_addr = if fixed {
        new_addr
    } else {
        std::ptr::null_mut()
    };
    with_mappings(|| {
        // SAFETY: the C caller's arguments, passed on; the kernel checks them.
        let p = unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) };
        (p as *mut c_void, p == -1)
    })
}

/// # Safety
/// As for C pkey_mprotect: the caller may change the protection of
/// `[addr, addr+len)`.
#[no_mangle]
pub unsafe extern "C" fn pkey_mprotect(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    pkey: c_int,
) -> c_int {
    // Any protection key, even with read-write, is a property of the mapping.
    exempt(addr, len);
    // SAFETY: the C caller's range, protection and key, passed on.
    unsafe {
        libc::syscall(
            libc::SYS_pkey_mprotect,
            addr,
            len,
            prot as c_long,
            pkey as c_long,
        ) as c_int
    }
}

/// Locked pages must stay locked: the engine's remaps would unlock them.
///
/// # Safety
/// As for C mlock: none beyond the kernel's own checks.
#[no_mangle]
pub unsafe extern "C" fn mlock(addr: *const c_void, len: usize) -> c_int {
    exempt(addr, len);
    // SAFETY: the C caller's range, passed on; mlock changes no contents.
    unsafe { sys(libc::SYS_mlock, addr as *mut c_void, len, 0) }
}

/// # Safety
/// As for C mlock2: none beyond the kernel's own checks.
#[no_mangle]
pub unsafe extern "C" fn mlock2(addr: *const c_void, len: usize, flags: std::ffi::c_uint) -> c_int {
    exempt(addr, len);
    // SAFETY: the C caller's range and flags, passed on; mlock2 changes no
    // contents.
    unsafe { sys(libc::SYS_mlock2, addr as *mut c_void, len, flags as c_long) }
}
