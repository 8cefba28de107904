//! The ledger's own entry in a conflist, as it arrives on stdin.

use super::error::{self, CniError};
use crate::logging::Level;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::PathBuf;

pub const DEFAULT_LEDGER_DIR: &str = "/var/lib/cni-ledger";
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// The ledger's plugin type: its binary's name in the CNI bin dir.
pub const DEFAULT_PLUGIN_TYPE: &str = "cni-ledger";
/// libcni's default cache dir (its results/ hold prevResult and the config as loaded).
pub const DEFAULT_CNI_CACHE_DIR: &str = "/var/lib/cni";
/// How long ADD/DEL wait for an attachment a gc replay holds (`lockTimeoutMs`).
pub const DEFAULT_LOCK_TIMEOUT_MS: u64 = 5000;
/// How long the CNI GC verb may take in all (`gcBudgetSecs`): CRI-O gives its whole GC
/// call 30 s, so the answer must come well before that, whatever a plugin's DEL does.
pub const DEFAULT_GC_BUDGET_SECS: u64 = 20;
/// Largest `gcBudgetSecs`: an hour. A runtime's GC call waits seconds (CRI-O: 30 s);
/// larger values are refused rather than clamped (a typo should be seen, not obeyed).
pub const MAX_GC_BUDGET_SECS: u64 = 3600;
/// Largest `lockTimeoutMs`: an hour (an ADD or DEL waiting longer is a runtime's
/// timeout anyway). Beyond what a deadline `Instant` can hold, a wait would panic.
pub const MAX_LOCK_TIMEOUT_MS: u64 = 3_600_000;
/// Largest `gcGraceSecs`: a year, well inside the signed seconds ages are counted in.
pub const MAX_GC_GRACE_SECS: u64 = 366 * 86_400;
/// Largest stdin accepted; a conflist is a few KiB, anything near this is an attack or a bug.
pub const MAX_STDIN: usize = 1 << 20;

/// One key of the ledger's own conflist entry: its name, its JSON type and its default
/// as docs/REFERENCE.md states them. tests/reference.rs holds that file to this list, and
/// the unit test `keys_are_the_parsers` holds this list to `Raw` and to `parse`.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub name: &'static str,
    pub json_type: &'static str,
    pub default: &'static str,
}

const fn key(name: &'static str, json_type: &'static str, default: &'static str) -> Key {
    Key {
        name,
        json_type,
        default,
    }
}

/// Every key `parse` reads, the runtime's (`cniVersion` … `prevResult`) first. Any other
/// key is ignored, as CNI asks of plugins.
pub const KEYS: &[Key] = &[
    key("cniVersion", "string", "0.1.0"),
    key("name", "string", "required"),
    key("type", "string", DEFAULT_PLUGIN_TYPE),
    key("runtimeConfig", "object", "{}"),
    key("prevResult", "object", "none"),
    key("ledgerDir", "path", DEFAULT_LEDGER_DIR),
    key("confDir", "path", "$NETCONFPATH, else /etc/cni/net.d"),
    key("logFile", "path", "none: stderr"),
    key("logLevel", "string", "error"),
    key("onLedgerError", "string", "fail"),
    key("role", "string", "head"),
    key("capabilities", "object", "{}"),
    key("lockTimeoutMs", "integer", "5000"),
    key("gcGraceSecs", "integer", "none: 0"),
    key("gcBudgetSecs", "integer", "20"),
    key("returnDevices", "boolean or object", "false"),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnLedgerError {
    #[default]
    Fail,
    Warn,
}

/// Which of the ledger's two entries of a chain this is (docs/CHAIN.md): the head (first)
/// writes the record before the chain runs; the tail (last) completes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    Head,
    Tail,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    #[serde(default)]
    cni_version: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "type")]
    plugin_type: Option<String>,
    ledger_dir: Option<PathBuf>,
    conf_dir: Option<PathBuf>,
    log_file: Option<PathBuf>,
    #[serde(default)]
    log_level: Level,
    #[serde(default)]
    on_ledger_error: OnLedgerError,
    #[serde(default)]
    role: Role,
    #[serde(default)]
    capabilities: Map<String, Value>,
    #[serde(default)]
    runtime_config: Map<String, Value>,
    #[serde(default)]
    prev_result: Option<Value>,
    lock_timeout_ms: Option<u64>,
    gc_grace_secs: Option<u64>,
    gc_budget_secs: Option<u64>,
    #[serde(default)]
    return_devices: Value,
}

