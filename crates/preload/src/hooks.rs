//! The exported symbols: malloc family, memcpy, memmove and their fortified
//! variants. Each decides engine or glibc and never fails where glibc would not.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use pagefold_engine::{Hint, PAGE};

use crate::global::{engine, note_free, running, with_busy, COPY_MIN, THRESHOLD};
use crate::real;

fn large(n: usize) -> bool {
    n >= THRESHOLD.load(Ordering::Relaxed)
}

/// An engine block for `n` bytes, if the engine takes it. `Hint::Uninit`
/// (all but calloc) lets a recently freed block of the same size come back.
fn engine_alloc(n: usize, hint: Hint) -> *mut c_void {
    // The configured threshold is read as the engine starts, in this very call.
    match engine()
        .filter(|_| large(n))
        .and_then(|e| with_busy(|| e.alloc(n, hint)))
    {
        Some(p) => p.cast(),
        None => std::ptr::null_mut(),
    }
}

/// Length of the engine block at `p`, if `p` is one. Only page-aligned
/// pointers can be, which spares glibc's pointers the engine's lock.
fn engine_len(p: *mut c_void) -> Option<usize> {
    if p as usize % PAGE != 0 {
        return None;
    }
    let e = running()?;
    with_busy(|| e.block_len(p.cast())).flatten()
}

#[no_mangle]
pub unsafe extern "C" fn malloc(n: usize) -> *mut c_void {
    if large(n) {
        let p = engine_alloc(n, Hint::Uninit);
        if !p.is_null() {
            return p;
        }
    }
    real::__libc_malloc(n)
}

#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        *libc::__errno_location() = libc::ENOMEM;
        return std::ptr::null_mut();
    };
    if large(total) {
        // Engine blocks start zero-filled.
        let p = engine_alloc(total, Hint::None);
        if !p.is_null() {
            return p;
        }
    }
    real::__libc_calloc(n, size)
}

#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    if p as usize % PAGE == 0 {
        if let Some(e) = running() {
            match with_busy(|| e.block_len(p.cast()).map(|len| (len, e.free(p.cast())))) {
                Some(Some((len, _))) => return note_free(len, e),
                Some(None) => {}
                // Inside the engine (a signal handler interrupting it): an
                // engine block cannot be told apart now; leaking beats crashing.
                None => return,
            }
        }
    }
    real::__libc_free(p)
}

#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(n);
    }
    if n == 0 {
        free(p);
        return std::ptr::null_mut();
    }
    if let Some(old) = engine_len(p) {
        if n <= old && large(n) {
            // Shrinking in place: the pages past the new end are released
            // (glibc shrinks its mmapped chunks too). If refused, p stays whole.
            if let Some(e) = running() {
                let _ = with_busy(|| e.shrink(p.cast(), n));
            }
            return p;
        }
        let q = malloc(n);
        if !q.is_null() {
            // Between two engine blocks at equal page offsets: a virtual copy.
            memcpy(q, p, old.min(n));
            free(p);
        }
        return q;
    }
    if large(n) {
        let q = engine_alloc(n, Hint::Uninit);
        if !q.is_null() {
            real::memcpy(q, p, real::malloc_usable_size(p).min(n));
            real::__libc_free(p);
            return q;
        }
    }
    real::__libc_realloc(p, n)
}

#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    engine_len(p).unwrap_or_else(|| real::malloc_usable_size(p))
}

/// Aligned allocation: the engine's blocks are page-aligned, so it serves any
/// alignment up to a page.
unsafe fn aligned(align: usize, n: usize) -> *mut c_void {
    if large(n) && align <= PAGE {
        let p = engine_alloc(n, Hint::Uninit);
        if !p.is_null() {
            return p;
        }
    }
    real::__libc_memalign(align, n)
}

#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, n: usize) -> i32 {
    if !align.is_power_of_two() || align % std::mem::size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    let p = aligned(align, n);
    if p.is_null() {
        return libc::ENOMEM;
    }
    *out = p;
    0
}

#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, n: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        *libc::__errno_location() = libc::EINVAL;
        return std::ptr::null_mut();
    }
    aligned(align, n)
}

#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, n: usize) -> *mut c_void {
    aligned(align, n)
}

#[no_mangle]
pub unsafe extern "C" fn valloc(n: usize) -> *mut c_void {
    aligned(PAGE, n)
}

#[no_mangle]
pub unsafe extern "C" fn pvalloc(n: usize) -> *mut c_void {
    aligned(PAGE, n.div_ceil(PAGE).max(1) * PAGE)
}

/// A large copy is offered to the engine, which shares whole pages between
/// its blocks and copies everything else plainly. Below COPY_MIN a mapping
/// change costs more than the copy it saves (and a row-by-row copy into an
/// array would take the engine's lock for every row), so glibc copies.
unsafe fn engine_copy(dst: *mut c_void, src: *const c_void, n: usize) -> bool {
    if n < COPY_MIN.load(Ordering::Relaxed) {
        return false;
    }
    let Some(e) = running() else { return false };
    with_busy(|| e.copy(dst.cast(), src.cast(), n)).is_some()
}

#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    if !engine_copy(dst, src, n) {
        real::memcpy(dst, src, n);
    }
    dst
}

#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    if !engine_copy(dst, src, n) {
        real::memmove(dst, src, n);
    }
    dst
}

#[no_mangle]
pub unsafe extern "C" fn __memcpy_chk(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    dst_len: usize,
) -> *mut c_void {
    if dst_len < n {
        real::__chk_fail();
    }
    memcpy(dst, src, n)
}

#[no_mangle]
pub unsafe extern "C" fn __memmove_chk(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    dst_len: usize,
) -> *mut c_void {
    if dst_len < n {
        real::__chk_fail();
    }
    memmove(dst, src, n)
}
