//! The image as the DaemonSet runs it, over pods a real runtime made through CRI: the
//! image builds with podman from `Containerfile` (scripts/build-image.sh), and the agent
//! runs in it with exactly the args, mounts and host namespaces the manifest declares
//! (read from it, so the two cannot drift) on a node of the test's own: a mount
//! namespace where the node's paths (`/etc/cni/net.d`, `/opt/cni/bin`, `/var/lib/cni`,
//! `/var/lib/cni-ledger`, `/run/netns`, `/run/containerd`, `/run/k3s`) are fresh tmpfs,
//! and a network namespace. containerd runs in both and makes the pods over CRI, with
//! the netns paths it gives every pod (`/var/run/netns/cni-...`, through the node's
//! `/var/run` link). Needs root, podman, containerd, curl and the test venv that
//! scripts/test.sh makes (target/test-venv: PyYAML).
//!
//!     cargo test --features testing --test agent_image
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;
mod cri_common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use agent_common::*;
use common::*;
use cri_common::*;
use serde_json::{json, Value};

fn ok(out: Output, what: &str) -> Output {
    assert!(out.status.success(), "{what}: {}", describe(&out));
    out
}

/// The node's paths that are made fresh for the test (tmpfs in the node's mount
/// namespace): what a node has, and nothing of the machine's own.
const NODE_DIRS: [&str; 7] = [
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/var/lib/cni",
    "/var/lib/cni-ledger",
    "/run/netns",
    "/run/containerd",
    "/run/k3s",
];

/// Every plugin call of the node's chain, `plugin COMMAND containerID` a line, in the
/// node's libcni cache dir: written by the runtime's calls and the agent's replays alike.
const CALLS: &str = "/var/lib/cni/test-calls";

/// The node's bin dir: the real plugins, `bridge` behind a wrapper that notes each call,
/// and `slowdown`, which takes `secs` over the ADD of a pod named `slow-*` (an IPAM
/// waiting on its datastore) and passes every result on unchanged.
fn node_plugins(node: &PrivateRun, secs: u32) {
    let bin = node.reach("/opt/cni/bin");
    for p in ["loopback", "host-local", "portmap"] {
        std::os::unix::fs::symlink(Path::new(CNI_PLUGIN_DIR).join(p), bin.join(p)).unwrap();
    }
    let script = |name: &str, body: String| {
        use std::os::unix::fs::PermissionsExt;
        let path = bin.join(name);
        fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    };
    script(
        "bridge",
        format!(
            "echo \"bridge $CNI_COMMAND $CNI_CONTAINERID\" >> {CALLS}\nexec {CNI_PLUGIN_DIR}/bridge \"$@\"\n"
        ),
    );
    script(
        "slowdown",
        format!(
            r#"echo "slowdown $CNI_COMMAND $CNI_CONTAINERID" >> {CALLS}
case "$CNI_COMMAND" in
ADD)
	case "$CNI_ARGS" in *K8S_POD_NAME=slow-*) sleep {secs} ;; esac
	exec /usr/bin/python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["prevResult"]))' ;;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}}' ;;
*) cat >/dev/null ;;
esac
"#
        ),
    );
}

/// The calls of `bridge` noted so far whose command is `cmd`, for container `id`.
fn calls(node: &PrivateRun, cmd: &str, id: &str) -> usize {
    fs::read_to_string(node.reach(CALLS))
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&"bridge") && f.get(1) == Some(&cmd) && f.get(2) == Some(&id)
        })
        .count()
}

fn all_dels(node: &PrivateRun) -> Vec<String> {
    fs::read_to_string(node.reach(CALLS))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split_whitespace().nth(1) == Some("DEL"))
        .map(String::from)
        .collect()
}

/// The record of a pod's attachment in the node's ledger, when there is one.
fn record(node: &PrivateRun, network: &str, id: &str) -> Option<Value> {
    let path = node
        .reach("/var/lib/cni-ledger/records")
        .join(format!("{network}:{id}:eth0.json"));
    let doc: Value = serde_json::from_slice(&fs::read(path).ok()?).ok()?;
    Some(doc["record"].clone())
}

/// A process whose mount namespace has a mount at `path` (as its mountinfo shows it).
fn mount_namespace_mounting(path: &str) -> Option<u32> {
    let needle = format!(" {path} ");
    fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            fs::read_to_string(format!("/proc/{pid}/mountinfo"))
                .is_ok_and(|m| m.lines().any(|l| l.contains(&needle)))
        })
}

