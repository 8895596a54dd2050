//! How much the micro and fold suites measure: how many runs each
//! measurement takes its median over, and whether it is a quick (CI) run
//! with fewer and smaller cases. Every suite reads it; lib.rs builds it from
//! the command line.

/// How much to measure.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub runs: usize,
    pub quick: bool,
}
