//! `pagefold analyze PID|IMAGE|CORE...`: what could sharing, patching,
//! compression and deduplication save on this process or memory image.
//! Arguments, the analyses, reports and messages live in
//! pagefold_analyze::cli, where they are tested; this file only hands the
//! parsed arguments over. Every failure is one line on stderr, exit code 2.

pub use pagefold_analyze::cli::Args;

pub fn run(a: Args) -> i32 {
    pagefold_analyze::cli::run(a)
}
