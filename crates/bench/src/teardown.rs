//! Undoing what a benchmark changes on the machine, on every way out we can
//! catch. Some suites change state that outlives the process: the kernel's
//! KSM knobs (global), memory cgroups, swap files and zram devices. Each guard
//! that makes such a change registers a `Teardown` here, and it runs exactly
//! once: when the guard is dropped (also while unwinding from a panic), from a
//! panic hook (the release profile aborts on panic, so no Drop runs there), or
//! from a SIGINT/SIGTERM/SIGHUP handler that undoes everything and then dies
//! of the same signal. Teardowns run newest first, so a cgroup (whose
//! processes hold swapped-out pages) goes before the swap device it used.
//!
//! A signal can interrupt anything, so a `Teardown` uses only system calls
//! (open, read, write, close, kill, rmdir, swapoff, unlink, nanosleep) on
//! data prepared when its guard was made: no allocation, no locks. SIGKILL
//! cannot be caught; cgroups and swap devices it leaves behind carry our name
//! and pid and are swept the next time (`cgroup::sweep_leftovers`,
//! `swap::sweep_leftovers`).
//!
//! On a panic the hook runs every teardown when panics abort (nothing else
//! will), but only the panicking thread's when they unwind (tests: the guards
//! of other threads are still in use and drop normally).

use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, Once};
use std::thread::ThreadId;

/// A teardown step that did not finish, described without allocating.
#[derive(Clone, Copy, Debug)]
pub struct Failure {
    pub what: &'static str,
    pub errno: i32,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}",
            self.what,
            std::io::Error::from_raw_os_error(self.errno)
        )
    }
}

/// Undoes one change. Must be async-signal-safe (see the module comment).
pub trait Teardown: Send + Sync {
    fn teardown(&self) -> Result<(), Failure>;
}

struct Entry {
    action: Box<dyn Teardown>,
    done: AtomicBool,
    /// Registration order: newest runs first.
    seq: u64,
    thread: ThreadId,
}

impl Entry {
    fn run_once(&self) -> Result<(), Failure> {
        if self.done.swap(true, SeqCst) {
            return Ok(());
        }
        self.action.teardown()
    }
}

const SLOTS: usize = 64;
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

static ENTRIES: [AtomicPtr<Entry>; SLOTS] = [const { AtomicPtr::new(null_mut()) }; SLOTS];
static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);
/// Hooks or handlers walking ENTRIES now: an entry is freed only when none is.
static WALKING: AtomicUsize = AtomicUsize::new(0);
/// Live registrations and the signal actions they replaced.
static HANDLERS: Mutex<(usize, Option<[libc::sigaction; 3]>)> = Mutex::new((0, None));
static PANIC_HOOK: Once = Once::new();

/// A registered teardown; dropping it runs the teardown (if nothing ran it
/// yet) and unregisters it.
pub struct Registration {
    slot: usize,
    entry: *mut Entry,
}

// The entry is only shared through ENTRIES and run at most once.
unsafe impl Send for Registration {}
unsafe impl Sync for Registration {}

/// Registers `action` to run on drop, panic or fatal signal.
pub fn register(action: Box<dyn Teardown>) -> Result<Registration, String> {
    let entry = Box::into_raw(Box::new(Entry {
        action,
        done: AtomicBool::new(false),
        seq: NEXT_SEQ.fetch_add(1, SeqCst),
        thread: std::thread::current().id(),
    }));
    let Some(slot) = ENTRIES.iter().position(|s| {
        s.compare_exchange(null_mut(), entry, SeqCst, SeqCst)
            .is_ok()
    }) else {
        drop(unsafe { Box::from_raw(entry) });
        return Err(format!("more than {SLOTS} teardowns registered at once"));
    };
    install_panic_hook();
    let mut handlers = HANDLERS.lock().unwrap_or_else(|e| e.into_inner());
    if handlers.0 == 0 {
        handlers.1 = Some(SIGNALS.map(|s| unsafe { install_handler(s) }));
    }
    handlers.0 += 1;
    Ok(Registration { slot, entry })
}

impl Registration {
    /// Runs the teardown now (unless something already did) and reports how it went.
    pub fn finish(self) -> Result<(), Failure> {
        let result = unsafe { &*self.entry }.run_once();
        drop(self);
        result
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Err(f) = unsafe { &*self.entry }.run_once() {
            eprintln!("bench: teardown incomplete: {f}");
        }
        ENTRIES[self.slot].store(null_mut(), SeqCst);
        while WALKING.load(SeqCst) > 0 {
            std::thread::yield_now();
        }
        drop(unsafe { Box::from_raw(self.entry) });
        let mut handlers = HANDLERS.lock().unwrap_or_else(|e| e.into_inner());
        handlers.0 -= 1;
        if handlers.0 == 0 {
            if let Some(old) = handlers.1.take() {
                for (sig, action) in SIGNALS.iter().zip(old) {
                    unsafe { libc::sigaction(*sig, &action, null_mut()) };
                }
            }
        }
    }
}

