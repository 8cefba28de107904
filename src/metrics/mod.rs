//! The node's metrics: what the agent serves on `/metrics` and what `gc --metrics-file`
//! writes, with the same names, in the Prometheus text format (0.0.4) (node_exporter's textfile collector reads that
//! format). Built on the `prometheus` crate's registry and text encoder.

pub mod chain;
pub mod headroom;

use crate::gc::{Action, RecordsLeft, Report};
use crate::ledger::{Decoded, Ledger};
use anyhow::{Context, Result};
use prometheus::core::Collector;
use prometheus::proto::MetricType;
use prometheus::{
    Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

pub struct Metrics {
    registry: Registry,
    /// Every family registered, for `metric_names` (the registry's `gather` leaves out
    /// families without a series yet).
    families: Vec<Box<dyn Collector>>,
    pub records: IntGaugeVec,
    pub stale: IntGaugeVec,
    pub quarantined: IntGauge,
    pub alias_mismatches: IntGauge,
    pub devices_repaired: IntGauge,
    pub replays: IntCounterVec,
    pub gc_runs: IntCounterVec,
    pub gc_duration: Gauge,
    pub gc_last_success: Gauge,
    pub injected: IntGaugeVec,
    pub injections: IntCounterVec,
    pub reverts: IntCounterVec,
    pub fight: IntGaugeVec,
    pub unsupported_version: IntGaugeVec,
    pub conflist_chosen: IntGaugeVec,
    pub choice_unknown: IntGaugeVec,
    pub unrecorded: IntGaugeVec,
    pub binary_installed: IntGaugeVec,
    pub cri_up: IntGaugeVec,
    pub cri_sandboxes: IntGaugeVec,
    pub cri_unanswered: IntCounterVec,
    pub cri_refused: Gauge,
    pub unreadable: Gauge,
    pub failed_records: IntGauge,
    pub chain_add_duration: HistogramVec,
    pub chain_del_duration: HistogramVec,
    pub chain_adds: IntCounterVec,
    pub chain_failed_left: IntGaugeVec,
    pub headroom_ratio: GaugeVec,
    pub addresses_used: GaugeVec,
    pub addresses_size: GaugeVec,
}

/// `cni_ledger_chain_adds_total{result}`: how a chain's ADD ended (docs/ALERTS.md).
pub const CHAIN_OK: &str = "ok";
pub const CHAIN_FAILED_TORN_DOWN: &str = "failed-torn-down";
pub const CHAIN_FAILED_LEFT: &str = "failed-left";

/// Buckets of the chain's ADD and DEL durations: a CNI call takes from a few ms (a
/// bridge and host-local) to tens of seconds (a cloud IPAM, runtimes' timeouts).
pub const CHAIN_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0,
];

/// Outcomes of a replay, as `cni_ledger_replays_total{outcome}` counts them.
pub const REPLAY_OUTCOMES: [Action; 3] = [Action::Replayed, Action::Retrying, Action::Failed];
/// Counter families, whose values a metrics file carries over from the previous run.
const COUNTERS: [&str; 3] = [
    "cni_ledger_replays_total",
    "cni_ledger_gc_runs_total",
    "cni_ledger_cri_unanswered_total",
];

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
}

