//! Acceptance tests of the plugin face (docs/DESIGN.md §3, §4, §8; docs/CONTRACT.md), run
//! through libcni (tests/driver) with real namespaces and Debian's CNI plugins, or by
//! invoking the binary directly as a plugin. Needs root.
//!
//!     cargo test --features testing --test plugin_face

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::fs;

use common::*;
use serde_json::{json, Value};

fn as_u64(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

fn row_for<'a>(rows: &'a [Value], cid: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["containerId"] == json!(cid))
        .unwrap_or_else(|| panic!("no list row for {cid}: {rows:#?}"))
}

// -----------------------------------------------------------------------------------------
// ADD / DEL through libcni
// -----------------------------------------------------------------------------------------

#[test]
fn add_del_through_libcni_with_bridge_and_portmap() {
    require_root!();
    let f = Fixture::new();
    assert_eq!(f.load().unwrap(), vec!["cni-ledger", "bridge", "portmap"]);
    let ns = Netns::new();
    let netns = ns.path_str();
    let cap = port_mappings(8080);

    let res = f
        .add("c-one", "eth0", Some(&netns), Some(&cap))
        .expect("ADD through libcni");

    // The chain's result comes out of libcni with the bridge's address in it.
    let ips = res["ips"]
        .as_array()
        .unwrap_or_else(|| panic!("no ips in result: {res}"));
    let prefix = format!("{}.", f.subnet_prefix);
    assert!(
        ips.iter().any(|ip| {
            let a = ip["address"].as_str().unwrap_or("");
            a.starts_with(&prefix) && a.ends_with("/24")
        }),
        "result has no address from the bridge's subnet {}: {res}",
        f.subnet()
    );
    assert!(
        res["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["name"] == json!(f.bridge)),
        "result does not name bridge {}: {res}",
        f.bridge
    );
    assert!(
        f.cache_result_path("c-one", "eth0").exists(),
        "libcni cached no result"
    );
    assert_eq!(
        f.ipam_addresses().len(),
        1,
        "host-local reserved no address"
    );
    assert!(
        f.host.has_link(&f.bridge),
        "bridge not created in the test host netns"
    );
    let nat = f.host.iptables_save();
    assert!(
        nat.contains("CNI-DN-") && nat.contains("8080"),
        "portmap rules missing:\n{nat}"
    );

    // list --json: one live record with what a replay needs.
    let rows = f.list_json();
    assert_eq!(rows.len(), 1, "list: {rows:#?}");
    let r = &rows[0];
    assert_eq!(r["network"], json!(f.network));
    assert_eq!(r["containerId"], json!("c-one"));
    assert_eq!(r["ifname"], json!("eth0"));
    assert_eq!(r["netns"], json!(netns));
    assert_eq!(r["state"], json!("live"), "row: {r:#}");
    assert!(r["reason"].is_null(), "live row has a reason: {r:#}");
    assert_eq!(
        r["runtimeConfig"]["portMappings"], cap["portMappings"],
        "runtimeConfig.portMappings not recorded: {r:#}"
    );

    // The record file itself (CONTRACT: records/<net>:<cid>:<ifname>.json, 0600, dir 0700).
    let rec_path = f.record_path("c-one", "eth0");
    assert!(
        rec_path.exists(),
        "no record at {}: {:?}",
        rec_path.display(),
        f.record_files()
    );
    assert_eq!(
        f.record_dir_entries().len(),
        1,
        "stray files: {:?}",
        f.record_dir_entries()
    );
    assert_eq!(mode_of(&f.ledger_dir), 0o700, "ledger dir mode");
    assert_eq!(mode_of(&rec_path), 0o600, "record file mode");
    let file: Value = serde_json::from_slice(&fs::read(&rec_path).unwrap()).unwrap();
    assert_eq!(file["format"], json!(1));
    assert!(
        file["sha256"].as_str().is_some_and(|s| s.len() == 64),
        "{file:#}"
    );
    let rec = &file["record"];
    let (dev, ino) = ns.identity();
    assert_eq!(
        as_u64(&rec["netnsId"]["dev"]),
        Some(dev),
        "netnsId.dev: {rec:#}"
    );
    assert_eq!(
        as_u64(&rec["netnsId"]["ino"]),
        Some(ino),
        "netnsId.ino: {rec:#}"
    );
    assert_eq!(rec["bootId"], json!(boot_id()));
    assert_eq!(rec["cniPath"], json!(f.cni_path()));
    assert_eq!(rec["confFile"], json!(f.conf_file));
    // The whole conflist is snapshotted, content-addressed.
    let snap = rec["snapshot"]
        .as_str()
        .unwrap_or_else(|| panic!("no snapshot: {rec:#}"));
    let snap_file = f.snapshots_dir().join(format!("{snap}.json"));
    assert_eq!(
        fs::read(&snap_file).unwrap(),
        f.conflist_bytes(),
        "snapshot bytes"
    );
    assert_eq!(
        sha256_hex(&snap_file),
        snap,
        "snapshot name is not its sha256"
    );

    // DEL through libcni: everything is released and the record dropped.
    f.del("c-one", "eth0", Some(&netns), Some(&cap))
        .expect("DEL through libcni");
    assert!(!rec_path.exists(), "record survived DEL");
    assert!(
        f.list_json().is_empty(),
        "list after DEL: {:#?}",
        f.list_json()
    );
    assert!(
        f.ipam_addresses().is_empty(),
        "host-local address left: {:?}",
        f.ipam_addresses()
    );
    assert!(
        !f.cache_result_path("c-one", "eth0").exists(),
        "libcni cache left"
    );
    let nat = f.host.iptables_save();
    assert!(!nat.contains("CNI-DN-"), "portmap DNAT chain left:\n{nat}");

    // DEL is idempotent.
    f.del("c-one", "eth0", Some(&netns), Some(&cap))
        .expect("second DEL");
    assert!(f.list_json().is_empty());
}

#[test]
fn add_failing_later_in_chain_keeps_record_without_libcni_cache() {
    require_root!();
    let spec = ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    }
    .with_extra(json!({"type": "cl-no-such-plugin"}));
    let f = Fixture::with_spec(spec);
    let ns = Netns::new();
    let netns = ns.path_str();

    let err = f
        .add("c-cut", "eth0", Some(&netns), None)
        .expect_err("ADD must fail");
    assert!(
        err.contains("cl-no-such-plugin"),
        "unexpected failure: {err}"
    );

    // libcni remembers nothing: its cache is written only after the whole chain succeeded.
    assert!(
        !f.cache_result_path("c-cut", "eth0").exists(),
        "libcni cached a failed ADD"
    );
    // The bridge ran and host-local leaked an address: exactly what the ledger is for.
    assert_eq!(
        f.ipam_addresses().len(),
        1,
        "bridge did not run before the failure"
    );
    // The ledger, first in the chain, has the write-ahead record.
    assert!(
        f.record_path("c-cut", "eth0").exists(),
        "files: {:?}",
        f.record_files()
    );
    let rows = f.list_json();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["containerId"], json!("c-cut"));
    assert_eq!(rows[0]["state"], json!("live"));

    // libcni's DEL stops at the first failing plugin (the missing one, DEL runs in
    // reverse), so the ledger's DEL never runs and the record must stay.
    assert!(f.del("c-cut", "eth0", Some(&netns), None).is_err());
    assert!(
        f.record_path("c-cut", "eth0").exists(),
        "record dropped although DEL failed"
    );
}

