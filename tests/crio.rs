//! CRI-O's own reboot story (issue 39), against a real CRI-O v1.36 built from its Go
//! module by scripts/build-crio.sh (pinns from the module's own source), with Debian's
//! conmon and runc. Pods are made over CRI with crictl (scripts/build-k8s.sh's). CRI-O
//! runs on a node of the test's own (`Node`: a mount namespace where the node's paths,
//! /run/crio and /var/lib/crio are fresh tmpfs, and a network namespace), with its config,
//! storage (vfs), runroot and socket there. Its conflist, `[bridge+host-local, cl-probe]`
//! at cniVersion 1.1.0 with the ledger added by `cni-ledger inject` (head and tail), is in
//! /etc/cni/net.d; its plugins are the reference plugins v1.10 of scripts/build-plugins.sh
//! (Debian's speak CNI 1.0.0 at most, and libcni sends GC only to a 1.1.0 list), the
//! ledger and cl-probe, in /opt/cni/bin.
//!
//! What CRI-O v1.36.3 does (its source): once started, `Server.restore` calls `networkGC`
//! with the sandboxes it could restore; the CNI manager gives ocicni's `GC` 30 s, and ocicni
//! calls libcni's `GCNetworkList` once per network it loaded, with those sandboxes as the
//! valid attachments (`null` when there are none). libcni DELs each cached attachment not
//! in the list through today's conflist, stopping at a failing plugin, then sends GC to
//! every plugin of the list. A failure is logged and never retried. bridge v1.10 does
//! nothing on GC (host-local's GC is reached only through an IPAM call bridge does not
//! make): what libcni's cache does not know, only the ledger releases.
//!
//! The story: two pods run, recorded under an old boot ID (`CNI_LEDGER_TEST_BOOT_ID` in
//! CRI-O's environment, which the plugins inherit); an unclean stop (SIGKILL to crio, the
//! conmons and the pods at once); what a reboot clears goes (/run/crio: runroot, version
//! file, pinned namespaces; the bridge; the pods' cgroups); `crio wipe` as CRI-O's unit
//! runs it at boot (after an unclean shutdown it removes the whole storage, so the pause
//! image is loaded again, as a node would pull it); one pod's libcni cache entry lost;
//! the other's DEL fails (cl-probe's `failDelMarker`, in that pod's recorded chain only).
//! CRI-O starts: its one-shot GC reaches the ledger's GC verb, which releases the lost
//! entry's attachment and the failing one's address, and answers error 11 for the latter,
//! whose record stays; `gc`, as the systemd unit runs it, keeps to the backoff that
//! failure set, then releases it. A pod made after the restart keeps its record, address
//! and eth0 throughout, and through CRI-O's GC on a clean restart, which names it valid.
//! Needs root, gcc, python3, podman, Debian's conmon and runc, and the builds above.
//!
//!     cargo test --features testing --test crio
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;
mod cri_common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use agent_common::wait_for;
use common::*;
use cri_common::node::*;
use cri_common::*;
use serde_json::{json, Value};

const NETWORK: &str = "crio-pods";
const BRIDGE: &str = "clcrio0";
const OLD_BOOT: &str = "cni-ledger-crio-test-old-boot";
/// The node's paths CRI-O uses beyond the CNI ones: its run dir (socket, runroot, pinned
/// namespaces, runc's state, and `crio wipe`'s fixed marker /run/crio/crio-wipe-done) and
/// its state dir (storage, clean-shutdown file).
const CRIO_RUN: &str = "/run/crio";
const CRIO_LIB: &str = "/var/lib/crio";

/// Debian's runc, with a negative oomScoreAdj dropped from the bundle's config on
/// `create`: CRI-O gives every pause process -998 (and has no setting against it), and
/// lowering a score needs CAP_SYS_RESOURCE, which root lacks on machines like the test's.
const RUNC_WRAPPER: &str = r#"#!/usr/bin/python3
import json, os, sys
args = sys.argv[1:]
if "create" in args:
    bundle = "."
    for i, a in enumerate(args):
        if a in ("--bundle", "-b") and i + 1 < len(args):
            bundle = args[i + 1]
        elif a.startswith("--bundle="):
            bundle = a.split("=", 1)[1]
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    if spec.get("process", {}).get("oomScoreAdj", 0) < 0:
        del spec["process"]["oomScoreAdj"]
        with open(path, "w") as f:
            json.dump(spec, f)
os.execv("/usr/bin/runc", ["runc"] + args)
"#;

