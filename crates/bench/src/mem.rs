//! Memory for the benchmarks: plain mappings (the baselines: anonymous memory,
//! memfd MAP_PRIVATE for the kernel's own copy-on-write), engine blocks that
//! free themselves, page contents that can be regenerated from an id (so a
//! benchmark can verify every byte after a fold without keeping a copy), and
//! touch loops that fault one byte per page.
//!
//! Content generation allocates nothing and calls nothing, so it is also safe
//! in a forked child of a multi-threaded process (the KSM workload).

use pagefold_engine::{Engine, Hint, PAGE};
use std::io;

const WORDS_PER_PAGE: usize = PAGE / 8;

/// An mmap'ed range, unmapped when dropped.
pub struct Region {
    ptr: *mut u8,
    len: usize,
}

impl Region {
    /// Fresh private anonymous memory (nothing faulted in yet).
    pub fn anon(len: usize) -> io::Result<Region> {
        map(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1)
    }

    /// The whole memfd mapped MAP_SHARED or MAP_PRIVATE.
    pub fn of_memfd(fd: &Memfd, shared: bool) -> io::Result<Region> {
        let kind = if shared {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE
        };
        map(fd.len, kind, fd.fd)
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn pages(&self) -> usize {
        self.len / PAGE
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn map(len: usize, flags: libc::c_int, fd: libc::c_int) -> io::Result<Region> {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(Region {
        ptr: ptr.cast(),
        len,
    })
}

/// A memfd of a fixed length, closed when dropped.
pub struct Memfd {
    fd: libc::c_int,
    len: usize,
}

impl Memfd {
    pub fn new(len: usize) -> io::Result<Memfd> {
        let fd = unsafe { libc::memfd_create(c"pagefold-bench".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let memfd = Memfd { fd, len };
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(memfd)
    }
}

impl Drop for Memfd {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

/// An engine allocation, freed when dropped.
pub struct Block<'e> {
    engine: &'e Engine,
    ptr: *mut u8,
    pages: usize,
}

impl<'e> Block<'e> {
    pub fn new(engine: &'e Engine, pages: usize, hint: Hint) -> Block<'e> {
        let ptr = engine.alloc(pages * PAGE, hint);
        assert!(
            !ptr.is_null(),
            "engine.alloc of {pages} pages returned null"
        );
        Block { engine, ptr, pages }
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn pages(&self) -> usize {
        self.pages
    }

    pub fn byte_len(&self) -> usize {
        self.pages * PAGE
    }

    /// A virtual copy of this block into a fresh block.
    pub fn copy_to_new(&self) -> Block<'e> {
        let dst = Block::new(self.engine, self.pages, Hint::None);
        unsafe { self.engine.copy(dst.ptr, self.ptr, self.byte_len()) };
        dst
    }
}

impl Drop for Block<'_> {
    fn drop(&mut self) {
        let freed = unsafe { self.engine.free(self.ptr) };
        debug_assert!(freed, "engine.free refused its own block");
    }
}

/// splitmix64: fast, stateless, good enough to make pages distinct.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn page_word(id: u64, word: usize) -> u64 {
    // never zero, so no generated page is an all-zero page
    mix(id
        .wrapping_mul(WORDS_PER_PAGE as u64)
        .wrapping_add(word as u64))
        | 1
}

/// Fills one page with the content named `id`.
///
/// # Safety
/// `page` must point to PAGE writable bytes, 8-byte aligned.
pub unsafe fn fill_page(page: *mut u8, id: u64) {
    let words = page.cast::<u64>();
    for w in 0..WORDS_PER_PAGE {
        words.add(w).write(page_word(id, w));
    }
}

/// Fills page i of the range with content `ids[i]`.
///
/// # Safety
/// `base` must point to `ids.len()` writable pages.
pub unsafe fn fill_pages(base: *mut u8, ids: &[u64]) {
    for (i, &id) in ids.iter().enumerate() {
        fill_page(base.add(i * PAGE), id);
    }
}

/// Whether the page holds exactly the content named `id`.
///
/// # Safety
/// `page` must point to PAGE readable bytes, 8-byte aligned.
pub unsafe fn page_is(page: *const u8, id: u64) -> bool {
    let words = page.cast::<u64>();
    (0..WORDS_PER_PAGE).all(|w| words.add(w).read_volatile() == page_word(id, w))
}

/// Index of the first page whose content is not `ids[i]`, if any.
///
/// # Safety
/// `base` must point to `ids.len()` readable pages.
pub unsafe fn first_mismatch(base: *const u8, ids: &[u64]) -> Option<usize> {
    (0..ids.len()).find(|&i| !page_is(base.add(i * PAGE), ids[i]))
}

/// Index of the first page that is not all zero, if any.
///
/// # Safety
/// `base` must point to `pages` readable pages.
pub unsafe fn first_nonzero_page(base: *const u8, pages: usize) -> Option<usize> {
    (0..pages).find(|&i| {
        let words = base.add(i * PAGE).cast::<u64>();
        (0..WORDS_PER_PAGE).any(|w| words.add(w).read_volatile() != 0)
    })
}

/// Writes one byte into every page (a write fault per page on fresh or shared memory).
///
/// # Safety
/// `base` must point to `pages` writable pages.
pub unsafe fn write_byte_per_page(base: *mut u8, pages: usize, value: u8) {
    for i in 0..pages {
        base.add(i * PAGE + 17).write_volatile(value);
    }
}

/// Reads one byte from every page (a read fault per page on unfaulted memory).
///
/// # Safety
/// `base` must point to `pages` readable pages.
pub unsafe fn read_byte_per_page(base: *const u8, pages: usize) -> u64 {
    (0..pages)
        .map(|i| base.add(i * PAGE).read_volatile() as u64)
        .sum()
}

/// A field of /proc/meminfo in KiB (Shmem holds memfd frames, AnonPages diverged copies).
pub fn meminfo_kib(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|line| {
            line.strip_prefix(field)?
                .strip_prefix(':')?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_pages_are_distinct_nonzero_and_checkable() {
        let region = Region::anon(3 * PAGE).unwrap();
        let ids = [7, 8, 7];
        unsafe {
            fill_pages(region.ptr(), &ids);
            assert_eq!(first_mismatch(region.ptr(), &ids), None);
            assert!(!page_is(region.ptr(), 8));
            assert_eq!(first_nonzero_page(region.ptr(), 3), Some(0));
            write_byte_per_page(region.ptr(), 3, 1);
            assert_eq!(first_mismatch(region.ptr(), &ids), Some(0));
        }
    }

    #[test]
    fn memfd_private_mapping_reads_file_content() {
        let fd = Memfd::new(2 * PAGE).unwrap();
        let shared = Region::of_memfd(&fd, true).unwrap();
        unsafe { fill_pages(shared.ptr(), &[1, 2]) };
        let private = Region::of_memfd(&fd, false).unwrap();
        assert_eq!(unsafe { first_mismatch(private.ptr(), &[1, 2]) }, None);
        assert!(meminfo_kib("MemTotal") > 0);
    }
}
