//! docs/REFERENCE.md against the code: every flag of every subcommand of the clap
//! definition with its default, every key of the ledger's conflist entry with its type and
//! default, and the CRI sockets `--cri-endpoint auto` looks for. A flag or key in the code
//! but not in the file fails, and so does one in the file but not in the code.
//! Needs no root and no network: it reads one file and the CLI's definition.

use std::collections::BTreeMap;

fn reference() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/REFERENCE.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The cells of a Markdown table row, trimmed; None for any other line.
fn cells(line: &str) -> Option<Vec<&str>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(str::trim).collect())
}

/// A cell's text without the backticks around it: `` `60` `` is `60`.
fn plain(cell: &str) -> &str {
    cell.trim_matches('`')
}

/// A table's place: the `## ` part and the `### ` section it stands in (the part's own
/// heading again when it stands before any section).
type Place = (String, String);

/// Table rows whose first cell is a backticked name, by place: name -> the row's other
/// cells.
fn tables(doc: &str) -> BTreeMap<Place, BTreeMap<String, Vec<String>>> {
    let mut out: BTreeMap<Place, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let (mut part, mut section) = (String::new(), String::new());
    for line in doc.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            part = h.trim().to_string();
            section = part.clone();
            continue;
        }
        if let Some(h) = line.strip_prefix("### ") {
            section = h.trim().to_string();
            continue;
        }
        let Some(row) = cells(line) else { continue };
        let name = row[0];
        if !(name.starts_with('`') && name.ends_with('`') && name.len() > 2) {
            continue;
        }
        let previous = out
            .entry((part.clone(), section.clone()))
            .or_default()
            .insert(
                plain(name).to_string(),
                row[1..].iter().map(|c| c.to_string()).collect(),
            );
        assert!(previous.is_none(), "{section}: {name} is listed twice");
    }
    out
}

/// The rows of every table in a part.
fn part(
    tables: &BTreeMap<Place, BTreeMap<String, Vec<String>>>,
    name: &str,
) -> BTreeMap<String, Vec<String>> {
    let mut rows = BTreeMap::new();
    for ((p, section), table) in tables {
        if p == name {
            for (k, v) in table {
                assert!(
                    rows.insert(k.clone(), v.clone()).is_none(),
                    "{section}: {k} is listed twice in {name}"
                );
            }
        }
    }
    rows
}

/// What the reference shows as a flag's default: clap's default values, or `none`.
fn clap_default(arg: &clap::Arg) -> String {
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if values.is_empty() {
        "none".into()
    } else {
        values.join(" ")
    }
}

#[test]
fn every_flag_is_documented_with_its_default() {
    let doc = reference();
    let tables = tables(&doc);
    let mut cmd = cni_ledger::cli::command();
    cmd.build();
    let mut problems = Vec::new();
    let mut seen_sections = Vec::new();
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let section = format!("`cni-ledger {}`", sub.get_name());
        seen_sections.push(section.clone());
        let Some(rows) = tables.get(&("Command line".to_string(), section.clone())) else {
            problems.push(format!("no section ### {section}"));
            continue;
        };
        let mut flags = Vec::new();
        for arg in sub.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if arg.is_hide_set() || long == "help" || long == "version" {
                continue;
            }
            let flag = format!("--{long}");
            flags.push(flag.clone());
            // Columns: flag | value | default | meaning.
            match rows.get(&flag) {
                None => problems.push(format!("{section}: {flag} is not documented")),
                Some(row) => {
                    let want = clap_default(arg);
                    let got = row.get(1).map(|c| plain(c)).unwrap_or("");
                    if got != want {
                        problems.push(format!(
                            "{section}: {flag} default is `{want}` in the code, `{got}` in REFERENCE.md"
                        ));
                    }
                }
            }
        }
        for documented in rows.keys() {
            if documented.starts_with("--") && !flags.contains(documented) {
                problems.push(format!(
                    "{section}: {documented} is documented but the CLI has no such flag"
                ));
            }
        }
    }
    for (_, section) in tables.keys() {
        if section.starts_with("`cni-ledger ") && !seen_sections.contains(section) {
            problems.push(format!(
                "### {section} documents a subcommand the CLI lacks"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/REFERENCE.md drifted from the CLI:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn every_plugin_key_is_documented_with_its_type_and_default() {
    let doc = reference();
    let tables = tables(&doc);
    // Columns: key | type | default | meaning; the keys stand in one or more tables
    // of the "Plugin configuration" part (the ledger's options, the runtime's keys).
    let rows = part(&tables, "Plugin configuration");
    let mut problems = Vec::new();
    for key in cni_ledger::cni::config::KEYS {
        match rows.get(key.name) {
            None => problems.push(format!("{} is not documented", key.name)),
            Some(row) => {
                let ty = row.first().map(|c| plain(c)).unwrap_or("");
                let default = row.get(1).map(|c| plain(c)).unwrap_or("");
                if ty != key.json_type {
                    problems.push(format!(
                        "{}: type `{}` in the code, `{ty}` in REFERENCE.md",
                        key.name, key.json_type
                    ));
                }
                if default != key.default {
                    problems.push(format!(
                        "{}: default `{}` in the code, `{default}` in REFERENCE.md",
                        key.name, key.default
                    ));
                }
            }
        }
    }
    for name in rows.keys() {
        if !cni_ledger::cni::config::KEYS.iter().any(|k| k.name == name) {
            problems.push(format!(
                "{name} is documented but the parser reads no such key"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/REFERENCE.md drifted from src/cni/config.rs:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn the_default_cri_sockets_are_the_ones_listed() {
    let doc = reference();
    let tables = tables(&doc);
    let listed: Vec<String> = part(&tables, "CRI sockets `auto` looks for")
        .into_keys()
        .collect();
    let code: Vec<String> = cni_ledger::cri::runtimes::DEFAULT_SOCKETS
        .iter()
        .map(|rel| format!("/{rel}"))
        .collect();
    assert_eq!(
        listed.len(),
        code.len(),
        "REFERENCE.md lists {listed:?}, the code {code:?}"
    );
    for socket in &code {
        assert!(
            listed.contains(socket),
            "{socket} (DEFAULT_SOCKETS) is not in REFERENCE.md's table"
        );
    }
}
