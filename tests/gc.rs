//! Acceptance tests of `cni-ledger gc` and the CNI GC verb (docs/DESIGN.md §5–§8, issue 3):
//! attachments are made through libcni (tests/driver) with Debian's bridge, host-local and
//! portmap inside a per-test host namespace, sandboxes vanish without DEL, and gc must
//! clean up what the plugins left behind — and nothing that is still alive. Needs root.
//!
//!     cargo test --features testing --test gc

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

// -----------------------------------------------------------------------------------------
// helpers
// -----------------------------------------------------------------------------------------

const PROBE: &str = "cl-probe";
const PROBE_FAIL_MSG: &str = "cl-probe refuses DEL";

fn probe_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/plugins/cl-probe")
}

/// Copies testdata/plugins/cl-probe into `dir` as `name` (mode 0755).
fn install_probe_as(dir: &Path, name: &str) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let to = dir.join(name);
    fs::copy(probe_source(), &to).unwrap_or_else(|e| panic!("copy cl-probe: {e}"));
    set_mode(&to, 0o755);
    to
}

/// A fixture whose chain is `[cni-ledger, bridge+host-local, (portmap), extra...]`, with
/// cl-probe installed in its CNI bin dir. `extra` may use `{tmp}` in string values.
fn fixture_with(portmap: bool, extra: Vec<Value>) -> Fixture {
    let spec = ChainSpec {
        portmap,
        ..ChainSpec::full()
    };
    let mut f = Fixture::with_spec(spec);
    install_probe_as(&f.bin_dir, PROBE);
    let tmp = f.tmp.path().display().to_string();
    let extra: Vec<Value> = extra
        .into_iter()
        .map(|v| serde_json::from_str(&v.to_string().replace("{tmp}", &tmp)).unwrap())
        .collect();
    f.spec.extra = extra;
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
    f
}

fn probe_log_path(f: &Fixture) -> PathBuf {
    f.tmp.path().join("probe.log")
}

fn probe_log(f: &Fixture) -> String {
    fs::read_to_string(probe_log_path(f)).unwrap_or_default()
}

/// Lines of the probe log for `verb` and container `cid`.
fn probe_calls(f: &Fixture, verb: &str, cid: &str) -> Vec<String> {
    let prefix = format!("{verb} cid={cid} ");
    probe_log(f)
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// The address (no prefix length) of the first IP of a CNI result.
fn first_ip(res: &Value) -> String {
    res["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no ips in result: {res}"))
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

fn ipam_file(f: &Fixture, ip: &str) -> PathBuf {
    f.ipam_net_dir().join(ip)
}

fn add_ok(f: &Fixture, cid: &str, ns: &Netns, cap: Option<&Value>) -> String {
    let res = f
        .add(cid, "eth0", Some(&ns.path_str()), cap)
        .unwrap_or_else(|e| panic!("ADD {cid} through libcni: {e}\nledger log:\n{}", f.log()));
    let ip = first_ip(&res);
    assert!(
        ipam_file(f, &ip).exists(),
        "host-local reserved no file for {ip} ({cid})"
    );
    assert!(f.record_path(cid, "eth0").exists(), "no record for {cid}");
    ip
}

fn exit_code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

/// `gc --json ...`; returns (exit code, report). Panics if no JSON report was printed.
fn gc_json(f: &Fixture, args: &[&str]) -> (i32, Value, Output) {
    let (out, v) = f.gc(args);
    let v = v.unwrap_or_else(|| panic!("gc {args:?} printed no JSON report: {}", describe(&out)));
    (exit_code(&out), v, out)
}

fn report_rec<'a>(rep: &'a Value, cid: &str) -> &'a Value {
    rep["records"]
        .as_array()
        .unwrap_or_else(|| panic!("report without records: {rep:#}"))
        .iter()
        .find(|r| r["containerId"] == json!(cid))
        .unwrap_or_else(|| panic!("no report entry for {cid}: {rep:#}"))
}

fn report_cids(rep: &Value) -> Vec<String> {
    let mut v: Vec<String> = rep["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["containerId"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

fn plugin_outcome<'a>(rec: &'a Value, plugin_type: &str) -> &'a Value {
    rec["plugins"]
        .as_array()
        .unwrap_or_else(|| panic!("no plugins in {rec:#}"))
        .iter()
        .find(|p| p["type"] == json!(plugin_type))
        .unwrap_or_else(|| panic!("no outcome for plugin {plugin_type}: {rec:#}"))
}

/// `ip -o addr show dev <ifname>` inside a namespace; None when the link is absent.
fn link_in(ns: &Netns, ifname: &str) -> Option<String> {
    let out = ns
        .exec("ip")
        .args(["-d", "-o", "addr", "show", "dev", ifname])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        .filter(|s| !s.trim().is_empty())
}

