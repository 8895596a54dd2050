//! Kernel KSM guard: the fold suite turns the kernel's KSM on and changes how
//! fast it scans, and those knobs under /sys/kernel/mm/ksm are global to the
//! machine. A `KsmGuard` saves every writable knob when it is taken and puts
//! back whatever changed, on every way out of the process we can catch (see
//! `teardown`: drop, panic hook, SIGINT/SIGTERM/SIGHUP).
//!
//! Other processes may drive KSM too (the demo, another benchmark): a guard
//! also holds an flock on LOCK_FILE, so cooperating processes take turns;
//! the fold suite additionally checks the knobs on every poll and reports a
//! run whose knobs someone else changed.
//!
//! The restore may run inside a signal handler, so it uses only open, read,
//! write and close on data prepared when the guard was taken: no allocation,
//! no locks. Guards in one process are serialised by a mutex (tests run in
//! threads).

use std::ffi::CString;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::sys::{self, Fd};
use crate::teardown::{self, Failure, Registration, Teardown};

/// Where the kernel exposes KSM.
pub const KSM_DIR: &str = "/sys/kernel/mm/ksm";
/// flock'ed by every guard: processes that drive KSM take turns on it.
pub const LOCK_FILE: &str = "/run/lock/pagefold-ksm.lock";
/// How long a guard waits for another process's guard before going ahead anyway.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// One writable knob and the value to put back (the selected word for
/// multiple-choice knobs such as `advisor_mode`).
struct Knob {
    name: String,
    path: CString,
    value: Vec<u8>,
}

/// Everything the restore path needs, prepared before any change is made.
struct Saved {
    knobs: Vec<Knob>,
}

/// One guard at a time per process.
static GUARD_LOCK: Mutex<()> = Mutex::new(());

/// Holds the KSM knobs as they were; restores them when it goes away.
pub struct KsmGuard {
    saved: Arc<Saved>,
    /// Restores the knobs when dropped (before the locks below are released).
    _restore: Registration,
    /// Holds the flock on LOCK_FILE (None if it could not be had); closed on drop.
    _file_lock: Option<std::fs::File>,
    _lock: MutexGuard<'static, ()>,
}

/// The teardown: the saved knobs, shared with the guard.
struct Restore(Arc<Saved>);

impl Teardown for Restore {
    fn teardown(&self) -> Result<(), Failure> {
        restore(&self.0);
        Ok(())
    }
}

impl KsmGuard {
    /// Saves the knobs and installs the restore handlers. `Err` says why KSM
    /// cannot be driven here (not root, no KSM in this kernel).
    pub fn acquire() -> Result<KsmGuard, String> {
        if !sys::is_root() {
            return Err("not root: /sys/kernel/mm/ksm is writable by root only".into());
        }
        if !Path::new(KSM_DIR).is_dir() {
            return Err(format!(
                "{KSM_DIR} missing: kernel built without CONFIG_KSM"
            ));
        }
        let lock = lock_guards();
        let file_lock = lock_across_processes();
        let knobs = save_knobs().map_err(|e| format!("reading {KSM_DIR}: {e}"))?;
        let saved = Arc::new(Saved { knobs });
        let restore = teardown::register(Box::new(Restore(saved.clone())))?;
        Ok(KsmGuard {
            saved,
            _restore: restore,
            _file_lock: file_lock,
            _lock: lock,
        })
    }

    /// Writes a knob. Only knobs saved by this guard can be written, so every
    /// change is undone.
    pub fn set(&self, name: &str, value: &str) -> io::Result<()> {
        if !self.saved.knobs.iter().any(|k| k.name == name) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name} is not a saved KSM knob"),
            ));
        }
        std::fs::write(Path::new(KSM_DIR).join(name), value)
    }

    /// The names of the knobs this guard will restore.
    pub fn saved_knobs(&self) -> Vec<String> {
        self.saved.knobs.iter().map(|k| k.name.clone()).collect()
    }
}

