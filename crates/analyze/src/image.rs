//! The in-memory form of everything the analyses look at: an [`Image`] is a
//! list of 4 KiB pages, each with where it came from (which input, which
//! mapping, which virtual address or file offset, which permissions) and,
//! when two snapshots were taken, how it behaved between them.
//!
//! Readers (see `read`) fill it; analyses only read it. The page bytes stay
//! where the reader put them: a raw image or a core file is memory-mapped
//! (no copy, so a 10 GiB image costs page cache, not heap), a live process is
//! read into one heap buffer. The analyses address pages by a dense index
//! `0..pages()`, which is also the order the sequential analyses (similarity
//! index, KSM trees) walk them in: input by input, address by address, the
//! order a scanner walking the address space would see.

use serde::Serialize;

/// The page size every analysis uses (x86-64 base page).
pub const PAGE: usize = 4096;

/// What a mapping holds, from /proc/PID/maps (or a core's NT_FILE note).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Anonymous memory (private or shared), including memfd and SysV shm.
    Anon,
    /// A mapped file.
    File,
    /// The process heap ([heap]).
    Heap,
    /// A thread stack ([stack]).
    Stack,
    /// Anything else with a name the kernel gives ([vdso], ...).
    Other,
    /// A raw image: no mapping information.
    Image,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Anon => "anon",
            Kind::File => "file",
            Kind::Heap => "heap",
            Kind::Stack => "stack",
            Kind::Other => "other",
            Kind::Image => "image",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "anon" | "anonymous" => Kind::Anon,
            "file" => Kind::File,
            "heap" => Kind::Heap,
            "stack" => Kind::Stack,
            "other" => Kind::Other,
            _ => return None,
        })
    }
}

/// Mapping permissions as /proc/PID/maps prints them ("rw-p").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Perms {
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    pub shared: bool,
}

impl Perms {
    pub fn parse(s: &str) -> Perms {
        let b = s.as_bytes();
        Perms {
            read: b.first() == Some(&b'r'),
            write: b.get(1) == Some(&b'w'),
            exec: b.get(2) == Some(&b'x'),
            shared: b.get(3) == Some(&b's'),
        }
    }

    pub fn label(self) -> String {
        let mut s = String::with_capacity(4);
        s.push(if self.read { 'r' } else { '-' });
        s.push(if self.write { 'w' } else { '-' });
        s.push(if self.exec { 'x' } else { '-' });
        s.push(if self.shared { 's' } else { 'p' });
        s
    }
}

impl Serialize for Perms {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.label())
    }
}

/// How a page behaved between two snapshots of its process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// Same bytes at the same address in both snapshots.
    Unchanged,
    /// Present in both, bytes differ.
    Changed,
    /// Present only in the second snapshot.
    New,
}

impl Change {
    pub fn name(self) -> &'static str {
        match self {
            Change::Unchanged => "unchanged",
            Change::Changed => "changed",
            Change::New => "new",
        }
    }
}

/// A run of pages with one origin: consecutive addresses of one mapping of
/// one input.
#[derive(Debug, Clone)]
pub struct Region {
    /// Index into [`Image::inputs`].
    pub input: usize,
    /// Virtual address of the first page (file offset for raw images).
    pub addr: u64,
    /// First page of the run in the image's dense page index.
    pub first_page: usize,
    pub pages: usize,
    pub kind: Kind,
    pub perms: Perms,
    /// Mapped file or kernel name ("[heap]"), if any.
    pub name: Option<String>,
}

/// One input (process, image or core file) as it was read.
#[derive(Debug, Clone, Serialize)]
pub struct InputInfo {
    /// "pid 1234 (python3)", a file path.
    pub name: String,
    /// "pid", "image", "core".
    pub source: &'static str,
    pub pages: usize,
    /// Mappings (or segments) that contributed pages.
    pub mappings: usize,
    /// Pages skipped because the reader found them unpopulated (pagemap).
    pub unpopulated_pages: u64,
    /// Pages that vanished while being read (a mapping went away).
    pub vanished_pages: u64,
    /// Bytes of a core segment that did not fill a whole page.
    pub partial_bytes: u64,
    pub read_seconds: f64,
    /// Set when two snapshots were taken (the image holds the second).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotInfo>,
}

