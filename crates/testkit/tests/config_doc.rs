//! docs/CONFIG.md documents every environment variable pagefold reads: every
//! `PAGEFOLD_` name in the workspace's sources (crates/**/*.{rs,c,h},
//! bench/**/*.{sh,py,R}) must be mentioned there. A name is what follows
//! `PAGEFOLD_` up to the first character that is not an upper-case letter, a
//! digit or `_`; prefixes of a family (`PAGEFOLD_INJECT_`) count as names of
//! their own, so the family is documented as such. This file is left out (its
//! examples are not variables).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const PREFIX: &[u8] = b"PAGEFOLD_";

/// The `PAGEFOLD_` names in `text`.
fn names(text: &[u8]) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut i = 0;
    while let Some(at) = text[i..].windows(PREFIX.len()).position(|w| w == PREFIX) {
        let start = i + at;
        let mut end = start + PREFIX.len();
        while end < text.len()
            && (text[end].is_ascii_uppercase() || text[end].is_ascii_digit() || text[end] == b'_')
        {
            end += 1;
        }
        // A name continues an identifier (XPAGEFOLD_A) only by accident; skip those.
        let glued =
            start > 0 && (text[start - 1].is_ascii_alphanumeric() || text[start - 1] == b'_');
        if end > start + PREFIX.len() && !glued {
            found.insert(String::from_utf8_lossy(&text[start..end]).into_owned());
        }
        i = end;
    }
    found
}

/// Files under `dir` (recursively, skipping build output and hidden
/// directories) whose extension is one of `exts`.
fn sources(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" {
                sources(&path, exts, out);
            }
        } else if path
            .extension()
            .is_some_and(|x| exts.iter().any(|e| x == *e))
        {
            out.push(path);
        }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `PAGEFOLD_` name in the sources, with the first file it was seen in.
fn names_in_sources(root: &Path) -> Vec<(String, PathBuf)> {
    let mut files = Vec::new();
    sources(&root.join("crates"), &["rs", "c", "h"], &mut files);
    sources(&root.join("bench"), &["sh", "py", "R"], &mut files);
    files.sort();
    assert!(
        files.len() > 50,
        "found only {} source files under {}: wrong root?",
        files.len(),
        root.display()
    );
    // This file's own examples are not variables.
    let this_file = Path::new("testkit/tests/config_doc.rs");
    let mut seen: Vec<(String, PathBuf)> = Vec::new();
    for f in files.into_iter().filter(|f| !f.ends_with(this_file)) {
        let text = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for n in names(&text) {
            if !seen.iter().any(|(s, _)| *s == n) {
                seen.push((n, f.clone()));
            }
        }
    }
    seen
}

#[test]
fn every_variable_in_the_sources_is_in_config_md() {
    let root = workspace();
    let doc_path = root.join("docs/CONFIG.md");
    let doc = std::fs::read(&doc_path).unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    let documented = names(&doc);
    let used = names_in_sources(&root);
    assert!(
        used.iter().any(|(n, _)| n == "PAGEFOLD_TIER"),
        "the scan of the sources missed PAGEFOLD_TIER"
    );
    let missing: Vec<String> = used
        .iter()
        .filter(|(n, _)| !documented.contains(n))
        .map(|(n, f)| {
            let f = f.strip_prefix(&root).unwrap_or(f);
            format!("  {n} (first seen in {})", f.display())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "docs/CONFIG.md does not mention {} name(s) the sources use; document each (with its \
         default and meaning; test-only ones under \"Test and harness variables\"):\n{}",
        missing.len(),
        missing.join("\n")
    );
}

#[test]
fn names_are_whole_tokens() {
    let text = b"PAGEFOLD_A=1 `PAGEFOLD_INJECT_{v}` XPAGEFOLD_NO PAGEFOLD_ PAGEFOLD_B_C2.";
    let got: Vec<String> = names(text).into_iter().collect();
    assert_eq!(got, ["PAGEFOLD_A", "PAGEFOLD_B_C2", "PAGEFOLD_INJECT_"]);
}
