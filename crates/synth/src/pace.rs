//! Pacing: spreading a fixed amount of work over at least a given time, as
//! a program that answers queries as they come in does. Zero folding and
//! merging act about two background scans (two seconds) after memory
//! settles, so a workload made to show them must keep its memory for
//! longer than that; pacing makes that true on a fast idle machine without
//! making the run longer on a loaded one (late steps start at once). Only
//! the timing depends on the clock, never the work or the output.

use std::time::{Duration, Instant};

pub struct Pacer {
    start: Instant,
    span: Duration,
    steps: usize,
}

impl Pacer {
    /// `steps` steps over at least `span` from now.
    pub fn new(span: Duration, steps: usize) -> Pacer {
        Pacer {
            start: Instant::now(),
            span,
            steps: steps.max(1),
        }
    }

    /// Sleeps until step `i` is due (no earlier than `i/steps` of the span).
    pub fn wait_for(&self, i: usize) {
        self.sleep(self.delay(i, Instant::now()));
    }

    /// Sleeps until `offset` after the start (at once if that has passed).
    pub fn wait_until(&self, offset: Duration) {
        self.sleep((self.start + offset).saturating_duration_since(Instant::now()));
    }

    fn sleep(&self, delay: Duration) {
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
    }

    /// How long step `i` still has to wait at `now`.
    fn delay(&self, i: usize, now: Instant) -> Duration {
        let due = self.start + self.span.mul_f64(i as f64 / self.steps as f64);
        due.saturating_duration_since(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_due_in_equal_shares_of_the_span_and_late_ones_do_not_wait() {
        let p = Pacer::new(Duration::from_secs(8), 4);
        let ms = |n| Duration::from_millis(n);
        assert_eq!(p.delay(0, p.start), Duration::ZERO);
        assert_eq!(p.delay(2, p.start), ms(4000));
        assert_eq!(p.delay(2, p.start + ms(1000)), ms(3000));
        assert_eq!(
            p.delay(1, p.start + ms(2500)),
            Duration::ZERO,
            "late: no wait"
        );
        assert_eq!(
            Pacer::new(Duration::ZERO, 10).delay(9, Instant::now()),
            Duration::ZERO
        );
        let t = Instant::now();
        Pacer::new(ms(200), 4).wait_for(2);
        assert!(t.elapsed() >= ms(100));
        let p = Pacer::new(Duration::ZERO, 1);
        p.wait_until(ms(150));
        assert!(p.start.elapsed() >= ms(150));
        let t = Instant::now();
        p.wait_until(ms(10));
        assert!(t.elapsed() < ms(10), "past offsets do not wait");
    }
}
