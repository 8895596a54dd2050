//! Blocks (the engine's virtual regions) and the state of each of their pages.
//!
//! A page's state says where its content is and how it is mapped; runs of
//! neighbouring pages with the same kind of mapping over consecutive frames
//! are one kernel mapping (VMA), which is what the VMA budget counts.

use crate::frames::FrameId;
use crate::sys::PAGE;

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
    /// Evicted (evict.rs): the content is in the page store, the memory is
    /// free, the range is registered for MISSING faults. The fault thread may
    /// have restored it already; the engine learns that when it reconciles.
    Evicted(Restores),
}

/// What an evicted page is once restored; it stays mapped as that meanwhile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restores {
    Anon,
    /// Its own frame, mapped shared and punched; restored into the frame.
    Owned(FrameId),
    /// Mapped private at a frame no other page maps (a hole); restored as
    /// the page's own anonymous copy.
    Diverged(FrameId),
}

impl Restores {
    pub fn page(self) -> Page {
        match self {
            Restores::Anon => Page::Anon,
            Restores::Owned(f) => Page::Owned(f),
            Restores::Diverged(f) => Page::Diverged(f),
        }
    }
}

/// How a page is mapped, as far as merging neighbouring VMAs is concerned
/// (the bool: registered for MISSING faults, which splits a VMA too).
#[derive(PartialEq, Eq)]
enum MapKind {
    Anon(bool),
    SharedFile(FrameId, bool),
    PrivateFile(FrameId, bool),
}

impl Page {
    pub fn frame(self) -> Option<FrameId> {
        match self {
            Page::Owned(f) | Page::Shared(f) => Some(f),
            _ => None,
        }
    }

    pub fn is_evicted(self) -> bool {
        matches!(self, Page::Evicted(_))
    }

    fn map_kind(self) -> MapKind {
        match self {
            Page::Anon => MapKind::Anon(false),
            Page::Owned(f) => MapKind::SharedFile(f, false),
            Page::Shared(f) | Page::Diverged(f) => MapKind::PrivateFile(f, false),
            Page::Evicted(Restores::Anon) => MapKind::Anon(true),
            Page::Evicted(Restores::Owned(f)) => MapKind::SharedFile(f, true),
            Page::Evicted(Restores::Diverged(f)) => MapKind::PrivateFile(f, true),
        }
    }
}

/// True if `b` directly after `a` continues `a`'s mapping.
pub fn continues(a: Page, b: Page) -> bool {
    match (a.map_kind(), b.map_kind()) {
        (MapKind::Anon(x), MapKind::Anon(y)) => x == y,
        (MapKind::SharedFile(x, xa), MapKind::SharedFile(y, ya))
        | (MapKind::PrivateFile(x, xa), MapKind::PrivateFile(y, ya)) => {
            xa == ya && x.pool() == y.pool() && y.0 == x.0 + 1
        }
        _ => false,
    }
}

/// Most copies a block remembers having shared its frames into (`Block::copies_out`).
const COPIES_REMEMBERED: usize = 8;

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
    /// Pages in state `Evicted` (a quick "nothing to reconcile" test).
    pub evicted: usize,
    /// Pages a copy shared into this block and not yet found written (fresh.rs learns from them).
    pub copy_shared: usize,
    /// When a copy last shared pages into this block (fresh.rs learns
    /// from copies freed young).
    pub shared_at: Option<std::time::Instant>,
    /// The size class (pages) of the block that copy came from, if the copy
    /// counted it as copied from: the count is taken back if the copy dies
    /// young (fresh.rs, `uncopied`).
    pub copied_from_class: Option<usize>,
    /// Blocks a copy shared this block's frames into (a few, most recent
    /// last): when this block is freed, their divergence is read at once.
    pub copies_out: Vec<usize>,
    /// Pages whose merge the mapping budget refused since the last look at
    /// handing the block to kernel KSM (ksm.rs).
    pub merges_refused: usize,
    /// What recent scans found in the block: whether it is sampled (sample.rs).
    pub found: crate::sample::Yield,
}

// SAFETY: base is the start of a mapping the engine made and owns; the Block only stores the
// address, and every access through it is made under the engine lock, so moving a Block to
// another thread is sound.
unsafe impl Send for Block {}

