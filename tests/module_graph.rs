//! The module graph: which top-level module of `src/` uses which, read from the source,
//! against the layering docs/MODULES.md describes. A module may use only modules of a
//! lower layer, so an upward import (and with it any cycle) fails here. Needs no root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers, lowest first. A module may use any module of a lower layer, none of its
/// own layer or above. A new top-level module must be placed here (and in MODULES.md).
const LAYERS: &[&[&str]] = &[
    &["faults", "process", "hostlocal"],
    &["time"],
    &["logging", "sandbox"],
    &["workers", "node_root"],
    &["ledger"],
    &["devices", "conflist", "chain", "replace"],
    &["cni", "injection"],
    &["libcni"],
    &["cri"],
    &["gc"],
    &["metrics"],
    &["agent", "plugin"],
    &["cli"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every library source file with its module path (`["gc", "replay"]` for
/// src/gc/replay.rs); the crate roots and src/bin are not modules of the library.
fn library_files() -> Vec<(PathBuf, Vec<String>)> {
    fn walk(dir: &Path, prefix: &[String], out: &mut Vec<(PathBuf, Vec<String>)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if prefix.is_empty() && name == "bin" {
                    continue;
                }
                let mut p = prefix.to_vec();
                p.push(name);
                walk(&path, &p, out);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                if prefix.is_empty() && (stem == "lib" || stem == "main") {
                    continue;
                }
                let mut p = prefix.to_vec();
                if stem != "mod" {
                    p.push(stem.to_string());
                }
                out.push((path, p));
            }
        }
    }
    let mut out = Vec::new();
    walk(&src_dir(), &[], &mut out);
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Bang,
    Other,
}

/// Rust source as the few tokens a path needs, without comments (doc links are not
/// uses), string and char literals.
fn tokens(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == 'r' && matches!(c.get(i + 1), Some('#') | Some('"')) && {
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            c.get(j) == Some(&'"')
        } {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c[j] == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1;
            loop {
                if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                    i = j + 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push(Tok::Other);
        } else if ch == '"' {
            i += 1;
            while c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Tok::Other);
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{7f}') or a lifetime ('a).
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
            out.push(Tok::Other);
        } else if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(c[start..i].iter().collect()));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok::PathSep);
            i += 2;
        } else {
            out.push(match ch {
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                '!' => Tok::Bang,
                _ => Tok::Other,
            });
            i += 1;
        }
    }
    out
}

