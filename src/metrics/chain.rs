//! What the chain's metrics read of a record (the chain's spec): `tail`, `createdBootNs`
//! and the tail's `chain` notes (its note file, or the record's own `chain`), decoded by
//! the ledger's own decoders, and the failed-left classification the agent's watcher
//! makes of them (by `crate::chain`'s rule and clocks, as gc's scan does of a record).

use crate::chain::State;
use crate::ledger::record::{self, ChainNote, Decoded, Record};
use crate::ledger::Ledger;

pub use crate::chain::{Now, DEFAULT_LEFT_AFTER_SECS};

/// The fields of a record the chain's metrics need (the chain's spec): what the watcher
/// keeps per record, without the chain's result.
#[derive(Debug, Clone)]
pub struct View {
    pub network: String,
    pub add_id: String,
    pub boot_id: String,
    pub created_at: String,
    pub created_boot_ns: Option<u64>,
    pub tail: bool,
    pub chain: Option<ChainNote>,
}

/// A record file's view; None for anything that is not an intact record of a format
/// this binary knows (gc and `list` deal with those).
pub fn view(bytes: &[u8]) -> Option<View> {
    intact(bytes).map(View::of)
}

fn intact(bytes: &[u8]) -> Option<Record> {
    match record::decode(bytes) {
        Decoded::Ok(r) => Some(*r),
        _ => None,
    }
}

impl View {
    pub fn of(r: Record) -> View {
        View {
            network: r.network,
            add_id: r.add_id,
            boot_id: r.boot_id,
            created_at: r.created_at,
            created_boot_ns: r.created_boot_ns,
            tail: r.tail,
            chain: r.chain.map(|c| ChainNote { result: None, ..c }),
        }
    }

    /// Completed by the tail.
    pub fn completed(&self) -> bool {
        matches!(self.state(None, 0), State::Completed { .. })
    }

    pub fn del_began_boot_ns(&self) -> Option<u64> {
        self.chain.as_ref().and_then(|c| c.del_began_boot_ns)
    }

    /// The chain's ADD time: the tail's own figure, else from the two boot-clock stamps.
    pub fn add_seconds(&self) -> Option<f64> {
        let c = self.chain.as_ref()?;
        c.add_seconds
            .or_else(|| crate::chain::add_seconds(self.created_boot_ns, c.completed_boot_ns?))
    }

    /// Age in seconds (`chain::age_secs_at`).
    fn age_secs(&self, now: &Now) -> Option<i64> {
        crate::chain::age_secs_at(&self.boot_id, self.created_boot_ns, &self.created_at, now)
    }

    /// The record's chain state, by the rule `list` uses (`chain::classify`).
    fn state(&self, age_secs: Option<i64>, left_after_secs: u64) -> State {
        crate::chain::classify(self.tail, self.chain.as_ref(), age_secs, left_after_secs)
    }

    /// Whether its ADD may still be in the chain, as `chain::may_complete` judges a
    /// record: a tail expected and not completed, this boot, younger than `left_after`.
    pub fn may_complete(&self, now: &Now, left_after_secs: u64) -> bool {
        self.tail
            && !self.completed()
            && self.boot_id == now.boot_id
            && !matches!(self.age_secs(now),
                Some(age) if age >= 0 && age.unsigned_abs() >= left_after_secs)
    }

    /// A chain with a tail whose ADD never completed, no DEL begun, older than `left_after`.
    pub fn failed_left(&self, now: &Now, left_after_secs: u64) -> bool {
        self.state(self.age_secs(now), left_after_secs) == State::FailedLeft
    }
}

/// CLOCK_BOOTTIME in nanoseconds: the clock the chain's stamps are on.
pub fn boot_ns() -> Option<u64> {
    crate::time::since_boot_ns()
}

/// Records failed-left now, by network, from a scan of its own: what the watcher's
/// tests check its count against (gc counts them in its one scan).
#[cfg(test)]
pub fn failed_left_by_network(
    ledger: &Ledger,
    left_after_secs: u64,
) -> std::collections::BTreeMap<String, i64> {
    let now = Now::read();
    let mut out = std::collections::BTreeMap::new();
    for (_, v) in list(ledger) {
        if v.failed_left(&now, left_after_secs) {
            *out.entry(v.network).or_default() += 1;
        }
    }
    out
}

pub fn list(ledger: &Ledger) -> Vec<(String, View)> {
    ledger
        .record_stems()
        .into_iter()
        .filter_map(|stem| {
            let v = read_view(ledger, &stem)?;
            Some((stem, v))
        })
        .collect()
}

/// The view of `stem`'s record, with the tail's note on it (`Ledger::read_intact`).
pub fn read_view(ledger: &Ledger, stem: &str) -> Option<View> {
    ledger.read_intact(stem).map(View::of)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_or_newer_file_is_no_record() {
        assert!(view(b"{}").is_none());
        assert!(view(br#"{"format":1,"sha256":"00","record":{"network":"n"}}"#).is_none());
        let mut rec = record::sample();
        rec.tail = true;
        let bytes = record::encode(&rec);
        assert!(view(&bytes).unwrap().tail);
        let newer = String::from_utf8(bytes)
            .unwrap()
            .replacen(r#""format":1"#, r#""format":9"#, 1);
        assert!(view(newer.as_bytes()).is_none());
    }
}
