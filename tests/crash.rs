//! Crash at every write step (docs/DESIGN.md §4 "Crash-consistent"; CONTRACT "Test-only env").
//!
//! For every crash point the ledger has, many trials: build a ledger (live records whose
//! namespaces exist, stale ones whose namespace was deleted or whose boot ID is another
//! boot's, records whose DEL fails, damaged records, damaged snapshots, conflist
//! changes), then run one plugin ADD/DEL, `gc` or `list` with
//! `CNI_LEDGER_TEST_CRASH_AT=<point>:<n>` so that it is SIGKILLed at the n-th passage.
//! Afterwards:
//!   - every record file is exactly the old bytes or a correct new version (decoded and
//!     compared field by field), removed only when the op removes it, damaged files are
//!     in quarantine/ byte for byte; snapshots are intact (name = sha256 of content);
//!   - `verify` exits 0 (1 only for planted damage still in place, which it names);
//!     temporary files are allowed leftovers;
//!   - `list --json` works and reports each record with the right state;
//!   - `gc` works (exit 0), replays every stale attachment exactly once, never a live one
//!     (the chain is [cni-ledger, counter], the counter logs every DEL it gets);
//!   - the runtime's retry of a crashed ADD/DEL succeeds (leftover temp files and lock
//!     files do not get in the way), and nothing stays locked: the live records can be
//!     DELeted right away.
//!
//! `every_crash_point_is_covered` fails when src/ gains a crash point not tried here.
//!
//!     cargo test --features testing --test crash -- --nocapture   (prints the figures)

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod rel;

use common::*;
use rel::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

const TRIALS: usize = 20;
const NET: &str = "crash";
const OLD_BOOT: &str = "boot-before-the-crash-test";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Live,
    StaleGone,
    StaleBoot,
    Damaged,
}

#[derive(Clone, Debug)]
enum Op {
    /// ADD in the first live namespace.
    Add(String),
    Del(String),
    Gc(usize),
    List,
}

#[derive(Default, Clone, Debug)]
struct Setup {
    live: usize,
    stale_gone: usize,
    stale_boot: usize,
    /// How many of the stale records fail their DEL (flag files).
    failing: usize,
    /// Stale records truncated after their ADD.
    damaged: usize,
    /// Live records use conflist variant 2 (the stale ones variant 1).
    switch_variant: bool,
    /// Truncate the snapshot of the stale records.
    damage_snapshot: bool,
    /// Conflist variant written just before the op.
    op_variant: Option<u32>,
}

#[derive(Debug)]
struct Trial {
    point: &'static str,
    n: u32,
    setup: Setup,
    op: Op,
}

#[derive(Default)]
struct Tally {
    trials: usize,
    ns: BTreeSet<u32>,
    old: usize,
    new: usize,
    temp_left: usize,
}

fn cid_of(name: &str) -> String {
    name.strip_prefix(&format!("{NET}:"))
        .and_then(|s| s.strip_suffix(":eth0.json"))
        .unwrap_or_else(|| panic!("unexpected record file name {name}"))
        .to_string()
}

fn strip_gc(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("gc");
    }
    v
}

/// The namespace cookie ADD records beside device and inode.
fn netns_cookie(netns: &str) -> u64 {
    let f = std::fs::File::open(netns).unwrap_or_else(|e| panic!("open {netns}: {e}"));
    cni_ledger::sandbox::identity::netns_cookie(&f)
        .unwrap_or_else(|e| panic!("cookie of {netns}: {e}"))
}

/// A correct new record of an ADD of `cid` in `netns` with the current conflist.
fn check_added(b: &[u8], cid: &str, netns: &str, conflist: &[u8], w: &World, old: Option<&Value>) {
    let r = decode_record(b).unwrap_or_else(|e| panic!("new record of {cid} is torn: {e}"));
    let (dev, ino) = identity(netns);
    let want = json!({
        "network": NET,
        "containerId": cid,
        "ifname": "eth0",
        "netns": netns,
        "netnsId": {"dev": dev, "ino": ino, "cookie": netns_cookie(netns)},
        "bootId": boot_id(),
        "cniArgs": "",
        "cniPath": w.cni_path(),
        "cniVersion": "1.0.0",
        "runtimeConfig": {},
        "ledgerType": "cni-ledger",
        "snapshot": sha256_of(conflist),
        "confFile": w.conf_file.display().to_string(),
    });
    for (k, v) in want.as_object().unwrap() {
        assert_eq!(&r[k], v, "new record of {cid}: field {k}: {r}");
    }
    assert!(r.get("gc").is_none(), "a fresh ADD carries gc state: {r}");
    assert!(
        r["createdAt"].as_str().is_some_and(|s| s.ends_with('Z')),
        "{r}"
    );
    let add_id = r["addId"].as_str().unwrap_or("");
    assert!(!add_id.is_empty(), "{r}");
    if let Some(old) = old {
        assert_ne!(old["addId"], r["addId"], "re-ADD kept the old addId");
    }
}

