//! The ledger goes only into chains whose `cniVersion` it serves (DESIGN §8, do no harm):
//! `cni-ledger agent` over a conf dir holding conflists with no `cniVersion`, 0.1.0, 0.2.0
//! and 0.3.1 leaves the first three byte for byte and names them in `/readyz` and
//! `cni_ledger_conflist_unsupported_version`, and ADD through libcni works on every one;
//! a conflist an older release injected at such a version gets the ledger taken out
//! (with it, every ADD failed in the ledger's version check, which says so in skel's
//! words); `cni-ledger inject` refuses all three; a `cniVersions` list is read as libcni
//! v1.1 and v1.3 each read it, and each runs the chains. Needs root, curl, promtool, Go,
//! and libcni v1.3 with Go 1.27 under target/ (`driver13`).
//!
//!     cargo test --features testing --test agent_versions
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use agent_common::*;
use common::*;
use serde_json::{json, Value};

const SECOND: Duration = Duration::from_secs(1);

/// The versions under test: the file name's tag and the `cniVersion` (None: no key).
const VERSIONS: [(&str, Option<&str>); 4] = [
    ("none", None),
    ("v010", Some("0.1.0")),
    ("v020", Some("0.2.0")),
    ("v031", Some("0.3.1")),
];

/// One network of the fixture's conf dir: `[bridge+host-local]` on a bridge and a /26 of
/// the fixture's /24 of its own (`i` of 0..4), at `version`.
fn network_doc(f: &Fixture, i: usize, name: &str, version: Option<&str>) -> Value {
    let base = 64 * i;
    let mut doc = json!({
        "name": name,
        "plugins": [{
            "type": "bridge",
            "bridge": format!("{}{i}", f.bridge),
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": f.ipam_dir,
                "subnet": format!("{}.{base}/26", f.subnet_prefix),
                "gateway": format!("{}.{}", f.subnet_prefix, base + 1),
            }
        }]
    });
    if let Some(v) = version {
        doc["cniVersion"] = json!(v);
    }
    doc
}

/// Replaces the fixture's own conflist by the four networks; their (file, network) pairs.
fn four_networks(f: &Fixture) -> Vec<(PathBuf, String)> {
    fs::remove_file(&f.conf_file).unwrap();
    let tag = format!("clv{}", next_id());
    VERSIONS
        .iter()
        .enumerate()
        .map(|(i, (what, version))| {
            let name = format!("{tag}-{what}");
            let file = f.conf_dir.join(format!("{}0-{what}.conflist", i + 1));
            write_in_place(&file, &network_doc(f, i, &name, *version));
            (file, name)
        })
        .collect()
}

/// (bytes, inode, mtime in ns) of a file: equal means not written.
fn file_state(p: &Path) -> (Vec<u8>, u64, i64) {
    let m = fs::metadata(p).unwrap();
    (
        fs::read(p).unwrap(),
        m.ino(),
        m.mtime() * 1_000_000_000 + m.mtime_nsec(),
    )
}

/// `cni-ledger inject <args> <file>` (CLI face).
fn inject(args: &[&str], file: &Path) -> std::process::Output {
    Command::new(ledger_bin())
        .arg("inject")
        .args(args)
        .arg(file)
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null())
        .output()
        .expect("run cni-ledger inject")
}

