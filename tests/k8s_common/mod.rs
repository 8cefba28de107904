//! A one-node Kubernetes for the tests (tests/k8s/cluster.sh): the cluster, its node's
//! paths seen from the machine, and the steps a user takes on it (the image imported, the
//! agent applied with kustomize), shared by the test binaries that need a real kubelet.
//!
//! The cluster's dir is cluster.sh's default, /var/lib/cni-ledger-k8s, and its ports, links
//! and cgroups are fixed: one cluster per machine. `Cluster::up` takes an exclusive lock
//! on CLUSTER_LOCK (as `flock` the command does, so a shell can share it) and keeps it
//! until the cluster is down, so test binaries and people take turns; a cluster left there
//! by an interrupted run is taken down first.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::common::*;
use nix::fcntl::{Flock, FlockArg};
use serde_json::Value;

/// Held for the cluster's life: `flock /run/lock/cni-ledger-k8s.lock bash tests/k8s/cluster.sh ...`
/// waits for it too.
pub const CLUSTER_LOCK: &str = "/run/lock/cni-ledger-k8s.lock";

/// The cluster's dir (cluster.sh's CNI_LEDGER_K8S_DIR default), and the node's dirs in it.
pub const D: &str = "/var/lib/cni-ledger-k8s";
pub const NETWORK: &str = "cni-ledger-k8s";
pub const PAUSE: &str = "registry.invalid/cni-ledger-k8s/pause:1";
pub const HOST_PORT: u16 = 18080;
/// gc's default `--grace` (docs/REFERENCE.md), which the manifest keeps.
pub const GRACE_SECS: u64 = 60;

pub fn node(path: &str) -> PathBuf {
    Path::new(D).join("node").join(path.trim_start_matches('/'))
}

