//! Upgrades and rollbacks do no harm (docs/OPERATING.md "Upgrades and rollbacks").
//!
//! - The agent's install step replaces the binary in the CNI bin dir again and again (two
//!   builds told apart by bytes appended to the ELF file, the agent run from each in
//!   turn) while 32 loops ADD and DEL through libcni on a real chain: no call fails (a
//!   half-written file or ETXTBSY would), every attachment still added has its record,
//!   none deleted has one.
//! - After a rollback, the older (this) binary meets records a newer one wrote (format
//!   2, naming a snapshot of their own): gc skips them and keeps their snapshots even
//!   while it sweeps, `verify` and `list` say why and exit 0, and DEL through libcni
//!   succeeds and leaves the record whole.
//!
//!     cargo test --features testing --test upgrade
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agent_common::*;
use common::*;
use serde_json::{json, Value};

const LOOPS: usize = 32;
/// Replacements the agent must make while the loops run.
const REPLACEMENTS: usize = 6;

/// `ledger_bin()` with `tag` appended: the loader ignores bytes past the ELF's sections,
/// so it runs as the same program, but the agent's install sees another binary.
fn tagged_copy(dir: &Path, tag: &str) -> (PathBuf, Vec<u8>) {
    let mut bytes = fs::read(ledger_bin()).unwrap();
    bytes.extend_from_slice(format!("\ncni-ledger-upgrade-test {tag}\n").as_bytes());
    let path = dir.join(format!("cni-ledger-{tag}"));
    fs::write(&path, &bytes).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    (path, bytes)
}

