//! pagefold-bench: the harness behind `pagefold bench`. It measures what the
//! engine's mechanisms cost and save, always next to what they replace
//! (memcpy into fresh memory, the kernel's copy-on-write fault, the kernel's
//! KSM) in the same run, and reports medians and ratios three ways: a human
//! table on stdout, JSON, markdown and charts in `--out` (nothing outside it),
//! and, only when asked with `--update-docs`, the generated sections of
//! BENCHMARKS.md and RESULTS.md. It is a harness, not a timed test: a missed target is
//! printed as MISS, it does not fail the command. A failed correctness check
//! (bytes read back wrong after a copy or a fold) does: exit code 2.
//!
//! Suites: `micro` (per-page costs and scan throughput, see `micro`), `fold`
//! (the 1 GiB fold against kernel KSM, see `fold` and `kernel_ksm`), and the
//! workload suites `r`, `python` and `synthetic`: real programs (see
//! `workloads`; the synthetic ones are pagefold-synth's subcommands, which
//! need neither R nor Python) run under each configuration (see `program`),
//! interleaved and summarised as ratios to plain (see `suite`), drawn (see
//! `plot`); with `--limit`, the same programs under a memory limit with swap
//! (see `constrained`). The workload suite `de` is Difference Engine's
//! micro-benchmark (pagefold-synth's `de-*` workloads) with its savings over
//! time per mechanism (see `de`). The workload suite `dask` runs Dask jobs
//! (bench/dask) on a two-worker LocalCluster, with what the jobs report
//! about themselves, bytes spilled and each worker's peak, tabulated beside
//! the harness's own figures (see `reported`). The `sharing-limit`
//! configuration of any workload suite gives each workload's sharing limit
//! and the share of it the others captured (see `sharing_limit`). The suite `banks` runs a streaming and a
//! random-access program together with their frames from shared and from
//! disjoint DRAM banks (page colouring), next to the row-buffer model (see `banks`).

pub mod banks;
pub mod cgroup;
pub mod compass;
pub mod constrained;
pub mod constrained_report;
pub mod de;
pub mod fold;
pub mod fold_data;
pub mod kernel_ksm;
pub mod ksm;
pub mod max_map;
pub mod mem;
pub mod micro;
pub mod plan;
pub mod plot;
pub mod program;
pub mod report;
pub mod reported;
pub mod sharing_limit;
pub mod stats;
pub mod suite;
pub mod suite_result;
pub mod swap;
pub mod sys;
pub mod teardown;
pub mod timing;
pub mod workloads;

use std::path::PathBuf;
use std::time::Duration;

pub use plan::Plan;
use workloads::ProgramSuite;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// Per-page costs: virtual copy, CoW break, zero fold, merge, scan throughput.
    Micro,
    /// The 1 GiB fold: pagefold's scan against kernel KSM at several scan rates.
    Fold,
    /// Micro, fold and synthetic.
    All,
    /// The R workloads (bench/r) under every configuration.
    R,
    /// The Python/numpy workloads (bench/python) under every configuration.
    Python,
    /// The synthetic workloads (pagefold-synth: copies, zeros, duplicates, mixed) under every
    /// configuration; needs neither R nor Python.
    Synthetic,
    /// Difference Engine's micro-benchmark (pagefold-synth de-zero, de-random, de-identical,
    /// de-similar): savings over time of sharing, patching and compression alone and together.
    De,
    /// Dask jobs (bench/dask) on a LocalCluster of two workers with a memory limit, plain and
    /// under pagefold, with the bytes Dask spilled and each worker's peak.
    Dask,
    /// Bank partitioning: a streaming and a random-access program together, frames from shared
    /// banks and from disjoint halves (page colouring), with the colouring cost, the row-conflict
    /// probe and the trace-driven row-buffer model.
    Banks,
}

/// The configurations a workload suite runs without `--configs`.
const DEFAULT_CONFIGS: &str = "plain,pagefold,copy,zero,merge,ksm-100,ksm-1000,ksm-10000";
/// The same for the de suite: Difference Engine's mechanisms alone and together.
const DEFAULT_DE_CONFIGS: &str = "plain,de-share,de-patch,de-compress,de-all";
/// The same for the dask suite: a Dask run is long, so plain and pagefold.
const DEFAULT_DASK_CONFIGS: &str = "plain,pagefold";

