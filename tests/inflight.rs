//! An ADD still in the chain when a DEL or a GC of its attachment lands (issue 30, item
//! 3; docs/CHAIN.md, "An ADD still in the chain"), through libcni v1.3 with Debian's
//! bridge and host-local held behind testdata/plugins/cl-slowadd, which keeps the ADD
//! waiting before bridge allocates anything. The chain is `[cni-ledger, cl-slowadd(bridge
//! + host-local), cni-ledger tail]`.
//!
//! What must hold: the ADD that then succeeds leaves a record for every address
//! host-local holds, and gc releases it once its namespace is gone. Needs root.
//!
//!     cargo test --features testing --test inflight

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

use common::slowadd::{gate_file, release, start_held_add};

/// The held chain on libcni v1.3.
fn fixture() -> Fixture {
    let mut f = common::slowadd::held_chain_fixture();
    f.driver = driver13();
    f
}

/// The container ID of every address host-local holds in the fixture's network.
fn holders(f: &Fixture) -> Vec<(String, String)> {
    f.ipam_addresses()
        .into_iter()
        .map(|ip| {
            let text = fs::read_to_string(f.ipam_net_dir().join(&ip)).unwrap();
            let cid = text.lines().next().unwrap_or("").trim().to_string();
            (ip, cid)
        })
        .collect()
}

/// Every address host-local holds has a record gc will act on, and `ip` is among them.
fn every_address_is_recorded(f: &Fixture, ip: &str) {
    let held = holders(f);
    assert!(held.iter().any(|(a, _)| a == ip), "{ip} not held: {held:?}");
    for (addr, cid) in &held {
        assert!(
            f.record_path(cid, "eth0").exists(),
            "{addr} is held by {cid}, which has no record (retired: {:?})\nlog:\n{}",
            list_dir(&f.ledger_dir.join("retired")),
            f.log()
        );
    }
    let rows = f.list_json();
    assert!(
        rows.iter().any(|r| r["containerId"] == json!("c-held")),
        "{rows:?}"
    );
}

/// With the namespace gone, gc (`--grace 0`) replays the record and host-local lets the
/// address go; nothing is left of it in the ledger.
fn gc_releases(f: &Fixture, ns: &mut Netns, ip: &str) {
    ns.delete();
    let (out, report) = f.gc(&["--now", "--grace", "0", "--network", &f.network]);
    assert!(
        out.status.success(),
        "{}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    assert_eq!(report.unwrap()["summary"]["replayed"], json!(1));
    assert!(
        !f.ipam_addresses().contains(&ip.to_string()),
        "{ip} still held"
    );
    assert!(!f.record_path("c-held", "eth0").exists());
    assert!(list_dir(&f.ledger_dir.join("retired")).is_empty());
}

#[test]
fn a_del_while_the_add_is_in_the_chain_leaves_a_record_that_gc_acts_on() {
    require_root!();
    let f = fixture();
    let mut ns = Netns::new();
    let add = start_held_add(&f, "c-held", &ns);

    // The runtime gives up on the slow sandbox: DEL through the whole chain.
    f.del("c-held", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    assert!(!f.record_path("c-held", "eth0").exists());
    assert_eq!(
        list_dir(&f.ledger_dir.join("retired")),
        vec![format!("{}:c-held:eth0.json", f.network)],
        "the DEL dropped the record of an ADD in flight\nlog:\n{}",
        f.log()
    );
    // Shown and counted while set aside.
    let row = f
        .list_row("c-held", "eth0")
        .expect("list shows no retired row");
    assert_eq!(row["chainState"], json!("retired"), "{row:#}");
    let out = f.ledger(&["verify"]);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("note: 1 retired record(s)"),
        "{}",
        describe(&out)
    );

    let ip = first_ip(&release(&f, add));
    every_address_is_recorded(&f, &ip);
    assert!(f.log().contains("its record is restored"), "{}", f.log());
    gc_releases(&f, &mut ns, &ip);
}

#[test]
fn a_gc_verb_while_the_add_is_in_the_chain_leaves_a_record_that_gc_acts_on() {
    require_root!();
    let mut f = fixture();
    let mut ns = Netns::new();
    let add = start_held_add(&f, "c-held", &ns);

    // The runtime's GC (CNI 1.1.0) lists no attachment: the held one is not valid. The
    // conflist is raised only now, as Debian's bridge speaks 1.0.0 (the ADD loaded the
    // list already; the replay runs its snapshot).
    let mut v: Value = serde_json::from_slice(&f.conflist_bytes()).unwrap();
    v["cniVersion"] = json!("1.1.0");
    f.write_conflist(&v);
    let out = f
        .host
        .cmd(&f.driver)
        .arg("gc")
        .arg("--conf-dir")
        .arg(&f.conf_dir)
        .args(["--net", &f.network, "--timeout", "30"])
        .arg("--cni-path")
        .arg(f.cni_path())
        .arg("--cache-dir")
        .arg(&f.cache_dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "GC: {}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    assert!(
        f.log().contains("replaying DEL"),
        "the GC replayed nothing:\n{}",
        f.log()
    );
    assert!(!f.record_path("c-held", "eth0").exists());
    assert_eq!(
        list_dir(&f.ledger_dir.join("retired")).len(),
        1,
        "the GC dropped the record of an ADD in flight\nlog:\n{}",
        f.log()
    );

    let ip = first_ip(&release(&f, add));
    every_address_is_recorded(&f, &ip);
    gc_releases(&f, &mut ns, &ip);
}

/// The held ADD of `c-held`, DELeted, then failed (its sandbox deleted before bridge
/// ran, so nothing was allocated): its record is left retired.
fn retired_by_a_failed_add(f: &Fixture) {
    let mut ns = Netns::new();
    let add = start_held_add(f, "c-held", &ns);
    f.del("c-held", "eth0", Some(&ns.path_str()), None).unwrap();
    ns.delete();
    fs::write(gate_file(f), b"").unwrap();
    let out = add.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "ADD into a deleted netns: {}",
        describe(&out)
    );
    assert_eq!(list_dir(&f.ledger_dir.join("retired")).len(), 1);
    assert!(f.ipam_addresses().is_empty());
}

