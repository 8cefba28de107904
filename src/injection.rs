//! The ledger's place in a conflist, shared by `cni-ledger inject` and the node agent:
//! first in the chain, declaring the union of the chain's capabilities (and nothing else:
//! runtimes read a declared capability as "the chain handles it"). Files are replaced by
//! rename, so a runtime watching the directory never reads half a file.

use crate::conflist;
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Options written into the ledger's entry.
#[derive(Default)]
pub struct EntryOptions<'a> {
    pub ledger_dir: Option<&'a Path>,
    pub conf_dir: Option<&'a Path>,
}

/// Returns the new conflist, or an error saying why this document cannot take a ledger.
pub fn transform(
    doc: &Value,
    plugin_type: &str,
    opts: &EntryOptions,
    remove: bool,
) -> Result<Value> {
    let Some(obj) = doc.as_object() else {
        bail!("not a JSON object");
    };
    let Some(plugins) = obj.get("plugins").and_then(Value::as_array) else {
        if obj.contains_key("type") {
            bail!("a single-plugin configuration cannot be chained; convert it to a .conflist with a \"plugins\" list first");
        }
        bail!("no \"plugins\" list: not a conflist");
    };
    let (ours, others): (Vec<&Value>, Vec<&Value>) = plugins
        .iter()
        .partition(|p| conflist::plugin_type(p) == plugin_type);
    let mut new_plugins: Vec<Value> = Vec::with_capacity(plugins.len() + 1);
    if !remove {
        let mut caps = Map::new();
        for p in &others {
            for cap in conflist::declared_capabilities(p) {
                caps.insert(cap, Value::Bool(true));
            }
        }
        let mut entry = ours
            .first()
            .and_then(|v| v.as_object().cloned())
            .unwrap_or_else(|| {
                let mut m = Map::new();
                m.insert("type".into(), Value::from(plugin_type));
                m
            });
        for (key, dir) in [("ledgerDir", opts.ledger_dir), ("confDir", opts.conf_dir)] {
            if let Some(dir) = dir {
                entry.insert(key.into(), Value::from(dir.display().to_string()));
            }
        }
        if caps.is_empty() {
            entry.remove("capabilities");
        } else {
            entry.insert("capabilities".into(), Value::Object(caps));
        }
        new_plugins.push(Value::Object(entry));
    }
    new_plugins.extend(others.into_iter().cloned());
    let mut out = obj.clone();
    out.insert("plugins".into(), Value::Array(new_plugins));
    Ok(Value::Object(out))
}

/// What `transform` makes of a file's bytes, rendered as `inject` writes it.
pub struct Planned {
    pub doc: Value,
    pub new: Value,
    /// Pretty-printed `new` with a final newline.
    pub text: String,
    pub changed: bool,
}

/// Parses `bytes` (read from `path`) and plans the edit; no file is touched.
pub fn plan(
    path: &Path,
    bytes: &[u8],
    plugin_type: &str,
    opts: &EntryOptions,
    remove: bool,
) -> Result<Planned> {
    let doc: Value =
        serde_json::from_slice(bytes).with_context(|| format!("parsing {}", path.display()))?;
    let new = transform(&doc, plugin_type, opts, remove)?;
    let mut text = serde_json::to_string_pretty(&new)?;
    text.push('\n');
    let changed = new != doc;
    Ok(Planned {
        doc,
        new,
        text,
        changed,
    })
}

/// A single-plugin configuration (`.conf`: an object with a `type`) as the one-plugin
/// conflist runtimes build from it (libcni's `ConfListFromConf`: the list takes the
/// `name` and `cniVersion`, the plugin keeps its object whole). None for anything else.
pub fn conflist_from_conf(doc: &Value) -> Option<Value> {
    let obj = doc.as_object()?;
    if obj.contains_key("plugins") || !obj.get("type").is_some_and(Value::is_string) {
        return None;
    }
    let mut list = Map::new();
    if let Some(v) = obj.get("cniVersion") {
        list.insert("cniVersion".into(), v.clone());
    }
    list.insert("name".into(), obj.get("name")?.clone());
    list.insert("plugins".into(), Value::Array(vec![doc.clone()]));
    Some(Value::Object(list))
}

/// Replaces `path` by a temp file (same mode, fsynced) renamed over it, then fsyncs the
/// directory: a reader sees the old bytes or the new, never a mix. Returns the new file's
/// inode number.
pub fn write_replacing(path: &Path, bytes: &[u8]) -> Result<u64> {
    use crate::ledger::fsio;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().context("no file name")?.to_string_lossy();
    let mode = std::fs::metadata(path)
        .map_err(fsio::at("examining", path))?
        .permissions()
        .mode()
        & 0o7777;
    // The ledger's atomic write: a hidden temporary name without the .conflist ending
    // (runtimes ignore it while it is written), fsync, rename, directory fsync.
    fsio::write_atomic_mode(dir, &name, bytes, "conflist", mode)?;
    // The inode the agent takes for its own write (a rewrite by another writer has another).
    Ok(std::fs::symlink_metadata(path)
        .map_err(fsio::at("examining", path))?
        .ino())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn injects_first_with_capability_union_and_is_idempotent() {
        let doc = json!({"cniVersion":"1.0.0","name":"n","plugins":[
            {"type":"bridge"},
            {"type":"portmap","capabilities":{"portMappings":true}},
            {"type":"bandwidth","capabilities":{"bandwidth":true,"other":false}}]});
        let once = transform(&doc, "cni-ledger", &EntryOptions::default(), false).unwrap();
        assert_eq!(
            once["plugins"][0],
            json!({"type":"cni-ledger","capabilities":{"portMappings":true,"bandwidth":true}})
        );
        assert_eq!(once["plugins"].as_array().unwrap().len(), 4);
        assert_eq!(
            transform(&once, "cni-ledger", &EntryOptions::default(), false).unwrap(),
            once
        );
        assert_eq!(
            transform(&once, "cni-ledger", &EntryOptions::default(), true).unwrap(),
            doc
        );
    }

    #[test]
    fn no_capabilities_when_the_chain_declares_none_and_keeps_options() {
        let doc = json!({"name":"n","plugins":[{"type":"bridge"},{"type":"cni-ledger","logFile":"/x","capabilities":{"portMappings":true}}]});
        let out = transform(&doc, "cni-ledger", &EntryOptions::default(), false).unwrap();
        assert_eq!(
            out["plugins"][0],
            json!({"type":"cni-ledger","logFile":"/x"})
        );
        assert_eq!(out["plugins"][1], json!({"type":"bridge"}));
    }

    #[test]
    fn single_plugin_conf_is_refused() {
        let e = transform(
            &json!({"name":"n","type":"bridge"}),
            "cni-ledger",
            &EntryOptions::default(),
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("single-plugin"));
    }

    #[test]
    fn single_plugin_conf_converts_like_libcni() {
        let conf = json!({"cniVersion":"0.4.0","name":"n","type":"bridge","bridge":"b0"});
        assert_eq!(
            conflist_from_conf(&conf).unwrap(),
            json!({"cniVersion":"0.4.0","name":"n","plugins":[conf.clone()]})
        );
        assert!(conflist_from_conf(&json!({"name":"n","plugins":[]})).is_none());
        assert!(conflist_from_conf(&json!({"type":"bridge"})).is_none());
    }
}
