//! `pagefold-analyze`: the same entry point as `pagefold analyze`, built with
//! this crate so its tests can run it as a process (exit codes, messages).

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "pagefold-analyze",
    version,
    about = "What could sharing, patching and compression save on this process or image?"
)]
struct Cli {
    #[command(flatten)]
    args: pagefold_analyze::cli::Args,
}

fn main() {
    let cli = Cli::parse();
    std::process::exit(pagefold_analyze::cli::run(cli.args));
}
