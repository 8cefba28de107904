//! gc policy: which records are stale, which to replay now, and what became of them.
//!
//! Scan (no locks, one record in memory at a time) → decide → for each candidate:
//! lock the key without waiting (a busy key belongs to an ADD, DEL or another gc),
//! re-read and re-judge under the lock, replay DEL, then remove the record or store
//! the attempt with its backoff.

pub mod libcni_cache;
pub mod replay;

use crate::conflist;
use crate::ledger::{Decoded, Ledger, Quarantine, Record, Wait};
use crate::sandbox::{self, Evidence, Liveness, Reason};
use anyhow::{Context, Result};
use libcni_cache::CachedAttachment;
use replay::{Invocation, PluginOutcome};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

pub const BACKOFF_BASE_SECS: i64 = 10;
pub const BACKOFF_MAX_SECS: i64 = 3600;

#[derive(Debug, Clone)]
pub struct Options {
    pub ledger_dir: PathBuf,
    pub dry_run: bool,
    /// Ignore backoff (`--now`).
    pub ignore_backoff: bool,
    pub network: Option<String>,
    pub grace_secs: i64,
    pub timeout: Duration,
    /// (containerID, ifname) pairs the runtime says are valid, for the networks concerned.
    pub valid: Option<HashSet<(String, String)>>,
    pub cache_dir: PathBuf,
    pub conf_dir: Option<PathBuf>,
    pub cni_path: Option<Vec<PathBuf>>,
    pub max_attempts: u32,
    pub jobs: usize,
    pub retry_failed: bool,
    /// The CRI runtime's sandbox list (`--cri-endpoint`), when it answered.
    pub cri: Option<crate::cri::Judgement>,
    /// Set by a shutting-down caller (the agent on SIGTERM): replays in progress finish,
    /// no new one starts.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Root directory (chroot) for the replayed plugins; None: ours.
    pub plugin_root: Option<PathBuf>,
}