#[derive(Debug, Clone)]
pub struct NetConf {
    pub cni_version: String,
    pub name: String,
    pub plugin_type: String,
    pub ledger_dir: PathBuf,
    pub conf_dir: Option<PathBuf>,
    pub log_file: Option<PathBuf>,
    pub log_level: Level,
    pub on_ledger_error: OnLedgerError,
    /// `role`: `head` (the default) or `tail`.
    pub role: Role,
    /// Capabilities the ledger's entry declares (only the `true` ones).
    pub capabilities: Vec<String>,
    pub runtime_config: Map<String, Value>,
    pub prev_result: Option<Value>,
    pub lock_timeout_ms: u64,
    /// Grace period of the CNI GC verb, only when set: the runtime guarantees that no
    /// ADD or DEL runs during GC, so by default its valid list is the whole truth.
    pub gc_grace_secs: Option<u64>,
    /// The GC verb's whole time budget: no replay starts after it, a plugin's DEL still
    /// running then is killed, and what was not cleaned stays recorded for later.
    pub gc_budget_secs: u64,
    /// `returnDevices`: None when off, and then DEL does no device work at all.
    pub return_devices: Option<crate::devices::Spec>,
    /// The whole stdin document, for commands (GC) that read more keys; decoded by them.
    pub stdin: Vec<u8>,
}

/// Decodes stdin into the ledger's configuration. The order of checks follows skel:
/// undecodable JSON is 6, a missing or invalid network name 7.
pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
    // Decoded straight into `Raw`: no tree of the whole document on every ADD. Anything
    // that path refuses (not an object, bad JSON, a wrong type, a key given twice) goes
    // the way of the tree, whose answer (accepted or which error) is the reference.
    // Skipping a key it does not read, serde checks neither the bytes' UTF-8 nor the
    // nesting depth, and the tree (what GC re-reads) would refuse what the ADD accepted:
    // only valid UTF-8 with fewer openers than the tree's depth limit goes direct.
    let starts_object = stdin.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let shallow = || stdin.iter().filter(|&&b| b == b'{' || b == b'[').count() < TREE_DEPTH;
    let direct = std::str::from_utf8(stdin)
        .ok()
        .filter(|_| starts_object && shallow())
        .and_then(|text| serde_json::from_str::<Raw>(text).ok());
    match direct {
        Some(raw) => build(raw, stdin),
        None => build(parse_tree(stdin)?, stdin),
    }
}

/// Below serde_json's recursion limit (128) for a tree: a document with fewer `{`/`[`
/// bytes than this cannot nest deeper, wherever they are.
const TREE_DEPTH: usize = 100;

/// Decodes by way of a JSON tree, in skel's order of checks.
fn parse_tree(stdin: &[u8]) -> Result<Raw, CniError> {
    let value: Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            error::DECODING_FAILURE,
            "error unmarshalling network config",
            e.to_string(),
        )
    })?;
    if !value.is_object() {
        return Err(CniError::new(
            error::DECODING_FAILURE,
            "network config is not a JSON object",
            "",
        ));
    }
    Raw::deserialize(&value).map_err(|e| {
        CniError::new(
            error::INVALID_NETWORK_CONFIG,
            "invalid cni-ledger configuration",
            e.to_string(),
        )
    })
}