/// Runs the agent from `bin` until the CNI bin dir holds its bytes, then stops it.
fn install_with_agent(f: &Fixture, bin: &Path, bytes: &[u8], n: usize) {
    let target = f.bin_dir.join("cni-ledger");
    let log = f.tmp.path().join(format!("agent-{n}.log"));
    let mut args = dir_args(&f.bin_dir, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    // The chain stays as the loops' ADDs found it: no tail entry placed.
    args.extend(["--no-tail", "--gc-interval", "3600"].map(String::from));
    let mut agent = Agent::start(bin, &args, &log, None);
    // The length tells the builds apart cheaply; the bytes are compared once it matches.
    wait_for(Duration::from_secs(60), || {
        fs::metadata(&target).is_ok_and(|m| m.len() == bytes.len() as u64)
    })
    .unwrap_or_else(|| {
        panic!(
            "agent {n} never installed its binary:\n{}",
            agent.log_text()
        )
    });
    assert!(
        fs::read(&target).unwrap() == bytes,
        "agent {n}: the installed binary differs from its own (torn?)"
    );
    assert!(agent.stop(30).success(), "agent {n}:\n{}", agent.log_text());
}

/// Sets the flag when dropped: the loops stop even when the rollout panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn the_agent_replaces_the_binary_under_32_add_del_loops_and_no_call_fails() {
    require_root!();
    let f = Fixture::new();
    let target = f.bin_dir.join("cni-ledger");
    fs::remove_file(&target).unwrap(); // the fixture's symlink: the agent installs it
    let builds = [
        tagged_copy(f.tmp.path(), "a"),
        tagged_copy(f.tmp.path(), "bb"),
    ];
    install_with_agent(&f, &builds[0].0, &builds[0].1, 0);

    let keep: Vec<Netns> = (0..LOOPS).map(|_| Netns::with_prefix("clupk")).collect();
    let cycle: Vec<Netns> = (0..LOOPS).map(|_| Netns::with_prefix("clupc")).collect();
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let calls = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    // Per loop: the attachments it DELeted, and the one it left added.
    let deleted: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let added: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    let mut replaced = 0;
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for i in 0..LOOPS {
            let (f, failures, calls, done) = (&f, &failures, &calls, &done);
            let (deleted, added) = (&deleted, &added);
            let (keep, cycle) = (keep[i].path_str(), cycle[i].path_str());
            s.spawn(move || {
                let fail = |what: String| failures.lock().unwrap().push(what);
                // One attachment made before the replacements and kept through them all.
                let kept = format!("upk{i}");
                match f.add(&kept, "eth0", Some(&keep), None) {
                    Ok(_) => added.lock().unwrap().push((kept.clone(), keep.clone())),
                    Err(e) => fail(format!("ADD {kept}: {e}")),
                }
                for j in 0.. {
                    let cid = format!("upc{i}-{j}");
                    calls.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = f.add(&cid, "eth0", Some(&cycle), None) {
                        fail(format!("ADD {cid}: {e}"));
                    } else if done.load(Ordering::Relaxed) && i % 2 == 0 {
                        // Half the loops end on an ADD: its record must be there.
                        added.lock().unwrap().push((cid, cycle.clone()));
                        break;
                    } else {
                        calls.fetch_add(1, Ordering::Relaxed);
                        match f.del(&cid, "eth0", Some(&cycle), None) {
                            Ok(()) => deleted.lock().unwrap().push(cid),
                            Err(e) => fail(format!("DEL {cid}: {e}")),
                        }
                    }
                    if done.load(Ordering::Relaxed) && i % 2 == 1 {
                        break;
                    }
                }
            });
        }
        // The loops end when the rollout does, however it ends (a panic included).
        let _stop = StopOnDrop(&done);
        // The rollout: the agent of each build in turn installs itself over the other.
        while replaced < REPLACEMENTS {
            let (bin, bytes) = &builds[(replaced + 1) % 2];
            install_with_agent(&f, bin, bytes, replaced + 1);
            replaced += 1;
            assert!(
                t0.elapsed() < Duration::from_secs(300),
                "only {replaced} replacements in 300 s"
            );
        }
    });
    let failures = failures.into_inner().unwrap();
    let (added, deleted) = (added.into_inner().unwrap(), deleted.into_inner().unwrap());
    eprintln!(
        "upgrade: {replaced} replacements, {} ADD/DEL calls through libcni in {:?}; {} left added, {} deleted",
        calls.load(Ordering::Relaxed) + LOOPS,
        t0.elapsed(),
        added.len(),
        deleted.len()
    );
    assert!(
        failures.is_empty(),
        "{} call(s) failed while the binary was replaced:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        deleted.len() >= LOOPS,
        "too few DELs ran during the replacements: {}",
        deleted.len()
    );
    assert_eq!(added.len(), LOOPS + LOOPS / 2);
    for (cid, _) in &added {
        let path = f.record_path(cid, "eth0");
        let bytes = fs::read(&path).unwrap_or_else(|e| panic!("{cid}: record lost ({e})"));
        let rec = records::decode_record(&bytes).unwrap_or_else(|e| panic!("{cid}: {e}"));
        assert_eq!(rec["containerId"], json!(cid), "{rec}");
    }
    for cid in &deleted {
        assert!(
            !f.record_path(cid, "eth0").exists(),
            "{cid}: DEL succeeded but its record is still there"
        );
    }
    assert_eq!(
        f.record_files().len(),
        added.len(),
        "records of no attachment: {:?}",
        f.record_files()
    );
    let last = &builds[REPLACEMENTS % 2].1;
    assert!(
        fs::read(&target).unwrap() == *last,
        "the last build is not the one installed"
    );
    assert_eq!(mode_of(&target), 0o755);
    assert_eq!(list_dir(&f.bin_dir), ["cni-ledger"], "temp files left");
    // And the build now in place tears down what the others added.
    for (cid, ns) in &added {
        f.del(cid, "eth0", Some(ns), None)
            .unwrap_or_else(|e| panic!("DEL {cid}: {e}"));
    }
    assert!(f.record_files().is_empty(), "{:?}", f.record_files());
    assert!(f.ipam_addresses().is_empty(), "{:?}", f.ipam_addresses());
}

// ---------------------------------------------------------------------------------------
// a rollback over newer-format records
// ---------------------------------------------------------------------------------------

