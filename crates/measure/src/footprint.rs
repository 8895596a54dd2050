//! The footprint of a set of processes: how much physical memory they really
//! hold, counting every physical page once however many mappings or
//! processes share it (RSS counts a shared page once per process, PSS splits
//! it; neither shows memory in an unmapped memfd page).
//!
//! With readable PFNs (root), method "pfn":
//!
//!   footprint_bytes = distinct_pages * page size + memfd_bytes
//!
//! - distinct_pages: distinct PFNs of the present pages of all mappings of all
//!   the processes, except the kernel's shared zero page, kernel special
//!   mappings ([vsyscall], [vvar]), and page-cache pages (pagemap bit 61) of
//!   accounted memfd mappings; in a MAP_PRIVATE memfd mapping the pages with
//!   bit 61 clear are the process's private copy-on-write copies, and those do
//!   count here.
//! - memfd_bytes: the sum over distinct memfd inodes (st_dev, st_ino) of
//!   st_blocks * 512, which counts each memfd page once whether it is mapped
//!   zero, one or many times (see `memfd`).
//!
//! Page tables and other kernel memory spent on the process are not counted
//! (nothing in /proc gives them per page), nor is swap (reported apart).
//!
//! Without readable PFNs (not root), method "pss-proxy": footprint_bytes is
//! the sum of PSS, the best proxy /proc offers; distinct_pages is None, and
//! memfd_bytes is shown for information but not added, since PSS already
//! includes the mapped part of memfds.

use std::fmt;

use serde::Serialize;

use crate::error::Error;
use crate::limit::{self, ProcessPages, SharingLimit};
use crate::memfd::{self, InodeKey};
use crate::pagemap;
use crate::procfs::{self, KsmStat, Rollup};
use crate::tree;

/// How `footprint_bytes` was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// Distinct physical pages from pagemap plus memfd blocks: exact.
    Pfn,
    /// Sum of PSS: a proxy, used when PFNs are hidden (not root).
    PssProxy,
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Pfn => "pfn",
            Method::PssProxy => "pss-proxy",
        })
    }
}

/// One measurement of one process or process tree. Byte counts are summed
/// over the processes, except footprint, distinct pages and memfd bytes,
/// which count every physical page once.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Footprint {
    /// The processes measured (root first for a tree).
    pub pids: Vec<u32>,
    /// The true physical footprint (see the module documentation).
    pub footprint_bytes: u64,
    /// Distinct physical pages outside memfd page caches; None for the proxy.
    pub distinct_pages: Option<u64>,
    /// Bytes allocated to the memfds the processes map or hold open.
    pub memfd_bytes: u64,
    pub method: Method,
    pub rss_bytes: u64,
    pub pss_bytes: u64,
    /// Private_Clean + Private_Dirty.
    pub uss_bytes: u64,
    pub swap_bytes: u64,
    /// VmHWM (peak RSS) summed over the processes.
    pub vm_hwm_bytes: u64,
    /// Kernel KSM statistics, summed; None when no process has a ksm_stat.
    pub ksm: Option<KsmStat>,
    /// Milliseconds since the start of the series (0 for a single measurement).
    pub timestamp_ms: u64,
    /// What the footprint would be if sharing folded all it could (limit.rs);
    /// read only when asked for, and only with PFNs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sharing_limit: Option<SharingLimit>,
}

/// Footprint of one process.
pub fn measure_pid(pid: u32) -> Result<Footprint, Error> {
    measure_pids(&[pid])
}

/// Footprint of several processes together; fails if any of them fails.
pub fn measure_pids(pids: &[u32]) -> Result<Footprint, Error> {
    measure_set(pids, |_| true, false)
}

/// Footprint of `root` and all its descendants together. A descendant that
/// exits while being measured is left out; the root exiting is an error.
pub fn measure_tree(root: u32) -> Result<Footprint, Error> {
    measure_set(&tree::process_tree(root)?, |pid| pid == root, false)
}

