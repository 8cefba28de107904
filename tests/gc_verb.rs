//! The CNI `GC` verb as SPEC v1.1 has it, invoked exactly as libcni v1.2.3's
//! `GCNetworkList` invokes a plugin (issue 9). Debian ships libcni 1.1.2, which has no
//! GC, so the test builds that invocation itself:
//!
//! - stdin: the plugin's object from the conflist as libcni parsed it, re-encoded the way
//!   `InjectConf` does (Go's `json.Marshal` of a map: compact, keys sorted at every
//!   level) with `name`, `cniVersion` and the valid list under both
//!   `cni.dev/valid-attachments` and `cni.dev/attachments` (libcni sets both since the
//!   spec's key was harmonised with libcni's; a nil list is `null`);
//! - env: `CNI_COMMAND=GC`, and `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_ARGS`, `CNI_IFNAME`
//!   all present and empty, `CNI_PATH` = the runtime's plugin path (libcni's `args("GC",
//!   &RuntimeConf{})`), before the inherited environment.
//!
//! Debian's bridge and host-local speak CNI up to 1.0.0, so the attachments are made with
//! a 1.0.0 conflist and the operator then raises it to 1.1.0 (the first version with GC);
//! the replay uses the ADD-time snapshot, so bridge is called in the version it was added
//! with. The hanging-DEL budget is also checked through the real `GCNetworkList` of
//! libcni v1.3 (the driver built by `common::driver13`). Needs root.
//!
//!     cargo test --features testing --test gc_verb
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;
use serde_json::{json, Value};

const PROBE: &str = "cl-probe";

/// Go's `json.Marshal` of a `map[string]interface{}` tree: object keys sorted.
fn go_marshal(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let b: BTreeMap<&String, Value> = m.iter().map(|(k, v)| (k, sorted(v))).collect();
                let mut out = serde_json::Map::new();
                for (k, v) in b {
                    out.insert(k.clone(), v);
                }
                Value::Object(out)
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string(&sorted(v)).unwrap()
}

/// The stdin libcni v1.2.3 hands the ledger's entry on GC for the conflist on disk.
fn gc_stdin(f: &Fixture, valid: Option<&[(&str, &str)]>) -> Vec<u8> {
    let list: Value = serde_json::from_slice(&f.conflist_bytes()).unwrap();
    let mut plugin = list["plugins"][0].clone();
    assert_eq!(plugin["type"], json!("cni-ledger"));
    plugin["name"] = list["name"].clone();
    plugin["cniVersion"] = list["cniVersion"].clone();
    let valid = match valid {
        Some(v) => Value::Array(
            v.iter()
                .map(|(c, i)| json!({"containerID": c, "ifname": i}))
                .collect(),
        ),
        None => Value::Null,
    };
    plugin["cni.dev/valid-attachments"] = valid.clone();
    plugin["cni.dev/attachments"] = valid;
    go_marshal(&plugin).into_bytes()
}

/// Execs the ledger as libcni's gcNetwork would, inside the test host namespace.
fn gc_verb(f: &Fixture, valid: Option<&[(&str, &str)]>) -> Output {
    let mut c = f.host.cmd(ledger_bin());
    c.env_clear()
        .env("CNI_COMMAND", "GC")
        .env("CNI_CONTAINERID", "")
        .env("CNI_NETNS", "")
        .env("CNI_ARGS", "")
        .env("CNI_IFNAME", "")
        .env("CNI_PATH", f.cni_path())
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    run_with_stdin(c, &gc_stdin(f, valid))
}

fn add(f: &Fixture, cid: &str, ns: &Netns) -> String {
    let res = f
        .add(cid, "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD {cid}: {e}\nlog:\n{}", f.log()));
    first_ip(&res)
}

fn snapshot_of(f: &Fixture, cid: &str) -> String {
    let v: Value = serde_json::from_slice(&fs::read(f.record_path(cid, "eth0")).unwrap()).unwrap();
    v["record"]["snapshot"].as_str().unwrap().to_string()
}

