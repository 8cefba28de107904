//! The chain's metrics, from the ledger's `records/` directory as it changes (inotify),
//! never by polling every record (docs/ALERTS.md, the chain's spec):
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

use super::{Liveness, Stop};
use crate::ledger::Ledger;
use crate::metrics::chain::{boot_ns, list, read_view, Now, View};
use crate::metrics::{Metrics, CHAIN_FAILED_LEFT, CHAIN_FAILED_TORN_DOWN, CHAIN_OK};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use crate::metrics::chain::DEFAULT_LEFT_AFTER_SECS;
/// How often the failed-left pass runs at most (more often for a shorter
/// `--chain-left-after`: the pass need not be finer than the threshold, nor coarser).
const SWEEP: Duration = Duration::from_secs(30);
/// How often an unarmed watch (no `records/` yet) is tried again.
const REARM: Duration = Duration::from_secs(1);

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

/// What a drain found besides the events it handed on.
#[derive(Debug, PartialEq, Eq)]
pub enum Drained {
    Done,
    /// Events were lost (queue overflow): a resync is due.
    Overflow,
    /// The directory was removed or moved: the watch must be armed again.
    Lost,
}

/// Why a directory could not be watched (yet: `records/` is made by the first ADD).
#[derive(Debug)]
pub struct ArmError(PathBuf, std::io::Error);

impl std::fmt::Display for ArmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot watch {}: {}", self.0.display(), self.1)
    }
}

/// An inotify watch of the ledger's `records/` and `notes/`.
pub struct Watch {
    inotify: Inotify,
    notes: WatchDescriptor,
}

impl Watch {
    /// Watches `records/`, and `notes/` (made here if no tail has written yet: a watch
    /// needs the directory).
    pub fn arm(ledger: &Ledger) -> Result<Watch, ArmError> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| ArmError(ledger.records_dir(), e.into()))?;
        let gone_self =
            AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF | AddWatchFlags::IN_ONLYDIR;
        let written = AddWatchFlags::IN_CLOSE_WRITE | AddWatchFlags::IN_MOVED_TO;
        let records = ledger.records_dir();
        inotify
            .add_watch(
                &records,
                written | AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM | gone_self,
            )
            .map_err(|e| ArmError(records, e.into()))?;
        let notes = ledger.notes_dir();
        ledger
            .make_notes_dir()
            .map_err(|e| ArmError(notes.clone(), e))?;
        // A note's removal says nothing: the record's removal is the DEL's end.
        let notes = inotify
            .add_watch(&notes, written | gone_self)
            .map_err(|e| ArmError(notes, e.into()))?;
        Ok(Watch { inotify, notes })
    }

    /// Hands pending events to `tracker`.
    pub fn drain(&self, tracker: &mut Tracker) -> Drained {
        let mut overflow = false;
        loop {
            let events = match self.inotify.read_events() {
                Ok(ev) if !ev.is_empty() => ev,
                _ if overflow => return Drained::Overflow,
                _ => return Drained::Done,
            };
            let at = boot_ns();
            for ev in events {
                if ev.mask.intersects(
                    AddWatchFlags::IN_IGNORED
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF,
                ) {
                    return Drained::Lost;
                }
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    overflow = true;
                    continue;
                }
                let Some(name) = ev.name.as_ref().and_then(|n| n.to_str()) else {
                    continue;
                };
                let Some(stem) = Ledger::record_stem(name) else {
                    continue;
                };
                if ev.wd != self.notes
                    && ev
                        .mask
                        .intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM)
                {
                    tracker.removed(stem, at);
                } else {
                    tracker.written(stem);
                }
            }
        }
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inotify.as_fd()
    }
}

