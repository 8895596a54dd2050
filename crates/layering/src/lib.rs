//! pagefold-layering: the module graph of a crate, read from its sources,
//! and the cycles in it. The crates whose tests call `assert_layered` keep
//! their modules layered: a lower module never reaches up into a higher one,
//! so each can be read, changed and tested with only what lies below it in
//! mind. One reader serves every crate that checks itself, so they all mean
//! the same thing by "layered".
//!
//! A crate is layered when no module depends, directly or through others,
//! on a module that depends on it: a lower layer never calls up into a higher
//! one, and the crate root (lib.rs), which ties the modules together, is the
//! top. This reads every module file reachable from src/lib.rs through
//! `mod NAME;` declarations and records an edge A -> B for every path in A's
//! code that names B or an item of B: `use` declarations (groups, renames and
//! `self` included) and paths written out in the code (`crate::b::f()`,
//! `super::x`, and in a parent module `child::f()`). A path to an item that a
//! module only re-exports (`pub use`) leads to where the item is defined, so
//! importing `crate::PAGE` depends on the module that defines `PAGE`, not on
//! lib.rs; a re-export of another crate leads nowhere. Comments, string and
//! character literals and `#[cfg(test)] mod` blocks are ignored: unit tests
//! may use whatever module they test against.
//!
//! It is a reader of the code we write, not a Rust parser: macros that build
//! paths, `#[path]` attributes and glob re-exports are not followed. Every
//! .rs file under src/ (except src/bin/) must be reached as a module, so a
//! layout it cannot follow fails loudly instead of passing unchecked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module, as its path from the crate root (empty for the root).
pub type Module = Vec<String>;