fn snapshot_file(f: &Fixture, hash: &str) -> PathBuf {
    f.snapshots_dir().join(format!("{hash}.json"))
}

fn no_debug_text(s: &str) {
    for bad in ["Some(", "None", "Os {", "[\""] {
        assert!(!s.contains(bad), "Rust debug text {bad:?} in {s}");
    }
}

/// A second network "other" sharing the ledger: an ADD and DEL through libcni leave its
/// snapshot unreferenced. Returns that snapshot's hash.
fn other_network_orphan_snapshot(f: &Fixture) -> String {
    let mut entry = f.ledger_entry(&ChainSpec::ledger_only());
    entry.as_object_mut().unwrap().remove("capabilities");
    let conf = json!({"cniVersion": "1.0.0", "name": "other", "plugins": [entry]});
    let bytes = serde_json::to_vec_pretty(&conf).unwrap();
    fs::write(f.conf_dir.join("20-other.conflist"), &bytes).unwrap();
    let ns = Netns::new();
    for verb in ["add", "del"] {
        let out = f
            .host
            .cmd(driver())
            .args([verb, "--conf-dir"])
            .arg(&f.conf_dir)
            .args([
                "--net", "other", "--cid", "o-1", "--ifname", "eth0", "--netns",
            ])
            .arg(ns.path())
            .arg("--cni-path")
            .arg(f.cni_path())
            .arg("--cache-dir")
            .arg(&f.cache_dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "other {verb}: {}", describe(&out));
    }
    let hash = sha256_hex(&f.conf_dir.join("20-other.conflist"));
    assert!(snapshot_file(f, &hash).exists(), "no snapshot for other");
    hash
}

