//! The fast tier: no root, no network, no namespace of its own. The plugin runs
//! in-process through `cni_ledger::plugin::run_with` (env, stdin and stdout passed in,
//! as libcni's `testutils.CmdAdd` drives a Go plugin) over a ledger in a temp dir. The
//! only other binary is Debian's real `host-local` (containernetworking-plugins), which
//! needs no root either: gc replays its DEL, which releases the address it reserved.
//!
//! What the tier cannot have without root is a namespace of its own: a namespace a
//! normal user can read is a child process's (`/proc/<pid>/ns/net`), and the path no
//! one can read is one under a `0000` directory.
//!
//! Run it: `cargo test --features testing --test inprocess` (as any user).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::inproc::{cni_error, host_local_bin, Pod, World};
use serde_json::{json, Value};
use std::fs;

const LATEST: &str = "1.1.0";
const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

// ---------------------------------------------------------------------------------------
// VERSION and the errors every command answers before it reaches the ledger
// ---------------------------------------------------------------------------------------

/// A relative `ledgerDir`, `logFile` or `confDir` is refused at ADD with error 7 naming
/// the key, before anything is made in the runtime's working directory (ADD used to
/// create the ledger there, then fail). Other commands log to stderr rather than to a
/// relative log file.
#[test]
fn relative_paths_are_refused_at_add_and_nothing_is_made_in_the_cwd() {
    let w = World::new();
    let rel = format!("cl-rel-{}", std::process::id());
    assert!(!std::path::Path::new(&rel).exists());
    for key in ["ledgerDir", "logFile", "confDir"] {
        let mut conf = w.conf("1.0.0");
        conf[key] = json!(format!("{rel}/x"));
        conf["logLevel"] = json!("debug");
        let e = cni_error(&w.add("c1", &conf), 7);
        assert_eq!(
            e["details"],
            json!(format!("{key} must be an absolute path, not \"{rel}/x\"")),
            "{e}"
        );
        let made = std::path::Path::new(&rel).exists();
        let _ = fs::remove_dir_all(&rel);
        assert!(!made, "{key}: ADD made {rel} in the working directory");
    }
    assert!(!w.ledger.exists(), "nothing written");
    let mut conf = w.conf("1.0.0");
    conf["logFile"] = json!(format!("{rel}.log"));
    conf["logLevel"] = json!("debug");
    w.verb("DEL", "c1", &conf).assert_quiet_success();
    let made = std::path::Path::new(&format!("{rel}.log")).exists();
    let _ = fs::remove_file(format!("{rel}.log"));
    assert!(!made, "DEL wrote a log file in the working directory");
}

/// A `ledgerDir` of `/` (the ledger's dirs over the node's root) or with a `..` is refused
/// at ADD with error 7 naming it, before anything is made.
#[test]
fn a_ledger_dir_of_root_or_with_dot_dot_is_refused_at_add() {
    let w = World::new();
    let parent = w.ledger.parent().unwrap().to_path_buf();
    // The `..` first: without the check it makes a ledger in the temp dir, not in `/`.
    for (dir, must) in [
        (
            format!("{}/x/..", parent.display()),
            "a path without \"..\"",
        ),
        ("/".to_string(), "a directory of its own"),
        ("//".to_string(), "a directory of its own"),
    ] {
        let mut conf = w.conf("1.0.0");
        conf["ledgerDir"] = json!(dir);
        let e = cni_error(&w.add("c1", &conf), 7);
        assert_eq!(
            e["details"],
            json!(format!("ledgerDir must be {must}, not {dir:?}")),
            "{e}"
        );
    }
    assert!(!parent.join("records").exists(), "ADD made a ledger");
    assert!(!parent.join("x").exists(), "ADD made a ledger");
}

