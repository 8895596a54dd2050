//! Memory for the benchmarks: plain mappings (the baselines: anonymous memory,
//! memfd MAP_PRIVATE for the kernel's own copy-on-write), engine blocks that
//! free themselves (both used through the safe methods of `Pages`), page
//! contents that can be regenerated from an id (so a
//! benchmark can verify every byte after a fold without keeping a copy), and
//! touch loops that fault one byte per page.
//!
//! Content generation allocates nothing and calls nothing, so it is also safe
//! in a forked child of a multi-threaded process (the KSM workload).

use pagefold_engine::{Engine, Hint, PAGE};
use std::io;

const WORDS_PER_PAGE: usize = PAGE / 8;

/// Memory of whole pages that belongs to one value and that the harness
/// reads and writes only through raw pointers: a mapping ([`Region`]) or an
/// engine block ([`Block`]). Its provided methods are the safe ways to fill,
/// touch, copy and check such memory, each with the one safety argument
/// below; the raw-pointer functions further down are for the forked KSM
/// child, which has no such value.
///
/// # Safety
/// An implementor guarantees that `ptr()` is page-aligned and points to
/// `pages() * PAGE` bytes that stay readable and writable for as long as
/// the value lives, that no other live value's range overlaps them, and that
/// no Rust reference to those bytes is ever made (only raw-pointer access).
pub unsafe trait Pages {
    /// The first byte.
    fn ptr(&self) -> *mut u8;

    fn pages(&self) -> usize;

    fn byte_len(&self) -> usize {
        self.pages() * PAGE
    }

    /// Fills page i with the content named `ids[i]`.
    fn fill(&self, ids: &[u64]) {
        assert!(ids.len() <= self.pages(), "more ids than pages");
        // SAFETY: by the trait's contract `ptr()` points to `pages()`
        // writable, aligned pages, and only the first `ids.len()` are written.
        unsafe { fill_pages(self.ptr(), ids) }
    }

    /// Writes zeros over every byte.
    fn fill_zero(&self) {
        // SAFETY: by the trait's contract `ptr()` points to `byte_len()`
        // writable bytes.
        unsafe { std::ptr::write_bytes(self.ptr(), 0, self.byte_len()) }
    }

    /// Index of the first page whose content is not `ids[i]`, if any.
    fn first_mismatch(&self, ids: &[u64]) -> Option<usize> {
        assert!(ids.len() <= self.pages(), "more ids than pages");
        // SAFETY: by the trait's contract `ptr()` points to `pages()`
        // readable, aligned pages, and only the first `ids.len()` are read.
        unsafe { first_mismatch(self.ptr(), ids) }
    }

    /// Index of the first page that is not all zero, if any.
    fn first_nonzero_page(&self) -> Option<usize> {
        // SAFETY: by the trait's contract `ptr()` points to `pages()`
        // readable pages.
        unsafe { first_nonzero_page(self.ptr(), self.pages()) }
    }

    /// Writes one byte into every page (a write fault per page on fresh or
    /// shared memory).
    fn write_byte_per_page(&self, value: u8) {
        // SAFETY: by the trait's contract `ptr()` points to `pages()`
        // writable pages.
        unsafe { write_byte_per_page(self.ptr(), self.pages(), value) }
    }

    /// Reads one byte from every page (a read fault per page on unfaulted
    /// memory); returns their sum, for `black_box`.
    fn read_byte_per_page(&self) -> u64 {
        // SAFETY: by the trait's contract `ptr()` points to `pages()`
        // readable pages.
        unsafe { read_byte_per_page(self.ptr(), self.pages()) }
    }

    /// The byte at `offset`, read volatile (it may be shared with a copy).
    fn byte_at(&self, offset: usize) -> u8 {
        assert!(offset < self.byte_len(), "offset past the end");
        // SAFETY: `offset` is inside the `byte_len()` readable bytes at
        // `ptr()` (the trait's contract), checked just above.
        unsafe { self.ptr().add(offset).read_volatile() }
    }

    /// memcpy of all of `src` into the start of this memory.
    fn copy_from(&self, src: &impl Pages) {
        assert!(
            src.byte_len() <= self.byte_len(),
            "source larger than destination"
        );
        // SAFETY: `src` is readable and `self` writable for `src.byte_len()`
        // bytes, and two live values never overlap (the trait's contract).
        unsafe { std::ptr::copy_nonoverlapping(src.ptr(), self.ptr(), src.byte_len()) }
    }
}

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
}