/// Measure the engine next to what it replaces (memcpy, the kernel's CoW fault, KSM), and real
/// programs under pagefold, plain and kernel KSM: print tables, write JSON, markdown and charts.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Suites to run, comma-separated or repeated: micro, fold, synthetic, all (= micro,fold,synthetic), banks,
    /// r, python, de, dask.
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1.., default_value = "all")]
    pub suite: Vec<Suite>,
    /// For CI: fewer runs (3 for micro/fold, 1 for workload suites), only the aggressive KSM setting
    /// for the fold, and the synthetic, de and dask workloads at their small sizes (pagefold-synth --quick;
    /// de: 16 MiB, 3 s idle periods, 10.5 s a run; dask: a 0.1 GB table).
    /// On a 2-core machine `--quick` alone (micro, fold, synthetic, every configuration) takes about
    /// 2.5 minutes (3.5 when it is busy), `--quick --suite synthetic` about 1.5 (2).
    #[arg(long)]
    pub quick: bool,
    /// Runs per measurement (medians are taken over them); default 5 (micro, fold) or 3 (workload
    /// suites); --quick: 3 or 1.
    #[arg(long)]
    pub runs: Option<usize>,
    /// Configurations of the workload suites, comma-separated: plain, pagefold, copy, zero, merge,
    /// ksm-100, ksm-1000, ksm-10000 (KSM ones need root; its knobs are restored afterwards),
    /// pagefold+ksm-10000 (pagefold handing blocks it cannot merge to KSM at that rate),
    /// de-share, de-patch, de-compress, de-all (Difference Engine's mechanisms, see docs/BENCHMARKS.md),
    /// sharing-limit (the program alone, sampled for what sharing could reach at best; the
    /// report then shows the share of it each configuration captured; needs root),
    /// and pagefold:KEY=V:... (pagefold with PAGEFOLD_KEY=V, for a variable docs/CONFIG.md
    /// lists; KEY with or without its PAGEFOLD_ prefix). Default:
    /// plain,pagefold,copy,zero,merge,ksm-100,ksm-1000,ksm-10000; for the de suite
    /// plain,de-share,de-patch,de-compress,de-all; for the dask suite plain,pagefold.
    #[arg(long, value_delimiter = ',')]
    pub configs: Vec<String>,
    /// Only these workloads of the workload suites (comma-separated names, e.g. glmnet,gbm).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Where the workload programs live (r/*.R, python/*.py, dask/*.py).
    #[arg(long, default_value = "bench")]
    pub workloads: PathBuf,
    /// The synthetic suite's program (default: pagefold-synth beside this program).
    #[arg(long)]
    pub synth: Option<PathBuf>,
    /// Seconds of each idle period of the de suite's workloads (default 10, 3 with --quick); the
    /// tiering mechanisms act only on pages the clock has found cold.
    #[arg(long, value_name = "SECONDS")]
    pub de_idle: Option<f64>,
    /// Workloads whose memory over time is drawn (default: the four pagefold changes most).
    #[arg(long, value_delimiter = ',')]
    pub timelines: Vec<String>,
    /// Footprint sampling interval of workload runs, in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub interval: u64,
    /// A workload run still going after this many seconds is killed and reported as failed.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// The preload library (default: libpagefold_preload.so beside this program).
    #[arg(long)]
    pub preload: Option<PathBuf>,
    /// Results directory: bench-results.json (micro, fold) and results/SUITE.{json,md,png}.
    /// The harness writes nothing outside it unless asked to update docs.
    #[arg(long, value_name = "DIR", default_value = "bench-results")]
    pub out: PathBuf,
    /// Also rewrite the generated sections of DIR/BENCHMARKS.md (micro, fold) and DIR/RESULTS.md
    /// (workload suites); their charts are linked where --out put them. Default: no doc is touched.
    #[arg(long, value_name = "DIR")]
    pub update_docs: Option<PathBuf>,
    /// Markdown file whose generated sections (micro, fold) are rewritten, instead of
    /// DIR/BENCHMARKS.md of --update-docs; "-" leaves it alone.
    #[arg(long, value_name = "PATH")]
    pub doc: Option<PathBuf>,
    /// Instead of running, draw again the tables and charts of these suite results
    /// (results/SUITE.json written by an earlier run) into --out (and the results doc, if asked).
    #[arg(long, value_delimiter = ',')]
    pub render: Vec<PathBuf>,
    /// Markdown file whose generated sections (one per workload suite) are rewritten, instead of
    /// DIR/RESULTS.md of --update-docs; "-" leaves it alone.
    #[arg(long, value_name = "PATH")]
    pub results_doc: Option<PathBuf>,
    /// MiB of each program's buffer in the banks suite (default 512, 128 with --quick): more than
    /// the caches hold.
    #[arg(long, value_name = "MIB")]
    pub banks_mib: Option<usize>,
    #[command(flatten)]
    pub limits: constrained::LimitArgs,
}

