//! Reading the ledger's files as the contract (docs/CONTRACT.md) describes them,
//! independently of the product's decoder: the envelope's checksum, a namespace's
//! identity as a record holds it.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fs;
use std::os::unix::fs::MetadataExt;

pub fn sha256_of(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An independent reading of a record file (CONTRACT.md): the envelope must parse,
/// `format` must be 1 and `sha256` must cover the exact bytes of `record`.
pub fn decode_record(bytes: &[u8]) -> Result<Value, String> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        format: u64,
        sha256: String,
        #[serde(borrow)]
        record: &'a RawValue,
    }
    let env: Envelope = serde_json::from_slice(bytes).map_err(|e| format!("undecodable: {e}"))?;
    if env.format != 1 {
        return Err(format!("format {}", env.format));
    }
    if sha256_of(env.record.get().as_bytes()) != env.sha256 {
        return Err("checksum mismatch".into());
    }
    serde_json::from_str(env.record.get()).map_err(|e| format!("record body: {e}"))
}

/// (dev, ino) of a path, following symlinks (a netns' identity as the ledger records it).
pub fn identity(path: &str) -> (u64, u64) {
    let m = fs::metadata(path).unwrap_or_else(|e| panic!("stat {path}: {e}"));
    (m.dev(), m.ino())
}
