//! Workload suites: every program of a suite under every configuration, the
//! whole set repeated `runs` times with the configurations interleaved inside
//! each repetition, so drift of a shared machine hits all of them alike.
//!
//! What is compared is always a ratio of medians taken in the same
//! invocation: for each workload and configuration the median (and min-max)
//! of average footprint, peak footprint, wall time and CPU time (the process
//! tree's, plus ksmd's for KSM), divided by plain's median; over workloads the
//! geometric mean of those ratios (the R paper's Tables 3-4). Every run's
//! output and exit code is compared with the first plain run's: a difference
//! is flagged in the tables and makes the command fail, because a footprint
//! bought with a wrong result is not a saving.

use std::path::Path;
use std::time::Duration;

use crate::ksm::KsmGuard;
use crate::program::{self, engine_total, Config, Invocation, Outcome};
use crate::stats::{geomean, Spread};
pub use crate::suite_result::{ConfigStats, Geomean, SuiteResult, WorkloadResult};
use crate::workloads::Workload;

/// How to run a suite.
pub struct SuitePlan<'a> {
    pub suite: &'a str,
    pub workloads: &'a [Workload],
    pub configs: &'a [Config],
    pub runs: usize,
    pub preload: &'a Path,
    pub interval: Duration,
    pub timeout: Option<Duration>,
}

