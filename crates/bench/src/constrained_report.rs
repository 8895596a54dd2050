//! Reports of the memory-constrained runs (see `constrained`): per workload,
//! device and configuration the medians over the runs that completed
//! correctly, the runtime as a ratio to plain on the same device (the R
//! paper's Table 5 compares runtimes under one limit), the footprint the
//! cgroup saw and the swap traffic, and what the engine did (its exit
//! reports: passes under pressure, evictions and restores, sharing, scanner
//! CPU). Markdown for stdout and the results
//! document, JSON with every run, and a bar chart of wall times relative to
//! plain without a limit.
//!
//! The resident peak is the cgroup's memory.max_usage_in_bytes, not the
//! sampler's footprint: the sampler counts the engine's memfd frames by
//! their allocated blocks, and a swapped-out shmem page stays allocated, so
//! under swap it would overstate pagefold's resident memory. The sampler's
//! average footprint is shown too, labelled.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::constrained::{mib, Device, LimitResult, LimitedRun, LimitedWorkload, Verdict};
use crate::stats::{geomean, Spread};

/// One workload under one device and configuration.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub workload: String,
    pub device: Device,
    pub config: String,
    pub runs: usize,
    /// Runs that completed with plain's output.
    pub completed: usize,
    /// Why the others did not (e.g. "OOM-killed 2/3").
    pub problems: Vec<String>,
    pub wall_s: Spread,
    /// The process tree's CPU plus ksmd's.
    pub cpu_s: Spread,
    pub ksmd_cpu_s: Spread,
    /// Median wall time over plain's median on the same device.
    pub wall_ratio: f64,
    /// Median wall time over plain's median without a limit.
    pub wall_vs_unlimited: f64,
    pub resident_peak_mib: Spread,
    pub footprint_avg_mib: Spread,
    pub swap_peak_mib: Spread,
    pub swapped_out_mib: Spread,
    pub swapped_in_mib: Spread,
    pub major_faults: Spread,
    /// zram's compressed store at its largest (zram only).
    pub zram_pool_peak_mib: Spread,
}

/// Every cell of a workload, devices outer, configurations inner.
pub fn cells(w: &LimitedWorkload, devices: &[Device], configs: &[String]) -> Vec<Cell> {
    let unlimited = plain_unlimited_wall(w);
    let mut out = Vec::new();
    for &device in devices {
        let plain = runs_of(w, device, "plain");
        let plain_wall = spread(&ok(&plain), |r| r.outcome.wall_s).median;
        for config in configs {
            let all = runs_of(w, device, config);
            let good = ok(&all);
            let wall = spread(&good, |r| r.outcome.wall_s);
            out.push(Cell {
                workload: w.name.clone(),
                device,
                config: config.clone(),
                runs: all.len(),
                completed: good.len(),
                problems: problems(&all),
                wall_s: wall,
                cpu_s: spread(&good, |r| {
                    r.outcome.cpu_s + r.outcome.ksmd_cpu_s.unwrap_or(0.0)
                }),
                ksmd_cpu_s: spread(&good, |r| r.outcome.ksmd_cpu_s.unwrap_or(0.0)),
                wall_ratio: wall.median / plain_wall,
                wall_vs_unlimited: wall.median / unlimited,
                resident_peak_mib: spread(&good, |r| mib(r.cgroup.max_usage_bytes)),
                footprint_avg_mib: spread(&good, |r| mib(r.outcome.average_bytes)),
                swap_peak_mib: spread(&good, |r| mib(r.peak_swap_bytes)),
                swapped_out_mib: spread(&good, |r| mib(r.swapped_out_bytes)),
                swapped_in_mib: spread(&good, |r| mib(r.swapped_in_bytes)),
                major_faults: spread(&good, |r| r.cgroup.major_faults as f64),
                zram_pool_peak_mib: spread(&good, |r| {
                    r.zram.map_or(f64::NAN, |z| mib(z.pool_peak_bytes))
                }),
            });
        }
    }
    out
}

