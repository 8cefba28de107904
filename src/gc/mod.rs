//! The gc engine: which records are stale, which to replay now, and what became of them.
//!
//! `run` scans the ledger (no locks, one record in memory at a time), then hands each
//! stale record to `attempt` (one attempt at one record, under its lock) on a few
//! worker threads, and reports. The policy is in `policy`, the report in `report`.

mod attempt;
pub mod courtesy;
mod policy;
pub mod replay;
mod report;

pub use policy::{
    backoff_secs, decide, judge, runtime_refusal, Decision, RuntimeTally, BACKOFF_BASE_SECS,
    BACKOFF_MAX_SECS,
};
pub use report::{
    failure_text, Action, ConfigSource, CriSummary, DamagedReport, HeldReport, NewerReport,
    RecordReport, RecordsLeft, Report, Summary, UnreadableReport,
};

use crate::ledger::{Damage, Damaged, Decoded, Entry, Ledger, Quarantine, Record};
use crate::sandbox::holders::NodeIndex;
use crate::sandbox::{self, Evidence, Reason};
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Records younger than this are left alone, unless the node rebooted since.
pub const DEFAULT_GRACE_SECS: u64 = 60;
/// A record absent from the CRI runtime's sandbox list is left alone until it is this
/// old: kubelet lets RunPodSandbox take 2 minutes, and the sandbox is listed only once
/// it returned; five times that bound leaves room for retries and a slow runtime.
pub const DEFAULT_CRI_MIN_AGE_SECS: u64 = 600;
/// A plugin that has not answered DEL after this long is killed.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// Failed attempts before a record is marked failed (with the backoff, some 15 hours).
pub const DEFAULT_MAX_ATTEMPTS: u32 = 24;
/// Records replayed in parallel. A replay mostly waits (on exec, on the kernel's nf_tables
/// commits, on host-local's lock), so on two cores 8 keep both busy: 500 replays through
/// the v1.10 plugins' nftables backends took 24 s at 8 against 32 s at 4; with iptables
/// the commits serialize and 8 is no slower than 4 (docs/EVIDENCE.md, "gc against
/// sequential DELs"). A pod-start storm is not slowed more: the workers join 0.5 s apart
/// and wait for ADDs (`courtesy`).
pub const DEFAULT_JOBS: usize = 8;

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
    /// The end of a caller's time budget (the GC verb's): no replay starts after it, and
    /// a plugin still running then is killed; what was not attempted is `Deferred`.
    pub deadline: Option<Instant>,
    /// A record absent from the CRI runtime's list is judged gone only at this age.
    pub cri_min_age_secs: i64,
    /// `--chain-left-after`: a record whose chain never completed, with no DEL begun, is
    /// failed-left from this age on (`chain::state`; the metrics count it).
    pub chain_left_after_secs: u64,
    /// `--yield-max`: how long in all one run may wait, before its replays, while ADDs
    /// are in flight on the node (`courtesy`); zero never waits (the CNI GC verb: the
    /// runtime runs no ADD during it).
    pub yield_max: Duration,
    /// Set by `run` for its replays: the wait for ADDs in flight, shared by its workers.
    pub courtesy: Option<std::sync::Arc<courtesy::Courtesy>>,
}