#[test]
fn failing_replay_is_reported_to_the_runtime_then_retried_and_per_network() {
    require_root!();
    let spec = ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    };
    let mut f = Fixture::with_spec(spec);
    f.install_test_plugin(PROBE);
    let marker = f.tmp.path().join("fail-del");
    let log = f.tmp.path().join("probe.log");
    f.spec.extra = vec![json!({"type": PROBE, "logFile": log, "failDelMarker": marker})];
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));

    // c-gone's namespace vanishes; c-unlisted lives but the runtime no longer lists it;
    // both are added under snapshot S1. c-keep is listed and added under S2.
    let mut ns_gone = Netns::new();
    let ns_unlisted = Netns::new();
    let ip_gone = add(&f, "c-gone", &ns_gone);
    let ip_unlisted = add(&f, "c-unlisted", &ns_unlisted);
    let s1 = snapshot_of(&f, "c-gone");
    let mut v: Value = serde_json::from_slice(&f.conflist_bytes()).unwrap();
    v["x-revision"] = json!(2);
    f.write_conflist(&v);
    let ns_keep = Netns::new();
    let ip_keep = add(&f, "c-keep", &ns_keep);
    let s2 = snapshot_of(&f, "c-keep");
    assert_ne!(s1, s2);
    let s_other = other_network_orphan_snapshot(&f);
    ns_gone.delete();

    // The operator raises the conflist to 1.1.0 so the runtime sends GC.
    let mut v: Value = serde_json::from_slice(&f.conflist_bytes()).unwrap();
    v["cniVersion"] = json!("1.1.0");
    f.write_conflist(&v);
    fs::write(&marker, b"").unwrap();
    let valid = [("c-keep", "eth0")];

    // First GC, right after the ADDs (no gcGraceSecs: no grace): the last plugin fails.
    let out = gc_verb(&f, Some(&valid));
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    let err: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one CNI error ({e}): {}", describe(&out)));
    assert_eq!(err["cniVersion"], json!("1.1.0"), "{err}");
    assert_eq!(err["code"], json!(11), "{err}");
    let msg = err["msg"].as_str().unwrap();
    let details = err["details"].as_str().unwrap();
    assert!(msg.contains("could not clean 2 attachment(s)"), "{err}");
    for cid in ["c-gone", "c-unlisted"] {
        assert_eq!(
            details.matches(&format!("{cid}/eth0")).count(),
            1,
            "{cid} not named exactly once: {err}"
        );
        assert!(
            f.record_path(cid, "eth0").exists(),
            "{cid}'s record dropped"
        );
    }
    assert_eq!(
        details.matches("cl-probe refuses DEL").count(),
        2,
        "each failure once per attachment: {err}"
    );
    assert!(!details.contains("c-keep"), "{err}");
    no_debug_text(&String::from_utf8_lossy(&out.stdout));
    no_debug_text(&f.log());
    // bridge ran nonetheless: both addresses are free, c-keep's is not.
    let addrs = f.ipam_addresses();
    assert!(!addrs.contains(&ip_gone), "{addrs:?}");
    assert!(!addrs.contains(&ip_unlisted), "{addrs:?}");
    assert!(addrs.contains(&ip_keep), "{addrs:?}");
    assert!(f.record_path("c-keep", "eth0").exists());
    let row = f.list_row("c-gone", "eth0").unwrap();
    assert_eq!(row["attempts"], json!(1), "{row:#}");
    // Nothing removed yet, so nothing swept.
    for s in [&s1, &s2, &s_other] {
        assert!(snapshot_file(&f, s).exists());
    }

    // The fault clears; the next GC (immediately: the runtime asked, no backoff) cleans.
    fs::remove_file(&marker).unwrap();
    let out = gc_verb(&f, Some(&valid));
    assert!(
        out.status.success(),
        "{}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    assert!(
        out.stdout.is_empty(),
        "GC prints nothing on success: {}",
        describe(&out)
    );
    assert!(!f.record_path("c-gone", "eth0").exists());
    assert!(!f.record_path("c-unlisted", "eth0").exists());
    assert!(f.record_path("c-keep", "eth0").exists());
    assert!(f.ipam_addresses().contains(&ip_keep));
    assert!(ns_keep.path().exists());
    // Per network: our unreferenced S1 goes, our referenced S2 stays, and the other
    // network's unreferenced snapshot is not ours to sweep.
    assert!(!snapshot_file(&f, &s1).exists(), "S1 not swept");
    assert!(snapshot_file(&f, &s2).exists(), "S2 (c-keep's) swept");
    assert!(
        snapshot_file(&f, &s_other).exists(),
        "GC of {} swept network other's snapshot",
        f.network
    );

    // A GC with no valid attachment at all (Go's nil slice: null) collects c-keep too.
    let out = gc_verb(&f, None);
    assert!(out.status.success(), "{}", describe(&out));
    assert!(!f.record_path("c-keep", "eth0").exists());
    assert!(snapshot_file(&f, &s_other).exists());
}

