//! The chain as the ledger's two entries see it (docs/CHAIN.md): the head writes the
//! record before any other plugin runs, the tail completes it once every plugin's ADD
//! has succeeded and notes when a DEL begins. From those fields a record's state.

use crate::ledger::record::ChainNote;
use crate::ledger::Record;
use serde_json::Value;

/// `--chain-left-after`'s default: an ADD not completed 15 minutes after it began is no
/// longer in progress (runtimes time a sandbox's network setup out in minutes).
pub const DEFAULT_LEFT_AFTER_SECS: u64 = 900;

/// The `role` of the tail entry.
pub const TAIL_ROLE: &str = "tail";

/// What a record says of its chain's ADD.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum State {
    /// The tail completed it; `add_seconds` when both ends were timed in one boot.
    Completed { add_seconds: Option<f64> },
    /// A tail is expected and has not come yet, and the ADD may still be running (or the
    /// record's age is unknown).
    Pending,
    /// A tail is expected, never came and no DEL began: older than the threshold, this is
    /// a failed ADD the runtime never tore down (what containerd#12130 leaks).
    FailedLeft,
    /// A tail is expected and never came, and a DEL has begun but not (yet) removed the
    /// record: a failed ADD being torn down. Once the record is gone it was
    /// failed-torn-down.
    TearingDown,
    /// No tail expected: made by a chain without a tail, or adopted.
    Untracked,
}

impl State {
    /// The word `list` and the metrics use.
    pub fn as_str(&self) -> &'static str {
        match self {
            State::Completed { .. } => "completed",
            State::Pending => "pending",
            State::FailedLeft => "failed-left",
            State::TearingDown => "tearing-down",
            State::Untracked => "untracked",
        }
    }
}

/// Classifies `rec` in the boot `boot_id` at wall-clock `now`: a record older than
/// `left_after_secs` that a tail never completed and no DEL touched is failed-left.
pub fn state(rec: &Record, boot_id: &str, now: i64, left_after_secs: u64) -> State {
    classify(
        rec.tail,
        rec.chain.as_ref(),
        rec.age_secs(boot_id, now),
        left_after_secs,
    )
}

/// The rule behind `state`, for callers that keep only a record's chain fields (the
/// agent's watcher): `tail` as the head wrote it, the tail's notes, the record's age in
/// seconds when known.
pub fn classify(
    tail: bool,
    note: Option<&ChainNote>,
    age_secs: Option<i64>,
    left_after_secs: u64,
) -> State {
    if let Some(n) = note.filter(|n| n.completed_boot_ns.is_some() || n.completed_at.is_some()) {
        return State::Completed {
            add_seconds: n.add_seconds,
        };
    }
    if !tail {
        return State::Untracked;
    }
    if note.is_some_and(|n| n.del_began_boot_ns.is_some() || n.del_began_at.is_some()) {
        return State::TearingDown;
    }
    match age_secs {
        Some(age) if age >= 0 && age.unsigned_abs() >= left_after_secs => State::FailedLeft,
        // Unknown or young: still possibly running; staleness errs towards live.
        _ => State::Pending,
    }
}

/// The clocks a record's age is read on: its boot, CLOCK_BOOTTIME, the wall clock.
pub struct Now {
    pub boot_id: String,
    pub boot_ns: Option<u64>,
    pub unix: i64,
}

impl Now {
    pub fn read() -> Now {
        Now {
            boot_id: crate::sandbox::boot_id().unwrap_or_default(),
            boot_ns: crate::time::since_boot_ns(),
            unix: crate::time::now(),
        }
    }
}

/// Age in seconds of a record made in `boot_id` at `created_boot_ns` (CLOCK_BOOTTIME)
/// and `created_at` (RFC 3339): on the boot clock within the boot that made it, else
/// the wall clock.
pub fn age_secs_at(
    boot_id: &str,
    created_boot_ns: Option<u64>,
    created_at: &str,
    now: &Now,
) -> Option<i64> {
    match (created_boot_ns, now.boot_ns) {
        (Some(then), Some(up)) if boot_id == now.boot_id => {
            i64::try_from(up.saturating_sub(then) / 1_000_000_000).ok()
        }
        _ => crate::time::parse_rfc3339(created_at).map(|t| now.unix - t),
    }
}

/// Whether `rec` is failed-left at `now` (`State::FailedLeft`), its age read as the
/// metrics read it (`age_secs_at`): what gc's scan counts for `--metrics-file`.
pub fn failed_left(rec: &Record, now: &Now, left_after_secs: u64) -> bool {
    let age = age_secs_at(&rec.boot_id, rec.created_boot_ns, &rec.created_at, now);
    classify(rec.tail, rec.chain.as_ref(), age, left_after_secs) == State::FailedLeft
}

/// Whether `rec`'s ADD may still be in the chain, so that its tail may still come: a
/// tail is expected and has not completed it, the record is of this boot (`boot_id`),
/// and it is younger than `left_after_secs` (or its age is unknown). Such a record is
/// never removed by a DEL or a replay, only retired (docs/CHAIN.md, "An ADD still in the
/// chain"): its ADD may yet succeed and hold what the DEL released nothing of.
pub fn may_complete(rec: &Record, boot_id: &str, now: i64, left_after_secs: u64) -> bool {
    let completed = rec
        .chain
        .as_ref()
        .is_some_and(|n| n.completed_boot_ns.is_some() || n.completed_at.is_some());
    if !rec.tail || completed || rec.boot_id != boot_id {
        return false;
    }
    !matches!(rec.age_secs(boot_id, now),
        Some(age) if age >= 0 && age.unsigned_abs() >= left_after_secs)
}