/// `measure_tree` if `tree`, else `measure_pid`; with `with_limit`, also
/// the sharing limit (limit.rs) when PFNs are readable, which reads every
/// anonymous page: far slower than the footprint alone.
pub fn measure(pid: u32, tree: bool, with_limit: bool) -> Result<Footprint, Error> {
    match tree {
        true => measure_set(&tree::process_tree(pid)?, |p| p == pid, with_limit),
        false => measure_set(&[pid], |_| true, with_limit),
    }
}

/// Footprint of the calling process (includes the few pages the measurement
/// itself allocates).
pub fn measure_self() -> Result<Footprint, Error> {
    measure_pid(std::process::id())
}

/// Everything read from one process; its PFNs go straight into the shared
/// list so that large processes are not copied twice.
#[derive(Default)]
struct ProcessScan {
    pfns_hidden: bool,
    memfds: Vec<(InodeKey, u64)>,
    rollup: Rollup,
    vm_hwm: u64,
    ksm: Option<KsmStat>,
    /// The anonymous pages, when the sharing limit is read.
    anon: Option<ProcessPages>,
}

/// Measures `pids`, with their sharing limit if `with_limit`; a process for
/// which `required` is false may vanish.
fn measure_set(
    pids: &[u32],
    required: impl Fn(u32) -> bool,
    with_limit: bool,
) -> Result<Footprint, Error> {
    let want_pfns = pagemap::probe().pfn_visible;
    let mut pfns = Vec::new();
    let mut scans = Vec::new();
    let mut measured = Vec::new();
    for &pid in pids {
        let kept = pfns.len();
        match scan_process(pid, want_pfns, with_limit && want_pfns, &mut pfns) {
            Ok(scan) => {
                scans.push(scan);
                measured.push(pid);
            }
            Err(e) if e.is_gone() && !required(pid) => pfns.truncate(kept),
            Err(e) => return Err(e),
        }
    }
    let pfn_method = want_pfns && !scans.iter().any(|s| s.pfns_hidden);
    let anon: Vec<ProcessPages> = scans.iter_mut().filter_map(|s| s.anon.take()).collect();
    let mut fp = combine(measured, scans, pfn_method.then_some(pfns));
    if with_limit && pfn_method {
        fp.sharing_limit = Some(limit::read(anon, fp.footprint_bytes));
    }
    Ok(fp)
}

fn scan_process(
    pid: u32,
    want_pfns: bool,
    with_limit: bool,
    pfns: &mut Vec<u64>,
) -> Result<ProcessScan, Error> {
    let stat = procfs::read_stat(pid)?;
    if stat.has_exited() {
        return Err(Error::ProcessExited(pid));
    }
    if stat.is_kernel_thread() {
        return Ok(ProcessScan::default()); // no user memory at all
    }
    let mappings = procfs::parse_maps(&procfs::read_text(pid, "maps")?);
    let memfds = memfd::find_memfds(pid, &mappings)?;
    let mut pfns_hidden = !want_pfns;
    let mut anon = with_limit.then(Vec::new);
    if want_pfns {
        let accounts = |m: &procfs::Mapping| memfds.accounts(m);
        let count = pagemap::collect_pfns(pid, &mappings, accounts, pfns, anon.as_mut())?;
        pfns_hidden = count.hidden > 0;
    }
    let anon = anon.map(|pages| ProcessPages { pid, pages });
    Ok(ProcessScan {
        pfns_hidden,
        memfds: memfds.bytes_by_inode.into_iter().collect(),
        rollup: procfs::parse_smaps_rollup(&procfs::read_text(pid, "smaps_rollup")?),
        vm_hwm: procfs::parse_vm_hwm(&procfs::read_text(pid, "status")?),
        ksm: procfs::read_ksm_stat(pid),
        anon,
    })
}

