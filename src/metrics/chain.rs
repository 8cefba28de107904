//! What the chain's metrics read of a record (the chain's spec): `tail`, `createdBootNs`
//! and the tail's `chain` notes, decoded from the record's JSON whatever else it holds,
//! and the failed-left classification `gc --metrics-file` and the agent's watcher share.

use crate::ledger::Ledger;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;

pub use crate::chain::DEFAULT_LEFT_AFTER_SECS;
const RECORD_EXT: &str = ".json";
const MAX_RECORD: u64 = 4 << 20;

/// The fields of a record the chain's metrics need (the chain's spec), read from the
/// record's JSON whatever else it holds.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    pub network: String,
    pub add_id: String,
    pub boot_id: String,
    pub created_at: String,
    #[serde(default)]
    pub created_boot_ns: Option<u64>,
    #[serde(default)]
    pub tail: Option<bool>,
    #[serde(default)]
    pub chain: Option<ChainView>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainView {
    #[serde(default)]
    pub completed_at: Option<String>,
    #[serde(default)]
    pub completed_boot_ns: Option<u64>,
    #[serde(default)]
    pub add_seconds: Option<f64>,
    #[serde(default)]
    pub del_began_at: Option<String>,
    #[serde(default)]
    pub del_began_boot_ns: Option<u64>,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    format: u32,
    sha256: String,
    #[serde(borrow)]
    record: &'a RawValue,
}

/// A record file's view; None for anything that is not an intact record of a format
/// this binary knows (gc and `list` deal with those).
pub fn view(bytes: &[u8]) -> Option<View> {
    let env: Envelope = serde_json::from_slice(bytes).ok()?;
    let body = env.record.get();
    if env.format > crate::ledger::record::FORMAT
        || crate::ledger::record::sha256_hex(body.as_bytes()) != env.sha256
    {
        return None;
    }
    serde_json::from_str(body).ok()
}

impl View {
    /// Completed by the tail (either of its stamps: one may be missing when the boot
    /// clock could not be read).
    pub fn completed(&self) -> bool {
        self.chain
            .as_ref()
            .is_some_and(|c| c.completed_boot_ns.is_some() || c.completed_at.is_some())
    }

    fn del_began(&self) -> bool {
        self.chain
            .as_ref()
            .is_some_and(|c| c.del_began_boot_ns.is_some() || c.del_began_at.is_some())
    }

    pub fn del_began_boot_ns(&self) -> Option<u64> {
        self.chain.as_ref().and_then(|c| c.del_began_boot_ns)
    }

    /// The chain's ADD time: the tail's own figure, else from the two boot-clock stamps.
    pub fn add_seconds(&self) -> Option<f64> {
        let c = self.chain.as_ref()?;
        c.add_seconds.or_else(|| {
            let ns = c.completed_boot_ns?.checked_sub(self.created_boot_ns?)?;
            Some(ns as f64 / 1e9)
        })
    }

    /// Age in seconds: on the boot clock within the boot that made it, else the wall clock.
    fn age_secs(&self, now: &Now) -> Option<f64> {
        match (self.created_boot_ns, now.boot_ns) {
            (Some(then), Some(up)) if self.boot_id == now.boot_id => {
                Some(up.saturating_sub(then) as f64 / 1e9)
            }
            _ => crate::time::parse_rfc3339(&self.created_at).map(|t| (now.unix - t) as f64),
        }
    }

    /// A chain with a tail whose ADD never completed, no DEL begun, older than `left_after`.
    pub fn failed_left(&self, now: &Now, left_after_secs: u64) -> bool {
        self.tail == Some(true)
            && !self.completed()
            && !self.del_began()
            && self
                .age_secs(now)
                .is_some_and(|age| age >= left_after_secs as f64)
    }
}

/// The clocks a classification reads.
pub struct Now {
    pub boot_id: String,
    pub boot_ns: Option<u64>,
    pub unix: i64,
}

impl Now {
    pub fn read() -> Now {
        Now {
            boot_id: crate::sandbox::boot_id().unwrap_or_default(),
            boot_ns: boot_ns(),
            unix: crate::time::now(),
        }
    }
}

/// CLOCK_BOOTTIME in nanoseconds: the clock the chain's stamps are on.
pub fn boot_ns() -> Option<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    let secs = u64::try_from(t.tv_sec()).ok()?;
    let nanos = u64::try_from(t.tv_nsec()).ok()?;
    secs.checked_mul(1_000_000_000)?.checked_add(nanos)
}

/// Records failed-left now, by network, from one scan of the ledger: what `gc
/// --metrics-file` exports without the agent.
pub fn failed_left_by_network(ledger: &Ledger, left_after_secs: u64) -> BTreeMap<String, i64> {
    let now = Now::read();
    let mut out = BTreeMap::new();
    for (_, v) in list(ledger) {
        if v.failed_left(&now, left_after_secs) {
            *out.entry(v.network).or_default() += 1;
        }
    }
    out
}

pub fn list(ledger: &Ledger) -> Vec<(String, View)> {
    let Ok(rd) = std::fs::read_dir(ledger.records_dir()) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let stem = stem(&name)?.to_string();
            let v = read_view(ledger, &stem)?;
            Some((stem, v))
        })
        .collect()
}

pub fn stem(name: &str) -> Option<&str> {
    // Temp files of writes in progress start with a dot and never end in `.json`.
    name.strip_suffix(RECORD_EXT)
        .filter(|s| !s.starts_with('.'))
}

pub fn read_view(ledger: &Ledger, stem: &str) -> Option<View> {
    let bytes = crate::ledger::fsio::read_nofollow(&ledger.record_path(stem), MAX_RECORD).ok()?;
    view(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_or_newer_file_is_no_record() {
        assert!(view(b"{}").is_none());
        assert!(view(br#"{"format":1,"sha256":"00","record":{"network":"n"}}"#).is_none());
        let body = r#"{"network":"n","addId":"a","bootId":"b","createdAt":"x","tail":true}"#;
        let sha = crate::ledger::record::sha256_hex(body.as_bytes());
        let ok = format!(r#"{{"format":1,"sha256":"{sha}","record":{body}}}"#);
        assert_eq!(view(ok.as_bytes()).unwrap().tail, Some(true));
        let newer = format!(r#"{{"format":9,"sha256":"{sha}","record":{body}}}"#);
        assert!(view(newer.as_bytes()).is_none());
    }
}
