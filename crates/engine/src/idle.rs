//! How often the scan looks at a page (kernel KSM's smart_scan, in user space).
//!
//! Most pages a scan reads are neither zero nor a duplicate, and they stay
//! so: re-reading and re-hashing them every scan is the bulk of the scan's
//! cost on a long-running program. So each page carries an idle level, the
//! number of consecutive looks that found nothing to do (capped at
//! MAX_LEVEL). Level 0 or 1: looked at every scan (a first look can never act,
//! the volatility check needs two). Level 2: every 2nd scan, level 3: every
//! 4th, and so on to level 7: every 64th. The period is aligned to the
//! engine's scan number, not to the page, so every 64th scan looks at every
//! page at once: two identical idle pages still meet in one scan's unstable
//! index. A page that was folded or merged starts again at level 0.
//!
//! Kernel KSM stops at every 8th scan, but ksmd's rate is set apart
//! (`pages_to_scan`); here a scan looks at every page due, once a second
//! under the preload, so the cap is what an idle program pays: at a cap of
//! 8 scans a program idling on 1 GiB would re-read all of it every 8
//! seconds, at this one every 64. A page written after it went idle waits
//! up to two such periods to be shared (the volatility check needs two
//! looks); a page reaches the slowest level only after 64 scans.
//!
//! The level lives in the page's `seen` word, beside what the previous look
//! saw and the clock's bits (seen.rs says which bits are which).

use crate::seen::{level, with_level};

const MAX_LEVEL: u32 = 7;

/// Whether a page whose `seen` word this is is looked at in scan `scan_no`.
pub fn due(seen: u32, scan_no: u64) -> bool {
    match level(seen) {
        0 | 1 => true,
        l => scan_no.is_multiple_of(1 << (l - 1)),
    }
}

/// `seen` after a look that did (`acted`) or did not fold or merge the page.
pub fn after_look(seen: u32, acted: bool) -> u32 {
    let next = if acted {
        0
    } else {
        (level(seen) + 1).min(MAX_LEVEL)
    };
    with_level(seen, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seen::{with_look, LOOK_MASK};

    #[test]
    fn idle_pages_are_looked_at_every_2nd_4th_and_on_to_every_64th_scan_all_together() {
        let mut seen = with_look(0, 0x1234_5678 | 2);
        assert_eq!(
            seen & LOOK_MASK,
            0x34_567a,
            "the look keeps its low 22 bits"
        );
        let mut looks = Vec::new();
        for scan_no in 0..300u64 {
            if due(seen, scan_no) {
                looks.push(scan_no);
                seen = after_look(seen, false);
            }
        }
        assert_eq!(looks, [0, 1, 2, 4, 8, 16, 32, 64, 128, 192, 256]);
        assert_eq!(seen & LOOK_MASK, 0x34_567a, "levels never touch the look");
        assert_eq!(
            level(after_look(seen, true)),
            0,
            "a page acted on starts again"
        );
        assert_eq!(
            after_look(seen | 0xf8c0_0000, false) & 0xf8c0_0000,
            0xf8c0_0000,
            "levels never touch the clock's bits"
        );
        assert!(
            (0..8).all(|n| due(0, n)),
            "a page never looked at is always due"
        );
    }
}
