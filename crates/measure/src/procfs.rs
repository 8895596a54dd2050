//! Readers and parsers for the text files under /proc/PID: `stat` (state,
//! parent, start time, kernel-thread flag), `maps` (the address ranges to walk
//! in pagemap and the memfds they map), `smaps_rollup` (RSS, PSS, USS, swap),
//! `status` (VmHWM) and `ksm_stat`. Parsers take text and never panic: a line
//! they do not understand is skipped, a field they cannot find reads as zero,
//! because /proc formats grow new fields between kernel versions.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::error::Error;

/// PF_KTHREAD in the `flags` field of /proc/PID/stat.
const PF_KTHREAD: u64 = 0x0020_0000;

pub(crate) fn proc_path(pid: u32, name: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{name}"))
}

/// Reads /proc/PID/NAME of a process already seen alive.
pub(crate) fn read_text(pid: u32, name: &str) -> Result<String, Error> {
    let path = proc_path(pid, name);
    std::fs::read_to_string(&path).map_err(|e| Error::from_proc_io(pid, path, e))
}

/// The fields of /proc/PID/stat that measurement needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    pub state: char,
    pub ppid: u32,
    pub flags: u64,
    /// Clock ticks after boot; with the PID it identifies one process even
    /// if the PID is reused.
    pub start_time: u64,
}

impl ProcStat {
    /// Zombie (exited, not yet reaped) or dead: no memory left to measure.
    pub fn has_exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }

    pub fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }
}

/// Parses /proc/PID/stat. The command name is in parentheses and may itself
/// contain spaces and ')', so fields are counted after the last ')'.
pub(crate) fn parse_stat(text: &str) -> Option<ProcStat> {
    let after_comm = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        flags: fields.get(6)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Reads /proc/PID/stat: the first look at a process, so a missing entry
/// means there is no such process.
pub(crate) fn read_stat(pid: u32) -> Result<ProcStat, Error> {
    let path = proc_path(pid, "stat");
    let text = std::fs::read_to_string(&path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => Error::NoSuchProcess(pid),
        _ => Error::from_proc_io(pid, path.clone(), e),
    })?;
    parse_stat(&text).ok_or_else(|| Error::Io {
        path,
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "unparsable stat"),
    })
}

/// True while the process exists and has not exited (not a zombie).
pub(crate) fn is_alive(pid: u32) -> bool {
    read_stat(pid).map(|s| !s.has_exited()).unwrap_or(false)
}

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Device of the mapped file, as a dev_t (same encoding as st_dev).
    pub dev: u64,
    pub inode: u64,
    /// Path or pseudo-name ("[heap]", "/memfd:x (deleted)"); empty if anonymous.
    pub path: String,
}

impl Mapping {
    pub fn is_memfd(&self) -> bool {
        self.path.starts_with("/memfd:")
    }

    /// Kernel pages mapped into every process ([vsyscall] is not even readable
    /// in pagemap; [vvar] is a PFN map of kernel data), not process memory.
    pub fn is_kernel_special(&self) -> bool {
        matches!(
            self.path.as_str(),
            "[vsyscall]" | "[vvar]" | "[vvar_vclock]"
        )
    }
}

/// Parses /proc/PID/maps, skipping lines it cannot read.
pub(crate) fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_maps_line).collect()
}

/// `start-end perms offset major:minor inode   path`; the path may contain
/// spaces, so it is whatever follows the fifth field.
fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut rest = line;
    let mut fields = [""; 5];
    for field in fields.iter_mut() {
        rest = rest.trim_start();
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        *field = &rest[..end];
        rest = &rest[end..];
    }
    let (start, end) = fields[0].split_once('-')?;
    let (major, minor) = fields[3].split_once(':')?;
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        dev: libc::makedev(
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode: fields[4].parse().ok()?,
        path: rest.trim().to_string(),
    })
}

/// Totals of /proc/PID/smaps_rollup, in bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rollup {
    pub rss: u64,
    pub pss: u64,
    pub uss: u64,
    pub swap: u64,
}

impl Rollup {
    pub fn add(&mut self, other: &Rollup) {
        self.rss += other.rss;
        self.pss += other.pss;
        self.uss += other.uss;
        self.swap += other.swap;
    }
}

/// Value of a `Key:   123 kB` line, in bytes.
fn kb_field(line: &str, key: &str) -> Option<u64> {
    let value = line.strip_prefix(key)?.strip_prefix(':')?;
    let kib: u64 = value.split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

pub(crate) fn parse_smaps_rollup(text: &str) -> Rollup {
    let mut rollup = Rollup::default();
    for line in text.lines() {
        let field = |key| kb_field(line, key).unwrap_or(0);
        rollup.rss += field("Rss");
        rollup.pss += field("Pss");
        rollup.uss += field("Private_Clean") + field("Private_Dirty");
        rollup.swap += field("Swap");
    }
    rollup
}

/// VmHWM (peak RSS) from /proc/PID/status, in bytes; 0 when absent.
pub(crate) fn parse_vm_hwm(status: &str) -> u64 {
    status
        .lines()
        .find_map(|l| kb_field(l, "VmHWM"))
        .unwrap_or(0)
}

/// /proc/PID/ksm_stat: what the kernel's KSM merged for this process. Fields
/// this kernel does not report read as 0 / false; unknown ones go to `other`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct KsmStat {
    /// Pages of this process currently merged by KSM.
    pub merging_pages: u64,
    /// Bytes KSM saved for this process minus its rmap_item overhead (may be
    /// negative).
    pub process_profit: i64,
    pub rmap_items: u64,
    /// Pages merged onto the zero page (use_zero_pages).
    pub zero_pages: u64,
    /// prctl(PR_SET_MEMORY_MERGE) is on.
    pub merge_any: bool,
    /// Some of the process's memory is registered with KSM.
    pub mergeable: bool,
    /// Any further `key value` lines, verbatim.
    pub other: BTreeMap<String, String>,
}

