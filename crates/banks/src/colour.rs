//! Serving pages of chosen banks only: fill a page, read its PFN, keep it if
//! its banks are in the set, otherwise give it back and try again.
//!
//! The kernel hands out the most recently freed page first (per-CPU free
//! lists are last in, first out), so a page given back would come straight
//! back on the retry. A [`Holder`] therefore takes fresh anonymous pages
//! right after they were given back: those are most likely the very pages
//! rejected, and they stay held until the run is done. In round r it takes
//! r + 1 times as many as were given back, so that free lists whose head is
//! mostly outside the set (another run's refused pages, let go when that run
//! ended) are drained instead of being drawn from again and again.
//! The number of rounds and the pages held are bounded; pages still wrong
//! then are left as they are (correct memory, only not coloured) and counted.
//!
//! [`colour_run`] is generic over where pages come from ([`Pages`]): the
//! engine fills slots of its memfd, the tests fill plain anonymous memory.
//! Colouring only chooses which physical page backs a still-empty slot; no
//! content is involved, so it cannot change a byte anyone reads.

use std::time::Instant;

use serde::Serialize;

use crate::map::{bits_of, BankMap, Source};
use crate::mem::{Huge, Populated};
use crate::set::BankSet;

/// What to colour by: a bank map and the banks a program's pages may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Colouring {
    pub map: BankMap,
    pub set: BankSet,
}

impl Colouring {
    /// The set `set_text` (`0-7,12`) under the map `functions`: a table
    /// entry's name, or hex masks (`0x2040,0x24000`); without it, the table
    /// entry assumed for this CPU. One-line errors.
    pub fn parse(set_text: &str, functions: Option<&str>) -> Result<Colouring, String> {
        let map = match functions.map(str::trim).filter(|f| !f.is_empty()) {
            None => crate::map::assumed_for_this_cpu().0,
            Some(f) => parse_map(f)?,
        };
        let set = BankSet::parse(set_text, map.bank_count()).map_err(|e| e.to_string())?;
        if !map.reachable(&set) {
            let inside: Vec<String> = map
                .functions
                .iter()
                .filter(|&&f| f & (crate::PAGE - 1) != 0)
                .map(|&f| bits_of(f))
                .collect();
            return Err(format!(
                "bank set {set} cannot be met by 4 KiB pages: function {} uses an address bit \
                 inside the page, so a page always covers both banks it separates",
                inside.join(", ")
            ));
        }
        Ok(Colouring { map, set })
    }

    /// Whether page `pfn` lies wholly in the set.
    pub fn fits(&self, pfn: u64) -> bool {
        self.map.page_fits(pfn, &self.set)
    }
}

/// A table entry's name or comma-separated hex masks.
fn parse_map(text: &str) -> Result<BankMap, String> {
    if let Some(m) = BankMap::known(text) {
        return Ok(m);
    }
    let masks = text
        .split(',')
        .map(|m| {
            let hex = m.trim().trim_start_matches("0x");
            u64::from_str_radix(hex, 16)
                .ok()
                .filter(|&v| v != 0)
                .ok_or_else(|| format!("'{}' is neither a bank map name nor a hex mask", m.trim()))
        })
        .collect::<Result<Vec<u64>, String>>()?;
    if masks.is_empty() || masks.len() > 6 {
        return Err(format!(
            "{} bank functions given; 1 to 6 are supported",
            masks.len()
        ));
    }
    Ok(BankMap::new("given", Source::Given, masks))
}

/// Rounds of fill, check and retry.
pub const MAX_ROUNDS: usize = 24;
/// Pages held aside at most, per page of the run (plus `HOLD_SLACK`).
pub const HOLD_PER_PAGE: usize = 8;
pub const HOLD_SLACK: usize = 4096;
/// Pages held beyond those given back each round: the holder's own page
/// tables and other allocations in between take freed pages too.
pub const HOLD_EXTRA: usize = 32;

/// A run of pages whose backing can be filled and given back.
pub trait Pages {
    /// Makes the pages `which` present (zero-filled) and writes their PFNs
    /// into `pfns` (same order; 0 where not present or not visible).
    fn fill(&mut self, which: &[usize], pfns: &mut [u64]) -> bool;
    /// Gives the backing of page `i` back to the kernel (empty again).
    fn give_back(&mut self, i: usize);
}

/// What colouring one run cost and achieved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Outcome {
    /// Pages of the run now backed by a page of the set.
    pub coloured: u64,
    /// Pages given back because their banks were outside the set.
    pub rejected: u64,
    /// Pages left uncoloured (rounds or the hold bound ran out).
    pub unmet: u64,
    /// PFNs read as zero (no CAP_SYS_ADMIN): nothing could be checked.
    pub pfns_hidden: bool,
    /// A fill failed (out of memory, a failed syscall): the run is uncoloured.
    pub failed: bool,
    /// Time spent, nanoseconds.
    pub ns: u64,
}

impl Outcome {
    /// Whether the set was met for every page.
    pub fn met(&self) -> bool {
        !self.pfns_hidden && !self.failed && self.unmet == 0
    }
}

