//! The frame pool: physical pages emulated by page-sized slots of a memfd.
//!
//! A frame counts two things. Its *references* are the pages whose content
//! it holds (owned or shared pages): at zero it is punched out, so it costs no
//! memory. Its *mappings* also count diverged pages, which hold their own copy
//! but whose mapping still points at the frame: were the slot reused, a
//! program's MADV_DONTNEED on such a page would reveal another block's data
//! (a private file mapping reverts to the file). So a slot is reused only when
//! both counts are zero; until then it is a hole, which reads as zero. Runs of frames are handed out best-fit from a set
//! of free extents, so a fresh block maps one contiguous run: one mapping.
//!
//! After fork both processes map the same memfd, so neither may punch or
//! reuse a frame from before the fork: the pool is *retired* (kept for reading
//! and mapping its frozen frames, references still counted) and a fresh pool
//! takes new allocations. A retired pool whose last reference is gone is
//! *closed*: its descriptor and window go, and the kernel frees the memfd once
//! no process maps it. Frame ids carry their pool's number in the high bits.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use crate::fds::{self, Fd};
use crate::sys::{self, PAGE};

/// Frames per pool: the memfd's size, reserved up front (sparse, free).
const POOL_FRAMES: u64 = 1 << 26; // 256 GiB
const POOL_SHIFT: u32 = 40;
const FROZEN: u8 = 1;
const INDEXED: u8 = 2;

/// A frame: pool number and slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub u64);

impl FrameId {
    pub fn new(pool: usize, slot: u64) -> FrameId {
        FrameId(((pool as u64) << POOL_SHIFT) | slot)
    }
    pub fn pool(self) -> usize {
        (self.0 >> POOL_SHIFT) as usize
    }
    pub fn slot(self) -> u64 {
        self.0 & ((1 << POOL_SHIFT) - 1)
    }
    /// The frame `n` slots further in the same pool.
    pub fn offset(self, n: u64) -> FrameId {
        FrameId(self.0 + n)
    }
}

/// Free slot extents, indexed by start (to coalesce) and by size (best fit).
#[derive(Default)]
struct FreeExtents {
    by_start: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
}

impl FreeExtents {
    fn take(&mut self, n: u64) -> Option<u64> {
        let &(len, start) = self.by_size.range((n, 0)..).next()?;
        self.remove(start, len);
        if len > n {
            self.insert_raw(start + n, len - n);
        }
        Some(start)
    }

    fn remove(&mut self, start: u64, len: u64) {
        self.by_start.remove(&start);
        self.by_size.remove(&(len, start));
    }

    fn insert_raw(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_size.insert((len, start));
    }

    /// Returns `[start, start+len)`, merged with free neighbours.
    fn give(&mut self, mut start: u64, mut len: u64) {
        if let Some((&s, &l)) = self.by_start.range(..start).next_back() {
            if s + l == start {
                self.remove(s, l);
                start = s;
                len += l;
            }
        }
        if let Some(&l) = self.by_start.get(&(start + len)) {
            self.remove(start + len, l);
            len += l;
        }
        self.insert_raw(start, len);
    }

    fn bytes(&self) -> usize {
        self.by_start.len() * 64
    }
}

/// One memfd and the bookkeeping of its slots.
pub struct Pool {
    /// The memfd, adopted (crate::fds): its number is out of the program's way.
    pub fd: Fd,
    /// A read-only view of the whole memfd, for comparing frame contents.
    window: *mut u8,
    refs: Vec<u32>,
    maps: Vec<u32>,
    /// Per slot: FROZEN (mapped privately somewhere: immutable while
    /// referenced) and INDEXED (a scan has checked and hashed it: as it cannot
    /// change, later scans skip it).
    flags: Vec<u8>,
    free: FreeExtents,
    /// Slots at and above this were never handed out.
    next: u64,
    /// References over all slots.
    live: u64,
    pub retired: bool,
    /// Retired and unreferenced: descriptor and window released.
    pub closed: bool,
}

// SAFETY: the raw window pointer is a mapping owned by this Pool alone (unmapped only in
// close_if_idle/Drop of this Pool); nothing in it is tied to the thread that created it, and
// all access goes through the engine lock.
unsafe impl Send for Pool {}

