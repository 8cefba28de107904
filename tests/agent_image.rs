//! The image and the manifest: `deploy/kubernetes/cni-ledger.yaml` validates offline
//! against the Kubernetes API schema (PyPI `kubernetes-validate`, strict), the image
//! builds with podman from `Containerfile` (scripts/build-image.sh), and the agent runs
//! in it with exactly the host mounts, args and host namespaces the manifest declares
//! (read from it, so the two cannot drift), installing its binary and injecting the
//! ledger into the host-side dirs. Needs root, podman, curl and the test venv that
//! scripts/test.sh makes (target/test-venv: kubernetes-validate, PyYAML).
//!
//!     cargo test --features testing --test agent_image
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use agent_common::*;
use common::*;
use serde_json::Value;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn manifest() -> PathBuf {
    repo().join("deploy/kubernetes/cni-ledger.yaml")
}

fn venv_bin(name: &str) -> PathBuf {
    let p = repo().join("target/test-venv/bin").join(name);
    assert!(
        p.exists(),
        "{} missing: run scripts/test.sh (it makes target/test-venv with kubernetes-validate)",
        p.display()
    );
    p
}

fn ok(out: Output, what: &str) -> Output {
    assert!(out.status.success(), "{what}: {}", describe(&out));
    out
}

/// The manifest's DaemonSet as JSON.
fn daemonset() -> Value {
    let out = ok(
        Command::new(venv_bin("python3"))
            .args([
                "-c",
                "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
            ])
            .arg(manifest())
            .output()
            .unwrap(),
        "reading the manifest",
    );
    let docs: Value = serde_json::from_slice(&out.stdout).unwrap();
    docs.as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet in the manifest")
        .clone()
}

/// podman's `-v` for a mount: HostToContainer is rslave, as kubelet makes it.
fn volume_flag(host: &Path, mount: &Value) -> String {
    let mut v = format!(
        "{}:{}",
        host.display(),
        mount["mountPath"].as_str().unwrap()
    );
    if mount["mountPropagation"] == "HostToContainer" {
        v.push_str(":rslave");
    }
    v
}

