//! libcni's result cache (`<cacheDir>/results/<net>-<cid>-<ifname>`, kind `cniCacheV1`):
//! the source of `prevResult` for a replayed DEL and a fallback for the config.

use crate::ledger::Key;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

pub struct CachedAttachment {
    path: PathBuf,
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
            path,
            config,
            result: file.result,
            capability_args: file.capability_args.unwrap_or_default(),
        })
    }

    /// libcni deletes the entry after a successful DEL; so does a successful replay.
    pub fn remove(&self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                crate::warn!(
                    "gc: cannot remove libcni cache {}: {e}",
                    self.path.display()
                );
            }
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
