//! Populated anonymous memory: a private mapping whose pages are all
//! allocated (MADV_POPULATE_WRITE) when it is made, unmapped when dropped.
//! The probe times accesses within one, the colouring loop holds refused
//! pages' successors in them, and the benchmark churns the free lists with
//! them.

/// Whether the mapping asks for transparent huge pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Huge {
    /// Ask for them (physical addresses then run on in 2 MiB pieces).
    Asked,
    /// Refuse them (every page a 4 KiB page of its own).
    Refused,
    /// The system's default.
    Default,
}

/// A populated private anonymous mapping of `len` bytes.
pub struct Populated {
    ptr: *mut u8,
    len: usize,
}

impl Populated {
    /// None if the kernel refuses the mapping.
    pub fn new(len: usize, huge: Huge) -> Option<Populated> {
        // SAFETY: a fresh private anonymous mapping owned by the returned value.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let advice = match huge {
            Huge::Asked => Some(libc::MADV_HUGEPAGE),
            Huge::Refused => Some(libc::MADV_NOHUGEPAGE),
            Huge::Default => None,
        };
        // SAFETY: advice and population on the mapping just made; they only allocate its pages.
        unsafe {
            if let Some(a) = advice {
                libc::madvise(p, len, a);
            }
            libc::madvise(p, len, libc::MADV_POPULATE_WRITE);
        }
        Some(Populated { ptr: p.cast(), len })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Populated {
    fn drop(&mut self) {
        // SAFETY: the mapping made in Populated::new, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
