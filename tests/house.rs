//! The house keeps its shape: no source file over 800 lines, and no import circle between the
//! library's files. (The third guard, no function over 120 lines, is clippy's
//! `too_many_lines`, with its threshold in `clippy.toml`.) Each failure names the files and
//! says what to do. docs/architecture.md ("Guards") says why each bound is what it is.
//!
//! The import graph is read from the code's own paths, as text: `use` trees and paths in code
//! that start at `crate::` or `super::`, and paths into a module's own children. A path names
//! the file of the longest module it reaches (`crate::metrics::Metrics` is `src/metrics/mod.rs`,
//! `crate::config::shaping::Priority` is `src/config/shaping.rs`). A file's own tests (an
//! inline `#[cfg(test)] mod tests`, or a `tests.rs` beside it) and a child's use of its own
//! parent's items (a folder's `mod.rs` is its face: it declares and re-exports its children)
//! draw no arrow.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a source file may hold.
const MAX_LINES: usize = 800;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !matches!(
                name.as_ref(),
                "target" | "node_modules" | "corpus" | "artifacts" | ".git"
            ) {
                walk(&path, out);
            }
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "rs" | "lua" | "py" | "sh" | "js" | "ts" | "go"))
        {
            out.push(path);
        }
    }
}

/// The product's sources: the library and binary, the benchmarks and load scripts, the fuzz
/// targets, the examples, the Express client, CI's own scripts. The suites under `tests/` are
/// scenarios, read top to bottom, and are not held to the bound.
fn product_sources() -> Vec<PathBuf> {
    let root = root();
    let mut files = Vec::new();
    for dir in [
        "src", "benches", "bench", "fuzz", "examples", "clients", ".ci", "scripts",
    ] {
        walk(&root.join(dir), &mut files);
    }
    files.sort();
    files
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

fn over_long(files: &[(String, usize)], max: usize) -> Vec<String> {
    files
        .iter()
        .filter(|(_, n)| *n > max)
        .map(|(f, n)| format!("  {f}: {n} lines"))
        .collect()
}

#[test]
fn no_source_file_is_over_800_lines() {
    let files: Vec<(String, usize)> = product_sources()
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            (rel(p), text.lines().count())
        })
        .collect();
    assert!(
        files.len() > 150,
        "the walk found the sources: {}",
        files.len()
    );
    let long = over_long(&files, MAX_LINES);
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines:\n{}\n\nSplit each by what its parts do (a folder \
         with a `mod.rs` front and one file per part, shared types in the lowest file), or move \
         a large `#[cfg(test)] mod tests` to a `tests.rs` beside it; then name the new files in \
         docs/architecture.md's map.",
        long.join("\n")
    );
}

/// The lines of `files` that turn the length guard off: an attribute (`allow`, `expect`,
/// `cfg_attr`) that names clippy's `too_many_lines`.
fn guards_turned_off(files: &[(String, String)]) -> Vec<String> {
    let lint = ["too_many", "_lines"].concat();
    files
        .iter()
        .flat_map(|(f, text)| {
            text.lines()
                .enumerate()
                .filter(|(_, l)| l.trim_start().starts_with("#") && l.contains(&lint))
                .map(move |(n, _)| format!("  {f}:{}", n + 1))
        })
        .collect()
}

#[test]
fn no_function_turns_the_length_guard_off() {
    let mut files: Vec<(String, String)> = product_sources()
        .iter()
        .map(|p| (rel(p), std::fs::read_to_string(p).unwrap_or_default()))
        .collect();
    let mut suites = Vec::new();
    walk(&root().join("tests"), &mut suites);
    files.extend(
        suites
            .iter()
            .map(|p| (rel(p), std::fs::read_to_string(p).unwrap_or_default())),
    );
    let off = guards_turned_off(&files);
    assert!(
        off.is_empty(),
        "functions that turn off clippy's too_many_lines:\n{}\n\nRemove the attribute and split \
         the function by step into named functions (docs/architecture.md, \"Guards\").",
        off.join("\n")
    );
    let planted = vec![(
        "src/x.rs".to_owned(),
        ["#[allow(clippy::", "too_many_lines)]\nfn f() {}"].concat(),
    )];
    assert_eq!(guards_turned_off(&planted), vec!["  src/x.rs:1"]);
}

#[test]
fn the_length_guard_names_what_is_over() {
    let files = vec![("src/a.rs".to_owned(), 801), ("src/b.rs".to_owned(), 800)];
    assert_eq!(over_long(&files, 800), vec!["  src/a.rs: 801 lines"]);
}

// ---- the import graph ----

/// A module path (`["http", "proxy", "client"]`; empty for the crate root) for each library
/// file, and back.
struct Modules {
    by_path: BTreeMap<Vec<String>, String>,
}

impl Modules {
    fn of(files: &[(String, String)]) -> Self {
        let by_path = files
            .iter()
            .filter_map(|(f, _)| module_path(f).map(|m| (m, f.clone())))
            .collect();
        Self { by_path }
    }

