//! The ledger's tail entry (issue 19, docs/CHAIN.md) through libcni with Debian's bridge
//! and host-local and the test plugin testdata/plugins/cl-chainprobe: the record's
//! completion and the chain's duration, failed ADDs torn down or left behind, a replay's
//! prevResult from the record when libcni's cache is gone, the tail last after libcni
//! v1.3's drop-ins, and `inject`'s placement of it. Needs root.
//!
//!     cargo test --features testing --test chain_tail

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use agent_common::{dir_args, ledger_first, types_in, wait_for, Agent};
use common::*;
use serde_json::{json, Value};

const PROBE: &str = "cl-chainprobe";

/// `[cni-ledger, bridge+host-local, cl-chainprobe(probe), (tail)]`, libcni 1.1's driver.
fn fixture(probe: Value, tail: bool) -> Fixture {
    let mut f = Fixture::with_spec(ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    f.install_test_plugin(PROBE);
    let mut probe = probe;
    probe["type"] = json!(PROBE);
    probe["logFile"] = json!(f.tmp.path().join("probe.log"));
    f.spec.extra = vec![probe];
    if tail {
        f.spec.extra.push(f.tail_entry());
    }
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
    f
}

fn probe_log(f: &Fixture) -> String {
    fs::read_to_string(f.tmp.path().join("probe.log")).unwrap_or_default()
}

/// The record of `cid`/eth0 as stored (its `record` object).
/// The record as stored, with the tail's note on its ADD (`notes/<stem>.json`, read by
/// hand as the format says) in its `chain`.
fn record(f: &Fixture, cid: &str) -> Value {
    let path = f.record_path(cid, "eth0");
    let bytes =
        fs::read(&path).unwrap_or_else(|e| panic!("no record for {cid}: {e}\nlog:\n{}", f.log()));
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    let mut rec = v["record"].clone();
    let note = f.ledger_dir.join("notes").join(path.file_name().unwrap());
    if let Ok(bytes) = fs::read(&note) {
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["note"]["addId"], rec["addId"], "{v:#}");
        rec["chain"] = v["note"]["chain"].clone();
    }
    rec
}

fn list_row_with(f: &Fixture, cid: &str, extra: &[&str]) -> Value {
    let mut args = vec!["list", "--json"];
    args.extend_from_slice(extra);
    let out = f.ledger(&args);
    assert!(out.status.success(), "list: {}", describe(&out));
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    rows.into_iter()
        .find(|r| r["containerId"] == json!(cid))
        .unwrap_or_else(|| panic!("no list row for {cid}"))
}