// -----------------------------------------------------------------------------------------
// liveness as reported by list
// -----------------------------------------------------------------------------------------

#[test]
fn list_reports_missing_replaced_and_live_namespaces() {
    require_root!();
    let f = Fixture::new();
    let mut gone = Netns::new();
    let mut replaced = Netns::new();
    let live = Netns::new();
    for (cid, ns) in [
        ("c-gone", &gone),
        ("c-replaced", &replaced),
        ("c-live", &live),
    ] {
        f.add(cid, "eth0", Some(&ns.path_str()), None)
            .unwrap_or_else(|e| panic!("ADD {cid}: {e}"));
    }
    let before = f.list_json();
    assert_eq!(
        count_by(&before, "state").get("live"),
        Some(&3),
        "{before:#?}"
    );

    let old_id = replaced.identity();
    gone.delete();
    replaced.replace();
    assert_ne!(
        replaced.identity(),
        old_id,
        "test setup: replacement has the same inode"
    );
    assert!(replaced.path().exists());

    let rows = f.list_json();
    assert_eq!(rows.len(), 3, "{rows:#?}");
    let g = row_for(&rows, "c-gone");
    assert_eq!(
        (&g["state"], &g["reason"]),
        (&json!("stale"), &json!("netns-missing")),
        "{g:#}"
    );
    let r = row_for(&rows, "c-replaced");
    assert_eq!(
        (&r["state"], &r["reason"]),
        (&json!("stale"), &json!("netns-replaced")),
        "{r:#}"
    );
    let l = row_for(&rows, "c-live");
    assert_eq!(l["state"], json!("live"), "{l:#}");
    assert!(l["reason"].is_null(), "{l:#}");

    // list is read-only for healthy records.
    assert_eq!(f.record_files().len(), 3);
    let v = f.ledger(&["verify"]);
    assert!(v.status.success(), "verify: {}", describe(&v));
}

// -----------------------------------------------------------------------------------------
// concurrency
// -----------------------------------------------------------------------------------------

