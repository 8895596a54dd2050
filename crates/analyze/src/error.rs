//! Why an analysis could not run. Every variant prints as one line that says
//! what was wrong with which input, so the CLI can print
//! `pagefold analyze: <message>` and exit with code 2; nothing in this crate
//! panics on bad input (a malformed core is an error value, not an index out
//! of bounds).

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no such process: {0}")]
    NoSuchProcess(u32),
    #[error("permission denied reading {} (need root, or ptrace access to process {pid})", path.display())]
    PermissionDenied { pid: u32, path: PathBuf },
    #[error("process {0} exited while it was being read")]
    ProcessExited(u32),
    #[error("process {0} has no user memory to read (a kernel thread or a zombie)")]
    NoUserMemory(u32),
    #[error("{}: file is empty", .0.display())]
    EmptyFile(PathBuf),
    #[error("{}: size {size} bytes is not a multiple of the 4096-byte page size", path.display())]
    NotPageMultiple { path: PathBuf, size: u64 },
    #[error("{}: not an ELF file", .0.display())]
    NotElf(PathBuf),
    #[error("{}: ELF {kind} file, not a core file", path.display())]
    NotCore { path: PathBuf, kind: &'static str },
    #[error("{}: truncated core file ({detail})", path.display())]
    Truncated { path: PathBuf, detail: String },
    #[error("{}: malformed ELF file ({detail})", path.display())]
    BadElf { path: PathBuf, detail: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("nothing to analyze: {0}")]
    NothingToAnalyze(String),
    #[error("{0}")]
    Usage(String),
    #[error("cannot write plots to {}: {detail}", dir.display())]
    Plot { dir: PathBuf, detail: String },
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
