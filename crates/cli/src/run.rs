//! `pagefold run [options] -- CMD ARGS...`: runs an unmodified program with the
//! preload library, passes stdin, stdout, stderr and the exit status through,
//! samples the true footprint of its whole process tree, and reports at exit.
//!
//! With `--compare` the same command also runs plain (and, as root, under
//! kernel KSM with its knobs restored afterwards), one after the other with
//! the same input; outputs are captured and must be byte-identical, and the
//! report puts all runs side by side; with `--sharing-limit` one more plain
//! run reads what sharing could reach at best on the program, and the
//! report says how much of it pagefold captured. The report goes to stderr (or
//! `--report FILE`) so the program's stdout stays its own; with `--json` it
//! is a document whose `"schema"` is [`SCHEMA`].
//!
//! Before the program starts, one line on stderr says so if the engine will
//! run without a mechanism it has by default (userfaultfd refused, a kernel
//! feature missing; `pagefold doctor` explains).

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use pagefold_bench::cgroup::MemoryCgroup;
use pagefold_bench::ksm::KsmGuard;
use pagefold_bench::program::{self, engine_total, Config, Invocation, Outcome};
use pagefold_bench::sharing_limit;
use serde::Serialize;
use serde_json::Value;

/// The `"schema"` of `pagefold run --json`.
const SCHEMA: &str = "pagefold-run/1";

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
    /// Draw memory over time (every run of --compare on one chart) into FILE.png.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Serve the program's fresh frames only from pages of these DRAM banks
    /// (`0-7,12`; sets PAGEFOLD_BANKS, see `pagefold banks` and docs/CONFIG.md).
    #[arg(long, value_name = "SET")]
    pub banks: Option<String>,
    /// The bank map for --banks: a table entry or hex masks (default: the
    /// entry assumed for this CPU; sets PAGEFOLD_BANK_FUNCTIONS).
    #[arg(long, value_name = "MAP", requires = "banks")]
    pub bank_functions: Option<String>,
    /// Let the engine hand blocks of scattered duplicates to kernel KSM
    /// while ksmd runs (sets PAGEFOLD_KSM=1; ksmd then merges them with
    /// equal pages of other processes, see docs/MECHANISMS.md).
    #[arg(long)]
    pub ksm: bool,
    /// The memory the program may use (`4G`, `512M`; K/M/G/T are powers of
    /// 1024): sets PAGEFOLD_MEMORY, which pressure-driven tiering keeps
    /// under, and as root with a cgroup v1 memory controller runs the
    /// program in a fresh memory cgroup limited to it.
    #[arg(long, value_name = "BYTES")]
    pub memory: Option<String>,
    /// With --compare, run CMD plain once more, reading its sharing limit
    /// (the footprint with every zero page and repeated anonymous content
    /// folded) at most twice a second, and report the share of it pagefold
    /// captured. Needs root; the reading slows that run.
    #[arg(long, requires = "compare")]
    pub sharing_limit: bool,
    /// The command and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "CMD"
    )]
    pub cmd: Vec<String>,
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

fn config(name: &str) -> Config {
    program::parse_config(name).expect("built-in configuration")
}