impl Block {
    pub fn new(base: *mut u8, pages: Vec<Page>) -> Block {
        let seen = vec![0; pages.len()];
        let evicted = pages.iter().filter(|p| p.is_evicted()).count();
        let mut b = Block {
            base,
            pages,
            vmas: 0,
            seen,
            exempt: false,
            evicted,
            copy_shared: 0,
            shared_at: None,
            copied_from_class: None,
            copies_out: Vec::new(),
            merges_refused: 0,
            found: Default::default(),
        };
        b.vmas = b.count_vmas();
        b
    }

    /// Sets page `k`'s state, keeping the evicted count.
    pub fn set(&mut self, k: usize, page: Page) {
        self.evicted =
            self.evicted + page.is_evicted() as usize - self.pages[k].is_evicted() as usize;
        self.pages[k] = page;
    }

    /// A copy out of this block shared its frames into the block at `dst`.
    pub fn note_copy_out(&mut self, dst: usize) {
        self.copies_out.retain(|&d| d != dst);
        if self.copies_out.len() == COPIES_REMEMBERED {
            self.copies_out.remove(0);
        }
        self.copies_out.push(dst);
    }

    /// Cuts the pages from `k` on off the block; returns them.
    pub fn cut(&mut self, k: usize) -> Vec<Page> {
        let tail = self.pages.split_off(k);
        self.seen.truncate(k);
        self.evicted -= tail.iter().filter(|p| p.is_evicted()).count();
        tail
    }

    pub fn len(&self) -> usize {
        self.pages.len() * PAGE
    }

    pub fn page_addr(&self, i: usize) -> *mut u8 {
        // SAFETY: callers pass i at most the block's page count, so base + i * PAGE stays
        // inside (or one past the end of) the block's mapping.
        unsafe { self.base.add(i * PAGE) }
    }

    pub fn contains(&self, addr: usize, len: usize) -> bool {
        let b = self.base as usize;
        addr >= b && addr + len <= b + self.len()
    }

    pub fn count_vmas(&self) -> usize {
        1 + self
            .pages
            .windows(2)
            .filter(|w| !continues(w[0], w[1]))
            .count()
    }

    /// Mapping boundaries around pages `[i, i+n)`, neighbours included: the
    /// part of the VMA count a remap of that range can change.
    pub fn boundaries(&self, i: usize, n: usize) -> usize {
        let lo = i.max(1);
        let hi = (i + n + 1).min(self.pages.len());
        (lo..hi)
            .filter(|&k| !continues(self.pages[k - 1], self.pages[k]))
            .count()
    }

    /// Mappings that remapping pages `[i, i+n)` as one new run can add: the
    /// run itself plus splitting its neighbours off.
    pub fn remap_cost(&self, i: usize, n: usize) -> usize {
        let inside_left = i > 0;
        let inside_right = i + n < self.pages.len();
        1 + inside_left as usize + inside_right as usize
    }

    pub fn metadata_bytes(&self) -> usize {
        std::mem::size_of::<Block>()
            + self.pages.capacity() * std::mem::size_of::<Page>()
            + self.seen.capacity() * 4
    }
}

/// Runs `[start, end)` of consecutive numbers in a sorted list.
pub fn consecutive(sorted: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &k in sorted {
        match out.last_mut() {
            Some((_, e)) if *e == k => *e += 1,
            _ => out.push((k, k + 1)),
        }
    }
    out
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
        while j < range.end
            && key(j).is_some_and(|g| g.pool() == f.pool() && g.0 == f.0 + (j - i) as u64)
        {
            j += 1;
        }
        out.push((i, j));
        i = j;
    }
    out
}

/// Maximal runs `[start, end)` within `range` where `want(page)` holds.
pub fn unit_runs<F>(range: std::ops::Range<usize>, want: F) -> Vec<(usize, usize)>
where
    F: Fn(usize) -> Option<()>,
{
    let mut out = Vec::new();
    let mut i = range.start;
    while i < range.end {
        if want(i).is_none() {
            i += 1;
            continue;
        }
        let j = (i + 1..range.end)
            .find(|&j| want(j).is_none())
            .unwrap_or(range.end);
        out.push((i, j));
        i = j;
    }
    out
}
