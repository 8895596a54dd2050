//! The de suite: Difference Engine's micro-benchmark (Gupta et al., OSDI
//! 2008, its Figures 5-7) on pagefold. Each workload (pagefold-synth's
//! `de-zero`, `de-random`, `de-identical`, `de-similar`) allocates pages of
//! one type, reads them, writes a constant byte at 16 fixed offsets of
//! each, and frees them, idle between the phases; the suite runs it plain
//! and under each of DE's mechanisms alone and together (`de-share`,
//! `de-patch`, `de-compress`, `de-all`, see `program`).
//!
//! DE plots savings over time. Here that is 1 - footprint(config, t) /
//! footprint(plain, t) for the first run of each configuration, plain's
//! footprint interpolated at each sample of the other run (both are
//! sampled from the program's start, and the phases start on a fixed
//! schedule, so the same t is the same phase in both). Every footprint is
//! the whole process's, memory for patches, compressed pages and the
//! engine's tables included, as DE counts it. The suite's tables (averages
//! and ratios, from `suite`) come first; this module adds the mean savings
//! in each phase, what the engine did, and one chart per page type.

use std::path::{Path, PathBuf};

use pagefold_synth::de::schedule;

use crate::program::engine_total;
use crate::suite_result::{SuiteResult, WorkloadResult};

/// The idle time a workload's command gave it (`--idle X`).
fn idle_of(cmd: &[String]) -> Option<f64> {
    let i = cmd.iter().position(|a| a == "--idle")?;
    cmd.get(i + 1)?.parse().ok()
}

/// Each phase as (name, start, end) in seconds from the program's start.
pub fn phases(cmd: &[String]) -> Vec<(&'static str, f64, f64)> {
    let Some(idle) = idle_of(cmd) else {
        return Vec::new();
    };
    let (starts, end) = schedule(idle);
    let ends = starts
        .iter()
        .skip(1)
        .map(|s| s.1)
        .chain(std::iter::once(end));
    starts
        .iter()
        .zip(ends)
        .map(|(&(name, start), end)| (name, start, end))
        .collect()
}

/// One sample of a run paired with plain's: (seconds, bytes, plain's bytes
/// interpolated there).
type Pair = (f64, f64, f64);

/// Each sample (ms, bytes) of `run` inside plain's span as (seconds,
/// bytes, plain's bytes interpolated there).
fn paired(plain: &[(u64, u64)], run: &[(u64, u64)]) -> Vec<Pair> {
    run.iter()
        .filter_map(|&(t, bytes)| Some((t as f64 / 1000.0, bytes as f64, interpolate(plain, t)?)))
        .filter(|p| p.2 > 0.0)
        .collect()
}

/// Savings over time: paired samples as (seconds, percent saved against
/// plain at that moment).
fn curve(pairs: &[Pair]) -> Vec<(f64, f64)> {
    pairs
        .iter()
        .map(|&(t, used, base)| (t, 100.0 * (1.0 - used / base)))
        .collect()
}

/// `samples` (sorted by time) at `t`, linearly between neighbours; None
/// outside their span.
fn interpolate(samples: &[(u64, u64)], t: u64) -> Option<f64> {
    let after = samples.partition_point(|s| s.0 < t);
    let (t1, b1) = *samples.get(after)?;
    if t1 == t {
        return Some(b1 as f64);
    }
    let (t0, b0) = *samples.get(after.checked_sub(1)?)?;
    let f = (t - t0) as f64 / (t1 - t0) as f64;
    Some(b0 as f64 + f * (b1 as f64 - b0 as f64))
}

/// Percent saved over start <= t < end: 1 - the memory-time used / plain's
/// (a ratio of sums, so the first milliseconds, when both programs hold
/// almost nothing, weigh as little as they hold); NaN without samples.
fn saved_in(pairs: &[Pair], start: f64, end: f64) -> f64 {
    let inside = pairs.iter().filter(|p| p.0 >= start && p.0 < end);
    let (used, base) = inside.fold((0.0, 0.0), |(u, b), p| (u + p.1, b + p.2));
    if base > 0.0 {
        100.0 * (1.0 - used / base)
    } else {
        f64::NAN
    }
}