fn run_checked(a: &Args) -> Result<i32, String> {
    if let Some(set) = &a.banks {
        let functions = a.bank_functions.as_deref();
        pagefold_banks::colour::Colouring::parse(set, functions)
            .map_err(|e| format!("--banks: {e}"))?;
        // The children inherit it; the preload's engine reads it (docs/CONFIG.md).
        std::env::set_var("PAGEFOLD_BANKS", set);
        if let Some(f) = functions {
            std::env::set_var("PAGEFOLD_BANK_FUNCTIONS", f);
        }
    }
    if a.ksm {
        std::env::set_var("PAGEFOLD_KSM", "1");
    }
    let memory = memory_limit(a)?;
    let preload = program::find_preload(a.preload.as_deref())?;
    let exe =
        program::resolve(&a.cmd[0]).ok_or_else(|| format!("{}: command not found", a.cmd[0]))?;
    let use_preload = program::is_dynamic(&exe);
    if !use_preload {
        eprintln!(
            "pagefold run: {} is statically linked (no dynamic loader): it runs without pagefold",
            exe.display()
        );
    } else if let Some(warning) =
        crate::doctor::degraded_warning(&pagefold_engine::Config::from_env())
    {
        eprintln!("{warning}");
    }
    if let Some(p) = &a.plot {
        // Fail before the program runs, not after.
        pagefold_bench::plot::check_target(p)?;
    }
    let interval = Duration::from_millis(a.interval.max(1));
    let mut inv = Invocation {
        cmd: &a.cmd,
        preload: &preload,
        input: None,
        interval,
        timeout: None,
    };
    let grouped = a.memory.is_some() && memory.is_some_and(cgroup_possible);
    let in_group = |inv: &Invocation, c: &Config| {
        if !grouped {
            return program::run(inv, c, None);
        }
        // A fresh group for each run: its usage is that run's alone.
        let g = MemoryCgroup::create(memory).map_err(|e| format!("--memory: {e}"))?;
        let r = program::run_in(inv, c, None, Some(&g));
        g.remove()?;
        r
    };
    if !a.compare {
        let r = in_group(
            &inv,
            &config(if use_preload { "pagefold" } else { "plain" }),
        )?;
        emit(a, &[r.summary_ref()], None)?;
        plot(a, std::slice::from_ref(&r))?;
        return Ok(r.exit_code);
    }
    let input = read_stdin_if_piped();
    inv.input = Some(&input);
    let mut results = vec![in_group(&inv, &config("plain"))?];
    if use_preload {
        results.push(in_group(&inv, &config("pagefold"))?);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        match KsmGuard::acquire().and_then(|g| program::run(&inv, &config("ksm-1000"), Some(&g))) {
            Ok(r) => results.push(r),
            Err(e) => eprintln!("pagefold run: KSM comparison skipped: {e}"),
        }
    }
    if a.sharing_limit {
        results.push(in_group(&inv, &config(sharing_limit::CONFIG))?);
    }
    let last = results
        .iter()
        .find(|r| r.config == "pagefold")
        .unwrap_or(&results[0]);
    std::io::stdout()
        .write_all(last.stdout.as_deref().unwrap_or_default())
        .map_err(|e| e.to_string())?;
    std::io::stderr()
        .write_all(last.stderr.as_deref().unwrap_or_default())
        .map_err(|e| e.to_string())?;
    let identical = results
        .windows(2)
        .all(|w| w[0].stdout == w[1].stdout && w[0].exit_code == w[1].exit_code);
    let refs: Vec<_> = results.iter().map(Outcome::summary_ref).collect();
    emit(a, &refs, Some(identical))?;
    plot(a, &results)?;
    if !identical {
        eprintln!("pagefold run: outputs or exit codes differ between runs");
        return Ok(3);
    }
    Ok(last.exit_code)
}

/// The limit of `--memory`, or of PAGEFOLD_MEMORY if it is set, checked
/// (one line on what is wrong) and handed to the program as PAGEFOLD_MEMORY.
fn memory_limit(a: &Args) -> Result<Option<u64>, String> {
    let (what, text) = match (&a.memory, std::env::var("PAGEFOLD_MEMORY")) {
        (Some(m), _) => ("--memory", m.clone()),
        (None, Ok(m)) => ("PAGEFOLD_MEMORY", m),
        (None, Err(_)) => return Ok(None),
    };
    let bytes =
        pagefold_engine::memlimit::parse_bytes(&text).map_err(|e| format!("{what}: {e}"))?;
    std::env::set_var("PAGEFOLD_MEMORY", bytes.to_string());
    Ok(Some(bytes))
}

/// Whether runs under `bytes` can get a memory cgroup of their own; where
/// none can be made, the limit is the engine's alone (said in one line).
fn cgroup_possible(bytes: u64) -> bool {
    let why = pagefold_bench::cgroup::check_available().err();
    if let Some(why) = &why {
        eprintln!(
            "pagefold run: no memory cgroup of {} MiB ({why}): the engine keeps to it alone",
            bytes >> 20
        );
    }
    why.is_none()
}

fn plot(a: &Args, runs: &[Outcome]) -> Result<(), String> {
    let Some(path) = &a.plot else { return Ok(()) };
    let series: Vec<_> = runs
        .iter()
        .map(|r| (r.config.clone(), r.timeline.clone()))
        .collect();
    let title = format!("pagefold run: {}", a.cmd.join(" "));
    pagefold_bench::plot::memory_over_time(path, &title, &series)?;
    eprintln!("pagefold run: memory over time drawn in {}", path.display());
    Ok(())
}

fn read_stdin_if_piped() -> Vec<u8> {
    let mut buf = Vec::new();
    if !std::io::stdin().is_terminal() {
        let _ = std::io::stdin().read_to_end(&mut buf);
    }
    buf
}

/// What the report shows of a run.
#[derive(Serialize)]
struct Summary<'a> {
    #[serde(flatten)]
    run: &'a Outcome,
    engine_total: Value,
}

