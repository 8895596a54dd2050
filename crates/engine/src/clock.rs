//! The clock and the tiering policy: which pages are cold, and what happens
//! to them (Difference Engine §4.2, in user space).
//!
//! With tiering on (`Config::tier`: always, or by default only while memory
//! is short, pressure.rs and pass.rs), some scans are *clock passes*: scans at least
//! `clock_interval` apart that look at every resident page (the smart scan's
//! skipping is off for them, idle.rs; but see incompressible pages below).
//! Each pass sorts every page it looks at into one of DE's four classes:
//!
//! - **C1**, recently written: a write was seen since the previous pass;
//! - **C2**, recently accessed, not written: restored from the page store
//!   because something touched it (fault.rs), and not written since;
//! - **C3**, not accessed since the previous pass;
//! - **C4**, not accessed for `cold_passes` passes.
//!
//! and the policy acts on the class, by default as DE does: C1 is left alone
//! (the volatility check keeps it from being merged too); C2 may be merged
//! (any scan merges settled pages) and is offered to the similarity detector
//! as a patch reference (patching.rs); C3 may be merged or patched (a C3 page
//! that finds no reference becomes a candidate reference itself); C4 may also be compressed (sent to the page store,
//! which may spill it to disk). No page is compressed before a full sharing
//! cycle: it must have been *settled* (unchanged, so eligible for merging)
//! in an earlier complete pass, so every duplicate had the chance to meet it
//! in that pass's index. Otherwise a page early in the pass is compressed
//! before its duplicate later in the pass finds it, and both end up
//! compressed instead of one of them freed. `tier_patch` and `tier_compress`
//! switch the two treatments off; the pass (pass.rs) hands the chosen pages
//! of the chunk the scan has write-protected anyway to tiering (evict.rs
//! `tier_chunk`, then `evict_pages`), with each page's `Allow`. This module
//! is the clock's data and its pure decisions; it knows no engine state.
//!
//! Watermarks. The engine's footprint is what it can see of its own memory:
//! resident frames (the pool's allocated blocks), resident private pages
//! (anonymous and diverged pages, counted by each pass's mincore), the page
//! store's bytes, the patches and the engine's metadata (the similarity
//! detector's included); reference frames kept only for patches are frames. Above `high_water` a pass is
//! under pressure until the footprint falls below `low_water`: it asks the
//! store to `spill` the excess to a lower tier (disk) first, and then
//! compresses C3 pages too (only having been looked at by an earlier pass,
//! not the whole sharing cycle: memory comes first), until the excess is shed.
//!
//! What tells the clock about accesses. This kernel has no accessed bits
//! (no soft-dirty, no idle page tracking; see docs/MECHANISMS.md). So:
//! - writes are what the scan sees: a page's *look* (a hash of 1/8 of its
//!   bytes, the one the volatility check keeps, idle.rs) changed since the
//!   previous look, a page looked at for the first time, or a shared page
//!   that diverged (the kernel copied it on a write). Any scan between two
//!   passes that sees a change marks the page written until the next pass.
//!   A write that leaves the sampled bytes as they were (or writes the same
//!   value again, as DE's micro-benchmark does) is not seen: such a page can
//!   be evicted while in use, and its next touch restores it (a fault,
//!   ~7-50 us) and makes it C2, so it is not evicted again until it has been
//!   cold for a pass or more again. The bytes are always right; only the cost is at stake.
//! - reads are seen only as faults on evicted pages: a restored page was
//!   accessed (C2). A page that is only read looks cold until it has been
//!   evicted once.
//!
//! Why not userfaultfd WP_ASYNC + PAGEMAP_SCAN for writes (it costs 0.8 us
//! per first write after a reset and ~1 ms/GiB per scan on this kernel; see
//! docs/MECHANISMS.md). WP_ASYNC is a feature of a whole userfaultfd: with it, every
//! write-protect fault on that descriptor is resolved by the kernel without
//! waiting. The engine's one descriptor needs *synchronous* write protection
//! (a writer must sleep while a scan compares and remaps its page, or its
//! write is lost) and MISSING mode for evicted pages, so the clock would need
//! a second descriptor; but a mapping can be registered with one
//! userfaultfd only (measured: EBUSY, probes/wpasync.c), and to catch writes
//! between passes the clock's registration would have to stay on every page
//! all the time, so the scan could no longer register its chunks and
//! eviction could no longer register MISSING. Keeping ranges registered also
//! turns off fault-around (a first read of a memfd private page: 4.9 against
//! 0.86 us in the probe on a busy machine, 1.0 against 0.16 us in protect.rs). Making
//! the whole engine use WP_ASYNC would need another way to stop writers
//! during a merge (mprotect: VMAs and signals); that is a redesign, not a
//! clock. So C1 is based on what scans see, as above.
//!
//! Incompressible pages are left alone: a page the store refused as
//! incompressible is not offered again until it is written (most numeric
//! data does not compress; trying it again every pass cost the scan more
//! than the rest of the pass), and a pass looks at it only when the smart
//! scan would (idle.rs), so its write is seen at most 8 scans late. Likewise
//! a page offered a patch that found no reference is not offered a patch
//! again until written (a similar page that comes later finds it as its
//! reference instead): on R's random-looking doubles, searching again every
//! pass cost more scan time than the patches saved. A pass classifies the
//! pages it looks at (its counts are page looks).
//!
//! The clock's state is kept per page in the page's `seen` word, beside the
//! look and the idle level, so every path that resets or splits `seen`
//! handles it too: no reference found, refused as incompressible, written
//! since the last pass, restored since the last pass, and passes without
//! access (capped at `MAX_AGE`); seen.rs lays the bits out.

