//! The ledger's place in a conflist, shared by `cni-ledger inject` and the node agent:
//! first in the chain, declaring the union of the chain's capabilities (and nothing else:
//! runtimes read a declared capability as "the chain handles it"); and, unless opted out,
//! its tail entry last (docs/CHAIN.md). Files are replaced by rename, so a runtime
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
use crate::ledger::fsio::FileId;
use anyhow::{bail, Context, Result};
use serde_json::{Map, Value};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
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

/// Whether `dropins` (of the network being edited) hold any but our own tail.
fn foreign_dropins(dropins: &[Value], plugin_type: &str) -> bool {
    dropins
        .iter()
        .any(|p| !crate::chain::is_tail(p, plugin_type))
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
        let foreign: Vec<&Value> = dropins
            .iter()
            .filter(|p| !crate::chain::is_tail(p, plugin_type))
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
}

/// The drop-in tail of a network with drop-ins (see the module's comment).
pub struct TailDropin {
    /// `<confdir>/<network>/TAIL_DROPIN`.
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
        let dir = parent_dir(&self.path);
        let name = self
            .path
            .file_name()
            .context("no file name")?
            .to_string_lossy();
        match &self.want {
            Some(text) => {
                refuse_symlink(&self.path)?;
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
    let dir = parent_dir(path).join(name.trim_start_matches('/'));
    let file = dir.join(TAIL_DROPIN);
    let head = conflist::plugins(new)
        .iter()
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
    let new = transform_with_dropins(&doc, plugin_type, opts, remove, &dropins)?;
    let mut text = serde_json::to_string_pretty(&new)?;
    text.push('\n');
    let changed = new != doc;
    let tail_dropin = if is_conflist {
        plan_tail_dropin(path, &new, plugin_type, opts, remove, &dropins)
    } else {
        None
    };
    Ok(Planned {
        doc,
        new,
        text,
        changed,
        tail_dropin,
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

/// What a symlink at `path` points to, when `path` is one. Conflists reached through a
/// link belong to whatever manages the link's target (a ConfigMap's `..data/`, a
/// package, a configuration-management store): they are read, never replaced.
pub fn symlink_target(path: &Path) -> Option<std::path::PathBuf> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_symlink())
        .map(|_| std::fs::read_link(path).unwrap_or_default())
}

fn refuse_symlink(path: &Path) -> Result<()> {
    if let Some(target) = symlink_target(path) {
        bail!(
            "{} is a symbolic link to {}: not replaced by a regular file and not written \
             through (its target belongs to whatever manages it); put the ledger in the \
             target's source, or pass the target itself",
            path.display(),
            target.display()
        );
    }
    Ok(())
}

/// Replaces `path` by a temp file (same mode, fsynced) renamed over it, then fsyncs the
/// directory: a reader sees the old bytes or the new, never a mix. A symlink is refused,
/// never replaced by a regular file. Returns the new file's inode number.
pub fn write_replacing(path: &Path, bytes: &[u8]) -> Result<u64> {
    use crate::ledger::fsio;
    refuse_symlink(path)?;
    let dir = parent_dir(path);
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

fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// A conflist as read for an edit: the bytes, and the file they were read from.
#[derive(Debug, Clone)]
pub struct ReadConf {
    pub bytes: Vec<u8>,
    id: FileId,
    mode: u32,
}

impl ReadConf {
    pub fn ino(&self) -> u64 {
        self.id.ino
    }
    /// The permission bits the file had.
    pub fn mode(&self) -> u32 {
        self.mode
    }
}

/// Larger than any conflist; a bigger file is not read whole.
const READ_LIMIT: u64 = 16 << 20;

/// Reads `path` (a regular file: a symlink is refused) with the identity it had while
/// it was read; a file that changed during the read is read again.
pub fn read_for_edit(path: &Path) -> Result<ReadConf> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tries = 0;
    loop {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        let before = f
            .metadata()
            .with_context(|| format!("examining {}", path.display()))?;
        if !before.is_file() {
            bail!("{} is not a regular file", path.display());
        }
        let mut bytes = Vec::with_capacity(before.len() as usize);
        (&mut f)
            .take(READ_LIMIT)
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading {}", path.display()))?;
        let after = f
            .metadata()
            .with_context(|| format!("examining {}", path.display()))?;
        tries += 1;
        if FileId::of(&before) == FileId::of(&after) || tries >= 3 {
            return Ok(ReadConf {
                bytes,
                id: FileId::of(&after),
                mode: after.mode() & 0o7777,
            });
        }
    }
}

/// What `replace_if_unchanged` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Replaced {
    /// The new bytes are in place; the inode of the new file.
    Done { ino: u64 },
    /// Another writer changed the file after it was read: nothing of theirs was
    /// replaced; read it again and plan again. Says what was seen.
    Changed(String),
}

/// Why `path` no longer is what `read` saw, if it is not (None: unchanged).
pub fn changed_since(path: &Path, read: &ReadConf) -> Option<String> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => return Some(format!("gone ({e})")),
    };
    if m.file_type().is_symlink() {
        return Some("now a symbolic link".into());
    }
    if FileId::of(&m) != read.id {
        return Some(if m.ino() != read.id.ino || m.dev() != read.id.dev {
            "replaced by another file".into()
        } else {
            "written in place".into()
        });
    }
    match read_for_edit(path) {
        Ok(now) if now.bytes == read.bytes => None,
        Ok(_) => Some("written in place".into()),
        Err(e) => Some(format!("unreadable ({e:#})")),
    }
}