/// Runs everything; an error only for what stops the whole suite (KSM
/// unavailable, a program that cannot be started).
pub fn run(plan: &SuitePlan) -> Result<SuiteResult, String> {
    let needs_ksm = plan.configs.iter().any(|c| c.setup.runs_ksmd());
    let guard = if needs_ksm {
        Some(KsmGuard::acquire().map_err(|e| {
            format!(
                "KSM configurations need root and {}: {e}",
                crate::ksm::KSM_DIR
            )
        })?)
    } else {
        None
    };
    let machine = crate::report::Machine::probe(&crate::plan::Plan {
        runs: plan.runs,
        quick: false,
    });
    let total = (plan.runs * plan.workloads.len() * plan.configs.len()) as u64;
    let bar = progress(total);
    let mut outcomes: Vec<Vec<Outcome>> = vec![Vec::new(); plan.workloads.len()];
    for rep in 0..plan.runs {
        for (w, wl) in plan.workloads.iter().enumerate() {
            for cfg in plan.configs {
                bar.set_message(format!(
                    "run {}/{} {} under {}",
                    rep + 1,
                    plan.runs,
                    wl.name,
                    cfg.name
                ));
                let inv = Invocation {
                    cmd: &wl.cmd,
                    preload: plan.preload,
                    input: Some(&[]),
                    interval: plan.interval,
                    timeout: plan.timeout,
                };
                let mut o = program::run(&inv, cfg, guard.as_ref())?;
                log(&bar, run_line(&wl.name, rep, &o));
                if o.exit_code != 0 {
                    log(&bar, failure_tail(&o));
                }
                if rep > 0 {
                    o.timeline = Vec::new();
                }
                outcomes[w].push(o);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    drop(guard);
    let names: Vec<String> = plan.configs.iter().map(|c| c.name.clone()).collect();
    let workloads = plan
        .workloads
        .iter()
        .zip(outcomes)
        .map(|(wl, runs)| WorkloadResult {
            name: wl.name.clone(),
            cmd: wl.cmd.clone(),
            stats: summarize(&names, &runs),
            outcomes: runs,
        })
        .collect();
    let mut r = assemble(plan.suite, names, plan.runs, plan.interval, workloads);
    r.machine = Some(machine);
    r.load_avg_end = Some(crate::report::load_avg());
    Ok(r)
}

pub(crate) fn progress(total: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    let style =
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} runs, ETA {eta} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    bar
}

/// A line above the progress bar, or on stderr when there is no bar (not a terminal).
pub(crate) fn log(bar: &indicatif::ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

fn run_line(workload: &str, rep: usize, o: &Outcome) -> String {
    let footprint = if o.samples == 0 {
        "footprint not sampled (left out of the footprint figures)".to_string()
    } else {
        format!(
            "avg {:>7.1} MiB, peak {:>7.1} MiB",
            mib(o.average_bytes),
            mib(o.peak_bytes)
        )
    };
    format!(
        "  {workload:<16} {:<10} run {}: {footprint}, wall {:>6.2} s, cpu {:>6.2} s{}, exit {}",
        o.config,
        rep + 1,
        o.wall_s,
        o.cpu_s,
        o.ksmd_cpu_s
            .map(|k| format!(" + ksmd {k:.2} s"))
            .unwrap_or_default(),
        o.exit_code
    )
}

pub(crate) fn failure_tail(o: &Outcome) -> String {
    let err = String::from_utf8_lossy(o.stderr.as_deref().unwrap_or_default()).into_owned();
    let lines: Vec<&str> = err.lines().rev().take(5).collect();
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    let why = if o.timed_out {
        ", killed at the time limit"
    } else {
        ""
    };
    format!(
        "    FAILED under {} (exit {}{why}); stderr ends:\n      {}",
        o.config,
        o.exit_code,
        tail.join("\n      ")
    )
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// Per-configuration statistics of one workload's runs. Plain (or, without
/// plain, the first configuration) is the base of every ratio and the
/// reference output.
pub fn summarize(configs: &[String], runs: &[Outcome]) -> Vec<ConfigStats> {
    let base_name = configs
        .iter()
        .find(|c| *c == "plain")
        .unwrap_or(&configs[0]);
    let reference = runs.iter().find(|o| &o.config == base_name);
    let of = |name: &str| runs.iter().filter(|o| o.config == name).collect::<Vec<_>>();
    let spread = |name: &str, f: &dyn Fn(&Outcome) -> f64| {
        Spread::of(&of(name).into_iter().map(f).collect::<Vec<_>>())
    };
    // A run the sampler never read (the program ended before its first
    // sample could be taken) has no footprint: it is left out of the
    // footprint figures, not counted as zero.
    let footprint = |name: &str, f: &dyn Fn(&Outcome) -> f64| {
        let sampled = of(name).into_iter().filter(|o| o.samples > 0);
        Spread::of(&sampled.map(f).collect::<Vec<_>>())
    };
    let total_cpu = |o: &Outcome| o.cpu_s + o.ksmd_cpu_s.unwrap_or(0.0);
    let base_avg = footprint(base_name, &|o| mib(o.average_bytes)).median;
    let base_peak = footprint(base_name, &|o| mib(o.peak_bytes)).median;
    let base_wall = spread(base_name, &|o| o.wall_s).median;
    let base_cpu = spread(base_name, &total_cpu).median;
    let faults = |o: &Outcome| o.minor_faults as f64;
    let base_faults = spread(base_name, &faults).median;
    let memory_time = |o: &Outcome| mib(o.average_bytes) * o.wall_s;
    let base_memory_time = footprint(base_name, &memory_time).median;
    configs
        .iter()
        .map(|c| {
            let average = footprint(c, &|o| mib(o.average_bytes));
            let peak = footprint(c, &|o| mib(o.peak_bytes));
            let wall = spread(c, &|o| o.wall_s);
            let cpu = spread(c, &total_cpu);
            let minor = spread(c, &faults);
            let held = footprint(c, &memory_time);
            ConfigStats {
                config: c.clone(),
                runs: of(c).len(),
                average_mib: average,
                peak_mib: peak,
                wall_s: wall,
                cpu_s: cpu,
                ksmd_cpu_s: spread(c, &|o| o.ksmd_cpu_s.unwrap_or(0.0)),
                average_ratio: average.over(base_avg),
                peak_ratio: peak.over(base_peak),
                wall_ratio: wall.over(base_wall),
                cpu_ratio: cpu.over(base_cpu),
                user_s: spread(c, &|o| o.user_s),
                sys_s: spread(c, &|o| o.sys_s),
                minor_faults: minor,
                faults_ratio: minor.over(base_faults),
                memory_time: held,
                memory_time_ratio: held.over(base_memory_time),
                limit_ratio: limit_ratio(&of(c)),
                identical: reference.is_some_and(|r| {
                    of(c)
                        .iter()
                        .all(|o| o.stdout == r.stdout && o.exit_code == r.exit_code)
                }),
                failed_runs: of(c).iter().filter(|o| o.exit_code != 0).count(),
                engine: median_counters(&of(c)),
                metrics: crate::reported::summarize(&of(c)),
            }
        })
        .collect()
}

/// The sharing limit over the average footprint of the same run, over the
/// runs that read it (none: NaN).
fn limit_ratio(runs: &[&Outcome]) -> Spread {
    let ratios: Vec<f64> = runs
        .iter()
        .filter(|o| o.samples > 0 && o.average_bytes > 0)
        .filter_map(|o| {
            o.limit_average_bytes
                .map(|l| l as f64 / o.average_bytes as f64)
        })
        .collect();
    Spread::of(&ratios)
}

/// Each top-level engine counter's median over the runs that used the engine.
fn median_counters(runs: &[&Outcome]) -> serde_json::Map<String, serde_json::Value> {
    let totals: Vec<_> = runs
        .iter()
        .filter(|o| !o.engine.is_empty())
        .map(|o| engine_total(&o.engine))
        .collect();
    let mut out = serde_json::Map::new();
    let Some(first) = totals.first().and_then(|t| t.as_object()) else {
        return out;
    };
    for key in first.keys() {
        let values: Vec<f64> = totals.iter().filter_map(|t| t[key].as_f64()).collect();
        if values.len() == totals.len() {
            out.insert(
                key.clone(),
                serde_json::json!(crate::timing::median(&values)),
            );
        }
    }
    out
}

pub fn assemble(
    suite: &str,
    configs: Vec<String>,
    runs: usize,
    interval: Duration,
    workloads: Vec<WorkloadResult>,
) -> SuiteResult {
    let geomeans = configs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let g = |f: &dyn Fn(&ConfigStats) -> f64| {
                geomean(&workloads.iter().map(|w| f(&w.stats[i])).collect::<Vec<_>>())
            };
            Geomean {
                config: c.clone(),
                average_ratio: g(&|s| s.average_ratio.median),
                peak_ratio: g(&|s| s.peak_ratio.median),
                wall_ratio: g(&|s| s.wall_ratio.median),
                cpu_ratio: g(&|s| s.cpu_ratio.median),
                faults_ratio: g(&|s| s.faults_ratio.median),
                memory_time_ratio: g(&|s| s.memory_time_ratio.median),
            }
        })
        .collect();
    let all_identical = workloads
        .iter()
        .all(|w| w.stats.iter().all(|s| s.identical));
    let mut r = SuiteResult {
        suite: suite.to_string(),
        configs,
        runs,
        interval_ms: interval.as_millis() as u64,
        workloads,
        geomeans,
        all_identical,
        machine: None,
        load_avg_end: None,
        compass: None,
    };
    r.compass = crate::compass::of(&r);
    r
}

/// One table of the markdown: its title, a configuration's spread and
/// ratio to plain of the quantity, the geomean of that ratio, and its unit.
type Table<'a> = (
    &'a str,
    &'a dyn Fn(&ConfigStats) -> (Spread, Spread),
    &'a dyn Fn(&Geomean) -> f64,
    &'a str,
);

/// The suite's markdown: one table per quantity, workloads down, configurations across.
pub fn markdown(r: &SuiteResult) -> String {
    let mut out = match (&r.machine, r.load_avg_end) {
        (Some(m), Some(end)) => format!("{} Load average {end:.2} at the end.\n\n", m.line()),
        (Some(m), None) => format!("{}\n\n", m.line()),
        _ => String::new(),
    };
    out += &format!(
        "Suite `{}`: {} workloads x {} configurations x {} runs, interleaved; footprint sampled every {} ms. \
         First column: plain's median [min-max]; others: median ratio to plain's median [min-max of the ratio]. \
         Last row: geometric mean of the median ratios.\n\n",
        r.suite,
        r.workloads.len(),
        r.configs.len(),
        r.runs,
        r.interval_ms
    );
    let tables: [Table; 6] = [
        (
            "Average footprint",
            &|s| (s.average_mib, s.average_ratio),
            &|g| g.average_ratio,
            "MiB",
        ),
        (
            "Peak footprint",
            &|s| (s.peak_mib, s.peak_ratio),
            &|g| g.peak_ratio,
            "MiB",
        ),
        (
            "Footprint x time (average footprint times wall time: the memory a run holds over its life; a run that is faster with the same footprint curve has a higher average but holds less)",
            &|s| (s.memory_time, s.memory_time_ratio),
            &|g| g.memory_time_ratio,
            "MiB s",
        ),
        (
            "Wall time",
            &|s| (s.wall_s, s.wall_ratio),
            &|g| g.wall_ratio,
            "s",
        ),
        (
            "CPU time (process tree + ksmd)",
            &|s| (s.cpu_s, s.cpu_ratio),
            &|g| g.cpu_ratio,
            "s",
        ),
        (
            "Minor page faults (process tree)",
            &|s| (s.minor_faults, s.faults_ratio),
            &|g| g.faults_ratio,
            "",
        ),
    ];
    for (title, cell, geo, unit) in tables {
        out += &format!("**{title}**\n\n| workload |");
        for (i, c) in r.configs.iter().enumerate() {
            out += &if i == 0 && !unit.is_empty() {
                format!(" {c} ({unit}) |")
            } else {
                format!(" {c} |")
            };
        }
        out += "\n|---|";
        out += &"---:|".repeat(r.configs.len());
        out.push('\n');
        for w in &r.workloads {
            out += &format!("| {} |", w.name);
            for (i, s) in w.stats.iter().enumerate() {
                let (abs, ratio) = cell(s);
                let flag = if s.identical { "" } else { " **DIFFERS**" };
                out += &if i == 0 {
                    format!(" {} |", fmt_spread(abs, 1))
                } else {
                    format!(" {}{flag} |", fmt_spread(ratio, 2))
                };
            }
            out.push('\n');
        }
        out += "| **geomean** |";
        for (i, g) in r.geomeans.iter().enumerate() {
            out += &if i == 0 {
                " |".to_string()
            } else {
                format!(" **{:.3}** |", geo(g))
            };
        }
        out += "\n\n";
    }
    out += &crate::sharing_limit::markdown(r);
    out += &crate::reported::markdown(r);
    out += &crate::compass::markdown(r);
    out += &engine_table(r);
    out += &tier_table(r);
    if r.suite == "de" {
        out += &crate::de::markdown(r);
    }
    out += &if r.all_identical {
        "Outputs: every run of every workload printed exactly what plain printed.\n".to_string()
    } else {
        "Outputs: **some runs differ from plain** (marked DIFFERS above).\n".to_string()
    };
    out
}

fn fmt_spread(s: Spread, digits: usize) -> String {
    if !s.median.is_finite() {
        return "-".into();
    }
    format!("{:.d$} [{:.d$}-{:.d$}]", s.median, s.min, s.max, d = digits)
}

/// What the engine did under the all-mechanisms configuration, per workload.
fn engine_table(r: &SuiteResult) -> String {
    let Some(i) = r.configs.iter().position(|c| c == "pagefold") else {
        return String::new();
    };
    let mut out = String::from(
        "**What the engine did** (configuration `pagefold`, medians over runs, summed over the processes of a run)\n\n\
         | workload | pages shared by copy | zero pages folded | pages merged | MiB copied plainly | scans | scan CPU (s) | fallbacks |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for w in &r.workloads {
        let e = &w.stats[i].engine;
        let n = |k: &str| e.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
        let fallbacks: u64 = w
            .outcomes
            .iter()
            .filter(|o| o.config == "pagefold")
            .map(|o| fallback_count(&engine_total(&o.engine)))
            .max()
            .unwrap_or(0);
        out += &format!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.0} | {:.2} | {} |\n",
            w.name,
            n("pages_shared_by_copy"),
            n("zero_folded"),
            n("merged"),
            n("bytes_copied_plain") / (1024.0 * 1024.0),
            n("scans"),
            n("scan_cpu_ns") / 1e9,
            fallbacks
        );
    }
    out.push('\n');
    out
}