use std::time::Instant;

use serde::Serialize;

use crate::config::Config;
use crate::seen::{age, ACCESSED, AGE_SHIFT, MAX_AGE, WRITTEN};

/// Which mechanisms may take a page (the policy allows them per clock class).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Allow {
    /// As a patch against a similar page kept in memory.
    pub patch: bool,
    /// Into the page store (compressed, or whatever the store does).
    pub compress: bool,
}

impl Allow {
    /// `Engine::evict`: a hint from the program allows everything.
    pub const ALL: Allow = Allow {
        patch: true,
        compress: true,
    };
}

/// DE's access classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    C1,
    C2,
    C3,
    C4,
}

/// One pass's verdict on a page: its class and its `seen` afterwards (the
/// written and accessed bits cleared, its age advanced or reset).
pub fn tick(seen: u32, cold_passes: u32) -> (Class, u32) {
    let rest = seen & !(WRITTEN | ACCESSED | (MAX_AGE << AGE_SHIFT));
    if seen & WRITTEN != 0 {
        return (Class::C1, rest);
    }
    if seen & ACCESSED != 0 {
        return (Class::C2, rest);
    }
    let a = (age(seen) + 1).min(MAX_AGE);
    let class = if a >= cold_passes.max(1) {
        Class::C4
    } else {
        Class::C3
    };
    (class, rest | a << AGE_SHIFT)
}

/// What the policy lets happen to a page of `class` that has gone `age`
/// passes without access; None: it stays as it is.
pub fn allow(class: Class, age: u32, pressing: bool, cfg: &Config) -> Option<Allow> {
    // Settled (unchanged) in an earlier complete pass: every duplicate has met it.
    let shared_cycle = age >= if cfg.volatile_check { 2 } else { 1 };
    let a = match class {
        Class::C1 | Class::C2 => return None,
        Class::C3 => Allow {
            patch: cfg.tier_patch,
            compress: cfg.tier_compress && pressing,
        },
        Class::C4 => Allow {
            patch: cfg.tier_patch,
            compress: cfg.tier_compress && shared_cycle,
        },
    };
    (a.patch || a.compress).then_some(a)
}

/// Pages per class and what the policy did, in one pass or summed over passes.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PassCounts {
    pub c1: u64,
    pub c2: u64,
    pub c3: u64,
    pub c4: u64,
    /// Pages the policy evicted (patched, compressed).
    pub evicted: u64,
    /// Pages the policy chose that stayed: shared with other pages, pre-fork,
    /// remapped during the pass's work on their chunk or without a pin test
    /// while `evict_untested` is off (`not_eligible`), refused by the store
    /// (`refused`: incompressible or full), allowed only a treatment that did
    /// not apply, now or (no reference) at an earlier pass since the page was
    /// last written (`not_allowed`).
    pub not_eligible: u64,
    pub refused: u64,
    pub not_allowed: u64,
    /// Pages not offered because the store refused them before (unwritten since).
    pub incompressible: u64,
    /// Pages found restored (touched after eviction) since the previous pass.
    pub restored: u64,
}