#[test]
fn explicit_grace_is_honoured_and_no_error_for_it() {
    require_root!();
    let mut f = Fixture::with_spec(ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    let ns = Netns::new();
    let ip = add(&f, "c-young", &ns);
    let mut v: Value = serde_json::from_slice(&f.conflist_bytes()).unwrap();
    v["cniVersion"] = json!("1.1.0");
    v["plugins"][0]["gcGraceSecs"] = json!(600);
    f.write_conflist(&v);
    let out = gc_verb(&f, Some(&[]));
    assert!(out.status.success(), "{}", describe(&out));
    assert!(f.record_path("c-young", "eth0").exists());
    assert!(f.ipam_addresses().contains(&ip));
}

/// DEL that cannot reach its ledger succeeds (the other plugins already tore down), and
/// the log says so; an ADD that cannot names each thing once, with no debug text.
#[test]
fn unreachable_ledger_del_succeeds_and_says_so() {
    require_root!();
    let f = Fixture::ledger_only();
    let blocker = f.tmp.path().join("a-file");
    fs::write(&blocker, b"").unwrap();
    let mut stdin = f.plugin_stdin("1.0.0");
    stdin["ledgerDir"] = json!(blocker.join("ledger"));
    let stdin = serde_json::to_vec(&stdin).unwrap();

    let del = run_plugin(&f.plugin_env("DEL", "c-1", "eth0", None), &stdin);
    assert!(del.status.success(), "{}", describe(&del));
    assert!(del.stdout.is_empty(), "{}", describe(&del));
    assert!(
        f.log().contains("cannot reach the ledger"),
        "the log does not say so:\n{}",
        f.log()
    );

    let ns = Netns::new();
    let add = run_plugin(
        &f.plugin_env("ADD", "c-1", "eth0", Some(&ns.path_str())),
        &stdin,
    );
    assert_eq!(cni_error_code(&add), 5, "{}", describe(&add));
    let err: Value = serde_json::from_slice(&add.stdout).unwrap();
    let msg = err["msg"].as_str().unwrap();
    let details = err["details"].as_str().unwrap_or("");
    assert!(!details.contains(msg), "details repeat the message: {err}");
    no_debug_text(&String::from_utf8_lossy(&add.stdout));

    // A DEL for a ledger never created is no error either, and is logged.
    let mut stdin: Value = f.plugin_stdin("1.0.0");
    stdin["ledgerDir"] = json!(f.tmp.path().join("never"));
    let del = run_plugin(
        &f.plugin_env("DEL", "c-2", "eth0", None),
        &serde_json::to_vec(&stdin).unwrap(),
    );
    assert!(del.status.success(), "{}", describe(&del));
    assert!(f.log().contains("no ledger at"), "{}", f.log());
}

/// A plugin whose DEL hangs (its daemon not up yet after a reboot) must not hold the
/// runtime's GC call past the verb's budget: CRI-O gives the whole call 30 s. The verb
/// answers within `gcBudgetSecs` (plus the time to kill and write), kills the hanging
/// DELs, starts no replay after it, keeps every record it did not clean and names each;
/// a later `cni-ledger gc` with a longer timeout replays them all.
#[test]
fn hanging_del_is_cut_at_the_budget_and_records_are_kept_for_gc() {
    require_root!();
    const BUDGET_SECS: u64 = 2;
    // Far past the budget, yet short enough for the later gc to wait it out.
    const HANG_SECS: u64 = 8;
    // Killing the plugins and writing the records; well under HANG_SECS.
    const MARGIN: std::time::Duration = std::time::Duration::from_secs(3);
    let mut f = Fixture::with_spec(ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    f.install_test_plugin(PROBE);
    let pids = f.tmp.path().join("probe.pids");
    f.spec.extra = vec![json!({"type": PROBE, "hangDelSecs": HANG_SECS, "pidFile": pids})];
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));

    // One stale attachment more than gc's default parallel jobs, so one is still
    // waiting when the budget runs out.
    let jobs = cni_ledger::gc::DEFAULT_JOBS;
    let n = jobs + 1;
    let cids: Vec<String> = (1..=n).map(|i| format!("c-hang-{i}")).collect();
    let mut nss: Vec<Netns> = cids.iter().map(|_| Netns::new()).collect();
    let ips: Vec<String> = cids
        .iter()
        .zip(&nss)
        .map(|(c, ns)| add(&f, c, ns))
        .collect();

    let mut v: Value = serde_json::from_slice(&f.conflist_bytes()).unwrap();
    v["cniVersion"] = json!("1.1.0");
    v["plugins"][0]["gcBudgetSecs"] = json!(BUDGET_SECS);
    f.write_conflist(&v);

    let started = std::time::Instant::now();
    let out = gc_verb(&f, Some(&[]));
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(BUDGET_SECS) + MARGIN,
        "GC answered after {took:?}, budget {BUDGET_SECS}s\n{}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one CNI error ({e}): {}", describe(&out)));
    assert_eq!(err["code"], json!(11), "{err}");
    let msg = err["msg"].as_str().unwrap();
    let details = err["details"].as_str().unwrap();
    assert!(
        msg.contains(&format!(
            "could not clean {n} attachment(s) within its 2s budget (gcBudgetSecs)"
        )),
        "{err}"
    );
    for (cid, ip) in cids.iter().zip(&ips) {
        assert_eq!(
            details.matches(&format!("{cid}/eth0:")).count(),
            1,
            "{cid} not named exactly once: {err}"
        );
        assert!(
            f.record_path(cid, "eth0").exists(),
            "{cid}'s record dropped"
        );
        assert!(f.ipam_addresses().contains(ip), "{cid}'s address released");
    }
    // Twice for each replay the budget cut: the hanging DEL killed, the next plugin's
    // not started.
    assert_eq!(
        details.matches("time budget ran out").count(),
        2 * jobs,
        "{err}"
    );
    assert_eq!(details.matches("not attempted").count(), 1, "{err}");
    no_debug_text(&String::from_utf8_lossy(&out.stdout));
    // The hanging DELs were killed, with what they started.
    // cl-probe writes its own PID and its sleeper's.
    assert_all_gone(&pids, 2 * jobs, "outlived the budget");

    // The sandboxes vanish; a gc that may wait out the hang (and the backoff, --now)
    // replays every one.
    for ns in &mut nss {
        ns.delete();
    }
    let (out, report) = f.gc(&[
        "--now",
        "--grace",
        "0",
        "--timeout",
        "30",
        "--jobs",
        &n.to_string(),
        "--network",
        &f.network,
    ]);
    assert!(
        out.status.success(),
        "{}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    assert_eq!(report.unwrap()["summary"]["replayed"], json!(n));
    let addrs = f.ipam_addresses();
    for (cid, ip) in cids.iter().zip(&ips) {
        assert!(!f.record_path(cid, "eth0").exists(), "{cid}'s record kept");
        assert!(
            !addrs.contains(ip),
            "{cid}'s address {ip} still held: {addrs:?}"
        );
    }
}