/// Plain's median wall time without a limit: its `none` runs, or without
/// them the reference run (cold page cache: slower).
fn plain_unlimited_wall(w: &LimitedWorkload) -> f64 {
    let none = runs_of(w, Device::None, "plain");
    let runs = if none.is_empty() {
        w.runs.iter().filter(|r| r.reference).collect()
    } else {
        none
    };
    spread(&ok(&runs), |r| r.outcome.wall_s).median
}

/// The runs of one cell (the reference run belongs to none).
fn runs_of<'a>(w: &'a LimitedWorkload, device: Device, config: &str) -> Vec<&'a LimitedRun> {
    w.runs
        .iter()
        .filter(|r| !r.reference && r.device == device && r.outcome.config == config)
        .collect()
}

fn ok<'a>(runs: &[&'a LimitedRun]) -> Vec<&'a LimitedRun> {
    runs.iter()
        .copied()
        .filter(|r| r.verdict == Verdict::Ok)
        .collect()
}

fn spread(runs: &[&LimitedRun], f: impl Fn(&LimitedRun) -> f64) -> Spread {
    let values: Vec<f64> = runs
        .iter()
        .map(|r| f(r))
        .filter(|v| v.is_finite())
        .collect();
    Spread::of(&values)
}

/// "OOM-killed 2/3"-style counts of the runs that did not complete correctly.
fn problems(runs: &[&LimitedRun]) -> Vec<String> {
    let kinds = [
        Verdict::OomKilled,
        Verdict::TimedOut,
        Verdict::Failed,
        Verdict::Differs,
    ];
    kinds
        .iter()
        .filter_map(|k| {
            let n = runs.iter().filter(|r| r.verdict == *k).count();
            (n > 0).then(|| format!("{} {n}/{}", k.label(), runs.len()))
        })
        .collect()
}

fn all_cells(r: &LimitResult) -> Vec<Vec<Cell>> {
    r.workloads
        .iter()
        .map(|w| cells(w, &r.devices, &r.configs))
        .collect()
}

/// The whole report in markdown.
pub fn markdown(r: &LimitResult) -> String {
    let cells = all_cells(r);
    let mut out = header(r);
    out += &runtime_table(r, &cells);
    out += &footprint_table(r, &cells);
    out += &detail_table(&cells);
    out += &engine_table(r);
    let errors = r
        .workloads
        .iter()
        .flat_map(|w| &w.runs)
        .filter(|x| x.verdict.is_error())
        .count();
    out += &match errors {
        0 => "Outputs: every run that completed printed exactly what plain printed without a limit.\n".to_string(),
        n => format!("Outputs: **{n} runs failed or printed something else than plain** (FAILED / DIFFERS above).\n"),
    };
    out
}

fn header(r: &LimitResult) -> String {
    let limited: Vec<&str> = r
        .devices
        .iter()
        .filter(|d| **d != Device::None)
        .map(|d| d.name())
        .collect();
    let mut out = format!(
        "{}\n\nSuite `{}` under a memory limit: {} workloads x {} configurations x {} devices ({}) x {} runs, interleaved. \
         The limit is {} x plain's peak footprint in a reference run without a limit made first in this invocation (not counted below: it runs with a cold page cache). \
         Each run has a fresh memory cgroup (v1) with that limit and unlimited swap; devices: {}. \
         Swap is on one device of ours at a time, at priority 32767, set up before a workload's configurations and removed after. \
         Medians over the runs that completed with plain's output; wall-time ratios are to plain on the same device. \
         Resident peak: the cgroup's memory.max_usage_in_bytes (anonymous, shmem and page cache charged to it). \
         Swap peak: memory.stat `swap` of the cgroup{}, sampled every {} ms. \
         Swapped out / in: /proc/vmstat pswpout / pswpin over the run, machine-wide (nothing else on this machine swapped during the runs unless noted below). \
         Major faults: the cgroup's pgmajfault.\n\n",
        r.machine_line(),
        r.suite,
        r.workloads.len(),
        r.configs.len(),
        r.devices.len(),
        r.devices.iter().map(|d| d.name()).collect::<Vec<_>>().join(", "),
        r.runs,
        r.fraction,
        describe_devices(r, &limited),
        if r.swap_accounted { "" } else { " (no swap accounting here: our device's use from /proc/swaps)" },
        r.interval_ms
    );
    out += &match r.foreign_swaps.is_empty() {
        true => "Swap active from elsewhere: none, so only our device could be swapped to.\n\n"
            .to_string(),
        false => {
            let list: Vec<String> = r
                .foreign_swaps
                .iter()
                .map(|s| {
                    format!(
                        "{} ({} MiB, priority {})",
                        s.path.display(),
                        s.size_bytes >> 20,
                        s.priority
                    )
                })
                .collect();
            format!("**Swap active from elsewhere**: {}; ours was used first (higher priority), the others once it was full.\n\n", list.join(", "))
        }
    };
    if !r.swept.is_empty() {
        out += &format!(
            "Removed before the runs (left by a killed harness): {}.\n\n",
            r.swept.join(", ")
        );
    }
    out
}

