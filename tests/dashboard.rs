//! The shipped Grafana dashboard and Prometheus rules refer only to series the code
//! exports (the names come from the metrics registry, not from a list kept here), every
//! alert has its runbook section in docs/ALERTS.md and a promtool test of it firing and
//! of it silent. No root needed.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

const DASHBOARD: &str = "deploy/grafana/cni-ledger.json";
const RULES: &str = "deploy/prometheus/cni-ledger-rules.yaml";
const RULE_TESTS: &str = "deploy/prometheus/cni-ledger-rules.test.yaml";
const RUNBOOKS: &str = "docs/ALERTS.md";

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn exported() -> BTreeSet<String> {
    cni_ledger::metrics::metric_names().into_iter().collect()
}

/// PromQL words that are not series names: keywords, and aggregation operators (which
/// may be followed by `by (...)` rather than their parenthesis).
const KEYWORDS: [&str; 23] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
];

/// The series names a PromQL expression selects: identifiers outside label matchers,
/// ranges, strings and grouping clauses that are not functions or keywords. Enough of
/// PromQL for the expressions we ship (promtool checks their syntax).
fn series_in(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    let mut skip_group = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += usize::from(chars[i] == '\\') + 1;
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    if chars[i] == '"' {
                        i += 1;
                        while i < chars.len() && chars[i] != '"' {
                            i += usize::from(chars[i] == '\\') + 1;
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            '(' if skip_group => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                skip_group = false;
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let call = j < chars.len() && chars[j] == '(';
                if matches!(word.as_str(), "by" | "without" | "on" | "ignoring")
                    || word.starts_with("group_")
                {
                    skip_group = true;
                } else if !call && !KEYWORDS.contains(&word.as_str()) {
                    names.push(word);
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                // Numbers and durations (5m, 1e3, 0.99).
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn the_expression_reader_finds_series_and_only_series() {
    let e = r#"histogram_quantile(0.99, sum by (network, le) (rate(a_bucket{x=~"$i",n="{b}"}[$__rate_interval]))) > 5 and on (instance) time() - b_seconds offset 5m or bottomk(10, c)"#;
    assert_eq!(series_in(e), ["a_bucket", "b_seconds", "c"]);
}

fn dashboard_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(e)) = m.get("expr") {
                out.push(e.clone());
            }
            m.values().for_each(|v| dashboard_exprs(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_is_valid_json_with_its_rows_variables_and_only_exported_series() {
    let dash: Value = serde_json::from_str(&read(DASHBOARD)).expect("valid JSON");
    let panels = dash["panels"].as_array().expect("panels");
    let rows: Vec<&str> = panels
        .iter()
        .filter(|p| p["type"] == "row")
        .filter_map(|p| p["title"].as_str())
        .collect();
    assert_eq!(
        rows,
        [
            "Chain latency",
            "Outcomes",
            "Leaks released",
            "Address headroom",
            "Agent health"
        ]
    );
    let vars = dash["templating"]["list"].as_array().expect("variables");
    assert!(vars
        .iter()
        .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"));
    assert!(vars.iter().any(|v| v["name"] == "instance"));
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "duplicate id: {p}"
        );
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{}", p["title"]);
        }
    }
    let mut exprs = Vec::new();
    dashboard_exprs(&dash, &mut exprs);
    // Variables' `label_values(<selector>, <label>)`: the selector's series count too.
    for v in vars.iter().filter(|v| v["type"] == "query") {
        let q = v["definition"].as_str().expect("definition");
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|q| q.rsplit_once(','))
            .map(|(sel, _)| sel)
            .unwrap_or_else(|| panic!("not label_values(selector, label): {q}"));
        assert_eq!(v["query"]["query"], q, "{}", v["name"]);
        exprs.push(inner.to_string());
    }
    let exported = exported();
    let mut used = BTreeSet::new();
    for e in &exprs {
        let names = series_in(e);
        assert!(!names.is_empty(), "selects no series: {e}");
        for n in names {
            assert!(exported.contains(&n), "{n} is not exported (in {e})");
            used.insert(n);
        }
    }
    // Every concern the issue names shows: latency, outcomes, leaks, headroom, health.
    for n in [
        "cni_ledger_chain_add_duration_seconds_bucket",
        "cni_ledger_chain_adds_total",
        "cni_ledger_replays_total",
        "cni_ledger_address_headroom_ratio",
        "cni_ledger_gc_runs_total",
    ] {
        assert!(used.contains(n), "the dashboard does not show {n}");
    }
}

/// `expr:` values of the rules file, single-line or block (`expr: |`).
fn rule_exprs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest == "|" || rest == ">" {
            let indent = line.len() - line.trim_start().len();
            let mut block = String::new();
            while i < lines.len()
                && (lines[i].trim().is_empty()
                    || lines[i].len() - lines[i].trim_start().len() > indent)
            {
                block.push_str(lines[i].trim());
                block.push(' ');
                i += 1;
            }
            out.push(block);
        } else {
            out.push(rest.trim_matches(|c| c == '"' || c == '\'').to_string());
        }
    }
    out
}

