//! A namespace any process or mount on the node still holds is live (issue 30, item 2;
//! docs/DESIGN.md §5): a runtime in a mount namespace of its own (`MountFlags=slave`,
//! `PrivateMounts`, a snap) pins its pods' namespaces with mounts gc's mount namespace
//! never sees. gc must find them anyway and keep every address, interface and record.
//!
//! The runtime stand-in is `unshare -m --propagation slave` running a small script that
//! makes the pods' namespaces inside its own mount namespace (`unshare --net=FILE`: a
//! bind mount only it has), starts a process in some of them, and stays. ADD runs through
//! the real chain ([cni-ledger, bridge+host-local] via libcni) from inside that mount
//! namespace, with the paths as the runtime named them. From the host's view:
//!
//! - (a) `pa`: the path is missing (its directory is a tmpfs only the stand-in has);
//! - (b) `pb`: the path is an empty regular file (the bind mount's target, seen without
//!   the mount);
//! - (c) `pc`: missing too, and no process in it at all: only the pin holds it;
//! - (d) `pd`: another namespace, the host's own mount at the same path (netns-replaced
//!   by device and inode), under the stand-in's pin of the pod.
//!
//! And `cni-ledger adopt` from the host over a libcni cache entry of such a pod (made
//! with the ledger out of the chain) records the identity the pin shows, so gc keeps it.
//!
//! Needs root.
//!
//!     cargo test --features testing --test mountns
// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// The stand-in: its private netns directory, the pods' namespaces, a process in `pa`
/// and `pb`, then it waits. `$1` the private dir (tmpfs, host sees it empty), `$2` a dir
/// whose empty file `pb` the host sees, `$3` where to say it is ready.
const STAND_IN: &str = r#"
set -e
mount -t tmpfs cl-mntns "$1"
touch "$1/pa" "$1/pc"
unshare --net="$1/pa" true
unshare --net="$2/pb" true
unshare --net="$1/pc" true
unshare --net="$2/pd" true
nsenter --net="$1/pa" sleep 1000 </dev/null >/dev/null 2>&1 &
echo $! > "$3.pa"
nsenter --net="$2/pb" sleep 1000 </dev/null >/dev/null 2>&1 &
echo $! > "$3.pb"
nsenter --net="$2/pd" sleep 1000 </dev/null >/dev/null 2>&1 &
echo $! > "$3.pd"
touch "$3"
exec sleep 1000
"#;

/// The runtime stand-in and its pods' processes, killed on drop.
struct StandIn {
    child: Option<Child>,
    pods: Vec<u32>,
}

impl StandIn {
    fn start(private: &Path, shared: &Path, ready: &Path) -> StandIn {
        let child = Command::new("unshare")
            .args([
                "-m",
                "--propagation",
                "slave",
                "sh",
                "-c",
                STAND_IN,
                "stand-in",
            ])
            .arg(private)
            .arg(shared)
            .arg(ready)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn unshare");
        let mut s = StandIn {
            child: Some(child),
            pods: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            if let Some(status) = s.child.as_mut().unwrap().try_wait().unwrap() {
                let mut err = String::new();
                use std::io::Read;
                let _ = s
                    .child
                    .take()
                    .unwrap()
                    .stderr
                    .unwrap()
                    .read_to_string(&mut err);
                panic!("the stand-in exited ({status}): {err}");
            }
            assert!(Instant::now() < deadline, "the stand-in never got ready");
            std::thread::sleep(Duration::from_millis(5));
        }
        for pod in ["pa", "pb", "pd"] {
            let f = format!("{}.{pod}", ready.display());
            s.pods
                .push(fs::read_to_string(&f).unwrap().trim().parse().unwrap());
        }
        s
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// `cmd` run inside the stand-in's mount namespace.
    fn inside(&self, cmd: &Command) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount=/proc/{}/ns/mnt", self.pid()))
            .arg("--")
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .stdin(Stdio::null());
        c
    }