fn describe_devices(r: &LimitResult, limited: &[&str]) -> String {
    if limited.is_empty() {
        return "none (no limit was set)".into();
    }
    let each: Vec<String> = limited
        .iter()
        .map(|d| match *d {
            "swapfile" => format!("swapfile = a swap file in {} (2 x plain's peak, at least 256 MiB)", r.swap_dir),
            _ => format!("zram = a zram device compressing with {} (same size; its compressed store is RAM outside the cgroup)", r.zram_algorithm),
        })
        .collect();
    each.join("; ")
}

impl LimitResult {
    fn machine_line(&self) -> String {
        let m = &self.machine;
        format!(
            "_Measured {} on Linux {}, {} ({} CPUs, {:.0} GiB), load average {:.2} at start._",
            m.date_utc, m.kernel, m.cpu, m.cpus, m.mem_gib, m.load_avg
        )
    }
}

/// Columns device x configuration.
fn columns(r: &LimitResult) -> Vec<(usize, Device, &str)> {
    let mut cols = Vec::new();
    for (d, device) in r.devices.iter().enumerate() {
        for (c, config) in r.configs.iter().enumerate() {
            cols.push((d * r.configs.len() + c, *device, config.as_str()));
        }
    }
    cols
}

fn runtime_table(r: &LimitResult, cells: &[Vec<Cell>]) -> String {
    let cols = columns(r);
    let mut out = String::from("**Runtime** (wall time: plain in seconds, other configurations as a ratio to plain on the same device; last row: geometric mean of the ratios)\n\n| workload | plain peak without limit (MiB) | limit (MiB) |");
    for (_, d, c) in &cols {
        out += &format!(" {}: {c} |", d.name());
    }
    out += "\n|---|---:|---:|";
    out += &"---:|".repeat(cols.len());
    out.push('\n');
    for (w, row) in r.workloads.iter().zip(cells) {
        out += &format!(
            "| {} | {:.1} | {:.1} |",
            w.name,
            mib(w.plain_peak_bytes),
            mib(w.limit_bytes)
        );
        for (i, _, c) in &cols {
            let cell = &row[*i];
            out += &format!(
                " {} |",
                if *c == "plain" {
                    seconds(cell)
                } else {
                    ratio(cell)
                }
            );
        }
        out.push('\n');
    }
    out += "| **geomean** | | |";
    for (i, _, c) in &cols {
        let g = geomean(
            &cells
                .iter()
                .map(|row| row[*i].wall_ratio)
                .collect::<Vec<_>>(),
        );
        out += &if *c == "plain" || !g.is_finite() {
            " |".to_string()
        } else {
            format!(" **{g:.3}** |")
        };
    }
    out += "\n\n";
    out
}