impl Metrics {
    // The names and labels are constants, each registered once: registration cannot
    // fail, and a unit test builds the set.
    #[allow(clippy::expect_used)]
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let families = std::cell::RefCell::new(Vec::<Box<dyn Collector>>::new());
        // One handle for the registry, one kept for `series_names`.
        let register = |c: Box<dyn Collector>, kept: Box<dyn Collector>| {
            registry.register(c).expect("unique metric");
            families.borrow_mut().push(kept);
        };
        let gauge_vec = |name: &str, help: &str, label: &str| {
            let m = IntGaugeVec::new(opts(name, help), &[label]).expect("valid metric");
            register(Box::new(m.clone()), Box::new(m.clone()));
            m
        };
        let gauge_vec_n = |name: &str, help: &str, labels: &[&str]| {
            let m = IntGaugeVec::new(opts(name, help), labels).expect("valid metric");
            register(Box::new(m.clone()), Box::new(m.clone()));
            m
        };
        let float_gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let m = GaugeVec::new(opts(name, help), labels).expect("valid metric");
            register(Box::new(m.clone()), Box::new(m.clone()));
            m
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let m = IntCounterVec::new(opts(name, help), labels).expect("valid metric");
            register(Box::new(m.clone()), Box::new(m.clone()));
            m
        };
        let gauge = |name: &str, help: &str| {
            let m = Gauge::with_opts(opts(name, help)).expect("valid metric");
            register(Box::new(m.clone()), Box::new(m.clone()));
            m
        };
        let int_gauge = |name: &str, help: &str| {
            let m = IntGauge::with_opts(opts(name, help)).expect("valid metric");
            register(Box::new(m.clone()), Box::new(m.clone()));
            m
        };
        let histogram_vec = |name: &str, help: &str| {
            let o = HistogramOpts::new(name, help).buckets(CHAIN_BUCKETS.to_vec());
            let m = HistogramVec::new(o, &["network"]).expect("valid metric");
            register(Box::new(m.clone()), Box::new(m.clone()));
            m
        };
        let quarantined = int_gauge(
            "cni_ledger_quarantined_files",
            "Damaged files moved aside into the ledger's quarantine/ (never acted on).",
        );
        Metrics {
            records: gauge_vec(
                "cni_ledger_records",
                "Records in the ledger, by network (after the last gc run).",
                "network",
            ),
            stale: gauge_vec(
                "cni_ledger_stale_records",
                "Stale records left after the last gc run (retrying, failed, in grace), by reason.",
                "reason",
            ),
            quarantined,
            alias_mismatches: int_gauge(
                "cni_ledger_device_alias_mismatches",
                "Attachments whose returned device's ifalias at DEL was not the host name recorded when the chain completed (the pod rewrote it; the alias was not used): files in the ledger's devices/alias-mismatch/, kept until an operator removes them.",
            ),
            devices_repaired: int_gauge(
                "cni_ledger_devices_given_back",
                "Attachments whose devices gc gave back after the fact (the namespace died with no DEL; the kernel had returned the NICs down under their pod names): files in the ledger's devices/repaired/, kept until an operator removes them.",
            ),
            unreadable: gauge(
                "cni_ledger_unreadable_records",
                "Records the last gc run could not read (EIO, EMFILE, ...): left in place, not judged, read again next run.",
            ),
            cri_refused: gauge(
                "cni_ledger_cri_refused",
                "1 when the last gc run judged nothing by the CRI runtimes' sandbox list because it could not be right (it misses most of a network's sandboxes whose namespaces are verifiably there), else 0.",
            ),
            replays: counter_vec(
                "cni_ledger_replays_total",
                "DEL replays by outcome: replayed (record removed), retrying (failed, will retry), failed (gave up).",
                &["outcome"],
            ),
            gc_runs: counter_vec(
                "cni_ledger_gc_runs_total",
                "gc runs by result: ok (the run completed, whatever its replays did) or error (the ledger could not be used).",
                &["result"],
            ),
            gc_duration: gauge(
                "cni_ledger_gc_duration_seconds",
                "Wall time of the last gc run.",
            ),
            gc_last_success: gauge(
                "cni_ledger_gc_last_success_timestamp_seconds",
                "Unix time at which the last gc run that completed ended; 0 until one has (the agent: since it started).",
            ),
            injected: gauge_vec(
                "cni_ledger_conflist_injected",
                "1 when the ledger is first in this conflist, as verified by reading it back.",
                "file",
            ),
            injections: counter_vec(
                "cni_ledger_conflist_injections_total",
                "Times the agent wrote the ledger into this conflist.",
                &["file"],
            ),
            reverts: counter_vec(
                "cni_ledger_conflist_reverts_total",
                "Times another writer took the ledger out of this conflist after the agent put it in.",
                &["file"],
            ),
            fight: gauge_vec(
                "cni_ledger_conflist_fight",
                "1 while another writer keeps reverting this conflist and the agent backs off.",
                "file",
            ),
            unsupported_version: gauge_vec(
                "cni_ledger_conflist_unsupported_version",
                "1 when this conflist's chain runs at a cniVersion the ledger does not serve: it is left without the ledger.",
                "file",
            ),
            conflist_chosen: gauge_vec_n(
                "cni_ledger_conflist_chosen",
                "1 for the conflist this runtime loads with this libcni, by the agent's reading of its rule (the agent keeps the ledger first in each).",
                &["file", "runtime", "libcni"],
            ),
            choice_unknown: gauge_vec_n(
                "cni_ledger_conflist_choice_unknown",
                "1 when the agent cannot tell which conflist this runtime loads with this libcni (a plugin binary it cannot examine): it keeps the ledger in each file it may be.",
                &["runtime", "libcni"],
            ),
            unrecorded: gauge_vec(
                "cni_ledger_unrecorded_attachments",
                "libcni cache entries of an injected network that have no record (made while the ledger was out of the chain or under onLedgerError: warn, or whose record was removed other than by DEL).",
                "network",
            ),
            binary_installed: gauge_vec(
                "cni_ledger_binary_installed",
                "1 when this CNI bin dir holds the agent's own binary.",
                "dir",
            ),
            cri_up: gauge_vec(
                "cni_ledger_cri_up",
                "1 when this CRI runtime answered ListPodSandbox at the last gc run; 0 when it did not, and nothing was judged by sandbox lists.",
                "endpoint",
            ),
            cri_sandboxes: gauge_vec(
                "cni_ledger_cri_sandboxes",
                "Pod sandboxes this CRI runtime listed at the last gc run.",
                "endpoint",
            ),
            cri_unanswered: counter_vec(
                "cni_ledger_cri_unanswered_total",
                "gc runs at which this CRI runtime did not answer.",
                &["endpoint"],
            ),
            failed_records: int_gauge(
                "cni_ledger_failed_records",
                "Records whose DEL replay failed --max-attempts times and were marked failed: left in place for an operator (gc --retry-failed tries them again).",
            ),
            chain_add_duration: histogram_vec(
                "cni_ledger_chain_add_duration_seconds",
                "Time a chain with a tail entry took on ADD, from the head's start to the tail's end (CLOCK_BOOTTIME), by network.",
            ),
            chain_del_duration: histogram_vec(
                "cni_ledger_chain_del_duration_seconds",
                "Time a chain with a tail entry took on DEL, from the tail's start to the record's removal by the head, by network.",
            ),
            chain_adds: counter_vec(
                "cni_ledger_chain_adds_total",
                "ADDs of chains with a tail entry by how they ended: ok (the tail completed the record), failed-torn-down (never completed, and its DEL came), failed-left (never completed, no DEL, older than --chain-left-after). Each record counted once.",
                &["network", "result"],
            ),
            chain_failed_left: gauge_vec(
                "cni_ledger_chain_failed_left_records",
                "Records of chains with a tail entry whose ADD never completed and no DEL came, older than --chain-left-after, at the last gc run: what a runtime that failed an ADD and never called DEL leaves behind.",
                "network",
            ),
            headroom_ratio: float_gauge_vec(
                "cni_ledger_address_headroom_ratio",
                "Free share of a host-local range: (size - used) / size, at the last gc run.",
                &["network", "range"],
            ),
            addresses_used: float_gauge_vec(
                "cni_ledger_addresses_used",
                "Addresses of a host-local range reserved in its data dir, at the last gc run.",
                &["network", "range"],
            ),
            addresses_size: float_gauge_vec(
                "cni_ledger_addresses_size",
                "Addresses host-local can hand out from a range (rangeStart to rangeEnd, less the gateway).",
                &["network", "range"],
            ),
            families: families.into_inner(),
            registry,
        }
    }

    /// The names of every series this process can export: a family's name, or for a
    /// histogram its `_bucket`, `_sum` and `_count` series. What dashboards and alert
    /// rules may refer to (tests/dashboard.rs checks them against it).
    pub fn series_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for family in self.families.iter().flat_map(|c| c.collect()) {
            let name = family.name();
            match family.get_field_type() {
                MetricType::HISTOGRAM => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.push(format!("{name}{suffix}"));
                    }
                }
                _ => names.push(name.to_string()),
            }
        }
        names.sort();
        names.dedup();
        names
    }

    pub fn encode(&self) -> String {
        TextEncoder::new()
            .encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }

    /// Counts what one gc run did.
    pub fn observe_gc(&self, report: &Report, secs: f64) {
        for outcome in REPLAY_OUTCOMES {
            self.replays
                .with_label_values(&[outcome.as_str()])
                .inc_by(0);
        }
        let mut stale: BTreeMap<&str, i64> = BTreeMap::new();
        let mut failed = 0;
        for r in &report.records {
            failed += i64::from(matches!(r.action, Action::Failed | Action::SkipFailed));
            if REPLAY_OUTCOMES.contains(&r.action) {
                self.replays.with_label_values(&[r.action.as_str()]).inc();
            }
            if !matches!(r.action, Action::Replayed | Action::Gone | Action::Live) {
                *stale.entry(r.reason.as_str()).or_default() += 1;
            }
        }
        self.failed_records.set(failed);
        self.stale.reset();
        for (reason, n) in stale {
            self.stale.with_label_values(&[reason]).set(n);
        }
        self.cri_refused
            .set(f64::from(u8::from(report.cri_refused.is_some())));
        self.unreadable.set(report.summary.unreadable as f64);
        self.gc_runs.with_label_values(&["ok"]).inc();
        self.gc_runs.with_label_values(&["error"]).inc_by(0);
        self.gc_duration.set(secs);
        self.gc_last_success.set(crate::time::now() as f64);
    }

    /// What the CRI runtimes answered before a gc run.
    pub fn observe_cri(&self, answers: &[crate::cri::Answer]) {
        self.cri_up.reset();
        self.cri_sandboxes.reset();
        for a in answers {
            let ep = [a.endpoint.as_str()];
            self.cri_up
                .with_label_values(&ep)
                .set(i64::from(a.sandboxes.is_some()));
            match a.sandboxes {
                Some(n) => {
                    self.cri_sandboxes.with_label_values(&ep).set(n as i64);
                    self.cri_unanswered.with_label_values(&ep).inc_by(0);
                }
                None => self.cri_unanswered.with_label_values(&ep).inc(),
            }
        }
    }

    /// The chain's series of `network` at zero, for a chain the agent keeps with a tail:
    /// a series born with its first observation shows Prometheus no increase, so
    /// `rate()` (CniLedgerChainAddSlow, the dashboard's rows) would miss that ADD.
    pub fn zero_chain_series(&self, network: &str) {
        self.chain_add_duration.with_label_values(&[network]);
        self.chain_del_duration.with_label_values(&[network]);
        for result in [CHAIN_OK, CHAIN_FAILED_TORN_DOWN, CHAIN_FAILED_LEFT] {
            self.chain_adds
                .with_label_values(&[network, result])
                .inc_by(0);
        }
    }

    /// Records of chains with a tail left behind, by network (gc --metrics-file; the
    /// agent's watcher sets the same gauge from what it remembers).
    fn set_failed_left(&self, by_network: BTreeMap<String, i64>) {
        self.chain_failed_left.reset();
        for (net, n) in by_network {
            self.chain_failed_left
                .with_label_values(&[net.as_str()])
                .set(n);
        }
    }

    /// Host-local's ranges as they stand: a range no longer configured leaves no series.
    pub fn observe_headroom(&self, usages: &[headroom::Usage]) {
        self.headroom_ratio.reset();
        self.addresses_used.reset();
        self.addresses_size.reset();
        for u in usages {
            let labels = [u.network.as_str(), u.range.as_str()];
            self.headroom_ratio
                .with_label_values(&labels)
                .set(u.headroom());
            self.addresses_used
                .with_label_values(&labels)
                .set(u.used as f64);
            self.addresses_size
                .with_label_values(&labels)
                .set(u.size as f64);
        }
    }

    /// Headroom of the host-local networks of these network configurations (a conf
    /// dir's, in the runtime's order), with the ranges runtimes passed (`runtime`, from
    /// `observe_ledger`); what cannot be measured is logged (at `warn` by gc, once an
    /// interval at `debug` by the agent).
    pub fn observe_confs_headroom(
        &self,
        confs: &[(std::path::PathBuf, serde_json::Value)],
        runtime: &headroom::RuntimeRanges,
        loud: bool,
    ) {
        let (usages, problems) = headroom::of_confs(confs, runtime);
        for p in problems {
            if loud {
                crate::warn!("headroom: {p}");
            } else {
                crate::debug!("headroom: {p}");
            }
        }
        self.observe_headroom(&usages);
    }

    pub fn observe_gc_error(&self, secs: f64) {
        self.gc_runs.with_label_values(&["ok"]).inc_by(0);
        self.gc_runs.with_label_values(&["error"]).inc();
        self.gc_duration.set(secs);
    }

    /// Records by network and quarantined files, from a scan of the ledger (the agent
    /// when its gc run could not tell them). Returns the address ranges runtimes passed
    /// in the records (for the headroom), found by the same scan.
    pub fn observe_ledger(&self, ledger: &Ledger) -> headroom::RuntimeRanges {
        self.observe_records(ledger, None)
    }

    /// `observe_ledger`, and the records failed-left now (`--chain-left-after`) counted
    /// in the same pass over the records: `gc --metrics-file` when its run could not
    /// tell them.
    pub fn observe_ledger_and_failed_left(
        &self,
        ledger: &Ledger,
        left_after_secs: u64,
    ) -> headroom::RuntimeRanges {
        self.observe_records(ledger, Some(left_after_secs))
    }

    /// What a gc run's own scan found left in the ledger (`Report::records_left`), the
    /// failed-left ones too when `with_failed_left` (`gc --metrics-file`; the agent's
    /// watcher sets those itself): no record is read again. Returns the runtime ranges.
    pub fn observe_records_left(
        &self,
        ledger: &Ledger,
        left: RecordsLeft,
        with_failed_left: bool,
    ) -> headroom::RuntimeRanges {
        self.records.reset();
        for (net, n) in left.records {
            self.records.with_label_values(&[&net]).set(n);
        }
        if with_failed_left {
            self.set_failed_left(left.failed_left);
        }
        self.observe_ledger_files(ledger);
        left.ranges
    }

    fn observe_records(
        &self,
        ledger: &Ledger,
        failed_left_after: Option<u64>,
    ) -> headroom::RuntimeRanges {
        let now = chain::Now::read();
        let after = failed_left_after.unwrap_or(chain::DEFAULT_LEFT_AFTER_SECS);
        let scans = ledger.scan(
            crate::ledger::scan_jobs(),
            RecordsLeft::default,
            |left, entry| {
                if let Decoded::Ok(rec) = entry.decoded {
                    left.add(&rec, &now, after);
                }
            },
        );
        match scans {
            Ok(scans) => {
                let mut left = RecordsLeft::default();
                for found in scans {
                    left.merge(found);
                }
                self.observe_records_left(ledger, left, failed_left_after.is_some())
            }
            Err(e) => {
                crate::warn!("agent: counting records: {e:#}");
                if failed_left_after.is_some() {
                    self.set_failed_left(BTreeMap::new());
                }
                self.observe_ledger_files(ledger);
                headroom::RuntimeRanges::default()
            }
        }
    }

    /// The ledger's files that are not records: quarantined ones, the devices' notes.
    fn observe_ledger_files(&self, ledger: &Ledger) {
        let q = std::fs::read_dir(ledger.quarantine_dir())
            .map(|rd| rd.count())
            .unwrap_or(0);
        self.quarantined.set(q as i64);
        self.alias_mismatches
            .set(crate::devices::failure_note::mismatch_count(ledger) as i64);
        self.devices_repaired
            .set(crate::devices::state::repaired_count(ledger) as i64);
    }

    /// Writes the node_exporter textfile: counters continue from the previous file's
    /// values (they count across runs), and so does the last completed run's time; the
    /// file replaced by rename (the collector never reads half of it).
    pub fn write_file(&self, path: &Path) -> Result<()> {
        if let Ok(old) = std::fs::read_to_string(path) {
            self.carry_over(&old);
        }
        let text = self.encode();
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path.file_name().context("no file name")?.to_string_lossy();
        // node_exporter reads only *.prom: a temp name without that ending is ignored.
        let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
        let result = (|| -> Result<()> {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&tmp)
                .with_context(|| format!("creating {}", tmp.display()))?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    fn carry_over(&self, old: &str) {
        for line in old.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            // A run that did not complete keeps the previous run's time: 0 would read as
            // "never", and CniLedgerGcNotRunning would fire 30 minutes early.
            if series == "cni_ledger_gc_last_success_timestamp_seconds" {
                if self.gc_last_success.get() == 0.0 && value > 0.0 && value.is_finite() {
                    self.gc_last_success.set(value);
                }
                continue;
            }
            let Some((name, labels)) = series.split_once('{') else {
                continue;
            };
            if !COUNTERS.contains(&name) {
                continue;
            }
            // Our own labels: one, `key="value"` with a plain value.
            let Some(label) = labels
                .strip_suffix('}')
                .and_then(|l| l.split_once("=\""))
                .and_then(|(_, v)| v.strip_suffix('"'))
            else {
                continue;
            };
            let family = match name {
                "cni_ledger_replays_total" => &self.replays,
                "cni_ledger_gc_runs_total" => &self.gc_runs,
                _ => &self.cri_unanswered,
            };
            if value >= 0.0 && value.is_finite() {
                family.with_label_values(&[label]).inc_by(value as u64);
            }
        }
    }
}