#[test]
fn agent_over_all_conflists_injects_only_the_served_version_and_every_add_works() {
    require_root!();
    let mut f = Fixture::new();
    let nets = four_networks(&f);
    let before: Vec<_> = nets.iter().map(|(p, _)| file_state(p)).collect();
    let bin = preinstalled_bin(&f);
    let log = f.tmp.path().join("agent.log");
    let mut args = dir_args(&bin, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    args.extend(["--conflist".to_string(), "all".to_string()]);
    let agent = Agent::start(&ledger_bin(), &args, &log, None);
    let (served, _) = &nets[3];
    wait_for(5 * SECOND, || ledger_first(served))
        .unwrap_or_else(|| panic!("0.3.1 never injected:\n{}", agent.log_text()));

    // /readyz: the first file is the one the runtime uses, so its version fails readiness;
    // the others of `all` are named without failing it.
    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 503, "{body}");
    let line = |file: &Path| {
        body.lines()
            .find(|l| l.contains(&*file.display().to_string()))
            .unwrap_or_else(|| panic!("/readyz names no {}:\n{body}", file.display()))
            .to_string()
    };
    let first = line(&nets[0].0);
    assert!(
        first.starts_with("FAIL") && first.contains("unsupported cniVersion none"),
        "{first}"
    );
    assert!(first.contains("libcni reads it as 0.1.0"), "{first}");
    for (i, v) in [(1, "0.1.0"), (2, "0.2.0")] {
        let l = line(&nets[i].0);
        assert!(
            l.starts_with("WARN") && l.contains(&format!("unsupported cniVersion {v}")),
            "{l}"
        );
    }
    assert!(line(served).starts_with("ok ledger first"), "{body}");

    let m = agent.metrics();
    promtool_check(&m);
    for (i, (file, _)) in nets.iter().enumerate() {
        let series = format!(
            "cni_ledger_conflist_unsupported_version{{file=\"{}\"}}",
            file.display()
        );
        let want = if i < 3 { 1.0 } else { 0.0 };
        assert_eq!(sample(&m, &series), Some(want), "{series}\n{m}");
    }

    // The unserved ones were never written: same bytes, same inode, same mtime.
    for (i, (file, _)) in nets.iter().enumerate().take(3) {
        assert_eq!(
            file_state(file),
            before[i],
            "{} was written",
            file.display()
        );
    }

    // ADD through libcni works on every network; only the served one is recorded.
    let pods: Vec<Netns> = nets.iter().map(|_| Netns::new()).collect();
    let keep = f.network.clone();
    for (i, (file, net)) in nets.iter().enumerate() {
        f.network = net.clone();
        f.add(&format!("v{i}"), "eth0", Some(&pods[i].path_str()), None)
            .unwrap_or_else(|e| panic!("ADD on {}: {e}\n{}", file.display(), agent.log_text()));
    }
    assert_eq!(
        f.record_files(),
        [format!("{}:v3:eth0.json", nets[3].1)],
        "only the 0.3.1 network's ADD is recorded"
    );
    for (i, (_, net)) in nets.iter().enumerate() {
        f.network = net.clone();
        f.del(&format!("v{i}"), "eth0", Some(&pods[i].path_str()), None)
            .unwrap_or_else(|e| panic!("DEL on {net}: {e}"));
    }
    f.network = keep;
    assert!(f.record_files().is_empty(), "DEL left a record");

    // A later pass leaves them alone too.
    std::thread::sleep(SECOND / 2);
    for (i, (file, _)) in nets.iter().enumerate().take(3) {
        assert_eq!(
            file_state(file),
            before[i],
            "{} was written",
            file.display()
        );
    }
    drop(agent);
}