/// Rewrites a record as a newer binary would write it: format 2, a field this binary does
/// not know, and `snapshot` naming `snapshot` (its own chain's, which it stored), or no
/// `snapshot` field at all (the newer format names its chain some other way).
fn make_newer(f: &Fixture, cid: &str, snapshot: Option<&str>, extra: Value) -> Vec<u8> {
    let path = f.record_path(cid, "eth0");
    let old: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let mut rec = old["record"].clone();
    match snapshot {
        Some(h) => rec["snapshot"] = json!(h),
        None => {
            rec.as_object_mut().unwrap().remove("snapshot");
        }
    }
    rec["fromTheFuture"] = extra;
    let body = serde_json::to_string(&rec).unwrap();
    let bytes = format!(
        "{{\"format\":2,\"sha256\":\"{}\",\"record\":{body}}}\n",
        records::sha256_of(body.as_bytes())
    )
    .into_bytes();
    fs::write(&path, &bytes).unwrap();
    bytes
}

/// Stores `bytes` as a snapshot, as any binary does: named by their sha256.
fn put_snapshot(f: &Fixture, bytes: &[u8]) -> String {
    let hash = records::sha256_of(bytes);
    let path = f.snapshots_dir().join(format!("{hash}.json"));
    fs::write(&path, bytes).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    hash
}

fn snapshot_exists(f: &Fixture, hash: &str) -> bool {
    f.snapshots_dir().join(format!("{hash}.json")).exists()
}

