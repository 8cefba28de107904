//! One attachment's record and its on-disk encoding.
//!
//! A record file is one line of JSON:
//! `{"format":1,"sha256":"<hex>","record":{...}}` where the hash covers the exact bytes
//! of the `record` value as stored. A file whose hash does not match, or that does not
//! decode, is damaged; one with a newer `format` is left alone for a newer binary.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::sandbox::NsId;

pub const FORMAT: u32 = 1;

/// What identifies an attachment, as libcni does: network, container, interface.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

impl Key {
    pub fn new(
        network: impl Into<String>,
        container_id: impl Into<String>,
        ifname: impl Into<String>,
    ) -> Key {
        Key {
            network: network.into(),
            container_id: container_id.into(),
            ifname: ifname.into(),
        }
    }

    /// File stem: readable `net:cid:ifname` (`:` cannot occur in any part), or a hash
    /// when that would exceed what a file name can hold.
    pub fn stem(&self) -> String {
        let readable = format!("{}:{}:{}", self.network, self.container_id, self.ifname);
        if readable.len() <= 200 {
            readable
        } else {
            format!("h-{}", sha256_hex(readable.as_bytes()))
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// Who made a record, when not the plugin's ADD (those carry no source). Stored as its
/// name; a name this binary does not know decodes as `Other`, so a record a newer binary
/// wrote is still read, never taken for damage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum RecordSource {
    /// `adopted`: made by `cni-ledger adopt` from libcni's cache.
    Adopted,
    Other(String),
}

impl RecordSource {
    pub fn as_str(&self) -> &str {
        match self {
            RecordSource::Adopted => "adopted",
            RecordSource::Other(s) => s,
        }
    }
}

impl From<String> for RecordSource {
    fn from(s: String) -> RecordSource {
        match s.as_str() {
            "adopted" => RecordSource::Adopted,
            _ => RecordSource::Other(s),
        }
    }
}

impl From<RecordSource> for String {
    fn from(s: RecordSource) -> String {
        match s {
            RecordSource::Other(s) => s,
            known => known.as_str().to_string(),
        }
    }
}

impl std::fmt::Display for RecordSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcState {
    pub attempts: u32,
    pub last_error: Option<String>,
    pub last_attempt_at: Option<String>,
    pub next_attempt_at: Option<String>,
    pub failed: bool,
}

/// The tail entry's part of a record (docs/CHAIN.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainNote {
    /// When the tail's ADD ran: every plugin of the chain had succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_boot_ns: Option<u64>,
    /// completedBootNs - createdBootNs, in seconds; absent unless both are of one boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_seconds: Option<f64>,
    /// The chain's result (the tail's prevResult): a replay's prevResult when libcni's
    /// cache is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// When the tail's DEL ran (first in DEL's reversed order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub del_began_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub del_began_boot_ns: Option<u64>,
    /// `returnDevices`: the host names of the pod's devices when the chain completed,
    /// before the pod could touch them (`devices::Recorded`, decoded there): the links
    /// that had one, as every release writes and reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Value>,
    /// `returnDevices`: every link the option selected when the chain completed, named
    /// or not, with what identifies it (`devices::Recorded`). Its presence says the list
    /// is whole: DEL then returns a virtual link only if it is on it. Absent in notes of
    /// older releases, whose `devices` left unnamed links out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub netns_id: Option<NsId>,
    pub boot_id: String,
    #[serde(default)]
    pub cni_args: String,
    #[serde(default)]
    pub cni_path: String,
    pub cni_version: String,
    #[serde(default)]
    pub runtime_config: Map<String, Value>,
    /// The `type` the ledger had in the chain, skipped on replay.
    pub ledger_type: String,
    pub snapshot: Option<String>,
    pub conf_file: Option<String>,
    pub created_at: String,
    /// Seconds since boot (CLOCK_BOOTTIME) at ADD: within the recorded boot, the record's
    /// age is measured on it, so a wall clock stepped forward ages no record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_boot_secs: Option<u64>,
    /// CLOCK_BOOTTIME nanoseconds when the head's ADD started: the chain's duration is
    /// measured from it (`chain.addSeconds`), within the recorded boot only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_boot_ns: Option<u64>,
    /// Random per ADD: tells a record apart from a newer one for the same key.
    pub add_id: String,
    /// The chain the head snapshotted holds a tail entry: the record is expected to be
    /// completed (`chain`) when the ADD succeeds (docs/CHAIN.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tail: bool,
    /// What the tail entry noted: the chain's completion and result, a DEL's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<ChainNote>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc: Option<GcState>,
    /// `adopted` for a record `cni-ledger adopt` made from libcni's cache; none for ADD's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<RecordSource>,
    /// The libcni cache file an adopted record came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_file: Option<String>,
    /// An adopted record's `conflist::chain_digest` of the cached chain: a runtime's
    /// sandbox list judges the record only if that runtime loads this very chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_digest: Option<String>,
}

impl Record {
    pub fn key(&self) -> Key {
        Key::new(&self.network, &self.container_id, &self.ifname)
    }