/// The bin dir scripts/build-crio.sh fills (asked, so the version is pinned there only).
fn crio_bin_dir() -> PathBuf {
    let out = run_ok(
        Command::new("bash")
            .arg(repo().join("scripts/build-crio.sh"))
            .arg("--path"),
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// crictl as scripts/build-k8s.sh caches it: its pinned version, read from the script.
fn crictl_path() -> PathBuf {
    let script = fs::read_to_string(repo().join("scripts/build-k8s.sh")).unwrap();
    let version = script
        .lines()
        .find_map(|l| l.strip_prefix("CRICTL_VERSION="))
        .expect("build-k8s.sh pins CRICTL_VERSION");
    let cache = std::env::var("CNI_LEDGER_K8S_CACHE")
        .unwrap_or_else(|_| "/var/cache/cni-ledger-k8s".to_string());
    PathBuf::from(format!("{cache}/crictl-{version}/bin/crictl"))
}

/// The reference plugins v1.10.x: scripts/build-plugins.sh prints their bin dir (a no-op
/// once built, as scripts/test.sh builds them first).
fn v110_bin() -> PathBuf {
    let out = run_ok(Command::new("bash").arg(repo().join("scripts/build-plugins.sh")));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The node's conflist as an operator makes it: bridge with host-local and cl-probe
/// logging each call, at 1.1.0, then `cni-ledger inject` (the ledger first, its tail last),
/// and the head's log raised to info, to a file of the test's. No portmap: CRI-O maps host
/// ports itself (its hostportManager) and never hands a plugin `portMappings`.
fn write_conflist(node: &Node, conf: &Path, tmp: &Path) {
    let plain = json!({"cniVersion": "1.1.0", "name": NETWORK, "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": true,
         "ipam": {"type": "host-local", "subnet": "198.18.253.0/24"}},
        {"type": "cl-probe", "logFile": tmp.join("probe.log")},
    ]});
    fs::write(conf, plain.to_string()).unwrap();
    let on_node = Path::new("/etc/cni/net.d").join(conf.file_name().unwrap());
    run_ok(&mut node.cmd(&[
        "/opt/cni/bin/cni-ledger".into(),
        "inject".into(),
        on_node.display().to_string(),
    ]));
    edit_conflist(conf, |doc| {
        let head = &mut doc["plugins"][0];
        head["logFile"] = json!(tmp.join("ledger.log"));
        head["logLevel"] = json!("info");
    });
    let doc: Value = serde_json::from_slice(&fs::read(conf).unwrap()).unwrap();
    let types: Vec<&str> = doc["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["cni-ledger", "bridge", "cl-probe", "cni-ledger"],
        "{doc:#}"
    );
}

/// Changes the conflist as a careful operator's tool does: a new file renamed over the old.
/// CRI-O reloads the dir on every event in it, and a write in place is first seen as a
/// truncated, invalid file: CRI-O then has no network and refuses the next sandbox.
fn edit_conflist(conf: &Path, edit: impl FnOnce(&mut Value)) {
    let mut doc: Value = serde_json::from_slice(&fs::read(conf).unwrap()).unwrap();
    edit(&mut doc);
    // Not a .conf/.conflist/.json name: CRI-O's loader skips it.
    let tmp = conf.with_file_name(format!(
        ".{}.tmp",
        conf.file_name().unwrap().to_string_lossy()
    ));
    fs::write(&tmp, doc.to_string()).unwrap();
    fs::rename(&tmp, conf).unwrap();
}

/// CRI-O on the node: its config in the test's dir, everything it keeps on the node's
/// paths. Killed, with its conmons and pods, on drop (`RuntimeProcs`).
struct Crio {
    bin: PathBuf,
    dir: PathBuf,
    child: Option<Child>,
    starts: usize,
    procs: Option<RuntimeProcs>,
    cgroup_parent: String,
}

impl Crio {
    fn new(bin: PathBuf, dir: &Path) -> Crio {
        fs::create_dir_all(dir.join("crio.conf.d")).unwrap();
        fs::create_dir_all(dir.join("pods")).unwrap();
        let runc = dir.join("runc");
        fs::write(&runc, RUNC_WRAPPER).unwrap();
        set_mode(&runc, 0o755);
        let policy = dir.join("policy.json");
        fs::write(
            &policy,
            r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
        )
        .unwrap();
        let config = format!(
            r#"[crio]
root = "{CRIO_LIB}/storage"
runroot = "{CRIO_RUN}/storage"
storage_driver = "vfs"
log_dir = "{logs}"
version_file = "{CRIO_RUN}/version"
version_file_persist = "{CRIO_LIB}/version"
clean_shutdown_file = "{CRIO_LIB}/clean.shutdown"

[crio.api]
listen = "{CRIO_RUN}/crio.sock"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
# A pause process in every pod, as containerd runs it: something to kill in the unclean stop.
drop_infra_ctr = false
namespaces_dir = "{CRIO_RUN}/ns"
pinns_path = "{pinns}"
container_exits_dir = "{CRIO_RUN}/exits"
container_attach_socket_dir = "{CRIO_RUN}"
hooks_dir = []

[crio.runtime.runtimes.runc]
runtime_path = "{runc}"
runtime_root = "{CRIO_RUN}/runc"
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"

[crio.image]
pause_image = "{SANDBOX_IMAGE}"
signature_policy = "{policy}"

[crio.network]
network_dir = "/etc/cni/net.d"
plugin_dirs = ["/opt/cni/bin"]

[crio.nri]
enable_nri = false
"#,
            logs = dir.join("pods").display(),
            pinns = bin.join("pinns").display(),
            runc = runc.display(),
            policy = policy.display(),
        );
        // A drop-in of the test's own and an empty main file: nothing of the machine's
        // /etc/crio.
        fs::write(dir.join("crio.conf.d/10-test.conf"), config).unwrap();
        fs::write(dir.join("crio.conf"), "").unwrap();
        Crio {
            bin,
            dir: dir.to_path_buf(),
            child: None,
            starts: 0,
            procs: None,
            cgroup_parent: format!("/cl-crio-{}", std::process::id()),
        }
    }

    /// `crio <args>` on the node, on the test's config only.
    fn command(&self, node: &Node, args: &[&str]) -> Command {
        let mut argv = vec![
            self.bin.join("crio").display().to_string(),
            "--config".into(),
            self.dir.join("crio.conf").display().to_string(),
            "--config-dir".into(),
            self.dir.join("crio.conf.d").display().to_string(),
        ];
        argv.extend(args.iter().map(|s| s.to_string()));
        node.cmd(&argv)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!("crio-{}.log", self.starts))
    }

    /// The log of its latest start.
    fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Waits until CRI-O has reloaded `on_node` (a conflist, by its path on the node) after
    /// its log was `since` bytes long: the rename's event, then a load that followed it.
    /// Until then a new sandbox may still get the chain as it was.
    fn wait_reload(&self, on_node: &str, since: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log();
            let tail = log.get(since..).unwrap_or("");
            // fsnotify reports a rename onto the name as CREATE of it.
            let mut lines = tail.lines();
            let renamed = lines.by_ref().any(|l| {
                l.contains("CNI monitoring event") && l.contains("CREATE") && l.contains(on_node)
            });
            if renamed && lines.any(|l| l.contains("Found CNI network")) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "CRI-O did not reload {on_node} within 30 s:\n{tail}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts it with `env` added (and waits for its socket to answer).
    fn start(&mut self, node: &Node, env: &[(&str, &str)]) {
        assert!(self.child.is_none());
        self.starts += 1;
        let log = fs::File::create(self.log_path()).unwrap();
        let child = self
            .command(node, &["--log-level", "info"])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start crio");
        // nsenter execs crio: the child's PID is crio's.
        match &mut self.procs {
            Some(p) => p.add(child.id()),
            None => self.procs = Some(RuntimeProcs::new(child.id())),
        }
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.crictl(node, &["version"]).status.success() {
            let exited = self.child.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "crio did not come up:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGTERM, as its unit stops it: it writes its clean-shutdown file and exits.
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().unwrap().is_none() {
                assert!(
                    Instant::now() < deadline,
                    "crio did not stop:\n{}",
                    self.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// crictl at its socket, as the test (outside the node) reaches it.
    fn crictl(&self, node: &Node, args: &[&str]) -> Output {
        let endpoint = format!(
            "unix://{}",
            node.mounts.reach(CRIO_RUN).join("crio.sock").display()
        );
        Command::new(crictl_path())
            .args([
                "--runtime-endpoint",
                &endpoint,
                "--image-endpoint",
                &endpoint,
            ])
            .args(["--timeout", "60s"])
            .args(args)
            .output()
            .unwrap()
    }

    fn crictl_ok(&self, node: &Node, args: &[&str]) -> String {
        let out = self.crictl(node, args);
        assert!(
            out.status.success(),
            "crictl {args:?}: {}\ncrio log:\n{}",
            describe(&out),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `crictl runp` of a pod; its sandbox ID. Its pause process and
    /// that one's conmon are the runtime's processes from now on.
    fn run_pod(&mut self, node: &Node, name: &str) -> String {
        let config = json!({
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"),
                         "attempt": 0},
            "hostname": name,
            "log_directory": self.dir.join("pods").join(name),
            "linux": {"cgroup_parent": self.cgroup_parent},
        });
        let file = self.dir.join(format!("{name}.json"));
        fs::write(&file, config.to_string()).unwrap();
        let id = self.crictl_ok(node, &["runp", file.to_str().unwrap()]);
        let pause = self.pause_pid(node, &id);
        let conmon = Proc::of(pause)
            .and_then(|p| p.parent())
            .expect("pause's parent");
        let comm = fs::read_to_string(format!("/proc/{conmon}/comm")).unwrap_or_default();
        assert_eq!(comm.trim(), "conmon", "pause's parent");
        let procs = self.procs.as_mut().unwrap();
        procs.add(conmon);
        procs.add(pause);
        id
    }

    /// The PID of the pod's pause process, as CRI-O's verbose status gives it.
    fn pause_pid(&self, node: &Node, id: &str) -> u32 {
        let v: Value =
            serde_json::from_str(&self.crictl_ok(node, &["inspectp", "-o", "json", id])).unwrap();
        v["info"]["pid"]
            .as_u64()
            .unwrap_or_else(|| panic!("no info.pid for {id}: {v:#}")) as u32
    }

    /// The unclean stop: SIGKILL to crio, every conmon and every pod at once.
    fn kill_all(&mut self) {
        self.procs.as_mut().unwrap().kill_all();
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// The pods' cgroups, in every hierarchy: a reboot's, or a runtime's on a clean stop.
    fn remove_cgroups(&self) {
        for h in fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
            remove_tree(&h.path().join(self.cgroup_parent.trim_start_matches('/')));
        }
    }
}

/// Removes a cgroup dir and the ones below it, deepest first (each empty of processes).
fn remove_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&e.path());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while fs::remove_dir(dir).is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for Crio {
    fn drop(&mut self) {
        // A failed assertion must not leave crio, conmons or pause processes behind, nor
        // anything in the node's mount namespace when the node goes.
        if let Some(procs) = self.procs.take() {
            let all = procs.alive();
            RuntimeProcs::signal(&all);
            for p in &all {
                process_gone(p.pid, 10);
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        self.remove_cgroups();
    }
}

/// The pause image in CRI-O's storage: loaded with podman on the same storage (no
/// registry here), as a node would pull it.
fn load_pause_image(node: &Node, tarball: &Path) {
    let argv: Vec<String> = [
        "podman",
        "--root",
        &format!("{CRIO_LIB}/storage"),
        "--runroot",
        &format!("{CRIO_RUN}/storage"),
        "--storage-driver",
        "vfs",
        "--tmpdir",
        &format!("{CRIO_RUN}/podman"),
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "none",
        "load",
        "-i",
        tarball.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = node.cmd(&argv).output().unwrap();
    assert!(out.status.success(), "podman load: {}", describe(&out));
}

/// How many lines of a log hold `text`.
fn count_lines(log: &Path, text: &str) -> usize {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(text))
        .count()
}

/// cl-probe's log lines for `verb` of container `id`.
fn probe_calls(tmp: &Path, verb: &str, id: &str) -> usize {
    let prefix = format!("{verb} cid={id} ");
    fs::read_to_string(tmp.join("probe.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .count()
}

/// A pod as the node shows it: its record, host-local's address, eth0's inside.
#[derive(Debug, PartialEq)]
struct Seen {
    record: Option<Value>,
    ipam: Option<String>,
    eth0: Option<String>,
}

fn seen(node: &Node, id: &str, pause: u32) -> Seen {
    Seen {
        record: node.record(NETWORK, id),
        ipam: node.address(NETWORK, id),
        eth0: eth0_of(pause),
    }
}

/// A pod running as it should: recorded (under `boot`), its address held and on eth0.
fn assert_running(node: &Node, id: &str, pause: u32, boot: &str) -> Seen {
    let s = seen(node, id, pause);
    let record = s
        .record
        .as_ref()
        .unwrap_or_else(|| panic!("{id} unrecorded: {s:?}"));
    assert_eq!(record["bootId"], json!(boot), "{id}");
    assert!(s.ipam.is_some(), "{id}: {s:?}");
    assert_eq!(s.ipam, s.eth0, "{id}");
    s
}

#[test]
fn crio_reboot_gc_verb_and_gc_release_what_the_old_boot_left() {
    require_root!();
    let bin = crio_bin_dir();
    let crictl = crictl_path();
    require_tools!(
        bin.join("crio").to_str().unwrap(),
        bin.join("pinns").to_str().unwrap(),
        crictl.to_str().unwrap()
    );
    let tmp = TempDir::new("crio");
    let tmp = tmp.path();
    let net = Netns::new();
    run_ok(Command::new("ip").args(["-n", net.name(), "link", "set", "lo", "up"]));
    let mut dirs: Vec<&str> = NODE_DIRS.to_vec();
    dirs.extend([CRIO_RUN, CRIO_LIB]);
    let node = Node {
        mounts: PrivateRun::over(&dirs),
        net,
    };
    let plugins = node.mounts.reach("/opt/cni/bin");
    let v110 = v110_bin();
    for p in ["bridge", "host-local", "loopback"] {
        symlink(v110.join(p), plugins.join(p)).unwrap();
    }
    install_test_plugin(&plugins, "cl-probe");
    fs::copy(ledger_bin(), plugins.join("cni-ledger")).unwrap();
    let conf = node.mounts.reach("/etc/cni/net.d/10-crio-pods.conflist");
    let marker = tmp.join("fail-del");
    write_conflist(&node, &conf, tmp);

    let tarball = build_pause_image(tmp);
    load_pause_image(&node, &tarball);
    let mut crio = Crio::new(bin, &tmp.join("crio"));

    // The old boot: two pods. `lost` on the chain as it was; then cl-probe gains its DEL
    // switch, and `failing` is made on that chain (the ledger replays each record with the
    // chain of its ADD; libcni DELs with today's conflist).
    crio.start(&node, &[("CNI_LEDGER_TEST_BOOT_ID", OLD_BOOT)]);
    let lost = crio.run_pod(&node, "lost");
    let since = crio.log().len();
    edit_conflist(&conf, |doc| {
        doc["plugins"][2]["failDelMarker"] = json!(marker)
    });
    crio.wait_reload("/etc/cni/net.d/10-crio-pods.conflist", since);
    let failing = crio.run_pod(&node, "failing");
    for id in [&lost, &failing] {
        assert_running(&node, id, crio.pause_pid(&node, id), OLD_BOOT);
    }

    // The unclean stop, then what a reboot clears: /run/crio (the runroot, the version
    // file, the pinned namespaces, runc's state), the bridge, the pods' cgroups.
    crio.kill_all();
    run_ok(&mut node.cmd(&[
        "sh".into(),
        "-c".into(),
        format!("umount -R {CRIO_RUN} && mount -t tmpfs -o mode=0755 cl-test {CRIO_RUN}"),
    ]));
    run_ok(Command::new("ip").args(["-n", node.net.name(), "link", "del", BRIDGE]));
    crio.remove_cgroups();

    // `crio wipe` at boot: no version file (rebooted) and no clean-shutdown file (unclean),
    // so it removes the whole storage, images too.
    let out = crio.command(&node, &["wipe"]).output().unwrap();
    assert!(out.status.success(), "crio wipe: {}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("suspected unclean shutdown"),
        "{}",
        describe(&out)
    );
    load_pause_image(&node, &tarball);

    // One pod's libcni cache entry lost; the other's DEL fails while the marker is there.
    let cache = node
        .mounts
        .reach("/var/lib/cni/results")
        .join(format!("{NETWORK}-{lost}-eth0"));
    fs::remove_file(&cache).unwrap();
    fs::write(&marker, "").unwrap();

    // CRI-O starts on the new boot: nothing to restore, so its one-shot GC has no valid
    // attachment. libcni DELs `failing` (cached) and fails; the ledger's GC verb replays
    // both records and cleans `lost`, which libcni's cache no longer knew.
    let gc_calls = probe_calls(tmp, "GC", "");
    crio.start(&node, &[]);
    let ledger_log = tmp.join("ledger.log");
    let gc_line = format!("GC {NETWORK}: 2 stale, 1 replayed, 1 retrying, 0 failed");
    wait_for(Duration::from_secs(40), || {
        count_lines(&ledger_log, &gc_line) == 1
    })
    .unwrap_or_else(|| {
        panic!(
            "the GC verb never ran as expected:\nledger log:\n{}\ncrio log:\n{}",
            fs::read_to_string(&ledger_log).unwrap_or_default(),
            crio.log()
        )
    });
    assert_eq!(
        crio.crictl_ok(&node, &["pods", "-q"]),
        "",
        "the wipe left sandboxes"
    );
    // The verb's error 11 reaches CRI-O, which logs it and never tries again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !crio.log().contains("Error while GCing network") {
        assert!(Instant::now() < deadline, "crio log:\n{}", crio.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = crio.log();
    assert!(log.contains(&format!("{failing}/eth0")), "{log}");
    assert!(!log.contains(&format!("{lost}/eth0")), "{log}");
    // cl-probe saw libcni's DEL of `failing`, the verb's replay of each, and GC.
    assert_eq!(
        probe_calls(tmp, "DEL", &failing),
        2,
        "libcni's DEL and the replay"
    );
    assert_eq!(probe_calls(tmp, "DEL", &lost), 1, "the replay only");
    assert_eq!(probe_calls(tmp, "GC", ""), gc_calls + 1, "one GC call");
    // `lost`: record and address released by the verb.
    assert!(node.record(NETWORK, &lost).is_none());
    assert!(node.address(NETWORK, &lost).is_none());
    // `failing`: its address too (the replay runs the rest of the chain past a failing
    // plugin, docs/DESIGN.md), but its record and libcni's entry stay for gc.
    assert!(node.record(NETWORK, &failing).is_some());
    assert!(node.address(NETWORK, &failing).is_none());
    let failing_cache = cache.with_file_name(format!("{NETWORK}-{failing}-eth0"));
    assert!(failing_cache.exists());

    // A pod of the new boot, made while `failing` waits.
    let live = crio.run_pod(&node, "live");
    let live_pause = crio.pause_pid(&node, &live);
    let live_seen = assert_running(&node, &live, live_pause, &boot_id());

    // gc, as the systemd unit runs it, keeps to the backoff the verb's failed replay set.
    let (code, rep, out) = node.gc(&["--json"]);
    assert_eq!(code, 1, "{rep:#}\n{}", describe(&out));
    assert_eq!(rep["summary"]["stale"], json!(1), "{rep:#}");
    let r = &rep["records"][0];
    assert_eq!(r["containerId"], json!(failing), "{rep:#}");
    assert_eq!(r["action"], json!("skip-backoff"), "{rep:#}");
    assert_eq!(probe_calls(tmp, "DEL", &failing), 2);

    // The plugin is back; once the backoff is over, the unit's next run releases `failing`
    // (its boot is gone) and leaves `live` alone.
    fs::remove_file(&marker).unwrap();
    let due = r["nextAttemptAt"]
        .as_str()
        .and_then(cni_ledger::time::parse_rfc3339)
        .unwrap_or_else(|| panic!("no nextAttemptAt: {rep:#}"));
    let wait = due - cni_ledger::time::now();
    assert!((0..=10).contains(&wait), "backoff {wait}s: {rep:#}");
    std::thread::sleep(Duration::from_secs(wait as u64 + 1));
    let (code, rep, out) = node.gc(&["--json"]);
    assert_eq!(code, 0, "{rep:#}\n{}", describe(&out));
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep:#}");
    let r = &rep["records"][0];
    assert_eq!(r["containerId"], json!(failing), "{rep:#}");
    assert_eq!(r["reason"], json!("boot-changed"), "{rep:#}");
    assert!(node.record(NETWORK, &failing).is_none());
    assert!(!failing_cache.exists());
    assert_eq!(probe_calls(tmp, "DEL", &failing), 3);
    assert_eq!(seen(&node, &live, live_pause), live_seen);

    // A clean restart: CRI-O restores `live` and its GC names it valid: kept.
    let kept = format!("GC {NETWORK}: 0 stale, 0 replayed, 0 retrying, 0 failed");
    let before = count_lines(&ledger_log, &kept);
    crio.stop();
    crio.start(&node, &[]);
    wait_for(Duration::from_secs(40), || {
        count_lines(&ledger_log, &kept) > before
    })
    .unwrap_or_else(|| panic!("no GC on the clean restart:\n{}", crio.log()));
    assert_eq!(seen(&node, &live, live_pause), live_seen);
    assert_eq!(probe_calls(tmp, "DEL", &live), 0);

    // kubelet's teardown goes through the ledger's DEL as usual.
    crio.crictl_ok(&node, &["stopp", &live]);
    crio.crictl_ok(&node, &["rmp", &live]);
    assert!(node.record(NETWORK, &live).is_none());
    assert!(node.address(NETWORK, &live).is_none());
    crio.stop();
}
