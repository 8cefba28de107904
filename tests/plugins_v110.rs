//! The chain on the reference plugins nodes run today: v1.10.x of
//! github.com/containernetworking/plugins, built by scripts/build-plugins.sh into a cache
//! outside the tree (default /var/cache/cni-ledger-plugins/<version>/bin), with bridge's
//! `"ipMasqBackend": "nftables"` and portmap's `"backend": "nftables"`, at cniVersion
//! 1.1.0, through libcni v1.3 (`driver13()`):
//!
//!     [cni-ledger, bridge (ipMasq, nftables) + host-local, portmap (nftables)]
//!
//! - ADD, CHECK, STATUS, DEL and the CNI GC verb (with a valid list) each work with the
//!   ledger first, and the nftables rules portmap (table `ip cni_hostport`, chains
//!   `hostports` and `masquerading`, each rule's comment the container ID) and bridge
//!   (table `inet cni_plugins_masquerade`, chain `masq_checks`, comment
//!   `<hash>, net: <net>, if: <if>, id: <cid>`) make appear on ADD and go on DEL.
//! - The unclean reboot: pods added under another boot ID (`CNI_LEDGER_TEST_BOOT_ID`),
//!   their namespaces then deleted, beside pods of this boot; `cni-ledger gc` releases
//!   every portmap rule and host-local address of the old boot and none of a live pod's.
//!
//! Every plugin but the ledger is the v1.10 build, linked into the fixture's CNI bin dir
//! (first on CNI_PATH, the path the ledger records and gc replays with). The plugins
//! are found through `CNI_LEDGER_PLUGINS_V110` (a bin dir), else the newest
//! `v1.10.*/bin` holding build-plugins.sh's stamp under `CNI_LEDGER_PLUGINS_CACHE`
//! (default /var/cache/cni-ledger-plugins); missing, or `nft` missing, the tests skip,
//! and fail under CI (tests/common/root.rs). Needs root.
//!
//!     bash scripts/build-plugins.sh
//!     sudo -E cargo test --features testing --test plugins_v110
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;
use serde_json::{json, Value};

/// The plugins of the v1.10 build the chain uses.
const PLUGINS: [&str; 3] = ["bridge", "host-local", "portmap"];
/// The boot the "old" pods were added under.
const OLD_BOOT: &str = "00000000-0000-0000-0000-0000000b0010";

