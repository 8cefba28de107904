//! Finding and reading network configuration lists the way libcni does: `.conflist`
//! files by sorted name first, then `.conf`/`.json` files that hold a `plugins` list.
//! A `.conflist` is loaded as libcni v1.3 loads it (`NetworkConfFromFile`): its inline
//! plugins, then every plugin config of its drop-in directory `<dir>/<name>/*.conf`,
//! sorted by file name, appended to the end of the chain, unless the conflist says
//! `"loadOnlyInlinedPlugins": true`.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The key of a loaded-chain snapshot that names, per plugin, the file its config came
/// from. A snapshot without it is a conflist file's own bytes: every plugin came from
/// the record's `confFile`.
pub const SOURCES_KEY: &str = "cniLedgerPluginSources";

pub struct Found {
    /// The conflist file.
    pub path: PathBuf,
    /// The conflist file's bytes.
    pub bytes: Vec<u8>,
    /// The chain as libcni loads it: the conflist with its drop-ins appended.
    pub list: Value,
    /// Per plugin of `list`, the file its config came from.
    pub sources: Vec<PathBuf>,
}

impl Found {
    /// Whether any plugin of the chain came from a drop-in file.
    pub fn has_dropins(&self) -> bool {
        self.sources.iter().any(|s| *s != self.path)
    }

    /// What ADD stores as the snapshot: the conflist's own bytes when the chain is the
    /// conflist alone (so the snapshot is named by the file's hash, as before drop-ins
    /// existed); else the loaded chain with `SOURCES_KEY`.
    pub fn snapshot_bytes(&self) -> Vec<u8> {
        if !self.has_dropins() {
            return self.bytes.clone();
        }
        let mut doc = self.list.clone();
        if let Some(obj) = doc.as_object_mut() {
            let sources = self
                .sources
                .iter()
                .map(|s| Value::from(s.display().to_string()))
                .collect();
            obj.insert(SOURCES_KEY.into(), Value::Array(sources));
        }
        serde_json::to_vec(&doc).unwrap_or_else(|_| self.bytes.clone())
    }
}

/// The entries of `dir` that `find` considers, in the order it reads them: `.conflist`
/// names first (libcni's order), then `.conf` and `.json`, each group sorted by name;
/// each with whether it is a file (libcni follows symlinks; directories are skipped).
pub fn candidates(dir: &Path) -> Result<Vec<(PathBuf, bool)>> {
    const EXTS: [&str; 3] = ["conflist", "conf", "json"];
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    for item in rd {
        let item = item?;
        let path = item.path();
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !EXTS.contains(&ext) {
            continue;
        }
        // The directory entry's type costs no system call; only a symlink (which libcni
        // follows) or a file system that gives no type needs a stat.
        let is_file = match item.file_type() {
            Ok(t) if t.is_file() => true,
            Ok(t) if t.is_dir() => false,
            _ => path.is_file(),
        };
        out.push((path, is_file));
    }
    out.sort();
    out.sort_by_key(|(p, _)| p.extension().is_none_or(|e| e != "conflist"));
    Ok(out)
}

/// A file's bytes, read into a buffer a conflist fits (no growing reads).
fn read_whole(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::with_capacity(4096);
    std::fs::File::open(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Parses a document as a conflist: an object with a `name` and a `plugins` array.
pub fn parse(bytes: &[u8]) -> Option<Value> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    (v.get("name")?.is_string() && v.get("plugins")?.is_array()).then_some(v)
}

/// The conflist named `name` in `dir`, if any, loaded with its drop-ins. Unreadable or
/// foreign files are skipped; a drop-in of the named network that cannot be read or
/// parsed is an error, as it is for libcni (the runtime cannot load the network).
pub fn find(dir: &Path, name: &str) -> Result<Option<Found>> {
    for (path, is_file) in candidates(dir)? {
        if !is_file {
            continue;
        }
        let Ok(bytes) = read_whole(&path) else {
            continue;
        };
        let is_conflist = path.extension().is_some_and(|e| e == "conflist");
        let Some(doc) = parse_named(&bytes, is_conflist) else {
            continue;
        };
        if doc["name"] != name {
            continue;
        }
        if !is_conflist {
            // libcni loads drop-ins for `.conflist` files only.
            let sources = vec![path.clone(); plugins(&doc).len()];
            return Ok(Some(Found {
                path,
                bytes,
                list: doc,
                sources,
            }));
        }
        let inline = doc.get("plugins").is_some();
        let found = load(&path, bytes, doc)
            .with_context(|| format!("loading network {name} from {}", path.display()))?;
        if !inline && found.sources.is_empty() {
            // A conflist without plugins nor drop-ins: libcni's "no plugin configs
            // found"; not a chain the ledger can be in.
            continue;
        }
        return Ok(Some(found));
    }
    Ok(None)
}

/// A conflist (or, for `.conflist` files, which libcni v1.3 completes from drop-ins, a
/// named object with no `plugins` key at all).
fn parse_named(bytes: &[u8], is_conflist: bool) -> Option<Value> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    let plugins_ok = match v.get("plugins") {
        Some(p) => p.is_array(),
        None => is_conflist,
    };
    (v.get("name")?.is_string() && plugins_ok).then_some(v)
}