/// Numbers beyond their documented maxima are refused at parse with error 7 naming the
/// key, on every command (issue #30: `gcBudgetSecs` 18446744073709551615 used to
/// overflow the GC verb's deadline, a panic answered as code 999). Nothing is written.
#[test]
fn out_of_range_numbers_are_refused_naming_the_key() {
    let w = World::new();
    let cases = [
        ("GC", "gcBudgetSecs", u64::MAX),
        ("GC", "gcBudgetSecs", 3601),
        ("ADD", "gcBudgetSecs", u64::MAX),
        ("ADD", "lockTimeoutMs", u64::MAX),
        ("DEL", "lockTimeoutMs", 3_600_001),
        ("GC", "gcGraceSecs", u64::MAX),
    ];
    for (cmd, key, v) in cases {
        let mut conf = w.conf("1.1.0");
        conf[key] = json!(v);
        let a = if cmd == "GC" {
            conf["cni.dev/valid-attachments"] = json!([]);
            w.call(&[("CNI_COMMAND", "GC")], conf.to_string().as_bytes())
        } else {
            w.verb(cmd, "c1", &conf)
        };
        let e = cni_error(&a, 7);
        let details = e["details"].as_str().unwrap_or_default();
        assert!(
            details.starts_with(&format!("{key} must be at most "))
                && details.ends_with(&format!("not {v}")),
            "{cmd} {key}={v}: {a}"
        );
    }
    assert!(!w.ledger.exists(), "nothing written");
    // The maxima themselves are accepted.
    let mut conf = w.conf("1.1.0");
    conf["gcBudgetSecs"] = json!(3600);
    conf["lockTimeoutMs"] = json!(3_600_000);
    conf["cni.dev/valid-attachments"] = json!([]);
    w.call(&[("CNI_COMMAND", "GC")], conf.to_string().as_bytes())
        .assert_quiet_success();
}

