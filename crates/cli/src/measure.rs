//! `pagefold measure PID`: the true physical footprint of a process (or its
//! tree), once as a small table or as a time series with peak and average.
//! Argument checks, messages and formatting live in pagefold_measure::cli,
//! where they are tested; this file wires them to clap, stdout and the exit
//! code. Every failure is one line on stderr and exit code 2.

use std::sync::atomic::{AtomicBool, Ordering};

use pagefold_measure::cli::{self, Failure, SeriesPlan};
use pagefold_measure::{measure, Footprint};

#[derive(clap::Args)]
pub struct Args {
    /// Process ID to measure.
    #[arg(value_name = "PID", allow_hyphen_values = true)]
    pid: String,
    /// Sample every MS milliseconds until the process exits (a time series).
    #[arg(long, value_name = "MS")]
    interval: Option<u64>,
    /// Stop the series after N samples (implies a series; interval 1000 ms by default).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Stop the series after S seconds (implies a series; interval 1000 ms by default).
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// Include all descendants of PID, counting pages they share once.
    #[arg(long)]
    tree: bool,
    /// Also read the sharing limit: the footprint if every all-zero page and
    /// every repeated anonymous page content were folded (needs root; reads
    /// every anonymous page, so each measurement takes longer).
    #[arg(long)]
    limit: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> i32 {
    match run_checked(&a) {
        Ok(()) => 0,
        Err(failure) => {
            eprintln!("{failure}");
            failure.exit_code
        }
    }
}

fn run_checked(a: &Args) -> Result<(), Failure> {
    let pid = cli::parse_pid(&a.pid)?;
    match SeriesPlan::from_options(a.interval, a.count, a.duration)? {
        None => one_shot(pid, a),
        Some(plan) => series(pid, a, &plan),
    }
}

fn one_shot(pid: u32, a: &Args) -> Result<(), Failure> {
    let footprint = measure(pid, a.tree, a.limit)?;
    if a.json {
        println!("{}", cli::footprint_json(&footprint)?);
    } else {
        print!("{}", cli::footprint_table(&footprint));
    }
    Ok(())
}

/// Set by SIGINT so that Ctrl-C ends a series with its summary.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

fn series(pid: u32, a: &Args, plan: &SeriesPlan) -> Result<(), Failure> {
    let handler = on_interrupt as extern "C" fn(libc::c_int);
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    let previous = unsafe { libc::signal(libc::SIGINT, handler as libc::sighandler_t) };
    let print_live = !a.json;
    let result = plan.sampler(pid, a.tree).sharing_limit(a.limit).run_with(
        &INTERRUPTED,
        |sample: &Footprint| {
            if print_live {
                println!("{}", cli::sample_line(sample));
            }
        },
    );
    // SAFETY: restores the disposition saved above.
    unsafe { libc::signal(libc::SIGINT, previous) };
    let series = result?;
    if a.json {
        println!("{}", cli::series_json(&series)?);
    } else {
        println!("{}", cli::summary_line(&series));
    }
    cli::series_failure(&series).map_or(Ok(()), Err)
}