/// The conflist file `path` (its `bytes`, parsed as `doc`) with its drop-ins appended.
pub fn load(path: &Path, bytes: Vec<u8>, mut doc: Value) -> Result<Found> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let dropins = dropins(dir, &doc)?;
    let mut sources = vec![path.to_path_buf(); plugins(&doc).len()];
    if let Some(obj) = doc.as_object_mut() {
        let list = obj
            .entry("plugins")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Some(list) = list.as_array_mut() {
            for (file, plugin) in dropins {
                list.push(plugin);
                sources.push(file);
            }
        }
    }
    Ok(Found {
        path: path.to_path_buf(),
        bytes,
        list: doc,
        sources,
    })
}

/// libcni v1.3's reading of a boolean conflist key: a JSON bool, or the string
/// "true"/"false" in any case; absent is false; anything else is an error.
fn read_bool(list: &Value, key: &str) -> Result<bool> {
    match list.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) => match s.to_lowercase().as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => bail!("error parsing configuration list: invalid value \"{other}\" for {key}"),
        },
        Some(other) => bail!("error parsing configuration list: invalid type {other} for {key}"),
    }
}

/// The drop-in plugin configs of the conflist `list` read from `conf_dir`: every file
/// of `<conf_dir>/<name>/` whose name ends in `.conf` (directories left out), in file
/// name order, each parsed as one plugin config (an object with a non-empty `type`);
/// none when the conflist says `loadOnlyInlinedPlugins`. Their own `name` and
/// `cniVersion` do not matter: libcni gives every plugin the list's at invocation, as
/// the replay does. Errors are libcni's: the whole network fails to load.
pub fn dropins(conf_dir: &Path, list: &Value) -> Result<Vec<(PathBuf, Value)>> {
    if read_bool(list, "loadOnlyInlinedPlugins")? {
        return Ok(Vec::new());
    }
    let name = list.get("name").and_then(Value::as_str).unwrap_or("");
    let dir = dropin_dir(conf_dir, name);
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(anyhow!(
                "failed to read plugin config files in {}: {e}",
                dir.display()
            ))
        }
    };
    let mut files = Vec::new();
    for item in rd {
        let item = item.map_err(|e| {
            anyhow!(
                "failed to read plugin config files in {}: {e}",
                dir.display()
            )
        })?;
        let is_dir = item.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir && item.file_name().as_bytes().ends_with(b".conf") {
            files.push(item.path());
        }
    }
    // Go's os.ReadDir order: by file name, bytewise.
    files.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        let bytes =
            std::fs::read(&file).map_err(|e| anyhow!("error reading {}: {e}", file.display()))?;
        let plugin = parse_plugin(&bytes).map_err(|e| anyhow!("{}: {e}", file.display()))?;
        out.push((file, plugin));
    }
    Ok(out)
}

/// Where libcni v1.3 looks for the drop-ins of network `name` whose conflist is in
/// `conf_dir`.
pub fn dropin_dir(conf_dir: &Path, name: &str) -> PathBuf {
    // Go's filepath.Join: a leading '/' of the name does not make it absolute.
    conf_dir.join(name.trim_start_matches('/'))
}

