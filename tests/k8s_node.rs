//! The DaemonSet on a real Kubernetes node (issue 38, items 2, 3 and 4): a one-node
//! Kubernetes v1.37.2 (tests/k8s/cluster.sh: etcd, API server, controller-manager,
//! scheduler, containerd 2.4.2 and kubelet, built from source by scripts/build-k8s.sh and
//! cached), its node in a mount and PID namespace of its own with the standard node paths
//! (/etc/cni/net.d, /opt/cni/bin, /var/lib/cni, /var/lib/cni-ledger, /run/netns,
//! /run/containerd) bound to dirs of the cluster's, so the shipped manifest runs unchanged
//! and the machine's own CNI dirs are never touched. Each test starts the cluster and
//! takes it down at the end, or on a panic (a Drop guard); they run one at a time.
//!
//! The agent is installed as a user would (docs/KUBERNETES.md): the image built by
//! scripts/build-image.sh with podman, loaded into the node's containerd with
//! `ctr -n k8s.io images import` under the manifest's image name (no registry), then
//! `kubectl apply -k deploy/kubernetes/base`; uninstalled with `kubectl delete -k` and
//! `cni-ledger agent --uninstall` on the node.
//!
//! The image is built with PROFILE=dev (as tests/agent_image.rs builds it: no `testing`
//! feature, so no test hooks; only quicker to build); CL_K8S_IMAGE_PROFILE=release builds
//! it as a user does. Every CNI call of the node's plugins is logged by cluster.sh's
//! wrappers in the node's /opt/cni/bin, the runtime's and the agent's replays alike.
//!
//! The cluster's dir is cluster.sh's default, /var/lib/cni-ledger-k8s: a cluster left
//! there (an interrupted run) is taken down first.
//!
//! Needs root, podman, gcc, openssl, curl, iptables, python3, util-linux (unshare,
//! nsenter), Debian's containernetworking-plugins, and the binaries scripts/build-k8s.sh
//! caches under /var/cache/cni-ledger-k8s (Go; it builds them when missing).
//!
//!     cargo test --test k8s_node
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// The cluster's dir (cluster.sh's CNI_LEDGER_K8S_DIR default), and the node's dirs in it.
const D: &str = "/var/lib/cni-ledger-k8s";
const NETWORK: &str = "cni-ledger-k8s";
const PAUSE: &str = "registry.invalid/cni-ledger-k8s/pause:1";
const HOST_PORT: u16 = 18080;
/// gc's default `--grace` (docs/REFERENCE.md), which the manifest keeps.
const GRACE_SECS: u64 = 60;

/// One cluster at a time on the machine: the tests of this binary take turns.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

fn node(path: &str) -> PathBuf {
    Path::new(D).join("node").join(path.trim_start_matches('/'))
}

fn describe_out(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", describe_out(&out));
    String::from_utf8(out.stdout).unwrap()
}

fn cluster_sh(args: &[&str]) -> Output {
    Command::new("bash")
        .arg(repo().join("tests/k8s/cluster.sh"))
        .args(args)
        .env("CNI_LEDGER_K8S_DIR", D)
        .output()
        .unwrap()
}

/// The cluster, up; down when dropped (at the end, or on a panic).
struct Cluster {
    kubeconfig: String,
    bins: Vec<PathBuf>,
    started: Instant,
}

impl Cluster {
    fn up() -> Cluster {
        // What an interrupted run left.
        let _ = cluster_sh(&["down"]);
        let t = Instant::now();
        let out = cluster_sh(&["up"]);
        let guard_less = !out.status.success();
        let env = ok(cluster_sh(&["env"]), "cluster.sh env");
        // "export KUBECONFIG=... PATH=a:b:c:$PATH"
        let mut kubeconfig = String::new();
        let mut bins = Vec::new();
        for w in env.split_whitespace() {
            if let Some(k) = w.strip_prefix("KUBECONFIG=") {
                kubeconfig = k.to_string();
            } else if let Some(p) = w.strip_prefix("PATH=") {
                bins = p
                    .split(':')
                    .filter(|d| !d.starts_with('$'))
                    .map(PathBuf::from)
                    .collect();
            }
        }
        let c = Cluster {
            kubeconfig,
            bins,
            started: Instant::now(),
        };
        if guard_less {
            drop(c);
            panic!("cluster.sh up: {}", describe_out(&out));
        }
        eprintln!("k8s_node: cluster up in {:.1} s", t.elapsed().as_secs_f64());
        c
    }

