//! What the end-to-end tests of the bench suites (synthetic, de, dask)
//! share: the binaries, a scratch directory, running a suite and reading its
//! JSON result.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The pagefold binary of this build with libpagefold_preload.so and
/// pagefold-synth beside it (where `pagefold bench` looks), built for the
/// test (see pagefold-testkit).
pub fn pagefold() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pagefold"));
    pagefold_testkit::build_into(
        bin.parent().unwrap(),
        &["pagefold-preload", "pagefold-synth"],
        &["libpagefold_preload.so", "pagefold-synth"],
    );
    bin
}

/// Runs `pagefold bench --quick --suite SUITE ARGS --out OUT` in `out`,
/// which must succeed; the suite's JSON result and what the bench printed
/// on stderr.
pub fn bench(suite: &str, out: &Path, args: &[&str]) -> (Value, String) {
    let run = Command::new(pagefold())
        .args(["bench", "--quick", "--suite", suite])
        .args(args)
        .arg("--out")
        .arg(out)
        .current_dir(out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
    assert!(
        run.status.success(),
        "pagefold bench failed ({}):\n{stderr}",
        run.status
    );
    let json = out.join(format!("results/{suite}.json"));
    let result = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    (result, stderr)
}

/// An empty directory of its own for the test called `name`.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagefold-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The stats of `config` for `workload` in the suite's JSON.
pub fn stats<'a>(suite: &'a Value, workload: &str, config: &str) -> &'a Value {
    let w = suite["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == workload)
        .unwrap_or_else(|| panic!("no workload {workload}"));
    w["stats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["config"] == config)
        .unwrap_or_else(|| panic!("{workload}: no config {config}"))
}

pub fn average_ratio(suite: &Value, workload: &str, config: &str) -> f64 {
    stats(suite, workload, config)["average_ratio"]["median"]
        .as_f64()
        .unwrap()
}

/// An engine counter (median over runs; 0 when absent).
pub fn counter(suite: &Value, workload: &str, config: &str, name: &str) -> f64 {
    stats(suite, workload, config)["engine"][name]
        .as_f64()
        .unwrap_or(0.0)
}
