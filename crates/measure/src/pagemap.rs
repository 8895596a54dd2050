//! Physical frame numbers of a process's resident pages, from
//! /proc/PID/pagemap: one 64-bit entry per virtual page (bit 63 present,
//! bit 62 swapped, bit 61 file page or shared anonymous, bits 0-54 the PFN,
//! which reads as zero without CAP_SYS_ADMIN).
//!
//! Only mapped ranges are read, in chunks of 64 Ki entries (512 KiB) per
//! pread. Sparse mappings (large reservations of which little is touched)
//! would still cost 8 bytes of reading per virtual page, so when the kernel
//! has the PAGEMAP_SCAN ioctl (Linux 6.7+) it first lists the present runs
//! and only those are read; without it every mapped page is read.
//!
//! The kernel's shared zero page is left out: every process maps it, it costs
//! nothing per process, and a range read but never written maps only it.
//! PAGEMAP_SCAN marks it (and the huge zero page) as PAGE_IS_PFNZERO; in the
//! plain path its PFN is learnt once by faulting it into this process.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use crate::error::Error;
use crate::procfs::{self, Mapping};

const PRESENT: u64 = 1 << 63;
/// Page-cache (file) page, or shared anonymous page.
const FILE_OR_SHARED: u64 = 1 << 61;
const PFN_MASK: u64 = (1 << 55) - 1;
const ENTRIES_PER_READ: usize = 64 * 1024;

/// PAGEMAP_SCAN categories (include/uapi/linux/fs.h).
const PAGE_IS_FILE: u64 = 1 << 2;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PAGE_IS_PFNZERO: u64 = 1 << 5;
/// _IOWR('f', 16, struct pm_scan_arg), the struct being 96 bytes.
const PAGEMAP_SCAN: u64 = (3 << 30) | (96 << 16) | ((b'f' as u64) << 8) | 16;
const REGIONS_PER_SCAN: usize = 4096;

pub fn page_size() -> u64 {
    static PAGE_SIZE: OnceLock<u64> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE_SIZE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    })
}

/// What this process can see in pagemap, learnt once from its own pages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe {
    /// PFNs are readable (CAP_SYS_ADMIN); otherwise they all read as zero.
    pub pfn_visible: bool,
    /// PFN of the kernel's shared zero page, when visible.
    pub zero_pfn: Option<u64>,
}

pub(crate) fn probe() -> Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    *PROBE.get_or_init(|| {
        let pfn_of = |entry: Option<u64>| entry.filter(|e| e & PRESENT != 0).map(|e| e & PFN_MASK);
        let written = pfn_of(own_page_entry(true)).unwrap_or(0);
        let zero = pfn_of(own_page_entry(false)).filter(|&pfn| pfn != 0);
        Probe {
            pfn_visible: written != 0,
            zero_pfn: zero,
        }
    })
}

/// Maps one fresh anonymous page, writes it (a page of its own) or reads it
/// (the zero page), and returns its pagemap entry.
fn own_page_entry(write: bool) -> Option<u64> {
    let size = page_size() as usize;
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a fresh private mapping, touched only inside its bounds and
    // unmapped before returning.
    unsafe {
        let page = libc::mmap(std::ptr::null_mut(), size, prot, flags, -1, 0);
        if page == libc::MAP_FAILED {
            return None;
        }
        let byte = page as *mut u8;
        if write {
            byte.write_volatile(1);
        } else {
            byte.read_volatile();
        }
        let entry = read_own_entry(page as u64 / size as u64);
        libc::munmap(page, size);
        entry
    }
}

fn read_own_entry(page_index: u64) -> Option<u64> {
    let file = File::open("/proc/self/pagemap").ok()?;
    let mut bytes = [0u8; 8];
    file.read_exact_at(&mut bytes, page_index * 8).ok()?;
    Some(u64::from_ne_bytes(bytes))
}

/// What a walk saw besides the PFNs it collected.
#[derive(Debug, Default)]
pub(crate) struct PfnCount {
    /// Present pages whose PFN read as 0: PFNs are hidden from this reader.
    pub hidden: u64,
}

/// One run of pages with the same PAGEMAP_SCAN categories (struct page_region).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct Region {
    start: u64,
    end: u64,
    categories: u64,
}

