//! Large buffers from glibc's malloc family, copied with glibc's memcpy and
//! cleared with its memset. The point of the synthetic workloads is to be
//! seen by pagefold's preload, which interposes malloc, calloc, free and
//! memcpy: so every allocation, copy and clear here is an explicit libc call
//! (Rust's allocator or an inlined copy loop might not reach those symbols).
//! Every constructor returns initialised memory, so the word slices handed
//! out are always sound to read.

use std::ptr::NonNull;

use crate::rng::Rng;

pub const PAGE: usize = 4096;
pub const WORDS_PER_PAGE: usize = PAGE / 8;
const MIB: usize = 1 << 20;

/// `words` u64 values in one glibc allocation, freed on drop.
///
/// Invariant: `ptr` is the start of a live allocation from glibc's malloc,
/// calloc or posix_memalign of `words * 8` bytes, owned by this buffer alone, and every word
/// of it is initialised (a buffer from `uninit` is written in full before
/// its public constructor returns it).
pub struct Buffer {
    ptr: NonNull<u64>,
    words: usize,
}

impl Buffer {
    /// Zeroed by calloc (fresh mmap memory under plain glibc: no page is
    /// touched until written).
    pub fn calloc(bytes: usize) -> Result<Buffer, String> {
        let words = word_count(bytes)?;
        // SAFETY: calloc has no precondition; NULL is turned into an error.
        let p = unsafe { libc::calloc(words, 8) };
        Buffer::from_raw(p, words)
    }

    /// malloc then memset 0: the pages are written, so they exist, all zero.
    pub fn memset_zero(bytes: usize) -> Result<Buffer, String> {
        let mut b = Buffer::uninit(bytes)?;
        b.clear();
        Ok(b)
    }

    /// malloc then memcpy from `src`.
    pub fn copy_of(src: &Buffer) -> Result<Buffer, String> {
        let b = Buffer::uninit(src.bytes())?;
        // SAFETY: `b` is a new allocation of src.bytes() bytes and `src` a
        // live, initialised one of the same size; two live allocations do
        // not overlap. Afterwards every word of `b` is initialised.
        unsafe { libc::memcpy(b.ptr.as_ptr().cast(), src.ptr.as_ptr().cast(), src.bytes()) };
        Ok(b)
    }

    /// malloc then every word written from `rng`, in order (the same seed
    /// gives the same bytes: that is how duplicates arise without a copy).
    pub fn generated(bytes: usize, rng: &mut Rng) -> Result<Buffer, String> {
        let b = Buffer::uninit(bytes)?;
        for i in 0..b.words {
            // SAFETY: i < b.words, so the word lies in b's allocation; `write`
            // does not read the uninitialised value it replaces.
            unsafe { b.ptr.as_ptr().add(i).write(rng.next_u64()) };
        }
        Ok(b)
    }

    /// posix_memalign at a page boundary, then every word written from
    /// `word(i)`, in order: a buffer whose pages are the program's pages (a
    /// glibc chunk starts 16 bytes into its first page, so page-sized records
    /// in it straddle two pages, and two equal records never make two equal
    /// pages).
    pub fn page_aligned_from(
        bytes: usize,
        mut word: impl FnMut(usize) -> u64,
    ) -> Result<Buffer, String> {
        let words = word_count(bytes)?;
        let mut p: *mut libc::c_void = std::ptr::null_mut();
        let len = words.checked_mul(8).ok_or("buffer size overflows")?;
        // SAFETY: `p` is a valid place for the result; PAGE is a power of two
        // and a multiple of the pointer size, as posix_memalign requires.
        if unsafe { libc::posix_memalign(&mut p, PAGE, len) } != 0 {
            p = std::ptr::null_mut();
        }
        let b = Buffer::from_raw(p, words)?;
        for i in 0..b.words {
            // SAFETY: i < b.words, so the word lies in b's allocation; `write`
            // does not read the uninitialised value it replaces.
            unsafe { b.ptr.as_ptr().add(i).write(word(i)) };
        }
        Ok(b)
    }