fn build(raw: Raw, stdin: &[u8]) -> Result<NetConf, CniError> {
    let name = raw.name.unwrap_or_default();
    super::env::validate_network_name(&name)?;
    let capabilities = raw
        .capabilities
        .iter()
        .filter(|(_, v)| v.as_bool() == Some(true))
        .map(|(k, _)| k.clone())
        .collect();
    let return_devices = crate::devices::parse_option(&raw.return_devices).map_err(|e| {
        CniError::new(
            error::INVALID_NETWORK_CONFIG,
            "invalid cni-ledger configuration",
            e,
        )
    })?;
    let gc_budget_secs = raw.gc_budget_secs.unwrap_or(DEFAULT_GC_BUDGET_SECS);
    if gc_budget_secs == 0 {
        return Err(CniError::new(
            error::INVALID_NETWORK_CONFIG,
            "invalid cni-ledger configuration",
            "gcBudgetSecs must be at least 1",
        ));
    }
    in_range("gcBudgetSecs", gc_budget_secs, MAX_GC_BUDGET_SECS)?;
    let lock_timeout_ms = raw.lock_timeout_ms.unwrap_or(DEFAULT_LOCK_TIMEOUT_MS);
    in_range("lockTimeoutMs", lock_timeout_ms, MAX_LOCK_TIMEOUT_MS)?;
    if let Some(grace) = raw.gc_grace_secs {
        in_range("gcGraceSecs", grace, MAX_GC_GRACE_SECS)?;
    }
    Ok(NetConf {
        // skel's decoder treats a missing version as 0.1.0, which no one supports today.
        cni_version: raw.cni_version.unwrap_or_else(|| "0.1.0".into()),
        name,
        plugin_type: raw
            .plugin_type
            .unwrap_or_else(|| DEFAULT_PLUGIN_TYPE.into()),
        ledger_dir: raw
            .ledger_dir
            .unwrap_or_else(|| PathBuf::from(DEFAULT_LEDGER_DIR)),
        conf_dir: raw.conf_dir,
        log_file: raw.log_file,
        log_level: raw.log_level,
        on_ledger_error: raw.on_ledger_error,
        role: raw.role,
        capabilities,
        runtime_config: raw.runtime_config,
        prev_result: raw.prev_result,
        lock_timeout_ms,
        gc_grace_secs: raw.gc_grace_secs,
        gc_budget_secs,
        return_devices,
        stdin: stdin.to_vec(),
    })
}

/// ADD's check of the paths it would create things under: each must be absolute. A
/// relative one resolves against the runtime's working directory, a different place
/// per runtime (and per call), where ADD would make a ledger no gc ever reads.
pub fn check_paths_for_add(conf: &NetConf) -> Result<(), CniError> {
    let paths = [
        ("ledgerDir", Some(&conf.ledger_dir)),
        ("logFile", conf.log_file.as_ref()),
        ("confDir", conf.conf_dir.as_ref()),
    ];
    for (key, path) in paths {
        if let Some(p) = path.filter(|p| !p.is_absolute()) {
            return Err(bad_path(key, p, "an absolute path"));
        }
    }
    // The ledger makes records/, locks/, snapshots/ … in its dir: `/` (a typo, or a
    // template's empty variable) would scatter them over the node's root, and a `..`
    // names one place here and another through a symlink, where gc reads none of it.
    let dir = &conf.ledger_dir;
    if dir.parent().is_none() {
        return Err(bad_path("ledgerDir", dir, "a directory of its own"));
    }
    if dir
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(bad_path("ledgerDir", dir, "a path without \"..\""));
    }
    Ok(())
}

fn bad_path(key: &str, p: &std::path::Path, must: &str) -> CniError {
    CniError::new(
        error::INVALID_NETWORK_CONFIG,
        "invalid cni-ledger configuration",
        format!("{key} must be {must}, not {:?}", p.display().to_string()),
    )
}

