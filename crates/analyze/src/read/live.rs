//! Live processes: /proc/PID/maps lists the mappings, /proc/PID/pagemap says
//! which of their pages are populated (present in RAM or swapped out), and
//! /proc/PID/mem gives their bytes. Unpopulated pages are skipped: they hold
//! no data and cost no memory, and reading them through mem would make the
//! kernel fault them in (changing the target, and inflating the zero count).
//! The target is not stopped, so a page may change while it is read; every
//! page is still one consistent 4 KiB read.
//!
//! Reading is parallel (pieces of at most 1 MiB, on all cores, with
//! process_vm_readv, falling back to /proc/PID/mem), with a progress bar. A mapping that disappears mid-read loses only its pages
//! (counted as vanished); a process that exits mid-read is an error.
//! [`read_snapshots`] reads the same PIDs twice, `interval` apart, and marks
//! every page of the second snapshot unchanged, changed or new: the
//! behaviour classes of the comparison analysis (CMDP's BMD).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use crate::error::{Error, Result};
pub use crate::image::SnapshotInfo;
use crate::image::{Buffer, Change, Image, InputInfo, Kind, Perms, Region, PAGE};
use crate::progress::Progress;
use crate::read::filter::Filter;

const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const PFN_MASK: u64 = (1 << 55) - 1;
const PIECE: usize = 1 << 20;

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub perms: Perms,
    pub name: Option<String>,
}

/// Parses /proc/PID/maps text; lines it does not understand are skipped.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut it = line.splitn(6, ' ');
        let (Some(range), Some(perms)) = (it.next(), it.next()) else {
            continue;
        };
        let _offset = it.next();
        let _dev = it.next();
        let _inode = it.next();
        let name = it
            .next()
            .map(|s| s.trim_start())
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        if end <= start {
            continue;
        }
        out.push(Mapping {
            start,
            end,
            perms: Perms::parse(perms),
            name,
        });
    }
    out
}

/// The kind of a mapping, or `None` for mappings that must not be read
/// ([vvar], [vsyscall]: reading them fails or has side effects).
pub fn kind_of(m: &Mapping) -> Option<Kind> {
    let Some(name) = m.name.as_deref() else {
        return Some(Kind::Anon);
    };
    if name == "[heap]" {
        Some(Kind::Heap)
    } else if name == "[stack]" || name.starts_with("[stack:") {
        Some(Kind::Stack)
    } else if name.starts_with("[anon") {
        Some(Kind::Anon)
    } else if name.starts_with("[vvar") || name == "[vsyscall]" {
        None
    } else if name.starts_with('[') {
        Some(Kind::Other)
    } else if name.starts_with("/memfd:")
        || name.starts_with("/dev/zero")
        || name.starts_with("/SYSV")
    {
        Some(Kind::Anon)
    } else {
        Some(Kind::File)
    }
}

/// Points in a live read where tests can step in (e.g. kill the target).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// maps and pagemap were read; the page bytes are next.
    PagemapRead,
}

pub type Hook<'a> = &'a (dyn Fn(Stage) + Sync);

fn proc_path(pid: u32, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{name}"))
}

/// State letter from /proc/PID/stat, `None` when the process is gone.
fn state(pid: u32) -> Option<char> {
    let text = std::fs::read_to_string(proc_path(pid, "stat")).ok()?;
    let after = &text[text.rfind(')')? + 1..];
    after.split_whitespace().next()?.chars().next()
}

fn alive(pid: u32) -> bool {
    !matches!(state(pid), None | Some('Z') | Some('X') | Some('x'))
}

/// Maps an error on /proc/PID/NAME to the process-level error it means.
fn proc_error(pid: u32, path: PathBuf, e: io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EPERM) => Error::PermissionDenied { pid, path },
        Some(libc::ENOENT) | Some(libc::ESRCH) => Error::ProcessExited(pid),
        _ if !alive(pid) => Error::ProcessExited(pid),
        _ => Error::io(path, e),
    }
}

/// A run of populated pages of one mapping.
struct Run {
    addr: u64,
    pages: usize,
    kind: Kind,
    perms: Perms,
    name: Option<String>,
    frames: Vec<u64>,
}

