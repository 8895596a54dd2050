//! The programs of the workload suites. They are real programs kept in the
//! repository's bench/ directory (R scripts for the unmodified Debian R, numpy
//! programs for Python), found by listing it, so adding a workload is adding
//! a file. Each prints a deterministic result, which is how a run under any
//! configuration is checked against the plain run.

use std::path::{Path, PathBuf};

/// A suite of real programs, and how each is started.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgramSuite {
    /// bench/r/*.R under Rscript.
    R,
    /// bench/python/*.py under python3.
    Python,
}

impl ProgramSuite {
    pub fn name(self) -> &'static str {
        match self {
            ProgramSuite::R => "r",
            ProgramSuite::Python => "python",
        }
    }

    fn layout(self) -> (&'static str, &'static str, &'static str) {
        match self {
            ProgramSuite::R => ("r", "R", "Rscript"),
            ProgramSuite::Python => ("python", "py", "python3"),
        }
    }
}

/// One program of a suite.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Workload {
    pub name: String,
    pub cmd: Vec<String>,
}

/// The suite's programs under `root` (bench/), sorted by name; `only`, when
/// not empty, keeps those named. Errors name what is missing.
pub fn discover(suite: ProgramSuite, root: &Path, only: &[String]) -> Result<Vec<Workload>, String> {
    let (dir, ext, interpreter) = suite.layout();
    let dir = root.join(dir);
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e} (run from the repository root or pass --workloads)", dir.display()))?;
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == ext)).collect();
    files.sort();
    let mut out: Vec<Workload> = files
        .into_iter()
        .map(|p| Workload {
            name: p.file_stem().unwrap_or_default().to_string_lossy().into_owned(),
            cmd: vec![interpreter.to_string(), p.to_string_lossy().into_owned()],
        })
        .filter(|w| only.is_empty() || only.contains(&w.name))
        .collect();
    if let Some(missing) = only.iter().find(|n| !out.iter().any(|w| &w.name == *n)) {
        return Err(format!("no workload '{missing}' in {}", dir.display()));
    }
    if out.is_empty() {
        return Err(format!("no *.{ext} workloads in {}", dir.display()));
    }
    if crate::program::resolve(interpreter).is_none() {
        return Err(format!("{interpreter} not found: the {} suite needs it", suite.name()));
    }
    out.dedup_by(|a, b| a.name == b.name);
    Ok(out)
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
        assert_eq!(all.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(all[0].cmd[0], "python3");
        let one = discover(ProgramSuite::Python, &root, &["b".into()]).unwrap();
        assert_eq!(one.len(), 1);
        let err = discover(ProgramSuite::Python, &root, &["zz".into()]).unwrap_err();
        assert!(err.contains("no workload 'zz'"), "{err}");
        let err = discover(ProgramSuite::R, &root, &[]).unwrap_err();
        assert!(err.contains("run from the repository root"), "{err}");
        std::fs::remove_dir_all(root).unwrap();
    }
}