    fn tool(&self, name: &str) -> PathBuf {
        self.bins
            .iter()
            .map(|d| d.join(name))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.bins))
    }

    fn kubectl_out(&self, args: &[&str]) -> Output {
        Command::new(self.tool("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .unwrap()
    }

    fn kubectl(&self, args: &[&str]) -> String {
        ok(
            self.kubectl_out(args),
            &format!("kubectl {}", args.join(" ")),
        )
    }

    fn kubectl_json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a)).unwrap()
    }

    fn sock(&self) -> PathBuf {
        node("/run/containerd/containerd.sock")
    }

    fn ctr(&self, args: &[&str]) -> String {
        let out = Command::new(self.tool("ctr"))
            .arg("--address")
            .arg(self.sock())
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .unwrap();
        ok(out, &format!("ctr {}", args.join(" ")))
    }

    /// The node's ready pod sandboxes, by pod name: (sandbox id, pod uid).
    fn sandboxes(&self) -> BTreeMap<String, (String, String)> {
        let out = Command::new(self.tool("crictl"))
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", self.sock().display()))
            .args(["pods", "--state", "ready", "-o", "json"])
            .output()
            .unwrap();
        let v: Value = serde_json::from_str(&ok(out, "crictl pods")).unwrap();
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["metadata"]["name"].as_str().unwrap().to_string(),
                    (
                        p["id"].as_str().unwrap().to_string(),
                        p["metadata"]["uid"].as_str().unwrap().to_string(),
                    ),
                )
            })
            .collect()
    }

    /// The node's PID 1 (cluster.sh records it), to enter the node's namespaces.
    fn node_pid(&self) -> String {
        fs::read_to_string(Path::new(D).join("pid/node"))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    }

    /// Runs a command in the node's mount namespace (its paths as the node has them).
    fn on_node(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.node_pid(), "-m", "-p", "--"])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let out = cluster_sh(&["down"]);
        eprintln!(
            "k8s_node: cluster down after {:.1} s{}",
            self.started.elapsed().as_secs_f64(),
            if out.status.success() {
                String::new()
            } else {
                format!(": cluster.sh down failed: {}", describe_out(&out))
            }
        );
    }
}

/// Retries `f` every 250 ms until it is true; panics with `what` after `secs`.
fn wait_until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(secs),
            "not after {secs} s: {what}"
        );
        sleep(Duration::from_millis(250));
    }
}

