//! The CRI runtime's own list as the valid set (issue 9), against a real runtime:
//! Debian's containerd 1.6 (and, for the clean-teardown adoption test, Debian unstable's
//! containerd 2.x, unpacked under target/ by scripts/fetch-unstable.sh), started by the test inside the test's host namespace with
//! its own root, state dir, socket and config (CNI conf and bin dirs are the fixture's,
//! the ledger first in the chain), and a sandbox image built here (a static `pause`
//! compiled with gcc, imported with `ctr images import` under the configured
//! `sandbox_image`: no registry is reachable). Pod sandboxes are created and removed over
//! CRI with the project's own gRPC client, as kubelet calls them. Needs root.
//!
//!     cargo test --features testing --test cri
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;
mod cri_common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agent_common::{sample, Agent};
use common::*;
use cri_common::*;
use serde_json::{json, Value};

fn gc_cri(f: &Fixture, endpoint: &str) -> (i32, Value) {
    let (code, v, _) = gc_cri_out(f, endpoint);
    (code, v)
}

fn gc_cri_out(f: &Fixture, endpoint: &str) -> (i32, Value, String) {
    let out = f.ledger(&[
        "gc",
        "--json",
        "--grace",
        "0",
        // The sandboxes here are made well before gc runs: no ADD is in progress.
        "--cri-min-age",
        "0",
        // Meant: containerd's libcni cache is the system's (see one_containerd_at_a_time).
        "--cni-cache-dir",
        "/var/lib/cni",
        "--cri-endpoint",
        endpoint,
        "--cri-network",
        &f.network,
    ]);
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("gc printed no JSON ({e}): {}", describe(&out)));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), v, stderr)
}

