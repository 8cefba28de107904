//! `cni-ledger inject`: put the ledger first in a conflist, declaring the union of the
//! chain's capabilities (and nothing else: runtimes read a declared capability as "the
//! chain handles it"). Idempotent; `--remove` undoes it. Files are replaced by rename,
//! so a runtime watching the directory never reads half a file.

use crate::conflist;
use crate::ledger::fsio;
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Conflist files (.conflist, or .conf/.json holding a "plugins" list).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Take the ledger out instead.
    #[arg(long)]
    remove: bool,
    /// Print the result instead of writing it.
    #[arg(long)]
    dry_run: bool,
    /// The ledger's plugin type (its binary name in the CNI bin dir).
    #[arg(long = "type", default_value = "cni-ledger")]
    plugin_type: String,
    /// Write this `ledgerDir` into the entry (default: the plugin's default).
    #[arg(long)]
    ledger_dir: Option<PathBuf>,
    /// Write this `confDir` into the entry, for a conf dir other than /etc/cni/net.d.
    #[arg(long)]
    conf_dir: Option<PathBuf>,
}

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

/// Replaces the file through the ledger's atomic write (temp, fsync, rename, directory
/// fsync), keeping its mode. The temporary name (`.tmp.<name>.<pid>.<n>`) is hidden and
/// does not end in .conflist/.conf/.json: runtimes ignore it while it is written.
fn write_replacing(path: &Path, bytes: &[u8]) -> Result<()> {
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
    fsio::write_atomic_mode(dir, &name, bytes, "conflist", mode)?;
    Ok(())
}

pub fn run(args: Args) -> Result<i32> {
    let mut status = 0;
    let opts = EntryOptions {
        ledger_dir: args.ledger_dir.as_deref(),
        conf_dir: args.conf_dir.as_deref(),
    };
    for path in &args.files {
        let result = (|| -> Result<&'static str> {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let doc: Value = serde_json::from_slice(&bytes)
                .with_context(|| format!("parsing {}", path.display()))?;
            let new = transform(&doc, &args.plugin_type, &opts, args.remove)?;
            let mut text = serde_json::to_string_pretty(&new)?;
            text.push('\n');
            if args.dry_run {
                print!("{text}");
                return Ok(if new == doc {
                    "unchanged (dry run)"
                } else {
                    "would change (dry run)"
                });
            }
            if new == doc {
                return Ok("unchanged");
            }
            write_replacing(path, text.as_bytes())?;
            Ok(if args.remove {
                "ledger removed"
            } else {
                "ledger injected"
            })
        })();
        match result {
            Ok(what) => eprintln!("{}: {what}", path.display()),
            Err(e) => {
                eprintln!("{}: refused: {e:#}", path.display());
                status = 1;
            }
        }
    }
    Ok(status)
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
}
