//! What the `pagefold` command writes for programs to read, through the
//! built binary: every JSON document has a `"schema"` field naming its
//! format and version (`pagefold measure`, `run` with the preload's exit
//! reports inside, `analyze`, `demo`, `bench`); `pagefold bench` writes only
//! under `--out DIR` and touches a doc only when asked to; `--version`
//! prints the version. Each command runs for about a second at most.

// The end-to-end helpers are shared with the bench suites' tests, which use
// the rest of them.
#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{pagefold, scratch};
use serde_json::Value;

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("running pagefold");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(text: &[u8]) -> Value {
    serde_json::from_slice(text)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(text)))
}

fn read_json(path: &Path) -> Value {
    json(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// Every file under `dir`, relative to it, sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, base, out);
            } else {
                out.push(p.strip_prefix(base).unwrap().to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn version_is_printed() {
    let out = run(Command::new(pagefold()).arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("pagefold {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn measure_json_has_a_schema_once_and_as_a_series() {
    let pid = std::process::id().to_string();
    let once = json(&run(Command::new(pagefold()).args(["measure", &pid, "--json"])).stdout);
    assert_eq!(once["schema"], "pagefold-measure/1", "{once}");
    assert!(once["footprint_bytes"].as_u64() > Some(0), "{once}");
    let series = json(
        &run(Command::new(pagefold()).args([
            "measure",
            &pid,
            "--json",
            "--count",
            "2",
            "--interval",
            "10",
        ]))
        .stdout,
    );
    assert_eq!(series["schema"], "pagefold-measure-series/1", "{series}");
    assert_eq!(series["samples"].as_array().map(Vec::len), Some(2));
}

/// A reader that stops early: the time series ends as `cat` would, by
/// SIGPIPE, with nothing on stderr (no panic on a closed pipe).
#[test]
fn measure_stops_quietly_when_its_reader_goes_away() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let pid = std::process::id().to_string();
    let mut child = Command::new(pagefold())
        .args(["measure", &pid, "--interval", "5", "--count", "100000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty());
    // The reader is gone: the next line written meets a closed pipe.
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{:?}", out.status);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `pagefold run --json` around a program whose copies the engine serves:
/// the report and each process's exit report inside it carry their schema.
#[test]
fn run_json_and_the_exit_reports_in_it_have_a_schema() {
    let bin = pagefold();
    let dir = scratch("json-run");
    let report = dir.join("report.json");
    run(Command::new(&bin)
        .args(["run", "--json", "--report"])
        .arg(&report)
        .arg("--")
        .arg(bin.with_file_name("pagefold-synth"))
        .args(["--quick", "copies"]));
    let doc = read_json(&report);
    assert_eq!(doc["schema"], "pagefold-run/1", "{doc}");
    let engine = doc["runs"][0]["engine"].as_array().unwrap();
    assert!(!engine.is_empty(), "no exit report: {doc}");
    for r in engine {
        assert_eq!(r["schema"], "pagefold-preload-report/1", "{r}");
        assert!(r["stats"]["pages_shared_by_copy"].as_u64() > Some(0), "{r}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `pagefold run --compare --sharing-limit` adds a plain run that read the
/// sharing limit (root: PFNs), which the text report turns into the share
/// pagefold captured; without `--compare` the option is refused.
#[test]
fn run_compare_reads_the_sharing_limit_when_asked() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return eprintln!("skipped: the sharing limit needs root (CI runs as root)");
    }
    let bin = pagefold();
    let dir = scratch("run-limit");
    let report = dir.join("report.txt");
    let synth = bin.with_file_name("pagefold-synth");
    run(Command::new(&bin)
        .args(["run", "--compare", "--sharing-limit", "--report"])
        .arg(&report)
        .arg("--")
        .arg(&synth)
        .args(["--quick", "duplicates"]));
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(text.contains("sharing-limit"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("sharing limit: "))
        .expect(&text);
    let limit: f64 = line["sharing limit: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // Independently generated duplicates: much to share, and pagefold captures some of it.
    assert!(limit > 0.0 && limit < 0.9, "{line}");
    assert!(line.contains("pagefold captured"), "{line}");
    let refused = Command::new(&bin)
        .args(["run", "--sharing-limit", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn analyze_json_has_a_schema() {
    let dir = scratch("json-analyze");
    let image = dir.join("image.raw");
    // 8 zero pages and 8 copies of one page.
    let mut data = vec![0u8; 16 * 4096];
    data[8 * 4096..].fill(7);
    std::fs::write(&image, &data).unwrap();
    let out = run(Command::new(pagefold())
        .args(["analyze", "--json", "-q", "--only", "sharing"])
        .arg(&image));
    let doc = json(&out.stdout);
    assert_eq!(doc["schema"], "pagefold-analyze/1", "{doc}");
    assert_eq!(doc["pages"], 16);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn demo_json_has_a_schema() {
    let out = run(Command::new(pagefold()).args([
        "demo",
        "--json",
        "--no-ksm",
        "--size-mb",
        "8",
        "--iterations",
        "50",
    ]));
    let doc = json(&out.stdout);
    assert_eq!(doc["schema"], "pagefold-demo/1", "{doc}");
    assert_eq!(doc["checksums_match"], true, "{doc}");
    let variants: Vec<&str> = doc["variants"]
        .as_array()
        .expect("variants")
        .iter()
        .map(|v| v["variant"].as_str().expect("variant name"))
        .collect();
    assert_eq!(variants, ["plain", "engine", "engine_all"], "{doc}");
}

/// One quick workload under two configurations, run from an empty
/// directory: everything it writes is under `--out`, the suite's JSON has
/// its schema, and no doc is written. Drawn again with `--render` and
/// `--update-docs`, the results doc appears in the directory given.
#[test]
fn bench_writes_only_under_out_and_docs_only_when_asked() {
    let bin = pagefold();
    let cwd = scratch("json-bench-cwd");
    let out = scratch("json-bench-out");
    run(Command::new(&bin)
        .args([
            "bench",
            "--quick",
            "--suite",
            "synthetic",
            "--configs",
            "plain,pagefold",
            "--only",
            "copies",
            "--out",
        ])
        .arg(&out)
        .current_dir(&cwd));
    assert_eq!(files(&cwd), Vec::<PathBuf>::new(), "written outside --out");
    let written = files(&out);
    assert!(
        written.iter().all(|p| p.starts_with("results")),
        "{written:?}"
    );
    let suite = read_json(&out.join("results/synthetic.json"));
    assert_eq!(suite["schema"], "pagefold-bench/1");

    let again = scratch("json-bench-again");
    let docs = scratch("json-bench-docs");
    run(Command::new(&bin)
        .arg("bench")
        .arg("--render")
        .arg(out.join("results/synthetic.json"))
        .arg("--out")
        .arg(&again)
        .arg("--update-docs")
        .arg(&docs)
        .current_dir(&cwd));
    assert_eq!(files(&cwd), Vec::<PathBuf>::new(), "written outside --out");
    assert_eq!(files(&docs), [PathBuf::from("RESULTS.md")]);
    assert_eq!(
        read_json(&again.join("results/synthetic.json"))["schema"],
        "pagefold-bench/1"
    );
    for d in [cwd, out, again, docs] {
        let _ = std::fs::remove_dir_all(d);
    }
}