#[test]
fn inject_refuses_the_unserved_versions_naming_file_and_version_and_removes_from_them() {
    let tmp = TempDir::new("injv");
    for (what, version, shown) in [
        ("none", None, "no cniVersion (libcni reads it as 0.1.0)"),
        ("v010", Some("0.1.0"), "cniVersion \"0.1.0\""),
        ("v020", Some("0.2.0"), "cniVersion \"0.2.0\""),
    ] {
        let file = tmp.path().join(format!("10-{what}.conflist"));
        let mut doc = json!({"name": what, "plugins": [{"type": "bridge"}]});
        if let Some(v) = version {
            doc["cniVersion"] = json!(v);
        }
        write_in_place(&file, &doc);
        let before = fs::read(&file).unwrap();
        let out = inject(&[], &file);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
        assert!(
            err.contains(&*file.display().to_string()) && err.contains(shown),
            "the refusal names neither file nor version: {err}"
        );
        assert_eq!(fs::read(&file).unwrap(), before, "refused, yet written");
        // --dry-run refuses too; --remove takes an older injection out.
        assert_eq!(inject(&["--dry-run"], &file).status.code(), Some(1));
        let mut injected = doc.clone();
        injected["plugins"] = json!([
            {"type": "cni-ledger"},
            {"type": "bridge"},
            {"type": "cni-ledger", "role": "tail"}
        ]);
        write_in_place(&file, &injected);
        let out = inject(&["--remove"], &file);
        assert!(out.status.success(), "{}", describe(&out));
        let back: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        assert_eq!(back, doc, "--remove did not give back the chain");
    }
    // A served version next to them is injected in the same run; the exit still says 1.
    let ok = tmp.path().join("20-ok.conflist");
    write_in_place(
        &ok,
        &json!({"cniVersion": "0.3.1", "name": "ok", "plugins": [{"type": "bridge"}]}),
    );
    let bad = tmp.path().join("10-none.conflist");
    let out = Command::new(ledger_bin())
        .args(["inject"])
        .arg(&bad)
        .arg(&ok)
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(ledger_first(&ok), "{}", describe(&out));
    assert!(!ledger_first(&bad));
}

