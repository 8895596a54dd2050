//! What a program (in practice: a test) may ask the preload while it runs:
//! a statistic of its engine by name, and a scan right now. Both are optional
//! extras found with dlsym; a program that does not look for them is unaffected.

use std::ffi::{c_char, CStr};

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
