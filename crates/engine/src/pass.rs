//! A clock pass (clock.rs says what the clock is and decides): the clock's
//! policy run over the pages a scan looks at. A pass begins with the
//! footprint against the watermarks, classifies the pages of each
//! protected chunk, and hands the pages its policy chose, with the
//! references it found, to tiering through `Tiering`, a function the
//! engine gives the scan: eviction and patching sit above the scan and the
//! clock, which never call up into them.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// A pass under pressure pays when it evicts at least this many pages and
/// what passes evicted stays out (`Governor`).
pub const PAID_PAGES: u64 = 256;
/// Until a pass pays, each pass under pressure waits twice as long as the
/// last, up to this many clock intervals ...
pub const MAX_BACKOFF: u32 = 16;
/// ... and while what passes evict comes back, they stop for this many
/// clock intervals (a minute at the default interval) before one probes again.
pub const SUSPEND: u32 = 120;
/// The governor's counts are halved when its evictions reach this many pages
/// (1 GiB), so it follows what the program does now.
const DECAY_PAGES: u64 = 1 << 18;
/// Until a pass has paid, and again after a stop, a pass under pressure
/// sheds at most this many pages: a probe (4 MiB).
pub const PROBE_PAGES: u64 = 1024;
/// A page touched within this many clock intervals of its eviction (10 s at
/// the default interval) was not cold: its restore counts as churn.
pub const YOUNG_INTERVALS: u32 = 20;

/// How soon after its eviction a restore counts as churn, under `cfg`.
pub(crate) fn young(cfg: &crate::config::Config) -> Duration {
    cfg.clock_interval * YOUNG_INTERVALS
}

/// Whether passes under pressure pay, and the wait it sets before the next.
///
/// A pass pays in pages that stay evicted; it costs a look at every page (a
/// full scan) and, for every page the program touches again, a fault that
/// restores it. With no accessed bits the clock cannot see reads (clock.rs),
/// so on a program whose evicted pages are read back soon, passes evict what
/// the program needs next and undo it at the next touch. Where the kernel
/// can swap, its own reclaim, which sees reads, relieves the shortage too
/// and would have chosen better; there passes must show that they pay.
/// Where it cannot (no swap free), passes are all that keeps the program
/// under its limit, and they shed what the shortage asks, backing off only
/// when they find too little to evict.
///
/// A page touched long after its eviction was cold for that long, and its
/// restore is what eviction is for (a job that reads its data back once, at
/// the end). So the governor keeps, over the passes of the program's life
/// (halved every `DECAY_PAGES` evicted), the pages passes evicted and the
/// pages restored *young*: within `YOUNG_INTERVALS` clock intervals of
/// their eviction (the fault thread counts them as it restores, fault.rs).
/// *Churn* is at least `PAID_PAGES` evicted and at least half as many
/// restored young. Where the kernel swaps:
/// - a pass is a *probe* until passes are trusted: it sheds at most
///   `PROBE_PAGES`, and if it evicted `PAID_PAGES` the next pass waits
///   `YOUNG_INTERVALS`, the time its evictions need to show whether they
///   come back young;
/// - the pass after a probe's wait trusts passes if there is no churn;
///   trusted passes shed what the shortage asks, the next after one clock
///   interval when a pass evicted `PAID_PAGES`;
/// - churn stops passes for `SUSPEND` intervals and ends the trust: the
///   pass after the stop probes again.
///
/// Everywhere, a pass that evicted less than `PAID_PAGES` doubles the wait
/// (up to `MAX_BACKOFF`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Governor {
    evicted: u64,
    restored_young: u64,
    /// The fault thread's count of young restores at the last judgment.
    young_seen: u64,
    /// Passes shed all the shortage asks.
    trusted: bool,
    /// A probe's evictions are waiting for their verdict.
    awaiting: bool,
    /// Clock intervals before the next pass under pressure.
    pub wait: u32,
}

impl Governor {
    /// Counts a pass under pressure that evicted `evicted` pages, given the
    /// young restores so far (`fault::Counts::restored_young`) and whether
    /// the kernel can swap, and sets the wait before the next.
    pub fn judge(&mut self, evicted: u64, young: u64, kernel_swaps: bool) {
        self.restored_young += young.saturating_sub(self.young_seen);
        self.young_seen = young;
        let churn = self.evicted >= PAID_PAGES && self.restored_young * 2 >= self.evicted;
        self.evicted += evicted;
        if self.evicted >= DECAY_PAGES {
            self.evicted /= 2;
            self.restored_young /= 2;
        }
        let verdict = std::mem::take(&mut self.awaiting);
        let enough = evicted >= PAID_PAGES;
        if kernel_swaps && churn {
            self.trusted = false;
            self.wait = SUSPEND;
            return;
        }
        self.trusted |= verdict || !kernel_swaps;
        self.awaiting = !self.trusted && enough;
        self.wait = if self.awaiting {
            YOUNG_INTERVALS
        } else if enough {
            1
        } else {
            (self.wait.max(1) * 2).min(MAX_BACKOFF)
        };
    }

