//! The docs' maps of the tree against the tree, as tests/reference.rs holds the flags:
//! docs/README.md ("Where things are"), docs/MODULES.md and tests/README.md. Needs no
//! root and no network: it reads three files and lists directories.
//!
//! The rules, one per test below:
//! - Every path these files name in backticks exists. A path is a backticked token whose first
//!   segment is a top-level entry of the repository (`src/gc/`, `scripts/test.sh`);
//!   `target/` (made by scripts/test.sh), absolute paths and patterns (`<platform>`, `*`)
//!   are not paths of the tree. In a table row whose first cell is a folder, a bare file
//!   name (`test.sh`) or folder (`base/`) in the other cells is inside that folder.
//! - Every file is named: by its own path, or by a folder holding it (`src/gc/` names
//!   src/gc/*: each module's first lines say what it owns). docs/README.md so covers
//!   src/; tests/README.md names every test binary (`tests/<name>.rs`) in its tiers table
//!   (and only binaries there and among the fetched tools' users) and every folder of
//!   tests/ in its harness list. A harness folder whose files the list
//!   names one by one (tests/common/) must name all of them.
//! - What the harness list says is in a file is there: a backticked Rust name (`Netns`,
//!   `driver()`, `require_root!()`) under a file's entry is an item defined in that file;
//!   under a folder's entry, a type (`PrivateRun`) or a call (`name()`) is defined in one of
//!   its files. docs/MODULES.md's table names exactly the top-level modules of src/.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines under `heading` (a whole heading line, `### Where things are`) down to the
/// next heading of its level or above.
fn section<'a>(doc: &'a str, heading: &str) -> Vec<&'a str> {
    let level = heading.chars().take_while(|&c| c == '#').count();
    let is_heading = |l: &str| {
        let n = l.chars().take_while(|&c| c == '#').count();
        n > 0 && l[n..].starts_with(' ')
    };
    let mut lines = doc.lines().skip_while(|l| l.trim_end() != heading);
    assert!(lines.next().is_some(), "no heading {heading:?}");
    lines
        .take_while(|l| !(is_heading(l) && l.chars().take_while(|&c| c == '#').count() <= level))
        .collect()
}

/// The backticked tokens of some lines (outside fenced code blocks).
fn ticks(lines: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in lines {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.extend(ticked(line));
        }
    }
    out
}

fn ticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

/// The top-level entries of the repository that paths may start with.
fn tops() -> BTreeSet<String> {
    std::fs::read_dir(repo())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "target" && n != ".git")
        .collect()
}

/// Whether a token is a path of the tree (see the rules above).
fn is_tree_path(token: &str, tops: &BTreeSet<String>) -> bool {
    if token.contains(|c: char| c.is_whitespace() || "<>*{}".contains(c)) {
        return false;
    }
    // A top-level entry alone is a path too, and trivially there.
    tops.contains(token.split('/').next().unwrap_or(""))
}

/// Whether a bare token names a file or folder (`test.sh`, `base/`), not code.
fn is_bare_file(token: &str) -> bool {
    const EXTS: &[&str] = &[
        "rs", "sh", "md", "toml", "go", "proto", "yaml", "yml", "json", "txt",
    ];
    if token.contains(|c: char| c.is_whitespace() || "<>*{}()".contains(c)) {
        return false;
    }
    let folder = token.ends_with('/') && !token[..token.len() - 1].contains('/');
    let file = !token.contains('/')
        && Path::new(token)
            .extension()
            .is_some_and(|e| EXTS.contains(&e.to_string_lossy().as_ref()));
    folder || file
}

/// Every file under a folder of the repository, as paths relative to the repository.
fn files_under(rel: &str) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join(rel), &mut out);
    let mut out: Vec<String> = out
        .into_iter()
        .map(|p| {
            p.strip_prefix(repo())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    out.sort();
    out
}

/// The paths among `tokens` that do not exist.
fn missing_paths(tokens: &[String]) -> Vec<String> {
    let tops = tops();
    tokens
        .iter()
        .filter(|t| is_tree_path(t, &tops) && !repo().join(t.as_str()).exists())
        .cloned()
        .collect()
}

/// The cells of a Markdown table row, trimmed; None for any other line.
fn cells(line: &str) -> Option<Vec<&str>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(str::trim).collect())
}

/// A Rust name as the docs write it (`Netns`, `driver()`, `require_root!()`), without
/// its call or macro marks; None for anything else.
fn rust_name(token: &str) -> Option<&str> {
    let name = token
        .strip_suffix("!()")
        .or_else(|| token.strip_suffix("()"))
        .unwrap_or(token);
    let ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_alphanumeric() || c == '_');
    ok.then_some(name)
}