    /// Not public: its words must be written before any slice is made.
    fn uninit(bytes: usize) -> Result<Buffer, String> {
        let words = word_count(bytes)?;
        // SAFETY: malloc has no precondition; NULL is turned into an error.
        let p = words
            .checked_mul(8)
            .map_or(std::ptr::null_mut(), |n| unsafe { libc::malloc(n) });
        Buffer::from_raw(p, words)
    }

    fn from_raw(p: *mut libc::c_void, words: usize) -> Result<Buffer, String> {
        match NonNull::new(p.cast::<u64>()) {
            Some(ptr) => Ok(Buffer { ptr, words }),
            None => Err(format!("out of memory allocating {} MiB", words * 8 / MIB)),
        }
    }

    /// memset 0 over the whole buffer.
    pub fn clear(&mut self) {
        // SAFETY: the allocation holds self.bytes() bytes (the invariant),
        // and `&mut self` means no slice of it is borrowed meanwhile.
        unsafe { libc::memset(self.ptr.as_ptr().cast(), 0, self.bytes()) };
    }

    pub fn words(&self) -> &[u64] {
        // SAFETY: `words` initialised u64s at `ptr` (the invariant), shared
        // for as long as `self` is borrowed, which no `&mut self` method can
        // overlap.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.words) }
    }

    pub fn words_mut(&mut self) -> &mut [u64] {
        // SAFETY: `words` initialised u64s at `ptr` (the invariant), borrowed
        // exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.words) }
    }

    pub fn bytes(&self) -> usize {
        self.words * 8
    }

    pub fn pages(&self) -> usize {
        self.bytes().div_ceil(PAGE)
    }

    /// The words of page `i` (the last page may be short).
    pub fn page_mut(&mut self, i: usize) -> &mut [u64] {
        let start = i * WORDS_PER_PAGE;
        let end = (start + WORDS_PER_PAGE).min(self.words);
        &mut self.words_mut()[start..end]
    }

    /// The bytes of page `i` (the last page may be short).
    pub fn page_bytes_mut(&mut self, i: usize) -> &mut [u8] {
        let start = i * PAGE;
        let end = (start + PAGE).min(self.bytes());
        // SAFETY: the allocation holds self.bytes() initialised bytes (the
        // invariant), borrowed exclusively through `&mut self`; any byte
        // value is a valid u64 byte.
        let all =
            unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<u8>(), self.bytes()) };
        &mut all[start..end]
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from glibc's malloc, calloc or posix_memalign (the invariant)
        // and is freed once, here; no borrow of it outlives `self`.
        unsafe { libc::free(self.ptr.as_ptr().cast()) };
    }
}

fn word_count(bytes: usize) -> Result<usize, String> {
    if bytes == 0 {
        return Err("a buffer of 0 bytes".into());
    }
    Ok(bytes.div_ceil(8))
}

/// `mib` MiB (fractional, from a scaled size) as whole pages, at least `min_pages`.
pub fn mib_bytes(mib: f64, min_pages: usize) -> usize {
    let pages = (mib * MIB as f64 / PAGE as f64).round() as usize;
    pages.max(min_pages) * PAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_give_the_content_they_promise() {
        let z = Buffer::calloc(3 * PAGE).unwrap();
        assert!(z.words().iter().all(|&w| w == 0) && z.pages() == 3);
        let m = Buffer::memset_zero(PAGE + 8).unwrap();
        assert!(m.words().iter().all(|&w| w == 0) && m.pages() == 2);
        let g = Buffer::generated(2 * PAGE, &mut Rng::new(1)).unwrap();
        let again = Buffer::generated(2 * PAGE, &mut Rng::new(1)).unwrap();
        assert_eq!(g.words(), again.words());
        let mut c = Buffer::copy_of(&g).unwrap();
        assert_eq!(c.words(), g.words());
        c.page_mut(1)[0] ^= 1;
        c.page_bytes_mut(1)[0] ^= 1;
        assert_eq!(c.words(), g.words());
        c.page_bytes_mut(1)[9] = 0x55;
        assert_ne!(c.words(), g.words());
        c.clear();
        assert!(c.words().iter().all(|&w| w == 0));
    }

    #[test]
    fn sizes_round_to_pages() {
        assert_eq!(mib_bytes(1.0, 1), MIB);
        assert_eq!(mib_bytes(0.0001, 4), 4 * PAGE);
        assert!(Buffer::calloc(0).is_err());
    }
}