/// What a second snapshot of a live process adds to an input's description
/// (see `read::live::read_snapshots`).
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    pub interval_seconds: f64,
    /// Pages populated in the first snapshot and not in the second.
    pub gone_pages: u64,
    /// Of those, per permission label.
    pub gone_by_perms: Vec<(String, u64)>,
}

/// Backing store of page bytes.
pub enum Buffer {
    Heap(Vec<u8>),
    Map(memmap2::Mmap),
}

impl std::ops::Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Buffer::Heap(v) => v,
            Buffer::Map(m) => m,
        }
    }
}

/// Where one page's bytes are: buffer index and byte offset.
#[derive(Debug, Clone, Copy)]
struct Loc {
    buf: u32,
    off: u64,
}

/// The pages of all inputs, in walk order.
#[derive(Default)]
pub struct Image {
    pub inputs: Vec<InputInfo>,
    pub regions: Vec<Region>,
    buffers: Vec<Buffer>,
    locs: Vec<Loc>,
    /// Region index of every page.
    region_of: Vec<u32>,
    /// Physical frame number of every page when the reader could see it
    /// (live process as root); 0 = unknown.
    pub frames: Vec<u64>,
    /// Behaviour between two snapshots, when they were taken.
    pub changes: Option<Vec<Change>>,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image")
            .field("inputs", &self.inputs)
            .field("regions", &self.regions.len())
            .field("pages", &self.pages())
            .finish()
    }
}

impl Image {
    pub fn new() -> Image {
        Image::default()
    }

    /// Pages held in memory as one region at address 0 (generated images,
    /// tests, benchmarks). No input is recorded; callers that report add one.
    pub fn in_memory(data: Vec<u8>) -> Image {
        let pages = data.len() / PAGE;
        let mut img = Image::new();
        let b = img.add_buffer(Buffer::Heap(data));
        let region = Region {
            input: 0,
            addr: 0,
            first_page: 0,
            pages: 0,
            kind: Kind::Image,
            perms: Perms::default(),
            name: None,
        };
        img.push_region(region, b, 0, pages, None);
        img
    }

    pub fn pages(&self) -> usize {
        self.locs.len()
    }

    pub fn bytes(&self) -> u64 {
        (self.locs.len() * PAGE) as u64
    }

    /// The bytes of page `i`.
    #[inline]
    pub fn page(&self, i: usize) -> &[u8] {
        let l = self.locs[i];
        let off = l.off as usize;
        &self.buffers[l.buf as usize][off..off + PAGE]
    }

    pub fn region(&self, page: usize) -> &Region {
        &self.regions[self.region_of[page] as usize]
    }

    pub fn input_of(&self, page: usize) -> usize {
        self.region(page).input
    }

    /// Virtual address (or file offset) of page `i`.
    pub fn addr(&self, page: usize) -> u64 {
        let r = self.region(page);
        r.addr + ((page - r.first_page) * PAGE) as u64
    }

    /// Adds a buffer and returns its index for [`Image::push_region`].
    pub fn add_buffer(&mut self, b: Buffer) -> u32 {
        self.buffers.push(b);
        (self.buffers.len() - 1) as u32
    }

    /// Appends `pages` pages that sit contiguously in buffer `buf` from byte
    /// `off` on. `region.first_page` and `region.pages` are filled in here.
    pub fn push_region(
        &mut self,
        mut region: Region,
        buf: u32,
        off: u64,
        pages: usize,
        frames: Option<&[u64]>,
    ) {
        if pages == 0 {
            return;
        }
        let len = self.buffers[buf as usize].len() as u64;
        assert!(
            off + (pages * PAGE) as u64 <= len,
            "region outside its buffer"
        );
        region.first_page = self.locs.len();
        region.pages = pages;
        let ri = self.regions.len() as u32;
        self.regions.push(region);
        for p in 0..pages {
            self.locs.push(Loc {
                buf,
                off: off + (p * PAGE) as u64,
            });
            self.region_of.push(ri);
        }
        match frames {
            Some(f) => self.frames.extend_from_slice(&f[..pages]),
            None => self.frames.extend(std::iter::repeat_n(0, pages)),
        }
    }