/// The chain's ADD duration in seconds, from the head's and the tail's boot-clock stamps
/// taken in one boot (the caller knows the boot); None when either is missing or the
/// clock went backwards (it cannot within a boot: the stamps are then not of one boot).
pub fn add_seconds(created_boot_ns: Option<u64>, completed_boot_ns: u64) -> Option<f64> {
    let created = created_boot_ns?;
    let ns = completed_boot_ns.checked_sub(created)?;
    Some(ns as f64 / 1e9)
}

// The plugin list is read here by hand, not through `conflist` (a layer above this
// one, docs/MODULES.md): `type` and `role` are all these need.
fn is_ours(plugin: &Value, ledger_type: &str) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(ledger_type)
}

/// Whether a plugin config of a chain is the ledger's tail entry.
pub fn is_tail(plugin: &Value, ledger_type: &str) -> bool {
    is_ours(plugin, ledger_type) && plugin.get("role").and_then(Value::as_str) == Some(TAIL_ROLE)
}

/// Whether a plugin config of a chain is the ledger's head entry (any role but `tail`).
pub fn is_head(plugin: &Value, ledger_type: &str) -> bool {
    is_ours(plugin, ledger_type) && !is_tail(plugin, ledger_type)
}

/// Whether a loaded chain (a conflist with its `plugins`) holds the ledger's tail entry.
pub fn holds_tail(list: &Value, ledger_type: &str) -> bool {
    list.get("plugins")
        .and_then(Value::as_array)
        .is_some_and(|plugins| plugins.iter().any(|p| is_tail(p, ledger_type)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::record::{sample, ChainNote};
    use serde_json::json;

    fn aged(secs_ago: i64) -> (Record, i64) {
        let mut r = sample();
        let now = 2_000_000_000;
        r.created_at = crate::time::rfc3339(now - secs_ago);
        r.boot_id = "another boot".into();
        (r, now)
    }

    #[test]
    fn the_classification_follows_the_spec() {
        let (mut r, now) = aged(10);
        assert_eq!(state(&r, "b", now, 900), State::Untracked);
        r.tail = true;
        assert_eq!(state(&r, "b", now, 900), State::Pending);
        assert_eq!(state(&r, "b", now, 5), State::FailedLeft);
        r.chain = Some(ChainNote {
            del_began_at: Some("x".into()),
            del_began_boot_ns: Some(1),
            ..ChainNote::default()
        });
        assert_eq!(state(&r, "b", now, 5), State::TearingDown);
        r.chain = Some(ChainNote {
            completed_at: Some("x".into()),
            completed_boot_ns: Some(2),
            add_seconds: Some(0.25),
            ..ChainNote::default()
        });
        assert_eq!(
            state(&r, "b", now, 5),
            State::Completed {
                add_seconds: Some(0.25)
            }
        );
        // An unknown age is never failed-left.
        r.chain = None;
        r.created_at = "garbage".into();
        assert_eq!(state(&r, "b", now, 0), State::Pending);
    }

    #[test]
    fn only_an_uncompleted_tail_chain_of_this_boot_may_complete() {
        let (mut r, now) = aged(10);
        r.boot_id = "b".into();
        // created_boot_secs is unset: the age is read on the wall clock.
        assert!(
            !may_complete(&r, "b", now, 900),
            "no tail: nothing to wait for"
        );
        r.tail = true;
        assert!(may_complete(&r, "b", now, 900));
        assert!(!may_complete(&r, "another", now, 900), "another boot");
        assert!(!may_complete(&r, "b", now, 5), "older than the threshold");
        r.chain = Some(ChainNote {
            del_began_at: Some("x".into()),
            ..ChainNote::default()
        });
        assert!(may_complete(&r, "b", now, 900), "a DEL began: still may");
        r.chain = Some(ChainNote {
            completed_at: Some("x".into()),
            ..ChainNote::default()
        });
        assert!(!may_complete(&r, "b", now, 900), "completed");
        r.chain = None;
        r.created_at = "garbage".into();
        assert!(
            may_complete(&r, "b", now, 0),
            "unknown age errs towards may"
        );
    }

    #[test]
    fn durations_need_both_stamps_in_order() {
        assert_eq!(add_seconds(Some(1_000), 1_500_001_000), Some(1.5));
        assert_eq!(add_seconds(None, 5), None);
        assert_eq!(add_seconds(Some(6), 5), None);
    }

    #[test]
    fn head_and_tail_are_told_apart_by_role() {
        let list = json!({"plugins": [
            {"type": "cni-ledger"},
            {"type": "bridge", "role": "tail"},
            {"type": "cni-ledger", "role": "tail"},
        ]});
        let p = list["plugins"].as_array().unwrap();
        assert!(is_head(&p[0], "cni-ledger") && !is_tail(&p[0], "cni-ledger"));
        assert!(!is_tail(&p[1], "cni-ledger") && !is_head(&p[1], "cni-ledger"));
        assert!(is_tail(&p[2], "cni-ledger") && !is_head(&p[2], "cni-ledger"));
        assert!(holds_tail(&list, "cni-ledger"));
        assert!(!holds_tail(&json!({"plugins": [p[0]]}), "cni-ledger"));
    }
}