/// struct pm_scan_arg.
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// Appends to `pfns` the PFN of every present page of `mappings`, except
/// kernel special mappings, the zero page, and, in mappings for which
/// `skip_file_pages` says so, page-cache pages (bit 61); and, in the same
/// walk, to `anon` (when given) every present anonymous page (bit 61 clear)
/// with its address.
pub(crate) fn collect_pfns(
    pid: u32,
    mappings: &[Mapping],
    skip_file_pages: impl Fn(&Mapping) -> bool,
    pfns: &mut Vec<u64>,
    anon: Option<&mut Vec<AnonPage>>,
) -> Result<PfnCount, Error> {
    collect_pfns_via(pid, mappings, skip_file_pages, pfns, anon, true)
}

/// `collect_pfns`, with PAGEMAP_SCAN allowed or not (tests compare the two).
fn collect_pfns_via(
    pid: u32,
    mappings: &[Mapping],
    skip_file_pages: impl Fn(&Mapping) -> bool,
    pfns: &mut Vec<u64>,
    mut anon: Option<&mut Vec<AnonPage>>,
    use_scan: bool,
) -> Result<PfnCount, Error> {
    let path = procfs::proc_path(pid, "pagemap");
    let file = File::open(&path).map_err(|e| Error::from_proc_io(pid, path, e))?;
    let mapped: Vec<&Mapping> = mappings.iter().filter(|m| !m.is_kernel_special()).collect();
    let present = match (mapped.first(), mapped.last()) {
        (Some(first), Some(last)) if use_scan => scan_present(&file, first.start, last.end),
        _ => None,
    };
    let mut reader = EntryReader::new(pid, file);
    let mut count = PfnCount::default();
    let zero_pfn = probe().zero_pfn;
    for mapping in mapped {
        let filter = EntryFilter {
            skip_file_pages: skip_file_pages(mapping),
            zero_pfn,
        };
        for region in regions_of(present.as_deref(), mapping) {
            if filter.skips_region(&region) {
                continue;
            }
            reader.for_each_chunk(region.start, region.end, |addr, entries| {
                filter.collect(entries, addr, pfns, &mut count, anon.as_deref_mut())
            })?;
        }
    }
    Ok(count)
}

/// One present anonymous page (pagemap bit 61 clear: a private page of its
/// own, whatever the mapping) and the frame it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct AnonPage {
    pub pfn: u64,
    pub addr: u64,
}

/// The runs of `mapping` to read: its present runs when PAGEMAP_SCAN listed
/// them, else the whole mapping (categories unknown, so nothing is skipped).
fn regions_of(present: Option<&[Region]>, mapping: &Mapping) -> Vec<Region> {
    let Some(regions) = present else {
        return vec![Region {
            start: mapping.start,
            end: mapping.end,
            categories: 0,
        }];
    };
    let first = regions.partition_point(|r| r.end <= mapping.start);
    regions[first..]
        .iter()
        .take_while(|r| r.start < mapping.end)
        .map(|r| Region {
            start: r.start.max(mapping.start),
            end: r.end.min(mapping.end),
            categories: r.categories,
        })
        .collect()
}

struct EntryFilter {
    skip_file_pages: bool,
    zero_pfn: Option<u64>,
}

impl EntryFilter {
    fn skips_region(&self, region: &Region) -> bool {
        region.categories & PAGE_IS_PFNZERO != 0
            || (self.skip_file_pages && region.categories & PAGE_IS_FILE != 0)
    }

    /// The entries of the pages from `addr` on.
    fn collect(
        &self,
        entries: &[u64],
        addr: u64,
        pfns: &mut Vec<u64>,
        count: &mut PfnCount,
        mut anon: Option<&mut Vec<AnonPage>>,
    ) {
        let page = page_size();
        for (i, &entry) in entries.iter().enumerate() {
            if entry & PRESENT == 0 || (self.skip_file_pages && entry & FILE_OR_SHARED != 0) {
                continue;
            }
            match entry & PFN_MASK {
                0 => count.hidden += 1,
                pfn if Some(pfn) == self.zero_pfn => {}
                pfn => {
                    pfns.push(pfn);
                    if let Some(anon) = anon.as_deref_mut().filter(|_| entry & FILE_OR_SHARED == 0)
                    {
                        let addr = addr + i as u64 * page;
                        anon.push(AnonPage { pfn, addr });
                    }
                }
            }
        }
    }
}