fn footprint_table(r: &LimitResult, cells: &[Vec<Cell>]) -> String {
    let cols = columns(r);
    let mut out = String::from(
        "**Footprint** (resident peak / swap peak, MiB, medians)\n\n| workload | limit (MiB) |",
    );
    for (_, d, c) in &cols {
        out += &format!(" {}: {c} |", d.name());
    }
    out += "\n|---|---:|";
    out += &"---:|".repeat(cols.len());
    out.push('\n');
    for (w, row) in r.workloads.iter().zip(cells) {
        out += &format!("| {} | {:.1} |", w.name, mib(w.limit_bytes));
        for (i, _, _) in &cols {
            let cell = &row[*i];
            out += &match cell.completed {
                0 => format!(" {} |", failed(cell)),
                _ => format!(
                    " {:.0} / {:.0} |",
                    cell.resident_peak_mib.median, cell.swap_peak_mib.median
                ),
            };
        }
        out.push('\n');
    }
    out.push('\n');
    out
}

fn detail_table(cells: &[Vec<Cell>]) -> String {
    let mut out = String::from(
        "**Every cell** (medians [min-max] over completed runs; footprint avg = the sampler's time-weighted footprint, which counts swapped-out memfd frames as resident)\n\n\
         | workload | device | configuration | completed | wall (s) | vs plain | CPU (s) | resident peak (MiB) | footprint avg (MiB) | swap peak (MiB) | swapped out / in (MiB) | major faults | zram store peak (MiB) |\n\
         |---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for cell in cells.iter().flatten() {
        let status = match cell.problems.is_empty() {
            true => format!("{}/{}", cell.completed, cell.runs),
            false => format!(
                "{}/{} ({})",
                cell.completed,
                cell.runs,
                cell.problems.join(", ")
            ),
        };
        out += &format!(
            "| {} | {} | {} | {status} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} |\n",
            cell.workload,
            cell.device.name(),
            cell.config,
            fmt_spread(cell.wall_s, 2),
            fmt(cell.wall_ratio, 2),
            fmt(cell.cpu_s.median, 2),
            fmt_spread(cell.resident_peak_mib, 1),
            fmt(cell.footprint_avg_mib.median, 1),
            fmt_spread(cell.swap_peak_mib, 1),
            fmt(cell.swapped_out_mib.median, 0),
            fmt(cell.swapped_in_mib.median, 0),
            fmt(cell.major_faults.median, 0),
            fmt(cell.zram_pool_peak_mib.median, 1),
        );
    }
    out.push('\n');
    out
}

/// What the engine did in each cell with engine reports: medians over the
/// runs that completed correctly, summed over the processes of a run.
fn engine_table(r: &LimitResult) -> String {
    let mut rows = String::new();
    for w in &r.workloads {
        for &device in &r.devices {
            for config in &r.configs {
                let totals: Vec<serde_json::Value> = ok(&runs_of(w, device, config))
                    .iter()
                    .filter(|x| !x.outcome.engine.is_empty())
                    .map(|x| crate::program::engine_total(&x.outcome.engine))
                    .collect();
                if totals.is_empty() {
                    continue;
                }
                let med = |path: &[&str]| {
                    let at = |t: &serde_json::Value| {
                        path.iter().fold(t, |v, k| &v[*k]).as_f64().unwrap_or(0.0)
                    };
                    crate::timing::median(&totals.iter().map(at).collect::<Vec<f64>>())
                };
                let mib = |pages: f64| pages * pagefold_engine::PAGE as f64 / (1 << 20) as f64;
                rows += &format!(
                    "| {} | {} | {} | {:.0} / {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2} |\n",
                    w.name,
                    device.name(),
                    config,
                    med(&["clock", "pressure_passes"]),
                    med(&["clock", "passes"]),
                    med(&["clock", "suspensions"]),
                    mib(med(&["clock", "total", "evicted"])),
                    mib(med(&["restored"])),
                    mib(med(&["pages_shared_by_copy"])),
                    med(&["scan_cpu_ns"]) / 1e9,
                );
            }
        }
    }
    if rows.is_empty() {
        return rows;
    }
    "**What the engine did** (medians over completed runs, summed over the processes of a run)\n\n\
     | workload | device | configuration | passes under pressure / all | stops for churn | evicted by passes (MiB) | restored on touch (MiB) | shared by copy (MiB) | scanner CPU (s) |\n\
     |---|---|---|---:|---:|---:|---:|---:|---:|\n"
        .to_string()
        + &rows
        + "\n"
}