pub fn describe_out(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn ok(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", describe_out(&out));
    String::from_utf8(out.stdout).unwrap()
}

pub fn cluster_sh(args: &[&str]) -> Output {
    cluster_sh_env(args, &[])
}

fn cluster_sh_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new("bash")
        .arg(repo().join("tests/k8s/cluster.sh"))
        .args(args)
        .env("CNI_LEDGER_K8S_DIR", D)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// The node's runtime (cluster.sh's CNI_LEDGER_K8S_RUNTIME).
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Runtime {
    Containerd,
    Crio,
}

/// The cluster, up; down when dropped (at the end, or on a panic).
pub struct Cluster {
    pub kubeconfig: String,
    pub runtime: Runtime,
    bins: Vec<PathBuf>,
    started: Instant,
    // Last: released after the Drop took the cluster down.
    _machine: Flock<fs::File>,
}

impl Cluster {
    pub fn up() -> Cluster {
        Cluster::up_on(Runtime::Containerd)
    }

    pub fn up_on(runtime: Runtime) -> Cluster {
        Cluster::up_with(runtime, &[])
    }

    /// Up with cluster.sh settings of `env` too (CNI_LEDGER_K8S_IPAM, ...).
    pub fn up_with(runtime: Runtime, env: &[(&str, &str)]) -> Cluster {
        let _ = fs::create_dir_all("/run/lock");
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(CLUSTER_LOCK)
            .unwrap();
        let t = Instant::now();
        let machine = Flock::lock(lock, FlockArg::LockExclusive)
            .unwrap_or_else(|(_, e)| panic!("flock {CLUSTER_LOCK}: {e}"));
        if t.elapsed() > Duration::from_secs(1) {
            eprintln!(
                "k8s: waited {:.0} s for the cluster (another test had it)",
                t.elapsed().as_secs_f64()
            );
        }
        // What an interrupted run left.
        let _ = cluster_sh(&["down"]);
        let t = Instant::now();
        let name = match runtime {
            Runtime::Containerd => "containerd",
            Runtime::Crio => "crio",
        };
        let mut env = env.to_vec();
        env.push(("CNI_LEDGER_K8S_RUNTIME", name));
        let out = cluster_sh_env(&["up"], &env);
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
            runtime,
            bins,
            started: Instant::now(),
            _machine: machine,
        };
        if guard_less {
            drop(c);
            panic!("cluster.sh up: {}", describe_out(&out));
        }
        eprintln!("k8s: cluster up in {:.1} s", t.elapsed().as_secs_f64());
        c
    }

    pub fn tool(&self, name: &str) -> PathBuf {
        self.bins
            .iter()
            .map(|d| d.join(name))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("no {name} in {:?}", self.bins))
    }

    pub fn kubectl_out(&self, args: &[&str]) -> Output {
        Command::new(self.tool("kubectl"))
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .unwrap()
    }

    pub fn kubectl(&self, args: &[&str]) -> String {
        ok(
            self.kubectl_out(args),
            &format!("kubectl {}", args.join(" ")),
        )
    }

    pub fn kubectl_json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a)).unwrap()
    }

    /// The runtime's CRI socket, seen from the machine.
    pub fn sock(&self) -> PathBuf {
        match self.runtime {
            Runtime::Containerd => node("/run/containerd/containerd.sock"),
            Runtime::Crio => node("/run/crio/crio.sock"),
        }
    }

    pub fn ctr(&self, args: &[&str]) -> String {
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
    pub fn sandboxes(&self) -> BTreeMap<String, (String, String)> {
        self.sandboxes_of(&[])
    }

    /// The same, of the pods of namespace `ns` only (not the agent's, which has the node's
    /// network and so no attachment).
    pub fn sandboxes_in(&self, ns: &str) -> BTreeMap<String, (String, String)> {
        self.sandboxes_of(&["--namespace", ns])
    }

    fn sandboxes_of(&self, filter: &[&str]) -> BTreeMap<String, (String, String)> {
        let out = Command::new(self.tool("crictl"))
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", self.sock().display()))
            .args(["pods", "--state", "ready", "-o", "json"])
            .args(filter)
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
    pub fn node_pid(&self) -> String {
        fs::read_to_string(Path::new(D).join("pid/node"))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    }

    /// Runs a command in the node's mount namespace (its paths as the node has them).
    pub fn on_node(&self, args: &[&str]) -> Output {
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
            "k8s: cluster down after {:.1} s{}",
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
pub fn wait_until(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
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
/// into the node's runtime (of the cluster `_up`, which must be up) under the manifest's
/// image name, as on a node without a registry. PROFILE=dev unless CL_K8S_IMAGE_PROFILE says otherwise (release: as a user
/// builds it, much slower to build); neither has the `testing` feature.
pub fn load_agent_image(_up: &Cluster, manifest_image: &str) {
    let tag = format!("localhost/cni-ledger:k8s-test-{}", std::process::id());
    let profile = image_profile();
    let t = Instant::now();
    let out = Command::new(repo().join("scripts/build-image.sh"))
        .arg(&tag)
        .env("PROFILE", &profile)
        .env("CARGO_PROFILE_DEV_DEBUG", "0")
        .output()
        .unwrap();
    ok(out, "scripts/build-image.sh");
    eprintln!(
        "k8s: image built ({profile}) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    import_image(&tag, manifest_image);
}

fn image_profile() -> String {
    std::env::var("CL_K8S_IMAGE_PROFILE").unwrap_or_else(|_| "dev".into())
}

/// The static binary scripts/build-image.sh put in the image (its own path logic).
fn image_binary() -> PathBuf {
    let host = ok(
        Command::new("rustc").arg("-vV").output().unwrap(),
        "rustc -vV",
    )
    .lines()
    .find_map(|l| l.strip_prefix("host: ").map(String::from))
    .unwrap();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    let out = match image_profile().as_str() {
        "dev" => "debug".to_string(),
        p => p.to_string(),
    };
    target.join(host).join(out).join("cni-ledger")
}

/// A new image of the agent, `image`, for an upgrade: the binary load_agent_image built
/// with a note section naming `image` added (objcopy), so the node is handed a file of
/// other bytes, as a new build's, that runs the same code (tests/upgrade.rs upgrades
/// across builds of other code); built from the Containerfile as scripts/build-image.sh
/// builds it. Call load_agent_image first.
pub fn load_upgrade_image(_up: &Cluster, image: &str) {
    let tmp = TempDir::new("k8s-upgrade-image");
    let note = tmp.path().join("note");
    fs::write(&note, image).unwrap();
    let bin = tmp.path().join("cni-ledger");
    ok(
        Command::new("objcopy")
            .arg(format!(
                "--add-section=.note.cni-ledger-test={}",
                note.display()
            ))
            .arg(image_binary())
            .arg(&bin)
            .output()
            .unwrap(),
        "objcopy --add-section",
    );
    let tag = format!("localhost/cni-ledger:k8s-upgrade-{}", std::process::id());
    ok(
        Command::new("podman")
            .args(["build", "--quiet", "-f"])
            .arg(repo().join("Containerfile"))
            .args(["-t", &tag])
            .arg(tmp.path())
            .output()
            .unwrap(),
        "podman build (the upgrade's image)",
    );
    import_image(&tag, image);
}

/// Moves podman's `tag` into the node's runtime as `image` (cluster.sh load-image, which
/// keeps it for `cluster.sh restart` to load again, as a registry would serve it again).
fn import_image(tag: &str, image: &str) {
    let tmp = TempDir::new("k8s-image");
    let tar = tmp.path().join("agent.tar");
    ok(
        Command::new("podman")
            .args(["save", "-o"])
            .arg(&tar)
            .arg(tag)
            .output()
            .unwrap(),
        "podman save",
    );
    let _ = Command::new("podman").args(["rmi", tag]).output();
    ok(
        cluster_sh(&["load-image", tar.to_str().unwrap(), tag, image]),
        "cluster.sh load-image",
    );
}

/// The node's conflist, as JSON, and its plugins' types.
pub fn conflist() -> Value {
    let p = node("/etc/cni/net.d/10-pods.conflist");
    serde_json::from_slice(&fs::read(&p).unwrap()).unwrap()
}

pub fn chain_types() -> Vec<String> {
    conflist()["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["type"].as_str().unwrap().to_string())
        .collect()
}

pub fn record_path(id: &str) -> PathBuf {
    node("/var/lib/cni-ledger/records").join(format!("{NETWORK}:{id}:eth0.json"))
}

pub fn records() -> BTreeSet<String> {
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
pub fn addresses() -> BTreeMap<String, String> {
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
pub fn nat_rules(id: &str) -> Vec<String> {
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

pub fn dnat_rules(id: &str) -> Vec<String> {
    nat_rules(id)
        .into_iter()
        .filter(|l| l.contains("dnat name"))
        .collect()
}

/// Every CNI call the node's plugins saw (cluster.sh's wrappers): (plugin, command,
/// container id, netns, CNI_ARGS).
pub fn calls() -> Vec<[String; 5]> {
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

pub fn dels_of(id: &str) -> usize {
    calls()
        .iter()
        .filter(|c| c[1] == "DEL" && c[2] == id)
        .count()
}

/// eth0's IPv4 address in the pod's network namespace (by its netns path in the node).
pub fn eth0_addr(c: &Cluster, netns: &str) -> Option<String> {
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
pub fn record_netns(id: &str) -> Option<String> {
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
pub fn workloads() -> String {
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

pub fn apply_stdin(c: &Cluster, yaml: &str) {
    let tmp = TempDir::new("k8s-yaml");
    let f = tmp.path().join("w.yaml");
    fs::write(&f, yaml).unwrap();
    c.kubectl(&["apply", "-f", f.to_str().unwrap()]);
}

/// The running pods of the default namespace: name -> pod IP.
pub fn pod_ips(c: &Cluster) -> BTreeMap<String, String> {
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

pub fn rollout(c: &Cluster, what: &str, ns: &str) {
    c.kubectl(&["-n", ns, "rollout", "status", what, "--timeout=180s"]);
}

/// Installs the agent as docs/KUBERNETES.md says; returns once its pod is Ready and the
/// ledger is first in the node's conflist.
pub fn install_agent(c: &Cluster) {
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
        "k8s: agent Ready {:.1} s after kubectl apply -k",
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
pub fn attached(c: &Cluster, want: usize) -> BTreeMap<String, String> {
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

pub fn the_hostport_pod(ids: &BTreeMap<String, String>) -> (String, String) {
    ids.iter()
        .find(|(n, _)| n.starts_with("hp-"))
        .map(|(n, i)| (n.clone(), i.clone()))
        .expect("the hostPort pod")
}

/// No DEL the node's plugins saw names a sandbox that is live now.
pub fn assert_no_del_of_live(c: &Cluster) {
    let live: BTreeSet<String> = c.sandboxes().into_values().map(|(id, _)| id).collect();
    let bad: Vec<_> = calls()
        .into_iter()
        .filter(|x| x[1] == "DEL" && live.contains(&x[2]))
        .collect();
    assert!(bad.is_empty(), "DELs of live pods: {bad:?}");
}

/// Pods made and deleted all the time while something else happens (an upgrade of the
/// agent): a Deployment `churn` scaled between 1 and 4 replicas and its pods deleted, as
/// kubelet would see on a busy node; meanwhile the node's conflist is read every 100 ms
/// and each read whose first plugin is not the ledger is kept.
pub struct ChurnReport {
    pub rounds: usize,
    pub chain_reads: usize,
    pub not_first: Vec<Vec<String>>,
}

pub fn churn_deployment() -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: churn, namespace: default}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: churn}}}}
  template:
    metadata: {{labels: {{app: churn}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: pause
        image: {PAUSE}
        imagePullPolicy: Never
"#
    )
}

/// Runs `during` while the `churn` Deployment (applied with churn_deployment) churns;
/// returns what it returned and the churn's report.
pub fn with_churn<T: Send>(c: &Cluster, during: impl FnOnce() -> T + Send) -> (T, ChurnReport) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let chain = s.spawn(|| {
            let (mut reads, mut bad) = (0, Vec::new());
            while !done.load(Ordering::Relaxed) {
                let types = chain_types();
                reads += 1;
                if types.first().map(String::as_str) != Some("cni-ledger") {
                    bad.push(types);
                }
                sleep(Duration::from_millis(100));
            }
            (reads, bad)
        });
        let pods = s.spawn(|| {
            let mut rounds = 0;
            while !done.load(Ordering::Relaxed) {
                let n = [4, 1, 3, 2][rounds % 4].to_string();
                let _ = c.kubectl_out(&["scale", "deployment/churn", &format!("--replicas={n}")]);
                sleep(Duration::from_millis(1500));
                let _ = c.kubectl_out(&[
                    "delete",
                    "pod",
                    "-l",
                    "app=churn",
                    "--wait=false",
                    "--grace-period=1",
                ]);
                sleep(Duration::from_millis(1500));
                rounds += 1;
            }
            rounds
        });
        let out = during();
        // A few rounds after it too: the new agent takes ADDs and DELs as well.
        sleep(Duration::from_secs(6));
        done.store(true, Ordering::Relaxed);
        let rounds = pods.join().unwrap();
        let (chain_reads, not_first) = chain.join().unwrap();
        (
            out,
            ChurnReport {
                rounds,
                chain_reads,
                not_first,
            },
        )
    })
}

/// The events in which kubelet says a pod's sandbox could not be made or torn down (a
/// failed CNI ADD or DEL among them): reason, object, message.
pub fn sandbox_failures(c: &Cluster) -> Vec<String> {
    c.kubectl_json(&["get", "events", "-A"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            let r = e["reason"].as_str().unwrap_or("");
            r == "FailedCreatePodSandBox" || r == "FailedKillPod"
        })
        .map(|e| {
            format!(
                "{} {}: {}",
                e["reason"].as_str().unwrap_or(""),
                e["involvedObject"]["name"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// Waits until the node's records are exactly its ready sandboxes' (each DEL of the churn
/// dropped its record, each pod that runs has one).
pub fn records_match_sandboxes(c: &Cluster) {
    let mut last = (BTreeSet::new(), BTreeSet::new());
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        let live: BTreeSet<String> = c
            .sandboxes_in("default")
            .into_values()
            .map(|(id, _)| id)
            .collect();
        let rec = records();
        if live == rec {
            return;
        }
        last = (live, rec);
        sleep(Duration::from_millis(500));
    }
    panic!(
        "records are not the ready sandboxes after 120 s: sandboxes without a record {:?}, \
         records without a sandbox {:?}",
        last.0.difference(&last.1).collect::<Vec<_>>(),
        last.1.difference(&last.0).collect::<Vec<_>>()
    );
}

/// The agent's pod's container: (container ID, image), once it has one.
pub fn agent_container(c: &Cluster) -> Option<(String, String)> {
    let v = c.kubectl_json(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=cni-ledger",
    ]);
    let items = v["items"].as_array()?;
    // During a rollout the old pod may still be listed: the one not being deleted.
    let p = items
        .iter()
        .find(|p| p["metadata"]["deletionTimestamp"].is_null())?;
    let s = &p["status"]["containerStatuses"][0];
    Some((
        s["containerID"].as_str()?.to_string(),
        p["spec"]["containers"][0]["image"].as_str()?.to_string(),
    ))
}

pub fn agent_ready(c: &Cluster) -> bool {
    c.kubectl_out(&[
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
}

/// Issue 38 item 4 (and 39 item 4 through helm): the agent's DaemonSet moved to `image` by
/// `apply` while the `churn` Deployment's pods are made and deleted all the time. kubelet
/// makes no sandbox fail, the ledger stays first in every read of the conflist, the new
/// agent runs `image`, and afterwards the records are exactly the ready pods' (none lost,
/// none left by a DEL); then the churn is deleted and its records go with it.
pub fn upgrade_under_churn(c: &Cluster, image: &str, apply: impl FnOnce() + Send) {
    apply_stdin(c, &churn_deployment());
    rollout(c, "deployment/churn", "default");
    let (old, _) = agent_container(c).expect("the agent runs");
    let seen = calls().len();
    let t = Instant::now();
    let (took, report) = with_churn(c, || {
        apply();
        rollout(c, "daemonset/cni-ledger", "kube-system");
        wait_until(120, "the new agent Ready", || {
            agent_container(c).is_some_and(|(id, img)| id != old && img == image) && agent_ready(c)
        });
        t.elapsed()
    });
    let during = &calls()[seen..];
    let count = |cmd: &str| {
        during
            .iter()
            .filter(|x| x[0] == "bridge" && x[1] == cmd)
            .count()
    };
    let (adds, dels) = (count("ADD"), count("DEL"));
    eprintln!(
        "FIGURE k8s rolling upgrade to {image}: {:.1} s, {} churn rounds, {adds} ADDs and {dels} \
         DELs through the chain meanwhile, the conflist read {} times",
        took.as_secs_f64(),
        report.rounds,
        report.chain_reads
    );
    assert!(
        report.rounds >= 2 && adds >= 2 && dels >= 2,
        "the churn did not overlap the upgrade: {} rounds, {adds} ADDs, {dels} DELs",
        report.rounds
    );
    assert!(
        report.not_first.is_empty(),
        "the ledger was not first in {} of {} reads of the conflist: {:?}",
        report.not_first.len(),
        report.chain_reads,
        report.not_first.first()
    );
    let failed = sandbox_failures(c);
    assert!(failed.is_empty(), "sandboxes failed: {failed:#?}");
    rollout(c, "deployment/churn", "default");
    records_match_sandboxes(c);
    c.kubectl(&[
        "delete",
        "deployment",
        "churn",
        "--wait=true",
        "--timeout=90s",
    ]);
    wait_until(90, "the churn's pods gone", || {
        !c.sandboxes_in("default")
            .keys()
            .any(|n| n.starts_with("churn-"))
    });
    records_match_sandboxes(c);
}