/// A DEL of an ADD that then fails leaves a retired record; the next ADD of the key
/// makes it moot: gc drops it without a replay, which would tear the new ADD down.
#[test]
fn a_retired_record_gives_way_to_a_newer_add_of_its_key() {
    require_root!();
    let f = fixture();
    retired_by_a_failed_add(&f);
    // Young, of this boot: its ADD might still complete, so gc leaves it.
    let (out, report) = f.gc(&["--now", "--grace", "0", "--network", &f.network]);
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(report.unwrap()["summary"]["replayed"], json!(0));
    assert_eq!(list_dir(&f.ledger_dir.join("retired")).len(), 1);

    // The same attachment added again, in a new sandbox, through the whole chain.
    let ns2 = Netns::new();
    let res = f
        .add("c-held", "eth0", Some(&ns2.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD again: {e}\nlog:\n{}", f.log()));
    let ip = first_ip(&res);
    let (out, report) = f.gc(&["--now", "--grace", "0", "--network", &f.network]);
    assert!(
        out.status.success(),
        "{}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    assert_eq!(report.unwrap()["summary"]["replayed"], json!(0));
    assert!(
        list_dir(&f.ledger_dir.join("retired")).is_empty(),
        "{}",
        describe(&out)
    );
    assert!(f.record_path("c-held", "eth0").exists());
    assert!(
        f.ipam_addresses().contains(&ip),
        "the new ADD was torn down"
    );
}

/// A retired record whose ADD can no longer complete (older than --chain-left-after) and
/// whose sandbox is gone is replayed once, like a record, and dropped.
#[test]
fn a_retired_record_whose_add_cannot_complete_is_replayed_and_dropped() {
    require_root!();
    let f = fixture();
    retired_by_a_failed_add(&f);
    let args = ["--now", "--grace", "0", "--network", &f.network];
    let (out, report) = f.gc(&[&args[..], &["--chain-left-after", "0"]].concat());
    assert!(
        out.status.success(),
        "{}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    let report = report.unwrap();
    assert_eq!(report["summary"]["replayed"], json!(1), "{report:#}");
    assert_eq!(report["records"][0]["retired"], json!(true), "{report:#}");
    assert!(list_dir(&f.ledger_dir.join("retired")).is_empty());
    // Nothing left to do.
    let (_, report) = f.gc(&[&args[..], &["--chain-left-after", "0"]].concat());
    assert_eq!(report.unwrap()["summary"]["replayed"], json!(0));
}

/// The agent's chain watcher sees the DEL retire the record and the tail restore it: the
/// ADD, which succeeded, is counted `ok` once and never `failed-torn-down`.
#[test]
fn the_agent_counts_an_add_restored_by_its_tail_ok_only() {
    require_root!();
    use agent_common::{dir_args, sample, wait_for, Agent};
    let f = fixture();
    let bin = f.tmp.path().join("agent-bin");
    fs::create_dir_all(&bin).unwrap();
    fs::copy(ledger_bin(), bin.join("cni-ledger")).unwrap();
    let args = dir_args(&bin, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    let agent = Agent::start(&ledger_bin(), &args, &f.tmp.path().join("agent.log"), None);
    wait_for(Duration::from_secs(5), || {
        f.ledger_dir.join("records").is_dir()
    })
    .unwrap_or_else(|| panic!("no records dir:\n{}", agent.log_text()));
    // Let the watcher arm.
    std::thread::sleep(Duration::from_secs(1));
    let net = f.network.clone();
    let series =
        |r: &str| format!("cni_ledger_chain_adds_total{{network=\"{net}\",result=\"{r}\"}}");

    let mut ns = Netns::new();
    let add = start_held_add(&f, "c-held", &ns);
    f.del("c-held", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    assert!(f
        .ledger_dir
        .join("retired")
        .read_dir()
        .unwrap()
        .next()
        .is_some());
    let ip = first_ip(&release(&f, add));
    every_address_is_recorded(&f, &ip);
    wait_for(Duration::from_secs(5), || {
        sample(&agent.metrics(), &series("ok")) == Some(1.0)
    })
    .unwrap_or_else(|| panic!("the ADD not counted ok:\n{}", agent.metrics()));
    // A pass of the watcher after the restore (it runs at most every 30 s; the retire's
    // event was read long before).
    std::thread::sleep(Duration::from_secs(1));
    let m = agent.metrics();
    // The agent keeps a kept chain's series from its injection on, at zero until counted.
    assert_eq!(
        sample(&m, &series("failed-torn-down")).unwrap_or(0.0),
        0.0,
        "{m}"
    );
    assert_eq!(sample(&m, &series("ok")), Some(1.0), "{m}");
    drop(agent);
    gc_releases(&f, &mut ns, &ip);
}
