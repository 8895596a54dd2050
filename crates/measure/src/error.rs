//! Errors of a measurement. A process can vanish at any moment while /proc is
//! being read, so "it is gone" is split in two: `NoSuchProcess` when it was not
//! there to begin with, `ProcessExited` when it went away (or became a zombie)
//! part-way. Callers such as the sampler treat the second as a normal end.

use std::io;
use std::path::PathBuf;

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No /proc entry for this PID when the measurement started.
    #[error("no such process {0}")]
    NoSuchProcess(u32),
    /// /proc refused to show this process (another user's process, not root).
    #[error("permission denied reading process {0} (run as root or as its owner)")]
    PermissionDenied(u32),
    /// The process exited, or is a zombie, while it was being measured.
    #[error("process {0} exited")]
    ProcessExited(u32),
    /// Any other failure reading /proc.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// True when the process is gone (never existed or exited): the normal end
    /// of a time series rather than a failure.
    pub fn is_gone(&self) -> bool {
        matches!(self, Error::NoSuchProcess(_) | Error::ProcessExited(_))
    }

    /// Classifies an I/O error on a /proc file of `pid`, after the process was
    /// seen alive: ENOENT/ESRCH there mean it exited in between.
    pub(crate) fn from_proc_io(pid: u32, path: impl Into<PathBuf>, source: io::Error) -> Error {
        match source.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ESRCH) => Error::ProcessExited(pid),
            Some(libc::EACCES) | Some(libc::EPERM) => Error::PermissionDenied(pid),
            _ => Error::Io {
                path: path.into(),
                source,
            },
        }
    }
}
