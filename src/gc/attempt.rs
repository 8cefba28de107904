//! One attempt at one stale record: decide, lock the key without waiting (a busy key
//! belongs to an ADD, DEL or another gc), re-read and re-judge under the lock, replay
//! DEL, then remove the record or store the attempt with its backoff.

use super::replay::{self, DelResult, Invocation, PluginOutcome, ReplayError};
use super::{
    backoff_secs, decide, failure_text, judge, Action, ConfigSource, Decision, Options,
    RecordReport, Staleness,
};
use crate::conflist;
use crate::ledger::{Decoded, Key, KeyLock, Ledger, Record, Snapshot, Wait};
use crate::libcni::cache::CachedAttachment;
use crate::sandbox::holders::NodeIndex;
use anyhow::Result;
use serde_json::{Map, Value};
use std::path::PathBuf;

/// Where a candidate lives: a record, or a retired record (`retired/`, docs/CHAIN.md).
#[derive(Clone, Copy)]
pub(super) struct At<'a> {
    pub(super) ledger: &'a Ledger,
    pub(super) retired: bool,
}

impl At<'_> {
    fn read(&self, stem: &str) -> Result<Option<Decoded>> {
        if self.retired {
            // A newer ADD of the key has a record: this one is no longer to be replayed.
            if self.ledger.has_record_file(stem) {
                return Ok(None);
            }
            self.ledger.read_retired(stem)
        } else {
            self.ledger.read(stem)
        }
    }

    fn write(&self, rec: &Record) -> Result<()> {
        if self.retired {
            self.ledger.write_retired(rec)
        } else {
            self.ledger.write(rec)
        }
    }
}

/// What became of `seen`, a record (or, `at.retired`, a retired record) the scan judged
/// stale. `node` is the run's index of the node's namespace holders, shared with the scan.
pub(super) fn attempt(
    at: At<'_>,
    seen: &Record,
    judged: Staleness,
    boot: &str,
    now: i64,
    opts: &Options,
    node: &NodeIndex,
) -> RecordReport {
    let mut r = attempt_at(at, seen, judged, boot, now, opts, node);
    r.retired = at.retired;
    r
}

fn attempt_at(
    at: At<'_>,
    seen: &Record,
    judged: Staleness,
    boot: &str,
    now: i64,
    opts: &Options,
    node: &NodeIndex,
) -> RecordReport {
    let key = seen.key();
    if let Decision::Skip(action) = decide(seen, judged.0, now, opts) {
        crate::info!("gc: {key}: stale ({}), {action}", judged.0.as_str());
        return RecordReport::of(seen, judged, action);
    }
    let Some(lock) = try_lock(at.ledger, &key) else {
        return RecordReport::of(seen, judged, Action::Busy);
    };
    match recheck(at, seen, boot, opts, node) {
        Recheck::Stale {
            rec,
            judged,
            verified,
        } => {
            // The namespace goes to the plugins only when its cookie, checked just now
            // under the lock, proved it the recorded one; otherwise none, so no DEL can
            // reach another pod.
            let netns = verified.then(|| rec.netns.clone());
            replay(at, lock, &rec, judged, netns, boot, now, opts)
        }
        Recheck::Live(rec) => RecordReport::of(&rec, judged, Action::Live),
        Recheck::Gone => RecordReport::of(seen, judged, Action::Gone),
        Recheck::Changed => RecordReport::of(seen, judged, Action::Changed),
    }
}

fn try_lock(ledger: &Ledger, key: &Key) -> Option<KeyLock> {
    match ledger.lock(&key.stem(), Wait::No) {
        Ok(Some(lock)) => Some(lock),
        Ok(None) => {
            crate::info!("gc: {key}: busy (an ADD, DEL or another gc holds it); next run");
            None
        }
        Err(e) => {
            crate::error!("gc: {key}: {e:#}");
            None
        }
    }
}

/// A scanned record as it is under its lock.
enum Recheck {
    /// Still the same record, still stale.
    Stale {
        rec: Box<Record>,
        /// Why, and which identity decided.
        judged: Staleness,
        /// The recorded namespace was proved the recorded one just now (its cookie).
        verified: bool,
    },
    Live(Box<Record>),
    Gone,
    /// Replaced by another ADD's record, or unreadable now.
    Changed,
}

/// Judges again under the lock: what we scanned may have been replaced or removed.
fn recheck(at: At<'_>, seen: &Record, boot: &str, opts: &Options, node: &NodeIndex) -> Recheck {
    let key = seen.key();
    let rec = match at.read(&key.stem()) {
        Ok(Some(Decoded::Ok(rec))) if rec.add_id == seen.add_id => rec,
        Ok(None) => return Recheck::Gone,
        _ => {
            crate::info!("gc: {key}: changed since the scan; left for the next run");
            return Recheck::Changed;
        }
    };
    let l = judge(&rec, boot, opts, node);
    match l.reason {
        Some(reason) => Recheck::Stale {
            rec,
            judged: (reason, l.evidence),
            verified: l.verified,
        },
        None => {
            crate::info!("gc: {key}: live on re-check; not touched");
            Recheck::Live(rec)
        }
    }
}

