//! `pagefold analyze`: arguments, the run, and the one rule for failures —
//! one line `pagefold analyze: <what went wrong>` on stderr and exit code 2,
//! never a panic or a backtrace (a panic hook turns even an internal bug into
//! such a line). The `pagefold` binary and this crate's own
//! `pagefold-analyze` binary (used by the tests) both call [`run`].

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::image::Kind;
use crate::read::{self, FileFormat, Filter, Target};
use crate::{analyze, delta::Encoder, Options, Progress, SimilarityConfig};

pub const EXIT_FAILURE: i32 = 2;

/// What could sharing, patching, compression and deduplication save on this
/// process or memory image?
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// PIDs (several: in-process vs cross-process sharing), raw memory images
    /// (size a multiple of 4096) or ELF core files (e.g. from gcore).
    #[arg(value_name = "PID|IMAGE|CORE", required = true)]
    pub targets: Vec<String>,
    /// How to read files: auto (ELF magic means core), raw or core.
    #[arg(long, value_name = "FORMAT", default_value = "auto")]
    pub format: String,
    /// Only these mapping kinds of processes and cores: anon,file,heap,stack.
    #[arg(long, value_name = "KINDS", value_delimiter = ',')]
    pub kind: Vec<String>,
    /// Only pages in START-END (virtual addresses; file offsets for raw
    /// images; 0x for hex). May be repeated.
    #[arg(long = "range", value_name = "START-END")]
    pub ranges: Vec<String>,
    /// Take two snapshots SECS apart and classify pages by behaviour (PIDs only).
    #[arg(long, value_name = "SECS")]
    pub interval: Option<f64>,
    /// Run only these analyses: sharing, patching, characterize, comparisons,
    /// codecs, dedup, fingerprints (breakdown = sharing + patching).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip these analyses (same names as --only).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub skip: Vec<String>,
    /// HashSimilarityDetector parameters k,s.
    #[arg(long, value_name = "K,S", default_value = "2,1")]
    pub hsd: String,
    /// Candidates kept per similarity bucket (c).
    #[arg(long, value_name = "C", default_value_t = 1)]
    pub candidates: usize,
    /// Bytes per similarity block.
    #[arg(long, value_name = "BYTES", default_value_t = 64)]
    pub sim_block: usize,
    /// Largest patch worth keeping, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 2048)]
    pub patch_cutoff: usize,
    /// Delta encoder for patches: zstd-ref, xor-lz4, xor-zstd or runs.
    #[arg(long, value_name = "ENCODER", default_value = "zstd-ref")]
    pub patch_encoder: String,
    /// MiB of the image the codec study samples.
    #[arg(long, value_name = "MIB", default_value_t = 8.0)]
    pub codec_sample: f64,
    /// Block sizes of the codec study, in KiB.
    #[arg(
        long,
        value_name = "KIB,...",
        value_delimiter = ',',
        default_value = "4,8,16,32,64,128"
    )]
    pub codec_blocks: Vec<usize>,
    /// MiB of the image the dedup study samples.
    #[arg(long, value_name = "MIB", default_value_t = 256.0)]
    pub dedup_sample: f64,
    /// Also report a sample of page fingerprints: the non-zero pages whose
    /// content hash is a multiple of RATE (one page in RATE), to estimate
    /// sharing between processes read apart (`--only fingerprints`: nothing else).
    #[arg(long, value_name = "RATE")]
    pub fingerprints: Option<u64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write PNG charts into DIR.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Runs `pagefold analyze` with stdout/stderr; returns the exit code.
pub fn run(args: Args) -> i32 {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "pagefold analyze: internal error: {}{at}",
            msg.replace('\n', " ")
        );
        std::process::exit(EXIT_FAILURE);
    }));
    // Unlocked handles: progress bars write to stderr from their own thread
    // while the run goes on.
    run_to(&args, &mut std::io::stdout(), &mut std::io::stderr())
}

