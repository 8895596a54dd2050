//! Quantities a workload reports about itself, which the harness cannot
//! see from outside: the Dask suite's bytes spilled to disk and read back,
//! the peak footprint of a single worker, the job's own wall time. A
//! program writes them as its last `bench-metrics {JSON}` line on stderr
//! (`program::reported_metrics` reads it); here they are summarised per
//! configuration (median, min, max over the runs) and drawn as one table
//! per quantity, plain's median and the others' ratios to it, like the
//! suite's own tables.

use std::collections::BTreeMap;

use crate::program::Outcome;
use crate::stats::Spread;
use crate::suite_result::SuiteResult;

/// What the tables call the quantities the suite's workloads report (a
/// quantity not named here is shown by its key).
const TITLES: &[(&str, &str)] = &[
    (
        "job_wall_s",
        "Job wall time (s; first persist to last result, cluster start and stop left out)",
    ),
    (
        "spilled_mib",
        "Spilled to disk (MiB written, all workers, Dask's own count)",
    ),
    (
        "unspilled_mib",
        "Read back from disk (MiB, all workers, Dask's own count)",
    ),
    (
        "workers_shared_by_copy_mib",
        "Shared by copy in the workers (MiB; the engines' counter read inside the workers at the job's end)",
    ),
    (
        "worker_peak_mib",
        "Peak footprint of a worker (MiB; the larger worker's peak in Dask's monitor, sampled every 100 ms)",
    ),
];

/// Each reported quantity's spread over the runs that reported it.
pub fn summarize(runs: &[&Outcome]) -> BTreeMap<String, Spread> {
    let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for o in runs {
        for (name, v) in &o.metrics {
            values.entry(name.clone()).or_default().push(*v);
        }
    }
    values
        .into_iter()
        .map(|(name, v)| (name, Spread::of(&v)))
        .collect()
}

/// One table per reported quantity, workloads down, configurations across
/// (the first column absolute, the others as ratios to plain's median, or
/// to the first configuration's without plain); empty when no workload
/// reported any.
pub fn markdown(r: &SuiteResult) -> String {
    let mut names: Vec<&String> = r
        .workloads
        .iter()
        .flat_map(|w| w.stats.iter().flat_map(|s| s.metrics.keys()))
        .collect();
    names.sort();
    names.dedup();
    let mut out = String::new();
    for name in names {
        out += &table(r, name);
    }
    out
}

fn title(name: &str) -> &str {
    TITLES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(name, |(_, t)| t)
}

fn table(r: &SuiteResult, name: &str) -> String {
    let mut out = format!(
        "**{}** (reported by the workload)\n\n| workload |",
        title(name)
    );
    for c in &r.configs {
        out += &format!(" {c} |");
    }
    out += "\n|---|";
    out += &"---:|".repeat(r.configs.len());
    out.push('\n');
    for w in &r.workloads {
        let plain = w.stats.iter().find(|s| s.config == "plain");
        let Some(base) = plain.or(w.stats.first()).and_then(|s| s.metrics.get(name)) else {
            continue;
        };
        out += &format!("| {} |", w.name);
        for (i, s) in w.stats.iter().enumerate() {
            let cell = match s.metrics.get(name) {
                None => "-".to_string(),
                Some(v) if i == 0 => spread(*v, 1),
                Some(v) => ratio(*v, base.median),
            };
            out += &format!(" {cell} |");
        }
        out.push('\n');
    }
    out.push('\n');
    out
}

fn spread(s: Spread, digits: usize) -> String {
    format!("{:.d$} [{:.d$}-{:.d$}]", s.median, s.min, s.max, d = digits)
}

/// The ratio to plain's median, or the value itself when plain's is zero
/// (nothing spilled: no ratio to take).
fn ratio(s: Spread, base: f64) -> String {
    if base > 0.0 {
        spread(s.over(base), 2)
    } else {
        format!("{} (plain 0)", spread(s, 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite_result::WorkloadResult;

    fn run(config: &str, metrics: &[(&str, f64)]) -> Outcome {
        let mut o: Outcome = serde_json::from_value(serde_json::json!({
            "config": config, "exit_code": 0, "timed_out": false, "wall_s": 1.0, "cpu_s": 1.0,
            "ksmd_cpu_s": null, "peak_bytes": 1, "average_bytes": 1, "samples": 1,
            "method": "pfn", "engine": [], "timeline": []
        }))
        .unwrap();
        o.metrics = metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        o.stdout = Some(Vec::new());
        o
    }

    #[test]
    fn tables_show_plain_median_and_ratios_and_zero_without_a_ratio() {
        let runs = vec![
            run(
                "plain",
                &[("spilled_mib", 100.0), ("worker_peak_mib", 1000.0)],
            ),
            run(
                "pagefold",
                &[("spilled_mib", 0.0), ("worker_peak_mib", 600.0)],
            ),
            run(
                "plain",
                &[("spilled_mib", 300.0), ("worker_peak_mib", 1200.0)],
            ),
            run(
                "pagefold",
                &[("spilled_mib", 20.0), ("worker_peak_mib", 700.0)],
            ),
            run(
                "plain",
                &[("spilled_mib", 200.0), ("worker_peak_mib", 1100.0)],
            ),
            run(
                "pagefold",
                &[("spilled_mib", 10.0), ("worker_peak_mib", 800.0)],
            ),
        ];
        let configs: Vec<String> = vec!["plain".into(), "pagefold".into()];
        let wl = |name: &str, runs: &[Outcome]| WorkloadResult {
            name: name.into(),
            cmd: vec![],
            stats: crate::suite::summarize(&configs, runs),
            outcomes: vec![],
        };
        let quiet = vec![run("plain", &[("spilled_mib", 0.0)]), run("pagefold", &[])];
        let r = crate::suite::assemble(
            "dask",
            configs.clone(),
            3,
            std::time::Duration::from_millis(50),
            vec![wl("frame", &runs), wl("quiet", &quiet)],
        );
        let md = markdown(&r);
        assert!(
            md.contains("| frame | 200.0 [100.0-300.0] | 0.05 [0.00-0.10] |"),
            "{md}"
        );
        assert!(md.contains("| frame | 1100.0 [1000.0-1200.0] | 0.64 [0.55-0.73] |"));
        assert!(md.contains("**Spilled to disk"));
        assert!(
            md.contains("| quiet | 0.0 [0.0-0.0] | - |"),
            "a configuration that reported nothing: {md}"
        );
        assert!(crate::suite::markdown(&r).contains("(reported by the workload)"));
        let plain_zero = vec![
            run("plain", &[("spilled_mib", 0.0)]),
            run("pagefold", &[("spilled_mib", 5.0)]),
        ];
        let r = crate::suite::assemble(
            "dask",
            configs.clone(),
            1,
            std::time::Duration::from_millis(50),
            vec![wl("w", &plain_zero)],
        );
        assert!(markdown(&r).contains("| w | 0.0 [0.0-0.0] | 5.0 [5.0-5.0] (plain 0) |"));
    }

    #[test]
    fn no_reported_quantity_no_table() {
        let configs: Vec<String> = vec!["plain".into()];
        let runs = vec![run("plain", &[])];
        let wl = WorkloadResult {
            name: "w".into(),
            cmd: vec![],
            stats: crate::suite::summarize(&configs, &runs),
            outcomes: vec![],
        };
        let r = crate::suite::assemble(
            "r",
            configs,
            1,
            std::time::Duration::from_millis(50),
            vec![wl],
        );
        assert!(markdown(&r).is_empty());
    }
}