/// The v1.10.x bin dir: `CNI_LEDGER_PLUGINS_V110`, else the newest stamped one in the
/// cache (a path that does not exist when there is none, for `require_tools!` to name).
fn v110_bin() -> String {
    if let Some(d) = std::env::var_os("CNI_LEDGER_PLUGINS_V110") {
        return d.to_string_lossy().into_owned();
    }
    let cache = std::env::var("CNI_LEDGER_PLUGINS_CACHE")
        .unwrap_or_else(|_| "/var/cache/cni-ledger-plugins".to_string());
    let mut found: Vec<(Vec<u64>, PathBuf)> = list_dir(Path::new(&cache))
        .into_iter()
        .filter_map(|name| {
            let rest = name.strip_prefix("v1.10.")?;
            let patch: u64 = rest.parse().ok()?;
            let bin = Path::new(&cache).join(&name).join("bin");
            bin.join(".built").is_file().then_some((vec![patch], bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin.display().to_string(),
        None => format!("{cache}/v1.10.x/bin"),
    }
}

/// Skips (fails under CI) unless the v1.10 plugins and `nft` are there.
macro_rules! require_v110 {
    () => {
        require_root!();
        let bin = v110_bin();
        let paths: Vec<String> = PLUGINS
            .iter()
            .map(|p| format!("{bin}/{p}"))
            .chain(std::iter::once("/usr/sbin/nft".to_string()))
            .collect();
        let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
        if !common::root::tools_or_skip(&paths) {
            return;
        }
    };
}

/// A fixture whose chain is the v1.10 plugins' with both nftables backends at 1.1.0,
/// driven by libcni v1.3.
fn v110_fixture() -> Fixture {
    let mut f = Fixture::with_spec(ChainSpec {
        cni_version: "1.1.0".into(),
        ..ChainSpec::full()
    });
    f.driver = driver13();
    let bin = v110_bin();
    for p in PLUGINS {
        std::os::unix::fs::symlink(Path::new(&bin).join(p), f.bin_dir.join(p))
            .unwrap_or_else(|e| panic!("link {bin}/{p} into the bin dir: {e}"));
    }
    let mut bridge = f.bridge_entry();
    bridge["ipMasq"] = json!(true);
    bridge["ipMasqBackend"] = json!("nftables");
    let spec = f.spec.clone();
    let conf = json!({
        "cniVersion": "1.1.0",
        "name": f.network,
        "plugins": [
            f.ledger_entry(&spec),
            bridge,
            // snat defaults to true: the masquerading chain's rules too.
            {"type": "portmap", "capabilities": {"portMappings": true}, "backend": "nftables"},
        ],
    });
    f.write_conflist(&conf);
    // The plugins libcni runs are the v1.10 ones: their VERSION says 1.1.0.
    let out = run_ok(
        f.host
            .cmd(f.bin_dir.join("portmap"))
            .env("CNI_COMMAND", "VERSION")
            .stdin(std::process::Stdio::null()),
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1.1.0"),
        "portmap in the bin dir is not a 1.1.0 plugin: {}",
        describe(&out)
    );
    f
}

/// One nftables rule of the host namespace: its table (`ip cni_hostport`), chain and text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Rule {
    table: String,
    chain: String,
    text: String,
}

/// Every rule of the host namespace's ruleset (`nft list ruleset`, text form).
fn ruleset(f: &Fixture) -> Vec<Rule> {
    let out = run_ok(f.host.cmd("nft").args(["list", "ruleset"]));
    let mut rules = Vec::new();
    let (mut table, mut chain) = (String::new(), String::new());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let l = line.trim();
        if let Some(t) = l.strip_prefix("table ") {
            table = t.trim_end_matches('{').trim().to_string();
        } else if let Some(c) = l.strip_prefix("chain ") {
            chain = c.trim_end_matches('{').trim().to_string();
        } else if l.is_empty()
            || l == "}"
            || l.starts_with("type ")
            || l.starts_with("comment ")
            || l.starts_with("policy ")
        {
        } else {
            rules.push(Rule {
                table: table.clone(),
                chain: chain.clone(),
                text: l.to_string(),
            });
        }
    }
    rules
}

/// Whether a rule names the container: portmap's comment is the ID, bridge's ends in
/// `id: <cid>`.
fn names(r: &Rule, cid: &str) -> bool {
    r.text.ends_with(&format!("comment \"{cid}\"")) || r.text.ends_with(&format!("id: {cid}\""))
}

fn rules_of(rules: &[Rule], cid: &str) -> Vec<Rule> {
    rules.iter().filter(|r| names(r, cid)).cloned().collect()
}

/// The rules a pod of `ip` with `host_port` → 80/tcp has: portmap's DNAT in
/// `hostports`, its two masquerade rules (hairpin, localhost) in `masquerading`, and
/// bridge's in `masq_checks`. Panics with the ruleset unless all are there.
fn assert_pod_rules(f: &Fixture, cid: &str, ip: &str, host_port: u16) {
    let rules = ruleset(f);
    let mine = rules_of(&rules, cid);
    let has = |table: &str, chain: &str, frag: &str| {
        mine.iter()
            .any(|r| r.table == table && r.chain == chain && r.text.contains(frag))
    };
    let dnat = format!("tcp dport {host_port} dnat to {ip}:80");
    assert!(
        has("ip cni_hostport", "hostports", &dnat),
        "{cid}: no portmap DNAT `{dnat}`: {mine:#?}\nruleset: {rules:#?}"
    );
    assert!(
        has(
            "ip cni_hostport",
            "masquerading",
            &format!("ip daddr {ip} masquerade")
        ),
        "{cid}: no portmap masquerade rule for {ip}: {mine:#?}"
    );
    assert!(
        has(
            "inet cni_plugins_masquerade",
            "masq_checks",
            &format!("ip saddr {ip} ")
        ),
        "{cid}: no bridge masquerade rule for {ip}: {mine:#?}"
    );
    assert_eq!(
        mine.len(),
        4,
        "{cid}: not exactly its four rules: {mine:#?}"
    );
}

fn ipam_file(f: &Fixture, ip: &str) -> PathBuf {
    f.ipam_net_dir().join(ip)
}

fn add_pod(f: &Fixture, cid: &str, ns: &Netns, host_port: u16) -> String {
    let res = f
        .add(
            cid,
            "eth0",
            Some(&ns.path_str()),
            Some(&port_mappings(host_port)),
        )
        .unwrap_or_else(|e| {
            panic!(
                "ADD {cid} through libcni 1.3: {e}\nledger log:\n{}",
                f.log()
            )
        });
    assert_eq!(res["cniVersion"], json!("1.1.0"), "{res:#}");
    let ip = first_ip(&res);
    assert!(ipam_file(f, &ip).exists(), "no host-local file for {ip}");
    assert!(f.record_path(cid, "eth0").exists(), "no record for {cid}");
    ip
}

/// The driver's `status` (libcni GetStatusNetworkList) in the host namespace.
fn status(f: &Fixture) -> Output {
    f.host
        .cmd(&f.driver)
        .arg("status")
        .arg("--conf-dir")
        .arg(&f.conf_dir)
        .args(["--net", &f.network, "--cni-path", &f.cni_path()])
        .output()
        .unwrap()
}

/// The driver's `gc` (libcni GCNetworkList) with `valid` attachments.
fn gc_verb(f: &Fixture, valid: &[&str]) -> Output {
    let mut c = f.host.cmd(&f.driver);
    c.arg("gc")
        .arg("--conf-dir")
        .arg(&f.conf_dir)
        .args(["--net", &f.network, "--cni-path", &f.cni_path()])
        .arg("--cache-dir")
        .arg(&f.cache_dir);
    for v in valid {
        c.arg("--valid").arg(format!("{v}/eth0"));
    }
    c.output().unwrap()
}

/// Deletes portmap's DNAT rule of `cid` behind the plugins' backs (by its handle).
fn delete_dnat_rule(f: &Fixture, cid: &str) {
    let out =
        run_ok(
            f.host
                .cmd("nft")
                .args(["-a", "list", "chain", "ip", "cni_hostport", "hostports"]),
        );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.contains(&format!("comment \"{cid}\"")))
        .unwrap_or_else(|| panic!("no DNAT rule of {cid}: {text}"));
    let handle = line
        .rsplit_once("# handle ")
        .map(|(_, h)| h.trim().to_string())
        .unwrap_or_else(|| panic!("no handle in {line}"));
    run_ok(f.host.cmd("nft").args([
        "delete",
        "rule",
        "ip",
        "cni_hostport",
        "hostports",
        "handle",
        &handle,
    ]));
}

