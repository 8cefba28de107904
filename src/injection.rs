//! The ledger's place in a conflist, shared by `cni-ledger inject` and the node agent:
//! first in the chain, declaring the union of the chain's capabilities (and nothing else:
//! runtimes read a declared capability as "the chain handles it"); and, unless opted out,
//! its tail entry last (docs/CHAIN.md). Files are replaced by rename (src/replace.rs), so a runtime
//! watching the directory never reads half a file.
//!
//! Where the tail goes. libcni v1.3 appends the drop-ins `<confdir>/<network>/*.conf`
//! (sorted by name) after the conflist's own plugins; libcni before v1.3 never reads
//! that directory. No single place is last under both and runs once under both, and two
//! tails would complete every record twice. So: a network without drop-ins (the common
//! case, and every network of an older runtime that works as configured) gets its tail
//! as the conflist's last plugin, which every libcni runs last. A network with drop-ins
//! of its own gets the tail as the drop-in `TAIL_DROPIN`, whose name sorts after any
//! ordinary one, and none inline: a runtime that loads drop-ins runs it last, once. A
//! runtime whose libcni predates v1.3 skips that network's drop-ins, theirs and the
//! tail alike; the ledger (snapshot, `list`, replay) reads every chain as v1.3 loads
//! it, and its records then show the chain as never completed, which is what the
//! operator of such a node needs to see: the configured chain is not the one that runs.

use crate::conflist;
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::path::Path;

/// Options written into the ledger's entry.
#[derive(Default)]
pub struct EntryOptions<'a> {
    pub ledger_dir: Option<&'a Path>,
    pub conf_dir: Option<&'a Path>,
    /// `--no-tail`: the chain gets no tail entry (an existing one is taken out).
    pub no_tail: bool,
}

/// The file name of the tail when it is a drop-in: `~` sorts after every ASCII letter
/// and digit, so libcni v1.3 (which sorts drop-ins by name) runs it last.
pub const TAIL_DROPIN: &str = "~cni-ledger-tail.conf";

/// The file name of the head when the conflist has no `plugins` of its own (libcni v1.3
/// takes its whole chain from drop-ins): `!` sorts before every letter and digit, so
/// the head runs first. Written as a drop-in rather than as an inline `plugins` list:
/// libcni before v1.3 refuses a conflist without `plugins`, and an inline list holding
/// only the ledger would make it load there as a chain without a network.
pub const HEAD_DROPIN: &str = "!cni-ledger-head.conf";

/// The head's keys the tail takes over: the same ledger, the same log, the same wait
/// for a key a replay holds. Copied on every edit, so the two never disagree.
const TAIL_COPIES: &[&str] = &["ledgerDir", "logFile", "logLevel", "lockTimeoutMs"];

/// The tail entry for the head entry `head`: `{"type": <ours>, "role": "tail"}` and the
/// head's `TAIL_COPIES`. No capabilities: it needs no runtime args.
pub fn tail_entry(head: &Map<String, Value>, plugin_type: &str) -> Value {
    let mut tail = Map::new();
    tail.insert("type".into(), Value::from(plugin_type));
    tail.insert("role".into(), Value::from(crate::chain::TAIL_ROLE));
    for key in TAIL_COPIES {
        if let Some(v) = head.get(*key) {
            tail.insert((*key).into(), v.clone());
        }
    }
    Value::Object(tail)
}

/// Whether `dropins` (of the network being edited) hold any but our own entries.
fn foreign_dropins(dropins: &[Value], plugin_type: &str) -> bool {
    dropins
        .iter()
        .any(|p| conflist::plugin_type(p) != plugin_type)
}

/// Returns the new conflist, or an error saying why this document cannot take a ledger.
pub fn transform(
    doc: &Value,
    plugin_type: &str,
    opts: &EntryOptions,
    remove: bool,
) -> Result<Value> {
    transform_with_dropins(doc, plugin_type, opts, remove, &[])
}