/// Every series name the agent and `gc --metrics-file` can export (see `series_names`).
pub fn metric_names() -> Vec<String> {
    Metrics::new().series_names()
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_carry_over_from_the_previous_file() {
        let m = Metrics::new();
        m.observe_gc(&Report::default(), 0.5);
        let first = m.encode();
        assert!(
            first.contains("cni_ledger_gc_runs_total{result=\"ok\"} 1"),
            "{first}"
        );
        let m2 = Metrics::new();
        m2.observe_gc(&Report::default(), 0.5);
        m2.carry_over(&first);
        assert!(m2
            .encode()
            .contains("cni_ledger_gc_runs_total{result=\"ok\"} 2"));
        assert!(m2
            .encode()
            .contains("# TYPE cni_ledger_replays_total counter"));
    }

    #[test]
    fn a_failed_run_keeps_the_previous_files_last_success() {
        let m = Metrics::new();
        assert!(m
            .encode()
            .contains("cni_ledger_gc_last_success_timestamp_seconds 0"));
        let before = "cni_ledger_gc_last_success_timestamp_seconds 1700000000\n";
        m.observe_gc_error(0.1);
        m.carry_over(before);
        assert!(
            m.encode()
                .contains("cni_ledger_gc_last_success_timestamp_seconds 1700000000"),
            "{}",
            m.encode()
        );
        // A run that completed says when it did.
        let m = Metrics::new();
        m.observe_gc(&Report::default(), 0.1);
        m.carry_over(before);
        assert!(m.gc_last_success.get() > 1.7e9 + 1.0, "{}", m.encode());
    }

    #[test]
    fn a_kept_chains_series_start_at_zero_so_a_rate_sees_its_first_add() {
        let m = Metrics::new();
        m.zero_chain_series("net1");
        let text = m.encode();
        for series in [
            "cni_ledger_chain_add_duration_seconds_count{network=\"net1\"} 0",
            "cni_ledger_chain_add_duration_seconds_bucket{network=\"net1\",le=\"5\"} 0",
            "cni_ledger_chain_del_duration_seconds_count{network=\"net1\"} 0",
            "cni_ledger_chain_adds_total{network=\"net1\",result=\"ok\"} 0",
            "cni_ledger_chain_adds_total{network=\"net1\",result=\"failed-left\"} 0",
            "cni_ledger_chain_adds_total{network=\"net1\",result=\"failed-torn-down\"} 0",
        ] {
            assert!(text.contains(series), "{series}:\n{text}");
        }
        // Again (every reconcile pass) changes nothing observed since.
        m.chain_adds.with_label_values(&["net1", CHAIN_OK]).inc();
        m.zero_chain_series("net1");
        assert!(m
            .encode()
            .contains("cni_ledger_chain_adds_total{network=\"net1\",result=\"ok\"} 1"));
    }

    #[test]
    fn a_refused_runtime_and_unreadable_records_show() {
        let m = Metrics::new();
        let mut r = Report::default();
        m.observe_gc(&r, 0.1);
        let text = m.encode();
        assert!(text.contains("cni_ledger_cri_refused 0"), "{text}");
        assert!(text.contains("cni_ledger_unreadable_records 0"), "{text}");
        r.cri_refused = Some("why".into());
        r.summary.unreadable = 2;
        m.observe_gc(&r, 0.1);
        let text = m.encode();
        assert!(text.contains("cni_ledger_cri_refused 1"), "{text}");
        assert!(text.contains("cni_ledger_unreadable_records 2"), "{text}");
    }

    #[test]
    fn gc_counts_records_and_failed_left_ones_in_one_pass() {
        let l = crate::ledger::tests::tmp_ledger("metrics-one-pass");
        // Of another boot and days old: a tail that never came is failed-left.
        let mut left = crate::ledger::record::sample();
        left.tail = true;
        l.write(&left).unwrap();
        let mut plain = crate::ledger::record::sample();
        plain.container_id = "def".into();
        l.write(&plain).unwrap();
        let m = Metrics::new();
        m.observe_ledger(&l);
        let text = m.encode();
        assert!(
            text.contains("cni_ledger_records{network=\"net1\"} 2"),
            "{text}"
        );
        assert!(
            !text.contains("cni_ledger_chain_failed_left_records{"),
            "{text}"
        );
        m.observe_ledger_and_failed_left(&l, 900);
        let text = m.encode();
        assert!(
            text.contains("cni_ledger_records{network=\"net1\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("cni_ledger_chain_failed_left_records{network=\"net1\"} 1"),
            "{text}"
        );
        l.remove(&left.key().stem()).unwrap();
        m.observe_ledger_and_failed_left(&l, 900);
        let text = m.encode();
        assert!(
            !text.contains("cni_ledger_chain_failed_left_records{"),
            "{text}"
        );
    }

    #[test]
    fn cri_answers_and_the_unanswered_count() {
        let m = Metrics::new();
        let ep = "unix:///run/containerd/containerd.sock";
        let answer = |sandboxes| crate::cri::Answer {
            endpoint: ep.into(),
            sandboxes,
        };
        m.observe_cri(&[answer(None)]);
        let first = m.encode();
        assert!(first.contains(&format!("cni_ledger_cri_up{{endpoint=\"{ep}\"}} 0")));
        assert!(first.contains(&format!(
            "cni_ledger_cri_unanswered_total{{endpoint=\"{ep}\"}} 1"
        )));
        let m2 = Metrics::new();
        m2.observe_cri(&[answer(Some(3))]);
        m2.carry_over(&first);
        let text = m2.encode();
        assert!(
            text.contains(&format!("cni_ledger_cri_up{{endpoint=\"{ep}\"}} 1")),
            "{text}"
        );
        assert!(text.contains(&format!("cni_ledger_cri_sandboxes{{endpoint=\"{ep}\"}} 3")));
        assert!(
            text.contains(&format!(
                "cni_ledger_cri_unanswered_total{{endpoint=\"{ep}\"}} 1"
            )),
            "carried over from the previous file: {text}"
        );
    }

    #[test]
    fn every_family_is_named_even_before_its_first_series() {
        let names = Metrics::new().series_names();
        for n in [
            "cni_ledger_replays_total",
            "cni_ledger_failed_records",
            "cni_ledger_chain_adds_total",
            "cni_ledger_address_headroom_ratio",
            "cni_ledger_chain_add_duration_seconds_bucket",
            "cni_ledger_chain_add_duration_seconds_sum",
            "cni_ledger_chain_del_duration_seconds_count",
        ] {
            assert!(names.iter().any(|x| x == n), "{n} not in {names:?}");
        }
        assert!(!names
            .iter()
            .any(|x| x == "cni_ledger_chain_add_duration_seconds"));
    }

    #[test]
    fn headroom_series_follow_the_ranges_configured() {
        let m = Metrics::new();
        let usage = |range: &str, used| headroom::Usage {
            network: "pods".into(),
            range: range.into(),
            used,
            size: 20,
        };
        m.observe_headroom(&[usage("10.0.0.1-10.0.0.20", 19), usage("b", 0)]);
        let text = m.encode();
        assert!(
            text.contains(
                "cni_ledger_address_headroom_ratio{network=\"pods\",range=\"10.0.0.1-10.0.0.20\"} 0.05"
            ),
            "{text}"
        );
        assert!(text.contains("cni_ledger_addresses_size{network=\"pods\",range=\"b\"} 20"));
        m.observe_headroom(&[usage("b", 1)]);
        assert!(
            !m.encode().contains("10.0.0.1-10.0.0.20"),
            "a range removed leaves no series"
        );
    }
}