/// The image as scripts/build-image.sh builds it, under a tag of the test's own (the
/// machine's podman store keeps its `localhost/cni-ledger:<version>`), saved and loaded
/// into the node's containerd under the manifest's image name, as on a node without a
/// registry. PROFILE=dev unless CL_K8S_IMAGE_PROFILE says otherwise (release: as a user
/// builds it, much slower to build); neither has the `testing` feature.
fn load_agent_image(c: &Cluster, manifest_image: &str) {
    let tag = format!("localhost/cni-ledger:k8s-test-{}", std::process::id());
    let profile = std::env::var("CL_K8S_IMAGE_PROFILE").unwrap_or_else(|_| "dev".into());
    let t = Instant::now();
    let out = Command::new(repo().join("scripts/build-image.sh"))
        .arg(&tag)
        .env("PROFILE", &profile)
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .output()
        .unwrap();
    ok(out, "scripts/build-image.sh");
    eprintln!(
        "k8s_node: image built ({profile}) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let tmp = TempDir::new("k8s-image");
    let tar = tmp.path().join("agent.tar");
    ok(
        Command::new("podman")
            .args(["save", "-o"])
            .arg(&tar)
            .arg(&tag)
            .output()
            .unwrap(),
        "podman save",
    );
    let _ = Command::new("podman").args(["rmi", &tag]).output();
    c.ctr(&["images", "import", tar.to_str().unwrap()]);
    c.ctr(&["images", "tag", "--force", &tag, manifest_image]);
    // Under the manifest's name, for `cluster.sh restart --lose-runtime-state` to import
    // again (as a registry would serve it again).
    let images = Path::new(D).join("images");
    fs::create_dir_all(&images).unwrap();
    c.ctr(&[
        "images",
        "export",
        images.join("agent.tar").to_str().unwrap(),
        manifest_image,
    ]);
}

/// The node's conflist, as JSON, and its plugins' types.
fn conflist() -> Value {
    let p = node("/etc/cni/net.d/10-pods.conflist");
    serde_json::from_slice(&fs::read(&p).unwrap()).unwrap()
}

fn chain_types() -> Vec<String> {
    conflist()["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect()
}

fn record_path(id: &str) -> PathBuf {
    node("/var/lib/cni-ledger/records").join(format!("{NETWORK}:{id}:eth0.json"))
}

fn records() -> BTreeSet<String> {
    fs::read_dir(node("/var/lib/cni-ledger/records"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_prefix(&format!("{NETWORK}:"))?
                .strip_suffix(":eth0.json")
                .map(String::from)
        })
        .collect()
}

/// host-local's addresses of the network: address -> container id.
fn addresses() -> BTreeMap<String, String> {
    fs::read_dir(node("/var/lib/cni/networks").join(NETWORK))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains('.'))
        .filter_map(|e| {
            let s = fs::read_to_string(e.path()).ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                s.lines().next()?.to_string(),
            ))
        })
        .collect()
}

/// The nat rules naming container `id` (portmap's DNAT, bridge's masquerade).
fn nat_rules(id: &str) -> Vec<String> {
    let out = Command::new("iptables")
        .args(["-w", "-t", "nat", "-S"])
        .output()
        .unwrap();
    ok(out, "iptables -t nat -S")
        .lines()
        .filter(|l| l.contains(&format!("id: \\\"{id}\\\"")))
        .map(String::from)
        .collect()
}

fn dnat_rules(id: &str) -> Vec<String> {
    nat_rules(id)
        .into_iter()
        .filter(|l| l.contains("dnat name"))
        .collect()
}

/// Every CNI call the node's plugins saw (cluster.sh's wrappers): (plugin, command,
/// container id, netns, CNI_ARGS).
fn calls() -> Vec<[String; 5]> {
    fs::read_to_string(Path::new(D).join("cni-calls.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() >= 7).then(|| {
                [
                    f[1].to_string(),
                    f[2].to_string(),
                    f[3].to_string(),
                    f[4].to_string(),
                    f[6].to_string(),
                ]
            })
        })
        .collect()
}

fn dels_of(id: &str) -> usize {
    calls()
        .iter()
        .filter(|c| c[1] == "DEL" && c[2] == id)
        .count()
}

/// eth0's IPv4 address in the pod's network namespace (by its netns path in the node).
fn eth0_addr(c: &Cluster, netns: &str) -> Option<String> {
    let out = c.on_node(&[
        "nsenter",
        &format!("--net={netns}"),
        "ip",
        "-4",
        "-o",
        "addr",
        "show",
        "eth0",
    ]);
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    let f: Vec<&str> = s.split_whitespace().collect();
    let i = f.iter().position(|w| *w == "inet")?;
    Some(f.get(i + 1)?.split('/').next()?.to_string())
}

/// A pod's network namespace path, as its record (or libcni's cache) holds it.
fn record_netns(id: &str) -> Option<String> {
    let doc: Value = serde_json::from_slice(&fs::read(record_path(id)).ok()?).ok()?;
    let r = &doc["record"];
    r["netns"]
        .as_str()
        .or_else(|| r["netns_path"].as_str())
        .map(String::from)
}