fn ident(t: Option<&Tok>) -> Option<&str> {
    match t {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

/// The first segment of each item of a `{a, b::c, d as e}` group starting at `toks[i]`
/// (the `{`).
fn group_heads(toks: &[Tok], mut i: usize) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut at_item_start = true;
    while i < toks.len() {
        match &toks[i] {
            Tok::Open => {
                depth += 1;
                at_item_start = depth == 1;
            }
            Tok::Close => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Tok::Comma if depth == 1 => at_item_start = true,
            Tok::Ident(s) if depth == 1 && at_item_start => {
                heads.push(s.clone());
                at_item_start = false;
            }
            _ => {}
        }
        i += 1;
    }
    heads
}

/// The top-level modules one file names (`crate::x`, `$crate::x`, `crate::{x, y}`,
/// `super::…` reaching the crate root, `crate::m!` for a macro that module defines).
fn uses_of(
    file: &Path,
    module_path: &[String],
    macros: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let src = std::fs::read_to_string(file).unwrap();
    let toks = tokens(&src);
    let mut found = BTreeSet::new();
    let name_after = |toks: &[Tok], i: usize, found: &mut BTreeSet<String>| {
        // toks[i] is what follows `<root>::`.
        match toks.get(i) {
            Some(Tok::Ident(s)) if toks.get(i + 1) == Some(&Tok::Bang) => {
                if let Some(m) = macros.get(s) {
                    found.insert(m.clone());
                }
            }
            Some(Tok::Ident(s)) => {
                found.insert(s.clone());
            }
            Some(Tok::Open) => found.extend(group_heads(toks, i)),
            _ => {}
        }
    };
    // Inline modules (`mod tests { … }`) deepen what `super` climbs from.
    let mut brace_depth = 0usize;
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Open => brace_depth += 1,
            Tok::Close => {
                brace_depth -= 1;
                if inline_mods.last() == Some(&brace_depth) {
                    inline_mods.pop();
                }
            }
            Tok::Ident(s)
                if s == "mod"
                    && ident(toks.get(i + 1)).is_some()
                    && toks.get(i + 2) == Some(&Tok::Open) =>
            {
                inline_mods.push(brace_depth);
            }
            Tok::Ident(s) if s == "crate" && toks.get(i + 1) == Some(&Tok::PathSep) => {
                name_after(&toks, i + 2, &mut found);
            }
            Tok::Ident(s)
                if s == "super"
                    && toks.get(i + 1) == Some(&Tok::PathSep)
                    && !(i >= 2
                        && toks[i - 1] == Tok::PathSep
                        && ident(toks.get(i - 2)) == Some("super")) =>
            {
                let mut n = 0;
                let mut j = i;
                while ident(toks.get(j)) == Some("super") && toks.get(j + 1) == Some(&Tok::PathSep)
                {
                    n += 1;
                    j += 2;
                }
                let depth = module_path.len() + inline_mods.len();
                assert!(
                    n <= depth,
                    "{}: `super` above the crate root ({n} > {depth}, {:?})",
                    file.display(),
                    &toks[i.saturating_sub(8)..(i + 8).min(toks.len())]
                );
                if n == depth {
                    name_after(&toks, j, &mut found);
                }
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// `macro_rules!` names and the top-level module defining each (`info` → `logging`).
fn macro_homes(files: &[(PathBuf, Vec<String>)]) -> BTreeMap<String, String> {
    let mut homes = BTreeMap::new();
    for (path, module_path) in files {
        let toks = tokens(&std::fs::read_to_string(path).unwrap());
        for w in toks.windows(3) {
            if let (Tok::Ident(m), Tok::Bang, Tok::Ident(name)) = (&w[0], &w[1], &w[2]) {
                if m == "macro_rules" {
                    homes.insert(name.clone(), module_path[0].clone());
                }
            }
        }
    }
    homes
}

/// Edges between top-level modules, each with a file that makes it.
fn graph() -> BTreeMap<(String, String), PathBuf> {
    let files = library_files();
    let tops: BTreeSet<String> = files.iter().map(|(_, p)| p[0].clone()).collect();
    let macros = macro_homes(&files);
    let mut edges = BTreeMap::new();
    for (path, module_path) in &files {
        for used in uses_of(path, module_path, &macros) {
            if tops.contains(&used) && used != module_path[0] {
                edges
                    .entry((module_path[0].clone(), used))
                    .or_insert_with(|| path.clone());
            }
        }
    }
    edges
}

fn find_cycle(edges: &BTreeMap<(String, String), PathBuf>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        next.entry(a).or_default().push(b);
    }
    fn visit<'a>(
        n: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|s| *s == n) {
            let mut cycle: Vec<String> = stack[at..].iter().map(|s| s.to_string()).collect();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if !done.insert(n) {
            return None;
        }
        stack.push(n);
        for m in next.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, next, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    for n in next.keys() {
        if let Some(c) = visit(n, &next, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

/// The sibling files of its folder one file names (`super::x`, `super::{x, y}`,
/// `crate::<folder>::x`, the same from an inline module with one more `super`): the
/// uses a circle between files inside a folder is made of. The folder's own `mod.rs`
/// is no sibling (it declares the files, and they use what it holds).
fn sibling_uses(
    file: &Path,
    module_path: &[String],
    siblings: &BTreeSet<String>,
) -> BTreeSet<String> {
    let folder = &module_path[..module_path.len() - 1];
    let toks = tokens(&std::fs::read_to_string(file).unwrap());
    let mut found = BTreeSet::new();
    let take = |toks: &[Tok], i: usize, found: &mut BTreeSet<String>| match toks.get(i) {
        Some(Tok::Ident(s)) => {
            found.insert(s.clone());
        }
        Some(Tok::Open) => found.extend(group_heads(toks, i)),
        _ => {}
    };
    let mut brace_depth = 0usize;
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Open => brace_depth += 1,
            Tok::Close => {
                brace_depth -= 1;
                if inline_mods.last() == Some(&brace_depth) {
                    inline_mods.pop();
                }
            }
            Tok::Ident(s)
                if s == "mod"
                    && ident(toks.get(i + 1)).is_some()
                    && toks.get(i + 2) == Some(&Tok::Open) =>
            {
                inline_mods.push(brace_depth);
            }
            Tok::Ident(s) if s == "crate" && toks.get(i + 1) == Some(&Tok::PathSep) => {
                let mut j = i + 2;
                let mut matched = true;
                for seg in folder {
                    if ident(toks.get(j)) == Some(seg.as_str())
                        && toks.get(j + 1) == Some(&Tok::PathSep)
                    {
                        j += 2;
                    } else {
                        matched = false;
                        break;
                    }
                }
                if matched {
                    take(&toks, j, &mut found);
                }
            }
            Tok::Ident(s)
                if s == "super"
                    && toks.get(i + 1) == Some(&Tok::PathSep)
                    && !(i >= 2
                        && toks[i - 1] == Tok::PathSep
                        && ident(toks.get(i - 2)) == Some("super")) =>
            {
                let mut n = 0;
                let mut j = i;
                while ident(toks.get(j)) == Some("super") && toks.get(j + 1) == Some(&Tok::PathSep)
                {
                    n += 1;
                    j += 2;
                }
                if n == inline_mods.len() + 1 {
                    take(&toks, j, &mut found);
                }
            }
            _ => {}
        }
        i += 1;
    }
    let own = &module_path[module_path.len() - 1];
    found
        .into_iter()
        .filter(|f| siblings.contains(f) && f != own)
        .collect()
}

/// Edges between the files of each folder of src/ (`devices/naming -> devices/select`),
/// each with the file that makes it.
fn file_graph() -> BTreeMap<(String, String), PathBuf> {
    let files = library_files();
    let mut folders: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for (path, module_path) in &files {
        let is_mod_rs = path.file_name().is_some_and(|n| n == "mod.rs");
        if module_path.len() >= 2 && !is_mod_rs {
            let (name, folder) = module_path.split_last().unwrap();
            folders
                .entry(folder.to_vec())
                .or_default()
                .insert(name.clone());
        }
    }
    let mut edges = BTreeMap::new();
    for (path, module_path) in &files {
        let is_mod_rs = path.file_name().is_some_and(|n| n == "mod.rs");
        if module_path.len() < 2 || is_mod_rs {
            continue;
        }
        let folder = &module_path[..module_path.len() - 1];
        let siblings = &folders[folder];
        for used in sibling_uses(path, module_path, siblings) {
            let mut to = folder.to_vec();
            to.push(used);
            edges
                .entry((module_path.join("/"), to.join("/")))
                .or_insert_with(|| path.clone());
        }
    }
    edges
}

#[test]
fn no_import_circle_between_the_files_of_a_folder() {
    let edges = file_graph();
    // The reader itself must see the graph: this edge exists for as long as the code
    // is what it is (a device's name is chosen from what the selection read).
    assert!(
        edges.contains_key(&("devices/naming".to_string(), "devices/select".to_string())),
        "the reader missed devices/naming -> devices/select: {:#?}",
        edges.keys()
    );
    if let Some(cycle) = find_cycle(&edges) {
        let files: Vec<String> = cycle
            .windows(2)
            .map(|w| format!("{}", edges[&(w[0].clone(), w[1].clone())].display()))
            .collect();
        panic!(
            "import circle between files: {} (made in {})",
            cycle.join(" -> "),
            files.join(", ")
        );
    }
}

#[test]
fn the_file_reader_sees_siblings_by_super_crate_and_groups_only() {
    let dir = std::env::temp_dir().join(format!("module-graph-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("x.rs");
    std::fs::write(
        &file,
        r##"
        //! See `super::doc` (a doc link, not a use).
        use super::{a::A, b};
        use crate::devices::c::C;
        use crate::ledger::d;
        use super::Thing;
        fn f() { let s = "super::e"; }
        mod tests { use super::super::f; use super::g; }
        "##,
    )
    .unwrap();
    let siblings: BTreeSet<String> = ["a", "b", "c", "d", "doc", "e", "f", "g", "x"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let found = sibling_uses(&file, &["devices".into(), "x".into()], &siblings);
    std::fs::remove_dir_all(&dir).unwrap();
    let want: BTreeSet<String> = ["a", "b", "c", "f"].iter().map(|s| s.to_string()).collect();
    assert_eq!(found, want);
}

#[test]
fn every_top_level_module_has_a_layer_and_a_line_in_modules_md() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/MODULES.md"))
            .unwrap();
    let tops: BTreeSet<String> = library_files()
        .into_iter()
        .map(|(_, p)| p[0].clone())
        .collect();
    for top in &tops {
        assert!(
            layer_of(top).is_some(),
            "src/{top} has no layer in tests/module_graph.rs"
        );
        assert!(
            doc.contains(&format!("`{top}`")),
            "docs/MODULES.md does not name `{top}`"
        );
    }
    for layer in LAYERS {
        for m in *layer {
            assert!(
                tops.contains(*m),
                "layer names `{m}`, which src/ does not have"
            );
        }
    }
}

#[test]
fn no_module_uses_its_own_layer_or_above_and_none_is_in_a_cycle() {
    let edges = graph();
    // The reader itself must see the graph: these edges exist for as long as the code
    // is what it is (the plugin records through the ledger; the CLI runs gc).
    for (a, b) in [("plugin", "ledger"), ("cli", "gc"), ("ledger", "time")] {
        assert!(
            edges.contains_key(&(a.to_string(), b.to_string())),
            "the reader missed {a} -> {b}: {:#?}",
            edges.keys()
        );
    }
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
    let upward: Vec<String> = edges
        .iter()
        .filter(|((a, b), _)| layer_of(b) >= layer_of(a))
        .map(|((a, b), f)| format!("{a} -> {b} ({})", f.display()))
        .collect();
    assert!(
        upward.is_empty(),
        "uses not allowed by the layering (docs/MODULES.md):\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_reader_sees_groups_super_and_macros_and_not_comments() {
    let dir = std::env::temp_dir().join(format!("module-graph-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("x.rs");
    std::fs::write(
        &file,
        r##"
        //! See `crate::cli` (a doc link, not a use).
        use crate::{ledger::{Key, Record}, time};
        use super::super::gc::Report;
        fn f() { let s = "crate::agent"; let r = r#"crate::plugin"#; let c = '{'; crate::info!("x"); }
        mod tests { use super::super::super::cri; use super::*; }
        "##,
    )
    .unwrap();
    let macros = BTreeMap::from([("info".to_string(), "logging".to_string())]);
    let found = uses_of(&file, &["devices".into(), "failure_note".into()], &macros);
    std::fs::remove_dir_all(&dir).unwrap();
    let want: BTreeSet<String> = ["ledger", "time", "gc", "logging", "cri"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(found, want);
}
