//! gc's courtesy to the node's new pods: before each replay, gc waits while an ADD is in
//! flight on the node, for at most a budget per run.
//!
//! After an unclean reboot the runtime starts the node's pods while gc replays DEL for
//! the old boot's attachments; both go through the same chain, and portmap's ADD and DEL
//! both take iptables' lock. A new pod waiting on a replay is the cost operators notice,
//! so the replays step aside. The ledger already sees every ADD start: the head writes a
//! record before any other plugin runs, and the tail's note completes it. A record of
//! this boot that is young and pending (a tail expected, no note yet) is an ADD in the
//! chain; one made by a chain without a tail counts while it is a few seconds old.
//! Nothing is added to ADD's path: gc reads what ADD writes anyway.
//!
//! An ADD that began moments ago counts too, completed or not: kubelet brings a node's
//! pods back one after another, so its ADDs leave short gaps, and a replay started in
//! one still holds iptables' lock and a core when the next pod's ADD comes. Waiting for
//! a short quiet moves the replays after the storm, within the same budget.
//!
//! A replay that began before an ADD did pauses between its plugins too, briefly (it
//! holds its key's lock), and a run's workers join one by one. The budget is the hard
//! bound: once a run has waited that long in all, its replays go on whatever starts, so
//! a node that never stops starting pods (or an ADD that hangs) delays a stale
//! attachment's release by at most the budget.

use crate::chain::{self, State};
use crate::ledger::{Decoded, Ledger, Record};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// `--yield-max`'s default: a 110-pod start on two cores took 6–14 s through the chain (docs/EVIDENCE.md, "gc under a pod-start storm"); six times that leaves room
/// for a slower node, and bounds how much later a stale attachment is released.
pub const DEFAULT_YIELD_MAX_SECS: u64 = 60;
/// A pending record is an ADD in flight while younger than this: beyond it the ADD has
/// most likely failed without a DEL (a runtime times network setup out in minutes, but
/// waiting on one stuck ADD would cost every replay the whole budget).
pub const IN_FLIGHT_SECS: u64 = 60;
/// A record of a chain without a tail has no note to say its ADD is done: it counts as
/// in flight only this long.
pub const UNTRACKED_IN_FLIGHT_SECS: u64 = 5;
/// An ADD of this boot that began less than this long ago counts as in flight even once
/// its chain completed: the quiet gc waits for between a storm's ADDs.
pub const QUIET_AFTER_ADD: Duration = Duration::from_secs(2);
/// Between the starts of a run's replay workers, which join one by one: a storm that
/// starts with the run finds one replay's plugin under way instead of `--jobs`; a run
/// without one loses at most (jobs - 1) × RAMP.
pub const RAMP: Duration = Duration::from_millis(500);
/// How often a waiting gc looks again: each look lists the records directory and stats
/// the young records' notes, well under a millisecond for a full node.
const POLL: Duration = Duration::from_millis(50);
/// A replay already under way (its key's lock held) pauses between its plugins for at
/// most this long at a time: a runtime's DEL of the same key waits for the lock for 5 s
/// (`lockTimeoutMs`) before it answers "busy".
pub const BETWEEN_PLUGINS_MAX: Duration = Duration::from_secs(2);

/// One run's waiting, shared by its replay workers.
#[derive(Debug)]
pub struct Courtesy {
    ledger: Ledger,
    boot: String,
    budget: Duration,
    spent: Mutex<Spent>,
    /// The last look for an ADD in flight: when, and what it found.
    last_look: Mutex<Option<(Instant, Option<String>)>>,
    announced: AtomicBool,
    spent_out: AtomicBool,
    stop: Option<Arc<AtomicBool>>,
    deadline: Option<Instant>,
    began: Instant,
}

/// Wall time the run has spent waiting: the union of its workers' waits, not their sum.
#[derive(Debug, Default)]
struct Spent {
    total: Duration,
    counted_to: Option<Instant>,
}

