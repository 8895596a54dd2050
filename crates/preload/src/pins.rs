//! Registrations that pin memory for long: io_uring fixed buffers and RDMA
//! memory regions.
//!
//! A program that registers a buffer with io_uring (`IORING_REGISTER_BUFFERS`)
//! or an RDMA device (`ibv_reg_mr`) has the kernel pin the buffer's pages
//! until it unregisters them, and every later I/O on the buffer reads and
//! writes those very pages, whatever the page table says by then. Were the
//! engine to fold, merge or evict such a page, the device would go on
//! writing the old page while the program reads the new one: a lost write.
//! The engine's pin guard and pin age cover pins the kernel takes for one
//! I/O; a registration outlives any age. So the preload interposes the
//! library calls that register buffers (liburing's and libibverbs'), takes
//! the engine blocks under each buffer out of the engine's hands first (moved
//! onto plain anonymous memory, never scanned, remapped or shared again, as
//! mlock'd blocks are), and then calls the library. A program that registers
//! through a raw system call goes unseen (docs/MECHANISMS.md, "Correctness
//! boundaries").
//!
//! Each hook finds the library's own function with `dlsym(RTLD_NEXT)`: the
//! program called it, so its library is loaded. Should it not be found, the
//! call fails as a missing function would (ENOSYS), never on the wrong memory.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::AtomicUsize;

use crate::real::{next, set_errno};
use crate::vm::exempt;

/// Exempts the buffers of `n` iovecs at `iov` (none if `iov` is null).
///
/// # Safety
/// `iov` is null or points to `n` readable iovecs, as the registering call requires.
unsafe fn exempt_iovecs(iov: *const libc::iovec, n: c_uint) {
    if iov.is_null() {
        return;
    }
    for k in 0..n as usize {
        // SAFETY: the caller's guarantee: iovec k of n is readable.
        let v = unsafe { *iov.add(k) };
        if !v.iov_base.is_null() {
            exempt(v.iov_base, v.iov_len);
        }
    }
}

/// `struct io_uring_buf_reg`'s first fields: where a provided-buffer ring
/// lies and how many 16-byte entries it has.
#[repr(C)]
pub struct BufReg {
    ring_addr: u64,
    ring_entries: u32,
}

/// Size of one entry of a provided-buffer ring (`struct io_uring_buf`).
const BUF_RING_ENTRY: usize = 16;

type RegisterBuffers = unsafe extern "C" fn(*mut c_void, *const libc::iovec, c_uint) -> c_int;
type RegisterBuffersTags =
    unsafe extern "C" fn(*mut c_void, *const libc::iovec, *const u64, c_uint) -> c_int;
type UpdateTag =
    unsafe extern "C" fn(*mut c_void, c_uint, *const libc::iovec, *const u64, c_uint) -> c_int;
type RegisterBufRing = unsafe extern "C" fn(*mut c_void, *mut BufReg, c_uint) -> c_int;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void;
type RegMrIova = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64, c_int) -> *mut c_void;
type RegMrIova2 = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64, c_uint) -> *mut c_void;

static REGISTER_BUFFERS: AtomicUsize = AtomicUsize::new(0);
static REGISTER_BUFFERS_TAGS: AtomicUsize = AtomicUsize::new(0);
static UPDATE_TAG: AtomicUsize = AtomicUsize::new(0);
static REGISTER_BUF_RING: AtomicUsize = AtomicUsize::new(0);
static REG_MR: AtomicUsize = AtomicUsize::new(0);
static REG_MR_IOVA: AtomicUsize = AtomicUsize::new(0);
static REG_MR_IOVA2: AtomicUsize = AtomicUsize::new(0);

/// liburing's error for a missing function: a negative errno.
const NO_FUNCTION: c_int = -libc::ENOSYS;

/// liburing's `io_uring_register_buffers`.
///
/// # Safety
/// As for liburing's: `iovecs` points to `nr` iovecs describing the caller's buffers.
#[no_mangle]
pub unsafe extern "C" fn io_uring_register_buffers(
    ring: *mut c_void,
    iovecs: *const libc::iovec,
    nr: c_uint,
) -> c_int {
    // SAFETY: the C caller's iovecs, as liburing's contract requires them.
    unsafe { exempt_iovecs(iovecs, nr) };
    match next(&REGISTER_BUFFERS, c"io_uring_register_buffers") {
        0 => NO_FUNCTION,
        // SAFETY: the next definition of this very function, with the caller's arguments.
        f => unsafe { std::mem::transmute::<usize, RegisterBuffers>(f)(ring, iovecs, nr) },
    }
}