/// Refuses a number above its documented maximum (error 7, naming the key).
fn in_range(key: &str, v: u64, max: u64) -> Result<(), CniError> {
    if v > max {
        return Err(CniError::new(
            error::INVALID_NETWORK_CONFIG,
            "invalid cni-ledger configuration",
            format!("{key} must be at most {max}, not {v}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The direct decoding gives what the tree gives: the same configuration, or the
    /// same error, for documents each path could judge differently on its own.
    #[test]
    fn direct_decoding_agrees_with_the_tree() {
        let docs: &[&[u8]] = &[
            br#"{"cniVersion":"1.0.0","name":"n","type":"cni-ledger","ledgerDir":"/l","capabilities":{"portMappings":true},"runtimeConfig":{"portMappings":[{"hostPort":1}]},"prevResult":{"ips":[]},"cni.dev/valid-attachments":[]}"#,
            br#"  {"name":"n","name":"m"}"#,
            br#"{"name":"n","logLevel":5}"#,
            br#"{"name":"n","logLevel":5,"#,
            br#"{"name":"n"} x"#,
            br#"["n"]"#,
            br#"null"#,
            b"",
            br#"{"name":"n","lockTimeoutMs":1.5}"#,
            br#"{"name":"n","capabilities":null}"#,
            br#"{"name":"n","prevResult":null,"role":"tail"}"#,
            br#"{"name":"n","gcBudgetSecs":0}"#,
            br#"{"name":"bad name"}"#,
        ];
        // Found by the fuzzer: invalid UTF-8 inside a key the ledger does not read.
        let mut not_utf8 = br#"{"name":"n","x":["#.to_vec();
        not_utf8.extend_from_slice(b"\"\xff\xfe\"]}");
        // Nesting deeper than a tree may hold, inside a key the ledger does not read.
        let deep = format!(
            r#"{{"name":"n","x":{}{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let more = [not_utf8, deep.into_bytes()];
        for doc in docs.iter().copied().chain(more.iter().map(Vec::as_slice)) {
            let tree = parse_tree(doc).and_then(|raw| build(raw, doc));
            let render = |r: &Result<NetConf, CniError>| match r {
                Ok(c) => format!("{c:?}"),
                Err(e) => format!("{} {} {}", e.code, e.msg, e.details),
            };
            assert_eq!(
                render(&parse(doc)),
                render(&tree),
                "{}",
                String::from_utf8_lossy(doc)
            );
        }
    }

    #[test]
    fn parses_options_and_defaults() {
        let c = parse(br#"{"cniVersion":"1.0.0","name":"n","type":"cni-ledger","capabilities":{"portMappings":true,"bandwidth":false}}"#).unwrap();
        assert_eq!(c.ledger_dir, PathBuf::from(DEFAULT_LEDGER_DIR));
        assert_eq!(c.capabilities, vec!["portMappings".to_string()]);
        assert_eq!(c.on_ledger_error, OnLedgerError::Fail);
        assert_eq!(c.lock_timeout_ms, DEFAULT_LOCK_TIMEOUT_MS);
        assert_eq!(c.gc_budget_secs, DEFAULT_GC_BUDGET_SECS);
        let c = parse(br#"{"name":"n","gcBudgetSecs":5}"#).unwrap();
        assert_eq!(c.gc_budget_secs, 5);
        for bad in [
            &br#"{"name":"n","gcBudgetSecs":0}"#[..],
            br#"{"name":"n","gcBudgetSecs":-1}"#,
        ] {
            assert_eq!(parse(bad).unwrap_err().code, error::INVALID_NETWORK_CONFIG);
        }
        // Above the documented maxima (u64::MAX once overflowed a deadline: a panic).
        for (key, max) in [
            ("gcBudgetSecs", MAX_GC_BUDGET_SECS),
            ("lockTimeoutMs", MAX_LOCK_TIMEOUT_MS),
            ("gcGraceSecs", MAX_GC_GRACE_SECS),
        ] {
            let doc = |v: u64| format!(r#"{{"name":"n","{key}":{v}}}"#).into_bytes();
            assert!(parse(&doc(max)).is_ok(), "{key}");
            for v in [max + 1, u64::MAX] {
                let e = parse(&doc(v)).unwrap_err();
                assert_eq!(e.code, error::INVALID_NETWORK_CONFIG, "{key}");
                assert_eq!(e.details, format!("{key} must be at most {max}, not {v}"));
            }
        }
        assert_eq!(c.log_level, Level::Error);
        let c = parse(br#"{"name":"n","logLevel":"info"}"#).unwrap();
        assert_eq!(c.log_level, Level::Info);
        assert_eq!(c.return_devices, None);
        assert_eq!(c.role, Role::Head);
        assert_eq!(
            parse(br#"{"name":"n","role":"tail"}"#).unwrap().role,
            Role::Tail
        );
        assert_eq!(
            parse(br#"{"name":"n","role":"middle"}"#).unwrap_err().code,
            error::INVALID_NETWORK_CONFIG
        );
        let c = parse(br#"{"name":"n","returnDevices":{"names":["dev*"]}}"#).unwrap();
        assert_eq!(c.return_devices.unwrap().names, vec!["dev*".to_string()]);
        assert_eq!(
            parse(br#"{"name":"n","returnDevices":"yes"}"#)
                .unwrap_err()
                .code,
            error::INVALID_NETWORK_CONFIG
        );
    }

    /// The field names serde's derive hands to `deserialize_struct`: exactly the keys
    /// `Raw` reads, renamed as in JSON.
    fn raw_fields() -> &'static [&'static str] {
        use serde::de::{self, Visitor};
        use std::cell::Cell;
        struct Names(Cell<&'static [&'static str]>);
        impl<'de> serde::Deserializer<'de> for &Names {
            type Error = de::value::Error;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
                Err(de::Error::custom("not a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Self::Error> {
                self.0.set(fields);
                Err(de::Error::custom("names taken"))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
                bytes byte_buf option unit unit_struct newtype_struct seq tuple
                tuple_struct map enum identifier ignored_any
            }
        }
        let names = Names(Cell::new(&[]));
        let _ = Raw::deserialize(&names);
        names.0.get()
    }

    #[test]
    fn keys_are_the_parsers() {
        let mut listed: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        let mut read = raw_fields().to_vec();
        listed.sort_unstable();
        read.sort_unstable();
        assert_eq!(listed, read, "KEYS and the fields of Raw differ");

        // Each stated default is what parse gives when the key is absent.
        let c = parse(br#"{"name":"n"}"#).unwrap();
        for k in KEYS {
            let d = k.default;
            match k.name {
                "cniVersion" => assert_eq!(c.cni_version, d),
                "name" => assert!(parse(b"{}").is_err() && d == "required"),
                "type" => assert_eq!(c.plugin_type, d),
                "runtimeConfig" => assert!(c.runtime_config.is_empty() && d == "{}"),
                "prevResult" => assert!(c.prev_result.is_none() && d == "none"),
                "ledgerDir" => assert_eq!(c.ledger_dir, PathBuf::from(d)),
                // Resolved at ADD: the option, else $NETCONFPATH, else the default dir.
                "confDir" => assert!(c.conf_dir.is_none() && d.ends_with(DEFAULT_CONF_DIR)),
                "logFile" => assert!(c.log_file.is_none() && d.ends_with("stderr")),
                "logLevel" => {
                    let given = format!(r#"{{"name":"n","logLevel":"{d}"}}"#);
                    assert_eq!(parse(given.as_bytes()).unwrap().log_level, c.log_level);
                }
                "onLedgerError" => {
                    let given = format!(r#"{{"name":"n","onLedgerError":"{d}"}}"#);
                    assert_eq!(
                        parse(given.as_bytes()).unwrap().on_ledger_error,
                        c.on_ledger_error
                    );
                }
                "role" => {
                    let given = format!(r#"{{"name":"n","role":"{d}"}}"#);
                    assert_eq!(parse(given.as_bytes()).unwrap().role, c.role);
                }
                "capabilities" => assert!(c.capabilities.is_empty() && d == "{}"),
                "lockTimeoutMs" => assert_eq!(c.lock_timeout_ms.to_string(), d),
                // Unset: the GC verb applies no grace (plugin::gc_verb reads it as 0).
                "gcGraceSecs" => assert!(c.gc_grace_secs.is_none() && d == "none: 0"),
                "gcBudgetSecs" => assert_eq!(c.gc_budget_secs.to_string(), d),
                "returnDevices" => assert!(c.return_devices.is_none() && d == "false"),
                other => panic!("KEYS names {other}, which this test does not check"),
            }
        }
    }

    #[test]
    fn error_codes_follow_skel() {
        assert_eq!(parse(b"{nope").unwrap_err().code, error::DECODING_FAILURE);
        assert_eq!(parse(b"[]").unwrap_err().code, error::DECODING_FAILURE);
        assert_eq!(
            parse(br#"{"cniVersion":"1.0.0"}"#).unwrap_err().code,
            error::INVALID_NETWORK_CONFIG
        );
        assert_eq!(
            parse(br#"{"name":"../x"}"#).unwrap_err().code,
            error::INVALID_NETWORK_CONFIG
        );
        assert_eq!(
            parse(br#"{"name":"n","logLevel":"verbose"}"#)
                .unwrap_err()
                .code,
            error::INVALID_NETWORK_CONFIG
        );
        assert_eq!(
            parse(br#"{"name":"n","onLedgerError":"maybe"}"#)
                .unwrap_err()
                .code,
            error::INVALID_NETWORK_CONFIG
        );
    }
}
