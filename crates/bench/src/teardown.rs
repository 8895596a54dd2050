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

// SAFETY: a Registration owns its `entry` like a Box<Entry> (made by
// Box::into_raw in `register`, freed only in its Drop); the only other
// access is through ENTRIES by hooks and handlers, which only call
// run_once, made at-most-once by the atomic `done`. Entry itself is Send
// and Sync (a Send + Sync Teardown, atomics, plain data), so moving a
// Registration to another thread is as safe as moving that Box.
unsafe impl Send for Registration {}
// SAFETY: a shared &Registration gives access to nothing (every method
// takes it by value), so sharing it between threads cannot race.
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
        // SAFETY: `entry` comes from Box::into_raw just above and was never
        // published (every compare_exchange failed): this is its only owner.
        drop(unsafe { Box::from_raw(entry) });
        return Err(format!("more than {SLOTS} teardowns registered at once"));
    };
    install_panic_hook();
    let mut handlers = HANDLERS.lock().unwrap_or_else(|e| e.into_inner());
    if handlers.0 == 0 {
        handlers.1 = Some(SIGNALS.map(install_handler));
    }
    handlers.0 += 1;
    Ok(Registration { slot, entry })
}

impl Registration {
    /// Runs the teardown now (unless something already did) and reports how it went.
    pub fn finish(self) -> Result<(), Failure> {
        // SAFETY: `entry` stays allocated until this Registration drops
        // (below, after the call), and Entry is only ever shared immutably.
        let result = unsafe { &*self.entry }.run_once();
        drop(self);
        result
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: `entry` is freed only further down in this drop, and Entry
        // is only ever shared immutably.
        if let Err(f) = unsafe { &*self.entry }.run_once() {
            eprintln!("bench: teardown incomplete: {f}");
        }
        ENTRIES[self.slot].store(null_mut(), SeqCst);
        while WALKING.load(SeqCst) > 0 {
            std::thread::yield_now();
        }
        // SAFETY: `entry` came from Box::into_raw in `register` and is owned
        // by this Registration; its slot is cleared and no hook or handler is
        // walking ENTRIES (a walker counts itself in WALKING before it loads
        // a slot, SeqCst), so no reference to it is left.
        drop(unsafe { Box::from_raw(self.entry) });
        let mut handlers = HANDLERS.lock().unwrap_or_else(|e| e.into_inner());
        handlers.0 -= 1;
        if handlers.0 == 0 {
            if let Some(old) = handlers.1.take() {
                for (sig, action) in SIGNALS.iter().zip(old) {
                    // SAFETY: `action` is the sigaction install_handler saved
                    // for `sig`, a valid value on this frame; the old-action
                    // pointer is null, which sigaction allows.
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
            // SAFETY: `p` is non-null and was in ENTRIES after this walker
            // counted itself in WALKING; an entry is freed only once its slot
            // is cleared and WALKING has dropped to zero (Registration::drop),
            // so it stays allocated until WALKING is decremented below.
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
    // SAFETY: signal and raise take no pointers and are async-signal-safe;
    // restoring the default action and raising again makes the process die
    // of the signal it got, after the teardowns above.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Installs the teardown handler for `sig` (the other two blocked while it
/// runs); returns the action it replaced. The handler, `on_fatal_signal`,
/// only walks ENTRIES and runs teardowns, which allocate nothing and take no
/// lock (see the module comment).
fn install_handler(sig: libc::c_int) -> libc::sigaction {
    // SAFETY: sigaction is a C struct of integers, a handler address and a
    // signal mask, for which all zero bytes is a valid value (SIG_DFL, no
    // flags, empty mask).
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_fatal_signal as extern "C" fn(libc::c_int) as usize;
    // SAFETY: sigemptyset and sigaddset write only into `action.sa_mask`, a
    // live sigset_t on this frame.
    unsafe {
        libc::sigemptyset(&mut action.sa_mask);
        for s in SIGNALS {
            libc::sigaddset(&mut action.sa_mask, s);
        }
    }
    // SAFETY: as for `action`, all zero bytes is a valid sigaction.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: `action` and `old` are live sigactions on this frame (read and
    // written respectively); `action.sa_sigaction` is an extern "C"
    // fn(c_int), the handler type sigaction expects without SA_SIGINFO.
    unsafe { libc::sigaction(sig, &action, &mut old) };
    old
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
            // SAFETY: `path` is a NUL-terminated CString owned by this
            // Marker; unlink only reads it.
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
            // SAFETY: raise takes no pointers; the process dies of SIGTERM
            // here (after the teardown handler), which is what this checks.
            unsafe { libc::raise(libc::SIGTERM) };
            unreachable!("SIGTERM should have ended this process");
        }
        std::mem::forget(r); // no Drop: only the panic hook can run it
        panic!("deliberate panic with the registration leaked");
    }
}
