//! pagefold-engine: fewer physical pages for the same bytes, inside one process.
//!
//! # Overview
//!
//! Memory handed out by the engine lives in *frames*: page-sized slots of one
//! memfd (the frame pool). A block (one allocation) is a virtual range whose
//! pages map frames; every page is in one of four states:
//!
//! - **Owned**: the page maps its own frame `MAP_SHARED`; writes go straight
//!   into the frame. A fresh block is one run of owned pages over a contiguous
//!   run of frames, so it costs one mapping and no memory until touched.
//! - **Shared**: the page maps a frame `MAP_PRIVATE`. The frame is immutable
//!   while any page maps it this way: a write makes the kernel copy the page
//!   (its own copy-on-write, about 2 us) and the page becomes *diverged*.
//! - **Diverged**: still mapped `MAP_PRIVATE` at a frame offset, but the
//!   content is the page's private anonymous copy; it no longer needs the frame.
//!   The engine learns of divergence lazily, from /proc/self/pagemap.
//! - **Anon**: plain anonymous memory (a fallback, or a folded zero range).
//!
//! and a fifth for pages taken out of memory: **Evicted**, whose content is
//! in a page store (compressed in memory by default, LZ4 or zstd, with a
//! swap file below when configured) while the page is not present and
//! registered for userfaultfd MISSING faults; a fault thread
//! puts the content back on any touch, including the kernel's inside a system
//! call (evict.rs, fault.rs, store.rs). A page similar to one kept in memory
//! is evicted as a small patch against that page's frame instead, which the
//! patch pins (one more frame reference) until the patch is gone (patching.rs).
//!
//! A virtual copy (`copy`) freezes the source's owned pages (remaps them
//! `MAP_PRIVATE` in place; the content stays in the page cache) and maps the
//! destination `MAP_PRIVATE` onto the same frames: mmapcopy without a new system
//! call. A source page on plain anonymous memory is first *adopted*: under
//! write protection its content is written into a fresh frame and the page,
//! taken off its address by the pin guard, maps that frame (adopt.rs), so its
//! first copy already shares. Diverged pages, zero or untouched anonymous
//! pages, and partial head and tail pages are copied plainly; a source page
//! is never remapped from under a writer, and no write can be lost.
//!
//! A scan walks blocks in chunks. Each chunk is write-protected with
//! userfaultfd (a writer sleeps in the kernel, no signal, no new mapping),
//! divergence is refreshed from pagemap, all-zero pages are folded (their frame
//! punched out, or an anonymous page dropped) and identical pages are merged:
//! an xxh3 hash finds a candidate, a full byte comparison decides, and the
//! page is remapped `MAP_PRIVATE` onto the one frame (consecutive pages onto
//! consecutive frames as one run). Then the chunk is unprotected and sleepers
//! wake. Without userfaultfd only the steps that are safe against concurrent
//! writers run (releasing frames of diverged pages).
//!
//! Frames are reference counted (one reference per owned or shared page, and
//! one per patch using the frame as its reference) and
//! freed by punching a hole, so a free frame is always zero. Every remap in
//! the middle of a block can cost mappings, and the kernel refuses mmap beyond
//! `vm.max_map_count`; the engine keeps its own VMA count under a budget and
//! falls back to plain copies or skipped merges before it gets there. Any
//! failed system call degrades to plain memory and is counted; it never fails
//! the program.
//!
//! Freed blocks that were all the program's own are kept mapped for a
//! while and handed out again to allocations of the same size that need no
//! zeroing (recycle.rs), as glibc's heap does, so an allocation loop does not
//! pay an mmap, a hole punch and a fault per page each time round.
//!
//! Fork: the child inherits mappings of the same memfd, so at fork every owned
//! page is frozen and both sides stop punching or reusing pre-fork frames
//! (they retire the pool and start a fresh one).
//!
//! # Layers
//!
//! The modules are layered: each uses only what lies below it, by name or by
//! method (tests/layering.rs keeps the module graph free of cycles). Bottom up:
//!
//! 1. The ground: system calls and the page size (sys.rs, fds.rs), the
//!    engine's threads (threads.rs), injected pauses (race.rs), the
//!    configuration (config.rs), the `seen` word's bits (seen.rs), the
//!    statistics and reports (stats.rs).
//! 2. Data, each part with its owner: frames (frames.rs), blocks and pages
//!    (space.rs), content indices (index.rs), userfaultfd (protect.rs),
//!    page stores (store.rs, tier_store.rs), the eviction table and fault
//!    thread (fault.rs) with the held pages (held.rs) and patches
//!    (patches.rs) it keeps, the pin guard's state (guard.rs), recycled
//!    blocks (recycle.rs), the count of mappings and their budget
//!    (mappings.rs), whether ksmd runs (ksm_link.rs), the scan's and
//!    clock's pure decisions (idle.rs, sample.rs, budget.rs, fresh.rs,
//!    clock.rs, governor.rs, colour.rs), and where allocations go: taken or
//!    left to the caller's heap, on frames or anonymous (placement.rs).
//! 3. The page table (state.rs): `State` and the operations every mechanism
//!    builds on (allocate, free, remap, freeze, divergence, the mapping
//!    budget); what a change of mapping invalidates below (holds, records of
//!    evicted pages, pins of dropped patches) is settled where it happens.
//! 4. Mechanisms: the pin guard (detach.rs), restoring evicted pages
//!    (restore.rs), then holds (hold.rs), advice (advice.rs), handing
//!    blocks to kernel KSM (ksm.rs), fork (fork.rs), patches (patching.rs),
//!    a clock pass (pass.rs), the protected-chunk protocol (chunk.rs), then
//!    taking a copy's anonymous source onto frames (adopt.rs) and virtual
//!    copy (copy.rs) on top of it.
//! 5. The scan (scan.rs) and eviction (evict.rs). Tiering is the scan's
//!    client: a clock pass hands it the pages its policy chose through a
//!    function the engine gives the scan (`pass::Tiering`), never by calling up.
//! 6. The public `Engine` (engine.rs), and this crate root.

mod adopt;
mod advice;
mod budget;
mod chunk;
mod clock;
mod colour;
mod config;
mod copy;
mod detach;
mod engine;
mod evict;
mod fault;
pub mod fds;
mod fork;
mod frames;
mod fresh;
mod governor;
mod guard;
mod heap;
mod held;
mod hold;
mod idle;
mod index;
mod ksm;
mod ksm_link;
mod mappings;
pub mod memlimit;
mod pass;
mod patches;
mod patching;
mod placement;
mod pressure;
#[doc(hidden)]
pub mod protect;
mod race;
mod recycle;
mod restore;
mod sample;
mod scan;
mod seen;
mod space;
mod state;
mod stats;
mod store;
mod sys;
mod threads;
mod tier_store;

pub use clock::{Allow, ClockStats, PassCounts};
pub use config::{Config, HeapFirst, Inject, Tier, MALLOC_THRESHOLD};
pub use engine::Engine;
pub use fresh::Fresh;
pub use placement::Hint;
pub use pressure::Reading as PressureReading;
pub use stats::{EvictReport, Fallbacks, ScanReport, Stats, LIFETIME_BUCKETS, STATS_SCHEMA};
pub use store::{Handle, PageStore, StoreBytes, StoreError};
pub use sys::PAGE;
pub use threads::on_engine_thread;
pub use tier_store::{SwapSettings, TierConfig, TierCounts, TierStore};