/// A correct gc state update of `old` after one failing replay.
fn check_gc_update(a: &[u8], b: &[u8], cid: &str) {
    let old = decode_record(a).unwrap();
    let new = decode_record(b).unwrap_or_else(|e| panic!("updated record of {cid} is torn: {e}"));
    assert_eq!(
        strip_gc(&old),
        strip_gc(&new),
        "gc changed more than the gc state of {cid}"
    );
    let gc = &new["gc"];
    let before = old["gc"]["attempts"].as_u64().unwrap_or(0);
    assert_eq!(gc["attempts"].as_u64(), Some(before + 1), "{new}");
    assert_eq!(gc["failed"], json!(false), "{new}");
    assert!(
        gc["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("counter told to fail")),
        "{new}"
    );
    assert!(gc["nextAttemptAt"].is_string(), "{new}");
}

fn run_trial(t: &Trial, seed: u64, live_ns: &[Netns], tally: &mut Tally) {
    let ctx = format!("trial {t:?} (seed {seed})");
    let mut rng = Prng::new(seed);
    let w = World::new("crash", NET, "0");
    let counter = [json!({"type": "counter"})];
    let s = &t.setup;
    let mut kinds: BTreeMap<String, Kind> = BTreeMap::new();
    let mut failing = BTreeSet::new();

    // --- the preceding state -----------------------------------------------------------
    let mut gone = Netns::with_prefix("clc");
    let gone_path = gone.path_str();
    w.write_conflist(1, &counter);
    for i in 0..s.stale_gone {
        let cid = format!("g-{i}");
        w.add(&cid, &gone_path, &[]);
        kinds.insert(cid, Kind::StaleGone);
    }
    for i in 0..s.stale_boot {
        let cid = format!("b-{i}");
        let ns = live_ns[i % live_ns.len()].path_str();
        w.add(&cid, &ns, &[("CNI_LEDGER_TEST_BOOT_ID", OLD_BOOT)]);
        kinds.insert(cid, Kind::StaleBoot);
    }
    for i in 0..s.damaged {
        let cid = format!("d-{i}");
        w.add(&cid, &gone_path, &[]);
        kinds.insert(cid, Kind::Damaged);
    }
    let stale_snapshot = format!("{}.json", sha256_of(&w.conflist_bytes()));
    if s.switch_variant {
        w.write_conflist(2, &counter);
    }
    for i in 0..s.live {
        let cid = format!("l-{i}");
        w.add(&cid, &live_ns[i % live_ns.len()].path_str(), &[]);
        kinds.insert(cid, Kind::Live);
    }
    gone.delete();
    let stale: Vec<String> = kinds
        .iter()
        .filter(|(_, k)| matches!(k, Kind::StaleGone | Kind::StaleBoot))
        .map(|(c, _)| c.clone())
        .collect();
    for cid in stale.iter().take(s.failing) {
        w.set_fail(cid, true);
        failing.insert(cid.clone());
    }
    // planted damage: file path -> damaged bytes
    let mut planted: BTreeMap<PathBuf, Vec<u8>> = BTreeMap::new();
    for i in 0..s.damaged {
        let p = w.record_path(&format!("d-{i}"));
        let bytes = std::fs::read(&p).unwrap();
        let cut = rng.range(1, bytes.len() - 1); // dropping only the final '\n' is no damage
        std::fs::write(&p, &bytes[..cut]).unwrap();
        planted.insert(p, bytes[..cut].to_vec());
    }
    if s.damage_snapshot {
        let p = w.snapshots_dir().join(&stale_snapshot);
        let bytes = std::fs::read(&p).unwrap();
        let cut = rng.range(0, bytes.len());
        std::fs::write(&p, &bytes[..cut]).unwrap();
        planted.insert(p, bytes[..cut].to_vec());
    }
    if let Some(v) = s.op_variant {
        w.write_conflist(v, &counter);
    }
    let conflist_at_op = w.conflist_bytes();
    let pre = w.records();
    let pre_snaps = w.snapshots();
    assert_eq!(
        w.verify().status.code(),
        Some(if planted.is_empty() { 0 } else { 1 }),
        "{ctx}: verify before the crash"
    );

    // --- the op, killed at the crash point ----------------------------------------------
    let spec = format!("{}:{}", t.point, t.n);
    let crash = [("CNI_LEDGER_TEST_CRASH_AT", spec.as_str())];
    let op_ns = live_ns[0].path_str();
    let out = match &t.op {
        Op::Add(cid) => w.plugin("ADD", cid, "eth0", Some(&op_ns), &crash),
        Op::Del(cid) => w.plugin("DEL", cid, "eth0", None, &crash),
        Op::Gc(jobs) => w.gc(&["--jobs", &jobs.to_string()], &crash).0,
        Op::List => w.cli(&["list", "--json"], &crash),
    };
    assert!(
        killed_by_sigkill(&out),
        "{ctx}: the op was not killed at {spec}: {}",
        describe(&out)
    );
    tally.trials += 1;
    tally.ns.insert(t.n);
    tally.temp_left += w.temp_files().len();

    // --- every record: the old bytes or a correct new version -----------------------------
    let post = w.records();
    let post_q = w.quarantine();
    let replayed_now: BTreeSet<String> = w
        .log_lines()
        .into_iter()
        .filter(|l| l.what == "DEL")
        .map(|l| l.cid)
        .collect();
    let in_quarantine = |name: &str, bytes: &[u8]| {
        post_q
            .iter()
            .any(|(q, b)| q.starts_with(&format!("{name}.")) && b == bytes)
    };
    let names: BTreeSet<&String> = pre.keys().chain(post.keys()).collect();
    // cid -> whether its surviving record is live
    let mut live_final = BTreeSet::new();
    let mut stale_final = BTreeSet::new();
    let mut removed_by_op = BTreeSet::new();
    for name in names {
        let cid = cid_of(name);
        let kind = kinds.get(&cid).copied();
        let target = matches!(&t.op, Op::Add(c) | Op::Del(c) if *c == cid);
        match (pre.get(name), post.get(name)) {
            (Some(a), Some(b)) if a == b => {
                tally.old += 1;
                match kind {
                    Some(Kind::Live) => {
                        live_final.insert(cid);
                    }
                    Some(Kind::StaleGone | Kind::StaleBoot) => {
                        stale_final.insert(cid);
                    }
                    _ => {}
                }
            }
            (Some(a), Some(b)) => {
                tally.new += 1;
                match &t.op {
                    Op::Add(c) if *c == cid => {
                        let old = decode_record(a).ok();
                        check_added(b, &cid, &op_ns, &conflist_at_op, &w, old.as_ref());
                        live_final.insert(cid);
                    }
                    Op::Gc(_) if failing.contains(&cid) => {
                        check_gc_update(a, b, &cid);
                        stale_final.insert(cid);
                    }
                    _ => panic!(
                        "{ctx}: record {name} changed though the op does not write it:\n\
                         before: {}\nafter:  {}",
                        text(a),
                        text(b)
                    ),
                }
            }
            (Some(a), None) => {
                tally.new += 1;
                match kind {
                    Some(Kind::Damaged) => assert!(
                        in_quarantine(name, a),
                        "{ctx}: damaged record {name} vanished without reaching quarantine \
                         (quarantine: {:?})",
                        post_q.keys()
                    ),
                    _ if target && matches!(t.op, Op::Del(_)) => {
                        removed_by_op.insert(cid);
                    }
                    Some(Kind::StaleGone | Kind::StaleBoot)
                        if matches!(t.op, Op::Gc(_)) && !failing.contains(&cid) =>
                    {
                        assert!(
                            replayed_now.contains(&cid),
                            "{ctx}: gc removed {name} without replaying its DEL"
                        );
                    }
                    _ => panic!("{ctx}: record {name} was lost:\n{}", text(a)),
                }
            }
            (None, Some(b)) => {
                assert!(
                    matches!(&t.op, Op::Add(c) if *c == cid),
                    "{ctx}: record {name} appeared from nowhere:\n{}",
                    text(b)
                );
                tally.new += 1;
                check_added(b, &cid, &op_ns, &conflist_at_op, &w, None);
                live_final.insert(cid);
            }
            (None, None) => unreachable!(),
        }
    }
    if let Op::Add(cid) = &t.op {
        if !pre.contains_key(&w.record_name(cid)) && !post.contains_key(&w.record_name(cid)) {
            tally.old += 1; // a new key, not written: the old state (absent)
        }
    }

    // --- snapshots: intact, or the planted damage (old), or replaced/quarantined (new) ---
    let post_snaps = w.snapshots();
    // A damaged snapshot that an ADD rewrote with the right content (its name says what
    // that is). Noted: the damaged bytes are then gone without quarantine.
    let mut repaired = BTreeSet::new();
    for (name, bytes) in &post_snaps {
        let path = w.snapshots_dir().join(name);
        if planted.get(&path) == Some(bytes) {
            continue;
        }
        if planted.contains_key(&path) {
            repaired.insert(path.clone());
        }
        assert_eq!(
            format!("{}.json", sha256_of(bytes)),
            *name,
            "{ctx}: snapshot {name} is torn"
        );
    }
    for (name, bytes) in &pre_snaps {
        if post_snaps.contains_key(name) {
            continue;
        }
        let path = w.snapshots_dir().join(name);
        if planted.contains_key(&path) {
            assert!(
                in_quarantine(name, bytes),
                "{ctx}: damaged snapshot {name} vanished without reaching quarantine"
            );
        } else {
            assert!(
                matches!(t.op, Op::Gc(_)),
                "{ctx}: snapshot {name} vanished during {:?}",
                t.op
            );
        }
    }
    for (name, bytes) in &post {
        if let Ok(r) = decode_record(bytes) {
            if let Some(h) = r["snapshot"].as_str() {
                let sname = format!("{h}.json");
                let planted_snap = planted.contains_key(&w.snapshots_dir().join(&sname));
                assert!(
                    post_snaps.contains_key(&sname) || planted_snap,
                    "{ctx}: record {name} refers to snapshot {h}, which is gone"
                );
            }
        }
    }

    // --- verify ----------------------------------------------------------------------------
    let remaining: Vec<&PathBuf> = planted
        .iter()
        .filter(|(p, b)| std::fs::read(p).ok().as_ref() == Some(*b))
        .map(|(p, _)| p)
        .collect();
    let v = w.verify();
    let vout = text(&v.stdout);
    assert_eq!(
        v.status.code(),
        Some(if remaining.is_empty() { 0 } else { 1 }),
        "{ctx}: verify after the crash: {}",
        describe(&v)
    );
    assert_eq!(
        vout.lines().filter(|l| l.starts_with("damaged: ")).count(),
        remaining.len(),
        "{ctx}: verify reports other damage than the planted one: {vout}"
    );
    for p in &remaining {
        assert!(verify_names(&vout, p), "{ctx}: verify does not name {p:?}");
    }
    assert_eq!(
        verify_temp_count(&vout),
        Some(w.temp_files().len()),
        "{ctx}: verify counts other temporary files than {:?}: {vout}",
        w.temp_files()
    );

    // --- list --------------------------------------------------------------------------------
    let rows = w.list_json();
    for r in &rows {
        match r["state"].as_str() {
            Some("damaged") => {
                let file = PathBuf::from(r["file"].as_str().unwrap_or(""));
                assert!(
                    remaining.contains(&&file),
                    "{ctx}: list calls {file:?} damaged: {r}"
                );
            }
            Some("live") => assert!(
                live_final.contains(r["containerId"].as_str().unwrap_or("")),
                "{ctx}: list reports a stale record live: {r}"
            ),
            Some("stale") => assert!(
                stale_final.contains(r["containerId"].as_str().unwrap_or("")),
                "{ctx}: list reports a live record stale: {r}"
            ),
            _ => panic!("{ctx}: unexpected list row {r}"),
        }
    }
    assert_eq!(
        rows.iter().filter(|r| r["state"] != "damaged").count(),
        live_final.len() + stale_final.len(),
        "{ctx}: list rows {rows:#?}"
    );

    // --- gc: works, replays the stale ones, never a live one ---------------------------------
    w.clear_fail();
    let (g, rep) = w.gc(&[], &[]);
    assert_eq!(g.status.code(), Some(0), "{ctx}: gc: {}", describe(&g));
    let rep = rep.unwrap();
    assert_eq!(
        rep["summary"]["live"].as_u64(),
        Some(live_final.len() as u64),
        "{ctx}: {rep:#}"
    );
    let (g2, rep2) = w.gc(&[], &[]);
    assert_eq!(
        g2.status.code(),
        Some(0),
        "{ctx}: 2nd gc: {}",
        describe(&g2)
    );
    assert_eq!(rep2.unwrap()["summary"]["replayed"], json!(0), "{ctx}");
    let after_gc = w.records();
    let want: BTreeSet<String> = live_final.iter().map(|c| w.record_name(c)).collect();
    assert_eq!(
        after_gc.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "{ctx}: records after gc"
    );
    for (name, bytes) in &after_gc {
        assert_eq!(Some(bytes), post.get(name), "{ctx}: gc touched live {name}");
    }
    let v = w.verify();
    assert_eq!(
        v.status.code(),
        Some(0),
        "{ctx}: verify after gc: {}",
        describe(&v)
    );
    assert_eq!(
        (verify_temp_count(&text(&v.stdout)), w.temp_files()),
        (Some(0), vec![]),
        "{ctx}: gc leaves temporary files behind"
    );
    for (p, b) in &planted {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let kept = w.quarantine().values().any(|q| q == b)
            || (p.exists() && std::fs::read(p).ok().as_ref() == Some(b));
        assert!(
            kept || repaired.contains(p),
            "{ctx}: damaged {name} was deleted, not quarantined"
        );
    }

    // --- the counting plugin's log -----------------------------------------------------------
    let lines = w.log_lines();
    let mut dels: BTreeMap<String, usize> = BTreeMap::new();
    for l in &lines {
        assert_ne!(l.what, "OVERLAP", "{ctx}: two DELs of {} at once", l.cid);
        assert_eq!(
            l.netns, "",
            "{ctx}: a replayed DEL was pointed at a namespace: {l:?}"
        );
        assert!(
            !live_final.contains(&l.cid),
            "{ctx}: LIVE attachment {} got a DEL: {l:?}",
            l.cid
        );
        assert_ne!(
            kinds.get(&l.cid),
            Some(&Kind::Damaged),
            "{ctx}: damaged record {} was acted on",
            l.cid
        );
        if l.what == "DEL" {
            *dels.entry(l.cid.clone()).or_default() += 1;
        }
    }
    for (cid, kind) in &kinds {
        let want = match kind {
            Kind::StaleGone | Kind::StaleBoot if !removed_by_op.contains(cid) => {
                usize::from(!live_final.contains(cid))
            }
            _ => 0,
        };
        assert_eq!(
            dels.get(cid).copied().unwrap_or(0),
            want,
            "{ctx}: DELs replayed for {cid} ({kind:?}); log: {lines:?}"
        );
    }

    // --- the runtime retries the op that crashed: it succeeds, leftovers do not get in the way -
    match &t.op {
        Op::Add(cid) => {
            let before = w.records().get(&w.record_name(cid)).cloned();
            w.add(cid, &op_ns, &[]);
            let after = std::fs::read(w.record_path(cid)).unwrap();
            let old = before.as_deref().and_then(|b| decode_record(b).ok());
            check_added(&after, cid, &op_ns, &conflist_at_op, &w, old.as_ref());
            live_final.insert(cid.clone());
        }
        Op::Del(cid) => {
            w.del(cid);
            assert!(!w.record_path(cid).exists(), "{ctx}");
        }
        Op::Gc(_) | Op::List => {}
    }

    // --- nothing stays locked: the live records go at once ------------------------------------
    let start = std::time::Instant::now();
    for cid in &live_final {
        w.del(cid);
    }
    assert!(
        start.elapsed() < std::time::Duration::from_secs(2),
        "{ctx}: DEL waited for a lock"
    );
    assert!(w.records().is_empty(), "{ctx}: {:?}", w.records());
    assert_eq!(w.verify().status.code(), Some(0), "{ctx}");
}

fn seed(point: &str, i: usize) -> u64 {
    point
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        })
        .wrapping_add(i as u64)
}