/// Reads the populated pages of process `pid`.
pub fn read_pid(
    pid: u32,
    filter: &Filter,
    progress: &Progress,
    hook: Option<Hook>,
) -> Result<Image> {
    let start = Instant::now();
    match std::fs::metadata(format!("/proc/{pid}")) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(Error::NoSuchProcess(pid)),
        Err(e) => return Err(proc_error(pid, proc_path(pid, ""), e)),
    }
    if matches!(state(pid), Some('Z') | Some('X') | Some('x')) {
        return Err(Error::NoUserMemory(pid));
    }
    let comm = std::fs::read_to_string(proc_path(pid, "comm")).unwrap_or_default();
    let maps_path = proc_path(pid, "maps");
    let maps =
        std::fs::read_to_string(&maps_path).map_err(|e| proc_error(pid, maps_path.clone(), e))?;
    let mappings = parse_maps(&maps);
    if mappings.is_empty() {
        return Err(if alive(pid) {
            Error::NoUserMemory(pid)
        } else {
            Error::ProcessExited(pid)
        });
    }
    let pagemap_path = proc_path(pid, "pagemap");
    let pagemap =
        File::open(&pagemap_path).map_err(|e| proc_error(pid, pagemap_path.clone(), e))?;
    let mem_path = proc_path(pid, "mem");
    let mem = File::open(&mem_path).map_err(|e| proc_error(pid, mem_path.clone(), e))?;

    // Populated runs, from pagemap.
    let mut runs: Vec<Run> = Vec::new();
    let mut unpopulated = 0u64;
    let mut used_mappings = 0;
    let mut entries = vec![0u8; 8 * 65536];
    for m in &mappings {
        let Some(kind) = kind_of(m) else { continue };
        if !filter.accepts_kind(kind) {
            continue;
        }
        let mut used = false;
        for (a, b) in filter.clip(m.start, m.end) {
            let mut addr = a;
            let mut run: Option<Run> = None;
            while addr < b {
                let n = (((b - addr) / PAGE as u64) as usize).min(65536);
                let want = n * 8;
                let got = read_full(&pagemap, &mut entries[..want], (addr / PAGE as u64) * 8)
                    .map_err(|e| proc_error(pid, pagemap_path.clone(), e))?;
                if got < want && !alive(pid) {
                    return Err(Error::ProcessExited(pid));
                }
                let got_pages = got / 8;
                for i in 0..n {
                    let e = if i < got_pages {
                        u64::from_le_bytes(entries[i * 8..i * 8 + 8].try_into().unwrap())
                    } else {
                        0
                    };
                    let page_addr = addr + (i * PAGE) as u64;
                    if e & (PRESENT | SWAPPED) != 0 {
                        let frame = if e & PRESENT != 0 { e & PFN_MASK } else { 0 };
                        match &mut run {
                            Some(r) if r.addr + (r.pages * PAGE) as u64 == page_addr => {
                                r.pages += 1;
                                r.frames.push(frame);
                            }
                            _ => {
                                if let Some(r) = run.take() {
                                    runs.push(r);
                                }
                                run = Some(Run {
                                    addr: page_addr,
                                    pages: 1,
                                    kind,
                                    perms: m.perms,
                                    name: m.name.clone(),
                                    frames: vec![frame],
                                });
                            }
                        }
                    } else {
                        unpopulated += 1;
                    }
                }
                addr += (n * PAGE) as u64;
            }
            if let Some(r) = run.take() {
                runs.push(r);
                used = true;
            }
        }
        used_mappings += used as usize;
    }
    if let Some(h) = hook {
        h(Stage::PagemapRead);
    }

    // Page bytes, in parallel pieces.
    let total: usize = runs.iter().map(|r| r.pages).sum();
    let mut buffer = vec![0u8; total * PAGE];
    let mut pieces: Vec<(u64, &mut [u8])> = Vec::new();
    {
        let mut rest: &mut [u8] = &mut buffer;
        for r in &runs {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(r.pages * PAGE);
            rest = tail;
            let mut addr = r.addr;
            for chunk in mine.chunks_mut(PIECE) {
                let len = chunk.len() as u64;
                pieces.push((addr, chunk));
                addr += len;
            }
        }
    }
    let bar = progress.stage("read", (total * PAGE) as u64, true);
    // For every piece: addresses of pages that could not be read.
    let failures: Vec<(Vec<u64>, bool)> = pieces
        .into_par_iter()
        .map(|(addr, chunk)| {
            let r = read_piece(pid, &mem, addr, chunk);
            bar.inc(chunk.len() as u64);
            r
        })
        .collect();
    bar.finish();
    let any_failed = failures.iter().any(|(f, _)| !f.is_empty());
    if any_failed && !alive(pid) {
        return Err(Error::ProcessExited(pid));
    }
    if let Some((_, true)) = failures.iter().find(|(_, denied)| *denied) {
        return Err(Error::PermissionDenied {
            pid,
            path: mem_path,
        });
    }
    let mut lost: Vec<u64> = failures.into_iter().flat_map(|(f, _)| f).collect();
    lost.sort_unstable();
    if total > 0 && lost.len() == total && !alive(pid) {
        return Err(Error::ProcessExited(pid));
    }

    let mut image = Image::new();
    let buf = image.add_buffer(Buffer::Heap(buffer));
    let mut off = 0u64;
    for r in runs {
        // Split the run around pages that could not be read.
        let mut i = 0;
        while i < r.pages {
            let page_addr = |k: usize| r.addr + (k * PAGE) as u64;
            if lost.binary_search(&page_addr(i)).is_ok() {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < r.pages && lost.binary_search(&page_addr(j)).is_err() {
                j += 1;
            }
            let region = Region {
                input: 0,
                addr: page_addr(i),
                first_page: 0,
                pages: 0,
                kind: r.kind,
                perms: r.perms,
                name: r.name.clone(),
            };
            image.push_region(
                region,
                buf,
                off + (i * PAGE) as u64,
                j - i,
                Some(&r.frames[i..j]),
            );
            i = j;
        }
        off += (r.pages * PAGE) as u64;
    }
    let pages = image.pages();
    image.inputs.push(InputInfo {
        name: format!("pid {pid} ({})", comm.trim()),
        source: "pid",
        pages,
        mappings: used_mappings,
        unpopulated_pages: unpopulated,
        vanished_pages: lost.len() as u64,
        partial_bytes: 0,
        read_seconds: start.elapsed().as_secs_f64(),
        snapshot: None,
    });
    Ok(image)
}

