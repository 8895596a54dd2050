//! The clock and the tiering policy: which pages are cold, and what happens
//! to them (Difference Engine §4.2, in user space).
//!
//! With `Config::tier`, some scans are *clock passes*: scans at least
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
//! switch the two treatments off; the scan evicts the chosen pages of the
//! chunk it has write-protected anyway (evict.rs `evict_pages`), passing
//! each page's `Allow`.
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
//! handles it too: bit 22 no reference found, bit 23 refused as
//! incompressible, bit 27 written since
//! the last pass, bit 28 restored since the last pass, bits 29-31 passes
//! without access (capped at `MAX_AGE`).

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::config::Config;
use crate::engine::{ScanReport, State};
use crate::evict::{Allow, EvictReport};
use crate::idle::LOOK_MASK;
use crate::space::Page;
use crate::store::PageStore;
use crate::PAGE;

/// Offered for a patch, the page found no reference: not offered for one
/// again until written (a later similar page finds it instead).
const NO_REFERENCE: u32 = 1 << 22;
const REFUSED: u32 = 1 << 23;
const WRITTEN: u32 = 1 << 27;
const ACCESSED: u32 = 1 << 28;
const AGE_SHIFT: u32 = 29;
/// Most passes without access a page's age counts; `cold_passes` is capped to it.
pub const MAX_AGE: u32 = 7;

/// `seen` of a page a scan saw written (new content: it may compress now).
pub fn written(seen: u32) -> u32 {
    (seen | WRITTEN) & !(REFUSED | NO_REFERENCE)
}

/// `seen` of a page for which patching found no reference.
pub fn no_reference(seen: u32) -> u32 {
    seen | NO_REFERENCE
}

/// `seen` of a page the store refused as incompressible.
pub fn refused(seen: u32) -> u32 {
    seen | REFUSED
}

/// Whether a pass must look at the page whatever the smart scan says: all
/// but those refused as incompressible, which the policy leaves alone until
/// a look sees them written (the smart scan's looks still come).
pub fn wanted(seen: u32) -> bool {
    seen & REFUSED == 0
}

/// `seen` of a page restored because something touched it.
pub fn accessed(seen: u32) -> u32 {
    seen | ACCESSED
}

/// `seen` of a page just evicted: the look stays (a restored page that was
/// only read then looks unchanged, C2); idle level and clock start again.
pub fn on_evict(seen: u32) -> u32 {
    seen & LOOK_MASK
}

fn age(seen: u32) -> u32 {
    seen >> AGE_SHIFT
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
    /// Pages the policy chose that stayed: shared with other pages or pre-fork
    /// (`not_eligible`), refused by the store (`refused`: incompressible or full),
    /// allowed only a treatment that did not apply, now or (no reference) at an
    /// earlier pass since the page was last written (`not_allowed`).
    pub not_eligible: u64,
    pub refused: u64,
    pub not_allowed: u64,
    /// Pages not offered because the store refused them before (unwritten since).
    pub incompressible: u64,
    /// Pages found restored (touched after eviction) since the previous pass.
    pub restored: u64,
}

