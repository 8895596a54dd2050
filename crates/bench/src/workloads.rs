//! The programs of the workload suites. The R and Python suites are real
//! programs kept in the repository's bench/ directory (R scripts for the
//! unmodified Debian R, numpy programs for Python), found by listing it, so
//! adding a workload is adding a file. The synthetic suite is the
//! subcommands of `pagefold-synth` (crates/synth), built beside `pagefold`
//! and asked for its list, so adding one is adding a subcommand; it needs
//! neither R nor Python. The de suite is pagefold-synth's `de-*`
//! subcommands (Difference Engine's micro-benchmark, `list de`), each given
//! its idle time explicitly so the command recorded with the results says
//! when its phases began. Each program prints a deterministic result, which
//! is how a run under any configuration is checked against the plain run.

use std::path::{Path, PathBuf};

use pagefold_synth::de::{DEFAULT_IDLE, QUICK_IDLE};

/// A suite of real programs, and how each is started.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgramSuite {
    /// bench/r/*.R under Rscript.
    R,
    /// bench/python/*.py under python3.
    Python,
    /// The subcommands of pagefold-synth.
    Synthetic,
    /// pagefold-synth's de-* subcommands: Difference Engine's micro-benchmark.
    De,
    /// bench/dask/*.py under python3: Dask jobs on a LocalCluster of two
    /// workers, each script with Dask's memory thresholds and spilling on
    /// process memory only.
    Dask,
}

impl ProgramSuite {
    pub fn name(self) -> &'static str {
        match self {
            ProgramSuite::R => "r",
            ProgramSuite::Python => "python",
            ProgramSuite::Synthetic => "synthetic",
            ProgramSuite::De => "de",
            ProgramSuite::Dask => "dask",
        }
    }

    /// Directory under bench/, script extension and interpreter (script suites only).
    fn layout(self) -> Option<(&'static str, &'static str, &'static str)> {
        match self {
            ProgramSuite::R => Some(("r", "R", "Rscript")),
            ProgramSuite::Python => Some(("python", "py", "python3")),
            ProgramSuite::Dask => Some(("dask", "py", "python3")),
            ProgramSuite::Synthetic | ProgramSuite::De => None,
        }
    }
}

/// One program of a suite.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Workload {
    pub name: String,
    pub cmd: Vec<String>,
}

/// The idle time of each phase the de suite gives its workloads.
pub fn idle_seconds(quick: bool) -> f64 {
    if quick {
        QUICK_IDLE
    } else {
        DEFAULT_IDLE
    }
}

/// The suite's programs under `root` (bench/), sorted by name; `only`, when
/// not empty, keeps those named. Errors name what is missing.
pub fn discover(
    suite: ProgramSuite,
    root: &Path,
    only: &[String],
) -> Result<Vec<Workload>, String> {
    let Some((dir, ext, interpreter)) = suite.layout() else {
        return Err(format!(
            "the {} suite has no scripts under {}",
            suite.name(),
            root.display()
        ));
    };
    let dir = root.join(dir);
    let entries = std::fs::read_dir(&dir).map_err(|e| {
        format!(
            "{}: {e} (run from the repository root or pass --workloads)",
            dir.display()
        )
    })?;
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    let all = files
        .into_iter()
        .map(|p| Workload {
            name: p
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            cmd: vec![interpreter.to_string(), p.to_string_lossy().into_owned()],
        })
        .collect();
    let out = keep_only(all, only, &dir.display().to_string())?;
    if out.is_empty() {
        return Err(format!("no *.{ext} workloads in {}", dir.display()));
    }
    if crate::program::resolve(interpreter).is_none() {
        return Err(format!(
            "{interpreter} not found: the {} suite needs it",
            suite.name()
        ));
    }
    Ok(out)
}

/// How the dask suite runs each of its scripts: the workload's name suffix
/// and the script's arguments. Dask's defaults spill a worker's oldest keys
/// once the sum of their `sizeof()` passes 60% of its memory limit, which
/// counts a copy at full size whatever it holds; with `target` off a worker
/// spills only when its process memory (what its monitor reads) passes 70%.
pub const DASK_VARIANTS: [(&str, &[&str]); 2] = [
    ("", &[]),
    ("_spill_on_memory", &["--spill-on", "process-memory"]),
];