/// The workloads: a Deployment of 3 pause pods, and one of 1 with a hostPort (one node:
/// the scheduler places one pod per hostPort per node, so 3 replicas of one would leave
/// 2 Pending).
fn workloads() -> String {
    let dep = |name: &str, replicas: u32, port: &str| {
        format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: pause
        image: {PAUSE}
        imagePullPolicy: Never{port}
"#
        )
    };
    format!(
        "{}---\n{}",
        dep("web", 3, ""),
        dep(
            "hp",
            1,
            &format!("\n        ports: [{{containerPort: 8080, hostPort: {HOST_PORT}}}]")
        )
    )
}

fn apply_stdin(c: &Cluster, yaml: &str) {
    let tmp = TempDir::new("k8s-yaml");
    let f = tmp.path().join("w.yaml");
    fs::write(&f, yaml).unwrap();
    c.kubectl(&["apply", "-f", f.to_str().unwrap()]);
}

/// The running pods of the default namespace: name -> pod IP.
fn pod_ips(c: &Cluster) -> BTreeMap<String, String> {
    c.kubectl_json(&["get", "pods", "-n", "default"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
        })
        .filter_map(|p| {
            Some((
                p["metadata"]["name"].as_str()?.to_string(),
                p["status"]["podIP"].as_str()?.to_string(),
            ))
        })
        .collect()
}

fn rollout(c: &Cluster, what: &str, ns: &str) {
    c.kubectl(&["-n", ns, "rollout", "status", what, "--timeout=180s"]);
}

/// Installs the agent as docs/KUBERNETES.md says; returns once its pod is Ready and the
/// ledger is first in the node's conflist.
fn install_agent(c: &Cluster) {
    // The manifest's image name, as `kubectl apply -k` will apply it.
    let built = c.kubectl(&[
        "kustomize",
        repo().join("deploy/kubernetes/base").to_str().unwrap(),
    ]);
    let image = built
        .lines()
        .find_map(|l| l.trim().strip_prefix("image: "))
        .expect("an image: in the base")
        .to_string();
    load_agent_image(c, &image);
    let t = Instant::now();
    c.kubectl(&[
        "apply",
        "-k",
        repo().join("deploy/kubernetes/base").to_str().unwrap(),
    ]);
    rollout(c, "daemonset/cni-ledger", "kube-system");
    c.kubectl(&[
        "-n",
        "kube-system",
        "wait",
        "--for=condition=Ready",
        "pod",
        "-l",
        "app.kubernetes.io/name=cni-ledger",
        "--timeout=120s",
    ]);
    eprintln!(
        "k8s_node: agent Ready {:.1} s after kubectl apply -k",
        t.elapsed().as_secs_f64()
    );
    wait_until(60, "the ledger first in the node's conflist", || {
        chain_types().first().map(String::as_str) == Some("cni-ledger")
    });
    assert!(
        node("/opt/cni/bin/cni-ledger").exists(),
        "the agent installed no binary in the node's /opt/cni/bin"
    );
}

/// Waits until every running pod of `names` has its record, its address in host-local
/// and eth0 with that address; returns name -> sandbox id.
fn attached(c: &Cluster, want: usize) -> BTreeMap<String, String> {
    let mut ids = BTreeMap::new();
    wait_until(120, &format!("{want} running pods, each recorded"), || {
        let ips = pod_ips(c);
        let sb = c.sandboxes();
        ids = ips
            .keys()
            .filter_map(|n| Some((n.clone(), sb.get(n)?.0.clone())))
            .collect();
        ids.len() == want && ids.values().all(|id| record_path(id).exists())
    });
    let ips = pod_ips(c);
    let held = addresses();
    for (name, id) in &ids {
        let ip = &ips[name];
        assert_eq!(
            held.get(ip),
            Some(id),
            "{name}: host-local holds {ip} for its sandbox {id}: {held:?}"
        );
        let netns = record_netns(id).unwrap_or_else(|| {
            panic!(
                "{name}: its record names no netns: {}",
                fs::read_to_string(record_path(id)).unwrap()
            )
        });
        assert_eq!(
            eth0_addr(c, &netns).as_deref(),
            Some(ip.as_str()),
            "{name}: eth0 in {netns}"
        );
    }
    ids
}