    pub fn created_unix(&self) -> Option<i64> {
        crate::time::parse_rfc3339(&self.created_at)
    }

    /// The record's age in seconds: on the boot clock when it was made in `boot` (the
    /// current one) and says when, else on the wall clock (`now`). None: unknown.
    pub fn age_secs(&self, boot: &str, now: i64) -> Option<i64> {
        match (self.created_boot_secs, crate::time::since_boot()) {
            (Some(then), Some(up)) if self.boot_id == boot => {
                Some(i64::try_from(up.saturating_sub(then)).unwrap_or(i64::MAX))
            }
            _ => self.created_unix().map(|t| now - t),
        }
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 0xf) as usize] as char);
    }
    s
}

pub fn encode(record: &Record) -> Vec<u8> {
    // Plain fields and string-keyed maps: serialising cannot fail.
    #[allow(clippy::expect_used)]
    let body = serde_json::to_string(record).expect("a record always serialises");
    format!(
        "{{\"format\":{FORMAT},\"sha256\":\"{}\",\"record\":{body}}}\n",
        sha256_hex(body.as_bytes())
    )
    .into_bytes()
}

/// Why a record file is damaged; shown as a short word (`checksum-mismatch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DamageReason {
    /// Not the JSON envelope of a record.
    Undecodable,
    /// The hash does not cover the bytes stored.
    ChecksumMismatch,
    /// Hashed right, but not a record this binary can read.
    InvalidRecord,
    /// The file holds another key's record.
    Misnamed,
    /// A symlink stands in place of a record.
    Symlink,
    /// In `records/` without a record file's name.
    ForeignFile,
    /// Not a regular file.
    NotAFile,
}

impl DamageReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DamageReason::Undecodable => "undecodable",
            DamageReason::ChecksumMismatch => "checksum-mismatch",
            DamageReason::InvalidRecord => "invalid-record",
            DamageReason::Misnamed => "misnamed",
            DamageReason::Symlink => "symlink",
            DamageReason::ForeignFile => "foreign-file",
            DamageReason::NotAFile => "not-a-file",
        }
    }
}

impl std::fmt::Display for DamageReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is wrong with a damaged record file: the reason, and the detail found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub reason: DamageReason,
    pub detail: String,
}

impl Damage {
    pub fn new(reason: DamageReason, detail: impl Into<String>) -> Damage {
        Damage {
            reason,
            detail: detail.into(),
        }
    }
}

#[derive(Debug)]
pub enum Decoded {
    Ok(Box<Record>),
    /// Not to be acted on, to be quarantined.
    Damaged(Damage),
    /// Written by a newer binary: neither acted on nor quarantined.
    Newer(u32),
    /// Could not be read just now (EIO, ENOMEM, EMFILE, ...): nothing is known of its
    /// content, so it is neither acted on nor quarantined; the next run reads it again.
    /// Only scans produce it (`Ledger::read` returns the error instead).
    Unreadable(String),
}

