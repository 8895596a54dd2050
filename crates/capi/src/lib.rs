//! C ABI for the pagefold engine: `libpagefold.so` / `libpagefold.a` and the
//! hand-written header `include/pagefold.h`.
//!
//! pagefold's main job is the LD_PRELOAD library, which guesses from outside
//! which allocations and copies matter. Programs that *know* their copies
//! (an interpreter with pass-by-value vectors, a data-frame library, a
//! snapshotting server) do better by asking the engine directly: allocate big
//! buffers from it, copy them with `pf_copy` (whole pages become copy-on-write
//! views instead of new memory), let a scan fold zero pages and merge
//! identical ones, and read statistics. This crate is that door, for C and for
//! every language with a C FFI (the Python package sits on top of it). It adds
//! no mechanism of its own: every call is one call of
//! [`pagefold_engine::Engine`].
//!
//! Rules every function keeps, so that a C caller cannot crash the process
//! through this layer:
//! - A NULL, freed or foreign `pf_engine *` is an error (-1, NULL or 0 and
//!   `errno = EINVAL`), never a dereference: handles are looked up in a
//!   registry of live engines (a handle is a token, never reused), and a call
//!   holds its own reference to the engine, so `pf_engine_free` racing with a
//!   call on another thread is safe.
//! - NULL data pointers are errors too (see each function).
//! - No Rust panic unwinds into C: every body runs under `catch_unwind` and a
//!   panic becomes the error return. (A build with `panic = "abort"`, such as
//!   the workspace's release profile, aborts instead of unwinding; that is
//!   also never undefined behaviour.)
//! - The engine itself never fails an allocation it can serve from plain
//!   memory: missing memfd, userfaultfd or mmap budget degrade it and show up
//!   in `pf_stats().fallbacks`.
//!
//! The `#[repr(C)]` structs here and the header are kept in sync by hand; the
//! unit tests below compile a C program against the header and compare every
//! size and offset with Rust's, and check that the header declares every
//! exported function.

// Several exported functions are `unsafe extern "C"`: each unsafe operation
// in them still gets its own block and SAFETY argument.
#![deny(unsafe_op_in_unsafe_fn)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use pagefold_engine::{Config, Engine, Hint, Inject, ScanReport, Stats, STATS_SCHEMA};

/// `pf_alloc` flag: the caller will write every page at once (the result of a
/// computation), so the block is populated now instead of one fault per page.
pub const PF_ALLOC_FULL_WRITE: c_int = 1;
const PF_ALLOC_KNOWN_FLAGS: c_int = PF_ALLOC_FULL_WRITE;

/// Opaque engine handle. C sees only `pf_engine *`; the pointer is a token
/// that is never dereferenced (each engine gets a new one, never reused, so a
/// freed handle stays invalid for good).
#[repr(C)]
pub struct pf_engine {
    _opaque: [u8; 0],
}

/// Mirror of [`pagefold_engine::Config`]: mechanism switches (0 = off,
/// anything else = on), budgets and fault injection (testing only).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct pf_config {
    pub frames: c_int,
    pub copy: c_int,
    pub zero: c_int,
    pub merge: c_int,
    pub vma_budget: usize,
    pub vma_reserve: usize,
    pub scan_chunk_pages: usize,
    /// Background scan period in ms; 0 = scan only on demand.
    pub scan_interval_ms: u64,
    /// Fraction of one core the background scanner may use, 0 < f <= 1.
    pub scan_cpu_budget: f64,
    pub inject_fail_memfd: c_int,
    pub inject_fail_uffd: c_int,
    /// Every engine mmap after this many fails; negative = never.
    pub inject_fail_mmap_after: i64,
    /// Pretend vm.max_map_count is this; 0 = read the real one.
    pub inject_max_map_count: u64,
    /// Fold or merge only pages the previous scan saw unchanged.
    pub volatile_check: c_int,
    /// Wait before acting on a chunk, for writes through pinned pages (us).
    pub pin_grace_us: u64,
}