impl PassCounts {
    fn add(&mut self, o: &PassCounts) {
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

    fn count(&mut self, class: Class) {
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
    /// The last pass.
    pub last: PassCounts,
    /// Summed over all passes.
    pub total: PassCounts,
}

/// The clock's state between passes (in `State`).
#[derive(Default)]
pub(crate) struct Clock {
    last_pass: Option<Instant>,
    /// Under pressure: above the high watermark, not yet below the low one.
    pressure: bool,
    /// Resident anonymous and diverged pages, as the last complete pass counted them.
    private_resident: u64,
    pub stats: ClockStats,
}

/// One pass in progress (local to the scan running it).
pub(crate) struct Pass {
    pub counts: PassCounts,
    /// Eviction works (userfaultfd MISSING mode and the fault thread).
    evict: bool,
    /// Bytes still to shed under pressure (0: no pressure).
    shed: u64,
    private_resident: u64,
    /// Where to spill, and how much, before the pass walks the blocks.
    spill: Option<(Arc<dyn PageStore>, u64)>,
}

impl Pass {
    /// Asks the store to spill (outside the engine lock: it may write to disk).
    pub fn spill_now(&mut self) -> u64 {
        let Some((store, bytes)) = self.spill.take() else {
            return 0;
        };
        let released = store.spill(bytes);
        self.shed = self.shed.saturating_sub(released);
        released
    }
}

impl State {
    /// Starts a clock pass if tiering is on and the last one is at least
    /// `clock_interval` old.
    pub(crate) fn begin_pass(&mut self) -> Option<Pass> {
        if !self.cfg.tier {
            return None;
        }
        let now = Instant::now();
        if self
            .clock
            .last_pass
            .is_some_and(|t| now.duration_since(t) < self.cfg.clock_interval)
        {
            return None;
        }
        self.clock.last_pass = Some(now);
        let evict = self.cfg.evict && self.fault_thread_ready();
        if self.cfg.evict && !evict {
            self.stats.fallbacks.evict += 1;
        }
        let footprint = self.footprint();
        self.clock.stats.footprint = footprint;
        let shed = self.excess(footprint);
        let mut spill = None;
        if shed > 0 {
            self.clock.stats.pressure_passes += 1;
            self.clock.stats.spill_requested += shed;
            spill = self
                .evictions
                .as_ref()
                .map(|ev| (ev.lock().store.clone(), shed));
        }
        Some(Pass {
            counts: PassCounts::default(),
            evict,
            shed,
            private_resident: 0,
            spill,
        })
    }

    /// Bytes above the low watermark, if under pressure (see the module comment).
    fn excess(&mut self, footprint: u64) -> u64 {
        let Some(high) = self.cfg.high_water else {
            return 0;
        };
        let low = self.cfg.low_water.unwrap_or(high / 8 * 7).min(high);
        if footprint > high {
            self.clock.pressure = true;
        } else if footprint < low {
            self.clock.pressure = false;
        }
        if self.clock.pressure {
            footprint.saturating_sub(low)
        } else {
            0
        }
    }

    /// What the engine can see of its own memory (see the module comment).
    fn footprint(&self) -> u64 {
        let frames: u64 = self.pools.iter().map(|p| p.resident_frames()).sum();
        // Patches, their table and the detector count as the statistics count them.
        let mut s = crate::Stats::default();
        let stored = self.evictions.as_ref().map_or(0, |ev| {
            let t = ev.lock();
            t.patches.stats(&mut s);
            t.store.bytes().memory() + s.patch_store_bytes + t.records_bytes() as u64
        });
        self.patch_stats(&mut s);
        (frames + self.clock.private_resident) * PAGE as u64
            + stored
            + self.metadata_bytes() as u64
            + s.metadata_bytes
    }

    /// Ends a pass: its counts go to the statistics and to the scan's report.
    pub(crate) fn end_pass(&mut self, pass: Pass, spilled: u64, rep: &mut ScanReport) {
        self.clock.private_resident = pass.private_resident;
        let s = &mut self.clock.stats;
        s.passes += 1;
        s.spilled += spilled;
        s.last = pass.counts;
        s.total.add(&pass.counts);
        rep.pass = true;
        rep.clock = pass.counts;
    }

    /// The clock's look at the pages of a protected chunk that hold content
    /// (`present`, sorted; none evicted or folded): classifies each, then
    /// evicts what the policy allows.
    pub(crate) fn clock_chunk(
        &mut self,
        base: usize,
        chunk: Range<usize>,
        present: &[usize],
        pass: &mut Pass,
    ) {
        let cold_passes = self.cfg.cold_passes;
        let (mut chosen, mut references) = (Vec::new(), Vec::new());
        // Pages taken for pressure alone: no more than the excess, in pages.
        let mut pressure_pages = pass.shed.div_ceil(PAGE as u64);
        let block = self
            .blocks
            .get_mut(&base)
            .expect("block vanished under the lock");
        for &k in present {
            pass.counts.restored += (block.seen[k] & ACCESSED != 0) as u64;
            let (class, seen) = tick(block.seen[k], cold_passes);
            block.seen[k] = seen;
            pass.counts.count(class);
            let pressing = class == Class::C3 && pressure_pages > 0;
            let mut allowed = allow(class, age(seen), pressing, &self.cfg);
            if allowed.is_some() && seen & REFUSED != 0 {
                pass.counts.incompressible += 1;
                allowed = None;
            }
            if let Some(a) = allowed.as_mut().filter(|_| seen & NO_REFERENCE != 0) {
                a.patch = false;
                if !a.compress {
                    // Patch-only, and an earlier try found no reference.
                    pass.counts.not_allowed += 1;
                    allowed = None;
                }
            }
            if let Some(a) = allowed {
                pressure_pages -= (pressing && a.compress) as u64;
                chosen.push((k, a));
            } else if class == Class::C2 && self.cfg.tier_patch {
                // Read but not written: DE's reference pages (patching.rs).
                references.push(k);
            }
        }
        for k in references {
            self.note_reference(base, k);
        }
        if pass.evict && !chosen.is_empty() {
            self.evict_chosen(base, chunk, &chosen, pass);
        }
        let block = &self.blocks[&base];
        pass.private_resident += present
            .iter()
            .filter(|&&k| matches!(block.pages[k], Page::Anon | Page::Diverged(_)))
            .count() as u64;
    }

    /// Evicts the chosen pages; what they freed counts against the excess.
    fn evict_chosen(
        &mut self,
        base: usize,
        chunk: Range<usize>,
        chosen: &[(usize, Allow)],
        pass: &mut Pass,
    ) {
        let stored = |st: &State| {
            st.evictions.as_ref().map_or(0, |ev| {
                let b = ev.lock().store.bytes();
                b.payload + b.overhead
            })
        };
        let before = stored(self);
        let mut rep = EvictReport::default();
        self.evict_pages(base, chunk, chosen, &mut rep);
        pass.counts.evicted += rep.evicted;
        pass.counts.not_eligible += rep.not_eligible;
        pass.counts.refused += rep.refused;
        // Only a patch was allowed and none applied (or nothing was allowed).
        pass.counts.not_allowed += rep.not_allowed + rep.unpatched;
        let freed = (rep.evicted * PAGE as u64).saturating_sub(stored(self).saturating_sub(before));
        pass.shed = pass.shed.saturating_sub(freed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
