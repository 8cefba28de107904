//! Acceptance tests of `cni-ledger inject` (docs/DESIGN.md §3: the ledger listed first and
//! declaring exactly the union of the chain's capabilities) on the conflists in
//! testdata/conflists, then libcni loading and running the injected conflist. Needs root
//! (the libcni part creates namespaces, bridges and iptables rules).
//!
//!     cargo test --features testing --test inject

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::{json, Value};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/conflists")
        .join(name)
}

/// A private copy of a testdata conflist (mode 0644) in `dir`.
fn copy_in(dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    fs::copy(testdata(name), &to).unwrap_or_else(|e| panic!("copy {name}: {e}"));
    set_mode(&to, 0o644);
    to
}

/// `cni-ledger inject <args...>` (CLI face: no CNI_COMMAND).
fn inject(args: &[&str], files: &[&Path]) -> Output {
    let mut c = Command::new(ledger_bin());
    c.arg("inject")
        .args(args)
        .args(files)
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null());
    c.output().expect("run cni-ledger inject")
}

fn inject_ok(args: &[&str], file: &Path) -> Output {
    let out = inject(args, &[file]);
    assert!(
        out.status.success(),
        "inject {args:?} {}: {}",
        file.display(),
        describe(&out)
    );
    out
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&fs::read(p).unwrap())
        .unwrap_or_else(|e| panic!("{} is no longer JSON: {e}", p.display()))
}

fn types(doc: &Value) -> Vec<String> {
    doc["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect()
}

/// (bytes, mtime, inode, mode) of a file: equal means untouched.
fn file_state(p: &Path) -> (Vec<u8>, i64, i64, u64, u32) {
    let m = fs::metadata(p).unwrap();
    (
        fs::read(p).unwrap(),
        m.mtime(),
        m.mtime_nsec(),
        m.ino(),
        m.mode(),
    )
}

/// Nothing but the given names in the dir (no temp files left behind).
fn assert_dir_holds(dir: &Path, names: &[&str]) {
    let mut want: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(list_dir(dir), want, "unexpected files in {}", dir.display());
}

// -----------------------------------------------------------------------------------------
// the file transformations
// -----------------------------------------------------------------------------------------

#[test]
fn inject_with_capabilities_puts_the_ledger_first_declaring_the_union() {
    let tmp = TempDir::new("inj");
    let orig = fs::read(testdata("portmap.conflist")).unwrap();
    let f = copy_in(tmp.path(), "portmap.conflist");
    let out = inject_ok(&[], &f);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("injected"),
        "{}",
        describe(&out)
    );
    let doc = read_json(&f);
    // The head first, the tail (docs/CHAIN.md) last.
    assert_eq!(
        types(&doc),
        ["cni-ledger", "bridge", "portmap", "cni-ledger"]
    );
    assert_eq!(
        doc["plugins"][3],
        json!({"type": "cni-ledger", "role": "tail"})
    );
    assert_eq!(
        doc["plugins"][0],
        json!({"type": "cni-ledger", "capabilities": {"portMappings": true}})
    );
    // The rest of the document is untouched.
    let before: Value = serde_json::from_slice(&orig).unwrap();
    assert_eq!(
        doc["plugins"].as_array().unwrap()[1..3],
        before["plugins"].as_array().unwrap()[..]
    );
    assert_eq!(doc["name"], before["name"]);
    assert_eq!(doc["cniVersion"], before["cniVersion"]);
    assert_eq!(
        fs::metadata(&f).unwrap().mode() & 0o7777,
        0o644,
        "mode changed"
    );
    assert_dir_holds(tmp.path(), &["portmap.conflist"]);

    // Idempotent: a second run leaves the bytes (and the file) as they are.
    let once = file_state(&f);
    inject_ok(&[], &f);
    assert_eq!(file_state(&f), once, "second inject changed the file");

    // The union of several plugins' true capabilities, and only those.
    let m = copy_in(tmp.path(), "multi-caps.conflist");
    inject_ok(&[], &m);
    let doc = read_json(&m);
    assert_eq!(
        types(&doc),
        [
            "cni-ledger",
            "bridge",
            "tuning",
            "portmap",
            "bandwidth",
            "cni-ledger"
        ]
    );
    assert_eq!(
        doc["plugins"][0]["capabilities"],
        json!({"portMappings": true, "bandwidth": true}),
        "{doc:#}"
    );

    // --ledger-dir is written into the entry.
    let p = copy_in(tmp.path(), "plain.conflist");
    inject_ok(&["--ledger-dir", "/var/lib/other-ledger"], &p);
    assert_eq!(
        read_json(&p)["plugins"][0],
        json!({"type": "cni-ledger", "ledgerDir": "/var/lib/other-ledger"})
    );
}