impl Args {
    /// The configurations of workload suite `ps`: `--configs`, or the suite's default.
    pub fn configs_for(&self, ps: ProgramSuite) -> Vec<String> {
        if !self.configs.is_empty() {
            return self.configs.clone();
        }
        let default = match ps {
            ProgramSuite::De => DEFAULT_DE_CONFIGS,
            ProgramSuite::Dask => DEFAULT_DASK_CONFIGS,
            _ => DEFAULT_CONFIGS,
        };
        default.split(',').map(str::to_string).collect()
    }

    /// The document whose micro and fold sections are rewritten, if any.
    pub fn benchmarks_doc_path(&self) -> Option<PathBuf> {
        doc_path(&self.doc, &self.update_docs, "BENCHMARKS.md")
    }

    /// The document whose workload suite sections are rewritten, if any.
    pub fn results_doc_path(&self) -> Option<PathBuf> {
        doc_path(&self.results_doc, &self.update_docs, "RESULTS.md")
    }
}

/// An explicit document (none if "-"), else `name` in the `--update-docs`
/// directory, else none.
fn doc_path(explicit: &Option<PathBuf>, dir: &Option<PathBuf>, name: &str) -> Option<PathBuf> {
    match explicit {
        Some(p) if p.as_os_str() == "-" => None,
        Some(p) => Some(p.clone()),
        None => dir.as_ref().map(|d| d.join(name)),
    }
}

impl Plan {
    pub fn from_args(a: &Args) -> Plan {
        let default_runs = if a.quick { 3 } else { 5 };
        Plan {
            runs: a.runs.unwrap_or(default_runs).max(1),
            quick: a.quick,
        }
    }
}

/// Runs the chosen suites; exit code 0, 1 on an error (files, KSM, a missing
/// interpreter), 2 if the engine failed a correctness check or a workload's
/// output differed from plain.
pub fn run(a: Args) -> i32 {
    match run_suites(&a) {
        Ok(true) => 0,
        Ok(false) => {
            eprintln!("bench: a correctness check FAILED (see 'verified' or DIFFERS above)");
            2
        }
        Err(e) => {
            eprintln!("bench: {e:#}");
            1
        }
    }
}

/// Returns whether every correctness check passed.
fn run_suites(a: &Args) -> anyhow::Result<bool> {
    if !a.render.is_empty() {
        return render(a);
    }
    let plan = Plan::from_args(a);
    let has = |s: Suite| {
        a.suite.contains(&s)
            || (a.suite.contains(&Suite::All)
                && matches!(s, Suite::Micro | Suite::Fold | Suite::Synthetic))
    };
    preflight(a, &has)?;
    let mut all_verified = true;
    if has(Suite::Micro) {
        let machine = report::Machine::probe(&plan);
        let results = micro::run(&plan);
        all_verified &= micro_verified(&results);
        let markdown = report::micro_markdown(&results, &machine);
        publish(
            a,
            "micro",
            &markdown,
            serde_json::json!({ "machine": machine, "results": results }),
        )?;
    }
    if has(Suite::Fold) {
        let machine = report::Machine::probe(&plan);
        let results = fold::run(&plan);
        all_verified &= results.engine.verified;
        let markdown = report::fold_markdown(&results, &machine);
        publish(
            a,
            "fold",
            &markdown,
            serde_json::json!({ "machine": machine, "results": results }),
        )?;
    }
    if has(Suite::Banks) {
        all_verified &= banks_suite(a)?;
    }
    for (s, ps) in PROGRAM_SUITES {
        if has(s) {
            all_verified &= program_suite(a, ps)?;
        }
    }
    Ok(all_verified)
}

/// The workload suites, by the suite that chooses them.
const PROGRAM_SUITES: [(Suite, ProgramSuite); 5] = [
    (Suite::R, ProgramSuite::R),
    (Suite::Python, ProgramSuite::Python),
    (Suite::Synthetic, ProgramSuite::Synthetic),
    (Suite::De, ProgramSuite::De),
    (Suite::Dask, ProgramSuite::Dask),
];

