//! The sharing limit: the footprint a process (tree) would have if every
//! page that sharing can fold were folded. It is the yardstick for what
//! pagefold, or kernel KSM, captures on a program: a program whose limit is
//! 0.95 of its footprint has almost nothing to share, and an engine that
//! costs it anything there does harm.
//!
//! Which pages sharing can fold: anonymous pages, the process's private
//! pages (pagemap bit 61 clear: heap, stacks, anonymous mappings and the
//! copy-on-write copies in private file mappings). Every anonymous page whose
//! content is all zeros could be the kernel's zero page, and all anonymous
//! pages of one content could share one frame. Frames of files and shared
//! memory (page cache, shmem, memfds) stay as they are: they are shared by
//! the kernel already, and merging their content is not ours to do. So
//!
//!   limit_bytes = footprint_bytes - (anon_frames - distinct_contents) * page size
//!
//! where anon_frames counts the distinct frames of anonymous pages (pages
//! shared after fork count once, as in the footprint) and distinct_contents
//! the distinct non-zero contents among them.
//!
//! Contents are read through /proc/PID/mem, a frame once, in runs of
//! adjacent pages, and told apart by their 128-bit xxh3 hash: two different
//! pages would have to collide in 128 bits to be counted as one, which at
//! millions of pages is far below one chance in 10^20. A page that can no
//! longer be read (unmapped between the pagemap read and the content read)
//! counts as a content of its own. Reading costs about as much as copying
//! the process's anonymous memory once; a sampler that reads the limit
//! slows the program it measures, so runs that read it are not timed.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_128;

use crate::pagemap::{self, AnonPage};
use crate::procfs;

/// Most adjacent pages read from /proc/PID/mem at once (256 KiB).
const PAGES_PER_READ: usize = 64;

/// One reading of the sharing limit of a process (tree).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SharingLimit {
    /// Distinct frames of anonymous pages: what sharing could fold.
    pub anon_frames: u64,
    /// Of those, the frames whose content is all zeros.
    pub zero_frames: u64,
    /// Distinct contents among the other anonymous frames.
    pub distinct_contents: u64,
    /// The footprint with every zero frame folded and every content on one
    /// frame (see the module documentation).
    pub limit_bytes: u64,
}

/// The present anonymous pages of one process (the footprint's pagemap
/// walk collects them with the frames, pagemap.rs `collect_pfns`).
pub(crate) struct ProcessPages {
    pub pid: u32,
    pub pages: Vec<AnonPage>,
}

/// The limit of the processes whose anonymous pages are `processes`, given
/// their footprint.
pub(crate) fn read(processes: Vec<ProcessPages>, footprint_bytes: u64) -> SharingLimit {
    let page = pagemap::page_size();
    let mut seen_frames = HashSet::new();
    let mut contents = Contents::default();
    for mut p in processes {
        // A frame once, however many processes or addresses map it.
        p.pages.retain(|pg| seen_frames.insert(pg.pfn));
        p.pages.sort_unstable_by_key(|pg| pg.addr);
        let Ok(mem) = File::open(procfs::proc_path(p.pid, "mem")) else {
            contents.unreadable += p.pages.len() as u64;
            continue;
        };
        for run in adjacent_runs(&p.pages, page) {
            contents.read_run(&mem, run, page as usize);
        }
    }
    let anon_frames = seen_frames.len() as u64;
    let kept = contents.distinct.len() as u64 + contents.unreadable;
    SharingLimit {
        anon_frames,
        zero_frames: contents.zero,
        distinct_contents: kept,
        limit_bytes: footprint_bytes.saturating_sub(anon_frames.saturating_sub(kept) * page),
    }
}

/// The contents seen so far.
#[derive(Default)]
struct Contents {
    distinct: HashSet<u128>,
    zero: u64,
    /// Pages that could not be read: each counts as a content of its own.
    unreadable: u64,
    buffer: Vec<u8>,
}

impl Contents {
    /// Reads the pages of `run` (adjacent, at most `PAGES_PER_READ`).
    fn read_run(&mut self, mem: &File, run: &[AnonPage], page: usize) {
        self.buffer.resize(run.len() * page, 0);
        if mem.read_exact_at(&mut self.buffer, run[0].addr).is_ok() {
            let buffer = std::mem::take(&mut self.buffer);
            buffer.chunks_exact(page).for_each(|p| self.add(p));
            self.buffer = buffer;
            return;
        }
        // Part of the run went away meanwhile: page by page.
        for pg in run {
            let mut one = vec![0u8; page];
            match mem.read_exact_at(&mut one, pg.addr) {
                Ok(()) => self.add(&one),
                Err(_) => self.unreadable += 1,
            }
        }
    }

    fn add(&mut self, content: &[u8]) {
        if content.iter().all(|&b| b == 0) {
            self.zero += 1;
        } else {
            self.distinct.insert(xxh3_128(content));
        }
    }
}

/// `pages` (sorted by address) cut into runs of adjacent pages of at most
/// `PAGES_PER_READ`.
fn adjacent_runs(pages: &[AnonPage], page: u64) -> impl Iterator<Item = &[AnonPage]> {
    let mut rest = pages;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut n = 1;
        while n < rest.len().min(PAGES_PER_READ) && rest[n].addr == rest[n - 1].addr + page {
            n += 1;
        }
        let (run, tail) = rest.split_at(n);
        rest = tail;
        Some(run)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(addrs: &[u64]) -> Vec<AnonPage> {
        addrs
            .iter()
            .map(|&a| AnonPage {
                pfn: a,
                addr: a * 4096,
            })
            .collect()
    }

    #[test]
    fn runs_break_at_gaps_and_at_the_read_size() {
        let mut addrs: Vec<u64> = (10..13).collect();
        addrs.extend(20..20 + PAGES_PER_READ as u64 + 1);
        let pages = at(&addrs);
        let lens: Vec<usize> = adjacent_runs(&pages, 4096).map(|r| r.len()).collect();
        assert_eq!(lens, vec![3, PAGES_PER_READ, 1]);
        assert_eq!(adjacent_runs(&[], 4096).count(), 0);
    }

    #[test]
    fn zero_pages_fold_and_equal_contents_count_once() {
        let mut c = Contents::default();
        let page = |b: u8| vec![b; 4096];
        for b in [0, 0, 7, 7, 7, 9] {
            c.add(&page(b));
        }
        assert_eq!((c.zero, c.distinct.len()), (2, 2));
    }

    #[test]
    fn the_limit_takes_what_sharing_folds_off_the_footprint() {
        // This process's own pages: a run of 32 written with one content
        // comes to one frame in the limit.
        let len = 32 * 4096;
        let mut buf = vec![0x5au8; len + 4096];
        let start = (buf.as_ptr() as usize).next_multiple_of(4096);
        let off = start - buf.as_ptr() as usize;
        buf[off..off + len].fill(0xa5);
        let base = start as u64;
        let pages: Vec<AnonPage> = (0..32)
            .map(|i| AnonPage {
                pfn: 1000 + i,
                addr: base + i * 4096,
            })
            .collect();
        let own = ProcessPages {
            pid: std::process::id(),
            pages,
        };
        let limit = read(vec![own], 100 * 4096);
        assert_eq!(limit.anon_frames, 32);
        assert_eq!(limit.distinct_contents, 1);
        assert_eq!(limit.zero_frames, 0);
        assert_eq!(limit.limit_bytes, (100 - 31) * 4096);
        drop(buf);
    }
}