/// The current value of a knob or counter (the selected word for multiple-choice knobs).
pub fn read_knob(name: &str) -> io::Result<String> {
    let raw = std::fs::read(Path::new(KSM_DIR).join(name))?;
    Ok(String::from_utf8_lossy(selected(&raw)).into_owned())
}

/// A numeric KSM counter such as `pages_sharing` or `full_scans`.
pub fn read_counter(name: &str) -> io::Result<u64> {
    read_knob(name)?
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{name}: {e}")))
}

fn lock_guards() -> MutexGuard<'static, ()> {
    GUARD_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Waits (up to LOCK_WAIT) for an exclusive flock on LOCK_FILE. The kernel
/// drops it when the process dies, however it dies.
fn lock_across_processes() -> Option<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_FILE)
        .ok()?;
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    let mut said = false;
    while !sys::try_lock_exclusive(&file) {
        if std::time::Instant::now() > deadline {
            eprintln!("ksm: {LOCK_FILE} still held by another process; going ahead without it");
            return None;
        }
        if !said {
            eprintln!("ksm: another process is driving KSM ({LOCK_FILE} held); waiting");
            said = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Some(file)
}

/// Every file under KSM_DIR whose owner may write it, `run` first so that
/// restoring stops ksmd before anything else is put back.
fn save_knobs() -> io::Result<Vec<Knob>> {
    let mut knobs = Vec::new();
    for entry in std::fs::read_dir(KSM_DIR)? {
        let entry = entry?;
        let writable =
            std::os::unix::fs::PermissionsExt::mode(&entry.metadata()?.permissions()) & 0o200 != 0;
        if !writable {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let value = selected(&std::fs::read(entry.path())?).to_vec();
        let path = CString::new(entry.path().as_os_str().as_encoded_bytes())
            .expect("no NUL in a sysfs path");
        knobs.push(Knob { name, path, value });
    }
    knobs.sort_by_key(|k| (k.name != "run", k.name.clone()));
    Ok(knobs)
}

/// The value a knob reads as: trimmed, and for "[none] scan-time" the word in brackets.
/// Allocation-free: the signal handler uses it.
fn selected(raw: &[u8]) -> &[u8] {
    if let Some(open) = raw.iter().position(|&b| b == b'[') {
        if let Some(len) = raw[open + 1..].iter().position(|&b| b == b']') {
            return &raw[open + 1..open + 1 + len];
        }
    }
    raw.trim_ascii()
}

/// Puts back every knob whose value differs from the saved one. Async-signal-safe.
/// Writing only what changed avoids EBUSY from knobs like merge_across_nodes.
fn restore(saved: &Saved) {
    for knob in &saved.knobs {
        let mut buf = [0u8; 256];
        let now = read_raw(&knob.path, &mut buf);
        if now.map(selected) != Some(&knob.value[..]) {
            write_raw(&knob.path, &knob.value);
        }
    }
}

/// What one read of the file at `path` returns, into `buf`; allocation-free.
fn read_raw<'b>(path: &CString, buf: &'b mut [u8]) -> Option<&'b [u8]> {
    let fd = Fd::open(path, libc::O_RDONLY | libc::O_CLOEXEC)?;
    let n = fd.read(buf);
    drop(fd);
    (n >= 0).then(|| &buf[..n as usize])
}

