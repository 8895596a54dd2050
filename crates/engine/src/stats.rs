//! Counters the engine keeps about itself. Gauges describe the present
//! (frames in use, VMAs, metadata); totals count events since the engine began.

use serde::Serialize;

/// The `"schema"` of a [`Stats`] written as a JSON document of its own (the
/// C API's `pf_stats_json`, the preload's `pagefold_stats_json`).
pub const STATS_SCHEMA: &str = "pagefold-engine-stats/1";

/// Why the engine took a slower or plainer path than it wanted.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Fallbacks {
    /// memfd_create failed: blocks are plain anonymous memory.
    pub memfd: u64,
    /// An mmap failed: a block became plain memory or a copy became a plain copy.
    pub mmap: u64,
    /// The VMA budget was exhausted: a copy was done plainly or a merge skipped.
    pub vma_budget: u64,
    /// userfaultfd unavailable: a scan skipped work that needs write protection.
    pub uffd: u64,
    /// The frame pool could not grow.
    pub frames: u64,
    /// An eviction was refused: no userfaultfd MISSING mode, or no fault thread.
    pub evict: u64,
    /// The kernel cannot move pages (UFFDIO_MOVE, Linux 6.8): scans fold
    /// and merge behind the pin grace instead of the pin guard.
    pub pin_guard: u64,
    /// No fault thread to end holds (userfaultfd MISSING mode missing):
    /// diverged pages are folded and merged behind the pin grace and owned
    /// zero pages frozen (hold.rs).
    pub pin_hold: u64,
    /// Fresh blocks whose frames could not all be given pages of the bank
    /// set (PFNs unreadable, a fill failed, the retry bounds ran out): the
    /// rest of their pages are uncoloured (colour.rs).
    pub banks: u64,
    /// Blocks in which the mapping budget refused merges while kernel KSM,
    /// which could take them, was not running; counted at each scan (ksm.rs).
    pub ksm: u64,
    /// Files the pressure gauge could not keep open: their descriptors would
    /// have taken numbers of a program whose descriptor limit is under 4096
    /// (fds.rs `SPARE_FLOOR`). Without
    /// them memory reads as never short and tiering driven by pressure stays
    /// idle (pressure.rs).
    pub pressure: u64,
}