impl Courtesy {
    /// `budget` for the run's replays in `ledger`; a set `stop` or a passed `deadline`
    /// ends any wait.
    pub fn new(
        ledger: Ledger,
        boot: &str,
        budget: Duration,
        stop: Option<Arc<AtomicBool>>,
        deadline: Option<Instant>,
    ) -> Courtesy {
        Courtesy {
            ledger,
            boot: boot.to_string(),
            budget,
            spent: Mutex::new(Spent::default()),
            last_look: Mutex::new(None),
            announced: AtomicBool::new(false),
            spent_out: AtomicBool::new(false),
            stop,
            deadline,
            began: Instant::now(),
        }
    }

    /// A run's `k`th worker starts `k` × `RAMP` after the run began (the first at once):
    /// a storm that begins with the run meets one replay under way, not `--jobs` of them.
    pub fn ramp(&self, k: usize) {
        if self.budget.is_zero() {
            return;
        }
        let at = self.began + RAMP * u32::try_from(k).unwrap_or(u32::MAX);
        while Instant::now() < at && !self.stopping() {
            std::thread::sleep(POLL.min(at.saturating_duration_since(Instant::now())));
        }
    }

    fn stopping(&self) -> bool {
        self.stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Relaxed))
            || self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Before a replay takes its key's lock: waits while an ADD is in flight.
    pub fn before_replay(&self) {
        self.wait(None);
    }

    /// Before each plugin of a replay under way: the same, at most `BETWEEN_PLUGINS_MAX`
    /// (an ADD that began after the replay did).
    pub fn between_plugins(&self) {
        self.wait(Some(BETWEEN_PLUGINS_MAX));
    }

    fn wait(&self, cap: Option<Duration>) {
        if self.budget.is_zero() {
            return;
        }
        let began = Instant::now();
        let mut from = began;
        loop {
            let stopping = self
                .stop
                .as_ref()
                .is_some_and(|s| s.load(Ordering::Relaxed))
                || self.deadline.is_some_and(|d| Instant::now() >= d);
            let total = self.total();
            if stopping || cap.is_some_and(|c| began.elapsed() >= c) {
                return;
            }
            if total >= self.budget {
                if !self.spent_out.swap(true, Ordering::Relaxed) {
                    crate::warn!(
                        "gc: waited {} s for ADDs in flight this run, the most it may: replaying regardless",
                        self.budget.as_secs()
                    );
                }
                return;
            }
            let Some(stem) = self.look() else {
                return;
            };
            if !self.announced.swap(true, Ordering::Relaxed) {
                crate::info!(
                    "gc: an ADD is in flight on the node ({stem}); replays wait for ADDs, {} s at most this run",
                    self.budget.as_secs()
                );
            }
            std::thread::sleep(POLL.min(self.budget - total));
            self.count(from);
            from = Instant::now();
        }
    }

    /// An ADD in flight, by a look shared by the workers: one taken less than `POLL` ago
    /// is reused, and the ADD found last time (most likely still in flight) is read
    /// first. A storm's waiting gc so costs the node one look per `POLL`.
    fn look(&self) -> Option<String> {
        let mut last = self
            .last_look
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((at, found)) = &*last {
            if at.elapsed() < POLL {
                return found.clone();
            }
        }
        let found = match last.as_ref().and_then(|(_, f)| f.clone()) {
            Some(stem) if in_flight(&self.ledger, &stem, &self.boot) => Some(stem),
            _ => add_in_flight(&self.ledger, &self.boot),
        };
        *last = Some((Instant::now(), found.clone()));
        found
    }

    /// Adds the wait since `from` to the run's total, minus what another worker counted.
    fn count(&self, from: Instant) {
        let now = Instant::now();
        let mut s = self.spent.lock().unwrap_or_else(PoisonError::into_inner);
        let start = s.counted_to.map_or(from, |c| c.max(from));
        s.total += now.saturating_duration_since(start);
        s.counted_to = Some(now);
    }

    /// What the run has waited so far.
    pub fn total(&self) -> Duration {
        self.spent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

/// The stem of a record whose ADD is in flight now, if there is one. Files older than
/// `IN_FLIGHT_SECS`, and young ones with a newer note, are passed over on their mtimes
/// without being read, so a look costs one listing and a stat or two per record, plus a
/// read of a young un-noted one until one is found in flight.
pub fn add_in_flight(ledger: &Ledger, boot: &str) -> Option<String> {
    let now = SystemTime::now();
    let young_since = now.checked_sub(Duration::from_secs(IN_FLIGHT_SECS))?;
    let just_since = now.checked_sub(QUIET_AFTER_ADD)?;
    // A write in progress is no stem: its record is not there yet.
    for (stem, made) in ledger.record_stems_modified() {
        if made < young_since {
            continue;
        }
        // The tail wrote its note after the head's record: the ADD completed, or a DEL
        // began. Told by one stat, without reading the record; a record written just now
        // is read whatever its note says (`QUIET_AFTER_ADD`).
        let noted = std::fs::metadata(ledger.note_path(&stem))
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= made);
        if (!noted || made >= just_since) && in_flight(ledger, &stem, boot) {
            return Some(stem);
        }
    }
    None
}