#[test]
fn the_tail_completes_the_record_with_the_result_and_the_time_the_chain_took() {
    require_root!();
    let sleep = Duration::from_millis(700);
    let f = fixture(json!({"addSleepMs": sleep.as_millis() as u64}), true);
    let ns = Netns::new();
    let cid = "c-timed";
    let started = Instant::now();
    let result = f
        .add(cid, "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("{e}\nlog:\n{}", f.log()));
    let outer = started.elapsed().as_secs_f64();

    let rec = record(&f, cid);
    assert_eq!(rec["tail"], json!(true), "{rec:#}");
    assert!(rec["createdBootNs"].as_u64().is_some(), "{rec:#}");
    // The head's write-ahead record is never rewritten: the tail's part is its note.
    let stored: Value =
        serde_json::from_slice(&fs::read(f.record_path(cid, "eth0")).unwrap()).unwrap();
    assert!(stored["record"].get("chain").is_none(), "{stored:#}");
    let chain = &rec["chain"];
    let secs = chain["addSeconds"]
        .as_f64()
        .unwrap_or_else(|| panic!("no addSeconds: {rec:#}\nlog:\n{}", f.log()));
    // The probe's sleep is inside the head-to-tail span; the span is inside the
    // driver's whole ADD.
    assert!(
        secs >= sleep.as_secs_f64() && secs <= outer,
        "addSeconds {secs} outside [{}, {outer}]",
        sleep.as_secs_f64()
    );
    assert!(chain["completedBootNs"].as_u64().unwrap() > rec["createdBootNs"].as_u64().unwrap());
    assert!(chain["completedAt"].is_string(), "{chain:#}");
    // The tail's copy is the chain's result, the one libcni handed back.
    assert_eq!(chain["result"]["ips"], result["ips"], "{chain:#}");
    assert_eq!(chain["result"]["interfaces"], result["interfaces"]);

    let row = list_row_with(&f, cid, &[]);
    assert_eq!(row["chainState"], json!("completed"), "{row:#}");
    assert_eq!(row["addSeconds"].as_f64(), Some(secs), "{row:#}");
    let table = f.ledger(&["list"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains(&format!("completed {secs:.3}s")),
        "the table shows no duration:\n{text}"
    );

    // CHECK passes through the tail; DEL runs it first, then the head drops the record.
    f.check(cid, "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("{e}\nlog:\n{}", f.log()));
    f.del(cid, "eth0", Some(&ns.path_str()), None).unwrap();
    assert!(!f.record_path(cid, "eth0").exists());
    let log = f.log();
    let began = log.find("tail: DEL began").expect("the tail noted no DEL");
    let removed = log
        .find("record removed")
        .expect("the head removed nothing");
    assert!(began < removed, "the tail's DEL did not run first:\n{log}");
}

#[test]
fn a_failed_add_is_never_completed_and_is_torn_down_or_left() {
    require_root!();
    let f = fixture(json!({"failAdd": true}), true);
    let torn_ns = Netns::new();
    let left_ns = Netns::new();
    for (cid, ns) in [("c-torn", &torn_ns), ("c-left", &left_ns)] {
        let e = f.add(cid, "eth0", Some(&ns.path_str()), None).unwrap_err();
        assert!(e.contains("cl-chainprobe fails ADD"), "{e}");
        let rec = record(&f, cid);
        assert_eq!(rec["tail"], json!(true), "{rec:#}");
        assert!(
            rec.get("chain").is_none(),
            "completed a failed ADD: {rec:#}"
        );
        let row = list_row_with(&f, cid, &[]);
        assert_eq!(row["chainState"], json!("pending"), "{row:#}");
        assert!(row["addSeconds"].is_null());
    }
    // The runtime's DEL for one of them (as a runtime tears down a failed sandbox): the
    // record goes; observed by the agent as a failed ADD torn down.
    f.del("c-torn", "eth0", Some(&torn_ns.path_str()), None)
        .unwrap();
    assert!(!f.record_path("c-torn", "eth0").exists());
    // No DEL for the other: failed-left once older than the threshold, not before.
    std::thread::sleep(Duration::from_millis(2100));
    let row = list_row_with(&f, "c-left", &["--chain-left-after", "1"]);
    assert_eq!(row["chainState"], json!("failed-left"), "{row:#}");
    let row = list_row_with(&f, "c-left", &[]);
    assert_eq!(row["chainState"], json!("pending"), "{row:#}");
}

/// gc's replay of a vanished sandbox whose libcni cache entry is gone (Bottlerocket and
/// the EKS AMI wipe /var/lib/cni/results at boot); cl-chainprobe's DEL needs prevResult.
fn replay_without_cache(tail: bool) -> (Fixture, Value, i32) {
    let f = fixture(json!({"needPrevOnDel": true}), tail);
    let mut ns = Netns::new();
    let cid = "c-wiped";
    f.add(cid, "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("{e}\nlog:\n{}", f.log()));
    fs::remove_dir_all(f.cache_dir.join("results")).unwrap();
    ns.delete();
    let (out, rep) = f.gc(&["--grace", "0"]);
    let rep = rep.unwrap_or_else(|| panic!("gc printed no report: {}", describe(&out)));
    let r = rep["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["containerId"] == json!(cid))
        .unwrap_or_else(|| panic!("no report entry: {rep:#}"))
        .clone();
    (f, r, out.status.code().unwrap_or(-1))
}

#[test]
fn a_replay_without_libcni_cache_gives_prevresult_from_the_record() {
    require_root!();
    let (f, r, code) = replay_without_cache(true);
    assert_eq!(code, 0, "{r:#}\nlog:\n{}", f.log());
    assert_eq!(r["action"], json!("replayed"), "{r:#}");
    assert!(
        r["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["ok"] == json!(true)),
        "{r:#}"
    );
    assert!(f.ipam_addresses().is_empty(), "host-local kept the address");
    assert!(
        probe_log(&f).contains("DEL cid=c-wiped ifname=eth0 prev=yes"),
        "{}",
        probe_log(&f)
    );
}

#[test]
fn without_a_tail_the_same_replay_has_no_prevresult() {
    require_root!();
    // The control: the probe really fails without prevResult, so the test above proves
    // that the record's copy was passed.
    let (f, r, code) = replay_without_cache(false);
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(r["action"], json!("retrying"), "{r:#}");
    assert!(
        r["lastError"]
            .as_str()
            .unwrap_or("")
            .contains("cannot DEL without prevResult"),
        "{r:#}"
    );
    assert!(probe_log(&f).contains("DEL cid=c-wiped ifname=eth0 prev=no"));
}

/// `cni-ledger inject <args...> <file>` (CLI face), which must succeed.
fn inject(args: &[&str], file: &Path) -> Output {
    let out = Command::new(ledger_bin())
        .arg("inject")
        .args(args)
        .arg(file)
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "inject {args:?}: {}", describe(&out));
    out
}

fn said(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn roles(list: &Value) -> Vec<String> {
    list["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| match p["role"].as_str() {
            Some(role) => format!("{}:{role}", p["type"].as_str().unwrap()),
            None => p["type"].as_str().unwrap().to_string(),
        })
        .collect()
}

/// `[bridge]` with the fixture's head, cl-chainprobe appending `dropin0` as the drop-in
/// `<confdir>/<net>/50-probe.conf`, and the tail placed by `inject`.
fn dropin_fixture(driver: PathBuf) -> (Fixture, PathBuf) {
    let mut f = Fixture::with_spec(ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    f.driver = driver;
    f.install_test_plugin(PROBE);
    let dir = f.conf_dir.join(&f.network);
    fs::create_dir_all(&dir).unwrap();
    let probe = json!({"type": PROBE, "appendInterface": "dropin0",
                       "logFile": f.tmp.path().join("probe.log")});
    fs::write(dir.join("50-probe.conf"), probe.to_string()).unwrap();
    let out = inject(&[], &f.conf_file);
    assert!(said(&out).contains("ledger injected"), "{}", said(&out));
    let tail = dir.join("~cni-ledger-tail.conf");
    assert!(tail.exists(), "no drop-in tail: {}", said(&out));
    (f, tail)
}

#[test]
fn with_dropins_under_libcni_13_the_tail_runs_last_and_sees_their_effect() {
    require_root!();
    let (f, tail) = dropin_fixture(driver13());
    assert_eq!(
        roles(&serde_json::from_slice(&f.conflist_bytes()).unwrap()),
        ["cni-ledger", "bridge"],
        "a tail inline as well would run twice"
    );
    assert_eq!(
        f.load().unwrap(),
        ["cni-ledger", "bridge", PROBE, "cni-ledger"],
        "libcni v1.3 does not run the tail last"
    );
    let ns = Netns::new();
    let cid = "c-dropin";
    let result = f
        .add(cid, "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("{e}\nlog:\n{}", f.log()));
    let rec = record(&f, cid);
    assert_eq!(rec["tail"], json!(true), "{rec:#}");
    let names: Vec<&str> = rec["chain"]["result"]["interfaces"]
        .as_array()
        .unwrap_or_else(|| panic!("no result recorded: {rec:#}\nlog:\n{}", f.log()))
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.last(), Some(&"dropin0"), "{rec:#}");
    assert_eq!(rec["chain"]["result"]["interfaces"], result["interfaces"]);
    assert_eq!(
        f.log()
            .matches(&format!("{cid}/eth0: chain completed"))
            .count(),
        1,
        "the tail ran other than once:\n{}",
        f.log()
    );

    // Idempotent; --no-tail takes the drop-in out and leaves the conflist alone.
    let before = f.conflist_bytes();
    assert!(said(&inject(&[], &f.conf_file)).contains("unchanged"));
    let out = inject(&["--no-tail"], &f.conf_file);
    assert!(!tail.exists(), "{}", said(&out));
    assert_eq!(f.conflist_bytes(), before);
    assert!(said(&inject(&["--no-tail"], &f.conf_file)).contains("unchanged"));
}

#[test]
fn with_dropins_under_libcni_11_nothing_of_the_dropin_dir_runs() {
    require_root!();
    // libcni before v1.3 skips the drop-ins, the tail's with them: the record says the
    // chain never completed, which is what its operator needs to see.
    let (f, _) = dropin_fixture(driver());
    assert_eq!(f.load().unwrap(), ["cni-ledger", "bridge"]);
    let ns = Netns::new();
    f.add("c-old", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("{e}\nlog:\n{}", f.log()));
    let rec = record(&f, "c-old");
    assert_eq!(rec["tail"], json!(true));
    assert!(rec.get("chain").is_none(), "{rec:#}");
    assert!(probe_log(&f).is_empty());
}

#[test]
fn inject_places_the_tail_last_idempotently_and_no_tail_takes_it_out() {
    // Files only: runs as any user.
    let tmp = TempDir::new("tail-inject");
    let file = tmp.path().join("10-n.conflist");
    let doc = json!({"cniVersion": "1.0.0", "name": "n", "plugins": [
        {"type": "bridge"}, {"type": "portmap", "capabilities": {"portMappings": true}}]});
    fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let read = || -> Value { serde_json::from_slice(&fs::read(&file).unwrap()).unwrap() };

    assert!(said(&inject(&["--ledger-dir", "/var/lib/l"], &file)).contains("injected"));
    let once = read();
    assert_eq!(
        roles(&once),
        ["cni-ledger", "bridge", "portmap", "cni-ledger:tail"]
    );
    assert_eq!(once["plugins"][3]["ledgerDir"], json!("/var/lib/l"));
    assert!(once["plugins"][3].get("capabilities").is_none());
    let bytes = fs::read(&file).unwrap();
    assert!(said(&inject(&["--ledger-dir", "/var/lib/l"], &file)).contains("unchanged"));
    assert_eq!(
        fs::read(&file).unwrap(),
        bytes,
        "a second inject rewrote the file"
    );

    inject(&["--ledger-dir", "/var/lib/l", "--no-tail"], &file);
    assert_eq!(roles(&read()), ["cni-ledger", "bridge", "portmap"]);
    assert!(
        said(&inject(&["--ledger-dir", "/var/lib/l", "--no-tail"], &file)).contains("unchanged")
    );
    inject(&["--ledger-dir", "/var/lib/l"], &file);
    assert_eq!(read(), once, "the tail came back other than it was");
    inject(&["--remove"], &file);
    assert_eq!(read(), doc);
}

#[test]
fn agent_places_the_tail_last_and_no_tail_takes_it_out() {
    require_root!();
    // In this test binary, not tests/agent.rs: its other agents starting at once would
    // slow this one's first injection past what that file's timing tests allow.
    let f = Fixture::new();
    let mut plain = f.conflist(&f.spec);
    plain["plugins"].as_array_mut().unwrap().remove(0);
    fs::write(&f.conf_file, serde_json::to_vec_pretty(&plain).unwrap()).unwrap();
    let agent_args = |extra: &[&str]| agent_args(&f, extra);
    let log = f.tmp.path().join("agent.log");
    let has_tail = |path: &Path| types_in(path).len() == 4;

    let mut agent = Agent::start(&ledger_bin(), &agent_args(&[]), &log, None);
    wait_for(Duration::from_secs(5), || has_tail(&f.conf_file))
        .unwrap_or_else(|| panic!("no tail placed:\n{}", agent.log_text()));
    let doc: Value = serde_json::from_slice(&fs::read(&f.conf_file).unwrap()).unwrap();
    assert_eq!(doc["plugins"][3]["role"], json!("tail"), "{doc:#}");
    assert_eq!(
        doc["plugins"][3]["ledgerDir"],
        doc["plugins"][0]["ledgerDir"]
    );
    // Through libcni, the agent's conflist completes the record.
    let ns = Netns::new();
    f.add("c-agent-tail", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let row = f.list_row("c-agent-tail", "eth0").expect("no record");
    assert_eq!(row["chainState"], json!("completed"), "{row:#}");
    f.del("c-agent-tail", "eth0", Some(&ns.path_str()), None)
        .unwrap();
    assert_eq!(agent.stop(10).code(), Some(0));

    let mut agent = Agent::start(&ledger_bin(), &agent_args(&["--no-tail"]), &log, None);
    wait_for(Duration::from_secs(5), || types_in(&f.conf_file).len() == 3)
        .unwrap_or_else(|| panic!("--no-tail left the tail:\n{}", agent.log_text()));
    assert!(ledger_first(&f.conf_file));
    assert_eq!(agent.stop(10).code(), Some(0));
}

/// The agent's arguments for the fixture's directories (its own bin dir, no CRI runtime).
fn agent_args(f: &Fixture, extra: &[&str]) -> Vec<String> {
    let bin = f.tmp.path().join("agent-bin");
    fs::create_dir_all(&bin).unwrap();
    if !bin.join("cni-ledger").exists() {
        fs::copy(ledger_bin(), bin.join("cni-ledger")).unwrap();
    }
    let mut v = dir_args(&bin, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

#[test]
fn the_agent_places_the_drop_in_tail_of_a_network_with_drop_ins() {
    require_root!();
    let mut f = Fixture::with_spec(ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    f.driver = driver13();
    f.install_test_plugin(PROBE);
    let mut plain = f.conflist(&f.spec);
    plain["plugins"].as_array_mut().unwrap().remove(0);
    f.write_conflist(&plain);
    let dir = f.conf_dir.join(&f.network);
    fs::create_dir_all(&dir).unwrap();
    let probe = json!({"type": PROBE, "appendInterface": "dropin0"});
    fs::write(dir.join("50-probe.conf"), probe.to_string()).unwrap();
    let tail = dir.join("~cni-ledger-tail.conf");

    let log = f.tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &agent_args(&f, &[]), &log, None);
    wait_for(Duration::from_secs(5), || {
        tail.exists() && ledger_first(&f.conf_file)
    })
    .unwrap_or_else(|| panic!("no drop-in tail placed:\n{}", agent.log_text()));
    assert_eq!(
        types_in(&f.conf_file),
        ["cni-ledger", "bridge"],
        "a tail inline too"
    );
    assert_eq!(
        f.load().unwrap(),
        ["cni-ledger", "bridge", PROBE, "cni-ledger"]
    );
    let ns = Netns::new();
    f.add("c-agent-dropin", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("{e}"));
    let rec = record(&f, "c-agent-dropin");
    let ifaces = rec["chain"]["result"]["interfaces"].as_array().unwrap();
    assert_eq!(ifaces.last().unwrap()["name"], json!("dropin0"), "{rec:#}");
    assert_eq!(agent.stop(10).code(), Some(0));

    // --uninstall takes the drop-in tail out with the head.
    let out = Command::new(ledger_bin())
        .arg("agent")
        .args(agent_args(&f, &["--uninstall"]))
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!tail.exists(), "--uninstall left the drop-in tail");
    assert_eq!(types_in(&f.conf_file), ["bridge"]);
}