/// Mirror of [`pagefold_engine::ScanReport`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct pf_scan_report {
    pub pages_scanned: u64,
    pub zero_folded: u64,
    pub merged: u64,
    pub diverged_released: u64,
    pub skipped_vma: u64,
    pub wall_ns: u64,
    pub cpu_ns: u64,
    pub changed_while_planned: u64,
    pub volatile_pages: u64,
}

/// Mirror of [`pagefold_engine::Fallbacks`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct pf_fallbacks {
    pub memfd: u64,
    pub mmap: u64,
    pub vma_budget: u64,
    pub uffd: u64,
    pub frames: u64,
}

/// Mirror of [`pagefold_engine::Stats`]; the two booleans are 0/1.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct pf_stats {
    pub blocks: u64,
    pub block_bytes: u64,
    pub frames_in_use: u64,
    pub frames_resident: u64,
    pub pages_sharing: u64,
    pub pages_shared_by_copy: u64,
    pub bytes_copied_plain: u64,
    pub zero_folded: u64,
    pub merged: u64,
    pub diverged_released: u64,
    pub scans: u64,
    pub scan_cpu_ns: u64,
    pub fallbacks: pf_fallbacks,
    pub vmas_used: u64,
    pub metadata_bytes: u64,
    pub protected_scan: c_int,
    pub frames_active: c_int,
}

impl From<&Config> for pf_config {
    fn from(c: &Config) -> pf_config {
        pf_config {
            frames: c.frames as c_int,
            copy: c.copy as c_int,
            zero: c.zero as c_int,
            merge: c.merge as c_int,
            vma_budget: c.vma_budget.unwrap_or(0),
            vma_reserve: c.vma_reserve,
            scan_chunk_pages: c.scan_chunk_pages,
            scan_interval_ms: c
                .scan_interval
                .map_or(0, |d| d.as_millis().min(u64::MAX as u128) as u64),
            scan_cpu_budget: c.scan_cpu_budget,
            inject_fail_memfd: c.inject.fail_memfd as c_int,
            inject_fail_uffd: c.inject.fail_uffd as c_int,
            inject_fail_mmap_after: c
                .inject
                .fail_mmap_after
                .map_or(-1, |n| n.min(i64::MAX as u64) as i64),
            inject_max_map_count: c.inject.max_map_count.unwrap_or(0) as u64,
            volatile_check: c.volatile_check as c_int,
            pin_grace_us: c.pin_grace.as_micros().min(u64::MAX as u128) as u64,
        }
    }
}

impl pf_config {
    /// The engine configuration; None if a value is out of range.
    fn config(&self) -> Option<Config> {
        let budget = self.scan_cpu_budget;
        if !(budget > 0.0 && budget <= 1.0) || self.scan_chunk_pages == 0 {
            return None;
        }
        Some(Config {
            frames: self.frames != 0,
            copy: self.copy != 0,
            zero: self.zero != 0,
            merge: self.merge != 0,
            vma_budget: (self.vma_budget > 0).then_some(self.vma_budget),
            vma_reserve: self.vma_reserve,
            scan_chunk_pages: self.scan_chunk_pages,
            scan_interval: (self.scan_interval_ms > 0)
                .then(|| Duration::from_millis(self.scan_interval_ms)),
            scan_cpu_budget: budget,
            pin_grace: Duration::from_micros(self.pin_grace_us),
            volatile_check: self.volatile_check != 0,
            smart_scan: Config::default().smart_scan,
            // A C caller's free gives memory back; recycling is the preload's.
            recycle_bytes: 0,
            recycle_age: Config::default().recycle_age,
            evict: true,
            evict_store_bytes: u64::MAX,
            inject: Inject {
                fail_memfd: self.inject_fail_memfd != 0,
                fail_uffd: self.inject_fail_uffd != 0,
                fail_uffd_missing: false,
                fail_mmap_after: (self.inject_fail_mmap_after >= 0)
                    .then_some(self.inject_fail_mmap_after as u64),
                max_map_count: (self.inject_max_map_count > 0)
                    .then_some(self.inject_max_map_count as usize),
                ..Inject::default()
            },
            // Settings the C ABI does not expose (smart scan, recycle age) keep the engine's defaults.
            ..Config::default()
        })
    }
}