/// Whether `stem`'s record is an ADD still in the chain: of this boot, and begun less
/// than `QUIET_AFTER_ADD` ago, or not completed by a tail, no DEL begun, and young.
fn in_flight(ledger: &Ledger, stem: &str, boot: &str) -> bool {
    let Ok(Some(Decoded::Ok(rec))) = ledger.read(stem) else {
        return false;
    };
    if rec.boot_id != boot {
        return false;
    }
    if began_within(&rec, QUIET_AFTER_ADD) {
        return true;
    }
    let age = rec.age_secs(boot, crate::time::now());
    match chain::classify(rec.tail, rec.chain.as_ref(), age, IN_FLIGHT_SECS) {
        State::Pending => true,
        State::Untracked => {
            age.is_some_and(|a| a >= 0 && a.unsigned_abs() < UNTRACKED_IN_FLIGHT_SECS)
        }
        _ => false,
    }
}

/// Whether `rec`'s ADD began less than `d` ago on the boot clock (the record is of this
/// boot; one without the head's start time never counts).
fn began_within(rec: &Record, d: Duration) -> bool {
    let (Some(then), Some(now)) = (rec.created_boot_ns, crate::time::since_boot_ns()) else {
        return false;
    };
    now.checked_sub(then)
        .is_some_and(|ago| u128::from(ago) < d.as_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::record::{self, ChainNote};
    use crate::ledger::tests::tmp_ledger;

    /// A record of `boot` whose chain (with a tail) completed, its ADD begun `ago`.
    fn completed(ledger: &Ledger, cid: &str, boot: &str, ago: Duration) -> String {
        let began = crate::time::since_boot_ns().unwrap() - ago.as_nanos() as u64;
        let mut rec = record::sample();
        rec.container_id = cid.into();
        rec.boot_id = boot.into();
        rec.tail = true;
        rec.created_boot_secs = Some(began / 1_000_000_000);
        rec.created_boot_ns = Some(began);
        ledger.write(&rec).unwrap();
        let note = ChainNote {
            completed_boot_ns: crate::time::since_boot_ns(),
            ..ChainNote::default()
        };
        ledger.put_note(&rec, &note).unwrap();
        rec.key().stem()
    }

    #[test]
    fn an_add_begun_moments_ago_counts_though_its_chain_completed() {
        let l = tmp_ledger("courtesy-quiet");
        let stem = completed(&l, "just", "this-boot", Duration::from_millis(100));
        assert_eq!(add_in_flight(&l, "this-boot"), Some(stem));
        // Of another boot: a record gc rewrites, never an ADD of this one.
        assert_eq!(add_in_flight(&l, "next-boot"), None);
    }

    #[test]
    fn a_completed_add_past_the_quiet_is_none() {
        let l = tmp_ledger("courtesy-past");
        completed(
            &l,
            "earlier",
            "this-boot",
            QUIET_AFTER_ADD + Duration::from_secs(1),
        );
        assert_eq!(add_in_flight(&l, "this-boot"), None);
    }
}