/// What the dask suite's scripts import (dask.dataframe needs pyarrow).
pub const DASK_MODULES: &[&str] = &["dask.dataframe", "distributed", "pandas", "pyarrow"];

/// The dask suite: every bench/dask script under `root` in each of
/// [`DASK_VARIANTS`] (`--quick`: the scripts' small sizes); `only`, when
/// not empty, keeps those named. Fails, naming the install, when python3
/// cannot import what the scripts need.
pub fn discover_dask(root: &Path, quick: bool, only: &[String]) -> Result<Vec<Workload>, String> {
    let scripts = discover(ProgramSuite::Dask, root, &[])?;
    require_modules("python3", DASK_MODULES)?;
    let all = scripts
        .iter()
        .flat_map(|script| {
            DASK_VARIANTS.iter().map(move |(suffix, args)| {
                let mut cmd = script.cmd.clone();
                cmd.extend(args.iter().map(|a| a.to_string()));
                if quick {
                    cmd.push("--quick".into());
                }
                Workload {
                    name: format!("{}{suffix}", script.name),
                    cmd,
                }
            })
        })
        .collect();
    keep_only(all, only, &root.join("dask").display().to_string())
}

/// Fails, naming the modules and the pip command, if `python` cannot import
/// every one of `modules`.
pub fn require_modules(python: &str, modules: &[&str]) -> Result<(), String> {
    let imports = format!("import {}", modules.join(", "));
    let done = std::process::Command::new(python)
        .args(["-c", &imports])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("{python}: {e}"))?;
    if done.success() {
        return Ok(());
    }
    Err(format!(
        "{python} cannot import {}: the dask suite needs them ({python} -m pip install 'dask[dataframe,distributed]')",
        modules.join(", ")
    ))
}

/// The workloads of a pagefold-synth suite (synthetic or de): every
/// subcommand `synth list SUITE` names, run as `synth NAME` (`--quick` for
/// the small sizes; de workloads with `--idle` given: `idle`, or the
/// default), in its order.
pub fn discover_synthetic(
    synth: &Path,
    suite: ProgramSuite,
    quick: bool,
    idle: Option<f64>,
    only: &[String],
) -> Result<Vec<Workload>, String> {
    let listed = std::process::Command::new(synth)
        .args(["list", suite.name()])
        .output()
        .map_err(|e| format!("{}: {e}", synth.display()))?;
    if !listed.status.success() {
        return Err(format!(
            "{} list {} failed: {}",
            synth.display(),
            suite.name(),
            String::from_utf8_lossy(&listed.stderr).trim()
        ));
    }
    let program = synth.to_string_lossy().into_owned();
    let all = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(|name| {
            let mut cmd = vec![program.clone(), name.to_string()];
            if suite == ProgramSuite::De {
                cmd.extend([
                    "--idle".to_string(),
                    idle.unwrap_or_else(|| idle_seconds(quick)).to_string(),
                ]);
            }
            if quick {
                cmd.push("--quick".into());
            }
            Workload {
                name: name.to_string(),
                cmd,
            }
        })
        .collect();
    let out = keep_only(all, only, &program)?;
    if out.is_empty() {
        return Err(format!(
            "{} list {} named no workloads",
            synth.display(),
            suite.name()
        ));
    }
    Ok(out)
}

/// `all` without duplicate names, restricted to `only` when it is not
/// empty; an error names a wanted workload that `source` does not have.
fn keep_only(
    mut all: Vec<Workload>,
    only: &[String],
    source: &str,
) -> Result<Vec<Workload>, String> {
    if let Some(missing) = only.iter().find(|n| !all.iter().any(|w| &w.name == *n)) {
        return Err(format!("no workload '{missing}' in {source}"));
    }
    all.retain(|w| only.is_empty() || only.contains(&w.name));
    all.dedup_by(|a, b| a.name == b.name);
    Ok(all)
}