impl From<ScanReport> for pf_scan_report {
    fn from(r: ScanReport) -> pf_scan_report {
        pf_scan_report {
            pages_scanned: r.pages_scanned,
            zero_folded: r.zero_folded,
            merged: r.merged,
            diverged_released: r.diverged_released,
            skipped_vma: r.skipped_vma,
            wall_ns: r.wall_ns,
            cpu_ns: r.cpu_ns,
            changed_while_planned: r.changed_while_planned,
            volatile_pages: r.volatile,
        }
    }
}

impl From<&Stats> for pf_stats {
    fn from(s: &Stats) -> pf_stats {
        let f = &s.fallbacks;
        pf_stats {
            blocks: s.blocks,
            block_bytes: s.block_bytes,
            frames_in_use: s.frames_in_use,
            frames_resident: s.frames_resident,
            pages_sharing: s.pages_sharing,
            pages_shared_by_copy: s.pages_shared_by_copy,
            bytes_copied_plain: s.bytes_copied_plain,
            zero_folded: s.zero_folded,
            merged: s.merged,
            diverged_released: s.diverged_released,
            scans: s.scans,
            scan_cpu_ns: s.scan_cpu_ns,
            fallbacks: pf_fallbacks {
                memfd: f.memfd,
                mmap: f.mmap,
                vma_budget: f.vma_budget,
                uffd: f.uffd,
                frames: f.frames,
            },
            vmas_used: s.vmas_used,
            metadata_bytes: s.metadata_bytes,
            protected_scan: s.protected_scan as c_int,
            frames_active: s.frames_active as c_int,
        }
    }
}

// ---------------------------------------------------------------------------
// Handle registry: a handle is valid exactly while its address is a key here.

/// Live handles, by address, each with its engine.
static LIVE: RwLock<Option<HashMap<usize, Engine>>> = RwLock::new(None);

fn live_read() -> RwLockReadGuard<'static, Option<HashMap<usize, Engine>>> {
    LIVE.read().unwrap_or_else(|e| e.into_inner())
}

fn live_write() -> RwLockWriteGuard<'static, Option<HashMap<usize, Engine>>> {
    LIVE.write().unwrap_or_else(|e| e.into_inner())
}

/// The engine behind a handle (a reference of the call's own), or None for a
/// NULL, freed or foreign handle.
fn engine_of(h: *const pf_engine) -> Option<Engine> {
    if h.is_null() {
        return None;
    }
    live_read().as_ref()?.get(&(h as usize)).cloned()
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the address of the calling thread's
    // errno, valid for as long as the thread lives.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f` with the engine behind `h`; `err` (and errno EINVAL) for a bad
/// handle, `err` (and errno EFAULT) if `f` panicked.
fn with_engine<R>(h: *const pf_engine, err: R, f: impl FnOnce(&Engine) -> R) -> R {
    guarded(err, || match engine_of(h) {
        Some(e) => Ok(f(&e)),
        None => Err(libc::EINVAL),
    })
}

/// Runs `f` under catch_unwind; an `Err(errno)` or a panic returns `err`.
fn guarded<R>(err: R, f: impl FnOnce() -> Result<R, c_int>) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            set_errno(e);
            err
        }
        Err(_) => {
            set_errno(libc::EFAULT);
            err
        }
    }
}

/// The next handle token (a multiple of 16, so it looks like an aligned pointer).
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

fn register(engine: Engine) -> *mut pf_engine {
    let token = NEXT_HANDLE.fetch_add(1, Ordering::Relaxed).wrapping_mul(16);
    live_write()
        .get_or_insert_with(HashMap::new)
        .insert(token, engine);
    token as *mut pf_engine
}