fn trials(point: &'static str) -> Vec<(Trial, u64)> {
    let mut out = Vec::new();
    for i in 0..TRIALS {
        let sd = seed(point, i);
        let mut rng = Prng::new(sd);
        let mut setup = Setup {
            live: rng.range(0, 3),
            stale_gone: rng.range(0, 3),
            stale_boot: rng.range(0, 2),
            ..Setup::default()
        };
        let mut n = 1;
        let op;
        match point {
            p if p.starts_with("record.") => match i % 5 {
                0 => {
                    if i == 0 {
                        setup = Setup::default(); // a fresh ledger
                    }
                    op = Op::Add("n-0".into());
                }
                1 => {
                    setup.live = setup.live.max(1);
                    setup.stale_gone = setup.stale_gone.max(1);
                    setup.stale_boot = 1;
                    op = Op::Add(["l-0", "g-0", "b-0"][(i / 5) % 3].into());
                }
                2 | 3 => {
                    setup.stale_gone = rng.range(1, 4);
                    let k = rng.range(1, setup.stale_gone + setup.stale_boot + 1);
                    setup.failing = k;
                    if i % 5 == 3 {
                        setup.damaged = rng.range(1, 3);
                    }
                    n = rng.range(1, k + 1) as u32;
                    op = Op::Gc(1);
                }
                _ => {
                    setup.switch_variant = true;
                    setup.op_variant = Some(3);
                    op = Op::Add("n-0".into());
                }
            },
            p if p.starts_with("snapshot.") => match i % 4 {
                0 => {
                    setup = Setup::default();
                    op = Op::Add("n-0".into());
                }
                1 => {
                    setup.switch_variant = true;
                    setup.op_variant = Some(3);
                    op = Op::Add("n-0".into());
                }
                2 => {
                    setup.stale_gone = setup.stale_gone.max(1);
                    setup.damage_snapshot = true;
                    op = Op::Add("n-0".into());
                }
                _ => {
                    setup.live = setup.live.max(1);
                    setup.stale_gone = setup.stale_gone.max(1);
                    setup.stale_boot = 1;
                    setup.op_variant = Some(3);
                    op = Op::Add(["l-0", "g-0", "b-0"][(i / 4) % 3].into());
                }
            },
            "remove.unlinked" => match i % 4 {
                0 => {
                    setup.live = setup.live.max(1);
                    op = Op::Del("l-0".into());
                }
                1 => {
                    setup.stale_gone = setup.stale_gone.max(1);
                    op = Op::Del("g-0".into());
                }
                2 => {
                    setup.stale_gone = rng.range(1, 4);
                    setup.failing = rng.range(0, 2);
                    // failing ones come first (sorted cids: b-*, g-*)
                    let ok = setup.stale_gone + setup.stale_boot - setup.failing;
                    if ok == 0 {
                        setup.failing = 0;
                    }
                    let ok = setup.stale_gone + setup.stale_boot - setup.failing;
                    n = rng.range(1, ok + 1) as u32;
                    op = Op::Gc(1);
                }
                _ => {
                    // every stale record removed, then the sweep of their snapshot
                    setup.stale_gone = rng.range(1, 4);
                    setup.live = setup.live.max(1);
                    setup.switch_variant = true;
                    n = (setup.stale_gone + setup.stale_boot + 1) as u32;
                    op = Op::Gc(1);
                }
            },
            // gc's n-th successful replay: record and cache entry gone, key just released.
            "gc.key-released" => {
                setup.stale_gone = rng.range(1, 4);
                n = rng.range(1, setup.stale_gone + setup.stale_boot + 1) as u32;
                op = Op::Gc(1);
            }
            "quarantine.renamed" => match i % 4 {
                0 => {
                    setup.damaged = rng.range(1, 4);
                    n = rng.range(1, setup.damaged + 1) as u32;
                    op = Op::Gc(1);
                }
                1 => {
                    setup.damaged = rng.range(1, 4);
                    n = rng.range(1, setup.damaged + 1) as u32;
                    op = Op::List;
                }
                2 => {
                    setup.damaged = rng.range(1, 3);
                    op = Op::Del("d-0".into());
                }
                _ => {
                    // damaged records first, then the damaged snapshot a replay needs
                    setup.damaged = rng.range(0, 3);
                    setup.stale_gone = setup.stale_gone.max(1);
                    setup.damage_snapshot = true;
                    setup.switch_variant = true;
                    n = (setup.damaged + 1) as u32;
                    op = Op::Gc(1);
                }
            },
            other => panic!("no trials for {other}"),
        }
        out.push((
            Trial {
                point,
                n,
                setup,
                op,
            },
            sd,
        ));
    }
    out
}

