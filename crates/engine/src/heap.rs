//! The caller's heap: the pages of the program break's area that read zero
//! without being written, so that copies and clears into them can leave
//! those pages out (sparse copies and sparse zeroing beyond the engine's
//! blocks).
//!
//! Sizes the engine leaves to the caller's allocator (placement.rs) live in
//! glibc's heap, which grows by moving the program break: the pages between
//! the old break and the new one are private anonymous memory nobody has
//! touched yet, and each reads zero until it is written. A program that
//! copies a mostly-zero array into such a chunk (numpy's `.copy()` of a
//! field that is zero far from its sources) or clears it (R's `numeric(n)`)
//! writes 4 KiB of zeros into every one of them, faulting each in. Leaving
//! out those pages keeps them on the kernel's zero page, as a scan folding
//! them would, without a scan and without the fault.
//!
//! Leaving a page out pays while the program does not write it: a page it
//! writes soon after costs the same fault later, and one it reads first
//! costs two (the zero page mapped, then a copy-on-write fault) where the
//! copy's write cost one. R's rda copies zero-filled matrices and fills
//! them at once: 62,000 pages left out per run, nine in ten written within
//! half a second, 12% more faults than writing them and no memory saved.
//! So the heap keeps the runs it left out, and once the oldest is
//! `JUDGE_AFTER` old it reads them back from pagemap and counts the pages
//! now the program's own (present and exclusive). While three in four of
//! the pages judged (over the program's recent past) were written, leaving
//! pages out of the heap stops; every `PROBE_EVERY`-th copy or clear that
//! could leave pages out still does, and its runs are judged the same way,
//! so a program whose use changes gets it back. numpy's snapshots of
//! mostly-zero fields see about a quarter of theirs written (huge pages
//! that a write next to them faults in whole): that still pays.
//!
//! Which memory this may touch is the whole question. The break's area,
//! `[start_brk, brk)`, is the one range of a process the kernel keeps
//! private and anonymous (it cannot grow over another mapping, and a
//! mapping placed inside it would end glibc's use of it), so there a page
//! that pagemap shows neither present nor swapped reads zero. Elsewhere the
//! engine cannot tell that cheaply (a private file mapping's untouched page
//! reads the file), so arenas and chunks glibc maps on their own are left
//! alone. One case breaks the rule and is not supported: a process whose
//! heap is registered with userfaultfd in missing mode by someone else (a
//! lazily restored CRIU checkpoint), where an untouched page reads what its
//! handler supplies.

use std::time::{Duration, Instant};

use crate::sys::{self, PAGE};

/// How long after leaving pages out the heap looks whether the program
/// wrote them.
pub const JUDGE_AFTER: Duration = Duration::from_millis(500);
/// Most runs of pages left out that wait for their judgment.
const RUNS_KEPT: usize = 64;
/// While leaving pages out does not pay, one chance in this many still does.
pub const PROBE_EVERY: u32 = 16;
/// The judged and written counts are halved when the judged reach this, so
/// the verdict follows what the program does now.
const DECAY_PAGES: u64 = 1 << 16;

/// The program break's area, and whether leaving its pages out pays.
#[derive(Debug, Default)]
pub(crate) struct Heap {
    start: Option<usize>,
    /// Runs of pages left out since the last judgment, (address, pages),
    /// and when the first of them was.
    left: Vec<(usize, usize)>,
    since: Option<Instant>,
    /// Pages judged, and of those found written (halved at `DECAY_PAGES`).
    judged: u64,
    written: u64,
    /// Three in four of the pages judged were found written.
    wasted: bool,
    /// Chances passed up since the last probe, while `wasted`.
    passed: u32,
}

impl Heap {
    /// Reads `start_brk` from /proc/self/stat (None where it cannot be read:
    /// the engine then leaves the heap alone).
    pub fn new() -> Heap {
        Heap {
            start: std::fs::read_to_string("/proc/self/stat")
                .ok()
                .and_then(|s| start_brk(&s)),
            ..Heap::default()
        }
    }

    /// Which whole pages of `[dst, dst + len)` read zero without being
    /// written, if the range lies in the program break's area and leaving
    /// pages out pays (or this is a probe): the first whole page's address
    /// and a flag per whole page; None when not, or no page reads zero.
    pub fn untouched(
        &mut self,
        pagemap: Option<&sys::Pagemap>,
        stats: &mut crate::stats::Stats,
        dst: usize,
        len: usize,
    ) -> Option<(usize, Vec<bool>)> {
        let start = self.start?;
        let end = sys::program_break();
        let (first, last) = (dst.next_multiple_of(PAGE), (dst + len) / PAGE * PAGE);
        if dst < start || dst + len > end || last <= first {
            return None;
        }
        let pagemap = pagemap?;
        let (judged, written) = self.judge_if_due(pagemap);
        stats.heap_pages_judged += judged;
        stats.heap_pages_found_written += written;
        if self.wasted {
            self.passed += 1;
            if self.passed < PROBE_EVERY {
                return None;
            }
            self.passed = 0;
        }
        let mut entries = vec![0u64; (last - first) / PAGE];
        pagemap.read(first as *const u8, &mut entries).ok()?;
        let untouched: Vec<bool> = entries.iter().map(|&e| sys::never_touched(e)).collect();
        untouched.contains(&true).then_some((first, untouched))
    }

