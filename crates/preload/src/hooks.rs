//! The exported symbols: malloc family, memcpy, memmove, memset and their
//! fortified variants. Each decides engine or glibc and never fails where glibc would not.
//!
//! Each is called by C code in place of glibc's function of the same name,
//! so its `# Safety` section is that function's contract, which the C caller
//! keeps. Recursion is excluded the same way everywhere: glibc is reached
//! through its internal entry points (`__libc_malloc` and friends) or
//! through the addresses dlsym gave for the next definition, never through
//! these symbols; and every call into the engine goes through `with_busy`,
//! so a copy or allocation the engine itself makes while it holds its lock
//! (or one made on its scanner thread) finds the thread busy and goes
//! straight to glibc instead of entering the engine again.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pagefold_engine::{Hint, PAGE};

use crate::global::{engine, note_free, running, with_busy, COPY_MIN, THRESHOLD};
use crate::placement;
use crate::real::{self, set_errno};

fn large(n: usize) -> bool {
    n >= THRESHOLD.load(Ordering::Relaxed)
}

/// An engine block for `n` bytes, if the engine takes it (below glibc's
/// largest mmap threshold it leaves sizes that are not copied from to
/// glibc's heap, and at that size and above a malloc glibc can serve from
/// memory freed into its heap). `Hint::Uninit` (all but calloc) lets a recently freed
/// block of the same size come back.
fn engine_alloc(n: usize, hint: Hint) -> *mut c_void {
    // The configured threshold is read as the engine starts, in this very call.
    match engine().filter(|_| large(n)).and_then(|e| {
        with_busy(|| {
            let free = if e.heap_matters(n, hint) {
                heap_free(n)
            } else {
                0
            };
            e.take_beside_heap(n, hint, free)
        })
        .flatten()
    }) {
        Some(p) => p.cast(),
        None => std::ptr::null_mut(),
    }
}

/// Bytes glibc holds freed in its arenas (free chunks and the unused top of
/// each heap), which it hands out again before it maps fresh memory, for a
/// malloc of `n` bytes the engine may leave to the heap (32 MiB and up by
/// default). Counting walks the arenas' free lists, one step per free
/// chunk: R's glm heap took 0.2-4.6 ms a count (29 counts, 23 ms in a 14 s
/// run), where each block left to the heap spares thousands of page faults;
/// a heap fragmented into a million free chunks takes 0.3 s. A count that
/// took longer than `COUNT_NS_PER_PAGE` per page of the block it was for
/// (what faulting the block in costs on a slow day of our machine; loaded,
/// glm's counts take several times their quiet time, and must not trip it)
/// is not made again: the engine then takes such mallocs, as with heap
/// first off.
fn heap_free(n: usize) -> usize {
    if HEAP_COUNT_SLOW.load(Ordering::Relaxed) {
        return 0;
    }
    let t0 = std::time::Instant::now();
    // SAFETY: mallinfo2 has no precondition; it takes glibc's arena locks,
    // which no caller of a malloc hook holds, and does not allocate.
    let free = unsafe { libc::mallinfo2() }.fordblks;
    let limit_ns = (n / PAGE) as u128 * COUNT_NS_PER_PAGE;
    if t0.elapsed().as_nanos() > limit_ns {
        HEAP_COUNT_SLOW.store(true, Ordering::Relaxed);
    }
    free
}

/// Most a count of glibc's freed bytes may take per page of the block it is
/// for (`heap_free`).
const COUNT_NS_PER_PAGE: u128 = 4000;
/// Set once a count took longer than its limit.
static HEAP_COUNT_SLOW: AtomicBool = AtomicBool::new(false);

/// Gives glibc's freed heap memory back to the kernel (`malloc_trim`): the
/// engine calls this while memory is short (`Engine::on_memory_short`).
/// glibc returns only the top of a heap on free; chunks freed below it stay
/// resident until reused, and under a memory limit the kernel swaps them
/// out, writing garbage to swap and reading it back when glibc hands the
/// chunk out again. Trimmed, their pages come back as fresh zero pages.
/// A trim walks the arenas' free chunks under their locks, as a count does
/// (`heap_free`); one that took longer than `TRIM_SLOW_NS` is not made
/// again. Answers whether glibc released memory.
pub fn trim_heap() -> bool {
    if HEAP_TRIM_SLOW.load(Ordering::Relaxed) {
        return false;
    }
    let t0 = std::time::Instant::now();
    // SAFETY: malloc_trim has no precondition; it takes glibc's arena locks,
    // which the engine's scanner thread (its only caller) never holds.
    let released = unsafe { libc::malloc_trim(0) } != 0;
    if t0.elapsed().as_nanos() > TRIM_SLOW_NS.load(Ordering::Relaxed) as u128 {
        HEAP_TRIM_SLOW.store(true, Ordering::Relaxed);
    }
    released
}