    /// Appends every page of `other` (another input) to this image.
    pub fn append(&mut self, other: Image) {
        let input_base = self.inputs.len();
        let buf_base = self.buffers.len() as u32;
        let region_base = self.regions.len() as u32;
        let page_base = self.locs.len();
        self.inputs.extend(other.inputs);
        self.buffers.extend(other.buffers);
        for mut r in other.regions {
            r.input += input_base;
            r.first_page += page_base;
            self.regions.push(r);
        }
        self.locs.extend(other.locs.into_iter().map(|l| Loc {
            buf: l.buf + buf_base,
            off: l.off,
        }));
        self.region_of
            .extend(other.region_of.into_iter().map(|r| r + region_base));
        self.frames.extend(other.frames);
        match (&mut self.changes, other.changes) {
            (Some(mine), Some(theirs)) => mine.extend(theirs),
            (Some(mine), None) => mine.extend(std::iter::repeat_n(
                Change::New,
                self.locs.len() - mine.len(),
            )),
            (None, Some(theirs)) => {
                let mut v = vec![Change::New; page_base];
                v.extend(theirs);
                self.changes = Some(v);
            }
            (None, None) => {}
        }
    }

    /// All page bytes of the image, concatenated in page order, starting at
    /// page `from` and holding at most `max_bytes` (whole pages).
    pub fn concat(&self, from: usize, max_bytes: usize) -> Vec<u8> {
        let n = (max_bytes / PAGE).min(self.pages().saturating_sub(from));
        let mut v = Vec::with_capacity(n * PAGE);
        for i in from..from + n {
            v.extend_from_slice(self.page(i));
        }
        v
    }
}

/// True when every byte of `page` is zero. Word-wise with an early exit on
/// the first non-zero word, so a typical non-zero page costs a few loads.
#[inline]
pub fn is_zero(page: &[u8]) -> bool {
    // SAFETY: every bit pattern is a valid u64, and align_to returns the
    // middle part only where it is aligned for u64.
    let (head, words, tail) = unsafe { page.align_to::<u64>() };
    if head.iter().any(|&b| b != 0) || tail.iter().any(|&b| b != 0) {
        return false;
    }
    if let Some(&w) = words.first() {
        if w != 0 {
            return false;
        }
    }
    // 8 words at a time so the compiler can vectorise the OR.
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        if (c[0] | c[1] | c[2] | c[3] | c[4] | c[5] | c[6] | c[7]) != 0 {
            return false;
        }
    }
    chunks.remainder().iter().all(|&w| w == 0)
}

/// Compares two equal-length byte strings like memcmp and also returns how
/// many bytes had to be examined (position of the first difference + 1, or
/// the length when equal): the cost model of a KSM tree walk.
#[inline]
pub fn memcmp_counted(a: &[u8], b: &[u8]) -> (std::cmp::Ordering, usize) {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_le_bytes(a[i..i + 8].try_into().unwrap());
        let y = u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if x != y {
            let j = i + ((x ^ y).trailing_zeros() / 8) as usize;
            return (a[j].cmp(&b[j]), j + 1);
        }
        i += 8;
    }
    while i < n {
        if a[i] != b[i] {
            return (a[i].cmp(&b[i]), i + 1);
        }
        i += 1;
    }
    (a.len().cmp(&b.len()), n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_check() {
        let mut p = vec![0u8; PAGE];
        assert!(is_zero(&p));
        p[4095] = 1;
        assert!(!is_zero(&p));
        p[4095] = 0;
        p[0] = 1;
        assert!(!is_zero(&p));
    }

    #[test]
    fn counted_memcmp() {
        let a = vec![0u8; 64];
        let mut b = a.clone();
        assert_eq!(memcmp_counted(&a, &b), (std::cmp::Ordering::Equal, 64));
        b[13] = 5;
        assert_eq!(memcmp_counted(&a, &b), (std::cmp::Ordering::Less, 14));
        assert_eq!(memcmp_counted(&b, &a), (std::cmp::Ordering::Greater, 14));
    }

    #[test]
    fn perms_round_trip() {
        assert_eq!(Perms::parse("rw-p").label(), "rw-p");
        assert_eq!(Perms::parse("r-xs").label(), "r-xs");
    }
}
