//! What a workload suite measured, as `publish` writes it to
//! results/SUITE.json and `load` reads it back: for each workload and
//! configuration the spread of footprint, time and CPU over the runs and
//! their ratios to plain ([`ConfigStats`]), every run's outcome, the
//! geometric means over workloads, the machine it ran on and the compass
//! verdict. The types live here, below `suite` (which fills them) and the
//! modules that present them (`compass`, `de`), so all of them can depend on
//! the types without depending on each other.

use serde::{Deserialize, Serialize};

use crate::program::Outcome;
use crate::report::Machine;
use crate::stats::{nan_if_null, Spread};

/// One configuration of one workload over all runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigStats {
    pub config: String,
    pub runs: usize,
    pub average_mib: Spread,
    pub peak_mib: Spread,
    pub wall_s: Spread,
    /// The tree's CPU plus ksmd's.
    pub cpu_s: Spread,
    pub ksmd_cpu_s: Spread,
    /// Ratios to plain's medians (1.0 for plain itself).
    pub average_ratio: Spread,
    pub peak_ratio: Spread,
    pub wall_ratio: Spread,
    pub cpu_ratio: Spread,
    /// The tree's user and system time, minor page faults, and the faults' ratio to plain's.
    #[serde(default = "Spread::none")]
    pub user_s: Spread,
    #[serde(default = "Spread::none")]
    pub sys_s: Spread,
    #[serde(default = "Spread::none")]
    pub minor_faults: Spread,
    #[serde(default = "Spread::none")]
    pub faults_ratio: Spread,
    /// Average footprint times wall time (MiB s): the memory a run holds
    /// over its life, which a faster run with the same footprint curve
    /// holds for less time; and its ratio to plain's.
    #[serde(default = "Spread::none")]
    pub memory_time: Spread,
    #[serde(default = "Spread::none")]
    pub memory_time_ratio: Spread,
    /// The `sharing-limit` configuration: its sharing limit over its own average
    /// footprint, both sampled together (NaN for other configurations).
    #[serde(default = "Spread::none")]
    pub limit_ratio: Spread,
    /// Every run printed what the first plain run printed and exited alike.
    pub identical: bool,
    pub failed_runs: usize,
    /// Engine counters summed over processes, median over runs.
    pub engine: serde_json::Map<String, serde_json::Value>,
    /// What the workload reported about itself (see `reported`), by name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metrics: std::collections::BTreeMap<String, Spread>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkloadResult {
    pub name: String,
    pub cmd: Vec<String>,
    pub stats: Vec<ConfigStats>,
    /// Every run, in the order they ran (timelines kept for the first repetition only).
    pub outcomes: Vec<Outcome>,
}

/// Geometric means over workloads of one configuration's ratios.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Geomean {
    pub config: String,
    #[serde(deserialize_with = "nan_if_null")]
    pub average_ratio: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub peak_ratio: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub wall_ratio: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub cpu_ratio: f64,
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub faults_ratio: f64,
    #[serde(default = "nan", deserialize_with = "nan_if_null")]
    pub memory_time_ratio: f64,
}

fn nan() -> f64 {
    f64::NAN
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SuiteResult {
    pub suite: String,
    pub configs: Vec<String>,
    pub runs: usize,
    pub interval_ms: u64,
    pub workloads: Vec<WorkloadResult>,
    pub geomeans: Vec<Geomean>,
    /// True if every run of every workload matched plain.
    pub all_identical: bool,
    /// The machine and its load when the suite started (None when a result file lacks it).
    #[serde(default)]
    pub machine: Option<Machine>,
    /// 1-minute load average when the suite ended.
    #[serde(default)]
    pub load_avg_end: Option<f64>,
    /// pagefold against KSM-aggressive, when both ran (recomputed on load).
    #[serde(default, skip_deserializing)]
    pub compass: Option<Compass>,
}

/// The compass verdict of a suite (see `compass`, which computes it).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Compass {
    /// Geomean over workloads of (pagefold's median average footprint / KSM's).
    pub footprint_vs_ksm: f64,
    /// Workloads where pagefold's average footprint is below KSM's.
    pub workloads_below_ksm: usize,
    pub workloads: usize,
    /// Sum over workloads of median total CPU (tree + ksmd), seconds.
    pub pagefold_cpu_s: f64,
    pub ksm_cpu_s: f64,
    pub plain_cpu_s: Option<f64>,
    /// pagefold_cpu_s / ksm_cpu_s.
    pub cpu_vs_ksm: f64,
    /// (pagefold - plain) / (ksm - plain), summed CPU; None without plain.
    pub extra_cpu_vs_ksm: Option<f64>,
    pub footprint_met: bool,
    pub cpu_met: bool,
}