/// [`run`] writing to the given streams (for tests).
pub fn run_to(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    match run_checked(args, out, err) {
        Ok(()) => 0,
        Err(e) => {
            let _ = writeln!(err, "pagefold analyze: {}", one_line(&e.to_string()));
            EXIT_FAILURE
        }
    }
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// Options and inputs parsed from the arguments.
pub struct Plan {
    pub targets: Vec<Target>,
    pub format: FileFormat,
    pub filter: Filter,
    pub interval: Option<Duration>,
    pub options: Options,
}

pub fn plan(a: &Args) -> Result<Plan> {
    let targets = a
        .targets
        .iter()
        .map(|t| Target::parse(t))
        .collect::<Result<Vec<_>>>()?;
    let format = match a.format.as_str() {
        "auto" => FileFormat::Auto,
        "raw" | "image" => FileFormat::Raw,
        "core" | "elf" => FileFormat::Core,
        f => {
            return Err(Error::Usage(format!(
                "unknown --format {f} (auto, raw or core)"
            )))
        }
    };
    let kinds = if a.kind.is_empty() {
        None
    } else {
        Some(
            a.kind
                .iter()
                .map(|k| {
                    Kind::parse(k.trim()).ok_or_else(|| {
                        Error::Usage(format!(
                            "unknown mapping kind {k} (anon, file, heap, stack)"
                        ))
                    })
                })
                .collect::<Result<Vec<_>>>()?,
        )
    };
    let ranges = a
        .ranges
        .iter()
        .map(|r| parse_range(r))
        .collect::<Result<Vec<_>>>()?;
    let interval = match a.interval {
        None => None,
        Some(s) if s.is_finite() && (0.0..=86400.0).contains(&s) => {
            Some(Duration::from_secs_f64(s))
        }
        Some(s) => {
            return Err(Error::Usage(format!(
                "--interval {s}: give seconds between 0 and 86400"
            )))
        }
    };
    let mut o = Options::default();
    let names = [
        "sharing",
        "patching",
        "characterize",
        "comparisons",
        "codecs",
        "dedup",
        "fingerprints",
        "breakdown",
    ];
    for n in a.only.iter().chain(&a.skip) {
        if !names.contains(&n.as_str()) {
            return Err(Error::Usage(format!(
                "unknown analysis {n} (one of {})",
                names.join(", ")
            )));
        }
    }
    let on = |name: &str| {
        let listed = |l: &Vec<String>| {
            l.iter().any(|x| {
                x == name || (x == "breakdown" && (name == "sharing" || name == "patching"))
            })
        };
        (a.only.is_empty() || listed(&a.only)) && !listed(&a.skip)
    };
    o.sharing = on("sharing") || (on("patching") && !a.skip.iter().any(|x| x == "sharing"));
    o.patching = on("patching");
    o.characterize = on("characterize");
    o.comparisons = on("comparisons");
    o.codecs = on("codecs");
    o.dedup = on("dedup");
    let skipped = a.skip.iter().any(|x| x == "fingerprints");
    o.fingerprints = fingerprint_rate(a, !skipped)?;
    let (k, s) = a
        .hsd
        .split_once(',')
        .and_then(|(k, s)| Some((k.trim().parse().ok()?, s.trim().parse().ok()?)))
        .ok_or_else(|| Error::Usage(format!("--hsd {}: give K,S (e.g. 2,1)", a.hsd)))?;
    o.similarity = SimilarityConfig {
        k,
        s,
        candidates: a.candidates,
        block: a.sim_block,
        cutoff: a.patch_cutoff,
        encoder: Encoder::parse(&a.patch_encoder).ok_or_else(|| {
            Error::Usage(format!(
                "unknown --patch-encoder {} (zstd-ref, xor-lz4, xor-zstd, runs)",
                a.patch_encoder
            ))
        })?,
        ..SimilarityConfig::default()
    };
    o.similarity.check().map_err(Error::Usage)?;
    let mib = |x: f64, what: &str| -> Result<usize> {
        if x.is_finite() && x > 0.0 && x < (1u64 << 24) as f64 {
            Ok(((x * (1u64 << 20) as f64) as usize).max(crate::PAGE))
        } else {
            Err(Error::Usage(format!(
                "{what} {x}: give a positive number of MiB"
            )))
        }
    };
    o.codec_sample = mib(a.codec_sample, "--codec-sample")?;
    o.dedup_sample = mib(a.dedup_sample, "--dedup-sample")?;
    if a.codec_blocks.is_empty() || a.codec_blocks.iter().any(|&b| b == 0 || b > 1 << 20) {
        return Err(Error::Usage(
            "--codec-blocks: give sizes in KiB, 1..1048576".into(),
        ));
    }
    o.codec_blocks = a.codec_blocks.iter().map(|b| b * 1024).collect();
    Ok(Plan {
        targets,
        format,
        filter: Filter { kinds, ranges },
        interval,
        options: o,
    })
}

/// The sampling rate of `--fingerprints`, checked (None when not given or
/// skipped); `--only fingerprints` without a rate is a usage error.
fn fingerprint_rate(a: &Args, wanted: bool) -> Result<Option<u64>> {
    let only_these = a.only.iter().any(|x| x == "fingerprints");
    match a.fingerprints {
        None if only_these => Err(Error::Usage(
            "--only fingerprints needs --fingerprints RATE".into(),
        )),
        None => Ok(None),
        Some(r) if (1..=crate::fingerprints::MAX_RATE).contains(&r) => Ok(wanted.then_some(r)),
        Some(r) => Err(Error::Usage(format!(
            "--fingerprints {r}: give a rate between 1 and {}",
            crate::fingerprints::MAX_RATE
        ))),
    }
}

fn parse_num(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn parse_range(r: &str) -> Result<(u64, u64)> {
    let bad = || {
        Error::Usage(format!(
            "--range {r}: give START-END, e.g. 0x7f0000000000-0x7f0000100000"
        ))
    };
    let (a, b) = r.split_once('-').ok_or_else(bad)?;
    let (a, b) = (parse_num(a).ok_or_else(bad)?, parse_num(b).ok_or_else(bad)?);
    if b <= a {
        return Err(bad());
    }
    Ok((a, b))
}

fn run_checked(a: &Args, out: &mut dyn Write, err: &mut dyn Write) -> Result<()> {
    let plan = plan(a)?;
    let progress = Progress::new(a.quiet);
    let compute = || -> Result<crate::Report> {
        let image = read::read_targets(
            &plan.targets,
            plan.format,
            &plan.filter,
            plan.interval,
            &progress,
        )?;
        analyze(&image, &plan.options, &progress)
    };
    let report = match a.threads {
        None => compute()?,
        Some(0) => return Err(Error::Usage("--threads must be at least 1".into())),
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build()
            .map_err(|e| Error::Usage(format!("cannot start {n} threads: {e}")))?
            .install(compute)?,
    };
    if let Some(dir) = &a.plot {
        let files = crate::plot::plot_all(&report, dir)?;
        if !a.json {
            let _ = writeln!(
                err,
                "pagefold analyze: wrote {} charts to {}",
                files.len(),
                dir.display()
            );
        }
    }
    let text = if a.json {
        crate::report::json(&report)
            .map_err(|e| Error::Usage(format!("cannot encode JSON: {e}")))?
    } else {
        crate::report::text(&report)
    };
    // A closed stdout (e.g. `| head`) is not an error worth a message.
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    Ok(())
}
