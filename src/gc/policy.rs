//! gc's pure policy: whether a record's sandbox is gone (`judge`), whether to replay a
//! stale record now (`decide`), and how long to wait after a failed attempt.

use super::{Action, Options};
use crate::ledger::Record;
use crate::sandbox::{self, Evidence, Liveness, Reason};

pub const BACKOFF_BASE_SECS: i64 = 10;
pub const BACKOFF_MAX_SECS: i64 = 3600;

/// What to do with a stale record right now.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Replay,
    Skip(Action),
}

pub fn decide(rec: &Record, reason: Reason, now: i64, opts: &Options) -> Decision {
    let gc = rec.gc.clone().unwrap_or_default();
    if gc.failed && !opts.retry_failed {
        return Decision::Skip(Action::SkipFailed);
    }
    // A young record may belong to an ADD whose sandbox is still being set up, unless
    // the node rebooted since: then nothing from before can be alive.
    let young = rec.created_unix().is_none_or(|t| now - t < opts.grace_secs);
    if young && reason != Reason::BootChanged {
        return Decision::Skip(Action::SkipGrace);
    }
    let due = gc
        .next_attempt_at
        .as_deref()
        .and_then(crate::time::parse_rfc3339)
        .is_none_or(|t| t <= now);
    if !due && !opts.ignore_backoff && !gc.failed {
        return Decision::Skip(Action::SkipBackoff);
    }
    if opts.dry_run {
        return Decision::Skip(Action::WouldReplay);
    }
    Decision::Replay
}

pub fn backoff_secs(attempts: u32) -> i64 {
    let shift = attempts.saturating_sub(1).min(20);
    (BACKOFF_BASE_SECS << shift).min(BACKOFF_MAX_SECS)
}

/// Rules 1–4 of "when is a sandbox gone" (docs/DESIGN.md) for one record. A record the
/// valid list leaves out keeps `verified` from the namespace check: its replay may be
/// given the namespace only when the cookie proved it is the recorded one.
pub fn judge(rec: &Record, boot: &str, opts: &Options) -> Liveness {
    let l = sandbox::liveness(&rec.boot_id, &rec.netns, rec.netns_id, boot);
    if l.reason.is_some() {
        return l;
    }
    match &opts.valid {
        Some(valid) if !valid.contains(&(rec.container_id.clone(), rec.ifname.clone())) => {
            return Liveness {
                reason: Some(Reason::NotValid),
                evidence: Evidence::ValidList,
                verified: l.verified,
            };
        }
        _ => {}
    }
    let absent =
        opts.cri.as_ref().and_then(|c| c.verdict(rec)) == Some(crate::cri::Verdict::Absent);
    if absent {
        return Liveness {
            reason: Some(Reason::NotInRuntime),
            evidence: Evidence::Runtime,
            verified: l.verified,
        };
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::record::{sample, GcState};
    use std::collections::HashSet;
    use std::path::PathBuf;

    fn opts() -> Options {
        Options::new(PathBuf::from("/nonexistent"))
    }

    #[test]
    fn backoff_doubles_to_an_hour() {
        assert_eq!(backoff_secs(1), 10);
        assert_eq!(backoff_secs(2), 20);
        assert_eq!(backoff_secs(4), 80);
        assert_eq!(backoff_secs(12), 3600);
        assert_eq!(backoff_secs(u32::MAX), 3600);
    }

    #[test]
    fn grace_protects_young_records_unless_the_boot_changed() {
        let rec = sample(); // created 2026-12-02T17:41:33Z
        let created = rec.created_unix().unwrap();
        let o = opts();
        assert_eq!(
            decide(&rec, Reason::NetnsMissing, created + 5, &o),
            Decision::Skip(Action::SkipGrace)
        );
        assert_eq!(
            decide(&rec, Reason::BootChanged, created + 5, &o),
            Decision::Replay
        );
        assert_eq!(
            decide(&rec, Reason::NetnsMissing, created + 61, &o),
            Decision::Replay
        );
        let mut bad = rec.clone();
        bad.created_at = "garbage".into();
        assert_eq!(
            decide(&bad, Reason::NetnsMissing, created + 1000, &o),
            Decision::Skip(Action::SkipGrace)
        );
    }

    #[test]
    fn backoff_failed_and_dry_run() {
        let mut rec = sample();
        let t = rec.created_unix().unwrap() + 1000;
        rec.gc = Some(GcState {
            attempts: 1,
            next_attempt_at: Some(crate::time::rfc3339(t + 5)),
            ..GcState::default()
        });
        let mut o = opts();
        assert_eq!(
            decide(&rec, Reason::NetnsMissing, t, &o),
            Decision::Skip(Action::SkipBackoff)
        );
        o.ignore_backoff = true;
        assert_eq!(decide(&rec, Reason::NetnsMissing, t, &o), Decision::Replay);
        o.dry_run = true;
        assert_eq!(
            decide(&rec, Reason::NetnsMissing, t, &o),
            Decision::Skip(Action::WouldReplay)
        );
        rec.gc.as_mut().unwrap().failed = true;
        assert_eq!(
            decide(&rec, Reason::NetnsMissing, t, &o),
            Decision::Skip(Action::SkipFailed)
        );
        o.retry_failed = true;
        assert_eq!(
            decide(&rec, Reason::NetnsMissing, t, &o),
            Decision::Skip(Action::WouldReplay)
        );
    }

    #[test]
    fn valid_list_marks_unlisted_records() {
        let rec = sample();
        let mut o = opts();
        let boot = rec.boot_id.clone();
        // The sample's netns does not exist: make it point at our own namespace.
        let mut live = rec.clone();
        live.netns = "/proc/self/ns/net".into();
        live.netns_id = None;
        assert_eq!(judge(&live, &boot, &o).reason, None);
        o.valid = Some(HashSet::from([("other".to_string(), "eth0".to_string())]));
        let l = judge(&live, &boot, &o);
        assert_eq!(l.reason, Some(Reason::NotValid));
        assert_eq!(l.evidence, Evidence::ValidList);
        // Not verified (no identity recorded): its replay gets no namespace.
        assert!(!l.verified);
        o.valid = Some(HashSet::from([("abc".to_string(), "eth0".to_string())]));
        assert_eq!(judge(&live, &boot, &o).reason, None);
    }
}
