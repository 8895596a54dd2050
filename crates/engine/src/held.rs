//! Which pages are held write-protected (hold.rs says why and when): the
//! engine's own list, under the engine lock, and the fault thread's table,
//! under the eviction table's lock (fault.rs), where a write ends a hold.
//! Both are plain data here, below everything that protects, remaps or
//! frees a range and so must end the holds in it.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::sys::PAGE;

/// A write to a held page ends the holds of up to this many held pages on
/// each side of it too.
const END_AROUND: usize = 256;

/// The engine's own list of held pages (a superset of the table's: a write
/// ends a hold in the table only), with the number of runs they form.
#[derive(Default)]
pub struct Holds {
    pages: BTreeMap<usize, Instant>,
    pub runs: usize,
    /// Holds were wanted without a fault thread: counted once.
    pub missing: bool,
    /// A scan told the fault thread it works on a chunk with holds.
    pub scanning: bool,
}

impl Holds {
    pub fn insert(&mut self, a: usize, since: Instant) {
        if self.pages.insert(a, since).is_none() {
            let joined = self.neighbours(a);
            self.runs = self.runs + 1 - joined;
        }
    }

    pub fn remove(&mut self, a: usize) {
        if self.pages.remove(&a).is_some() {
            let joined = self.neighbours(a);
            self.runs = self.runs + joined - 1;
        }
    }

    /// Held pages right before and after `a` (0, 1 or 2).
    fn neighbours(&self, a: usize) -> usize {
        let held = |x: Option<usize>| x.is_some_and(|x| self.pages.contains_key(&x));
        held(a.checked_sub(PAGE)) as usize + held(a.checked_add(PAGE)) as usize
    }

    pub fn contains(&self, a: usize) -> bool {
        self.pages.contains_key(&a)
    }

    /// Held pages in `[addr, addr+len)`, with when their hold began.
    pub fn within(&self, addr: usize, len: usize) -> Vec<(usize, Instant)> {
        self.pages
            .range(addr..addr + len)
            .map(|(&a, &t)| (a, t))
            .collect()
    }

    pub fn any_within(&self, addr: usize, len: usize) -> bool {
        self.pages.range(addr..addr + len).next().is_some()
    }

    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Forgets every held page (in a forked child nothing is registered);
    /// whether holds were found missing is kept.
    pub fn clear(&mut self) {
        self.pages.clear();
        self.runs = 0;
        self.scanning = false;
    }

    /// Memory the list takes: a B-tree entry, with about as much again for its node.
    pub fn bytes(&self) -> usize {
        self.pages.len() * 2 * std::mem::size_of::<(usize, Instant)>()
    }
}

/// The held pages, in the table the fault thread shares (fault.rs).
pub(crate) struct Held {
    /// Held page address -> when its hold began.
    pub pages: HashMap<usize, Instant>,
    /// The range a scan is working on: its holds are the scan's.
    pub scanning: Option<(usize, usize)>,
    /// Holds a write ended (with the run around the page written).
    pub broken: u64,
}

impl Held {
    /// Only engine threads insert (and may allocate); the fault thread
    /// only removes, which never allocates.
    pub fn new() -> Held {
        Held {
            pages: HashMap::new(),
            scanning: None,
            broken: 0,
        }
    }

    /// On the fault thread: a write-protect fault at `addr` ends its hold,
    /// unless a scan is working there, and the holds of the run of held
    /// pages around it (up to `END_AROUND` each way): a program writing a
    /// held range page by page pays one fault for the run, not one a page.
    /// Returns the range whose holds ended, for the caller to unprotect.
    pub fn end_by_write(&mut self, addr: usize) -> Option<(usize, usize)> {
        let free = |held: &Held, a: usize| {
            held.pages.contains_key(&a)
                && !held.scanning.is_some_and(|(s, end)| (s..end).contains(&a))
        };
        if !free(self, addr) {
            return None;
        }
        let mut start = addr;
        while addr - start < END_AROUND * PAGE && start >= PAGE && free(self, start - PAGE) {
            start -= PAGE;
        }
        let mut end = addr + PAGE;
        while end - addr <= END_AROUND * PAGE && free(self, end) {
            end += PAGE;
        }
        for a in (start..end).step_by(PAGE) {
            self.pages.remove(&a);
        }
        self.broken += ((end - start) / PAGE) as u64;
        Some((start, end - start))
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Memory the table of holds takes (a hash map entry and its control byte).
    pub fn bytes(&self) -> usize {
        self.pages.capacity() * (std::mem::size_of::<(usize, Instant)>() + 1)
    }

    /// Forgets every hold (in a forked child nothing is registered).
    pub fn clear(&mut self) {
        self.pages.clear();
        self.scanning = None;
    }

    /// Every held page, for unprotecting them all when the engine goes.
    pub fn take_all(&mut self) -> Vec<usize> {
        self.pages.drain().map(|(a, _)| a).collect()
    }
}
