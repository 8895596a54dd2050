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

use crate::sys::{self, PAGE};

/// Where the program break's area starts, learnt once.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Heap {
    start: Option<usize>,
}

impl Heap {
    /// Reads `start_brk` from /proc/self/stat (None where it cannot be read:
    /// the engine then leaves the heap alone).
    pub fn new() -> Heap {
        Heap {
            start: std::fs::read_to_string("/proc/self/stat")
                .ok()
                .and_then(|s| start_brk(&s)),
        }
    }

    /// Which whole pages of `[dst, dst + len)` read zero without being
    /// written, if the range lies in the program break's area: the first
    /// whole page's address and a flag per whole page; None when it does
    /// not, or holds no such page.
    pub fn untouched(
        &self,
        pagemap: Option<&sys::Pagemap>,
        dst: usize,
        len: usize,
    ) -> Option<(usize, Vec<bool>)> {
        let start = self.start?;
        let end = sys::program_break();
        let (first, last) = (dst.next_multiple_of(PAGE), (dst + len) / PAGE * PAGE);
        if dst < start || dst + len > end || last <= first {
            return None;
        }
        let mut entries = vec![0u64; (last - first) / PAGE];
        pagemap?.read(first as *const u8, &mut entries).ok()?;
        let untouched: Vec<bool> = entries
            .iter()
            .map(|e| e & (sys::PM_PRESENT | sys::PM_SWAP) == 0)
            .collect();
        untouched.contains(&true).then_some((first, untouched))
    }
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

    #[test]
    fn this_process_has_a_heap_and_memory_outside_it_is_left_alone() {
        let heap = Heap::new();
        let start = heap.start.expect("start_brk readable");
        assert!(start > 0 && start <= sys::program_break());
        let pagemap = sys::Pagemap::open().ok();
        // A range beyond the break is not the heap's, whatever it holds.
        let beyond = sys::program_break() + (1 << 30);
        assert!(heap.untouched(pagemap.as_ref(), beyond, 4 * PAGE).is_none());
        assert!(heap
            .untouched(pagemap.as_ref(), start.saturating_sub(8 * PAGE), 4 * PAGE)
            .is_none());
    }
}