/// Longest a trim of glibc's heap may take and be made again: 5% of the
/// clock interval it runs in at most once. `PAGEFOLD_INJECT_SLOW_TRIM=1`
/// makes it 0, so the first trim is the last.
pub static TRIM_SLOW_NS: AtomicU64 = AtomicU64::new(25_000_000);
/// Set once a trim took longer than `TRIM_SLOW_NS`.
static HEAP_TRIM_SLOW: AtomicBool = AtomicBool::new(false);

/// A large allocation of `n` bytes from the engine, started where its size
/// class's copies line up (placement.rs); null if the engine does not take it.
fn engine_malloc(n: usize) -> *mut c_void {
    let offset = placement::offset_for(n);
    if offset > 0 {
        if let Some(total) = n.checked_add(offset) {
            let base = engine_alloc(total, Hint::Uninit);
            if !base.is_null() {
                // SAFETY: the block is `total` bytes, so base + offset and the
                // n bytes after it lie inside it.
                let p = unsafe { base.cast::<u8>().add(offset) };
                if placement::insert(p as usize) {
                    return p.cast();
                }
                return base;
            }
        }
    }
    engine_alloc(n, Hint::Uninit)
}

/// The engine block `p` starts or was placed in: (block start, offset of `p`).
/// Only page-aligned pointers and placed ones can be, which spares glibc's
/// pointers the engine's lock.
fn engine_block(p: *mut c_void) -> Option<(*mut c_void, usize)> {
    let offset = (p as usize) % PAGE;
    if offset == 0 || placement::contains(p as usize) {
        Some(((p as usize - offset) as *mut c_void, offset))
    } else {
        None
    }
}

/// Usable length of the engine allocation at `p`, if `p` is one.
fn engine_len(p: *mut c_void) -> Option<usize> {
    let (base, offset) = engine_block(p)?;
    let e = running()?;
    with_busy(|| e.block_len(base.cast()))
        .flatten()
        .map(|len| len - offset)
}

/// # Safety
/// As for C malloc: none.
#[no_mangle]
pub unsafe extern "C" fn malloc(n: usize) -> *mut c_void {
    if large(n) {
        let p = engine_malloc(n);
        if !p.is_null() {
            return p;
        }
    }
    // SAFETY: glibc's malloc has no precondition; its internal entry point
    // never comes back to this hook.
    unsafe { real::__libc_malloc(n) }
}

/// # Safety
/// As for C calloc: none.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(size) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    if large(total) {
        // Engine blocks start zero-filled.
        let p = engine_alloc(total, Hint::Zeroed);
        if !p.is_null() {
            return p;
        }
    }
    // SAFETY: glibc's calloc has no precondition; its internal entry point
    // never comes back to this hook.
    unsafe { real::__libc_calloc(n, size) }
}

/// # Safety
/// As for C free: `p` is NULL or a live block from this library's malloc
/// family (engine or glibc), not used after this call.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    if let Some((base, offset)) = engine_block(p) {
        if let Some(e) = running() {
            let freed = with_busy(|| {
                e.block_len(base.cast()).map(|len| {
                    // SAFETY: base is the start of one of the engine's blocks
                    // (block_len knows it), whose allocation the C caller
                    // gives up with this call.
                    (len, unsafe { e.free(base.cast()) })
                })
            });
            if offset > 0 && matches!(freed, Some(Some(_))) {
                placement::remove(p as usize);
            }
            match freed {
                Some(Some((len, _))) => return note_free(len, e),
                // A placed pointer the engine does not know: not glibc's either.
                Some(None) if offset > 0 => return,
                Some(None) => {}
                // Inside the engine (a signal handler interrupting it): an
                // engine block cannot be told apart now; leaking beats crashing.
                None => return,
            }
        }
    }
    // SAFETY: p is a live block of our malloc family (the C caller's
    // guarantee) and not an engine allocation (those are page-aligned or in
    // the placement set, exist only while the engine runs, and the engine did
    // not know this one), so it is glibc's chunk, given back to glibc.
    unsafe { real::__libc_free(p) }
}