/// `crate`, `crate::read`, `crate::read::live`.
pub fn name(m: &Module) -> String {
    std::iter::once("crate")
        .chain(m.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join("::")
}

/// One reference from a module to another, kept to name it in a failure.
#[derive(Clone, Debug)]
pub struct Reference {
    pub file: PathBuf,
    pub line: usize,
    pub path: String,
}

/// The crate's modules and, for each, the modules it uses with the first
/// reference found to each.
#[derive(Debug, Default)]
pub struct Graph {
    pub files: BTreeMap<Module, PathBuf>,
    pub edges: BTreeMap<Module, BTreeMap<Module, Reference>>,
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// A module file reduced to what the graph needs.
struct Source {
    tokens: Vec<(Token, usize)>,
    /// Child modules declared with `mod NAME;` outside test code.
    children: Vec<String>,
}

/// A `use` declaration expanded to one path per imported name.
struct Import {
    path: Vec<String>,
    /// The name it is imported as (None for `*`).
    alias: Option<String>,
    public: bool,
    line: usize,
}

/// Replaces comments and the contents of string and character literals with
/// spaces, keeping newlines (for line numbers) and lifetimes.
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        if at(i) == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if at(i) == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if at(i) == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if at(i) == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
        } else if (at(i) == 'r' || (at(i) == 'b' && at(i + 1) == 'r'))
            && !is_ident(at(i.wrapping_sub(1)))
            && {
                let mut k = i + if at(i) == 'b' { 2 } else { 1 };
                while at(k) == '#' {
                    k += 1;
                }
                at(k) == '"'
            }
        {
            // A raw string: r"..." or r#"..."# (also br).
            i += if at(i) == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while at(i) == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                    i += 1 + hashes;
                    break;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if at(i) == '"' {
            i += 1;
            out.push_str("\"\"");
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    blank(&mut out, c[i]);
                    i += 1;
                }
                if i < c.len() {
                    blank(&mut out, c[i]);
                }
                i += 1;
            }
            i += 1;
        } else if at(i) == '\'' && (at(i + 1) == '\\' || (at(i + 2) == '\'' && at(i + 1) != '\'')) {
            // A character literal ('x', '\n', '\'', '\u{..}'), not a lifetime ('a).
            if at(i + 1) == '\\' {
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else {
                i += 3;
            }
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn is_ident(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

fn tokenize(src: &str) -> Vec<(Token, usize)> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if is_ident(ch) {
            let start = i;
            while i < c.len() && is_ident(c[i]) {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // `r#ident` is the identifier `ident`.
            out.push((Token::Ident(word), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Token::Path, line));
            i += 2;
        } else {
            out.push((Token::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Index just past the bracket closing the one at `open`.
fn skip_group(t: &[(Token, usize)], open: usize) -> usize {
    let (o, c) = match t[open].0 {
        Token::Punct('{') => ('{', '}'),
        Token::Punct('(') => ('(', ')'),
        _ => ('[', ']'),
    };
    let mut depth = 0;
    let mut i = open;
    while i < t.len() {
        if t[i].0 == Token::Punct(o) {
            depth += 1;
        } else if t[i].0 == Token::Punct(c) {
            depth -= 1;
            if depth == 0 {
                return i + 1;
            }
        }
        i += 1;
    }
    t.len()
}

fn ident(t: &[(Token, usize)], i: usize) -> Option<&str> {
    match t.get(i) {
        Some((Token::Ident(s), _)) => Some(s),
        _ => None,
    }
}

/// Drops `#[cfg(test)]` modules (inline or not) and notes `mod NAME;`.
fn read_source(text: &str) -> Source {
    let all = tokenize(&strip(text));
    let mut tokens = Vec::new();
    let mut children = Vec::new();
    let mut i = 0;
    while i < all.len() {
        // #[cfg(test)] followed (after other attributes) by `mod`.
        if all[i].0 == Token::Punct('#') && all.get(i + 1).map(|t| &t.0) == Some(&Token::Punct('['))
        {
            let end = skip_group(&all, i + 1);
            let is_cfg_test = ident(&all, i + 2) == Some("cfg")
                && ident(&all, i + 4) == Some("test")
                && all.get(i + 5).map(|t| &t.0) == Some(&Token::Punct(')'));
            let mut j = end;
            while all.get(j).map(|t| &t.0) == Some(&Token::Punct('#')) {
                j = skip_group(&all, j + 1);
            }
            if ident(&all, j) == Some("pub") {
                j += 1;
                if all.get(j).map(|t| &t.0) == Some(&Token::Punct('(')) {
                    j = skip_group(&all, j);
                }
            }
            if is_cfg_test && ident(&all, j) == Some("mod") {
                j += 2;
                i = match all.get(j).map(|t| &t.0) {
                    Some(Token::Punct('{')) => skip_group(&all, j),
                    _ => j + 1,
                };
                continue;
            }
        }
        if ident(&all, i) == Some("mod") {
            if let (Some(n), Some((Token::Punct(';'), _))) = (ident(&all, i + 1), all.get(i + 2)) {
                children.push(n.to_string());
            }
        }
        tokens.push(all[i].clone());
        i += 1;
    }
    Source { tokens, children }
}

/// Expands the use tree starting at `i` (after `use`); returns the index of
/// the token after it.
fn use_tree(
    t: &[(Token, usize)],
    mut i: usize,
    prefix: &[String],
    public: bool,
    out: &mut Vec<Import>,
) -> usize {
    let line = t.get(i).map_or(0, |t| t.1);
    let mut path = prefix.to_vec();
    if t.get(i).map(|t| &t.0) == Some(&Token::Path) {
        i += 1; // a leading `::`
    }
    loop {
        match t.get(i).map(|t| &t.0) {
            Some(Token::Punct('{')) => {
                i += 1;
                while !matches!(t.get(i).map(|t| &t.0), None | Some(Token::Punct('}'))) {
                    i = use_tree(t, i, &path, public, out);
                    if t.get(i).map(|t| &t.0) == Some(&Token::Punct(',')) {
                        i += 1;
                    }
                }
                return i + 1;
            }
            Some(Token::Punct('*')) => {
                out.push(Import {
                    path,
                    alias: None,
                    public,
                    line,
                });
                return i + 1;
            }
            Some(Token::Ident(s)) => {
                path.push(s.clone());
                i += 1;
                if t.get(i).map(|t| &t.0) == Some(&Token::Path) {
                    i += 1;
                    continue;
                }
                let mut alias = path.last().cloned();
                if ident(t, i) == Some("as") {
                    alias = ident(t, i + 1).map(str::to_string);
                    i += 2;
                }
                if path.last().map(String::as_str) == Some("self") {
                    path.pop();
                    if alias.as_deref() == Some("self") {
                        alias = path.last().cloned();
                    }
                }
                out.push(Import {
                    path,
                    alias,
                    public,
                    line,
                });
                return i;
            }
            _ => return i + 1,
        }
    }
}

/// The `use` declarations of a module and the paths written out in its code.
fn references(s: &Source) -> (Vec<Import>, Vec<(Vec<String>, usize)>) {
    let t = &s.tokens;
    let mut imports = Vec::new();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < t.len() {
        if ident(t, i) == Some("use") {
            // `pub use` or `pub(crate) use` (also `pub(super)`).
            let public = (i >= 1 && ident(t, i - 1) == Some("pub"))
                || (i >= 4 && t[i - 1].0 == Token::Punct(')') && ident(t, i - 4) == Some("pub"));
            let mut j = use_tree(t, i + 1, &[], public, &mut imports);
            while j < t.len() && t[j].0 != Token::Punct(';') {
                j += 1;
            }
            i = j + 1;
            continue;
        }
        // The start of a path: an identifier not preceded by `::` or `.`
        // and followed by `::`.
        let starts = matches!(t[i].0, Token::Ident(_))
            && t.get(i + 1).map(|t| &t.0) == Some(&Token::Path)
            && (i == 0 || !matches!(t[i - 1].0, Token::Path | Token::Punct('.')));
        if starts {
            let line = t[i].1;
            let mut path = Vec::new();
            let mut j = i;
            while let Some(s) = ident(t, j) {
                path.push(s.to_string());
                if t.get(j + 1).map(|t| &t.0) != Some(&Token::Path) {
                    break;
                }
                j += 2;
            }
            paths.push((path, line));
            i = j + 1;
            continue;
        }
        i += 1;
    }
    (imports, paths)
}

struct Crate {
    files: BTreeMap<Module, PathBuf>,
    sources: BTreeMap<Module, Source>,
    imports: BTreeMap<Module, Vec<Import>>,
}

impl Crate {
    /// `path` as written in module `m`, made absolute; None if it leads
    /// outside the crate.
    fn absolute(&self, m: &Module, path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?.as_str();
        let mut base = m.clone();
        let mut rest = path;
        match first {
            "crate" => {
                base.clear();
                rest = &path[1..];
            }
            "self" => rest = &path[1..],
            "super" => {
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            _ if self.sources[m].children.iter().any(|c| c == first) => {}
            _ => return None,
        }
        Some(base.into_iter().chain(rest.iter().cloned()).collect())
    }

    /// The module defining what an absolute path names: the longest module
    /// prefix, through its re-exports; None outside the crate.
    fn target(&self, abs: &[String], depth: usize) -> Option<Module> {
        let k = (0..=abs.len())
            .rev()
            .find(|&k| self.files.contains_key(&abs[..k]))?;
        let module: Module = abs[..k].to_vec();
        let Some(item) = abs.get(k) else {
            return Some(module);
        };
        let reexport = self.imports[&module]
            .iter()
            .find(|im| im.public && im.alias.as_deref() == Some(item.as_str()));
        match reexport {
            Some(im) if depth < 16 => {
                let to = self.absolute(&module, &im.path)?;
                self.target(&[to, abs[k + 1..].to_vec()].concat(), depth + 1)
            }
            _ => Some(module),
        }
    }
}

/// Reads the crate whose sources are in `src` (src/lib.rs and its modules).
pub fn read(src: &Path) -> Result<Graph, String> {
    let mut c = Crate {
        files: BTreeMap::new(),
        sources: BTreeMap::new(),
        imports: BTreeMap::new(),
    };
    let mut todo = vec![(Module::new(), src.join("lib.rs"), src.to_path_buf())];
    while let Some((m, file, dir)) = todo.pop() {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let source = read_source(&text);
        for child in &source.children {
            let flat = dir.join(format!("{child}.rs"));
            let nested = dir.join(child).join("mod.rs");
            let f = if flat.exists() { flat } else { nested };
            let mut cm = m.clone();
            cm.push(child.clone());
            todo.push((cm, f, dir.join(child)));
        }
        let (imports, _) = references(&source);
        c.imports.insert(m.clone(), imports);
        c.sources.insert(m.clone(), source);
        c.files.insert(m, file);
    }
    let reached: BTreeSet<PathBuf> = c.files.values().cloned().collect();
    for f in rs_files(src, &src.join("bin")) {
        if !reached.contains(&f) {
            return Err(format!(
                "{} is not reached from lib.rs through `mod NAME;`: the layering check cannot see it",
                f.display()
            ));
        }
    }
    let mut g = Graph {
        files: c.files.clone(),
        edges: BTreeMap::new(),
    };
    for (m, source) in &c.sources {
        let (imports, paths) = references(source);
        let written = imports
            .iter()
            .map(|im| (im.path.clone(), im.line))
            .chain(paths);
        let out = g.edges.entry(m.clone()).or_default();
        for (path, line) in written {
            let Some(to) = c.absolute(m, &path).and_then(|a| c.target(&a, 0)) else {
                continue;
            };
            if &to != m {
                out.entry(to).or_insert_with(|| Reference {
                    file: c.files[m].clone(),
                    line,
                    path: path.join("::"),
                });
            }
        }
    }
    Ok(g)
}

fn rs_files(dir: &Path, skip: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p == skip {
            continue;
        }
        if p.is_dir() {
            out.extend(rs_files(&p, skip));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

impl Graph {
    /// One cycle per strongly connected component of more than one module
    /// (a set of modules each reachable from every other), as the modules
    /// along it, the first repeated at the end; a shortest one through the
    /// component's first module, so breaking it may leave another.
    pub fn cycles(&self) -> Vec<Vec<Module>> {
        let nodes: Vec<&Module> = self.files.keys().collect();
        let index = |m: &Module| nodes.iter().position(|n| *n == m);
        let succ: Vec<Vec<usize>> = nodes
            .iter()
            .map(|m| {
                self.edges
                    .get(*m)
                    .map(|e| e.keys().filter_map(index).collect())
                    .unwrap_or_default()
            })
            .collect();
        // Tarjan's strongly connected components.
        struct State {
            next: usize,
            index: Vec<Option<usize>>,
            low: Vec<usize>,
            stack: Vec<usize>,
            on_stack: Vec<bool>,
            components: Vec<Vec<usize>>,
        }
        fn visit(v: usize, succ: &[Vec<usize>], s: &mut State) {
            s.index[v] = Some(s.next);
            s.low[v] = s.next;
            s.next += 1;
            s.stack.push(v);
            s.on_stack[v] = true;
            for &w in &succ[v] {
                match s.index[w] {
                    None => {
                        visit(w, succ, s);
                        s.low[v] = s.low[v].min(s.low[w]);
                    }
                    Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                    _ => {}
                }
            }
            if Some(s.low[v]) == s.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = s.stack.pop() {
                    s.on_stack[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                s.components.push(comp);
            }
        }
        let n = nodes.len();
        let mut s = State {
            next: 0,
            index: vec![None; n],
            low: vec![0; n],
            stack: Vec::new(),
            on_stack: vec![false; n],
            components: Vec::new(),
        };
        for v in 0..n {
            if s.index[v].is_none() {
                visit(v, &succ, &mut s);
            }
        }
        let mut cycles = Vec::new();
        for comp in s.components.into_iter().filter(|c| c.len() > 1) {
            // A shortest way back to the component's first module.
            let start = *comp.iter().min().expect("not empty");
            let mut from: BTreeMap<usize, usize> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut last = None;
            'search: while let Some(v) = queue.pop_front() {
                for &w in succ[v].iter().filter(|w| comp.contains(w)) {
                    if w == start {
                        last = Some(v);
                        break 'search;
                    }
                    if let std::collections::btree_map::Entry::Vacant(e) = from.entry(w) {
                        e.insert(v);
                        queue.push_back(w);
                    }
                }
            }
            let mut back = Vec::new();
            let mut v = last.expect("a component of two or more modules has a cycle");
            while v != start {
                back.push(v);
                v = from[&v];
            }
            let path = std::iter::once(start)
                .chain(back.into_iter().rev())
                .chain(std::iter::once(start));
            cycles.push(path.map(|i| nodes[i].clone()).collect());
        }
        cycles
    }

    /// A cycle as text, each step with the reference that makes it.
    pub fn describe(&self, cycle: &[Module]) -> String {
        let mut out = cycle.iter().map(name).collect::<Vec<_>>().join(" -> ");
        for pair in cycle.windows(2) {
            let r = &self.edges[&pair[0]][&pair[1]];
            out += &format!(
                "\n  {} uses {} ({}:{}: {})",
                name(&pair[0]),
                name(&pair[1]),
                r.file.display(),
                r.line,
                r.path
            );
        }
        out
    }
}

/// Fails naming every module cycle of the crate in `src`.
pub fn assert_layered(src: &Path) {
    let g = read(src).unwrap_or_else(|e| panic!("{e}"));
    let cycles = g.cycles();
    assert!(
        cycles.is_empty(),
        "modules of {} depend on each other in a circle (move what they share into a module \
         below both):\n{}",
        src.display(),
        cycles
            .iter()
            .map(|c| g.describe(c))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Writes a small crate into a fresh directory under the system temp dir,
/// for testing the reader itself; `files` are (path under src/, contents).
pub fn scratch_crate(tag: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pagefold-layering-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, text) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().expect("a file has a directory")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
    }
    dir
}

/// The checks of the reader itself, on small crates with and without cycles;
/// each crate's layering test runs them so a reader that sees nothing cannot
/// pass silently.
pub fn self_test() {
    let layered = scratch_crate(
        "layered",
        &[
            (
                "lib.rs",
                "pub mod a;\npub mod b;\npub mod c;\npub use a::Thing;\npub use other_crate::x as x;\n\
                 pub fn top() { b::f(); }\n",
            ),
            ("a.rs", "pub struct Thing;\n"),
            (
                "b.rs",
                "use crate::{a::{self, Thing}, x::Y};\n// crate::c::g() in a comment\n\
                 pub fn f() { let _ = \"crate::c::g\"; let _ = '\\''; crate::c::g(); }\n\
                 #[cfg(test)]\nmod tests { use crate::top; #[test] fn t() { crate::top(); } }\n",
            ),
            ("c.rs", "use crate::Thing;\npub fn g() {}\n"),
        ],
    );
    let g = read(&layered).expect("read");
    let edges = |m: &[&str]| -> Vec<String> {
        let m: Module = m.iter().map(|s| s.to_string()).collect();
        g.edges[&m].keys().map(name).collect()
    };
    assert_eq!(edges(&[]), ["crate::a", "crate::b"]);
    assert_eq!(edges(&["b"]), ["crate::a", "crate::c"]);
    assert_eq!(edges(&["c"]), ["crate::a"]);
    assert!(g.cycles().is_empty());
    let _ = std::fs::remove_dir_all(&layered);

    let circular = scratch_crate(
        "circular",
        &[
            ("lib.rs", "pub mod a;\npub mod nest;\npub struct Plan;\n"),
            ("a.rs", "pub fn f() { crate::nest::inner::g() }\n"),
            ("nest/mod.rs", "pub mod inner;\npub fn h() { inner::g() }\n"),
            (
                "nest/inner.rs",
                "pub fn g() { let _ = crate::Plan; }\npub fn k() { super::h() }\n",
            ),
        ],
    );
    let g = read(&circular).expect("read");
    let cycles: Vec<String> = g
        .cycles()
        .iter()
        .map(|c| c.iter().map(name).collect::<Vec<_>>().join(" -> "))
        .collect();
    assert_eq!(
        cycles,
        ["crate::nest -> crate::nest::inner -> crate::nest"],
        "{:#?}",
        g.edges
    );
    let message = std::panic::catch_unwind(|| assert_layered(&circular));
    assert!(message.is_err(), "a crate with a cycle must fail the check");
    let _ = std::fs::remove_dir_all(&circular);
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_reader_finds_cycles() {
        super::self_test();
    }
}
