//! `returnDevices`: DEL (and gc's replayed DEL) hands devices in the pod's namespace back
//! to the host's, before the record goes. Root, real namespaces, libcni through the
//! driver. The test machine has no spare NIC, so a veth end moved into the pod under a
//! `dev*` name with a host-style alias stands in for a driver-moved NIC (it has no
//! `device` entry, so the `names` pattern selects it). "The host" is the test's private
//! host namespace, where libcni, the plugins and `cni-ledger gc` run. The chain has the
//! ledger's tail entry, which records the device's host name (its alias then) when the
//! chain completes; the pod may rewrite the alias after, and DEL never uses it. Being
//! virtual, the stand-in goes back only because the tail recorded it: links the pod
//! makes after ADD stay in its namespace.
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

/// `[cni-ledger, bridge+host-local, (tail)]`, with `returnDevices` when given.
fn fixture_with(return_devices: Option<Value>, tail: bool) -> Fixture {
    let mut spec = ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    };
    if let Some(v) = return_devices {
        spec = spec.with_ledger_opt("returnDevices", v);
    }
    let mut f = Fixture::with_spec(spec);
    if tail {
        let tail = f.tail_entry();
        f.spec.extra.push(tail);
        let spec = f.spec.clone();
        f.write_conflist(&f.conflist(&spec));
    }
    f
}

fn fixture(return_devices: Option<Value>) -> Fixture {
    fixture_with(return_devices, true)
}

/// A veth end moved in from the host as `devx0`, alias `ens9f0`, up (the way a driver
/// leaves a NIC it configured for the pod), then the pod's ADD through libcni.
fn pod_with_device(f: &Fixture, cid: &str) -> Netns {
    let pod = Netns::new();
    put_device(f, &pod);
    f.add(cid, "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}\nlog:\n{}", f.log()));
    assert!(is_up(&pod_link(&pod, POD_NAME).unwrap()));
    pod
}

fn put_device(f: &Fixture, pod: &Netns) {
    put_link(f, pod, POD_NAME, ALIAS)
}

/// A veth end moved in from the host as `name`, with the alias `alias`, up.
fn put_link(f: &Fixture, pod: &Netns, name: &str, alias: &str) {
    let peer = format!("clvh{}", next_id());
    run({
        let mut c = f.host.cmd("ip");
        c.args(["link", "add", &peer, "type", "veth", "peer", "name", name]);
        c
    });
    run({
        let mut c = f.host.cmd("ip");
        c.args(["link", "set", name, "netns", pod.name()]);
        c
    });
    run({
        let mut c = pod.exec("ip");
        c.args(["link", "set", name, "alias", alias, "up"]);
        c
    });
    assert!(host_link(f, name).is_none());
}

/// The names of the links in the test's host namespace.
fn host_links(f: &Fixture) -> std::collections::BTreeSet<String> {
    let out = run({
        let mut c = f.host.cmd("ip");
        c.args(["-j", "link", "show"]);
        c
    });
    let v: Value = serde_json::from_str(&out).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|l| l["ifname"].as_str().unwrap().to_string())
        .collect()
}

/// `ip` in the pod's namespace, as a process of the pod (root in it) would run it.
fn pod_ip(pod: &Netns, args: &[&str]) {
    run({
        let mut c = pod.exec("ip");
        c.args(args);
        c
    });
}

/// The neutral name DEL gives the pod's `devx0` when nothing was recorded: a veth has
/// no bus address and no permanent hardware address (its current one is the pod's to
/// set), so the first `devN` free on the host.
fn neutral_name(f: &Fixture) -> String {
    (0..)
        .map(|i| format!("dev{i}"))
        .find(|n| host_link(f, n).is_none())
        .unwrap()
}

/// The pod (root in its namespace) rewrites its device's alias.
fn set_alias(pod: &Netns, alias: &str) {
    run({
        let mut c = pod.exec("ip");
        c.args(["link", "set", POD_NAME, "alias", alias]);
        c
    });
}

fn assert_returned_as(f: &Fixture, pod: &Netns, host_name: &str) {
    assert_returned_with_alias(f, pod, host_name, ALIAS)
}

