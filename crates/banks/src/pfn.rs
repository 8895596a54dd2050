//! Physical frame numbers of this process's own pages, from
//! /proc/self/pagemap (bit 63 present, bits 0-54 the PFN). Without
//! CAP_SYS_ADMIN the kernel reports every PFN as zero: callers treat zero as
//! "not visible" and fall back.
//!
//! Opened and read with plain libc calls, so that the engine may call it
//! while it holds its lock inside a preloaded program without allocating.

const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;

/// The PFN in a pagemap entry: 0 for a page not present or a PFN hidden.
pub fn from_entry(entry: u64) -> u64 {
    if entry & PRESENT != 0 {
        entry & PFN_MASK
    } else {
        0
    }
}

/// An open /proc/self/pagemap.
pub struct Pagemap {
    fd: libc::c_int,
}

impl Pagemap {
    pub fn open() -> Option<Pagemap> {
        // SAFETY: a NUL-terminated path literal; the descriptor is owned by the returned value.
        let fd = unsafe {
            libc::open(
                c"/proc/self/pagemap".as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        (fd >= 0).then_some(Pagemap { fd })
    }

    /// PFNs of the `out.len()` pages from `addr` (page aligned); 0 for a page
    /// not present or a PFN hidden from this process. False if the read failed.
    pub fn pfns(&self, addr: usize, out: &mut [u64]) -> bool {
        let offset = (addr / crate::PAGE as usize * 8) as libc::off_t;
        let bytes = std::mem::size_of_val(out);
        // SAFETY: `out` is a writable buffer of exactly `bytes` bytes; pread writes within it.
        let n = unsafe { libc::pread(self.fd, out.as_mut_ptr().cast(), bytes, offset) };
        if n != bytes as isize {
            return false;
        }
        for e in out.iter_mut() {
            *e = from_entry(*e);
        }
        true
    }

    /// The PFN of the page at `addr`, if present and visible.
    pub fn pfn(&self, addr: usize) -> Option<u64> {
        let mut one = [0u64];
        (self.pfns(addr & !(crate::PAGE as usize - 1), &mut one) && one[0] != 0).then_some(one[0])
    }
}

impl Drop for Pagemap {
    fn drop(&mut self) {
        // SAFETY: the descriptor was opened by Pagemap::open and is closed once, here.
        unsafe { libc::close(self.fd) };
    }
}

/// Whether this process can read real PFNs (writes one page of its own and looks).
pub fn visible() -> bool {
    let Some(map) = Pagemap::open() else {
        return false;
    };
    let page = Box::new([1u8; crate::PAGE as usize * 2]);
    let addr = (page.as_ptr() as usize + crate::PAGE as usize - 1) & !(crate::PAGE as usize - 1);
    // SAFETY: addr lies inside the live boxed buffer (rounded up by less than a page).
    unsafe { std::ptr::write_volatile(addr as *mut u8, 2) };
    map.pfn(addr).is_some()
}