fn list_cri(f: &Fixture, endpoint: &str) -> Vec<Value> {
    let out = f.ledger(&[
        "list",
        "--json",
        "--cri-endpoint",
        endpoint,
        "--cri-network",
        &f.network,
    ]);
    assert!(out.status.success(), "{}", describe(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `list_cri` once containerd's CRI service answers: a restarted containerd takes
/// its API socket before the CRI plugin has loaded (slow on a loaded machine), and a
/// list made in between says nothing of the runtime.
fn list_cri_answered(f: &Fixture, endpoint: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rows = list_cri(f, endpoint);
        if rows.iter().all(|r| r.get("runtimeState").is_some()) {
            return rows;
        }
        assert!(Instant::now() < deadline, "CRI never answered: {rows:#?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn row<'a>(rows: &'a [Value], id: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["containerId"] == json!(id))
        .unwrap_or_else(|| panic!("no row for {id}: {rows:#?}"))
}

/// The containerds of these tests share the system's libcni cache (/var/lib/cni, which
/// neither containerd 1.6 nor 2.x lets a config move): one test at a time, so an agent that
/// adopts from it never takes another test's live sandboxes for its own.
fn one_containerd_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// containerd's libcni cache is the system's (/var/lib/cni): drops what a sandbox the
/// test made containerd forget left there.
fn forget_system_cache_entries(id: &str) {
    for e in fs::read_dir("/var/lib/cni/results")
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.file_name().to_string_lossy().contains(&format!("-{id}-")) {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// The agent as a node runs it, on the fixture's bin, conf and ledger dirs and libcni's
/// cache at `cache`: in `private`'s mount namespace (where containerd's default socket
/// is) and the test host's network namespace, gc every second; `extra` after.
fn start_agent(f: &Fixture, private: &PrivateRun, cache: &Path, extra: &[&str]) -> Agent {
    let mut args = Vec::new();
    for (flag, dir) in [
        ("--cni-bin-dir", f.bin_dir.as_path()),
        ("--conf-dir", f.conf_dir.as_path()),
        ("--ledger-dir", f.ledger_dir.as_path()),
        ("--cni-cache-dir", cache),
    ] {
        args.push(flag.to_string());
        args.push(dir.display().to_string());
    }
    // No --cri-endpoint, meant: the agent finds containerd at its default socket, the
    // private one. No ADD is in progress when the agent starts: it may judge at once.
    args.extend(
        ["--gc-interval", "1", "--cri-min-age", "0"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string()),
    );
    let log = f.tmp.path().join("agent.log");
    Agent::start_in_mounts(&ledger_bin(), &args, &log, f.host.name(), &private.mnt())
}

/// The agent's metrics once they meet `cond`, within 30 s.
fn wait_metrics(agent: &Agent, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = agent.metrics();
        if cond(&m) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {m}\nagent log:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The forgotten sandbox's address and DNAT are gone; the live one keeps its own.
fn assert_only_wiped_released(f: &Fixture, wiped: &str, live: &str) {
    assert_eq!(f.ipam_addresses().len(), 1, "wiped's address not released");
    assert!(
        f.host.nat_lines_for(wiped).is_empty(),
        "{}",
        f.host.iptables_save()
    );
    assert!(
        !f.host.nat_lines_for(live).is_empty(),
        "the live sandbox lost its DNAT"
    );
    assert!(f.record_path(live, "eth0").exists());
}

fn record_netns(f: &Fixture, id: &str) -> String {
    let v: Value = serde_json::from_slice(&fs::read(f.record_path(id, "eth0")).unwrap()).unwrap();
    v["record"]["netns"].as_str().unwrap().to_string()
}

/// The pod's namespace as containerd's libcni cache holds it (an adopted record does not
/// name it): the sandbox path of the result's interface in the pod.
fn cached_netns(network: &str, id: &str) -> String {
    let path = Path::new("/var/lib/cni/results").join(format!("{network}-{id}-eth0"));
    let v: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    v["result"]["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|i| i["sandbox"].as_str().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| panic!("no sandbox in {}: {v:#}", path.display()))
        .to_string()
}

/// A sandbox containerd was made to forget leaves its named namespace behind: nobody's
/// now, the test made it, the test removes it.
fn remove_forgotten_netns(path: &str) {
    if let Some(name) = path.strip_prefix("/var/run/netns/") {
        let _ = Command::new("ip").args(["netns", "del", name]).status();
    }
}

/// containerd's list, read over CRI: a ready or NOTREADY sandbox is never absent; a
/// sandbox containerd forgot is absent, but kept while its namespace is there (issue 37),
/// and released once it is gone; a containerd that does not answer judges nothing.
#[test]
fn containerd_sandbox_list_judges_exactly_the_forgotten_sandbox() {
    require_root!();
    let _serial = one_containerd_at_a_time();
    let f = Fixture::new(); // [cni-ledger, bridge+host-local, portmap]
    for p in ["loopback", "bridge", "host-local", "portmap"] {
        symlink(Path::new(CNI_PLUGIN_DIR).join(p), f.bin_dir.join(p)).unwrap();
    }
    let tarball = build_pause_image(f.tmp.path());
    let dir = Containerd::configure(&f);
    let mut ctrd = Containerd::start(&f, &dir);
    let out = ctrd.ctr(&["images", "import", tarball.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    let endpoint = ctrd.endpoint();

    let live = ctrd.run_sandbox("live", 18081);
    let wiped = ctrd.run_sandbox("wiped", 18082);
    assert!(f.record_path(&live, "eth0").exists(), "{}", f.log());
    assert!(f.record_path(&wiped, "eth0").exists(), "{}", f.log());
    let wiped_ns = record_netns(&f, &wiped);
    let ips_before = f.ipam_addresses();
    assert_eq!(ips_before.len(), 2, "{ips_before:?}");
    assert!(
        !f.host.nat_lines_for(&wiped).is_empty(),
        "{}",
        f.host.iptables_save()
    );
    std::thread::sleep(Duration::from_millis(2100)); // records older than any list below

    // Both live in the runtime's list: nothing replayed, even with no grace.
    let (code, rep) = gc_cri(&f, &endpoint);
    assert_eq!(code, 0, "{rep:#}");
    assert_eq!(rep["cri"]["answered"], json!(true), "{rep:#}");
    assert_eq!(rep["cri"]["sandboxes"], json!(2), "{rep:#}");
    assert_eq!(rep["summary"]["stale"], json!(0), "{rep:#}");

    // The sandbox's task dies: containerd keeps it, NOTREADY. Not absent.
    let out = ctrd.ctr(&["tasks", "kill", "-s", "SIGKILL", &wiped]);
    assert!(out.status.success(), "{}", describe(&out));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rows = list_cri(&f, &endpoint);
        if row(&rows, &wiped)["runtimeState"] == json!("notready") {
            assert_eq!(row(&rows, &live)["runtimeState"], json!("ready"));
            assert_eq!(row(&rows, &wiped)["state"], json!("live"));
            break;
        }
        assert!(Instant::now() < deadline, "{rows:#?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, rep) = gc_cri(&f, &endpoint);
    assert_eq!(
        rep["summary"]["stale"],
        json!(0),
        "NOTREADY judged absent: {rep:#}"
    );

    // Its state is removed behind the runtime's back (as `crio wipe` does); after a
    // restart containerd has forgotten it, but its namespace stays.
    ctrd.forget_and_stop(&wiped);
    let mut ctrd = Containerd::start(&f, &dir);
    assert!(Path::new(&wiped_ns).exists());
    let rows = list_cri_answered(&f, &endpoint);
    assert_eq!(
        row(&rows, &wiped)["runtimeState"],
        json!("absent"),
        "{rows:#?}"
    );

    // Absent from the list, but its namespace is verifiably there: the runtime's silence
    // is not proof (a container it runs outside CRI looks the same), so gc keeps it.
    let (code, rep) = gc_cri(&f, &endpoint);
    assert_eq!(code, 0, "{rep:#}\nlog:\n{}", f.log());
    assert_eq!(rep["cri"]["answered"], json!(true), "{rep:#}");
    assert_eq!(rep["summary"]["stale"], json!(0), "{rep:#}");
    assert!(rep.get("criRefused").is_none_or(Value::is_null), "{rep:#}");
    assert!(f.record_path(&wiped, "eth0").exists());
    assert_eq!(f.ipam_addresses().len(), 2);

    // Its namespace goes (nothing holds it any more): released, and only it.
    remove_forgotten_netns(&wiped_ns);
    let (code, rep) = gc_cri(&f, &endpoint);
    assert_eq!(code, 0, "{rep:#}\nlog:\n{}", f.log());
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep:#}");
    let r = &rep["records"][0];
    assert_eq!(r["containerId"], json!(wiped), "{rep:#}");
    assert_eq!(r["reason"], json!("netns-missing"), "{rep:#}");
    assert!(!f.record_path(&wiped, "eth0").exists());
    assert!(
        !Path::new(&format!("/var/lib/cni/results/{}-{wiped}-eth0", f.network)).exists(),
        "the replay left containerd's libcni cache entry"
    );
    assert_only_wiped_released(&f, &wiped, &live);

    // containerd stopped during gc: no CRI judgement at all, nothing replayed.
    ctrd.stop();
    let (code, rep, stderr) = gc_cri_out(&f, &endpoint);
    assert_eq!(code, 0, "{rep:#}");
    assert_eq!(rep["cri"]["answered"], json!(false), "{rep:#}");
    assert_eq!(rep["summary"]["stale"], json!(0), "{rep:#}");
    assert!(f.record_path(&live, "eth0").exists());
    assert!(stderr.contains("did not answer"), "not logged: {stderr}");

    // kubelet's teardown of the live one goes through the ledger's DEL as usual.
    let ctrd = Containerd::start(&f, &dir);
    ctrd.stop_and_remove(&live);
    assert!(!f.record_path(&live, "eth0").exists(), "{}", f.log());
    assert!(f.ipam_addresses().is_empty());
    drop(ctrd);
    // gc removed the entry of our network; loopback's is left.
    forget_system_cache_entries(&wiped);
}

/// The agent finds containerd at its default socket by itself, asks it before every gc
/// run, judges only the networks containerd says it serves, and judges nothing while
/// containerd does not answer.
#[test]
fn agent_asks_containerd_at_its_default_socket() {
    require_root!();
    let _serial = one_containerd_at_a_time();
    // 10-cltest.conflist: [cni-ledger, bridge+host-local, portmap]. The agent adopts every
    // network in the system's libcni cache, where containerd writes; a name of its own
    // keeps other tests' entries out of containerd's judgement.
    let mut f = Fixture::new();
    f.network = format!("cltest{}", next_id());
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
    let own = f.network.clone();
    for p in ["loopback", "bridge", "host-local", "portmap"] {
        symlink(Path::new(CNI_PLUGIN_DIR).join(p), f.bin_dir.join(p)).unwrap();
    }
    // A second network on the same conf dir that containerd (max_conf_num 1) does not
    // serve: another caller's, as podman's would be.
    let other = format!("other{}", next_id());
    let other_conf = json!({
        "cniVersion": f.spec.cni_version,
        "name": other,
        "plugins": [f.ledger_entry(&ChainSpec::ledger_only())],
    });
    fs::write(
        f.conf_dir.join("20-other.conflist"),
        serde_json::to_vec(&other_conf).unwrap(),
    )
    .unwrap();
    // Made before the private mount namespace, which sees mounts of the time it was made.
    let podman_like = Netns::new();
    let private = PrivateRun::new();
    let tarball = build_pause_image(f.tmp.path());
    let dir = Containerd::configure_at(&f, Some("/run/containerd/containerd.sock"));
    let mut ctrd = Containerd::start_in(&f, &dir, Some(&private));
    let out = ctrd.ctr(&["images", "import", tarball.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));

    let live = ctrd.run_sandbox("live", 18091);
    let wiped = ctrd.run_sandbox("wiped", 18092);
    assert!(f.record_path(&live, "eth0").exists(), "{}", f.log());
    assert!(f.record_path(&wiped, "eth0").exists(), "{}", f.log());
    // The other caller's container: a live namespace, no sandbox of containerd's.
    let foreign = format!("foreign{}", next_id());
    f.network = other.clone();
    f.add(&foreign, "eth0", Some(&podman_like.path_str()), None)
        .unwrap();
    let foreign_record = f.record_path(&foreign, "eth0");
    f.network = own.clone();
    assert!(foreign_record.exists(), "{}", f.log());
    std::thread::sleep(Duration::from_millis(2100)); // records older than any list below

    let system_cache = Path::new("/var/lib/cni");
    let mut agent = start_agent(
        &f,
        &private,
        system_cache,
        &["--conflist", "all", "--grace", "0"],
    );
    let ep = r#"endpoint="unix:///run/containerd/containerd.sock""#;
    let up = format!("cni_ledger_cri_up{{{ep}}}");
    let sandboxes = format!("cni_ledger_cri_sandboxes{{{ep}}}");
    let unanswered = format!("cni_ledger_cri_unanswered_total{{{ep}}}");
    let runs = r#"cni_ledger_gc_runs_total{result="ok"}"#;

    // Two gc runs with containerd's word: nothing is stale.
    let m = wait_metrics(&agent, "two gc runs judged by containerd", |m| {
        sample(m, &up) == Some(1.0) && sample(m, runs).unwrap_or(0.0) >= 2.0
    });
    assert_eq!(sample(&m, &sandboxes), Some(2.0), "{m}");
    for id in [&live, &wiped] {
        assert!(
            f.record_path(id, "eth0").exists(),
            "{id} replayed:\n{}",
            agent.log_text()
        );
    }
    assert!(foreign_record.exists(), "{}", agent.log_text());
    let text = agent.log_text();
    assert!(
        text.contains("asking the CRI runtime at unix:///run/containerd/containerd.sock"),
        "{text}"
    );
    assert!(
        text.contains(&format!("judging networks {own}\n")),
        "{text}"
    );

    // containerd forgets one sandbox behind its back (its namespace stays): absent from
    // its list, but its namespace is there, so the agent keeps it (issue 37).
    let wiped_ns = record_netns(&f, &wiped);
    ctrd.forget_and_stop(&wiped);
    let mut ctrd = Containerd::start_in(&f, &dir, Some(&private));
    let m = wait_metrics(&agent, "containerd answering again", |m| {
        sample(m, &up) == Some(1.0) && sample(m, &sandboxes) == Some(1.0)
    });
    let before = sample(&m, runs).unwrap_or(0.0);
    wait_metrics(&agent, "two gc runs on the list without it", |m| {
        sample(m, runs).unwrap_or(0.0) >= before + 2.0
    });
    assert!(
        f.record_path(&wiped, "eth0").exists(),
        "the forgotten sandbox was freed while its namespace lived:\n{}",
        agent.log_text()
    );
    assert!(!agent.log_text().contains("not-in-runtime"));

    // Its namespace goes (unmounted where containerd mounted it, in the private mount
    // namespace): the agent releases it, and only it.
    run_ok(
        Command::new("nsenter")
            .arg(format!("--mount={}", private.mnt()))
            .args(["ip", "netns", "del"])
            .arg(wiped_ns.rsplit('/').next().unwrap()),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while f.record_path(&wiped, "eth0").exists() {
        assert!(
            Instant::now() < deadline,
            "the forgotten sandbox was never released:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_only_wiped_released(&f, &wiped, &live);
    assert!(
        foreign_record.exists(),
        "a network containerd does not serve was judged by its list"
    );

    // containerd crashes, its socket left behind: counted, and nothing judged by it.
    ctrd.crash();
    let before = sample(&agent.metrics(), runs).unwrap_or(0.0);
    let m = wait_metrics(&agent, "gc runs without an answer", |m| {
        sample(m, &up) == Some(0.0) && sample(m, runs).unwrap_or(0.0) >= before + 2.0
    });
    assert!(sample(&m, &unanswered).unwrap_or(0.0) >= 1.0, "{m}");
    assert!(f.record_path(&live, "eth0").exists());
    assert!(foreign_record.exists());
    assert!(agent.log_text().contains("did not answer"));

    // Stopped cleanly, it takes its socket along: no runtime to ask, no stale gauge.
    let mut ctrd = Containerd::start_in(&f, &dir, Some(&private));
    wait_metrics(&agent, "containerd answering again", |m| {
        sample(m, &up) == Some(1.0)
    });
    ctrd.stop();
    wait_metrics(&agent, "no runtime left to ask", |m| {
        sample(m, &up).is_none()
    });
    assert!(agent.log_text().contains("no CRI runtime to ask"));
    assert!(f.record_path(&live, "eth0").exists());
    assert!(agent.stop(20).success(), "{}", agent.log_text());

    // Teardown as kubelet and the other caller would do it.
    let ctrd = Containerd::start_in(&f, &dir, Some(&private));
    ctrd.stop_and_remove(&live);
    assert!(!f.record_path(&live, "eth0").exists(), "{}", f.log());
    drop(ctrd);
    f.network = other;
    f.del(&foreign, "eth0", Some(&podman_like.path_str()), None)
        .unwrap();
    forget_system_cache_entries(&wiped);
}

/// Docker's containerd runs with its CRI plugin off: at the default socket it is found,
/// answers Unimplemented, and is left out as no runtime of pods, not counted as a
/// runtime that did not answer.
#[test]
fn agent_leaves_out_a_containerd_without_cri() {
    require_root!();
    let _serial = one_containerd_at_a_time();
    let f = Fixture::new();
    let private = PrivateRun::new();
    let dir = Containerd::configure_at(&f, Some("/run/containerd/containerd.sock"));
    let config = fs::read_to_string(dir.join("config.toml"))
        .unwrap()
        .replacen(
            "disabled_plugins = [",
            r#"disabled_plugins = ["io.containerd.grpc.v1.cri", "#,
            1,
        );
    fs::write(dir.join("config.toml"), config).unwrap();
    let _ctrd = Containerd::start_in(&f, &dir, Some(&private));
    let mut agent = start_agent(&f, &private, &f.cache_dir, &[]);
    let runs = r#"cni_ledger_gc_runs_total{result="ok"}"#;
    let m = wait_metrics(&agent, "two gc runs", |m| {
        sample(m, runs).unwrap_or(0.0) >= 2.0
    });
    let text = agent.log_text();
    assert!(
        text.contains("unix:///run/containerd/containerd.sock serves no CRI RuntimeService"),
        "{text}"
    );
    assert!(!text.contains("did not answer"), "{text}");
    assert!(!m.contains("cni_ledger_cri_up{"), "{m}");
    assert!(!m.contains("cni_ledger_cri_unanswered_total{"), "{m}");
    assert!(agent.stop(20).success(), "{}", agent.log_text());
}

/// A fixture whose conflist ([bridge+host-local, portmap]) does not hold the ledger yet,
/// and `version`'s containerd serving it at its default socket in a private
/// `/run/containerd`, with the pause image imported: pods made now are recorded by nobody.
fn containerd_before_injection(
    version: ContainerdVersion,
    prefix: &str,
) -> (Fixture, PrivateRun, Containerd) {
    let mut f = Fixture::new();
    f.network = format!("{prefix}{}", next_id());
    let spec = f.spec.clone();
    let mut plain = f.conflist(&spec);
    plain["plugins"].as_array_mut().unwrap().remove(0);
    f.write_conflist(&plain);
    for p in ["loopback", "bridge", "host-local", "portmap"] {
        symlink(Path::new(CNI_PLUGIN_DIR).join(p), f.bin_dir.join(p)).unwrap();
    }
    let private = PrivateRun::new();
    let tarball = build_pause_image(f.tmp.path());
    let dir = Containerd::configure_version(version, &f, Some(Containerd::DEFAULT_SOCKET));
    let ctrd = Containerd::start_version(version, &f, &dir, Some(&private));
    let out = ctrd.ctr(&["images", "import", tarball.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));
    (f, private, ctrd)
}

/// A sandbox made while the ledger was out of the chain: the agent injects the ledger,
/// adopts the attachment from containerd's libcni cache and, once containerd has
/// forgotten the sandbox, releases it. The chain libcni cached (without the ledger) is
/// the one containerd reports loading (with it), so containerd's list may judge it.
#[test]
fn agent_releases_an_adopted_sandbox_containerd_forgot() {
    require_root!();
    let _serial = one_containerd_at_a_time();
    let (f, private, mut ctrd) = containerd_before_injection(ContainerdVersion::V1_6, "cladopt");
    let early = ctrd.run_sandbox("early", 18101);
    assert!(
        !f.record_path(&early, "eth0").exists(),
        "recorded without the ledger"
    );
    assert_eq!(f.ipam_addresses().len(), 1);
    std::thread::sleep(Duration::from_millis(2100)); // older than any list below

    let mut agent = start_agent(&f, &private, Path::new("/var/lib/cni"), &["--grace", "0"]);
    let record = f.record_path(&early, "eth0");
    let runs = r#"cni_ledger_gc_runs_total{result="ok"}"#;
    wait_metrics(&agent, "adopted, and three gc runs", |m| {
        record.exists() && sample(m, runs).unwrap_or(0.0) >= 3.0
    });
    let doc: Value = serde_json::from_slice(&fs::read(&record).unwrap()).unwrap();
    assert_eq!(doc["record"]["source"], json!("adopted"), "{doc:#}");
    assert!(doc["record"]["chainDigest"].is_string(), "{doc:#}");
    // Listed by containerd: live, though the namespace is not recorded.
    assert_eq!(f.ipam_addresses().len(), 1, "{}", agent.log_text());

    let early_ns = cached_netns(&f.network, &early);
    let dir = ctrd.dir.clone();
    ctrd.forget_and_stop(&early);
    let _ctrd = Containerd::start_in(&f, &dir, Some(&private));
    let deadline = Instant::now() + Duration::from_secs(30);
    while record.exists() {
        assert!(
            Instant::now() < deadline,
            "the adopted, forgotten sandbox was never released:\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(f.ipam_addresses().is_empty(), "address not released");
    assert!(
        f.host.nat_lines_for(&early).is_empty(),
        "{}",
        f.host.iptables_save()
    );
    assert!(
        agent.log_text().contains("not-in-runtime"),
        "{}",
        agent.log_text()
    );
    assert!(agent.stop(20).success(), "{}", agent.log_text());
    forget_system_cache_entries(&early);
    remove_forgotten_netns(&early_ns);
}

/// containerd runs its own `cni-loopback` network beside the pod network, through the
/// same libcni cache. The agent adopts the pod network's attachment made while the
/// ledger was out of the chain, and nothing of cni-loopback (no DEL of it ever reaches
/// the ledger): once containerd has stopped and removed the pod cleanly, the ledger
/// holds nothing of it in any network, and gc has nothing to report.
#[test]
fn agent_adopts_nothing_a_clean_teardown_would_leave_behind() {
    require_root!();
    adopts_nothing_a_clean_teardown_would_leave_behind(ContainerdVersion::V1_6, "clscope");
}

/// The same through containerd 2.x, whose CRI (split in runtime and images plugins, config
/// version 3) runs cni-loopback through libcni as 1.6 does.
#[test]
fn agent_adopts_nothing_a_clean_teardown_of_containerd_2_would_leave_behind() {
    require_root!();
    adopts_nothing_a_clean_teardown_would_leave_behind(ContainerdVersion::V2, "clscope2-");
}

fn adopts_nothing_a_clean_teardown_would_leave_behind(version: ContainerdVersion, prefix: &str) {
    let _serial = one_containerd_at_a_time();
    let (f, private, ctrd) = containerd_before_injection(version, prefix);
    let early = ctrd.run_sandbox("early", 18102);
    let loopback_cache = Path::new("/var/lib/cni/results").join(format!("cni-loopback-{early}-lo"));
    assert!(
        loopback_cache.exists(),
        "containerd ran no cni-loopback attachment"
    );
    assert!(!f.record_path(&early, "eth0").exists());

    let mut agent = start_agent(&f, &private, Path::new("/var/lib/cni"), &["--grace", "0"]);
    let record = f.record_path(&early, "eth0");
    let runs = r#"cni_ledger_gc_runs_total{result="ok"}"#;
    wait_metrics(&agent, "adopted, and a gc run", |m| {
        record.exists()
            && agent.log_text().contains("agent: adopted")
            && sample(m, runs).unwrap_or(0.0) >= 1.0
    });
    let of_the_pod = |f: &Fixture| -> Vec<String> {
        f.record_files()
            .into_iter()
            .filter(|n| n.contains(&early))
            .collect()
    };
    assert_eq!(
        of_the_pod(&f),
        [format!("{}:{early}:eth0.json", f.network)],
        "{}",
        agent.log_text()
    );
    assert!(
        agent.log_text().contains("network cni-loopback"),
        "what was left out is not reported:\n{}",
        agent.log_text()
    );

    ctrd.stop_and_remove(&early);
    assert!(
        !loopback_cache.exists(),
        "containerd kept its cni-loopback entry"
    );
    let done = sample(&agent.metrics(), runs).unwrap_or(0.0);
    wait_metrics(&agent, "two more gc runs", |m| {
        sample(m, runs).unwrap_or(0.0) >= done + 2.0
    });
    assert!(
        of_the_pod(&f).is_empty(),
        "left after a clean Stop/Remove: {:?}\n{}",
        of_the_pod(&f),
        agent.log_text()
    );
    assert!(f.ipam_addresses().is_empty(), "address not released");
    let (code, rep) = gc_cri(&f, &ctrd.endpoint());
    assert_eq!(code, 0, "{rep:#}");
    assert_eq!(rep["records"], json!([]), "{rep:#}");
    assert!(agent.stop(20).success(), "{}", agent.log_text());
    forget_system_cache_entries(&early);
}

/// containerd 2.x's verbose Status still says which networks it loads from which conf
/// dir, in the shape 1.6 gave (`cniconfig`: PluginConfDir, Networks[].Config.Name and
/// .Source): a discovered containerd 2.x judges the fixture's network, and the chain it
/// reports loading is the conflist's, as the ledger digests it.
#[test]
fn containerd_2_status_names_the_networks_it_loads() {
    require_root!();
    let _serial = one_containerd_at_a_time();
    let (f, _private, ctrd) = containerd_before_injection(ContainerdVersion::V2, "clstatus");
    let consulted = cni_ledger::cri::consult(
        &[ctrd.endpoint()],
        std::slice::from_ref(&f.network),
        cni_ledger::cri::Served::Reported {
            conf_dir: &f.conf_dir,
            default_network: None,
            discovered: true,
        },
        true,
        Duration::from_secs(30),
    );
    let judgement = consulted
        .judgement
        .unwrap_or_else(|| panic!("nothing judged: {:?}\n{}", consulted.answers, ctrd.log()));
    assert_eq!(
        judgement.networks,
        [f.network.clone()].into_iter().collect(),
        "{}",
        ctrd.log()
    );
    let list = cni_ledger::conflist::parse(&fs::read(&f.conf_file).unwrap()).unwrap();
    let digest = cni_ledger::conflist::chain_digest(&list, "cni-ledger");
    assert_eq!(
        judgement.adopted,
        cni_ledger::cri::AdoptedChains::Loaded(
            [(f.network.clone(), [digest].into_iter().collect())]
                .into_iter()
                .collect()
        )
    );
}
