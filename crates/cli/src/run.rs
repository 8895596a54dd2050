//! `pagefold run [options] -- CMD ARGS...`: runs an unmodified program with the
//! preload library, passes stdin, stdout, stderr and the exit status through,
//! samples the true footprint of its whole process tree, and reports at exit.
//!
//! With `--compare` the same command also runs plain (and, as root, under
//! kernel KSM with its knobs restored afterwards), one after the other with
//! the same input; outputs are captured and must be byte-identical, and the
//! report puts all runs side by side. The report goes to stderr (or
//! `--report FILE`) so the program's stdout stays its own.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pagefold_measure::{Sampler, Series};
use serde::Serialize;
use serde_json::Value;

const PR_SET_MEMORY_MERGE: libc::c_int = 67;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also run CMD plain (and under kernel KSM when root) and compare.
    #[arg(long)]
    pub compare: bool,
    /// Footprint sampling interval in milliseconds.
    #[arg(long, default_value_t = 50)]
    pub interval: u64,
    /// The preload library (default: libpagefold_preload.so beside this program).
    #[arg(long)]
    pub preload: Option<PathBuf>,
    /// Write the report to FILE instead of stderr.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Plain,
    Pagefold,
    Ksm,
}

#[derive(Serialize)]
struct RunResult {
    mode: Mode,
    exit_code: i32,
    wall_s: f64,
    cpu_s: f64,
    ksmd_cpu_s: Option<f64>,
    peak_bytes: u64,
    average_bytes: u64,
    samples: u64,
    method: String,
    /// The engine's statistics, one per process that used it.
    engine: Vec<Value>,
    /// Footprint over time: (ms since start, bytes).
    timeline: Vec<(u64, u64)>,
    #[serde(skip)]
    stdout: Option<Vec<u8>>,
}

pub fn run(a: Args) -> i32 {
    match run_checked(&a) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("pagefold run: {msg}");
            2
        }
    }
}

fn run_checked(a: &Args) -> Result<i32, String> {
    let preload = find_preload(a.preload.as_deref())?;
    let program = resolve(&a.cmd[0]).ok_or_else(|| format!("{}: command not found", a.cmd[0]))?;
    let mut use_preload = true;
    if !is_dynamic(&program) {
        eprintln!(
            "pagefold run: {} is statically linked (no dynamic loader): it runs without pagefold",
            program.display()
        );
        use_preload = false;
    }
    let interval = Duration::from_millis(a.interval.max(1));
    if !a.compare {
        let mode = if use_preload { Mode::Pagefold } else { Mode::Plain };
        let r = run_once(mode, a, &preload, None, interval)?;
        emit(a, &[r.summary_ref()], true)?;
        return Ok(r.exit_code);
    }
    let input = read_stdin_if_piped();
    let mut results = vec![run_once(Mode::Plain, a, &preload, Some(&input), interval)?];
    if use_preload {
        results.push(run_once(Mode::Pagefold, a, &preload, Some(&input), interval)?);
    }
    if unsafe { libc::geteuid() } == 0 {
        match run_ksm(a, &preload, &input, interval) {
            Ok(r) => results.push(r),
            Err(e) => eprintln!("pagefold run: KSM comparison skipped: {e}"),
        }
    }
    let last = results.iter().find(|r| r.mode == Mode::Pagefold).unwrap_or(&results[0]);
    std::io::stdout().write_all(last.stdout.as_deref().unwrap_or_default()).map_err(|e| e.to_string())?;
    let identical = results.windows(2).all(|w| w[0].stdout == w[1].stdout && w[0].exit_code == w[1].exit_code);
    let refs: Vec<_> = results.iter().map(RunResult::summary_ref).collect();
    emit(a, &refs, identical)?;
    if !identical {
        eprintln!("pagefold run: outputs or exit codes differ between runs");
        return Ok(3);
    }
    Ok(last.exit_code)
}

fn run_ksm(a: &Args, preload: &Path, input: &[u8], interval: Duration) -> Result<RunResult, String> {
    let guard = pagefold_bench::ksm::KsmGuard::acquire()?;
    for (k, v) in [("pages_to_scan", "1000"), ("sleep_millisecs", "20"), ("run", "1")] {
        guard.set(k, v).map_err(|e| format!("setting KSM {k}: {e}"))?;
    }
    let ksmd0 = ksmd_cpu();
    let mut r = run_once(Mode::Ksm, a, preload, Some(input), interval)?;
    r.ksmd_cpu_s = ksmd0.zip(ksmd_cpu()).map(|(a, b)| (b - a).as_secs_f64());
    Ok(r)
}