#[test]
fn image_builds_with_podman_and_the_agent_in_it_injects_into_the_host_conf_dir() {
    require_root();
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
    let image_bin = repo()
        .join("target")
        .join(&host_target)
        .join("debug/cni-ledger");

    // The manifest's host paths, each under a scratch root standing in for the node.
    let ds = daemonset();
    let spec = &ds["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
    let node = TempDir::new("node");
    let host_dir = |hp: &str| node.path().join(hp.trim_start_matches('/'));
    let mut run = Command::new("podman");
    let name = format!("cl-agent-{}", std::process::id());
    // Lower rlimits than podman's defaults, which a sandboxed test machine may not let
    // the container runtime set (EPERM); the agent needs few of either.
    run.args([
        "run",
        "-d",
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
    ]);
    run.args(["--name", &name]);
    if spec["hostNetwork"] == true {
        run.arg("--network=host");
    }
    if spec["hostPID"] == true {
        run.arg("--pid=host");
    }
    if c["securityContext"]["privileged"] == true {
        run.arg("--privileged");
    }
    for m in c["volumeMounts"].as_array().unwrap() {
        let vol = spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap();
        let host = host_dir(vol["hostPath"]["path"].as_str().unwrap());
        fs::create_dir_all(&host).unwrap();
        run.arg("-v").arg(volume_flag(&host, m));
    }
    let port = free_port();
    // On a node PID 1 is its init and /proc/1/root the node's root. Where PID 1 is a
    // sandbox's own init whose root even root may not enter, the test process stands in
    // for it: same host PID namespace, same magic link, the machine's root.
    let node_root = if fs::read_dir("/proc/1/root/").is_ok() {
        "/proc/1/root".to_string()
    } else {
        format!("/proc/{}/root", std::process::id())
    };
    run.arg(&tag);
    for a in c["args"].as_array().unwrap() {
        let a = a.as_str().unwrap();
        // The one value kubelet would fill in, and a free port for this test.
        run.arg(if a.starts_with("--listen=") {
            format!("--listen=127.0.0.1:{port}")
        } else if a == "--plugin-root=/proc/1/root" {
            format!("--plugin-root={node_root}")
        } else {
            a.to_string()
        });
    }

    let conf = host_dir("/etc/cni/net.d").join("10-pods.conflist");
    let plain = serde_json::json!({"cniVersion": "1.0.0", "name": "pods", "plugins": [
        {"type": "bridge", "bridge": "climg0", "ipam": {"type": "host-local", "subnet": "198.18.250.0/24"}},
        {"type": "portmap", "capabilities": {"portMappings": true}}]});
    fs::write(&conf, serde_json::to_vec_pretty(&plain).unwrap()).unwrap();
    // The node's runtime at its default socket, serving the node's conf dir: the agent
    // in the container must find it through the manifest's --plugin-root alone.
    let runtime = NodeContainerd::start(&node, &host_dir("/opt/cni/bin"), &conf);
    struct Cleanup(String, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = Command::new("podman").args(["rm", "-f", &self.0]).output();
            let _ = Command::new("podman").args(["rmi", "-f", &self.1]).output();
        }
    }
    let _cleanup = Cleanup(name.clone(), tag.clone());
    ok(run.output().unwrap(), "podman run");
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
    wait_for(Duration::from_secs(20), || ledger_first(&conf))
        .unwrap_or_else(|| panic!("not injected from the container:\n{}", logs()));
    let installed = host_dir("/opt/cni/bin").join("cni-ledger");
    wait_for(Duration::from_secs(20), || installed.exists())
        .unwrap_or_else(|| panic!("binary not installed:\n{}", logs()));
    assert_eq!(sha256_hex(&installed), sha256_hex(&image_bin));
    let url = format!("http://127.0.0.1:{port}/readyz");
    let ready = || {
        Command::new("curl")
            .args(["-sf", "--max-time", "2", &url])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    wait_for(Duration::from_secs(10), ready)
        .unwrap_or_else(|| panic!("/readyz never 200:\n{}", logs()));
    assert!(host_dir("/var/lib/cni-ledger").join("records").is_dir());

    // Its first gc run asked containerd, through the node's root, about the network
    // containerd says it serves.
    let metrics_url = format!("http://127.0.0.1:{port}/metrics");
    let up = format!(
        r#"cni_ledger_cri_up{{endpoint="unix://{node_root}/run/containerd/containerd.sock"}}"#
    );
    let metrics = || {
        let o = Command::new("curl")
            .args(["-s", "--max-time", "2", &metrics_url])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    wait_for(Duration::from_secs(20), || {
        sample(&metrics(), &up) == Some(1.0)
    })
    .unwrap_or_else(|| {
        panic!(
            "containerd not asked:\n{}\n{}\n{}",
            metrics(),
            logs(),
            runtime.log()
        )
    });
    if runtime.ours {
        assert!(logs().contains("judging networks pods"), "{}", logs());
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
}

/// containerd at the node's default socket, /run/containerd/containerd.sock, with its
/// own root and state under the scratch node: the DaemonSet's agent reaches it under
/// its --plugin-root, /proc/1/root/run/containerd/containerd.sock on a node. A runtime
/// already listening there (a developer's machine) is used as it is: the agent only
/// reads from it.
struct NodeContainerd {
    child: Option<std::process::Child>,
    dir: PathBuf,
    made_dir: bool,
    ours: bool,
}

impl NodeContainerd {
    const SOCKET: &'static str = "/run/containerd/containerd.sock";

    fn start(node: &TempDir, bin_dir: &Path, conf: &Path) -> NodeContainerd {
        let dir = node.path().join("containerd");
        fs::create_dir_all(&dir).unwrap();
        if Path::new(Self::SOCKET).exists() {
            return NodeContainerd {
                child: None,
                dir,
                made_dir: false,
                ours: false,
            };
        }
        let made_dir = !Path::new("/run/containerd").exists();
        fs::create_dir_all("/run/containerd").unwrap();
        let config = containerd_config(
            &dir,
            Self::SOCKET,
            bin_dir,
            conf.parent().unwrap(),
            "registry.invalid/cni-ledger-test/pause:1",
        );
        fs::write(dir.join("config.toml"), config).unwrap();
        let log = fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let c = NodeContainerd {
            child: Some(child),
            dir,
            made_dir,
            ours: true,
        };
        wait_for(Duration::from_secs(30), || Path::new(Self::SOCKET).exists())
            .unwrap_or_else(|| panic!("containerd did not come up:\n{}", c.log()));
        c
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }
}

impl Drop for NodeContainerd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            if wait_for(Duration::from_secs(20), || {
                child.try_wait().ok().flatten().is_some()
            })
            .is_none()
            {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Made for this containerd, which also made its shim and runc dirs in it.
        if self.made_dir {
            let _ = fs::remove_dir_all("/run/containerd");
        }
    }
}