/// Whether the file now at `tmp` is the very file `read` saw, unchanged (after a
/// rename or an exchange moved it there; the move itself changes only its ctime).
pub fn is_what_was_read(tmp: &Path, read: &ReadConf) -> bool {
    let Ok(m) = std::fs::symlink_metadata(tmp) else {
        return false;
    };
    m.is_file()
        && (m.dev(), m.ino(), m.len(), (m.mtime(), m.mtime_nsec()))
            == (read.id.dev, read.id.ino, read.id.len, read.id.mtime)
        && read_for_edit(tmp).is_ok_and(|now| now.bytes == read.bytes)
}

/// Swaps the two names atomically (`renameat2(RENAME_EXCHANGE)`).
fn exchange(a: &Path, b: &Path) -> nix::Result<()> {
    nix::fcntl::renameat2(None, a, None, b, nix::fcntl::RenameFlags::RENAME_EXCHANGE)
}

/// Replaces `path` with `bytes` only if it still is exactly what `read` saw: another
/// writer's version, written after the read (renamed over it or written in place), is
/// never replaced by an edit of the older one. Checked just before the swap, and again
/// after it, on what the swap displaced: the new file and the old are exchanged
/// atomically, so the displaced file is exactly what stood there at that instant; if it
/// is not what was read, the swap is undone and the caller starts over. (Where the
/// filesystem cannot exchange, the check before a plain rename is all there is.)
/// Same mode, fsynced, directory fsynced, as `write_replacing`.
pub fn replace_if_unchanged(path: &Path, read: &ReadConf, bytes: &[u8]) -> Result<Replaced> {
    use crate::ledger::fsio;
    let dir = parent_dir(path);
    let name = path.file_name().context("no file name")?.to_string_lossy();
    let tmp = fsio::write_temp(dir, &name, bytes, "conflist", read.mode)?;
    let discard = |why: String| -> Result<Replaced> {
        let _ = std::fs::remove_file(&tmp);
        Ok(Replaced::Changed(why))
    };
    let ours = match std::fs::symlink_metadata(&tmp) {
        Ok(m) => m.ino(),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("examining {}", tmp.display()));
        }
    };
    if let Some(why) = changed_since(path, read) {
        return discard(why);
    }
    match exchange(&tmp, path) {
        Ok(()) => {}
        Err(
            nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS | nix::errno::Errno::EOPNOTSUPP,
        ) => {
            // No exchange on this filesystem: the re-check above must do.
            if let Err(e) = std::fs::rename(&tmp, path) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e).with_context(|| format!("renaming over {}", path.display()));
            }
            fsio::fsync_dir(dir)?;
            return Ok(Replaced::Done { ino: ours });
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e)
                .with_context(|| format!("exchanging {} with {}", tmp.display(), path.display()));
        }
    }
    if is_what_was_read(&tmp, read) {
        // The old file, now under the temp name.
        std::fs::remove_file(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
        fsio::fsync_dir(dir)?;
        return Ok(Replaced::Done { ino: ours });
    }
    // Another writer's file was displaced: put it back.
    exchange(&tmp, path).with_context(|| {
        format!(
            "putting back {} (kept as {})",
            path.display(),
            tmp.display()
        )
    })?;
    let back_is_ours = std::fs::symlink_metadata(&tmp).is_ok_and(|m| m.ino() == ours)
        && std::fs::read(&tmp).is_ok_and(|b| b == bytes);
    if !back_is_ours {
        // A newer write still landed on the name after the swap (a rename over it, or
        // a write into the new file): that one is the latest; it goes back in place.
        exchange(&tmp, path).with_context(|| {
            format!(
                "putting back {} (kept as {})",
                path.display(),
                tmp.display()
            )
        })?;
    }
    // Left under the temp name: our own edit, or the older of the other writer's two.
    let _ = std::fs::remove_file(&tmp);
    fsio::fsync_dir(dir)?;
    Ok(Replaced::Changed(
        "replaced while the edit was being put in place; the other writer's version was put back"
            .into(),
    ))
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
    fn an_edit_replaces_only_the_file_it_was_planned_from() {
        let dir = scratch("cas");
        let path = dir.join("10-n.conflist");
        std::fs::write(&path, b"v1").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let read = read_for_edit(&path).unwrap();
        assert!(matches!(
            replace_if_unchanged(&path, &read, b"v1+ledger").unwrap(),
            Replaced::Done { .. }
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"v1+ledger");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o640);

        // Written in place after the read (same length: only bytes and times tell).
        let read = read_for_edit(&path).unwrap();
        std::fs::write(&path, b"v2+ledger").unwrap();
        assert!(matches!(
            replace_if_unchanged(&path, &read, b"stale").unwrap(),
            Replaced::Changed(_)
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"v2+ledger");

        // Replaced by rename after the read.
        let read = read_for_edit(&path).unwrap();
        std::fs::write(dir.join("other"), b"v3").unwrap();
        std::fs::rename(dir.join("other"), &path).unwrap();
        assert!(matches!(
            replace_if_unchanged(&path, &read, b"stale").unwrap(),
            Replaced::Changed(_)
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"v3");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            [std::ffi::OsString::from("10-n.conflist")],
            "temp files left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
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
    fn a_symlinked_conflist_is_never_replaced_by_a_regular_file() {
        let dir = scratch("link");
        std::fs::create_dir_all(dir.join("..data")).unwrap();
        std::fs::write(dir.join("..data/10-n.conflist"), b"{}").unwrap();
        let link = dir.join("10-n.conflist");
        std::os::unix::fs::symlink("..data/10-n.conflist", &link).unwrap();
        let e = write_replacing(&link, b"new").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e:#}");
        assert!(
            read_for_edit(&link).is_err(),
            "read through a link for an edit"
        );
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            std::fs::read(dir.join("..data/10-n.conflist")).unwrap(),
            b"{}"
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
