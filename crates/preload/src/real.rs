//! glibc's own allocator, copy and memset, reached without going through our hooks.

use std::ffi::{c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

extern "C" {
    pub fn __libc_malloc(size: usize) -> *mut c_void;
    pub fn __libc_free(ptr: *mut c_void);
    pub fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    pub fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    pub fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    pub fn __chk_fail() -> !;
}

type CopyFn = unsafe extern "C" fn(*mut c_void, *const c_void, usize) -> *mut c_void;
type UsableFn = unsafe extern "C" fn(*mut c_void) -> usize;
type SetFn = unsafe extern "C" fn(*mut c_void, c_int, usize) -> *mut c_void;

static MEMCPY: AtomicUsize = AtomicUsize::new(0);
static MEMMOVE: AtomicUsize = AtomicUsize::new(0);
static USABLE: AtomicUsize = AtomicUsize::new(0);
static MEMSET: AtomicUsize = AtomicUsize::new(0);

/// Looks up glibc's memcpy, memmove, memset and malloc_usable_size. dlsym may
/// allocate; our malloc handles that (small requests go straight to glibc).
pub fn resolve() {
    // SAFETY: dlsym gets RTLD_NEXT and NUL-terminated names (C string
    // literals) and returns NULL or the address of the next definition. Its
    // own allocations are small: our malloc hands them to __libc_malloc
    // without resolving anything, so dlsym is not re-entered.
    unsafe {
        let next = libc::RTLD_NEXT;
        MEMCPY.store(
            libc::dlsym(next, c"memcpy".as_ptr()) as usize,
            Ordering::Release,
        );
        MEMMOVE.store(
            libc::dlsym(next, c"memmove".as_ptr()) as usize,
            Ordering::Release,
        );
        USABLE.store(
            libc::dlsym(next, c"malloc_usable_size".as_ptr()) as usize,
            Ordering::Release,
        );
        MEMSET.store(
            libc::dlsym(next, c"memset".as_ptr()) as usize,
            Ordering::Release,
        );
    }
}

/// Resolve glibc's functions as soon as the library is loaded (after libc,
/// before the program's main), so copies before the engine starts run at
/// glibc speed; `rep movsb` and a byte loop cover only the loader's own early calls.
#[used]
#[link_section = ".init_array"]
static RESOLVE_AT_LOAD: extern "C" fn() = {
    extern "C" fn init() {
        resolve();
    }
    init
};

/// Copies forward with `rep movsb`: correct for non-overlapping ranges and
/// for dst < src. Never compiled into a call to memcpy.
///
/// # Safety
/// `src` is valid for reading and `dst` for writing `n` bytes, and the ranges
/// do not overlap or `dst` lies below `src`.
unsafe fn movsb(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: rep movsb copies rcx = n bytes from rsi = src to rdi = dst,
    // upwards (the ABI keeps the direction flag clear on entry to any
    // function); the caller guarantees both ranges, and a forward copy is
    // correct for them. It touches no stack and no flags, as declared.
    unsafe {
        std::arch::asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _, inout("rsi") src => _,
        options(nostack, preserves_flags));
    }
}

/// glibc's memcpy, or `rep movsb` until it is resolved.
///
/// # Safety
/// As for C memcpy: `src` is valid for reading and `dst` for writing `n`
/// bytes, and the ranges do not overlap.
pub unsafe fn memcpy(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    match MEMCPY.load(Ordering::Acquire) {
        0 => {
            // SAFETY: the caller's guarantee: both ranges valid, no overlap.
            unsafe { movsb(dst.cast(), src.cast(), n) };
            dst
        }
        // SAFETY: a non-zero MEMCPY is the address dlsym gave `resolve` for
        // glibc's memcpy (the next definition after ours, never this hook),
        // whose signature CopyFn is; the caller's guarantee is memcpy's.
        f => unsafe { std::mem::transmute::<usize, CopyFn>(f)(dst, src, n) },
    }
}

/// glibc's memset, or `rep stosb` until it is resolved.
///
/// # Safety
/// As for C memset: `dst` is valid for writing `n` bytes.
pub unsafe fn memset(dst: *mut c_void, c: c_int, n: usize) -> *mut c_void {
    match MEMSET.load(Ordering::Acquire) {
        0 => {
            // SAFETY: rep stosb stores al = c's low byte into rcx = n bytes
            // from rdi = dst, upwards (the direction flag is clear on entry
            // to any function); the caller guarantees the range. It touches
            // no stack and no flags, as declared.
            unsafe {
                std::arch::asm!("rep stosb", inout("rcx") n => _, inout("rdi") dst => _,
                in("al") c as u8, options(nostack, preserves_flags));
            }
            dst
        }
        // SAFETY: a non-zero MEMSET is the address dlsym gave `resolve` for
        // glibc's memset (the next definition after ours, never this hook),
        // whose signature SetFn is; the caller's guarantee is memset's.
        f => unsafe { std::mem::transmute::<usize, SetFn>(f)(dst, c, n) },
    }
}