#[test]
fn add_check_status_del_and_gc_through_libcni_13_on_nftables() {
    require_v110!();
    let f = v110_fixture();
    assert!(
        ruleset(&f)
            .iter()
            .all(|r| !r.table.contains("cni_hostport") && !r.table.contains("cni_plugins")),
        "the test host starts with CNI tables: {:#?}",
        ruleset(&f)
    );

    // STATUS: every plugin of the list (the ledger, bridge, portmap) says available.
    let out = status(&f);
    assert!(
        out.status.success(),
        "STATUS: {}\nlog:\n{}",
        describe(&out),
        f.log()
    );

    // ADD: the ledger records, the plugins make their nftables rules.
    let (ns1, ns2, ns3, ns4) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
    let ip1 = add_pod(&f, "p-1", &ns1, 8081);
    let ip2 = add_pod(&f, "p-2", &ns2, 8082);
    let ip3 = add_pod(&f, "p-3", &ns3, 8083);
    let ip4 = add_pod(&f, "p-4", &ns4, 8084);
    for (cid, ip, port) in [
        ("p-1", &ip1, 8081),
        ("p-2", &ip2, 8082),
        ("p-3", &ip3, 8083),
        ("p-4", &ip4, 8084),
    ] {
        assert_pod_rules(&f, cid, ip, port);
    }
    let rec: Value = serde_json::from_slice(&fs::read(f.record_path("p-1", "eth0")).unwrap())
        .expect("record JSON");
    assert_eq!(
        rec["record"]["runtimeConfig"]["portMappings"][0]["hostPort"],
        json!(8081),
        "the record keeps the port mappings gc will replay: {rec:#}"
    );

    // CHECK passes with everything in place, and fails once p-3's DNAT rule is gone:
    // portmap's nftables check really ran.
    for (cid, ns, port) in [("p-1", &ns1, 8081), ("p-3", &ns3, 8083)] {
        f.check(
            cid,
            "eth0",
            Some(&ns.path_str()),
            Some(&port_mappings(port)),
        )
        .unwrap_or_else(|e| panic!("CHECK {cid}: {e}\nlog:\n{}", f.log()));
    }
    delete_dnat_rule(&f, "p-3");
    let err = f
        .check(
            "p-3",
            "eth0",
            Some(&ns3.path_str()),
            Some(&port_mappings(8083)),
        )
        .expect_err("CHECK passed without p-3's DNAT rule");
    assert!(err.contains("hostport"), "{err}");

    // DEL: p-1's rules, address and record go; the others' stay.
    f.del(
        "p-1",
        "eth0",
        Some(&ns1.path_str()),
        Some(&port_mappings(8081)),
    )
    .unwrap_or_else(|e| panic!("DEL p-1: {e}\nlog:\n{}", f.log()));
    assert_eq!(
        rules_of(&ruleset(&f), "p-1"),
        vec![],
        "p-1's rules outlived DEL"
    );
    assert!(!ipam_file(&f, &ip1).exists(), "p-1's address outlived DEL");
    assert!(!f.record_path("p-1", "eth0").exists());
    assert_pod_rules(&f, "p-2", &ip2, 8082);
    assert_pod_rules(&f, "p-4", &ip4, 8084);

    // GC with the runtime listing p-2 and p-3: the ledger replays DEL for p-4, whose
    // namespace lives. Bridge v1.10 has no GC verb, so its masquerade rule and the
    // host-local address going prove the ledger's replay, not portmap's own GC.
    let out = gc_verb(&f, &["p-2", "p-3"]);
    assert!(
        out.status.success(),
        "GC: {}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    assert_eq!(
        rules_of(&ruleset(&f), "p-4"),
        vec![],
        "p-4's rules outlived GC"
    );
    assert!(!ipam_file(&f, &ip4).exists(), "p-4's address outlived GC");
    assert!(
        !f.record_path("p-4", "eth0").exists(),
        "p-4's record outlived GC"
    );
    assert!(
        f.log().contains("p-4"),
        "the ledger's log does not name the replayed p-4:\n{}",
        f.log()
    );
    // ... and the listed ones are untouched.
    assert_pod_rules(&f, "p-2", &ip2, 8082);
    assert!(ipam_file(&f, &ip2).exists() && ipam_file(&f, &ip3).exists());
    assert!(f.record_path("p-2", "eth0").exists() && f.record_path("p-3", "eth0").exists());
    f.check(
        "p-2",
        "eth0",
        Some(&ns2.path_str()),
        Some(&port_mappings(8082)),
    )
    .unwrap_or_else(|e| panic!("CHECK p-2 after GC: {e}"));

    // The last DELs leave no container rule in either table, and no address.
    for (cid, ns, port) in [("p-2", &ns2, 8082), ("p-3", &ns3, 8083)] {
        f.del(
            cid,
            "eth0",
            Some(&ns.path_str()),
            Some(&port_mappings(port)),
        )
        .unwrap_or_else(|e| panic!("DEL {cid}: {e}\nlog:\n{}", f.log()));
    }
    let left: Vec<Rule> = ruleset(&f)
        .into_iter()
        .filter(|r| r.text.contains("comment"))
        .collect();
    assert_eq!(left, vec![], "rules outlived every DEL");
    assert_eq!(f.ipam_addresses(), Vec::<String>::new());
    assert_eq!(f.record_files(), Vec::<String>::new());
    let out = status(&f);
    assert!(
        out.status.success(),
        "STATUS at the end: {}",
        describe(&out)
    );
}

