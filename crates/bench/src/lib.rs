//! pagefold-bench: the harness behind `pagefold bench`. It measures what the
//! engine's mechanisms cost and save, always next to what they replace
//! (memcpy into fresh memory, the kernel's copy-on-write fault, the kernel's
//! KSM) in the same run, and reports medians and ratios three ways: a human
//! table on stdout, JSON (`--out`), and the generated sections of
//! docs/BENCHMARKS.md. It is a harness, not a timed test: a missed target is
//! printed as MISS, it does not fail the command. A failed correctness check
//! (bytes read back wrong after a copy or a fold) does: exit code 2.
//!
//! Suites: `micro` (per-page costs and scan throughput, see `micro`), `fold`
//! (the 1 GiB fold against kernel KSM, see `fold` and `kernel_ksm`).

pub mod fold;
pub mod kernel_ksm;
pub mod ksm;
pub mod mem;
pub mod plot;
pub mod program;
pub mod micro;
pub mod report;
pub mod timing;

use std::path::PathBuf;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// Per-page costs: virtual copy, CoW break, zero fold, merge, scan throughput.
    Micro,
    /// The 1 GiB fold: pagefold's scan against kernel KSM at several scan rates.
    Fold,
    /// Both.
    All,
}

/// Measure the engine next to what it replaces (memcpy, the kernel's CoW fault, KSM): print tables,
/// write JSON and the generated sections of docs/BENCHMARKS.md.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which suite to run.
    #[arg(long, value_enum, default_value_t = Suite::All)]
    pub suite: Suite,
    /// Fewer runs and only the aggressive KSM setting (capped at 30 s): under 2 minutes.
    #[arg(long)]
    pub quick: bool,
    /// Runs per measurement (medians are taken over them); default 5, or 3 with --quick.
    #[arg(long)]
    pub runs: Option<usize>,
    /// JSON results file; the suites run now replace their key, the others are kept.
    #[arg(long, default_value = "docs/bench-results.json")]
    pub out: PathBuf,
    /// Markdown file whose generated sections are rewritten; "-" leaves it alone.
    #[arg(long, default_value = "docs/BENCHMARKS.md")]
    pub doc: PathBuf,
}

/// How much to measure.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub runs: usize,
    pub quick: bool,
}

impl Plan {
    pub fn from_args(a: &Args) -> Plan {
        let default_runs = if a.quick { 3 } else { 5 };
        Plan { runs: a.runs.unwrap_or(default_runs).max(1), quick: a.quick }
    }
}

/// Runs the chosen suites; exit code 0, 1 on an error (files, KSM), 2 if the
/// engine failed a correctness check.
pub fn run(a: Args) -> i32 {
    match run_suites(&a) {
        Ok(true) => 0,
        Ok(false) => {
            eprintln!("bench: the engine FAILED a correctness check (see 'verified' above)");
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
    let plan = Plan::from_args(a);
    let mut all_verified = true;
    if matches!(a.suite, Suite::Micro | Suite::All) {
        let machine = report::Machine::probe(&plan);
        let results = micro::run(&plan);
        all_verified &= micro_verified(&results);
        let markdown = report::micro_markdown(&results, &machine);
        publish(a, "micro", &markdown, serde_json::json!({ "machine": machine, "results": results }))?;
    }
    if matches!(a.suite, Suite::Fold | Suite::All) {
        let machine = report::Machine::probe(&plan);
        let results = fold::run(&plan);
        all_verified &= results.engine.verified;
        let markdown = report::fold_markdown(&results, &machine);
        publish(a, "fold", &markdown, serde_json::json!({ "machine": machine, "results": results }))?;
    }
    Ok(all_verified)
}

fn micro_verified(m: &micro::MicroResults) -> bool {
    let scans = [&m.zero_fold, &m.merge, &m.scan_unique, &m.scan_zero];
    m.copy.iter().all(|r| r.verified) && scans.iter().all(|s| s.verified)
}

/// Prints the section and writes it to the JSON file and the doc.
fn publish(a: &Args, suite: &str, markdown: &str, json: serde_json::Value) -> anyhow::Result<()> {
    println!("\n## pagefold bench: {suite}\n\n{markdown}");
    report::update_json(&a.out, suite, json)?;
    eprintln!("bench: {suite} results written to {}", a.out.display());
    if a.doc.as_os_str() != "-" {
        report::update_doc(&a.doc, suite, markdown)?;
        eprintln!("bench: {suite} section regenerated in {}", a.doc.display());
    }
    Ok(())
}