/// What the tiering clock and policy did (engine clock.rs), for every
/// configuration whose runs made clock passes (`pagefold:TIER=1`).
fn tier_table(r: &SuiteResult) -> String {
    let mut rows = String::new();
    for w in &r.workloads {
        for c in &r.configs {
            let totals: Vec<serde_json::Value> = w
                .outcomes
                .iter()
                .filter(|o| &o.config == c && !o.engine.is_empty())
                .map(|o| engine_total(&o.engine))
                .collect();
            let med = |path: &[&str]| {
                let at = |t: &serde_json::Value| {
                    path.iter().fold(t, |v, k| &v[*k]).as_f64().unwrap_or(0.0)
                };
                crate::timing::median(&totals.iter().map(at).collect::<Vec<f64>>())
            };
            if totals.is_empty() || med(&["clock", "passes"]) == 0.0 {
                continue;
            }
            let class = |k: &str| med(&["clock", "total", k]);
            rows += &format!(
                "| {} | {} | {:.0} | {:.0} / {:.0} / {:.0} / {:.0} | {:.0} | {:.0} / {:.0} | {:.0} | {:.0} |\n",
                w.name,
                c,
                med(&["clock", "passes"]),
                class("c1"),
                class("c2"),
                class("c3"),
                class("c4"),
                class("evicted"),
                class("not_eligible"),
                class("refused") + class("incompressible"),
                med(&["restored"]),
                med(&["clock", "pressure_passes"]),
            );
        }
    }
    if rows.is_empty() {
        return rows;
    }
    "**What tiering did** (medians over runs, summed over processes; page looks per class summed over passes)\n\n\
     | workload | configuration | clock passes | C1 / C2 / C3 / C4 | evicted by policy | left: shared / incompressible | restored on touch | pressure passes |\n\
     |---|---|---:|---:|---:|---:|---:|---:|\n"
        .to_string()
        + &rows
        + "\n"
}

