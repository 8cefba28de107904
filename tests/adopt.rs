//! `cni-ledger adopt` (issue 9): attachments made through libcni with the ledger *not*
//! in the chain (bridge + host-local + portmap with a host port) get records from
//! libcni's result cache, and gc then releases what is stale and nothing else. Debian's
//! libcni 1.1.2 writes no `netns` into its cache; the libcni 1.2 layout is made by adding
//! that field to a real cache file, as libcni 1.2's cacheAdd writes it. Needs root.
//!
//!     cargo test --features testing --test adopt
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use common::*;
use serde_json::{json, Value};

/// `[bridge+host-local, portmap]`: no ledger in the chain. Before the ledger is taken
/// out, `p-led` is added with it in the chain, so it has both a record and a cache entry.
fn fixture_without_ledger() -> (Fixture, Netns) {
    let mut f = Fixture::new();
    let ns = Netns::new();
    f.add(
        "p-led",
        "eth0",
        Some(&ns.path_str()),
        Some(&port_mappings(8080)),
    )
    .unwrap_or_else(|e| panic!("ADD p-led: {e}"));
    assert!(f.record_path("p-led", "eth0").exists());
    let list = json!({
        "cniVersion": "1.0.0",
        "name": f.network,
        "plugins": [f.bridge_entry(), Fixture::portmap_entry()],
    });
    f.write_conflist(&list);
    (f, ns)
}

fn add(f: &Fixture, cid: &str, ns: &Netns, port: u16) -> String {
    let res = f
        .add(
            cid,
            "eth0",
            Some(&ns.path_str()),
            Some(&port_mappings(port)),
        )
        .unwrap_or_else(|e| panic!("ADD {cid}: {e}"));
    assert!(
        !f.record_path(cid, "eth0").exists(),
        "the ledger is not in the chain"
    );
    first_ip(&res)
}

fn btime() -> i64 {
    fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The birth time of `dir` (Unix seconds), where the kernel keeps one.
fn birth(dir: &str) -> Option<i64> {
    let born = fs::metadata(dir).ok()?.created().ok()?;
    let secs = born.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64;
    Some(secs).filter(|&s| s > 0)
}

/// The earliest reading of when this boot began: `btime`, or the birth of /dev or /run
/// (made anew each boot) where the clock was stepped forward since.
fn boot_began() -> i64 {
    [birth("/dev"), birth("/run")]
        .into_iter()
        .flatten()
        .fold(btime(), i64::min)
}

fn mtime(path: &Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(path).unwrap().mtime()
}

/// Sets a file's mtime to Unix time `t` (coreutils touch).
fn set_mtime(path: &Path, t: i64) {
    let out = Command::new("touch")
        .arg("-m")
        .arg("-d")
        .arg(format!("@{t}"))
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
}

/// Rewrites a cache file as libcni 1.2 would have written it: with `netns`.
fn add_netns_to_cache(f: &Fixture, cid: &str, netns: &str) {
    let path = f.cache_result_path(cid, "eth0");
    let mut v: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert!(v.get("netns").is_none(), "libcni 1.1 writes no netns");
    v["netns"] = json!(netns);
    fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// Puts the ledger back first in the fixture's chain, as `inject` would: adoption
/// takes only networks whose chain holds the ledger.
fn put_ledger_back(f: &mut Fixture) {
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
}

fn adopt(f: &Fixture, extra: &[&str]) -> (Output, Value) {
    let cni_path = f.cni_path();
    adopt_with(f, &["--cni-path", cni_path.as_str()], extra)
}

/// `adopt --json` over the fixture's cache and conf dir, `flags` and `extra` after.
fn adopt_with(f: &Fixture, flags: &[&str], extra: &[&str]) -> (Output, Value) {
    let cache = f.cache_dir.to_string_lossy().into_owned();
    let conf = f.conf_dir.to_string_lossy().into_owned();
    let mut args = vec![
        "adopt",
        "--json",
        "--cni-cache-dir",
        cache.as_str(),
        "--conf-dir",
        conf.as_str(),
    ];
    args.extend_from_slice(flags);
    args.extend_from_slice(extra);
    // As install.sh runs it: no CNI_PATH unless a flag gives one.
    let out = f.ledger_cmd(&args).env_remove("CNI_PATH").output().unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("adopt printed no JSON ({e}): {}", describe(&out)));
    (out, v)
}

fn adopted<'a>(rep: &'a Value, cid: &str) -> &'a Value {
    rep["adopted"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["containerId"] == json!(cid))
        .unwrap_or_else(|| panic!("{cid} not adopted: {rep:#}"))
}

fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    walk_files(dir)
        .into_iter()
        .filter(|p| !p.starts_with("locks/"))
        .map(|p| {
            let bytes = fs::read(dir.join(&p)).unwrap_or_default();
            (p, bytes)
        })
        .collect()
}

#[test]
fn adopted_attachments_are_judged_and_replayed_from_the_cached_conflist() {
    require_root!();
    let (mut f, _ns_led) = fixture_without_ledger();
    let led_record = fs::read(f.record_path("p-led", "eth0")).unwrap();
    let conflist = f.conflist_bytes();
    // Earlier boot, no netns cached: its namespace is gone as after a reboot.
    let mut ns_old = Netns::new();
    let ip_old = add(&f, "p-old", &ns_old, 8081);
    // This boot, no netns cached: live until a valid list says otherwise.
    let ns_new = Netns::new();
    let ip_new = add(&f, "p-new", &ns_new, 8082);
    // libcni 1.2 layout, namespace deleted / still there.
    let mut ns_gone = Netns::new();
    let ip_gone = add(&f, "p-nsgone", &ns_gone, 8083);
    let ns_live = Netns::new();
    let ip_live = add(&f, "p-nslive", &ns_live, 8084);
    add_netns_to_cache(&f, "p-nsgone", &ns_gone.path_str());
    add_netns_to_cache(&f, "p-nslive", &ns_live.path_str());
    set_mtime(&f.cache_result_path("p-old", "eth0"), boot_began() - 3600);
    ns_old.delete();
    ns_gone.delete();
    // libcni writes without fsync: a zero-length and a cut-off file after a crash.
    let results = f.cache_dir.join("results");
    fs::write(results.join(format!("{}-p-empty-eth0", f.network)), b"").unwrap();
    fs::write(
        results.join(format!("{}-p-garbage-eth0", f.network)),
        b"{\"kind\":\"cniCacheV1\",\"containerId\":\"p-gar",
    )
    .unwrap();
    for cid in ["p-old", "p-new", "p-nsgone", "p-nslive"] {
        assert!(
            !f.host.nat_lines_for(cid).is_empty(),
            "{cid}: no DNAT to begin with"
        );
    }
    // An entry of a network whose chain does not hold the ledger (as containerd's own
    // cni-loopback beside the pod network), and an unusable one of it: never taken.
    let foreign = fs::read_to_string(f.cache_result_path("p-new", "eth0"))
        .unwrap()
        .replace(&format!(r#""{}""#, f.network), r#""cni-loopback""#)
        .replace(r#""eth0""#, r#""lo""#);
    assert!(
        foreign.contains(r#""networkName":"cni-loopback""#),
        "{foreign}"
    );
    fs::write(results.join("cni-loopback-p-new-lo"), foreign).unwrap();
    fs::write(results.join("cni-loopback-p-cut-lo"), b"").unwrap();

    // With the ledger out of every chain, nothing is taken; everything is left out.
    let (out, rep) = adopt(&f, &["--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(rep["adopted"].as_array().unwrap().is_empty(), "{rep:#}");
    assert_eq!(rep["leftOut"].as_array().unwrap().len(), 9, "{rep:#}");
    put_ledger_back(&mut f);

    // A dry run writes nothing.
    let untouched = tree(&f.ledger_dir);
    let (out, rep) = adopt(&f, &["--dry-run"]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert_eq!(rep["networks"], json!([f.network]), "{rep:#}");
    assert_eq!(rep["adopted"].as_array().unwrap().len(), 3, "{rep:#}");
    assert_eq!(rep["deferred"].as_array().unwrap().len(), 1, "{rep:#}");
    let left: Vec<&Value> = rep["leftOut"].as_array().unwrap().iter().collect();
    assert_eq!(left.len(), 2, "{rep:#}");
    assert!(left.iter().any(|l| l["network"] == json!("cni-loopback")
        && l["cacheFile"]
            .as_str()
            .unwrap()
            .ends_with("/cni-loopback-p-new-lo")));
    assert!(left.iter().any(|l| l["network"].is_null()
        && l["cacheFile"]
            .as_str()
            .unwrap()
            .ends_with("/cni-loopback-p-cut-lo")));
    assert_eq!(
        tree(&f.ledger_dir),
        untouched,
        "a dry run changed the ledger"
    );

    let (out, rep) = adopt(&f, &[]);
    // The attachment recorded by ADD is never touched.
    assert_eq!(rep["alreadyRecorded"], json!(1), "{rep:#}");
    assert_eq!(
        fs::read(f.record_path("p-led", "eth0")).unwrap(),
        led_record
    );
    // Unusable cache files are reported (exit 1), never acted on.
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let unusable: Vec<&str> = rep["unusable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["file"].as_str().unwrap())
        .collect();
    assert_eq!(unusable.len(), 2, "{rep:#}");
    assert!(unusable.iter().any(|u| u.ends_with("-p-empty-eth0")));
    assert!(unusable.iter().any(|u| u.ends_with("-p-garbage-eth0")));
    assert!(!f.record_path("p-empty", "eth0").exists());
    assert!(!f.record_path("p-garbage", "eth0").exists());
    assert!(
        !f.records_dir().join("cni-loopback:p-new:lo.json").exists(),
        "a network without the ledger was adopted"
    );
    // A netns path of this boot that shows nothing: its namespace may be held elsewhere
    // on the node (an open file, a socket), and no identity was recorded to search by,
    // so it waits for a reboot to prove it gone.
    let deferred = rep["deferred"].as_array().unwrap();
    assert_eq!(deferred.len(), 1, "{rep:#}");
    assert_eq!(deferred[0]["containerId"], json!("p-nsgone"), "{rep:#}");
    assert_eq!(deferred[0]["netns"], json!(ns_gone.path_str()), "{rep:#}");
    assert!(!f.record_path("p-nsgone", "eth0").exists());
    for (cid, state, reason) in [
        ("p-old", "stale", json!("boot-changed")),
        ("p-new", "live", Value::Null),
        ("p-nslive", "live", Value::Null),
    ] {
        let a = adopted(&rep, cid);
        assert_eq!(a["action"], json!("adopted"), "{a:#}");
        assert_eq!(a["state"], json!(state), "{a:#}");
        assert_eq!(a["reason"], reason, "{a:#}");
        let row = f.list_row(cid, "eth0").expect("list row");
        assert_eq!(row["source"], json!("adopted"), "{row:#}");
        assert_eq!(
            row["cacheFile"],
            json!(f.cache_result_path(cid, "eth0")),
            "{row:#}"
        );
        assert_eq!(row["state"], json!(state), "{row:#}");
        assert_eq!(row["reason"], reason, "{row:#}");
        // The cached conflist is the record's snapshot, byte for byte.
        let snap = row["snapshot"].as_str().unwrap();
        let bytes = fs::read(f.snapshots_dir().join(format!("{snap}.json"))).unwrap();
        assert_eq!(
            bytes, conflist,
            "{cid}'s snapshot is not the cached conflist"
        );
    }
    let table = f.ledger(&["list"]);
    assert!(
        String::from_utf8_lossy(&table.stdout).contains("(adopted)"),
        "{}",
        describe(&table)
    );

    // Running it again changes nothing.
    let before = tree(&f.ledger_dir);
    let (_, rep2) = adopt(&f, &[]);
    assert!(rep2["adopted"].as_array().unwrap().is_empty(), "{rep2:#}");
    assert_eq!(rep2["alreadyRecorded"], json!(4), "{rep2:#}");
    assert_eq!(rep2["deferred"].as_array().unwrap().len(), 1, "{rep2:#}");
    assert_eq!(
        tree(&f.ledger_dir),
        before,
        "a second adopt changed the ledger"
    );

    // gc: the stale one is released through the cached chain, the live two untouched, the
    // deferred one kept (unrecorded).
    let (out, rep) = f.gc(&["--grace", "0"]);
    let rep = rep.unwrap_or_else(|| panic!("{}", describe(&out)));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep:#}");
    assert!(
        f.ipam_addresses().contains(&ip_gone),
        "the deferred entry lost its address"
    );
    // Once its file predates the boot (as after a reboot), adoption takes it as stale.
    set_mtime(
        &f.cache_result_path("p-nsgone", "eth0"),
        boot_began() - 3600,
    );
    let (_, rep3) = adopt(&f, &[]);
    let a = adopted(&rep3, "p-nsgone");
    assert_eq!(a["state"], json!("stale"), "{a:#}");
    assert_eq!(a["reason"], json!("boot-changed"), "{a:#}");
    let (out, rep) = f.gc(&["--grace", "0"]);
    let rep = rep.unwrap_or_else(|| panic!("{}", describe(&out)));
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep:#}");
    for r in rep["records"].as_array().unwrap() {
        assert_eq!(r["configSource"], json!("snapshot"), "{r:#}");
    }
    let addrs = f.ipam_addresses();
    for (cid, ip) in [("p-old", &ip_old), ("p-nsgone", &ip_gone)] {
        assert!(!addrs.contains(ip), "{cid} kept {ip}: {addrs:?}");
        assert!(
            f.host.nat_lines_for(cid).is_empty(),
            "{}",
            f.host.iptables_save()
        );
        assert!(!f.record_path(cid, "eth0").exists());
        assert!(!f.cache_result_path(cid, "eth0").exists());
    }
    assert_eq!(
        fs::read(f.record_path("p-led", "eth0")).unwrap(),
        led_record
    );
    for (cid, ip) in [("p-new", &ip_new), ("p-nslive", &ip_live)] {
        assert!(addrs.contains(ip), "{cid} lost {ip}: {addrs:?}");
        assert!(!f.host.nat_lines_for(cid).is_empty(), "{cid} lost its DNAT");
        assert!(f.record_path(cid, "eth0").exists());
        assert!(f.cache_result_path(cid, "eth0").exists());
    }
    // The bad cache files are still there, untouched.
    assert_eq!(
        fs::read(results.join(format!("{}-p-empty-eth0", f.network))).unwrap(),
        b""
    );

    // A valid list settles the one without a netns: p-new is not in it.
    let valid = f.tmp.path().join("valid.json");
    fs::write(
        &valid,
        json!([{"containerID": "p-nslive", "ifname": "eth0"}, {"containerID": "p-led", "ifname": "eth0"}])
            .to_string(),
    )
    .unwrap();
    let (out, rep) = f.gc(&[
        "--grace",
        "0",
        "--network",
        &f.network,
        "--valid-attachments",
        valid.to_str().unwrap(),
    ]);
    let rep = rep.unwrap_or_else(|| panic!("{}", describe(&out)));
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep:#}");
    assert!(!f.ipam_addresses().contains(&ip_new));
    assert!(f.ipam_addresses().contains(&ip_live));
    assert!(ns_new.path().exists());
}

#[test]
fn a_clock_stepped_forward_after_boot_leaves_this_boots_attachments_live() {
    require_root!();
    let (f, _ns_led) = fixture_without_ledger();
    // libcni 1.1: no netns in the cache, its date is all there is.
    let ns = Netns::new();
    add(&f, "p-step", &ns, 8085);
    let cache = f.cache_result_path("p-step", "eth0");
    let written = mtime(&cache);
    let judged = |btime: i64| -> Value {
        let dir = f.cache_dir.to_string_lossy().into_owned();
        // The fixture's plugin dirs: without them adopt would look in the machine's.
        let cni_path = f.cni_path();
        let mut c = f.ledger_cmd(&[
            "adopt",
            "--json",
            "--dry-run",
            "--cni-cache-dir",
            &dir,
            "--network",
            &f.network,
            "--cni-path",
            &cni_path,
        ]);
        // What /proc/stat says once the clock has been stepped forward past the write:
        // btime is the clock now less the time since boot.
        c.env("CNI_LEDGER_TEST_BTIME", btime.to_string());
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
        adopted(&rep, "p-step").clone()
    };
    let stepped = written + 3600;
    let a = judged(stepped);
    // The births of /dev and /run (made anew each boot) remember the clock of the boot;
    // a kernel that keeps no birth time leaves btime alone to go by.
    let remembered = birth("/dev")
        .or(birth("/run"))
        .is_some_and(|b| b <= written);
    if remembered {
        assert_eq!(a["state"], json!("live"), "{a:#}");
        assert_eq!(a["reason"], Value::Null, "{a:#}");
    } else {
        assert_eq!(a["reason"], json!("boot-changed"), "{a:#}");
    }
    // A file written before this boot began is from an earlier boot, stepped or not.
    set_mtime(&cache, boot_began() - 3600);
    let a = judged(stepped);
    assert_eq!(a["state"], json!("stale"), "{a:#}");
    assert_eq!(a["reason"], json!("boot-changed"), "{a:#}");
    assert!(
        !f.record_path("p-step", "eth0").exists(),
        "a dry run wrote a record"
    );
}

/// As `install.sh` runs it (no `--cni-path`, no CNI_PATH): on a node whose plugins are
/// in /usr/lib/cni only, an adopted record's CNI_PATH is where its chain's plugins are,
/// so its replay releases the address.
#[test]
fn adopted_records_find_their_plugins_in_the_conventional_dirs() {
    require_root!();
    let (mut f, _ns_led) = fixture_without_ledger();
    let mut ns = Netns::new();
    let ip = add(&f, "p-deb", &ns, 8086);
    add_netns_to_cache(&f, "p-deb", &ns.path_str());
    ns.delete();
    // A chain plugin found nowhere is warned about, per record; it is not installed.
    let mut odd = Netns::new();
    add(&f, "p-odd", &odd, 8087);
    add_netns_to_cache(&f, "p-odd", &odd.path_str());
    odd.delete();
    let cache = f.cache_result_path("p-odd", "eth0");
    let mut v: Value = serde_json::from_slice(&fs::read(&cache).unwrap()).unwrap();
    let config = base64_decode(v["config"].as_str().unwrap());
    let mut list: Value = serde_json::from_slice(&config).unwrap();
    list["plugins"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "cl-no-such-plugin"}));
    v["config"] = json!(base64_encode(&serde_json::to_vec(&list).unwrap()));
    fs::write(&cache, serde_json::to_vec(&v).unwrap()).unwrap();
    // Written before this boot began, as after a reboot: a path of this boot that shows
    // nothing would be deferred (its namespace may be held elsewhere).
    for cid in ["p-deb", "p-odd"] {
        set_mtime(&f.cache_result_path(cid, "eth0"), boot_began() - 3600);
    }
    put_ledger_back(&mut f);

    // No --cni-path on purpose: the conventional dirs are what this test checks.
    let (out, rep) = adopt_with(&f, &[], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let a = adopted(&rep, "p-deb").clone();
    let odd_a = adopted(&rep, "p-odd").clone();
    let adopt_stderr = String::from_utf8_lossy(&out.stderr).into_owned();

    let (out, rep) = f.gc(&["--grace", "0"]);
    let rep = rep.unwrap_or_else(|| panic!("{}", describe(&out)));
    let replayed: Vec<&Value> = rep["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["containerId"] == json!("p-deb"))
        .collect();
    assert_eq!(replayed.len(), 1, "{rep:#}");
    assert_eq!(
        replayed[0]["action"],
        json!("replayed"),
        "{rep:#}\nadopted: {a:#}"
    );
    assert!(!f.ipam_addresses().contains(&ip), "{rep:#}");
    assert!(
        f.host.nat_lines_for("p-deb").is_empty(),
        "{}",
        f.host.iptables_save()
    );
    assert!(!f.record_path("p-deb", "eth0").exists());
    let path = a["cniPath"].as_str().unwrap();
    assert!(
        path.split(':').any(|d| d == CNI_PLUGIN_DIR),
        "{CNI_PLUGIN_DIR} not in {path}: {a:#}"
    );
    assert_eq!(a["missingPlugins"], json!([]), "{a:#}");
    // A chain plugin found nowhere: warned about for that record, which stays.
    assert_eq!(
        odd_a["missingPlugins"],
        json!(["cl-no-such-plugin"]),
        "{odd_a:#}"
    );
    assert!(adopt_stderr.contains("cl-no-such-plugin"), "{adopt_stderr}");
    assert!(f.record_path("p-odd", "eth0").exists());
}

/// After a power cut libcni's cache file can be empty (written without fsync). A
/// successful replay removes whatever is at the attachment's path, as libcni's DEL
/// does, so `adopt` has nothing unusable to report afterwards.
#[test]
fn a_replay_removes_an_empty_cache_file_at_the_attachments_path() {
    require_root!();
    let f = Fixture::new();
    let mut ns = Netns::new();
    let res = f
        .add(
            "p-cut",
            "eth0",
            Some(&ns.path_str()),
            Some(&port_mappings(8088)),
        )
        .unwrap_or_else(|e| panic!("ADD p-cut: {e}"));
    let ip = first_ip(&res);
    assert!(f.record_path("p-cut", "eth0").exists());
    let cache = f.cache_result_path("p-cut", "eth0");
    fs::write(&cache, b"").unwrap();
    // The record covers it: not unusable for adopt, gc's to clean up.
    let (out, rep) = adopt(&f, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(rep["alreadyRecorded"], json!(1), "{rep:#}");
    assert!(rep["unusable"].as_array().unwrap().is_empty(), "{rep:#}");
    ns.delete();

    let (out, rep) = f.gc(&["--grace", "0"]);
    let rep = rep.unwrap_or_else(|| panic!("{}", describe(&out)));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep:#}");
    assert!(!f.ipam_addresses().contains(&ip));
    assert!(!cache.exists(), "the empty cache file survived the replay");
    let (out, rep) = adopt(&f, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(rep["unusable"].as_array().unwrap().is_empty(), "{rep:#}");
}

fn base64_decode(s: &str) -> Vec<u8> {
    let out = Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(s.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

fn base64_encode(b: &[u8]) -> String {
    let out = Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b)?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}
