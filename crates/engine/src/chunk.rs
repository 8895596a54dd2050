//! A protected chunk: the one protocol by which the scan (scan.rs) and
//! eviction (evict.rs) work on a run of a block's pages that no writer may
//! change meanwhile. For pages `[i, i+c)` of a block:
//!
//! 1. pages the fault thread restored are reconciled (restore.rs);
//! 2. the work looks first (`ChunkWork::before`) and may find nothing to
//!    do: then the chunk is neither registered nor protected, and no writer
//!    is stopped;
//! 3. this thread's signals are blocked until the end: a signal handler of
//!    this thread writing into the protected chunk would wait for this very
//!    thread;
//! 4. the chunk is registered with userfaultfd, and unregistered at the end
//!    but for its evicted and held pages (`State::with_registered`);
//! 5. the holds in the chunk (hold.rs) are taken for the work to decide on
//!    (the scan), or ended (eviction);
//! 6. the chunk is write-protected: writers sleep in the kernel. Should the
//!    kernel refuse, it may have protected the mappings before the one it
//!    refused: those are unprotected again (or their writers would sleep for
//!    good), the failure is counted and the chunk left;
//! 7. divergence is refreshed (a write may have landed before the protect)
//!    and mincore says which pages hold content;
//! 8. the work runs (`ChunkWork::work`) and names the holds that go on;
//! 9. the rest of the chunk is unprotected, waking its writers, and the
//!    writers of held pages are woken to fault again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::protect::Protector;
use crate::state::State;
use crate::sys::{self, PAGE};

/// What a chunk does with the holds in it as it begins.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkHolds {
    /// The work decides which go on (the scan): they are taken from the
    /// fault thread for the chunk's time.
    Decide,
    /// They end before the chunk is protected (eviction).
    End,
}

/// A chunk while it is protected, as its work sees it.
pub(crate) struct Protected {
    pub protector: Arc<Protector>,
    /// mincore's answer per page of the chunk (bit 0: holds content); None
    /// if mincore failed.
    pub resident: Option<Vec<u8>>,
    /// The chunk's holds still unbroken as it began, with when they began
    /// (empty with `ChunkHolds::End`).
    pub held: HashMap<usize, Instant>,
    /// Frames released by the divergence refresh under protection.
    pub diverged_released: u64,
}

/// The work done on a protected chunk.
pub(crate) trait ChunkWork {
    const HOLDS: ChunkHolds;

    /// Before the chunk is registered and protected: false if there is
    /// nothing to do (no writer is stopped then).
    fn before(&mut self, _st: &mut State, _base: usize, _i: usize, _c: usize) -> bool {
        true
    }

    /// The work proper, on pages `[i, i+c)` of block `base`; returns the
    /// holds that go on after the chunk (address, start of the hold).
    fn work(
        &mut self,
        st: &mut State,
        base: usize,
        i: usize,
        c: usize,
        chunk: &Protected,
    ) -> Vec<(usize, Instant)>;
}

impl State {
    /// Runs `w` on pages `[i, i+c)` of block `base` under the protocol in
    /// the module comment.
    pub(crate) fn in_protected_chunk<W: ChunkWork>(
        &mut self,
        base: usize,
        i: usize,
        c: usize,
        w: &mut W,
    ) {
        self.reconcile(base, i, c);
        if !w.before(self, base, i, c) {
            return;
        }
        let mask = sys::block_signals();
        self.with_registered(base, i, c, |st| st.protected(base, i, c, w));
        sys::restore_signals(&mask);
    }

    /// Steps 5-9 of the protocol, the chunk registered.
    fn protected<W: ChunkWork>(&mut self, base: usize, i: usize, c: usize, w: &mut W) {
        let addr = self.blocks[&base].page_addr(i);
        let Some(protector) = self.protector.clone() else {
            return;
        };
        let held = match W::HOLDS {
            ChunkHolds::Decide => self.begin_chunk_holds(addr as usize, c * PAGE),
            ChunkHolds::End => {
                self.drop_holds(addr as usize, c * PAGE);
                HashMap::new()
            }
        };
        if protector.protect(addr, c * PAGE).is_err() {
            self.end_chunk_holds(addr as usize, c * PAGE, &[]);
            let _ = protector.unprotect(addr, c * PAGE);
            self.stats.fallbacks.uffd += 1;
            return;
        }
        crate::race::pause();
        let diverged_released = self.refresh_divergence(base, i, c);
        let mut resident = vec![0u8; c];
        let resident = sys::mincore(addr, c * PAGE, &mut resident)
            .is_ok()
            .then_some(resident);
        let chunk = Protected {
            protector,
            resident,
            held,
            diverged_released,
        };
        let keep = w.work(self, base, i, c, &chunk);
        self.end_chunk_holds(addr as usize, c * PAGE, &keep);
        self.unprotect_unheld(&chunk.protector, addr as usize, c * PAGE);
    }
}
