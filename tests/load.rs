//! Load (docs/DESIGN.md §4 "Concurrency"): 64 processes at a time doing ADD/DEL through the
//! binary (each worker's own keys and keys all workers collide on) while two
//! `gc --grace 0 --now` loops overlap, for a bounded time; some namespaces are deleted
//! midway so that gc has stale records to replay. Every ADD carries a unique op id in
//! CNI_ARGS, which the record keeps and a replayed DEL hands to the counting plugin.
//!
//! Afterwards, per key, with the successful ops that no other successful op strictly
//! follows (the "last" ones, several when they overlapped in time):
//!   - no lost record: a record is present unless a last op is a DEL, or gc replayed
//!     the very ADD a last op made (its op id in the counter's log);
//!   - no record left for a completed DEL: absent when every last op is a DEL;
//!   - a present record is intact and was written by one of the last ADDs;
//!   - no attachment replayed twice at once (the counter's `flock -n` per key), no ADD
//!     replayed twice, and no live attachment (namespace never deleted) replayed at all.
//!
//!     cargo test --features testing --test load -- --nocapture   (prints the figures)

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod rel;

use common::*;
use rel::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WORKERS: usize = 64;
const RUN: Duration = Duration::from_secs(15);
const LIVE_NS: usize = 8;
const DOOMED_NS: usize = 4;
const SHARED_KEYS: usize = 8;
const OWN_KEYS: usize = 2;

#[derive(Debug, Clone)]
struct OpRec {
    cid: String,
    add: bool,
    id: String,
    start: Instant,
    end: Instant,
    ok: bool,
}

/// Which namespace a key's ADDs name: live keys never lose theirs; doomed keys lose it
/// a third into the run.
fn key_ns(cid: &str, live: &[String], doomed: &[String]) -> (String, bool) {
    let h = cid
        .bytes()
        .fold(0usize, |h, b| h.wrapping_mul(31).wrapping_add(b as usize));
    let is_doomed = match cid.strip_prefix("c-") {
        Some(n) => n.parse::<usize>().unwrap() >= SHARED_KEYS - 2,
        None => cid.ends_with("-1") && h % 2 == 0,
    };
    if is_doomed {
        (doomed[h % doomed.len()].clone(), true)
    } else {
        (live[h % live.len()].clone(), false)
    }
}

