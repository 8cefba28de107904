//! `returnDevices`: DEL (and gc's replayed DEL) hands devices in the pod's namespace back
//! to the host's, before the record goes. Root, real namespaces, libcni through the
//! driver. The test machine has no spare NIC, so a veth end moved into the pod under a
//! `dev*` name with a host-style alias stands in for a driver-moved NIC (it has no
//! `device` entry, so the `names` pattern selects it). "The host" is the test's private
//! host namespace, where libcni, the plugins and `cni-ledger gc` run.
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::process::Command;

const POD_NAME: &str = "devx0";
const ALIAS: &str = "ens9f0";

fn run(mut c: Command) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("run {c:?}: {e}"));
    assert!(out.status.success(), "{c:?}: {}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ip -j -d link show dev NAME` in a namespace (via `exec`), or None when absent.
fn link(mut exec: Command, name: &str) -> Option<Value> {
    exec.args(["-j", "-d", "link", "show", "dev", name]);
    let out = exec.output().unwrap();
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array().and_then(|a| a.first().cloned())
}

fn host_link(f: &Fixture, name: &str) -> Option<Value> {
    link(f.host.cmd("ip"), name)
}

fn pod_link(pod: &Netns, name: &str) -> Option<Value> {
    link(pod.exec("ip"), name)
}

fn is_up(l: &Value) -> bool {
    l["flags"]
        .as_array()
        .is_some_and(|f| f.iter().any(|x| x == "UP"))
}

fn fixture(return_devices: Option<Value>) -> Fixture {
    let mut spec = ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    };
    if let Some(v) = return_devices {
        spec = spec.with_ledger_opt("returnDevices", v);
    }
    Fixture::with_spec(spec)
}

/// A pod through libcni, plus a veth end moved in from the host as `devx0`, alias
/// `ens9f0`, up (the way a driver leaves a NIC it configured for the pod).
fn pod_with_device(f: &Fixture, cid: &str) -> Netns {
    let pod = Netns::new();
    f.add(cid, "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}\nlog:\n{}", f.log()));
    let peer = format!("clvh{}", next_id());
    run({
        let mut c = f.host.cmd("ip");
        c.args([
            "link", "add", &peer, "type", "veth", "peer", "name", POD_NAME,
        ]);
        c
    });
    run({
        let mut c = f.host.cmd("ip");
        c.args(["link", "set", POD_NAME, "netns", pod.name()]);
        c
    });
    run({
        let mut c = pod.exec("ip");
        c.args(["link", "set", POD_NAME, "alias", ALIAS, "up"]);
        c
    });
    assert!(host_link(f, POD_NAME).is_none());
    assert!(is_up(&pod_link(&pod, POD_NAME).unwrap()));
    pod
}

fn assert_returned_as(f: &Fixture, pod: &Netns, host_name: &str) {
    let l = host_link(f, host_name)
        .unwrap_or_else(|| panic!("{host_name} is not on the host\nlog:\n{}", f.log()));
    assert_eq!(l["link_type"], json!("ether"), "{l:#}");
    assert_eq!(l["linkinfo"]["info_kind"], json!("veth"), "{l:#}");
    assert_eq!(l["ifalias"], json!(ALIAS), "{l:#}");
    assert!(!is_up(&l), "returned link is up: {l:#}");
    assert!(pod_link(pod, POD_NAME).is_none(), "still in the pod");
    assert!(
        pod_link(pod, "eth0").is_none(),
        "the chain's eth0 is still there"
    );
    assert!(f.record_files().is_empty(), "{:?}", f.record_files());
}

