//! The pin guard's state (detach.rs says what the guard does and why): the
//! scratch range it moves pages into, whether the kernel refused it, and the
//! frames and pages still too young to fold or merge; and a run of pages
//! taken off their addresses into the scratch range.

use std::collections::HashMap;
use std::io;
use std::time::Instant;

use crate::frames::FrameId;
use crate::protect::Protector;
use crate::sys::{self, PAGE};

/// What the pin guard keeps between scans (in `State`).
#[derive(Default)]
pub(crate) struct Guard {
    /// Where the guard moves pages; made on first use.
    pub scratch: Option<Scratch>,
    /// The kernel refused the guard's first move: not tried again.
    pub missing: bool,
    /// Frames a scan froze from owned pages less than `pin_age` ago, and when.
    pub young_frames: HashMap<FrameId, Instant>,
    /// Pages that diverged less than `pin_age` ago (by address), and when.
    pub young_pages: HashMap<usize, Instant>,
}

impl Guard {
    /// Memory the young frames and pages take: a hash map entry (key,
    /// value and a control byte) over each map's capacity.
    pub fn bytes(&self) -> usize {
        self.young_frames.capacity() * (std::mem::size_of::<(FrameId, Instant)>() + 1)
            + self.young_pages.capacity() * (std::mem::size_of::<(usize, Instant)>() + 1)
    }
}

/// Anonymous memory the engine moves pages into: registered with the
/// engine's userfaultfd (UFFDIO_MOVE requires it of the destination, and the
/// same write-protect registration as the program's side so both mappings
/// have the same protection bits), not inherited by a fork.
pub struct Scratch {
    base: *mut u8,
    pages: usize,
}

// SAFETY: the scratch range is a mapping the engine made and owns; it is used only under the
// engine lock, so moving the handle to another thread is sound.
unsafe impl Send for Scratch {}

impl Scratch {
    pub fn open(protector: &Protector, pages: usize) -> io::Result<Scratch> {
        let base = sys::map(std::ptr::null_mut(), pages * PAGE, None, 0, false, false)?;
        let scratch = Scratch { base, pages };
        sys::madvise(base, pages * PAGE, libc::MADV_DONTFORK)?;
        sys::madvise(base, pages * PAGE, libc::MADV_NOHUGEPAGE)?;
        protector.register(base, pages * PAGE)?;
        Ok(scratch)
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    pub fn page(&self, j: usize) -> *mut u8 {
        // SAFETY: callers pass j below `pages`, so the offset stays inside the mapping.
        unsafe { self.base.add(j * PAGE) }
    }

    /// Frees the pages moved into `[0, n)`.
    pub fn clear(&self, n: usize) {
        let _ = sys::madvise(self.base, n * PAGE, libc::MADV_DONTNEED);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        sys::unmap(self.base, self.pages * PAGE);
    }
}

/// Pages of a run moved off their addresses: `taken[j]` is a hole at page
/// `i + j` whose content waits in scratch page `j`.
pub struct Detached {
    pub base: usize,
    pub i: usize,
    pub taken: Vec<bool>,
}

impl Detached {
    /// Runs `[x, y)` of consecutive pages taken off.
    pub fn taken_runs(&self) -> Vec<(usize, usize)> {
        let taken: Vec<usize> = (0..self.taken.len()).filter(|&j| self.taken[j]).collect();
        crate::space::consecutive(&taken)
    }
}

/// Whether this kernel moves pages: one page of scratch onto another.
pub fn moves_pages(p: &Protector, s: &Scratch) -> bool {
    if s.pages() < 2 {
        return false;
    }
    // SAFETY: page 0 of the scratch range is ours and writable.
    unsafe { s.page(0).write(1) };
    let ok = p.move_pages(s.page(1), s.page(0), PAGE).1.is_none();
    s.clear(2);
    ok
}
