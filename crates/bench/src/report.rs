//! Reporting: the same results three ways. A markdown section per suite (it is
//! printed to stdout as the human table and, with `--update-docs`, regenerated
//! into BENCHMARKS.md between `<!-- bench:SUITE:begin -->` and `:end -->`
//! markers, leaving the hand-written text around them alone), and a JSON file
//! that keeps one key per suite, so running one suite does not erase the
//! other's numbers. Every JSON file the harness writes carries `"schema":
//! SCHEMA` (put there by `pagefold_measure::schema::document`). Every target is printed next to its result as pass or miss, with
//! the margin.

use crate::fold::{EngineFold, FoldResults};
use crate::kernel_ksm::KsmFold;
use crate::micro::{CopyRow, MicroResults, ScanRow, Source};
use crate::plan::Plan;
use anyhow::{Context, Result};
use serde::Serialize;
use std::fmt::Write;
use std::path::Path;

/// Difference Engine, Table 2: per-page operation costs in microseconds.
pub const DE_SHARE_US: f64 = 6.2;
pub const DE_COW_BREAK_US: f64 = 25.1;
/// Targets.
pub const COPY_SPEEDUP_MIN: f64 = 50.0;
pub const COW_RATIO_MAX: f64 = 1.5;
pub const SCAN_GBPS_MIN: f64 = 5.0;
pub const FOLD_WALL_MAX_S: f64 = 0.3;
pub const FOLD_CPU_MAX_S: f64 = 0.3;

pub const REPRODUCE: &str = "cargo run --release -p pagefold -- bench --suite all --out DIR";

/// The format of every JSON file the harness writes (its `"schema"` field);
/// the number changes when a field changes meaning or goes away.
pub const SCHEMA: &str = "pagefold-bench/1";

/// How a markdown file at `doc` links to `file`: the path of `file` relative
/// to the directory of `doc` (with `..` where needed), or `file` as given if
/// the two share no root.
pub fn link(doc: &Path, file: &Path) -> String {
    use std::path::Component;
    let absolute = |p: &Path| -> Vec<String> {
        let p = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut parts: Vec<String> = Vec::new();
        for c in p.components() {
            match c {
                Component::ParentDir => {
                    parts.pop();
                }
                Component::CurDir => {}
                c => parts.push(c.as_os_str().to_string_lossy().into_owned()),
            }
        }
        parts
    };
    let base = absolute(doc.parent().unwrap_or(Path::new("")));
    let target = absolute(file);
    let common = base.iter().zip(&target).take_while(|(a, b)| a == b).count();
    if common == 0 {
        return file.display().to_string();
    }
    let mut parts = vec![".."; base.len() - common];
    parts.extend(target[common..].iter().map(String::as_str));
    parts.join("/")
}

/// Where and when a run was made.
#[derive(Serialize, serde::Deserialize, Clone, Debug)]
pub struct Machine {
    pub date_utc: String,
    pub kernel: String,
    pub cpu: String,
    pub cpus: usize,
    pub mem_gib: f64,
    pub runs: usize,
    pub quick: bool,
    /// 1-minute load average when the suite started: other work on the machine skews timings.
    pub load_avg: f64,
}

impl Machine {
    pub fn probe(plan: &Plan) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1))
            .unwrap_or("?");
        Machine {
            date_utc: utc_now(),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            cpu: cpu.trim().to_string(),
            cpus: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            mem_gib: crate::mem::meminfo_kib("MemTotal") as f64 / (1 << 20) as f64,
            runs: plan.runs,
            quick: plan.quick,
            load_avg: load_avg(),
        }
    }

    pub fn line(&self) -> String {
        format!(
            "_Measured {} on Linux {}, {} ({} CPUs, {:.0} GiB), load average {:.2} at start; medians of {} runs{}._",
            self.date_utc,
            self.kernel,
            self.cpu,
            self.cpus,
            self.mem_gib,
            self.load_avg,
            self.runs,
            if self.quick { ", --quick" } else { "" }
        )
    }
}

pub fn load_avg() -> f64 {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// "2026-11-21 15:04 UTC" without a date crate (civil-from-days, H. Hinnant).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rest / 3600,
        rest / 60 % 60
    )
}

/// "pass (63.0x >= 50x, 1.26x margin)" or "MISS (12.0x < 50x, short by 4.17x)".
pub fn at_least(measured: f64, target: f64, unit: &str) -> String {
    if measured >= target {
        format!(
            "pass ({measured:.2}{unit} >= {target}{unit}, {:.2}x margin)",
            measured / target
        )
    } else {
        format!(
            "MISS ({measured:.2}{unit} < {target}{unit}, short by {:.2}x)",
            target / measured
        )
    }
}