/// The address host-local holds for a pod, by its file in the node's IPAM dir.
fn holds_address(node: &PrivateRun, network: &str, id: &str) -> bool {
    fs::read_dir(node.reach("/var/lib/cni/networks").join(network))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            fs::read_to_string(e.path()).is_ok_and(|s| s.lines().next() == Some(id))
                && e.file_name().to_string_lossy().contains('.')
        })
}

#[test]
fn the_daemonsets_agent_leaves_live_pods_alone_and_releases_only_a_forgotten_one() {
    require_root!();
    let tag = format!("localhost/cni-ledger:test-{}", std::process::id());
    let out = Command::new(repo().join("scripts/build-image.sh"))
        .arg(&tag)
        .env("PROFILE", "dev")
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .output()
        .unwrap();
    ok(out, "scripts/build-image.sh");
    let host_target = String::from_utf8(Command::new("rustc").arg("-vV").output().unwrap().stdout)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(String::from))
        .unwrap();
    // Where scripts/build-image.sh built it: CARGO_TARGET_DIR if set, else target/.
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    let image_bin = target_dir.join(&host_target).join("debug/cni-ledger");

    // The node: its network namespace (hostNetwork), then its mount namespace.
    let net = Netns::new();
    run_ok(Command::new("ip").args(["-n", net.name(), "link", "set", "lo", "up"]));
    let node = PrivateRun::over(&NODE_DIRS);
    node_plugins(&node, 8);
    let network = format!("pods{}", next_id());
    let conf = node.reach("/etc/cni/net.d/10-pods.conflist");
    let plain = json!({"cniVersion": "1.0.0", "name": network, "plugins": [
        {"type": "bridge", "bridge": "climg0", "isGateway": true,
         "ipam": {"type": "host-local", "subnet": "198.18.250.0/24"}},
        {"type": "portmap", "capabilities": {"portMappings": true}},
        {"type": "slowdown"}]});
    fs::write(&conf, serde_json::to_vec_pretty(&plain).unwrap()).unwrap();
    let tmp = TempDir::new("image");
    let tarball = build_pause_image(tmp.path());
    let dir = Containerd::configure_dirs(
        &tmp.path().join("containerd"),
        "/run/containerd/containerd.sock",
        Path::new("/opt/cni/bin"),
        Path::new("/etc/cni/net.d"),
    );
    let mut ctrd = Containerd::launch(&dir, net.name(), Some(&node), Containerd::DEFAULT_SOCKET);
    // Everything the runtimes and podman start, stopped by PID and start time at the end
    // (or on a panic): shims and conmon daemonize, so no stop of containerd's or podman's
    // own is sure to take them.
    let mut procs = RuntimeProcs::new(ctrd.pid().unwrap());
    ok(
        ctrd.ctr(&["images", "import", tarball.to_str().unwrap()]),
        "ctr images import",
    );

    // The agent as the manifest runs it.
    let ds = daemonset();
    let spec = &ds["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["hostPID"], true);
    assert_eq!(c["securityContext"]["privileged"], true);
    let name = format!("cl-agent-{}", std::process::id());
    let mut run = Command::new("podman");
    // Lower rlimits than podman's defaults, which a sandboxed test machine may not let
    // the container runtime set (EPERM); runc, which handles a hybrid cgroup layout
    // that crun refuses.
    run.args([
        "--runtime",
        "runc",
        "run",
        "-d",
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
        "--name",
        &name,
        "--pid=host",
        "--privileged",
    ]);
    // hostNetwork: the node's network namespace is the test's.
    run.arg(format!("--network=ns:/run/netns/{}", net.name()));
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let vol = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        let host = node.reach(vol["hostPath"]["path"].as_str().unwrap());
        fs::create_dir_all(&host).unwrap();
        run.arg("-v").arg(format!(
            "{}:{}",
            host.display(),
            m["mountPath"].as_str().unwrap()
        ));
    }
    let port = free_port();
    run.arg(&tag);
    for a in c["args"].as_array().unwrap() {
        let a = a.as_str().unwrap();
        // What kubelet fills in, free ports, the node's root (its init's: here the
        // node's holder process), and gc every second instead of every 5 minutes.
        run.arg(if a.starts_with("--listen=") {
            format!("--listen=127.0.0.1:{port}")
        } else if a.starts_with("--probe-listen=") {
            format!("--probe-listen=127.0.0.1:{}", free_port())
        } else if a == "--node-root=/proc/1/root" {
            format!("--node-root={}", node.root())
        } else if a.starts_with("--gc-interval=") {
            "--gc-interval=1".to_string()
        } else {
            a.to_string()
        });
    }
    // Not in the manifest (its defaults are 60 s and 10 min): no grace, and a runtime
    // minimum age the test can wait out, above the slow ADD below.
    run.args(["--grace=0", "--cri-min-age=20"]);
    struct Cleanup(String, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = Command::new("podman").args(["rm", "-f", &self.0]).output();
            let _ = Command::new("podman").args(["rmi", "-f", &self.1]).output();
        }
    }
    let cleanup = Cleanup(name.clone(), tag.clone());
    ok(run.output().unwrap(), "podman run");
    let pids = ok(
        Command::new("podman")
            .args([
                "inspect",
                "--format",
                "{{.State.ConmonPid}} {{.State.Pid}}",
                &name,
            ])
            .output()
            .unwrap(),
        "podman inspect",
    );
    for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
        procs.add(pid.parse().unwrap());
    }
    let logs = || {
        let o = Command::new("podman")
            .args(["logs", &name])
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let agent = Agent {
        child: None,
        port,
        netns: Some(net.name().to_string()),
        log: PathBuf::new(),
    };
    wait_for(Duration::from_secs(30), || agent.get("/readyz").0 == 200)
        .unwrap_or_else(|| panic!("/readyz never 200:\n{}", logs()));
    assert!(ledger_first(&conf), "{}", logs());
    let installed = node.reach("/opt/cni/bin/cni-ledger");
    assert_eq!(sha256_hex(&installed), sha256_hex(&image_bin));
    let ep = |socket: &str| format!("endpoint=\"unix://{socket}\"");
    let containerd = ep("/run/containerd/containerd.sock");
    let runs = r#"cni_ledger_gc_runs_total{result="ok"}"#;
    let metric = |series: &str| sample(&agent.metrics(), series);
    let wait_metric = |what: &str, cond: &dyn Fn(&str) -> bool| {
        wait_for(Duration::from_secs(40), || cond(&agent.metrics()))
            .unwrap_or_else(|| panic!("{what}:\n{}\n{}", agent.metrics(), logs()));
    };
    wait_metric("containerd asked at the node's socket", &|m| {
        sample(m, &format!("cni_ledger_cri_up{{{containerd}}}")) == Some(1.0)
    });

    // Pods made by containerd through CRI, recorded with the path containerd gives.
    let live = ctrd.run_sandbox("live-1", 18101);
    let forgotten = ctrd.run_sandbox("live-2", 18102);
    for id in [&live, &forgotten] {
        procs.add_pause(ctrd.task_pid(id), id);
    }
    for id in [&live, &forgotten] {
        let rec = record(&node, &network, id).unwrap_or_else(|| {
            let records = fs::read_dir(node.reach("/var/lib/cni-ledger/records"))
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>());
            panic!(
                "{id} unrecorded: {records:?}\n{}\n{}",
                fs::read_to_string(&conf).unwrap_or_default(),
                logs()
            )
        });
        let netns = rec["netns"].as_str().unwrap();
        assert!(netns.starts_with("/var/run/netns/"), "{rec}");
        assert!(holds_address(&node, &network, id));
    }

    // A pod whose chain takes 8 s, longer than the grace: gc runs all along, and its
    // record, written before the chain ran, is not in containerd's list until
    // RunPodSandbox returns. Nothing may tear it down.
    let before = metric(runs).unwrap_or(0.0);
    let slow = std::thread::scope(|s| {
        let ctrd = &ctrd;
        s.spawn(move || ctrd.run_sandbox("slow-1", 18103))
            .join()
            .unwrap()
    });
    assert!(
        metric(runs).unwrap_or(0.0) >= before + 4.0,
        "gc did not run during the slow ADD:\n{}",
        logs()
    );
    procs.add_pause(ctrd.task_pid(&slow), &slow);
    assert!(holds_address(&node, &network, &slow));
    let settled = metric(runs).unwrap_or(0.0);
    wait_metric("three more gc runs", &|m| {
        sample(m, runs).unwrap_or(0.0) >= settled + 3.0
    });
    assert_eq!(all_dels(&node), Vec::<String>::new(), "{}", logs());
    for id in [&live, &forgotten, &slow] {
        assert!(record(&node, &network, id).is_some(), "{id}\n{}", logs());
    }

    // containerd forgets one pod (its state wiped behind its back, the namespace kept)
    // and stops; a stray runtime with no sandboxes answers at k3s's default socket. Its
    // empty list cannot be right about pods whose namespaces are verifiably there.
    ctrd.forget_and_stop(&forgotten);
    let stray_dir = Containerd::configure_dirs(
        &tmp.path().join("stray"),
        "/run/k3s/containerd/containerd.sock",
        Path::new("/opt/cni/bin"),
        Path::new("/etc/cni/net.d"),
    );
    let mut stray = Containerd::launch(
        &stray_dir,
        net.name(),
        Some(&node),
        "/run/k3s/containerd/containerd.sock",
    );
    procs.add(stray.pid().unwrap());
    let k3s = ep("/run/k3s/containerd/containerd.sock");
    wait_metric("the stray runtime's list refused", &|m| {
        sample(m, &format!("cni_ledger_cri_up{{{k3s}}}")) == Some(1.0)
            && sample(m, "cni_ledger_cri_refused") == Some(1.0)
    });
    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("WARN cri:") && body.contains("cannot be right"),
        "{body}"
    );
    let settled = metric(runs).unwrap_or(0.0);
    wait_metric("two more gc runs", &|m| {
        sample(m, runs).unwrap_or(0.0) >= settled + 2.0
    });
    assert_eq!(all_dels(&node), Vec::<String>::new(), "{}", logs());
    stray.stop();

    // containerd back, without the forgotten pod: its list no longer names it, but its
    // namespace is still mounted (in the mount namespace the old containerd's shims
    // keep), and a runtime's silence never frees a namespace that is there.
    let forgotten_ns = record(&node, &network, &forgotten).unwrap()["netns"]
        .as_str()
        .unwrap()
        .to_string();
    let mut ctrd = Containerd::launch(&dir, net.name(), Some(&node), Containerd::DEFAULT_SOCKET);
    procs.add(ctrd.pid().unwrap());
    let settled = metric(runs).unwrap_or(0.0);
    wait_metric("two gc runs on the list without it", &|m| {
        sample(m, runs).unwrap_or(0.0) >= settled + 2.0
    });
    assert!(
        record(&node, &network, &forgotten).is_some(),
        "the forgotten pod was freed while its namespace was mounted:\n{}",
        logs()
    );
    assert_eq!(all_dels(&node), Vec::<String>::new(), "{}", logs());
    // Its namespace goes (unmounted where containerd mounted it): that one alone is
    // released, its address and port mapping with it, by a replay through the chain.
    let ns_name = forgotten_ns.rsplit('/').next().unwrap();
    let holder = mount_namespace_mounting(&format!("/run/netns/{ns_name}"))
        .unwrap_or_else(|| panic!("no mount namespace mounts {forgotten_ns}"));
    ok(
        Command::new("nsenter")
            .arg(format!("--mount=/proc/{holder}/ns/mnt"))
            .args(["ip", "netns", "del", ns_name])
            .output()
            .unwrap(),
        "ip netns del in containerd's mount namespace",
    );
    wait_for(Duration::from_secs(60), || {
        record(&node, &network, &forgotten).is_none()
    })
    .unwrap_or_else(|| panic!("forgotten pod never released:\n{}", logs()));
    assert_eq!(calls(&node, "DEL", &forgotten), 1, "{:?}", all_dels(&node));
    assert!(!holds_address(&node, &network, &forgotten));
    assert_eq!(metric("cni_ledger_cri_refused"), Some(0.0));
    for id in [&live, &slow] {
        assert_eq!(calls(&node, "DEL", id), 0, "{:?}", all_dels(&node));
        assert!(record(&node, &network, id).is_some());
        assert!(holds_address(&node, &network, id));
    }

    // The runtime's own DELs of the live pods end their records; nothing is left.
    for id in [&live, &slow] {
        ctrd.stop_and_remove(id);
        assert!(record(&node, &network, id).is_none(), "{id}");
    }
    // podman stop sends SIGTERM: exit 0, and the conflist stays injected.
    ok(
        Command::new("podman")
            .args(["stop", "-t", "20", &name])
            .output()
            .unwrap(),
        "podman stop",
    );
    let code = ok(
        Command::new("podman")
            .args(["inspect", "--format", "{{.State.ExitCode}}", &name])
            .output()
            .unwrap(),
        "podman inspect",
    );
    assert_eq!(
        String::from_utf8_lossy(&code.stdout).trim(),
        "0",
        "{}",
        logs()
    );
    assert!(ledger_first(&conf));
    ctrd.stop();
    drop(cleanup);
    // Whatever the orderly stops left (a shim still shutting down, say) is killed and
    // waited for: nothing of the test's outlives it.
    let left = procs.alive();
    if !left.is_empty() {
        eprintln!("still running after the runtimes' and podman's stops: {left:?}");
    }
    procs.kill_all();
}
