//! CNI 1.1 GC: the runtime names the attachments that are still valid for this network;
//! every other record of the network is stale and its DEL is replayed.
//!
//! As the spec asks of GC, a replay that fails does not stop the others: the verb
//! removes what it can and then reports, as a CNI error, every attachment it could not
//! clean; their records stay for the next GC or `cni-ledger gc`.
//!
//! The runtime waits for the answer with a deadline of its own (CRI-O gives the whole
//! call 30 s), so the verb works within `gcBudgetSecs`: no replay starts after it, a
//! plugin still running then is killed, and every attachment not cleaned in time keeps
//! its record and is named in the answer.

use crate::cni::config::NetConf;
use crate::cni::error::{self, CniError};
use crate::gc::{self, Action, RecordReport, Report};
use serde_json::Value;
use std::time::{Duration, Instant};

pub fn gc(conf: &NetConf) -> Result<(), CniError> {
    // The budget counts from the verb's start: the scan is part of the wait too.
    let budget = Duration::from_secs(conf.gc_budget_secs);
    let deadline = Instant::now() + budget;
    // parse() accepted this document as a JSON object; the fallback is for form's sake.
    let stdin: Value = serde_json::from_slice(&conf.stdin).unwrap_or(Value::Null);
    let list = valid_list(&stdin).ok_or_else(|| {
        CniError::new(
            error::INVALID_NETWORK_CONFIG,
            "GC without a valid-attachments list",
            "the request carries neither cni.dev/valid-attachments nor cni.dev/attachments; \
             nothing is judged without the runtime's list",
        )
    })?;
    let valid = gc::valid_set(list).map_err(|e| {
        CniError::new(
            error::INVALID_NETWORK_CONFIG,
            "invalid cni.dev/valid-attachments",
            e.to_string(),
        )
    })?;
    let mut opts = gc::Options::new(conf.ledger_dir.clone());
    opts.network = Some(conf.name.clone());
    opts.valid = Some(valid);
    opts.conf_dir = conf.conf_dir.clone();
    // No ADD or DEL runs during GC (the runtime guarantees it), so the valid list is
    // complete: no grace unless the operator asked for one. An ADD in the chain all the
    // same keeps its record: the replay retires it for the tail (docs/CHAIN.md).
    opts.grace_secs = conf.gc_grace_secs.unwrap_or(0) as i64;
    // The runtime asked now; a record waiting out its backoff is tried again.
    opts.ignore_backoff = true;
    opts.deadline = Some(deadline);
    let report = gc::run(&opts).map_err(|e| CniError::from_anyhow(error::IO_FAILURE, &e))?;
    crate::info!(
        "GC {}: {} stale, {} replayed, {} retrying, {} failed",
        conf.name,
        report.summary.stale,
        report.summary.replayed,
        report.summary.retrying,
        report.summary.failed
    );
    let out_of_time = Instant::now() >= deadline;
    match not_cleaned(
        &conf.name,
        &report,
        out_of_time.then_some(conf.gc_budget_secs),
    ) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Stale records the verb left behind: the error the runtime gets, each attachment
/// named once with why it is still there. Records in a grace period the operator set
/// are not judged yet and are no failure. `budget_spent` is the budget, when it ran out.
fn not_cleaned(network: &str, report: &Report, budget_spent: Option<u64>) -> Option<CniError> {
    let left: Vec<String> = report.records.iter().filter_map(why_left).collect();
    if left.is_empty() {
        return None;
    }
    let when = match budget_spent {
        Some(secs) => format!(" within its {secs}s budget (gcBudgetSecs)"),
        None => String::new(),
    };
    Some(CniError::new(
        error::TRY_AGAIN_LATER,
        format!(
            "GC of network {network} could not clean {} attachment(s){when}; their records are kept for retry",
            left.len()
        ),
        left.join("; "),
    ))
}

fn why_left(r: &RecordReport) -> Option<String> {
    let why = match r.action {
        Action::Retrying | Action::Failed => r
            .plugins
            .iter()
            .filter(|p| !p.ok())
            .map(gc::failure_text)
            .collect::<Vec<_>>()
            .join(", "),
        Action::SkipFailed => format!(
            "given up after {} attempts, left for an operator (last: {})",
            r.attempts,
            r.last_error.as_deref().unwrap_or("unknown")
        ),
        Action::Busy => "busy: another cni-ledger gc holds it".to_string(),
        Action::SkipBackoff => "waiting out its backoff".to_string(),
        Action::Deferred => "not attempted: the GC budget ran out first".to_string(),
        Action::Replayed
        | Action::WouldReplay
        | Action::SkipGrace
        | Action::Gone
        | Action::Changed
        | Action::Live => return None,
    };
    let why = if r.action == Action::Failed {
        format!("{why}; given up after {} attempts", r.attempts)
    } else {
        why
    };
    Some(format!("{}/{}: {why}", r.container_id, r.ifname))
}

/// The list a GC stdin carries, or None when it carries none.
///
/// SPEC.md, "GC: Clean up any stale resources": the runtime must provide
/// `cni.dev/valid-attachments`, "the list of still valid attachments to this network",
/// and the plugin removes what belongs to attachments not in it. An early wording named
/// the key `cni.dev/attachments`, and libcni (#1101) sends the same list under both
/// names. So:
/// - a list under either name is read, and a `null` never shadows a list under the
///   other name (lists under both are joined: whatever either says is valid stays);
/// - `null` alone (Go marshals an empty, nil slice so) is the empty list: none valid;
/// - neither key is no list at all: a request missing what the spec says it must carry
///   judges nothing (every record would otherwise look stale).
fn valid_list(stdin: &Value) -> Option<Value> {
    let named: Vec<&Value> = ["cni.dev/valid-attachments", "cni.dev/attachments"]
        .iter()
        .filter_map(|k| stdin.get(*k))
        .collect();
    if named.is_empty() {
        return None;
    }
    let lists: Vec<&Value> = named.into_iter().filter(|v| !v.is_null()).collect();
    Some(match lists.as_slice() {
        [] => serde_json::json!([]),
        [one] => (*one).clone(),
        // Both arrays: one list of the two. Anything else under either name is handed
        // on as it is, for valid_set to refuse.
        [a, b] => match (a.as_array(), b.as_array()) {
            (Some(a), Some(b)) => Value::Array(a.iter().chain(b).cloned().collect()),
            _ if !a.is_array() => (*a).clone(),
            _ => (*b).clone(),
        },
        _ => unreachable!("two names at most"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gc::replay::{DelResult, PluginOutcome, ReplayError};
    use crate::gc::ConfigSource;

    fn rec(cid: &str, action: Action, plugins: Vec<PluginOutcome>) -> RecordReport {
        RecordReport {
            network: "pods".into(),
            container_id: cid.into(),
            ifname: "eth0".into(),
            reason: crate::sandbox::Reason::NotValid,
            identity: crate::sandbox::Evidence::ValidList,
            action,
            replay_netns: None,
            config_source: Some(ConfigSource::Snapshot),
            plugins,
            attempts: 1,
            last_error: None,
            next_attempt_at: None,
            retired: false,
            devices: Vec::new(),
        }
    }

    #[test]
    fn error_names_each_uncleaned_attachment_once() {
        let failing = PluginOutcome {
            plugin_type: "cl-probe".into(),
            result: DelResult::Failed(ReplayError {
                message: "cl-probe refuses DEL".into(),
                exit_status: Some(1),
            }),
            source: None,
        };
        let ok = PluginOutcome {
            plugin_type: "bridge".into(),
            result: DelResult::Done,
            source: None,
        };
        let report = Report {
            records: vec![
                rec("a", Action::Replayed, vec![ok.clone()]),
                rec("b", Action::Retrying, vec![failing, ok]),
                rec("c", Action::SkipGrace, vec![]),
                rec("d", Action::Busy, vec![]),
            ],
            ..Report::default()
        };
        let e = not_cleaned("pods", &report, None).unwrap();
        assert_eq!(e.code, error::TRY_AGAIN_LATER);
        assert!(
            e.msg.contains("could not clean 2 attachment(s)"),
            "{}",
            e.msg
        );
        assert_eq!(
            e.details,
            "b/eth0: cl-probe: cl-probe refuses DEL (exit 1); d/eth0: busy: another cni-ledger gc holds it"
        );
        let clean = Report {
            records: vec![rec("a", Action::Replayed, vec![])],
            ..Report::default()
        };
        assert!(not_cleaned("pods", &clean, None).is_none());
    }

    #[test]
    fn budget_spent_is_said_and_deferred_records_named() {
        let report = Report {
            records: vec![rec("late", Action::Deferred, vec![])],
            ..Report::default()
        };
        let e = not_cleaned("pods", &report, Some(20)).unwrap();
        assert_eq!(e.code, error::TRY_AGAIN_LATER);
        assert!(
            e.msg.contains("within its 20s budget (gcBudgetSecs)"),
            "{}",
            e.msg
        );
        assert_eq!(
            e.details,
            "late/eth0: not attempted: the GC budget ran out first"
        );
    }

    /// Each plugin gets its own timeout, cut to what is left of the budget; nothing
    /// starts once it is spent.
    #[test]
    fn plugin_timeout_is_capped_by_what_is_left_of_the_budget() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let timeout = s(60);
        assert_eq!(gc::capped_timeout(timeout, None, t0), Some(timeout));
        let deadline = Some(t0 + s(20));
        assert_eq!(gc::capped_timeout(timeout, deadline, t0), Some(s(20)));
        assert_eq!(
            gc::capped_timeout(timeout, deadline, t0 + s(15)),
            Some(s(5))
        );
        assert_eq!(gc::capped_timeout(s(3), deadline, t0 + s(15)), Some(s(3)));
        assert_eq!(gc::capped_timeout(timeout, deadline, t0 + s(20)), None);
        assert_eq!(gc::capped_timeout(timeout, deadline, t0 + s(25)), None);
    }

    #[test]
    fn null_list_is_empty_and_the_older_key_is_read() {
        use serde_json::json;
        let one = json!([{"containerID": "a", "ifname": "eth0"}]);
        let two = json!([{"containerID": "b", "ifname": "eth0"}]);
        let v = "cni.dev/valid-attachments";
        let older = "cni.dev/attachments";
        assert_eq!(valid_list(&json!({v: null})), Some(json!([])));
        assert_eq!(valid_list(&json!({older: null})), Some(json!([])));
        assert_eq!(valid_list(&json!({v: null, older: null})), Some(json!([])));
        assert_eq!(valid_list(&json!({older: one})), Some(one.clone()));
        assert_eq!(valid_list(&json!({v: one, older: []})), Some(one.clone()));
        // A null never shadows the list under the other name, either way round.
        assert_eq!(valid_list(&json!({v: null, older: one})), Some(one.clone()));
        assert_eq!(valid_list(&json!({v: one, older: null})), Some(one.clone()));
        // Two lists: whatever either names is valid.
        let both =
            json!([{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "eth0"}]);
        assert_eq!(valid_list(&json!({v: one, older: two})), Some(both));
        // No list at all is no list, not an empty one.
        assert_eq!(valid_list(&json!({"name": "pods"})), None);
        // Not an array: handed on for valid_set to refuse.
        assert_eq!(
            valid_list(&json!({v: "keep", older: one})),
            Some(json!("keep"))
        );
        assert!(gc::valid_set(json!("keep")).is_err());
    }
}