/// One drop-in plugin config, judged as libcni's `NetworkPluginConfFromBytes` does.
fn parse_plugin(bytes: &[u8]) -> Result<Value> {
    let v: Value =
        serde_json::from_slice(bytes).map_err(|e| anyhow!("error parsing configuration: {e}"))?;
    let Some(obj) = v.as_object() else {
        bail!("error parsing configuration: not a JSON object");
    };
    match obj.get("type") {
        None | Some(Value::Null) => bail!("error parsing configuration: missing 'type'"),
        Some(Value::String(t)) if t.is_empty() => {
            bail!("error parsing configuration: missing 'type'")
        }
        Some(Value::String(_)) => Ok(v),
        Some(other) => bail!("error parsing configuration: 'type' is {other}, not a string"),
    }
}

/// Per plugin of a snapshot `doc`, the file its config came from: `SOURCES_KEY` when
/// the snapshot is a loaded chain, else `conf_file` (a conflist file's own bytes).
pub fn plugin_sources(doc: &Value, conf_file: Option<&str>) -> Vec<Option<String>> {
    let n = plugins(doc).len();
    match doc.get(SOURCES_KEY).and_then(Value::as_array) {
        Some(s) if s.len() == n => s.iter().map(|v| v.as_str().map(String::from)).collect(),
        _ => vec![conf_file.map(String::from); n],
    }
}

/// Which libcni a runtime loads configuration files with: before v1.3 (no drop-ins; a
/// `.conflist` must have a non-empty `plugins` list) or v1.3 (drop-ins appended, a
/// `.conflist` may have no `plugins` key at all and take its chain from them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Libcni {
    V1_1,
    V1_3,
}

impl Libcni {
    pub const ALL: [Libcni; 2] = [Libcni::V1_1, Libcni::V1_3];

    /// As shown in metrics' `libcni` label and in `/readyz`.
    pub fn as_str(self) -> &'static str {
        match self {
            Libcni::V1_1 => "1.1",
            Libcni::V1_3 => "1.3",
        }
    }
}

/// The chain a runtime builds from one file of its conf dir, as containerd's go-cni and
/// CRI-O's ocicni do: a `.conflist` by libcni's `ConfListFromFile` (with `libcni`'s
/// rules), a `.conf` or `.json` by `ConfFromFile` (one plugin, with a `type`) made into a
/// one-plugin list. Err: why that libcni refuses it, in its words where it has them.
pub fn load_for_runtime(path: &Path, libcni: Libcni) -> std::result::Result<Value, String> {
    let bytes = read_whole(path).map_err(|e| format!("error reading {}: {e}", path.display()))?;
    if path.extension().is_some_and(|e| e == "conflist") {
        return load_list(path, &bytes, libcni);
    }
    let doc: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("error parsing configuration: {e}"))?;
    let Some(obj) = doc.as_object() else {
        return Err("error parsing configuration: not a JSON object".into());
    };
    if obj.get("name").is_some_and(|n| !n.is_string())
        || obj.get("cniVersion").is_some_and(|v| !v.is_string())
    {
        return Err("error parsing configuration: name and cniVersion must be strings".into());
    }
    if obj
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        return Err("error parsing configuration: missing 'type'".into());
    }
    let mut list = serde_json::Map::new();
    list.insert(
        "cniVersion".into(),
        obj.get("cniVersion").cloned().unwrap_or(Value::from("")),
    );
    list.insert(
        "name".into(),
        obj.get("name").cloned().unwrap_or(Value::from("")),
    );
    list.insert("plugins".into(), Value::Array(vec![doc.clone()]));
    Ok(Value::Object(list))
}

