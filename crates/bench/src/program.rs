//! One run of a real, unmodified program under one configuration, measured
//! from outside: plain, under pagefold's preload (all mechanisms or some), or
//! under kernel KSM applied to the whole process with
//! prctl(PR_SET_MEMORY_MERGE) (what ksm_preload does with madvise).
//!
//! The footprint is sampled for the whole process tree at a fixed interval
//! (distinct physical pages plus the engine's memfd frames, see
//! pagefold-measure); CPU time is the tree's own (wait4's rusage covers every
//! descendant that was waited for) and, for KSM, ksmd's CPU over the run is
//! read apart, because it is spent outside the tree. Engine statistics come
//! from the report each preloaded process writes at exit.
//!
//! `pagefold run` and the workload suites of `pagefold bench` both run
//! programs through here, so the two can never measure differently.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pagefold_measure::{Sampler, Series};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cgroup::MemoryCgroup;
use crate::ksm::KsmGuard;

const PR_SET_MEMORY_MERGE: libc::c_int = 67;

/// How a configuration runs the program.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum Setup {
    Plain,
    /// The program alone, sampled for its sharing limit as well
    /// (pagefold_measure's limit.rs): every sample reads every anonymous
    /// page, which slows the program, so its times are not comparable.
    Limit,
    /// Under the preload, with these `PAGEFOLD_*` variables.
    Pagefold {
        env: Vec<(String, String)>,
    },
    /// The whole process made mergeable; ksmd scans at this rate.
    Ksm {
        pages_to_scan: u32,
        sleep_ms: u32,
    },
    /// Under the preload with `PAGEFOLD_KSM=1` (and these variables): the
    /// engine hands blocks whose duplicates it cannot merge to ksmd, which
    /// scans at this rate.
    PagefoldKsm {
        env: Vec<(String, String)>,
        pages_to_scan: u32,
        sleep_ms: u32,
    },
}

impl Setup {
    /// Whether the configuration runs ksmd (needs root and the KSM guard).
    pub fn runs_ksmd(&self) -> bool {
        self.ksmd_rate().is_some()
    }

    /// ksmd's rate for this configuration: pages per wake-up and sleep.
    fn ksmd_rate(&self) -> Option<(u32, u32)> {
        match self {
            Setup::Ksm {
                pages_to_scan,
                sleep_ms,
            }
            | Setup::PagefoldKsm {
                pages_to_scan,
                sleep_ms,
                ..
            } => Some((*pages_to_scan, *sleep_ms)),
            _ => None,
        }
    }
}

/// A named configuration, as given to `--configs`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Config {
    pub name: String,
    pub setup: Setup,
}

/// Every configuration name `parse_config` knows, with what it means.
pub const CONFIG_NAMES: &[(&str, &str)] = &[
    ("plain", "the program alone"),
    (
        "sharing-limit",
        "the program alone, sampled for its sharing limit (footprint with every zero page and repeated anonymous content folded) at most twice a second; slowed by the sampling, so only its footprints count",
    ),
    ("pagefold", "pagefold, every mechanism"),
    ("copy", "pagefold, virtual copies only"),
    ("zero", "pagefold, zero-page folding only"),
    ("merge", "pagefold, identical-page merging only"),
    ("ksm-100", "kernel KSM, 100 pages per 20 ms (its default)"),
    ("ksm-1000", "kernel KSM, 1000 pages per 20 ms"),
    ("ksm-10000", "kernel KSM, 10000 pages per 20 ms"),
    (
        "pagefold+ksm-10000",
        "pagefold handing blocks whose duplicates it cannot merge to kernel KSM, 10000 pages per 20 ms",
    ),
    (
        "de-share",
        "pagefold with tiering off: zero folding and merging (Difference Engine's sharing)",
    ),
    (
        "de-patch",
        "pagefold, tiering with patching only: no compression, no zero folding, no merging",
    ),
    (
        "de-compress",
        "pagefold, tiering with compression only: no patching, no zero folding, no merging",
    ),
    (
        "de-all",
        "pagefold, tiering on: sharing, patching and compression together",
    ),
];

