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
pub mod live;
pub mod raw;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::image::{Image, Kind};
use crate::progress::Progress;

/// Which pages of a target to keep.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Mapping kinds to keep; `None` keeps all.
    pub kinds: Option<Vec<Kind>>,
    /// Address ranges [start, end) to keep (virtual addresses, or file
    /// offsets for raw images); empty keeps all.
    pub ranges: Vec<(u64, u64)>,
}

impl Filter {
    pub fn accepts_kind(&self, kind: Kind) -> bool {
        match (&self.kinds, kind) {
            (_, Kind::Image) => true,
            (None, _) => true,
            (Some(k), kind) => k.contains(&kind),
        }
    }

    /// The parts of [a, b) inside the range filter, page-aligned inward.
    pub fn clip(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        let page = crate::image::PAGE as u64;
        if self.ranges.is_empty() {
            return if b > a { vec![(a, b)] } else { vec![] };
        }
        let mut out = Vec::new();
        for &(ra, rb) in &self.ranges {
            let s = a.max(ra);
            let e = b.min(rb);
            let s = s.next_multiple_of(page).max(a);
            let e = a + (e.saturating_sub(a) / page) * page;
            if e > s {
                out.push((s, e));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

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
