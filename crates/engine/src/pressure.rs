//! Pressure-driven tiering: when tiering runs by default (`Tier::Pressure`),
//! the clock makes passes only while memory is short, and sheds as much as
//! the shortage asks for (the way Meta's TMO drives proactive reclaim from
//! PSI).
//!
//! A *reading* is the binding limit and its usage (memlimit.rs: the memory
//! cgroup's limit against its working set, else `PAGEFOLD_MEMORY` against
//! the process's resident memory, else the machine's memory against what is
//! not available) and PSI's `some avg10` (the group's memory.pressure, else
//! the machine's /proc/pressure/memory). Memory is short from the moment the
//! usage passes `pressure_high` percent of the limit, or the group's *own*
//! PSI passes `pressure_psi`, until the usage is back under `pressure_low`
//! percent and the PSI under its threshold. The machine's PSI alone never
//! starts an episode: another group's stalls against its own limit say
//! nothing about this process's memory. While memory is short each pass
//! sheds the usage above the low mark plus, if PSI (either) is above its
//! threshold, `min(avg10, 20)` percent of the engine's footprint, so
//! passes shed faster the more the program stalls.
//!
//! Reading costs a few small files (0.3-0.5 ms on a cgroup v1 machine,
//! where each read of memory.stat takes about 0.1 ms), about 0.1% of a
//! core at two looks a second; the background scanner
//! reads once a clock interval (pressure polls) and otherwise keeps its
//! schedule, so a program with room to spare gets no clock pass, no page
//! classified and no tiering metadata.

use std::path::PathBuf;

use serde::Serialize;

use crate::config::Config;
use crate::memlimit::{self, Binding, Group, Sources};

/// PSI's share counted as shed per pass at most (percent of the footprint).
pub const PSI_SHED_MAX_PERCENT: f64 = 20.0;

/// What the gauge reads from: resolved once, when first needed.
pub struct Gauge {
    sources: Sources,
    group: Option<Group>,
    user_limit: Option<u64>,
    /// The group's own PSI file (true), or the machine's.
    psi: Option<(PathBuf, bool)>,
}

/// One look at memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Reading {
    /// The limit that binds and the usage against it (bytes); None: none found.
    pub limit: u64,
    pub used: u64,
    pub source: Option<memlimit::Source>,
    /// PSI some avg10 (percent), and whether it is the group's own.
    pub psi: Option<f64>,
    pub psi_own: bool,
}

impl Gauge {
    /// The live gauge, under `cfg`'s limit and fault injection.
    pub fn new(cfg: &Config) -> Gauge {
        Gauge::from_sources(Sources::default(), cfg)
    }

    pub fn from_sources(sources: Sources, cfg: &Config) -> Gauge {
        let group = (!cfg.inject.hide_cgroup)
            .then(|| memlimit::live_group(&sources))
            .flatten();
        let own = group.as_ref().and_then(Group::psi_file).map(|f| (f, true));
        let system = Some(sources.system_psi.clone())
            .filter(|f| f.is_file())
            .map(|f| (f, false));
        let psi = (!cfg.inject.hide_psi).then(|| own.or(system)).flatten();
        Gauge {
            sources,
            group,
            user_limit: cfg.memory_limit,
            psi,
        }
    }

    pub fn read(&self) -> Reading {
        let binding = memlimit::binding(&self.sources, self.group.as_ref(), self.user_limit);
        let psi = self.psi.as_ref().and_then(|(f, own)| {
            let v = memlimit::parse_psi(&std::fs::read_to_string(f).ok()?)?;
            Some((v, *own))
        });
        let Binding {
            source,
            limit,
            used,
        } = binding.unwrap_or(Binding {
            source: memlimit::Source::Machine,
            limit: 0,
            used: 0,
        });
        Reading {
            limit,
            used,
            source: binding.map(|_| source),
            psi: psi.map(|p| p.0),
            psi_own: psi.is_some_and(|p| p.1),
        }
    }
}

impl Reading {
    fn mark(&self, percent: u32) -> u64 {
        (self.limit as u128 * percent as u128 / 100) as u64
    }

    fn psi_above(&self, cfg: &Config) -> bool {
        self.psi.is_some_and(|p| p > cfg.pressure_psi)
    }

    /// Whether memory is short, given whether it was at the last pass.
    pub fn short(&self, was_short: bool, cfg: &Config) -> bool {
        if self.limit == 0 {
            return false;
        }
        let own_psi = self.psi_own && self.psi_above(cfg);
        if self.used > self.mark(cfg.pressure_high) || own_psi {
            return true;
        }
        was_short && (self.used > self.mark(cfg.pressure_low) || self.psi_above(cfg))
    }

    /// Bytes a pass should shed while memory is short, with the engine's
    /// footprint (see the module comment).
    pub fn shed(&self, footprint: u64, cfg: &Config) -> u64 {
        let over = self.used.saturating_sub(self.mark(cfg.pressure_low));
        let stall = match self.psi.filter(|_| self.psi_above(cfg)) {
            Some(p) => (footprint as f64 * p.min(PSI_SHED_MAX_PERCENT) / 100.0) as u64,
            None => 0,
        };
        (over + stall).max(crate::sys::PAGE as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(used_mb: u64, psi: Option<f64>, own: bool) -> Reading {
        Reading {
            limit: 1000 << 20,
            used: used_mb << 20,
            source: Some(memlimit::Source::Cgroup),
            psi,
            psi_own: own,
        }
    }

    #[test]
    fn short_from_the_high_mark_until_below_the_low_one() {
        let cfg = Config::default();
        assert!(!at(800, None, false).short(false, &cfg));
        assert!(at(810, None, false).short(false, &cfg));
        assert!(at(720, None, false).short(true, &cfg), "hysteresis");
        assert!(!at(690, None, false).short(true, &cfg));
        assert!(!at(720, None, false).short(false, &cfg));
        let none = Reading::default();
        assert!(!none.short(true, &cfg), "no limit known, nothing read");
    }

    #[test]
    fn only_the_groups_own_psi_starts_an_episode() {
        let cfg = Config::default();
        assert!(at(100, Some(5.0), true).short(false, &cfg));
        assert!(!at(100, Some(5.0), false).short(false, &cfg));
        assert!(at(100, Some(5.0), false).short(true, &cfg), "but keeps one");
        assert!(!at(100, Some(0.5), true).short(false, &cfg), "below 1%");
    }

    #[test]
    fn shed_follows_usage_and_stalls() {
        let cfg = Config::default();
        assert_eq!(at(900, None, false).shed(0, &cfg), 200 << 20);
        assert_eq!(
            at(900, Some(10.0), true).shed(500 << 20, &cfg),
            (200 << 20) + (50 << 20)
        );
        assert_eq!(
            at(100, Some(90.0), true).shed(500 << 20, &cfg),
            100 << 20,
            "at most 20% of the footprint for stalls"
        );
        assert_eq!(at(100, None, false).shed(0, &cfg), 4096, "at least a page");
    }
}
