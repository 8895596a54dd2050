//! How much background scanning a program pays for: scan cost in proportion
//! to profit.
//!
//! A scanner that looks at every page at a fixed pace costs the same whether
//! it finds duplicates or not; on a program that keeps making fresh,
//! short-lived arrays it is pure overhead, and on an idle program whose pages
//! were all folded long ago it burns a core for nothing. So the background
//! scanner keeps an account, in nanoseconds of its own CPU time:
//!
//! - it is credited a fixed share of the program's own CPU time (the process's
//!   CPU time less the scanner's), so a busy program pays a small, fixed tax;
//! - every page the engine hands out earns `NS_PER_FRESH_PAGE`, enough for the
//!   two looks a page needs before it can be merged (the first look records
//!   its content, the second acts if it did not change), so new memory is
//!   scanned even while the program sleeps;
//! - every page a scan folds or merges earns `NS_PER_SAVED_PAGE`, so scanning
//!   that saves memory pays for more of itself;
//! - a scan is started only while the account is not overdrawn.
//!
//! And as kernel KSM's smart scan skips pages that did not merge, the
//! scanner backs off when a scan found nothing to do and nothing new to look
//! at (no page folded or merged, none changed since its last look): the
//! interval doubles, up to `MAX_BACKOFF` times, and is reset by any scan that
//! acts or sees new content, and by a wake-up from the program.

use std::time::Duration;

/// Credit per page of fresh memory handed out.
pub const NS_PER_FRESH_PAGE: u64 = 1_000;
/// Credit per page folded or merged.
pub const NS_PER_SAVED_PAGE: u64 = 5_000;
/// Credit before anything was earned: one small scan.
const START_CREDIT_NS: u64 = 20_000_000;
/// Longest interval, in multiples of the configured one.
pub const MAX_BACKOFF: u32 = 16;

/// The scanner's account.
pub struct Budget {
    share: f64,
    spent_ns: u64,
    earned_ns: u64,
    backoff: u32,
}

impl Budget {
    pub fn new(share: f64) -> Budget {
        Budget {
            share,
            spent_ns: 0,
            earned_ns: START_CREDIT_NS,
            backoff: 1,
        }
    }

    /// Whether a scan may start, with the process's CPU time so far and the
    /// pages handed out so far (both totals).
    pub fn may_scan(&self, process_cpu_ns: u64, fresh_pages: u64) -> bool {
        let program_ns = process_cpu_ns.saturating_sub(self.spent_ns);
        let allowed = self.earned_ns
            + (program_ns as f64 * self.share) as u64
            + fresh_pages.saturating_mul(NS_PER_FRESH_PAGE);
        self.spent_ns <= allowed
    }

    /// After a scan: what it cost, what it saved, and whether it saw content
    /// that changed since its last look (pages that may merge next time).
    pub fn record(&mut self, cpu_ns: u64, saved_pages: u64, saw_changes: bool) {
        self.spent_ns += cpu_ns;
        self.earned_ns += saved_pages.saturating_mul(NS_PER_SAVED_PAGE);
        self.backoff = if saved_pages == 0 && !saw_changes {
            (self.backoff * 2).min(MAX_BACKOFF)
        } else {
            1
        };
    }

    /// The program woke the scanner: something may have changed.
    pub fn woken(&mut self) {
        self.backoff = 1;
    }

    /// How long to wait before the next scan.
    pub fn interval(&self, base: Duration) -> Duration {
        base * self.backoff
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_memory_pays_for_two_looks_and_savings_for_more() {
        let mut b = Budget::new(0.0);
        assert!(b.may_scan(0, 0), "the start credit allows one scan");
        b.record(START_CREDIT_NS + 1, 0, true);
        assert!(!b.may_scan(0, 0));
        assert!(b.may_scan(0, 100), "fresh pages earn credit");
        b.record(200 * NS_PER_FRESH_PAGE, 0, true);
        assert!(!b.may_scan(0, 100));
        b.record(0, 1000, true);
        assert!(b.may_scan(0, 100), "saved pages earn credit");
    }

    #[test]
    fn the_program_pays_a_share_of_its_own_cpu() {
        let mut b = Budget::new(0.05);
        b.record(START_CREDIT_NS + 50_000_000, 0, true);
        // The scanner's own CPU time is not the program's.
        assert!(!b.may_scan(START_CREDIT_NS + 50_000_000 + 500_000_000, 0));
        assert!(b.may_scan(START_CREDIT_NS + 50_000_000 + 1_000_000_000, 0));
    }

    #[test]
    fn backs_off_while_nothing_happens() {
        let mut b = Budget::new(0.05);
        let base = Duration::from_millis(100);
        for _ in 0..10 {
            b.record(1, 0, false);
        }
        assert_eq!(b.interval(base), base * MAX_BACKOFF);
        b.record(1, 0, true);
        assert_eq!(b.interval(base), base);
        b.record(1, 0, false);
        b.record(1, 0, false);
        assert_eq!(b.interval(base), base * 4);
        b.woken();
        assert_eq!(b.interval(base), base);
    }
}