fn fallback_count(total: &serde_json::Value) -> u64 {
    total["fallbacks"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_u64()).sum())
        .unwrap_or(0)
}

/// A suite result written by `publish`, for drawing its tables and charts
/// again without running it again.
pub fn load(path: &Path) -> Result<SuiteResult, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r: SuiteResult = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a suite result: {e}", path.display()))?;
    r.compass = crate::compass::of(&r);
    Ok(r)
}

/// Writes JSON, markdown and charts for the suite into `dir`; returns the
/// files written. Timelines are drawn for `timelines` workloads, or else for
/// the four where pagefold's average footprint differs most from plain's.
pub fn publish(
    r: &SuiteResult,
    dir: &Path,
    timelines: &[String],
) -> Result<Vec<std::path::PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files = Vec::new();
    let json_path = dir.join(format!("{}.json", r.suite));
    let json =
        pagefold_measure::schema::pretty(crate::report::SCHEMA, r).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, json + "\n").map_err(|e| format!("{}: {e}", json_path.display()))?;
    files.push(json_path);
    let md_path = dir.join(format!("{}.md", r.suite));
    std::fs::write(&md_path, markdown(r)).map_err(|e| format!("{}: {e}", md_path.display()))?;
    files.push(md_path);
    files.extend(charts(r, dir, timelines)?);
    Ok(files)
}