/// Writes `value` to the file at `path` if it opens; allocation-free.
fn write_raw(path: &CString, value: &[u8]) {
    if let Some(fd) = Fd::open(path, libc::O_WRONLY | libc::O_CLOEXEC) {
        fd.write(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    const CHILD_MODE: &str = "PAGEFOLD_KSM_TEST_CHILD";

    fn guard_or_skip() -> Option<KsmGuard> {
        match KsmGuard::acquire() {
            Ok(g) => Some(g),
            Err(why) => {
                eprintln!("skipped: {why}");
                None
            }
        }
    }

    fn pages_to_scan() -> u64 {
        read_counter("pages_to_scan").unwrap()
    }

    #[test]
    fn selected_word_of_multiple_choice_knob() {
        assert_eq!(selected(b"[none] scan-time\n"), b"none");
        assert_eq!(selected(b"none [scan-time]\n"), b"scan-time");
        assert_eq!(selected(b" 100\n"), b"100");
    }

    #[test]
    fn restores_on_drop() {
        let Some(guard) = guard_or_skip() else { return };
        let before = (pages_to_scan(), read_counter("sleep_millisecs").unwrap());
        guard
            .set("pages_to_scan", &(before.0 + 37).to_string())
            .unwrap();
        guard
            .set("sleep_millisecs", &(before.1 + 3).to_string())
            .unwrap();
        assert_eq!(pages_to_scan(), before.0 + 37);
        assert!(guard.saved_knobs().iter().any(|k| k == "run"));
        drop(guard);
        assert_eq!(
            (pages_to_scan(), read_counter("sleep_millisecs").unwrap()),
            before
        );
    }

    #[test]
    fn refuses_knobs_it_did_not_save() {
        let Some(guard) = guard_or_skip() else { return };
        assert!(guard.set("pages_sharing", "1").is_err());
        assert!(guard.set("../../../../tmp/x", "1").is_err());
    }

    #[test]
    fn restores_after_panic_inside_guard() {
        if KsmGuard::acquire().is_err() {
            eprintln!("skipped: cannot drive KSM here");
            return;
        }
        let before = pages_to_scan();
        let outcome = std::panic::catch_unwind(|| {
            let guard = KsmGuard::acquire().unwrap();
            guard
                .set("pages_to_scan", &(before + 19).to_string())
                .unwrap();
            assert_eq!(pages_to_scan(), before + 19);
            panic!("deliberate panic inside the KSM guard");
        });
        assert!(outcome.is_err());
        assert_eq!(pages_to_scan(), before);
    }

    /// Runs `child_helper` in a fresh copy of this test binary with the given mode;
    /// returns its exit status and output. The parent holds the guard lock meanwhile.
    fn run_child(mode: &str) -> (std::process::ExitStatus, String) {
        let exe = std::env::current_exe().unwrap();
        let out = Command::new(exe)
            .args([
                "ksm::tests::child_helper",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_MODE, mode)
            .output()
            .unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    #[test]
    fn restores_on_sigterm() {
        if KsmGuard::acquire().is_err() {
            eprintln!("skipped: cannot drive KSM here");
            return;
        }
        let _serial = lock_guards();
        let before = pages_to_scan();
        let (status, stdout) = run_child("sigterm");
        assert!(
            stdout.contains("knob changed"),
            "child did not change the knob: {stdout}"
        );
        assert_eq!(
            status.signal(),
            Some(libc::SIGTERM),
            "child status {status:?}"
        );
        assert_eq!(pages_to_scan(), before);
    }

    #[test]
    fn restores_from_panic_hook_without_drop() {
        if KsmGuard::acquire().is_err() {
            eprintln!("skipped: cannot drive KSM here");
            return;
        }
        let _serial = lock_guards();
        let before = pages_to_scan();
        let (status, stdout) = run_child("panic-no-drop");
        assert!(
            stdout.contains("knob changed"),
            "child did not change the knob: {stdout}"
        );
        assert!(!status.success());
        assert_eq!(pages_to_scan(), before);
    }

    /// Not a test on its own: the body of the two child-process tests above.
    /// It does nothing unless the parent test set PAGEFOLD_KSM_TEST_CHILD.
    #[test]
    fn child_helper() {
        let Ok(mode) = std::env::var(CHILD_MODE) else {
            return;
        };
        let guard = KsmGuard::acquire().unwrap();
        guard
            .set("pages_to_scan", &(pages_to_scan() + 41).to_string())
            .unwrap();
        println!("knob changed");
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        match mode.as_str() {
            "sigterm" => {
                // SAFETY: raise takes no pointers; the process dies of SIGTERM
                // here (after the restore handler), which is what this checks.
                unsafe { libc::raise(libc::SIGTERM) };
            }
            _ => {
                std::mem::forget(guard); // no Drop: only the panic hook can restore
                panic!("deliberate panic with the guard leaked");
            }
        }
        unreachable!("SIGTERM should have ended this process");
    }
}