/// Whether `src` defines an item called `name`.
fn defines(src: &str, name: &str) -> bool {
    const KINDS: &[&str] = &[
        "fn ",
        "struct ",
        "enum ",
        "type ",
        "const ",
        "static ",
        "trait ",
        "mod ",
        "macro_rules! ",
    ];
    KINDS.iter().any(|k| {
        let needle = format!("{k}{name}");
        src.match_indices(&needle).any(|(i, _)| {
            let before = src[..i].chars().next_back();
            let after = src[i + needle.len()..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    })
}

#[test]
fn docs_readme_names_existing_paths_and_every_source_file() {
    let doc = read("docs/README.md");
    let lines: Vec<&str> = doc.lines().collect();
    let missing = missing_paths(&ticks(&lines));
    assert!(
        missing.is_empty(),
        "docs/README.md names paths that do not exist: {missing:?}"
    );
    let sec = section(&doc, "### Where things are");
    let tokens = ticks(&sec);
    // Bare names in a folder's row are inside that folder.
    for line in &sec {
        let Some(row) = cells(line) else { continue };
        let first = ticked(row[0]);
        let [folder] = first.as_slice() else { continue };
        if !folder.ends_with('/') {
            continue;
        }
        for t in row[1..].iter().flat_map(|c| ticked(c)) {
            if is_bare_file(&t) {
                assert!(
                    repo().join(folder).join(&t).exists(),
                    "docs/README.md: `{t}` in the row of `{folder}` is not in {folder}"
                );
            }
        }
    }
    let named: BTreeSet<&str> = tokens.iter().map(String::as_str).collect();
    let unnamed: Vec<String> = files_under("src")
        .into_iter()
        .filter(|f| {
            !named.contains(f.as_str())
                && !named.iter().any(|n| n.ends_with('/') && f.starts_with(n))
        })
        .collect();
    assert!(
        unnamed.is_empty(),
        "docs/README.md (Where things are) names neither these files nor a folder of theirs: \
         {unnamed:?}"
    );
}

#[test]
fn modules_md_names_existing_paths_and_exactly_the_top_level_modules() {
    let doc = read("docs/MODULES.md");
    let lines: Vec<&str> = doc.lines().collect();
    let missing = missing_paths(&ticks(&lines));
    assert!(
        missing.is_empty(),
        "docs/MODULES.md names paths that do not exist: {missing:?}"
    );
    // Rows `| <layer> | `module` | … |`.
    let listed: BTreeSet<String> = lines
        .iter()
        .filter_map(|l| cells(l))
        .filter(|row| row.len() > 2 && row[0].parse::<u32>().is_ok())
        .map(|row| row[1].trim_matches('`').to_string())
        .collect();
    let actual: BTreeSet<String> = std::fs::read_dir(repo().join("src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_string_lossy().into_owned();
            if p.is_dir() {
                (p.join("mod.rs").exists()).then_some(name)
            } else {
                let stem = name.strip_suffix(".rs")?;
                (stem != "lib" && stem != "main").then(|| stem.to_string())
            }
        })
        .collect();
    assert_eq!(
        listed, actual,
        "docs/MODULES.md's table (left) against src/'s top-level modules (right)"
    );
}

#[test]
fn tests_readme_names_existing_paths_and_every_test_binary() {
    let doc = read("tests/README.md");
    let lines: Vec<&str> = doc.lines().collect();
    let missing = missing_paths(&ticks(&lines));
    assert!(
        missing.is_empty(),
        "tests/README.md names paths that do not exist: {missing:?}"
    );
    // The tiers table: `| tier | binaries | needs |`; a bare name is a test binary.
    let mut tiers = BTreeSet::new();
    for line in section(&doc, "## Tiers") {
        let Some(row) = cells(line) else { continue };
        if row.len() < 2 {
            continue;
        }
        for t in ticked(row[1]) {
            if rust_name(&t) == Some(t.as_str()) {
                assert!(
                    repo().join(format!("tests/{t}.rs")).exists(),
                    "tests/README.md's tiers name `{t}`, but there is no tests/{t}.rs"
                );
                tiers.insert(t);
            }
        }
    }
    let binaries: BTreeSet<String> = std::fs::read_dir(repo().join("tests"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            name.strip_suffix(".rs").map(str::to_string)
        })
        .collect();
    // The tools table's users are test binaries too.
    for line in section(&doc, "## Where fetched tools live") {
        let Some(row) = cells(line) else { continue };
        for t in ticked(row.last().unwrap()) {
            if rust_name(&t) == Some(t.as_str()) {
                assert!(
                    binaries.contains(&t),
                    "tests/README.md's tools table names `{t}`, but there is no tests/{t}.rs"
                );
            }
        }
    }
    let untiered: Vec<&String> = binaries.difference(&tiers).collect();
    assert!(
        untiered.is_empty(),
        "tests/README.md's tiers table does not name these test binaries: {untiered:?}"
    );
}

/// One entry of the harness list: a folder of tests/ (`- `tests/common/` — …`), with
/// its text and its files' entries (`  - `mod.rs`: …`).
struct Harness {
    folder: String,
    text: String,
    files: Vec<(String, String)>,
}

fn harnesses(doc: &str) -> Vec<Harness> {
    let mut out: Vec<Harness> = Vec::new();
    // Which entry a continuation line belongs to: None, the folder's, or a file's.
    let mut in_file = false;
    for line in section(doc, "## Harnesses") {
        let indent = line.len() - line.trim_start().len();
        let body = line.trim_start();
        if let Some(item) = body.strip_prefix("- ") {
            let head = ticked(item).into_iter().next().unwrap_or_default();
            if indent == 0 {
                assert!(
                    head.starts_with("tests/") && head.ends_with('/'),
                    "tests/README.md: a harness entry starts with its folder: {line:?}"
                );
                out.push(Harness {
                    folder: head,
                    text: item.to_string(),
                    files: Vec::new(),
                });
                in_file = false;
            } else {
                let h = out.last_mut().expect("a file's entry under a folder's");
                h.files.push((head, item.to_string()));
                in_file = true;
            }
        } else if !body.is_empty() {
            let Some(h) = out.last_mut() else { continue };
            match h.files.last_mut() {
                Some((_, text)) if in_file => text.push_str(&format!(" {body}")),
                _ => h.text.push_str(&format!(" {body}")),
            }
        } else {
            in_file = false;
        }
    }
    out
}

#[test]
fn tests_readme_lists_every_harness_and_what_each_file_holds() {
    let doc = read("tests/README.md");
    let list = harnesses(&doc);
    let folders: BTreeSet<String> = std::fs::read_dir(repo().join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| format!("tests/{}/", p.file_name().unwrap().to_string_lossy()))
        .collect();
    let listed: BTreeSet<String> = list.iter().map(|h| h.folder.clone()).collect();
    assert_eq!(
        listed, folders,
        "tests/README.md's harness list (left) against the folders of tests/ (right)"
    );
    let mut wrong = Vec::new();
    for h in &list {
        if h.files.is_empty() {
            // Items the folder's entry names: types and calls, in any of its files.
            let sources: String = files_under(&h.folder)
                .iter()
                .filter(|f| f.ends_with(".rs"))
                .map(|f| read(f))
                .collect();
            for t in ticked(&h.text) {
                let Some(name) = rust_name(&t) else { continue };
                let item = t.ends_with("()") || name.starts_with(char::is_uppercase);
                if item && !defines(&sources, name) {
                    wrong.push(format!("`{t}` is not defined in {}", h.folder));
                }
            }
            continue;
        }
        // A folder listed file by file: every file named, each file's items in it.
        let named: BTreeSet<String> = h
            .files
            .iter()
            .map(|(f, _)| format!("{}{f}", h.folder))
            .collect();
        for f in files_under(&h.folder) {
            if !named.contains(&f) {
                wrong.push(format!("{f} is not listed under {}", h.folder));
            }
        }
        for (file, text) in &h.files {
            let path = format!("{}{file}", h.folder);
            let Ok(src) = std::fs::read_to_string(repo().join(&path)) else {
                wrong.push(format!("{path} does not exist"));
                continue;
            };
            for t in ticked(text).iter().skip(1) {
                if let Some(name) = rust_name(t) {
                    if !defines(&src, name) {
                        wrong.push(format!("`{t}` is not defined in {path}"));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "tests/README.md's harness list against the files:\n{}",
        wrong.join("\n")
    );
}

/// The checks above must be able to fail: the helpers on made-up text.
#[test]
fn the_rules_catch_what_they_are_for() {
    let tops = tops();
    assert!(is_tree_path("src/gc/", &tops));
    assert!(is_tree_path("src/metrics.rs", &tops));
    assert!(is_tree_path("Containerfile", &tops));
    assert!(!is_tree_path("target/kustomize", &tops));
    assert!(!is_tree_path(
        "deploy/kubernetes/overlays/<platform>/",
        &tops
    ));
    assert!(!is_tree_path("cli::command()", &tops));
    assert_eq!(
        missing_paths(&["src/metrics.rs".into(), "src/metrics/".into()]),
        ["src/metrics.rs"]
    );
    assert!(is_bare_file("test.sh") && is_bare_file("base/"));
    assert!(!is_bare_file("runtime.v1") && !is_bare_file("KEYS"));
    assert!(defines("pub struct Netns {", "Netns"));
    assert!(defines("macro_rules! require_root {", "require_root"));
    assert!(!defines("pub struct NetnsX;", "Netns"));
    assert!(!defines("let x = Netns::new();", "Netns"));
    assert_eq!(rust_name("require_root!()"), Some("require_root"));
    assert_eq!(rust_name("ip netns add"), None);
    let doc = "## Harnesses\n\n- `tests/common/` — base.\n  - `mod.rs`: `Fixture`, `Netns`\n    \
               (more) `TempDir`.\n- `tests/rel/` — a `World`.\n\n## Next\n";
    let h = harnesses(doc);
    assert_eq!(h.len(), 2);
    assert_eq!(h[0].files.len(), 1);
    assert_eq!(
        ticked(&h[0].files[0].1),
        ["mod.rs", "Fixture", "Netns", "TempDir"]
    );
    assert_eq!(ticked(&h[1].text), ["tests/rel/", "World"]);
}
