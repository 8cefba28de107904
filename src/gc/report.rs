//! What a gc run reports: a summary, one entry per stale record and per damaged file,
//! and the exit status that follows from them.

use super::replay::PluginOutcome;
use super::Staleness;
use crate::ledger::Record;
use crate::sandbox::{Evidence, Reason};
use serde::Serialize;
use std::collections::BTreeMap;

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
    /// Records that could not be read this run (I/O error, no fd, no memory): left in
    /// place, neither judged nor quarantined, read again next run.
    pub unreadable: usize,
    /// Records of a newer format (a rollback): left whole for the binary that wrote
    /// them, with the snapshot they name; neither damage nor anything left to do.
    pub newer: usize,
}

/// What became of one stale record in a run (`action` in the report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// DEL replayed through the whole chain; the record is gone.
    Replayed,
    /// A plugin's DEL failed; the record stays, with its next attempt after a backoff.
    Retrying,
    /// A plugin's DEL failed for the last allowed time: left for an operator.
    Failed,
    /// Dry run: would have been replayed.
    WouldReplay,
    /// Young, so perhaps an ADD still in progress; not judged yet.
    SkipGrace,
    /// Its last attempt's backoff has not run out.
    SkipBackoff,
    /// Marked failed by an earlier run (`--retry-failed` tries it again).
    SkipFailed,
    /// An ADD, DEL or another gc held its key.
    Busy,
    /// Removed since the scan.
    Gone,
    /// Replaced or unreadable since the scan.
    Changed,
    /// Live after all, on the re-check under its lock.
    Live,
    /// Not attempted: the run's time budget (the GC verb's) ran out first.
    Deferred,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Replayed => "replayed",
            Action::Retrying => "retrying",
            Action::Failed => "failed",
            Action::WouldReplay => "would-replay",
            Action::SkipGrace => "skip-grace",
            Action::SkipBackoff => "skip-backoff",
            Action::SkipFailed => "skip-failed",
            Action::Busy => "busy",
            Action::Gone => "gone",
            Action::Changed => "changed",
            Action::Live => "live",
            Action::Deferred => "deferred",
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Summary {
    /// Counts one stale record by what became of it: what the exit status hangs on.
    pub(super) fn count(&mut self, action: Action) {
        match action {
            Action::Replayed => self.replayed += 1,
            Action::Retrying | Action::SkipBackoff | Action::Busy | Action::Deferred => {
                self.retrying += 1
            }
            Action::Failed | Action::SkipFailed => self.failed += 1,
            Action::WouldReplay => self.would_replay += 1,
            // Counted stale by the scan, it never was.
            Action::Live => {
                self.live += 1;
                self.stale -= 1;
            }
            Action::SkipGrace | Action::Gone | Action::Changed => self.skipped += 1,
        }
    }
}

/// Where a replayed chain came from, in the order they are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigSource {
    /// The ledger's snapshot of the conflist at ADD.
    Snapshot,
    /// libcni's cached config of the attachment.
    Cache,
    /// Today's conflist of that network name.
    Conflist,
}

impl ConfigSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigSource::Snapshot => "snapshot",
            ConfigSource::Cache => "cache",
            ConfigSource::Conflist => "conflist",
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordReport {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub reason: Reason,
    /// Which identity decided.
    pub identity: Evidence,
    pub action: Action,
    /// The CNI_NETNS a replay was given: the recorded path only when its cookie proved it
    /// the recorded namespace, else none.
    pub replay_netns: Option<String>,
    pub config_source: Option<ConfigSource>,
    pub plugins: Vec<PluginOutcome>,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub next_attempt_at: Option<String>,
    /// A record a DEL or GC set aside while its ADD was in the chain (`retired/`),
    /// replayed now that its ADD can no longer complete. Absent for a record.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub retired: bool,
    /// Devices the replay gave back after the fact (the namespace died with no DEL):
    /// found on the host by bus address, renamed and restored.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<crate::devices::state::Repaired>,
}

impl RecordReport {
    /// The entry of a record as it stands (its gc state included), before any replay.
    pub(super) fn of(rec: &Record, (reason, evidence): Staleness, action: Action) -> Self {
        let gc = rec.gc.clone().unwrap_or_default();
        RecordReport {
            network: rec.network.clone(),
            container_id: rec.container_id.clone(),
            ifname: rec.ifname.clone(),
            reason,
            identity: evidence,
            action,
            replay_netns: None,
            config_source: None,
            plugins: Vec::new(),
            attempts: gc.attempts,
            last_error: gc.last_error,
            next_attempt_at: gc.next_attempt_at,
            retired: false,
            devices: Vec::new(),
        }
    }
}

/// A live record whose path shows no namespace from here, kept live because a process
/// or a mount elsewhere on the node holds the recorded namespace (DESIGN §5).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldReport {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    /// "held by pid 1234", "mounted at /run/netns/x in the mount namespace of pid 99".
    pub held_by: String,
}