#[test]
fn version_needs_no_env_or_config_and_answers_in_the_asked_version() {
    let w = World::new();
    for (stdin, answered) in [
        (&b"not json"[..], LATEST),
        (br#"{"cniVersion":"0.4.0"}"#, "0.4.0"),
        (br#"{"cniVersion":"0.2.0"}"#, LATEST),
    ] {
        let a = w.call(&[("CNI_COMMAND", "VERSION")], stdin);
        assert_eq!(a.status, 0, "{a}");
        assert_eq!(
            a.json(),
            json!({"cniVersion": answered, "supportedVersions": SUPPORTED}),
            "{a}"
        );
    }
    assert!(!w.ledger.exists(), "VERSION touches no ledger");
}

/// Every refusal is one CNI error object on stdout (`cniVersion`, `code`, `msg` and,
/// when there is more to say, `details`), exit status 1, and nothing written.
#[test]
fn bad_requests_get_the_spec_codes_and_write_nothing() {
    let w = World::new();
    let conf = |v: Value| v.to_string().into_bytes();
    let good = w.conf("1.0.0");
    let with = |k: &str, v: Value| {
        let mut c = good.clone();
        c[k] = v;
        conf(c)
    };
    let add = w.env("ADD", "c1", "eth0", "/no/such/netns");
    let without = |name: &str| -> Vec<(String, String)> {
        add.iter().filter(|(k, _)| k != name).cloned().collect()
    };
    let set = |name: &str, val: &str| -> Vec<(String, String)> {
        let mut e = without(name);
        e.push((name.to_string(), val.to_string()));
        e
    };
    let big = vec![b' '; (1 << 20) + 1];
    // (what, env, stdin, code, cniVersion of the answer)
    type Case<'a> = (&'a str, Vec<(String, String)>, Vec<u8>, u64, &'a str);
    let cases: Vec<Case> = vec![
        (
            "unknown command",
            set("CNI_COMMAND", "ATTACH"),
            conf(good.clone()),
            4,
            LATEST,
        ),
        (
            "lower-case command",
            set("CNI_COMMAND", "add"),
            conf(good.clone()),
            4,
            LATEST,
        ),
        (
            "no container ID",
            without("CNI_CONTAINERID"),
            conf(good.clone()),
            3,
            LATEST,
        ),
        (
            "no netns on ADD",
            without("CNI_NETNS"),
            conf(good.clone()),
            4,
            LATEST,
        ),
        (
            "no ifname",
            without("CNI_IFNAME"),
            conf(good.clone()),
            4,
            LATEST,
        ),
        (
            "no CNI_PATH",
            without("CNI_PATH"),
            conf(good.clone()),
            4,
            LATEST,
        ),
        (
            "container ID with a slash",
            set("CNI_CONTAINERID", "../c1"),
            conf(good.clone()),
            4,
            LATEST,
        ),
        (
            "ifname with a slash",
            set("CNI_IFNAME", "a/b"),
            conf(good.clone()),
            4,
            LATEST,
        ),
        (
            "ifname too long",
            set("CNI_IFNAME", "abcdefghijklmnop"),
            conf(good.clone()),
            4,
            LATEST,
        ),
        (
            "undecodable stdin",
            add.clone(),
            b"{\"cniVersion\":".to_vec(),
            6,
            LATEST,
        ),
        (
            "stdin not an object",
            add.clone(),
            b"[]".to_vec(),
            6,
            LATEST,
        ),
        ("stdin over 1 MiB", add.clone(), big, 6, LATEST),
        (
            "no network name",
            add.clone(),
            conf(json!({"cniVersion": "1.0.0", "type": "cni-ledger"})),
            7,
            LATEST,
        ),
        (
            "network name with a slash",
            add.clone(),
            with("name", json!("a/b")),
            7,
            LATEST,
        ),
        (
            "unknown logLevel",
            add.clone(),
            with("logLevel", json!("verbose")),
            7,
            LATEST,
        ),
        (
            "gcBudgetSecs 0",
            add.clone(),
            with("gcBudgetSecs", json!(0)),
            7,
            LATEST,
        ),
        (
            "returnDevices not an object",
            add.clone(),
            with("returnDevices", json!("yes")),
            7,
            LATEST,
        ),
        (
            "unsupported cniVersion",
            add.clone(),
            with("cniVersion", json!("0.2.0")),
            1,
            LATEST,
        ),
        (
            "no cniVersion (0.1.0)",
            add.clone(),
            conf(json!({"name": "n", "type": "cni-ledger"})),
            1,
            LATEST,
        ),
        (
            "CHECK before 0.4.0",
            set("CNI_COMMAND", "CHECK"),
            with("cniVersion", json!("0.3.1")),
            1,
            "0.3.1",
        ),
    ];
    for (what, env, stdin, code, version) in cases {
        let a = w.call_owned(&env, &stdin);
        let e = cni_error(&a, code);
        assert_eq!(e["cniVersion"], json!(version), "{what}: {a}");
    }
    for cmd in ["STATUS", "GC"] {
        let a = w.call(&[("CNI_COMMAND", cmd)], &conf(w.conf("1.0.0")));
        let e = cni_error(&a, 1);
        assert_eq!(e["cniVersion"], json!("1.0.0"), "{cmd} needs 1.1.0: {a}");
    }
    assert!(!w.ledger.exists(), "a refused request creates no ledger");
}

// ---------------------------------------------------------------------------------------
// ADD
// ---------------------------------------------------------------------------------------

#[test]
fn add_writes_a_durable_record_with_every_field_and_a_snapshot_of_the_chain() {
    common::root::require_ledger_trust!();
    let w = World::new();
    let conflist = w.write_conflist(&[w.host_local_entry("10.90.1.0/24")]);
    let pod = Pod::spawn();
    let mut conf = w.conf("1.0.0");
    conf["runtimeConfig"] =
        json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]});
    let mut env = w.env("ADD", "c1", "eth0", &pod.netns());
    env.push((
        "CNI_ARGS".into(),
        "K8S_POD_NAME=web;K8S_POD_NAMESPACE=default".into(),
    ));
    let before = now_unix();
    let a = w.call_owned(&env, conf.to_string().as_bytes());
    assert_eq!(a.status, 0, "{a}");
    assert_eq!(
        a.json(),
        json!({"cniVersion": "1.0.0", "dns": {}}),
        "no prevResult: an empty result"
    );

    let file = w.record_file("c1", "eth0");
    assert_eq!(common::mode_of(&file), 0o600);
    for dir in [
        &w.ledger,
        &w.ledger.join("records"),
        &w.ledger.join("snapshots"),
    ] {
        assert_eq!(common::mode_of(dir), 0o700, "{}", dir.display());
    }
    let rec = w.record("c1", "eth0").expect("a record after ADD");
    let keys: Vec<&str> = rec
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "network",
            "containerId",
            "ifname",
            "netns",
            "netnsId",
            "bootId",
            "cniArgs",
            "cniPath",
            "cniVersion",
            "runtimeConfig",
            "ledgerType",
            "snapshot",
            "confFile",
            "createdAt",
            "createdBootSecs",
            "createdBootNs",
            "addId"
        ],
        "{rec}"
    );
    assert_eq!(rec["network"], json!(w.network));
    assert_eq!(rec["containerId"], json!("c1"));
    assert_eq!(rec["ifname"], json!("eth0"));
    assert_eq!(rec["netns"], json!(pod.netns()));
    assert_eq!(rec["bootId"], json!(common::boot_id()));
    assert_eq!(
        rec["cniArgs"],
        json!("K8S_POD_NAME=web;K8S_POD_NAMESPACE=default")
    );
    assert_eq!(rec["cniPath"], json!(w.cni_path()));
    assert_eq!(rec["cniVersion"], json!("1.0.0"));
    assert_eq!(rec["runtimeConfig"], conf["runtimeConfig"]);
    assert_eq!(rec["ledgerType"], json!("cni-ledger"));
    assert_eq!(rec["confFile"], json!(conflist.display().to_string()));
    assert!(
        rec["addId"].as_str().is_some_and(|s| !s.is_empty()),
        "{rec}"
    );
    assert!(rec["createdBootSecs"].as_u64().is_some(), "{rec}");
    // The head's start on the boot clock, in ns (docs/CHAIN.md): the same instant.
    let ns = rec["createdBootNs"].as_u64().expect("createdBootNs");
    assert_eq!(
        ns / 1_000_000_000,
        rec["createdBootSecs"].as_u64().unwrap(),
        "{rec}"
    );
    assert!(rec.get("tail").is_none(), "no tail in this chain: {rec}");
    let created = common::inproc::parse_rfc3339(rec["createdAt"].as_str().unwrap());
    assert!(
        (before - 1..=now_unix() + 1).contains(&created),
        "createdAt {} is now",
        rec["createdAt"]
    );

    // The pod's namespace, as a normal user can see one: its identity is the file's.
    let id = &rec["netnsId"];
    let (dev, ino) = pod.ns_dev_ino();
    assert_eq!(
        (id["dev"].as_u64(), id["ino"].as_u64()),
        (Some(dev), Some(ino)),
        "{rec}"
    );
    assert!(
        id["pidStart"].as_u64().is_some(),
        "a /proc/<pid>/ path records its start: {rec}"
    );

    // The snapshot is the exact conflist bytes, named by their hash.
    let hash = rec["snapshot"].as_str().expect("a snapshot");
    let snap = w.ledger.join("snapshots").join(format!("{hash}.json"));
    assert_eq!(fs::read(&snap).unwrap(), fs::read(&conflist).unwrap());
    assert_eq!(common::sha256_hex(&snap), hash);
    assert_eq!(common::mode_of(&snap), 0o600);
}