/// Replays DEL for `rec` while `lock` holds its key, then removes the record and
/// libcni's cache entry before releasing it, or stores the failed attempt.
#[allow(clippy::too_many_arguments)]
fn replay(
    at: At<'_>,
    lock: KeyLock,
    rec: &Record,
    judged: Staleness,
    netns: Option<String>,
    boot: &str,
    now: i64,
    opts: &Options,
) -> RecordReport {
    let ledger = at.ledger;
    let key = rec.key();
    log_replaying(&key, judged, netns.as_deref());
    let cached = CachedAttachment::load(&opts.cache_dir, &key);
    let (config, source) = match resolve_config(ledger, rec, cached.as_ref(), opts) {
        Ok(found) => found,
        Err(e) => {
            let outcome = PluginOutcome {
                plugin_type: String::new(),
                result: DelResult::Failed(ReplayError::without_exit(format!("{e:#}"))),
                source: None,
            };
            return record_failure(at, rec, judged, None, vec![outcome], now, opts);
        }
    };
    let (outcomes, repaired) = del_chain(
        ledger,
        rec,
        &config,
        cached.as_ref(),
        netns.as_deref(),
        boot,
        opts,
    );
    if !outcomes.iter().all(PluginOutcome::ok) {
        let mut r = record_failure(at, rec, judged, Some(source), outcomes, now, opts);
        r.replay_netns = netns;
        return r;
    }
    // A record whose ADD may still complete is retired, not removed: the DEL just
    // replayed may have come before that ADD allocated, and its tail restores the
    // record if it succeeds (docs/CHAIN.md). A retired one goes: its ADD cannot.
    let stem = key.stem();
    let (gone, what) = if at.retired {
        (
            ledger.drop_retired(&stem).map(|_| ()),
            "retired record dropped",
        )
    } else if crate::chain::may_complete(rec, boot, now, opts.chain_left_after_secs) {
        (
            ledger.retire(&lock, &stem),
            "record retired: its ADD has not completed",
        )
    } else {
        (ledger.remove(&stem).map(|_| ()), "record removed")
    };
    if let Err(e) = gone {
        crate::error!("gc: {key}: replayed but cannot remove the record: {e:#}");
        let mut r = record_failure(at, rec, judged, Some(source), outcomes, now, opts);
        r.replay_netns = netns;
        return r;
    }
    // libcni's entry goes while the key is still ours: once it is released, an adopt
    // that finds no record must not find the cache entry of what was just released.
    // Whatever is at its path goes, as libcni's DEL does: an unusable file too.
    crate::libcni::cache::remove_entry(&opts.cache_dir, &key);
    lock.release_and_remove();
    crate::faults::crash_point("gc.key-released");
    crate::info!("gc: {key}: replayed, {what}");
    let mut r = RecordReport::of(rec, judged, Action::Replayed);
    r.devices = repaired;
    r.config_source = Some(source);
    r.plugins = outcomes;
    r.replay_netns = netns;
    r
}

fn log_replaying(key: &Key, (reason, evidence): Staleness, netns: Option<&str>) {
    crate::info!(
        "gc: {key}: stale ({}, by {}), replaying DEL {}",
        reason.as_str(),
        evidence.as_str(),
        match netns {
            Some(p) => format!("in {p}"),
            None => "without a namespace".into(),
        }
    );
}

/// Runs every plugin's DEL in `config` but ours, then our own (device return) last, as
/// the chain would have.
fn del_chain(
    ledger: &Ledger,
    rec: &Record,
    config: &Value,
    cached: Option<&CachedAttachment>,
    netns: Option<&str>,
    boot: &str,
    opts: &Options,
) -> (Vec<PluginOutcome>, Vec<crate::devices::state::Repaired>) {
    let key = rec.key();
    let caps = capability_args(rec, cached);
    let cni_path: Vec<PathBuf> = match &opts.cni_path {
        Some(p) => p.clone(),
        None => std::env::split_paths(&rec.cni_path).collect(),
    };
    let inv = Invocation {
        network: &rec.network,
        container_id: &rec.container_id,
        ifname: &rec.ifname,
        netns,
        cni_args: &rec.cni_args,
        cni_path: &cni_path,
        capability_args: &caps,
        // libcni's cached result, as libcni's own DEL would pass; when its cache is gone
        // (wiped at boot on Bottlerocket and the EKS AMI) the tail's copy of the same
        // result, so a plugin that needs prevResult on DEL can still release.
        prev_result: cached
            .and_then(|c| c.result.as_ref())
            .or_else(|| rec.chain.as_ref().and_then(|c| c.result.as_ref())),
        timeout: opts.timeout,
        deadline: opts.deadline,
        courtesy: opts.courtesy.as_deref(),
    };
    let outcomes = replay::replay_del(config, &rec.ledger_type, &inv);
    // The ledger's own DEL, skipped in the chain, runs last: its device return too.
    let spec = crate::devices::spec_in_chain(config, &rec.ledger_type);
    let mut repaired = Vec::new();
    match (netns, &spec) {
        (Some(ns), Some(spec)) => crate::devices::at_del(ledger, &key, ns, spec, "gc:"),
        // The namespace died with no DEL in this boot: the kernel returned its NICs down
        // under their pod names. After a reboot they booted on the host: nothing to do.
        (None, Some(_)) if rec.boot_id == boot && outcomes.iter().all(PluginOutcome::ok) => {
            repaired = crate::devices::repair_after_the_fact(ledger, rec, "gc:");
        }
        _ => {}
    }
    // The host's device state kept at ADD is of no more use once DEL has run.
    if spec.is_some() {
        crate::devices::state::forget(ledger, &key);
    }
    for o in &outcomes {
        match &o.result {
            DelResult::Done => crate::info!("gc: {key}: {} DEL ok", o.plugin_type),
            DelResult::Failed(_) => crate::warn!("gc: {key}: DEL failed: {}", failure_text(o)),
        }
    }
    (outcomes, repaired)
}

