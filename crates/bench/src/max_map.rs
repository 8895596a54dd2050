//! A raised `vm.max_map_count` for one measurement. The engine merges a page
//! by mapping it onto another page's frame, so an isolated merged page costs
//! two mappings, and a program's mappings are bounded by `vm.max_map_count`
//! (65,530 by default). An administrator can raise it; the fold suite
//! measures what the engine does then. The knob is global to the machine, so
//! a `MaxMapGuard` puts the old value back on every way out of the process it
//! can catch (see `teardown`), with nothing but open, write and close on data
//! prepared when it was taken.

use std::ffi::CString;

use crate::sys::{self, Fd};
use crate::teardown::{self, Registration, Teardown};

/// Where the kernel exposes the knob.
pub const KNOB: &str = "/proc/sys/vm/max_map_count";

/// The knob's value before the guard raised it, and the path to write it back.
struct Saved {
    path: CString,
    value: Vec<u8>,
}

impl Teardown for Saved {
    fn teardown(&self) -> Result<(), teardown::Failure> {
        match Fd::open(&self.path, libc::O_WRONLY | libc::O_CLOEXEC) {
            Some(fd) if fd.write(&self.value) == self.value.len() as isize => Ok(()),
            _ => Err(teardown::Failure {
                what: "restoring vm.max_map_count",
                errno: sys::errno(),
            }),
        }
    }
}

/// `vm.max_map_count` raised; restored when dropped.
pub struct MaxMapGuard {
    /// The value it had before.
    pub before: u64,
    _restore: Registration,
}

impl MaxMapGuard {
    /// Raises `vm.max_map_count` to at least `to`. `Err` says why not (not
    /// root, no such knob).
    pub fn raise(to: u64) -> Result<MaxMapGuard, String> {
        if !sys::is_root() {
            return Err(format!("not root: {KNOB} is writable by root only"));
        }
        let text = std::fs::read_to_string(KNOB).map_err(|e| format!("{KNOB}: {e}"))?;
        let before: u64 = text
            .trim()
            .parse()
            .map_err(|e| format!("{KNOB} holds {text:?}: {e}"))?;
        let saved = Saved {
            path: sys::c_path(std::path::Path::new(KNOB)),
            value: text.trim().as_bytes().to_vec(),
        };
        let restore = teardown::register(Box::new(saved))?;
        if to > before {
            std::fs::write(KNOB, to.to_string()).map_err(|e| format!("{KNOB}: {e}"))?;
        }
        Ok(MaxMapGuard {
            before,
            _restore: restore,
        })
    }
}

/// The knob's value now.
pub fn current() -> Option<u64> {
    std::fs::read_to_string(KNOB).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raises_and_puts_back() {
        let Some(before) = current() else { return };
        match MaxMapGuard::raise(before + 4096) {
            Ok(guard) => {
                assert_eq!(guard.before, before);
                assert_eq!(current(), Some(before + 4096));
                drop(guard);
                assert_eq!(current(), Some(before));
            }
            Err(why) => {
                assert!(!sys::is_root(), "root could not raise it: {why}");
                assert_eq!(current(), Some(before));
            }
        }
    }
}
