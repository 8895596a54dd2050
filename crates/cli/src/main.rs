//! The `pagefold` command: it only orchestrates and reports. Engine work lives
//! in pagefold-engine, footprint reading in pagefold-measure, workloads and
//! benchmarks in pagefold-bench.

use clap::{Parser, Subcommand};

mod analyze;
mod banks;
mod demo;
mod doctor;
mod measure;
mod preload;
mod run;

#[derive(Parser)]
#[command(
    name = "pagefold",
    version,
    about = "Fewer physical pages for the same bytes"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the built-in interpreter-like workload plain, through the engine and
    /// (as root) under kernel KSM, and print footprint and time side by side.
    Demo(demo::Args),
    /// The true physical footprint of a process, once or as a time series.
    Measure(measure::Args),
    /// What could sharing, patching and compression save on this process or
    /// memory image (PIDs, raw images, ELF core files)?
    Analyze(analyze::Args),
    /// Run an unmodified program with pagefold (LD_PRELOAD) and report its
    /// footprint; --compare also runs it plain and under kernel KSM.
    Run(run::Args),
    /// Engine micro-benchmarks, the fold comparison against kernel KSM, and the workload
    /// suites (synthetic, R, Python) under plain, pagefold and kernel KSM.
    Bench(pagefold_bench::Args),
    /// How physical addresses map to DRAM banks here: the functions found (by
    /// row-conflict timing) or assumed (from a table), how sure, and whether
    /// the addresses are real or a virtual machine's.
    Banks(banks::Args),
    /// What of pagefold works here, for this user, and why: userfaultfd and
    /// its features, memfd, PFNs, huge pages, KSM, memory limit, mappings;
    /// for each missing piece what it takes away and how to enable it.
    Doctor(doctor::Args),
    /// Print the path of the preload library `pagefold run` uses (for
    /// LD_PRELOAD in a kernel spec or a service file).
    Preload,
}

fn main() {
    let cli = Cli::parse();
    if matches!(
        cli.cmd,
        Cmd::Measure(_) | Cmd::Analyze(_) | Cmd::Banks(_) | Cmd::Doctor(_) | Cmd::Preload
    ) {
        quiet_on_closed_output();
    }
    if let Err(e) = preload::provide() {
        eprintln!("pagefold: {e}");
    }
    let code = match cli.cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Measure(a) => measure::run(a),
        Cmd::Analyze(a) => analyze::run(a),
        Cmd::Bench(a) => pagefold_bench::run(a),
        Cmd::Run(a) => run::run(a),
        Cmd::Banks(a) => banks::run(a),
        Cmd::Doctor(a) => doctor::run(a),
        Cmd::Preload => match preload::path() {
            Ok(p) => {
                println!("{}", p.display());
                0
            }
            Err(e) => {
                eprintln!("pagefold: {e}");
                1
            }
        },
    };
    std::process::exit(code);
}

/// For the commands that only write their own output: a reader that stops
/// early (`pagefold measure --json | head`) ends the command as it ends
/// `cat`, quietly, by SIGPIPE. Rust ignores SIGPIPE, which turns every later
/// `println!` into a panic on a closed pipe. Not for `run`, `bench` and
/// `demo`, which write into pipes to their children and must see EPIPE.
fn quiet_on_closed_output() {
    // SAFETY: called in main before any thread starts; SIG_DFL is a valid
    // disposition for SIGPIPE and no handler of ours is replaced.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}