/// `transform`, with the drop-in plugin configs libcni appends to the chain: their
/// capabilities join the union the ledger declares, since the runtime hands capability
/// args to the chain as loaded, drop-ins included.
pub fn transform_with_dropins(
    doc: &Value,
    plugin_type: &str,
    opts: &EntryOptions,
    remove: bool,
    dropins: &[Value],
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
    // The head's options come from an existing head, never from a tail.
    let ours: Vec<&Value> = ours
        .into_iter()
        .filter(|p| !crate::chain::is_tail(p, plugin_type))
        .collect();
    let mut new_plugins: Vec<Value> = Vec::with_capacity(plugins.len() + 2);
    let mut tail = None;
    if !remove {
        let mut caps = Map::new();
        // Our own drop-ins declare nothing of the chain's: a capability only the
        // ledger's head declares would outlive the plugin that brought it.
        let foreign: Vec<&Value> = dropins
            .iter()
            .filter(|p| conflist::plugin_type(p) != plugin_type)
            .collect();
        for p in others.iter().copied().chain(foreign) {
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
        if !opts.no_tail && !foreign_dropins(dropins, plugin_type) {
            tail = Some(tail_entry(&entry, plugin_type));
        }
        new_plugins.push(Value::Object(entry));
    }
    new_plugins.extend(others.into_iter().cloned());
    new_plugins.extend(tail);
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
    /// Whether the conflist changes.
    pub changed: bool,
    /// The tail as a drop-in (a `.conflist` only): what its file should hold.
    pub tail_dropin: Option<TailDropin>,
    /// The head as a drop-in (a `.conflist` without `plugins`): what its file should hold.
    pub head_dropin: Option<TailDropin>,
}

/// A drop-in of the ledger's own: the tail of a network with drop-ins (see the module's
/// comment), or the head of a conflist whose chain is all drop-ins (`HEAD_DROPIN`).
pub struct TailDropin {
    /// `<confdir>/<network>/TAIL_DROPIN` (or `HEAD_DROPIN`).
    pub path: std::path::PathBuf,
    /// What the file should hold; None: no such file.
    pub want: Option<String>,
    /// Whether the file differs from `want`.
    pub changed: bool,
}

impl TailDropin {
    /// Writes or removes the file as planned (atomically and durably, mode 0644 as
    /// conflists are).
    pub fn apply(&self) -> Result<()> {
        use crate::ledger::fsio;
        if !self.changed {
            return Ok(());
        }
        let dir = crate::replace::parent_dir(&self.path);
        let name = self
            .path
            .file_name()
            .context("no file name")?
            .to_string_lossy();
        match &self.want {
            Some(text) => {
                crate::replace::refuse_symlink(&self.path)?;
                fsio::write_atomic_mode(dir, &name, text.as_bytes(), "conflist", 0o644)
                    .with_context(|| format!("writing {}", self.path.display()))
            }
            None => fsio::remove_durable(dir, &name)
                .map(|_| ())
                .with_context(|| format!("removing {}", self.path.display())),
        }
    }
}

/// The planned state of the drop-in tail of the conflist `new` at `path`.
fn plan_tail_dropin(
    path: &Path,
    new: &Value,
    plugin_type: &str,
    opts: &EntryOptions,
    remove: bool,
    dropins: &[Value],
) -> Option<TailDropin> {
    let name = new.get("name")?.as_str()?;
    let dir = crate::replace::parent_dir(path).join(name.trim_start_matches('/'));
    let file = dir.join(TAIL_DROPIN);
    let head = conflist::plugins(new)
        .iter()
        .chain(dropins.iter())
        .find(|p| crate::chain::is_head(p, plugin_type))
        .and_then(Value::as_object);
    let want = match head {
        Some(head) if !remove && !opts.no_tail && foreign_dropins(dropins, plugin_type) => {
            let mut text = serde_json::to_string_pretty(&tail_entry(head, plugin_type)).ok()?;
            text.push('\n');
            Some(text)
        }
        _ => None,
    };
    let have = std::fs::read_to_string(&file).ok();
    let changed = have != want;
    Some(TailDropin {
        path: file,
        want,
        changed,
    })
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
    // libcni v1.3 loads drop-ins for `.conflist` files only; one it cannot parse makes
    // the network unloadable, so nothing is planned for it either.
    let is_conflist = path.extension().is_some_and(|e| e == "conflist");
    let dropins = if is_conflist && doc.is_object() {
        let dir = path.parent().unwrap_or(Path::new("."));
        conflist::dropins(dir, &doc)
            .with_context(|| format!("loading the drop-ins of {}", path.display()))?
            .into_iter()
            .map(|(_, plugin)| plugin)
            .collect()
    } else {
        Vec::new()
    };
    if is_conflist && doc.is_object() && doc.get("plugins").is_none() {
        return plan_dropins_only(path, doc, plugin_type, opts, remove, &dropins);
    }
    let new = transform_with_dropins(&doc, plugin_type, opts, remove, &dropins)?;
    let mut text = serde_json::to_string_pretty(&new)?;
    text.push('\n');
    let changed = new != doc;
    let tail_dropin = if is_conflist {
        plan_tail_dropin(path, &new, plugin_type, opts, remove, &dropins)
    } else {
        None
    };
    // A head drop-in left from when the conflist had no `plugins`: it goes.
    let head_dropin = if is_conflist {
        plan_head_dropin(path, &new, None)
    } else {
        None
    };
    Ok(Planned {
        doc,
        new,
        text,
        changed,
        tail_dropin,
        head_dropin,
    })
}

/// The planned state of the head drop-in of the conflist `doc` at `path`: `want` its
/// entry, None for no such file.
fn plan_head_dropin(path: &Path, doc: &Value, want: Option<&Value>) -> Option<TailDropin> {
    let name = doc.get("name")?.as_str()?;
    let file = crate::replace::parent_dir(path)
        .join(name.trim_start_matches('/'))
        .join(HEAD_DROPIN);
    let want = match want {
        Some(v) => {
            let mut text = serde_json::to_string_pretty(v).ok()?;
            text.push('\n');
            Some(text)
        }
        None => None,
    };
    let have = std::fs::read_to_string(&file).ok();
    Some(TailDropin {
        changed: have != want,
        path: file,
        want,
    })
}

/// The plan for a `.conflist` without `plugins`, whose chain libcni v1.3 takes from its
/// drop-ins alone: the file stays as it is; the head is the drop-in `HEAD_DROPIN`
/// (options kept from one already there, capabilities the union of the other
/// drop-ins'), the tail the drop-in `TAIL_DROPIN`.
fn plan_dropins_only(
    path: &Path,
    doc: Value,
    plugin_type: &str,
    opts: &EntryOptions,
    remove: bool,
    dropins: &[Value],
) -> Result<Planned> {
    if !foreign_dropins(dropins, plugin_type) && !remove {
        bail!("no \"plugins\" list and no drop-in plugin: libcni loads no chain from it");
    }
    // The head's entry as `transform` makes it for the drop-ins as a chain.
    let head = if remove {
        None
    } else {
        let others: Vec<Value> = dropins
            .iter()
            .filter(|p| !crate::chain::is_tail(p, plugin_type))
            .cloned()
            .collect();
        let mut as_list = doc.clone();
        if let Some(o) = as_list.as_object_mut() {
            o.insert("plugins".into(), Value::Array(others));
        }
        let no_tail = EntryOptions {
            ledger_dir: opts.ledger_dir,
            conf_dir: opts.conf_dir,
            no_tail: true,
        };
        let made = transform(&as_list, plugin_type, &no_tail, false)?;
        conflist::plugins(&made).first().cloned()
    };
    let head_dropin = plan_head_dropin(path, &doc, head.as_ref());
    let mut with_head = doc.clone();
    if let Some(o) = with_head.as_object_mut() {
        o.insert("plugins".into(), Value::Array(head.into_iter().collect()));
    }
    let tail_dropin = plan_tail_dropin(path, &with_head, plugin_type, opts, remove, dropins);
    let mut text = serde_json::to_string_pretty(&doc)?;
    text.push('\n');
    Ok(Planned {
        new: doc.clone(),
        doc,
        text,
        changed: false,
        tail_dropin,
        head_dropin,
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
        assert_eq!(once["plugins"].as_array().unwrap().len(), 5);
        assert_eq!(
            once["plugins"][4],
            json!({"type":"cni-ledger","role":"tail"}),
            "the tail is last, without capabilities"
        );
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
        let doc = json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"},{"type":"cni-ledger","logFile":"/x","capabilities":{"portMappings":true}}]});
        let out = transform(&doc, "cni-ledger", &EntryOptions::default(), false).unwrap();
        assert_eq!(
            out["plugins"][0],
            json!({"type":"cni-ledger","logFile":"/x"})
        );
        assert_eq!(out["plugins"][1], json!({"type":"bridge"}));
        assert_eq!(
            out["plugins"][2],
            json!({"type":"cni-ledger","role":"tail","logFile":"/x"})
        );
    }

    #[test]
    fn the_tail_follows_the_head_and_no_tail_takes_it_out() {
        let doc = json!({"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]});
        let dir = Path::new("/var/lib/l");
        let opts = EntryOptions {
            ledger_dir: Some(dir),
            ..EntryOptions::default()
        };
        let with = transform(&doc, "cni-ledger", &opts, false).unwrap();
        let types: Vec<_> = conflist::plugins(&with)
            .iter()
            .map(|p| {
                p.get("role")
                    .and_then(Value::as_str)
                    .unwrap_or(conflist::plugin_type(p))
            })
            .collect();
        assert_eq!(types, ["cni-ledger", "bridge", "tail"]);
        assert_eq!(with["plugins"][2]["ledgerDir"], json!("/var/lib/l"));
        // A tail somewhere else (hand-edited, or a plugin appended after it) moves last.
        let mut moved = with.clone();
        let plugins = moved["plugins"].as_array_mut().unwrap();
        let tail = plugins.remove(2);
        plugins.insert(1, tail);
        plugins.push(json!({"type":"tuning"}));
        let again = transform(&moved, "cni-ledger", &opts, false).unwrap();
        assert_eq!(again["plugins"][3], with["plugins"][2]);
        assert_eq!(again["plugins"].as_array().unwrap().len(), 4);
        assert_eq!(transform(&with, "cni-ledger", &opts, false).unwrap(), with);
        let no_tail = EntryOptions {
            no_tail: true,
            ..opts
        };
        let without = transform(&with, "cni-ledger", &no_tail, false).unwrap();
        assert_eq!(without["plugins"].as_array().unwrap().len(), 2);
        assert_eq!(
            transform(&without, "cni-ledger", &no_tail, false).unwrap(),
            without
        );
        assert_eq!(transform(&with, "cni-ledger", &opts, true).unwrap(), doc);
    }

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("cl-inj-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn the_capability_union_takes_in_the_dropins() {
        let dir = scratch("dropins");
        std::fs::create_dir_all(dir.join("n")).unwrap();
        let conflist = dir.join("10-n.conflist");
        std::fs::write(
            dir.join("n/50-portmap.conf"),
            br#"{"type":"portmap","capabilities":{"portMappings":true}}"#,
        )
        .unwrap();
        let plan_of = |text: &str| {
            plan(
                &conflist,
                text.as_bytes(),
                "cni-ledger",
                &EntryOptions::default(),
                false,
            )
        };
        let p =
            plan_of(r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#).unwrap();
        assert_eq!(
            p.new["plugins"][0]["capabilities"],
            json!({"portMappings": true})
        );
        // Not loaded by libcni, so not the chain's.
        let p =
            plan_of(r#"{"cniVersion":"1.0.0","name":"n","loadOnlyInlinedPlugins":true,"plugins":[{"type":"bridge"}]}"#)
                .unwrap();
        assert!(p.new["plugins"][0].get("capabilities").is_none());
        // With drop-ins, the tail is the drop-in sorting last, and none is inline.
        let p =
            plan_of(r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#).unwrap();
        assert_eq!(p.new["plugins"].as_array().unwrap().len(), 2);
        let d = p.tail_dropin.unwrap();
        assert_eq!(d.path, dir.join("n").join(TAIL_DROPIN));
        assert!(d.changed && d.want.as_deref().unwrap().contains("\"tail\""));
        d.apply().unwrap();
        let p = plan_of(&p.text).unwrap();
        assert!(
            !p.changed && !p.tail_dropin.as_ref().unwrap().changed,
            "idempotent"
        );
        // Our own drop-in is no reason for a drop-in tail: without the others it comes
        // back inline and the file goes.
        std::fs::remove_file(dir.join("n/50-portmap.conf")).unwrap();
        let p = plan_of(&p.text).unwrap();
        assert_eq!(p.new["plugins"][2]["role"], json!("tail"));
        let d = p.tail_dropin.unwrap();
        assert!(d.changed && d.want.is_none());
        d.apply().unwrap();
        assert!(!dir.join("n").join(TAIL_DROPIN).exists());
        // A drop-in libcni cannot parse: the network cannot load, nothing is planned.
        std::fs::write(dir.join("n/60-bad.conf"), b"[]").unwrap();
        assert!(
            plan_of(r#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#).is_err()
        );
        std::fs::remove_dir_all(&dir).unwrap();
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

    #[test]
    fn takes_the_ledger_out_of_a_chain_at_any_version() {
        let opts = EntryOptions::default();
        for v in [json!(null), json!("0.1.0"), json!("0.2.0"), json!("")] {
            let mut doc = json!({"name":"n","plugins":[{"type":"bridge"}]});
            if !v.is_null() {
                doc["cniVersion"] = v.clone();
            }
            // An older release's ledger in it comes out, head and tail.
            let mut injected = doc.clone();
            injected["plugins"] = json!([{"type":"cni-ledger"},{"type":"bridge"},{"type":"cni-ledger","role":"tail"}]);
            assert_eq!(
                transform(&injected, "cni-ledger", &opts, true).unwrap(),
                doc
            );
        }
    }
}