fn run_point(point: &'static str, live_ns: &[Netns]) {
    let mut tally = Tally::default();
    let start = std::time::Instant::now();
    for (t, sd) in trials(point) {
        run_trial(&t, sd, live_ns, &mut tally);
    }
    eprintln!(
        "FIGURE crash: {point}: {} trials, n in {:?}, records after the crash: {} old / {} new, \
         {} temp file(s) left, {:.1}s",
        tally.trials,
        tally.ns,
        tally.old,
        tally.new,
        tally.temp_left,
        start.elapsed().as_secs_f64()
    );
}

fn run_points(points: &[&'static str]) {
    let live_ns = [Netns::with_prefix("cll"), Netns::with_prefix("cll")];
    for p in points {
        run_point(p, &live_ns);
    }
}

#[test]
fn crash_while_writing_records() {
    require_root!();
    run_points(&["record.tmp-written", "record.tmp-synced"]);
}

#[test]
fn crash_while_renaming_records() {
    require_root!();
    run_points(&["record.renamed", "record.dir-synced"]);
}

#[test]
fn crash_while_writing_snapshots() {
    require_root!();
    run_points(&[
        "snapshot.tmp-written",
        "snapshot.tmp-synced",
        "snapshot.renamed",
        "snapshot.dir-synced",
    ]);
}

#[test]
fn crash_while_removing_records_and_snapshots() {
    require_root!();
    run_points(&["remove.unlinked"]);
}

#[test]
fn crash_after_a_replay_released_its_key() {
    require_root!();
    run_points(&["gc.key-released"]);
}

#[test]
fn crash_while_quarantining() {
    require_root!();
    run_points(&["quarantine.renamed"]);
}

/// The tail's note (`notes/`, written unflushed): a crash while the tail writes it, on
/// ADD or on DEL, leaves the head's record as it was and the note old, new or absent,
/// never torn for a reader; the tail's retry, `list`, `verify`, gc and the DEL work.
#[test]
fn crash_while_writing_notes() {
    require_root!();
    let ns = Netns::with_prefix("cln");
    let result = json!({"cniVersion": "1.0.0", "ips": [{"address": "198.18.0.9/24"}]});
    let mut trials = 0;
    for point in ["note.tmp-written", "note.renamed"] {
        for command in ["ADD", "DEL"] {
            let ctx = format!("{point} in the tail's {command}");
            let w = World::new("crash-note", NET, "0");
            w.write_conflist(1, &[json!({"type": "counter"}), w.tail_entry()]);
            let cid = "t-0";
            w.add(cid, &ns.path_str(), &[]);
            let tail = |command: &str, crash: &[(&str, &str)]| {
                let netns = (command == "ADD").then(|| ns.path_str());
                w.plugin_with(
                    &w.tail_stdin(&result),
                    command,
                    cid,
                    "eth0",
                    netns.as_deref(),
                    crash,
                )
            };
            if command == "DEL" {
                let out = tail("ADD", &[]);
                assert!(out.status.success(), "{ctx}: {}", describe(&out));
            }
            let record = w.records();
            let spec = format!("{point}:1");
            let out = tail(command, &[("CNI_LEDGER_TEST_CRASH_AT", &spec)]);
            assert!(killed_by_sigkill(&out), "{ctx}: {}", describe(&out));
            trials += 1;
            assert_eq!(w.records(), record, "{ctx}: the record changed");

            // A reader sees the old note or the new one: completed, unless the ADD's
            // note was the one cut short.
            let rows = w.list_json();
            assert_eq!(rows.len(), 1, "{ctx}: {rows:#?}");
            let want = if command == "ADD" && point == "note.tmp-written" {
                "pending"
            } else {
                "completed"
            };
            assert_eq!(rows[0]["chainState"], json!(want), "{ctx}: {:#}", rows[0]);
            let v = w.verify();
            assert_eq!(v.status.code(), Some(0), "{ctx}: {}", describe(&v));
            assert_eq!(
                verify_temp_count(&text(&v.stdout)),
                Some(w.temp_files().len()),
                "{ctx}: {}",
                describe(&v)
            );

            // The runtime's retry, then gc (a live record: nothing replayed, the
            // temporary file gone), then the head's DEL, which takes the note too.
            let out = tail(command, &[]);
            assert!(out.status.success(), "{ctx}: retry: {}", describe(&out));
            assert_eq!(w.list_json()[0]["chainState"], json!("completed"), "{ctx}");
            let (g, rep) = w.gc(&[], &[]);
            assert_eq!(g.status.code(), Some(0), "{ctx}: gc: {}", describe(&g));
            assert_eq!(rep.unwrap()["summary"]["replayed"], json!(0), "{ctx}");
            assert!(w.temp_files().is_empty(), "{ctx}: {:?}", w.temp_files());
            w.del(cid);
            assert!(w.records().is_empty(), "{ctx}");
            let notes = w.ledger_dir.join("notes");
            assert!(list_dir(&notes).is_empty(), "{ctx}: {:?}", list_dir(&notes));
        }
    }
    eprintln!("FIGURE crash: notes: {trials} crashes");
}

/// A record retired by the head's DEL while its ADD was in the chain, and restored by the
/// tail's ADD (docs/CHAIN.md, "An ADD still in the chain"): a crash right after either
/// rename leaves the record whole in one of the two places, byte for byte, and the
/// runtime's retry, `list`, `verify`, gc and the last DEL all work from there.
#[test]
fn crash_while_retiring_and_restoring() {
    require_root!();
    let ns = Netns::with_prefix("clr");
    let result = json!({"cniVersion": "1.0.0", "ips": [{"address": "198.18.0.9/24"}]});
    let cid = "r-0";
    for point in ["retire.renamed", "restore.renamed"] {
        let ctx = point;
        let w = World::new("crash-retire", NET, "0");
        w.write_conflist(1, &[json!({"type": "counter"}), w.tail_entry()]);
        let retired_dir = w.ledger_dir.join("retired");
        let retired = || files_of(&retired_dir, false);
        let tail_add = |crash: &[(&str, &str)]| {
            w.plugin_with(
                &w.tail_stdin(&result),
                "ADD",
                cid,
                "eth0",
                Some(&ns.path_str()),
                crash,
            )
        };
        // The head recorded; the chain has not completed when the DEL comes.
        w.add(cid, &ns.path_str(), &[]);
        let record = w.records();
        assert_eq!(record.len(), 1, "{ctx}");
        let spec = format!("{point}:1");
        let crash = [("CNI_LEDGER_TEST_CRASH_AT", spec.as_str())];
        if point == "retire.renamed" {
            let out = w.plugin("DEL", cid, "eth0", None, &crash);
            assert!(killed_by_sigkill(&out), "{ctx}: {}", describe(&out));
            assert!(w.records().is_empty(), "{ctx}");
            assert_eq!(
                retired().into_values().collect::<Vec<_>>(),
                vec![record.values().next().unwrap().clone()],
                "{ctx}"
            );
            assert_eq!(w.list_json()[0]["chainState"], json!("retired"), "{ctx}");
            // The runtime's retry of the DEL finds nothing more to do.
            w.del(cid);
            assert_eq!(retired().len(), 1, "{ctx}");
            let out = tail_add(&[]);
            assert!(out.status.success(), "{ctx}: {}", describe(&out));
        } else {
            w.del(cid);
            assert_eq!(retired().len(), 1, "{ctx}");
            let out = tail_add(&crash);
            assert!(killed_by_sigkill(&out), "{ctx}: {}", describe(&out));
            assert_eq!(w.records(), record, "{ctx}: not the same record back");
            assert!(retired().is_empty(), "{ctx}");
            assert_eq!(w.list_json()[0]["chainState"], json!("pending"), "{ctx}");
            // The chain's ADD is retried (libcni returned the error): the tail completes.
            let out = tail_add(&[]);
            assert!(out.status.success(), "{ctx}: retry: {}", describe(&out));
        }
        assert_eq!(w.records(), record, "{ctx}: the record changed");
        assert!(retired().is_empty(), "{ctx}");
        let rows = w.list_json();
        assert_eq!(rows.len(), 1, "{ctx}: {rows:#?}");
        assert_eq!(rows[0]["chainState"], json!("completed"), "{ctx}");
        let v = w.verify();
        assert_eq!(v.status.code(), Some(0), "{ctx}: {}", describe(&v));
        let (g, rep) = w.gc(&[], &[]);
        assert_eq!(g.status.code(), Some(0), "{ctx}: gc: {}", describe(&g));
        assert_eq!(rep.unwrap()["summary"]["replayed"], json!(0), "{ctx}: live");
        w.del(cid);
        assert!(w.records().is_empty() && retired().is_empty(), "{ctx}");
    }
    eprintln!("FIGURE crash: retire and restore: 2 crashes");
}

/// The conflist memo (`snapshots/.conf-memo.*`, written after the record): a crash while
/// an ADD writes it leaves that ADD's record whole, and every later ADD records the chain
/// of the conflist then in place, memo or none.
#[test]
fn crash_while_writing_the_conflist_memo() {
    require_root!();
    const ROUNDS: usize = 4;
    let ns = Netns::with_prefix("clm");
    let counter = [json!({"type": "counter"})];
    let memos = |w: &World| -> Vec<String> {
        list_dir(&w.ledger_dir.join("snapshots"))
            .into_iter()
            .filter(|n| n.starts_with(".conf-memo."))
            .collect()
    };
    for point in ["memo.tmp-written", "memo.tmp-synced", "memo.renamed"] {
        let w = World::new("crash-memo", NET, "0");
        w.write_conflist(1, &counter);
        // Only a conflist settled for the memo's margin is remembered.
        std::thread::sleep(std::time::Duration::from_millis(3300));
        let conflist = w.conflist_bytes();
        for round in 0..ROUNDS {
            let ctx = format!("{point}, round {round}");
            for memo in memos(&w) {
                std::fs::remove_file(w.ledger_dir.join("snapshots").join(memo)).unwrap();
            }
            let cid = format!("m-{round}");
            let spec = format!("{point}:1");
            let out = w.plugin(
                "ADD",
                &cid,
                "eth0",
                Some(&ns.path_str()),
                &[("CNI_LEDGER_TEST_CRASH_AT", &spec)],
            );
            assert!(killed_by_sigkill(&out), "{ctx}: {}", describe(&out));
            let rec = std::fs::read(w.record_path(&cid)).unwrap();
            check_added(&rec, &cid, &ns.path_str(), &conflist, &w, None);
            assert_eq!(
                memos(&w).len(),
                usize::from(point == "memo.renamed"),
                "{ctx}: {:?}",
                memos(&w)
            );
            // The runtime's retry and the next pod: recorded as before.
            w.add(&cid, &ns.path_str(), &[]);
            let retried = std::fs::read(w.record_path(&cid)).unwrap();
            let old = decode_record(&rec).ok();
            check_added(&retried, &cid, &ns.path_str(), &conflist, &w, old.as_ref());
            let next = format!("n-{round}");
            w.add(&next, &ns.path_str(), &[]);
            let next_rec = std::fs::read(w.record_path(&next)).unwrap();
            check_added(&next_rec, &next, &ns.path_str(), &conflist, &w, None);
            let v = w.verify();
            assert_eq!(v.status.code(), Some(0), "{ctx}: {}", describe(&v));
        }
        // The memo left standing does not outlive the conflist it names.
        w.write_conflist(2, &counter);
        let changed = w.conflist_bytes();
        w.add("after", &ns.path_str(), &[]);
        let rec = std::fs::read(w.record_path("after")).unwrap();
        check_added(&rec, "after", &ns.path_str(), &changed, &w, None);
        let (g, _) = w.gc(&[], &[]);
        assert_eq!(g.status.code(), Some(0), "{point}: gc: {}", describe(&g));
        assert!(w.temp_files().is_empty(), "{point}: {:?}", w.temp_files());
    }
    eprintln!("FIGURE crash: conflist memo: {} crashes", 3 * ROUNDS);
}

/// The text of a call's arguments: `text` up to the parenthesis that closes the call.
fn call_args(text: &str) -> &str {
    let (mut depth, mut in_str, mut escaped) = (1, false, false);
    for (i, c) in text.char_indices() {
        match (in_str, c) {
            (true, _) if escaped => escaped = false,
            (true, '\\') => escaped = true,
            (_, '"') => in_str = !in_str,
            (false, '(') => depth += 1,
            (false, ')') => {
                depth -= 1;
                if depth == 0 {
                    return &text[..i];
                }
            }
            _ => {}
        }
    }
    text
}

/// Every crash point the binary has is exercised here (a new one must be added above),
/// or named below as another test's.
#[test]
fn every_crash_point_is_covered() {
    fn sources(dir: &std::path::Path, out: &mut String) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push_str(&std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let mut src = String::new();
    sources(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut src,
    );
    let covered = [
        "record.tmp-written",
        "record.tmp-synced",
        "record.renamed",
        "record.dir-synced",
        "snapshot.tmp-written",
        "snapshot.tmp-synced",
        "snapshot.renamed",
        "snapshot.dir-synced",
        "memo.tmp-written",
        "memo.tmp-synced",
        "memo.renamed",
        "note.tmp-written",
        "note.renamed",
        "remove.unlinked",
        "quarantine.renamed",
        "gc.key-released",
        "retire.renamed",
        "restore.renamed",
    ];
    // Files outside the ledger, written by the same fsio code whose crash points the
    // record trials above try; a crash while writing them is not tried here: the
    // conflists inject and the agent edit, the agent's installed binary, the devices'
    // notes, and the writes of src's own unit tests.
    let elsewhere = ["conflist", "binary", "devices", "test"];

    // The crash points each fsio writer passes, named `{what}.<suffix>` by its caller.
    let writers: [(&str, &[&str]); 5] = [
        (
            "write_atomic(",
            &["tmp-written", "tmp-synced", "renamed", "dir-synced"],
        ),
        (
            "write_atomic_mode(",
            &["tmp-written", "tmp-synced", "renamed", "dir-synced"],
        ),
        ("replace_atomic(", &["tmp-written", "tmp-synced", "renamed"]),
        ("replace_unsynced(", &["tmp-written", "renamed"]),
        ("write_temp(", &["tmp-written", "tmp-synced"]),
    ];
    let mut found = BTreeSet::new();
    for part in src.split("crash_point(").skip(1) {
        let arg = part.split(')').next().unwrap_or("");
        if let Some(lit) = arg.split('"').nth(1) {
            if !lit.starts_with("{what}") {
                found.insert(lit.to_string());
            }
        }
    }
    // Each call of a writer: its last string literal is `what` (the record's writer
    // passes `fsio::write_atomic` by name, its `what` beside it).
    found.extend(
        ["tmp-written", "tmp-synced", "renamed", "dir-synced"].map(|s| format!("record.{s}")),
    );
    for (writer, suffixes) in writers {
        for call in src.split(writer).skip(1) {
            let args = call_args(call);
            let what = args
                .split('"')
                .enumerate()
                .filter(|(i, _)| i % 2 == 1)
                .map(|(_, lit)| lit)
                .last();
            let Some(what) = what else { continue }; // the definition, or a name passed
            if elsewhere.contains(&what) {
                continue;
            }
            for suffix in suffixes {
                found.insert(format!("{what}.{suffix}"));
            }
        }
    }
    let covered: BTreeSet<String> = covered.iter().map(|s| s.to_string()).collect();
    assert_eq!(found, covered, "crash points in src/ vs. those tested");
    eprintln!("FIGURE crash: {} crash points", covered.len());
}

/// A panic in plugin mode reaches the runtime as a CNI error on stdout (code 999), not
/// as a bare crash. Triggered from outside: the plugin GC verb scans the ledger on
/// threads, and a thread stack no system can map (`RUST_MIN_STACK`, which Rust reads
/// at spawn) makes the spawn panic.
#[test]
fn a_panic_in_plugin_mode_is_a_cni_error_on_stdout() {
    require_root!();
    let w = World::new("panic", NET, "0");
    let ns = Netns::with_prefix("clp");
    w.add("c-1", &ns.path_str(), &[]);
    let mut stdin: Value = serde_json::from_slice(&w.stdin()).unwrap();
    stdin["cniVersion"] = json!("1.1.0");
    stdin["cni.dev/valid-attachments"] = json!([{"containerID": "c-1", "ifname": "eth0"}]);
    let mut c = std::process::Command::new(ledger_bin());
    c.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", "GC")
        .env("CNI_PATH", w.cni_path())
        .env("RUST_MIN_STACK", "18446744073709551615")
        .env("RUST_BACKTRACE", "0");
    let out = run_with_stdin(c, &serde_json::to_vec(&stdin).unwrap());
    if out.status.success() {
        eprintln!("NOTE crash: could not make the plugin panic from outside; not tested");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one CNI error JSON ({e}): {}", describe(&out)));
    assert_eq!(err["code"], json!(999), "{err}");
    assert_eq!(err["cniVersion"], json!("1.1.0"), "{err}");
    assert!(
        err["msg"].as_str().is_some_and(|m| m.contains("panicked")),
        "{err}"
    );
    assert!(err["details"].is_string(), "{err}");
    assert!(
        text(&out.stderr).contains("panicked"),
        "the panic message belongs on stderr / in the log"
    );
    // The ledger is untouched.
    assert!(w.record_path("c-1").exists());
    assert_eq!(w.verify().status.code(), Some(0));
    eprintln!(
        "FIGURE crash: plugin panic -> CNI error: {}",
        text(&out.stdout).trim()
    );
}