/// ADD remembers a settled conflist instead of reloading it (src/plugin/conf_memo.rs);
/// what it records must be what a full load would give, before and after an edit that
/// keeps the file's inode and size.
#[test]
fn add_records_the_chain_as_it_is_now_when_the_conflist_is_remembered() {
    common::root::require_ledger_trust!();
    let w = World::new();
    let tail = json!({"type": "cni-ledger", "role": "tail", "ledgerDir": w.ledger});
    let conflist = w.write_conflist(&[w.host_local_entry("10.90.7.0/24"), tail]);
    // Older than the memo's settling time, as a node's conflist is.
    std::thread::sleep(std::time::Duration::from_millis(3300));
    let memo = || {
        let prefix = format!(".conf-memo.{}.", w.network);
        fs::read_dir(w.ledger.join("snapshots"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&prefix)
            })
            .expect("the settled conflist remembered")
    };
    let snapshot_of = |cid: &str| {
        let rec = w.record(cid, "eth0").expect("a record after ADD");
        assert_eq!(rec["tail"], json!(true), "{rec}");
        assert_eq!(rec["confFile"], json!(conflist.display().to_string()));
        let hash = rec["snapshot"].as_str().unwrap().to_string();
        fs::read_to_string(w.ledger.join("snapshots").join(format!("{hash}.json"))).unwrap()
    };

    let a = w.add("c1", &w.conf("1.0.0"));
    assert_eq!(a.status, 0, "{a}");
    assert_eq!(snapshot_of("c1"), fs::read_to_string(&conflist).unwrap());
    let remembered = fs::metadata(memo()).unwrap();
    let a = w.add("c2", &w.conf("1.0.0"));
    assert_eq!(a.status, 0, "{a}");
    assert_eq!(snapshot_of("c2"), fs::read_to_string(&conflist).unwrap());
    assert_eq!(
        fs::metadata(memo()).unwrap().modified().unwrap(),
        remembered.modified().unwrap(),
        "the memo was recalled, not written again"
    );

    // Edited in place: same inode, same size, another subnet.
    let edited = fs::read_to_string(&conflist)
        .unwrap()
        .replace("10.90.7.0", "10.90.8.0");
    fs::OpenOptions::new()
        .write(true)
        .open(&conflist)
        .and_then(|mut f| std::io::Write::write_all(&mut f, edited.as_bytes()))
        .unwrap();
    let a = w.add("c3", &w.conf("1.0.0"));
    assert_eq!(a.status, 0, "{a}");
    assert_eq!(snapshot_of("c3"), edited);
}