#[test]
fn a_rollback_leaves_newer_records_and_their_snapshots_whole() {
    require_root!();
    let f = Fixture::new();
    let mut gone_new = Netns::with_prefix("clupn");
    let mut gone_old = Netns::with_prefix("clupo");
    f.add("newer", "eth0", Some(&gone_new.path_str()), None)
        .unwrap();
    f.add("older", "eth0", Some(&gone_old.path_str()), None)
        .unwrap();
    let today = f.record_path("older", "eth0");
    let today_snapshot = records::decode_record(&fs::read(&today).unwrap()).unwrap()["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    // The newer binary's chain (another conflist) and its record naming it.
    let mut newer_chain = f.conflist(&f.spec);
    newer_chain["plugins"][1]["comment"] = json!("the newer binary's chain");
    let newer_snapshot = put_snapshot(&f, &serde_json::to_vec(&newer_chain).unwrap());
    let newer_bytes = make_newer(&f, "newer", Some(&newer_snapshot), json!({"x": 1}));
    let newer_path = f.record_path("newer", "eth0");
    let ips_before = f.ipam_addresses();
    assert_eq!(ips_before.len(), 2);
    // Both sandboxes are gone (a reboot would do the same).
    gone_new.delete();
    gone_old.delete();

    // gc replays the older record (so it sweeps snapshots), skips the newer one.
    let (out, rep) = f.gc(&["--grace", "0"]);
    let rep = rep.unwrap_or_else(|| panic!("gc printed no JSON: {}", describe(&out)));
    assert_eq!(out.status.code(), Some(0), "gc: {}", describe(&out));
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep}");
    assert_eq!(rep["summary"]["newer"], json!(1), "{rep}");
    assert_eq!(rep["summary"]["damaged"], json!(0), "{rep}");
    assert_eq!(rep["damaged"], json!([]), "{rep}");
    assert_eq!(
        rep["newer"],
        json!([{"file": newer_path.display().to_string(), "format": 2,
                "reason": "newer format, left for a newer binary"}]),
        "{rep}"
    );
    assert!(!today.exists(), "the older record was replayed and removed");
    assert!(
        !snapshot_exists(&f, &today_snapshot),
        "the sweep ran: the replayed record's snapshot, named by nothing else, is gone"
    );
    assert!(
        snapshot_exists(&f, &newer_snapshot),
        "the sweep deleted the snapshot a newer record names"
    );
    assert_eq!(
        fs::read(&newer_path).unwrap(),
        newer_bytes,
        "newer record changed"
    );
    assert_eq!(
        f.ipam_addresses().len(),
        1,
        "no DEL replayed for the newer record"
    );
    assert!(
        f.quarantine_files().is_empty(),
        "{:?}",
        f.quarantine_files()
    );

    // A newer record whose snapshot this binary cannot find in it: while it is there,
    // the sweep keeps every snapshot, even one no record names.
    let mut gone_third = Netns::with_prefix("clupt");
    f.add("untold", "eth0", Some(&gone_third.path_str()), None)
        .unwrap();
    let mut gone_fourth = Netns::with_prefix("clupf");
    f.add("older2", "eth0", Some(&gone_fourth.path_str()), None)
        .unwrap();
    let untold_bytes = make_newer(&f, "untold", None, json!({"chainRef": "q83v"}));
    gone_third.delete();
    gone_fourth.delete();
    let (out, rep) = f.gc(&["--grace", "0"]);
    let rep = rep.unwrap_or_else(|| panic!("gc printed no JSON: {}", describe(&out)));
    assert_eq!(out.status.code(), Some(0), "gc: {}", describe(&out));
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep}");
    assert_eq!(rep["summary"]["newer"], json!(2), "{rep}");
    assert!(
        snapshot_exists(&f, &today_snapshot),
        "no snapshot may go while a newer record's cannot be told"
    );
    assert!(snapshot_exists(&f, &newer_snapshot));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("newer-format record(s) name snapshots this binary cannot tell"),
        "gc: {}",
        describe(&out)
    );

    // gc's table says so too.
    let cache = f.cache_dir.display().to_string();
    let human = f.ledger(&["gc", "--grace", "0", "--cni-cache-dir", &cache]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert_eq!(human.status.code(), Some(0), "gc: {}", describe(&human));
    assert!(text.contains(", damaged 0, newer format 2"), "{text}");
    assert!(
        text.contains(&format!(
            "newer: {} (format 2): newer format, left for a newer binary",
            newer_path.display()
        )),
        "{text}"
    );

    // verify: counted apart, not damage, exit 0.
    let v = f.ledger(&["verify"]);
    let text = String::from_utf8_lossy(&v.stdout);
    assert_eq!(v.status.code(), Some(0), "verify: {}", describe(&v));
    assert!(
        text.contains(&format!(
            "newer: {}: format 2, newer format, left for a newer binary",
            newer_path.display()
        )),
        "{text}"
    );
    assert!(
        text.contains("2 newer-format record(s) (not damage)"),
        "{text}"
    );
    assert!(text.contains(", 0 damaged,"), "{text}");

    // list: shown, with why, and exit 0.
    let rows = f.list_json();
    let row = rows
        .iter()
        .find(|r| r["file"] == json!(newer_path.display().to_string()))
        .unwrap_or_else(|| panic!("list does not show the newer record: {rows:#?}"));
    assert_eq!(row["state"], "unknown", "{row}");
    assert_eq!(row["reason"], "newer-format-2", "{row}");
    assert_eq!(
        row["details"], "newer format, left for a newer binary",
        "{row}"
    );
    // The key, as far as a tolerant read finds it, to tell which pod it is.
    assert_eq!(row["network"], json!(f.network), "{row}");
    assert_eq!(row["containerId"], "newer", "{row}");
    assert_eq!(row["ifname"], "eth0", "{row}");
    let table = f.ledger(&["list"]);
    assert!(table.status.success(), "{}", describe(&table));
    assert!(
        String::from_utf8_lossy(&table.stdout).lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.starts_with(&["cltest", "newer", "eth0", "unknown", "newer-format-2"])
                && l.ends_with("newer format, left for a newer binary")
        }),
        "{}",
        describe(&table)
    );

    // DEL through libcni: the chain's DELs run (the address goes back), the ledger's
    // succeeds and leaves the record whole for the newer binary.
    f.del("newer", "eth0", None, None)
        .unwrap_or_else(|e| panic!("DEL of a newer record failed: {e}"));
    assert_eq!(
        fs::read(&newer_path).unwrap(),
        newer_bytes,
        "DEL changed it"
    );
    assert!(snapshot_exists(&f, &newer_snapshot));
    assert!(
        f.log()
            .contains("record of format 2: newer format, left for a newer binary"),
        "{}",
        f.log()
    );
    let untold_path = f.record_path("untold", "eth0");
    assert_eq!(fs::read(&untold_path).unwrap(), untold_bytes);
    assert!(
        f.quarantine_files().is_empty(),
        "{:?}",
        f.quarantine_files()
    );
}
