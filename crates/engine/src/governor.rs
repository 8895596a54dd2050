//! The pass governor: whether clock passes under pressure pay, and how
//! long the next one waits (pass.rs runs the passes; the governor only
//! decides their pace and how much they may shed, from counts the pass and
//! the fault thread give it).

use std::time::Duration;

use crate::sys::PAGE;

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