#[test]
fn agent_takes_an_older_releases_ledger_out_of_a_versionless_chain_and_adds_work_again() {
    require_root!();
    let f = Fixture::new();
    // What an older release left: the ledger in a conflist with no cniVersion.
    let plain = network_doc(&f, 0, &f.network.clone(), None);
    let mut injected = plain.clone();
    let entry = f.ledger_entry(&ChainSpec::ledger_only());
    injected["plugins"] =
        json!([entry, plain["plugins"][0], {"type": "cni-ledger", "role": "tail"}]);
    write_in_place(&f.conf_file, &injected);

    // Every ADD fails in the head, in skel's words: the version it reads is 0.1.0.
    let ns = Netns::new();
    let e = f
        .add("broken", "eth0", Some(&ns.path_str()), None)
        .unwrap_err();
    assert!(
        e.contains("incompatible CNI versions")
            && e.contains("config is \"0.1.0\" (the conflist has no cniVersion)"),
        "{e}"
    );
    // The plugin's own answer to what libcni passes (`"cniVersion": ""`): error code 1.
    let mut conf = entry.clone();
    conf["name"] = json!(f.network);
    conf["cniVersion"] = json!("");
    let mut child = Command::new(ledger_bin())
        .envs([
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", "direct"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_NETNS", &ns.path_str()),
            ("CNI_PATH", &f.cni_path()),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        conf.to_string().as_bytes(),
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["code"], json!(1), "{answer}");
    assert!(f.record_files().is_empty(), "a refused ADD was recorded");

    let bin = preinstalled_bin(&f);
    let log = f.tmp.path().join("agent.log");
    let args = dir_args(&bin, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    let agent = Agent::start(&ledger_bin(), &args, &log, None);
    wait_for(5 * SECOND, || types_in(&f.conf_file) == ["bridge"])
        .unwrap_or_else(|| panic!("the ledger never came out:\n{}", agent.log_text()));
    let now: Value = serde_json::from_slice(&fs::read(&f.conf_file).unwrap()).unwrap();
    assert_eq!(now, plain, "not the chain as it was without the ledger");
    // Logged just after the write.
    wait_for(2 * SECOND, || agent.log_text().contains("taken out"))
        .unwrap_or_else(|| panic!("not logged:\n{}", agent.log_text()));

    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains(&format!(
            "FAIL {}: unsupported cniVersion none",
            f.conf_file.display()
        )) && body.contains("taken out"),
        "{body}"
    );
    let m = agent.metrics();
    let series = format!(
        "cni_ledger_conflist_unsupported_version{{file=\"{}\"}}",
        f.conf_file.display()
    );
    assert_eq!(sample(&m, &series), Some(1.0), "{m}");

    // ADD works again, and the agent does not put the ledger back.
    f.add("fixed", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD after the ledger came out: {e}"));
    f.del("fixed", "eth0", Some(&ns.path_str()), None).unwrap();
    std::thread::sleep(SECOND / 2);
    assert_eq!(types_in(&f.conf_file), ["bridge"]);

    // Given a version it serves, the agent puts it in, and ADDs are recorded.
    let mut served = plain.clone();
    served["cniVersion"] = json!("0.3.1");
    write_in_place(&f.conf_file, &served);
    wait_for(5 * SECOND, || ledger_first(&f.conf_file))
        .unwrap_or_else(|| panic!("not injected at 0.3.1:\n{}", agent.log_text()));
    let m = agent.metrics();
    assert_eq!(sample(&m, &series), Some(0.0), "{m}");
    f.add("served", "eth0", Some(&ns.path_str()), None).unwrap();
    assert!(f.record_path("served", "eth0").exists());
    f.del("served", "eth0", Some(&ns.path_str()), None).unwrap();
    drop(agent);
}

#[test]
fn cniversions_are_read_as_libcni_1_1_and_1_3_read_them() {
    require_root!();
    let mut f = Fixture::new();
    fs::remove_file(&f.conf_file).unwrap();
    let tag = format!("clv{}", next_id());
    // Served under both: v1.1 runs it at 0.4.0, v1.3 at the highest listed not above
    // 1.1.0, 1.0.0.
    let both = format!("{tag}-both");
    let mut doc = network_doc(&f, 0, &both, Some("0.4.0"));
    doc["cniVersions"] = json!(["1.0.0", "0.3.1", "9.9.9"]);
    let both_file = f.conf_dir.join("10-both.conflist");
    write_in_place(&both_file, &doc);
    // v1.3 runs it at 1.0.0 but v1.1 at 0.2.0: with the ledger, a v1.1 runtime's ADDs fail.
    let split = format!("{tag}-split");
    let mut doc = network_doc(&f, 1, &split, Some("0.2.0"));
    doc["cniVersions"] = json!(["1.0.0"]);
    let split_file = f.conf_dir.join("20-split.conflist");
    write_in_place(&split_file, &doc);
    let before = file_state(&split_file);

    let bin = preinstalled_bin(&f);
    let log = f.tmp.path().join("agent.log");
    let mut args = dir_args(&bin, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    args.extend(["--conflist".to_string(), "all".to_string()]);
    let agent = Agent::start(&ledger_bin(), &args, &log, None);
    wait_for(5 * SECOND, || ledger_first(&both_file))
        .unwrap_or_else(|| panic!("never injected:\n{}", agent.log_text()));
    wait_for(2 * SECOND, || agent.get("/readyz").1.contains("WARN"))
        .unwrap_or_else(|| panic!("no WARN line:\n{}", agent.get("/readyz").1));
    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 200, "the runtime's file has the ledger: {body}");
    assert!(
        body.contains(&format!(
            "WARN {}: unsupported cniVersion 0.2.0/1.0.0: libcni v1.1 runs it at cniVersion \"0.2.0\"",
            split_file.display()
        )),
        "{body}"
    );

    // Each libcni runs both networks; the served one is recorded under each.
    let pod = Netns::new();
    for (driver, cid) in [(driver(), "l11"), (driver13(), "l13")] {
        f.driver = driver;
        f.network = both.clone();
        f.add(cid, "eth0", Some(&pod.path_str()), None)
            .unwrap_or_else(|e| panic!("{cid} ADD on {both}: {e}"));
        assert!(f.record_path(cid, "eth0").exists(), "{cid}: not recorded");
        f.del(cid, "eth0", Some(&pod.path_str()), None).unwrap();
        f.network = split.clone();
        f.add(cid, "eth0", Some(&pod.path_str()), None)
            .unwrap_or_else(|e| panic!("{cid} ADD on {split}: {e}"));
        f.del(cid, "eth0", Some(&pod.path_str()), None).unwrap();
    }
    assert_eq!(file_state(&split_file), before, "written");
    drop(agent);
}
