//! pagefold-synth: synthetic workloads for `pagefold bench --suite synthetic`.
//! Each subcommand is a small program that uses memory the way the R and
//! Python workloads do, but in one mechanism at a time and without needing R
//! or Python: a large array passed by value (copied and slightly modified
//! generation after generation), mostly-zero buffers, the same content
//! loaded several times, and a mix of the three. It is an ordinary,
//! dynamically linked program that knows nothing of the engine: it allocates
//! with glibc's malloc/calloc/free and copies with glibc's memcpy, so under
//! `pagefold run` the preload sees exactly what it would see in any C
//! program. Every workload holds its memory for seconds (average footprint
//! is what the suite compares), is deterministic (seeded generator), reads
//! all the data it keeps, and prints a checksum that must be byte-identical
//! under every configuration.
//!
//! The `de-*` workloads are Difference Engine's micro-benchmark (see `de`),
//! run by `pagefold bench --suite de`; `list` names the synthetic suite's
//! workloads, `list de` these.

pub mod buffer;
pub mod copies;
pub mod de;
pub mod digest;
pub mod duplicates;
pub mod mixed;
pub mod pace;
pub mod rng;
pub mod scattered;
pub mod zeros;

use std::io::Write;

/// The seed used unless `--seed` says otherwise.
pub const DEFAULT_SEED: u64 = 0x5eed_f01d;
/// Largest `--scale`: the default sizes times this stay within a few GiB.
pub const MAX_SCALE: f64 = 16.0;
/// Longest `--hold` and `--idle`, in seconds.
pub const MAX_HOLD: f64 = 3600.0;

/// The workloads, as subcommands are named.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    Copies,
    Zeros,
    Duplicates,
    Mixed,
    Scattered,
    DeZero,
    DeRandom,
    DeIdentical,
    DeSimilar,
}

impl Workload {
    pub const ALL: [Workload; 9] = [
        Workload::Copies,
        Workload::Zeros,
        Workload::Duplicates,
        Workload::Mixed,
        Workload::Scattered,
        Workload::DeZero,
        Workload::DeRandom,
        Workload::DeIdentical,
        Workload::DeSimilar,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Copies => "copies",
            Workload::Zeros => "zeros",
            Workload::Duplicates => "duplicates",
            Workload::Mixed => "mixed",
            Workload::Scattered => "scattered",
            Workload::DeZero => "de-zero",
            Workload::DeRandom => "de-random",
            Workload::DeIdentical => "de-identical",
            Workload::DeSimilar => "de-similar",
        }
    }

    /// The suite of `pagefold bench` that runs it: "synthetic" or "de".
    pub fn suite(self) -> &'static str {
        match self {
            Workload::DeZero | Workload::DeRandom | Workload::DeIdentical | Workload::DeSimilar => {
                "de"
            }
            _ => "synthetic",
        }
    }

    pub fn about(self) -> &'static str {
        match self {
            Workload::Copies => "a large array copied (memcpy) generation after generation, each copy modified in a few percent of its pages",
            Workload::Zeros => "mostly-zero tables (calloc, malloc+memset) updated sparsely, and a buffer cleared for reuse",
            Workload::Duplicates => "the same content generated independently into several buffers (no memcpy), plus unique buffers",
            Workload::Mixed => "copies, zero-filled results and duplicated tables in one program",
            Workload::Scattered => "a table whose pages are half copies of 1,000 contents at random places, then idle (no memcpy; merging one page at a time)",
            Workload::DeZero => "Difference Engine's micro-benchmark on zero pages: alloc, read, write 16 bytes a page, free, idle between",
            Workload::DeRandom => "Difference Engine's micro-benchmark on random pages (nothing to share, patch or compress)",
            Workload::DeIdentical => "Difference Engine's micro-benchmark on identical pages (one random page repeated)",
            Workload::DeSimilar => "Difference Engine's micro-benchmark on 95%-similar pages (a random page, the rest it with 5% of bytes replaced)",
        }
    }
}

/// How big and how long.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Smaller sizes and less work, for CI.
    pub quick: bool,
    /// Multiplies every size and the work done on it.
    pub scale: f64,
    pub seed: u64,
    /// Seconds over which `zeros` and `duplicates` spread their work at
    /// least (see `pace`); None: 6, or 4 with `quick`.
    pub hold: Option<f64>,
    /// Seconds of each idle period of the `de-*` workloads; None: 10, or 3
    /// with `quick` (see `de`).
    pub idle: Option<f64>,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            quick: false,
            scale: 1.0,
            seed: DEFAULT_SEED,
            hold: None,
            idle: None,
        }
    }
}

