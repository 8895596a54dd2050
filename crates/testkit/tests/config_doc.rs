//! Every `PAGEFOLD_*` name in the workspace's sources is documented in
//! docs/CONFIG.md. Include guards of C headers (`#ifndef PAGEFOLD_H`) are not
//! variables and are left out; a name ending in `_` is a family (it is
//! documented when some documented name starts with it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target" && !name.to_string_lossy().starts_with('.') {
                sources(&p, out);
            }
        } else if matches!(
            p.extension().and_then(|x| x.to_str()),
            Some("rs" | "c" | "h" | "sh" | "py" | "R")
        ) {
            out.push(p);
        }
    }
}

/// The `PAGEFOLD_*` names in `text`, include guards left out.
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#ifndef") || t.starts_with("#define") || t.starts_with("#endif") {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("PAGEFOLD_") {
            let tail = &rest[i..];
            let len = tail
                .bytes()
                .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
                .count();
            out.insert(tail[..len].to_string());
            rest = &tail[len..];
        }
    }
    out
}

fn undocumented(used: &BTreeSet<String>, doc: &str) -> Vec<String> {
    let documented = names(doc);
    used.iter()
        .filter(|n| {
            if n.ends_with('_') {
                !documented.iter().any(|d| d.starts_with(n.as_str()))
            } else {
                !documented.contains(*n)
            }
        })
        .cloned()
        .collect()
}

#[test]
fn every_variable_the_code_reads_is_documented() {
    let mut files = Vec::new();
    sources(&root().join("crates"), &mut files);
    sources(&root().join("bench"), &mut files);
    assert!(files.len() > 50, "sources not found under {:?}", root());
    let mut used = BTreeSet::new();
    // This file's own examples are not the code's variables.
    for f in files
        .iter()
        .filter(|f| !f.ends_with("testkit/tests/config_doc.rs"))
    {
        used.extend(names(&std::fs::read_to_string(f).unwrap_or_default()));
    }
    assert!(used.contains("PAGEFOLD_THRESHOLD"), "{used:?}");
    let doc = std::fs::read_to_string(root().join("docs/CONFIG.md")).unwrap();
    let missing = undocumented(&used, &doc);
    assert!(
        missing.is_empty(),
        "read by the code but not in docs/CONFIG.md: {missing:?}"
    );
}

#[test]
fn the_check_finds_a_missing_name_and_ignores_guards() {
    let code = "#ifndef PAGEFOLD_X_H\nlet v = env(\"PAGEFOLD_ALPHA\"); env(\"PAGEFOLD_FAM_\"+k)";
    let used = names(code);
    assert_eq!(
        used.iter().cloned().collect::<Vec<_>>(),
        ["PAGEFOLD_ALPHA", "PAGEFOLD_FAM_"]
    );
    assert_eq!(
        undocumented(&used, "`PAGEFOLD_FAM_ONE`"),
        ["PAGEFOLD_ALPHA"]
    );
    assert!(undocumented(&used, "`PAGEFOLD_ALPHA` `PAGEFOLD_FAM_ONE`").is_empty());
}
