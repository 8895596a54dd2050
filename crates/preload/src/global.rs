//! The one engine of this process, its configuration, and the report the
//! process leaves at exit for `pagefold run`.
//!
//! The engine starts at the first large allocation (not in a constructor:
//! the program's own constructors may allocate before ours run). While it
//! starts, other threads are served by glibc rather than made to wait.
//!
//! Variables (besides the engine's own `PAGEFOLD_*`, see docs/CONFIG.md):
//! `PAGEFOLD_THRESHOLD` (bytes, default 1 MiB): smallest block the engine serves,
//! read as the library is loaded, so a process that never asks for that much
//! never starts the engine;
//! `PAGEFOLD_COPY_MIN` (bytes, default 131072): smallest memcpy/memmove/memset offered to the engine;
//! `PAGEFOLD_DISABLE=1`: pass everything to glibc;
//! `PAGEFOLD_HEAP_TRIM` (default 1): while memory is short, the engine has glibc's
//! freed heap memory given back (hooks.rs `trim_heap`); 0: never;
//! `PAGEFOLD_SCAN_INTERVAL_MS` defaults to 1000 here (background scan on);
//! `PAGEFOLD_RECYCLE_MB` defaults to 256 here (freed blocks reused, see the engine's recycle.rs);
//! `PAGEFOLD_PIN_AGE_MS` defaults to 200 here (owned pages are frozen before they are folded
//! or shared, so a program's O_DIRECT and other pinned I/O cannot lose a write; the engine's
//! detach.rs);
//! `PAGEFOLD_FRESH` defaults to `adaptive` (`frames` with tiering on, whose patches need
//! reference pages in frames) and `PAGEFOLD_COPY_THROUGH` to 1 here (a block
//! starts on plain anonymous memory unless its size is often copied from, and a copy out of
//! anonymous memory adopts its source onto frames: the engine's fresh.rs and adopt.rs);
//! `PAGEFOLD_PLAIN_BELOW` defaults to 32 MiB here with `adaptive` (a block below it whose size
//! is not copied from is left to glibc, whose heap reuses freed memory: the engine's
//! placement.rs);
//! `PAGEFOLD_COPY_LEARN` defaults to 1 here (copies into a size class whose copies were
//! mostly written over, or below `PAGEFOLD_PLAIN_BELOW` freed young, are made plainly:
//! fresh.rs);
//! `PAGEFOLD_EVICT_UNTESTED` defaults to 0 here unless `PAGEFOLD_TIER=1` (under
//! pressure-driven tiering only pages the pin guard tests are evicted: the engine's evict.rs);
//! `PAGEFOLD_SCAN_AFTER_FREE_MB` (default 64): wake the scanner after this much
//! engine memory was freed, which is when a garbage collector has just run;
//! `PAGEFOLD_REPORT=PATH`: at exit write the engine's statistics as JSON to
//! `PATH.PID` (`{"schema": REPORT_SCHEMA, "pid", "threshold", "stats"}`).

use std::cell::Cell;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use pagefold_engine::{Config, Engine};

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const READY: u8 = 2;
const OFF: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
static mut ENGINE: Option<Engine> = None;
pub static THRESHOLD: AtomicUsize = AtomicUsize::new(DEFAULT_THRESHOLD);

/// Smallest block the engine serves unless `PAGEFOLD_THRESHOLD` says
/// otherwise (`pagefold_engine::MALLOC_THRESHOLD`).
pub const DEFAULT_THRESHOLD: usize = pagefold_engine::MALLOC_THRESHOLD;
/// Smallest copy offered to the engine (see hooks::engine_copy).
pub static COPY_MIN: AtomicUsize = AtomicUsize::new(128 << 10);
static FREED: AtomicUsize = AtomicUsize::new(0);
static SCAN_AFTER_FREE: AtomicUsize = AtomicUsize::new(64 << 20);
/// The `"schema"` of the exit report `PAGEFOLD_REPORT` asks for.
const REPORT_SCHEMA: &str = "pagefold-preload-report/1";

thread_local! {
    /// Set while this thread is inside the engine: its own copies and
    /// allocations must not re-enter it.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on the value of the environment variable `name`, if set. getenv,
/// not std::env: no allocation, no lock we might already hold.
fn with_env<R>(name: &CStr, f: impl FnOnce(&CStr) -> R) -> Option<R> {
    // SAFETY: `name` is NUL-terminated. getenv only reads the environment.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a non-NULL getenv result points to the variable's
    // NUL-terminated value inside the environment, which stays in place
    // until the environment is changed; this library never changes it, and
    // the borrow ends when `f` returns.
    Some(f(unsafe { CStr::from_ptr(p) }))
}

fn env_usize(name: &CStr) -> Option<usize> {
    with_env(name, |v| v.to_str().ok()?.trim().parse().ok()).flatten()
}

/// The engine, once started; starts it on first use.
pub fn engine() -> Option<&'static Engine> {
    match STATE.load(Ordering::Acquire) {
        READY => running(),
        UNINIT => start(),
        _ => None,
    }
}