// ---------------------------------------------------------------------------
// Exported functions. Keep include/pagefold.h in sync (the tests check it).

/// Fills `*out` with the engine's defaults (no environment). 0, or -1 if `out` is NULL.
///
/// # Safety
/// `out` is NULL or valid for writing one `pf_config`.
#[no_mangle]
pub unsafe extern "C" fn pf_config_default(out: *mut pf_config) -> c_int {
    guarded(-1, || {
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: non-NULL, so valid for writing one pf_config (the
        // caller's guarantee).
        unsafe { out.write(pf_config::from(&Config::default())) };
        Ok(0)
    })
}

/// A new engine configured from the `PAGEFOLD_*` environment variables.
/// NULL only on a panic (the engine itself degrades instead of failing).
#[no_mangle]
pub extern "C" fn pf_engine_new() -> *mut pf_engine {
    guarded(std::ptr::null_mut(), || {
        Ok(register(Engine::new(Config::from_env())))
    })
}

/// A new engine with the given configuration; NULL (errno EINVAL) if `cfg` is
/// NULL or out of range (scan_cpu_budget not in (0, 1], scan_chunk_pages 0).
///
/// # Safety
/// `cfg` is NULL or points to a readable `pf_config`.
#[no_mangle]
pub unsafe extern "C" fn pf_engine_new_with(cfg: *const pf_config) -> *mut pf_engine {
    guarded(std::ptr::null_mut(), || {
        // SAFETY: `cfg` is NULL (as_ref gives None) or points to a readable
        // pf_config (the caller's guarantee), borrowed only during this call.
        let cfg = unsafe { cfg.as_ref() }
            .ok_or(libc::EINVAL)?
            .config()
            .ok_or(libc::EINVAL)?;
        Ok(register(Engine::new(cfg)))
    })
}

/// Stops the background scanner and releases the engine. NULL, or a handle
/// already freed, is ignored. Blocks still allocated stay mapped with their
/// contents and remain usable, but they are leaked: nothing can free them any
/// more (pf_free on another engine returns -1) and no scan visits them. Free
/// your blocks first.
#[no_mangle]
pub extern "C" fn pf_engine_free(h: *mut pf_engine) {
    guarded((), || {
        if h.is_null() {
            return Ok(());
        }
        let removed = live_write().as_mut().and_then(|m| m.remove(&(h as usize)));
        if let Some(engine) = removed {
            // Calls in flight on other threads hold their own clones; the engine
            // goes when the last of them returns.
            engine.stop_background();
        }
        Ok(())
    })
}

/// A zero-filled, page-aligned block of at least `len` bytes (`len` 0 gives
/// one page). `flags`: 0 or PF_ALLOC_FULL_WRITE. NULL on a bad handle or
/// unknown flags (errno EINVAL) or when not even plain memory is left (ENOMEM).
#[no_mangle]
pub extern "C" fn pf_alloc(h: *mut pf_engine, len: usize, flags: c_int) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        let engine = engine_of(h).ok_or(libc::EINVAL)?;
        if flags & !PF_ALLOC_KNOWN_FLAGS != 0 || len > isize::MAX as usize - pagefold_engine::PAGE {
            return Err(libc::EINVAL);
        }
        let hint = if flags & PF_ALLOC_FULL_WRITE != 0 {
            Hint::FullWrite
        } else {
            Hint::None
        };
        let p = engine.alloc(len, hint);
        if p.is_null() {
            return Err(libc::ENOMEM);
        }
        Ok(p.cast())
    })
}

/// Frees a block returned by `pf_alloc` (its start address). 0 on success, -1
/// if `ptr` is not the start of one of this engine's blocks (nothing happens).
///
/// # Safety
/// `ptr` (if a block of this engine) is not used after this call.
#[no_mangle]
pub unsafe extern "C" fn pf_free(h: *mut pf_engine, ptr: *mut c_void) -> c_int {
    with_engine(h, -1, |e| {
        // SAFETY: the engine frees `ptr` only if it starts one of its blocks,
        // and the caller does not use such a block after this call.
        if !ptr.is_null() && unsafe { e.free(ptr.cast()) } {
            0
        } else {
            -1
        }
    })
}