#[test]
fn inject_without_capabilities_declares_none() {
    let tmp = TempDir::new("inj");
    let f = copy_in(tmp.path(), "plain.conflist");
    inject_ok(&[], &f);
    let doc = read_json(&f);
    assert_eq!(types(&doc), ["cni-ledger", "bridge", "cni-ledger"]);
    assert_eq!(doc["plugins"][0], json!({"type": "cni-ledger"}));
    assert!(doc["plugins"][0].get("capabilities").is_none());
    let once = file_state(&f);
    inject_ok(&[], &f);
    assert_eq!(file_state(&f), once, "second inject changed the file");
}

#[test]
fn already_injected_conflist_is_left_byte_identical() {
    let tmp = TempDir::new("inj");
    let f = copy_in(tmp.path(), "injected.conflist");
    let before = file_state(&f);
    let out = inject_ok(&[], &f);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unchanged"),
        "{}",
        describe(&out)
    );
    assert_eq!(file_state(&f), before, "an injected conflist was rewritten");

    // A ledger entry elsewhere in the chain is moved first, its options kept and its
    // capabilities recomputed (bridge declares none, so none remain).
    let l = copy_in(tmp.path(), "ledger-last.conflist");
    inject_ok(&[], &l);
    let doc = read_json(&l);
    assert_eq!(types(&doc), ["cni-ledger", "bridge", "cni-ledger"]);
    assert_eq!(
        doc["plugins"][0],
        json!({"type": "cni-ledger", "logFile": "/var/log/cni-ledger.log"})
    );
    let once = file_state(&l);
    inject_ok(&[], &l);
    assert_eq!(file_state(&l), once);
}

#[test]
fn single_plugin_conf_is_refused_and_untouched() {
    let tmp = TempDir::new("inj");
    let f = copy_in(tmp.path(), "single.conf");
    let before = file_state(&f);
    let out = inject(&[], &[&f]);
    assert_ne!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(out.status.code().is_some(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("single.conf") && err.contains("single-plugin") && err.contains("conflist"),
        "unclear refusal: {err}"
    );
    assert!(out.stdout.is_empty(), "{}", describe(&out));
    assert_eq!(file_state(&f), before, "refused file was modified");
    assert_dir_holds(tmp.path(), &["single.conf"]);

    // Also with --remove and --dry-run.
    for flag in ["--remove", "--dry-run"] {
        let out = inject(&[flag], &[&f]);
        assert_ne!(out.status.code(), Some(0), "{flag}: {}", describe(&out));
        assert_eq!(file_state(&f), before, "{flag}: refused file was modified");
    }
}

#[test]
fn remove_restores_the_original() {
    let tmp = TempDir::new("inj");
    for name in ["portmap.conflist", "plain.conflist", "multi-caps.conflist"] {
        let orig = fs::read(testdata(name)).unwrap();
        let f = copy_in(tmp.path(), name);
        inject_ok(&[], &f);
        assert_ne!(
            fs::read(&f).unwrap(),
            orig,
            "{name}: inject changed nothing"
        );
        let out = inject_ok(&["--remove"], &f);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("removed"),
            "{}",
            describe(&out)
        );
        assert_eq!(
            String::from_utf8_lossy(&fs::read(&f).unwrap()),
            String::from_utf8_lossy(&orig),
            "{name}: --remove did not restore the original bytes"
        );
        // Removing again is a no-op.
        let before = file_state(&f);
        inject_ok(&["--remove"], &f);
        assert_eq!(file_state(&f), before);
    }
    // An injected file from elsewhere: the ledger goes, the rest stays.
    let f = copy_in(tmp.path(), "injected.conflist");
    inject_ok(&["--remove"], &f);
    assert_eq!(
        read_json(&f),
        read_json(&testdata("portmap.conflist")),
        "--remove left more than the chain"
    );
}

#[test]
fn dry_run_prints_and_writes_nothing() {
    let tmp = TempDir::new("inj");
    let f = copy_in(tmp.path(), "portmap.conflist");
    let before = file_state(&f);
    let out = inject_ok(&["--dry-run"], &f);
    assert_eq!(file_state(&f), before, "--dry-run wrote the file");
    assert_dir_holds(tmp.path(), &["portmap.conflist"]);
    let printed: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("--dry-run printed no JSON ({e}): {}", describe(&out)));
    assert_eq!(
        types(&printed),
        ["cni-ledger", "bridge", "portmap", "cni-ledger"]
    );

    // What it printed is exactly what a real run writes.
    inject_ok(&[], &f);
    assert_eq!(fs::read(&f).unwrap(), out.stdout);

    // --remove --dry-run as well.
    let injected = file_state(&f);
    let out = inject_ok(&["--remove", "--dry-run"], &f);
    assert_eq!(
        file_state(&f),
        injected,
        "--remove --dry-run wrote the file"
    );
    assert_eq!(out.stdout, fs::read(testdata("portmap.conflist")).unwrap());
    assert_dir_holds(tmp.path(), &["portmap.conflist"]);
}