/// A snapshot of the engine's state and history.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Stats {
    /// Live blocks and their total length in bytes.
    pub blocks: u64,
    pub block_bytes: u64,
    /// Frames referenced by at least one page.
    pub frames_in_use: u64,
    /// Frames whose content is resident in memory (holes excluded).
    pub frames_resident: u64,
    /// Pages currently mapping a frame that another page maps too.
    pub pages_sharing: u64,
    /// Pages of memory sharing saves now: those pages less the frames they map.
    pub pages_saved_by_sharing: u64,
    /// Total pages turned into copy-on-write views by `copy`.
    pub pages_shared_by_copy: u64,
    /// Total pages a copy wrote from anonymous memory into fresh frames it then shared.
    pub pages_copied_through: u64,
    /// Total anonymous source pages a copy moved onto the frames it shared (adopt.rs).
    pub pages_adopted: u64,
    /// Copies made plainly because copies into blocks of that size were
    /// mostly written over or freed young (fresh.rs).
    pub copies_made_plain: u64,
    /// Copies that shared only their first `fresh::PROBE_PAGES` pages, to
    /// keep measuring a size whose copies are made plainly (fresh.rs).
    pub copies_probed: u64,
    /// Pages a copy shared that the program freed young, unwritten (fresh.rs).
    pub copy_pages_freed_young: u64,
    /// Total bytes copied plainly by `copy` (partial pages, non-engine memory, fallbacks).
    pub bytes_copied_plain: u64,
    /// Total pages freed because they were all zero.
    pub zero_folded: u64,
    /// Pages folded as zero that a later look found written again (the fold
    /// cost a fault and saved memory only until then).
    pub zero_refilled: u64,
    /// Zero pages of a plain copy's source not written to a destination
    /// page that read zero already (copy.rs).
    pub zero_pages_not_copied: u64,
    /// Pages a zeroing of an engine range left out: they read zero already
    /// (copy.rs, `Engine::zero`).
    pub zero_pages_not_written: u64,
    /// Pages of the caller's heap that copies and zeroings left out: they
    /// read zero, untouched (heap.rs).
    pub heap_pages_left_zero: u64,
    /// Of those, the pages read back half a second later, and the pages
    /// found written then (heap.rs).
    pub heap_pages_judged: u64,
    pub heap_pages_found_written: u64,
    /// Times a block's looks were spaced further because the program undid
    /// what the previous look folded or merged (sample.rs).
    pub block_rests: u64,
    /// Total pages merged onto an identical frame.
    pub merged: u64,
    /// Total pages a scan left alone because the kernel may hold a pin on
    /// them (I/O in flight) or they are shared with another process.
    pub pin_refused: u64,
    /// Total pages a scan left alone because they changed between its
    /// comparison and taking them off (a write through an earlier pin).
    pub pin_changed: u64,
    /// Total holds begun on diverged pages before folding or merging them (hold.rs).
    pub pin_held: u64,
    /// Total holds a write (or a pin for writing) ended.
    pub pin_hold_broken: u64,
    /// Total frames released because every page using them had diverged.
    pub diverged_released: u64,
    /// Total pages the program discarded (madvise MADV_DONTNEED/MADV_FREE
    /// through the preload): they read zero and their frames were released.
    pub discarded: u64,
    /// Blocks taken out of the engine's hands (the program changed their
    /// protection or set fork/dump advice on them): plain memory since.
    pub exempted: u64,
    /// Blocks handed to kernel KSM (ksm.rs) and their bytes: plain
    /// anonymous memory marked mergeable, no longer scanned by the engine.
    pub ksm_blocks: u64,
    pub ksm_bytes: u64,
    /// Times the program ran out of mappings (`vm.max_map_count`) and the
    /// engine gave its own back, and the mappings it gave back (advice.rs).
    pub mappings_given_back: u64,
    pub mapping_shortages: u64,
    /// Mallocs left to the caller's heap, which held enough freed memory
    /// to serve them (placement.rs, `leave_to_heap`).
    pub allocs_left_to_heap: u64,
    /// Allocations served by a recycled block (recycle.rs).
    pub recycled: u64,
    /// Of those, allocations no single recycled block fitted, served by
    /// several laid side by side (recycle.rs `gather`).
    pub recycled_joined: u64,
    /// Bytes of freed blocks kept for reuse now.
    pub recycled_bytes: u64,
    /// Completed scans.
    pub scans: u64,
    /// Background scans not started because the scan budget was spent (budget.rs).
    pub scans_deferred: u64,
    /// Pages of fresh blocks handed out (not recycled ones).
    pub fresh_pages: u64,
    /// Fresh blocks that started sampled, their size class having yielded
    /// nothing to scans (sample.rs).
    pub blocks_started_sampled: u64,
    /// Allocations `Engine::take` left to the program's own allocator
    /// (below `Config::plain_below`, of a size class not copied from).
    pub allocs_declined: u64,
    /// Page colouring (colour.rs): frames backed by a page of the bank set,
    /// pages refused for being outside it, frames left uncoloured, and the
    /// time colouring took, in nanoseconds.
    pub coloured_pages: u64,
    pub colour_rejected: u64,
    pub colour_unmet: u64,
    pub colour_ns: u64,
    /// One of the engine's descriptors was found naming another file (the
    /// program replaced it behind the preload's back): since then the engine
    /// takes no new work (fresh blocks are plain memory, copies plain, no
    /// scans); pages it already maps keep their contents (fds.rs).
    pub descriptor_replaced: bool,
    /// CPU time spent scanning, in nanoseconds.
    pub scan_cpu_ns: u64,
    /// Page looks the scans saved: pages skipped because earlier looks found nothing to do.
    pub scan_skipped_idle: u64,
    /// Page looks the scans left out while memory was short and the kernel
    /// could swap (a look marks a page used for the kernel's reclaim).
    pub scan_skipped_pressure: u64,
    /// Chunks the scans write-protected for their look, and chunks they
    /// looked at without protection, none of whose pages could be folded
    /// or merged (`Config::look_first`).
    pub scan_chunks_protected: u64,
    pub scan_chunks_unprotected: u64,
    pub fallbacks: Fallbacks,
    /// Mappings the engine's blocks use now.
    pub vmas_used: u64,
    /// Bytes of the engine's own bookkeeping.
    pub metadata_bytes: u64,
    /// Whether write protection (userfaultfd) is available for scans.
    pub protected_scan: bool,
    /// Whether blocks are served from memfd frames (false: degraded to plain memory).
    pub frames_active: bool,
    /// Total pages evicted to the page store (evict.rs).
    pub evicted: u64,
    /// Pages evicted now (their content in the store, their memory free).
    pub evicted_now: u64,
    /// Total evicted pages restored because something touched them.
    pub restored: u64,
    /// Of those, pages touched within 20 clock intervals of their eviction
    /// (churn to the pass governor, governor.rs).
    pub restored_young: u64,
    /// Total evicted pages the engine restored itself (before fork, exempting a block).
    pub restored_by_engine: u64,
    /// Total evicted pages freed or overwritten before anything touched them.
    pub evicted_dropped: u64,
    /// Total pages evicted as patches against a reference page (patching.rs).
    pub patched: u64,
    /// Patches held now, their bytes, and the patch store's footprint (its
    /// slabs, cached slabs and tables).
    pub patched_now: u64,
    pub patch_bytes: u64,
    pub patch_store_bytes: u64,
    /// Frames pinned as references by patches now.
    pub references_pinned: u64,
    /// Bytes of pinned frames no page holds any more (kept only for patches).
    pub reference_bytes: u64,
    /// Time eviction spent finding references and encoding patches (every
    /// page tried, patched or not), in nanoseconds.
    pub patch_work_ns: u64,
    /// Patched pages rebuilt by the fault thread, and the time that took
    /// (reference read, patch read, decode; not the fault's round trip).
    pub patch_restores: u64,
    pub patch_restore_ns: u64,
    /// Total pages the store refused to take (incompressible, full): left in memory.
    pub evict_refused: u64,
    /// Restores that went wrong (page found present, stored copy lost); 0 unless a bug.
    pub restore_errors: u64,
    /// Pages an unprotect found not registered while it had to reach past
    /// them (0 unless a bug: protection beyond such a page would outlive its
    /// range; protect.rs).
    pub unprotect_gaps: u64,
    /// What the page store holds now: pages, payload bytes, overhead bytes.
    pub store: crate::store::StoreBytes,
    /// Time from eviction to the touch that restored the page: bucket 0 under
    /// 1 ms, bucket b from 2^(b-1) to 2^b ms, the last one open (DE's Figure 4).
    pub evict_lifetime_ms_log2: [u64; LIFETIME_BUCKETS],
    /// The tiering clock (clock.rs): passes, pages per class in the last pass
    /// and summed over passes, pages the policy evicted, restores it saw, watermarks.
    pub clock: crate::clock::ClockStats,
}