/// The first run's footprint timeline of `config`.
fn timeline<'a>(w: &'a WorkloadResult, config: &str) -> Option<&'a [(u64, u64)]> {
    w.outcomes
        .iter()
        .find(|o| o.config == config && !o.timeline.is_empty())
        .map(|o| o.timeline.as_slice())
}

/// Every configuration but plain, in the suite's order, with its samples
/// paired with plain's (see `paired`) while the pages are allocated (up to
/// the free phase: after it both footprints are the bare program's, and
/// their ratio says nothing of the mechanisms).
fn pairs(r: &SuiteResult, w: &WorkloadResult) -> Vec<(String, Vec<Pair>)> {
    let Some(plain) = timeline(w, "plain") else {
        return Vec::new();
    };
    let until = phases(&w.cmd)
        .iter()
        .find(|p| p.0 == "free")
        .map_or(f64::INFINITY, |p| p.1);
    let of = |c: &str| {
        timeline(w, c)
            .map(|t| {
                paired(plain, t)
                    .into_iter()
                    .filter(|p| p.0 <= until)
                    .collect()
            })
            .unwrap_or_default()
    };
    r.configs
        .iter()
        .filter(|c| *c != "plain")
        .map(|c| (c.clone(), of(c)))
        .collect()
}

/// The suite's DE part: mean savings per phase and what the engine did.
pub fn markdown(r: &SuiteResult) -> String {
    let mut out = String::from(
        "**Savings over time** (Difference Engine's Figures 5-7), first run of each configuration: 1 - footprint / \
         plain's footprint at the same moment, in %, over each phase of the workload (the phase and the idle period \
         after it) and over all three (`allocated`: until the free); over a phase it is 1 - the memory-time used / \
         plain's. Negative: more memory than plain.\n\n\
         | workload | configuration | alloc | read | write | allocated |\n|---|---|---:|---:|---:|---:|\n",
    );
    for w in &r.workloads {
        let phases = phases(&w.cmd);
        for (config, pairs) in pairs(r, w) {
            out += &format!("| {} | {config} |", w.name);
            for name in ["alloc", "read", "write"] {
                let saved = phases
                    .iter()
                    .find(|p| p.0 == name)
                    .map_or(f64::NAN, |p| saved_in(&pairs, p.1, p.2));
                out += &format!(" {} |", percent(saved));
            }
            out += &format!(" {} |\n", percent(saved_in(&pairs, 0.0, f64::INFINITY)));
        }
    }
    out.push('\n');
    out + &engine_table(r)
}

fn percent(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.1}")
    } else {
        "-".into()
    }
}

/// Counters of the tiering mechanisms, whatever their exact names: keys
/// that speak of patches, compression or swap.
fn is_tier_counter(key: &str) -> bool {
    ["patch", "compress", "swap", "clock", "cold"]
        .iter()
        .any(|w| key.contains(w))
}

/// The numbers of an engine report, nested ones as "outer.inner".
fn flatten(v: &serde_json::Value) -> Vec<(String, f64)> {
    let Some(map) = v.as_object() else {
        return Vec::new();
    };
    map.iter()
        .flat_map(|(k, v)| match v {
            serde_json::Value::Object(_) => flatten(v)
                .into_iter()
                .map(|(inner, x)| (format!("{k}.{inner}"), x))
                .collect(),
            _ => v.as_f64().map(|x| vec![(k.clone(), x)]).unwrap_or_default(),
        })
        .collect()
}