pub fn at_most(measured: f64, target: f64, unit: &str) -> String {
    if measured <= target {
        format!(
            "pass ({measured:.3}{unit} <= {target}{unit}, {:.2}x margin)",
            target / measured
        )
    } else {
        format!(
            "MISS ({measured:.3}{unit} > {target}{unit}, over by {:.2}x)",
            measured / target
        )
    }
}

// ---------------------------------------------------------------- micro

pub fn micro_markdown(m: &MicroResults, machine: &Machine) -> String {
    let mut out = String::new();
    writeln!(out, "{}\n", machine.line()).unwrap();
    out += &micro_targets(m);
    out += &per_page_table(m);
    out += &copy_table(&m.copy);
    out += &scan_table(&[&m.zero_fold, &m.merge, &m.scan_unique, &m.scan_zero]);
    out
}

fn copy_row(m: &MicroResults, source: Source, pages: usize) -> Option<&CopyRow> {
    m.copy
        .iter()
        .find(|r| r.source == source && r.pages == pages)
}

fn micro_targets(m: &MicroResults) -> String {
    let mut out = String::from("**Targets**\n\n");
    for (source, label) in [
        (Source::Fresh, "fresh source"),
        (Source::CopyOfCopy, "copy of a copy"),
    ] {
        if let Some(r) = copy_row(m, source, 16384) {
            writeln!(
                out,
                "- Virtual copy of 16384 pages >= {COPY_SPEEDUP_MIN}x faster than memcpy into fresh memory, {label}: \
                 {}; with a first read of every page: {:.1}x.",
                at_least(r.speedup, COPY_SPEEDUP_MIN, "x"),
                r.speedup_with_read
            )
            .unwrap();
        }
    }
    writeln!(
        out,
        "- CoW break within {COW_RATIO_MAX}x of the kernel's CoW fault: {} (write without a prior read: {:.2}x).",
        at_most(m.cow.ratio, COW_RATIO_MAX, "x"),
        m.cow.ratio_cold
    )
    .unwrap();
    writeln!(
        out,
        "- Scan >= {SCAN_GBPS_MIN} GB/s per core, 1 GiB of unique pages: {}; 1 GiB of zero pages: {}.\n",
        at_least(m.scan_unique.gb_per_cpu_s, SCAN_GBPS_MIN, " GB/s"),
        at_least(m.scan_zero.gb_per_cpu_s, SCAN_GBPS_MIN, " GB/s")
    )
    .unwrap();
    out
}

fn per_page_table(m: &MicroResults) -> String {
    let mut out = String::from(
        "**Per-page costs, us** (kernel column measured in the same run; Difference Engine = its Table 2, Xen 2008)\n\n\
         | operation | pagefold | kernel | Difference Engine |\n|---|---:|---:|---:|\n",
    );
    for (source, label) in [
        (Source::Fresh, "fresh source"),
        (Source::CopyOfCopy, "copy of a copy"),
    ] {
        if let Some(r) = copy_row(m, source, 16384) {
            writeln!(
                out,
                "| share: engine.copy of 16384 pages, {label} | {:.3} | - | {DE_SHARE_US} |",
                r.share_us_per_page
            )
            .unwrap();
        }
    }
    let c = &m.cow;
    writeln!(out, "| CoW break: 1 byte written per page of a copy, pages read first | {:.2} | {:.2} (memfd MAP_PRIVATE) | {DE_COW_BREAK_US} |", c.engine_us, c.kernel_us).unwrap();
    writeln!(
        out,
        "| CoW break, written without a prior read | {:.2} | {:.2} | - |",
        c.engine_cold_us, c.kernel_cold_us
    )
    .unwrap();
    writeln!(
        out,
        "| first-touch anonymous write fault | - | {:.2} | - |",
        c.first_touch_us
    )
    .unwrap();
    writeln!(
        out,
        "| zero fold: scan of {} all-zero pages | {:.3} | - | - |",
        m.zero_fold.pages, m.zero_fold.us_per_page
    )
    .unwrap();
    writeln!(
        out,
        "| merge: scan of {} pages, {:?} | {:.3} | - | - |\n",
        m.merge.pages, m.merge.content, m.merge.us_per_page
    )
    .unwrap();
    out
}