fn the_hostport_pod(ids: &BTreeMap<String, String>) -> (String, String) {
    ids.iter()
        .find(|(n, _)| n.starts_with("hp-"))
        .map(|(n, i)| (n.clone(), i.clone()))
        .expect("the hostPort pod")
}

/// No DEL the node's plugins saw names a sandbox that is live now.
fn assert_no_del_of_live(c: &Cluster) {
    let live: BTreeSet<String> = c.sandboxes().into_values().map(|(id, _)| id).collect();
    let bad: Vec<_> = calls()
        .into_iter()
        .filter(|x| x[1] == "DEL" && live.contains(&x[2]))
        .collect();
    assert!(bad.is_empty(), "DELs of live pods: {bad:?}");
}

#[test]
fn installed_with_kubectl_the_agent_records_the_nodes_pods_and_uninstalls_cleanly() {
    require_root!();
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up();

    // The node as cluster.sh makes it: Ready, a plain chain, no ledger.
    assert_eq!(
        c.kubectl(&[
            "get",
            "node",
            "-o",
            "jsonpath={.items[0].status.conditions[?(@.type==\"Ready\")].status}"
        ]),
        "True"
    );
    let plain = fs::read(node("/etc/cni/net.d/10-pods.conflist")).unwrap();
    assert_eq!(chain_types(), ["bridge", "portmap"]);
    assert_eq!(conflist()["plugins"][0]["ipam"]["type"], "host-local");
    assert!(records().is_empty());

    install_agent(&c);

    // Pods through the chain, each recorded.
    apply_stdin(&c, &workloads());
    rollout(&c, "deployment/web", "default");
    rollout(&c, "deployment/hp", "default");
    let ids = attached(&c, 4);
    let (hp, hp_id) = the_hostport_pod(&ids);
    assert!(
        dnat_rules(&hp_id)
            .iter()
            .any(|r| r.contains(&format!("--dports {HOST_PORT} "))),
        "no DNAT rule of {hp} for {HOST_PORT}: {:?}",
        nat_rules(&hp_id)
    );
    let hp_ip = pod_ips(&c)[&hp].clone();

    // kubectl delete pod: its DEL drops the record, frees the address and the DNAT rule.
    c.kubectl(&["delete", "pod", &hp, "--wait=true", "--timeout=90s"]);
    wait_until(
        60,
        &format!("{hp}'s record, address and DNAT rule gone"),
        || {
            !record_path(&hp_id).exists()
                && addresses().get(&hp_ip) != Some(&hp_id)
                && dnat_rules(&hp_id).is_empty()
        },
    );
    assert!(dels_of(&hp_id) >= 1, "no DEL of {hp_id} seen");
    // Its replacement, recorded too.
    rollout(&c, "deployment/hp", "default");
    let ids = attached(&c, 4);
    assert!(!ids.values().any(|i| *i == hp_id));
    assert_no_del_of_live(&c);

    // Uninstall: kubectl delete -k; the ledger stays first until `agent --uninstall`.
    c.kubectl(&[
        "delete",
        "-k",
        repo().join("deploy/kubernetes/base").to_str().unwrap(),
        "--wait=true",
        "--timeout=120s",
    ]);
    wait_until(120, "the agent's pod gone", || {
        c.kubectl_json(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=cni-ledger",
        ])["items"]
            .as_array()
            .unwrap()
            .is_empty()
    });
    assert_eq!(
        chain_types().first().map(String::as_str),
        Some("cni-ledger"),
        "docs/KUBERNETES.md: the ledger stays in the chain after kubectl delete -k"
    );
    let out = c.on_node(&[
        "/opt/cni/bin/cni-ledger",
        "agent",
        "--uninstall",
        "--conf-dir=/etc/cni/net.d",
    ]);
    ok(out, "cni-ledger agent --uninstall on the node");
    assert_eq!(
        chain_types(),
        ["bridge", "portmap"],
        "the chain after --uninstall"
    );
    let after: Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(
        conflist()["plugins"],
        after["plugins"],
        "the chain after --uninstall is the plain one"
    );
    assert!(
        node("/opt/cni/bin/cni-ledger").exists(),
        "the binary stays (docs: until the pods of the old chain are gone)"
    );

    // The pods keep their addresses, eth0 and records; a new pod starts, unrecorded.
    let kept = attached(&c, 4);
    assert_eq!(kept, ids, "the pods after the uninstall");
    c.kubectl(&["scale", "deployment/web", "--replicas=4"]);
    rollout(&c, "deployment/web", "default");
    let mut new_id = String::new();
    wait_until(60, "a 5th pod running with an address", || {
        let sb = c.sandboxes();
        let ips = pod_ips(&c);
        match ips.keys().find(|n| !ids.contains_key(*n)) {
            Some(n) => match sb.get(n) {
                Some((id, _)) => {
                    new_id = id.clone();
                    addresses().values().any(|v| v == id)
                }
                None => false,
            },
            None => false,
        }
    });
    assert!(
        !record_path(&new_id).exists(),
        "a pod started after the uninstall is recorded"
    );
    // A pod of the old chain. containerd (go-cni) runs DEL with the conflist it has
    // loaded now, not libcni's cached config of the ADD: the plain chain releases its
    // address and DNAT, but the ledger is not called, so its record stays behind in the
    // node's ledger dir (docs/KUBERNETES.md's Uninstall said libcni would run the ledger
    // from its cached config: not so under containerd 2.4).
    let (old, old_id) = ids.iter().find(|(n, _)| n.starts_with("web-")).unwrap();
    let old_ip = pod_ips(&c)[old].clone();
    let seen = calls().len();
    c.kubectl(&["delete", "pod", old, "--wait=true", "--timeout=90s"]);
    wait_until(60, &format!("{old}'s address released"), || {
        addresses().get(&old_ip) != Some(old_id)
    });
    let dels: Vec<_> = calls()[seen..]
        .iter()
        .filter(|x| x[1] == "DEL" && x[2] == *old_id)
        .map(|x| x[0].clone())
        .collect();
    assert!(
        dels.contains(&"bridge".to_string()) && dels.contains(&"portmap".to_string()),
        "{old}'s DEL through the plain chain: {dels:?}"
    );
    assert!(
        record_path(old_id).exists(),
        "{old}'s record went: the runtime ran the ledger on DEL after --uninstall \
         (docs/KUBERNETES.md's Uninstall should say so again)"
    );
    assert_no_del_of_live(&c);
}