impl KsmStat {
    /// Sums two processes' statistics (for a process tree).
    pub fn add(&mut self, other: &KsmStat) {
        self.merging_pages += other.merging_pages;
        self.process_profit += other.process_profit;
        self.rmap_items += other.rmap_items;
        self.zero_pages += other.zero_pages;
        self.merge_any |= other.merge_any;
        self.mergeable |= other.mergeable;
        for (key, value) in &other.other {
            self.other
                .entry(key.clone())
                .or_insert_with(|| value.clone());
        }
    }
}

pub(crate) fn parse_ksm_stat(text: &str) -> KsmStat {
    let mut ksm = KsmStat::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(|c: char| c == ':' || c.is_whitespace()) else {
            continue;
        };
        let value = value.trim_start_matches(':').trim();
        let number = || value.parse::<u64>().unwrap_or(0);
        match key {
            "ksm_merging_pages" => ksm.merging_pages = number(),
            "ksm_process_profit" => ksm.process_profit = value.parse().unwrap_or(0),
            "ksm_rmap_items" => ksm.rmap_items = number(),
            "ksm_zero_pages" => ksm.zero_pages = number(),
            "ksm_merge_any" => ksm.merge_any = value == "yes",
            "ksm_mergeable" => ksm.mergeable = value == "yes",
            _ => {
                ksm.other.insert(key.to_string(), value.to_string());
            }
        }
    }
    ksm
}

/// ksm_stat of a process; None when the kernel has no such file (no KSM) or
/// it cannot be read: it is extra information, never a reason to fail.
pub(crate) fn read_ksm_stat(pid: u32) -> Option<KsmStat> {
    std::fs::read_to_string(proc_path(pid, "ksm_stat"))
        .ok()
        .map(|text| parse_ksm_stat(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_parenthesis_in_name() {
        let text = "42 (a) b) c) S 7 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 0 0";
        let stat = parse_stat(text).unwrap();
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.ppid, 7);
        assert_eq!(stat.start_time, 12345);
        assert!(!stat.is_kernel_thread());
    }

    #[test]
    fn stat_garbage_is_none() {
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("1 (x) S"), None);
        assert_eq!(parse_stat("1 (x) S notanumber"), None);
    }

    #[test]
    fn maps_lines() {
        let text = "\
7f0000000000-7f0000002000 rw-s 00000000 00:01 1234                       /memfd:pagefold (deleted)
7f0000003000-7f0000004000 r--p 00000000 fd:01 99   /usr/lib/a file with spaces.so
7ffd1000-7ffd2000 rw-p 00000000 00:00 0
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
not a maps line
";
        let maps = parse_maps(text);
        assert_eq!(maps.len(), 4);
        assert_eq!(maps[0].start, 0x7f00_0000_0000);
        assert_eq!(maps[0].end, 0x7f00_0000_2000);
        assert!(maps[0].is_memfd());
        assert_eq!(maps[0].dev, libc::makedev(0, 1));
        assert_eq!(maps[0].inode, 1234);
        assert_eq!(maps[1].path, "/usr/lib/a file with spaces.so");
        assert_eq!(maps[1].dev, libc::makedev(0xfd, 1));
        assert_eq!(maps[2].path, "");
        assert!(maps[3].is_kernel_special());
    }

    #[test]
    fn smaps_rollup_totals() {
        let text = "\
55d5c0a00000-7ffd1e5f2000 ---p 00000000 00:00 0                          [rollup]
Rss:                1000 kB
Pss:                 600 kB
Pss_Anon:            100 kB
Shared_Clean:        500 kB
Private_Clean:        20 kB
Private_Dirty:        80 kB
Swap:                  4 kB
SwapPss:               4 kB
";
        let r = parse_smaps_rollup(text);
        assert_eq!(r.rss, 1000 * 1024);
        assert_eq!(r.pss, 600 * 1024);
        assert_eq!(r.uss, 100 * 1024);
        assert_eq!(r.swap, 4 * 1024);
    }

    #[test]
    fn vm_hwm() {
        assert_eq!(parse_vm_hwm("Name:\tx\nVmHWM:\t    2048 kB\n"), 2048 * 1024);
        assert_eq!(parse_vm_hwm("Name:\tkthread\n"), 0);
    }

    #[test]
    fn ksm_stat_fields() {
        let text = "ksm_rmap_items 10\nksm_zero_pages 2\nksm_merging_pages 5\n\
                    ksm_process_profit -123\nksm_merge_any: yes\nksm_mergeable: no\nksm_new 7\n";
        let k = parse_ksm_stat(text);
        assert_eq!(k.rmap_items, 10);
        assert_eq!(k.zero_pages, 2);
        assert_eq!(k.merging_pages, 5);
        assert_eq!(k.process_profit, -123);
        assert!(k.merge_any);
        assert!(!k.mergeable);
        assert_eq!(k.other.get("ksm_new").map(String::as_str), Some("7"));
    }
}