/// The `de-*` configurations as `PAGEFOLD_*` settings (docs/CONFIG.md): each
/// of Difference Engine's mechanisms alone, and all together.
const DE_CONFIGS: &[(&str, &[(&str, &str)])] = &[
    ("de-share", &[("TIER", "0")]),
    (
        "de-patch",
        &[
            ("TIER", "1"),
            ("TIER_COMPRESS", "0"),
            ("MERGE", "0"),
            ("ZERO", "0"),
        ],
    ),
    (
        "de-compress",
        &[
            ("TIER", "1"),
            ("TIER_PATCH", "0"),
            ("MERGE", "0"),
            ("ZERO", "0"),
        ],
    ),
    ("de-all", &[("TIER", "1")]),
];

/// The configuration called `name` (see `CONFIG_NAMES`), or
/// `pagefold:KEY=V:...`: pagefold with `PAGEFOLD_KEY=V` set (docs/CONFIG.md).
pub fn parse_config(name: &str) -> Result<Config, String> {
    if let Some(settings) = name.strip_prefix("pagefold:") {
        return Ok(Config {
            name: name.to_string(),
            setup: Setup::Pagefold {
                env: parse_settings(settings)?,
            },
        });
    }
    let only = |keep: &str| {
        let env = ["COPY", "ZERO", "MERGE"]
            .iter()
            .filter(|m| !m.eq_ignore_ascii_case(keep))
            .map(|m| (format!("PAGEFOLD_{m}"), "0".to_string()))
            .collect();
        Setup::Pagefold { env }
    };
    let ksm = |pages_to_scan| Setup::Ksm {
        pages_to_scan,
        sleep_ms: 20,
    };
    if let Some((_, settings)) = DE_CONFIGS.iter().find(|(n, _)| *n == name) {
        let env = settings
            .iter()
            .map(|(k, v)| (format!("PAGEFOLD_{k}"), v.to_string()))
            .collect();
        return Ok(Config {
            name: name.to_string(),
            setup: Setup::Pagefold { env },
        });
    }
    let setup = match name {
        "plain" => Setup::Plain,
        "sharing-limit" => Setup::Limit,
        "pagefold" => Setup::Pagefold { env: Vec::new() },
        "copy" | "zero" | "merge" => only(name),
        "ksm" | "ksm-100" => ksm(100),
        "ksm-1000" => ksm(1000),
        "ksm-10000" => ksm(10000),
        "pagefold+ksm-10000" => Setup::PagefoldKsm {
            env: vec![("PAGEFOLD_KSM".to_string(), "1".to_string())],
            pages_to_scan: 10000,
            sleep_ms: 20,
        },
        _ => {
            let known: Vec<_> = CONFIG_NAMES.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "unknown configuration '{name}' (known: {})",
                known.join(", ")
            ));
        }
    };
    Ok(Config {
        name: name.to_string(),
        setup,
    })
}

/// `KEY=V:KEY=V` as `PAGEFOLD_KEY=V` variables. A key may also be written
/// with its `PAGEFOLD_` prefix (`PAGEFOLD_DISABLE=1` is `DISABLE=1`); a key
/// that names no variable docs/CONFIG.md documents is refused, since the
/// preload would ignore it and the configuration would silently run as
/// plain `pagefold`.
fn parse_settings(settings: &str) -> Result<Vec<(String, String)>, String> {
    settings
        .split(':')
        .map(|kv| {
            let not_kv = || format!("'{kv}' in configuration 'pagefold:{settings}' is not KEY=VALUE");
            let (key, value) = kv.split_once('=').ok_or_else(not_kv)?;
            if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(not_kv());
            }
            let upper = key.to_ascii_uppercase();
            let name = match upper.strip_prefix(VARIABLE_PREFIX) {
                Some(_) => upper,
                None => format!("{VARIABLE_PREFIX}{upper}"),
            };
            if !is_documented_variable(&name) {
                return Err(format!(
                    "'{key}' in configuration 'pagefold:{settings}': {name} is not a pagefold variable (docs/CONFIG.md lists them)"
                ));
            }
            Ok((name, value.to_string()))
        })
        .collect()
}