#[test]
fn parallel_adds_through_libcni_are_all_recorded() {
    require_root!();
    const N: usize = 64;
    let f = Fixture::ledger_only();
    let ns = Netns::new();
    let netns = ns.path_str();

    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..N)
            .map(|i| {
                let (f, netns) = (&f, &netns);
                s.spawn(move || {
                    f.add(&format!("par-{i:02}"), "eth0", Some(netns), None)
                        .err()
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(
        errors.is_empty(),
        "{} ADDs failed, first: {}",
        errors.len(),
        errors[0]
    );

    let rows = f.list_json();
    assert_eq!(rows.len(), N, "list shows {} records", rows.len());
    assert_eq!(
        count_by(&rows, "state").get("live"),
        Some(&N),
        "{:?}",
        count_by(&rows, "state")
    );
    let cids: BTreeSet<_> = rows
        .iter()
        .map(|r| r["containerId"].as_str().unwrap())
        .collect();
    assert_eq!(cids.len(), N);
    // No temp files left behind, one shared snapshot for the one conflist.
    assert_eq!(
        f.record_dir_entries().len(),
        N,
        "{:?}",
        f.record_dir_entries()
    );
    assert_eq!(
        list_dir(&f.snapshots_dir()).len(),
        1,
        "{:?}",
        list_dir(&f.snapshots_dir())
    );

    let v = f.ledger(&["verify"]);
    assert!(v.status.success(), "verify not clean: {}", describe(&v));

    // And the same in reverse.
    let errors: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..N)
            .map(|i| {
                let (f, netns) = (&f, &netns);
                s.spawn(move || {
                    f.del(&format!("par-{i:02}"), "eth0", Some(netns), None)
                        .err()
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(
        errors.is_empty(),
        "{} DELs failed, first: {}",
        errors.len(),
        errors[0]
    );
    assert!(
        f.record_dir_entries().is_empty(),
        "{:?}",
        f.record_dir_entries()
    );
}

// -----------------------------------------------------------------------------------------
// integrity
// -----------------------------------------------------------------------------------------

#[test]
fn damaged_records_are_reported_and_quarantined() {
    require_root!();
    let f = Fixture::ledger_only();
    let ns = Netns::new();
    let netns = ns.path_str();
    for cid in ["c-ok", "c-trunc", "c-flip"] {
        f.add(cid, "eth0", Some(&netns), None)
            .unwrap_or_else(|e| panic!("ADD {cid}: {e}"));
    }
    let trunc = f.record_path("c-trunc", "eth0");
    let flip = f.record_path("c-flip", "eth0");
    let trunc_name = trunc.file_name().unwrap().to_string_lossy().into_owned();
    let flip_name = flip.file_name().unwrap().to_string_lossy().into_owned();

    // Truncate one record to half its size.
    let bytes = fs::read(&trunc).unwrap();
    fs::write(&trunc, &bytes[..bytes.len() / 2]).unwrap();
    // Flip one bit of the other inside the checksummed record: JSON stays valid.
    let mut bytes = fs::read(&flip).unwrap();
    let rec_at = find(&bytes, b"\"record\"").expect("record key");
    let pos = rec_at + find(&bytes[rec_at..], b"c-flip").expect("containerId in record") + 3;
    bytes[pos] ^= 0x01; // "c-flip" -> "c-fmip"
    fs::write(&flip, &bytes).unwrap();
    assert!(serde_json::from_slice::<Value>(&bytes).is_ok());

    // verify reports damage and touches nothing.
    let v = f.ledger(&["verify"]);
    assert_eq!(
        v.status.code(),
        Some(1),
        "verify must exit 1 on damage: {}",
        describe(&v)
    );
    assert!(
        trunc.exists() && flip.exists(),
        "verify is read-only but moved files"
    );

    // list: damaged (never live), moved to quarantine/, named in the output.
    let out = f.ledger(&["list", "--json"]);
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("list --json output ({e}): {}", describe(&out)));
    let damaged: Vec<&Value> = rows
        .iter()
        .filter(|r| r["state"] == json!("damaged"))
        .collect();
    assert_eq!(damaged.len(), 2, "expected 2 damaged rows: {rows:#?}");
    for name in [&trunc_name, &flip_name] {
        let row = damaged
            .iter()
            .find(|r| {
                r["file"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(name.as_str()))
            })
            .unwrap_or_else(|| panic!("no damaged row names {name}: {rows:#?}"));
        assert!(
            row["reason"].is_string(),
            "damaged row without reason: {row:#}"
        );
        let q = row["quarantinedTo"]
            .as_str()
            .unwrap_or_else(|| panic!("damaged row without quarantinedTo: {row:#}"));
        let q_path = if q.starts_with('/') {
            q.into()
        } else {
            f.ledger_dir.join(q)
        };
        assert!(q_path.exists(), "quarantinedTo {q} does not exist");
        assert!(
            q_path.starts_with(f.quarantine_dir()),
            "quarantined outside quarantine/: {q}"
        );
    }
    let flip_row = damaged
        .iter()
        .find(|r| {
            r["file"]
                .as_str()
                .is_some_and(|p| p.ends_with(flip_name.as_str()))
        })
        .unwrap();
    assert_eq!(
        flip_row["reason"],
        json!("checksum-mismatch"),
        "{flip_row:#}"
    );
    let live: Vec<&Value> = rows
        .iter()
        .filter(|r| r["state"] == json!("live"))
        .collect();
    assert_eq!(live.len(), 1, "only c-ok may be live: {rows:#?}");
    assert_eq!(live[0]["containerId"], json!("c-ok"));

    assert!(
        !trunc.exists() && !flip.exists(),
        "damaged files left in records/"
    );
    assert_eq!(
        f.record_files(),
        vec![f
            .record_path("c-ok", "eth0")
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()]
    );
    let q = f.quarantine_files();
    for name in [&trunc_name, &flip_name] {
        assert!(
            q.iter().any(|n| n
                .strip_prefix(name.as_str())
                .and_then(|r| r.strip_prefix('.'))
                .is_some_and(|t| !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()))),
            "quarantine/ has no {name}.<unix-seconds>: {q:?}"
        );
    }
    // Nothing damaged is left for a second look.
    let rows = f.list_json();
    assert_eq!(rows.len(), 1, "{rows:#?}");
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

// -----------------------------------------------------------------------------------------
// bad input, direct plugin invocation
// -----------------------------------------------------------------------------------------

#[test]
fn bad_inputs_are_rejected_with_cni_errors_and_write_nothing() {
    require_root!();
    let f = Fixture::ledger_only();
    let ns = Netns::new();
    let netns = ns.path_str();
    let good_stdin = f.plugin_stdin("1.0.0");
    let good = serde_json::to_vec(&good_stdin).unwrap();
    let env = |cid: &str, ifname: &str| f.plugin_env("ADD", cid, ifname, Some(&netns));
    let without = |mut e: Vec<(String, String)>, key: &str| {
        e.retain(|(k, _)| k != key);
        e
    };
    let with_stdin = |k: &str, v: Value| {
        let mut s = good_stdin.clone();
        s[k] = v;
        serde_json::to_vec(&s).unwrap()
    };
    let oversized = {
        let mut s = good_stdin.clone();
        s["padding"] = json!("x".repeat(1024 * 1024 + 1));
        serde_json::to_vec(&s).unwrap()
    };

    type Case<'a> = (&'a str, Vec<(String, String)>, Vec<u8>, u64);
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            env("c-1", "eth0"),
            br#"{"cniVersion":"1.0.0","name":"#.to_vec(),
            6,
        ),
        (
            "stdin not an object",
            env("c-1", "eth0"),
            b"[1,2,3]".to_vec(),
            6,
        ),
        (
            "missing CNI_CONTAINERID",
            without(env("c-1", "eth0"), "CNI_CONTAINERID"),
            good.clone(),
            3,
        ),
        (
            "container ID ../../etc",
            env("../../etc", "eth0"),
            good.clone(),
            4,
        ),
        (
            "container ID with leading dash",
            env("-c1", "eth0"),
            good.clone(),
            4,
        ),
        (
            "container ID with a space",
            env("c 1", "eth0"),
            good.clone(),
            4,
        ),
        (
            "ifname of 16 bytes",
            env("c-1", "abcdefghijklmnop"),
            good.clone(),
            4,
        ),
        ("ifname a/b", env("c-1", "a/b"), good.clone(), 4),
        ("ifname .", env("c-1", "."), good.clone(), 4),
        ("ifname ..", env("c-1", ".."), good.clone(), 4),
        ("ifname a:b", env("c-1", "a:b"), good.clone(), 4),
        ("ifname with a space", env("c-1", "a b"), good.clone(), 4),
        ("empty ifname", env("c-1", ""), good.clone(), 4),
        (
            "missing CNI_IFNAME",
            without(env("c-1", "eth0"), "CNI_IFNAME"),
            good.clone(),
            4,
        ),
        (
            "missing CNI_NETNS on ADD",
            without(env("c-1", "eth0"), "CNI_NETNS"),
            good.clone(),
            4,
        ),
        (
            "network name with a slash",
            env("c-1", "eth0"),
            with_stdin("name", json!("bad/name")),
            7,
        ),
        (
            "network name ..",
            env("c-1", "eth0"),
            with_stdin("name", json!("..")),
            7,
        ),
        (
            "empty network name",
            env("c-1", "eth0"),
            with_stdin("name", json!("")),
            7,
        ),
        (
            "unsupported cniVersion",
            env("c-1", "eth0"),
            with_stdin("cniVersion", json!("9.9.9")),
            1,
        ),
        ("stdin over 1 MiB", env("c-1", "eth0"), oversized, 6),
    ];

    let mut failures = Vec::new();
    for (what, env, stdin, want) in &cases {
        let out = f.run_plugin(env, stdin);
        let parsed: Result<Value, _> = serde_json::from_slice(&out.stdout);
        let problem = match &parsed {
            _ if out.status.success() => Some("exit status 0".to_string()),
            Err(e) => Some(format!("stdout is not JSON: {e}")),
            Ok(v) if v["code"].as_u64() != Some(*want) => {
                Some(format!("code {} (want {want})", v["code"]))
            }
            Ok(v) if !v["msg"].is_string() => Some("no msg".to_string()),
            Ok(_) => None,
        };
        if let Some(p) = problem {
            failures.push(format!("{what}: {p}\n{}", describe(&out)));
        }
        let files = walk_files(&f.ledger_dir);
        if !files.is_empty() {
            failures.push(format!(
                "{what}: ledger dir not empty afterwards: {files:?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );

    // The same environment with nothing wrong works (the cases above fail for their reason).
    let out = f.run_plugin(&env("c-1", "eth0"), &good);
    assert!(out.status.success(), "valid ADD failed: {}", describe(&out));
    assert_eq!(f.record_files().len(), 1);
    let del = f.plugin_env("DEL", "c-1", "eth0", None); // CNI_NETNS optional on DEL
    let out = f.run_plugin(&del, &good);
    assert!(
        out.status.success(),
        "DEL without CNI_NETNS failed: {}",
        describe(&out)
    );
    assert!(f.record_files().is_empty());
}

// -----------------------------------------------------------------------------------------
// unwritable ledger: onLedgerError, STATUS
// -----------------------------------------------------------------------------------------

#[test]
fn ledger_under_a_regular_file_fails_add_unless_warn() {
    require_root!();
    let mut f = Fixture::ledger_only();
    let ns = Netns::new();
    let netns = ns.path_str();
    let blocker = f.tmp.path().join("blocker");
    fs::write(&blocker, b"not a directory").unwrap();
    f.set_ledger_dir(&blocker.join("ledger"));

    // Default onLedgerError=fail: the runtime sees the ADD fail.
    let err = f
        .add("c-ro", "eth0", Some(&netns), None)
        .expect_err("ADD must fail");
    assert!(
        !f.cache_result_path("c-ro", "eth0").exists(),
        "libcni cached a failed ADD ({err})"
    );
    let out = f.run_plugin(
        &f.plugin_env("ADD", "c-ro", "eth0", Some(&netns)),
        &serde_json::to_vec(&f.plugin_stdin("1.0.0")).unwrap(),
    );
    assert!(!out.status.success(), "{}", describe(&out));
    let code = cni_error_code(&out);
    assert!(
        code == 5 || code == 11,
        "want code 5 or 11: {}",
        describe(&out)
    );

    // STATUS says the plugin is not available.
    let out = f.run_plugin(
        &f.status_env(),
        &serde_json::to_vec(&f.plugin_stdin("1.1.0")).unwrap(),
    );
    assert!(
        !out.status.success(),
        "STATUS on an unwritable ledger: {}",
        describe(&out)
    );
    assert_eq!(cni_error_code(&out), 50, "{}", describe(&out));

    // onLedgerError=warn: ADD succeeds, the log says what went wrong.
    f.set_ledger_opt("onLedgerError", json!("warn"));
    let log_before = f.log().len();
    f.add("c-ro", "eth0", Some(&netns), None)
        .expect("ADD under onLedgerError=warn");
    let log = f.log();
    let new = &log[log_before.min(log.len())..];
    assert!(
        !new.trim().is_empty() && new.to_lowercase().contains("warn"),
        "no warning in the log file {}: {new:?}",
        f.log_file.display()
    );
    assert!(f.cache_result_path("c-ro", "eth0").exists());
    f.del("c-ro", "eth0", Some(&netns), None)
        .expect("DEL under warn");
}

#[test]
fn read_only_ledger_fails_add_unless_warn_and_status_reports_50() {
    require_root!();
    let f = Fixture::ledger_only();
    let ns = Netns::new();
    let netns = ns.path_str();
    // A ledger that exists and works ...
    f.add("c-before", "eth0", Some(&netns), None)
        .expect("ADD on a writable ledger");
    let stdin = serde_json::to_vec(&f.plugin_stdin("1.0.0")).unwrap();
    let status_stdin = serde_json::to_vec(&f.plugin_stdin("1.1.0")).unwrap();
    let out = f.run_plugin(&f.status_env(), &status_stdin);
    assert!(
        out.status.success(),
        "STATUS on a writable ledger: {}",
        describe(&out)
    );

    // ... then is mounted read-only (in a private mount namespace of the plugin).
    let add_env = f.plugin_env("ADD", "c-after", "eth0", Some(&netns));
    let out = run_plugin_with_ro_dir(&f.ledger_dir, &add_env, &stdin);
    assert!(
        !out.status.success(),
        "ADD on a read-only ledger: {}",
        describe(&out)
    );
    let code = cni_error_code(&out);
    assert!(
        code == 5 || code == 11,
        "want code 5 or 11: {}",
        describe(&out)
    );
    let out = run_plugin_with_ro_dir(&f.ledger_dir, &f.status_env(), &status_stdin);
    assert!(
        !out.status.success(),
        "STATUS on a read-only ledger: {}",
        describe(&out)
    );
    assert_eq!(cni_error_code(&out), 50, "{}", describe(&out));

    // onLedgerError=warn turns it into a logged warning.
    let mut warn = f.plugin_stdin("1.0.0");
    warn["onLedgerError"] = json!("warn");
    let log_before = f.log().len();
    let out = run_plugin_with_ro_dir(&f.ledger_dir, &add_env, &serde_json::to_vec(&warn).unwrap());
    assert!(
        out.status.success(),
        "ADD under warn on a read-only ledger: {}",
        describe(&out)
    );
    let res: Value = serde_json::from_slice(&out.stdout).expect("a result on stdout");
    assert_eq!(res["cniVersion"], json!("1.0.0"), "{res}");
    let log = f.log();
    assert!(
        log.len() > log_before,
        "nothing logged to {}",
        f.log_file.display()
    );

    assert_eq!(
        f.record_files(),
        vec![f
            .record_path("c-before", "eth0")
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()]
    );
}

/// The libcni v1.3 driver running `args` in a private mount namespace in which `dir` is
/// bind-mounted read-only onto itself: the plugins libcni runs see the ledger as a
/// read-only mount shows it, and nothing outside the test's process sees the mount.
fn driver13_with_ro_dir(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut c = std::process::Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@""#)
        .arg("sh")
        .arg(dir)
        .arg(driver13())
        .args(args);
    c.output().unwrap()
}

/// Issue 37: on a read-only ledger, STATUS through libcni v1.3's GetStatusNetworkList (what
/// containerd 2.x turns into NetworkReady) answers as ADD does: error 50 under the default
/// `onLedgerError: fail`, available under `warn` (with an ADD that goes on unrecorded, the
/// node must not go NotReady), the problem logged to the log file and stderr.
#[test]
fn status_through_libcni_follows_on_ledger_error_on_a_read_only_ledger() {
    require_root!();
    let mut f = Fixture::with_spec(ChainSpec {
        cni_version: "1.1.0".into(),
        ..ChainSpec::ledger_only()
    });
    // libcni v1.1 reads no 1.1.0 result: every call here is libcni v1.3's.
    f.driver = driver13();
    let ns = Netns::new();
    let netns = ns.path_str();
    let (conf_dir, cni_path) = (f.conf_dir.display().to_string(), f.cni_path());
    let network = f.network.clone();
    let status = [
        "status",
        "--conf-dir",
        &conf_dir,
        "--net",
        &network,
        "--cni-path",
        &cni_path,
    ];
    let add = |f: &Fixture, cid: &str| {
        let cache = f.cache_dir.display().to_string();
        let args = [
            "add",
            "--conf-dir",
            &conf_dir,
            "--net",
            &network,
            "--cid",
            cid,
            "--ifname",
            "eth0",
            "--netns",
            &netns,
            "--cni-path",
            &cni_path,
            "--cache-dir",
            &cache,
        ];
        driver13_with_ro_dir(&f.ledger_dir, &args)
    };
    // A ledger that exists and works: available.
    f.add("c-before", "eth0", Some(&netns), None)
        .expect("ADD on a writable ledger");
    let out = run_ok(std::process::Command::new(driver13()).args(status));
    assert!(out.stderr.is_empty(), "{}", describe(&out));

    // Read-only, onLedgerError: fail: ADD fails, and STATUS says not available.
    let out = add(&f, "c-fail");
    assert!(
        !out.status.success(),
        "ADD on a read-only ledger: {}",
        describe(&out)
    );
    let out = driver13_with_ro_dir(&f.ledger_dir, &status);
    assert!(
        !out.status.success(),
        "STATUS on a read-only ledger: {}",
        describe(&out)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the ledger cannot be written"), "{err}");

    // Read-only, onLedgerError: warn: ADD goes on, and so does STATUS, saying why in the
    // log file and on stderr (the runtime's log).
    f.set_ledger_opt("onLedgerError", json!("warn"));
    let out = add(&f, "c-warn");
    assert!(out.status.success(), "ADD under warn: {}", describe(&out));
    let log_before = f.log().len();
    let out = driver13_with_ro_dir(&f.ledger_dir, &status);
    assert!(
        out.status.success(),
        "STATUS under warn on a read-only ledger: {}",
        describe(&out)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("STATUS") && err.contains("onLedgerError=warn"),
        "not on stderr: {err}"
    );
    let log = f.log();
    let new = &log[log_before.min(log.len())..];
    assert!(
        new.contains("the ledger cannot be written") && new.contains("onLedgerError=warn"),
        "not in the log file: {new:?}"
    );
    // Writable again: available, and nothing was recorded while it was not.
    let out = run_ok(std::process::Command::new(driver13()).args(status));
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    assert_eq!(f.record_files().len(), 1, "{:?}", f.record_files());
    f.del("c-before", "eth0", Some(&netns), None).unwrap();
}

// -----------------------------------------------------------------------------------------
// VERSION, STATUS, CHECK
// -----------------------------------------------------------------------------------------

#[test]
fn version_lists_the_five_supported_versions() {
    // No root: VERSION touches nothing.
    let env = vec![("CNI_COMMAND".to_string(), "VERSION".to_string())];
    let out = run_plugin(&env, br#"{"cniVersion":"1.0.0"}"#);
    assert!(out.status.success(), "{}", describe(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("VERSION JSON");
    let got: BTreeSet<&str> = v["supportedVersions"]
        .as_array()
        .unwrap_or_else(|| panic!("no supportedVersions: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let want: BTreeSet<&str> = SUPPORTED_VERSIONS.into_iter().collect();
    assert_eq!(got, want);
    assert!(v["cniVersion"].is_string(), "{v}");
}

#[test]
fn status_succeeds_on_a_writable_ledger() {
    require_root!();
    let f = Fixture::ledger_only();
    let stdin = serde_json::to_vec(&f.plugin_stdin("1.1.0")).unwrap();
    // Not created yet, but creatable.
    let out = f.run_plugin(&f.status_env(), &stdin);
    assert!(
        out.status.success(),
        "STATUS before first ADD: {}",
        describe(&out)
    );
    let ns = Netns::new();
    f.add("c-st", "eth0", Some(&ns.path_str()), None).unwrap();
    let out = f.run_plugin(&f.status_env(), &stdin);
    assert!(out.status.success(), "STATUS after ADD: {}", describe(&out));
    assert_eq!(f.record_files().len(), 1, "STATUS changed the records");
}

#[test]
fn check_errors_without_a_record() {
    require_root!();
    let f = Fixture::ledger_only();
    let ns = Netns::new();
    let netns = ns.path_str();
    let mut stdin = f.plugin_stdin("1.0.0");
    stdin["prevResult"] = json!({"cniVersion": "1.0.0"});
    let stdin = serde_json::to_vec(&stdin).unwrap();
    let check = f.plugin_env("CHECK", "c-chk", "eth0", Some(&netns));

    let out = f.run_plugin(&check, &stdin);
    assert!(
        !out.status.success(),
        "CHECK without a record succeeded: {}",
        describe(&out)
    );
    assert_eq!(cni_error_code(&out), 3, "{}", describe(&out));
    assert!(
        f.check("c-chk", "eth0", Some(&netns), None).is_err(),
        "libcni CHECK without ADD"
    );

    f.add("c-chk", "eth0", Some(&netns), None).expect("ADD");
    let out = f.run_plugin(&check, &stdin);
    assert!(
        out.status.success(),
        "CHECK with a record: {}",
        describe(&out)
    );
    f.check("c-chk", "eth0", Some(&netns), None)
        .expect("libcni CHECK after ADD");

    f.del("c-chk", "eth0", Some(&netns), None).expect("DEL");
    let out = f.run_plugin(&check, &stdin);
    assert!(
        !out.status.success(),
        "CHECK after DEL succeeded: {}",
        describe(&out)
    );
    assert_eq!(cni_error_code(&out), 3, "{}", describe(&out));
}

// -----------------------------------------------------------------------------------------
// ADD's output, DEL without a namespace, capability union
// -----------------------------------------------------------------------------------------

#[test]
fn add_prints_prev_result_unchanged_or_an_empty_result_in_the_requested_version() {
    require_root!();
    let f = Fixture::ledger_only();
    let ns = Netns::new();
    let netns = ns.path_str();
    for (i, v) in SUPPORTED_VERSIONS.iter().enumerate() {
        let cid = format!("c-v{i}");
        let out = f.run_plugin(
            &f.plugin_env("ADD", &cid, "eth0", Some(&netns)),
            &serde_json::to_vec(&f.plugin_stdin(v)).unwrap(),
        );
        assert!(
            out.status.success(),
            "ADD cniVersion {v}: {}",
            describe(&out)
        );
        let res: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("ADD {v} printed no JSON ({e}): {}", describe(&out)));
        assert_eq!(res["cniVersion"], json!(v), "result version: {res}");
        assert!(
            res["ips"].as_array().is_none_or(|a| a.is_empty()),
            "not empty: {res}"
        );
        assert!(
            res["interfaces"].as_array().is_none_or(|a| a.is_empty()),
            "not empty: {res}"
        );
    }
    let prev = json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "mac": "0a:58:c6:12:00:05", "sandbox": netns}],
        "ips": [{"address": "198.18.0.5/24", "gateway": "198.18.0.1", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {"nameservers": ["198.18.0.1"]}
    });
    let mut stdin = f.plugin_stdin("1.0.0");
    stdin["prevResult"] = prev.clone();
    let out = f.run_plugin(
        &f.plugin_env("ADD", "c-prev", "eth0", Some(&netns)),
        &serde_json::to_vec(&stdin).unwrap(),
    );
    assert!(
        out.status.success(),
        "ADD with prevResult: {}",
        describe(&out)
    );
    let res: Value = serde_json::from_slice(&out.stdout).expect("result JSON");
    assert_eq!(res, prev, "prevResult not passed through unchanged");
    assert_eq!(f.record_files().len(), SUPPORTED_VERSIONS.len() + 1);
}

#[test]
fn del_succeeds_and_drops_the_record_when_the_namespace_is_gone() {
    require_root!();
    let f = Fixture::new();
    let mut ns = Netns::new();
    let netns = ns.path_str();
    f.add("c-gone", "eth0", Some(&netns), None).expect("ADD");
    ns.delete();
    // libcni still passes the (now dangling) path, as runtimes do.
    f.del("c-gone", "eth0", Some(&netns), None)
        .expect("DEL with the netns gone");
    assert!(f.record_files().is_empty(), "{:?}", f.record_files());
    assert!(f.ipam_addresses().is_empty(), "bridge did not release IPAM");
    // And directly, with CNI_NETNS naming a path that does not exist.
    let out = f.run_plugin(
        &f.plugin_env("DEL", "c-gone", "eth0", Some(&netns)),
        &serde_json::to_vec(&f.plugin_stdin("1.0.0")).unwrap(),
    );
    assert!(out.status.success(), "{}", describe(&out));
}

#[test]
fn add_warns_when_a_later_plugin_declares_a_capability_the_ledger_does_not() {
    require_root!();
    // The ledger's entry declares no capabilities although portmap declares portMappings.
    let spec = ChainSpec::full().with_ledger_opt("capabilities", json!({}));
    let f = Fixture::with_spec(spec);
    let ns = Netns::new();
    f.add(
        "c-cap",
        "eth0",
        Some(&ns.path_str()),
        Some(&port_mappings(8080)),
    )
    .expect("ADD");
    let log = f.log();
    assert!(
        log.lines()
            .any(|l| l.contains("portMappings") && l.to_lowercase().contains("warn")),
        "no warning naming portMappings in {}:\n{log}",
        f.log_file.display()
    );
    // libcni gave the ledger nothing it did not declare.
    let row = f.list_row("c-cap", "eth0").expect("record");
    assert!(
        row["runtimeConfig"].get("portMappings").is_none(),
        "{row:#}"
    );
}

// -----------------------------------------------------------------------------------------
// The process's start (src/main.rs is C's entry point, src/process.rs does what std's did)
// -----------------------------------------------------------------------------------------

/// An ADD run with stderr closed: its warning (no namespace at the path) goes nowhere;
/// the lock file it holds meanwhile is not handed descriptor 2 to receive it.
#[test]
fn add_with_stderr_closed_writes_its_warning_into_no_ledger_file() {
    require_root!();
    let tmp = tempfile::tempdir().unwrap();
    let ledger = tmp.path().join("ledger");
    let stdin = json!({"cniVersion": "1.0.0", "name": "n", "type": "cni-ledger",
        "logLevel": "warn",
        "ledgerDir": ledger, "confDir": tmp.path()})
    .to_string();
    let mut child = std::process::Command::new("sh")
        .args(["-c", r#"exec "$0" 2>&-"#])
        .arg(ledger_bin())
        .envs([
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "closed-stdout"),
            ("CNI_NETNS", "/nonexistent"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/usr/lib/cni"),
        ])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    let verify = std::process::Command::new(ledger_bin())
        .args(["verify", "--ledger-dir"])
        .arg(&ledger)
        .output()
        .unwrap();
    assert!(verify.status.success(), "{verify:?}");
    for entry in walk(&ledger) {
        let bytes = fs::read(&entry).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains("\"dns\"") && !text.contains("without identity"),
            "{} received output meant for stdout or stderr: {}",
            entry.display(),
            String::from_utf8_lossy(&bytes)
        );
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A runtime that closed its end of our stdout gets an exit code, not a process killed by
/// SIGPIPE, as under std's start.
#[test]
fn a_closed_stdout_pipe_is_an_error_not_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = std::process::Command::new(ledger_bin())
        .env("CNI_COMMAND", "VERSION")
        .stdin(std::process::Stdio::piped())
        .stdout(writer)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    use std::io::Write;
    let _ = child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"cniVersion":"1.0.0"}"#);
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), None, "{status:?}");
    assert!(!status.success(), "{status:?}");
}
