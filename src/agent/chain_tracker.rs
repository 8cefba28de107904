//! What the chain's metrics make of the ledger's records as the watch (chain_watch.rs)
//! reports them (docs/ALERTS.md, the chain's spec):
//!
//! - a record or the tail's note on it written (`IN_CLOSE_WRITE`, `IN_MOVED_TO`: the
//!   ledger writes by rename; notes in `notes/`, watched beside `records/`) is read once
//!   with its note; the first time its ADD shows completed by the tail (`chain.completedBootNs`)
//!   its duration is observed in `cni_ledger_chain_add_duration_seconds` and counted
//!   `ok`, once per key and ADD (`addId`);
//! - a record removed (`IN_DELETE`, `IN_MOVED_FROM`) that had `tail: true` and never
//!   completed is counted `failed-torn-down` (its DEL came: the runtime's, or gc's
//!   replay); if the tail noted DEL's start (`chain.delBeganBootNs`), the time from then
//!   to now is observed in `cni_ledger_chain_del_duration_seconds`; a record retired
//!   instead (to `retired/`: a DEL or GC while its ADD was in the chain) is held aside,
//!   taken back when its tail restores it, and counted torn down only once its ADD can
//!   no longer complete (older than `--chain-left-after`) or gc has dropped it (the
//!   periodic pass);
//! - a periodic pass over what the watcher remembers (no file read) classifies records
//!   with `tail: true`, never completed, no DEL begun and older than `--chain-left-after`
//!   as `failed-left`: counted once each, and their number now in
//!   `cni_ledger_chain_failed_left_records`.
//!
//! Memory: a few short strings per record in the ledger (one per attachment on the
//! node), dropped with the record. Missed events (queue overflow, a watch re-armed) are
//! made up by listing the directory again: records completed meanwhile are observed
//! then, removals found then are counted without a DEL duration.

use crate::ledger::Ledger;
use crate::metrics::chain::{list, read_view, Now, View};
use crate::metrics::{Metrics, CHAIN_FAILED_LEFT, CHAIN_FAILED_TORN_DOWN, CHAIN_OK};
use std::collections::{BTreeMap, HashMap};

/// What the watcher remembers of a record.
struct Known {
    view: View,
    /// Already counted failed-left: not counted again when its DEL comes.
    counted_left: bool,
}

/// The watcher's memory and the metrics it feeds.
pub struct Tracker<'a> {
    ledger: Ledger,
    metrics: &'a Metrics,
    left_after_secs: u64,
    known: HashMap<String, Known>,
    /// Records moved out of `records/` by a retire (a DEL or GC while their ADD was in
    /// the chain): not torn down yet. The tail's restore brings one back under the same
    /// ADD; one gone from `retired/` too (gc replayed it) was torn down after all.
    retired: HashMap<String, Known>,
}