impl Options {
    pub fn new(ledger_dir: PathBuf) -> Options {
        Options {
            ledger_dir,
            dry_run: false,
            ignore_backoff: false,
            network: None,
            grace_secs: DEFAULT_GRACE_SECS as i64,
            timeout: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            valid: None,
            cache_dir: PathBuf::from(crate::cni::config::DEFAULT_CNI_CACHE_DIR),
            conf_dir: None,
            cni_path: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            jobs: DEFAULT_JOBS,
            retry_failed: false,
            cri: None,
            stop: None,
            deadline: None,
            cri_min_age_secs: DEFAULT_CRI_MIN_AGE_SECS as i64,
            chain_left_after_secs: crate::chain::DEFAULT_LEFT_AFTER_SECS,
            yield_max: Duration::ZERO,
            courtesy: None,
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

/// How long a plugin started at `now` may run: `timeout`, cut to what is left before
/// `deadline`; None when nothing is left, and then it is not started at all.
pub fn capped_timeout(
    timeout: Duration,
    deadline: Option<Instant>,
    now: Instant,
) -> Option<Duration> {
    let left = match deadline {
        Some(d) => timeout.min(d.saturating_duration_since(now)),
        None => timeout,
    };
    (!left.is_zero()).then_some(left)
}

/// A stale record's reason and the identity that decided it.
type Staleness = (Reason, Evidence);

/// A record the scan found stale.
struct Candidate {
    rec: Box<Record>,
    judged: Staleness,
    /// In `retired/`, not `records/`.
    retired: bool,
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
    // One index of the node's namespace holders per run, built only if a record of this
    // boot would otherwise be gone; scan and re-check under the lock share it.
    let node = NodeIndex::new();
    let clock = crate::chain::Now::read();
    let (mut candidates, tallies, mut kept) =
        scan(&ledger, &boot, opts, &node, &clock, &mut report)?;
    // What stays in records/ is counted for the metrics as it is decided, so that they
    // need no second walk over the records.
    let left_after = opts.chain_left_after_secs;
    // A runtime whose list cannot be right judges nothing, here and under the lock.
    let unjudged;
    let mut opts = opts;
    if let Some(why) = opts.cri.as_ref().and(runtime_refusal(&tallies)) {
        crate::error!("gc: {why}");
        let before = candidates.len();
        candidates.retain(|c| {
            let keep = c.judged.0 != Reason::NotInRuntime;
            if !keep && !c.retired {
                kept.add(&c.rec, &clock, left_after);
            }
            keep
        });
        report.summary.live += before - candidates.len();
        report.summary.stale = candidates.len();
        report.cri_refused = Some(why);
        unjudged = Options {
            cri: None,
            ..opts.clone()
        };
        opts = &unjudged;
    }
    // Snapshots the removed records referred to: the only ones a per-network gc may sweep.
    let mut released = HashSet::new();
    let mut removed = vec![false; candidates.len()];
    for (i, r) in attempt_all(&ledger, &candidates, &boot, now, opts, &node) {
        report.summary.count(r.action);
        if r.action == Action::Replayed {
            released.extend(candidates[i].rec.snapshot.clone());
        }
        removed[i] = matches!(r.action, Action::Replayed | Action::Gone);
        report.records.push(r);
    }
    for (c, _) in candidates
        .iter()
        .zip(removed)
        .filter(|(c, removed)| !c.retired && !removed)
    {
        kept.add(&c.rec, &clock, left_after);
    }
    report.records_left = Some(kept);
    let s = &report.summary;
    crate::info!(
        "gc: done: {} live, {} stale ({} replayed, {} retrying, {} failed, {} would replay, {} skipped), {} damaged",
        s.live, s.stale, s.replayed, s.retrying, s.failed, s.would_replay, s.skipped, s.damaged
    );
    if s.replayed > 0 {
        sweep_snapshots(&ledger, opts, &released);
    }
    Ok(report)
}

/// What one scan worker found.
#[derive(Default)]
struct ScanFindings {
    live: usize,
    /// Live records whose namespace only a holder elsewhere on the node showed.
    held: Vec<HeldReport>,
    candidates: Vec<Candidate>,
    runtime: BTreeMap<String, RuntimeTally>,
    newer: Vec<NewerReport>,
    damaged: Vec<Damaged>,
    unreadable: Vec<UnreadableReport>,
    /// The records that are not candidates (`RecordsLeft`).
    kept: RecordsLeft,
}

impl ScanFindings {
    fn visit(
        &mut self,
        entry: Entry,
        boot: &str,
        opts: &Options,
        node: &NodeIndex,
        clock: &crate::chain::Now,
    ) {
        match entry.decoded {
            Decoded::Ok(rec) => {
                if opts.network.as_ref().is_some_and(|n| *n != rec.network) {
                    self.kept.add(&rec, clock, opts.chain_left_after_secs);
                    return;
                }
                let (l, verdict, holder) = policy::assess(&rec, boot, opts, node);
                if let (Some(v), true) = (verdict, l.verified) {
                    let t = self.runtime.entry(rec.network.clone()).or_default();
                    t.verified += 1;
                    t.absent += usize::from(v == crate::cri::Verdict::Absent);
                }
                if let (None, Some(h)) = (l.reason, holder) {
                    self.held.push(HeldReport::of(&rec, &h));
                }
                match l.reason {
                    None => {
                        self.live += 1;
                        self.kept.add(&rec, clock, opts.chain_left_after_secs);
                    }
                    Some(reason) => self.candidates.push(Candidate {
                        rec,
                        judged: (reason, l.evidence),
                        retired: false,
                    }),
                }
            }
            Decoded::Newer(format) => self.newer.push(NewerReport {
                file: entry.path.display().to_string(),
                format,
                reason: NewerReport::REASON,
            }),
            Decoded::Damaged(Damage { reason, detail }) => self.damaged.push(Damaged {
                stem: entry.stem,
                path: entry.path,
                reason,
                detail,
            }),
            Decoded::Unreadable(error) => self
                .unreadable
                .push(UnreadableReport::of(&entry.path, error)),
        }
    }
}

/// Reads every record once: live ones are counted (and tallied), stale ones returned
/// (oldest first), damaged ones quarantined and reported, with newer-format ones, in
/// `report`.
fn scan(
    ledger: &Ledger,
    boot: &str,
    opts: &Options,
    node: &NodeIndex,
    clock: &crate::chain::Now,
    report: &mut Report,
) -> Result<(Vec<Candidate>, BTreeMap<String, RuntimeTally>, RecordsLeft)> {
    let scans = ledger.scan(
        crate::ledger::scan_jobs(),
        ScanFindings::default,
        |acc, entry| acc.visit(entry, boot, opts, node, clock),
    )?;
    let mut kept = RecordsLeft::default();
    let mut candidates = Vec::new();
    let mut damaged = Vec::new();
    let mut tallies: BTreeMap<String, RuntimeTally> = BTreeMap::new();
    for scan in scans {
        for (net, t) in scan.runtime {
            let sum = tallies.entry(net).or_default();
            sum.verified += t.verified;
            sum.absent += t.absent;
        }
        report.summary.live += scan.live;
        kept.merge(scan.kept);
        report.held.extend(scan.held);
        candidates.extend(scan.candidates);
        report.newer.extend(scan.newer);
        damaged.extend(scan.damaged);
        report.unreadable.extend(scan.unreadable);
    }
    // Replay in a stable order: oldest attachments first, then by key.
    candidates.sort_by(|a, b| {
        let (a, b) = (&a.rec, &b.rec);
        (&a.created_at, &a.network, &a.container_id, &a.ifname).cmp(&(
            &b.created_at,
            &b.network,
            &b.container_id,
            &b.ifname,
        ))
    });
    for d in &damaged {
        report.damaged.push(damaged_report(ledger, d, opts.dry_run));
    }
    scan_retired(ledger, boot, opts, node, report, &mut candidates)?;
    // By file, not in the scan workers' finishing order: the same ledger, the same report.
    report.damaged.sort_by(|a, b| a.file.cmp(&b.file));
    report.unreadable.sort_by(|a, b| a.file.cmp(&b.file));
    report.newer.sort_by(|a, b| a.file.cmp(&b.file));
    report.summary.newer = report.newer.len();
    for n in &report.newer {
        crate::info!("gc: {}: format {}: {}", n.file, n.format, n.reason);
    }
    report.held.sort_by(|a, b| {
        (&a.network, &a.container_id, &a.ifname).cmp(&(&b.network, &b.container_id, &b.ifname))
    });
    // One line, not one per record: a runtime with private mounts makes every one of
    // its pods such a record, on every run.
    if let Some(first) = report.held.first() {
        crate::info!(
            "gc: {} record(s) live though their netns path shows no namespace from here: held elsewhere on the node (e.g. {}/{}/{}: {}); see the report's held",
            report.held.len(),
            first.network,
            first.container_id,
            first.ifname,
            first.held_by
        );
    }
    report.summary.damaged = report.damaged.len();
    report.summary.unreadable = report.unreadable.len();
    if !opts.dry_run {
        let n = ledger.remove_orphan_temps();
        if n > 0 {
            crate::info!("gc: removed {n} temporary file(s) left by interrupted writes");
        }
        let n = ledger.remove_orphan_notes();
        if n > 0 {
            crate::info!("gc: removed {n} tail note(s) whose record is gone");
        }
    }
    report.summary.stale = candidates.len();
    Ok((candidates, tallies, kept))
}

/// The records a DEL or GC retired while their ADD was in the chain (docs/CHAIN.md). One
/// whose key has a record again (a newer ADD) is dropped: replaying it would tear that
/// ADD down. One whose ADD may still complete is left for its tail. The others are
/// judged as records are, and the stale ones join `candidates` (after the records:
/// there are few). Damaged ones are quarantined under their key's lock.
fn scan_retired(
    ledger: &Ledger,
    boot: &str,
    opts: &Options,
    node: &NodeIndex,
    report: &mut Report,
    candidates: &mut Vec<Candidate>,
) -> Result<()> {
    let now = crate::time::now();
    let mut found = Vec::new();
    ledger.for_each_retired(|e| found.push(e))?;
    found.sort_by(|a, b| a.stem.cmp(&b.stem));
    for entry in found {
        match entry.decoded {
            Decoded::Ok(rec) => {
                if opts.network.as_ref().is_some_and(|n| *n != rec.network) {
                    continue;
                }
                if ledger.has_record_file(&entry.stem) {
                    if !opts.dry_run {
                        drop_superseded(ledger, &entry.stem, &rec);
                    }
                    continue;
                }
                if crate::chain::may_complete(&rec, boot, now, opts.chain_left_after_secs) {
                    crate::info!(
                        "gc: {}: retired while its ADD was in the chain; left for its tail",
                        rec.key()
                    );
                    report.summary.live += 1;
                    continue;
                }
                let (l, _, _) = policy::assess(&rec, boot, opts, node);
                match l.reason {
                    None => report.summary.live += 1,
                    Some(reason) => candidates.push(Candidate {
                        rec,
                        judged: (reason, l.evidence),
                        retired: true,
                    }),
                }
            }
            Decoded::Newer(format) => report.newer.push(NewerReport {
                file: entry.path.display().to_string(),
                format,
                reason: NewerReport::REASON,
            }),
            Decoded::Damaged(Damage { reason, detail }) => {
                let d = Damaged {
                    stem: entry.stem,
                    path: entry.path,
                    reason,
                    detail,
                };
                let mut out = DamagedReport {
                    file: d.path.display().to_string(),
                    reason: format!("{}: {}", d.reason, d.detail),
                    quarantined_to: None,
                };
                // As damaged records are: a FIFO, directory or non-UTF-8 name too.
                if !opts.dry_run {
                    if let Quarantine::Moved(to) = ledger.quarantine_retired(&d, "gc: retired") {
                        out.quarantined_to = Some(to.display().to_string());
                    }
                }
                report.damaged.push(out);
            }
            Decoded::Unreadable(error) => report
                .unreadable
                .push(UnreadableReport::of(&entry.path, error)),
        }
    }
    report.summary.damaged = report.damaged.len();
    report.summary.unreadable = report.unreadable.len();
    Ok(())
}

/// Drops the retired record `rec` once a newer ADD of its key has a record: the chain
/// of `rec`'s ADD can no longer complete, and the newer record's DEL releases the key.
fn drop_superseded(ledger: &Ledger, stem: &str, rec: &Record) {
    let key = rec.key();
    let Ok(Some(_lock)) = ledger.lock(stem, crate::ledger::Wait::No) else {
        return;
    };
    let same =
        matches!(ledger.read_retired(stem), Ok(Some(Decoded::Ok(r))) if r.add_id == rec.add_id);
    if same && ledger.has_record_file(stem) {
        match ledger.drop_retired(stem) {
            Ok(_) => crate::info!(
                "gc: {key}: retired record dropped: a newer ADD of the key has a record"
            ),
            Err(e) => crate::warn!("gc: {key}: cannot drop the retired record: {e:#}"),
        }
    }
}

/// Attempts every candidate on up to `opts.jobs` threads, until `opts.stop` is set or
/// `opts.deadline` passed; returns each report with its candidate's index, in candidate
/// order. Past the deadline, those not attempted are reported `Deferred`.
fn attempt_all(
    ledger: &Ledger,
    candidates: &[Candidate],
    boot: &str,
    now: i64,
    opts: &Options,
    node: &NodeIndex,
) -> Vec<(usize, RecordReport)> {
    let next = AtomicUsize::new(0);
    let out_of_time = || opts.deadline.is_some_and(|d| Instant::now() >= d);
    let stopping = || {
        out_of_time()
            || opts
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed))
    };
    let jobs = opts.jobs.clamp(1, 64).min(candidates.len().max(1));
    // A dry run runs no plugin: nothing to step aside for.
    let budget = if opts.dry_run {
        Duration::ZERO
    } else {
        opts.yield_max
    };
    let courtesy = std::sync::Arc::new(courtesy::Courtesy::new(
        ledger.clone(),
        boot,
        budget,
        opts.stop.clone(),
        opts.deadline,
    ));
    let with_courtesy = Options {
        courtesy: Some(courtesy.clone()),
        ..opts.clone()
    };
    let opts = &with_courtesy;
    let started = AtomicUsize::new(0);
    let per_worker = crate::workers::run(jobs, || {
        let mut done = Vec::new();
        // Nothing left to replay: no reason to wait for anyone.
        let left = || next.load(Ordering::Relaxed) < candidates.len();
        if left() {
            courtesy.ramp(started.fetch_add(1, Ordering::Relaxed));
        }
        while !stopping() && left() {
            courtesy.before_replay();
            if stopping() {
                break;
            }
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(c) = candidates.get(i) else {
                break;
            };
            done.push((
                i,
                attempt::attempt(
                    attempt::At {
                        ledger,
                        retired: c.retired,
                    },
                    &c.rec,
                    c.judged,
                    boot,
                    now,
                    opts,
                    node,
                ),
            ));
        }
        done
    });
    let mut results: Vec<_> = per_worker.into_iter().flatten().collect();
    let waited = courtesy.total();
    if !waited.is_zero() {
        crate::info!(
            "gc: replays waited {:.1} s in all for ADDs in flight on the node",
            waited.as_secs_f64()
        );
    }
    if out_of_time() {
        let tried: HashSet<usize> = results.iter().map(|(i, _)| *i).collect();
        for (i, c) in candidates
            .iter()
            .enumerate()
            .filter(|(i, _)| !tried.contains(i))
        {
            let mut r = RecordReport::of(&c.rec, c.judged, Action::Deferred);
            r.retired = c.retired;
            results.push((i, r));
        }
    }
    results.sort_by_key(|(i, _)| *i);
    results
}

/// Removes unreferenced snapshots after a run that removed records.
fn sweep_snapshots(ledger: &Ledger, opts: &Options, released: &HashSet<String>) {
    // Per network (the GC verb, `--network`), other networks' snapshots are not ours
    // to judge, not even unreferenced ones: only those our removed records used.
    let only = opts.network.as_ref().map(|_| released);
    match ledger.sweep_snapshots(only) {
        Ok(n) if n > 0 => crate::info!("gc: removed {n} unreferenced snapshot(s)"),
        Ok(_) => {}
        Err(e) => crate::warn!("gc: snapshot sweep failed: {e:#}"),
    }
}

/// A damaged record's entry in the report, after quarantine (a dry run leaves it).
fn damaged_report(ledger: &Ledger, d: &Damaged, dry_run: bool) -> DamagedReport {
    let mut out = DamagedReport {
        file: d.path.display().to_string(),
        reason: format!("{}: {}", d.reason, d.detail),
        quarantined_to: None,
    };
    if dry_run {
        crate::warn!("gc: damaged record {d}; dry run, left in place");
        return out;
    }
    match ledger.quarantine_damaged(d, "gc:") {
        Quarantine::Moved(to) => out.quarantined_to = Some(to.display().to_string()),
        Quarantine::Replaced => out.reason.push_str(" (since replaced by a good record)"),
        Quarantine::Busy | Quarantine::Failed(_) => {}
    }
    out
}