/// Runs the selected registered teardowns, newest first, without allocating.
fn run_registered(select: impl Fn(&Entry) -> bool) {
    WALKING.fetch_add(1, SeqCst);
    let mut below = u64::MAX;
    loop {
        let mut newest: Option<&Entry> = None;
        for slot in &ENTRIES {
            let p = slot.load(SeqCst);
            if p.is_null() {
                continue;
            }
            let e = unsafe { &*p };
            if e.seq < below && newest.is_none_or(|n| e.seq > n.seq) {
                newest = Some(e);
            }
        }
        let Some(e) = newest else { break };
        below = e.seq;
        if select(e) {
            let _ = e.run_once();
        }
    }
    WALKING.fetch_sub(1, SeqCst);
}

/// Chains a hook in front of the existing one.
fn install_panic_hook() {
    PANIC_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let me = std::thread::current().id();
            run_registered(|e| cfg!(panic = "abort") || e.thread == me);
            previous(info);
        }));
    });
}

extern "C" fn on_fatal_signal(sig: libc::c_int) {
    run_registered(|_| true);
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Installs the teardown handler for `sig` (the other two blocked while it
/// runs); returns the action it replaced.
unsafe fn install_handler(sig: libc::c_int) -> libc::sigaction {
    let mut action: libc::sigaction = std::mem::zeroed();
    action.sa_sigaction = on_fatal_signal as extern "C" fn(libc::c_int) as usize;
    libc::sigemptyset(&mut action.sa_mask);
    for s in SIGNALS {
        libc::sigaddset(&mut action.sa_mask, s);
    }
    let mut old: libc::sigaction = std::mem::zeroed();
    libc::sigaction(sig, &action, &mut old);
    old
}

/// Sleeps without allocating (usable from the signal handler).
pub fn sleep_ms(ms: u64) {
    let ts = libc::timespec {
        tv_sec: (ms / 1000) as libc::time_t,
        tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
    };
    unsafe { libc::nanosleep(&ts, null_mut()) };
}

/// errno of the last failed call.
pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::path::PathBuf;
    use std::sync::Arc;

    /// Counts its runs and removes a marker file, like a real teardown would.
    struct Marker {
        runs: Arc<AtomicUsize>,
        path: std::ffi::CString,
    }

    impl Teardown for Marker {
        fn teardown(&self) -> Result<(), Failure> {
            self.runs.fetch_add(1, SeqCst);
            unsafe { libc::unlink(self.path.as_ptr()) };
            Ok(())
        }
    }

    fn marker(name: &str) -> (PathBuf, Arc<AtomicUsize>, Box<dyn Teardown>) {
        let path =
            std::env::temp_dir().join(format!("pagefold-teardown-{}-{name}", std::process::id()));
        std::fs::write(&path, "x").unwrap();
        let runs = Arc::new(AtomicUsize::new(0));
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        (path, runs.clone(), Box::new(Marker { runs, path: c }))
    }

    #[test]
    fn runs_once_on_finish_and_not_again_on_drop() {
        let (path, runs, action) = marker("finish");
        let r = register(action).unwrap();
        assert!(path.exists());
        r.finish().unwrap();
        assert!(!path.exists());
        assert_eq!(runs.load(SeqCst), 1);
    }

    #[test]
    fn a_panic_runs_the_panicking_threads_teardowns_once() {
        let (path, runs, action) = marker("panic");
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _r = register(action).unwrap();
            panic!("deliberate panic with a teardown registered");
        }));
        assert!(outcome.is_err());
        assert!(!path.exists());
        assert_eq!(
            runs.load(SeqCst),
            1,
            "the hook ran it; the drop while unwinding did not again"
        );
    }

    /// Runs `child_helper` in a copy of this test binary and returns its status.
    fn run_child(mode: &str, marker: &std::path::Path) -> std::process::ExitStatus {
        let exe = std::env::current_exe().unwrap();
        std::process::Command::new(exe)
            .args([
                "teardown::tests::child_helper",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("PAGEFOLD_TEARDOWN_CHILD", mode)
            .env("PAGEFOLD_TEARDOWN_MARKER", marker)
            .output()
            .unwrap()
            .status
    }

    #[test]
    fn sigterm_and_a_leaked_guard_panicking_still_tear_down() {
        for mode in ["sigterm", "panic-leaked"] {
            let path = std::env::temp_dir().join(format!(
                "pagefold-teardown-{}-child-{mode}",
                std::process::id()
            ));
            std::fs::write(&path, "x").unwrap();
            let status = run_child(mode, &path);
            assert!(!status.success(), "{mode}: {status:?}");
            if mode == "sigterm" {
                assert_eq!(
                    status.signal(),
                    Some(libc::SIGTERM),
                    "dies of the same signal"
                );
            }
            assert!(!path.exists(), "{mode}: the child's teardown did not run");
        }
    }

    /// Not a test on its own: the child of the test above.
    #[test]
    fn child_helper() {
        let (Ok(mode), Ok(path)) = (
            std::env::var("PAGEFOLD_TEARDOWN_CHILD"),
            std::env::var("PAGEFOLD_TEARDOWN_MARKER"),
        ) else {
            return;
        };
        let action = Box::new(Marker {
            runs: Arc::new(AtomicUsize::new(0)),
            path: std::ffi::CString::new(path).unwrap(),
        });
        let r = register(action).unwrap();
        if mode == "sigterm" {
            unsafe { libc::raise(libc::SIGTERM) };
            unreachable!("SIGTERM should have ended this process");
        }
        std::mem::forget(r); // no Drop: only the panic hook can run it
        panic!("deliberate panic with the registration leaked");
    }
}