    /// Every process gone: the pods' processes, then the stand-in, its mount namespace
    /// (and the pins in it) with it.
    fn stop(&mut self) {
        for pid in self.pods.drain(..) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .output();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The host's own namespace mounted at `path` (as `ip netns add` would), unmounted on
/// drop: what the host's view of a path shows while a runtime pins another there.
struct HostMount(std::path::PathBuf);

impl HostMount {
    fn new(path: &Path) -> HostMount {
        fs::write(path, b"").unwrap();
        let out = Command::new("unshare")
            .arg(format!("--net={}", path.display()))
            .arg("true")
            .output()
            .unwrap();
        assert!(out.status.success(), "unshare --net: {}", describe(&out));
        HostMount(path.to_path_buf())
    }
}

impl Drop for HostMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
    }
}

/// Waits until no process has `pid` any more (killed orphans are reaped by init).
fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(Instant::now() < deadline, "pid {pid} did not exit");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The IPv4 address on eth0 in the namespace at `netns`, as the stand-in sees it.
fn eth0_addr(s: &StandIn, netns: &str) -> Option<String> {
    let mut ip = Command::new("nsenter");
    ip.arg(format!("--net={netns}"))
        .args(["ip", "-j", "-4", "addr", "show", "dev", "eth0"]);
    let out = s.inside(&ip).output().unwrap();
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v[0]["addr_info"][0]["local"].as_str().map(str::to_string)
}

