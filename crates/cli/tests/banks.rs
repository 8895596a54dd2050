//! `pagefold banks` and `pagefold run --banks` through the built binary: the
//! report names its map, its source and whether addresses are real; a bad
//! bank set is refused before the program runs, with one line and a non-zero
//! exit, never a panic; a good one reaches the program's engine; the banks
//! suite writes its measured and simulated tables.

#[allow(dead_code)]
mod common;

use std::process::Command;

use common::pagefold;
use serde_json::Value;

/// The command exited 0; else its stderr is the failure.
fn succeeded(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn banks_json_names_the_map_and_its_source() {
    let out = Command::new(pagefold())
        .args(["banks", "--no-probe", "--json"])
        .output()
        .unwrap();
    succeeded(&out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "pagefold-banks/1");
    assert_eq!(v["map"]["source"], "table");
    assert_eq!(v["confidence"], "none");
    assert!(v["why"].as_str().unwrap().contains("ASSUMED"));
    assert!(v["banks"].as_u64().unwrap() >= 8);
    assert!(v["addresses_real"].is_boolean());
}

#[test]
fn banks_probe_reports_what_it_found() {
    let out = Command::new(pagefold())
        .args([
            "banks",
            "--candidates",
            "300",
            "--rounds",
            "20",
            "--buffer-mib",
            "32",
        ])
        .output()
        .unwrap();
    succeeded(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("physical addresses:"), "{text}");
    assert!(text.contains("bank map in use:"), "{text}");
    assert!(text.contains("confidence:"), "{text}");
}

#[test]
fn bad_bank_sets_are_refused_in_one_line() {
    for (set, says) in [
        ("9-3", "backwards"),
        ("0-99", "does not exist"),
        ("0,2", "inside the page"),
        ("x", "not a bank"),
    ] {
        let out = Command::new(pagefold())
            .args([
                "run",
                "--banks",
                set,
                "--bank-functions",
                "coffee-lake-ddr4-1rank",
                "--",
                "true",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{set}: {err}");
        assert!(err.contains(says), "{set}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{set}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn a_good_set_reaches_the_program() {
    let out = Command::new(pagefold())
        .args([
            "run",
            "--banks",
            "0-7",
            "--",
            "sh",
            "-c",
            "echo $PAGEFOLD_BANKS",
        ])
        .output()
        .unwrap();
    succeeded(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0-7");
}

#[test]
fn the_banks_suite_writes_measured_and_simulated_results() {
    let out_dir = common::scratch("banks-suite");
    let out = Command::new(pagefold())
        .args([
            "bench",
            "--quick",
            "--suite",
            "banks",
            "--banks-mib",
            "16",
            "--out",
        ])
        .arg(&out_dir)
        .output()
        .unwrap();
    succeeded(&out);
    let json = std::fs::read(out_dir.join("results/banks.json")).unwrap();
    let v: Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(v["schema"], "pagefold-bench/1");
    assert_eq!(v["verified"], true);
    let md = std::fs::read_to_string(out_dir.join("results/banks.md")).unwrap();
    assert!(
        md.contains("| measured |") && md.contains("| simulated:"),
        "{md}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}
