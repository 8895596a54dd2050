//! Taking a copy's anonymous source onto frames ("adoption").
//!
//! A virtual copy shares frames, and a source page on plain anonymous
//! memory has none to share. So the first copy out of anonymous pages
//! writes them into fresh frames and maps both sides onto those frames: the
//! source through the pin guard (detach.rs), the destination privately.
//! That first copy costs about what a plain one does (one write of the pages,
//! one move of the source's page-table entries, two mappings), the source's
//! anonymous pages are freed, so it already saves the copy's size, and every
//! later copy of the same source only maps frames. Blocks can therefore
//! start on plain anonymous memory (fresh.rs), with the faults, huge pages
//! and zero page the program would have had without the engine, and pay for
//! frames only once they are copied.
//!
//! Correctness. The source's pages are written into the frames inside a
//! protected chunk (chunk.rs): writers sleep from before the write until the
//! source maps the frames, so no write lands in between. The pin guard takes
//! each page off its address with UFFDIO_MOVE, which refuses a page the
//! kernel may have pinned (an O_DIRECT read into it in flight), and compares
//! every page it took with its frame once more; a refused or changed page
//! stays where it is, anonymous, and the source keeps it. The destination
//! maps the frames whatever the source did: they hold the source's bytes as
//! of the copy, which is what the copy must give. Without the pin guard (no
//! UFFDIO_MOVE: Linux before 6.8, or `PAGEFOLD_PIN_GUARD=0`) no source is
//! adopted, and the copy writes through (copy.rs). Pages not in memory
//! (never touched) and all-zero pages are not adopted either: a frame of
//! zeros saves nothing. The caller copies them as it copies every page left
//! over.

use std::time::Instant;

use crate::chunk::{ChunkHolds, ChunkWork, Protected};
use crate::fds::Fd;
use crate::frames::FrameId;
use crate::space::{unit_runs, Page};
use crate::state::State;
use crate::sys::{self, PAGE};

/// The adoption of one run of source pages, chunk by chunk.
struct AdoptChunk {
    /// The run's first page and the frame it goes to; page `k` of the block
    /// goes to `first.offset(k - i0)`.
    i0: usize,
    first: FrameId,
    fd: Fd,
    /// Per page of the run: its content was written into its frame.
    written: Vec<bool>,
    /// Pages the source now maps from their frame.
    adopted: usize,
}

impl ChunkWork for AdoptChunk {
    const HOLDS: ChunkHolds = ChunkHolds::End;

    fn work(
        &mut self,
        st: &mut State,
        base: usize,
        i: usize,
        c: usize,
        chunk: &Protected,
    ) -> Vec<(usize, Instant)> {
        let Some(resident) = &chunk.resident else {
            return Vec::new();
        };
        let block = &st.blocks[&base];
        // A zero page is left alone: the source reads it from the kernel's
        // zero page or will be folded, and a frame of zeros saves nothing.
        let wanted: Vec<bool> = (i..i + c)
            .map(|k| {
                resident[k - i] & 1 != 0
                    && block.pages[k] == Page::Anon
                    && !sys::is_zero(block.page_addr(k))
            })
            .collect();
        for (a, b) in unit_runs(i..i + c, |k| wanted[k - i].then_some(())) {
            let f = self.first.offset((a - self.i0) as u64);
            let addr = st.blocks[&base].page_addr(a);
            // The pages are write-protected: what is written is what the
            // source holds until it maps the frames.
            if sys::pwrite_all(self.fd, addr, (b - a) * PAGE, f.slot() * PAGE as u64).is_err() {
                continue;
            }
            self.written[a - self.i0..b - self.i0].fill(true);
            let (taken, _) = st.merge_anon(base, a, b - a, f);
            self.adopted += taken;
        }
        Vec::new()
    }
}

impl State {
    /// Adopts the anonymous source pages `[si, si+n)` of block `sb` onto
    /// fresh frames (the module comment) and maps the destination pages
    /// `[di, di+n)` of block `db` onto the same frames. Returns, per page,
    /// whether the destination now maps its frame; the caller copies the
    /// others plainly. All false when nothing can be adopted (no pin
    /// guard, no frames).
    pub(crate) fn adopt_source(
        &mut self,
        sb: usize,
        si: usize,
        db: usize,
        di: usize,
        n: usize,
    ) -> Vec<bool> {
        let mut mapped = vec![false; n];
        if !self.pin_guard() {
            return mapped;
        }
        let Some(pi) = self.current_pool() else {
            return mapped;
        };
        let Some(slot) = self.pools[pi].alloc(n as u64) else {
            self.stats.fallbacks.frames += 1;
            return mapped;
        };
        let first = FrameId::new(pi, slot);
        let mut work = AdoptChunk {
            i0: si,
            first,
            fd: self.pools[pi].fd,
            written: vec![false; n],
            adopted: 0,
        };
        let chunk = self.cfg.scan_chunk_pages.max(1);
        for i in (si..si + n).step_by(chunk) {
            self.in_protected_chunk(sb, i, chunk.min(si + n - i), &mut work);
        }
        for (a, b) in unit_runs(0..n, |k| work.written[k].then_some(())) {
            if self.remap(db, di + a, b - a, Some(first.offset(a as u64))) {
                mapped[a..b].fill(true);
            }
        }
        // A frame some page maps is frozen (copies and merges may share it);
        // one nobody maps (not written, or both remaps refused) goes back.
        for k in 0..n as u64 {
            if self.pools[pi].maps(slot + k) > 0 {
                self.pools[pi].freeze(slot + k);
            } else {
                self.pools[pi].abandon(slot + k, 1);
            }
        }
        self.stats.pages_adopted += work.adopted as u64;
        self.stats.pages_shared_by_copy += mapped.iter().filter(|m| **m).count() as u64;
        mapped
    }
}