/// The watcher thread: until `stop`, events as they come, the failed-left pass every
/// `SWEEP`.
pub fn run(
    ledger_dir: &Path,
    metrics: &Metrics,
    left_after_secs: u64,
    stop: &Stop,
    liveness: &Liveness,
) {
    let ledger = Ledger::at(ledger_dir);
    let records = ledger.records_dir();
    let mut tracker = Tracker::new(ledger.clone(), metrics, left_after_secs);
    let mut watch: Option<Watch> = None;
    let mut warned = false;
    // A listing at start only learns: what completed before the agent watched is not
    // its to count. Any later one (records/ made after the start, a watch re-armed)
    // also counts.
    let mut observe = false;
    let mut next_sweep = Instant::now();
    loop {
        liveness.beat(&liveness.chain);
        if watch.is_none() {
            match Watch::arm(&ledger) {
                Ok(w) => {
                    // Armed before listing: nothing written in between is missed.
                    tracker.resync(observe);
                    observe = true;
                    crate::debug!(
                        "agent: watching {} ({} records)",
                        records.display(),
                        tracker.len()
                    );
                    watch = Some(w);
                }
                Err(e) if !warned => {
                    observe = true;
                    crate::info!("agent: {e}; chain metrics start once it exists");
                    warned = true;
                }
                Err(_) => observe = true,
            }
        }
        if Instant::now() >= next_sweep {
            tracker.sweep(&Now::read());
            next_sweep = Instant::now() + SWEEP.min(Duration::from_secs(left_after_secs.max(1)));
        }
        let wait = next_sweep.saturating_duration_since(Instant::now());
        let wait = if watch.is_none() {
            wait.min(REARM)
        } else {
            wait
        };
        let timeout = PollTimeout::try_from(wait.as_millis().min(60_000) as i32 + 1)
            .unwrap_or(PollTimeout::MAX);
        let mut fds = vec![PollFd::new(stop.fd(), PollFlags::POLLIN)];
        if let Some(w) = &watch {
            fds.push(PollFd::new(w.as_fd(), PollFlags::POLLIN));
        }
        let _ = nix::poll::poll(&mut fds, timeout);
        if stop.requested() {
            return;
        }
        let event = fds
            .get(1)
            .and_then(|f| f.revents())
            .is_some_and(|r| r.contains(PollFlags::POLLIN));
        if !event {
            continue;
        }
        let drained = watch.as_ref().map(|w| w.drain(&mut tracker));
        match drained {
            Some(Drained::Overflow) => {
                crate::warn!(
                    "agent: inotify queue overflow on {}; listing it again",
                    records.display()
                );
                tracker.resync(true);
            }
            Some(Drained::Lost) => {
                crate::warn!(
                    "agent: {} was removed or moved; watching it again",
                    records.display()
                );
                watch = None;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::tests::tmp_ledger;
    use serde_json::{json, Value};

    /// A record as the head writes it, with the chain's fields the spec adds, written
    /// the ledger's way (checksummed envelope, temp + fsync + rename).
    fn write(l: &Ledger, cid: &str, add_id: &str, extra: Value) -> String {
        let mut rec = crate::ledger::record::sample();
        rec.container_id = cid.into();
        rec.add_id = add_id.into();
        rec.boot_id = crate::sandbox::boot_id().unwrap();
        rec.created_at = crate::time::rfc3339(crate::time::now());
        let mut v = serde_json::to_value(&rec).unwrap();
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        let body = serde_json::to_string(&v).unwrap();
        let bytes = format!(
            "{{\"format\":1,\"sha256\":\"{}\",\"record\":{body}}}\n",
            crate::ledger::record::sha256_hex(body.as_bytes())
        );
        let stem = rec.key().stem();
        let path = l.record_path(&stem);
        crate::ledger::fsio::write_atomic(
            &l.records_dir(),
            &path.file_name().unwrap().to_string_lossy(),
            bytes.as_bytes(),
            "record",
        )
        .unwrap();
        stem
    }

    /// Waits up to 1 s for events and hands them to `t`.
    fn drain(w: &Watch, t: &mut Tracker) {
        let mut fds = [PollFd::new(w.as_fd(), PollFlags::POLLIN)];
        let _ = nix::poll::poll(&mut fds, PollTimeout::from(1000u16));
        assert_eq!(w.drain(t), Drained::Done);
    }

    fn adds(m: &Metrics, result: &str) -> u64 {
        m.chain_adds.with_label_values(&["net1", result]).get()
    }

    #[test]
    fn a_completion_is_observed_once_per_add() {
        let l = tmp_ledger("once");
        let m = Metrics::new();
        let mut t = Tracker::new(l.clone(), &m, DEFAULT_LEFT_AFTER_SECS);
        let start = boot_ns().unwrap();
        let stem = write(
            &l,
            "c1",
            "a1",
            json!({"tail": true, "createdBootNs": start}),
        );
        t.written(&stem);
        assert_eq!(adds(&m, CHAIN_OK), 0);
        let done = json!({"tail": true, "createdBootNs": start, "chain": {
            "completedAt": "2026-12-04T15:00:00Z", "completedBootNs": start + 250_000_000,
            "addSeconds": 0.25, "result": {"cniVersion": "1.0.0"}}});
        write(&l, "c1", "a1", done.clone());
        t.written(&stem);
        // gc's bookkeeping rewrites the record: not a second ADD.
        let mut again = done.clone();
        again["gc"] = json!({"attempts": 1, "failed": false});
        write(&l, "c1", "a1", again);
        t.written(&stem);
        assert_eq!(adds(&m, CHAIN_OK), 1);
        let h = m.chain_add_duration.with_label_values(&["net1"]);
        assert_eq!(h.get_sample_count(), 1);
        assert!((h.get_sample_sum() - 0.25).abs() < 1e-9);
        // A new ADD of the same key (new addId) is another.
        write(&l, "c1", "a2", done);
        t.written(&stem);
        assert_eq!(adds(&m, CHAIN_OK), 2);
        // Without addSeconds, from the two stamps.
        let stem2 = write(
            &l,
            "c2",
            "b1",
            json!({"tail": true, "createdBootNs": 1_000_000_000u64,
            "chain": {"completedBootNs": 3_500_000_000u64}}),
        );
        t.written(&stem2);
        assert!((h.get_sample_sum() - 0.5 - 2.5).abs() < 1e-9);
    }

    #[test]
    fn removed_uncompleted_is_torn_down_with_its_del_time_and_untracked_counts_nothing() {
        let l = tmp_ledger("torn");
        let m = Metrics::new();
        let mut t = Tracker::new(l.clone(), &m, DEFAULT_LEFT_AFTER_SECS);
        let began = boot_ns().unwrap();
        let stem = write(
            &l,
            "c1",
            "a1",
            json!({"tail": true, "createdBootNs": began,
            "chain": {"delBeganAt": "2026-12-04T15:00:00Z", "delBeganBootNs": began}}),
        );
        t.written(&stem);
        let plain = write(&l, "c2", "a2", json!({}));
        t.written(&plain);
        assert_eq!(t.len(), 2);
        l.remove(&stem).unwrap();
        t.removed(&stem, Some(began + 1_500_000_000));
        l.remove(&plain).unwrap();
        t.removed(&plain, Some(began + 1));
        assert_eq!(adds(&m, CHAIN_FAILED_TORN_DOWN), 1);
        let h = m.chain_del_duration.with_label_values(&["net1"]);
        assert_eq!(
            h.get_sample_count(),
            1,
            "only the tail's record has a DEL time"
        );
        assert!((h.get_sample_sum() - 1.5).abs() < 1e-9);
        assert!(t.is_empty());
    }

    #[test]
    fn left_behind_is_counted_once_and_not_again_when_its_del_comes() {
        let l = tmp_ledger("left");
        let m = Metrics::new();
        let mut t = Tracker::new(l.clone(), &m, 60);
        let now = boot_ns().unwrap();
        let old = write(
            &l,
            "c1",
            "a1",
            json!({"tail": true,
            "createdBootNs": now.saturating_sub(120_000_000_000)}),
        );
        let young = write(&l, "c2", "a2", json!({"tail": true, "createdBootNs": now}));
        let begun = write(
            &l,
            "c3",
            "a3",
            json!({"tail": true,
            "createdBootNs": now.saturating_sub(120_000_000_000),
            "chain": {"delBeganBootNs": now}}),
        );
        t.resync(false);
        assert_eq!(t.len(), 3);
        t.sweep(&Now::read());
        t.sweep(&Now::read());
        assert_eq!(adds(&m, CHAIN_FAILED_LEFT), 1);
        assert_eq!(m.chain_failed_left.with_label_values(&["net1"]).get(), 1);
        assert_eq!(
            crate::metrics::chain::failed_left_by_network(&l, 60).get("net1"),
            Some(&1)
        );
        l.remove(&old).unwrap();
        t.removed(&old, boot_ns());
        assert_eq!(
            adds(&m, CHAIN_FAILED_TORN_DOWN),
            0,
            "counted once, as failed-left"
        );
        t.sweep(&Now::read());
        assert!(!m.encode().contains("cni_ledger_chain_failed_left_records{"));
        let _ = (young, begun);
    }

    #[test]
    fn events_drive_it_and_a_resync_makes_up_for_missed_ones() {
        let l = tmp_ledger("inotify");
        let m = Metrics::new();
        let mut t = Tracker::new(l.clone(), &m, DEFAULT_LEFT_AFTER_SECS);
        let w = Watch::arm(&l).unwrap();
        t.resync(false);
        // Stamps in the past: a DEL's duration is measured up to its removal's event.
        let start = boot_ns().unwrap() - 30_000_000;
        let stem = write(
            &l,
            "c1",
            "a1",
            json!({"tail": true, "createdBootNs": start,
            "chain": {"completedBootNs": start + 10_000_000, "addSeconds": 0.01,
                "delBeganBootNs": start + 20_000_000}}),
        );
        let pending = write(
            &l,
            "c2",
            "a2",
            json!({"tail": true, "createdBootNs": start}),
        );
        drain(&w, &mut t);
        assert_eq!(adds(&m, CHAIN_OK), 1);
        l.remove(&stem).unwrap();
        l.remove(&pending).unwrap();
        drain(&w, &mut t);
        assert_eq!(adds(&m, CHAIN_FAILED_TORN_DOWN), 1);
        assert_eq!(
            m.chain_del_duration
                .with_label_values(&["net1"])
                .get_sample_count(),
            1
        );
        assert!(t.is_empty());
        // Events lost: a record completed and one removed meanwhile.
        let gone = write(
            &l,
            "c3",
            "a3",
            json!({"tail": true, "createdBootNs": start}),
        );
        t.written(&gone);
        l.remove(&gone).unwrap();
        write(
            &l,
            "c4",
            "a4",
            json!({"tail": true, "chain": {"completedBootNs": 5, "addSeconds": 2.0}}),
        );
        t.resync(true);
        assert_eq!(adds(&m, CHAIN_OK), 2);
        assert_eq!(adds(&m, CHAIN_FAILED_TORN_DOWN), 2);
    }

    #[test]
    fn the_tails_notes_are_watched_beside_the_records() {
        let l = tmp_ledger("notes");
        let m = Metrics::new();
        let mut t = Tracker::new(l.clone(), &m, DEFAULT_LEFT_AFTER_SECS);
        let w = Watch::arm(&l).unwrap();
        t.resync(false);
        let start = boot_ns().unwrap() - 30_000_000;
        let stem = write(
            &l,
            "c1",
            "a1",
            json!({"tail": true, "createdBootNs": start}),
        );
        drain(&w, &mut t);
        assert_eq!(adds(&m, CHAIN_OK), 0, "the head's record alone is pending");
        let Some(crate::ledger::Decoded::Ok(rec)) = l.read(&stem).unwrap() else {
            panic!("no record")
        };
        let mut chain = crate::ledger::record::ChainNote {
            completed_boot_ns: Some(start + 10_000_000),
            ..Default::default()
        };
        l.put_note(&rec, &chain).unwrap();
        drain(&w, &mut t);
        assert_eq!(adds(&m, CHAIN_OK), 1, "the tail's note completes it");
        let add = m.chain_add_duration.with_label_values(&["net1"]);
        assert_eq!(add.get_sample_count(), 1);
        assert!((add.get_sample_sum() - 0.01).abs() < 1e-9);
        chain.del_began_boot_ns = Some(start + 20_000_000);
        l.put_note(&rec, &chain).unwrap();
        drain(&w, &mut t);
        // The record goes, then its note: one DEL measured from the note's start.
        l.remove(&stem).unwrap();
        drain(&w, &mut t);
        assert!(t.is_empty());
        assert_eq!(adds(&m, CHAIN_OK), 1);
        assert_eq!(adds(&m, CHAIN_FAILED_TORN_DOWN), 0);
        let del = m.chain_del_duration.with_label_values(&["net1"]);
        assert_eq!(del.get_sample_count(), 1);
        assert!(del.get_sample_sum() >= 0.01, "{}", del.get_sample_sum());
    }

    /// A DEL landing on an ADD in the chain retires its record; the tail restores and
    /// completes it: one `ok`, never `failed-torn-down` too. A retired record gc then
    /// replays and drops is torn down, counted once by the next pass.
    #[test]
    fn a_retired_record_is_not_torn_down_until_it_is_dropped() {
        let l = tmp_ledger("retired");
        let m = Metrics::new();
        let mut t = Tracker::new(l.clone(), &m, DEFAULT_LEFT_AFTER_SECS);
        let w = Watch::arm(&l).unwrap();
        t.resync(false);
        let start = boot_ns().unwrap() - 30_000_000;
        let pending = json!({"tail": true, "createdBootNs": start});
        let stem = write(&l, "c1", "a1", pending.clone());
        drain(&w, &mut t);
        let lock = l.lock(&stem, crate::ledger::Wait::No).unwrap().unwrap();
        l.retire(&lock, &stem).unwrap();
        drain(&w, &mut t);
        assert_eq!(
            adds(&m, CHAIN_FAILED_TORN_DOWN),
            0,
            "retired is not torn down"
        );
        // The tail's restore, then its note.
        l.restore_retired(&lock, &stem).unwrap();
        drop(lock);
        drain(&w, &mut t);
        let Some(crate::ledger::Decoded::Ok(rec)) = l.read(&stem).unwrap() else {
            panic!("no record")
        };
        let chain = crate::ledger::record::ChainNote {
            completed_boot_ns: Some(start + 10_000_000),
            ..Default::default()
        };
        l.put_note(&rec, &chain).unwrap();
        drain(&w, &mut t);
        t.sweep(&Now::read());
        assert_eq!(adds(&m, CHAIN_OK), 1);
        assert_eq!(adds(&m, CHAIN_FAILED_TORN_DOWN), 0);

        // Retired, restored and completed before the watcher reads the retire's event.
        let quick = write(&l, "c3", "a3", pending.clone());
        drain(&w, &mut t);
        let lock = l.lock(&quick, crate::ledger::Wait::No).unwrap().unwrap();
        l.retire(&lock, &quick).unwrap();
        l.restore_retired(&lock, &quick).unwrap();
        drop(lock);
        let Some(crate::ledger::Decoded::Ok(rec)) = l.read(&quick).unwrap() else {
            panic!("no record")
        };
        l.put_note(&rec, &chain).unwrap();
        drain(&w, &mut t);
        assert_eq!(adds(&m, CHAIN_OK), 2);
        assert_eq!(adds(&m, CHAIN_FAILED_TORN_DOWN), 0);

        // Retired, and its ADD never completes: gc replays and drops it.
        let lost = write(&l, "c2", "a2", pending);
        drain(&w, &mut t);
        let lock = l.lock(&lost, crate::ledger::Wait::No).unwrap().unwrap();
        l.retire(&lock, &lost).unwrap();
        drain(&w, &mut t);
        t.sweep(&Now::read());
        assert_eq!(adds(&m, CHAIN_FAILED_TORN_DOWN), 0, "still retired");
        assert!(l.drop_retired(&lost).unwrap());
        drop(lock);
        t.sweep(&Now::read());
        t.sweep(&Now::read());
        assert_eq!(adds(&m, CHAIN_FAILED_TORN_DOWN), 1);
        assert_eq!(adds(&m, CHAIN_OK), 2);
    }

    /// A retired record whose ADD can no longer complete (older than `left_after`) is
    /// torn down by the next pass, once, with its DEL timed at the retire.
    #[test]
    fn a_retired_record_too_old_to_complete_is_torn_down() {
        let l = tmp_ledger("retired-old");
        let m = Metrics::new();
        let mut t = Tracker::new(l.clone(), &m, 1);
        let w = Watch::arm(&l).unwrap();
        t.resync(false);
        let now = boot_ns().unwrap();
        let stem = write(
            &l,
            "c1",
            "a1",
            json!({"tail": true, "createdBootNs": now,
                "chain": {"delBeganBootNs": now}}),
        );
        drain(&w, &mut t);
        let lock = l.lock(&stem, crate::ledger::Wait::No).unwrap().unwrap();
        l.retire(&lock, &stem).unwrap();
        drain(&w, &mut t);
        let del = m.chain_del_duration.with_label_values(&["net1"]);
        assert_eq!(del.get_sample_count(), 1, "the DEL is over at the retire");
        t.sweep(&Now::read());
        assert_eq!(adds(&m, CHAIN_FAILED_TORN_DOWN), 0, "young: may complete");
        std::thread::sleep(Duration::from_millis(1100));
        t.sweep(&Now::read());
        t.sweep(&Now::read());
        assert_eq!(adds(&m, CHAIN_FAILED_TORN_DOWN), 1);
        assert_eq!(del.get_sample_count(), 1);
    }
}
