//! The pagefold-synth binary as `pagefold bench` and users meet it: the
//! workload list, byte-identical output for identical arguments, and one
//! line plus a non-zero exit code for bad input.

use std::process::{Command, Output};

fn synth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pagefold-synth"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn lists_the_workloads_by_name() {
    let out = synth(&["list"]);
    assert!(out.status.success());
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        ["copies", "zeros", "duplicates", "mixed", "scattered"]
    );
    let out = synth(&["list", "de"]);
    assert!(out.status.success());
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        ["de-zero", "de-random", "de-identical", "de-similar"]
    );
}

#[test]
fn same_arguments_print_the_same_bytes() {
    for w in [
        "copies",
        "zeros",
        "duplicates",
        "mixed",
        "scattered",
        "de-zero",
        "de-random",
        "de-identical",
        "de-similar",
    ] {
        let args = [
            w, "--quick", "--scale", "0.02", "--hold", "0", "--idle", "0",
        ];
        let (a, b) = (synth(&args), synth(&args));
        assert!(
            a.status.success(),
            "{w}: {}",
            String::from_utf8_lossy(&a.stderr)
        );
        assert!(
            !a.stdout.is_empty() && a.stdout == b.stdout,
            "{w}: outputs differ"
        );
        let other_seed = synth(&[
            w, "--quick", "--scale", "0.02", "--hold", "0", "--idle", "0", "--seed", "9",
        ]);
        // Zero pages are zero pages, whatever the seed.
        assert!(
            w == "de-zero" || a.stdout != other_seed.stdout,
            "{w}: the seed changes nothing"
        );
    }
}

#[test]
fn bad_input_is_one_line_and_a_non_zero_exit() {
    for args in [
        &["bogus"][..],
        &[],
        &["copies", "--scale", "x"],
        &["zeros", "--scale", "100"],
        &["copies", "--scale", "0"],
        &["mixed", "--frob"],
        &["copies", "--seed", "-1"],
        &["zeros", "--hold", "x"],
        &["duplicates", "--hold", "99999"],
        &["de-zero", "--idle", "-1"],
        &["list", "nope"],
    ] {
        let out = synth(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            err.starts_with("pagefold-synth: ") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