impl PassCounts {
    pub(crate) fn add(&mut self, o: &PassCounts) {
        self.c1 += o.c1;
        self.c2 += o.c2;
        self.c3 += o.c3;
        self.c4 += o.c4;
        self.evicted += o.evicted;
        self.not_eligible += o.not_eligible;
        self.refused += o.refused;
        self.not_allowed += o.not_allowed;
        self.incompressible += o.incompressible;
        self.restored += o.restored;
    }

    pub(crate) fn count(&mut self, class: Class) {
        match class {
            Class::C1 => self.c1 += 1,
            Class::C2 => self.c2 += 1,
            Class::C3 => self.c3 += 1,
            Class::C4 => self.c4 += 1,
        }
    }
}

/// The clock's statistics (in `Stats::clock`).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ClockStats {
    pub passes: u64,
    /// Passes that began above the high watermark (or had not yet fallen below the low one).
    pub pressure_passes: u64,
    /// Bytes the policy asked the store to spill, and bytes of memory the store says it released.
    pub spill_requested: u64,
    pub spilled: u64,
    /// The engine's footprint as the last pass saw it at its start (bytes).
    pub footprint: u64,
    /// With pressure-driven tiering: looks at memory (pressure.rs), and the last.
    pub pressure_reads: u64,
    pub pressure: crate::pressure::Reading,
    /// Clock intervals the next pass under pressure waits (1 after a pass
    /// that paid, governor.rs).
    pub backoff: u32,
    /// Passes under pressure after which passes stopped for a while, because
    /// what passes evict comes back.
    pub suspensions: u64,
    /// Calls of the caller's relief while memory was short
    /// (`Engine::on_memory_short`), and those that released memory.
    pub reliefs: u64,
    pub reliefs_released: u64,
    /// The last pass.
    pub last: PassCounts,
    /// Summed over all passes.
    pub total: PassCounts,
}

/// The clock's state between passes (in `State`).
#[derive(Default)]
pub(crate) struct Clock {
    pub last_pass: Option<Instant>,
    /// Under pressure: above the high watermark, not yet below the low one.
    pub pressure: bool,
    /// Driven by pressure: whether passes pay, and the wait it sets (governor.rs).
    pub governor: crate::governor::Governor,
    /// Resident anonymous and diverged pages, as the last complete pass counted them.
    pub private_resident: u64,
    pub stats: ClockStats,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seen::{on_evict, LOOK_MASK};

    fn run(mut seen: u32, events: &[u32], cold: u32) -> Vec<Class> {
        events
            .iter()
            .map(|&e| {
                let (c, s) = tick(seen | e, cold);
                seen = s;
                c
            })
            .collect()
    }

    #[test]
    fn pages_age_from_c3_to_c4_and_any_access_starts_again() {
        use Class::*;
        let look = 0x1234 | 2;
        assert_eq!(
            run(
                look,
                &[WRITTEN, 0, 0, 0, ACCESSED, 0, WRITTEN | ACCESSED, 0, 0],
                2
            ),
            [C1, C3, C4, C4, C2, C3, C1, C3, C4]
        );
        assert_eq!(run(look, &[0; 10], 3)[..4], [C3, C3, C4, C4]);
        let (_, s) = (0..20).fold((Class::C3, look), |(_, s), _| tick(s, 7));
        assert_eq!(age(s), MAX_AGE, "age saturates");
        assert_eq!(s & LOOK_MASK, look, "the look stays");
        assert_eq!(
            on_evict(s | WRITTEN | 0x0300_0000),
            look,
            "eviction keeps only the look"
        );
    }

    #[test]
    fn policy_is_des_by_default_and_waits_for_a_sharing_cycle() {
        let cfg = Config::default();
        assert!(allow(Class::C1, 0, true, &cfg).is_none());
        assert!(allow(Class::C2, 0, true, &cfg).is_none());
        let c3 = allow(Class::C3, 1, false, &cfg).expect("C3 may be patched");
        assert!(c3.patch && !c3.compress);
        assert!(allow(Class::C3, 1, true, &cfg).expect("pressure").compress);
        let early = Config {
            cold_passes: 1,
            ..Config::default()
        };
        assert!(
            !allow(Class::C4, 1, false, &early).expect("C4").compress,
            "settled only once: not yet"
        );
        assert!(allow(Class::C4, 2, false, &cfg).expect("C4").compress);
        let off = Config {
            tier_patch: false,
            tier_compress: false,
            ..Config::default()
        };
        assert!(allow(Class::C4, 5, true, &off).is_none());
    }
}