#[test]
fn del_returns_the_device_under_its_alias_down() {
    require_root!();
    let f = fixture(Some(json!({"names": ["dev*"]})));
    let pod = pod_with_device(&f, "c-1");
    f.del("c-1", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    assert_returned_as(&f, &pod, ALIAS);
    let log = f.log();
    assert!(
        log.contains("returned netdev devx0 (no bus address) to the host as ens9f0 (by alias)"),
        "{log}"
    );
    // No RDMA here: reported as none, nothing attempted.
    assert!(log.contains("RDMA: none to return"), "{log}");
    assert!(!log.contains("could not return"), "{log}");
    assert!(f.list_json().is_empty(), "{:#?}", f.list_json());
}

#[test]
fn taken_alias_falls_back_and_nothing_on_the_host_is_renamed() {
    require_root!();
    let f = fixture(Some(json!({"names": ["dev*"]})));
    run({
        let mut c = f.host.cmd("ip");
        c.args(["link", "add", ALIAS, "type", "bridge"]);
        c
    });
    let before = host_link(&f, ALIAS).unwrap();
    let pod = pod_with_device(&f, "c-2");
    f.del("c-2", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    // Back under its current name; the host's ens9f0 is the same bridge as before.
    assert_returned_as(&f, &pod, POD_NAME);
    let after = host_link(&f, ALIAS).unwrap();
    assert_eq!(after["ifindex"], before["ifindex"]);
    assert_eq!(after["linkinfo"]["info_kind"], json!("bridge"));
    assert!(
        f.log().contains("to the host as devx0 (by current name)"),
        "{}",
        f.log()
    );
}

#[test]
fn gc_returns_the_device_of_a_not_valid_record_whose_namespace_lives() {
    require_root!();
    let f = fixture(Some(json!({"names": ["dev*"]})));
    let pod = pod_with_device(&f, "c-3");
    let valid = f.tmp.path().join("valid.json");
    std::fs::write(&valid, "[]").unwrap();
    let (out, rep) = f.gc(&[
        "--grace",
        "0",
        "--network",
        &f.network,
        "--valid-attachments",
        valid.to_str().unwrap(),
    ]);
    let rep = rep.unwrap_or_else(|| panic!("no report: {}", describe(&out)));
    assert_eq!(rep["records"][0]["reason"], json!("not-valid"), "{rep:#}");
    assert_eq!(rep["records"][0]["action"], json!("replayed"), "{rep:#}");
    assert_returned_as(&f, &pod, ALIAS);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("gc: cltest/c-3/eth0: returned netdev devx0"),
        "{log}"
    );
}

#[test]
fn without_the_option_del_leaves_the_link_alone() {
    require_root!();
    let f = fixture(None);
    let pod = pod_with_device(&f, "c-4");
    f.del("c-4", "eth0", Some(&pod.path_str()), None).unwrap();
    let l = pod_link(&pod, POD_NAME).expect("the link left the pod");
    assert!(is_up(&l) && l["ifalias"] == json!(ALIAS), "{l:#}");
    assert!(host_link(&f, ALIAS).is_none() && host_link(&f, POD_NAME).is_none());
    assert!(pod_link(&pod, "eth0").is_none());
    assert!(f.record_files().is_empty());
    assert!(!f.log().contains("return"), "{}", f.log());
}

#[test]
fn a_device_that_cannot_move_never_fails_del_and_list_shows_it() {
    require_root!();
    let f = fixture(Some(json!({"names": ["dev*"]})));
    let pod = pod_with_device(&f, "c-5");
    // A bridge is local to its namespace: the kernel refuses to move it.
    run({
        let mut c = pod.exec("ip");
        c.args(["link", "add", "devbr0", "type", "bridge"]);
        c
    });
    f.del("c-5", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL failed: {e}\nlog:\n{}", f.log()));
    assert_returned_as(&f, &pod, ALIAS);
    assert!(pod_link(&pod, "devbr0").is_some());
    let log = f.log();
    assert!(
        log.contains(
            "could not return device devbr0 (no bus address): moving to the host as devbr0"
        ),
        "{log}"
    );
    let rows = f.list_json();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let r = &rows[0];
    assert_eq!(r["state"], json!("devices-left"), "{r:#}");
    assert_eq!(r["containerId"], json!("c-5"), "{r:#}");
    assert_eq!(r["netns"], json!(pod.path_str()), "{r:#}");
    assert_eq!(r["devices"][0]["device"], json!("devbr0"), "{r:#}");
    let table = String::from_utf8_lossy(&f.ledger(&["list"]).stdout).into_owned();
    assert!(
        table.contains("devices-left") && table.contains("devbr0 (-): moving"),
        "{table}"
    );
}

#[test]
fn a_namespace_that_is_not_the_recorded_one_is_left_alone() {
    require_root!();
    let f = fixture(Some(json!({"names": ["dev*"]})));
    let mut pod = Netns::new();
    f.add("c-6", "eth0", Some(&pod.path_str()), None).unwrap();
    // Another namespace now sits at the recorded path (the runtime reused it).
    pod.replace();
    run({
        let mut c = pod.exec("ip");
        c.args([
            "link", "add", POD_NAME, "type", "veth", "peer", "name", "devx1",
        ]);
        c
    });
    f.del("c-6", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    assert!(pod_link(&pod, POD_NAME).is_some() && pod_link(&pod, "devx1").is_some());
    assert!(host_link(&f, POD_NAME).is_none() && host_link(&f, "devx1").is_none());
    assert!(f.record_files().is_empty());
    assert!(!f.log().contains("return"), "{}", f.log());
}

#[test]
fn true_returns_only_device_backed_links_so_a_veth_stays() {
    require_root!();
    let f = fixture(Some(json!(true)));
    let pod = pod_with_device(&f, "c-7");
    f.del("c-7", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    // A veth has no `device` entry in the pod's sysfs: virtual, left to its owner.
    assert!(pod_link(&pod, POD_NAME).is_some());
    assert!(host_link(&f, ALIAS).is_none() && host_link(&f, POD_NAME).is_none());
    assert!(f.record_files().is_empty());
    let log = f.log();
    assert!(
        log.contains("DEL cltest/c-7/eth0: no devices to return from"),
        "{log}"
    );
}

/// The namespace opened for the move is checked, not the path: a namespace that is not
/// the recorded one (another cookie) gives up nothing, even at the recorded path.
#[test]
fn only_the_namespace_with_the_recorded_cookie_gives_up_devices() {
    require_root!();
    use cni_ledger::devices::{return_devices, Spec};
    let f = fixture(Some(json!({"names": ["dev*"]})));
    let pod = pod_with_device(&f, "c-cookie");
    let host = std::fs::File::open(format!("/run/netns/{}", f.host.name())).unwrap();
    let path = pod.path_str();
    let (wrong, right) = std::thread::spawn(move || {
        // This thread alone moves into the test's host namespace, then ends.
        nix::sched::setns(&host, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let opened = std::fs::File::open(&path).unwrap();
        let cookie = cni_ledger::sandbox::identity::netns_cookie(&opened).unwrap();
        let spec = Spec {
            names: vec!["dev*".into()],
        };
        let wrong = return_devices(&path, cookie + 1, &spec);
        let right = return_devices(&path, cookie, &spec);
        (wrong, right)
    })
    .join()
    .unwrap();
    assert!(wrong.moved.is_empty(), "{:?}", wrong.moved);
    assert_eq!(wrong.failures.len(), 1, "{:?}", wrong.failures);
    assert!(
        wrong.failures[0]
            .error
            .contains("is not the recorded namespace now"),
        "{:?}",
        wrong.failures
    );
    assert_eq!(right.moved.len(), 1, "{:?}", right.failures);
    assert!(host_link(&f, ALIAS).is_some());
    assert!(pod_link(&pod, POD_NAME).is_none());
    f.del("c-cookie", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
}
