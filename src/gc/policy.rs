//! gc's pure policy: whether a record's sandbox is gone (`judge`), whether to replay a
//! stale record now (`decide`), and how long to wait after a failed attempt.

use super::{Action, Options};
use crate::cri::Verdict;
use crate::ledger::Record;
use crate::sandbox::holders::{Holder, NodeIndex};
use crate::sandbox::{self, Evidence, Liveness, Reason};
use std::collections::BTreeMap;

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
    // the node rebooted since: then nothing from before can be alive. Any other reason
    // means the record is of this boot, so its age is read on the boot clock.
    let young = rec
        .age_secs(&rec.boot_id, now)
        .is_none_or(|age| age < opts.grace_secs);
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
/// given the namespace only when the cookie proved it is the recorded one. `node` is the
/// run's one index of who on the node holds which namespace (built only if needed).
pub fn judge(rec: &Record, boot: &str, opts: &Options, node: &NodeIndex) -> Liveness {
    assess(rec, boot, opts, node).0
}

/// `judge`, with the runtime's verdict on a record whose namespace check said live (None
/// when no runtime judges it, or it is too young for a sandbox list to know it), so that
/// the scan can tell whether the runtime's answer can be right at all (an absence it may
/// not act on still counts there); and the holder elsewhere on the node that kept a
/// record live whose path showed no namespace.
pub(super) fn assess(
    rec: &Record,
    boot: &str,
    opts: &Options,
    node: &NodeIndex,
) -> (Liveness, Option<Verdict>, Option<Holder>) {
    let (l, holder) = sandbox::liveness_on_node(&rec.boot_id, &rec.netns, rec.netns_id, boot, node);
    if l.reason.is_some() {
        return (l, None, None);
    }
    match &opts.valid {
        Some(valid) if !valid.contains(&(rec.container_id.clone(), rec.ifname.clone())) => {
            let l = Liveness {
                reason: Some(Reason::NotValid),
                evidence: Evidence::ValidList,
                verified: l.verified,
            };
            return (l, None, holder);
        }
        _ => {}
    }
    // A sandbox is listed only once RunPodSandbox returned: until the record is older
    // than any ADD can take, its absence from the list says nothing.
    let verdict = opts.cri.as_ref().and_then(|c| c.verdict(rec)).filter(|_| {
        rec.age_secs(boot, crate::time::now())
            .is_some_and(|age| age >= opts.cri_min_age_secs)
    });
    // Only what the namespace check could not show either way; a namespace shown live or
    // held on the node is never freed on a runtime's silence (DESIGN §5).
    if verdict == Some(Verdict::Absent) && crate::cri::absence_may_judge(&l) {
        let l = Liveness {
            reason: Some(Reason::NotInRuntime),
            evidence: Evidence::Runtime,
            verified: l.verified,
        };
        return (l, verdict, holder);
    }
    (l, verdict, holder)
}

/// Per network, the records whose namespace is verified live and that the runtime
/// judged: how many, and how many of them it does not list.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RuntimeTally {
    pub verified: usize,
    pub absent: usize,
}