fn alerts(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- alert:"))
        .map(|a| a.trim().to_string())
        .collect()
}

#[test]
fn the_rules_use_only_exported_series_and_each_alert_has_its_runbook() {
    let rules = read(RULES);
    let exported = exported();
    let exprs = rule_exprs(&rules);
    let alerts = alerts(&rules);
    assert_eq!(exprs.len(), alerts.len(), "one expr per alert");
    for e in &exprs {
        let names = series_in(e);
        assert!(!names.is_empty(), "selects no series: {e}");
        for n in names {
            assert!(exported.contains(&n), "{n} is not exported (in {e})");
        }
    }
    let runbooks = read(RUNBOOKS);
    let headings: BTreeSet<&str> = runbooks
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(str::trim)
        .collect();
    let urls: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("runbook_url:"))
        .map(|u| u.trim().trim_matches('"'))
        .collect();
    assert_eq!(urls.len(), alerts.len(), "one runbook_url per alert");
    for (alert, url) in alerts.iter().zip(&urls) {
        assert!(
            headings.contains(alert.as_str()),
            "no `## {alert}` in {RUNBOOKS}"
        );
        // GitHub's anchor of a heading that is one word: the word in lower case.
        assert_eq!(
            *url,
            format!("{RUNBOOKS}#{}", alert.to_lowercase()),
            "{alert}"
        );
        let section = runbooks
            .split("\n## ")
            .find(|s| s.starts_with(alert.as_str()))
            .expect("section");
        for must in ["cni-ledger", "What it means", "Confirm", "What to do"] {
            assert!(section.contains(must), "{alert}'s runbook lacks {must:?}");
        }
    }
}

#[test]
fn every_alert_is_tested_firing_and_silent() {
    let alerts = alerts(&read(RULES));
    let tests = read(RULE_TESTS);
    let lines: Vec<&str> = tests.lines().collect();
    let mut firing = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(name) = l.trim_start().strip_prefix("alertname:") else {
            continue;
        };
        let exp = lines.get(i + 1).map(|l| l.trim()).unwrap_or_default();
        match exp {
            "exp_alerts: []" => silent.insert(name.trim().to_string()),
            "exp_alerts:" => firing.insert(name.trim().to_string()),
            other => panic!("after alertname {name}: {other}"),
        };
    }
    for a in &alerts {
        assert!(firing.contains(a), "{a} is never tested firing");
        assert!(silent.contains(a), "{a} is never tested silent");
    }
    assert!(tests.contains("- cni-ledger-rules.yaml"));
}

/// The operator's guide lists every family the code exports, and nothing else.
#[test]
fn the_operators_metric_table_is_the_registry() {
    let guide = read("docs/OPERATING.md");
    let table: BTreeSet<String> = guide
        .lines()
        .filter_map(|l| l.strip_prefix("| `cni_ledger_"))
        .filter_map(|rest| rest.split('`').next())
        .map(|name| format!("cni_ledger_{name}"))
        .collect();
    // A histogram's family is the name its three series (`_bucket`, `_sum`, `_count`) share.
    let exported = exported();
    let families: BTreeSet<String> = exported
        .iter()
        .map(|name| {
            name.strip_suffix("_bucket")
                .filter(|f| exported.contains(&format!("{f}_sum")))
                .or_else(|| {
                    ["_sum", "_count"].iter().find_map(|s| {
                        name.strip_suffix(s)
                            .filter(|f| exported.contains(&format!("{f}_bucket")))
                    })
                })
                .unwrap_or(name)
                .to_string()
        })
        .collect();
    for name in &table {
        assert!(
            families.contains(name),
            "docs/OPERATING.md lists {name}, which no code exports"
        );
    }
    for family in &families {
        assert!(
            table.contains(family),
            "{family} is exported but missing from docs/OPERATING.md's metric table"
        );
    }
}