/// glibc's memmove, or a forward `rep movsb` or backward byte loop until it
/// is resolved.
///
/// # Safety
/// As for C memmove: `src` is valid for reading and `dst` for writing `n`
/// bytes; they may overlap.
pub unsafe fn memmove(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    match MEMMOVE.load(Ordering::Acquire) {
        0 => {
            if (dst as usize) <= (src as usize) || (dst as usize) >= src as usize + n {
                // SAFETY: both ranges are valid (the caller's guarantee) and
                // either disjoint or with dst below src, where a forward
                // copy never reads a byte it has already overwritten.
                unsafe { movsb(dst.cast(), src.cast(), n) };
            } else {
                // Overlapping with dst above src: copy backwards, byte by byte.
                for i in (0..n).rev() {
                    // SAFETY: i < n, and both ranges are valid for n bytes.
                    // Volatile, so the loop is not turned into a memmove call.
                    unsafe {
                        std::ptr::write_volatile(
                            (dst as *mut u8).add(i),
                            std::ptr::read_volatile((src as *const u8).add(i)),
                        );
                    }
                }
            }
            dst
        }
        // SAFETY: a non-zero MEMMOVE is the address dlsym gave `resolve` for
        // glibc's memmove, whose signature CopyFn is; the caller's guarantee
        // is memmove's.
        f => unsafe { std::mem::transmute::<usize, CopyFn>(f)(dst, src, n) },
    }
}

/// glibc's malloc_usable_size; 0 until it is resolved.
///
/// # Safety
/// `p` is NULL or a live chunk of glibc's allocator (never an engine block).
pub unsafe fn malloc_usable_size(p: *mut c_void) -> usize {
    match USABLE.load(Ordering::Acquire) {
        0 => 0,
        // SAFETY: a non-zero USABLE is the address dlsym gave `resolve` for
        // glibc's malloc_usable_size, whose signature UsableFn is; `p` is
        // NULL or glibc's own chunk (the caller's guarantee).
        f => unsafe { std::mem::transmute::<usize, UsableFn>(f)(p) },
    }
}

/// This thread's errno.
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns the address of the calling thread's
    // errno, valid for as long as the thread lives.
    unsafe { *libc::__errno_location() }
}

/// Sets this thread's errno, as the C functions we stand in for do on failure.
pub fn set_errno(e: c_int) {
    // SAFETY: as in `errno`: the calling thread's own errno.
    unsafe { *libc::__errno_location() = e };
}

/// The library's own heap (and so the engine's bookkeeping) is glibc's.
pub struct LibcHeap;

// SAFETY: every block comes from glibc's allocator through its internal
// entry points (never our exported malloc, so never the engine) and goes
// back to it: sizes and alignments are honoured (__libc_malloc and
// __libc_calloc align to 16 bytes on x86-64, __libc_memalign serves larger
// alignments), nothing here unwinds, and nothing calls Rust's allocator.
unsafe impl std::alloc::GlobalAlloc for LibcHeap {
    /// # Safety
    /// As for `GlobalAlloc::alloc`: `l` has a non-zero size.
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.align() <= 16 {
            // SAFETY: no precondition; glibc's malloc aligns to 16 bytes.
            unsafe { __libc_malloc(l.size()).cast() }
        } else {
            // SAFETY: a Layout's alignment is a power of two, as memalign needs.
            unsafe { __libc_memalign(l.align(), l.size()).cast() }
        }
    }
    /// # Safety
    /// As for `GlobalAlloc::dealloc`: `p` came from this allocator and is not
    /// used again.
    unsafe fn dealloc(&self, p: *mut u8, _: std::alloc::Layout) {
        // SAFETY: p came from __libc_malloc, __libc_calloc, __libc_memalign
        // or __libc_realloc (the methods here) and is not used again.
        unsafe { __libc_free(p.cast()) }
    }
    /// # Safety
    /// As for `GlobalAlloc::alloc_zeroed`: `l` has a non-zero size.
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.align() <= 16 {
            // SAFETY: no precondition; glibc's calloc aligns to 16 bytes and
            // zero-fills.
            unsafe { __libc_calloc(1, l.size()).cast() }
        } else {
            // SAFETY: `l` is the caller's layout, of non-zero size.
            let p = unsafe { self.alloc(l) };
            if !p.is_null() {
                // SAFETY: p is a fresh block of l.size() bytes.
                unsafe { std::ptr::write_bytes(p, 0, l.size()) };
            }
            p
        }
    }
    /// # Safety
    /// As for `GlobalAlloc::realloc`: `p` came from this allocator with
    /// layout `l`, and `new` (non-zero) rounded up to `l.align()` does not
    /// exceed isize::MAX.
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        if l.align() <= 16 {
            // SAFETY: p is a live chunk of glibc's allocator (the caller's
            // guarantee); realloc keeps its 16-byte alignment.
            unsafe { __libc_realloc(p.cast(), new).cast() }
        } else {
            // SAFETY: the caller guarantees that `new` with `l.align()`
            // (a power of two) makes a valid layout, of non-zero size.
            let q = unsafe {
                self.alloc(std::alloc::Layout::from_size_align_unchecked(
                    new,
                    l.align(),
                ))
            };
            if !q.is_null() {
                // SAFETY: p holds l.size() bytes and q new bytes; q is a fresh
                // block, so they do not overlap. p is live until the free, and
                // the caller does not use it afterwards.
                unsafe {
                    memcpy(q.cast(), p.cast(), l.size().min(new));
                    __libc_free(p.cast());
                }
            }
            q
        }
    }
}

#[global_allocator]
static HEAP: LibcHeap = LibcHeap;

/// The next definition of `name` after this library (the one the program
/// meant to call), looked up once and kept in `cache`; 0 if there is none.
pub fn next(cache: &AtomicUsize, name: &CStr) -> usize {
    match cache.load(Ordering::Acquire) {
        0 => {
            // SAFETY: dlsym gets RTLD_NEXT and a NUL-terminated name, and
            // returns NULL or the address of the next definition. Its own
            // allocations are small and go to glibc through our malloc.
            let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
            cache.store(f, Ordering::Release);
            f
        }
        f => f,
    }
}