#[test]
fn an_unclean_reboot_releases_the_old_boots_nftables_rules_and_addresses_only() {
    require_v110!();
    let f = v110_fixture();
    let this_boot = boot_id();
    assert_ne!(this_boot, OLD_BOOT);

    // The old boot: four pods, each with a port, added under another boot ID.
    let old: Vec<(String, u16)> = (1..=4).map(|i| (format!("old-{i}"), 9000 + i)).collect();
    let mut old_ns: Vec<Netns> = old.iter().map(|_| Netns::new()).collect();
    let mut old_ips = Vec::new();
    for ((cid, port), ns) in old.iter().zip(&old_ns) {
        let mut c = f.driver_cmd(
            "add",
            cid,
            "eth0",
            Some(&ns.path_str()),
            Some(&port_mappings(*port)),
        );
        c.env("CNI_LEDGER_TEST_BOOT_ID", OLD_BOOT);
        let out = c.output().unwrap();
        assert!(out.status.success(), "ADD {cid}: {}", describe(&out));
        let ip = first_ip(&serde_json::from_slice(&out.stdout).unwrap());
        let rec: Value =
            serde_json::from_slice(&fs::read(f.record_path(cid, "eth0")).unwrap()).unwrap();
        assert_eq!(rec["record"]["bootId"], json!(OLD_BOOT), "{rec:#}");
        old_ips.push(ip);
    }
    // The reboot: the old namespaces are gone; nobody ran DEL.
    for ns in &mut old_ns {
        ns.delete();
    }

    // This boot: three live pods.
    let live: Vec<(String, u16)> = (1..=3).map(|i| (format!("live-{i}"), 9100 + i)).collect();
    let live_ns: Vec<Netns> = live.iter().map(|_| Netns::new()).collect();
    let live_ips: Vec<String> = live
        .iter()
        .zip(&live_ns)
        .map(|((cid, port), ns)| add_pod(&f, cid, ns, *port))
        .collect();

    // Controls: before gc every pod, old and live, has its rules and its address, so the
    // checks after gc can fail.
    for (((cid, port), ip), _) in old.iter().zip(&old_ips).zip(&old_ns) {
        assert_pod_rules(&f, cid, ip, *port);
        assert!(ipam_file(&f, ip).exists(), "{cid}: no address before gc");
    }
    for ((cid, port), ip) in live.iter().zip(&live_ips) {
        assert_pod_rules(&f, cid, ip, *port);
    }

    // A dry run changes nothing: no rule, no address, no record.
    let before = (ruleset(&f), f.ipam_addresses(), f.record_files());
    let (out, rep) = f.gc(&["--dry-run"]);
    // Exit 1: work left to do.
    assert_eq!(
        out.status.code(),
        Some(1),
        "gc --dry-run: {}",
        describe(&out)
    );
    let rep = rep.expect("gc --dry-run printed no report");
    assert_eq!(rep["summary"]["wouldReplay"], json!(4), "{rep:#}");
    assert_eq!(
        (ruleset(&f), f.ipam_addresses(), f.record_files()),
        before,
        "gc --dry-run changed something: {rep:#}"
    );

    // gc, as the boot unit runs it (default grace: a boot change bypasses it).
    let (out, rep) = f.gc(&[]);
    assert!(
        out.status.success(),
        "gc: {}\nlog:\n{}",
        describe(&out),
        f.log()
    );
    let rep = rep.expect("gc printed no report");
    let records = rep["records"].as_array().expect("report records");
    for (cid, _) in &old {
        let r = records
            .iter()
            .find(|r| r["containerId"] == json!(cid))
            .unwrap_or_else(|| panic!("gc did not report {cid}: {rep:#}"));
        assert_eq!(r["reason"], json!("boot-changed"), "{r:#}");
        assert_eq!(r["action"], json!("replayed"), "{r:#}");
    }
    for (cid, _) in &live {
        assert!(
            records
                .iter()
                .all(|r| r["containerId"] != json!(cid) || r["action"] != json!("replayed")),
            "gc replayed the live {cid}: {rep:#}"
        );
    }

    let rules = ruleset(&f);
    for ((cid, _), ip) in old.iter().zip(&old_ips) {
        // Every portmap rule of the old boot is gone ...
        let left: Vec<Rule> = rules_of(&rules, cid)
            .into_iter()
            .filter(|r| r.table == "ip cni_hostport")
            .collect();
        assert_eq!(left, vec![], "{cid}: portmap rules outlived gc");
        assert!(
            !rules.iter().any(|r| r.text.contains(&format!("{ip}:80"))),
            "{cid}: a DNAT to {ip} outlived gc: {rules:#?}"
        );
        // ... and so is its address and its record.
        assert!(!ipam_file(&f, ip).exists(), "{cid}: {ip} outlived gc");
        assert!(
            !f.record_path(cid, "eth0").exists(),
            "{cid}: record outlived gc"
        );
        // Bridge v1.10's DEL drops its masquerade rule only inside the pod's namespace
        // (with no namespace it releases the address alone), and a real reboot empties
        // the kernel's tables anyway: any rule of the old pod still here is that one.
        for r in rules_of(&rules, cid) {
            assert_eq!(
                (r.table.as_str(), r.chain.as_str()),
                ("inet cni_plugins_masquerade", "masq_checks"),
                "{cid}: a rule other than bridge's masquerade outlived gc: {r:?}"
            );
        }
    }
    // None of a live pod's rules, addresses or records went, and libcni's CHECK of each
    // still passes.
    for (((cid, port), ip), ns) in live.iter().zip(&live_ips).zip(&live_ns) {
        assert_pod_rules(&f, cid, ip, *port);
        assert!(ipam_file(&f, ip).exists(), "{cid}: gc released its {ip}");
        assert!(
            f.record_path(cid, "eth0").exists(),
            "{cid}: gc removed its record"
        );
        f.check(
            cid,
            "eth0",
            Some(&ns.path_str()),
            Some(&port_mappings(*port)),
        )
        .unwrap_or_else(|e| panic!("CHECK {cid} after gc: {e}"));
    }
    let mut want = live_ips.clone();
    want.sort();
    assert_eq!(
        f.ipam_addresses(),
        want,
        "addresses left are not the live pods'"
    );

    // A second gc finds nothing more to do.
    let (out, rep) = f.gc(&[]);
    assert!(out.status.success(), "second gc: {}", describe(&out));
    let rep = rep.unwrap();
    assert!(
        rep["records"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["action"] != json!("replayed")),
        "second gc replayed again: {rep:#}"
    );
}
