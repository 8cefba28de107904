//! Damaged records and snapshots (docs/DESIGN.md §4 "Integrity"): truncated at random offsets
//! and bit-flipped (deterministic PRNG). Each damaged file must be detected (`verify`
//! exits 1 and names it), never reported live by `list` (which shows it damaged and
//! moves it to quarantine/), reported and quarantined by `gc` with no plugin run for it
//! (counting plugin), and never silently deleted (quarantine holds the exact bytes).
//!
//!     cargo test --features testing --test damage -- --nocapture   (prints the figures)

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod rel;

use common::*;
use rel::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

const RECORD_VARIANTS: usize = 400;
const SNAPSHOT_VARIANTS: usize = 200;
const BATCH: usize = 25;
const NET: &str = "dmg";

/// What an independent reading says a damaged variant is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// Same record (only the envelope's format 1→0 or the final newline changed):
    /// may be read as intact or as damaged.
    Harmless,
    /// A well-formed envelope of a newer format: left alone for a newer binary, but
    /// reported and never acted on.
    Newer,
    Damaged,
}

fn classify(orig: &[u8], bytes: &[u8]) -> Class {
    let o: Value = serde_json::from_slice(orig).unwrap();
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return Class::Damaged;
    };
    let envelope_ok = v.as_object().is_some_and(|m| m.len() == 3)
        && v["sha256"].is_string()
        && v.get("record").is_some();
    match v["format"].as_u64() {
        Some(f) if f > 1 && f <= u32::MAX as u64 && envelope_ok => Class::Newer,
        Some(0 | 1) if v["record"] == o["record"] && v["sha256"] == o["sha256"] => Class::Harmless,
        _ => Class::Damaged,
    }
}

/// Truncation (even variants) or one flipped bit (odd variants). For records, three in
/// every hundred are chosen edge cases: the format digit 1 flipped to 3 (a "newer"
/// record) or to 0, and the final newline cut (both harmless).
fn damage(rng: &mut Prng, i: usize, orig: &[u8], record: bool) -> (Vec<u8>, String, &'static str) {
    let format_digit = orig
        .windows(10)
        .position(|w| w == b"\"format\":1")
        .map(|p| p + 9);
    match (record, i % 100, format_digit) {
        (true, 95, Some(pos)) | (true, 97, Some(pos)) => {
            let bit = if i % 100 == 95 { 1 } else { 0 };
            let mut b = orig.to_vec();
            b[pos] ^= 1 << bit;
            let how = format!("format digit flipped to {}", b[pos] as char);
            return (b, how, "format-digit");
        }
        (true, 99, _) => {
            return (
                orig[..orig.len() - 1].to_vec(),
                "final newline cut".to_string(),
                "newline-cut",
            )
        }
        _ => {}
    }
    let keep_newline_cut = record;
    if i.is_multiple_of(2) {
        // Cutting only a record's final '\n' leaves the record whole: not damage.
        let hi = if keep_newline_cut {
            orig.len() - 1
        } else {
            orig.len()
        };
        let cut = rng.range(0, hi);
        (
            orig[..cut].to_vec(),
            format!("truncated at {cut}/{}", orig.len()),
            "truncated",
        )
    } else {
        let pos = rng.range(0, orig.len());
        let bit = rng.range(0, 8);
        let mut b = orig.to_vec();
        b[pos] ^= 1 << bit;
        (
            b,
            format!("bit {bit} of byte {pos}/{} flipped", orig.len()),
            "bit-flipped",
        )
    }
}

fn quarantined_copy(w: &World, name: &str, bytes: &[u8]) -> Option<String> {
    w.quarantine()
        .into_iter()
        .find(|(q, b)| q.starts_with(&format!("{name}.")) && b == bytes)
        .map(|(q, _)| q)
}