fn copy_table(rows: &[CopyRow]) -> String {
    let mut out = String::from(
        "**Virtual copy vs memcpy into fresh memory** (us per whole copy; engine = alloc + copy, memcpy = fresh mmap + memcpy, \
         page faults included; \"+ read\" adds a first read of every destination page; kernel view = mmap MAP_PRIVATE of a memfd \
         range, the floor any memfd-based virtual copy builds on)\n\n\
         | source | pages | share us/page | engine | memcpy | speedup | engine + read | memcpy + read | speedup | kernel view (mmap) | kernel view + read | pages shared | verified |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        writeln!(
            out,
            "| {:?} | {} | {:.3} | {:.1} | {:.1} | {:.1}x | {:.1} | {:.1} | {:.1}x | {:.1} | {:.1} | {} | {} |",
            r.source,
            r.pages,
            r.share_us_per_page,
            r.vcopy_us,
            r.memcpy_us,
            r.speedup,
            r.vcopy_read_us,
            r.memcpy_read_us,
            r.speedup_with_read,
            r.kernel_view_us,
            r.kernel_view_read_us,
            r.pages_shared_by_copy,
            r.verified
        )
        .unwrap();
    }
    out + "\n"
}

fn scan_table(rows: &[&ScanRow]) -> String {
    let mut out = String::from(
        "**Scans** (one engine.scan() over one block; GB = 1e9 bytes; per core = bytes / process CPU time)\n\n\
         | content | pages | wall ms | CPU ms | us/page | GB/s per core | GB/s wall | rescan ms | zero folded | merged | frames in use before -> after | resident after scan -> after read-back | VMAs after (merges skipped) | verified |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|\n",
    );
    for r in rows {
        writeln!(
            out,
            "| {:?} | {} | {:.1} | {:.1} | {:.3} | {:.2} | {:.2} | {:.1} | {} | {} | {} -> {} | {} -> {} | {} ({}) | {} |",
            r.content,
            r.pages,
            r.wall_ms,
            r.cpu_ms,
            r.us_per_page,
            r.gb_per_cpu_s,
            r.gb_per_wall_s,
            r.rescan_ms,
            r.zero_folded,
            r.merged,
            r.frames_before,
            r.frames_after,
            r.resident_after,
            r.resident_after_read,
            r.vmas_after,
            r.skipped_vma,
            r.verified
        )
        .unwrap();
    }
    out + "\n"
}

// ---------------------------------------------------------------- fold

pub fn fold_markdown(f: &FoldResults, machine: &Machine) -> String {
    let e = &f.engine;
    let mut out = String::new();
    writeln!(out, "{}\n", machine.line()).unwrap();
    writeln!(
        out,
        "1 GiB = {} pages: {} copies of {} distinct contents, the rest unique, placed at random (seed {:#x}).\n",
        e.pages,
        e.duplicate_pages,
        e.distinct_duplicates,
        crate::fold_data::SEED
    )
    .unwrap();
    writeln!(
        out,
        "**Target**: 1 GiB fold < {FOLD_WALL_MAX_S} s wall and < {FOLD_CPU_MAX_S} s CPU. Wall: {}. CPU: {}.\n",
        at_most(e.wall_s, FOLD_WALL_MAX_S, " s"),
        at_most(e.cpu_s, FOLD_CPU_MAX_S, " s")
    )
    .unwrap();
    out += &fold_table(f);
    out += &fold_notes(f);
    out
}

fn fold_table(f: &FoldResults) -> String {
    let mut out = String::from(
        "| system | setting | time to fold, s | CPU, s | 50% merged, s | pages merged | footprint MiB | notes |\n\
         |---|---|---:|---:|---:|---:|---:|---|\n",
    );
    out += &engine_line(&f.engine, "engine.scan(), on demand");
    match (&f.engine_raised, &f.raised_skipped) {
        (Some(e), _) => {
            out += &engine_line(
                e,
                &format!("engine.scan(), vm.max_map_count {}", e.max_map_count),
            )
        }
        (None, Some(why)) => {
            writeln!(
                out,
                "| pagefold | vm.max_map_count raised: skipped | - | - | - | - | - | {why} |"
            )
            .unwrap();
        }
        (None, None) => {}
    }
    for k in &f.ksm {
        out += &ksm_line(k);
    }
    if let Some(why) = &f.ksm_skipped {
        writeln!(out, "| kernel KSM | skipped | - | - | - | - | - | {why} |").unwrap();
    }
    out + "\n"
}

