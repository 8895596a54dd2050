//! Blocks (the engine's virtual regions) and the state of each of their pages.
//!
//! A page's state says where its content is and how it is mapped; runs of
//! neighbouring pages with the same kind of mapping over consecutive frames
//! are one kernel mapping (VMA), which is what the VMA budget counts.

use crate::frames::FrameId;
use crate::PAGE;

/// Where a page's content lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    /// Anonymous memory; the zero page until written.
    Anon,
    /// Its own frame, mapped shared: writes go to the frame.
    Owned(FrameId),
    /// A frozen frame mapped private; a write makes the kernel copy it.
    Shared(FrameId),
    /// Mapped private at this frame but holding its own copy: the frame is no longer referenced.
    Diverged(FrameId),
}

/// How a page is mapped, as far as merging neighbouring VMAs is concerned.
#[derive(PartialEq, Eq)]
enum MapKind {
    Anon,
    SharedFile(FrameId),
    PrivateFile(FrameId),
}

impl Page {
    pub fn frame(self) -> Option<FrameId> {
        match self {
            Page::Owned(f) | Page::Shared(f) => Some(f),
            _ => None,
        }
    }

    fn map_kind(self) -> MapKind {
        match self {
            Page::Anon => MapKind::Anon,
            Page::Owned(f) => MapKind::SharedFile(f),
            Page::Shared(f) | Page::Diverged(f) => MapKind::PrivateFile(f),
        }
    }
}

/// True if `b` directly after `a` continues `a`'s mapping.
pub fn continues(a: Page, b: Page) -> bool {
    match (a.map_kind(), b.map_kind()) {
        (MapKind::Anon, MapKind::Anon) => true,
        (MapKind::SharedFile(x), MapKind::SharedFile(y)) | (MapKind::PrivateFile(x), MapKind::PrivateFile(y)) => {
            x.pool() == y.pool() && y.0 == x.0 + 1
        }
        _ => false,
    }
}

/// One allocation.
pub struct Block {
    pub base: *mut u8,
    pub pages: Vec<Page>,
    /// Mappings this block uses now.
    pub vmas: usize,
    /// Per page, what the last scan saw (`Seen`): a page is folded or
    /// merged only if it looked the same to the scan before, as kernel KSM
    /// keeps volatile pages out of its unstable tree. Its top bits hold
    /// how often the scan looks at the page (idle.rs).
    pub seen: Vec<u32>,
    /// The program changed the block's protection or per-mapping advice: the
    /// engine no longer scans, remaps or shares it (see advice.rs).
    pub exempt: bool,
}

unsafe impl Send for Block {}

impl Block {
    pub fn new(base: *mut u8, pages: Vec<Page>) -> Block {
        let seen = vec![0; pages.len()];
        let mut b = Block { base, pages, vmas: 0, seen, exempt: false };
        b.vmas = b.count_vmas();
        b
    }

    pub fn len(&self) -> usize {
        self.pages.len() * PAGE
    }

    pub fn page_addr(&self, i: usize) -> *mut u8 {
        unsafe { self.base.add(i * PAGE) }
    }

    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let b = self.base as usize;
        addr >= b && addr + len <= b + self.len()
    }

    pub fn count_vmas(&self) -> usize {
        1 + self.pages.windows(2).filter(|w| !continues(w[0], w[1])).count()
    }

    /// Mapping boundaries around pages `[i, i+n)`, neighbours included: the
    /// part of the VMA count a remap of that range can change.
    pub fn boundaries(&self, i: usize, n: usize) -> usize {
        let lo = i.max(1);
        let hi = (i + n + 1).min(self.pages.len());
        (lo..hi).filter(|&k| !continues(self.pages[k - 1], self.pages[k])).count()
    }

    /// Mappings that remapping pages `[i, i+n)` as one new run can add: the
    /// run itself plus splitting its neighbours off.
    pub fn remap_cost(&self, i: usize, n: usize) -> usize {
        let inside_left = i > 0;
        let inside_right = i + n < self.pages.len();
        1 + inside_left as usize + inside_right as usize
    }

    pub fn metadata_bytes(&self) -> usize {
        std::mem::size_of::<Block>() + self.pages.capacity() * std::mem::size_of::<Page>() + self.seen.capacity() * 4
    }
}

/// Maximal runs `[start, end)` within `range` where `want(page)` holds and
/// consecutive pages keep consecutive frames (`key` gives the frame to follow).
pub fn runs<F>(range: std::ops::Range<usize>, key: F) -> Vec<(usize, usize)>
where
    F: Fn(usize) -> Option<FrameId>,
{
    let mut out = Vec::new();
    let mut i = range.start;
    while i < range.end {
        let Some(f) = key(i) else {
            i += 1;
            continue;
        };
        let mut j = i + 1;
        while j < range.end && key(j).is_some_and(|g| g.pool() == f.pool() && g.0 == f.0 + (j - i) as u64) {
            j += 1;
        }
        out.push((i, j));
        i = j;
    }
    out
}