/// The section of the results document: the tables and the charts, linked
/// relative to the document.
pub fn doc_section(r: &SuiteResult, files: &[std::path::PathBuf], doc: &Path) -> String {
    let mut out = markdown(r);
    out.push('\n');
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "png"))
    {
        let name = f.file_stem().unwrap_or_default().to_string_lossy();
        out += &format!("![{name}]({})\n\n", crate::report::link(doc, f));
    }
    out
}

fn charts(
    r: &SuiteResult,
    dir: &Path,
    timelines: &[String],
) -> Result<Vec<std::path::PathBuf>, String> {
    let names: Vec<String> = r.workloads.iter().map(|w| w.name.clone()).collect();
    let col = |f: &dyn Fn(&ConfigStats) -> f64| {
        r.workloads
            .iter()
            .map(|w| w.stats.iter().map(f).collect())
            .collect()
    };
    let zeros = col(&|_| 0.0);
    let memory = dir.join(format!("{}-memory.png", r.suite));
    let bars = crate::plot::Bars {
        title: &format!("{}: average footprint relative to plain", r.suite),
        y_desc: "average footprint / plain",
        workloads: &names,
        configs: &r.configs,
        values: col(&|s| s.average_ratio.median),
        stacked: zeros,
    };
    crate::plot::relative_bars(&memory, &bars)?;
    let runtime = dir.join(format!("{}-runtime.png", r.suite));
    let plain_wall: Vec<f64> = r
        .workloads
        .iter()
        .map(|w| w.stats[0].wall_s.median)
        .collect();
    let bars = crate::plot::Bars {
        title: &format!("{}: wall time relative to plain (dark: ksmd CPU)", r.suite),
        y_desc: "wall time / plain",
        workloads: &names,
        configs: &r.configs,
        values: col(&|s| s.wall_ratio.median),
        stacked: r
            .workloads
            .iter()
            .zip(&plain_wall)
            .map(|(w, base)| w.stats.iter().map(|s| s.ksmd_cpu_s.median / base).collect())
            .collect(),
    };
    crate::plot::relative_bars(&runtime, &bars)?;
    let mut files = vec![memory, runtime];
    if r.suite == "de" {
        files.extend(crate::de::charts(r, dir)?);
    }
    for w in pick_timelines(r, timelines) {
        let path = dir.join(format!("{}-timeline-{}.png", r.suite, w.name));
        let series: Vec<_> = w
            .outcomes
            .iter()
            .filter(|o| !o.timeline.is_empty())
            .map(|o| (o.config.clone(), o.timeline.clone()))
            .collect();
        crate::plot::memory_over_time(
            &path,
            &format!("{}: footprint over time (first run)", w.name),
            &series,
        )?;
        files.push(path);
    }
    Ok(files)
}