const VARIABLE_PREFIX: &str = "PAGEFOLD_";

/// docs/CONFIG.md, which names every `PAGEFOLD_*` variable the sources read
/// (crates/testkit/tests/config_doc.rs holds it to that).
const CONFIG_DOC: &str = include_str!("../../../docs/CONFIG.md");

/// Whether docs/CONFIG.md names `name` as a variable (its `PAGEFOLD_KEY`
/// row stands for the `pagefold:KEY=V` form itself, and a name ending in
/// `_` for a family such as `PAGEFOLD_INJECT_*`: neither is a variable).
fn is_documented_variable(name: &str) -> bool {
    name != "PAGEFOLD_KEY"
        && !name.ends_with('_')
        && CONFIG_DOC.match_indices(name).any(|(at, _)| {
            let after = CONFIG_DOC[at + name.len()..].bytes().next();
            let before = CONFIG_DOC[..at].bytes().next_back();
            let is_name_byte = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
            !after.is_some_and(is_name_byte) && !before.is_some_and(is_name_byte)
        })
}

/// What to run and how to watch it.
pub struct Invocation<'a> {
    pub cmd: &'a [String],
    pub preload: &'a Path,
    /// Some: stdin fed from it, stdout and stderr captured. None: inherited.
    pub input: Option<&'a [u8]>,
    pub interval: Duration,
    /// Killed (SIGKILL to the whole process group) after this long.
    pub timeout: Option<Duration>,
}

/// One measured run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    pub config: String,
    /// 128 + signal if killed, as shells report it.
    pub exit_code: i32,
    /// Killed after `Invocation::timeout`.
    pub timed_out: bool,
    pub wall_s: f64,
    pub cpu_s: f64,
    /// The tree's user and system CPU time (their sum is `cpu_s`).
    #[serde(default)]
    pub user_s: f64,
    #[serde(default)]
    pub sys_s: f64,
    /// Page faults of the tree that needed no I/O (minor) and that did (major).
    #[serde(default)]
    pub minor_faults: u64,
    #[serde(default)]
    pub major_faults: u64,
    /// ksmd's CPU time during the run (KSM configurations only).
    pub ksmd_cpu_s: Option<f64>,
    pub peak_bytes: u64,
    pub average_bytes: u64,
    pub samples: u64,
    /// "pfn" (exact) or "pssproxy" (without root).
    pub method: String,
    /// The engine's statistics, one per process that used it.
    pub engine: Vec<Value>,
    /// Footprint over time: (ms since start, bytes).
    pub timeline: Vec<(u64, u64)>,
    /// Time-weighted average of the sharing limit (the `sharing-limit` configuration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_average_bytes: Option<u64>,
    /// Quantities the program reported about itself (see [`reported_metrics`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
    #[serde(skip)]
    pub stdout: Option<Vec<u8>>,
    #[serde(skip)]
    pub stderr: Option<Vec<u8>>,
}

/// Runs the program once under `config`. KSM configurations need `ksm` (the
/// caller holds the guard across runs so the knobs are restored once, at the end).
pub fn run(inv: &Invocation, config: &Config, ksm: Option<&KsmGuard>) -> Result<Outcome, String> {
    run_in(inv, config, ksm, None)
}