#[test]
fn namespaces_pinned_in_a_runtimes_own_mount_namespace_are_live() {
    require_root!();
    let f = Fixture::with_spec(ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    let private = f.tmp.path().join("runtime-netns");
    let shared = f.tmp.path().join("runtime-files");
    fs::create_dir_all(&private).unwrap();
    fs::create_dir_all(&shared).unwrap();
    // (b): the host sees this empty file; the stand-in mounts the namespace over it.
    fs::write(shared.join("pb"), b"").unwrap();
    // (d): the host's path holds a namespace of its own; the stand-in pins the pod over it.
    let decoy = HostMount::new(&shared.join("pd"));
    let ready = f.tmp.path().join("stand-in-ready");
    let mut s = StandIn::start(&private, &shared, &ready);

    let pods: Vec<(String, String)> = [
        ("cid-a", private.join("pa")),
        ("cid-b", shared.join("pb")),
        ("cid-c", private.join("pc")),
        ("cid-d", shared.join("pd")),
    ]
    .into_iter()
    .map(|(cid, p)| (cid.to_string(), p.display().to_string()))
    .collect();
    let mut addrs = Vec::new();
    for (cid, netns) in &pods {
        let out = s
            .inside(&f.driver_cmd("add", cid, "eth0", Some(netns), None))
            .output()
            .unwrap();
        assert!(out.status.success(), "ADD {cid}: {}", describe(&out));
        let a = eth0_addr(&s, netns).unwrap_or_else(|| panic!("{cid}: no eth0 after ADD"));
        addrs.push(a);
    }
    // The host's view: (a) and (c) missing, (b) an empty regular file.
    assert!(!private.join("pa").exists() && !private.join("pc").exists());
    assert_eq!(fs::metadata(shared.join("pb")).unwrap().len(), 0);
    let records = f.record_files();
    let leases = f.ipam_addresses();
    assert_eq!(
        (records.len(), leases.len()),
        (4, 4),
        "{records:?} {leases:?}"
    );
    // (d): the host's view is a namespace, not the pod's.
    let host_view = fs::metadata(shared.join("pd")).unwrap();
    let pod_ns = fs::metadata(format!("/proc/{}/ns/net", s.pods[2])).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_ne!(
        host_view.ino(),
        pod_ns.ino(),
        "the decoy is the pod's namespace"
    );

    let (out, report) = f.gc(&["--grace", "0"]);
    let report = report.unwrap_or_else(|| panic!("gc printed no JSON: {}", describe(&out)));
    assert_eq!(report["summary"]["live"], json!(4), "{report:#}");
    assert_eq!(report["summary"]["stale"], json!(0), "{report:#}");
    assert_eq!(f.record_files(), records, "gc removed a live record");
    assert_eq!(f.ipam_addresses(), leases, "gc freed a live pod's address");
    for ((cid, netns), addr) in pods.iter().zip(&addrs) {
        assert_eq!(
            eth0_addr(&s, netns).as_ref(),
            Some(addr),
            "{cid}: eth0 gone from the pod after gc"
        );
    }
    let held = report["held"].as_array().expect("held in the report");
    let held_by = |cid: &str| {
        held.iter()
            .find(|h| h["containerId"] == json!(cid))
            .and_then(|h| h["heldBy"].as_str())
            .unwrap_or_else(|| panic!("{cid} not reported held: {report:#}"))
            .to_string()
    };
    for (cid, _) in &pods {
        let by = held_by(cid);
        assert!(
            by.starts_with("held by pid ") || by.starts_with("mounted at "),
            "{cid}: {by}"
        );
    }
    // (c) has no process: only the pin in the stand-in's mount namespace holds it.
    let pin = format!("mounted at {} in the mount namespace of pid ", pods[2].1);
    assert!(held_by("cid-c").starts_with(&pin), "{}", held_by("cid-c"));

    // list says the same, and why.
    for (cid, _) in &pods {
        let row = f.list_row(cid, "eth0").unwrap();
        assert_eq!(row["state"], json!("live"), "{row:#}");
        assert_eq!(row["identity"], json!("held"), "{row:#}");
        assert!(row["heldBy"].as_str().is_some(), "{row:#}");
    }

    // The CNI GC verb, every attachment in the runtime's valid list: the list judges only
    // what rules 2 and 3 left live, so without the node search it released them all too.
    let mut stdin = f.plugin_stdin("1.1.0");
    stdin["cni.dev/valid-attachments"] = pods
        .iter()
        .map(|(cid, _)| json!({"containerID": cid, "ifname": "eth0"}))
        .collect();
    let mut verb = f.host.cmd(ledger_bin());
    verb.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", "GC")
        .env("CNI_CONTAINERID", "")
        .env("CNI_NETNS", "")
        .env("CNI_ARGS", "")
        .env("CNI_IFNAME", "")
        .env("CNI_PATH", f.cni_path());
    let out = run_with_stdin(verb, &serde_json::to_vec(&stdin).unwrap());
    assert!(out.status.success(), "GC verb: {}", describe(&out));
    assert_eq!(
        f.record_files(),
        records,
        "the GC verb removed a live record"
    );
    assert_eq!(
        f.ipam_addresses(),
        leases,
        "the GC verb freed a live address"
    );

    // The control: the pods' processes and the stand-in gone, its mount namespace and
    // every pin with it: the next gc releases every address.
    let pids: Vec<u32> = s.pods.clone();
    s.stop();
    for pid in pids {
        wait_gone(pid);
    }
    let (out, report) = f.gc(&["--grace", "0"]);
    let report = report.unwrap_or_else(|| panic!("gc printed no JSON: {}", describe(&out)));
    assert_eq!(report["summary"]["replayed"], json!(4), "{report:#}");
    assert!(report.get("held").is_none(), "{report:#}");
    assert_eq!(f.record_files(), Vec::<String>::new());
    assert_eq!(f.ipam_addresses(), Vec::<String>::new());
    drop(decoy);
}

/// `cni-ledger adopt` from the host over libcni cache entries of pods the stand-in pins
/// where the host sees nothing (made with the ledger out of the chain): `pa` in its
/// private dir, and one at `/var/run/netns/<name>` as containerd names them (its
/// mountinfo shows `/run/netns/<name>`; the host sees the empty file under the pin). Each
/// record takes the identity the pin shows, is reported live, and gc keeps the pods'
/// addresses; once the stand-in is gone, gc releases them.
#[test]
fn adopt_finds_pods_pinned_in_a_runtimes_own_mount_namespace() {
    require_root!();
    let mut f = Fixture::with_spec(ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    let private = f.tmp.path().join("runtime-netns");
    let shared = f.tmp.path().join("runtime-files");
    fs::create_dir_all(&private).unwrap();
    fs::create_dir_all(&shared).unwrap();
    fs::write(shared.join("pb"), b"").unwrap();
    fs::write(shared.join("pd"), b"").unwrap();
    let ready = f.tmp.path().join("stand-in-ready");
    let mut s = StandIn::start(&private, &shared, &ready);
    // The host's /run/netns holds the empty file; only the stand-in has the pin.
    let name = format!("cl-mntns-{}", std::process::id());
    let host_file = Path::new("/run/netns").join(&name);
    let _remove = RemoveOnDrop(host_file.clone());
    let mut pin = Command::new("sh");
    pin.arg("-c").arg(format!(
        "touch {0} && unshare --net={0} true",
        host_file.display()
    ));
    let out = s.inside(&pin).output().unwrap();
    assert!(out.status.success(), "pin: {}", describe(&out));

    // The ledger out of the chain: libcni's cache is the only trace of the ADDs.
    let without = json!({
        "cniVersion": "1.0.0",
        "name": f.network,
        "plugins": [f.bridge_entry()],
    });
    f.write_conflist(&without);
    let pods = [
        ("cid-adopt", private.join("pa").display().to_string()),
        ("cid-var", format!("/var/run/netns/{name}")),
    ];
    let mut addrs = Vec::new();
    for (cid, netns) in &pods {
        let out = s
            .inside(&f.driver_cmd("add", cid, "eth0", Some(netns), None))
            .output()
            .unwrap();
        assert!(out.status.success(), "ADD {cid}: {}", describe(&out));
        addrs.push(eth0_addr(&s, netns).expect("no eth0 after ADD"));
        // libcni 1.1 caches no netns; 1.2 and later do, as here.
        let cache = f.cache_result_path(cid, "eth0");
        let mut entry: Value = serde_json::from_slice(&fs::read(&cache).unwrap()).unwrap();
        entry["netns"] = json!(netns);
        fs::write(&cache, serde_json::to_vec(&entry).unwrap()).unwrap();
    }
    assert!(
        f.record_files().is_empty(),
        "the ledger was not in the chain"
    );
    assert_eq!(fs::metadata(&host_file).unwrap().len(), 0);
    // Adoption takes networks whose chain holds the ledger: put it back.
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));

    let cache_dir = f.cache_dir.display().to_string();
    let conf_dir = f.conf_dir.display().to_string();
    let cni_path = f.cni_path();
    let out = f
        .ledger_cmd(&[
            "adopt",
            "--json",
            "--cni-cache-dir",
            &cache_dir,
            "--conf-dir",
            &conf_dir,
            "--cni-path",
            &cni_path,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "adopt: {}", describe(&out));
    let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (cid, _) in &pods {
        let adopted = rep["adopted"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["containerId"] == json!(cid))
            .unwrap_or_else(|| panic!("{cid} not adopted: {rep:#}"));
        assert_eq!(adopted["state"], json!("live"), "{rep:#}");
    }
    let leases = f.ipam_addresses();
    assert_eq!(leases.len(), 2, "{leases:?}");

    let (out, report) = f.gc(&["--grace", "0"]);
    let report = report.unwrap_or_else(|| panic!("gc printed no JSON: {}", describe(&out)));
    assert_eq!(report["summary"]["live"], json!(2), "{report:#}");
    assert_eq!(f.record_files().len(), 2, "gc removed an adopted record");
    assert_eq!(f.ipam_addresses(), leases, "gc freed a pod's address");
    for ((cid, netns), addr) in pods.iter().zip(&addrs) {
        assert_eq!(
            eth0_addr(&s, netns).as_ref(),
            Some(addr),
            "{cid}: eth0 gone"
        );
        let row = f.list_row(cid, "eth0").unwrap();
        assert_eq!(row["identity"], json!("held"), "{row:#}");
    }

    // The control: the stand-in and its pins gone, the adopted records are released.
    let pids: Vec<u32> = s.pods.clone();
    s.stop();
    for pid in pids {
        wait_gone(pid);
    }
    let (out, report) = f.gc(&["--grace", "0"]);
    let report = report.unwrap_or_else(|| panic!("gc printed no JSON: {}", describe(&out)));
    assert_eq!(report["summary"]["replayed"], json!(2), "{report:#}");
    assert_eq!(f.ipam_addresses(), Vec::<String>::new());
}

/// A file removed on drop.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}