fn engine_line(e: &EngineFold, setting: &str) -> String {
    format!(
        "| pagefold | {setting} | {:.3} | {:.3} | - | {} (ideal {}) | {:.1} | frames {} -> {} (ideal {}), metadata {} KiB, Shmem {:.0} -> {:.0} MiB, VMAs {} (budget fallbacks {}, merges skipped {}), mapping slabs +{} KiB, verified {} |\n",
        e.wall_s,
        e.cpu_s,
        e.merged,
        e.duplicate_pages as u64 - e.distinct_duplicates,
        e.footprint_mib,
        e.frames_before,
        e.frames_after,
        e.frames_ideal,
        e.metadata_bytes / 1024,
        e.shmem_filled_mib,
        e.shmem_folded_mib,
        e.vmas_used,
        e.vma_budget_fallbacks,
        e.skipped_vma,
        e.vma_slab_kib.map_or("?".into(), |v| v.to_string()),
        e.verified
    )
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("?".into(), |v| format!("{v:.digits$}"))
}

fn ksm_line(k: &KsmFold) -> String {
    let mut warnings = String::new();
    if let Some(what) = &k.knobs_disturbed {
        warnings += &format!("; **DISTURBED**: {what}");
    }
    if k.baseline_pages_sharing > 0 {
        warnings += &format!(
            "; another KSM user held {} pages_sharing at the start",
            k.baseline_pages_sharing
        );
    }
    let settle = if k.confirmed {
        format!("{:.2}", k.settled_s)
    } else {
        format!("{:.2} (unconfirmed)", k.settled_s)
    };
    format!(
        "| kernel KSM | pages_to_scan {}, sleep {} ms | {} | {} (ksmd) | {} | {} (ideal {}) | {:.1} | {} full scans, {} us ksmd CPU/scanned page, ksmd CPU {} s over {:.1} s observed, slab {} KiB{} |\n",
        k.pages_to_scan,
        k.sleep_ms,
        settle,
        opt(k.ksmd_cpu_s, 2),
        opt(k.half_merged_s, 2),
        k.pages_sharing,
        k.pages_sharing_ideal,
        k.footprint_mib,
        k.full_scans,
        opt(k.cpu_per_scanned_page_us, 2),
        opt(k.ksmd_cpu_observed_s, 2),
        k.observed_s,
        k.ksm_metadata_kib.map_or("?".into(), |v| v.to_string()),
        warnings
    )
}

/// "3.1x less" when ours is the smaller, "1.4x more" when it is the larger.
fn factor(ours: f64, theirs: f64) -> String {
    if ours <= theirs {
        format!("{:.1}x less", theirs / ours)
    } else {
        format!("{:.1}x more", ours / theirs)
    }
}

fn fold_notes(f: &FoldResults) -> String {
    let e = &f.engine;
    let mut out = String::new();
    let fastest = f
        .ksm
        .iter()
        .filter(|k| k.pages_sharing > 0)
        .min_by(|a, b| a.settled_s.total_cmp(&b.settled_s));
    if let Some(k) = fastest {
        let ksm_mib = k.footprint_mib + k.ksm_metadata_kib.unwrap_or(0) as f64 / 1024.0;
        for (e, what) in [
            (Some(e), "pagefold"),
            (
                f.engine_raised.as_ref(),
                "pagefold with vm.max_map_count raised",
            ),
        ] {
            let Some(e) = e else { continue };
            let ours = e.footprint_mib + e.vma_slab_kib.unwrap_or(0) as f64 / 1024.0;
            writeln!(
                out,
                "Same run, fastest KSM setting (pages_to_scan {}): {what} takes {} wall time and {} CPU than KSM, \
                 merges {:.1}% of the duplicates, and leaves {} footprint (each side's slab growth included).\n",
                k.pages_to_scan,
                factor(e.wall_s, k.settled_s),
                k.ksmd_cpu_s.map_or("?".into(), |c| factor(e.cpu_s, c)),
                100.0 * e.merged as f64 / (e.duplicate_pages as u64 - e.distinct_duplicates) as f64,
                factor(ours, ksm_mib)
            )
            .unwrap();
        }
    }
    out + "KSM's \"time to fold\" is when pages_sharing last changed; \"unconfirmed\" means the cap came before two \
           further full scans could show it would not change again. KSM footprint counts pages only; its slab \
           metadata is listed apart. pagefold's footprint counts frames in use plus the engine's metadata; the kernel's \
           memory for its mappings (slab growth) is listed apart.\n"
}

// ---------------------------------------------------------------- files

const DOC_TEMPLATE: &str = "# pagefold benchmarks