/// `run`, with the program put into `cgroup` before it executes. What is
/// left in the group when the program has exited is killed, so a process
/// that left its process group cannot hold the output pipes open.
pub fn run_in(
    inv: &Invocation,
    config: &Config,
    ksm: Option<&KsmGuard>,
    cgroup: Option<&MemoryCgroup>,
) -> Result<Outcome, String> {
    let reports = tempdir()?;
    let mut cmd = command(inv, &config.setup, &reports);
    if let Some(procs) = cgroup.map(|g| g.procs_file().to_owned()) {
        crate::cgroup::join_before_exec(&mut cmd, procs);
    }
    let ksmd_before = match config.setup.ksmd_rate() {
        Some((pages_to_scan, sleep_ms)) => {
            let guard = ksm.ok_or("a KSM configuration needs root and the KSM guard")?;
            start_ksm(guard, pages_to_scan, sleep_ms)?;
            ksmd_cpu()
        }
        None => None,
    };
    let result = run_command(&mut cmd, inv, config.setup == Setup::Limit, &|| {
        cgroup.iter().for_each(|g| g.kill_members())
    });
    if let (true, Some(guard)) = (config.setup.runs_ksmd(), ksm) {
        // ksmd must not keep spending CPU during the next configuration's run.
        let _ = guard.set("run", "0");
    }
    let engine = read_reports(&reports);
    let _ = std::fs::remove_dir_all(&reports);
    let Finished {
        code,
        wall,
        usage,
        series,
        stdout,
        stderr,
        timed_out,
    } = result?;
    let s = &series.summary;
    Ok(Outcome {
        config: config.name.clone(),
        exit_code: code,
        timed_out,
        wall_s: wall.as_secs_f64(),
        cpu_s: (usage.user + usage.sys).as_secs_f64(),
        user_s: usage.user.as_secs_f64(),
        sys_s: usage.sys.as_secs_f64(),
        minor_faults: usage.minor_faults,
        major_faults: usage.major_faults,
        ksmd_cpu_s: ksmd_before
            .zip(ksmd_cpu())
            .map(|(a, b)| b.saturating_sub(a).as_secs_f64()),
        peak_bytes: s.peak_bytes,
        average_bytes: s.average_bytes,
        samples: s.samples,
        method: s
            .method
            .map(|m| format!("{m:?}").to_lowercase())
            .unwrap_or_else(|| "none".into()),
        engine,
        timeline: series
            .samples
            .iter()
            .map(|f| (f.timestamp_ms, f.footprint_bytes))
            .collect(),
        limit_average_bytes: s.average_limit_bytes,
        metrics: reported_metrics(stderr.as_deref().unwrap_or_default()),
        stdout,
        stderr,
    })
}

/// What marks the line a program writes on stderr to report quantities
/// only it can see (Dask's spilled bytes, a worker's peak): the marker,
/// then a JSON object.
pub const METRICS_MARKER: &str = "bench-metrics ";

/// The numbers of the last `bench-metrics {JSON}` line of `stderr`, by
/// name; values that are not numbers are left out, and a line that is not
/// a JSON object reports nothing.
pub fn reported_metrics(stderr: &[u8]) -> BTreeMap<String, f64> {
    let text = String::from_utf8_lossy(stderr);
    let Some(doc) = text
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix(METRICS_MARKER))
    else {
        return BTreeMap::new();
    };
    match serde_json::from_str::<Value>(doc) {
        Ok(Value::Object(fields)) => fields
            .into_iter()
            .filter(|(_, v)| v.is_number())
            .filter_map(|(k, v)| v.as_f64().map(|n| (k, n)))
            .collect(),
        _ => BTreeMap::new(),
    }
}

