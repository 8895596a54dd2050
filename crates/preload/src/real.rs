//! glibc's own allocator and copy, reached without going through our hooks.

use std::ffi::c_void;
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

static MEMCPY: AtomicUsize = AtomicUsize::new(0);
static MEMMOVE: AtomicUsize = AtomicUsize::new(0);
static USABLE: AtomicUsize = AtomicUsize::new(0);

/// Looks up glibc's memcpy, memmove and malloc_usable_size. dlsym may
/// allocate; our malloc handles that (small requests go straight to glibc).
pub fn resolve() {
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
unsafe fn movsb(dst: *mut u8, src: *const u8, n: usize) {
    std::arch::asm!("rep movsb", inout("rcx") n => _, inout("rdi") dst => _, inout("rsi") src => _,
        options(nostack, preserves_flags));
}

pub unsafe fn memcpy(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    match MEMCPY.load(Ordering::Acquire) {
        0 => {
            movsb(dst.cast(), src.cast(), n);
            dst
        }
        f => std::mem::transmute::<usize, CopyFn>(f)(dst, src, n),
    }
}

pub unsafe fn memmove(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    match MEMMOVE.load(Ordering::Acquire) {
        0 => {
            if (dst as usize) <= (src as usize) || (dst as usize) >= src as usize + n {
                movsb(dst.cast(), src.cast(), n);
            } else {
                // Overlapping with dst above src: copy backwards, byte by byte.
                for i in (0..n).rev() {
                    std::ptr::write_volatile(
                        (dst as *mut u8).add(i),
                        std::ptr::read_volatile((src as *const u8).add(i)),
                    );
                }
            }
            dst
        }
        f => std::mem::transmute::<usize, CopyFn>(f)(dst, src, n),
    }
}

pub unsafe fn malloc_usable_size(p: *mut c_void) -> usize {
    match USABLE.load(Ordering::Acquire) {
        0 => 0,
        f => std::mem::transmute::<usize, UsableFn>(f)(p),
    }
}

/// The library's own heap (and so the engine's bookkeeping) is glibc's.
pub struct LibcHeap;

unsafe impl std::alloc::GlobalAlloc for LibcHeap {
    unsafe fn alloc(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.align() <= 16 {
            __libc_malloc(l.size()).cast()
        } else {
            __libc_memalign(l.align(), l.size()).cast()
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, _: std::alloc::Layout) {
        __libc_free(p.cast())
    }
    unsafe fn alloc_zeroed(&self, l: std::alloc::Layout) -> *mut u8 {
        if l.align() <= 16 {
            __libc_calloc(1, l.size()).cast()
        } else {
            let p = self.alloc(l);
            if !p.is_null() {
                std::ptr::write_bytes(p, 0, l.size());
            }
            p
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: std::alloc::Layout, new: usize) -> *mut u8 {
        if l.align() <= 16 {
            __libc_realloc(p.cast(), new).cast()
        } else {
            let q = self.alloc(std::alloc::Layout::from_size_align_unchecked(
                new,
                l.align(),
            ));
            if !q.is_null() {
                memcpy(q.cast(), p.cast(), l.size().min(new));
                __libc_free(p.cast());
            }
            q
        }
    }
}

#[global_allocator]
static HEAP: LibcHeap = LibcHeap;