How to read these numbers: they come from `pagefold bench` (crate `pagefold-bench`), a harness, not a
test. Every figure is a median over several runs (`--runs`, default 5, 3 with `--quick`), and every
comparison is a ratio of two medians measured side by side in the same run on the same machine:
the engine against the kernel's own mechanism (copy-on-write fault, first-touch fault, memcpy into
freshly mapped memory, KSM), never against a number from another day. Page faults are always
included in what they belong to. After every copy and every scan the harness reads the bytes back
and checks them; a row that says `verified false` is an engine bug, not a result. Footprints are
the engine's counters cross-checked with the kernel's Shmem count (/proc/meminfo). The Difference
Engine's Table 2 costs (OSDI 2008, Xen) are shown for orientation only: another machine, another
decade. The KSM runs drive /sys/kernel/mm/ksm as root and restore every knob afterwards, also on
panic and on SIGINT/SIGTERM.

Reproduce (root, about 5 minutes; `--quick` takes under 2):

    cargo run --release -p pagefold -- bench --suite all --out DIR

Raw numbers: `DIR/bench-results.json`.

## Micro-benchmarks

<!-- bench:micro:begin -->
<!-- bench:micro:end -->

## The 1 GiB fold against kernel KSM

<!-- bench:fold:begin -->
<!-- bench:fold:end -->
";

/// Replaces the text between the suite's markers (creating the doc or the markers if missing).
pub fn update_doc(path: &Path, suite: &str, body: &str) -> Result<()> {
    let begin = format!("<!-- bench:{suite}:begin -->");
    let end = format!("<!-- bench:{suite}:end -->");
    let text = std::fs::read_to_string(path).unwrap_or_else(|_| DOC_TEMPLATE.to_string());
    let updated = match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) if b < e => format!("{}{begin}\n{body}{}", &text[..b], &text[e..]),
        _ => format!("{}\n{begin}\n{body}{end}\n", text.trim_end()),
    };
    write_creating_dirs(path, &updated)
}

/// Sets `key` in the JSON object stored at `path`, keeping the other keys.
pub fn update_json(path: &Path, key: &str, value: serde_json::Value) -> Result<()> {
    let mut root = std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .filter(|v| v.is_object())
        .unwrap_or_else(|| serde_json::json!({}));
    root[key] = value;
    write_creating_dirs(
        path,
        &(pagefold_measure::schema::pretty(SCHEMA, &root)? + "\n"),
    )
}

fn write_creating_dirs(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_sections_replace_only_their_markers() {
        let dir = std::env::temp_dir().join(format!("pagefold-bench-doc-{}", std::process::id()));
        let path = dir.join("BENCHMARKS.md");
        update_doc(&path, "micro", "FIRST-BODY\n").unwrap();
        update_doc(&path, "fold", "fold body\n").unwrap();
        update_doc(&path, "micro", "second\n").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("<!-- bench:micro:begin -->\nsecond\n<!-- bench:micro:end -->"));
        assert!(text.contains("<!-- bench:fold:begin -->\nfold body\n<!-- bench:fold:end -->"));
        assert!(!text.contains("FIRST-BODY"));
        assert!(text.contains(REPRODUCE));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn json_keeps_other_suites() {
        let path = std::env::temp_dir().join(format!("pagefold-bench-{}.json", std::process::id()));
        update_json(&path, "micro", serde_json::json!({"a": 1})).unwrap();
        update_json(&path, "fold", serde_json::json!({"b": 2})).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["micro"]["a"], 1);
        assert_eq!(v["fold"]["b"], 2);
        assert_eq!(v["schema"], SCHEMA);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn links_are_relative_to_the_document() {
        assert_eq!(
            link(
                Path::new("docs/RESULTS.md"),
                Path::new("docs/results/r-memory.png")
            ),
            "results/r-memory.png"
        );
        assert_eq!(
            link(
                Path::new("docs/RESULTS.md"),
                Path::new("out/results/r-memory.png")
            ),
            "../out/results/r-memory.png"
        );
        assert_eq!(
            link(Path::new("/a/b/RESULTS.md"), Path::new("/a/c/x.png")),
            "../c/x.png"
        );
    }

    #[test]
    fn verdicts_say_pass_or_miss_with_margin() {
        assert!(at_least(100.0, 50.0, "x").starts_with("pass"));
        assert!(at_least(10.0, 50.0, "x").contains("short by 5.00x"));
        assert!(at_most(0.6, 0.3, " s").contains("over by 2.00x"));
    }
}