fn command(inv: &Invocation, setup: &Setup, reports: &Path) -> Command {
    let mut cmd = Command::new(&inv.cmd[0]);
    cmd.args(&inv.cmd[1..]);
    match setup {
        Setup::Plain | Setup::Limit => {}
        Setup::Pagefold { env } | Setup::PagefoldKsm { env, .. } => {
            let mut ld = inv.preload.as_os_str().to_owned();
            if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
                ld.push(":");
                ld.push(old);
            }
            cmd.env("LD_PRELOAD", ld)
                .env("PAGEFOLD_REPORT", reports.join("engine"));
            cmd.envs(env.iter().map(|(k, v)| (k, v)));
        }
        Setup::Ksm { .. } => {
            // SAFETY: the closure runs in the forked child before exec and
            // makes one prctl call (async-signal-safe, no pointers) and reads
            // errno: no allocation and no lock another thread could hold.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
    }
    if inv.input.is_some() {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }
    if inv.timeout.is_some() {
        // Its own process group, so a timeout kills every descendant too.
        cmd.process_group(0);
    }
    cmd
}

fn start_ksm(guard: &KsmGuard, pages_to_scan: u32, sleep_ms: u32) -> Result<(), String> {
    let values = [
        ("pages_to_scan", pages_to_scan.to_string()),
        ("sleep_millisecs", sleep_ms.to_string()),
        ("run", "1".into()),
    ];
    for (k, v) in values {
        guard
            .set(k, &v)
            .map_err(|e| format!("setting KSM {k}: {e}"))?;
    }
    Ok(())
}

struct Finished {
    code: i32,
    wall: Duration,
    usage: Usage,
    series: Series,
    stdout: Option<Vec<u8>>,
    stderr: Option<Vec<u8>>,
    timed_out: bool,
}

/// Least interval between two samples that read the sharing limit.
const LIMIT_INTERVAL: Duration = Duration::from_millis(500);

/// Runs the command to its end, sampling its sharing limit too if
/// `limit`; `after_exit` runs once the program has exited, before its
/// output pipes are drained.
fn run_command(
    cmd: &mut Command,
    inv: &Invocation,
    limit: bool,
    after_exit: &dyn Fn(),
) -> Result<Finished, String> {
    let t0 = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", inv.cmd[0]))?;
    let pid = child.id();
    let interval = match limit {
        true => inv.interval.max(LIMIT_INTERVAL),
        false => inv.interval,
    };
    let sampler = Sampler::new(pid, interval)
        .tree(true)
        .sharing_limit(limit)
        .start();
    let feeder = child.stdin.take().map(|mut w| {
        let data = inv.input.unwrap_or_default().to_vec();
        std::thread::spawn(move || {
            let _ = w.write_all(&data);
        })
    });
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        pipe.map(|mut p| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = p.read_to_end(&mut buf);
                buf
            })
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let watchdog = inv.timeout.map(|limit| Watchdog::start(pid, limit));
    let waited = wait_with_rusage(pid);
    let wall = t0.elapsed();
    after_exit();
    let timed_out = watchdog.is_some_and(Watchdog::stop);
    let series = sampler.stop();
    if let Some(f) = feeder {
        let _ = f.join();
    }
    let stdout = out.map(|r| r.join().unwrap_or_default());
    let stderr = err.map(|r| r.join().unwrap_or_default());
    let (code, usage) = waited?;
    Ok(Finished {
        code,
        wall,
        usage,
        series,
        stdout,
        stderr,
        timed_out,
    })
}

