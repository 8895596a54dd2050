//! What a program may ask the preload while it runs: a statistic of its
//! engine by name, all of them as JSON (the Python package's
//! `engine_stats()`), and a scan right now (tests). All are optional extras
//! found with dlsym; a program that does not look for them is unaffected.

use std::ffi::{c_char, CStr};

use pagefold_engine::STATS_SCHEMA;

use crate::global::{running, with_busy};

/// The running engine's statistic `name` as in the exit report ("merged",
/// "frames_resident", "fallbacks.mmap"; booleans are 0/1). u64::MAX if no
/// engine runs or there is no such statistic.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string, readable during the call.
#[no_mangle]
pub unsafe extern "C" fn pagefold_stat(name: *const c_char) -> u64 {
    if name.is_null() {
        return u64::MAX;
    }
    let Some(e) = running() else { return u64::MAX };
    // SAFETY: non-NULL, so a NUL-terminated string readable during this
    // call (the caller's guarantee); it is copied or borrowed only here.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    with_busy(|| {
        let stats = serde_json::to_value(e.stats()).ok()?;
        let v = name.split('.').try_fold(&stats, |v, key| v.get(key))?;
        v.as_u64().or_else(|| v.as_bool().map(u64::from))
    })
    .flatten()
    .unwrap_or(u64::MAX)
}

/// Runs one scan on the calling thread; returns the pages it folded or
/// merged, or -1 if no engine runs (or this thread is inside it).
#[no_mangle]
pub extern "C" fn pagefold_scan() -> i64 {
    let Some(e) = running() else { return -1 };
    with_busy(|| {
        let r = e.scan();
        (r.zero_folded + r.merged) as i64
    })
    .unwrap_or(-1)
}

/// Writes the running engine's statistics as a JSON document (the exit
/// report's `stats`, with `"schema"` set to [`STATS_SCHEMA`]) into `buf`,
/// NUL-terminated if it fits, and returns the JSON's length; 0 if no engine
/// runs. A return of `len` or more means `buf` was too small (nothing usable
/// was written).
///
/// # Safety
/// `buf` is NULL or valid for writing `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn pagefold_stats_json(buf: *mut c_char, len: usize) -> usize {
    let Some(e) = running() else { return 0 };
    let json = || {
        let doc = pagefold_measure::schema::document(STATS_SCHEMA, &e.stats()).ok()?;
        serde_json::to_string(&doc).ok()
    };
    let Some(json) = with_busy(json).flatten() else {
        return 0;
    };
    if !buf.is_null() && json.len() < len {
        // SAFETY: buf is valid for len bytes (the caller's guarantee) and
        // json.len() + 1 <= len bytes are written; the source is a distinct
        // Rust string.
        unsafe {
            std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), json.len());
            *buf.add(json.len()) = 0;
        }
    }
    json.len()
}
