//! `pagefold bench --quick --suite synthetic` end to end, through the built
//! binaries: pagefold, the preload library and pagefold-synth beside it.
//! Besides "it runs and every output matches plain", it checks that each
//! mechanism does its job on the workload made for it: the virtual copy on
//! `copies`, zero folding on `zeros`, merging on `duplicates` and on the
//! scattered duplicates of `scattered`, both by the
//! engine's counters and by a smaller average footprint than plain's.
//!
//! Why this holds under load: `copies` saves from its first memcpy on; the
//! scan-based mechanisms act about two background scans (two seconds of
//! wall time) after the content settles, and the quick workloads keep it
//! for longer than that. A loaded machine stretches the workloads, not the
//! scanner's clock, so the share of time spent folded only grows. No KSM
//! configuration runs here (they drive machine-wide knobs).

mod common;

use common::{average_ratio, counter, scratch, stats};
use serde_json::Value;

const CONFIGS: [&str; 5] = ["plain", "pagefold", "copy", "zero", "merge"];

#[test]
fn quick_synthetic_suite_runs_every_config_and_each_mechanism_saves_where_it_applies() {
    let out = scratch("synthetic");
    let (suite, stderr) = common::bench("synthetic", &out, &["--configs", &CONFIGS.join(",")]);
    let summary = report(&suite);
    eprintln!("{summary}");

    let names: Vec<&str> = suite["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["copies", "zeros", "duplicates", "mixed", "scattered"]
    );
    for w in &names {
        for c in CONFIGS {
            let s = stats(&suite, w, c);
            assert_eq!(s["runs"], 1, "{w} {c}");
            assert_eq!(s["failed_runs"], 0, "{w} {c}\n{stderr}");
            assert_eq!(
                s["identical"], true,
                "{w} under {c} printed something else than plain"
            );
        }
    }
    assert_eq!(suite["all_identical"], true);

    // Each mechanism acted on its workload, alone and with the others...
    for (workload, config, what) in [
        ("copies", "copy", "pages_shared_by_copy"),
        ("zeros", "zero", "zero_folded"),
        ("duplicates", "merge", "merged"),
        ("scattered", "merge", "merged"),
    ] {
        for c in ["pagefold", config] {
            assert!(
                counter(&suite, workload, c, what) > 0.0,
                "{workload} under {c}: no {what}\n{summary}"
            );
            // ...and it showed in the footprint.
            let ratio = average_ratio(&suite, workload, c);
            assert!(
                ratio < 1.0,
                "{workload} under {c}: average footprint {ratio:.2}x plain's\n{summary}"
            );
        }
    }
    assert!(out.join("results/synthetic.md").is_file());
    std::fs::remove_dir_all(&out).unwrap();
}

/// Average-footprint ratios, one line per workload, for failure messages.
fn report(suite: &Value) -> String {
    let mut out = String::from("average footprint / plain:");
    for w in suite["workloads"].as_array().unwrap() {
        let name = w["name"].as_str().unwrap();
        out += &format!("\n  {name:<11}");
        for c in CONFIGS {
            out += &format!(" {c} {:.2}", average_ratio(suite, name, c));
        }
    }
    out
}