/// Kills a process group that outlives its time limit.
struct Watchdog {
    done: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    fired: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Watchdog {
    fn start(pid: u32, limit: Duration) -> Watchdog {
        let done = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let fired = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (d, f) = (done.clone(), fired.clone());
        let thread = std::thread::spawn(move || {
            let (lock, cv) = &*d;
            let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
            let (finished, _) = cv
                .wait_timeout_while(guard, limit, |finished| !*finished)
                .unwrap_or_else(|e| e.into_inner());
            if !*finished {
                f.store(true, std::sync::atomic::Ordering::SeqCst);
                crate::sys::kill(-(pid as i32), libc::SIGKILL);
            }
        });
        Watchdog {
            done,
            fired,
            thread,
        }
    }

    /// True if it had to kill.
    fn stop(self) -> bool {
        *self.done.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.done.1.notify_all();
        let _ = self.thread.join();
        self.fired.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// What a finished process tree used, from wait4's rusage (it and every
/// descendant it waited for).
struct Usage {
    user: Duration,
    sys: Duration,
    minor_faults: u64,
    major_faults: u64,
}

/// Waits for `pid`; its exit code (128 + signal if killed, as shells do) and
/// what it and every descendant it waited for used.
fn wait_with_rusage(pid: u32) -> Result<(i32, Usage), String> {
    let mut status = 0;
    // SAFETY: rusage is a C struct of integers and timevals, for which all
    // zero bytes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `ru` are live, writable locals of the types
        // wait4 fills, and the only memory it writes.
        let r = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut ru) };
        if r == pid as i32 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(format!("waiting for the command: {e}"));
        }
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    };
    let usage = Usage {
        user: tv(ru.ru_utime),
        sys: tv(ru.ru_stime),
        minor_faults: ru.ru_minflt.max(0) as u64,
        major_faults: ru.ru_majflt.max(0) as u64,
    };
    Ok((code, usage))
}

fn ksmd_cpu() -> Option<Duration> {
    crate::timing::pid_cpu(crate::timing::find_pid_by_comm("ksmd")?)
}

fn read_reports(dir: &Path) -> Vec<Value> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Value> = entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|s| serde_json::from_str(&s).ok())
        .collect();
    out.sort_by_key(|v| v["pid"].as_u64());
    out
}