#[test]
fn add_passes_prev_result_through_unchanged_in_every_version() {
    common::root::require_ledger_trust!();
    let w = World::new();
    for (i, version) in SUPPORTED.iter().enumerate() {
        // Fields the ledger knows nothing about, in an order it must keep.
        let prev = json!({
            "cniVersion": version,
            "zeta": [3, 1, 2],
            "interfaces": [{"name": "eth0", "mac": "0a:58:0a:00:00:02", "sandbox": "/x"}],
            "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}],
            "alpha": {"nested": null, "n": 1.5},
            "dns": {"nameservers": ["10.0.0.10"]}
        });
        let mut conf = w.conf(version);
        conf["prevResult"] = prev.clone();
        let cid = format!("c{i}");
        let a = w.add(&cid, &conf);
        assert_eq!(a.status, 0, "{version}: {a}");
        assert_eq!(
            a.out,
            format!("{prev}\n"),
            "{version}: byte for byte, one line"
        );
        assert!(w.record(&cid, "eth0").is_some(), "{version}");
        // Without one: an empty result of the asked version.
        conf.as_object_mut().unwrap().remove("prevResult");
        let a = w.add(&format!("e{i}"), &conf);
        assert_eq!(
            a.json(),
            json!({"cniVersion": version, "dns": {}}),
            "{version}"
        );
    }
}