impl Options {
    pub fn new(ledger_dir: PathBuf) -> Options {
        Options {
            ledger_dir,
            dry_run: false,
            ignore_backoff: false,
            network: None,
            grace_secs: 60,
            timeout: Duration::from_secs(60),
            valid: None,
            cache_dir: PathBuf::from("/var/lib/cni"),
            conf_dir: None,
            cni_path: None,
            max_attempts: 24,
            jobs: 4,
            retry_failed: false,
            cri: None,
            stop: None,
            plugin_root: None,
        }
    }
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub live: usize,
    pub stale: usize,
    pub replayed: usize,
    pub retrying: usize,
    pub failed: usize,
    pub would_replay: usize,
    pub skipped: usize,
    pub damaged: usize,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordReport {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub reason: &'static str,
    /// Which identity decided (`sandbox::Evidence`).
    pub identity: &'static str,
    pub action: &'static str,
    /// The CNI_NETNS a replay was given: the recorded path only when its cookie proved it
    /// the recorded namespace, else none.
    pub replay_netns: Option<String>,
    pub config_source: Option<&'static str>,
    pub plugins: Vec<PluginOutcome>,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DamagedReport {
    pub file: String,
    pub reason: String,
    pub quarantined_to: Option<String>,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub dry_run: bool,
    pub summary: Summary,
    pub records: Vec<RecordReport>,
    pub damaged: Vec<DamagedReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cri: Option<CriSummary>,
}

/// Whether the CRI runtime (`--cri-endpoint`) answered, and with how many sandboxes.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CriSummary {
    pub endpoint: String,
    pub answered: bool,
    pub sandboxes: Option<usize>,
}

impl Report {
    /// 0 when nothing stale remains to be cleaned (records in their grace period are not
    /// judged yet), 1 when something is left for later or, in a dry run, would be replayed.
    pub fn exit_code(&self) -> i32 {
        let s = &self.summary;
        if s.retrying + s.failed + s.would_replay > 0 || !self.damaged.is_empty() {
            1
        } else {
            0
        }
    }
}

/// One entry of a runtime's valid list (`cni.dev/valid-attachments`, `--valid-attachments`).
#[derive(serde::Deserialize)]
struct ValidAttachment {
    #[serde(rename = "containerID")]
    container_id: String,
    ifname: String,
}

/// Parses `[{"containerID","ifname"}, ...]` into the set `Options::valid` holds.
pub fn valid_set(list: Value) -> serde_json::Result<HashSet<(String, String)>> {
    let list: Vec<ValidAttachment> = serde_json::from_value(list)?;
    Ok(list
        .into_iter()
        .map(|a| (a.container_id, a.ifname))
        .collect())
}

/// What to do with a stale record right now.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    Replay,
    Skip(&'static str),
}

pub fn decide(rec: &Record, reason: Reason, now: i64, opts: &Options) -> Decision {
    let gc = rec.gc.clone().unwrap_or_default();
    if gc.failed && !opts.retry_failed {
        return Decision::Skip("skip-failed");
    }
    // A young record may belong to an ADD whose sandbox is still being set up, unless
    // the node rebooted since: then nothing from before can be alive.
    let young = rec.created_unix().is_none_or(|t| now - t < opts.grace_secs);
    if young && reason != Reason::BootChanged {
        return Decision::Skip("skip-grace");
    }
    let due = gc
        .next_attempt_at
        .as_deref()
        .and_then(crate::time::parse_rfc3339)
        .is_none_or(|t| t <= now);
    if !due && !opts.ignore_backoff && !gc.failed {
        return Decision::Skip("skip-backoff");
    }
    if opts.dry_run {
        return Decision::Skip("would-replay");
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

pub fn run(opts: &Options) -> Result<Report> {
    let ledger = Ledger::at(&opts.ledger_dir);
    let mut report = Report {
        dry_run: opts.dry_run,
        ..Report::default()
    };
    if !ledger.root().exists() {
        crate::info!(
            "gc: no ledger at {}; nothing to do",
            ledger.root().display()
        );
        return Ok(report);
    }
    ledger.check_trusted()?;
    let boot = sandbox::boot_id().context("reading the boot ID")?;
    let now = crate::time::now();

    #[derive(Default)]
    struct Scan {
        live: usize,
        candidates: Vec<(Box<Record>, Reason, Evidence)>,
        newer: Vec<DamagedReport>,
        damaged: Vec<(String, PathBuf, &'static str, String)>,
    }
    let scans = ledger.scan(
        crate::ledger::scan_jobs(),
        Scan::default,
        |acc, entry| match entry.decoded {
            Decoded::Ok(rec) => {
                if opts.network.as_ref().is_some_and(|n| *n != rec.network) {
                    return;
                }
                let l = judge(&rec, &boot, opts);
                match l.reason {
                    None => acc.live += 1,
                    Some(reason) => acc.candidates.push((rec, reason, l.evidence)),
                }
            }
            Decoded::Newer(format) => acc.newer.push(DamagedReport {
                file: entry.path.display().to_string(),
                reason: format!("newer-format {format}: left for a newer cni-ledger"),
                quarantined_to: None,
            }),
            Decoded::Damaged(reason, detail) => {
                acc.damaged.push((entry.stem, entry.path, reason, detail))
            }
        },
    )?;
    let mut candidates = Vec::new();
    let mut damaged = Vec::new();
    for scan in scans {
        report.summary.live += scan.live;
        candidates.extend(scan.candidates);
        report.damaged.extend(scan.newer);
        damaged.extend(scan.damaged);
    }
    // Replay in a stable order: oldest attachments first, then by key.
    candidates.sort_by(|(a, ..), (b, ..)| {
        (&a.created_at, &a.network, &a.container_id, &a.ifname).cmp(&(
            &b.created_at,
            &b.network,
            &b.container_id,
            &b.ifname,
        ))
    });
    for (stem, path, reason, detail) in damaged {
        report.damaged.push(quarantine_damaged(
            &ledger,
            &stem,
            path,
            reason,
            &detail,
            opts.dry_run,
        ));
    }
    report.summary.damaged = report.damaged.len();
    if !opts.dry_run {
        let n = ledger.remove_orphan_temps();
        if n > 0 {
            crate::info!("gc: removed {n} temporary file(s) left by interrupted writes");
        }
    }
    report.summary.stale = candidates.len();

    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(candidates.len()));
    crate::workers::run(opts.jobs.clamp(1, 64).min(candidates.len().max(1)), || {
        loop {
            if opts
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed))
            {
                break;
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((rec, reason, evidence)) = candidates.get(i) else {
                break;
            };
            let r = handle(&ledger, rec, (*reason, *evidence), &boot, now, opts);
            results
                .lock()
                .expect("no panics hold this lock")
                .push((i, r));
        }
    });
    let mut results = results.into_inner().expect("no panics hold this lock");
    results.sort_by_key(|(i, _)| *i);
    let mut removed_any = false;
    // Snapshots the removed records referred to: the only ones a per-network gc may sweep.
    let mut released = HashSet::new();
    for (i, r) in results {
        match r.action {
            "replayed" => {
                report.summary.replayed += 1;
                removed_any = true;
                released.extend(candidates[i].0.snapshot.clone());
            }
            "retrying" | "skip-backoff" | "busy" => report.summary.retrying += 1,
            "failed" | "skip-failed" => report.summary.failed += 1,
            "would-replay" => report.summary.would_replay += 1,
            "live" => {
                report.summary.live += 1;
                report.summary.stale -= 1;
            }
            _ => report.summary.skipped += 1,
        }
        report.records.push(r);
    }
    let s = &report.summary;
    crate::info!(
        "gc: done: {} live, {} stale ({} replayed, {} retrying, {} failed, {} would replay, {} skipped), {} damaged",
        s.live, s.stale, s.replayed, s.retrying, s.failed, s.would_replay, s.skipped, s.damaged
    );
    if removed_any {
        // Per network (the GC verb, `--network`), other networks' snapshots are not ours
        // to judge, not even unreferenced ones: only those our removed records used.
        let only = opts.network.as_ref().map(|_| &released);
        match ledger.sweep_snapshots(only) {
            Ok(n) if n > 0 => crate::info!("gc: removed {n} unreferenced snapshot(s)"),
            Ok(_) => {}
            Err(e) => crate::warn!("gc: snapshot sweep failed: {e:#}"),
        }
    }
    Ok(report)
}

fn quarantine_damaged(
    ledger: &Ledger,
    stem: &str,
    path: PathBuf,
    reason: &str,
    detail: &str,
    dry_run: bool,
) -> DamagedReport {
    let mut out = DamagedReport {
        file: path.display().to_string(),
        reason: format!("{reason}: {detail}"),
        quarantined_to: None,
    };
    if dry_run {
        crate::warn!(
            "gc: damaged record {} ({reason}); dry run, left in place",
            out.file
        );
        return out;
    }
    match ledger.quarantine_if_still_damaged(stem, &path) {
        Ok(Quarantine::Moved(to)) => out.quarantined_to = Some(to.display().to_string()),
        Ok(Quarantine::Replaced) => out.reason.push_str(" (since replaced by a good record)"),
        Ok(Quarantine::Busy) => crate::warn!(
            "gc: damaged record {} is locked; quarantine next run",
            out.file
        ),
        Err(e) => crate::error!("gc: cannot quarantine {}: {e:#}", out.file),
    }
    if let Some(to) = &out.quarantined_to {
        crate::warn!(
            "gc: damaged record {} ({reason}: {detail}) quarantined to {to}",
            out.file
        );
    }
    out
}

/// A stale record's reason and the identity that decided it.
type Judged = (Reason, Evidence);

fn report_for(rec: &Record, (reason, evidence): Judged, action: &'static str) -> RecordReport {
    let gc = rec.gc.clone().unwrap_or_default();
    RecordReport {
        network: rec.network.clone(),
        container_id: rec.container_id.clone(),
        ifname: rec.ifname.clone(),
        reason: reason.as_str(),
        identity: evidence.as_str(),
        action,
        replay_netns: None,
        config_source: None,
        plugins: Vec::new(),
        attempts: gc.attempts,
        last_error: gc.last_error,
        next_attempt_at: gc.next_attempt_at,
    }
}

fn handle(
    ledger: &Ledger,
    seen: &Record,
    judged: Judged,
    boot: &str,
    now: i64,
    opts: &Options,
) -> RecordReport {
    let key = seen.key();
    if let Decision::Skip(action) = decide(seen, judged.0, now, opts) {
        crate::info!("gc: {key}: stale ({}), {action}", judged.0.as_str());
        return report_for(seen, judged, action);
    }
    let stem = key.stem();
    let lock = match ledger.lock(&stem, Wait::No) {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            crate::info!("gc: {key}: busy (an ADD, DEL or another gc holds it); next run");
            return report_for(seen, judged, "busy");
        }
        Err(e) => {
            crate::error!("gc: {key}: {e:#}");
            return report_for(seen, judged, "busy");
        }
    };
    // Judge again under the lock: what we scanned may have been replaced or removed.
    let rec = match ledger.read(&stem) {
        Ok(Some(Decoded::Ok(rec))) if rec.add_id == seen.add_id => rec,
        Ok(None) => return report_for(seen, judged, "gone"),
        _ => {
            crate::info!("gc: {key}: changed since the scan; left for the next run");
            return report_for(seen, judged, "changed");
        }
    };
    let now_judged = judge(&rec, boot, opts);
    let Some(reason) = now_judged.reason else {
        crate::info!("gc: {key}: live on re-check; not touched");
        return report_for(&rec, judged, "live");
    };
    let judged = (reason, now_judged.evidence);
    // The namespace goes to the plugins only when its cookie, checked just now under the
    // lock, proved it the recorded one; otherwise none, so no DEL can reach another pod.
    let netns = now_judged.verified.then(|| rec.netns.clone());
    crate::info!(
        "gc: {key}: stale ({}, by {}), replaying DEL {}",
        reason.as_str(),
        judged.1.as_str(),
        match &netns {
            Some(p) => format!("in {p}"),
            None => "without a namespace".into(),
        }
    );

    let cached = CachedAttachment::load(&opts.cache_dir, &key);
    let (config, source) = match resolve_config(ledger, &rec, cached.as_ref(), opts) {
        Ok(found) => found,
        Err(e) => {
            let outcome = PluginOutcome {
                plugin_type: String::new(),
                ok: false,
                error: Some(format!("{e:#}")),
                exit_status: None,
            };
            return record_failure(ledger, &rec, judged, None, vec![outcome], now, opts);
        }
    };
    let mut caps = rec.runtime_config.clone();
    if let Some(c) = &cached {
        for (k, v) in &c.capability_args {
            caps.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let cni_path: Vec<PathBuf> = match &opts.cni_path {
        Some(p) => p.clone(),
        None => std::env::split_paths(&rec.cni_path).collect(),
    };
    let inv = Invocation {
        network: &rec.network,
        container_id: &rec.container_id,
        ifname: &rec.ifname,
        netns: netns.as_deref(),
        cni_args: &rec.cni_args,
        cni_path: &cni_path,
        capability_args: &caps,
        prev_result: cached.as_ref().and_then(|c| c.result.as_ref()),
        timeout: opts.timeout,
        root: opts.plugin_root.as_deref(),
    };
    let outcomes = replay::replay_del(&config, &rec.ledger_type, &inv);
    // The ledger's own DEL, skipped in the chain, runs last: its device return too.
    if let (Some(ns), Some(spec)) = (
        &netns,
        crate::devices::spec_in_chain(&config, &rec.ledger_type),
    ) {
        crate::devices::at_del(ledger, &key, ns, &spec, "gc:");
    }
    for o in &outcomes {
        match &o.error {
            None => crate::info!("gc: {key}: {} DEL ok", o.plugin_type),
            Some(_) => crate::warn!("gc: {key}: DEL failed: {}", failure_text(o)),
        }
    }
    if outcomes.iter().all(|o| o.ok) {
        if let Err(e) = ledger.remove(&stem) {
            crate::error!("gc: {key}: replayed but cannot remove the record: {e:#}");
            return record_failure(ledger, &rec, judged, Some(source), outcomes, now, opts);
        }
        lock.release_and_remove();
        if let Some(c) = &cached {
            c.remove();
        }
        crate::info!("gc: {key}: replayed, record removed");
        let mut r = report_for(&rec, judged, "replayed");
        r.config_source = Some(source);
        r.plugins = outcomes;
        r.replay_netns = netns;
        return r;
    }
    let mut r = record_failure(ledger, &rec, judged, Some(source), outcomes, now, opts);
    r.replay_netns = netns;
    r
}

fn record_failure(
    ledger: &Ledger,
    rec: &Record,
    judged: Judged,
    source: Option<&'static str>,
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
            .filter(|o| !o.ok)
            .map(failure_text)
            .collect::<Vec<_>>()
            .join("; "),
    );
    gc.last_attempt_at = Some(crate::time::rfc3339(now));
    gc.next_attempt_at = Some(crate::time::rfc3339(now + backoff_secs(gc.attempts)));
    gc.failed = gc.attempts >= opts.max_attempts;
    let action = if gc.failed { "failed" } else { "retrying" };
    let mut updated = rec.clone();
    updated.gc = Some(gc);
    if let Err(e) = ledger.write(&updated) {
        crate::error!("gc: {key}: cannot store the attempt: {e:#}");
    }
    if action == "failed" {
        crate::error!(
            "gc: {key}: giving up after {} attempts; left for an operator",
            opts.max_attempts
        );
    }
    let mut r = report_for(&updated, judged, action);
    r.config_source = source;
    r.plugins = outcomes;
    r
}

/// One failed plugin as an operator reads it: `type: message (exit N)`; a plugin that
/// never ran or was killed has no exit status to show.
pub fn failure_text(o: &PluginOutcome) -> String {
    let msg = o.error.as_deref().unwrap_or("failed");
    let who = if o.plugin_type.is_empty() {
        String::new()
    } else {
        format!("{}: ", o.plugin_type)
    };
    match o.exit_status {
        Some(s) => format!("{who}{msg} (exit {s})"),
        None => format!("{who}{msg}"),
    }
}

/// The chain to replay: the ADD-time snapshot, else libcni's cached config, else
/// today's conflist of that name.
fn resolve_config(
    ledger: &Ledger,
    rec: &Record,
    cached: Option<&CachedAttachment>,
    opts: &Options,
) -> Result<(Value, &'static str)> {
    if let Some(hash) = &rec.snapshot {
        match ledger.get_snapshot(hash)? {
            Some(Ok(bytes)) => {
                if let Some(list) = conflist::parse(&bytes) {
                    return Ok((list, "snapshot"));
                }
            }
            Some(Err(reason)) => {
                let path = ledger.snapshot_path(hash);
                match ledger.quarantine(&path) {
                    Ok(to) => crate::warn!(
                        "gc: snapshot {hash} is damaged ({reason}); quarantined to {}",
                        to.display()
                    ),
                    Err(e) => crate::warn!("gc: snapshot {hash} is damaged ({reason}): {e:#}"),
                }
            }
            None => crate::warn!("gc: {}: snapshot {hash} is missing", rec.key()),
        }
    }
    if let Some(list) = cached.and_then(|c| c.config.as_ref()) {
        return Ok((list.clone(), "cache"));
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
        return Ok((found.list, "conflist"));
    }
    anyhow::bail!(
        "no configuration for network {}: no snapshot, no libcni cache, nothing in {}",
        rec.network,
        dir.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::record::{sample, GcState};

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
            Decision::Skip("skip-grace")
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
            Decision::Skip("skip-grace")
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
            Decision::Skip("skip-backoff")
        );
        o.ignore_backoff = true;
        assert_eq!(decide(&rec, Reason::NetnsMissing, t, &o), Decision::Replay);
        o.dry_run = true;
        assert_eq!(
            decide(&rec, Reason::NetnsMissing, t, &o),
            Decision::Skip("would-replay")
        );
        rec.gc.as_mut().unwrap().failed = true;
        assert_eq!(
            decide(&rec, Reason::NetnsMissing, t, &o),
            Decision::Skip("skip-failed")
        );
        o.retry_failed = true;
        assert_eq!(
            decide(&rec, Reason::NetnsMissing, t, &o),
            Decision::Skip("would-replay")
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