fn seconds(cell: &Cell) -> String {
    match cell.completed {
        0 => failed(cell),
        _ => format!("{:.2} s", cell.wall_s.median),
    }
}

fn ratio(cell: &Cell) -> String {
    match (cell.completed, cell.wall_ratio.is_finite()) {
        (0, _) => failed(cell),
        (_, false) => format!("{:.2} s (plain did not complete)", cell.wall_s.median),
        _ => format!("{:.2}", cell.wall_ratio),
    }
}

fn failed(cell: &Cell) -> String {
    format!("**{}**", cell.problems.join(", "))
}

fn fmt(v: f64, digits: usize) -> String {
    if v.is_finite() {
        format!("{v:.digits$}")
    } else {
        "-".into()
    }
}

fn fmt_spread(s: Spread, digits: usize) -> String {
    if !s.median.is_finite() {
        return "-".into();
    }
    format!("{:.d$} [{:.d$}-{:.d$}]", s.median, s.min, s.max, d = digits)
}

/// Writes constrained-SUITE.{json,md,png} into `dir`; returns the files.
pub fn publish(r: &LimitResult, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let stem = format!("constrained-{}", r.suite);
    let mut json = serde_json::to_value(r).map_err(|e| e.to_string())?;
    json["cells"] = serde_json::to_value(all_cells(r)).map_err(|e| e.to_string())?;
    let json_path = dir.join(format!("{stem}.json"));
    let text = pagefold_measure::schema::pretty(crate::report::SCHEMA, &json)
        .map_err(|e| e.to_string())?;
    std::fs::write(&json_path, text + "\n").map_err(|e| format!("{}: {e}", json_path.display()))?;
    let md_path = dir.join(format!("{stem}.md"));
    std::fs::write(&md_path, markdown(r)).map_err(|e| format!("{}: {e}", md_path.display()))?;
    let chart = dir.join(format!("{stem}-runtime.png"));
    runtime_chart(r, &chart)?;
    Ok(vec![json_path, md_path, chart])
}

/// Bars per workload and device: each configuration's wall time relative to
/// plain without a limit (1.0), ksmd's CPU stacked on top.
fn runtime_chart(r: &LimitResult, path: &Path) -> Result<(), String> {
    let cells = all_cells(r);
    let mut groups = Vec::new();
    let (mut values, mut stacked) = (Vec::new(), Vec::new());
    for (w, row) in r.workloads.iter().zip(&cells) {
        let base = plain_unlimited_wall(w);
        for chunk in row.chunks(r.configs.len()) {
            groups.push(format!("{} {}", w.name, chunk[0].device.name()));
            values.push(chunk.iter().map(|c| c.wall_vs_unlimited).collect());
            stacked.push(chunk.iter().map(|c| c.ksmd_cpu_s.median / base).collect());
        }
    }
    let title = format!(
        "{}: wall time under {} x plain's peak, relative to plain without a limit",
        r.suite, r.fraction
    );
    let bars = crate::plot::Bars {
        title: &title,
        y_desc: "wall time / plain without limit",
        workloads: &groups,
        configs: &r.configs,
        values,
        stacked,
    };
    crate::plot::relative_bars(path, &bars)
}

/// The section of the results document: the tables and the chart, linked
/// relative to the document.
pub fn doc_section(r: &LimitResult, files: &[PathBuf], doc: &Path) -> String {
    let mut out = markdown(r);
    out.push('\n');
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "png"))
    {
        out += &format!(
            "![{}]({})\n\n",
            f.file_stem().unwrap_or_default().to_string_lossy(),
            crate::report::link(doc, f)
        );
    }
    out
}