fn assert_returned_with_alias(f: &Fixture, pod: &Netns, host_name: &str, alias: &str) {
    let l = host_link(f, host_name)
        .unwrap_or_else(|| panic!("{host_name} is not on the host\nlog:\n{}", f.log()));
    assert_eq!(l["link_type"], json!("ether"), "{l:#}");
    assert_eq!(l["linkinfo"]["info_kind"], json!("veth"), "{l:#}");
    assert_eq!(l["ifalias"], json!(alias), "{l:#}");
    assert!(!is_up(&l), "returned link is up: {l:#}");
    assert!(pod_link(pod, POD_NAME).is_none(), "still in the pod");
    assert!(
        pod_link(pod, "eth0").is_none(),
        "the chain's eth0 is still there"
    );
    assert!(f.record_files().is_empty(), "{:?}", f.record_files());
}

#[test]
fn del_returns_the_device_under_the_name_recorded_at_add_down() {
    require_root!();
    let f = fixture(Some(json!({"names": ["dev*"]})));
    let pod = pod_with_device(&f, "c-1");
    f.del("c-1", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    assert_returned_as(&f, &pod, ALIAS);
    let log = f.log();
    assert!(
        log.contains(
            "returned netdev devx0 (no bus address) to the host as ens9f0 (by name recorded at ADD)"
        ),
        "{log}"
    );
    // No RDMA here: reported as none, nothing attempted.
    assert!(log.contains("RDMA: none to return"), "{log}");
    assert!(!log.contains("could not return"), "{log}");
    assert!(f.list_json().is_empty(), "{:#?}", f.list_json());
}

#[test]
fn taken_recorded_name_falls_back_to_a_neutral_one_and_nothing_on_the_host_is_renamed() {
    require_root!();
    let f = fixture(Some(json!({"names": ["dev*"]})));
    run({
        let mut c = f.host.cmd("ip");
        c.args(["link", "add", ALIAS, "type", "bridge"]);
        c
    });
    let before = host_link(&f, ALIAS).unwrap();
    let pod = pod_with_device(&f, "c-2");
    let neutral = neutral_name(&f);
    f.del("c-2", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    // Back under a neutral name (never its pod name, which the pod chose); the host's
    // ens9f0 is the same bridge as before.
    assert_returned_as(&f, &pod, &neutral);
    let after = host_link(&f, ALIAS).unwrap();
    assert_eq!(after["ifindex"], before["ifindex"]);
    assert_eq!(after["linkinfo"]["info_kind"], json!("bridge"));
    assert!(
        f.log()
            .contains(&format!("to the host as {neutral} (by first free devN)")),
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
    let pod = Netns::new();
    put_device(&f, &pod);
    // A bridge is local to its namespace: the kernel refuses to move it. Made before
    // ADD, so the tail records it (one made after would be left in the pod).
    pod_ip(&pod, &["link", "add", "devbr0", "type", "bridge"]);
    f.add("c-5", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}\nlog:\n{}", f.log()));
    f.del("c-5", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL failed: {e}\nlog:\n{}", f.log()));
    assert_returned_as(&f, &pod, ALIAS);
    assert!(pod_link(&pod, "devbr0").is_some());
    let log = f.log();
    assert!(
        log.contains("could not return device devbr0 (no bus address): moving to the host as dev"),
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
    use cni_ledger::devices::{return_devices, Recording, Spec};
    let f = fixture(Some(json!({"names": ["dev*"]})));
    let pod = pod_with_device(&f, "c-cookie");
    let host = std::fs::File::open(format!("/run/netns/{}", f.host.name())).unwrap();
    let path = pod.path_str();
    let neutral = neutral_name(&f);
    let (wrong, right) = std::thread::spawn(move || {
        // This thread alone moves into the test's host namespace, then ends.
        nix::sched::setns(&host, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let opened = std::fs::File::open(&path).unwrap();
        let cookie = cni_ledger::sandbox::identity::netns_cookie(&opened).unwrap();
        let spec = Spec {
            names: vec!["dev*".into()],
        };
        let wrong = return_devices(&path, cookie + 1, &spec, &Recording::default());
        let right = return_devices(&path, cookie, &spec, &Recording::default());
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
    // Given no recorded names, it comes back under a neutral one.
    assert_eq!(right.moved[0].host_name, neutral);
    assert!(host_link(&f, &right.moved[0].host_name).is_some());
    assert!(pod_link(&pod, POD_NAME).is_none());
    f.del("c-cookie", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
}

fn alias_mismatches_metric(f: &Fixture) -> String {
    let file = f.tmp.path().join("cni-ledger.prom");
    let out = Command::new(ledger_bin())
        .arg("gc")
        .args(["--ledger-dir", f.ledger_dir.to_str().unwrap()])
        .args(["--conf-dir", f.conf_dir.to_str().unwrap()])
        .args(["--cni-cache-dir", f.cache_dir.to_str().unwrap()])
        .arg("--metrics-file")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let text = std::fs::read_to_string(&file).unwrap();
    text.lines()
        .find(|l| l.starts_with("cni_ledger_device_alias_mismatches "))
        .unwrap_or_else(|| panic!("no alias metric in:\n{text}"))
        .to_string()
}

/// Issue #30 item 4: a pod rewrites its device's alias after ADD, to `cni0` (which the
/// bridge plugin of a node would then find taken) and to the name of a link the host
/// has. The device comes back under the name recorded when the chain completed, the
/// mismatch is logged at warn and counted, and no host link is touched.
#[test]
fn an_alias_the_pod_rewrites_after_add_is_never_the_host_name() {
    require_root!();
    let f = fixture(Some(json!({"names": ["dev*"]})));
    assert_eq!(
        alias_mismatches_metric(&f),
        "cni_ledger_device_alias_mismatches 0"
    );
    for (cid, alias) in [("c-a1", "cni0"), ("c-a2", f.bridge.as_str())] {
        let pod = pod_with_device(&f, cid);
        let br_before = host_link(&f, &f.bridge).expect("the chain's bridge");
        set_alias(&pod, alias);
        f.del(cid, "eth0", Some(&pod.path_str()), None)
            .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
        assert_returned_with_alias(&f, &pod, ALIAS, alias);
        assert!(host_link(&f, "cni0").is_none(), "cni0 appeared on the host");
        let br_after = host_link(&f, &f.bridge).unwrap();
        assert_eq!(br_after["ifindex"], br_before["ifindex"]);
        assert_eq!(br_after["linkinfo"]["info_kind"], json!("bridge"));
        let log = f.log();
        assert!(
            log.contains(&format!(
                "warn DEL cltest/{cid}/eth0: device devx0: its alias is {alias:?} but ens9f0 was recorded"
            )),
            "{log}"
        );
        // The next pod's device may be named ens9f0 too: move this one out of the way.
        run({
            let mut c = f.host.cmd("ip");
            c.args(["link", "del", ALIAS]);
            c
        });
    }
    assert_eq!(
        alias_mismatches_metric(&f),
        "cni_ledger_device_alias_mismatches 2"
    );
}

/// Without the tail nothing was recorded: a rewritten alias still never names the
/// device; it comes back under its neutral name, and no mismatch is claimed.
#[test]
fn with_nothing_recorded_a_rewritten_alias_gives_the_neutral_name() {
    require_root!();
    let f = fixture_with(Some(json!({"names": ["dev*"]})), false);
    let pod = pod_with_device(&f, "c-n1");
    set_alias(&pod, "cni0");
    let neutral = neutral_name(&f);
    f.del("c-n1", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    assert_returned_with_alias(&f, &pod, &neutral, "cni0");
    assert!(host_link(&f, "cni0").is_none());
    let log = f.log();
    assert!(
        log.contains(&format!("to the host as {neutral} (by first free devN)")),
        "{log}"
    );
    assert!(!log.contains("was recorded"), "{log}");
    assert_eq!(
        alias_mismatches_metric(&f),
        "cni_ledger_device_alias_mismatches 0"
    );
}

/// The pod (root in its namespace) sets its device's MAC after ADD, and nothing was
/// recorded: udev's `enx<mac>` rule would let it choose a host name (the 12 hex digits
/// after `enx`). The name comes from the permanent hardware address only, which a veth
/// has none of: the device comes back as the first free `devN`, keeping the pod's MAC.
#[test]
fn a_mac_the_pod_sets_never_names_the_device() {
    require_root!();
    let f = fixture_with(Some(json!({"names": ["dev*"]})), false);
    let pod = pod_with_device(&f, "c-m1");
    let mac = "02:c1:1e:d9:e0:01";
    run({
        let mut c = pod.exec("ip");
        c.args(["link", "set", POD_NAME, "address", mac]);
        c
    });
    assert_eq!(pod_link(&pod, POD_NAME).unwrap()["address"], json!(mac));
    let neutral = neutral_name(&f);
    f.del("c-m1", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    assert!(host_link(&f, "enx02c11ed9e001").is_none(), "{}", f.log());
    assert_returned_as(&f, &pod, &neutral);
    assert_eq!(host_link(&f, &neutral).unwrap()["address"], json!(mac));
    let log = f.log();
    assert!(
        log.contains(&format!("to the host as {neutral} (by first free devN)")),
        "{log}"
    );
}

/// A virtual link moved in before ADD (as host-device moves one) is recorded by the tail
/// and comes back under its recorded name; a veth pair the pod makes after ADD under
/// names the pattern matches stays in the pod: nothing new appears on the host but the
/// recorded link, and the pod's links are logged as left.
#[test]
fn a_virtual_link_the_pod_makes_after_add_stays_in_the_pod() {
    require_root!();
    let f = fixture(Some(json!({"names": ["net*"]})));
    let pod = Netns::new();
    put_link(&f, &pod, "net0", ALIAS);
    f.add("c-v1", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}\nlog:\n{}", f.log()));
    pod_ip(
        &pod,
        &[
            "link", "add", "net7", "type", "veth", "peer", "name", "net8",
        ],
    );
    pod_ip(&pod, &["link", "set", "net7", "alias", "cni0"]);
    let before = host_links(&f);
    f.del("c-v1", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    let added: Vec<_> = host_links(&f).difference(&before).cloned().collect();
    assert_eq!(added, vec![ALIAS.to_string()], "log:\n{}", f.log());
    assert!(pod_link(&pod, "net0").is_none(), "net0 still in the pod");
    assert!(pod_link(&pod, "net7").is_some() && pod_link(&pod, "net8").is_some());
    let log = f.log();
    assert!(
        log.contains(
            "returned netdev net0 (no bus address) to the host as ens9f0 (by name recorded at ADD)"
        ),
        "{log}"
    );
    for l in ["net7", "net8"] {
        let ifindex = pod_link(&pod, l).unwrap()["ifindex"].clone();
        assert!(
            log.contains(&format!(
                "info DEL cltest/c-v1/eth0: link {l} (ifindex {ifindex}) left in the pod: not recorded at ADD"
            )),
            "{log}"
        );
    }
    assert!(!log.contains("could not return"), "{log}");
    assert!(f.record_files().is_empty());
    assert!(f.list_json().is_empty(), "{:#?}", f.list_json());
}

/// The pod deletes the virtual link the host gave it and makes another under the same
/// name, ifindex and alias: the kernel gave the new one a new sysfs inode, which the
/// tail recorded for the first, so it stays in the pod.
#[test]
fn a_link_the_pod_remakes_with_the_recorded_ifindex_stays_in_the_pod() {
    require_root!();
    let f = fixture(Some(json!({"names": ["net*"]})));
    let pod = Netns::new();
    put_link(&f, &pod, "net0", ALIAS);
    let ifindex = pod_link(&pod, "net0").unwrap()["ifindex"]
        .as_u64()
        .unwrap()
        .to_string();
    f.add("c-v2", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}\nlog:\n{}", f.log()));
    pod_ip(&pod, &["link", "del", "net0"]);
    pod_ip(
        &pod,
        &[
            "link", "add", "net0", "index", &ifindex, "type", "veth", "peer", "name", "net9",
        ],
    );
    pod_ip(&pod, &["link", "set", "net0", "alias", ALIAS]);
    assert_eq!(
        pod_link(&pod, "net0").unwrap()["ifindex"].to_string(),
        ifindex
    );
    let before = host_links(&f);
    f.del("c-v2", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    let added: Vec<_> = host_links(&f).difference(&before).cloned().collect();
    assert!(added.is_empty(), "{added:?}\nlog:\n{}", f.log());
    assert!(pod_link(&pod, "net0").is_some() && pod_link(&pod, "net9").is_some());
    let log = f.log();
    assert!(
        log.contains(&format!(
            "link net0 (ifindex {ifindex}) left in the pod: not recorded at ADD"
        )),
        "{log}"
    );
}

/// Without the tail there is no list of what the host gave the pod: every link a
/// pattern matches goes back, the pod's own too, under neutral names (never the ones
/// the pod gave them). Only the tail's note makes the rule exact (docs/OPERATING.md).
#[test]
fn without_the_tail_links_the_pod_makes_go_back_neutrally_named() {
    require_root!();
    let f = fixture_with(Some(json!({"names": ["net*"]})), false);
    let pod = Netns::new();
    put_link(&f, &pod, "net0", ALIAS);
    f.add("c-v3", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}\nlog:\n{}", f.log()));
    pod_ip(
        &pod,
        &[
            "link", "add", "net7", "type", "veth", "peer", "name", "net8",
        ],
    );
    let before = host_links(&f);
    f.del("c-v3", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    let added: Vec<_> = host_links(&f).difference(&before).cloned().collect();
    assert_eq!(added.len(), 3, "{added:?}\nlog:\n{}", f.log());
    assert!(added.iter().all(|n| n.starts_with("dev")), "{added:?}");
    for n in &added {
        let l = host_link(&f, n).unwrap();
        assert!(!is_up(&l), "{l:#}");
    }
    for l in ["net0", "net7", "net8"] {
        assert!(pod_link(&pod, l).is_none(), "{l} still in the pod");
    }
    let log = f.log();
    assert!(log.contains("returned netdev net7"), "{log}");
    assert!(!log.contains("left in the pod"), "{log}");
}

/// The tail's note of the attachment `cid`/eth0, as stored: (the envelope's note, its path).
fn stored_note(f: &Fixture, cid: &str) -> (Value, std::path::PathBuf) {
    let path = f
        .ledger_dir
        .join("notes")
        .join(format!("cltest:{cid}:eth0.json"));
    let env: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    (env["note"].clone(), path)
}

/// Rewrites the note at `path` with `note`, signed as the ledger signs it.
fn restore_note(path: &std::path::Path, note: &Value) {
    let body = serde_json::to_string(note).unwrap();
    let env = format!(
        "{{\"format\":1,\"sha256\":\"{}\",\"note\":{body}}}\n",
        common::records::sha256_of(body.as_bytes())
    );
    std::fs::write(path, env).unwrap();
}

/// The tail's note keeps two lists: `devices`, the named links, as every release reads
/// it; `links`, every link the option selected, unnamed virtual ones too, each with its
/// sysfs inode. A note of an older release has only `devices`: DEL then keeps the old
/// rule and returns a virtual link the pod made too (neutrally named, down).
#[test]
fn the_note_keeps_named_devices_for_every_release_and_the_whole_list_beside() {
    require_root!();
    let f = fixture(Some(json!({"names": ["net*"]})));
    let pod = Netns::new();
    put_link(&f, &pod, "net0", ALIAS);
    pod_ip(
        &pod,
        &[
            "link", "add", "net1", "type", "veth", "peer", "name", "net2",
        ],
    );
    f.add("c-n1", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}\nlog:\n{}", f.log()));
    let (note, path) = stored_note(&f, "c-n1");
    let chain = &note["chain"];
    let devices = chain["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{chain:#}");
    assert_eq!(devices[0]["hostName"], json!(ALIAS), "{chain:#}");
    let links = chain["links"].as_array().unwrap();
    let mut pod_names: Vec<_> = links
        .iter()
        .map(|l| l["podName"].as_str().unwrap())
        .collect();
    pod_names.sort();
    assert_eq!(pod_names, ["net0", "net1", "net2"], "{chain:#}");
    assert!(
        links.iter().all(|l| l["sysfsIno"].as_u64().is_some()),
        "{chain:#}"
    );

    // As an older release wrote it: no `links`. A pair the pod makes now goes back too.
    let mut old = note.clone();
    old["chain"].as_object_mut().unwrap().remove("links");
    restore_note(&path, &old);
    pod_ip(
        &pod,
        &[
            "link", "add", "net7", "type", "veth", "peer", "name", "net8",
        ],
    );
    let before = host_links(&f);
    f.del("c-n1", "eth0", Some(&pod.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}\nlog:\n{}", f.log()));
    let added: Vec<_> = host_links(&f).difference(&before).cloned().collect();
    assert!(
        added.contains(&ALIAS.to_string()),
        "{added:?}\nlog:\n{}",
        f.log()
    );
    assert_eq!(
        added.len(),
        5,
        "net0 by its name, four neutrally: {added:?}\n{}",
        f.log()
    );
    assert!(!f.log().contains("left in the pod"), "{}", f.log());
}