#[derive(Deserialize)]
struct Envelope<'a> {
    format: u32,
    sha256: String,
    #[serde(borrow)]
    record: &'a RawValue,
}

pub fn decode(bytes: &[u8]) -> Decoded {
    let env: Envelope = match serde_json::from_slice(bytes) {
        Ok(e) => e,
        Err(e) => return Decoded::Damaged(Damage::new(DamageReason::Undecodable, e.to_string())),
    };
    if env.format > FORMAT {
        return Decoded::Newer(env.format);
    }
    let body = env.record.get();
    if sha256_hex(body.as_bytes()) != env.sha256 {
        return Decoded::Damaged(Damage::new(
            DamageReason::ChecksumMismatch,
            "sha256 does not match content",
        ));
    }
    match serde_json::from_str::<Record>(body) {
        Ok(r) => Decoded::Ok(Box::new(r)),
        Err(e) => Decoded::Damaged(Damage::new(DamageReason::InvalidRecord, e.to_string())),
    }
}

/// What an older binary can still tell of a record of a newer format (`Decoded::Newer`),
/// read tolerantly: which snapshots it may name, and its key where the fields of this
/// format still hold it. Never used to act on the record, only to leave it and what it
/// refers to whole.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NewerView {
    /// Every 64-hex run in any string of the file but the envelope's own `sha256`: the
    /// snapshot(s) it names, whatever the field or its shape (`"sha256:<hex>"`, a path).
    pub hashes: Vec<String>,
    /// None: the names it uses for snapshots cannot be told (no hash found, and no
    /// `record.snapshot: null` saying it has none): a sweep must keep every snapshot.
    pub snapshots_known: bool,
    pub key: Option<Key>,
}