/// Fails at once, not after minutes of micro and fold, when a chosen
/// workload suite could not run anyway (unknown configuration, no preload
/// library, no pagefold-synth).
fn preflight(a: &Args, has: &dyn Fn(Suite) -> bool) -> anyhow::Result<()> {
    let chosen: Vec<ProgramSuite> = PROGRAM_SUITES
        .iter()
        .filter(|(s, _)| has(*s))
        .map(|(_, ps)| *ps)
        .collect();
    if chosen.is_empty() {
        return Ok(());
    }
    for c in chosen.iter().flat_map(|ps| a.configs_for(*ps)) {
        program::parse_config(&c).map_err(anyhow::Error::msg)?;
    }
    program::find_preload(a.preload.as_deref()).map_err(anyhow::Error::msg)?;
    if let Some(idle) = a
        .de_idle
        .filter(|i| !(0.0..=pagefold_synth::MAX_HOLD).contains(i))
    {
        anyhow::bail!(
            "--de-idle must be 0 to {} seconds, not {idle}",
            pagefold_synth::MAX_HOLD
        );
    }
    if chosen
        .iter()
        .any(|ps| matches!(ps, ProgramSuite::Synthetic | ProgramSuite::De))
    {
        workloads::find_synth(a.synth.as_deref()).map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

/// The programs of a workload suite as the arguments choose them: scripts
/// under `--workloads`, or pagefold-synth's subcommands (small with `--quick`).
pub(crate) fn suite_workloads(
    a: &Args,
    ps: ProgramSuite,
) -> Result<Vec<workloads::Workload>, String> {
    match ps {
        ProgramSuite::Synthetic | ProgramSuite::De => workloads::find_synth(a.synth.as_deref())
            .and_then(|synth| {
                workloads::discover_synthetic(&synth, ps, a.quick, a.de_idle, &a.only)
            }),
        ProgramSuite::Dask => workloads::discover_dask(&a.workloads, a.quick, &a.only),
        _ => workloads::discover(ps, &a.workloads, &a.only),
    }
}

/// Runs one workload suite and publishes it; false if an output differed.
fn program_suite(a: &Args, ps: ProgramSuite) -> anyhow::Result<bool> {
    if !a.limits.limit.is_empty() {
        return constrained_suite(a, ps);
    }
    let configs = a
        .configs_for(ps)
        .iter()
        .map(|c| program::parse_config(c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    let workloads = suite_workloads(a, ps).map_err(anyhow::Error::msg)?;
    let preload = program::find_preload(a.preload.as_deref()).map_err(anyhow::Error::msg)?;
    let runs = a.runs.unwrap_or(if a.quick { 1 } else { 3 }).max(1);
    let plan = suite::SuitePlan {
        suite: ps.name(),
        workloads: &workloads,
        configs: &configs,
        runs,
        preload: &preload,
        interval: Duration::from_millis(a.interval.max(1)),
        timeout: Some(Duration::from_secs(a.timeout.max(1))),
    };
    eprintln!(
        "bench: suite {}: {} workloads x {} configurations x {runs} runs",
        ps.name(),
        workloads.len(),
        configs.len()
    );
    let result = suite::run(&plan).map_err(anyhow::Error::msg)?;
    publish_suite(a, &result)?;
    Ok(result.all_identical)
}

/// `pagefold bench --limit ...` for one workload suite: runs, prints,
/// writes files and the doc section; false if a run failed or differed.
fn constrained_suite(a: &Args, ps: ProgramSuite) -> anyhow::Result<bool> {
    let l = &a.limits;
    constrained::check_fraction(l.limit_fraction).map_err(anyhow::Error::msg)?;
    let mut configs = a
        .configs_for(ps)
        .iter()
        .map(|c| program::parse_config(c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    constrained::plain_first(&mut configs);
    let mut devices = l.limit.clone();
    devices.sort();
    devices.dedup();
    let workloads = suite_workloads(a, ps).map_err(anyhow::Error::msg)?;
    let preload = program::find_preload(a.preload.as_deref()).map_err(anyhow::Error::msg)?;
    let runs = a.runs.unwrap_or(if a.quick { 1 } else { 3 }).max(1);
    let plan = constrained::LimitPlan {
        suite: ps.name(),
        workloads: &workloads,
        configs: &configs,
        devices: &devices,
        fraction: l.limit_fraction,
        runs,
        preload: &preload,
        interval: Duration::from_millis(a.interval.max(1)),
        timeout: Some(Duration::from_secs(a.timeout.max(1))),
        swap_dir: &l.swap_dir,
        zram_algorithm: &l.zram_algorithm,
    };
    eprintln!(
        "bench: suite {} under a limit of {} x plain's peak: {} workloads x {} configurations x {} devices x {runs} runs",
        ps.name(),
        l.limit_fraction,
        workloads.len(),
        configs.len(),
        devices.len()
    );
    let result = constrained::run(&plan).map_err(anyhow::Error::msg)?;
    let markdown = constrained_report::markdown(&result);
    println!(
        "\n## pagefold bench: {} under a memory limit\n\n{markdown}",
        ps.name()
    );
    let files =
        constrained_report::publish(&result, &a.out.join("results")).map_err(anyhow::Error::msg)?;
    for f in &files {
        eprintln!("bench: wrote {}", f.display());
    }
    if let Some(doc) = a.results_doc_path() {
        let key = if ps == ProgramSuite::R {
            "constrained".to_string()
        } else {
            format!("constrained-{}", ps.name())
        };
        report::update_doc(
            &doc,
            &key,
            &constrained_report::doc_section(&result, &files, &doc),
        )?;
        eprintln!("bench: {key} section regenerated in {}", doc.display());
    }
    Ok(result
        .workloads
        .iter()
        .flat_map(|w| &w.runs)
        .all(|r| !r.verdict.is_error()))
}

/// `--suite banks`: runs, prints, writes results/banks.{json,md} and the doc
/// section; false if a program's bytes were not intact.
fn banks_suite(a: &Args) -> anyhow::Result<bool> {
    let plan = banks::BanksPlan {
        runs: a.runs.unwrap_or(if a.quick { 1 } else { 3 }).max(1),
        mib: a
            .banks_mib
            .unwrap_or(if a.quick { 128 } else { 512 })
            .max(8),
        seconds: if a.quick { 1.0 } else { 2.0 },
        cost_mib: 64,
    };
    let result = banks::run(&plan).map_err(anyhow::Error::msg)?;
    let markdown = banks::markdown(&result);
    println!("\n## pagefold bench: banks\n\n{markdown}");
    let dir = a.out.join("results");
    std::fs::create_dir_all(&dir)?;
    let json = pagefold_measure::schema::pretty(report::SCHEMA, &result)?;
    std::fs::write(dir.join("banks.json"), json + "\n")?;
    std::fs::write(dir.join("banks.md"), &markdown)?;
    eprintln!("bench: wrote {}", dir.join("banks.{json,md}").display());
    if let Some(doc) = a.results_doc_path() {
        report::update_doc(&doc, "banks", &markdown)?;
        eprintln!("bench: banks section regenerated in {}", doc.display());
    }
    Ok(result.verified)
}

/// Publishes earlier suite results again (`--render`).
fn render(a: &Args) -> anyhow::Result<bool> {
    let mut all_identical = true;
    for path in &a.render {
        let result = suite::load(path).map_err(anyhow::Error::msg)?;
        publish_suite(a, &result)?;
        all_identical &= result.all_identical;
    }
    Ok(all_identical)
}

/// Prints a workload suite's tables and writes its files and doc section.
fn publish_suite(a: &Args, result: &suite::SuiteResult) -> anyhow::Result<()> {
    let markdown = suite::markdown(result);
    println!("\n## pagefold bench: {}\n\n{markdown}", result.suite);
    let dir = a.out.join("results");
    let files = suite::publish(result, &dir, &a.timelines).map_err(anyhow::Error::msg)?;
    for f in &files {
        eprintln!("bench: wrote {}", f.display());
    }
    if let Some(doc) = a.results_doc_path() {
        let section = suite::doc_section(result, &files, &doc);
        report::update_doc(&doc, &result.suite, &section)?;
        eprintln!(
            "bench: {} section regenerated in {}",
            result.suite,
            doc.display()
        );
    }
    Ok(())
}

fn micro_verified(m: &micro::MicroResults) -> bool {
    let scans = [&m.zero_fold, &m.merge, &m.scan_unique, &m.scan_zero];
    m.copy.iter().all(|r| r.verified) && scans.iter().all(|s| s.verified)
}

/// Prints the section and writes it to the JSON file (and the doc, if asked).
fn publish(a: &Args, suite: &str, markdown: &str, json: serde_json::Value) -> anyhow::Result<()> {
    println!("\n## pagefold bench: {suite}\n\n{markdown}");
    let path = a.out.join("bench-results.json");
    report::update_json(&path, suite, json)?;
    eprintln!("bench: {suite} results written to {}", path.display());
    if let Some(doc) = a.benchmarks_doc_path() {
        report::update_doc(&doc, suite, markdown)?;
        eprintln!("bench: {suite} section regenerated in {}", doc.display());
    }
    Ok(())
}