impl<'a> Tracker<'a> {
    pub fn new(ledger: Ledger, metrics: &'a Metrics, left_after_secs: u64) -> Tracker<'a> {
        Tracker {
            ledger,
            metrics,
            left_after_secs,
            known: HashMap::new(),
            retired: HashMap::new(),
        }
    }

    /// Lists `records/` and takes what changed since the watcher last knew: at start
    /// (`observe` false: what completed before the agent watched is not this process's
    /// to count) and after missed events.
    pub fn resync(&mut self, observe: bool) {
        let listed: HashMap<String, View> = list(&self.ledger).into_iter().collect();
        let gone: Vec<String> = self
            .known
            .keys()
            .filter(|k| !listed.contains_key(*k))
            .cloned()
            .collect();
        for stem in gone {
            self.removed(&stem, None);
        }
        for (stem, v) in listed {
            if observe {
                self.take(stem, v);
            } else {
                self.known.insert(
                    stem,
                    Known {
                        view: v,
                        counted_left: false,
                    },
                );
            }
        }
    }

    /// A record file was written: read it and count its completion, once.
    pub fn written(&mut self, stem: &str) {
        // None: gone again already, or not a record we can read; its removal (if
        // any) comes as its own event.
        if let Some(v) = read_view(&self.ledger, stem) {
            self.take(stem.to_string(), v);
        }
    }

    fn take(&mut self, stem: String, v: View) {
        if let Some(k) = self.retired.remove(&stem) {
            if k.view.add_id == v.add_id {
                // Restored by its tail: the same ADD, counted once when it completes.
                self.known.entry(stem.clone()).or_insert(k);
            } else {
                // A new ADD of the key: the retired one's record is gone for good.
                self.torn_down(&k);
            }
        }
        let prev = self.known.get(&stem);
        let same_add = prev.is_some_and(|p| p.view.add_id == v.add_id);
        let was_completed = same_add && prev.is_some_and(|p| p.view.completed());
        let counted_left = same_add && prev.is_some_and(|p| p.counted_left);
        if v.completed() && !was_completed {
            if let Some(secs) = v.add_seconds() {
                self.metrics
                    .chain_add_duration
                    .with_label_values(&[v.network.as_str()])
                    .observe(secs);
            }
            self.metrics
                .chain_adds
                .with_label_values(&[v.network.as_str(), CHAIN_OK])
                .inc();
        }
        self.known.insert(
            stem,
            Known {
                view: v,
                counted_left,
            },
        );
    }

    /// A record file was removed; `at_boot_ns` is when (None: found by a resync, time
    /// unknown).
    pub fn removed(&mut self, stem: &str, at_boot_ns: Option<u64>) {
        let Some(k) = self.known.remove(stem) else {
            return;
        };
        // The DEL (or GC) is over either way: its time is known now.
        self.del_ended(&k.view, at_boot_ns);
        // Retired, not removed (or already restored by the time this event is read):
        // its ADD may still complete, so its outcome waits (`take`, `sweep`).
        if self.is_retired(stem) || self.ledger.has_record_file(stem) {
            self.retired.insert(stem.to_string(), k);
            return;
        }
        self.torn_down(&k);
    }

    fn is_retired(&self, stem: &str) -> bool {
        std::fs::symlink_metadata(self.ledger.retired_path(stem)).is_ok()
    }

    /// A record of a chain with a tail that went away: counted torn down unless it
    /// completed or was counted left.
    fn torn_down(&self, k: &Known) {
        let v = &k.view;
        if v.tail && !v.completed() && !k.counted_left {
            self.metrics
                .chain_adds
                .with_label_values(&[v.network.as_str(), CHAIN_FAILED_TORN_DOWN])
                .inc();
        }
    }

    /// A DEL's end, timed when both ends are known.
    fn del_ended(&self, v: &View, at_boot_ns: Option<u64>) {
        if !v.tail {
            return;
        }
        let net = [v.network.as_str()];
        if let (Some(began), Some(at)) = (v.del_began_boot_ns(), at_boot_ns) {
            if let Some(ns) = at.checked_sub(began) {
                self.metrics
                    .chain_del_duration
                    .with_label_values(&net)
                    .observe(ns as f64 / 1e9);
            }
        }
    }

    /// The failed-left pass over what is remembered: counts each record once and sets
    /// the number left behind now, per network.
    pub fn sweep(&mut self, now: &Now) {
        // Retired records whose ADD can no longer complete (too old, as gc and DEL judge
        // it), or that gc has replayed and dropped: torn down after all. One restored
        // meanwhile waits for its event (`take`). One stat each: few are ever retired.
        let over: Vec<String> = self
            .retired
            .iter()
            .filter(|(s, k)| {
                if self.is_retired(s) {
                    !k.view.may_complete(now, self.left_after_secs)
                } else {
                    !self.ledger.has_record_file(s)
                }
            })
            .map(|(s, _)| s.clone())
            .collect();
        for stem in over {
            if let Some(k) = self.retired.remove(&stem) {
                self.torn_down(&k);
            }
        }
        let mut now_left: BTreeMap<String, i64> = BTreeMap::new();
        for k in self.known.values_mut() {
            if !k.view.failed_left(now, self.left_after_secs) {
                continue;
            }
            *now_left.entry(k.view.network.clone()).or_default() += 1;
            if !k.counted_left {
                k.counted_left = true;
                self.metrics
                    .chain_adds
                    .with_label_values(&[k.view.network.as_str(), CHAIN_FAILED_LEFT])
                    .inc();
            }
        }
        self.metrics.chain_failed_left.reset();
        for (net, n) in now_left {
            self.metrics
                .chain_failed_left
                .with_label_values(&[net.as_str()])
                .set(n);
        }
    }

    /// Records remembered (for tests and the log).
    pub fn len(&self) -> usize {
        self.known.len()
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
    }
}
