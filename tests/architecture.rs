//! docs/architecture.md is the map of the house: every source file under `src/` (Rust and the
//! Redis scripts) is named there, by its whole path in a row of its own, or by its file name in
//! the row of a folder above it (`src/limiter/` naming `gcra.rs`). A file added without a row
//! fails here, with the rows to write.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs" || e == "lua") {
            out.push(path);
        }
    }
}

/// Whether `name` stands in `row` as a whole file name (not the end of a longer one).
fn names(row: &str, name: &str) -> bool {
    row.match_indices(name).any(|(at, _)| {
        let before = row[..at].chars().next_back();
        let after = row[at + name.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '/')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

fn named(doc: &str, rows: &[&str], file: &str) -> bool {
    if doc.contains(&format!("`{file}`")) {
        return true;
    }
    let parts: Vec<&str> = file.split('/').collect();
    let Some(base) = parts.last() else {
        return false;
    };
    (1..parts.len()).any(|i| {
        let folder = format!("`{}/`", parts[..i].join("/"));
        rows.iter().any(|row| {
            row.split('|')
                .nth(1)
                .is_some_and(|first| first.contains(&folder))
                && names(row, base)
        })
    })
}

#[test]
fn every_source_file_is_named_in_the_architecture_map() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("the map");
    let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `")).collect();
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    assert!(
        files.len() > 100,
        "the walk found the sources: {}",
        files.len()
    );
    let mut missing: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(&root).ok()?.to_str()?.replace('\\', "/");
            (!named(&doc, &rows, &rel)).then_some(rel)
        })
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names no row for these files; add `| \\`<path>\\` | what it does |` under Modules:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_file_name_counts_only_whole_and_only_in_its_folder_s_row() {
    let doc =
        "| `src/limiter/` | Pure math: `gcra.rs` and `fixed_window.rs`. |\n| `src/x.rs` | x |";
    let rows: Vec<&str> = doc.lines().collect();
    assert!(named(doc, &rows, "src/limiter/gcra.rs"));
    assert!(named(doc, &rows, "src/x.rs"));
    assert!(
        !named(doc, &rows, "src/limiter/window.rs"),
        "a part of a name"
    );
    assert!(
        !named(doc, &rows, "src/store/gcra.rs"),
        "another folder's row"
    );
    assert!(!named(doc, &rows, "src/limiter/mod.rs"));
}