    /// The file of the longest module `path` reaches, if it reaches one.
    fn file_of(&self, path: &[String]) -> Option<&String> {
        (1..=path.len())
            .rev()
            .find_map(|n| self.by_path.get(&path[..n]))
    }

    fn is_module(&self, path: &[String]) -> bool {
        self.by_path.contains_key(path)
    }
}

/// `src/http/proxy/client.rs` → `http::proxy::client`; `src/metrics/mod.rs` → `metrics`;
/// `src/lib.rs` → the root. None for the binary's own files and for test modules.
fn module_path(file: &str) -> Option<Vec<String>> {
    let inner = file.strip_prefix("src/")?.strip_suffix(".rs")?;
    if inner == "main" || inner == "cli" {
        return None;
    }
    if inner == "lib" {
        return Some(Vec::new());
    }
    let mut parts: Vec<String> = inner.split('/').map(str::to_owned).collect();
    if parts.last().is_some_and(|p| p == "tests") {
        return None;
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    Some(parts)
}

/// The code of a file without comments, string and char literals, and its inline test module.
fn code_of(text: &str) -> String {
    let cut = text
        .find("#[cfg(test)]\nmod tests")
        .or_else(|| text.find("#[cfg(test)]\nmod test "))
        .unwrap_or(text.len());
    let text = &text[..cut];
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'r' if (b.get(i + 1) == Some(&b'#') || b.get(i + 1) == Some(&b'"'))
                && !ident_byte(i.checked_sub(1).map(|p| b[p])) =>
            {
                // A raw string: r"…" or r#"…"#.
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                j += 1;
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                i = j + close.len();
                out.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' => {
                // A char literal ('a', '\n', '\u{..}') or a lifetime ('a): only the first is
                // skipped.
                if b.get(i + 1) == Some(&b'\\') {
                    let mut j = i + 2;
                    while j < b.len() && b[j] != b'\'' {
                        j += 1;
                    }
                    i = j + 1;
                } else if b.get(i + 2) == Some(&b'\'') {
                    i += 3;
                } else {
                    out.push('\'');
                    i += 1;
                }
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

fn ident_byte(b: Option<u8>) -> bool {
    b.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Every path in `code`: `use` trees expanded (`use a::{b, c::d}` gives `a::b` and `a::c::d`),
/// and every other run of `ident::ident…` as it stands.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if ident_byte(Some(b[i])) && !ident_byte(i.checked_sub(1).map(|p| b[p])) {
            let start = i;
            while i < b.len() && ident_byte(Some(b[i])) {
                i += 1;
            }
            let word = &code[start..i];
            let after_colons = start >= 2 && &code[start - 2..start] == "::";
            if word == "use" && !after_colons {
                let end = code[i..].find(';').map_or(code.len(), |e| i + e);
                use_tree(&code[i..end], &mut Vec::new(), &mut out);
                i = end;
                continue;
            }
            if after_colons {
                continue;
            }
            // A path in code: ident (:: ident)*.
            let mut path = vec![word.to_owned()];
            let mut j = i;
            while code[j..].starts_with("::") {
                let s = j + 2;
                let mut e = s;
                while e < b.len() && ident_byte(Some(b[e])) {
                    e += 1;
                }
                if e == s {
                    break;
                }
                path.push(code[s..e].to_owned());
                j = e;
            }
            if path.len() > 1 {
                out.push(path);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// The paths of one `use` tree (the text after `use`, up to its `;`), each under `prefix`.
fn use_tree(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let n = prefix.len();
        prefix.extend(
            head.split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
        let close = tree.rfind('}').unwrap_or(tree.len());
        let inner = &tree[open + 1..close];
        // Split the group at its top-level commas.
        let mut depth = 0;
        let mut from = 0;
        for (k, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    use_tree(&inner[from..k], prefix, out);
                    from = k + 1;
                }
                _ => {}
            }
        }
        use_tree(&inner[from..], prefix, out);
        prefix.truncate(n);
    } else {
        let item = tree.split(" as ").next().unwrap_or("").trim();
        if item.is_empty() {
            return;
        }
        let mut path = prefix.clone();
        path.extend(
            item.split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty() && *s != "self" && *s != "*")
                .map(str::to_owned),
        );
        if !path.is_empty() {
            out.push(path);
        }
    }
}

/// The module `path`, written in module `here`, resolves to: `crate::…`, `super::…`,
/// `self::…`, or a child of `here`. None for anything else (std, other crates, local names).
fn resolve(path: &[String], here: &[String], modules: &Modules) -> Option<Vec<String>> {
    let (mut base, rest): (Vec<String>, &[String]) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (here.to_vec(), &path[1..]),
        "super" => {
            let mut base = here.to_vec();
            let mut k = 0;
            while path.get(k).is_some_and(|p| p == "super") {
                base.pop()?;
                k += 1;
            }
            (base, &path[k..])
        }
        first => {
            let mut child = here.to_vec();
            child.push(first.to_owned());
            if !modules.is_module(&child) {
                return None;
            }
            (here.to_vec(), path)
        }
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Arrows between library files: file → the files it takes names from, each with the paths.
fn arrows(files: &[(String, String)]) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let modules = Modules::of(files);
    let mut out: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (file, text) in files {
        let Some(here) = module_path(file) else {
            continue;
        };
        let entry = out.entry(file.clone()).or_default();
        for path in paths_in(&code_of(text)) {
            let Some(target) = resolve(&path, &here, &modules) else {
                continue;
            };
            let Some(to) = modules.file_of(&target) else {
                continue;
            };
            let to_module = module_path(to).unwrap_or_default();
            // Itself, or one of its own ancestors (a folder's face): no arrow.
            if to == file || here.starts_with(&to_module) {
                continue;
            }
            entry.entry(to.clone()).or_default().insert(path.join("::"));
        }
    }
    out
}

/// The circles of `graph`: each strongly connected set of more than one file (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>) -> Vec<Vec<String>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on.insert(v);
            let graph = self.graph;
            for w in graph.get(v).into_iter().flat_map(|m| m.keys()) {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low[v];
                    self.low.insert(v, lv.min(lw));
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low[v];
                    self.low.insert(v, lv.min(iw));
                }
            }
            if self.low[v] == self.index[v] {
                let mut set = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    set.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if set.len() > 1 {
                    set.sort();
                    self.out.push(set);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out
}

fn describe(
    circles: &[Vec<String>],
    graph: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
) -> String {
    let mut s = String::new();
    for (n, set) in circles.iter().enumerate() {
        s.push_str(&format!("circle {}: {}\n", n + 1, set.join(", ")));
        for from in set {
            for (to, paths) in graph.get(from).into_iter().flatten() {
                if set.contains(to) {
                    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
                    s.push_str(&format!("  {from} -> {to}: {}\n", paths.join(", ")));
                }
            }
        }
    }
    s
}

fn library_files() -> Vec<(String, String)> {
    let mut files = Vec::new();
    walk(&root().join("src"), &mut files);
    files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            (rel(&p), text)
        })
        .collect()
}

