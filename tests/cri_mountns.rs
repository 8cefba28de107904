//! A namespace any process or mount on the node still holds is live (issue 30, item 2),
//! as users deploy it: a real containerd (Debian's 1.6, and unstable's 2.x unpacked under
//! target/ by scripts/fetch-unstable.sh) in a mount namespace of its own, as a unit with
//! `MountFlags=slave` or `PrivateMounts` runs it (`unshare -m --propagation slave`),
//! makes pods through CRI; its netns pins (`/var/run/netns/cni-...`) are mounts only it
//! and its shims see, and the node sees the empty files under them. cni-ledger runs as
//! shipped: the agent with the DaemonSet's args (read from deploy/kubernetes, so they
//! cannot drift) injects itself and runs gc, and `gc` runs from the node's mount
//! namespace with the systemd unit's ExecStart (packaging/systemd, install.sh's default
//! paths) plus `--grace 0`. Every pod keeps its address, its eth0 and its record; `list`
//! says what holds each. The controls: a pod removed through CRI goes by the runtime's
//! own DEL; a pod whose pause process is killed and whose pin is unmounted inside the
//! runtime's mount namespace is released by the next gc; the last pod once its mount
//! namespace died with its last process.
//!
//! The node is a mount namespace of the test's (`PrivateRun`) where the node's paths are
//! fresh tmpfs, and a network namespace of its own. Needs root, containerd, gcc, curl and
//! target/test-venv (PyYAML, for the manifest).
//!
//!     cargo test --features testing --test cri_mountns
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;
mod cri_common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use agent_common::*;
use common::*;
use cri_common::node::*;
use cri_common::*;
use serde_json::{json, Value};

/// `/proc/<pid>/ns/<ns>` as its link reads (`mnt:[4026531841]`).
fn ns_of(pid: u32, ns: &str) -> String {
    fs::read_link(format!("/proc/{pid}/ns/{ns}"))
        .map(|l| l.display().to_string())
        .unwrap_or_default()
}