/// Lifetime buckets: [0] under 1 ms, [b] from 2^(b-1) to 2^b ms, the last open.
pub const LIFETIME_BUCKETS: usize = 24;

/// What one scan did.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ScanReport {
    pub pages_scanned: u64,
    pub zero_folded: u64,
    pub merged: u64,
    pub diverged_released: u64,
    /// Merges or folds skipped because the VMA budget was spent.
    pub skipped_vma: u64,
    /// Planned folds and merges dropped because the page changed during the pin grace.
    pub changed_while_planned: u64,
    /// Pages left alone because they changed since the previous scan.
    pub volatile: u64,
    /// Pages not looked at: earlier looks found nothing to do (smart scan).
    pub skipped_idle: u64,
    /// Pages not looked at because memory was short and the kernel could
    /// swap (scan.rs: a look would tell the kernel's reclaim they are in use).
    pub skipped_pressure: u64,
    /// Chunks write-protected for their look, and chunks looked at without
    /// protection because none of their pages could be folded or merged.
    pub chunks_protected: u64,
    pub chunks_unprotected: u64,
    /// Owned pages frozen, and diverged and owned zero pages held (hold.rs),
    /// to be folded or merged once the pin age has passed.
    pub frozen: u64,
    /// Blocks handed to kernel KSM after this scan (ksm.rs).
    pub ksm_handed: u64,
    /// This scan was a clock pass (clock.rs); what it classified and evicted.
    pub pass: bool,
    pub clock: crate::clock::PassCounts,
    pub wall_ns: u64,
    pub cpu_ns: u64,
}

/// What one `evict` call did, in pages.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct EvictReport {
    pub evicted: u64,
    /// Of the evicted pages, those kept as patches against a reference page.
    pub patched: u64,
    /// Pages left in memory because patching found no reference (or no patch
    /// small enough) and compression was not allowed.
    pub unpatched: u64,
    /// Pages whose state does not allow it (shared with others, pre-fork, exempt block).
    pub not_eligible: u64,
    /// Pages holding nothing (never touched, already folded or evicted).
    pub not_resident: u64,
    /// All-zero pages, left to zero folding.
    pub zero: u64,
    /// Pages the store refused (incompressible or full).
    pub refused: u64,
    /// Pages for which the caller allowed no treatment at all.
    pub not_allowed: u64,
    /// Pages that changed during the pin grace.
    pub changed: u64,
    /// Pages without a pin test, left because `evict_untested` is off.
    pub untested: u64,
    /// Pages the chunk's write protection did not cover (remapped while a
    /// scan worked on the chunk: frozen, or a merge partner), left for a
    /// later pass.
    pub unprotected: u64,
    /// Pages left because the VMA budget was spent.
    pub skipped_vma: u64,
    /// Nothing was done: no userfaultfd MISSING mode or no fault thread (counted in fallbacks.evict).
    pub unavailable: bool,
    pub wall_ns: u64,
}
