//! Finding and reading network configuration lists the way libcni does: `.conflist`
//! files by sorted name first, then `.conf`/`.json` files that hold a `plugins` list.

use anyhow::{Context, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub struct Found {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    pub list: Value,
}

fn files_with(dir: &Path, exts: &[&str]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    for item in rd {
        let path = item?.path();
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if exts.contains(&ext) && path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// Parses a document as a conflist: an object with a `name` and a `plugins` array.
pub fn parse(bytes: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    (v.get("name")?.is_string() && v.get("plugins")?.is_array()).then_some(v)
}

/// The conflist named `name` in `dir`, if any. Unreadable or foreign files are skipped.
pub fn find(dir: &Path, name: &str) -> Result<Option<Found>> {
    // One listing, .conflist files first (libcni's order), each group sorted by name.
    let mut files = files_with(dir, &["conflist", "conf", "json"])?;
    files.sort_by_key(|p| p.extension().is_none_or(|e| e != "conflist"));
    for path in files {
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        if let Some(list) = parse(&bytes) {
            if list["name"] == name {
                return Ok(Some(Found { path, bytes, list }));
            }
        }
    }
    Ok(None)
}

/// What identifies a network's chain apart from the ledger's own place in it: a digest
/// of its name and plugins, the `ledger_type` entries left out and keys in sorted order,
/// so the conflist before and after `inject` (or as another program reformatted it)
/// digests alike, while any other change to the chain does not.
pub fn chain_digest(list: &Value, ledger_type: &str) -> String {
    use sha2::{Digest, Sha256};
    let plugins: Vec<Value> = plugins(list)
        .iter()
        .filter(|p| plugin_type(p) != ledger_type)
        .map(sorted)
        .collect();
    let canonical = serde_json::json!([list.get("name"), plugins]);
    let digest = Sha256::digest(canonical.to_string().as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// `v` with every object's keys in sorted order.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

pub fn plugins(list: &Value) -> &[Value] {
    list.get("plugins")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

pub fn plugin_type(plugin: &Value) -> &str {
    plugin.get("type").and_then(Value::as_str).unwrap_or("")
}

/// The capabilities a plugin entry declares as `true`.
pub fn declared_capabilities(plugin: &Value) -> Vec<String> {
    plugin
        .get("capabilities")
        .and_then(Value::as_object)
        .map(|caps| {
            caps.iter()
                .filter(|(_, v)| v.as_bool() == Some(true))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_digest_ignores_the_ledger_and_key_order_only() {
        let d = |text: &str| chain_digest(&parse(text.as_bytes()).unwrap(), "cni-ledger");
        let plain =
            d(r#"{"name":"n","plugins":[{"type":"bridge","bridge":"b0"},{"type":"portmap"}]}"#);
        assert_eq!(
            plain,
            d(
                r#"{"plugins":[{"type":"cni-ledger","ledgerDir":"/x"},{"bridge":"b0","type":"bridge"},{"type":"portmap"}],"name":"n","cniVersion":"1.0.0"}"#
            )
        );
        assert_ne!(
            plain,
            d(r#"{"name":"n","plugins":[{"type":"bridge","bridge":"b1"},{"type":"portmap"}]}"#)
        );
        assert_ne!(
            plain,
            d(r#"{"name":"m","plugins":[{"type":"bridge","bridge":"b0"},{"type":"portmap"}]}"#)
        );
        assert_ne!(
            plain,
            d(r#"{"name":"n","plugins":[{"type":"portmap"},{"type":"bridge","bridge":"b0"}]}"#)
        );
    }

    #[test]
    fn finds_by_name_conflist_first() {
        let dir = std::env::temp_dir().join(format!("cl-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("10-a.conf"),
            br#"{"name":"n","plugins":[{"type":"a"}]}"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("20-b.conflist"),
            br#"{"name":"n","plugins":[{"type":"b"}]}"#,
        )
        .unwrap();
        std::fs::write(dir.join("05-bad.conflist"), b"{not json").unwrap();
        std::fs::write(
            dir.join("30-single.conf"),
            br#"{"name":"s","type":"bridge"}"#,
        )
        .unwrap();
        let f = find(&dir, "n").unwrap().unwrap();
        assert_eq!(plugin_type(&plugins(&f.list)[0]), "b");
        assert!(find(&dir, "s").unwrap().is_none());
        assert!(find(&dir, "zz").unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn capabilities_only_true_ones() {
        let p: Value = serde_json::json!({"type":"x","capabilities":{"a":true,"b":false,"c":1}});
        assert_eq!(declared_capabilities(&p), vec!["a".to_string()]);
    }
}