trait SummaryRef {
    fn summary_ref(&self) -> Summary<'_>;
}

impl SummaryRef for Outcome {
    fn summary_ref(&self) -> Summary<'_> {
        Summary {
            run: self,
            engine_total: engine_total(&self.engine),
        }
    }
}

fn emit(a: &Args, runs: &[Summary], identical: Option<bool>) -> Result<(), String> {
    let text = if a.json {
        json(&a.cmd, runs, identical).map_err(|e| e.to_string())?
    } else {
        table(runs, identical)
    };
    match &a.report {
        Some(path) => {
            std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
        }
        None => {
            eprintln!("{text}");
            Ok(())
        }
    }
}

/// The `--json` report: the command, each run, and (with `--compare`)
/// whether all runs printed the same.
fn json(cmd: &[String], runs: &[Summary], identical: Option<bool>) -> serde_json::Result<String> {
    let body = serde_json::json!({ "command": cmd, "runs": runs, "outputs_identical": identical });
    pagefold_measure::schema::pretty(SCHEMA, &body)
}

fn table(runs: &[Summary], identical: Option<bool>) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let base = &runs[0].run;
    let mut out = String::from(
        "pagefold run report (footprint = distinct physical pages of the process tree)\n",
    );
    out += &format!("{:<28}", "");
    for r in runs {
        out += &format!("{:>14}", r.run.config.clone());
    }
    out.push('\n');
    let mut row = |name: &str, f: &dyn Fn(&Outcome) -> String| {
        out += &format!("{name:<28}");
        for r in runs {
            out += &format!("{:>14}", f(r.run));
        }
        out.push('\n');
    };
    row("peak footprint (MiB)", &|r| {
        format!("{:.1}", mib(r.peak_bytes))
    });
    row("average footprint (MiB)", &|r| {
        format!("{:.1}", mib(r.average_bytes))
    });
    if runs.len() > 1 {
        row("average vs first", &|r| {
            format!(
                "{:.3}",
                r.average_bytes as f64 / base.average_bytes.max(1) as f64
            )
        });
    }
    row("wall time (s)", &|r| format!("{:.2}", r.wall_s));
    row("CPU time (s)", &|r| format!("{:.2}", r.cpu_s));
    row("+ ksmd CPU (s)", &|r| {
        r.ksmd_cpu_s.map_or("-".into(), |c| format!("{c:.2}"))
    });
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
        let clock = &t["clock"];
        if clock["passes"].as_u64().unwrap_or(0) > 0 {
            let c = |k: &str| clock["total"][k].as_u64().unwrap_or(0);
            out += &format!(
                "tiering: {} clock passes (page looks C1 {} C2 {} C3 {} C4 {}), {} pages evicted by the policy, \
                 {} restored on touch, {} evicted now, {} pressure passes, evict fallbacks {}\n",
                clock["passes"].as_u64().unwrap_or(0),
                c("c1"),
                c("c2"),
                c("c3"),
                c("c4"),
                c("evicted"),
                n("restored"),
                n("evicted_now"),
                clock["pressure_passes"].as_u64().unwrap_or(0),
                t["fallbacks"]["evict"].as_u64().unwrap_or(0),
            );
        }
    }
    out += &limit_line(runs);
    if let Some(same) = identical {
        out += if same {
            "outputs: byte-identical in every run\n"
        } else {
            "outputs: DIFFER between runs\n"
        };
    }
    out
}

/// What a `sharing-limit` run read, and the share of it pagefold captured
/// against the first run (plain); empty without such a run.
fn limit_line(runs: &[Summary]) -> String {
    let Some((limited, limit)) = runs.iter().find_map(|r| {
        let l = r.run.limit_average_bytes?;
        Some((r.run, l as f64 / r.run.average_bytes.max(1) as f64))
    }) else {
        return String::new();
    };
    let mut out = format!(
        "sharing limit: {:.3} of the footprint ({:.1} MiB on average, read in a run of its own)",
        limit,
        limited.limit_average_bytes.unwrap_or(0) as f64 / (1024.0 * 1024.0)
    );
    let base = runs[0].run.average_bytes.max(1) as f64;
    if let Some(pf) = runs.iter().find(|r| r.run.config == "pagefold") {
        let ratio = pf.run.average_bytes as f64 / base;
        out += &match sharing_limit::captured(ratio, limit) {
            Some(share) => format!("; pagefold captured {:.0}% of it", share * 100.0),
            None => "; too little to share for a captured share to mean much".to_string(),
        };
    }
    out + "\n"
}