fn ksmd_cpu() -> Option<Duration> {
    let pid = pagefold_bench::timing::find_pid_by_comm("ksmd")?;
    pagefold_bench::timing::pid_cpu(pid)
}

/// One run of the command. `input` given: stdin is fed from it and stdout
/// captured (comparison mode); otherwise stdio is inherited.
fn run_once(mode: Mode, a: &Args, preload: &Path, input: Option<&[u8]>, interval: Duration) -> Result<RunResult, String> {
    let reports = tempdir()?;
    let mut cmd = Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..]);
    if mode == Mode::Pagefold {
        let mut ld = preload.as_os_str().to_owned();
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            ld.push(":");
            ld.push(old);
        }
        cmd.env("LD_PRELOAD", ld).env("PAGEFOLD_REPORT", reports.join("engine"));
    }
    if mode == Mode::Ksm {
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
    }
    if input.is_some() {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    }
    let t0 = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("{}: {e}", a.cmd[0]))?;
    let pid = child.id();
    let sampler = Sampler::spawn(pid, interval, true);
    let feeder = child.stdin.take().map(|mut w| {
        let data = input.unwrap_or_default().to_vec();
        std::thread::spawn(move || {
            let _ = w.write_all(&data);
        })
    });
    let reader = child.stdout.take().map(|mut out| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = out.read_to_end(&mut buf);
            buf
        })
    });
    let (status, cpu) = wait_with_rusage(pid)?;
    let wall = t0.elapsed();
    let series = sampler.stop();
    if let Some(f) = feeder {
        let _ = f.join();
    }
    let stdout = reader.map(|r| r.join().unwrap_or_default());
    let engine = read_reports(&reports);
    let _ = std::fs::remove_dir_all(&reports);
    let s = &series.summary;
    Ok(RunResult {
        mode,
        exit_code: status,
        wall_s: wall.as_secs_f64(),
        cpu_s: cpu.as_secs_f64(),
        ksmd_cpu_s: None,
        peak_bytes: s.peak_bytes,
        average_bytes: s.average_bytes,
        samples: s.samples,
        method: s.method.map(|m| format!("{m:?}").to_lowercase()).unwrap_or_else(|| "none".into()),
        engine,
        timeline: timeline(&series),
        stdout,
    })
}

fn timeline(series: &Series) -> Vec<(u64, u64)> {
    series.samples.iter().map(|f| (f.timestamp_ms, f.footprint_bytes)).collect()
}

/// Waits for `pid`; its exit code (128 + signal if killed, as shells do) and
/// the CPU time of it and every descendant it waited for.
fn wait_with_rusage(pid: u32) -> Result<(i32, Duration), String> {
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
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
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 128 + libc::WTERMSIG(status) };
    Ok((code, tv(ru.ru_utime) + tv(ru.ru_stime)))
}

fn read_reports(dir: &Path) -> Vec<Value> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
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

fn read_stdin_if_piped() -> Vec<u8> {
    let mut buf = Vec::new();
    if unsafe { libc::isatty(0) } == 0 {
        let _ = std::io::stdin().read_to_end(&mut buf);
    }
    buf
}

/// The preload library: the option, PAGEFOLD_PRELOAD, or beside this program.
fn find_preload(opt: Option<&Path>) -> Result<PathBuf, String> {
    let candidate = match (opt, std::env::var_os("PAGEFOLD_PRELOAD")) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => {
            let exe = std::env::current_exe().map_err(|e| format!("locating pagefold: {e}"))?;
            exe.with_file_name("libpagefold_preload.so")
        }
    };
    if !candidate.is_file() {
        return Err(format!(
            "preload library {} not found (build it with `cargo build --release -p pagefold-preload`, or pass --preload)",
            candidate.display()
        ));
    }
    candidate.canonicalize().map_err(|e| format!("{}: {e}", candidate.display()))
}

/// `name` as the shell would find it.
fn resolve(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// True unless `path` is an ELF file without a program interpreter (static):
/// scripts run an interpreter that is itself checked by the kernel, not us.
fn is_dynamic(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else { return true };
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return true;
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into().unwrap_or_default()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count).any(|i| {
        let o = phoff + i * size;
        bytes.get(o..o + 4).is_some_and(|t| u32::from_le_bytes(t.try_into().unwrap_or_default()) == 3)
    })
}