/// A `.conflist` as `libcni`'s `NetworkConfFromFile` (v1.3) or `ConfListFromFile`
/// (before) loads it; the chain with drop-ins appended for v1.3.
fn load_list(path: &Path, bytes: &[u8], libcni: Libcni) -> std::result::Result<Value, String> {
    let err = |why: &str| format!("error parsing configuration list: {why}");
    let doc: Value = serde_json::from_slice(bytes).map_err(|e| err(&e.to_string()))?;
    let Some(obj) = doc.as_object() else {
        return Err(err("not a JSON object"));
    };
    if !obj.get("name").ok_or_else(|| err("no name"))?.is_string() {
        return Err(err("invalid name type"));
    }
    if obj.get("cniVersion").is_some_and(|v| !v.is_string()) {
        return Err(err("invalid cniVersion type"));
    }
    let only_inlined = match libcni {
        Libcni::V1_1 => {
            // Before v1.3 the one boolean read is `disableCheck`, and only as a JSON bool.
            if obj.get("disableCheck").is_some_and(|v| !v.is_boolean()) {
                return Err(err("invalid disableCheck type"));
            }
            true
        }
        Libcni::V1_3 => {
            for key in ["disableCheck", "disableGC"] {
                read_bool(&doc, key).map_err(|e| e.to_string())?;
            }
            read_bool(&doc, "loadOnlyInlinedPlugins").map_err(|e| e.to_string())?
        }
    };
    let inline = match obj.get("plugins") {
        None if libcni == Libcni::V1_1 => return Err(err("no 'plugins' key")),
        None if only_inlined => {
            return Err(err(
                "`loadOnlyInlinedPlugins` is true, and no 'plugins' key",
            ))
        }
        None => Vec::new(),
        Some(Value::Array(p)) if p.is_empty() => return Err(err("no plugins in list")),
        Some(Value::Array(p)) => p.clone(),
        Some(_) => return Err(err("invalid 'plugins' type")),
    };
    for (i, p) in inline.iter().enumerate() {
        if plugin_type(p).is_empty() {
            return Err(format!(
                "failed to parse plugin config {i}: error parsing configuration: missing 'type'"
            ));
        }
    }
    let mut list = doc.clone();
    let mut plugins = inline;
    if libcni == Libcni::V1_3 {
        let dir = path.parent().unwrap_or(Path::new("."));
        let more = dropins(dir, &doc).map_err(|e| format!("{e:#}"))?;
        plugins.extend(more.into_iter().map(|(_, p)| p));
        if plugins.is_empty() {
            return Err("no plugin configs found".into());
        }
    }
    if let Some(o) = list.as_object_mut() {
        o.insert("plugins".into(), Value::Array(plugins));
    }
    Ok(list)
}

/// The drop-in directory of the conflist `list` (at `path`) as it stands: every entry
/// libcni v1.3 would read (`*.conf`, not a directory) with its bytes (None: unreadable),
/// by name. What an agent's plan of that conflist depends on besides its own bytes.
pub fn dropin_state(path: &Path, list: &Value) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    let name = list.get("name").and_then(Value::as_str).unwrap_or("");
    let dir = dropin_dir(path.parent().unwrap_or(Path::new(".")), name);
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, Option<Vec<u8>>)> = rd
        .filter_map(|e| e.ok())
        .filter(|e| !e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| e.file_name().as_bytes().ends_with(b".conf"))
        .map(|e| {
            let p = e.path();
            let bytes = std::fs::read(&p).ok();
            (p, bytes)
        })
        .collect();
    out.sort_by(|a, b| a.0.as_os_str().as_bytes().cmp(b.0.as_os_str().as_bytes()));
    out
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

/// Whether a document loads as a network configuration: a conflist (a `name` and a
/// non-empty `plugins` list) or a single plugin (a `name` and a `type`), whose
/// `cniVersion`, if any, is a string (libcni refuses to load any other).
pub fn loads(doc: &Value) -> bool {
    if doc.get("cniVersion").is_some_and(|v| !v.is_string()) {
        return false;
    }
    let named = doc.get("name").and_then(Value::as_str).is_some();
    let list = doc
        .get("plugins")
        .and_then(Value::as_array)
        .is_some_and(|p| !p.is_empty());
    let single = doc.get("type").and_then(Value::as_str).is_some();
    named && (list || single)
}

