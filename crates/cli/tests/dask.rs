//! `pagefold bench --quick --suite dask` end to end, through the built
//! binaries and the real Dask: the dataframe job of bench/dask at its small
//! size (a 0.1 GB table, 4 partitions) on a LocalCluster of two worker
//! processes, plain and under pagefold, one run each. It checks that both
//! print the same results, that the job's own report (bytes spilled, each
//! worker's peak, the job's wall time) reaches the suite's JSON and
//! markdown, and that under pagefold the partitions' defensive copies were
//! made copy-on-write (the workers' engines' counter, as the job reports it). Needs python3 with
//! dask[dataframe,distributed] (.ci/run installs it); 86 s on a 2-core
//! machine at load average 13-15, most of it starting and stopping clusters.

#[allow(dead_code)]
mod common;

use std::path::Path;

use common::{scratch, stats};

#[test]
fn quick_dask_suite_runs_plain_and_pagefold_and_tabulates_what_the_job_reports() {
    let out = scratch("dask-suite");
    let bench = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench");
    let workloads = bench.to_str().unwrap();
    let (suite, stderr) = common::bench(
        "dask",
        &out,
        &["--only", "frame_copies", "--workloads", workloads],
    );
    assert_eq!(suite["configs"], serde_json::json!(["plain", "pagefold"]));
    assert_eq!(suite["all_identical"], true, "{stderr}");
    for c in ["plain", "pagefold"] {
        let s = stats(&suite, "frame_copies", c);
        assert_eq!(s["failed_runs"], 0, "{c}\n{stderr}");
        for m in [
            "spilled_mib",
            "unspilled_mib",
            "worker_peak_mib",
            "job_wall_s",
        ] {
            assert!(
                s["metrics"][m]["median"].as_f64().is_some(),
                "{c}: the job reported no {m}\n{stderr}"
            );
        }
        assert!(s["metrics"]["worker_peak_mib"]["median"].as_f64().unwrap() > 50.0);
    }
    // The quick table: 4 partitions of 100,000 rows, 8 float64 columns each
    // (6.1 MiB a partition): its defensive copies are 24.4 MiB. The
    // workers' engines count them (a worker stopped by its nanny writes no
    // exit report, so the job reads the counter inside the workers). At
    // least half of them share frames; runs have shown 24.4 and 18.3 MiB
    // (where the tasks ran decides which copies are of the source's buffer).
    let shared = |c: &str| {
        stats(&suite, "frame_copies", c)["metrics"]["workers_shared_by_copy_mib"]["median"]
            .as_f64()
            .unwrap()
    };
    assert!(
        shared("pagefold") >= 12.0,
        "{}\n{stderr}",
        shared("pagefold")
    );
    assert_eq!(shared("plain"), 0.0);
    let md = std::fs::read_to_string(out.join("results/dask.md")).unwrap();
    assert!(md.contains("**Spilled to disk"), "{md}");
    assert!(md.contains("**Peak footprint of a worker"), "{md}");
    std::fs::remove_dir_all(&out).unwrap();
}