/// Lists the present runs in [start, end) with PAGEMAP_SCAN. None when the
/// kernel lacks the ioctl or it fails: the caller then reads everything,
/// which also reports a vanished process properly.
fn scan_present(file: &File, start: u64, end: u64) -> Option<Vec<Region>> {
    let mut found = Vec::new();
    let mut buffer = vec![Region::default(); REGIONS_PER_SCAN];
    let mut from = start;
    while from < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start: from,
            end,
            vec: buffer.as_mut_ptr() as u64,
            vec_len: buffer.len() as u64,
            category_mask: PAGE_IS_PRESENT,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_FILE | PAGE_IS_PFNZERO,
            ..Default::default()
        };
        // SAFETY: `arg` is a valid pm_scan_arg and `vec` points to vec_len
        // writable page_region structs that outlive the call.
        let filled = unsafe { libc::ioctl(file.as_raw_fd(), PAGEMAP_SCAN as _, &mut arg) };
        if filled < 0 || filled as usize > buffer.len() || arg.walk_end <= from {
            return None;
        }
        found.extend_from_slice(&buffer[..filled as usize]);
        from = arg.walk_end;
    }
    Some(found)
}

/// Reads pagemap entries in large chunks through one reusable buffer.
struct EntryReader {
    pid: u32,
    file: File,
    buffer: Vec<u64>,
}

impl EntryReader {
    fn new(pid: u32, file: File) -> Self {
        EntryReader {
            pid,
            file,
            buffer: vec![0; ENTRIES_PER_READ],
        }
    }

    /// Calls `each` with the entries of [start, end), chunk by chunk, and
    /// the address of each chunk's first page.
    fn for_each_chunk(
        &mut self,
        start: u64,
        end: u64,
        mut each: impl FnMut(u64, &[u64]),
    ) -> Result<(), Error> {
        let page = page_size();
        let (mut index, last) = (start / page, end / page);
        while index < last {
            let wanted = (last - index).min(ENTRIES_PER_READ as u64) as usize;
            let got = self.read_entries(index, wanted)?;
            if got == 0 {
                return self.short_read();
            }
            each(index * page, &self.buffer[..got]);
            index += got as u64;
        }
        Ok(())
    }