    /// The pages from `first` that `left` marks were left out (counted in
    /// `stats`; their runs wait for judgment).
    pub fn left_out(&mut self, stats: &mut crate::stats::Stats, first: usize, left: &[bool]) {
        stats.heap_pages_left_zero += left.iter().filter(|&&l| l).count() as u64;
        let mut k = 0;
        while k < left.len() {
            if !left[k] {
                k += 1;
                continue;
            }
            let n = left[k..].iter().take_while(|&&l| l).count();
            if self.left.len() < RUNS_KEPT {
                self.left.push((first + k * PAGE, n));
                self.since.get_or_insert_with(Instant::now);
            }
            k += n;
        }
    }

    /// Once the first run left out is `JUDGE_AFTER` old: how many of its
    /// pages the program has written since, and whether three in four of
    /// all pages judged lately were. Returns the pages judged and those
    /// found written.
    fn judge_if_due(&mut self, pagemap: &sys::Pagemap) -> (u64, u64) {
        if self.since.is_none_or(|t| t.elapsed() < JUDGE_AFTER) {
            return (0, 0);
        }
        let (mut pages, mut written) = (0, 0);
        for &(addr, n) in &self.left {
            let mut entries = vec![0u64; n];
            // A run the program has given back since reads as not written.
            if pagemap.read(addr as *const u8, &mut entries).is_ok() {
                written += entries.iter().filter(|&&e| is_written(e)).count();
            }
            pages += n;
        }
        self.judged += pages as u64;
        self.written += written as u64;
        if self.judged >= DECAY_PAGES {
            self.judged /= 2;
            self.written /= 2;
        }
        self.wasted = 4 * self.written >= 3 * self.judged;
        self.left.clear();
        self.since = None;
        (pages as u64, written as u64)
    }
}

/// A pagemap entry of a page the program wrote: present and its own (the
/// zero page a read maps is shared by everyone).
fn is_written(entry: u64) -> bool {
    entry & sys::PM_PRESENT != 0 && entry & sys::PM_MMAP_EXCLUSIVE != 0
}

/// Field 47 of a /proc/PID/stat text (`start_brk`), counted after the
/// command name, which may itself hold spaces and parentheses.
fn start_brk(stat: &str) -> Option<usize> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the name; start_brk is the 45th of them.
    after_comm.split_whitespace().nth(44)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_brk_is_field_47_whatever_the_name() {
        let mut fields: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        fields[47 - 3] = "94371840".into();
        let stat = format!("1234 (a (b) c) {}", fields.join(" "));
        assert_eq!(start_brk(&stat), Some(94371840));
        assert_eq!(start_brk("1234 (x) R 1"), None);
    }

    /// Pages of this test binary nothing touches: writable and
    /// zero-initialised, so in .bss (below the break's area), private
    /// anonymous memory never faulted in.
    #[repr(align(4096))]
    #[allow(dead_code)] // only its address is used
    struct Untouched([u8; 8 * PAGE]);
    static mut UNTOUCHED: Untouched = Untouched([0; 8 * PAGE]);

    #[test]
    fn leaving_pages_out_stops_once_the_program_writes_them_and_probes_after() {
        let pagemap = sys::Pagemap::open().expect("pagemap");
        // A heap whose area starts at 0 takes in .bss too.
        let mut heap = Heap {
            start: Some(0),
            ..Heap::default()
        };
        let untouched = std::ptr::addr_of!(UNTOUCHED) as usize;
        let mut stats = crate::stats::Stats::default();
        // Runs left out that the program then wrote: it does not pay.
        let mut written = vec![0u8; 16 * PAGE];
        written.fill(1);
        let first = (written.as_ptr() as usize).next_multiple_of(PAGE);
        heap.left_out(&mut stats, first, &[true; 8]);
        heap.since = Some(Instant::now() - JUDGE_AFTER);
        assert!(heap
            .untouched(Some(&pagemap), &mut stats, untouched, 4 * PAGE)
            .is_none());
        assert!(heap.wasted && heap.left.is_empty());
        // Every PROBE_EVERY-th chance is still taken.
        for _ in 2..PROBE_EVERY {
            assert!(heap
                .untouched(Some(&pagemap), &mut stats, untouched, 4 * PAGE)
                .is_none());
        }
        let (at, pages) = heap
            .untouched(Some(&pagemap), &mut stats, untouched, 4 * PAGE)
            .expect("a probe");
        assert_eq!((at, &pages), (untouched, &vec![true; 4]));
        // The probe's pages stay unwritten: leaving out pays again.
        heap.left_out(&mut stats, at, &pages);
        heap.since = Some(Instant::now() - JUDGE_AFTER);
        assert!(heap
            .untouched(Some(&pagemap), &mut stats, untouched, 4 * PAGE)
            .is_some());
        assert!(!heap.wasted);
        drop(written);
    }

    #[test]
    fn this_process_has_a_heap_and_memory_outside_it_is_left_alone() {
        let mut heap = Heap::new();
        let start = heap.start.expect("start_brk readable");
        assert!(start > 0 && start <= sys::program_break());
        let pagemap = sys::Pagemap::open().ok();
        // A range beyond the break is not the heap's, whatever it holds.
        let beyond = sys::program_break() + (1 << 30);
        let mut stats = crate::stats::Stats::default();
        let below = start.saturating_sub(8 * PAGE);
        assert!(heap
            .untouched(pagemap.as_ref(), &mut stats, beyond, 4 * PAGE)
            .is_none());
        assert!(heap
            .untouched(pagemap.as_ref(), &mut stats, below, 4 * PAGE)
            .is_none());
    }
}
