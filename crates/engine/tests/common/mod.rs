//! Helpers several engine test files share (each test file is its own crate,
//! so not every one uses every helper).
#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// A pipe with room for the largest transfer, so one thread can write then read.
pub fn pipe() -> (i32, i32) {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a writable array of two ints, as pipe2 requires.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fds[1] is the pipe's write end, just opened; F_SETPIPE_SZ takes an int.
    unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, 1 << 20) };
    (fds[0], fds[1])
}

/// A connected pair of Unix stream sockets.
pub fn socketpair() -> (i32, i32) {
    let mut fds = [0i32; 2];
    assert_eq!(
        // SAFETY: fds is a writable array of two ints, as socketpair requires.
        unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        },
        0
    );
    (fds[0], fds[1])
}

/// Runs `body` in its own thread and fails if it takes longer than `limit`
/// (a fault nobody answers hangs the thread that took it).
pub fn with_deadline(name: &str, limit: Duration, body: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        let _ = tx.send(());
        if let Err(p) = r {
            std::panic::resume_unwind(p);
        }
    });
    match rx.recv_timeout(limit) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
        Err(_) => panic!(
            "{name}: still running after {limit:?}: a touch of an evicted page was never answered"
        ),
    }
}

static SERIAL: Mutex<()> = Mutex::new(());

/// Held by tests of one file that must not run at the same time.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `len` bytes at `p`.
pub fn bytes<'a>(p: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: every caller passes a live mapping of at least `len` readable
    // bytes that outlives its use of the slice.
    unsafe { std::slice::from_raw_parts(p, len) }
}

/// Waits for child `pid` and asserts it died of SIGBUS — or SIGABRT where
/// UFFDIO_POISON is missing (before 6.6), when the engine aborts instead —
/// for touching a page whose content is lost; returns the signal.
pub fn assert_killed_for_lost_page(pid: i32, what: &str) -> i32 {
    let mut status = 0;
    // SAFETY: status is a writable int; waitpid only reaps the given child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status) && matches!(libc::WTERMSIG(status), libc::SIGBUS | libc::SIGABRT),
        "{what} must not be read: child status {status:#x}"
    );
    libc::WTERMSIG(status)
}

/// A random page, different for every seed: nothing compresses it, and no
/// two of them are similar.
pub fn incompressible(seed: u64) -> Vec<u8> {
    pagefold_tier::kinds::page(pagefold_tier::kinds::Kind::Random, seed)
}