#[test]
fn damaged_records_are_detected_quarantined_and_never_replayed() {
    require_root!();
    let live_ns = Netns::with_prefix("cld");
    let mut rng = Prng::new(0xda4a6e);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let start = std::time::Instant::now();
    for batch in 0..RECORD_VARIANTS / BATCH {
        let list_first = batch % 2 == 1;
        let w = World::new("dmg", NET, "0");
        let mut gone = Netns::with_prefix("cld");
        w.add("live-0", &live_ns.path_str(), &[]);
        w.add("stale-0", &gone.path_str(), &[]);
        // variant cid -> (class, damaged bytes, description)
        let mut variants: BTreeMap<String, (Class, Vec<u8>, String)> = BTreeMap::new();
        for j in 0..BATCH {
            let i = batch * BATCH + j;
            let cid = format!("v-{i}");
            w.add(&cid, &gone.path_str(), &[]);
            let path = w.record_path(&cid);
            let orig = std::fs::read(&path).unwrap();
            let (bytes, how, kind) = damage(&mut rng, i, &orig, true);
            std::fs::write(&path, &bytes).unwrap();
            let class = classify(&orig, &bytes);
            *counts
                .entry(match class {
                    Class::Harmless => "=harmless",
                    Class::Newer => "=newer-format",
                    Class::Damaged => "=damaged",
                })
                .or_default() += 1;
            *counts.entry(kind).or_default() += 1;
            variants.insert(cid, (class, bytes, how));
        }
        gone.delete();
        let ctx = |cid: &str| {
            let (c, _, how) = &variants[cid];
            format!("batch {batch}, record {cid} ({how}, {c:?})")
        };

        // verify: exit 1, names every damaged one, changes nothing
        let before = w.records();
        let v = w.verify();
        let vout = text(&v.stdout);
        assert_eq!(v.status.code(), Some(1), "verify: {}", describe(&v));
        for (cid, (class, _, _)) in &variants {
            let path = w.record_path(cid).display().to_string();
            match class {
                Class::Damaged => assert!(
                    verify_names(&vout, &w.record_path(cid)),
                    "{}: verify does not name it:\n{vout}",
                    ctx(cid)
                ),
                // Named apart, as no damage.
                Class::Newer => assert!(
                    !verify_names(&vout, &w.record_path(cid))
                        && vout
                            .lines()
                            .any(|l| l.starts_with("newer: ") && l.contains(&path)),
                    "{}: verify does not name it newer:\n{vout}",
                    ctx(cid)
                ),
                Class::Harmless => {}
            }
        }
        assert!(!verify_names(&vout, &w.record_path("live-0")));
        assert!(!verify_names(&vout, &w.record_path("stale-0")));
        assert_eq!(w.records(), before, "verify changed the ledger");

        // detected = what the binary took for damage (all but some harmless ones)
        let mut detected: BTreeSet<String> = BTreeSet::new();
        let check_list = |detected: &mut BTreeSet<String>, quarantines: bool| {
            let rows = w.list_json();
            for r in &rows {
                let file = r["file"].as_str().unwrap_or("").to_string();
                let Some(cid) = variants
                    .keys()
                    .find(|c| w.record_path(c).display().to_string() == file)
                else {
                    continue;
                };
                let class = variants[cid].0;
                match (r["state"].as_str(), class) {
                    (Some("damaged"), Class::Damaged | Class::Harmless) => {
                        assert!(quarantines, "{}: damaged twice", ctx(cid));
                        assert!(
                            r["quarantinedTo"].is_string(),
                            "{}: list did not quarantine: {r}",
                            ctx(cid)
                        );
                        detected.insert(cid.clone());
                    }
                    (Some("stale"), Class::Harmless) => {}
                    (Some("unknown"), Class::Newer) => {}
                    (state, _) => panic!("{}: list shows it as {state:?}: {r}", ctx(cid)),
                }
            }
            for r in &rows {
                if r["state"] == "live" {
                    assert_eq!(r["containerId"], "live-0", "{r}");
                }
            }
            rows
        };
        let check_gc = |detected: &mut BTreeSet<String>| {
            let (g, rep) = w.gc(&[], &[]);
            let rep = rep.unwrap_or_else(|| panic!("gc printed no JSON: {}", describe(&g)));
            for d in rep["damaged"].as_array().unwrap() {
                let file = d["file"].as_str().unwrap();
                let cid = variants
                    .keys()
                    .find(|c| w.record_path(c).display().to_string() == file)
                    .unwrap_or_else(|| panic!("gc reports {file} damaged: {d}"));
                match variants[cid].0 {
                    Class::Newer => panic!("{}: a newer record reported damaged: {d}", ctx(cid)),
                    _ => {
                        assert!(
                            d["quarantinedTo"].is_string(),
                            "{}: gc did not quarantine: {d}",
                            ctx(cid)
                        );
                        detected.insert(cid.clone());
                    }
                }
            }
            for r in rep["records"].as_array().unwrap() {
                let cid = r["containerId"].as_str().unwrap();
                assert!(
                    cid == "stale-0" || variants[cid].0 == Class::Harmless,
                    "gc acted on {cid}: {r}"
                );
            }
            // newer records are reported apart, neither damage nor a failure
            let newer: BTreeSet<String> = variants
                .iter()
                .filter(|(_, v)| v.0 == Class::Newer)
                .map(|(c, _)| w.record_path(c).display().to_string())
                .collect();
            let reported: BTreeSet<String> = rep["newer"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|n| n["file"].as_str().unwrap().to_string())
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(reported, newer, "gc's newer-format records: {rep}");
            // exit 1 while anything damaged was found
            let want = if rep["damaged"].as_array().unwrap().is_empty() {
                0
            } else {
                1
            };
            assert_eq!(g.status.code(), Some(want), "gc: {}", describe(&g));
        };
        if list_first {
            check_list(&mut detected, true);
            check_gc(&mut detected);
        } else {
            check_gc(&mut detected);
            let rows = check_list(&mut detected, false);
            assert!(
                rows.iter().all(|r| r["state"] != "damaged"),
                "gc left damage for list: {rows:#?}"
            );
        }

        // every damaged one detected; nothing deleted: quarantine or records/ holds the bytes
        for (cid, (class, bytes, _)) in &variants {
            let name = w.record_name(cid);
            match class {
                Class::Damaged => {
                    assert!(detected.contains(cid), "{}: not detected", ctx(cid));
                    assert!(
                        quarantined_copy(&w, &name, bytes).is_some(),
                        "{}: not in quarantine with its bytes",
                        ctx(cid)
                    );
                    assert!(!w.record_path(cid).exists(), "{}", ctx(cid));
                }
                Class::Newer => assert_eq!(
                    std::fs::read(w.record_path(cid)).ok().as_ref(),
                    Some(bytes),
                    "{}: a newer-format record must be left in place",
                    ctx(cid)
                ),
                Class::Harmless => {
                    if detected.contains(cid) {
                        assert!(quarantined_copy(&w, &name, bytes).is_some(), "{}", ctx(cid));
                    }
                }
            }
        }

        // no plugin ran for a damaged (or newer) record, none for the live one
        for l in w.log_lines() {
            let ok = l.cid == "stale-0"
                || variants
                    .get(&l.cid)
                    .is_some_and(|v| v.0 == Class::Harmless && !detected.contains(&l.cid));
            assert!(ok, "batch {batch}: a DEL was replayed for {l:?}");
        }
        assert_eq!(
            w.log_lines().iter().filter(|l| l.cid == "stale-0").count(),
            1,
            "the intact stale record was not replayed once"
        );
        assert!(w.record_path("live-0").exists());
        let v = w.verify();
        // Quarantined damage is no damage left; a newer record is none at all.
        assert_eq!(
            v.status.code(),
            Some(0),
            "verify after gc: {}",
            describe(&v)
        );
    }
    eprintln!(
        "FIGURE damage: {RECORD_VARIANTS} damaged records tried ({counts:?}), {:.1}s",
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn damaged_snapshots_are_detected_quarantined_and_never_executed() {
    require_root!();
    let live_ns = Netns::with_prefix("cld");
    let mut rng = Prng::new(0x5a4a_5407);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let start = std::time::Instant::now();
    for batch in 0..SNAPSHOT_VARIANTS / BATCH {
        let w = World::new("dmgs", NET, "0");
        install_counter(
            &w.bin_dir,
            "counter-b",
            "b",
            &w.counter_log,
            &w.fail_dir,
            &w.lock_dir,
            "0",
        );
        let mut gone = Netns::with_prefix("cld");
        let a = [json!({"type": "counter"})];
        w.write_conflist(1, &a);
        w.add("live-0", &live_ns.path_str(), &[]);
        // snapshot file name -> (cid, damaged bytes, description)
        let mut variants: BTreeMap<String, (String, Vec<u8>, String)> = BTreeMap::new();
        for j in 0..BATCH {
            let i = batch * BATCH + j;
            let cid = format!("s-{i}");
            w.write_conflist(100 + i as u32, &a);
            w.add(&cid, &gone.path_str(), &[]);
            let name = format!("{}.json", sha256_of(&w.conflist_bytes()));
            let path = w.snapshots_dir().join(&name);
            let orig = std::fs::read(&path).unwrap();
            assert_eq!(
                orig,
                w.conflist_bytes(),
                "snapshot is not the conflist's bytes"
            );
            let (bytes, how, kind) = damage(&mut rng, i, &orig, false);
            std::fs::write(&path, &bytes).unwrap();
            *counts.entry(kind).or_default() += 1;
            variants.insert(name, (cid, bytes, how));
        }
        gone.delete();
        // Today's conflist has another plugin: what gc falls back to.
        w.write_conflist(2, &[json!({"type": "counter-b"})]);

        let v = w.verify();
        let vout = text(&v.stdout);
        assert_eq!(v.status.code(), Some(1), "verify: {}", describe(&v));
        for (name, (cid, _, how)) in &variants {
            assert!(
                verify_names(&vout, &w.snapshots_dir().join(name)),
                "snapshot of {cid} ({how}) not named by verify:\n{vout}"
            );
        }

        let (g, rep) = w.gc(&[], &[]);
        assert_eq!(g.status.code(), Some(0), "gc: {}", describe(&g));
        let rep = rep.unwrap();
        let log = text(&g.stderr);
        for r in rep["records"].as_array().unwrap() {
            assert_eq!(r["action"], "replayed", "{r}");
            assert_eq!(r["configSource"], "conflist", "{r}");
            let types: Vec<&str> = r["plugins"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["type"].as_str().unwrap())
                .collect();
            assert_eq!(types, ["counter-b"], "{r}");
        }
        for (name, (cid, bytes, how)) in &variants {
            let hash = name.trim_end_matches(".json");
            assert!(
                log.contains(&format!("snapshot {hash} is damaged")),
                "gc did not report the damaged snapshot of {cid} ({how}):\n{log}"
            );
            assert!(
                quarantined_copy(&w, name, bytes).is_some(),
                "damaged snapshot of {cid} ({how}) is not in quarantine with its bytes"
            );
            assert!(!w.snapshots_dir().join(name).exists());
        }
        let lines = w.log_lines();
        for l in &lines {
            assert_eq!(
                l.tag, "b",
                "a plugin of a damaged snapshot was executed: {l:?}"
            );
            assert_ne!(l.cid, "live-0");
        }
        assert_eq!(lines.len(), BATCH, "{lines:?}");
        assert_eq!(w.verify().status.code(), Some(0));
        assert_eq!(w.records().len(), 1);
    }
    eprintln!(
        "FIGURE damage: {SNAPSHOT_VARIANTS} damaged snapshots tried ({counts:?}), {:.1}s",
        start.elapsed().as_secs_f64()
    );
}

/// A plugin-face DEL of a damaged record drops nothing unseen: it quarantines the file.
#[test]
fn del_of_a_damaged_record_quarantines_it() {
    require_root!();
    let w = World::new("dmgd", NET, "0");
    let ns = Netns::with_prefix("cld");
    let mut rng = Prng::new(7);
    for i in 0..10 {
        let cid = format!("d-{i}");
        w.add(&cid, &ns.path_str(), &[]);
        let path = w.record_path(&cid);
        let orig = std::fs::read(&path).unwrap();
        let (bytes, how, _) = damage(&mut rng, i, &orig, true);
        std::fs::write(&path, &bytes).unwrap();
        let class = classify(&orig, &bytes);
        w.del(&cid);
        assert!(!path.exists(), "{cid} ({how})");
        if class == Class::Damaged {
            assert!(
                quarantined_copy(&w, &w.record_name(&cid), &bytes).is_some(),
                "{cid} ({how}): DEL dropped a damaged record without quarantine"
            );
        }
    }
    assert!(w.log_lines().is_empty());
}

/// Runs `c` to its end, failing the test if it takes longer than `secs` (a FIFO opened
/// for reading without O_NONBLOCK would hang gc forever).
fn output_within(mut c: std::process::Command, secs: u64) -> std::process::Output {
    use std::process::Stdio;
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = std::process::Command::new("kill")
                .args(["-9", &id.to_string()])
                .status();
            panic!("{c:?} still running after {secs} s (blocked?)");
        }
    }
}