/// The pagefold-synth program: the option, or beside this program (as the
/// preload library is found).
pub fn find_synth(opt: Option<&Path>) -> Result<PathBuf, String> {
    let candidate = match opt {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| format!("locating pagefold: {e}"))?
            .with_file_name("pagefold-synth"),
    };
    if !candidate.is_file() {
        return Err(format!(
            "{} not found (build it with `cargo build --release -p pagefold-synth`, or pass --synth)",
            candidate.display()
        ));
    }
    candidate
        .canonicalize()
        .map_err(|e| format!("{}: {e}", candidate.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovers_sorted_scripts_and_names_what_is_missing() {
        let root = std::env::temp_dir().join(format!("pagefold-workloads-{}", std::process::id()));
        std::fs::create_dir_all(root.join("python")).unwrap();
        for f in ["b.py", "a.py", "notes.txt"] {
            std::fs::write(root.join("python").join(f), "").unwrap();
        }
        let all = discover(ProgramSuite::Python, &root, &[]).unwrap();
        assert_eq!(
            all.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(all[0].cmd[0], "python3");
        let one = discover(ProgramSuite::Python, &root, &["b".into()]).unwrap();
        assert_eq!(one.len(), 1);
        let err = discover(ProgramSuite::Python, &root, &["zz".into()]).unwrap_err();
        assert!(err.contains("no workload 'zz'"), "{err}");
        let err = discover(ProgramSuite::R, &root, &[]).unwrap_err();
        assert!(err.contains("run from the repository root"), "{err}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn dask_workloads_are_each_script_in_each_variant() {
        let root = std::env::temp_dir().join(format!("pagefold-dask-wl-{}", std::process::id()));
        std::fs::create_dir_all(root.join("dask")).unwrap();
        std::fs::write(root.join("dask").join("job.py"), "").unwrap();
        let missing = require_modules("python3", &["pagefold_no_such_module"]).unwrap_err();
        assert!(
            missing.contains("cannot import pagefold_no_such_module") && missing.contains("pip"),
            "{missing}"
        );
        // The rest needs what the suite needs, as CI installs it.
        let all = discover_dask(&root, true, &[]).unwrap();
        assert_eq!(
            all.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
            ["job", "job_spill_on_memory"]
        );
        assert_eq!(all[0].cmd[2..], ["--quick"]);
        assert_eq!(all[1].cmd[2..], ["--spill-on", "process-memory", "--quick"]);
        let one = discover_dask(&root, false, &["job_spill_on_memory".into()]).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].cmd.len(), 4);
        let err = discover_dask(&root, false, &["nope".into()]).unwrap_err();
        assert!(err.contains("no workload 'nope'"), "{err}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn synthetic_workloads_are_the_subcommands_the_program_lists() {
        let dir = std::env::temp_dir().join(format!("pagefold-synth-list-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("pagefold-synth");
        let script = "#!/bin/sh\ncase $2 in de) printf 'de-zero  zero pages\\n';; *) printf 'copies  copied arrays\\nzeros   zero pages\\n';; esac\n";
        std::fs::write(&fake, script).unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        // A fork elsewhere in this test process may still hold the script
        // open for writing for an instant (ETXTBSY): try again then.
        let mut quick = discover_synthetic(&fake, ProgramSuite::Synthetic, true, None, &[]);
        for _ in 0..50 {
            if !quick.as_ref().is_err_and(|e| e.contains("os error 26")) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            quick = discover_synthetic(&fake, ProgramSuite::Synthetic, true, None, &[]);
        }
        let quick = quick.unwrap();
        assert_eq!(
            quick.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
            ["copies", "zeros"]
        );
        assert_eq!(quick[1].cmd[1..], ["zeros", "--quick"]);
        let full = discover_synthetic(
            &fake,
            ProgramSuite::Synthetic,
            false,
            None,
            &["zeros".into()],
        )
        .unwrap();
        assert_eq!(full.len(), 1);
        assert_eq!(full[0].cmd.len(), 2);
        let de = discover_synthetic(&fake, ProgramSuite::De, true, None, &[]).unwrap();
        assert_eq!(de.len(), 1);
        assert_eq!(de[0].cmd[1..], ["de-zero", "--idle", "3", "--quick"]);
        let de = discover_synthetic(&fake, ProgramSuite::De, false, Some(2.5), &[]).unwrap();
        assert_eq!(de[0].cmd[1..], ["de-zero", "--idle", "2.5"]);
        let err = discover_synthetic(
            &fake,
            ProgramSuite::Synthetic,
            false,
            None,
            &["nope".into()],
        )
        .unwrap_err();
        assert!(err.contains("no workload 'nope'"), "{err}");
        let err = find_synth(Some(&dir.join("missing"))).unwrap_err();
        assert!(err.contains("--synth"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
