//! pagefold-testkit: what the integration tests of several crates share.
//!
//! [`TmpMount`]: a small tmpfs mounted for a test (a disk that fills up on
//! demand), unmounted however the test ends.
//!
//! Cargo builds a package's binaries for its own integration tests, but not
//! other packages' artifacts: the preload cdylib, pagefold-synth. Tests that
//! run them build them here, with the same profile into the same target
//! directory, once per test binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Builds `packages` into `dir` (a target/<profile> directory, as the
/// running test's executable or `CARGO_BIN_EXE_*` shows) and checks that
/// each of `files` is there afterwards; returns `dir`. Panics (failing the
/// test) if the build fails.
pub fn build_into(dir: &Path, packages: &[&str], files: &[&str]) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let key = format!("{}:{}", dir.display(), packages.join(","));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.contains(&key) {
        let mut cargo = Command::new(env!("CARGO"));
        cargo.arg("build");
        for p in packages {
            cargo.args(["-p", p]);
        }
        if dir.file_name().is_some_and(|n| n == "release") {
            cargo.arg("--release");
        }
        cargo.env("CARGO_TARGET_DIR", dir.parent().expect("target/<profile>"));
        let status = cargo
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo");
        assert!(status.success(), "building {} failed", packages.join(", "));
        built.push(key);
    }
    for f in files {
        assert!(dir.join(f).is_file(), "{f} not built in {}", dir.display());
    }
    dir.to_path_buf()
}

/// target/<profile> of the running test executable (it lives in deps/ below it).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/TEST")
        .to_path_buf()
}

/// A tmpfs of `size` (as mount's `size=` option: "256k", "1m") mounted on a
/// fresh directory; unmounted and removed on drop, also when the test
/// fails. Needs root: `new` returns None (and says so) without it.
pub struct TmpMount(PathBuf);

impl TmpMount {
    pub fn new(tag: &str, size: &str) -> Option<TmpMount> {
        let dir = std::env::temp_dir().join(format!("pagefold-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            let _ = std::fs::remove_dir(&dir);
            eprintln!("skipping: cannot mount a tmpfs (not root?)");
            return None;
        }
        Some(TmpMount(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpMount {
    fn drop(&mut self) {
        // Busy (a file still open, say by a failed test's leftover thread):
        // detach it now; the kernel frees it when the file is closed.
        let unmounted = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}