/// liburing's `io_uring_register_buffers_tags`.
///
/// # Safety
/// As for liburing's: `iovecs` and `tags` point to `nr` entries each.
#[no_mangle]
pub unsafe extern "C" fn io_uring_register_buffers_tags(
    ring: *mut c_void,
    iovecs: *const libc::iovec,
    tags: *const u64,
    nr: c_uint,
) -> c_int {
    // SAFETY: the C caller's iovecs, as liburing's contract requires them.
    unsafe { exempt_iovecs(iovecs, nr) };
    match next(&REGISTER_BUFFERS_TAGS, c"io_uring_register_buffers_tags") {
        0 => NO_FUNCTION,
        // SAFETY: the next definition of this very function, with the caller's arguments.
        f => unsafe {
            std::mem::transmute::<usize, RegisterBuffersTags>(f)(ring, iovecs, tags, nr)
        },
    }
}

/// liburing's `io_uring_register_buffers_update_tag`.
///
/// # Safety
/// As for liburing's: `iovecs` and `tags` point to `nr` entries each.
#[no_mangle]
pub unsafe extern "C" fn io_uring_register_buffers_update_tag(
    ring: *mut c_void,
    off: c_uint,
    iovecs: *const libc::iovec,
    tags: *const u64,
    nr: c_uint,
) -> c_int {
    // SAFETY: the C caller's iovecs, as liburing's contract requires them.
    unsafe { exempt_iovecs(iovecs, nr) };
    match next(&UPDATE_TAG, c"io_uring_register_buffers_update_tag") {
        0 => NO_FUNCTION,
        // SAFETY: the next definition of this very function, with the caller's arguments.
        f => unsafe { std::mem::transmute::<usize, UpdateTag>(f)(ring, off, iovecs, tags, nr) },
    }
}

/// liburing's `io_uring_register_buf_ring`: the ring of provided buffers
/// is pinned (the buffers it lists are not).
///
/// # Safety
/// As for liburing's: `reg` points to a filled `struct io_uring_buf_reg`.
#[no_mangle]
pub unsafe extern "C" fn io_uring_register_buf_ring(
    ring: *mut c_void,
    reg: *mut BufReg,
    flags: c_uint,
) -> c_int {
    if !reg.is_null() {
        // SAFETY: the caller's guarantee: reg is a readable io_uring_buf_reg.
        let (addr, entries) = unsafe { ((*reg).ring_addr, (*reg).ring_entries) };
        exempt(addr as *const c_void, entries as usize * BUF_RING_ENTRY);
    }
    match next(&REGISTER_BUF_RING, c"io_uring_register_buf_ring") {
        0 => NO_FUNCTION,
        // SAFETY: the next definition of this very function, with the caller's arguments.
        f => unsafe { std::mem::transmute::<usize, RegisterBufRing>(f)(ring, reg, flags) },
    }
}

/// libibverbs' error for a missing function: NULL with errno set.
fn no_region() -> *mut c_void {
    set_errno(libc::ENOSYS);
    std::ptr::null_mut()
}

/// libibverbs' `ibv_reg_mr`.
///
/// # Safety
/// As for libibverbs': `addr` and `length` describe the caller's buffer.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut c_void {
    exempt(addr, length);
    match next(&REG_MR, c"ibv_reg_mr") {
        0 => no_region(),
        // SAFETY: the next definition of this very function, with the caller's arguments.
        f => unsafe { std::mem::transmute::<usize, RegMr>(f)(pd, addr, length, access) },
    }
}

/// libibverbs' `ibv_reg_mr_iova`.
///
/// # Safety
/// As for libibverbs': `addr` and `length` describe the caller's buffer.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut c_void {
    exempt(addr, length);
    match next(&REG_MR_IOVA, c"ibv_reg_mr_iova") {
        0 => no_region(),
        // SAFETY: the next definition of this very function, with the caller's arguments.
        f => unsafe { std::mem::transmute::<usize, RegMrIova>(f)(pd, addr, length, iova, access) },
    }
}

/// libibverbs' `ibv_reg_mr_iova2`.
///
/// # Safety
/// As for libibverbs': `addr` and `length` describe the caller's buffer.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut c_void {
    exempt(addr, length);
    match next(&REG_MR_IOVA2, c"ibv_reg_mr_iova2") {
        0 => no_region(),
        // SAFETY: the next definition of this very function, with the caller's arguments.
        f => unsafe { std::mem::transmute::<usize, RegMrIova2>(f)(pd, addr, length, iova, access) },
    }
}