#[test]
fn concurrent_add_del_and_overlapping_gc() {
    require_root!();
    let w = World::new("load", "load", "0.05");
    let live: Vec<Netns> = (0..LIVE_NS).map(|_| Netns::with_prefix("cll")).collect();
    let mut doomed: Vec<Netns> = (0..DOOMED_NS).map(|_| Netns::with_prefix("clx")).collect();
    let live_paths: Vec<String> = live.iter().map(Netns::path_str).collect();
    let doomed_paths: Vec<String> = doomed.iter().map(Netns::path_str).collect();

    let ops: Mutex<Vec<OpRec>> = Mutex::new(Vec::new());
    let busy = AtomicUsize::new(0);
    let gc_runs = AtomicUsize::new(0);
    let gc_replayed = AtomicUsize::new(0);
    let gc_busy = AtomicUsize::new(0);
    let stop_gc = AtomicBool::new(false);
    let errors: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let t0 = Instant::now();
    let deadline = t0 + RUN;

    std::thread::scope(|s| {
        for worker in 0..WORKERS {
            let (w, ops, busy, errors) = (&w, &ops, &busy, &errors);
            let (live_paths, doomed_paths) = (&live_paths, &doomed_paths);
            s.spawn(move || {
                let mut rng = Prng::new(0x10ad + worker as u64);
                let mut seq = 0;
                while Instant::now() < deadline {
                    let cid = if rng.chance(35) {
                        format!("c-{}", rng.range(0, SHARED_KEYS))
                    } else {
                        format!("p{worker}-{}", rng.range(0, OWN_KEYS))
                    };
                    let (ns, _) = key_ns(&cid, live_paths, doomed_paths);
                    let add = rng.chance(60);
                    seq += 1;
                    let id = format!("w{worker}s{seq}");
                    let args = format!("IgnoreUnknown=1;OP={id}");
                    let start = Instant::now();
                    let out = if add {
                        w.plugin("ADD", &cid, "eth0", Some(&ns), &[("CNI_ARGS", &args)])
                    } else {
                        w.plugin("DEL", &cid, "eth0", Some(&ns), &[("CNI_ARGS", &args)])
                    };
                    let end = Instant::now();
                    let ok = out.status.success();
                    if !ok {
                        let code = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                            .ok()
                            .and_then(|v| v["code"].as_u64());
                        if code == Some(11) {
                            busy.fetch_add(1, Ordering::Relaxed);
                        } else {
                            errors.lock().unwrap().push(format!(
                                "{} {cid} failed: {}",
                                if add { "ADD" } else { "DEL" },
                                describe(&out)
                            ));
                        }
                    }
                    ops.lock().unwrap().push(OpRec {
                        cid,
                        add,
                        id,
                        start,
                        end,
                        ok,
                    });
                }
            });
        }
        for _ in 0..2 {
            let (w, stop_gc, errors) = (&w, &stop_gc, &errors);
            let (gc_runs, gc_replayed, gc_busy) = (&gc_runs, &gc_replayed, &gc_busy);
            s.spawn(move || {
                while !stop_gc.load(Ordering::Relaxed) {
                    let (out, rep) = w.gc(&["--jobs", "4"], &[]);
                    gc_runs.fetch_add(1, Ordering::Relaxed);
                    match (out.status.code(), rep) {
                        (Some(0 | 1), Some(rep)) => {
                            let s = &rep["summary"];
                            gc_replayed.fetch_add(
                                s["replayed"].as_u64().unwrap_or(0) as usize,
                                Ordering::Relaxed,
                            );
                            gc_busy.fetch_add(
                                rep["records"]
                                    .as_array()
                                    .unwrap()
                                    .iter()
                                    .filter(|r| r["action"] == "busy")
                                    .count(),
                                Ordering::Relaxed,
                            );
                            if !rep["damaged"].as_array().unwrap().is_empty() {
                                errors
                                    .lock()
                                    .unwrap()
                                    .push(format!("gc found damage: {rep}"));
                            }
                            for r in rep["records"].as_array().unwrap() {
                                if matches!(r["action"].as_str(), Some("retrying" | "failed")) {
                                    errors
                                        .lock()
                                        .unwrap()
                                        .push(format!("gc replay failed: {r}"));
                                }
                            }
                        }
                        _ => errors
                            .lock()
                            .unwrap()
                            .push(format!("gc: {}", describe(&out))),
                    }
                }
            });
        }
        // A third into the run, the doomed namespaces go (as with a runtime losing them).
        std::thread::sleep(RUN / 3);
        for ns in doomed.iter_mut() {
            ns.delete();
        }
        // Workers stop at the deadline; the gc loops a little after them.
        std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        std::thread::sleep(Duration::from_millis(300));
        stop_gc.store(true, Ordering::Relaxed);
    });
    let elapsed = t0.elapsed();
    let errors = errors.into_inner().unwrap();
    assert!(
        errors.is_empty(),
        "{} error(s), first: {}",
        errors.len(),
        errors[0]
    );

    // --- the state right after the run -------------------------------------------------------
    let ops = ops.into_inner().unwrap();
    let records = w.records();
    let log = w.log_lines();
    let v = w.verify();
    assert_eq!(v.status.code(), Some(0), "verify: {}", describe(&v));

    let mut by_key: BTreeMap<&str, Vec<&OpRec>> = BTreeMap::new();
    for op in &ops {
        by_key.entry(&op.cid).or_default().push(op);
    }
    let adds: BTreeMap<&str, &OpRec> = ops
        .iter()
        .filter(|o| o.add && o.ok)
        .map(|o| (o.id.as_str(), o))
        .collect();
    let op_of = |args: &str| -> Option<String> {
        args.split(';')
            .find_map(|kv| kv.strip_prefix("OP="))
            .map(str::to_string)
    };

    // replays: never two at once, never one ADD twice, never a live key, never a netns
    let mut replayed_ops: BTreeMap<String, usize> = BTreeMap::new();
    for l in &log {
        assert_ne!(l.what, "OVERLAP", "two replays of {} at once", l.cid);
        assert_eq!(l.what, "DEL", "{l:?}");
        let (_, doomed_key) = key_ns(&l.cid, &live_paths, &doomed_paths);
        assert!(doomed_key, "LIVE attachment {} was replayed: {l:?}", l.cid);
        assert_eq!(l.netns, "", "a replay was pointed at a namespace: {l:?}");
        let id = op_of(&l.args).unwrap_or_else(|| panic!("replay without op id: {l:?}"));
        let add = adds
            .get(id.as_str())
            .unwrap_or_else(|| panic!("replay of {id}, which no successful ADD made: {l:?}"));
        assert_eq!(add.cid, l.cid, "{l:?}");
        *replayed_ops.entry(id).or_default() += 1;
    }
    for (id, n) in &replayed_ops {
        assert_eq!(*n, 1, "the ADD {id} was replayed {n} times");
    }

    // final state of every key
    let mut present = 0;
    for (cid, kops) in &by_key {
        let ok: Vec<&&OpRec> = kops.iter().filter(|o| o.ok).collect();
        let last: Vec<&&OpRec> = ok
            .iter()
            .filter(|a| !ok.iter().any(|b| a.end < b.start))
            .copied()
            .collect();
        let name = w.record_name(cid);
        let (_, doomed_key) = key_ns(cid, &live_paths, &doomed_paths);
        match records.get(&name) {
            Some(bytes) => {
                present += 1;
                let r = decode_record(bytes).unwrap_or_else(|e| panic!("{name} is torn: {e}"));
                let id = op_of(r["cniArgs"].as_str().unwrap_or("")).unwrap();
                assert!(
                    last.iter().any(|o| o.add && o.id == id),
                    "{cid}: the record is of ADD {id}, not one of the last ops {last:#?}"
                );
                assert!(
                    !replayed_ops.contains_key(&id),
                    "{cid}: the record of ADD {id} was replayed but is still there"
                );
            }
            None => {
                let del_last = last.iter().any(|o| !o.add);
                let replayed_last = doomed_key
                    && last
                        .iter()
                        .any(|o| o.add && replayed_ops.contains_key(&o.id));
                assert!(
                    last.is_empty() || del_last || replayed_last,
                    "LOST RECORD {cid}: last ops {last:#?}, none a DEL nor replayed by gc"
                );
            }
        }
    }
    for name in records.keys() {
        let cid = name
            .strip_prefix("load:")
            .and_then(|s| s.strip_suffix(":eth0.json"))
            .unwrap();
        assert!(by_key.contains_key(cid), "record {name} of no op");
    }

    // a last gc: every stale record replayed, the live ones kept
    let (g, rep) = w.gc(&[], &[]);
    assert_eq!(g.status.code(), Some(0), "final gc: {}", describe(&g));
    let rep = rep.unwrap();
    for name in w.records().keys() {
        let cid = name
            .strip_prefix("load:")
            .and_then(|s| s.strip_suffix(":eth0.json"))
            .unwrap();
        assert!(
            !key_ns(cid, &live_paths, &doomed_paths).1,
            "stale {cid} left after the final gc: {rep:#}"
        );
    }
    for l in w.log_lines() {
        assert!(key_ns(&l.cid, &live_paths, &doomed_paths).1, "{l:?}");
    }
    assert_eq!(w.verify().status.code(), Some(0));

    let n_add = ops.iter().filter(|o| o.add).count();
    let n_ok = ops.iter().filter(|o| o.ok).count();
    let lat: Vec<u128> = {
        let mut v: Vec<u128> = ops.iter().map(|o| (o.end - o.start).as_millis()).collect();
        v.sort();
        v
    };
    let keys: BTreeSet<&str> = ops.iter().map(|o| o.cid.as_str()).collect();
    eprintln!(
        "FIGURE load: {WORKERS} concurrent plugin processes + 2 overlapping gc loops for {:.1}s: \
         {} ops ({} ADD, {} DEL; {} ok, {} busy/11) on {} keys = {:.0} ops/s, latency p50 {} ms \
         p99 {} ms max {} ms; {} gc runs replayed {} (busy {}); {} records after the run; \
         final gc replayed {}",
        elapsed.as_secs_f64(),
        ops.len(),
        n_add,
        ops.len() - n_add,
        n_ok,
        busy.load(Ordering::Relaxed),
        keys.len(),
        ops.len() as f64 / RUN.as_secs_f64(),
        lat[lat.len() / 2],
        lat[lat.len() * 99 / 100],
        lat[lat.len() - 1],
        gc_runs.load(Ordering::Relaxed),
        gc_replayed.load(Ordering::Relaxed),
        gc_busy.load(Ordering::Relaxed),
        present,
        rep["summary"]["replayed"]
    );
}