impl HeldReport {
    pub(super) fn of(rec: &Record, holder: &crate::sandbox::holders::Holder) -> Self {
        HeldReport {
            network: rec.network.clone(),
            container_id: rec.container_id.clone(),
            ifname: rec.ifname.clone(),
            netns: rec.netns.clone(),
            held_by: holder.to_string(),
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DamagedReport {
    pub file: String,
    pub reason: String,
    pub quarantined_to: Option<String>,
}

/// A record of a newer format, left whole for a newer binary.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewerReport {
    pub file: String,
    pub format: u32,
    pub reason: &'static str,
}

impl NewerReport {
    pub const REASON: &'static str = "newer format, left for a newer binary";
}

/// A record file a scan could not read, and the error.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnreadableReport {
    pub file: String,
    pub error: String,
}

impl UnreadableReport {
    /// Logs it too: the record is left where it is, with nothing else to show for it.
    pub(super) fn of(path: &std::path::Path, error: String) -> Self {
        let file = path.display().to_string();
        crate::warn!("gc: cannot read record {file} ({error}); left in place, read again next run");
        UnreadableReport { file, error }
    }
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub dry_run: bool,
    pub summary: Summary,
    pub records: Vec<RecordReport>,
    pub damaged: Vec<DamagedReport>,
    /// Absent when every record could be read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unreadable: Vec<UnreadableReport>,
    /// Absent when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub newer: Vec<NewerReport>,
    /// Live records whose namespace only a holder elsewhere on the node showed; absent
    /// when there are none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cri: Option<CriSummary>,
    /// Why the CRI runtime's list judged nothing this run, when its answer could not
    /// be right (`gc::runtime_refusal`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cri_refused: Option<String>,
    /// What the records left add up to, for the metrics; None when the run scanned no
    /// records (no ledger). Not part of the report's JSON.
    #[serde(skip)]
    pub records_left: Option<RecordsLeft>,
}

/// The records a run leaves in `records/`, added up by its one scan for the metrics (the
/// `records` and `chain_failed_left_records` series, the runtime ranges of the headroom):
/// a record the run replayed, or found removed under its lock, is not in it. Records
/// written during the run are not either; the next run counts them.
#[derive(Debug, Default)]
pub struct RecordsLeft {
    /// Records by network.
    pub records: BTreeMap<String, i64>,
    /// Records failed-left at the scan (`chain::failed_left`, `--chain-left-after`), by network.
    pub failed_left: BTreeMap<String, i64>,
    /// The address ranges runtimes passed in the records' `ipRanges`.
    pub ranges: crate::hostlocal::RuntimeRanges,
}

impl RecordsLeft {
    pub fn add(&mut self, rec: &Record, now: &crate::chain::Now, left_after_secs: u64) {
        self.ranges
            .add(&rec.network, rec.runtime_config.get("ipRanges"));
        *self.records.entry(rec.network.clone()).or_default() += 1;
        if crate::chain::failed_left(rec, now, left_after_secs) {
            *self.failed_left.entry(rec.network.clone()).or_default() += 1;
        }
    }

    /// Another scan worker's findings.
    pub fn merge(&mut self, other: RecordsLeft) {
        for (net, n) in other.records {
            *self.records.entry(net).or_default() += n;
        }
        for (net, n) in other.failed_left {
            *self.failed_left.entry(net).or_default() += n;
        }
        self.ranges.merge(other.ranges);
    }
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
    /// judged yet), 1 when something is left for later (an unreadable record too: it
    /// was not judged) or, in a dry run, would be replayed. A newer-format record is
    /// not for this binary to clean: it counts for neither.
    pub fn exit_code(&self) -> i32 {
        let s = &self.summary;
        if s.retrying + s.failed + s.would_replay + s.unreadable > 0 || !self.damaged.is_empty() {
            1
        } else {
            0
        }
    }
}

/// One failed plugin as an operator reads it: `type (from FILE): message (exit N)`; a plugin that
/// never ran or was killed has no exit status to show.
pub fn failure_text(o: &PluginOutcome) -> String {
    let error = o.error();
    let msg = error.map_or("failed", |e| e.message.as_str());
    let who = match (o.plugin_type.as_str(), &o.source) {
        ("", _) => String::new(),
        (t, Some(source)) => format!("{t} (from {source}): "),
        (t, None) => format!("{t}: "),
    };
    match o.exit_status() {
        Some(s) => format!("{who}{msg} (exit {s})"),
        None => format!("{who}{msg}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_serialise_as_they_print() {
        let all = [
            Action::Replayed,
            Action::Retrying,
            Action::Failed,
            Action::WouldReplay,
            Action::SkipGrace,
            Action::SkipBackoff,
            Action::SkipFailed,
            Action::Busy,
            Action::Gone,
            Action::Changed,
            Action::Live,
            Action::Deferred,
        ];
        for a in all {
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str(), "{a:?}");
        }
    }
}