/// Issue #30 item 6: what no writer could have made in `records/` (a FIFO under a
/// record's name and under another, a directory under a record's name, a name that is
/// not UTF-8) is reported once and moved into quarantine/ by the first gc, which never
/// blocks on the FIFO; the next gc finds nothing and exits 0. The live record is left
/// alone, and a DEL whose record is a FIFO succeeds and quarantines it.
#[test]
fn odd_entries_in_records_are_quarantined_once_never_blocking() {
    require_root!();
    use std::os::unix::ffi::OsStrExt;
    let w = World::new("dmgodd", NET, "0");
    let ns = Netns::with_prefix("clodd");
    w.add("keep", &ns.path_str(), &[]);
    let kept = std::fs::read(w.record_path("keep")).unwrap();
    let dir = w.records_dir();
    let mkfifo = |p: &std::path::Path| {
        nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
    };
    mkfifo(&dir.join(format!("{NET}:fifo:eth0.json")));
    mkfifo(&dir.join("plain-fifo"));
    std::fs::create_dir(dir.join(format!("{NET}:adir:eth0.json"))).unwrap();
    let not_utf8 = std::ffi::OsStr::from_bytes(b"dmg:\xff\xfe:eth0.json");
    std::fs::write(dir.join(not_utf8), b"{}").unwrap();

    let gc = || {
        let all = w.gc_args(&[]);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let out = output_within(w.cli_cmd(&refs), 60);
        let rep: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("no report ({e}): {}", describe(&out)));
        (out, rep)
    };
    let (out, rep) = gc();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert_eq!(rep["damaged"].as_array().unwrap().len(), 4, "{rep:#}");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!log.contains("cannot be quarantined"), "{log}");
    let mut names: Vec<Vec<u8>> = std::fs::read_dir(w.quarantine_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().as_bytes().to_vec())
        .collect();
    names.sort();
    let has = |prefix: &[u8]| names.iter().any(|n| n.starts_with(prefix));
    assert!(
        has(format!("{NET}:fifo:eth0.json.").as_bytes()),
        "{names:?}"
    );
    assert!(has(b"plain-fifo."), "{names:?}");
    assert!(
        has(format!("{NET}:adir:eth0.json.").as_bytes()),
        "{names:?}"
    );
    // The name's own bytes, not a lossy copy of them.
    assert!(has(b"dmg:\xff\xfe:eth0.json."), "{names:?}");
    assert_eq!(
        w.records().keys().cloned().collect::<Vec<_>>(),
        [w.record_name("keep")]
    );
    assert_eq!(std::fs::read(w.record_path("keep")).unwrap(), kept);

    let (out, rep) = gc();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(rep["damaged"].as_array().unwrap().is_empty(), "{rep:#}");

    // A FIFO where DEL reads its record: DEL succeeds (no I/O error every retry) and
    // the FIFO goes to quarantine/.
    std::fs::remove_file(w.record_path("keep")).unwrap();
    mkfifo(&w.record_path("keep"));
    let del = output_within(
        {
            let mut c = std::process::Command::new(ledger_bin());
            c.env("CNI_COMMAND", "DEL")
                .env("CNI_CONTAINERID", "keep")
                .env("CNI_IFNAME", "eth0")
                .env("CNI_PATH", w.cni_path())
                .stdin(std::fs::File::open(write_stdin(&w)).unwrap());
            c
        },
        60,
    );
    assert!(del.status.success(), "DEL: {}", describe(&del));
    assert!(w.record_path("keep").symlink_metadata().is_err());
    assert!(std::fs::read_dir(w.quarantine_dir()).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with(&w.record_name("keep"))));
}