/// # Safety
/// As for C realloc: `p` is NULL or a live block from this library's malloc
/// family, not used after this call unless the result is NULL with `n` > 0.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    if p.is_null() {
        // SAFETY: malloc has no precondition.
        return unsafe { malloc(n) };
    }
    if n == 0 {
        // SAFETY: p is a live block, given up by the caller.
        unsafe { free(p) };
        return std::ptr::null_mut();
    }
    if let Some(old) = engine_len(p) {
        if n <= old && large(n) {
            // Shrinking in place: the pages past the new end are released
            // (glibc shrinks its mmapped chunks too). If refused, p stays
            // whole; a placed allocation always does.
            if let Some(e) = running().filter(|_| (p as usize).is_multiple_of(PAGE)) {
                let _ = with_busy(|| e.shrink(p.cast(), n));
            }
            return p;
        }
        // SAFETY: malloc has no precondition.
        let q = unsafe { malloc(n) };
        if !q.is_null() {
            // SAFETY: p is a live engine block of `old` bytes and q a fresh
            // block of at least n bytes, so both hold old.min(n) bytes and do
            // not overlap; p is freed once, after the copy, and the caller
            // does not use it again. Between two engine blocks at equal page
            // offsets the copy is a virtual one.
            unsafe {
                memcpy(q, p, old.min(n));
                free(p);
            }
        }
        return q;
    }
    if large(n) {
        let q = engine_malloc(n);
        if !q.is_null() {
            // SAFETY: p is not an engine block (see the last call below),
            // so it is a live glibc chunk of malloc_usable_size(p) bytes; q is a fresh engine block of at
            // least n bytes, disjoint from it. p goes back to glibc once,
            // after the copy, and the caller does not use it again.
            unsafe {
                real::memcpy(q, p, real::malloc_usable_size(p).min(n));
                real::__libc_free(p);
            }
            return q;
        }
    }
    // SAFETY: p is a live block (the caller's guarantee) that engine_len
    // did not know, so a glibc chunk: engine_len knows every engine block
    // except on a thread inside the engine, which can reach realloc only
    // from a signal handler, where realloc is not allowed (it is not
    // async-signal-safe). glibc's internal realloc never comes back here.
    unsafe { real::__libc_realloc(p, n) }
}

/// # Safety
/// As for C malloc_usable_size: `p` is NULL or a live block from this
/// library's malloc family.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if p.is_null() {
        return 0;
    }
    // SAFETY: p is live (the caller's guarantee) and, if engine_len does not
    // know it, glibc's chunk (as in `realloc`: a thread inside the engine
    // does not call this, which is not async-signal-safe).
    engine_len(p).unwrap_or_else(|| unsafe { real::malloc_usable_size(p) })
}

/// Aligned allocation: the engine's blocks are page-aligned, so it serves any
/// alignment up to a page.
fn aligned(align: usize, n: usize) -> *mut c_void {
    if large(n) && align <= PAGE {
        let p = engine_alloc(n, Hint::Uninit);
        if !p.is_null() {
            return p;
        }
    }
    // SAFETY: glibc's memalign has no memory-safety precondition (it rejects
    // a bad alignment itself) and never comes back to these hooks.
    unsafe { real::__libc_memalign(align, n) }
}

/// # Safety
/// As for C posix_memalign: `out` is valid for writing one pointer.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, n: usize) -> i32 {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    let p = aligned(align, n);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the C caller guarantees `out` is writable.
    unsafe { *out = p };
    0
}

/// # Safety
/// As for C aligned_alloc: none.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, n: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    aligned(align, n)
}

/// # Safety
/// As for C memalign: none.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, n: usize) -> *mut c_void {
    aligned(align, n)
}

/// # Safety
/// As for C valloc: none.
#[no_mangle]
pub unsafe extern "C" fn valloc(n: usize) -> *mut c_void {
    aligned(PAGE, n)
}

/// # Safety
/// As for C pvalloc: none.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(n: usize) -> *mut c_void {
    aligned(PAGE, n.div_ceil(PAGE).max(1) * PAGE)
}

/// A large copy is offered to the engine, which shares whole pages between
/// its blocks and copies everything else plainly. Below COPY_MIN a mapping
/// change costs more than the copy it saves (and a row-by-row copy into an
/// array would take the engine's lock for every row), so glibc copies.
/// True if the engine made the copy.
///
/// # Safety
/// As for memmove: `src` is valid for reading and `dst` for writing `n` bytes.
unsafe fn engine_copy(dst: *mut c_void, src: *const c_void, n: usize) -> bool {
    if n < COPY_MIN.load(Ordering::Relaxed) {
        return false;
    }
    let Some(e) = running() else { return false };
    with_busy(|| {
        if (dst as usize) % PAGE != (src as usize) % PAGE && n >= 2 * PAGE {
            learn_placement(e, dst as usize, src as usize);
        }
        // SAFETY: the engine's copy has memmove's contract, which the caller
        // keeps. The plain copies it makes inside call this library's memcpy,
        // which finds the thread busy and hands them to glibc.
        unsafe { e.copy(dst.cast(), src.cast(), n) }
    })
    .is_some()
}