fn dev_ino(path: &Path) -> Option<(u64, u64)> {
    fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[test]
fn containerd_in_its_own_mount_namespace_keeps_its_pods_through_gc_and_the_agent() {
    require_root!();
    require_tools!("target/test-venv");
    keeps_pods_of_a_runtime_with_its_own_mounts(ContainerdVersion::V1_6);
}

/// The same with containerd 2.x (unpacked under target/ by scripts/fetch-unstable.sh).
#[test]
fn containerd_2_in_its_own_mount_namespace_keeps_its_pods_through_gc_and_the_agent() {
    require_root!();
    require_tools!("target/test-venv");
    keeps_pods_of_a_runtime_with_its_own_mounts(ContainerdVersion::V2);
}

fn keeps_pods_of_a_runtime_with_its_own_mounts(version: ContainerdVersion) {
    let ds = daemonset();
    let net = Netns::new();
    run_ok(Command::new("ip").args(["-n", net.name(), "link", "set", "lo", "up"]));
    let node = Node {
        mounts: PrivateRun::over(&NODE_DIRS),
        net,
    };
    let bin = node.mounts.reach("/opt/cni/bin");
    for p in ["loopback", "bridge", "host-local", "portmap"] {
        std::os::unix::fs::symlink(Path::new(CNI_PLUGIN_DIR).join(p), bin.join(p)).unwrap();
    }
    let network = "clmntns";
    let conf = node.mounts.reach("/etc/cni/net.d/10-pods.conflist");
    let plain = json!({"cniVersion": "1.0.0", "name": network, "plugins": [
        {"type": "bridge", "bridge": "clmntns0", "isGateway": true,
         "ipam": {"type": "host-local", "subnet": "198.18.251.0/24"}},
        {"type": "portmap", "capabilities": {"portMappings": true}}]});
    fs::write(&conf, serde_json::to_vec_pretty(&plain).unwrap()).unwrap();

    // The agent with the DaemonSet's args: it installs itself and puts the ledger (and
    // its tail) into the chain before the runtime loads it.
    let tmp = TempDir::new("crimnt");
    let mut args = Vec::new();
    for a in ds["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
    {
        let a = a.as_str().unwrap();
        // What kubelet fills in and the node's root (its init's: here the node's holder)
        // differ; gc every second instead of every 5 minutes. `Agent` adds --listen.
        if a.starts_with("--listen=") {
            continue;
        }
        args.push(if a.starts_with("--probe-listen=") {
            format!("--probe-listen=127.0.0.1:{}", free_port())
        } else if a == "--node-root=/proc/1/root" {
            format!("--node-root={}", node.mounts.root())
        } else if a.starts_with("--gc-interval=") {
            "--gc-interval=1".to_string()
        } else {
            a.to_string()
        });
    }
    // Not in the manifest (its default is 60 s): no grace, so every run judges every pod.
    args.push("--grace=0".into());
    let mut agent = Agent::start_in_mounts(
        &ledger_bin(),
        &args,
        &tmp.path().join("agent.log"),
        node.net.name(),
        &node.mounts.mnt(),
    );
    wait_for(Duration::from_secs(30), || agent.get("/readyz").0 == 200)
        .unwrap_or_else(|| panic!("/readyz never 200:\n{}", agent.log_text()));
    assert!(ledger_first(&conf), "{}", agent.log_text());
    let chain = types_in(&conf);
    assert_eq!(
        chain.last().map(String::as_str),
        Some("cni-ledger"),
        "{chain:?}"
    );

    // containerd in a mount namespace of its own, on the node's CNI dirs.
    let tarball = build_pause_image(tmp.path());
    let dir = Containerd::configure_dirs_version(
        version,
        &tmp.path().join("containerd"),
        Containerd::DEFAULT_SOCKET,
        Path::new("/opt/cni/bin"),
        Path::new("/etc/cni/net.d"),
    );
    let mut ctrd = Containerd::launch_own_mounts(
        version,
        &dir,
        node.net.name(),
        &node.mounts,
        Containerd::DEFAULT_SOCKET,
    );
    let ctrd_pid = ctrd.pid().unwrap();
    let runtime_mnt = ns_of(ctrd_pid, "mnt");
    let node_mnt = fs::read_link(node.mounts.mnt())
        .unwrap()
        .display()
        .to_string();
    assert_ne!(runtime_mnt, node_mnt, "containerd shares the node's mounts");
    let mut procs = RuntimeProcs::new(ctrd_pid);
    let out = ctrd.ctr(&["images", "import", tarball.to_str().unwrap()]);
    assert!(out.status.success(), "{}", describe(&out));

    // Three pods through CRI: `keep` lives on, `gone` loses its pause and its pin,
    // `removed` is stopped and removed by the runtime.
    struct Pod {
        id: String,
        pause: u32,
        shim: Proc,
        netns: String,
        addr: String,
    }
    let mut pods = Vec::new();
    for (name, port) in [("keep", 18201), ("gone", 18202), ("removed", 18203)] {
        let id = ctrd.run_sandbox(name, port);
        let pause = ctrd.task_pid(&id);
        let shim = procs.add_pause(pause, &id);
        assert_eq!(ns_of(shim.pid, "mnt"), runtime_mnt, "{name}'s shim");
        let rec = node
            .record(network, &id)
            .unwrap_or_else(|| panic!("{name} unrecorded:\n{}", agent.log_text()));
        let netns = rec["netns"].as_str().unwrap().to_string();
        assert!(netns.starts_with("/var/run/netns/cni-"), "{rec}");
        let addr = node
            .address(network, &id)
            .unwrap_or_else(|| panic!("{name}: no address held"));
        assert_eq!(eth0_of(pause).as_deref(), Some(addr.as_str()), "{name}");
        // The pin is the pod's namespace in the runtime's mount namespace only: the
        // node sees the empty file under it. Otherwise this test proves nothing.
        let pod_ns = dev_ino(Path::new(&format!("/proc/{pause}/ns/net")));
        // /var/run is an absolute link to /run, which a path through /proc/PID/root
        // would resolve in the test's root: the link's target, spelled out.
        let run_path = netns.trim_start_matches("/var").to_string();
        let inside = format!("/proc/{ctrd_pid}/root{run_path}");
        assert_eq!(
            dev_ino(Path::new(&inside)),
            pod_ns,
            "{name}: no pin at {netns}"
        );
        let seen = node.mounts.reach(&run_path);
        let meta = fs::metadata(&seen).unwrap();
        assert_eq!(meta.len(), 0);
        assert_ne!(
            Some((meta.dev(), meta.ino())),
            pod_ns,
            "the node sees the pin"
        );
        pods.push(Pod {
            id,
            pause,
            shim,
            netns,
            addr,
        });
    }
    let [keep, gone, removed] = &pods[..] else {
        unreachable!()
    };
    let records = |node: &Node| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(node.mounts.reach("/var/lib/cni-ledger/records"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let all_records = records(&node);
    assert_eq!(all_records.len(), 3, "{all_records:?}");
    let assert_kept = |node: &Node, pod: &Pod, when: &str| {
        assert!(
            node.record(network, &pod.id).is_some(),
            "{when}: record gone"
        );
        assert_eq!(
            node.address(network, &pod.id).as_deref(),
            Some(pod.addr.as_str()),
            "{when}: address released"
        );
        assert_eq!(
            eth0_of(pod.pause).as_deref(),
            Some(pod.addr.as_str()),
            "{when}: eth0 gone from the pod"
        );
    };

    // The agent's gc runs, every second, with no grace: every pod kept, and said why.
    let runs = r#"cni_ledger_gc_runs_total{result="ok"}"#;
    let before = sample(&agent.metrics(), runs).unwrap_or(0.0);
    wait_for(Duration::from_secs(20), || {
        sample(&agent.metrics(), runs).unwrap_or(0.0) >= before + 2.0
    })
    .unwrap_or_else(|| panic!("no agent gc runs:\n{}", agent.log_text()));
    assert_eq!(records(&node), all_records, "{}", agent.log_text());
    for pod in &pods {
        assert_kept(&node, pod, "after the agent's gc");
    }
    // It asked containerd at its default socket in the node's root, as a node's agent does.
    assert!(
        agent
            .log_text()
            .contains("asking the CRI runtime at unix:///run/containerd/containerd.sock"),
        "{}",
        agent.log_text()
    );
    assert!(
        agent.log_text().contains("held elsewhere on the node"),
        "{}",
        agent.log_text()
    );
    assert!(agent.stop(20).success(), "{}", agent.log_text());

    // gc as the unit runs it, from the node's mount namespace.
    let (code, rep, out) = node.gc(&["--grace", "0", "--json"]);
    assert_eq!(code, 0, "{rep:#}\n{}", describe(&out));
    assert_eq!(rep["summary"]["live"], json!(3), "{rep:#}");
    assert_eq!(rep["summary"]["stale"], json!(0), "{rep:#}");
    assert_eq!(records(&node), all_records);
    for pod in &pods {
        assert_kept(&node, pod, "after gc");
        let held = rep["held"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|h| h["containerId"] == json!(pod.id))
            .unwrap_or_else(|| panic!("{} not reported held: {rep:#}", pod.id));
        let by = held["heldBy"].as_str().unwrap();
        assert!(
            by == format!("held by pid {}", pod.pause)
                || by.starts_with(&format!(
                    "mounted at {}",
                    pod.netns.trim_start_matches("/var")
                )),
            "{}: {by}",
            pod.id
        );
    }
    let rows = node.list();
    for pod in &pods {
        let row = rows
            .iter()
            .find(|r| r["containerId"] == json!(pod.id))
            .unwrap_or_else(|| panic!("no row for {}: {rows:#?}", pod.id));
        assert_eq!(row["state"], json!("live"), "{row:#}");
        assert_eq!(row["identity"], json!("held"), "{row:#}");
        assert!(row["heldBy"].as_str().is_some(), "{row:#}");
    }

    // Control: the runtime removes a pod; its own DEL goes through the chain.
    ctrd.stop_and_remove(&removed.id);
    assert!(
        node.record(network, &removed.id).is_none(),
        "removed: record kept"
    );
    assert!(
        node.address(network, &removed.id).is_none(),
        "removed: address kept"
    );

    // Control: containerd dies, then `gone`'s pause process, and its pin is unmounted
    // in the runtime's mount namespace (which `keep`'s shim still holds): the next gc
    // releases `gone`, and only it.
    ctrd.crash();
    RuntimeProcs::kill(&[Proc::of(gone.pause).expect("gone's pause")]);
    let shim = keep.shim;
    assert!(shim.alive(), "keep's shim died with containerd");
    assert_eq!(ns_of(shim.pid, "mnt"), runtime_mnt);
    run_ok(
        Command::new("nsenter")
            .arg(format!("--mount=/proc/{}/ns/mnt", shim.pid))
            .arg("umount")
            .arg(gone.netns.trim_start_matches("/var")),
    );
    let (code, rep, out) = node.gc(&["--grace", "0", "--json"]);
    assert_eq!(code, 0, "{rep:#}\n{}", describe(&out));
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep:#}");
    assert_eq!(rep["records"][0]["containerId"], json!(gone.id), "{rep:#}");
    // The node sees the empty file under the pin that was: not a namespace.
    assert_eq!(
        rep["records"][0]["reason"],
        json!("netns-not-namespace"),
        "{rep:#}"
    );
    // Its DEL was pointed at no namespace: the file is not the pod's.
    assert_eq!(rep["records"][0]["replayNetns"], Value::Null, "{rep:#}");
    assert!(node.record(network, &gone.id).is_none());
    assert!(
        node.address(network, &gone.id).is_none(),
        "gone: address kept"
    );
    assert_kept(&node, keep, "after gone's release");

    // Control: the last pod's processes and the runtime's shims gone, its mount
    // namespace and pin with them: the next gc releases it.
    procs.kill_all();
    let (code, rep, out) = node.gc(&["--grace", "0", "--json"]);
    assert_eq!(code, 0, "{rep:#}\n{}", describe(&out));
    assert_eq!(rep["summary"]["replayed"], json!(1), "{rep:#}");
    assert_eq!(rep["records"][0]["containerId"], json!(keep.id), "{rep:#}");
    assert!(rep.get("held").is_none(), "{rep:#}");
    assert!(records(&node).is_empty(), "{rep:#}");
    assert!(
        node.address(network, &keep.id).is_none(),
        "keep: address kept"
    );
}
