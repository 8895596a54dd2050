//! What `pagefold measure` needs beyond the library calls: checking its
//! arguments, turning errors into one-line messages and exit codes, and
//! formatting footprints as text or JSON. It lives here rather than in the CLI crate
//! so that it is unit-tested with the measurement it reports on; the CLI's
//! measure.rs only wires clap, printing and exit codes to these functions.

use std::fmt;
use std::time::Duration;

use crate::error::Error;
use crate::footprint::{Footprint, Method};
use crate::sampler::{Sampler, Series, SeriesEnd};

/// Exit code for bad arguments and failed measurements.
pub const EXIT_FAILURE: i32 = 2;
/// The `"schema"` of `pagefold measure --json` (one [`Footprint`]).
pub const FOOTPRINT_SCHEMA: &str = "pagefold-measure/1";
/// The `"schema"` of `pagefold measure --json` with `--interval`, `--count`
/// or `--duration` (a [`Series`]).
pub const SERIES_SCHEMA: &str = "pagefold-measure-series/1";
/// Interval of a series when only --count or --duration was given.
pub const DEFAULT_INTERVAL_MS: u64 = 1000;
const PREFIX: &str = "pagefold measure";

/// A one-line message for stderr and the exit code that goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    pub exit_code: i32,
}

impl Failure {
    fn new(detail: impl fmt::Display) -> Failure {
        Failure {
            message: format!("{PREFIX}: {detail}"),
            exit_code: EXIT_FAILURE,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<&Error> for Failure {
    fn from(error: &Error) -> Failure {
        Failure::new(error)
    }
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure::new(&error)
    }
}

/// Parses a PID argument: decimal digits only, 1 ..= i32::MAX (pid_t).
pub fn parse_pid(text: &str) -> Result<u32, Failure> {
    let invalid = || {
        Failure::new(format_args!(
            "invalid PID '{text}' (expected a positive process ID)"
        ))
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    match text.parse::<u32>() {
        Ok(pid) if pid > 0 && pid <= i32::MAX as u32 => Ok(pid),
        _ => Err(invalid()),
    }
}

/// How a series is to be sampled.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesPlan {
    pub interval: Duration,
    pub count: Option<u64>,
    pub duration: Option<Duration>,
}

impl SeriesPlan {
    /// A series if any of the three options is given, else None (one
    /// measurement). The interval defaults to DEFAULT_INTERVAL_MS.
    pub fn from_options(
        interval_ms: Option<u64>,
        count: Option<u64>,
        duration_secs: Option<f64>,
    ) -> Result<Option<SeriesPlan>, Failure> {
        if interval_ms.is_none() && count.is_none() && duration_secs.is_none() {
            return Ok(None);
        }
        let interval_ms = interval_ms.unwrap_or(DEFAULT_INTERVAL_MS);
        if interval_ms == 0 {
            return Err(Failure::new("--interval must be at least 1 ms"));
        }
        if count == Some(0) {
            return Err(Failure::new("--count must be at least 1"));
        }
        let duration = duration_secs.map(checked_duration).transpose()?;
        Ok(Some(SeriesPlan {
            interval: Duration::from_millis(interval_ms),
            count,
            duration,
        }))
    }

    pub fn sampler(&self, pid: u32, tree: bool) -> Sampler {
        let mut sampler = Sampler::new(pid, self.interval).tree(tree);
        if let Some(count) = self.count {
            sampler = sampler.max_samples(count);
        }
        if let Some(duration) = self.duration {
            sampler = sampler.max_duration(duration);
        }
        sampler
    }
}

fn checked_duration(secs: f64) -> Result<Duration, Failure> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Failure::new(format_args!(
                "invalid --duration {secs} (expected seconds > 0)"
            ))
        })
}

/// The failure a finished series reports, if it did not end normally. A
/// process exiting is a normal end once at least one sample was taken.
pub fn series_failure(series: &Series) -> Option<Failure> {
    let error = series.error.as_deref().unwrap_or("measurement failed");
    match series.end {
        SeriesEnd::Failed => Some(Failure::new(error)),
        _ if series.samples.is_empty() => Some(Failure::new(error)),
        _ => None,
    }
}

/// 1536 -> "1.5 KiB"; exact below 1 KiB.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn format_signed_bytes(bytes: i64) -> String {
    match bytes < 0 {
        true => format!("-{}", format_bytes(bytes.unsigned_abs())),
        false => format_bytes(bytes as u64),
    }
}

