//! The chain's metrics, from the ledger's `records/` directory as it changes (inotify),
//! never by polling every record (docs/ALERTS.md, the chain's spec): this file is the
//! watch and the thread that runs it; what each event means for the metrics is the
//! tracker's (chain_tracker.rs). A record or note written (`IN_CLOSE_WRITE`,
//! `IN_MOVED_TO`: the ledger writes by rename; notes in `notes/`, watched beside
//! `records/`) or a record removed (`IN_DELETE`, `IN_MOVED_FROM`) is handed to the
//! tracker; the failed-left pass runs periodically.
//!
//! Missed events (queue overflow, a watch re-armed) are made up by listing the
//! directory again: records completed meanwhile are observed then, removals found then
//! are counted without a DEL duration.

pub use super::chain_tracker::Tracker;
use super::{Stop, ThreadHealth};
use crate::ledger::Ledger;
use crate::metrics::chain::{boot_ns, Now};
use crate::metrics::Metrics;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use crate::metrics::chain::DEFAULT_LEFT_AFTER_SECS;
/// How often the failed-left pass runs at most (more often for a shorter
/// `--chain-left-after`: the pass need not be finer than the threshold, nor coarser).
const SWEEP: Duration = Duration::from_secs(30);
/// How often an unarmed watch (no `records/` yet) is tried again.
const REARM: Duration = Duration::from_secs(1);

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
pub struct LedgerWatch {
    inotify: Inotify,
    notes: WatchDescriptor,
}

impl LedgerWatch {
    /// Watches `records/`, and `notes/` (made here if no tail has written yet: a watch
    /// needs the directory).
    pub fn arm(ledger: &Ledger) -> Result<LedgerWatch, ArmError> {
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
        Ok(LedgerWatch { inotify, notes })
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
    health: &ThreadHealth,
) {
    let ledger = Ledger::at(ledger_dir);
    let records = ledger.records_dir();
    let mut tracker = Tracker::new(ledger.clone(), metrics, left_after_secs);
    let mut watch: Option<LedgerWatch> = None;
    let mut warned = false;
    // A listing at start only learns: what completed before the agent watched is not
    // its to count. Any later one (records/ made after the start, a watch re-armed)
    // also counts.
    let mut observe = false;
    let mut next_sweep = Instant::now();
    loop {
        health.beat(&health.chain);
        if watch.is_none() {
            match LedgerWatch::arm(&ledger) {
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
    use crate::metrics::{CHAIN_FAILED_LEFT, CHAIN_FAILED_TORN_DOWN, CHAIN_OK};
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
    fn drain(w: &LedgerWatch, t: &mut Tracker) {
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
        let w = LedgerWatch::arm(&l).unwrap();
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
        let w = LedgerWatch::arm(&l).unwrap();
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
        let w = LedgerWatch::arm(&l).unwrap();
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
        let w = LedgerWatch::arm(&l).unwrap();
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