impl Pool {
    pub fn create() -> io::Result<Pool> {
        let fd = fds::adopt(sys::memfd_create(c"pagefold")?)?;
        let setup = || -> io::Result<*mut u8> {
            fd.with(|n| {
                sys::ftruncate(n, POOL_FRAMES * PAGE as u64)?;
                sys::map_window(n, (POOL_FRAMES as usize) * PAGE)
            })
        };
        match setup() {
            Ok(window) => Ok(Pool {
                fd,
                window,
                refs: Vec::new(),
                maps: Vec::new(),
                flags: Vec::new(),
                free: FreeExtents::default(),
                next: 0,
                live: 0,
                retired: false,
                closed: false,
            }),
            Err(e) => {
                fd.close();
                Err(e)
            }
        }
    }

    /// A run of `n` fresh (zero, unreferenced) slots.
    pub fn alloc(&mut self, n: u64) -> Option<u64> {
        if self.retired {
            return None;
        }
        if let Some(s) = self.free.take(n) {
            return Some(s);
        }
        if self.next + n > POOL_FRAMES {
            return None;
        }
        let s = self.next;
        self.next += n;
        self.refs.resize(self.next as usize, 0);
        self.maps.resize(self.next as usize, 0);
        self.flags.resize(self.next as usize, 0);
        Some(s)
    }

    /// Returns never-mapped slots (an allocation that failed later). They
    /// may hold data (a pwrite before a failed mmap): punched first.
    pub fn abandon(&mut self, slot: u64, n: u64) {
        if self.punch(slot, n).is_ok() {
            self.free.give(slot, n);
        }
    }

    /// A page now maps the slot and holds its content.
    pub fn map(&mut self, slot: u64) {
        self.refs[slot as usize] += 1;
        self.maps[slot as usize] += 1;
        self.live += 1;
    }

    /// A patch depends on the slot's content (patching.rs): one reference
    /// more, no mapping, so the frame is neither punched nor reused while
    /// the patch lives, whatever happens to the pages that map it.
    pub fn pin(&mut self, slot: u64) {
        self.refs[slot as usize] += 1;
        self.live += 1;
    }

    /// A patch stopped depending on the slot. Returns (punch, reuse) as `unmap` does.
    pub fn unpin(&mut self, slot: u64) -> (bool, bool) {
        let punch = self.drop_ref(slot);
        (punch, punch && self.maps(slot) == 0)
    }

    /// A page mapping the slot wrote its own copy: one reference fewer.
    /// True if the slot's content is no longer needed (punch it).
    pub fn diverge(&mut self, slot: u64) -> bool {
        self.drop_ref(slot)
    }

    fn drop_ref(&mut self, slot: u64) -> bool {
        // A closed pool keeps no counts (diverged pages may still map it).
        let Some(r) = self.refs.get_mut(slot as usize) else {
            return false;
        };
        debug_assert!(*r > 0, "frame {slot} over-released");
        if *r == 0 {
            return false;
        }
        *r -= 1;
        self.live -= 1;
        if *r == 0 {
            self.flags[slot as usize] = 0;
            return !self.retired;
        }
        false
    }

    /// A page stopped mapping the slot (`content`: it held the frame's
    /// content, i.e. had not diverged). Returns (punch, reuse): the content
    /// is no longer needed / nothing maps the slot any more. Never either in
    /// a retired pool: the other process may still map it.
    pub fn unmap(&mut self, slot: u64, content: bool) -> (bool, bool) {
        let punch = content && self.drop_ref(slot);
        let Some(m) = self.maps.get_mut(slot as usize) else {
            return (false, false);
        };
        *m = m.saturating_sub(1);
        let reuse = !self.retired && *m == 0 && self.refs[slot as usize] == 0;
        (punch, reuse)
    }

    pub fn live(&self) -> u64 {
        self.live
    }

    /// Releases a retired pool nobody here references any more.
    pub fn close_if_idle(&mut self) {
        if self.retired && self.live == 0 && !self.closed {
            self.closed = true;
            self.unmap_and_close();
        }
    }

    fn unmap_and_close(&mut self) {
        // Blocks still mapping the memfd keep it alive; only our handles go.
        sys::unmap(self.window, POOL_FRAMES as usize * PAGE);
        // closed is set by the callers so this runs once; the blocks that still map the memfd
        // keep their own reference to the file.
        self.fd.close();
        self.refs = Vec::new();
        self.maps = Vec::new();
        self.flags = Vec::new();
        self.free = FreeExtents::default();
    }

