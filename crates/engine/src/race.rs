//! Injected pauses that widen race windows, for tests.
//!
//! A race between the engine's threads and the program's (a write landing
//! while a page is evicted, a fault served while its range is reconciled)
//! may need microsecond timing to show, and how often it shows depends on
//! the machine's load. With `PAGEFOLD_INJECT_RACE_US=N` each point marked
//! with `pause()` sleeps a pseudo-random 0..N µs one time in four, so that a
//! test also meets interleavings its machine's timing alone would rarely
//! give. Off, a point costs one relaxed load. No allocation: the fault
//! thread calls it too.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

static MAX_US: AtomicU64 = AtomicU64::new(0);
static STATE: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

/// Turns the pauses on (`us` > 0) or off.
pub fn set(us: u64) {
    MAX_US.store(us, Ordering::Relaxed);
}

/// A marked point: sleeps now and then while pauses are on.
pub fn pause() {
    let max = MAX_US.load(Ordering::Relaxed);
    if max == 0 {
        return;
    }
    let r = STATE
        .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let r = r ^ (r >> 31);
    if r.is_multiple_of(4) {
        std::thread::sleep(Duration::from_micros((r >> 8) % max));
    }
}