/// The recorded capability args, completed by those libcni cached and we did not record.
fn capability_args(rec: &Record, cached: Option<&CachedAttachment>) -> Map<String, Value> {
    let mut caps = rec.runtime_config.clone();
    if let Some(c) = cached {
        for (k, v) in &c.capability_args {
            caps.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    caps
}

/// Stores a failed attempt in the record: one more try, its error, and when the next is
/// due; after `max_attempts` the record is marked failed, for an operator.
fn record_failure(
    at: At<'_>,
    rec: &Record,
    judged: Staleness,
    source: Option<ConfigSource>,
    outcomes: Vec<PluginOutcome>,
    now: i64,
    opts: &Options,
) -> RecordReport {
    let key = rec.key();
    let mut gc = rec.gc.clone().unwrap_or_default();
    gc.attempts += 1;
    gc.last_error = Some(
        outcomes
            .iter()
            .filter(|o| !o.ok())
            .map(failure_text)
            .collect::<Vec<_>>()
            .join("; "),
    );
    gc.last_attempt_at = Some(crate::time::rfc3339(now));
    gc.next_attempt_at = Some(crate::time::rfc3339(now + backoff_secs(gc.attempts)));
    gc.failed = gc.attempts >= opts.max_attempts;
    let action = if gc.failed {
        Action::Failed
    } else {
        Action::Retrying
    };
    let mut updated = rec.clone();
    updated.gc = Some(gc);
    if let Err(e) = at.write(&updated) {
        crate::error!("gc: {key}: cannot store the attempt: {e:#}");
    }
    if action == Action::Failed {
        crate::error!(
            "gc: {key}: giving up after {} attempts; left for an operator",
            opts.max_attempts
        );
    }
    let mut r = RecordReport::of(&updated, judged, action);
    r.config_source = source;
    r.plugins = outcomes;
    r
}

/// The chain to replay: the ADD-time snapshot, else libcni's cached config, else
/// today's conflist of that name.
fn resolve_config(
    ledger: &Ledger,
    rec: &Record,
    cached: Option<&CachedAttachment>,
    opts: &Options,
) -> Result<(Value, ConfigSource)> {
    if let Some(list) = snapshot_config(ledger, rec)? {
        return Ok((list, ConfigSource::Snapshot));
    }
    if let Some(list) = cached.and_then(|c| c.config.as_ref()) {
        return Ok((list.clone(), ConfigSource::Cache));
    }
    let dir = opts
        .conf_dir
        .clone()
        .or_else(|| {
            rec.conf_file
                .as_ref()
                .and_then(|f| PathBuf::from(f).parent().map(PathBuf::from))
        })
        .unwrap_or_else(|| PathBuf::from(crate::cni::config::DEFAULT_CONF_DIR));
    if let Some(found) = conflist::find(&dir, &rec.network)? {
        return Ok((found.list, ConfigSource::Conflist));
    }
    anyhow::bail!(
        "no configuration for network {}: no snapshot, no libcni cache, nothing in {}",
        rec.network,
        dir.display()
    )
}

/// The record's ADD-time snapshot as a conflist; None when it has none, or it is
/// missing, damaged (then quarantined) or not a conflist.
fn snapshot_config(ledger: &Ledger, rec: &Record) -> Result<Option<Value>> {
    let Some(hash) = &rec.snapshot else {
        return Ok(None);
    };
    match ledger.get_snapshot(hash)? {
        Snapshot::Ok(bytes) => return Ok(conflist::parse(&bytes)),
        Snapshot::Damaged(reason) => ledger.quarantine_snapshot(hash, reason, "gc:"),
        Snapshot::Missing => crate::warn!("gc: {}: snapshot {hash} is missing", rec.key()),
    }
    Ok(None)
}