/// 1 if `ptr` lies inside one of this engine's blocks, else 0 (also for NULL).
#[no_mangle]
pub extern "C" fn pf_owns(h: *mut pf_engine, ptr: *const c_void) -> c_int {
    with_engine(h, 0, |e| (!ptr.is_null() && e.owns(ptr.cast())) as c_int)
}

/// The length of the block starting at `ptr` (a multiple of the page size), or
/// 0 if `ptr` is not the start of one of this engine's blocks.
#[no_mangle]
pub extern "C" fn pf_block_len(h: *mut pf_engine, ptr: *const c_void) -> usize {
    with_engine(h, 0, |e| {
        if ptr.is_null() {
            0
        } else {
            e.block_len(ptr.cast()).unwrap_or(0)
        }
    })
}

/// Copies `len` bytes with memmove semantics. Whole pages from one engine
/// block to another at the same offset within a page become copy-on-write
/// views; everything else is copied plainly. With a NULL or invalid handle the
/// copy is a plain memmove; with a NULL `dst` or `src` (and `len` > 0) nothing
/// is copied.
///
/// # Safety
/// As for memmove: `src` readable and `dst` writable for `len` bytes (or NULL).
#[no_mangle]
pub unsafe extern "C" fn pf_copy(
    h: *mut pf_engine,
    dst: *mut c_void,
    src: *const c_void,
    len: usize,
) {
    guarded((), || {
        if len == 0 || dst.is_null() || src.is_null() {
            return Ok(());
        }
        // SAFETY: both are non-NULL here, so `src` is readable and `dst`
        // writable for `len` bytes (the caller's guarantee, memmove's), which
        // is the contract of the engine's copy and of ptr::copy.
        unsafe {
            match engine_of(h) {
                Some(e) => e.copy(dst.cast(), src.cast(), len),
                None => std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), len),
            }
        }
        Ok(())
    })
}

/// Folds zero pages and merges identical pages now. 0 on success (`*out`
/// filled unless `out` is NULL), -1 on a bad handle.
///
/// # Safety
/// `out` is NULL or valid for writing one `pf_scan_report`.
#[no_mangle]
pub unsafe extern "C" fn pf_scan(h: *mut pf_engine, out: *mut pf_scan_report) -> c_int {
    with_engine(h, -1, |e| {
        let rep = pf_scan_report::from(e.scan());
        if !out.is_null() {
            // SAFETY: non-NULL, so valid for writing one pf_scan_report (the
            // caller's guarantee).
            unsafe { out.write(rep) };
        }
        0
    })
}

/// Starts scanning every `interval_ms` ms (within the configured CPU budget).
/// 0 on success or if already running; -1 on a bad handle or `interval_ms` 0.
#[no_mangle]
pub extern "C" fn pf_start_background(h: *mut pf_engine, interval_ms: c_uint) -> c_int {
    if interval_ms == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    with_engine(h, -1, |e| {
        e.start_background(Duration::from_millis(interval_ms as u64));
        0
    })
}

/// Stops the background scanner and waits for it; a no-op if none runs.
#[no_mangle]
pub extern "C" fn pf_stop_background(h: *mut pf_engine) {
    with_engine(h, (), |e| e.stop_background())
}

/// Fills `*out` with the engine's statistics. 0, or -1 on a bad handle or NULL `out`.
///
/// # Safety
/// `out` is NULL or valid for writing one `pf_stats`.
#[no_mangle]
pub unsafe extern "C" fn pf_stats(h: *mut pf_engine, out: *mut pf_stats) -> c_int {
    if out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    with_engine(h, -1, |e| {
        // SAFETY: checked non-NULL above, so valid for writing one pf_stats
        // (the caller's guarantee).
        unsafe { out.write(pf_stats::from(&e.stats())) };
        0
    })
}

