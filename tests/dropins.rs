//! Drop-in plugin configs through libcni v1.3 (issue 17): libcni appends every
//! `<confdir>/<network>/*.conf` to the end of the chain unless the conflist says
//! `"loadOnlyInlinedPlugins": true`; the ledger's snapshot, `list` and gc's replay must
//! see that same chain. Runs the driver built on libcni v1.3 (`common::driver13`),
//! Debian's bridge, host-local and portmap in a per-test host namespace. Needs root.
//!
//!     cargo test --features testing --test dropins

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::PathBuf;

use common::*;
use serde_json::{json, Value};

/// `[cni-ledger, bridge+host-local]` inline, portmap as the drop-in
/// `<confdir>/<net>/50-portmap.conf`, driven by libcni v1.3. The ledger declares
/// portMappings, as `inject` makes it (the drop-in's capability joins the union).
fn fixture(only_inlined: bool) -> (Fixture, PathBuf) {
    let spec = ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    }
    .with_ledger_opt("capabilities", json!({"portMappings": true}));
    let mut f = Fixture::with_spec(spec);
    f.driver = driver13();
    let mut list = f.conflist(&f.spec.clone());
    if only_inlined {
        list["loadOnlyInlinedPlugins"] = json!(true);
    }
    f.write_conflist(&list);
    let dir = f.conf_dir.join(&f.network);
    fs::create_dir_all(&dir).unwrap();
    let dropin = dir.join("50-portmap.conf");
    // As a drop-in is written: its own name and version, which libcni replaces.
    let mut plugin = Fixture::portmap_entry();
    plugin["name"] = json!("portmap-dropin");
    plugin["cniVersion"] = json!("1.0.0");
    fs::write(&dropin, serde_json::to_vec_pretty(&plugin).unwrap()).unwrap();
    (f, dropin)
}

/// `(type, source)` of each plugin of a `list --json` row's chain.
fn chain_of(row: &Value) -> Vec<(String, String)> {
    row["chain"]
        .as_array()
        .unwrap_or_else(|| panic!("list row without a chain: {row:#}"))
        .iter()
        .map(|p| {
            (
                p["type"].as_str().unwrap().to_string(),
                p["source"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// gc --grace 0 replays the record of the vanished sandbox `cid`: its report entry.
fn gc_replays(f: &Fixture, cid: &str) -> Value {
    let (out, rep) = f.gc(&["--grace", "0"]);
    let rep = rep.unwrap_or_else(|| panic!("gc printed no JSON report: {}", describe(&out)));
    assert_eq!(
        out.status.code(),
        Some(0),
        "gc: {}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    let r = rep["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["containerId"] == json!(cid))
        .unwrap_or_else(|| panic!("no report entry for {cid}: {rep:#}"))
        .clone();
    assert_eq!(r["action"], json!("replayed"), "{r:#}");
    assert!(
        r["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["ok"] == json!(true)),
        "{r:#}"
    );
    r
}

fn replayed_types(r: &Value) -> Vec<String> {
    r["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn dropin_portmap_is_snapshotted_and_released_by_gc() {
    require_root!();
    let (f, dropin) = fixture(false);
    let conf_file = f.conf_file.display().to_string();
    let dropin_file = dropin.display().to_string();
    assert_eq!(
        f.load().unwrap(),
        ["cni-ledger", "bridge", "portmap"],
        "libcni v1.3 does not append the drop-in"
    );
    let mut ns = Netns::new();
    let cid = "c-dropin";
    f.add(
        cid,
        "eth0",
        Some(&ns.path_str()),
        Some(&port_mappings(8080)),
    )
    .unwrap_or_else(|e| panic!("{e}\nlog:\n{}", f.log()));
    let nat = f.host.iptables_save();
    assert!(
        f.host
            .nat_lines_for(cid)
            .iter()
            .any(|l| l.contains("CNI-DN-"))
            && nat.contains("--dport 8080"),
        "the drop-in portmap made no DNAT rule for {cid}:\n{nat}"
    );

    // What a user reads: the chain plugin by plugin, with the file each came from.
    let row = f.list_row(cid, "eth0").expect("no record for the ADD");
    assert_eq!(
        chain_of(&row),
        [
            ("cni-ledger".to_string(), conf_file.clone()),
            ("bridge".to_string(), conf_file.clone()),
            ("portmap".to_string(), dropin_file.clone()),
        ],
        "{row:#}"
    );

    // The sandbox vanishes without DEL; the drop-in is gone too by then, so only the
    // snapshot can know portmap was in the chain.
    ns.delete();
    fs::remove_file(&dropin).unwrap();
    let r = gc_replays(&f, cid);
    assert_eq!(r["configSource"], json!("snapshot"), "{r:#}");
    assert_eq!(
        replayed_types(&r),
        ["portmap", "bridge"],
        "reverse order, ledger skipped: {r:#}"
    );
    assert_eq!(r["plugins"][0]["source"], json!(dropin_file), "{r:#}");

    let nat = f.host.iptables_save();
    assert!(
        f.host.nat_lines_for(cid).is_empty() && !nat.contains("CNI-DN-"),
        "the drop-in portmap's DNAT chain survived gc:\n{nat}"
    );
    assert!(f.ipam_addresses().is_empty(), "{:?}", f.ipam_addresses());
    assert!(f.record_files().is_empty(), "{:?}", f.record_files());
}

#[test]
fn load_only_inlined_plugins_keeps_the_dropin_out_of_add_and_replay() {
    require_root!();
    let (f, _dropin) = fixture(true);
    assert_eq!(
        f.load().unwrap(),
        ["cni-ledger", "bridge"],
        "libcni v1.3 loaded the drop-in despite loadOnlyInlinedPlugins"
    );
    let mut ns = Netns::new();
    let cid = "c-inlined";
    f.add(
        cid,
        "eth0",
        Some(&ns.path_str()),
        Some(&port_mappings(8080)),
    )
    .unwrap_or_else(|e| panic!("{e}\nlog:\n{}", f.log()));
    assert!(
        f.host.nat_lines_for(cid).is_empty(),
        "portmap ran though only inlined plugins load:\n{}",
        f.host.iptables_save()
    );
    let row = f.list_row(cid, "eth0").expect("no record for the ADD");
    let types: Vec<String> = chain_of(&row).into_iter().map(|(t, _)| t).collect();
    assert_eq!(types, ["cni-ledger", "bridge"], "{row:#}");

    ns.delete();
    let r = gc_replays(&f, cid);
    assert_eq!(replayed_types(&r), ["bridge"], "{r:#}");
    assert!(f.ipam_addresses().is_empty(), "{:?}", f.ipam_addresses());
    assert!(f.record_files().is_empty(), "{:?}", f.record_files());
}

#[test]
fn unparseable_dropin_fails_libcni_and_the_ledger_alike() {
    require_root!();
    let (f, dropin) = fixture(false);
    fs::write(&dropin, br#"{"snat": false}"#).unwrap();
    let err = f
        .load()
        .expect_err("libcni v1.3 loaded a drop-in without a type");
    assert!(err.contains("missing 'type'"), "{err}");
    // The ledger's reading of the chain (here `inject --dry-run`, as the agent plans
    // it) refuses the network the same way, naming the file.
    let out = f
        .ledger_cmd(&["inject", "--dry-run"])
        .arg(&f.conf_file)
        .output()
        .unwrap();
    let text = describe(&out);
    assert!(
        !out.status.success()
            && text.contains("missing 'type'")
            && text.contains(&dropin.display().to_string()),
        "{text}"
    );
}