fn pick_timelines<'a>(r: &'a SuiteResult, chosen: &[String]) -> Vec<&'a WorkloadResult> {
    if !chosen.is_empty() {
        return r
            .workloads
            .iter()
            .filter(|w| chosen.contains(&w.name))
            .collect();
    }
    let Some(i) = r.configs.iter().position(|c| c == "pagefold") else {
        return Vec::new();
    };
    let mut by_gap: Vec<_> = r
        .workloads
        .iter()
        .map(|w| {
            (
                w.stats[0].average_mib.median - w.stats[i].average_mib.median,
                w,
            )
        })
        .collect();
    by_gap.sort_by(|a, b| b.0.total_cmp(&a.0));
    by_gap.into_iter().take(4).map(|(_, w)| w).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(config: &str, avg_mib: u64, wall: f64, out: &str) -> Outcome {
        Outcome {
            config: config.into(),
            exit_code: 0,
            timed_out: false,
            wall_s: wall,
            cpu_s: wall,
            user_s: wall * 0.8,
            sys_s: wall * 0.2,
            minor_faults: avg_mib * 256,
            major_faults: 0,
            ksmd_cpu_s: (config.starts_with("ksm")).then_some(0.5),
            peak_bytes: (avg_mib * 2) << 20,
            average_bytes: avg_mib << 20,
            samples: 10,
            method: "pfn".into(),
            engine: Vec::new(),
            timeline: Vec::new(),
            limit_average_bytes: None,
            metrics: Default::default(),
            stdout: Some(out.as_bytes().to_vec()),
            stderr: Some(Vec::new()),
        }
    }

    fn configs() -> Vec<String> {
        vec!["plain".into(), "pagefold".into(), "ksm-100".into()]
    }

    #[test]
    fn ratios_are_medians_over_plain_median_and_ksmd_counts_as_cpu() {
        let runs = vec![
            outcome("plain", 100, 10.0, "x"),
            outcome("pagefold", 50, 11.0, "x"),
            outcome("ksm-100", 90, 10.0, "x"),
            outcome("plain", 120, 12.0, "x"),
            outcome("pagefold", 60, 9.0, "x"),
            outcome("ksm-100", 80, 10.0, "x"),
            outcome("plain", 110, 11.0, "x"),
            outcome("pagefold", 55, 10.0, "x"),
            outcome("ksm-100", 70, 10.0, "x"),
        ];
        let s = summarize(&configs(), &runs);
        assert_eq!(
            s[0].average_mib,
            Spread {
                median: 110.0,
                min: 100.0,
                max: 120.0
            }
        );
        assert_eq!(s[0].average_ratio.median, 1.0);
        assert!((s[1].average_ratio.median - 0.5).abs() < 1e-12);
        assert!((s[1].average_ratio.min - 50.0 / 110.0).abs() < 1e-12);
        assert!((s[1].wall_ratio.median - 10.0 / 11.0).abs() < 1e-12);
        assert!(
            (s[2].cpu_ratio.median - 10.5 / 11.0).abs() < 1e-12,
            "ksmd's 0.5 s is added to KSM's CPU"
        );
        assert!(s
            .iter()
            .all(|c| c.identical && c.runs == 3 && c.failed_runs == 0));
    }

    #[test]
    fn a_faster_run_with_a_higher_average_can_hold_less_memory_over_time() {
        let runs = vec![
            outcome("plain", 100, 10.0, "x"),
            outcome("pagefold", 110, 8.0, "x"),
        ];
        let s = summarize(&configs()[..2], &runs);
        assert!((s[1].average_ratio.median - 1.1).abs() < 1e-12);
        assert!((s[1].memory_time.median - 880.0 * mib(1 << 20)).abs() < 1e-9);
        assert!(
            (s[1].memory_time_ratio.median - 0.88).abs() < 1e-12,
            "110 MiB for 8 s against 100 MiB for 10 s"
        );
        let r = assemble(
            "python",
            configs()[..2].to_vec(),
            1,
            Duration::from_millis(50),
            vec![WorkloadResult {
                name: "w".into(),
                cmd: vec![],
                stats: s,
                outcomes: vec![],
            }],
        );
        assert!((r.geomeans[1].memory_time_ratio - 0.88).abs() < 1e-12);
        assert!(markdown(&r).contains("**Footprint x time"));
    }

    #[test]
    fn a_run_the_sampler_never_read_is_left_out_of_the_footprint_not_counted_as_zero() {
        let mut unsampled = outcome("pagefold", 0, 8.0, "x");
        unsampled.samples = 0;
        unsampled.peak_bytes = 0;
        let runs = vec![
            outcome("plain", 100, 10.0, "x"),
            outcome("pagefold", 50, 10.0, "x"),
            outcome("plain", 100, 10.0, "x"),
            unsampled.clone(),
        ];
        let s = summarize(&configs()[..2], &runs);
        assert_eq!(s[1].average_mib.median, 50.0, "the sampled run alone");
        assert_eq!(s[1].peak_ratio.median, 0.5, "100 MiB against 200");
        assert_eq!(s[1].runs, 2, "the run still counts for time and output");
        assert!((s[1].wall_ratio.median - 0.9).abs() < 1e-12);
        assert!(run_line("w", 1, &unsampled).contains("footprint not sampled"));
    }

    #[test]
    fn an_output_that_differs_from_plain_is_flagged() {
        let mut bad = outcome("pagefold", 50, 10.0, "y");
        let runs = vec![
            outcome("plain", 100, 10.0, "x"),
            bad.clone(),
            outcome("ksm-100", 90, 10.0, "x"),
        ];
        let s = summarize(&configs(), &runs);
        assert!(s[0].identical && !s[1].identical && s[2].identical);
        bad.stdout = Some(b"x".to_vec());
        bad.exit_code = 1;
        let s = summarize(
            &configs(),
            &[
                outcome("plain", 100, 10.0, "x"),
                bad,
                outcome("ksm-100", 90, 10.0, "x"),
            ],
        );
        assert!(
            !s[1].identical && s[1].failed_runs == 1,
            "a different exit code is a different result"
        );
        let wl = WorkloadResult {
            name: "w".into(),
            cmd: vec![],
            stats: s,
            outcomes: vec![],
        };
        let r = assemble("t", configs(), 1, Duration::from_millis(50), vec![wl]);
        assert!(!r.all_identical);
        assert!(markdown(&r).contains("DIFFERS"));
    }

    #[test]
    fn geomean_of_ratios() {
        assert!((geomean(&[0.5, 2.0]) - 1.0).abs() < 1e-12);
        assert!(
            (geomean(&[0.25, 1.0, f64::NAN]) - 0.5).abs() < 1e-12,
            "NaN (a missing run) is left out"
        );
        assert!(geomean(&[]).is_nan());
        let w = |n: &str, a: u64| WorkloadResult {
            name: n.into(),
            cmd: vec![],
            stats: summarize(
                &configs(),
                &[
                    outcome("plain", 100, 1.0, ""),
                    outcome("pagefold", a, 1.0, ""),
                    outcome("ksm-100", 100, 1.0, ""),
                ],
            ),
            outcomes: vec![],
        };
        let r = assemble(
            "t",
            configs(),
            1,
            Duration::from_millis(50),
            vec![w("a", 25), w("b", 100)],
        );
        assert!((r.geomeans[1].average_ratio - 0.5).abs() < 1e-12);
        let md = markdown(&r);
        assert!(md.contains("| **geomean** | | **0.500** |"), "{md}");
    }

    #[test]
    fn the_sharing_limit_table_shows_the_share_captured() {
        let configs: Vec<String> = vec!["plain".into(), "pagefold".into(), "sharing-limit".into()];
        // The limit run: its limit is 40 MiB of its own 100 MiB average.
        let mut limit = outcome("sharing-limit", 100, 3.0, "");
        limit.limit_average_bytes = Some(40 << 20);
        let w = WorkloadResult {
            name: "w".into(),
            cmd: vec![],
            stats: summarize(
                &configs,
                &[
                    outcome("plain", 100, 1.0, ""),
                    outcome("pagefold", 70, 1.0, ""),
                    limit,
                ],
            ),
            outcomes: vec![],
        };
        assert!((w.stats[2].limit_ratio.median - 0.4).abs() < 1e-12);
        assert!(w.stats[1].limit_ratio.median.is_nan(), "no limit sampled");
        let r = assemble("t", configs, 1, Duration::from_millis(50), vec![w]);
        let md = markdown(&r);
        // (1 - 0.7) / (1 - 0.4) = 50%.
        assert!(md.contains("| w | 0.40 | 0.70 | 50% |"), "{md}");
        assert!(!markdown(&assemble(
            "t",
            self::configs(),
            1,
            Duration::from_millis(50),
            vec![]
        ))
        .contains("Sharing limit"));
    }

    #[test]
    fn compass_compares_pagefold_with_aggressive_ksm_in_footprint_and_total_cpu() {
        let configs: Vec<String> = vec!["plain".into(), "pagefold".into(), "ksm-10000".into()];
        let w = |n: &str, pf: u64, ksm: u64| WorkloadResult {
            name: n.into(),
            cmd: vec![],
            // CPU: plain 10 s, pagefold 11 s, KSM 10 s + ksmd 0.5 s.
            stats: summarize(
                &configs,
                &[
                    outcome("plain", 100, 10.0, ""),
                    outcome("pagefold", pf, 11.0, ""),
                    outcome("ksm-10000", ksm, 10.0, ""),
                ],
            ),
            outcomes: vec![],
        };
        let r = assemble(
            "t",
            configs.clone(),
            1,
            Duration::from_millis(50),
            vec![w("a", 40, 80), w("b", 90, 45)],
        );
        let c = r.compass.clone().expect("both configurations ran");
        assert!(
            (c.footprint_vs_ksm - (0.5f64 * 2.0).sqrt()).abs() < 1e-12,
            "geomean of 40/80 and 90/45"
        );
        assert_eq!((c.workloads_below_ksm, c.workloads), (1, 2));
        assert!((c.pagefold_cpu_s - 22.0).abs() < 1e-12 && (c.ksm_cpu_s - 21.0).abs() < 1e-12);
        assert!(
            (c.extra_cpu_vs_ksm.unwrap() - 2.0).abs() < 1e-12,
            "2 s extra against ksmd's 1 s"
        );
        assert!(!c.footprint_met && !c.cpu_met);
        assert!(markdown(&r).contains("**Compass**"));
        let without = assemble(
            "t",
            configs[..2].to_vec(),
            1,
            Duration::from_millis(50),
            vec![],
        );
        assert!(without.compass.is_none() && !markdown(&without).contains("Compass"));
    }

    #[test]
    fn a_published_result_loads_back_to_the_same_tables() {
        let configs: Vec<String> = vec!["plain".into(), "pagefold".into(), "ksm-10000".into()];
        let mut missing = outcome("ksm-10000", 1, 1.0, "");
        missing.config = "nobody".into(); // ksm-10000 has no run: NaN medians, null in JSON
        let w = WorkloadResult {
            name: "w".into(),
            cmd: vec!["x".into()],
            stats: summarize(
                &configs,
                &[
                    outcome("plain", 100, 2.0, "a"),
                    outcome("pagefold", 30, 3.0, "a"),
                    missing,
                ],
            ),
            outcomes: vec![outcome("plain", 100, 2.0, "a")],
        };
        let r = assemble("roundtrip", configs, 1, Duration::from_millis(50), vec![w]);
        let dir = std::env::temp_dir().join(format!("pagefold-suite-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("roundtrip.json");
        // As publish writes it, with its schema.
        let doc = pagefold_measure::schema::document(crate::report::SCHEMA, &r).unwrap();
        std::fs::write(&path, doc.to_string()).unwrap();
        let back = load(&path).unwrap();
        assert_eq!(markdown(&back), markdown(&r));
        assert!(back.workloads[0].stats[2].average_mib.median.is_nan());
        std::fs::write(&path, "{}").unwrap();
        assert!(load(&path).unwrap_err().contains("not a suite result"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn tiering_table_shows_configurations_that_made_clock_passes() {
        let tiered = |evicted: u64| {
            let mut o = outcome("pagefold:TIER=1", 40, 10.0, "x");
            let clock = serde_json::json!({"passes": 5, "pressure_passes": 0,
                "total": {"c1": 1, "c2": 2, "c3": 3, "c4": 4, "evicted": evicted, "not_eligible": 7, "refused": 1, "incompressible": 2}});
            o.engine = vec![serde_json::json!({"stats": {"restored": 9, "clock": clock}})];
            o
        };
        let names: Vec<String> = vec!["plain".into(), "pagefold".into(), "pagefold:TIER=1".into()];
        let runs = vec![
            outcome("plain", 100, 10.0, "x"),
            outcome("pagefold", 50, 10.0, "x"),
            tiered(10),
            tiered(30),
            tiered(20),
        ];
        let wl = WorkloadResult {
            name: "w".into(),
            cmd: vec![],
            stats: summarize(&names, &runs),
            outcomes: runs,
        };
        let r = assemble("t", names, 3, Duration::from_millis(50), vec![wl]);
        let table = tier_table(&r);
        assert!(
            table.contains("| w | pagefold:TIER=1 | 5 | 1 / 2 / 3 / 4 | 20 | 7 / 3 | 9 | 0 |"),
            "{table}"
        );
        assert!(
            !table.contains("| w | pagefold |"),
            "configurations without passes are left out"
        );
        let plain_runs = vec![
            outcome("plain", 100, 10.0, "x"),
            outcome("pagefold", 50, 10.0, "x"),
        ];
        let names: Vec<String> = vec!["plain".into(), "pagefold".into()];
        let untiered = WorkloadResult {
            name: "w".into(),
            cmd: vec![],
            stats: summarize(&names, &plain_runs),
            outcomes: plain_runs,
        };
        assert!(tier_table(&assemble(
            "t",
            names,
            1,
            Duration::from_millis(50),
            vec![untiered]
        ))
        .is_empty());
    }
}