// SAFETY: `ptr` is the page-aligned start of a fresh read-write mapping of
// `len` bytes made by `map`, unmapped only when the Region drops; mmap never
// returns a range overlapping another live mapping, and Region hands out
// only the raw pointer.
unsafe impl Pages for Region {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn pages(&self) -> usize {
        self.len / PAGE
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are exactly the mapping `map` made for this
        // Region, which no one else unmaps, and nothing uses it after drop.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

fn map(len: usize, flags: libc::c_int, fd: libc::c_int) -> io::Result<Region> {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: no address hint and no MAP_FIXED, so the kernel places the
    // mapping in unused address space and no existing memory is affected;
    // `fd` is -1 (anonymous) or an open memfd of at least `len` bytes.
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
        // SAFETY: the name is a NUL-terminated literal; memfd_create only
        // reads it.
        let fd = unsafe { libc::memfd_create(c"pagefold-bench".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let memfd = Memfd { fd, len };
        // SAFETY: `fd` is the memfd just created and owned by `memfd`;
        // ftruncate takes no pointers.
        if unsafe { libc::ftruncate(fd, len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(memfd)
    }
}

impl Drop for Memfd {
    fn drop(&mut self) {
        // SAFETY: `fd` was opened by Memfd::new for this value alone and is
        // closed only here, once. Mappings made from it stay valid.
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

    /// A virtual copy of this block into a fresh block.
    pub fn copy_to_new(&self) -> Block<'e> {
        let dst = Block::new(self.engine, self.pages, Hint::None);
        self.copy_into(&dst);
        dst
    }

    /// A virtual copy (`engine.copy`) of this block into `dst`, a block of
    /// the same size.
    pub fn copy_into(&self, dst: &Block) {
        assert_eq!(dst.pages, self.pages, "blocks of different sizes");
        // SAFETY: both are live engine blocks of `pages` pages (Block::new),
        // so both ranges are valid for `byte_len()` bytes.
        unsafe { self.engine.copy(dst.ptr, self.ptr, self.byte_len()) };
    }
}

// SAFETY: `ptr` is the start of a page-aligned engine block of `pages`
// pages (engine.alloc, checked not null), readable and writable until the
// Block drops and frees it; the engine never hands out overlapping blocks,
// and Block hands out only the raw pointer.
unsafe impl Pages for Block<'_> {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    fn pages(&self) -> usize {
        self.pages
    }
}

impl Drop for Block<'_> {
    fn drop(&mut self) {
        // SAFETY: `ptr` is this Block's own allocation; nothing uses it after
        // the Block drops (Pages hands out only raw pointers tied to it).
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
/// `base` must point to `ids.len()` writable pages, 8-byte aligned.
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
/// `base` must point to `ids.len()` readable pages, 8-byte aligned.
pub unsafe fn first_mismatch(base: *const u8, ids: &[u64]) -> Option<usize> {
    (0..ids.len()).find(|&i| !page_is(base.add(i * PAGE), ids[i]))
}

/// Index of the first page that is not all zero, if any.
///
/// # Safety
/// `base` must point to `pages` readable pages, 8-byte aligned.
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

/// Bytes in use in the kernel's slab caches `caches`, from /sys/kernel/slab.
/// SLUB often merges caches into generic ones shared with others, so only
/// the growth over a baseline means anything; each distinct cache is counted
/// once. None where the files cannot be read.
pub fn slab_bytes(caches: &[&str]) -> Option<u64> {
    let mut seen = Vec::new();
    let mut bytes = 0;
    for cache in caches {
        let dir = std::fs::canonicalize(format!("/sys/kernel/slab/{cache}")).ok()?;
        if seen.contains(&dir) {
            continue;
        }
        let read = |file: &str| -> Option<u64> {
            std::fs::read_to_string(dir.join(file))
                .ok()?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        };
        bytes += read("objects")? * read("object_size")?;
        seen.push(dir);
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_pages_are_distinct_nonzero_and_checkable() {
        let region = Region::anon(3 * PAGE).unwrap();
        let ids = [7, 8, 7];
        region.fill(&ids);
        assert_eq!(region.first_mismatch(&ids), None);
        // SAFETY: the region's first page is PAGE readable, aligned bytes.
        assert!(!unsafe { page_is(region.ptr(), 8) });
        assert_eq!(region.first_nonzero_page(), Some(0));
        region.write_byte_per_page(1);
        assert_eq!(region.first_mismatch(&ids), Some(0));
    }

    #[test]
    fn memfd_private_mapping_reads_file_content() {
        let fd = Memfd::new(2 * PAGE).unwrap();
        let shared = Region::of_memfd(&fd, true).unwrap();
        shared.fill(&[1, 2]);
        let private = Region::of_memfd(&fd, false).unwrap();
        assert_eq!(private.first_mismatch(&[1, 2]), None);
        assert!(meminfo_kib("MemTotal") > 0);
    }
}