fn link_details(ns: &Netns, ifname: &str) -> Option<String> {
    let out = ns
        .exec("ip")
        .args(["-d", "link", "show", "dev", ifname])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn record_json(f: &Fixture, cid: &str) -> Value {
    let bytes = fs::read(f.record_path(cid, "eth0")).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// Every entry below `dir` with its kind, mode, owner, size, mtime (ns) and content (files)
/// or target (symlinks): two equal states mean nothing below `dir` changed.
fn tree_state(dir: &Path) -> BTreeMap<String, String> {
    fn rec(base: &Path, d: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            let common = format!(
                "mode={:o} uid={} size={} mtime={}.{:09} ino={}",
                m.mode(),
                m.uid(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                m.ino()
            );
            if m.file_type().is_symlink() {
                out.insert(
                    rel,
                    format!("link {common} -> {:?}", fs::read_link(&p).unwrap()),
                );
            } else if m.is_dir() {
                out.insert(rel.clone(), format!("dir {common}"));
                rec(base, &p, out);
            } else {
                let content = fs::read(&p).unwrap_or_default();
                out.insert(
                    rel,
                    format!("file {common} {}", String::from_utf8_lossy(&content)),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(m) = fs::metadata(dir) {
        out.insert(
            ".".into(),
            format!(
                "dir mode={:o} mtime={}.{:09}",
                m.mode(),
                m.mtime(),
                m.mtime_nsec()
            ),
        );
    }
    rec(dir, dir, &mut out);
    out
}

fn assert_same_state(
    label: &str,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) {
    if before == after {
        return;
    }
    let mut diff = String::new();
    for (k, v) in before {
        match after.get(k) {
            None => diff.push_str(&format!("  removed {k}: {v}\n")),
            Some(w) if w != v => diff.push_str(&format!("  changed {k}:\n    {v}\n    {w}\n")),
            _ => {}
        }
    }
    for (k, v) in after {
        if !before.contains_key(k) {
            diff.push_str(&format!("  added {k}: {v}\n"));
        }
    }
    panic!("{label} changed:\n{diff}");
}

/// Runs the ledger binary as a CNI plugin inside the test host namespace (the GC verb
/// replays DEL, and portmap/bridge act on the current namespace).
fn plugin_in_host(f: &Fixture, env: &[(String, String)], stdin: &[u8]) -> Output {
    let mut c = f.host.cmd(ledger_bin());
    c.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    run_with_stdin(c, stdin)
}

// -----------------------------------------------------------------------------------------
// 1. the seed's story
// -----------------------------------------------------------------------------------------

#[test]
fn seed_story_vanished_namespace_is_cleaned_from_the_snapshot() {
    require_root!();
    let f = Fixture::new(); // [cni-ledger, bridge+host-local, portmap]
    let mut ns = Netns::new();
    let cid = "c-seed";
    let ip = add_ok(&f, cid, &ns, Some(&port_mappings(8080)));

    let nat = f.host.iptables_save();
    assert!(
        nat.contains(":CNI-DN-"),
        "portmap created no DNAT chain:\n{nat}"
    );
    let mine = f.host.nat_lines_for(cid);
    assert!(
        mine.iter().any(|l| l.contains("CNI-DN-")) && nat.contains("--dport 8080"),
        "no DNAT rule for {cid} / port 8080:\n{nat}"
    );
    assert!(
        f.cache_result_path(cid, "eth0").exists(),
        "libcni cached nothing"
    );

    // The reboot: the namespace goes away, nobody calls DEL.
    ns.delete();
    assert!(ipam_file(&f, &ip).exists(), "leak precondition");
    assert!(!f.host.nat_lines_for(cid).is_empty(), "leak precondition");

    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(code, 0, "gc: {}\nlog:\n{}", describe(&out), f.log());
    let r = report_rec(&rep, cid);
    assert_eq!(r["action"], json!("replayed"), "{r:#}");
    assert_eq!(r["reason"], json!("netns-missing"), "{r:#}");
    assert_eq!(r["configSource"], json!("snapshot"), "{r:#}");
    let types: Vec<&str> = r["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["portmap", "bridge"],
        "reverse order, ledger skipped: {r:#}"
    );
    assert!(
        r["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["ok"] == json!(true)),
        "{r:#}"
    );
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep:#}");
    assert_eq!(rep["dryRun"], json!(false));

    // The real effects.
    assert!(
        !ipam_file(&f, &ip).exists(),
        "host-local address file {ip} survived gc: {:?}",
        f.ipam_addresses()
    );
    let nat = f.host.iptables_save();
    assert!(
        f.host.nat_lines_for(cid).is_empty() && !nat.contains("CNI-DN-"),
        "portmap DNAT rule/chain for {cid} survived gc:\n{nat}"
    );
    assert!(!f.record_path(cid, "eth0").exists(), "record survived");
    assert!(f.record_files().is_empty(), "{:?}", f.record_files());
    assert!(
        !f.cache_result_path(cid, "eth0").exists(),
        "libcni cache file survived"
    );
    assert!(f.list_json().is_empty());

    // A second run finds nothing to do.
    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(code, 0, "{}", describe(&out));
    assert_eq!(rep["summary"]["stale"], json!(0), "{rep:#}");
}

// -----------------------------------------------------------------------------------------
// 2. live, vanished and recreated namespaces side by side
// -----------------------------------------------------------------------------------------

#[test]
fn only_vanished_namespaces_are_replayed_and_a_recreated_one_is_never_entered() {
    require_root!();
    let f = fixture_with(
        true,
        vec![
            json!({"type": PROBE, "logFile": "{tmp}/probe.log", "signalsFile": "{tmp}/signals.log"}),
        ],
    );
    let live = Netns::new();
    let mut gone = Netns::new();
    let mut reborn = Netns::new();
    let ip_live = add_ok(&f, "c-live", &live, None);
    let ip_gone = add_ok(&f, "c-gone", &gone, None);
    let ip_reborn = add_ok(&f, "c-reborn", &reborn, None);

    gone.delete();
    reborn.replace();
    // Something in the new namespace that a misdirected DEL would destroy.
    let out = reborn
        .exec("ip")
        .args([
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0-peer",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    assert!(link_details(&reborn, "eth0").unwrap().contains("eth0-peer"));

    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(code, 0, "gc: {}\nlog:\n{}", describe(&out), f.log());
    assert_eq!(report_cids(&rep), ["c-gone", "c-reborn"], "{rep:#}");
    assert_eq!(report_rec(&rep, "c-gone")["reason"], json!("netns-missing"));
    assert_eq!(
        report_rec(&rep, "c-reborn")["reason"],
        json!("netns-replaced")
    );
    for cid in ["c-gone", "c-reborn"] {
        assert_eq!(
            report_rec(&rep, cid)["action"],
            json!("replayed"),
            "{rep:#}"
        );
    }
    assert_eq!(rep["summary"]["live"], json!(1), "{rep:#}");
    assert_eq!(rep["summary"]["replayed"], json!(2), "{rep:#}");

    // Never pointed at a namespace that is not the recorded one, nor at the live pod.
    let gone_del = probe_calls(&f, "DEL", "c-gone");
    let reborn_del = probe_calls(&f, "DEL", "c-reborn");
    assert_eq!(gone_del.len(), 1, "probe log:\n{}", probe_log(&f));
    assert_eq!(reborn_del.len(), 1, "probe log:\n{}", probe_log(&f));
    assert!(gone_del[0].ends_with("netns="), "{gone_del:?}");
    assert!(
        reborn_del[0].ends_with("netns="),
        "the recreated namespace was handed to DEL: {reborn_del:?}"
    );
    assert!(
        probe_calls(&f, "DEL", "c-live").is_empty(),
        "{}",
        probe_log(&f)
    );
    // gc blocks nothing and ignores SIGPIPE itself (src/process.rs); the plugins it runs
    // start with SIGPIPE at its default, as they do under a runtime.
    let signals = fs::read_to_string(f.tmp.path().join("signals.log")).unwrap();
    for cid in ["c-gone", "c-reborn"] {
        let line = format!("DEL cid={cid} sigpipe=default");
        assert!(signals.lines().any(|l| l == line), "{signals}");
    }

    // The recreated namespace still has its own eth0.
    let d = link_details(&reborn, "eth0").expect("eth0 of the recreated namespace is gone");
    assert!(
        d.contains("eth0-peer"),
        "not the eth0 made after the recreation: {d}"
    );

    // The live pod keeps its address and its interface.
    assert!(
        ipam_file(&f, &ip_live).exists(),
        "live pod lost its address"
    );
    let a = link_in(&live, "eth0").expect("live pod lost eth0");
    assert!(a.contains(&ip_live), "live eth0 lost {ip_live}: {a}");
    assert!(f.record_path("c-live", "eth0").exists());

    // The two vanished ones released theirs.
    assert!(!ipam_file(&f, &ip_gone).exists());
    assert!(!ipam_file(&f, &ip_reborn).exists());
    assert!(!f.record_path("c-gone", "eth0").exists());
    assert!(!f.record_path("c-reborn", "eth0").exists());
    let rows = f.list_json();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["containerId"], json!("c-live"));
    assert_eq!(rows[0]["state"], json!("live"));
}

// -----------------------------------------------------------------------------------------
// 3. a plugin that fails DEL
// -----------------------------------------------------------------------------------------

#[test]
fn failing_plugin_keeps_the_record_with_backoff_but_others_still_release() {
    require_root!();
    let f = fixture_with(
        true,
        vec![
            json!({"type": PROBE, "logFile": "{tmp}/probe.log", "failDelMarker": "{tmp}/fail-del"}),
        ],
    );
    let marker = f.tmp.path().join("fail-del");
    let mut ns = Netns::new();
    let cid = "c-fail";
    let ip = add_ok(&f, cid, &ns, Some(&port_mappings(8080)));
    fs::write(&marker, b"").unwrap();
    ns.delete();

    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(
        code,
        1,
        "gc with a failing plugin must exit 1: {}",
        describe(&out)
    );
    let r = report_rec(&rep, cid);
    assert_eq!(r["action"], json!("retrying"), "{r:#}");
    assert_eq!(r["attempts"], json!(1), "{r:#}");
    assert!(
        r["lastError"]
            .as_str()
            .unwrap_or("")
            .contains(PROBE_FAIL_MSG),
        "lastError lacks the plugin's message: {r:#}"
    );
    assert!(r["nextAttemptAt"].is_string(), "{r:#}");
    assert_eq!(plugin_outcome(r, PROBE)["ok"], json!(false), "{r:#}");
    assert_eq!(plugin_outcome(r, PROBE)["exitStatus"], json!(1), "{r:#}");
    assert_eq!(plugin_outcome(r, "bridge")["ok"], json!(true), "{r:#}");
    assert_eq!(plugin_outcome(r, "portmap")["ok"], json!(true), "{r:#}");
    assert_eq!(rep["summary"]["retrying"], json!(1), "{rep:#}");

    // The others ran nonetheless: the address and the DNAT rule are gone.
    assert!(
        !ipam_file(&f, &ip).exists(),
        "bridge's IPAM address not released although only cl-probe failed"
    );
    assert!(
        f.host.nat_lines_for(cid).is_empty(),
        "{}",
        f.host.iptables_save()
    );
    // The record stays, with its attempt.
    assert!(
        f.record_path(cid, "eth0").exists(),
        "record dropped after a failed DEL"
    );
    let gc_state = &record_json(&f, cid)["record"]["gc"];
    assert_eq!(gc_state["attempts"], json!(1), "{gc_state:#}");
    let row = f.list_row(cid, "eth0").expect("list row");
    assert_eq!(row["attempts"], json!(1), "{row:#}");
    assert!(
        row["lastError"]
            .as_str()
            .unwrap_or("")
            .contains(PROBE_FAIL_MSG),
        "{row:#}"
    );
    assert!(row["nextAttemptAt"].is_string(), "{row:#}");
    assert_eq!(row["state"], json!("stale"), "{row:#}");
    assert_eq!(row["failed"], json!(false), "{row:#}");
    assert_eq!(probe_calls(&f, "DEL", cid).len(), 1);

    // Plain gc again: still in backoff, nothing run.
    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(code, 1, "{}", describe(&out));
    let r = report_rec(&rep, cid);
    assert_eq!(r["action"], json!("skip-backoff"), "{r:#}");
    assert_eq!(r["attempts"], json!(1), "{r:#}");
    assert_eq!(
        probe_calls(&f, "DEL", cid).len(),
        1,
        "ran a plugin in backoff"
    );

    // The plugin recovers; --now ignores the backoff.
    fs::remove_file(&marker).unwrap();
    let (code, rep, out) = gc_json(&f, &["--grace", "0", "--now"]);
    assert_eq!(code, 0, "{}\nlog:\n{}", describe(&out), f.log());
    assert_eq!(
        report_rec(&rep, cid)["action"],
        json!("replayed"),
        "{rep:#}"
    );
    assert_eq!(probe_calls(&f, "DEL", cid).len(), 2);
    assert!(
        !f.record_path(cid, "eth0").exists(),
        "record survived a clean replay"
    );
    assert!(!f.cache_result_path(cid, "eth0").exists());
    assert!(f.list_json().is_empty());
}

// -----------------------------------------------------------------------------------------
// 4. --dry-run
// -----------------------------------------------------------------------------------------

#[test]
fn dry_run_changes_no_file_and_runs_no_plugin() {
    require_root!();
    let f = fixture_with(
        true,
        vec![json!({"type": PROBE, "logFile": "{tmp}/probe.log"})],
    );
    let mut ns = Netns::new();
    let cid = "c-dry";
    let ip = add_ok(&f, cid, &ns, Some(&port_mappings(8080)));
    ns.delete();
    // A damaged record too: a dry run must not quarantine it either.
    fs::write(
        f.records_dir().join("cltest:c-junk:eth0.json"),
        b"{not json",
    )
    .unwrap();
    set_mode(&f.records_dir().join("cltest:c-junk:eth0.json"), 0o600);

    let snap = |f: &Fixture| {
        (
            tree_state(&f.ledger_dir),
            tree_state(&f.cache_dir),
            tree_state(&f.ipam_dir),
            probe_log(f),
            f.host.iptables_save(),
        )
    };
    let before = snap(&f);
    assert_eq!(probe_calls(&f, "ADD", cid).len(), 1);

    let (code, rep, out) = gc_json(&f, &["--grace", "0", "--dry-run"]);
    assert_eq!(
        code,
        1,
        "a dry run with work left exits 1: {}",
        describe(&out)
    );
    assert_eq!(rep["dryRun"], json!(true), "{rep:#}");
    let r = report_rec(&rep, cid);
    assert_eq!(r["action"], json!("would-replay"), "{r:#}");
    assert_eq!(r["reason"], json!("netns-missing"), "{r:#}");
    assert!(
        r["plugins"].as_array().is_none_or(|p| p.is_empty()),
        "a dry run reported plugin runs: {r:#}"
    );
    assert_eq!(rep["damaged"].as_array().map(Vec::len), Some(1), "{rep:#}");
    assert!(rep["damaged"][0]["quarantinedTo"].is_null(), "{rep:#}");

    // The human form as well.
    let human = f.ledger(&[
        "gc",
        "--dry-run",
        "--grace",
        "0",
        "--cni-cache-dir",
        f.cache_dir.to_str().unwrap(),
    ]);
    assert_eq!(exit_code(&human), 1, "{}", describe(&human));
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains(cid) && text.contains("would-replay"),
        "{text}"
    );

    let after = snap(&f);
    assert_same_state("ledger dir", &before.0, &after.0);
    assert_same_state("libcni cache dir", &before.1, &after.1);
    assert_same_state("host-local dataDir", &before.2, &after.2);
    assert_eq!(before.3, after.3, "a dry run invoked a plugin");
    assert_eq!(before.4, after.4, "a dry run changed iptables");
    assert!(ipam_file(&f, &ip).exists());

    // Not vacuous: the real run replays it.
    let (_, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(
        report_rec(&rep, cid)["action"],
        json!("replayed"),
        "{}",
        describe(&out)
    );
    assert!(!ipam_file(&f, &ip).exists());
    assert_eq!(probe_calls(&f, "DEL", cid).len(), 1);
}

// -----------------------------------------------------------------------------------------
// 5. valid-attachment lists: --valid-attachments and the CNI GC verb
// -----------------------------------------------------------------------------------------

/// Three live attachments a, b, c in their own namespaces; returns (fixture, ns, ips).
fn three_live() -> (Fixture, Vec<Netns>, Vec<String>) {
    let f = fixture_with(
        true,
        vec![json!({"type": PROBE, "logFile": "{tmp}/probe.log"})],
    );
    let mut nss = Vec::new();
    let mut ips = Vec::new();
    for cid in ["c-a", "c-b", "c-c"] {
        let ns = Netns::new();
        ips.push(add_ok(&f, cid, &ns, Some(&port_mappings_for(cid))));
        nss.push(ns);
    }
    (f, nss, ips)
}

/// A distinct host port per container (portmap refuses nothing, but keep them apart).
fn port_mappings_for(cid: &str) -> Value {
    let port = 8080 + u16::from(cid.bytes().last().unwrap() - b'a');
    port_mappings(port)
}

fn valid_ab() -> Value {
    json!([{"containerID": "c-a", "ifname": "eth0"}, {"containerID": "c-b", "ifname": "eth0"}])
}

/// a and b untouched, c cleaned (address, DNAT, record, its eth0 via the recorded netns).
fn assert_only_c_cleaned(f: &Fixture, nss: &[Netns], ips: &[String]) {
    for (i, cid) in ["c-a", "c-b"].iter().enumerate() {
        assert!(ipam_file(f, &ips[i]).exists(), "{cid} lost its address");
        assert!(f.record_path(cid, "eth0").exists(), "{cid} lost its record");
        assert!(link_in(&nss[i], "eth0").is_some(), "{cid} lost its eth0");
        assert!(!f.host.nat_lines_for(cid).is_empty(), "{cid} lost its DNAT");
        assert!(probe_calls(f, "DEL", cid).is_empty(), "{cid} got a DEL");
    }
    assert!(!ipam_file(f, &ips[2]).exists(), "c-c kept its address");
    assert!(
        !f.record_path("c-c", "eth0").exists(),
        "c-c kept its record"
    );
    assert!(
        f.host.nat_lines_for("c-c").is_empty(),
        "{}",
        f.host.iptables_save()
    );
    let dels = probe_calls(f, "DEL", "c-c");
    assert_eq!(dels.len(), 1, "{}", probe_log(f));
    // Still the recorded namespace: DEL is handed it and bridge removes the veth.
    assert!(
        dels[0].ends_with(&format!("netns={}", nss[2].path_str())),
        "{dels:?}"
    );
    assert!(
        link_in(&nss[2], "eth0").is_none(),
        "c-c's eth0 was not removed"
    );
}

#[test]
fn valid_attachments_file_replays_exactly_the_unlisted_one() {
    require_root!();
    let (f, nss, ips) = three_live();
    let file = f.tmp.path().join("valid.json");
    fs::write(&file, valid_ab().to_string()).unwrap();

    // Without the list all three are live.
    let (code, rep, _) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(code, 0);
    assert_eq!(rep["summary"]["live"], json!(3), "{rep:#}");

    // A list names no network: without --network it would make every other network's
    // records stale too, so it is refused before anything is judged.
    let before = tree_state(&f.ledger_dir);
    let (out, _) = f.gc(&[
        "--grace",
        "0",
        "--valid-attachments",
        file.to_str().unwrap(),
    ]);
    assert_eq!(exit_code(&out), 2, "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--network"),
        "{}",
        describe(&out)
    );
    assert_eq!(tree_state(&f.ledger_dir), before);
    assert!(
        probe_calls(&f, "DEL", "c-c").is_empty(),
        "{}",
        probe_log(&f)
    );

    let (code, rep, out) = gc_json(
        &f,
        &[
            "--grace",
            "0",
            "--network",
            &f.network,
            "--valid-attachments",
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{}\nlog:\n{}", describe(&out), f.log());
    assert_eq!(report_cids(&rep), ["c-c"], "{rep:#}");
    let r = report_rec(&rep, "c-c");
    assert_eq!(r["reason"], json!("not-valid"), "{r:#}");
    assert_eq!(r["action"], json!("replayed"), "{r:#}");
    assert_eq!(rep["summary"]["live"], json!(2), "{rep:#}");
    assert_only_c_cleaned(&f, &nss, &ips);
}

/// The CNI GC verb with the ledger's own conf, cniVersion 1.1.0 and `key` = a, b.
fn gc_verb(f: &Fixture, key: &str, grace: Option<u64>) -> Output {
    let mut stdin = f.plugin_stdin("1.1.0");
    stdin[key] = valid_ab();
    if let Some(g) = grace {
        stdin["gcGraceSecs"] = json!(g);
    }
    let env = vec![
        ("CNI_COMMAND".to_string(), "GC".to_string()),
        ("CNI_PATH".to_string(), f.cni_path()),
    ];
    plugin_in_host(f, &env, stdin.to_string().as_bytes())
}

fn gc_verb_replays_the_unlisted_one(key: &str) {
    let (f, nss, ips) = three_live();

    // An explicit gcGraceSecs of 60: the young unlisted record is left alone for now.
    let out = gc_verb(&f, key, Some(60));
    assert!(
        out.status.success(),
        "GC verb: {}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    assert!(
        f.record_path("c-c", "eth0").exists(),
        "GC ignored the grace period"
    );
    assert!(ipam_file(&f, &ips[2]).exists());
    assert!(probe_calls(&f, "DEL", "c-c").is_empty());

    // No gcGraceSecs: no ADD or DEL runs during GC, so no grace; replayed now.
    let out = gc_verb(&f, key, None);
    assert!(
        out.status.success(),
        "GC verb: {}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "GC prints nothing on success: {}",
        describe(&out)
    );
    assert_only_c_cleaned(&f, &nss, &ips);
    assert!(
        f.log().contains("not-valid"),
        "the decision is not logged:\n{}",
        f.log()
    );
}

#[test]
fn gc_verb_valid_attachments_replays_exactly_the_unlisted_one() {
    require_root!();
    gc_verb_replays_the_unlisted_one("cni.dev/valid-attachments");
}

#[test]
fn gc_verb_older_attachments_key_replays_exactly_the_unlisted_one() {
    require_root!();
    gc_verb_replays_the_unlisted_one("cni.dev/attachments");
}

// -----------------------------------------------------------------------------------------
// 6. a changed boot ID
// -----------------------------------------------------------------------------------------

#[test]
fn changed_boot_id_replays_without_entering_the_surviving_namespace() {
    require_root!();
    let f = fixture_with(
        true,
        vec![json!({"type": PROBE, "logFile": "{tmp}/probe.log"})],
    );
    let ns = Netns::new();
    let cid = "c-boot";
    let cap = port_mappings(8080);
    let mut c = f.driver_cmd("add", cid, "eth0", Some(&ns.path_str()), Some(&cap));
    c.env(
        "CNI_LEDGER_TEST_BOOT_ID",
        "00000000-0000-0000-0000-0000000b007",
    );
    let out = c.output().unwrap();
    assert!(out.status.success(), "ADD: {}", describe(&out));
    let ip = first_ip(&serde_json::from_slice(&out.stdout).unwrap());
    assert_eq!(
        record_json(&f, cid)["record"]["bootId"],
        json!("00000000-0000-0000-0000-0000000b007"),
        "the fake boot ID did not reach the plugin"
    );
    assert!(link_in(&ns, "eth0").unwrap().contains(&ip));

    // The real boot ID now; default grace: a boot change bypasses it.
    let (code, rep, out) = gc_json(&f, &[]);
    assert_eq!(code, 0, "{}\nlog:\n{}", describe(&out), f.log());
    let r = report_rec(&rep, cid);
    assert_eq!(r["reason"], json!("boot-changed"), "{r:#}");
    assert_eq!(r["action"], json!("replayed"), "{r:#}");
    let dels = probe_calls(&f, "DEL", cid);
    assert_eq!(dels.len(), 1, "{}", probe_log(&f));
    assert!(
        dels[0].ends_with("netns="),
        "namespace handed over after a boot change: {dels:?}"
    );

    // Address released, record gone, but the namespace (from "another boot") untouched.
    assert!(!ipam_file(&f, &ip).exists());
    assert!(!f.record_path(cid, "eth0").exists());
    let a = link_in(&ns, "eth0").expect("eth0 in the surviving namespace was removed");
    assert!(a.contains(&ip), "{a}");
}

// -----------------------------------------------------------------------------------------
// 7. a plugin that hangs on DEL
// -----------------------------------------------------------------------------------------

#[test]
fn hanging_plugin_is_killed_at_the_timeout() {
    require_root!();
    let f = fixture_with(
        false,
        vec![
            json!({"type": PROBE, "logFile": "{tmp}/probe.log", "hangDelSecs": 300, "pidFile": "{tmp}/hang.pids"}),
        ],
    );
    let mut ns = Netns::new();
    let cid = "c-hang";
    let ip = add_ok(&f, cid, &ns, None);
    ns.delete();

    let t = Instant::now();
    let (code, rep, out) = gc_json(&f, &["--grace", "0", "--timeout", "2"]);
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "gc took {took:?} with --timeout 2"
    );
    assert!(
        took >= Duration::from_secs(2),
        "gc returned before the timeout: {took:?}"
    );
    assert_eq!(code, 1, "{}", describe(&out));
    let r = report_rec(&rep, cid);
    assert_eq!(r["action"], json!("retrying"), "{r:#}");
    assert_eq!(r["attempts"], json!(1), "{r:#}");
    let err = r["lastError"].as_str().unwrap_or("");
    assert!(err.contains(PROBE) && err.contains("timed out"), "{r:#}");
    assert_eq!(plugin_outcome(r, PROBE)["ok"], json!(false));
    // bridge ran after the hung plugin was killed.
    assert_eq!(plugin_outcome(r, "bridge")["ok"], json!(true), "{r:#}");
    assert!(!ipam_file(&f, &ip).exists());

    let row = f.list_row(cid, "eth0").expect("record kept");
    assert_eq!(row["attempts"], json!(1));
    assert!(
        row["lastError"]
            .as_str()
            .unwrap_or("")
            .contains("timed out"),
        "{row:#}"
    );

    // The plugin and what it started are dead.
    let pids = fs::read_to_string(f.tmp.path().join("hang.pids")).expect("cl-probe never hung");
    for pid in pids.split_whitespace() {
        let pid: u32 = pid.parse().unwrap();
        assert!(
            process_gone(pid, 5),
            "process {pid} of the hung plugin is still alive"
        );
    }
}

// -----------------------------------------------------------------------------------------
// 9. ledger security
// -----------------------------------------------------------------------------------------

#[test]
fn gc_refuses_a_ledger_writable_or_owned_by_others() {
    require_root!();
    let f = fixture_with(
        true,
        vec![json!({"type": PROBE, "logFile": "{tmp}/probe.log"})],
    );
    let mut ns = Netns::new();
    let cid = "c-sec";
    let ip = add_ok(&f, cid, &ns, None);
    ns.delete();

    let chown = |p: &Path, uid: u32| {
        std::os::unix::fs::chown(p, Some(uid), None)
            .unwrap_or_else(|e| panic!("chown {uid} {}: {e}", p.display()))
    };
    let expect_refused = |what: &str, needle: &str| {
        let (out, _) = f.gc(&["--grace", "0"]);
        assert_eq!(exit_code(&out), 2, "{what}: {}", describe(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("refusing") && err.contains(needle),
            "{what}: unclear message: {err}"
        );
        assert!(
            f.record_path(cid, "eth0").exists(),
            "{what}: record touched"
        );
        assert!(
            ipam_file(&f, &ip).exists(),
            "{what}: something was replayed"
        );
        assert!(
            probe_calls(&f, "DEL", cid).is_empty(),
            "{what}: a plugin ran"
        );
    };

    set_mode(&f.ledger_dir, 0o777);
    expect_refused("ledger dir 0777", "writable");
    set_mode(&f.ledger_dir, 0o700);

    set_mode(&f.records_dir(), 0o777);
    expect_refused("records dir 0777", "writable");
    set_mode(&f.records_dir(), 0o700);

    chown(&f.ledger_dir, 65534);
    expect_refused("ledger dir owned by 65534", "65534");
    chown(&f.ledger_dir, 0);

    chown(&f.records_dir(), 65534);
    expect_refused("records dir owned by 65534", "65534");
    chown(&f.records_dir(), 0);

    // Trusted again: it goes ahead.
    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(code, 0, "{}", describe(&out));
    assert_eq!(report_rec(&rep, cid)["action"], json!("replayed"));
    assert!(!ipam_file(&f, &ip).exists());
}

#[test]
fn snapshot_with_path_plugin_types_executes_nothing_outside_cni_path() {
    require_root!();
    let f = fixture_with(
        false,
        vec![
            json!({"type": PROBE, "logFile": "{tmp}/probe.log"}),
            json!({"type": "../../bin/sh"}),
            json!({"type": "/bin/sh"}),
            json!({"type": "../evil/cl-probe", "logFile": "{tmp}/evil.log"}),
        ],
    );
    // A real executable where the traversal would lead (bin/../evil/cl-probe).
    install_probe_as(&f.tmp.path().join("evil"), "cl-probe");
    let evil_log = f.tmp.path().join("evil.log");
    let mut ns = Netns::new();
    let cid = "c-evil";

    // libcni would refuse or run these itself; record through the ledger's plugin face
    // directly (it snapshots the whole conflist).
    let env = f.plugin_env("ADD", cid, "eth0", Some(&ns.path_str()));
    let out = run_plugin(&env, f.plugin_stdin("1.0.0").to_string().as_bytes());
    assert!(out.status.success(), "ADD: {}", describe(&out));
    let snap = record_json(&f, cid)["record"]["snapshot"].clone();
    assert!(snap.is_string(), "no snapshot recorded");
    ns.delete();

    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(code, 1, "{}\nlog:\n{}", describe(&out), f.log());
    let r = report_rec(&rep, cid);
    assert_eq!(r["configSource"], json!("snapshot"), "{r:#}");
    assert_eq!(r["action"], json!("retrying"), "{r:#}");
    for bad in ["../../bin/sh", "/bin/sh", "../evil/cl-probe"] {
        let o = plugin_outcome(r, bad);
        assert_eq!(o["ok"], json!(false), "{bad}: {o:#}");
        assert!(o["exitStatus"].is_null(), "{bad} was executed: {o:#}");
        assert!(
            o["error"].as_str().unwrap_or("").contains("bare name"),
            "{bad}: {o:#}"
        );
    }
    assert!(!evil_log.exists(), "a plugin outside CNI_PATH was executed");
    // The legitimate plugin still ran; the record stays for an operator.
    assert_eq!(plugin_outcome(r, PROBE)["ok"], json!(true), "{r:#}");
    assert_eq!(probe_calls(&f, "DEL", cid).len(), 1);
    assert!(f.record_path(cid, "eth0").exists());
    assert!(
        r["lastError"]
            .as_str()
            .unwrap_or("")
            .contains("../../bin/sh"),
        "{r:#}"
    );
}

#[test]
fn symlink_in_records_is_reported_damaged_and_not_followed() {
    require_root!();
    let f = fixture_with(
        true,
        vec![json!({"type": PROBE, "logFile": "{tmp}/probe.log"})],
    );
    let mut ns = Netns::new();
    let cid = "c-link";
    let ip = add_ok(&f, cid, &ns, None);
    ns.delete();

    // Move the (valid, stale) record outside the ledger and plant a symlink to it: a gc
    // that followed it would replay DEL from a file outside the ledger.
    let rec = f.record_path(cid, "eth0");
    let outside = f.tmp.path().join("outside.json");
    fs::rename(&rec, &outside).unwrap();
    std::os::unix::fs::symlink(&outside, &rec).unwrap();
    let outside_bytes = fs::read(&outside).unwrap();

    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(
        code,
        1,
        "damage must show in the exit status: {}",
        describe(&out)
    );
    assert!(
        rep["records"].as_array().unwrap().is_empty(),
        "the symlinked record was acted on: {rep:#}"
    );
    let damaged = rep["damaged"].as_array().unwrap();
    assert_eq!(damaged.len(), 1, "{rep:#}");
    assert!(
        damaged[0]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("symlink"),
        "{rep:#}"
    );
    assert_eq!(rep["summary"]["damaged"], json!(1));

    // Not followed: the target is intact, nothing was replayed.
    assert_eq!(
        fs::read(&outside).unwrap(),
        outside_bytes,
        "target modified"
    );
    assert!(ipam_file(&f, &ip).exists(), "replayed through a symlink");
    assert!(probe_calls(&f, "DEL", cid).is_empty(), "{}", probe_log(&f));

    // The link itself was moved aside (still a link, not a copy of the target).
    assert!(
        fs::symlink_metadata(&rec).is_err(),
        "symlink left in records/"
    );
    let q = damaged[0]["quarantinedTo"]
        .as_str()
        .expect("not quarantined");
    let qm = fs::symlink_metadata(q).unwrap_or_else(|e| panic!("{q}: {e}"));
    assert!(
        qm.file_type().is_symlink(),
        "quarantine holds a copy, not the link"
    );
    assert!(q.starts_with(f.quarantine_dir().to_str().unwrap()), "{q}");
}

/// `gc --json --cni-cache-dir ... <args>` with reading the record file `name` failing
/// with `errno` (the `testing` build's fault hook), as a failing disk (EIO), an
/// exhausted fd table (EMFILE) or memory (ENOMEM) would make it.
fn gc_with_read_errno(f: &Fixture, errno: i32, name: &str, args: &[&str]) -> Output {
    let cache = f.cache_dir.to_string_lossy().into_owned();
    let mut all = vec!["gc", "--cni-cache-dir", cache.as_str()];
    all.extend_from_slice(args);
    let mut c = f.ledger_cmd(&all);
    c.env("CNI_LEDGER_TEST_READ_ERRNO", format!("{errno}:{name}"));
    c.output().unwrap()
}

#[test]
fn a_record_that_cannot_be_read_is_left_in_place_and_reported_unreadable() {
    require_root!();
    let f = fixture_with(
        true,
        vec![json!({"type": PROBE, "logFile": "{tmp}/probe.log"})],
    );
    let mut ns = Netns::new();
    let cid = "c-eio";
    let ip = add_ok(&f, cid, &ns, None);
    ns.delete();
    let rec = f.record_path(cid, "eth0");
    let name = rec.file_name().unwrap().to_str().unwrap().to_string();
    let bytes = fs::read(&rec).unwrap();

    for (errno, text) in [
        (5, "Input/output error"),
        (24, "Too many open files"),
        (12, "Cannot allocate memory"),
    ] {
        let out = gc_with_read_errno(&f, errno, &name, &["--json", "--grace", "0"]);
        let rep: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("no JSON report ({e}): {}", describe(&out)));
        // Left for later: not damage, not clean either.
        assert_eq!(exit_code(&out), 1, "{}", describe(&out));
        assert_eq!(rep["summary"]["damaged"], json!(0), "{rep:#}");
        assert_eq!(rep["summary"]["unreadable"], json!(1), "{rep:#}");
        assert!(rep["damaged"].as_array().unwrap().is_empty(), "{rep:#}");
        let u = &rep["unreadable"][0];
        assert_eq!(u["file"], json!(rec.display().to_string()), "{rep:#}");
        assert!(u["error"].as_str().unwrap().contains(text), "{rep:#}");
        assert!(rep["records"].as_array().unwrap().is_empty(), "{rep:#}");
        // The record is where it was, byte for byte; nothing went to quarantine.
        assert_eq!(fs::read(&rec).unwrap(), bytes, "errno {errno}");
        assert!(
            f.quarantine_files().is_empty(),
            "{:?}",
            f.quarantine_files()
        );
        assert!(probe_calls(&f, "DEL", cid).is_empty(), "{}", probe_log(&f));
        assert!(ipam_file(&f, &ip).exists());
    }
    // The human summary says so too, and `list` leaves it as well.
    let out = gc_with_read_errno(&f, 5, &name, &["--grace", "0"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(", damaged 0, unreadable 1\n"), "{text}");
    assert!(
        text.contains(&format!("unreadable: {}", rec.display())),
        "{text}"
    );
    let mut c = f.ledger_cmd(&["list", "--json"]);
    c.env("CNI_LEDGER_TEST_READ_ERRNO", format!("5:{name}"));
    let out = c.output().unwrap();
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows[0]["state"], json!("unknown"), "{rows:#}");
    assert_eq!(rows[0]["reason"], json!("unreadable"), "{rows:#}");
    assert_eq!(fs::read(&rec).unwrap(), bytes);
    assert!(f.quarantine_files().is_empty());

    // Readable again: the next run judges and releases it.
    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(code, 0, "{}", describe(&out));
    assert_eq!(
        report_rec(&rep, cid)["action"],
        json!("replayed"),
        "{rep:#}"
    );
    assert!(rep.get("unreadable").is_none(), "{rep:#}");
    assert!(!ipam_file(&f, &ip).exists());
    assert!(!rec.exists());
}

#[test]
fn the_cache_entry_is_gone_before_the_key_is_released() {
    require_root!();
    // Once gc lets go of the key, an adopt that finds no record must find no cache
    // entry of the attachment just released either (or it would adopt it again).
    let f = fixture_with(false, vec![]);
    let mut ns = Netns::new();
    let cid = "c-order";
    let ip = add_ok(&f, cid, &ns, None);
    ns.delete();
    let cache = f.cache_result_path(cid, "eth0");
    assert!(cache.exists(), "libcni cached nothing");
    let cache_dir = f.cache_dir.to_string_lossy().into_owned();
    let mut c = f.ledger_cmd(&["gc", "--cni-cache-dir", &cache_dir, "--grace", "0"]);
    // Killed the moment the key is released: what is on disk then is what an adopt
    // taking the key next would see.
    c.env("CNI_LEDGER_TEST_CRASH_AT", "gc.key-released");
    let out = c.output().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "not killed at the crash point: {}",
        describe(&out)
    );
    assert!(!f.record_path(cid, "eth0").exists());
    assert!(!cache.exists(), "the cache entry outlived the key lock");
    assert!(!ipam_file(&f, &ip).exists());
}

#[test]
fn no_file_descriptor_left_to_read_records_quarantines_nothing() {
    require_root!();
    let f = fixture_with(
        true,
        vec![json!({"type": PROBE, "logFile": "{tmp}/probe.log"})],
    );
    let live = Netns::new();
    add_ok(&f, "c-fd-live", &live, None);
    let mut gone = Netns::new();
    let ip = add_ok(&f, "c-fd-gone", &gone, None);
    gone.delete();
    let before = tree_state(&f.records_dir());
    // Room for stdio and the records directory being listed, none for a record: every
    // read fails with EMFILE, as on a node whose gc ran out of descriptors.
    let cache = f.cache_dir.to_string_lossy().into_owned();
    let out = f
        .host
        .cmd("prlimit")
        .arg("--nofile=5")
        .arg(ledger_bin())
        .args(["gc", "--json", "--grace", "0", "--cni-cache-dir", &cache])
        .arg("--ledger-dir")
        .arg(&f.ledger_dir)
        .output()
        .unwrap();
    let rep: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}): {}", describe(&out)));
    assert_eq!(exit_code(&out), 1, "{}", describe(&out));
    assert_eq!(rep["summary"]["unreadable"], json!(2), "{rep:#}");
    assert_eq!(rep["summary"]["damaged"], json!(0), "{rep:#}");
    for u in rep["unreadable"].as_array().unwrap() {
        assert!(
            u["error"].as_str().unwrap().contains("Too many open files"),
            "{rep:#}"
        );
    }
    assert_eq!(tree_state(&f.records_dir()), before, "records changed");
    assert!(
        f.quarantine_files().is_empty(),
        "{:?}",
        f.quarantine_files()
    );
    assert!(probe_calls(&f, "DEL", "c-fd-gone").is_empty());

    // With descriptors again, the stale one is released and the live one kept.
    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(code, 0, "{}", describe(&out));
    assert_eq!(report_cids(&rep), ["c-fd-gone"], "{rep:#}");
    assert!(!ipam_file(&f, &ip).exists());
    assert!(f.record_path("c-fd-live", "eth0").exists());
}

#[test]
fn the_snapshot_of_an_unreadable_record_is_not_swept() {
    require_root!();
    let f = fixture_with(false, vec![]);
    let mut ns_x = Netns::new();
    let mut ns_y = Netns::new();
    let ip_x = add_ok(&f, "c-x", &ns_x, None);
    add_ok(&f, "c-y", &ns_y, None);
    ns_x.delete();
    ns_y.delete();
    let snapshot = record_json(&f, "c-x")["record"]["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let snapshot_file = f.snapshots_dir().join(format!("{snapshot}.json"));
    assert!(snapshot_file.exists());
    // c-y's replay removes the last readable record naming the snapshot, and the run
    // then sweeps unreferenced snapshots: c-x, unread, still names it.
    let rec_x = f.record_path("c-x", "eth0");
    let name = rec_x.file_name().unwrap().to_str().unwrap().to_string();
    let out = gc_with_read_errno(&f, 5, &name, &["--json", "--grace", "0"]);
    let rep: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON report ({e}): {}", describe(&out)));
    assert_eq!(
        report_rec(&rep, "c-y")["action"],
        json!("replayed"),
        "{rep:#}"
    );
    assert_eq!(rep["summary"]["unreadable"], json!(1), "{rep:#}");
    assert!(
        snapshot_file.exists(),
        "the unread record's snapshot was swept"
    );

    let (code, rep, out) = gc_json(&f, &["--grace", "0"]);
    assert_eq!(code, 0, "{}", describe(&out));
    let r = report_rec(&rep, "c-x");
    assert_eq!(r["action"], json!("replayed"), "{r:#}");
    assert_eq!(r["configSource"], json!("snapshot"), "{r:#}");
    assert!(!ipam_file(&f, &ip_x).exists());
}

/// The report lists damaged records by file name, whatever order the scan's workers
/// finished in: two runs over one ledger print one report.
#[test]
fn damaged_records_are_reported_in_file_order() {
    require_root!();
    let f = fixture_with(false, vec![]);
    let records = f.ledger_dir.join("records");
    fs::create_dir_all(&records).unwrap();
    for i in 0..24 {
        fs::write(records.join(format!("n:bad{i:02}:eth0.json")), b"{").unwrap();
    }
    let (code, rep, out) = gc_json(&f, &["--dry-run"]);
    assert_eq!(code, 1, "{}", describe(&out));
    let files: Vec<String> = rep["damaged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["file"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(files.len(), 24, "{rep:#}");
    let mut sorted = files.clone();
    sorted.sort();
    assert_eq!(files, sorted);
}