#[test]
fn add_over_an_unwritable_ledger_fails_with_5_unless_told_to_warn() {
    let w = World::new();
    let blocker = w.dir.path().join("a-file");
    fs::write(&blocker, b"").unwrap();
    let mut conf = w.conf("1.0.0");
    conf["ledgerDir"] = json!(blocker.join("ledger"));
    conf["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]});
    let a = w.add("c1", &conf);
    let e = cni_error(&a, 5);
    assert!(e["msg"].as_str().unwrap().contains("ledger"), "{a}");
    conf["onLedgerError"] = json!("warn");
    let a = w.add("c1", &conf);
    assert_eq!(a.status, 0, "{a}");
    assert_eq!(
        a.json(),
        conf["prevResult"],
        "warn: the result goes on unchanged"
    );
}

/// A netns path nobody may look into (root can; then it is no namespace file): the
/// record is written all the same, without an identity, and so is never proved stale
/// by one. A missing path and a plain file are recorded the same way.
#[test]
fn add_records_no_identity_for_an_unreadable_missing_or_non_namespace_path() {
    common::root::require_ledger_trust!();
    let w = World::new();
    let closed = w.dir.path().join("closed");
    fs::create_dir(&closed).unwrap();
    fs::write(closed.join("netns"), b"").unwrap();
    common::set_mode(&closed, 0o000);
    let plain = w.dir.path().join("plain");
    fs::write(&plain, b"not a namespace").unwrap();
    let paths = [
        closed.join("netns").display().to_string(),
        w.dir.path().join("gone").display().to_string(),
        plain.display().to_string(),
    ];
    for (i, netns) in paths.iter().enumerate() {
        let cid = format!("c{i}");
        let a = w.call_owned(
            &w.env("ADD", &cid, "eth0", netns),
            w.conf("1.0.0").to_string().as_bytes(),
        );
        assert_eq!(a.status, 0, "{netns}: {a}");
        let rec = w.record(&cid, "eth0").expect("recorded");
        assert_eq!(rec["netns"], json!(netns));
        assert_eq!(rec["netnsId"], Value::Null, "{netns}: {rec}");
        assert_eq!(
            rec["snapshot"],
            Value::Null,
            "no conflist in confDir: {rec}"
        );
    }
    common::set_mode(&closed, 0o700);
}

// ---------------------------------------------------------------------------------------
// DEL and CHECK
// ---------------------------------------------------------------------------------------

#[test]
fn del_drops_the_record_and_a_del_of_nothing_succeeds() {
    common::root::require_ledger_trust!();
    let w = World::new();
    // No ledger at all yet: DEL succeeds and creates none.
    let a = w.del("c1");
    a.assert_quiet_success();
    assert!(!w.ledger.exists(), "DEL created a ledger");

    assert_eq!(w.add("c1", &w.conf("1.0.0")).status, 0);
    assert_eq!(w.add("c2", &w.conf("1.0.0")).status, 0);
    w.del("c1").assert_quiet_success();
    assert!(w.record("c1", "eth0").is_none(), "dropped on DEL");
    assert!(
        w.record("c2", "eth0").is_some(),
        "another attachment's record stays"
    );
    // Again, and for an attachment never added: DEL is idempotent.
    w.del("c1").assert_quiet_success();
    w.del("never").assert_quiet_success();
    // DEL needs no namespace (the runtime may have lost it).
    let mut env = w.env("DEL", "c2", "eth0", "");
    env.retain(|(k, _)| k != "CNI_NETNS");
    w.call_owned(&env, w.conf("1.0.0").to_string().as_bytes())
        .assert_quiet_success();
    assert!(w.record("c2", "eth0").is_none());
    assert_eq!(w.quarantined(), Vec::<String>::new());
}

#[test]
fn check_answers_from_the_record() {
    common::root::require_ledger_trust!();
    let w = World::new();
    let conf = w.conf("1.0.0");
    let e = cni_error(&w.verb("CHECK", "c1", &conf), 3);
    assert_eq!(e["details"], json!(format!("{}/c1/eth0", w.network)));
    assert_eq!(w.add("c1", &conf).status, 0);
    w.verb("CHECK", "c1", &conf).assert_quiet_success();
    // A damaged record is an I/O error for CHECK, which leaves it where it is.
    w.damage("c1", "eth0");
    let damaged = fs::read(w.record_file("c1", "eth0")).unwrap();
    let e = cni_error(&w.verb("CHECK", "c1", &conf), 5);
    assert!(
        e["msg"].as_str().unwrap().contains("checksum-mismatch"),
        "{e}"
    );
    assert_eq!(fs::read(w.record_file("c1", "eth0")).unwrap(), damaged);
    assert!(w.quarantined().is_empty(), "CHECK quarantines nothing");
    // Gone after DEL.
    w.del("c1").assert_quiet_success();
    cni_error(&w.verb("CHECK", "c1", &conf), 3);
}

/// DEL of an attachment whose record is damaged succeeds (the chain has torn it down)
/// and moves the file, byte for byte, to quarantine instead of dropping it unseen.
#[test]
fn del_quarantines_a_damaged_record_and_keeps_its_bytes() {
    common::root::require_ledger_trust!();
    let w = World::new();
    assert_eq!(w.add("c1", &w.conf("1.0.0")).status, 0);
    w.damage("c1", "eth0");
    let bytes = fs::read(w.record_file("c1", "eth0")).unwrap();
    w.del("c1").assert_quiet_success();
    assert!(!w.record_file("c1", "eth0").exists());
    let q = w.quarantined();
    assert_eq!(q.len(), 1, "{q:?}");
    let stem = format!("{}:c1:eth0.json.", w.network);
    assert!(q[0].starts_with(&stem), "{q:?}");
    assert!(
        q[0][stem.len()..].parse::<u64>().is_ok(),
        "suffix is unix seconds: {q:?}"
    );
    assert_eq!(
        fs::read(w.ledger.join("quarantine").join(&q[0])).unwrap(),
        bytes
    );
}

// ---------------------------------------------------------------------------------------
// STATUS
// ---------------------------------------------------------------------------------------

#[test]
fn status_is_available_only_while_the_ledger_can_be_written() {
    let w = World::new();
    let status = |conf: &Value| w.call(&[("CNI_COMMAND", "STATUS")], conf.to_string().as_bytes());
    status(&w.conf(LATEST)).assert_quiet_success();
    assert!(
        w.ledger.join("records").is_dir(),
        "STATUS made the ledger it probed"
    );
    let names: Vec<String> = common::list_dir(&w.ledger.join("records"));
    assert!(names.is_empty(), "the probe file is gone: {names:?}");

    let blocker = w.dir.path().join("a-file");
    fs::write(&blocker, b"").unwrap();
    let mut conf = w.conf(LATEST);
    conf["ledgerDir"] = json!(blocker.join("ledger"));
    let e = cni_error(&status(&conf), 50);
    assert_eq!(e["msg"], json!("the ledger cannot be written"));
    assert!(e["details"].as_str().is_some_and(|d| !d.is_empty()), "{e}");

    // Under onLedgerError: warn ADD goes on without a record, and STATUS says what ADD
    // does: available (issue 37), or the runtime stops starting pods ADD would let through.
    conf["onLedgerError"] = json!("warn");
    status(&conf).assert_quiet_success();
    conf["onLedgerError"] = json!("fail");
    cni_error(&status(&conf), 50);
}

// ---------------------------------------------------------------------------------------
// GC (CNI 1.1): the runtime names the valid attachments, the rest is replayed
// ---------------------------------------------------------------------------------------

/// Three attachments made by the real chain [cni-ledger, host-local]: the one the
/// runtime still lists keeps its record and its address; the two it does not are
/// replayed through the recorded chain, so host-local releases their addresses, and
/// their records go. Another network's record is not this GC's business.
#[test]
fn gc_replays_del_for_attachments_not_in_the_valid_list_and_keeps_the_valid_ones() {
    common::root::require_ledger_trust!();
    let w = World::new();
    w.write_conflist(&[w.host_local_entry("10.90.2.0/24")]);
    let pod = Pod::spawn();
    let mut ips = Vec::new();
    for cid in ["keep", "drop1", "drop2"] {
        ips.push(w.add_through_chain(cid, &pod.netns()));
    }
    assert!(w.reserved_ips().contains(&ips[1]), "{ips:?}");
    let other = World::new_network_in(&w, "othernet");
    assert_eq!(other.add("o1", &other.conf(LATEST)).status, 0);

    let a = w.gc(json!([{"containerID": "keep", "ifname": "eth0"}]));
    a.assert_quiet_success();
    assert!(w.record("keep", "eth0").is_some());
    assert!(w.record("drop1", "eth0").is_none());
    assert!(w.record("drop2", "eth0").is_none());
    assert!(
        other.record("o1", "eth0").is_some(),
        "another network's record"
    );
    assert_eq!(
        w.reserved_ips(),
        vec![ips[0].clone()],
        "host-local released the dropped two"
    );

    // Same list again: nothing left to do, and still success.
    w.gc(json!([{"containerID": "keep", "ifname": "eth0"}]))
        .assert_quiet_success();
    // The older name of the list is read too; null (Go's empty slice) is "none valid".
    w.gc_with(
        "cni.dev/attachments",
        json!([{"containerID": "keep", "ifname": "eth0"}]),
    )
    .assert_quiet_success();
    assert!(w.record("keep", "eth0").is_some());
    w.gc(Value::Null).assert_quiet_success();
    assert!(w.record("keep", "eth0").is_none(), "not listed: replayed");
    assert!(w.reserved_ips().is_empty());
}

/// The GC verb reads its list strictly (SPEC.md's GC section: the runtime must send the
/// still-valid attachments): a `null` under one name never shadows the list under the
/// other, and a request with no list at all judges nothing and is refused with error 7.
#[test]
fn gc_verb_reads_its_list_strictly() {
    common::root::require_ledger_trust!();
    let w = World::new();
    w.write_conflist(&[w.host_local_entry("10.90.5.0/24")]);
    let pod = Pod::spawn();
    let keep = w.add_through_chain("keep", &pod.netns());
    let drop = w.add_through_chain("drop", &pod.netns());
    let gc_raw = |extra: Value| {
        let mut conf = w.conf("1.1.0");
        for (k, v) in extra.as_object().unwrap() {
            conf[k] = v.clone();
        }
        w.call(&[("CNI_COMMAND", "GC")], conf.to_string().as_bytes())
    };

    // Neither key: refused, and nothing judged.
    let e = cni_error(&gc_raw(json!({})), 7);
    assert_eq!(
        e["msg"],
        json!("GC without a valid-attachments list"),
        "{e}"
    );
    assert!(w.record("keep", "eth0").is_some() && w.record("drop", "eth0").is_some());
    assert_eq!(w.reserved_ips().len(), 2, "no DEL was replayed");

    // A null under the spec's name beside a list under the older one: the list counts.
    let listed = json!([{"containerID": "keep", "ifname": "eth0"}]);
    gc_raw(json!({"cni.dev/valid-attachments": null, "cni.dev/attachments": listed}))
        .assert_quiet_success();
    assert!(w.record("keep", "eth0").is_some(), "listed: live");
    assert!(w.record("drop", "eth0").is_none(), "unlisted: replayed");
    assert_eq!(w.reserved_ips(), vec![keep.clone()], "only {drop} released");

    // And the other way round.
    gc_raw(json!({"cni.dev/valid-attachments": listed, "cni.dev/attachments": null}))
        .assert_quiet_success();
    assert!(w.record("keep", "eth0").is_some());
    assert_eq!(w.reserved_ips(), vec![keep]);
}

/// A replay that fails keeps its record, counts an attempt, and the runtime gets error
/// 11 naming it; the others are cleaned all the same. A malformed list is error 7.
#[test]
fn gc_reports_what_it_could_not_clean_as_try_again_later() {
    common::root::require_ledger_trust!();
    let w = World::new();
    let blocker = w.dir.path().join("a-file");
    fs::write(&blocker, b"").unwrap();
    // host-local whose dataDir cannot exist: its DEL fails. Added by hand (its ADD
    // would fail the same way), as a record made while the chain was so configured.
    let mut broken = w.host_local_entry("10.90.3.0/24");
    broken["ipam"]["dataDir"] = json!(blocker.join("ipam"));
    w.write_conflist(&[broken]);
    assert_eq!(w.add("bad", &w.conf(LATEST)).status, 0);
    w.write_conflist(&[w.host_local_entry("10.90.3.0/24")]);
    let pod = Pod::spawn();
    w.add_through_chain("good", &pod.netns());

    let e = cni_error(&w.gc(json!([])), 11);
    assert_eq!(
        e["msg"],
        json!(format!(
            "GC of network {} could not clean 1 attachment(s); their records are kept for retry",
            w.network
        ))
    );
    let details = e["details"].as_str().unwrap();
    assert!(details.starts_with("bad/eth0: host-local: "), "{details}");
    let rec = w.record("bad", "eth0").expect("kept for retry");
    assert_eq!(rec["gc"]["attempts"], json!(1), "{rec}");
    assert!(w.record("good", "eth0").is_none(), "the other was cleaned");

    for bad in [json!("keep"), json!([{"containerID": 7}])] {
        let e = cni_error(&w.gc(bad.clone()), 7);
        assert_eq!(
            e["msg"],
            json!("invalid cni.dev/valid-attachments"),
            "{bad}"
        );
    }
}

/// gc never acts on a record it cannot trust: a damaged one is quarantined and its
/// chain is not run; one of a newer format is left in place for a newer cni-ledger, by
/// gc and by DEL alike, and CHECK takes it for a record.
#[test]
fn gc_quarantines_damaged_records_and_leaves_newer_formats_alone() {
    common::root::require_ledger_trust!();
    let w = World::new();
    w.write_conflist(&[w.host_local_entry("10.90.4.0/24")]);
    let pod = Pod::spawn();
    let ip = w.add_through_chain("dmg", &pod.netns());
    w.damage("dmg", "eth0");
    let damaged = fs::read(w.record_file("dmg", "eth0")).unwrap();
    let newer = w.record_file("new", "eth0");
    let newer_bytes = br#"{"format":2,"sha256":"","record":{"from":"the future"}}"#;
    fs::write(&newer, newer_bytes).unwrap();

    w.gc(json!([])).assert_quiet_success();
    assert!(!w.record_file("dmg", "eth0").exists());
    let q = w.quarantined();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(
        fs::read(w.ledger.join("quarantine").join(&q[0])).unwrap(),
        damaged
    );
    assert_eq!(
        w.reserved_ips(),
        vec![ip],
        "no DEL was replayed for the damaged record"
    );
    assert_eq!(
        fs::read(&newer).unwrap(),
        newer_bytes,
        "newer format: untouched"
    );
    // CHECK: it is recorded, if by a newer binary.
    w.verb("CHECK", "new", &w.conf("1.0.0"))
        .assert_quiet_success();
    // DEL of that attachment succeeds (every plugin before the head has torn it down)
    // and leaves the file whole: what a newer format asks of DEL is not known here.
    w.del("new").assert_quiet_success();
    assert_eq!(
        fs::read(&newer).unwrap(),
        newer_bytes,
        "newer format: DEL left it"
    );
}

// ---------------------------------------------------------------------------------------
// helpers of this file
// ---------------------------------------------------------------------------------------

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[test]
fn the_tier_has_what_it_needs() {
    // One clear failure, not a dozen confusing ones, when host-local is missing.
    let hl = host_local_bin();
    assert!(
        hl.is_file(),
        "{} is missing: install Debian's containernetworking-plugins",
        hl.display()
    );
}
