//! The engine's modules are layered: no module depends, directly or through
//! others, on one that depends on it (see pagefold-layering). Frames and the
//! page table at the bottom, then the mechanisms (copy, fold, merge, the pin
//! guard, holds), the scan's policy and the clock, tiering (eviction, the
//! page stores, patching) as their client, and the public `Engine` on top
//! (lib.rs, "Layers").
//!
//! The engine's state is one type, `State` (state.rs), to which modules above
//! the page table add methods; calling such a method needs no import, so
//! the second test adds an edge from every module that calls a method of
//! `State` to the module that defines it, and checks that graph too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use pagefold_layering::{Graph, Module, Reference};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_module_graph_reader_finds_cycles() {
    pagefold_layering::self_test();
}

#[test]
fn no_module_depends_on_itself_through_others() {
    pagefold_layering::assert_layered(&src());
}

/// A module's code without its unit tests and line comments.
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).expect("read a module");
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Names of the functions in `impl State` blocks of `code`, and of all others.
fn functions(code: &str) -> (Vec<String>, Vec<String>) {
    let (mut state, mut other) = (Vec::new(), Vec::new());
    let mut in_state = false;
    for line in code.lines() {
        if line.starts_with("impl State {") {
            in_state = true;
        } else if line == "}" {
            in_state = false;
        }
        let Some(at) = line.find("fn ") else { continue };
        let before = line[..at].trim();
        if !before.is_empty()
            && !before.starts_with("pub")
            && !before.ends_with("unsafe")
            && !before.ends_with("const")
        {
            continue;
        }
        let name: String = line[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if in_state && line.starts_with("    ") && !line.starts_with("     ") {
            state.push(name);
        } else {
            other.push(name);
        }
    }
    (state, other)
}

#[test]
fn no_module_calls_a_state_method_of_a_module_above_it() {
    let g = pagefold_layering::read(&src()).unwrap_or_else(|e| panic!("{e}"));
    let codes: BTreeMap<Module, String> =
        g.files.iter().map(|(m, f)| (m.clone(), code(f))).collect();
    let mut defined: BTreeMap<String, Module> = BTreeMap::new();
    let mut elsewhere: BTreeSet<String> = BTreeSet::new();
    for (m, c) in &codes {
        let (state, other) = functions(c);
        for name in state {
            if defined.insert(name.clone(), m.clone()).is_some() {
                elsewhere.insert(name);
            }
        }
        elsewhere.extend(other);
    }
    // A name also given to another function may be a call of that one.
    defined.retain(|name, _| !elsewhere.contains(name));
    assert!(
        defined.len() > 50,
        "the reader of `impl State` blocks found only {} methods",
        defined.len()
    );
    let mut edges = g.edges.clone();
    for (m, c) in &codes {
        for (name, d) in &defined {
            if d == m {
                continue;
            }
            let call = format!(".{name}(");
            if let Some(at) = c.find(&call) {
                edges
                    .entry(m.clone())
                    .or_default()
                    .entry(d.clone())
                    .or_insert_with(|| Reference {
                        file: g.files[m].clone(),
                        line: c[..at].lines().count(),
                        path: format!("State::{name}"),
                    });
            }
        }
    }
    let with_calls = Graph {
        files: g.files.clone(),
        edges,
    };
    let cycles = with_calls.cycles();
    assert!(
        cycles.is_empty(),
        "modules depend on each other in a circle once calls of `State` methods count:\n{}",
        cycles
            .iter()
            .map(|c| with_calls.describe(c))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
