//! The chain's metrics and host-local headroom through the real agent binary: records
//! made by real ADDs through libcni (bridge + host-local), completed or marked as the
//! chain's tail entry does (docs/ALERTS.md, the chain's spec), show in `/metrics` as
//! they change (the agent's inotify watch), and the range's used/size follow
//! host-local's data dir. Needs root, curl and promtool.
//!
//!     cargo test --features testing --test chain_metrics
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_common::*;
use common::*;
use serde_json::{json, Value};

const SECOND: Duration = Duration::from_secs(1);

fn preinstalled_bin(f: &Fixture) -> PathBuf {
    let dir = f.tmp.path().join("agent-bin");
    fs::create_dir_all(&dir).unwrap();
    fs::copy(ledger_bin(), dir.join("cni-ledger")).unwrap();
    dir
}

fn agent_args(f: &Fixture, bin: &Path) -> Vec<String> {
    let mut v = dir_args(bin, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    // gc every second.
    v.extend(["--gc-interval", "1"].map(String::from));
    v
}

/// Runs `gc --metrics-file` on the fixture (no agent) and returns the file's text.
fn gc_metrics_file(f: &Fixture) -> String {
    let file = f.tmp.path().join("cni-ledger.prom");
    let out = std::process::Command::new(ledger_bin())
        .arg("gc")
        .args(["--ledger-dir", f.ledger_dir.to_str().unwrap()])
        .args(["--conf-dir", f.conf_dir.to_str().unwrap()])
        .args(["--cni-cache-dir", f.cache_dir.to_str().unwrap()])
        .arg("--metrics-file")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::read_to_string(&file).unwrap()
}

/// Adds the chain's fields to a record as the tail entry does: `tail` as the head writes
/// it for a chain with a tail, then `chain` merged in; the record rewritten the ledger's
/// way (checksummed envelope, temp + fsync + rename).
fn mark(path: &Path, chain: Value) {
    let env: Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    let mut rec = env["record"].clone();
    rec["tail"] = json!(true);
    rec["chain"] = chain;
    let body = serde_json::to_string(&rec).unwrap();
    let bytes = format!(
        "{{\"format\":1,\"sha256\":\"{}\",\"record\":{body}}}\n",
        cni_ledger::ledger::record::sha256_hex(body.as_bytes())
    );
    let name = path.file_name().unwrap().to_str().unwrap();
    cni_ledger::ledger::fsio::write_atomic(
        path.parent().unwrap(),
        name,
        bytes.as_bytes(),
        "record",
    )
    .unwrap();
}

fn created_boot_ns(path: &Path) -> Option<u64> {
    let env: Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    env["record"]["createdBootNs"].as_u64()
}

#[test]
fn the_agent_exports_chain_outcomes_durations_and_headroom() {
    require_root!();
    let f = Fixture::new();
    let bin = preinstalled_bin(&f);
    let log = f.tmp.path().join("agent.log");
    // No tail in the chain: the test plays the tail's part on the records itself.
    let mut args = agent_args(&f, &bin);
    args.push("--no-tail".into());
    // A DEL landing on an ADD not completed retires its record: counted torn down once
    // that ADD can no longer complete, here after 2 s.
    args.extend(["--chain-left-after".into(), "2".into()]);
    let agent = Agent::start(&ledger_bin(), &args, &log, None);
    let net = f.network.clone();
    let ok = format!("cni_ledger_chain_adds_total{{network=\"{net}\",result=\"ok\"}}");
    let torn =
        format!("cni_ledger_chain_adds_total{{network=\"{net}\",result=\"failed-torn-down\"}}");

    // An ADD the tail completed, 0.3 s after the head began.
    let ns1 = Netns::new();
    f.add("c-done", "eth0", Some(&ns1.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let rec1 = f.record_path("c-done", "eth0");
    let began = created_boot_ns(&rec1).unwrap_or(1_000_000_000);
    // Let the watcher learn the record first, as it would between head and tail.
    std::thread::sleep(SECOND / 2);
    mark(
        &rec1,
        json!({"completedAt": "2026-12-04T16:00:00Z", "completedBootNs": began + 300_000_000,
               "addSeconds": 0.3, "result": {"cniVersion": "1.0.0"}}),
    );
    wait_for(5 * SECOND, || sample(&agent.metrics(), &ok) == Some(1.0)).unwrap_or_else(|| {
        panic!(
            "no ok ADD counted:\n{}\n{}",
            agent.metrics(),
            agent.log_text()
        )
    });
    let m = agent.metrics();
    let h = "cni_ledger_chain_add_duration_seconds";
    let series = |s: &str, le: Option<&str>| match le {
        Some(le) => format!("{h}_{s}{{network=\"{net}\",le=\"{le}\"}}"),
        None => format!("{h}_{s}{{network=\"{net}\"}}"),
    };
    assert_eq!(sample(&m, &series("count", None)), Some(1.0), "{m}");
    assert!(
        (sample(&m, &series("sum", None)).unwrap() - 0.3).abs() < 1e-9,
        "{m}"
    );
    assert_eq!(
        sample(&m, &series("bucket", Some("0.25"))),
        Some(0.0),
        "{m}"
    );
    assert_eq!(sample(&m, &series("bucket", Some("0.5"))), Some(1.0), "{m}");

    // An ADD that never reached the tail, then its DEL: the tail noted DEL's start.
    let ns2 = Netns::new();
    f.add("c-torn", "eth0", Some(&ns2.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let rec2 = f.record_path("c-torn", "eth0");
    let del_began = cni_ledger::metrics::chain::boot_ns().unwrap();
    mark(
        &rec2,
        json!({"delBeganAt": "2026-12-04T16:00:01Z", "delBeganBootNs": del_began}),
    );
    std::thread::sleep(SECOND / 2);
    f.del("c-torn", "eth0", Some(&ns2.path_str()), None)
        .unwrap_or_else(|e| panic!("DEL: {e}"));
    assert!(!rec2.exists(), "DEL left the record");
    let del_count = format!("cni_ledger_chain_del_duration_seconds_count{{network=\"{net}\"}}");
    wait_for(10 * SECOND, || {
        let m = agent.metrics();
        sample(&m, &torn) == Some(1.0) && sample(&m, &del_count) == Some(1.0)
    })
    .unwrap_or_else(|| panic!("torn-down ADD not counted:\n{}", agent.metrics()));
    let m = agent.metrics();
    let del_sum = sample(
        &m,
        &format!("cni_ledger_chain_del_duration_seconds_sum{{network=\"{net}\"}}"),
    )
    .unwrap();
    assert!(
        (0.5..10.0).contains(&del_sum),
        "DEL began before the 0.5 s pause: {del_sum}"
    );
    assert_eq!(sample(&m, &ok), Some(1.0), "a DEL is no second ok ADD: {m}");

    // host-local's range: one address held (c-done's), of .2-.254 (the gateway .1 out).
    let range = format!("{p}.1-{p}.254", p = f.subnet_prefix);
    let used = format!("cni_ledger_addresses_used{{network=\"{net}\",range=\"{range}\"}}");
    let size = format!("cni_ledger_addresses_size{{network=\"{net}\",range=\"{range}\"}}");
    wait_for(5 * SECOND, || sample(&agent.metrics(), &used) == Some(1.0)).unwrap_or_else(|| {
        panic!(
            "headroom not exported: {:?}\n{}",
            f.ipam_addresses(),
            agent.metrics()
        )
    });
    let m = agent.metrics();
    assert_eq!(sample(&m, &size), Some(253.0), "{m}");
    let ratio = sample(
        &m,
        &format!("cni_ledger_address_headroom_ratio{{network=\"{net}\",range=\"{range}\"}}"),
    )
    .unwrap();
    assert!((ratio - 252.0 / 253.0).abs() < 1e-9, "{ratio}");
    promtool_check(&m);

    f.del("c-done", "eth0", Some(&ns1.path_str()), None)
        .unwrap();
    drop(agent);
}

#[test]
fn gc_metrics_file_carries_failed_left_and_headroom_without_the_agent() {
    require_root!();
    let f = Fixture::new();
    let ns = Netns::new();
    f.add("c-left", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let rec = f.record_path("c-left", "eth0");
    // Never completed, no DEL, begun 20 minutes ago: past --chain-left-after's 900 s.
    let now = cni_ledger::metrics::chain::boot_ns().unwrap();
    let env: Value = serde_json::from_slice(&fs::read(&rec).unwrap()).unwrap();
    let mut body = env["record"].clone();
    body["createdBootNs"] = json!(now.saturating_sub(1_200_000_000_000));
    body["tail"] = json!(true);
    let text = serde_json::to_string(&body).unwrap();
    let bytes = format!(
        "{{\"format\":1,\"sha256\":\"{}\",\"record\":{text}}}\n",
        cni_ledger::ledger::record::sha256_hex(text.as_bytes())
    );
    let name = rec.file_name().unwrap().to_str().unwrap();
    cni_ledger::ledger::fsio::write_atomic(rec.parent().unwrap(), name, bytes.as_bytes(), "record")
        .unwrap();
    let m = gc_metrics_file(&f);
    let net = &f.network;
    assert_eq!(
        sample(
            &m,
            &format!("cni_ledger_chain_failed_left_records{{network=\"{net}\"}}")
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(addresses_used(&f, &m), Some(1.0), "{m}");
    promtool_check(&m);
    assert!(rec.exists(), "a live record is left alone");
    f.del("c-left", "eth0", Some(&ns.path_str()), None).unwrap();
}

/// gc's metrics come from its own scan of the records, less what the run removed: the
/// record it replayed is no longer counted, the one it left is, and host-local's
/// address of the replayed one is free again.
#[test]
fn gc_metrics_file_counts_the_records_the_run_left() {
    require_root!();
    let f = Fixture::new();
    let stays = Netns::new();
    let mut goes = Netns::new();
    for (cid, ns) in [("c-stays", &stays), ("c-goes", &goes)] {
        f.add(cid, "eth0", Some(&ns.path_str()), None)
            .unwrap_or_else(|e| panic!("ADD {cid}: {e}"));
    }
    goes.delete();
    let file = f.tmp.path().join("left.prom");
    let (out, rep) = f.gc(&[
        "--grace",
        "0",
        "--conf-dir",
        f.conf_dir.to_str().unwrap(),
        "--metrics-file",
        file.to_str().unwrap(),
    ]);
    let rep = rep.unwrap_or_else(|| panic!("gc: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep:#}");
    assert_eq!(rep["summary"]["live"], json!(1), "{rep:#}");
    let m = fs::read_to_string(&file).unwrap();
    let net = &f.network;
    assert_eq!(
        sample(&m, &format!("cni_ledger_records{{network=\"{net}\"}}")),
        Some(1.0),
        "the replayed record is gone from the count: {m}"
    );
    assert_eq!(
        sample(&m, "cni_ledger_replays_total{outcome=\"replayed\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(addresses_used(&f, &m), Some(1.0), "{m}");
    promtool_check(&m);
    assert!(f.record_path("c-stays", "eth0").exists());
    assert!(!f.record_path("c-goes", "eth0").exists());
    f.del("c-stays", "eth0", Some(&stays.path_str()), None)
        .unwrap();
}

/// A node whose pod range comes from the runtime (`ipRanges`, as containerd passes the
/// node's pod CIDR) and not from the conflist: host-local hands addresses out of it, the
/// ledger's record keeps it, and the headroom counts it. (A range in both places would
/// give a second IPv4 gateway, which Debian's bridge 1.1.1 refuses.)
#[test]
fn headroom_counts_the_range_the_runtime_passed() {
    require_root!();
    let mut f = Fixture::new();
    let mut list = f.conflist(&ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    list["plugins"][0]["capabilities"] = json!({"ipRanges": true});
    list["plugins"][1]["capabilities"] = json!({"ipRanges": true});
    list["plugins"][1]["ipam"]
        .as_object_mut()
        .unwrap()
        .remove("ranges");
    f.write_conflist(&list);
    let pod_cidr = "10.231.7.0/24";
    let caps = json!({"ipRanges": [[{"subnet": pod_cidr}]]});
    let ns = Netns::new();
    let result = f
        .add("c-ranges", "eth0", Some(&ns.path_str()), Some(&caps))
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let ips: Vec<&str> = result["ips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|ip| ip["address"].as_str().unwrap())
        .collect();
    assert!(
        ips.iter().any(|a| a.starts_with("10.231.7.")),
        "host-local used the runtime's range: {result}"
    );
    let m = gc_metrics_file(&f);
    let net = &f.network;
    let series = |name: &str, range: &str| {
        sample(
            &m,
            &format!("{name}{{network=\"{net}\",range=\"{range}\"}}"),
        )
    };
    let passed = "10.231.7.1-10.231.7.254";
    assert_eq!(
        series("cni_ledger_addresses_used", passed),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        series("cni_ledger_addresses_size", passed),
        Some(253.0),
        "{m}"
    );
    assert_eq!(
        m.matches("cni_ledger_addresses_size{").count(),
        1,
        "the runtime's range, and no other: {m}"
    );
    promtool_check(&m);
    f.del("c-ranges", "eth0", Some(&ns.path_str()), Some(&caps))
        .unwrap();
}

// Through libcni with the real tail: the chain helper's probe plugin
// (testdata/plugins/cl-chainprobe) sleeps or fails ADD in the chain
// `[cni-ledger, bridge+host-local, cl-chainprobe, cni-ledger (tail)]`.

const PROBE: &str = "cl-chainprobe";

fn tail_fixture(probe: Value) -> Fixture {
    let mut f = Fixture::with_spec(ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    f.install_test_plugin(PROBE);
    let mut probe = probe;
    probe["type"] = json!(PROBE);
    let tail = f.tail_entry();
    f.spec.extra = vec![probe, tail];
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
    f
}

fn tail_agent(f: &Fixture, left_after: &str) -> Agent {
    let bin = preinstalled_bin(f);
    let mut args = agent_args(f, &bin);
    args.extend(["--chain-left-after".to_string(), left_after.to_string()]);
    let log = f.tmp.path().join("agent.log");
    let agent = Agent::start(&ledger_bin(), &args, &log, None);
    // The records dir exists from the agent's first pass; let the watcher arm.
    wait_for(5 * SECOND, || f.ledger_dir.join("records").is_dir())
        .unwrap_or_else(|| panic!("no records dir:\n{}", agent.log_text()));
    std::thread::sleep(SECOND);
    agent
}

#[test]
fn through_libcni_the_add_histogram_brackets_a_plugins_sleep() {
    require_root!();
    let sleep = 0.7;
    let f = tail_fixture(json!({"addSleepMs": 700}));
    let agent = tail_agent(&f, "900");
    let net = f.network.clone();
    let ns = Netns::new();
    let t0 = std::time::Instant::now();
    f.add("c-timed", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}\n{}", f.log()));
    let outer = t0.elapsed().as_secs_f64();
    let count = format!("cni_ledger_chain_add_duration_seconds_count{{network=\"{net}\"}}");
    wait_for(5 * SECOND, || sample(&agent.metrics(), &count) == Some(1.0))
        .unwrap_or_else(|| panic!("not observed:\n{}\n{}", agent.metrics(), agent.log_text()));
    let m = agent.metrics();
    let sum = sample(
        &m,
        &format!("cni_ledger_chain_add_duration_seconds_sum{{network=\"{net}\"}}"),
    )
    .unwrap();
    assert!(
        sum >= sleep && sum <= outer,
        "observed {sum}s outside [{sleep}, {outer}]"
    );
    let bucket = |le: &str| {
        sample(
            &m,
            &format!(
                "cni_ledger_chain_add_duration_seconds_bucket{{network=\"{net}\",le=\"{le}\"}}"
            ),
        )
    };
    assert_eq!(bucket("0.5"), Some(0.0), "{m}");
    assert_eq!(bucket("60"), Some(1.0), "{m}");
    assert_eq!(
        sample(
            &m,
            &format!("cni_ledger_chain_adds_total{{network=\"{net}\",result=\"ok\"}}")
        ),
        Some(1.0)
    );
    // The runtime's DEL: the tail notes its start, the head removes the record.
    f.del("c-timed", "eth0", Some(&ns.path_str()), None)
        .unwrap();
    let del = format!("cni_ledger_chain_del_duration_seconds_count{{network=\"{net}\"}}");
    wait_for(5 * SECOND, || sample(&agent.metrics(), &del) == Some(1.0))
        .unwrap_or_else(|| panic!("DEL not observed:\n{}", agent.metrics()));
    let m = agent.metrics();
    assert_eq!(
        sample(
            &m,
            &format!(
                "cni_ledger_chain_adds_total{{network=\"{net}\",result=\"failed-torn-down\"}}"
            )
        ),
        Some(0.0),
        "a completed ADD's DEL is no failure (the series is at zero since the injection): {m}"
    );
}

#[test]
fn through_libcni_a_failed_add_is_torn_down_with_its_del_and_left_without() {
    require_root!();
    let f = tail_fixture(json!({"failAdd": true}));
    let agent = tail_agent(&f, "2");
    let net = f.network.clone();
    let (torn_ns, left_ns) = (Netns::new(), Netns::new());
    for (cid, ns) in [("c-torn", &torn_ns), ("c-left", &left_ns)] {
        let e = f.add(cid, "eth0", Some(&ns.path_str()), None).unwrap_err();
        assert!(e.contains("cl-chainprobe fails ADD"), "{e}");
    }
    let series =
        |r: &str| format!("cni_ledger_chain_adds_total{{network=\"{net}\",result=\"{r}\"}}");
    f.del("c-torn", "eth0", Some(&torn_ns.path_str()), None)
        .unwrap();
    wait_for(5 * SECOND, || {
        sample(&agent.metrics(), &series("failed-torn-down")) == Some(1.0)
    })
    .unwrap_or_else(|| panic!("torn-down not counted:\n{}", agent.metrics()));
    // No DEL for the other: failed-left once older than --chain-left-after (2 s), once.
    let left_now = format!("cni_ledger_chain_failed_left_records{{network=\"{net}\"}}");
    wait_for(10 * SECOND, || {
        sample(&agent.metrics(), &left_now) == Some(1.0)
    })
    .unwrap_or_else(|| panic!("failed-left not seen:\n{}", agent.metrics()));
    std::thread::sleep(3 * SECOND);
    let m = agent.metrics();
    assert_eq!(
        sample(&m, &series("failed-left")),
        Some(1.0),
        "counted once: {m}"
    );
    // At zero from the injection on (a rate must see the first ADD), and no more.
    assert_eq!(sample(&m, &series("ok")), Some(0.0), "{m}");
    assert_eq!(sample(&m, &series("failed-torn-down")), Some(1.0), "{m}");
    // Its late DEL is not counted again as torn down.
    f.del("c-left", "eth0", Some(&left_ns.path_str()), None)
        .unwrap();
    wait_for(5 * SECOND, || sample(&agent.metrics(), &left_now).is_none())
        .unwrap_or_else(|| panic!("gauge kept a removed record:\n{}", agent.metrics()));
    assert_eq!(
        sample(&agent.metrics(), &series("failed-torn-down")),
        Some(1.0)
    );
}

/// host-local's used count of the fixture's one range, as the metrics file has it.
fn addresses_used(f: &Fixture, m: &str) -> Option<f64> {
    let range = format!("{p}.1-{p}.254", p = f.subnet_prefix);
    sample(
        m,
        &format!(
            "cni_ledger_addresses_used{{network=\"{}\",range=\"{range}\"}}",
            f.network
        ),
    )
}