fn tempdir() -> Result<PathBuf, String> {
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let base = std::env::temp_dir().join(format!("pagefold-run-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).map_err(|e| format!("creating {}: {e}", base.display()))?;
    Ok(base)
}

/// The engine counters summed over every process that used it.
pub fn engine_total(reports: &[Value]) -> Value {
    let mut total = serde_json::Map::new();
    for r in reports {
        if let Some(stats) = r["stats"].as_object() {
            add_numbers(&mut total, stats);
        }
    }
    Value::Object(total)
}

fn add_numbers(total: &mut serde_json::Map<String, Value>, stats: &serde_json::Map<String, Value>) {
    for (k, v) in stats {
        match v {
            Value::Number(n) => {
                let sum =
                    total.get(k).and_then(Value::as_u64).unwrap_or(0) + n.as_u64().unwrap_or(0);
                total.insert(k.clone(), sum.into());
            }
            Value::Object(inner) => {
                let mut sub = total
                    .get(k)
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                add_numbers(&mut sub, inner);
                total.insert(k.clone(), Value::Object(sub));
            }
            _ => {}
        }
    }
}

/// The preload library: the option, $PAGEFOLD_PRELOAD, or beside this program.
pub fn find_preload(opt: Option<&Path>) -> Result<PathBuf, String> {
    let candidate = match (opt, std::env::var_os("PAGEFOLD_PRELOAD")) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => {
            let exe = std::env::current_exe().map_err(|e| format!("locating pagefold: {e}"))?;
            let places = preload_places(&exe);
            match places.iter().find(|p| p.is_file()) {
                Some(p) => p.clone(),
                None => places[0].clone(),
            }
        }
    };
    if !candidate.is_file() {
        return Err(format!(
            "preload library {} not found (build it with `cargo build --release -p pagefold-preload`, or pass --preload)",
            candidate.display()
        ));
    }
    candidate
        .canonicalize()
        .map_err(|e| format!("{}: {e}", candidate.display()))
}

/// Where the preload library sits for the program at `exe`, in the order
/// looked at: beside it (a cargo build), then in `lib/` beside its `bin/`
/// (`make install`, the Debian package).
pub fn preload_places(exe: &Path) -> Vec<PathBuf> {
    const NAME: &str = "libpagefold_preload.so";
    let mut places = vec![exe.with_file_name(NAME)];
    if let Some(prefix) = exe.parent().and_then(Path::parent) {
        places.push(prefix.join("lib").join(NAME));
    }
    places
}

/// `name` as the shell would find it.
pub fn resolve(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// True unless `path` is an ELF file without a program interpreter (static):
/// scripts run an interpreter that is itself checked by the kernel, not us.
pub fn is_dynamic(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return true;
    };
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return true;
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into().unwrap_or_default()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let o = phoff + i * size;
        bytes
            .get(o..o + 4)
            .is_some_and(|t| u32::from_le_bytes(t.try_into().unwrap_or_default()) == 3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_metrics_line_is_read_and_its_numbers_kept() {
        let stderr = b"bench-metrics {\"a\": 1}\nsome log\nbench-metrics {\"spilled_mib\": 12.5, \"peak\": 3, \"list\": [1], \"flag\": true}\n";
        let m = reported_metrics(stderr);
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!((m["spilled_mib"], m["peak"]), (12.5, 3.0));
        assert!(reported_metrics(b"no line here\n").is_empty());
        assert!(
            reported_metrics(b"bench-metrics [1, 2]\n").is_empty(),
            "not an object"
        );
        assert!(reported_metrics(b"bench-metrics {broken\n").is_empty());
    }

    #[test]
    fn every_listed_config_parses_and_unknown_ones_do_not() {
        for (name, _) in CONFIG_NAMES {
            assert_eq!(parse_config(name).unwrap().name, *name);
        }
        let err = parse_config("turbo").unwrap_err();
        assert!(
            err.contains("unknown configuration 'turbo'") && err.contains("ksm-10000"),
            "{err}"
        );
        let set = parse_config("pagefold:threshold=131072:SCAN_CPU=0.05").unwrap();
        let env = vec![
            ("PAGEFOLD_THRESHOLD".to_string(), "131072".to_string()),
            ("PAGEFOLD_SCAN_CPU".to_string(), "0.05".to_string()),
        ];
        assert_eq!(set.setup, Setup::Pagefold { env });
        assert!(parse_config("pagefold:THRESHOLD")
            .unwrap_err()
            .contains("not KEY=VALUE"));
        assert!(parse_config("pagefold:A B=1").is_err());
    }

    #[test]
    fn a_setting_may_carry_its_prefix_and_must_name_a_documented_variable() {
        let env = |name: &str| match parse_config(name).unwrap().setup {
            Setup::Pagefold { env } => env,
            other => panic!("{name}: {other:?}"),
        };
        let disabled = vec![("PAGEFOLD_DISABLE".to_string(), "1".to_string())];
        assert_eq!(env("pagefold:DISABLE=1"), disabled);
        assert_eq!(env("pagefold:PAGEFOLD_DISABLE=1"), disabled);
        assert_eq!(env("pagefold:pagefold_disable=1"), disabled);
        for unknown in [
            "pagefold:DISABLED=1",
            "pagefold:KEY=1",
            "pagefold:PAGEFOLD_=1",
            "pagefold:INJECT_=1",
        ] {
            let err = parse_config(unknown).unwrap_err();
            assert!(
                err.contains("is not a pagefold variable"),
                "{unknown}: {err}"
            );
        }
        // A name inside a longer documented one is not a variable.
        assert!(parse_config("pagefold:SCAN=1").is_err());
        assert!(parse_config("pagefold:COPY=0:ZERO=0:MERGE=0").is_ok());
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    fn invocation<'a>(cmd: &'a [String], timeout: Option<Duration>) -> Invocation<'a> {
        Invocation {
            cmd,
            preload: Path::new("/nonexistent"),
            input: Some(&[]),
            interval: Duration::from_millis(10),
            timeout,
        }
    }

    #[test]
    fn ksm_knobs_are_restored_after_a_failing_run() {
        let knobs = || {
            ["run", "pages_to_scan", "sleep_millisecs"].map(|k| crate::ksm::read_knob(k).unwrap())
        };
        let guard = match KsmGuard::acquire() {
            Ok(g) => g,
            Err(why) => return eprintln!("skipped: {why}"),
        };
        let before = knobs();
        let cmd = sh("echo partial; exit 3");
        let o = run(
            &invocation(&cmd, None),
            &parse_config("ksm-10000").unwrap(),
            Some(&guard),
        )
        .unwrap();
        assert_eq!(o.exit_code, 3);
        assert_eq!(o.stdout.as_deref(), Some(&b"partial\n"[..]));
        assert!(o.ksmd_cpu_s.is_some());
        assert_eq!(
            crate::ksm::read_knob("run").unwrap(),
            "0",
            "ksmd stopped after the run"
        );
        drop(guard);
        assert_eq!(knobs(), before);
    }

    #[test]
    fn a_run_past_its_time_limit_is_killed_with_its_children() {
        let cmd = sh("sleep 30 & sleep 30; echo never");
        let t = std::time::Instant::now();
        let o = run(
            &invocation(&cmd, Some(Duration::from_millis(300))),
            &parse_config("plain").unwrap(),
            None,
        )
        .unwrap();
        assert!(o.timed_out && o.exit_code == 128 + libc::SIGKILL, "{o:?}");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the background child kept the pipes open"
        );
        assert_eq!(o.stdout.as_deref(), Some(&b""[..]));
    }

    #[test]
    fn a_program_whose_output_changes_is_flagged_by_the_suite() {
        // Real runs of a program that prints its own pid: never the same twice.
        let cmd = sh("echo $$");
        let plain = parse_config("plain").unwrap();
        let runs: Vec<Outcome> = (0..2)
            .map(|_| run(&invocation(&cmd, None), &plain, None).unwrap())
            .collect();
        let mut second = runs[1].clone();
        second.config = "pagefold".into();
        let stats = crate::suite::summarize(
            &["plain".into(), "pagefold".into()],
            &[runs[0].clone(), second],
        );
        assert!(stats[0].identical && !stats[1].identical);
        let same = sh("echo same");
        let a = run(&invocation(&same, None), &plain, None).unwrap();
        let mut b = run(&invocation(&same, None), &plain, None).unwrap();
        b.config = "pagefold".into();
        assert!(
            crate::suite::summarize(&["plain".into(), "pagefold".into()], &[a, b])[1].identical
        );
    }

    #[test]
    fn a_single_mechanism_switches_the_other_two_off() {
        let Setup::Pagefold { env } = parse_config("zero").unwrap().setup else {
            panic!()
        };
        assert_eq!(
            env,
            vec![
                ("PAGEFOLD_COPY".to_string(), "0".to_string()),
                ("PAGEFOLD_MERGE".to_string(), "0".to_string())
            ]
        );
        assert_eq!(
            parse_config("ksm").unwrap().setup,
            Setup::Ksm {
                pages_to_scan: 100,
                sleep_ms: 20
            }
        );
    }

    #[test]
    fn de_configurations_are_the_pagefold_settings_they_stand_for() {
        let env = |name: &str| match parse_config(name).unwrap().setup {
            Setup::Pagefold { env } => env,
            other => panic!("{name}: {other:?}"),
        };
        let by_hand = |s: &str| match parse_config(&format!("pagefold:{s}")).unwrap().setup {
            Setup::Pagefold { env } => env,
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(env("de-share"), by_hand("TIER=0"));
        assert_eq!(
            env("de-patch"),
            by_hand("TIER=1:TIER_COMPRESS=0:MERGE=0:ZERO=0")
        );
        assert_eq!(
            env("de-compress"),
            by_hand("TIER=1:TIER_PATCH=0:MERGE=0:ZERO=0")
        );
        assert_eq!(env("de-all"), by_hand("TIER=1"));
    }
}