fn method_note(method: Method) -> &'static str {
    match method {
        Method::Pfn => "pfn: distinct physical pages + memfd blocks",
        Method::PssProxy => "pss-proxy: sum of PSS, PFNs are readable only as root",
    }
}

/// The one-shot report: one `name  value` row per line.
pub fn footprint_table(fp: &Footprint) -> String {
    let page = crate::page_size();
    let distinct = match fp.distinct_pages {
        Some(pages) => format!("{pages} pages ({})", format_bytes(pages * page)),
        None => "n/a (PFNs not readable)".to_string(),
    };
    let rows = [
        ("pids", pids_text(&fp.pids)),
        (
            "footprint",
            format!(
                "{}  ({})",
                format_bytes(fp.footprint_bytes),
                method_note(fp.method)
            ),
        ),
        ("method", fp.method.to_string()),
        ("distinct", distinct),
        ("memfd", format_bytes(fp.memfd_bytes)),
        ("rss", format_bytes(fp.rss_bytes)),
        ("pss", format_bytes(fp.pss_bytes)),
        ("uss", format_bytes(fp.uss_bytes)),
        ("swap", format_bytes(fp.swap_bytes)),
        ("peak rss", format_bytes(fp.vm_hwm_bytes)),
        ("ksm", ksm_text(fp)),
        ("limit", limit_text(fp)),
    ];
    rows.iter()
        .map(|(name, value)| format!("{name:<10} {value}\n"))
        .collect()
}