// -----------------------------------------------------------------------------------------
// libcni loads and runs the injected conflist
// -----------------------------------------------------------------------------------------

/// Writes testdata `name` with the fixture's bridge, dataDir and subnet as the fixture's
/// conflist (no ledger in it), then injects the ledger pointing at the fixture's ledger.
fn install_injected(f: &Fixture, name: &str) -> Vec<u8> {
    let text = fs::read_to_string(testdata(name))
        .unwrap()
        .replace("@BRIDGE@", &f.bridge)
        .replace("@DATADIR@", f.ipam_dir.to_str().unwrap())
        .replace("@SUBNET@", &f.subnet())
        .replace("@GATEWAY@", &f.gateway());
    fs::write(&f.conf_file, text).unwrap();
    // libcni loads it before the injection too (and sees no ledger).
    assert_eq!(f.load().unwrap(), types(&read_json(&f.conf_file)));
    inject_ok(
        &["--ledger-dir", f.ledger_dir.to_str().unwrap()],
        &f.conf_file,
    );
    fs::read(&f.conf_file).unwrap()
}

/// ADD through libcni; NETCONFPATH lets the ledger find (and snapshot) the conflist,
/// as the injected entry names no confDir.
fn add_with_netconfpath(f: &Fixture, cid: &str, ns: &Netns, cap: Option<&Value>) -> Value {
    let mut c = f.driver_cmd("add", cid, "eth0", Some(&ns.path_str()), cap);
    c.env("NETCONFPATH", &f.conf_dir);
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "ADD through libcni: {}",
        describe(&out)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn del_with_netconfpath(f: &Fixture, cid: &str, ns: &Netns, cap: Option<&Value>) {
    let mut c = f.driver_cmd("del", cid, "eth0", Some(&ns.path_str()), cap);
    c.env("NETCONFPATH", &f.conf_dir);
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "DEL through libcni: {}",
        describe(&out)
    );
}

#[test]
fn libcni_runs_the_injected_conflist_and_the_ledger_records_it() {
    require_root!();
    let f = Fixture::new();
    let bytes = install_injected(&f, "portmap.conflist");
    assert_eq!(
        f.load().unwrap(),
        ["cni-ledger", "bridge", "portmap", "cni-ledger"]
    );

    let ns = Netns::new();
    let cid = "c-inj";
    let cap = json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]});
    let res = add_with_netconfpath(&f, cid, &ns, Some(&cap));
    let ip = res["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    assert!(f.ipam_net_dir().join(&ip).exists());
    assert!(f.host.iptables_save().contains("--dport 8080"));

    // The ledger received the portMappings because inject declared the capability.
    let row = f.list_row(cid, "eth0").expect("the ledger recorded no ADD");
    assert_eq!(row["state"], json!("live"), "{row:#}");
    assert_eq!(
        row["runtimeConfig"]["portMappings"], cap["portMappings"],
        "{row:#}"
    );
    let snap = row["snapshot"]
        .as_str()
        .expect("no snapshot of the injected conflist");
    assert_eq!(
        snap,
        sha256_hex(&f.conf_file),
        "snapshot is not the injected file"
    );
    assert_eq!(
        fs::read(f.snapshots_dir().join(format!("{snap}.json"))).unwrap(),
        bytes
    );

    del_with_netconfpath(&f, cid, &ns, Some(&cap));
    assert!(f.list_json().is_empty(), "DEL left the record");
    assert!(!f.ipam_net_dir().join(&ip).exists());
    assert!(!f.host.iptables_save().contains("CNI-DN-"));
}

#[test]
fn libcni_runs_an_injected_conflist_without_capabilities() {
    require_root!();
    let f = Fixture::ledger_only();
    install_injected(&f, "plain.conflist");
    assert_eq!(f.load().unwrap(), ["cni-ledger", "bridge", "cni-ledger"]);

    let ns = Netns::new();
    let cid = "c-plain";
    let res = add_with_netconfpath(&f, cid, &ns, None);
    let ip = res["ips"][0]["address"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let row = f.list_row(cid, "eth0").expect("the ledger recorded no ADD");
    assert_eq!(row["runtimeConfig"], json!({}), "{row:#}");
    assert!(row["snapshot"].is_string(), "{row:#}");

    del_with_netconfpath(&f, cid, &ns, None);
    assert!(f.list_json().is_empty(), "DEL left the record");
    assert!(!f.ipam_net_dir().join(&ip).exists());
}