    /// What a pass under pressure may shed of the `bytes` the shortage asks.
    pub fn allowed_shed(&self, bytes: u64, kernel_swaps: bool) -> u64 {
        match self.trusted || !kernel_swaps {
            true => bytes,
            false => bytes.min(PROBE_PAGES * PAGE as u64),
        }
    }

    /// Whether passes stop because what they evict comes back.
    pub fn suspended(&self) -> bool {
        self.wait >= SUSPEND
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A governor fed passes, with the fault thread's count of young restores.
    struct Run {
        g: Governor,
        young: u64,
        kernel_swaps: bool,
    }

    impl Run {
        fn swapping() -> Run {
            Run {
                g: Governor::default(),
                young: 0,
                kernel_swaps: true,
            }
        }

        /// A pass that evicted `evicted` pages, after `young` restores soon
        /// after eviction; the wait it set.
        fn pass(&mut self, evicted: u64, young: u64) -> u32 {
            self.young += young;
            self.g.judge(evicted, self.young, self.kernel_swaps);
            self.g.wait
        }

        fn shed(&self, bytes: u64) -> u64 {
            self.g.allowed_shed(bytes, self.kernel_swaps)
        }
    }

    const PROBE: u64 = PROBE_PAGES * PAGE as u64;

    #[test]
    fn a_probe_waits_for_its_verdict_then_passes_are_trusted() {
        let mut r = Run::swapping();
        assert_eq!(r.shed(1 << 30), PROBE, "nothing paid yet: a probe");
        assert_eq!(r.shed(4096), 4096);
        assert_eq!(
            r.pass(PROBE_PAGES, 0),
            YOUNG_INTERVALS,
            "awaiting the verdict"
        );
        assert_eq!(r.shed(1 << 30), PROBE, "not trusted before the verdict");
        assert_eq!(r.pass(5000, 10), 1, "few came back young: trusted");
        assert_eq!(r.shed(1 << 30), 1 << 30);
        assert_eq!(r.pass(10, 0), 2, "too little evicted: backs off");
        assert_eq!(r.shed(1 << 30), 1 << 30, "still trusted");
    }

    #[test]
    fn churn_stops_passes_and_ends_the_trust() {
        let mut r = Run::swapping();
        r.pass(PROBE_PAGES, 0);
        assert_eq!(
            r.pass(PROBE_PAGES, PROBE_PAGES),
            SUSPEND,
            "the probe came back young"
        );
        assert!(r.g.suspended());
        assert_eq!(r.shed(1 << 30), PROBE, "after a stop, a probe");
        // The probe after the stop: still churning, another stop.
        assert_eq!(r.pass(300, 200), SUSPEND);
        // Evictions that stay out bring passes back once churn falls under half.
        let mut passes = 0;
        while r.g.suspended() {
            r.pass(1000, 0);
            passes += 1;
        }
        assert!(passes <= 3, "{passes}");
        assert_eq!(r.g.wait, YOUNG_INTERVALS, "a probe again");
        assert_eq!(r.pass(1000, 0), 1, "its verdict: trusted");
    }

    #[test]
    fn without_swap_passes_shed_all_and_never_stop() {
        let mut r = Run {
            kernel_swaps: false,
            ..Run::swapping()
        };
        assert_eq!(r.shed(1 << 30), 1 << 30);
        assert_eq!(r.pass(1000, 0), 1);
        assert_eq!(
            r.pass(1000, 1000),
            1,
            "churn, but nothing else relieves memory"
        );
        assert!(!r.g.suspended());
        assert_eq!(r.pass(10, 0), 2);
    }

    #[test]
    fn passes_that_evict_too_little_back_off() {
        let mut r = Run::swapping();
        let waits: Vec<u32> = (0..6).map(|_| r.pass(10, 0)).collect();
        assert_eq!(waits, [2, 4, 8, 16, 16, 16]);
    }

    #[test]
    fn too_little_evicted_is_no_evidence_of_churn() {
        let mut r = Run::swapping();
        r.pass(100, 0);
        r.pass(100, 100);
        assert!(
            !r.g.suspended(),
            "100 pages evicted, 100 back: too few to judge"
        );
        assert_eq!(r.g.wait, 4);
    }

    #[test]
    fn the_account_follows_the_present() {
        let mut r = Run::swapping();
        r.pass(DECAY_PAGES - 1, 0);
        r.pass(1000, DECAY_PAGES / 2);
        assert!(r.g.suspended());
        assert!(r.g.evicted < DECAY_PAGES, "halved: {}", r.g.evicted);
        assert_eq!(r.g.restored_young, DECAY_PAGES / 4);
    }
}
