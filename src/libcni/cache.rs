//! libcni's result cache (`<cacheDir>/results/<net>-<cid>-<ifname>`, kind `cniCacheV1`):
//! the source of `prevResult` for a replayed DEL, a fallback for the config, and what
//! `adopt` makes records from. libcni writes these files without fsync, so an empty or
//! cut-off one is expected after a crash and is never acted on.

use crate::ledger::Key;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

pub struct CachedAttachment {
    pub config: Option<Value>,
    pub result: Option<Value>,
    pub capability_args: Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheFile {
    kind: String,
    #[serde(default)]
    config: Option<String>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    capability_args: Option<Map<String, Value>>,
    /// The attachment's names: absent is told apart from empty (`attachment_key`);
    /// a `null` is undecodable, as for a plain string.
    #[serde(default, deserialize_with = "string")]
    container_id: Option<String>,
    #[serde(default, deserialize_with = "string")]
    if_name: Option<String>,
    #[serde(default, deserialize_with = "string")]
    network_name: Option<String>,
    /// Written from libcni 1.2 on.
    #[serde(default)]
    netns: String,
    #[serde(default)]
    cni_args: Option<Vec<[String; 2]>>,
}

fn string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

/// One whole cache entry, as `adopt` needs it.
#[derive(Debug, Clone)]
pub struct CacheEntry {
    pub path: PathBuf,
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    /// Empty before libcni 1.2.
    pub netns: String,
    /// `K=V;K2=V2`, as libcni passes `CNI_ARGS`.
    pub cni_args: String,
    pub capability_args: Map<String, Value>,
    /// The conflist's exact bytes, as libcni loaded them.
    pub config_bytes: Vec<u8>,
    pub cni_version: String,
    /// Unix seconds of the file's last write: when libcni finished the ADD.
    pub written_at: i64,
}

/// Why a cache file cannot be used (it is reported and never acted on).
pub type Unusable = String;

/// Every file in `<cache_dir>/results`, sorted; empty when there is no such directory.
pub fn result_files(cache_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let dir = cache_dir.join("results");
    let mut out = Vec::new();
    match std::fs::read_dir(&dir) {
        Ok(rd) => {
            for item in rd {
                let item = item?;
                if item.file_type().is_ok_and(|t| t.is_file()) {
                    out.push(item.path());
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    out.sort();
    Ok(out)
}

/// Reads and checks one cache file completely: an empty, cut-off, foreign or
/// misnamed file, or one whose names would not pass the plugin's own checks, is
/// Err(why).
pub fn read_entry(path: &Path) -> Result<CacheEntry, Unusable> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("unreadable: {e}"))?;
    let bytes = crate::ledger::fsio::read_nofollow(path, 4 << 20)
        .map_err(|e| format!("unreadable: {e}"))?;
    if bytes.is_empty() {
        return Err("empty (zero-length; libcni writes without fsync)".into());
    }
    let file: CacheFile =
        serde_json::from_slice(&bytes).map_err(|e| format!("undecodable: {e}"))?;
    if file.kind != "cniCacheV1" {
        return Err(format!("unknown kind {}", file.kind));
    }
    let network_name = file.network_name.unwrap_or_default();
    let container_id = file.container_id.unwrap_or_default();
    let if_name = file.if_name.unwrap_or_default();
    let env = crate::cni::env::is_valid_name;
    if !env(&network_name) || !env(&container_id) {
        return Err("invalid or missing networkName or containerId".into());
    }
    crate::cni::env::validate_ifname(&if_name)
        .map_err(|_| "invalid or missing ifName".to_string())?;
    let expected = format!("{network_name}-{container_id}-{if_name}");
    if path.file_name().and_then(|n| n.to_str()) != Some(expected.as_str()) {
        return Err(format!("misnamed: holds the entry of {expected}"));
    }
    let config_bytes = file
        .config
        .as_deref()
        .and_then(base64_decode)
        .ok_or("no decodable config")?;
    let list = crate::conflist::parse(&config_bytes).ok_or("config is not a conflist")?;
    let cni_version = list
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok(CacheEntry {
        path: path.to_path_buf(),
        network: network_name,
        container_id,
        ifname: if_name,
        netns: file.netns,
        cni_args: file
            .cni_args
            .unwrap_or_default()
            .iter()
            .map(|[k, v]| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";"),
        capability_args: file.capability_args.unwrap_or_default(),
        config_bytes,
        cni_version,
        written_at: meta.mtime(),
    })
}

/// The attachment a cache file is of, read leniently for counting (the agent's count of
/// attachments with no record): any `cniCacheV1` file naming its network, container
/// and interface, whatever its file name and the rest of it.
pub fn attachment_key(path: &Path) -> Option<Key> {
    let bytes = crate::ledger::fsio::read_nofollow(path, 4 << 20).ok()?;
    let file: CacheFile = serde_json::from_slice(&bytes).ok()?;
    if file.kind != "cniCacheV1" {
        return None;
    }
    Some(Key::new(
        file.network_name?,
        file.container_id?,
        file.if_name?,
    ))
}

impl CachedAttachment {
    pub fn path_for(cache_dir: &Path, key: &Key) -> PathBuf {
        cache_dir.join("results").join(format!(
            "{}-{}-{}",
            key.network, key.container_id, key.ifname
        ))
    }

    /// None when there is no usable cache entry; a bad one is logged and ignored.
    pub fn load(cache_dir: &Path, key: &Key) -> Option<CachedAttachment> {
        let path = Self::path_for(cache_dir, key);
        let bytes = crate::ledger::fsio::read_nofollow(&path, 4 << 20).ok()?;
        let file: CacheFile = match serde_json::from_slice(&bytes) {
            Ok(f) => f,
            Err(e) => {
                crate::warn!("gc: ignoring libcni cache {}: {e}", path.display());
                return None;
            }
        };
        if file.kind != "cniCacheV1" {
            crate::warn!(
                "gc: ignoring libcni cache {} of kind {}",
                path.display(),
                file.kind
            );
            return None;
        }
        let config = file
            .config
            .as_deref()
            .and_then(base64_decode)
            .and_then(|b| crate::conflist::parse(&b));
        Some(CachedAttachment {
            config,
            result: file.result,
            capability_args: file.capability_args.unwrap_or_default(),
        })
    }
}

/// libcni removes an attachment's cache path after a successful DEL whatever it holds;
/// so does a successful replay: an empty or cut-off file left there (libcni writes
/// without fsync) would be reported unusable by every `adopt` from then on.
pub fn remove_entry(cache_dir: &Path, key: &Key) {
    let path = CachedAttachment::path_for(cache_dir, key);
    if let Err(e) = std::fs::remove_file(&path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            crate::warn!("gc: cannot remove libcni cache {}: {e}", path.display());
        }
    }
}

/// Standard base64 with padding, as Go's encoding/json writes `[]byte`.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    }
    let s = s.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_cache_files_are_told_apart() {
        let dir = std::env::temp_dir().join(format!("cl-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let good = br#"{"kind":"cniCacheV1","containerId":"c1","ifName":"eth0","networkName":"pods","config":"eyJjbmlWZXJzaW9uIjoiMS4wLjAiLCJuYW1lIjoicG9kcyIsInBsdWdpbnMiOltdfQ==","cniArgs":[["K8S_POD_NAME","p"],["IgnoreUnknown","1"]],"netns":"/run/netns/x"}"#;
        let e = read_entry(&write("pods-c1-eth0", good)).unwrap();
        assert_eq!(e.cni_args, "K8S_POD_NAME=p;IgnoreUnknown=1");
        assert_eq!(e.cni_version, "1.0.0");
        assert_eq!(e.netns, "/run/netns/x");
        assert_eq!(
            e.config_bytes,
            br#"{"cniVersion":"1.0.0","name":"pods","plugins":[]}"#
        );
        let why = |name: &str, bytes: &[u8]| read_entry(&write(name, bytes)).unwrap_err();
        assert!(why("pods-e-eth0", b"").starts_with("empty"));
        assert!(why("pods-g-eth0", &good[..40]).starts_with("undecodable"));
        assert!(why("pods-other-eth0", good).starts_with("misnamed"));
        let bad_id = String::from_utf8_lossy(good).replace(r#""c1""#, r#""../x""#);
        assert!(why("pods-x-eth0", bad_id.as_bytes()).starts_with("invalid"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_attachment_key_needs_the_three_names_and_the_kind() {
        let dir = std::env::temp_dir().join(format!("cl-cache-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = |bytes: &str| {
            let p = dir.join("any-name");
            std::fs::write(&p, bytes).unwrap();
            attachment_key(&p)
        };
        let k =
            key(r#"{"kind":"cniCacheV1","containerId":"c1","ifName":"eth0","networkName":"pods"}"#)
                .unwrap();
        assert_eq!(k, Key::new("pods", "c1", "eth0"));
        assert!(key(r#"{"kind":"cniCacheV1","ifName":"eth0","networkName":"pods"}"#).is_none());
        assert!(
            key(r#"{"kind":"v2","containerId":"c1","ifName":"eth0","networkName":"pods"}"#)
                .is_none()
        );
        assert!(key("").is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn decodes_base64() {
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("Zg==").unwrap(), b"f");
        assert_eq!(base64_decode("Zm8=").unwrap(), b"fo");
        assert_eq!(base64_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(base64_decode("eyJhIjoxfQ==").unwrap(), br#"{"a":1}"#);
        assert!(base64_decode("Z").is_none());
        assert!(base64_decode("Zm9*").is_none());
    }
}