/// pread until `buf` is full, EOF or an error; returns bytes read.
fn read_full(f: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if done > 0 => {
                let _ = e;
                break;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Reads one piece with process_vm_readv (one copy, pages pinned in
/// batches: about twice as fast as /proc/PID/mem here), falling back to
/// /proc/PID/mem and then to page-by-page reads on a short read. Returns the
/// addresses of pages that could not be read, and whether access was denied.
fn read_piece(pid: u32, mem: &File, addr: u64, chunk: &mut [u8]) -> (Vec<u64>, bool) {
    let local = libc::iovec {
        iov_base: chunk.as_mut_ptr() as *mut libc::c_void,
        iov_len: chunk.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: chunk.len(),
    };
    // SAFETY: `local` describes `chunk`, which we own exclusively; the
    // remote side is only read by the kernel.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n == chunk.len() as isize {
        return (Vec::new(), false);
    }
    match read_full(mem, chunk, addr) {
        Ok(n) if n == chunk.len() => return (Vec::new(), false),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) => {
            return (
                (0..chunk.len() / PAGE)
                    .map(|i| addr + (i * PAGE) as u64)
                    .collect(),
                true,
            )
        }
        _ => {}
    }
    let mut lost = Vec::new();
    for (i, page) in chunk.chunks_mut(PAGE).enumerate() {
        let a = addr + (i * PAGE) as u64;
        match read_full(mem, page, a) {
            Ok(n) if n == PAGE => {}
            _ => lost.push(a),
        }
    }
    (lost, false)
}

/// Reads every PID, waits `interval`, reads them again; returns the second
/// snapshots with every page's [`Change`] against the first.
pub fn read_snapshots(
    pids: &[u32],
    filter: &Filter,
    interval: Duration,
    progress: &Progress,
) -> Result<Vec<Image>> {
    let mut first = Vec::new();
    for &pid in pids {
        first.push(read_pid(pid, filter, progress, None)?);
    }
    progress.note(&format!(
        "waiting {:.1} s for the second snapshot",
        interval.as_secs_f64()
    ));
    std::thread::sleep(interval);
    let mut out = Vec::new();
    for (&pid, before) in pids.iter().zip(first) {
        let mut after = read_pid(pid, filter, progress, None)?;
        let before_addrs: Vec<u64> = (0..before.pages()).map(|i| before.addr(i)).collect();
        let mut seen = vec![false; before.pages()];
        let changes: Vec<Change> = (0..after.pages())
            .into_par_iter()
            .map(|i| match before_addrs.binary_search(&after.addr(i)) {
                Ok(j) if before.page(j) == after.page(i) => Change::Unchanged,
                Ok(_) => Change::Changed,
                Err(_) => Change::New,
            })
            .collect();
        for i in 0..after.pages() {
            if let Ok(j) = before_addrs.binary_search(&after.addr(i)) {
                seen[j] = true;
            }
        }
        let mut gone_by: std::collections::BTreeMap<String, u64> = Default::default();
        let mut gone = 0;
        for (j, s) in seen.iter().enumerate() {
            if !s {
                gone += 1;
                *gone_by.entry(before.region(j).perms.label()).or_default() += 1;
            }
        }
        after.changes = Some(changes);
        after.inputs[0].snapshot = Some(SnapshotInfo {
            interval_seconds: interval.as_secs_f64(),
            gone_pages: gone,
            gone_by_perms: gone_by.into_iter().collect(),
        });
        out.push(after);
    }
    Ok(out)
}