/// Issue 38 item 3, "runtime state lost": the node goes down uncleanly with the agent
/// installed and pods running (kubelet, containerd, the shims and the pods killed at
/// once), and comes back with what a reboot clears gone (the pods' netns mounts and
/// /run/netns files, the bridge, this network's nat rules, containerd's state dir) and
/// containerd's root dir lost as well, so the runtime knows none of the old sandboxes and
/// no runtime DEL ever comes for them. kubelet brings the pods back (new sandboxes through
/// the chain, each recorded); the agent, once kubelet restarts it, releases every
/// attachment of the old boot (records stale by `netns-missing`, host-local's addresses,
/// DNAT rules) by replaying their DEL; no live pod loses its address, eth0 or record, and
/// no DEL the plugins see names a live pod.
#[test]
fn after_a_reboot_that_lost_the_runtimes_state_the_agent_releases_the_old_boots_attachments() {
    require_root!();
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up();
    install_agent(&c);
    apply_stdin(&c, &workloads());
    rollout(&c, "deployment/web", "default");
    rollout(&c, "deployment/hp", "default");
    let before = attached(&c, 4);
    let recorded_at = Instant::now();
    let (_, hp_old) = the_hostport_pod(&before);
    assert!(!dnat_rules(&hp_old).is_empty());
    let old_ips: BTreeMap<String, String> = addresses()
        .into_iter()
        .filter(|(_, id)| before.values().any(|i| i == id))
        .collect();
    assert_eq!(
        old_ips.len(),
        4,
        "host-local's addresses of the pods: {old_ips:?}"
    );
    let agent_uid = |c: &Cluster| {
        c.kubectl_json(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=cni-ledger",
        ])["items"][0]["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .map(String::from)
    };
    let agent_before = agent_uid(&c);
    // gc leaves records younger than its --grace (60 s; the manifest passes none) alone
    // unless the boot ID changed, which this reboot (of the node, not of the machine)
    // does not; the agent runs gc at its start, then every --gc-interval (300 s). So the
    // pods run past the grace first, as they would on a node up for more than a minute.
    let since = recorded_at.elapsed();
    if since < Duration::from_secs(GRACE_SECS + 2) {
        sleep(Duration::from_secs(GRACE_SECS + 2) - since);
    }

    // The unclean reboot, state lost.
    let t = Instant::now();
    ok(
        cluster_sh(&["restart", "--lose-runtime-state"]),
        "cluster.sh restart --lose-runtime-state",
    );
    let node_back = Instant::now();
    eprintln!(
        "k8s_node: node rebooted (runtime state lost) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for id in before.values() {
        assert!(
            record_path(id).exists(),
            "the reboot took the record of {id}: the ledger is on disk"
        );
    }

    // kubelet brings the agent back: a new container, Ready.
    wait_until(180, "the agent's pod running again, Ready", || {
        let now = agent_uid(&c);
        now.is_some()
            && now != agent_before
            && c.kubectl_out(&[
                "-n",
                "kube-system",
                "wait",
                "--for=condition=Ready",
                "pod",
                "-l",
                "app.kubernetes.io/name=cni-ledger",
                "--timeout=1s",
            ])
            .status
            .success()
    });
    let agent_ready = Instant::now();
    // ... and the pods, new sandboxes, each recorded, with an address and eth0.
    let after = attached(&c, 4);
    for (n, id) in &after {
        assert!(
            !before.values().any(|o| o == id),
            "{n} kept its old sandbox {id} though the runtime lost it"
        );
    }
    // Every attachment of the old boot released.
    wait_until(
        180,
        "every record, address and DNAT rule of the old boot released",
        || {
            let held = addresses();
            before.values().all(|id| {
                !record_path(id).exists()
                    && !held.values().any(|v| v == id)
                    && dnat_rules(id).is_empty()
            })
        },
    );
    let released = Instant::now();
    eprintln!(
        "k8s_node: the old boot's 4 attachments released {:.1} s after the node came back, \
         {:.1} s after the agent was Ready again",
        (released - node_back).as_secs_f64(),
        (released - agent_ready).as_secs_f64()
    );
    // By the agent's replayed DELs: the runtime never heard of those sandboxes again.
    for id in before.values() {
        assert!(
            calls()
                .iter()
                .any(|x| x[0] == "bridge" && x[1] == "DEL" && x[2] == *id),
            "no bridge DEL of the old sandbox {id}"
        );
    }
    // Judged stale because their namespaces are gone (a release build: no test boot ID),
    // and replayed, as the agent's log says.
    let log = c.kubectl(&["-n", "kube-system", "logs", "daemonset/cni-ledger"]);
    for id in before.values() {
        let key = format!("gc: {NETWORK}/{id}/eth0: ");
        assert!(
            log.contains(&format!("{key}stale (netns-missing")),
            "{id} not judged stale by netns-missing:\n{log}"
        );
        assert!(
            log.contains(&format!("{key}replayed")),
            "{id} not replayed:\n{log}"
        );
    }
    // The live pods untouched: same sandboxes, each with its record, address and eth0.
    let still = attached(&c, 4);
    assert_eq!(still, after, "the live pods after the release");
    assert!(
        !dnat_rules(&the_hostport_pod(&still).1).is_empty(),
        "the live hostPort pod lost its DNAT rule"
    );
    assert_no_del_of_live(&c);
}