/// Adds up the processes; `pfns` is Some for the pfn method.
fn combine(pids: Vec<u32>, scans: Vec<ProcessScan>, pfns: Option<Vec<u64>>) -> Footprint {
    let mut rollup = Rollup::default();
    let mut ksm: Option<KsmStat> = None;
    let mut memfd_inodes = std::collections::HashMap::new();
    let mut vm_hwm_bytes = 0;
    for scan in &scans {
        rollup.add(&scan.rollup);
        vm_hwm_bytes += scan.vm_hwm;
        if let Some(stat) = &scan.ksm {
            ksm.get_or_insert_with(KsmStat::default).add(stat);
        }
        memfd_inodes.extend(scan.memfds.iter().copied());
    }
    let memfd_bytes: u64 = memfd_inodes.values().sum();
    let distinct_pages = pfns.map(count_distinct);
    let footprint_bytes = match distinct_pages {
        Some(pages) => pages * pagemap::page_size() + memfd_bytes,
        None => rollup.pss,
    };
    Footprint {
        pids,
        footprint_bytes,
        distinct_pages,
        memfd_bytes,
        method: if distinct_pages.is_some() {
            Method::Pfn
        } else {
            Method::PssProxy
        },
        rss_bytes: rollup.rss,
        pss_bytes: rollup.pss,
        uss_bytes: rollup.uss,
        swap_bytes: rollup.swap,
        vm_hwm_bytes,
        ksm,
        timestamp_ms: 0,
        sharing_limit: None,
    }
}

fn count_distinct(mut pfns: Vec<u64>) -> u64 {
    pfns.sort_unstable();
    pfns.dedup();
    pfns.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_counts_shared_frames_once() {
        assert_eq!(count_distinct(vec![5, 1, 5, 3, 1]), 3);
        assert_eq!(count_distinct(vec![]), 0);
    }

    #[test]
    fn proxy_uses_pss_and_does_not_add_memfd() {
        let scan = ProcessScan {
            pfns_hidden: true,
            memfds: vec![((1, 2), 8192)],
            rollup: Rollup {
                rss: 10,
                pss: 7,
                uss: 5,
                swap: 0,
            },
            vm_hwm: 12,
            ksm: None,
            anon: None,
        };
        let fp = combine(vec![9], vec![scan], None);
        assert_eq!(fp.method, Method::PssProxy);
        assert_eq!(fp.footprint_bytes, 7);
        assert_eq!(fp.memfd_bytes, 8192);
        assert_eq!(fp.distinct_pages, None);
    }

    #[test]
    fn memfd_inodes_shared_by_processes_count_once() {
        let scan = || ProcessScan {
            memfds: vec![((1, 2), 8192)],
            ..Default::default()
        };
        let fp = combine(vec![1, 2], vec![scan(), scan()], Some(vec![4, 4, 6]));
        assert_eq!(fp.method, Method::Pfn);
        assert_eq!(fp.distinct_pages, Some(2));
        assert_eq!(fp.memfd_bytes, 8192);
        assert_eq!(fp.footprint_bytes, 2 * pagemap::page_size() + 8192);
    }

    #[test]
    fn method_serializes_as_documented() {
        assert_eq!(
            serde_json::to_string(&Method::PssProxy).unwrap(),
            "\"pss-proxy\""
        );
        assert_eq!(serde_json::to_string(&Method::Pfn).unwrap(), "\"pfn\"");
    }

    #[test]
    fn self_measurement_is_plausible() {
        let fp = measure_self().unwrap();
        assert_eq!(fp.pids, vec![std::process::id()]);
        assert!(fp.rss_bytes > 0 && fp.footprint_bytes > 0);
        if fp.method == Method::Pfn {
            // Distinct pages never exceed what RSS counts, plus a little
            // slack: the two are read at slightly different moments.
            let pages = fp.distinct_pages.unwrap() * pagemap::page_size();
            assert!(
                pages <= fp.rss_bytes + (1 << 20),
                "{pages} vs rss {}",
                fp.rss_bytes
            );
        }
    }
}