/// What the engine did under each configuration (medians over runs;
/// tiering counters of the first run).
fn engine_table(r: &SuiteResult) -> String {
    let mut out = String::from(
        "**What the engine did** (medians over runs, summed over the processes of a run)\n\n\
         | workload | configuration | zero pages folded | pages merged | pages evicted | pages restored | tiering counters |\n|---|---|---:|---:|---:|---:|---|\n",
    );
    for w in &r.workloads {
        for s in w.stats.iter().filter(|s| s.config != "plain") {
            let n = |k: &str| s.engine.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
            let first_run = w
                .outcomes
                .iter()
                .find(|o| o.config == s.config)
                .map(|o| engine_total(&o.engine));
            let tier: Vec<String> = flatten(&first_run.unwrap_or_default())
                .into_iter()
                .filter(|(k, v)| is_tier_counter(k) && *v != 0.0)
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            out += &format!(
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} |\n",
                w.name,
                s.config,
                n("zero_folded"),
                n("merged"),
                n("evicted"),
                n("restored"),
                if tier.is_empty() {
                    "-".to_string()
                } else {
                    tier.join(", ")
                }
            );
        }
    }
    out.push('\n');
    out
}

/// One savings-over-time chart per workload (page type) in `dir`.
pub fn charts(r: &SuiteResult, dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for w in &r.workloads {
        let series: Vec<_> = pairs(r, w)
            .into_iter()
            .map(|(c, p)| (c, curve(&p)))
            .collect();
        if series.is_empty() {
            continue;
        }
        let phases: Vec<(&str, f64)> = phases(&w.cmd).iter().map(|p| (p.0, p.1)).collect();
        let path = dir.join(format!("de-savings-{}.png", w.name));
        let title = format!(
            "{}: savings over time against plain (Difference Engine micro-benchmark)",
            w.name
        );
        crate::plot::savings_over_time(
            &path,
            &crate::plot::SavingsChart {
                title: &title,
                series: &series,
                phases: &phases,
            },
        )?;
        files.push(path);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn savings_compare_with_plain_at_the_same_moment() {
        let plain = [(0, 100), (1000, 200), (2000, 200)];
        let run = [(0, 50), (500, 75), (2000, 20), (2500, 10)];
        let s = curve(&paired(&plain, &run));
        assert_eq!(
            s,
            [(0.0, 50.0), (0.5, 50.0), (2.0, 90.0)],
            "plain is 150 at 0.5 s; 2.5 s is past plain's end"
        );
        assert!(paired(&[], &run).is_empty());
        assert_eq!(interpolate(&plain, 1500), Some(200.0));
    }

    #[test]
    fn phases_come_from_the_idle_time_in_the_command() {
        let cmd: Vec<String> = ["synth", "de-zero", "--idle", "4", "--quick"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            phases(&cmd),
            [
                ("alloc", 0.0, 4.0),
                ("read", 4.0, 8.0),
                ("write", 8.0, 12.0),
                ("free", 12.0, 14.0)
            ]
        );
        assert!(phases(&cmd[..2]).is_empty());
        // 1 MiB against 10 at first, then 10 against 10: 11 of 20 used.
        let pairs = [(0.0, 1.0, 10.0), (3.9, 10.0, 10.0), (4.0, 0.0, 10.0)];
        assert!((saved_in(&pairs, 0.0, 4.0) - 45.0).abs() < 1e-9);
        assert!(saved_in(&pairs, 20.0, 30.0).is_nan());
    }

    #[test]
    fn tier_counters_are_found_by_what_they_name() {
        assert!(
            is_tier_counter("pages_patched")
                && is_tier_counter("compressed_bytes")
                && is_tier_counter("swap_out")
        );
        assert!(!is_tier_counter("merged") && !is_tier_counter("zero_folded"));
        let report =
            serde_json::json!({"merged": 3, "store": {"compressed_pages": 2, "name": "lz4"}});
        let mut flat = flatten(&report);
        flat.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            flat,
            [
                ("merged".to_string(), 3.0),
                ("store.compressed_pages".to_string(), 2.0)
            ]
        );
    }
}