/// Why a runtime's answer cannot be right, when it cannot: it does not list most of a
/// network's sandboxes whose namespaces are verifiably there (a stray idle runtime, one
/// just restarted with its state gone, another runtime's pods). Then its list judges
/// nothing this run: a runtime's silence is not proof.
pub fn runtime_refusal(tallies: &BTreeMap<String, RuntimeTally>) -> Option<String> {
    let odd: Vec<String> = tallies
        .iter()
        .filter(|(_, t)| t.verified > 0 && t.absent * 2 > t.verified)
        .map(|(net, t)| {
            format!(
                "{net}: {} of {} attachments with verified live namespaces are not in its list",
                t.absent, t.verified
            )
        })
        .collect();
    (!odd.is_empty()).then(|| {
        format!(
            "the CRI runtime's sandbox list cannot be right ({}); nothing is judged by it this run",
            odd.join("; ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::record::{sample, GcState};
    use crate::sandbox::NsId;
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
    fn a_runtime_that_misses_most_verified_sandboxes_judges_nothing() {
        let t = |verified, absent| RuntimeTally { verified, absent };
        let tallies = |v: Vec<(&str, RuntimeTally)>| {
            v.into_iter()
                .map(|(n, t)| (n.to_string(), t))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(runtime_refusal(&tallies(vec![])), None);
        assert_eq!(runtime_refusal(&tallies(vec![("pods", t(3, 1))])), None);
        assert_eq!(runtime_refusal(&tallies(vec![("pods", t(2, 1))])), None);
        // Lists none of them: not the runtime that made them.
        let why = runtime_refusal(&tallies(vec![("pods", t(2, 2))])).unwrap();
        assert!(why.contains("pods: 2 of 2"), "{why}");
        // Most of one network, even when another network looks fine.
        assert!(runtime_refusal(&tallies(vec![("a", t(5, 0)), ("b", t(3, 2))])).is_some());
        // Nothing verified: nothing to check the runtime against.
        assert_eq!(runtime_refusal(&tallies(vec![("pods", t(0, 0))])), None);
    }

    /// A runtime whose list has no sandboxes of `net1`, fetched well after the sample.
    fn empty_list(rec: &Record) -> crate::cri::Judgement {
        crate::cri::Judgement {
            networks: HashSet::from(["net1".to_string()]),
            sandboxes: std::collections::HashMap::new(),
            fetched_at: rec.created_unix().unwrap() + 100,
            adopted: crate::cri::AdoptedChains::Any,
        }
    }

    #[test]
    fn the_runtime_judges_only_records_older_than_the_min_age() {
        let mut rec = sample();
        // No namespace path (an adopted attachment): nothing but the list can tell.
        rec.netns = String::new();
        rec.netns_id = None;
        let boot = rec.boot_id.clone();
        let mut o = opts();
        o.cri = Some(empty_list(&rec));
        // The sample was made in the past on the wall clock: old enough for any min age
        // up to its real age.
        o.cri_min_age_secs = 60;
        assert_eq!(
            judge(&rec, &boot, &o, &NodeIndex::new()).reason,
            Some(Reason::NotInRuntime)
        );
        // Made now by the boot clock: however far the wall clock says it is, too young.
        rec.created_boot_secs = crate::time::since_boot();
        assert_eq!(judge(&rec, &boot, &o, &NodeIndex::new()).reason, None);
        o.cri_min_age_secs = 0;
        assert_eq!(
            judge(&rec, &boot, &o, &NodeIndex::new()).reason,
            Some(Reason::NotInRuntime)
        );
    }

    /// Issue 37: a container on the runtime's network that CRI does not list (`ctr run
    /// --cni`) must keep its network while its namespace is there, whatever the list says.
    #[test]
    fn the_runtime_never_frees_a_namespace_shown_live_or_held() {
        let own = match sandbox::probe("/proc/self/ns/net") {
            sandbox::Probe::Namespace(id) => id,
            other => panic!("our own namespace: {other:?}"),
        };
        let mut rec = sample();
        let boot = rec.boot_id.clone();
        let mut o = opts();
        o.cri = Some(empty_list(&rec));
        o.cri_min_age_secs = 0;
        let judged = |rec: &Record, o: &Options| {
            let (l, verdict, _) = assess(rec, &boot, o, &NodeIndex::new());
            (l.reason, l.evidence, verdict)
        };
        let absent = Some(Verdict::Absent);
        // At its path, verified by its cookie (what a ctr container's record shows).
        rec.netns = "/proc/self/ns/net".into();
        rec.netns_id = Some(own);
        let cookie = if own.cookie.is_some() {
            Evidence::Cookie
        } else {
            Evidence::DevIno
        };
        assert_eq!(judged(&rec, &o), (None, cookie, absent));
        // At its path by device/inode, nothing stronger recorded.
        rec.netns_id = Some(NsId {
            cookie: None,
            pid_start: None,
            ..own
        });
        assert_eq!(judged(&rec, &o), (None, Evidence::DevIno, absent));
        rec.netns_id = None;
        assert_eq!(judged(&rec, &o), (None, Evidence::DevIno, absent));
        // Gone from its path, but held elsewhere on the node (here: by this process).
        let dir = tempfile::tempdir().unwrap();
        rec.netns = dir.path().join("gone").display().to_string();
        rec.netns_id = Some(own);
        assert_eq!(judged(&rec, &o), (None, Evidence::Held, absent));
        // Its directory unseen from here: it may be there all the same, so live.
        rec.netns = "/nonexistent-dir/ns".into();
        assert_eq!(judged(&rec, &o), (None, Evidence::Unseen, absent));
        // No path at all (adopted from a cache entry without one): only the list can tell.
        rec.netns = String::new();
        rec.netns_id = None;
        assert_eq!(
            judged(&rec, &o),
            (Some(Reason::NotInRuntime), Evidence::Runtime, absent)
        );
        rec.netns_id = Some(own);
        // The CNI GC verb's valid list is an explicit statement: it still decides.
        rec.netns = "/proc/self/ns/net".into();
        o.valid = Some(HashSet::new());
        assert_eq!(
            judge(&rec, &boot, &o, &NodeIndex::new()).reason,
            Some(Reason::NotValid)
        );
    }

    #[test]
    fn a_wall_clock_step_does_not_age_a_record_of_this_boot() {
        let mut rec = sample();
        rec.created_boot_secs = crate::time::since_boot();
        let o = opts();
        // The wall clock says a day has passed; the boot clock says no time has.
        let created = rec.created_unix().unwrap();
        assert_eq!(
            decide(&rec, Reason::NetnsMissing, created + 86_400, &o),
            Decision::Skip(Action::SkipGrace)
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
        assert_eq!(judge(&live, &boot, &o, &NodeIndex::new()).reason, None);
        o.valid = Some(HashSet::from([("other".to_string(), "eth0".to_string())]));
        let l = judge(&live, &boot, &o, &NodeIndex::new());
        assert_eq!(l.reason, Some(Reason::NotValid));
        assert_eq!(l.evidence, Evidence::ValidList);
        // Not verified (no identity recorded): its replay gets no namespace.
        assert!(!l.verified);
        o.valid = Some(HashSet::from([("abc".to_string(), "eth0".to_string())]));
        assert_eq!(judge(&live, &boot, &o, &NodeIndex::new()).reason, None);
    }
}