/// `NewerView` of a file's bytes; None when they are not JSON at all.
pub fn newer_view(bytes: &[u8]) -> Option<NewerView> {
    let mut v: Value = serde_json::from_slice(bytes).ok()?;
    if let Some(env) = v.as_object_mut() {
        env.remove("sha256");
    }
    let mut hashes = Vec::new();
    collect_hex64(&v, &mut hashes);
    hashes.sort();
    hashes.dedup();
    let rec = v.get("record");
    let says_none = rec
        .and_then(|r| r.as_object())
        .and_then(|r| r.get("snapshot"))
        .is_some_and(Value::is_null);
    let field = |name: &str| {
        rec.and_then(|r| r.get(name))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let key = match (field("network"), field("containerId"), field("ifname")) {
        (Some(n), Some(c), Some(i)) => Some(Key::new(n, c, i)),
        _ => None,
    };
    Some(NewerView {
        snapshots_known: !hashes.is_empty() || says_none,
        hashes,
        key,
    })
}

fn collect_hex64(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => {
            for run in s.split(|c: char| !c.is_ascii_hexdigit()) {
                if run.len() == 64 {
                    out.push(run.to_ascii_lowercase());
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_hex64(v, out)),
        Value::Object(o) => o.values().for_each(|v| collect_hex64(v, out)),
        _ => {}
    }
}

#[cfg(test)]
pub(crate) fn sample() -> Record {
    Record {
        network: "net1".into(),
        container_id: "abc".into(),
        ifname: "eth0".into(),
        netns: "/run/netns/x".into(),
        netns_id: Some(NsId {
            dev: 4,
            ino: 4026532000,
            cookie: Some(4096),
            pid_start: None,
        }),
        boot_id: "b".into(),
        cni_args: "K8S_POD_NAME=p".into(),
        cni_path: "/opt/cni/bin".into(),
        cni_version: "1.0.0".into(),
        runtime_config: Map::new(),
        ledger_type: "cni-ledger".into(),
        snapshot: None,
        conf_file: None,
        created_at: "2026-12-02T17:41:33Z".into(),
        created_boot_secs: None,
        created_boot_ns: None,
        add_id: "00".into(),
        tail: false,
        chain: None,
        gc: None,
        source: None,
        cache_file: None,
        chain_digest: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_stored_as_its_name_and_an_unknown_one_still_decodes() {
        let mut r = sample();
        r.source = Some(RecordSource::Adopted);
        let bytes = encode(&r);
        assert!(String::from_utf8_lossy(&bytes).contains(r#""source":"adopted""#));
        assert!(matches!(decode(&bytes), Decoded::Ok(d) if *d == r));
        r.source = Some(RecordSource::Other("imported-by-v9".into()));
        let bytes = encode(&r);
        assert!(String::from_utf8_lossy(&bytes).contains(r#""source":"imported-by-v9""#));
        match decode(&bytes) {
            Decoded::Ok(d) => assert_eq!(d.source, r.source),
            other => panic!("a record of unknown source is not damaged: {other:?}"),
        }
    }

    #[test]
    fn round_trip_and_every_single_byte_flip_is_caught() {
        let r = sample();
        let bytes = encode(&r);
        match decode(&bytes) {
            Decoded::Ok(d) => assert_eq!(*d, r),
            other => panic!("{other:?}"),
        }
        for i in 0..bytes.len() - 1 {
            let mut b = bytes.clone();
            b[i] ^= 0x01;
            match decode(&b) {
                Decoded::Ok(d) => assert_eq!(*d, r, "flip at {i} changed the record undetected"),
                Decoded::Damaged(..) | Decoded::Newer(_) => {}
                Decoded::Unreadable(e) => panic!("decoding bytes cannot fail to read: {e}"),
            }
        }
        for cut in 0..bytes.len() - 1 {
            assert!(
                !matches!(decode(&bytes[..cut]), Decoded::Ok(_)),
                "truncation at {cut}"
            );
        }
    }

    #[test]
    fn newer_format_is_not_damage() {
        let bytes = br#"{"format":9,"sha256":"x","record":{}}"#;
        assert!(matches!(decode(bytes), Decoded::Newer(9)));
    }

    #[test]
    fn a_newer_record_shows_the_snapshots_it_names_however_it_names_them() {
        let h1 = "ab".repeat(32);
        let h2 = "0c".repeat(32);
        let bytes = format!(
            r#"{{"format":2,"sha256":"{}","record":{{"network":"n","containerId":"c","ifname":"eth0","snapshot":"{h1}","more":[{{"ref":"sha256:{h2}"}}]}}}}"#,
            "ee".repeat(32)
        );
        let v = newer_view(bytes.as_bytes()).unwrap();
        assert_eq!(v.hashes, vec![h2.clone(), h1.clone()]);
        assert!(v.snapshots_known);
        assert_eq!(v.key, Some(Key::new("n", "c", "eth0")));
        // No hash and no word that it has none: unknown, so a sweep keeps them all.
        let v = newer_view(br#"{"format":2,"record":{"snap":{"b64":"q83v"}}}"#).unwrap();
        assert!(!v.snapshots_known && v.hashes.is_empty() && v.key.is_none());
        let v = newer_view(br#"{"format":2,"record":{"snapshot":null}}"#).unwrap();
        assert!(v.snapshots_known && v.hashes.is_empty());
        // A 65-hex run is no sha256.
        let v = newer_view(format!(r#"{{"x":"{h1}f"}}"#).as_bytes()).unwrap();
        assert!(v.hashes.is_empty());
        assert!(newer_view(b"{not json").is_none());
    }

    #[test]
    fn long_keys_are_hashed() {
        let mut k = sample().key();
        assert_eq!(k.stem(), "net1:abc:eth0");
        k.container_id = "a".repeat(300);
        assert!(k.stem().starts_with("h-") && k.stem().len() == 66);
    }
}