/// The world's plugin stdin in a file (a Command's stdin).
fn write_stdin(w: &World) -> std::path::PathBuf {
    let p = w.ledger_dir.parent().unwrap().join("del-stdin.json");
    std::fs::write(&p, w.stdin()).unwrap();
    p
}

/// `cmd` run by `unshare -T --boottime <ahead>`: in a time namespace whose
/// CLOCK_BOOTTIME reads `ahead` seconds more than the host's.
fn in_time_ns(ahead: u64, cmd: &std::process::Command) -> std::process::Command {
    let mut c = std::process::Command::new("unshare");
    c.args(["-T", "--boottime", &ahead.to_string()])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env_clear();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    c
}

fn host_uptime() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Issue #30 item 6: a Linux time namespace offsets CLOCK_BOOTTIME, so a plugin and a gc
/// in different ones read one boot's clock apart. Ages stay right across them: a record
/// made a moment ago by ADD in a namespace 100000 s ahead, and one made in the host,
/// are both seconds old to gc in the host and to gc in that namespace (within
/// `--grace 3600`, so not replayed though their namespace is gone); with `--grace 0`
/// the same records are replayed, so the grace is what held them.
#[test]
fn record_ages_hold_across_time_namespaces() {
    require_root!();
    const AHEAD: u64 = 100_000;
    let w = World::new("dmgtime", NET, "0");
    let mut gone = Netns::with_prefix("cltime");
    let add = |cid: &str, ahead: bool| {
        let mut c = std::process::Command::new(ledger_bin());
        c.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", cid)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_NETNS", gone.path_str())
            .env("CNI_PATH", w.cni_path());
        let c = if ahead { in_time_ns(AHEAD, &c) } else { c };
        let out = run_with_stdin(c, &w.stdin());
        assert!(out.status.success(), "ADD {cid}: {}", describe(&out));
    };
    add("ahead", true);
    add("host", false);
    let up = host_uptime();
    for cid in ["ahead", "host"] {
        let v: Value = serde_json::from_slice(&std::fs::read(w.record_path(cid)).unwrap()).unwrap();
        let stamp = v["record"]["createdBootSecs"].as_f64().unwrap();
        assert!(
            (stamp - up).abs() < 60.0,
            "{cid}: createdBootSecs {stamp}, host uptime {up}"
        );
    }
    gone.delete();
    let gc = |grace: &str, ahead: bool| {
        let mut c = w.cli_cmd(&[
            "gc",
            "--json",
            "--now",
            "--grace",
            grace,
            "--cni-cache-dir",
            w.cache_dir.to_str().unwrap(),
        ]);
        if ahead {
            c = in_time_ns(AHEAD, &c);
        }
        let out = c.output().unwrap();
        let rep: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("no report ({e}): {}", describe(&out)));
        let mut actions: Vec<(String, String)> = rep["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["containerId"].as_str().unwrap_or_default().to_string(),
                    r["action"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        actions.sort();
        actions
    };
    let in_grace = vec![
        ("ahead".to_string(), "skip-grace".to_string()),
        ("host".to_string(), "skip-grace".to_string()),
    ];
    assert_eq!(gc("3600", true), in_grace, "gc {AHEAD} s ahead");
    assert_eq!(gc("3600", false), in_grace, "gc in the host");
    assert!(w.log_lines().is_empty(), "a plugin ran");
    let replayed = vec![
        ("ahead".to_string(), "replayed".to_string()),
        ("host".to_string(), "replayed".to_string()),
    ];
    assert_eq!(gc("0", true), replayed);
}