/// Backs every page of `pages` (`n` of them) with a page for which `fits`
/// holds, as far as the bounds allow.
pub fn colour_run(pages: &mut dyn Pages, n: usize, fits: &dyn Fn(u64) -> bool) -> Outcome {
    let start = Instant::now();
    let mut out = Outcome::default();
    let mut holder = Holder::new(n * HOLD_PER_PAGE + HOLD_SLACK);
    let mut pending: Vec<usize> = (0..n).collect();
    let mut pfns = vec![0u64; n];
    for round in 0..MAX_ROUNDS {
        let pfns = &mut pfns[..pending.len()];
        if !pages.fill(&pending, pfns) {
            out.failed = true;
            break;
        }
        if round == 0 && pfns.iter().all(|&p| p == 0) {
            out.pfns_hidden = true;
            break;
        }
        let wrong: Vec<usize> = pending
            .iter()
            .zip(pfns.iter())
            .filter(|(_, &pfn)| pfn == 0 || !fits(pfn))
            .map(|(&i, _)| i)
            .collect();
        out.coloured += (pending.len() - wrong.len()) as u64;
        if wrong.is_empty() {
            break;
        }
        // Pages given back in round r are retried after taking r + 1 times as
        // many: when the free lists' head is mostly outside the set (pages a
        // previous run held and let go), holding grows until it is drained.
        let hold = (wrong.len() * (round + 1) + HOLD_EXTRA).min(holder.room());
        if round + 1 == MAX_ROUNDS || hold < wrong.len() {
            out.unmet = wrong.len() as u64;
            break;
        }
        wrong.iter().for_each(|&i| pages.give_back(i));
        out.rejected += wrong.len() as u64;
        holder.take(hold);
        pending = wrong;
    }
    if out.pfns_hidden || out.failed {
        out.coloured = 0;
        out.unmet = n as u64;
    }
    drop(holder);
    out.ns = start.elapsed().as_nanos() as u64;
    out
}

/// Anonymous pages taken from the kernel and held until dropped.
pub struct Holder {
    regions: Vec<Populated>,
    held: usize,
    limit: usize,
}

impl Holder {
    /// A holder of at most `limit` pages.
    pub fn new(limit: usize) -> Holder {
        Holder {
            regions: Vec::new(),
            held: 0,
            limit,
        }
    }

    /// Pages it may still take.
    pub fn room(&self) -> usize {
        self.limit.saturating_sub(self.held)
    }

    /// Takes `pages` fresh pages (written, so each is a page of its own).
    pub fn take(&mut self, pages: usize) {
        if let Some(r) = Populated::new(pages * crate::PAGE as usize, Huge::Default) {
            self.regions.push(r);
            self.held += pages;
        }
    }

    pub fn held(&self) -> usize {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fake pages whose PFNs come from a counter: every fill gets new PFNs.
    struct Counter {
        next: u64,
        given_back: usize,
        hidden: bool,
    }

    impl Pages for Counter {
        fn fill(&mut self, which: &[usize], pfns: &mut [u64]) -> bool {
            for p in pfns.iter_mut().take(which.len()) {
                self.next += 1;
                *p = if self.hidden { 0 } else { self.next };
            }
            true
        }
        fn give_back(&mut self, _: usize) {
            self.given_back += 1;
        }
    }

    #[test]
    fn keeps_fitting_pages_and_retries_the_rest() {
        let mut c = Counter {
            next: 0,
            given_back: 0,
            hidden: false,
        };
        let out = colour_run(&mut c, 100, &|pfn| pfn % 2 == 0);
        assert!(out.met(), "{out:?}");
        assert_eq!(out.coloured, 100);
        assert_eq!(out.rejected as usize, c.given_back);
        assert!(out.rejected >= 50);
    }

    #[test]
    fn hidden_pfns_give_up_at_once() {
        let mut c = Counter {
            next: 0,
            given_back: 0,
            hidden: true,
        };
        let out = colour_run(&mut c, 10, &|_| true);
        assert!(out.pfns_hidden && !out.met());
        assert_eq!((out.coloured, out.unmet, c.given_back), (0, 10, 0));
    }

    #[test]
    fn colouring_parses_maps_and_refuses_sets_pages_cannot_meet() {
        let c = Colouring::parse("0-7", Some("coffee-lake-ddr4-1rank")).unwrap();
        assert!(c.fits(0) && !c.fits(1 << (19 - 12)));
        let c = Colouring::parse("1", Some("0x22000,0x44000,0x88000")).unwrap();
        assert_eq!(c.map.bank_count(), 8);
        assert!(c.fits(1 << (13 - 12)));
        let e = Colouring::parse("0,2", Some("coffee-lake-ddr4-1rank")).unwrap_err();
        assert!(e.contains("(6, 13)"), "{e}");
        let e = Colouring::parse("0-16", Some("coffee-lake-ddr4-1rank")).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
        assert!(Colouring::parse("0", Some("zz")).is_err());
        assert!(Colouring::parse("9-3", None).is_err());
    }

    #[test]
    fn an_impossible_set_is_bounded() {
        let mut c = Counter {
            next: 0,
            given_back: 0,
            hidden: false,
        };
        let out = colour_run(&mut c, 10, &|_| false);
        assert_eq!(out.unmet, 10);
        assert!(out.rejected <= (10 * (MAX_ROUNDS - 1)) as u64);
    }
}