fn limit_text(fp: &Footprint) -> String {
    match &fp.sharing_limit {
        Some(l) => format!(
            "{} ({:.3} of the footprint): {} anonymous frames, {} of them zero, {} distinct contents in the rest",
            format_bytes(l.limit_bytes),
            ratio(l.limit_bytes, fp.footprint_bytes),
            l.anon_frames,
            l.zero_frames,
            l.distinct_contents,
        ),
        None => "n/a (not asked for, or PFNs not readable)".to_string(),
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    match whole {
        0 => 1.0,
        w => part as f64 / w as f64,
    }
}

fn pids_text(pids: &[u32]) -> String {
    match pids {
        [] => "none".to_string(),
        [only] => only.to_string(),
        [root, rest @ ..] => format!("{root} (+{} descendants)", rest.len()),
    }
}

fn ksm_text(fp: &Footprint) -> String {
    match &fp.ksm {
        Some(k) => format!(
            "{} pages merged, profit {}",
            k.merging_pages,
            format_signed_bytes(k.process_profit)
        ),
        None => "n/a (no ksm_stat)".to_string(),
    }
}

/// `pagefold measure --json`: one footprint as a JSON document.
pub fn footprint_json(fp: &Footprint) -> Result<String, Failure> {
    json(FOOTPRINT_SCHEMA, fp)
}

/// `pagefold measure --json` of a series: samples, summary and why it ended.
pub fn series_json(series: &Series) -> Result<String, Failure> {
    json(SERIES_SCHEMA, series)
}

fn json(schema: &str, body: &impl serde::Serialize) -> Result<String, Failure> {
    crate::schema::pretty(schema, body)
        .map_err(|e| Failure::new(format_args!("cannot encode JSON: {e}")))
}

/// One line of a live series.
pub fn sample_line(fp: &Footprint) -> String {
    let ksm = fp
        .ksm
        .as_ref()
        .map_or(String::new(), |k| format!("  ksm {}", k.merging_pages));
    let limit = fp.sharing_limit.as_ref().map_or(String::new(), |l| {
        format!("  limit {}", format_bytes(l.limit_bytes))
    });
    format!(
        "{:>8} ms  footprint {:>10}  rss {:>10}  pss {:>10}  uss {:>10}  swap {:>9}  pids {}{ksm}{limit}",
        fp.timestamp_ms,
        format_bytes(fp.footprint_bytes),
        format_bytes(fp.rss_bytes),
        format_bytes(fp.pss_bytes),
        format_bytes(fp.uss_bytes),
        format_bytes(fp.swap_bytes),
        fp.pids.len(),
    )
}

/// The closing line of a series: peak, average and why it ended.
pub fn summary_line(series: &Series) -> String {
    let s = &series.summary;
    let method = s.method.map_or("none".to_string(), |m| m.to_string());
    let limit = s.average_limit_bytes.map_or(String::new(), |l| {
        format!(
            ", sharing limit {} on average ({:.3} of the footprint)",
            format_bytes(l),
            ratio(l, s.average_bytes)
        )
    });
    format!(
        "{} samples over {:.2} s: peak {}, average {} (time-weighted; plain mean {}), method {method}{limit}, ended: {}",
        s.samples,
        s.span_ms as f64 / 1000.0,
        format_bytes(s.peak_bytes),
        format_bytes(s.average_bytes),
        format_bytes(s.mean_bytes),
        end_text(series.end),
    )
}

fn end_text(end: SeriesEnd) -> &'static str {
    match end {
        SeriesEnd::ProcessExited => "process exited",
        SeriesEnd::CountReached => "sample count reached",
        SeriesEnd::DurationReached => "duration reached",
        SeriesEnd::Stopped => "stopped",
        SeriesEnd::Failed => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_validation() {
        assert_eq!(parse_pid("1234"), Ok(1234));
        for bad in [
            "abc",
            "",
            "-5",
            "+5",
            "12a",
            " 12",
            "0",
            "4294967296",
            "2147483648",
        ] {
            let failure = parse_pid(bad).unwrap_err();
            assert_eq!(failure.exit_code, 2, "{bad}");
            assert_eq!(
                failure.message,
                format!("pagefold measure: invalid PID '{bad}' (expected a positive process ID)")
            );
            assert!(!failure.message.contains('\n'));
        }
    }

    #[test]
    fn error_messages() {
        let cases = [
            (Error::NoSuchProcess(12345), "pagefold measure: no such process 12345"),
            (Error::ProcessExited(7), "pagefold measure: process 7 exited"),
            (
                Error::PermissionDenied(1),
                "pagefold measure: permission denied reading process 1 (run as root or as its owner)",
            ),
        ];
        for (error, message) in cases {
            let failure = Failure::from(&error);
            assert_eq!(failure.message, message);
            assert_eq!(failure.exit_code, 2);
        }
        let io = Error::Io {
            path: "/proc/1/maps".into(),
            source: std::io::Error::from_raw_os_error(libc::EIO),
        };
        assert!(Failure::from(io)
            .message
            .starts_with("pagefold measure: /proc/1/maps: "));
    }

    #[test]
    fn series_options() {
        assert_eq!(SeriesPlan::from_options(None, None, None), Ok(None));
        let plan = SeriesPlan::from_options(Some(250), Some(4), Some(1.5))
            .unwrap()
            .unwrap();
        assert_eq!(plan.interval, Duration::from_millis(250));
        assert_eq!(plan.count, Some(4));
        assert_eq!(plan.duration, Some(Duration::from_millis(1500)));
        let implied = SeriesPlan::from_options(None, Some(3), None)
            .unwrap()
            .unwrap();
        assert_eq!(implied.interval, Duration::from_millis(DEFAULT_INTERVAL_MS));
        assert!(SeriesPlan::from_options(Some(0), None, None).is_err());
        assert!(SeriesPlan::from_options(Some(10), Some(0), None).is_err());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(
                SeriesPlan::from_options(Some(10), None, Some(bad)).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn byte_formatting() {
        assert_eq!(format_bytes(0), "0 B");
        assert_eq!(format_bytes(1023), "1023 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(64 << 20), "64.0 MiB");
        assert_eq!(format_bytes(3 << 30), "3.0 GiB");
        assert_eq!(format_signed_bytes(-2048), "-2.0 KiB");
    }

    #[test]
    fn json_documents_carry_their_schema() {
        let fp = crate::measure_self().unwrap();
        let v: serde_json::Value = serde_json::from_str(&footprint_json(&fp).unwrap()).unwrap();
        assert_eq!(v["schema"], "pagefold-measure/1");
        assert_eq!(v["footprint_bytes"], fp.footprint_bytes);
        let series = Sampler::new(std::process::id(), Duration::from_millis(1))
            .max_samples(2)
            .run()
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&series_json(&series).unwrap()).unwrap();
        assert_eq!(v["schema"], "pagefold-measure-series/1");
        assert_eq!(v["samples"].as_array().map(Vec::len), Some(2), "{v}");
        assert!(v["samples"][0].get("schema").is_none(), "{v}");
    }

    #[test]
    fn table_has_every_row() {
        let fp = crate::measure_self().unwrap();
        let table = footprint_table(&fp);
        for row in [
            "pids",
            "footprint",
            "method",
            "distinct",
            "memfd",
            "rss",
            "pss",
            "uss",
            "swap",
            "ksm",
        ] {
            assert!(
                table.lines().any(|l| l.starts_with(row)),
                "{row} missing in\n{table}"
            );
        }
    }
}