/// The engine if it already runs (for free and realloc of our blocks).
pub fn running() -> Option<&'static Engine> {
    if STATE.load(Ordering::Acquire) != READY {
        return None;
    }
    // SAFETY: `start` writes ENGINE once, before its Release store of READY
    // (which the Acquire load above has seen), and READY is never left, so
    // ENGINE is never written again: a shared reference to it is valid for
    // the rest of the process.
    unsafe { (*std::ptr::addr_of!(ENGINE)).as_ref() }
}

#[cold]
fn start() -> Option<&'static Engine> {
    if STATE
        .compare_exchange(UNINIT, STARTING, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return None;
    }
    crate::real::resolve();
    if env_usize(c"PAGEFOLD_DISABLE").unwrap_or(0) != 0 {
        STATE.store(OFF, Ordering::Release);
        return None;
    }
    read_threshold();
    if let Some(b) = env_usize(c"PAGEFOLD_COPY_MIN") {
        COPY_MIN.store(b, Ordering::Relaxed);
    }
    if let Some(mb) = env_usize(c"PAGEFOLD_SCAN_AFTER_FREE_MB") {
        SCAN_AFTER_FREE.store(mb << 20, Ordering::Relaxed);
    }
    let engine = with_busy(|| Engine::new(Config::malloc_from_env()))?;
    if env_usize(c"PAGEFOLD_HEAP_TRIM").unwrap_or(1) != 0 {
        engine.on_memory_short(crate::hooks::trim_heap);
    }
    if env_usize(c"PAGEFOLD_INJECT_SLOW_TRIM").unwrap_or(0) != 0 {
        crate::hooks::TRIM_SLOW_NS.store(0, Ordering::Relaxed);
    }
    // SAFETY: only the thread that moved STATE from UNINIT to STARTING gets
    // here, once; ENGINE is read only after STATE is READY, which is stored
    // just below, so nothing reads it while it is written.
    unsafe { ENGINE = Some(engine) };
    STATE.store(READY, Ordering::Release);
    // SAFETY: report_at_exit is a plain `extern "C" fn()` of this library,
    // which stays loaded until the process exits.
    unsafe { libc::atexit(report_at_exit) };
    running()
}

/// `PAGEFOLD_THRESHOLD`, if set, into THRESHOLD (at least a page).
fn read_threshold() {
    if let Some(t) = env_usize(c"PAGEFOLD_THRESHOLD") {
        THRESHOLD.store(t.max(pagefold_engine::PAGE), Ordering::Relaxed);
    }
}

/// The threshold is read as soon as the library is loaded (after libc, so
/// the environment is there), not only when the engine starts: a threshold
/// below the default must let an allocation start the engine. Allocations
/// made by constructors that run before this one see the default.
#[used]
#[link_section = ".init_array"]
static READ_THRESHOLD_AT_LOAD: extern "C" fn() = {
    extern "C" fn init() {
        read_threshold();
    }
    init
};

/// Runs `f` marked as inside the engine; None if this thread already is,
/// or is the engine's own scanner.
pub fn with_busy<T>(f: impl FnOnce() -> T) -> Option<T> {
    if pagefold_engine::on_engine_thread() {
        return None;
    }
    BUSY.with(|b| {
        if b.get() {
            return None;
        }
        b.set(true);
        let r = f();
        b.set(false);
        Some(r)
    })
}

/// Counts freed engine memory; wakes the scanner after a burst.
pub fn note_free(bytes: usize, e: &Engine) {
    let total = FREED.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if total >= SCAN_AFTER_FREE.load(Ordering::Relaxed) {
        FREED.store(0, Ordering::Relaxed);
        e.request_scan();
    }
}

extern "C" fn report_at_exit() {
    let Some(e) = running() else { return };
    let _ = with_env(c"PAGEFOLD_REPORT", |path| {
        with_busy(|| {
            let base = path.to_string_lossy().into_owned();
            let file = format!("{base}.{}", std::process::id());
            let report = serde_json::json!({
                "pid": std::process::id(),
                "threshold": THRESHOLD.load(Ordering::Relaxed),
                "stats": e.stats(),
            });
            if let Ok(doc) = pagefold_measure::schema::document(REPORT_SCHEMA, &report) {
                let _ = std::fs::write(file, doc.to_string());
            }
        })
    });
}