/// A chained plugin whose DEL hangs while the file named by its `hangWhile` key exists
/// (its daemon not up yet), appending its PID to `pidFile` when it starts hanging; every
/// other call, and DEL once the file is gone, is cl-probe's.
const HANG_DEL: &str = r#"#!/bin/bash
stdin=$(cat)
opt() {
	local re="\"$1\"[[:space:]]*:[[:space:]]*\"([^\"]*)\""
	[[ $stdin =~ $re ]] && printf '%s' "${BASH_REMATCH[1]}"
}
marker=$(opt hangWhile)
if [[ ${CNI_COMMAND:-} == DEL && -n $marker && -e $marker ]]; then
	echo "$$" >>"$(opt pidFile)"
	while [[ -e $marker ]]; do sleep 0.2; done
fi
printf '%s' "$stdin" | exec "$(dirname "$0")/cl-probe"
"#;

/// The same budget through the real libcni v1.3 `GCNetworkList`, the call CRI-O and
/// containerd make: the runtime gets its answer within `gcBudgetSecs`, the records the
/// ledger could not clean stay, and a later `cni-ledger gc` replays them once the plugin
/// answers again.
///
/// `GCNetworkList` first runs `DelNetworkList` itself for every stale attachment in
/// libcni's cache, under nothing but the caller's context; with this chain that DEL
/// would hang before the ledger is even asked, and no budget of the ledger could
/// shorten it. What only the ledger can clean are attachments libcni no longer knows:
/// libcni writes its cache without fsync, a power cut leaves the files empty, and
/// `GetCachedAttachments` skips a file it cannot parse. So the stale attachments' cache
/// files are emptied here as a power cut would, which makes the ledger's GC verb the
/// only part that meets the hanging plugin, and the part timed.
#[test]
fn hanging_del_through_libcni13_gc_is_answered_within_the_budget() {
    require_root!();
    const BUDGET_SECS: u64 = 2;
    // Killing the plugins and writing the records.
    const MARGIN: std::time::Duration = std::time::Duration::from_secs(3);
    let mut f = Fixture::with_spec(ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    f.driver = driver13();
    f.install_test_plugin(PROBE);
    let hang_del = f.bin_dir.join("hang-del");
    fs::write(&hang_del, HANG_DEL).unwrap();
    set_mode(&hang_del, 0o755);
    let hanging = f.tmp.path().join("daemon-down");
    let pids = f.tmp.path().join("hang.pids");
    f.spec.extra = vec![json!({"type": "hang-del", "hangWhile": hanging, "pidFile": pids})];
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));

    let stale: Vec<String> = (1..=3).map(|i| format!("c-stale-{i}")).collect();
    let mut nss: Vec<Netns> = stale.iter().map(|_| Netns::new()).collect();
    let ips: Vec<String> = stale
        .iter()
        .zip(&nss)
        .map(|(c, ns)| add(&f, c, ns))
        .collect();
    let ns_live = Netns::new();
    let ip_live = add(&f, "c-live", &ns_live);
    for (cid, ns) in stale.iter().zip(&mut nss) {
        ns.delete();
        let cache = f.cache_result_path(cid, "eth0");
        assert!(cache.exists(), "no libcni cache file for {cid}");
        fs::write(&cache, b"").unwrap();
    }

    let mut v: Value = serde_json::from_slice(&f.conflist_bytes()).unwrap();
    v["cniVersion"] = json!("1.1.0");
    v["plugins"][0]["gcBudgetSecs"] = json!(BUDGET_SECS);
    f.write_conflist(&v);
    fs::write(&hanging, b"").unwrap();

    // CRI-O's deadline for the whole call, so a ledger past it is killed, not waited on.
    let mut gc = f.host.cmd(&f.driver);
    gc.arg("gc")
        .arg("--conf-dir")
        .arg(&f.conf_dir)
        .args([
            "--net",
            &f.network,
            "--valid",
            "c-live/eth0",
            "--timeout",
            "30",
        ])
        .arg("--cni-path")
        .arg(f.cni_path())
        .arg("--cache-dir")
        .arg(&f.cache_dir);
    let started = std::time::Instant::now();
    let out = gc.output().unwrap();
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(BUDGET_SECS) + MARGIN,
        "GC through libcni answered after {took:?}, budget {BUDGET_SECS}s\n{}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    // libcni joins every plugin's GC error (Debian's bridge, which predates GC, adds
    // its own); the ledger's says what it left and why.
    assert!(!out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "failed to GC plugin cni-ledger: GC of network {} could not clean 3 attachment(s) \
             within its 2s budget (gcBudgetSecs)",
            f.network
        )),
        "{}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    for (cid, ip) in stale.iter().zip(&ips) {
        assert_eq!(err.matches(&format!("{cid}/eth0:")).count(), 1, "{err}");
        assert!(
            f.record_path(cid, "eth0").exists(),
            "{cid}'s record dropped"
        );
        assert!(f.ipam_addresses().contains(ip), "{cid}'s address released");
    }
    assert!(!err.contains("c-live"), "{err}");
    // The hanging DELs did not outlive the verb.
    assert_all_gone(&pids, 3, "outlived the GC verb");

    // The plugin's daemon is up: gc replays each kept record once, and leaves nothing
    // of them in libcni's cache; the live attachment is untouched.
    fs::remove_file(&hanging).unwrap();
    let (out, report) = f.gc(&["--now", "--grace", "0", "--network", &f.network]);
    assert!(
        out.status.success(),
        "{}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    assert_eq!(report.unwrap()["summary"]["replayed"], json!(3));
    let addrs = f.ipam_addresses();
    for (cid, ip) in stale.iter().zip(&ips) {
        assert!(!f.record_path(cid, "eth0").exists(), "{cid}'s record kept");
        assert!(!f.cache_result_path(cid, "eth0").exists(), "{cid}'s cache");
        assert!(!addrs.contains(ip), "{cid}'s address {ip} held: {addrs:?}");
    }
    assert!(f.record_path("c-live", "eth0").exists());
    assert!(addrs.contains(&ip_live), "{addrs:?}");
    assert!(ns_live.path().exists());
}

/// The `count` processes whose PIDs the hanging plugin wrote to `pids` have all exited
/// (within 2 s each: killed with their process group).
fn assert_all_gone(pids: &Path, count: usize, what: &str) {
    let text = fs::read_to_string(pids).unwrap();
    let started: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(started.len(), count, "{started:?}");
    for pid in started {
        let pid: u32 = pid.parse().unwrap();
        assert!(process_gone(pid, 2), "hanging DEL {pid} {what}");
    }
}
