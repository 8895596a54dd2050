//! `pagefold bench --quick --suite de` end to end, through the built
//! binaries (pagefold, the preload library and pagefold-synth beside it):
//! Difference Engine's micro-benchmark on zero and identical pages, plain,
//! with sharing alone (`de-share`) and with every mechanism (`de-all`).
//! Every output must match plain's, sharing must save on both page types
//! (by the engine's counters and by the average footprint), and the suite
//! must draw its savings-over-time chart per page type.
//!
//! A second test runs the 95%-similar pages under patching alone and the
//! zero pages (compressible once written) under compression alone: the
//! engine must patch and compress, and every byte must come back (the
//! program's final read digests every page after the engine had the
//! chance to patch or compress it).
//!
//! Why this holds under load: each quick phase is followed by 3 s of idle
//! wall time, and folding and merging act about two background scans (two
//! seconds) after the pages settle; a loaded machine delays the scanner
//! by little, since 16 MiB is scanned in milliseconds. Random pages are
//! left out, and each configuration runs only where it has work, to keep
//! the tests under a minute (they run side by side). No KSM configuration
//! runs here.

mod common;

use common::{average_ratio, counter, scratch, stats};
use serde_json::Value;

const CONFIGS: [&str; 3] = ["plain", "de-share", "de-all"];
const WORKLOADS: [&str; 2] = ["de-zero", "de-identical"];

/// Runs `pagefold bench --quick --suite de` with `args` in `out` (the
/// results document there too); the suite's JSON result.
fn bench(out: &std::path::Path, args: &[&str]) -> Value {
    let doc = out.join("RESULTS.md");
    let mut all = args.to_vec();
    all.extend(["--results-doc", doc.to_str().unwrap()]);
    common::bench("de", out, &all).0
}

/// Every configuration of every workload ran without failing and printed
/// what plain printed.
fn assert_all_match_plain(suite: &Value, workloads: &[&str], configs: &[&str]) {
    let names: Vec<&str> = suite["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, workloads);
    for w in workloads {
        for c in configs {
            let s = stats(suite, w, c);
            assert_eq!(s["failed_runs"], 0, "{w} {c}");
            assert_eq!(
                s["identical"], true,
                "{w} under {c} printed something else than plain"
            );
        }
    }
    assert_eq!(suite["all_identical"], true);
}

#[test]
fn quick_de_suite_matches_plain_and_sharing_saves_on_zero_and_identical_pages() {
    let out = scratch("de-share");
    let suite = bench(
        &out,
        &[
            "--configs",
            &CONFIGS.join(","),
            "--only",
            &WORKLOADS.join(","),
        ],
    );
    assert_all_match_plain(&suite, &WORKLOADS, &CONFIGS);

    // Sharing, alone and among all mechanisms: zero pages are folded (and,
    // once written, merged), identical pages merged, and the footprint shows it.
    let summary = format!(
        "average footprint / plain: {:?}",
        WORKLOADS.map(|w| (
            w,
            CONFIGS.map(|c| format!("{c} {:.2}", average_ratio(&suite, w, c)))
        ))
    );
    for c in ["de-share", "de-all"] {
        assert!(
            counter(&suite, "de-zero", c, "zero_folded") > 0.0,
            "de-zero under {c}: nothing folded\n{summary}"
        );
        assert!(
            counter(&suite, "de-identical", c, "merged") > 0.0,
            "de-identical under {c}: nothing merged\n{summary}"
        );
        for w in WORKLOADS {
            let ratio = average_ratio(&suite, w, c);
            assert!(
                ratio < 0.8,
                "{w} under {c}: average footprint {ratio:.2}x plain's\n{summary}"
            );
        }
    }

    // The savings-over-time table and one chart per page type, in the
    // results file and the document section.
    let md = std::fs::read_to_string(out.join("results/de.md")).unwrap();
    assert!(
        md.contains("**Savings over time**") && md.contains("| de-identical | de-share |"),
        "{md}"
    );
    let doc = std::fs::read_to_string(out.join("RESULTS.md")).unwrap();
    for w in WORKLOADS {
        let chart = format!("results/de-savings-{w}.png");
        assert!(out.join(&chart).is_file(), "{chart} not drawn");
        assert!(doc.contains(&chart), "{chart} not in the document section");
    }
    std::fs::remove_dir_all(&out).unwrap();
}

/// Patching alone on 95%-similar pages and compression alone on the
/// (written, so compressible) zero pages: the mechanisms act, and every
/// byte comes back (outputs identical to plain's, which digest every page
/// after the engine had the chance to patch or compress it). Idle periods
/// of 4 s give the clock a pass or two.
#[test]
fn quick_de_pages_are_patched_and_compressed_and_come_back_intact() {
    let configs = ["plain", "de-patch", "de-compress"];
    let workloads = ["de-zero", "de-similar"];
    let out = scratch("de-tier");
    let suite = bench(
        &out,
        &[
            "--configs",
            &configs.join(","),
            "--only",
            &workloads.join(","),
            "--de-idle",
            "4",
        ],
    );
    assert_all_match_plain(&suite, &workloads, &configs);
    let patched = counter(&suite, "de-similar", "de-patch", "patched");
    assert!(patched > 0.0, "de-similar under de-patch: nothing patched");
    assert!(
        counter(&suite, "de-similar", "de-patch", "patch_restores") > 0.0,
        "patched pages were read back through restores"
    );
    assert_eq!(
        counter(&suite, "de-similar", "de-compress", "evicted"),
        0.0,
        "random-looking similar pages are incompressible"
    );
    assert!(
        counter(&suite, "de-zero", "de-compress", "evicted") > 0.0,
        "de-zero under de-compress: nothing compressed"
    );
    std::fs::remove_dir_all(&out).unwrap();
}