    fn read_entries(&mut self, index: u64, count: usize) -> Result<usize, Error> {
        // SAFETY: u64 has no invalid bit patterns; the byte view covers
        // exactly the first `count` (<= len) entries of the buffer.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(self.buffer.as_mut_ptr() as *mut u8, count * 8)
        };
        match self.file.read_at(bytes, index * 8) {
            Ok(n) => Ok(n / 8),
            Err(e) => Err(Error::from_proc_io(
                self.pid,
                procfs::proc_path(self.pid, "pagemap"),
                e,
            )),
        }
    }

    /// pagemap reads nothing once the address space is gone: the process
    /// exited. A live process with a short read (an address past the user
    /// address space) simply has nothing more there.
    fn short_read(&self) -> Result<(), Error> {
        if procfs::is_alive(self.pid) {
            Ok(())
        } else {
            Err(Error::ProcessExited(self.pid))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64) -> Mapping {
        Mapping {
            start,
            end,
            dev: 0,
            inode: 0,
            path: String::new(),
        }
    }

    #[test]
    fn ioctl_number_matches_kernel() {
        assert_eq!(PAGEMAP_SCAN, 0xc060_6610);
        assert_eq!(std::mem::size_of::<PmScanArg>(), 96);
        assert_eq!(std::mem::size_of::<Region>(), 24);
    }

    #[test]
    fn regions_are_clipped_to_the_mapping() {
        let present = [
            Region {
                start: 0x1000,
                end: 0x3000,
                categories: 1,
            },
            Region {
                start: 0x5000,
                end: 0x9000,
                categories: 2,
            },
            Region {
                start: 0xa000,
                end: 0xb000,
                categories: 3,
            },
        ];
        let got = regions_of(Some(&present), &mapping(0x2000, 0x6000));
        let spans: Vec<_> = got.iter().map(|r| (r.start, r.end, r.categories)).collect();
        assert_eq!(spans, vec![(0x2000, 0x3000, 1), (0x5000, 0x6000, 2)]);
        assert!(regions_of(Some(&present), &mapping(0x3000, 0x5000)).is_empty());
        assert_eq!(regions_of(None, &mapping(0x3000, 0x5000)).len(), 1);
    }

    #[test]
    fn filter_skips_absent_zero_and_file_pages() {
        let filter = EntryFilter {
            skip_file_pages: true,
            zero_pfn: Some(7),
        };
        let entries = [
            0,
            PRESENT | 5,
            PRESENT | 7,
            PRESENT | FILE_OR_SHARED | 9,
            PRESENT,
            1 << 62,
        ];
        let (mut pfns, mut count, mut anon) = (Vec::new(), PfnCount::default(), Vec::new());
        filter.collect(&entries, 1 << 20, &mut pfns, &mut count, Some(&mut anon));
        assert_eq!(pfns, vec![5]);
        assert_eq!(count.hidden, 1);
        let at = (1 << 20) + page_size();
        assert_eq!(anon, vec![AnonPage { pfn: 5, addr: at }]);
        // A file page kept for the footprint is no anonymous page.
        let filter = EntryFilter {
            skip_file_pages: false,
            zero_pfn: None,
        };
        let (mut pfns, mut anon) = (Vec::new(), Vec::new());
        filter.collect(&entries[3..4], 0, &mut pfns, &mut count, Some(&mut anon));
        assert_eq!((pfns, anon), (vec![9], vec![]));
    }

    /// Maps `total` anonymous pages, writes the first `written`, reads the
    /// next `read` (zero page), and collects PFNs of that mapping only.
    fn pfns_of_fresh_mapping(
        total: usize,
        written: usize,
        read: usize,
        use_scan: bool,
    ) -> Vec<u64> {
        let size = page_size() as usize;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: fresh private mapping, touched within bounds, unmapped below.
        let base = unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                total * size,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            libc::madvise(base, total * size, libc::MADV_NOHUGEPAGE);
            let bytes = base as *mut u8;
            for page in 0..written {
                bytes.add(page * size).write_volatile(page as u8 + 1);
            }
            for page in written..written + read {
                bytes.add(page * size).read_volatile();
            }
            base as u64
        };
        let target = mapping(base, base + (total * size) as u64);
        let (mut pfns, mut anon) = (Vec::new(), Vec::new());
        let pid = std::process::id();
        collect_pfns_via(
            pid,
            std::slice::from_ref(&target),
            |_| false,
            &mut pfns,
            Some(&mut anon),
            use_scan,
        )
        .unwrap();
        // Every page is anonymous here: the same pages, at their addresses.
        assert_eq!(anon.iter().map(|a| a.pfn).collect::<Vec<_>>(), pfns);
        let at = |k: usize| base + (k * size) as u64;
        assert!(anon.iter().enumerate().all(|(k, a)| a.addr == at(k)));
        // SAFETY: unmapping exactly what was mapped above.
        unsafe { libc::munmap(base as *mut libc::c_void, total * size) };
        pfns
    }

    #[test]
    fn scan_and_plain_reads_agree() {
        if !probe().pfn_visible {
            return; // PFNs need root; the integration tests cover the proxy.
        }
        for use_scan in [true, false] {
            let mut pfns = pfns_of_fresh_mapping(64, 10, 5, use_scan);
            assert_eq!(pfns.len(), 10, "use_scan={use_scan}");
            pfns.sort_unstable();
            pfns.dedup();
            assert_eq!(pfns.len(), 10, "written pages have their own frames");
        }
    }

    /// Linux 6.7 brought PAGEMAP_SCAN: on such kernels the fast path must
    /// really be taken, not silently fall back.
    #[test]
    fn scan_is_used_on_kernels_that_have_it() {
        use crate::procfs;
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut numbers = release
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u32>().ok());
        let version = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        let file = File::open("/proc/self/pagemap").unwrap();
        let stack_probe = 0u64;
        let page = (&stack_probe as *const u64 as u64) & !(page_size() - 1);
        let regions = scan_present(&file, page, page + page_size());
        if version >= (6, 7) {
            let regions = regions.expect("PAGEMAP_SCAN failed on a kernel that has it");
            assert_eq!(regions.len(), 1, "the stack page in use is present");
            // Also across a whole address space, special mappings included.
            let maps = procfs::parse_maps(&std::fs::read_to_string("/proc/self/maps").unwrap());
            let user: Vec<_> = maps.iter().filter(|m| !m.is_kernel_special()).collect();
            let whole = scan_present(&file, user[0].start, user[user.len() - 1].end);
            assert!(whole.is_some_and(|r| !r.is_empty()));
        }
    }

    #[test]
    fn own_written_page_is_visible_as_root() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let probe = probe();
            assert!(probe.pfn_visible);
            assert!(probe.zero_pfn.is_some());
        }
    }
}