/// What the report shows of a run.
#[derive(Serialize)]
struct Summary<'a> {
    #[serde(flatten)]
    run: &'a RunResult,
    engine_total: Value,
}

impl RunResult {
    fn summary_ref(&self) -> Summary<'_> {
        Summary { run: self, engine_total: engine_total(&self.engine) }
    }
}

/// The engine counters summed over every process that used it.
fn engine_total(reports: &[Value]) -> Value {
    let mut total = serde_json::Map::new();
    for r in reports {
        let Some(stats) = r["stats"].as_object() else { continue };
        add_numbers(&mut total, stats);
    }
    Value::Object(total)
}

fn add_numbers(total: &mut serde_json::Map<String, Value>, stats: &serde_json::Map<String, Value>) {
    for (k, v) in stats {
        match v {
            Value::Number(n) => {
                let sum = total.get(k).and_then(Value::as_u64).unwrap_or(0) + n.as_u64().unwrap_or(0);
                total.insert(k.clone(), sum.into());
            }
            Value::Object(inner) => {
                let mut sub = total.get(k).and_then(Value::as_object).cloned().unwrap_or_default();
                add_numbers(&mut sub, inner);
                total.insert(k.clone(), Value::Object(sub));
            }
            _ => {}
        }
    }
}

fn emit(a: &Args, runs: &[Summary], identical: bool) -> Result<(), String> {
    let text = if a.json {
        serde_json::to_string_pretty(&serde_json::json!({ "command": a.cmd, "runs": runs, "outputs_identical": identical }))
            .map_err(|e| e.to_string())?
    } else {
        table(runs, a.compare.then_some(identical))
    };
    match &a.report {
        Some(path) => std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display())),
        None => {
            eprintln!("{text}");
            Ok(())
        }
    }
}

fn table(runs: &[Summary], identical: Option<bool>) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let base = &runs[0].run;
    let mut out = String::from("pagefold run report (footprint = distinct physical pages of the process tree)\n");
    out += &format!("{:<28}", "");
    for r in runs {
        out += &format!("{:>14}", format!("{:?}", r.run.mode).to_lowercase());
    }
    out.push('\n');
    let mut row = |name: &str, f: &dyn Fn(&RunResult) -> String| {
        out += &format!("{name:<28}");
        for r in runs {
            out += &format!("{:>14}", f(r.run));
        }
        out.push('\n');
    };
    row("peak footprint (MiB)", &|r| format!("{:.1}", mib(r.peak_bytes)));
    row("average footprint (MiB)", &|r| format!("{:.1}", mib(r.average_bytes)));
    if runs.len() > 1 {
        row("average vs first", &|r| format!("{:.3}", r.average_bytes as f64 / base.average_bytes.max(1) as f64));
    }
    row("wall time (s)", &|r| format!("{:.2}", r.wall_s));
    row("CPU time (s)", &|r| format!("{:.2}", r.cpu_s));
    row("+ ksmd CPU (s)", &|r| r.ksmd_cpu_s.map_or("-".into(), |c| format!("{c:.2}")));
    row("exit code", &|r| r.exit_code.to_string());
    row("samples", &|r| format!("{} ({})", r.samples, r.method));
    for r in runs.iter().filter(|r| !r.run.engine.is_empty()) {
        let t = &r.engine_total;
        let n = |k: &str| t[k].as_u64().unwrap_or(0);
        out += &format!(
            "engine ({} processes): {} pages shared by copy, {} zero pages folded, {} pages merged, \
             {} frames released after divergence, {:.1} MiB copied plainly, {} scans ({:.2} s CPU), \
             fallbacks: memfd {} mmap {} vma {} uffd {} frames {}\n",
            r.run.engine.len(),
            n("pages_shared_by_copy"),
            n("zero_folded"),
            n("merged"),
            n("diverged_released"),
            n("bytes_copied_plain") as f64 / (1024.0 * 1024.0),
            n("scans"),
            n("scan_cpu_ns") as f64 / 1e9,
            t["fallbacks"]["memfd"].as_u64().unwrap_or(0),
            t["fallbacks"]["mmap"].as_u64().unwrap_or(0),
            t["fallbacks"]["vma_budget"].as_u64().unwrap_or(0),
            t["fallbacks"]["uffd"].as_u64().unwrap_or(0),
            t["fallbacks"]["frames"].as_u64().unwrap_or(0),
        );
    }
    if let Some(same) = identical {
        out += if same { "outputs: byte-identical in every run\n" } else { "outputs: DIFFER between runs\n" };
    }
    out
}