/// The same odd entries in `retired/` (where a DEL or GC sets aside the record of an ADD
/// in the chain): the first gc reports and quarantines each once, never blocking on the
/// FIFO; the next finds nothing and exits 0. Without this gc exited 1 on every run.
#[test]
fn odd_entries_in_retired_are_quarantined_once() {
    require_root!();
    use std::os::unix::ffi::OsStrExt;
    let w = World::new("dmgret", NET, "0");
    let ns = Netns::with_prefix("clret");
    w.add("keep", &ns.path_str(), &[]);
    let dir = w.ledger_dir.join("retired");
    std::fs::create_dir(&dir).unwrap();
    nix::unistd::mkfifo(
        &dir.join(format!("{NET}:fifo:eth0.json")),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::fs::create_dir(dir.join(format!("{NET}:adir:eth0.json"))).unwrap();
    std::fs::write(
        dir.join(std::ffi::OsStr::from_bytes(b"dmg:\xff\xfe:eth0.json")),
        b"{}",
    )
    .unwrap();
    std::fs::write(dir.join(format!("{NET}:cut:eth0.json")), b"{\"format\":1").unwrap();

    let gc = || {
        let all = w.gc_args(&[]);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let out = output_within(w.cli_cmd(&refs), 60);
        let rep: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("no report ({e}): {}", describe(&out)));
        (out, rep)
    };
    let (out, rep) = gc();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let damaged = rep["damaged"].as_array().unwrap();
    assert_eq!(damaged.len(), 4, "{rep:#}");
    assert!(
        damaged.iter().all(|d| d["quarantinedTo"].is_string()),
        "{rep:#}"
    );
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    assert_eq!(std::fs::read_dir(w.quarantine_dir()).unwrap().count(), 4);
    assert!(w.record_path("keep").exists(), "the live record stays");

    let (out, rep) = gc();
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(rep["damaged"].as_array().unwrap().is_empty(), "{rep:#}");
}
