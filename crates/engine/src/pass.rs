//! A clock pass (clock.rs says what the clock is and decides): the clock's
//! policy run over the pages a scan looks at. A pass begins with the
//! footprint against the watermarks, classifies the pages of each
//! protected chunk, and hands the pages its policy chose, with the
//! references it found, to tiering through `Tiering`, a function the
//! engine gives the scan: eviction and patching sit above the scan and the
//! clock, which never call up into them.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use crate::clock::{allow, tick, Allow, Class, PassCounts};
use crate::config::Tier;
use crate::pressure::Reading;
use crate::seen::{age, ACCESSED, NO_REFERENCE, REFUSED};
use crate::space::Page;
use crate::state::State;
use crate::stats::ScanReport;
use crate::store::PageStore;
use crate::sys::PAGE;

/// What tiering does with the pages of a protected chunk a pass chose
/// (block base, the chunk's pages, each chosen page with what it may
/// become, the pages to note as patch references): evict.rs `tier_chunk`.
pub(crate) type Tiering =
    fn(&mut State, usize, Range<usize>, &[(usize, Allow)], &[usize], &mut Pass);

/// One pass in progress (local to the scan running it).
pub(crate) struct Pass {
    pub counts: PassCounts,
    /// Eviction works (userfaultfd MISSING mode and the fault thread).
    pub evict: bool,
    /// Bytes still to shed under pressure (0: no pressure).
    pub shed: u64,
    /// The kernel could swap when the pass began (pressure.rs `Reading`).
    kernel_swaps: bool,
    private_resident: u64,
    /// Where to spill, and how much, before the pass walks the blocks.
    spill: Option<(Arc<dyn PageStore>, u64)>,
    tier: Tiering,
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
    /// Starts a clock pass if tiering is on (with `Tier::Pressure`: while
    /// `reading` says memory is short, pressure.rs) and the last one is at
    /// least `clock_interval` old (under pressure, times the back-off);
    /// `tier` takes the pages its policy chooses.
    pub(crate) fn begin_pass(&mut self, tier: Tiering, reading: Option<Reading>) -> Option<Pass> {
        let reading = match self.cfg.tier {
            Tier::Off => return None,
            Tier::On => None,
            Tier::Pressure => {
                let r = reading?;
                if !self.note_pressure(r) {
                    return None;
                }
                Some(r)
            }
        };
        let now = Instant::now();
        if !self.pass_due(now) {
            return None;
        }
        self.clock.last_pass = Some(now);
        let evict = self.cfg.evict && self.fault_thread_ready();
        if self.cfg.evict && !evict {
            self.stats.fallbacks.evict += 1;
        }
        let footprint = self.footprint();
        self.clock.stats.footprint = footprint;
        let shed = match reading {
            Some(r) => {
                let shed = r.shed(footprint, &self.cfg);
                self.clock.governor.allowed_shed(shed, r.kernel_swaps())
            }
            None => self.excess(footprint),
        };
        let mut spill = None;
        if shed > 0 {
            self.clock.stats.pressure_passes += 1;
            self.clock.stats.spill_requested += shed;
            spill = self
                .restoring
                .evictions
                .as_ref()
                .map(|ev| (ev.lock().store.clone(), shed));
        }
        Some(Pass {
            counts: PassCounts::default(),
            evict,
            shed,
            kernel_swaps: reading.is_some_and(|r| r.kernel_swaps()),
            private_resident: 0,
            spill,
            tier,
        })
    }

    /// Whether the last pass is at least `clock_interval` old, times the
    /// wait the governor set after the last pass under pressure (`Governor`).
    fn pass_due(&self, now: Instant) -> bool {
        let wait = self.cfg.clock_interval * self.clock.governor.wait.max(1);
        self.clock
            .last_pass
            .is_none_or(|t| now.duration_since(t) >= wait)
    }

    /// Records a look at memory; whether it is short and a pass is due.
    pub(crate) fn pressure_pass_due(&mut self, reading: Reading) -> bool {
        self.note_pressure(reading) && self.pass_due(Instant::now())
    }

    /// Records a look at memory; whether it is short (pressure.rs), which
    /// lasts until the usage is back under the low mark.
    pub(crate) fn note_pressure(&mut self, reading: Reading) -> bool {
        let short = reading.short(self.clock.pressure, &self.cfg);
        self.clock.pressure = short;
        self.clock.stats.pressure_reads += 1;
        self.clock.stats.pressure = reading;
        short
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

    /// Ends a pass: its counts go to the statistics and to the scan's report.
    pub(crate) fn end_pass(&mut self, pass: Pass, spilled: u64, rep: &mut ScanReport) {
        self.clock.private_resident = pass.private_resident;
        if self.cfg.tier == Tier::Pressure {
            let young = self
                .restoring
                .evictions
                .as_ref()
                .map_or(0, |ev| ev.lock().counts.restored_young);
            let g = &mut self.clock.governor;
            g.judge(pass.counts.evicted, young, pass.kernel_swaps);
            self.clock.stats.backoff = g.wait;
            self.clock.stats.suspensions += g.suspended() as u64;
        }
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
    /// hands what the policy allows to tiering.
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
        // Driven by pressure, every page compressed counts against it.
        let mut pressure_pages = pass.shed.div_ceil(PAGE as u64);
        let budgeted = self.cfg.tier == Tier::Pressure;
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
            if budgeted && pressure_pages == 0 {
                allowed = allowed
                    .map(|a| Allow {
                        compress: false,
                        ..a
                    })
                    .filter(|a| a.patch);
            }
            if let Some(a) = allowed {
                let counted = if budgeted {
                    a.compress
                } else {
                    pressing && a.compress
                };
                pressure_pages -= counted as u64;
                chosen.push((k, a));
            } else if class == Class::C2 && self.cfg.tier_patch {
                // Read but not written: DE's reference pages (patching.rs).
                references.push(k);
            }
        }
        let tier = pass.tier;
        tier(self, base, chunk, &chosen, &references, pass);
        let block = &self.blocks[&base];
        pass.private_resident += present
            .iter()
            .filter(|&&k| matches!(block.pages[k], Page::Anon | Page::Diverged(_)))
            .count() as u64;
    }
}
