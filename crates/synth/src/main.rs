//! The `pagefold-synth` command: one subcommand per synthetic workload (see
//! the library's documentation), plus `list`. Bad input ends in one line on
//! stderr and exit code 2; a failure while running (memory refused) in one
//! line and exit code 1.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pagefold_synth::{Params, Workload, DEFAULT_SEED};

#[derive(Parser)]
#[command(
    name = "pagefold-synth",
    version,
    about = "Synthetic workloads for pagefold bench: copies, zero pages, duplicates; Difference Engine's micro-benchmark"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Smaller sizes and less work (what `pagefold bench --quick` runs).
    #[arg(long, global = true)]
    quick: bool,
    /// Multiply every size (and the work on it) by this, at most 16.
    #[arg(long, global = true, default_value_t = 1.0)]
    scale: f64,
    /// Seed of the generator that makes every buffer's content.
    #[arg(long, global = true, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Spread the work of zeros and duplicates over at least this many seconds (default 6, 4
    /// with --quick; 0: as fast as possible). Their memory must outlive two background scans.
    /// For scattered: how long it stays idle (default 20, 6 with --quick).
    #[arg(long, global = true, value_name = "SECONDS")]
    hold: Option<f64>,
    /// Length of each idle period of the de-* workloads (default 10, 3 with --quick): long enough
    /// for background scans to share the pages and the clock to find them cold.
    #[arg(long, global = true, value_name = "SECONDS")]
    idle: Option<f64>,
}

#[derive(Subcommand)]
enum Cmd {
    #[command(about = Workload::Copies.about())]
    Copies,
    #[command(about = Workload::Zeros.about())]
    Zeros,
    #[command(about = Workload::Duplicates.about())]
    Duplicates,
    #[command(about = Workload::Mixed.about())]
    Mixed,
    #[command(about = Workload::Scattered.about())]
    Scattered,
    #[command(about = Workload::DeZero.about())]
    DeZero,
    #[command(about = Workload::DeRandom.about())]
    DeRandom,
    #[command(about = Workload::DeIdentical.about())]
    DeIdentical,
    #[command(about = Workload::DeSimilar.about())]
    DeSimilar,
    /// The workloads of a suite of `pagefold bench`, one per line: name, then what it does.
    List {
        /// synthetic (copies, zeros, duplicates, mixed) or de (Difference Engine's micro-benchmark).
        #[arg(default_value = "synthetic", value_parser = ["synthetic", "de"])]
        suite: String,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    let workload = match cli.cmd {
        Cmd::Copies => Workload::Copies,
        Cmd::Zeros => Workload::Zeros,
        Cmd::Duplicates => Workload::Duplicates,
        Cmd::Mixed => Workload::Mixed,
        Cmd::Scattered => Workload::Scattered,
        Cmd::DeZero => Workload::DeZero,
        Cmd::DeRandom => Workload::DeRandom,
        Cmd::DeIdentical => Workload::DeIdentical,
        Cmd::DeSimilar => Workload::DeSimilar,
        Cmd::List { suite } => return list(&suite),
    };
    let params = Params {
        quick: cli.quick,
        scale: cli.scale,
        seed: cli.seed,
        hold: cli.hold,
        idle: cli.idle,
    };
    if let Err(e) = params.validate() {
        eprintln!("pagefold-synth: {e}");
        return ExitCode::from(2);
    }
    match pagefold_synth::run(workload, &params, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pagefold-synth {}: {e}", workload.name());
            ExitCode::FAILURE
        }
    }
}

fn list(suite: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    for w in Workload::ALL.into_iter().filter(|w| w.suite() == suite) {
        if writeln!(out, "{:<14}{}", w.name(), w.about()).is_err() {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Help and version as clap prints them; any other parse error as its
/// first line only (clap adds usage and a hint below it).
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            eprintln!("pagefold-synth: no workload given (one of: copies, zeros, duplicates, mixed, de-zero, de-random, de-identical, de-similar, list)");
            ExitCode::from(2)
        }
        _ => {
            let text = e.render().to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("bad arguments")
                .trim_start_matches("error: ");
            eprintln!("pagefold-synth: {first}");
            ExitCode::from(2)
        }
    }
}