#[test]
fn no_import_circle_between_the_library_s_files() {
    let files = library_files();
    let graph = arrows(&files);
    let n: usize = graph.values().map(BTreeMap::len).sum();
    assert!(n > 300, "the graph was read: {n} arrows");
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles between the library's files:\n{}\nBreak each by moving what both sides \
         share down a floor (into a file that neither imports back), or by handing it in as a \
         parameter or a narrow trait the lower file defines; never by a path that hides the \
         import. docs/architecture.md (\"Floors\") says what sits above what.",
        describe(&found, &graph)
    );
}

fn graph_of(files: &[(&str, &str)]) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(f, t)| ((*f).to_owned(), (*t).to_owned()))
        .collect();
    arrows(&files)
}

#[test]
fn the_circle_guard_sees_the_paths_rust_has() {
    let g = graph_of(&[
        ("src/lib.rs", "mod a; mod b; mod c;"),
        ("src/a/mod.rs", "mod x; use crate::b::{self, Thing as T};"),
        ("src/a/x.rs", "use super::Face; fn f() { crate::c::g() }"),
        (
            "src/b.rs",
            "// crate::c::h in a comment\nfn f() { let s = \"crate::c::i\"; }",
        ),
        ("src/c.rs", "use crate::a::x::{One, deep::{Two}};"),
    ]);
    let to = |f: &str| -> Vec<String> {
        g.get(f)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    assert_eq!(to("src/a/mod.rs"), vec!["src/b.rs"]);
    // A child's use of its folder's face draws no arrow; a path in code does.
    assert_eq!(to("src/a/x.rs"), vec!["src/c.rs"]);
    // Comments and strings are not code.
    assert!(to("src/b.rs").is_empty());
    assert_eq!(to("src/c.rs"), vec!["src/a/x.rs"]);
    // c -> a/x -> c is a circle; a/mod -> b is not in it.
    assert_eq!(
        circles(&g),
        vec![vec!["src/a/x.rs".to_owned(), "src/c.rs".to_owned()]]
    );
    // super:: from a file, and a parent's path into its child.
    let g = graph_of(&[
        ("src/lib.rs", "mod http;"),
        ("src/http/mod.rs", "mod m; mod s; fn f() { s::admit(); }"),
        ("src/http/m.rs", "fn f() { super::s::admit() }"),
        ("src/http/s.rs", "use super::m::FleetLimiter;"),
    ]);
    assert_eq!(
        circles(&g),
        vec![vec!["src/http/m.rs".to_owned(), "src/http/s.rs".to_owned()]]
    );
    assert!(describe(&circles(&g), &g)
        .contains("src/http/s.rs -> src/http/m.rs: super::m::FleetLimiter"));
}
