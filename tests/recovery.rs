//! Recovery that does not slow the node (issue 33): gc's replays step aside while an ADD
//! is in flight on the node, for at most `--yield-max` per run, then replay regardless.
//!
//! The chain is `[cni-ledger, cl-slowadd(bridge + host-local), cni-ledger tail]` through
//! libcni: testdata/plugins/cl-slowadd holds a new pod's ADD in the chain after the head
//! recorded it, as a pod-start storm keeps ADDs in flight while gc runs. The stale
//! attachment is a real one (bridge, veth, a host-local address) whose namespace is
//! gone. Needs root.
//!
//!     cargo test --features testing --test recovery

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use agent_common::{dir_args, preinstalled_bin, wait_for, Agent};
use common::*;
use serde_json::{json, Value};

use common::slowadd::{gate_file, held_chain_fixture as fixture, release, start_held_add};

/// A completed attachment whose namespace is then deleted: stale, with its address
/// still held by host-local. Returns the address.
fn stale_attachment(f: &Fixture, cid: &str) -> String {
    fs::write(gate_file(f), b"").unwrap();
    let mut ns = Netns::new();
    let result = f
        .add(cid, "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD {cid}: {e}\nlog:\n{}", f.log()));
    ns.delete();
    fs::remove_file(gate_file(f)).unwrap();
    let ip = first_ip(&result);
    assert!(f.ipam_addresses().contains(&ip), "{ip} not held");
    ip
}

/// `cni-ledger gc --json --grace 0 --now` of the fixture's network, started, logging
/// into the fixture's log.
fn start_gc(f: &Fixture, extra: &[&str]) -> Child {
    let cache = f.cache_dir.to_string_lossy().into_owned();
    let log = f.log_file.to_string_lossy().into_owned();
    let mut args = vec!["gc", "--json", "--cni-cache-dir", cache.as_str()];
    args.extend_from_slice(&["--log-file", log.as_str()]);
    args.extend_from_slice(&["--grace", "0", "--now", "--network", &f.network]);
    args.extend_from_slice(extra);
    f.ledger_cmd(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for gc and returns its output and report; the replay of the
/// stale attachment must have released it.
fn replayed(f: &Fixture, gc: Child, stale: &str, ip: &str) -> (Output, Value) {
    let out = gc.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "gc: {}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["summary"]["replayed"], json!(1), "{report:#}");
    assert!(
        !f.record_path(stale, "eth0").exists(),
        "the stale record is left"
    );
    assert!(
        !f.ipam_addresses().contains(&ip.to_string()),
        "{ip} still held"
    );
    (out, report)
}

#[test]
fn gc_waits_while_an_add_is_in_the_chain_and_replays_once_it_completed() {
    require_root!();
    let f = fixture();
    let ip = stale_attachment(&f, "c-stale");
    let ns = Netns::new();
    let add = start_held_add(&f, "c-new", &ns);

    let t0 = Instant::now();
    let mut gc = start_gc(&f, &["--yield-max", "60"]);
    // The ADD is in the chain: gc scans, finds the stale attachment and waits.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        gc.try_wait().unwrap().is_none(),
        "gc finished with an ADD in the chain\nlog:\n{}",
        f.log()
    );
    assert!(
        f.record_path("c-stale", "eth0").exists() && f.ipam_addresses().contains(&ip),
        "gc replayed while an ADD was in the chain\nlog:\n{}",
        f.log()
    );
    assert!(
        f.log().contains("an ADD is in flight on the node"),
        "{}",
        f.log()
    );

    // The ADD completes (the tail notes it): gc goes on at once, far within its bound.
    let released = Instant::now();
    release(&f, add);
    let _ = replayed(&f, gc, "c-stale", &ip);
    assert!(
        released.elapsed() < Duration::from_secs(20),
        "gc went on {:?} after the ADD completed",
        released.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(60));
    assert!(f.log().contains("replays waited"), "{}", f.log());
    // The new pod's record is live and untouched.
    assert!(f.record_path("c-new", "eth0").exists());
}

#[test]
fn gc_replays_once_its_bound_is_spent_with_the_add_still_in_the_chain() {
    require_root!();
    let f = fixture();
    let ip = stale_attachment(&f, "c-stale");
    let ns = Netns::new();
    let add = start_held_add(&f, "c-new", &ns);

    let t0 = Instant::now();
    let gc = start_gc(&f, &["--yield-max", "3"]);
    let (_, _) = replayed(&f, gc, "c-stale", &ip);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(3),
        "gc did not wait for the ADD in the chain: {took:?}\nlog:\n{}",
        f.log()
    );
    assert!(
        f.log().contains("the most it may: replaying regardless"),
        "{}",
        f.log()
    );
    // The held ADD is still in the chain, and completes afterwards.
    assert!(!f.tmp.path().join("slow-gate").exists());
    release(&f, add);
    assert!(f.record_path("c-new", "eth0").exists());
}

#[test]
fn gc_without_yield_and_a_dry_run_do_not_wait() {
    require_root!();
    let f = fixture();
    let ip = stale_attachment(&f, "c-stale");
    let ns = Netns::new();
    let add = start_held_add(&f, "c-new", &ns);

    // A dry run runs no plugin: it reports at once.
    let t0 = Instant::now();
    let dry = start_gc(&f, &["--dry-run"]).wait_with_output().unwrap();
    // Exit 1: a record would be replayed.
    assert_eq!(dry.status.code(), Some(1), "{}", describe(&dry));
    let report: Value = serde_json::from_slice(&dry.stdout).unwrap();
    assert_eq!(report["summary"]["wouldReplay"], json!(1), "{report:#}");
    // `--yield-max 0`: the replay runs with the ADD in the chain.
    let gc = start_gc(&f, &["--yield-max", "0"]);
    let _ = replayed(&f, gc, "c-stale", &ip);
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "{:?}\nlog:\n{}",
        t0.elapsed(),
        f.log()
    );
    assert!(
        !f.log().contains("an ADD is in flight on the node"),
        "{}",
        f.log()
    );
    release(&f, add);
}