    /// Frees the memory of `[slot, slot+n)`; with `reuse`, the slots also go
    /// back to the free extents. A failed punch leaks them rather than hand
    /// out a frame that is not zero.
    pub fn release(&mut self, slot: u64, n: u64, reuse: bool) {
        if self.punch(slot, n).is_ok() && reuse {
            self.free.give(slot, n);
        }
    }

    /// Frees frames `[slot, slot + n)` of the memfd (they read as zero after).
    pub fn punch(&self, slot: u64, n: u64) -> io::Result<()> {
        sys::punch(self.fd, slot, n)
    }

    pub fn refs(&self, slot: u64) -> u32 {
        self.refs.get(slot as usize).copied().unwrap_or(0)
    }

    /// Pages mapping the slot (referencing it or diverged from it).
    pub fn maps(&self, slot: u64) -> u32 {
        self.maps.get(slot as usize).copied().unwrap_or(0)
    }

    pub fn freeze(&mut self, slot: u64) {
        if let Some(f) = self.flags.get_mut(slot as usize) {
            *f |= FROZEN;
        }
    }

    /// Still immutable and in use: a valid merge target. Every referenced
    /// frame of a retired pool is frozen.
    pub fn is_stable(&self, slot: u64) -> bool {
        self.refs(slot) > 0 && (self.retired || self.flag(slot, FROZEN))
    }

    fn flag(&self, slot: u64, bit: u8) -> bool {
        self.flags.get(slot as usize).is_some_and(|f| f & bit != 0)
    }

    /// A stable frame a scan has already checked (zero test and hash).
    pub fn is_indexed(&self, slot: u64) -> bool {
        self.is_stable(slot) && self.flag(slot, INDEXED)
    }

    pub fn set_indexed(&mut self, slot: u64) {
        if let Some(f) = self.flags.get_mut(slot as usize) {
            *f |= INDEXED;
        }
    }

    pub fn frame_ptr(&self, slot: u64) -> *const u8 {
        // SAFETY: window maps all POOL_FRAMES frames and callers pass a slot below POOL_FRAMES,
        // so the offset stays inside that mapping.
        unsafe { self.window.add(slot as usize * PAGE) }
    }

    /// True if the slot's content is in memory (reading it allocates nothing).
    pub fn resident(&self, slot: u64) -> bool {
        let mut v = [0u8; 1];
        sys::mincore(self.frame_ptr(slot) as *mut u8, PAGE, &mut v).is_ok() && v[0] & 1 != 0
    }

    pub fn in_use(&self) -> u64 {
        self.refs.iter().filter(|&&r| r > 0).count() as u64
    }

    /// Resident frames, counted by the kernel (st_blocks of the memfd).
    pub fn resident_frames(&self) -> u64 {
        if self.closed {
            return 0;
        }
        let Ok(st) = self.fd.stat() else { return 0 };
        st.st_blocks as u64 * 512 / PAGE as u64
    }

    pub fn metadata_bytes(&self) -> usize {
        (self.refs.capacity() + self.maps.capacity()) * 4
            + self.flags.capacity()
            + self.free.bytes()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if !self.closed {
            self.unmap_and_close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_are_the_frames_never_written_or_punched() {
        let pool = Pool::create().expect("a memfd pool");
        let page = vec![7u8; PAGE];
        for slot in [2u64, 3, 4, 9, 15] {
            sys::pwrite_all(pool.fd, page.as_ptr(), PAGE, slot * PAGE as u64).expect("pwrite");
        }
        pool.punch(3, 1).expect("punch");
        let want: Vec<bool> = (0..20).map(|s| ![2, 4, 9, 15].contains(&s)).collect();
        assert_eq!(sys::holes(pool.fd, 0, 20), want);
        assert_eq!(sys::holes(pool.fd, 4, 6), want[4..10]);
        assert_eq!(sys::holes(pool.fd, 16, 30), vec![true; 30], "past the end");
        assert!((0..20).all(|s| sys::is_hole(pool.fd, s) == want[s as usize]));
    }
}