/// A copy between two engine blocks at different offsets within their pages
/// cannot be mapped: the destination's size class learns where its
/// allocations should start for the next such copy to line up (placement.rs).
fn learn_placement(e: &pagefold_engine::Engine, dst: usize, src: usize) {
    if e.block_of(src as *const u8).is_none() {
        return;
    }
    if let Some((base, len)) = e.block_of(dst as *const u8) {
        let (class, offset) = placement::lesson(dst, src, base as usize, len);
        placement::learn(class, offset);
    }
}

/// # Safety
/// As for C memcpy: `src` is valid for reading and `dst` for writing `n`
/// bytes, and the ranges do not overlap.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    // SAFETY: the C caller's guarantee covers both copies (the engine's has
    // memmove's weaker contract); real::memcpy is glibc's, never this hook.
    unsafe {
        if !engine_copy(dst, src, n) {
            real::memcpy(dst, src, n);
        }
    }
    dst
}

/// # Safety
/// As for C memmove: `src` is valid for reading and `dst` for writing `n`
/// bytes; they may overlap.
#[no_mangle]
pub unsafe extern "C" fn memmove(dst: *mut c_void, src: *const c_void, n: usize) -> *mut c_void {
    // SAFETY: the C caller's guarantee is memmove's, as both copies need;
    // real::memmove is glibc's, never this hook.
    unsafe {
        if !engine_copy(dst, src, n) {
            real::memmove(dst, src, n);
        }
    }
    dst
}

/// A large zeroing of engine memory is offered to the engine, which leaves
/// out the whole pages that read zero already (Engine::zero): R clears
/// every fresh vector it makes with `integer(n)` or `numeric(n)`, and the
/// part the program never writes afterwards stays on the zero page instead
/// of costing a fault and a page of zeros each. True if the engine did it.
///
/// # Safety
/// As for memset: `dst` is valid for writing `n` bytes.
unsafe fn engine_zero(dst: *mut c_void, n: usize) -> bool {
    if n < COPY_MIN.load(Ordering::Relaxed) {
        return false;
    }
    let Some(e) = running() else { return false };
    // SAFETY: the engine's zero has memset's contract, which the caller
    // keeps. The plain zeroing it does inside calls this library's memset,
    // which finds the thread busy and hands it to glibc.
    with_busy(|| unsafe { e.zero(dst.cast(), n) }).unwrap_or(false)
}

/// # Safety
/// As for C memset: `dst` is valid for writing `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn memset(dst: *mut c_void, c: c_int, n: usize) -> *mut c_void {
    // SAFETY: the C caller's guarantee covers both; real::memset is
    // glibc's, never this hook.
    unsafe {
        if c as u8 != 0 || !engine_zero(dst, n) {
            real::memset(dst, c, n);
        }
    }
    dst
}

/// # Safety
/// As for glibc's __memset_chk: as memset, and `dst_len` is at most the size
/// of the object at `dst` (a compiler-computed bound).
#[no_mangle]
pub unsafe extern "C" fn __memset_chk(
    dst: *mut c_void,
    c: c_int,
    n: usize,
    dst_len: usize,
) -> *mut c_void {
    if dst_len < n {
        // SAFETY: no precondition; glibc reports the overflow and aborts.
        unsafe { real::__chk_fail() };
    }
    // SAFETY: memset's contract is the C caller's, and n fits in dst_len.
    unsafe { memset(dst, c, n) }
}

/// # Safety
/// As for glibc's __memcpy_chk: as memcpy, and `dst_len` is at most the size
/// of the object at `dst` (a compiler-computed bound).
#[no_mangle]
pub unsafe extern "C" fn __memcpy_chk(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    dst_len: usize,
) -> *mut c_void {
    if dst_len < n {
        // SAFETY: no precondition; glibc reports the overflow and aborts.
        unsafe { real::__chk_fail() };
    }
    // SAFETY: memcpy's contract is the C caller's, and n fits in dst_len.
    unsafe { memcpy(dst, src, n) }
}

/// # Safety
/// As for glibc's __memmove_chk: as memmove, and `dst_len` is at most the
/// size of the object at `dst` (a compiler-computed bound).
#[no_mangle]
pub unsafe extern "C" fn __memmove_chk(
    dst: *mut c_void,
    src: *const c_void,
    n: usize,
    dst_len: usize,
) -> *mut c_void {
    if dst_len < n {
        // SAFETY: no precondition; glibc reports the overflow and aborts.
        unsafe { real::__chk_fail() };
    }
    // SAFETY: memmove's contract is the C caller's, and n fits in dst_len.
    unsafe { memmove(dst, src, n) }
}