/// The statistics as one JSON object (with `"schema"` set to
/// [`STATS_SCHEMA`]), snprintf-style: writes at most `cap`
/// bytes including a terminating NUL (if `cap` > 0) and returns the length of
/// the whole document without the NUL, so a return >= `cap` means truncated.
/// `buf` may be NULL when `cap` is 0. Returns 0 on a bad handle (`buf` then
/// holds an empty string if `cap` > 0).
///
/// # Safety
/// `buf` is valid for writing `cap` bytes (or NULL with `cap` 0).
#[no_mangle]
pub unsafe extern "C" fn pf_stats_json(h: *mut pf_engine, buf: *mut c_char, cap: usize) -> usize {
    guarded(0, || {
        if buf.is_null() && cap > 0 {
            return Err(libc::EINVAL);
        }
        if cap > 0 {
            // SAFETY: cap > 0 and buf non-NULL (checked above), so buf[0] is
            // writable (the caller's guarantee: `cap` writable bytes).
            unsafe { *buf = 0 };
        }
        let engine = engine_of(h).ok_or(libc::EINVAL)?;
        let json = pagefold_measure::schema::document(STATS_SCHEMA, &engine.stats())
            .and_then(|doc| serde_json::to_string(&doc))
            .map_err(|_| libc::EFAULT)?;
        if cap > 0 {
            let n = json.len().min(cap - 1);
            // SAFETY: buf is writable for cap bytes and n + 1 <= cap; the
            // source is our own string of at least n bytes, so no overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        Ok(json.len())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn header_path() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("include/pagefold.h")
    }

    /// Names of the functions this file exports: `#[no_mangle]` followed by a fn.
    fn exported_names() -> Vec<String> {
        let src = include_str!("lib.rs");
        let mut names = Vec::new();
        let mut pending = false;
        for line in src.lines().map(str::trim) {
            if line == concat!("#[no_", "mangle]") {
                pending = true;
                continue;
            }
            if pending && !line.starts_with("#[") && !line.starts_with("///") {
                let name = line
                    .split_once("fn ")
                    .map(|(_, rest)| rest.split(['(', '<']).next().unwrap().trim().to_string())
                    .unwrap_or_else(|| panic!("no_mangle item is not a function: {line}"));
                names.push(name);
                pending = false;
            }
        }
        names
    }

    #[test]
    fn header_declares_every_exported_function() {
        let header = std::fs::read_to_string(header_path()).unwrap();
        let names = exported_names();
        assert!(names.len() >= 14, "found only {names:?}");
        for name in &names {
            let declared = header.lines().any(|l| {
                let l = l.trim_start();
                !l.starts_with("//") && !l.starts_with('*') && l.contains(&format!("{name}("))
            });
            assert!(
                declared,
                "{name} is exported by src/lib.rs but not declared in include/pagefold.h"
            );
        }
        // And the other way round: every pf_ function the header declares exists.
        for l in header
            .lines()
            .filter(|l| l.contains("pf_") && l.trim_end().ends_with(");"))
        {
            let before = l.split('(').next().unwrap();
            let name = before.rsplit([' ', '*']).next().unwrap();
            if name.starts_with("pf_") {
                assert!(
                    names.iter().any(|n| n == name),
                    "header declares {name}, which src/lib.rs does not export"
                );
            }
        }
    }

    /// Compiles a C program that prints `sizeof`/`offsetof` for every struct
    /// and field of the header, and compares each line with Rust's layout.
    #[test]
    fn struct_layout_matches_header() {
        fn field_size<T, F>(_: impl Fn(&T) -> &F) -> usize {
            size_of::<F>()
        }
        macro_rules! layout {
            ($out:ident, $t:ident { $($f:ident),* $(,)? }) => {{
                $out.push((format!("sizeof {}", stringify!($t)), size_of::<$t>()));
                $out.push((format!("alignof {}", stringify!($t)), std::mem::align_of::<$t>()));
                $(
                    $out.push((format!("offsetof {}.{}", stringify!($t), stringify!($f)), offset_of!($t, $f)));
                    $out.push((format!("sizeof {}.{}", stringify!($t), stringify!($f)), field_size(|s: &$t| &s.$f)));
                )*
            }};
        }
        let mut rust: Vec<(String, usize)> = Vec::new();
        layout!(
            rust,
            pf_config {
                frames,
                copy,
                zero,
                merge,
                vma_budget,
                vma_reserve,
                scan_chunk_pages,
                scan_interval_ms,
                scan_cpu_budget,
                inject_fail_memfd,
                inject_fail_uffd,
                inject_fail_mmap_after,
                inject_max_map_count,
                volatile_check,
                pin_grace_us
            }
        );
        layout!(
            rust,
            pf_scan_report {
                pages_scanned,
                zero_folded,
                merged,
                diverged_released,
                skipped_vma,
                wall_ns,
                cpu_ns,
                changed_while_planned,
                volatile_pages
            }
        );
        layout!(
            rust,
            pf_fallbacks {
                memfd,
                mmap,
                vma_budget,
                uffd,
                frames
            }
        );
        layout!(
            rust,
            pf_stats {
                blocks,
                block_bytes,
                frames_in_use,
                frames_resident,
                pages_sharing,
                pages_shared_by_copy,
                bytes_copied_plain,
                zero_folded,
                merged,
                diverged_released,
                scans,
                scan_cpu_ns,
                fallbacks,
                vmas_used,
                metadata_bytes,
                protected_scan,
                frames_active
            }
        );

        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include \"pagefold.h\"\nint main(void) {\n",
        );
        for (key, _) in &rust {
            let (what, arg) = key.split_once(' ').unwrap();
            let expr = match (what, arg.split_once('.')) {
                ("offsetof", Some((t, f))) => format!("offsetof(struct {t}, {f})"),
                ("sizeof", Some((t, f))) => format!("sizeof(((struct {t} *)0)->{f})"),
                ("alignof", _) => format!("_Alignof(struct {arg})"),
                _ => format!("sizeof(struct {arg})"),
            };
            c.push_str(&format!("  printf(\"{key} %zu\\n\", (size_t){expr});\n"));
        }
        c.push_str(
            "  printf(\"PF_ALLOC_FULL_WRITE %d\\n\", PF_ALLOC_FULL_WRITE);\n  return 0;\n}\n",
        );
        rust.push(("PF_ALLOC_FULL_WRITE".into(), PF_ALLOC_FULL_WRITE as usize));

        let dir = std::env::temp_dir().join(format!("pagefold-capi-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
        std::fs::write(&src, c).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-std=c11", "-Wall", "-Werror", "-I"])
            .arg(header_path().parent().unwrap())
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .output()
            .unwrap_or_else(|e| panic!("running {cc}: {e}"));
        assert!(
            out.status.success(),
            "cc failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let run = Command::new(&exe).output().unwrap();
        assert!(run.status.success());
        let printed = String::from_utf8(run.stdout).unwrap();
        let c_lines: Vec<(String, usize)> = printed
            .lines()
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            c_lines.len(),
            rust.len(),
            "the C program printed {} lines, expected {}",
            c_lines.len(),
            rust.len()
        );
        let differ: Vec<String> = c_lines
            .iter()
            .zip(&rust)
            .filter(|(c, r)| c != r)
            .map(|((k, c), (_, r))| format!("{k}: C {c}, Rust {r}"))
            .collect();
        assert!(
            differ.is_empty(),
            "layout of include/pagefold.h differs from src/lib.rs:\n{}",
            differ.join("\n")
        );
    }

    #[test]
    fn config_roundtrip_and_defaults() {
        let mut c = std::mem::MaybeUninit::<pf_config>::uninit();
        // SAFETY: a local pf_config's worth of writable memory.
        let ret = unsafe { pf_config_default(c.as_mut_ptr()) };
        assert_eq!(ret, 0);
        // SAFETY: pf_config_default returned 0, so it wrote the whole struct.
        let c = unsafe { c.assume_init() };
        let back = c.config().unwrap();
        let d = Config::default();
        assert_eq!(pf_config::from(&back), pf_config::from(&d));
        assert_eq!(c.inject_fail_mmap_after, -1);
        // SAFETY: NULL is allowed (and must be refused).
        let ret = unsafe { pf_config_default(std::ptr::null_mut()) };
        assert_eq!(ret, -1);
        let bad = pf_config {
            scan_cpu_budget: 0.0,
            ..c
        };
        // SAFETY: points to a readable local pf_config.
        assert!(unsafe { pf_engine_new_with(&bad) }.is_null());
    }

    /// A panic inside a call becomes the error value (unwinding builds only;
    /// with panic = "abort" the process would abort, by design).
    #[test]
    #[cfg(panic = "unwind")]
    fn panic_becomes_error() {
        let errno = || std::io::Error::last_os_error().raw_os_error();
        let r: c_int = guarded(-1, || panic!("deliberate"));
        assert_eq!(r, -1);
        assert_eq!(errno(), Some(libc::EFAULT));
        let p: *mut c_void = guarded(std::ptr::null_mut(), || Err(libc::ENOMEM));
        assert!(p.is_null());
        assert_eq!(errno(), Some(libc::ENOMEM));
    }

    #[test]
    fn bad_handles_are_errors() {
        let bogus = 0x1000 as *mut pf_engine;
        for h in [std::ptr::null_mut(), bogus] {
            // SAFETY: 0x2000 is no engine's block, so pf_free frees nothing;
            // pf_scan gets a NULL `out`, pf_stats a local pf_stats and
            // pf_stats_json a local buffer of buf.len() bytes.
            unsafe {
                assert!(pf_alloc(h, 4096, 0).is_null());
                assert_eq!(pf_free(h, 0x2000 as *mut c_void), -1);
                assert_eq!(pf_owns(h, 0x2000 as *const c_void), 0);
                assert_eq!(pf_block_len(h, 0x2000 as *const c_void), 0);
                assert_eq!(pf_scan(h, std::ptr::null_mut()), -1);
                assert_eq!(pf_start_background(h, 10), -1);
                pf_stop_background(h);
                let mut s = pf_stats::default();
                assert_eq!(pf_stats(h, &mut s), -1);
                let mut buf = [1 as c_char; 8];
                assert_eq!(pf_stats_json(h, buf.as_mut_ptr(), buf.len()), 0);
                assert_eq!(buf[0], 0);
                pf_engine_free(h);
            }
        }
    }

    #[test]
    fn handle_lifecycle_and_double_free() {
        // SAFETY: pf_stats_json gets NULL with cap 0, then `buf` with its
        // length, and so NUL-terminates `buf` for CStr::from_ptr; `p` is
        // not used after the pf_free that frees it (the second pf_free only
        // looks it up, finds no block and frees nothing).
        unsafe {
            let h = pf_engine_new();
            assert!(!h.is_null());
            let p = pf_alloc(h, 3 * 4096 + 1, PF_ALLOC_FULL_WRITE);
            assert!(!p.is_null());
            assert_eq!(pf_block_len(h, p), 4 * 4096);
            assert!(pf_alloc(h, 4096, 0x100).is_null(), "unknown flag accepted");
            let need = pf_stats_json(h, std::ptr::null_mut(), 0);
            let mut buf = vec![0 as c_char; need + 1];
            assert_eq!(pf_stats_json(h, buf.as_mut_ptr(), buf.len()), need);
            let text = std::ffi::CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
            let v: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(v["blocks"], 1);
            assert_eq!(v["schema"], "pagefold-engine-stats/1");
            assert_eq!(pf_free(h, p), 0);
            assert_eq!(pf_free(h, p), -1);
            pf_engine_free(h);
            pf_engine_free(h); // ignored: no longer a live handle
            assert!(pf_alloc(h, 4096, 0).is_null());
        }
    }
}