impl Params {
    /// Checks what a user can get wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.scale > 0.0 && self.scale <= MAX_SCALE) {
            return Err(format!(
                "--scale must be more than 0 and at most {MAX_SCALE}, not {}",
                self.scale
            ));
        }
        if let Some(h) = self.hold.filter(|h| !(0.0..=MAX_HOLD).contains(h)) {
            return Err(format!("--hold must be 0 to {MAX_HOLD} seconds, not {h}"));
        }
        if let Some(i) = self.idle.filter(|i| !(0.0..=MAX_HOLD).contains(i)) {
            return Err(format!("--idle must be 0 to {MAX_HOLD} seconds, not {i}"));
        }
        Ok(())
    }

    /// How long each idle period of the `de-*` workloads lasts.
    pub fn idle(&self) -> std::time::Duration {
        let default = if self.quick {
            de::QUICK_IDLE
        } else {
            de::DEFAULT_IDLE
        };
        std::time::Duration::from_secs_f64(self.idle.unwrap_or(default))
    }

    /// How long the paced workloads keep their memory at least.
    pub fn hold(&self) -> std::time::Duration {
        let default = if self.quick { 4.0 } else { 6.0 };
        std::time::Duration::from_secs_f64(self.hold.unwrap_or(default))
    }

    /// Bytes (whole pages, at least 16) of a size given in MiB for the
    /// default and the quick run.
    pub fn bytes(&self, default_mib: f64, quick_mib: f64) -> usize {
        let mib = if self.quick { quick_mib } else { default_mib };
        buffer::mib_bytes(mib * self.scale, 16)
    }

    /// A count of rounds for the default and the quick run (not scaled: the
    /// work per round scales with the sizes).
    pub fn rounds(&self, default: usize, quick: usize) -> usize {
        if self.quick {
            quick
        } else {
            default
        }
    }
}

/// Runs `w` and writes its summary to `out`.
pub fn run(w: Workload, p: &Params, out: &mut dyn Write) -> Result<(), String> {
    p.validate()?;
    let lines = match w {
        Workload::Copies => copies::run(p)?,
        Workload::Zeros => zeros::run(p)?,
        Workload::Duplicates => duplicates::run(p)?,
        Workload::Mixed => mixed::run(p)?,
        Workload::Scattered => scattered::run(p)?,
        Workload::DeZero => de::run(p, de::PageType::Zero)?,
        Workload::DeRandom => de::run(p, de::PageType::Random)?,
        Workload::DeIdentical => de::run(p, de::PageType::Identical)?,
        Workload::DeSimilar => de::run(p, de::PageType::Similar)?,
    };
    for line in lines {
        writeln!(out, "{line}").map_err(|e| format!("writing the summary: {e}"))?;
    }
    Ok(())
}

/// MiB, for summaries.
pub fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tiny sizes, quick rounds, no pacing: each workload in a fraction of a second.
    fn tiny(seed: u64) -> Params {
        Params {
            quick: true,
            scale: 0.01,
            seed,
            hold: Some(0.0),
            idle: Some(0.0),
        }
    }

    fn output(w: Workload, p: &Params) -> String {
        let mut out = Vec::new();
        run(w, p, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_workload_is_deterministic_and_depends_on_its_seed() {
        for w in Workload::ALL {
            let first = output(w, &tiny(1));
            assert_eq!(first, output(w, &tiny(1)), "{}: two runs differ", w.name());
            // Zero pages are zero pages, whatever the seed.
            if w != Workload::DeZero {
                assert_ne!(
                    first,
                    output(w, &tiny(2)),
                    "{}: the seed changes nothing",
                    w.name()
                );
            }
            assert!(first.contains("digest 0x"), "{}: {first}", w.name());
        }
    }

    #[test]
    fn bad_scales_and_holds_are_refused() {
        for scale in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_SCALE * 2.0] {
            let p = Params {
                scale,
                ..Params::default()
            };
            let err = run(Workload::Copies, &p, &mut Vec::new()).unwrap_err();
            assert!(err.contains("--scale"), "{err}");
        }
        for hold in [-1.0, f64::NAN, MAX_HOLD + 1.0] {
            let p = Params {
                hold: Some(hold),
                ..Params::default()
            };
            let err = run(Workload::Zeros, &p, &mut Vec::new()).unwrap_err();
            assert!(err.contains("--hold"), "{err}");
            let p = Params {
                idle: Some(hold),
                ..Params::default()
            };
            let err = run(Workload::DeZero, &p, &mut Vec::new()).unwrap_err();
            assert!(err.contains("--idle"), "{err}");
        }
    }

    #[test]
    fn de_workloads_are_their_own_suite_and_idle_changes_the_time_not_the_output() {
        let de: Vec<_> = Workload::ALL
            .iter()
            .filter(|w| w.suite() == "de")
            .map(|w| w.name())
            .collect();
        assert_eq!(de, ["de-zero", "de-random", "de-identical", "de-similar"]);
        let idle = Params {
            idle: Some(0.1),
            ..tiny(1)
        };
        let t = std::time::Instant::now();
        assert_eq!(
            output(Workload::DeSimilar, &idle),
            output(Workload::DeSimilar, &tiny(1))
        );
        assert!(
            t.elapsed() >= std::time::Duration::from_millis(350),
            "three idle periods and a half"
        );
        let outputs: Vec<_> = de
            .iter()
            .map(|n| {
                output(
                    Workload::ALL.into_iter().find(|w| w.name() == *n).unwrap(),
                    &tiny(1),
                )
            })
            .collect();
        let digests = |o: &String| {
            o.lines()
                .nth(1)
                .and_then(|l| l.split_once(": "))
                .map(|(_, d)| d.to_string())
                .unwrap()
        };
        for (i, o) in outputs.iter().enumerate() {
            assert!(
                outputs[i + 1..].iter().all(|p| digests(p) != digests(o)),
                "two page types gave the same digests:\n{o}"
            );
        }
    }

    #[test]
    fn pacing_changes_the_time_not_the_output() {
        let paced = Params {
            hold: Some(0.3),
            ..tiny(1)
        };
        let t = std::time::Instant::now();
        assert_eq!(
            output(Workload::Duplicates, &paced),
            output(Workload::Duplicates, &tiny(1))
        );
        assert!(t.elapsed() >= std::time::Duration::from_millis(250));
    }
}
