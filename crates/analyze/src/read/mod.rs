//! Readers: turn a target (a live PID, a raw memory image, an ELF core file,
//! or two snapshots of PIDs taken some time apart) into an [`Image`].
//!
//! A target string that is all digits is a PID; anything else is a path.
//! Files starting with the ELF magic are read as core files, everything else
//! as a raw image, unless the caller forces one format. A [`Filter`] selects
//! mapping kinds (anon/file/heap/stack) and address ranges; raw images have
//! no mappings, so only the range filter (file offsets) applies to them.
//! Several targets are read one after the other and appended, each keeping
//! its input index, which is what cross-input (KSM-like) sharing is measured
//! against.

pub mod core;
pub mod filter;
pub mod live;
pub mod raw;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::image::Image;
use crate::progress::Progress;

pub use filter::Filter;

/// How to read a file target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileFormat {
    /// ELF magic decides.
    #[default]
    Auto,
    Raw,
    Core,
}

/// A parsed target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Pid(u32),
    File(PathBuf),
}

impl Target {
    pub fn parse(s: &str) -> Result<Target> {
        if s.is_empty() {
            return Err(Error::Usage("empty target (give a PID or a file)".into()));
        }
        if s.bytes().all(|b| b.is_ascii_digit()) {
            return match s.parse::<u32>() {
                Ok(0) | Err(_) => Err(Error::Usage(format!("invalid PID: {s}"))),
                Ok(p) if p > i32::MAX as u32 => Err(Error::Usage(format!("invalid PID: {s}"))),
                Ok(p) => Ok(Target::Pid(p)),
            };
        }
        if s.starts_with('-') && s[1..].bytes().all(|b| b.is_ascii_digit()) && s.len() > 1 {
            return Err(Error::Usage(format!("invalid PID: {s}")));
        }
        Ok(Target::File(PathBuf::from(s)))
    }
}

/// Reads one file target.
pub fn read_file(path: &Path, format: FileFormat, filter: &Filter) -> Result<Image> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if meta.is_dir() {
        return Err(Error::Usage(format!(
            "{} is a directory, not an image or core file",
            path.display()
        )));
    }
    let core = match format {
        FileFormat::Core => true,
        FileFormat::Raw => false,
        FileFormat::Auto => meta.len() > 0 && core::looks_like_elf(path)?,
    };
    if core {
        core::read(path, filter)
    } else {
        raw::read(path, filter)
    }
}

/// Reads all targets, each once, or twice `interval` apart when given (PIDs
/// only), and appends them into one image.
pub fn read_targets(
    targets: &[Target],
    format: FileFormat,
    filter: &Filter,
    interval: Option<Duration>,
    progress: &Progress,
) -> Result<Image> {
    if targets.is_empty() {
        return Err(Error::Usage(
            "no target (give a PID, an image file or a core file)".into(),
        ));
    }
    let mut image = Image::new();
    match interval {
        None => {
            for t in targets {
                let part = match t {
                    Target::Pid(pid) => live::read_pid(*pid, filter, progress, None)?,
                    Target::File(p) => read_file(p, format, filter)?,
                };
                image.append(part);
            }
        }
        Some(interval) => {
            let mut pids = Vec::new();
            for t in targets {
                match t {
                    Target::Pid(p) => pids.push(*p),
                    Target::File(p) => {
                        return Err(Error::Usage(format!(
                            "--interval takes snapshots of processes; {} is a file",
                            p.display()
                        )))
                    }
                }
            }
            for part in live::read_snapshots(&pids, filter, interval, progress)? {
                image.append(part);
            }
        }
    }
    if image.pages() == 0 {
        return Err(Error::NothingToAnalyze(
            "no populated page is left after the filters".into(),
        ));
    }
    Ok(image)
}