#[test]
fn the_agents_first_gc_run_waits_for_an_add_in_the_chain() {
    require_root!();
    let f = fixture();
    let ip = stale_attachment(&f, "c-stale");
    let ns = Netns::new();
    let add = start_held_add(&f, "c-new", &ns);

    // The agent over a node whose pods are starting: its first gc run (at start, flags
    // at their defaults but the grace: the stale record is of this boot).
    let bin = preinstalled_bin(&f);
    let mut args = dir_args(&bin, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    args.extend(["--grace".to_string(), "0".to_string()]);
    let log = f.tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &args, &log, Some(f.host.name()));
    wait_for(Duration::from_secs(10), || {
        agent.log_text().contains("an ADD is in flight on the node")
    })
    .unwrap_or_else(|| panic!("the agent's gc did not wait:\n{}", agent.log_text()));
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        f.record_path("c-stale", "eth0").exists() && f.ipam_addresses().contains(&ip),
        "the agent replayed while an ADD was in the chain:\n{}",
        agent.log_text()
    );

    release(&f, add);
    wait_for(Duration::from_secs(20), || {
        !f.record_path("c-stale", "eth0").exists() && !f.ipam_addresses().contains(&ip)
    })
    .unwrap_or_else(|| {
        panic!(
            "not released after the ADD completed:\n{}",
            agent.log_text()
        )
    });
    assert!(agent.stop(30).success());
    assert!(f.record_path("c-new", "eth0").exists());
}

#[test]
fn gc_with_nothing_stale_does_not_wait_for_an_add_in_the_chain() {
    require_root!();
    let f = fixture();
    let ns = Netns::new();
    let add = start_held_add(&f, "c-new", &ns);

    // Only the held ADD's record, live: nothing to replay, so nothing to wait for.
    let t0 = Instant::now();
    let out = start_gc(&f, &[]).wait_with_output().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["summary"]["stale"], json!(0), "{report:#}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(
        !f.log().contains("an ADD is in flight on the node"),
        "{}",
        f.log()
    );
    release(&f, add);
}