/// Configuration files of `dir` that load (a `.conflist` of drop-ins alone included),
/// sorted by file name (the runtime's order, as
/// kubelet's runtimes list `.conf`, `.conflist` and `.json` together).
pub fn loadable(dir: &Path) -> Result<Vec<(PathBuf, Value)>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    let mut paths: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("conf" | "conflist" | "json")
            ) && p.is_file()
        })
        .collect();
    paths.sort();
    Ok(paths
        .into_iter()
        .filter_map(|p| {
            let bytes = std::fs::read(&p).ok()?;
            let doc: Value = serde_json::from_slice(&bytes).ok()?;
            // A `.conflist` whose chain comes from drop-ins alone loads with libcni v1.3.
            let loaded = loads(&doc)
                || (p.extension().is_some_and(|e| e == "conflist")
                    && doc.get("plugins").is_none()
                    && load_for_runtime(&p, Libcni::V1_3).is_ok());
            loaded.then_some((p, doc))
        })
        .collect())
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
    fn dropins_are_appended_in_name_order_as_libcni_v1_3_loads_them() {
        let dir = std::env::temp_dir().join(format!("cl-dropins-{}", std::process::id()));
        let net = dir.join("n");
        std::fs::create_dir_all(net.join("sub.conf")).unwrap();
        let list = br#"{"name":"n","plugins":[{"type":"cni-ledger"},{"type":"bridge"}]}"#;
        std::fs::write(dir.join("10-n.conflist"), list).unwrap();
        std::fs::write(net.join("50-portmap.conf"), br#"{"type":"portmap"}"#).unwrap();
        std::fs::write(
            net.join("20-tuning.conf"),
            br#"{"type":"tuning","name":"x"}"#,
        )
        .unwrap();
        std::fs::write(net.join("30-skip.json"), br#"{"type":"skip"}"#).unwrap();
        let f = find(&dir, "n").unwrap().unwrap();
        let types: Vec<&str> = plugins(&f.list).iter().map(plugin_type).collect();
        assert_eq!(types, ["cni-ledger", "bridge", "tuning", "portmap"]);
        assert_eq!(f.sources[3], net.join("50-portmap.conf"));
        assert_eq!(f.sources[1], dir.join("10-n.conflist"));
        // The snapshot names each plugin's file; replay and list read them back.
        let snap = parse(&f.snapshot_bytes()).unwrap();
        let sources = plugin_sources(&snap, Some("/elsewhere"));
        assert_eq!(
            sources[2].as_deref(),
            Some(net.join("20-tuning.conf").to_str().unwrap())
        );
        assert_eq!(
            chain_digest(&snap, "cni-ledger"),
            chain_digest(&f.list, "cni-ledger")
        );

        // loadOnlyInlinedPlugins, as a bool or libcni's string form: the conflist's bytes.
        for only in [r#"true"#, r#""TRUE""#] {
            let text = format!(
                r#"{{"name":"n","loadOnlyInlinedPlugins":{only},"plugins":[{{"type":"bridge"}}]}}"#
            );
            std::fs::write(dir.join("10-n.conflist"), &text).unwrap();
            let f = find(&dir, "n").unwrap().unwrap();
            assert_eq!(plugins(&f.list).len(), 1);
            assert_eq!(f.snapshot_bytes(), text.as_bytes());
        }
        std::fs::write(
            dir.join("10-n.conflist"),
            br#"{"name":"n","loadOnlyInlinedPlugins":"yes","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        assert!(find(&dir, "n").is_err());

        // A drop-in without a type fails the whole network, in libcni's words.
        std::fs::write(dir.join("10-n.conflist"), list).unwrap();
        std::fs::write(net.join("60-bad.conf"), br#"{"name":"x"}"#).unwrap();
        let e = format!("{:#}", find(&dir, "n").err().unwrap());
        assert!(
            e.contains("60-bad.conf") && e.contains("missing 'type'"),
            "{e}"
        );
        std::fs::write(net.join("60-bad.conf"), b"{not json").unwrap();
        let e = format!("{:#}", find(&dir, "n").err().unwrap());
        assert!(e.contains("error parsing configuration"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn old_snapshots_name_the_records_conflist() {
        let doc = parse(br#"{"name":"n","plugins":[{"type":"a"},{"type":"b"}]}"#).unwrap();
        assert_eq!(
            plugin_sources(&doc, Some("/c/10.conflist")),
            vec![Some("/c/10.conflist".to_string()); 2]
        );
    }

    #[test]
    fn capabilities_only_true_ones() {
        let p: Value = serde_json::json!({"type":"x","capabilities":{"a":true,"b":false,"c":1}});
        assert_eq!(declared_capabilities(&p), vec!["a".to_string()]);
    }
}
