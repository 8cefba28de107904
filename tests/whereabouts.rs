//! whereabouts as the pod network's IPAM on a real Kubernetes node (issue 39, item 2): the
//! cluster of tests/k8s/cluster.sh with CNI_LEDGER_K8S_IPAM=whereabouts (`[cni-ledger,
//! bridge + whereabouts, portmap]`, whereabouts v0.9.2 built by scripts/build-whereabouts.sh,
//! its leases in IPPools and OverlappingRangeIPReservations of the cluster's API server),
//! the agent installed as tests/k8s_node.rs installs it.
//!
//! The node goes down uncleanly; while it is down two of its four pods are deleted from the
//! API (as the pod GC or an operator does with a node that is gone), and it comes back
//! with containerd's state lost: nobody runs a DEL for the old sandboxes. Their leases stay
//! in whereabouts' pool. The two pods that still exist are started again by kubelet under
//! the SAME names, and whereabouts' ADD hands a pod whose podRef already holds a lease that
//! lease (its AssignIP), rewriting its container ID; its DEL frees
//! only the lease of the container ID and interface it is given (DeallocateIP). So the old
//! sandboxes' replayed DELs must free the deleted pods' leases and none of a live pod's,
//! although a live pod has the podRef of an old sandbox. Read through the API, before and
//! after.
//!
//! Then whereabouts' own reconciler (ip-control-loop, its shipped DaemonSet) on the same
//! state: what it releases, when, and whether it touches a live pod's lease.
//!
//!     CARGO_TARGET_DIR=... cargo test --features testing --test whereabouts -- --nocapture
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod k8s_common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use k8s_common::*;
use serde_json::{json, Value};

const POOLS: &str = "ippools.whereabouts.cni.cncf.io";
const RESERVATIONS: &str = "overlappingrangeipreservations.whereabouts.cni.cncf.io";
/// Where whereabouts keeps its objects: the namespace of its kubeconfig's context, none
/// in the admin kubeconfig cluster.sh hands it, so kube-system (wbNamespaceFromCtx).
const WB_NS: &str = "kube-system";
/// What Multus writes on a pod for each of its networks, and all that whereabouts'
/// reconciler reads of a pod (its getFlatIPSet).
const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";

/// The whereabouts build's dir (bin/, crds/, install/), built when missing.
fn whereabouts_dir() -> PathBuf {
    let out = Command::new("bash")
        .arg(repo().join("scripts/build-whereabouts.sh"))
        .output()
        .unwrap();
    PathBuf::from(ok(out, "scripts/build-whereabouts.sh").trim())
}

/// One lease of whereabouts' pools.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Lease {
    container: String,
    pod: String,
    ifname: String,
}

/// Every lease in whereabouts' IPPools, read through the API: address -> lease. A pool's
/// allocations are keyed by the offset from its range's address (whereabouts'
/// toIPReservationList).
fn leases(c: &Cluster) -> BTreeMap<String, Lease> {
    let mut all = BTreeMap::new();
    for p in c.kubectl_json(&["get", POOLS, "-A"])["items"]
        .as_array()
        .unwrap()
    {
        let range = p["spec"]["range"].as_str().unwrap();
        let base: Ipv4Addr = range.split('/').next().unwrap().parse().unwrap();
        for (off, a) in p["spec"]["allocations"].as_object().into_iter().flatten() {
            let ip = Ipv4Addr::from(u32::from(base) + off.parse::<u32>().unwrap());
            all.insert(
                ip.to_string(),
                Lease {
                    container: a["id"].as_str().unwrap_or("").to_string(),
                    pod: a["podref"].as_str().unwrap_or("").to_string(),
                    ifname: a["ifname"].as_str().unwrap_or("").to_string(),
                },
            );
        }
    }
    all
}

/// whereabouts' cluster-wide reservations (enable_overlapping_ranges, on by default):
/// address -> podRef.
fn reservations(c: &Cluster) -> BTreeMap<String, String> {
    c.kubectl_json(&["get", RESERVATIONS, "-A"])["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["metadata"]["name"].as_str().unwrap().to_string(),
                r["spec"]["podref"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn web(replicas: u32) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: default}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: pause
        image: {PAUSE}
        imagePullPolicy: Never
"#
    )
}

/// A running pod of the default namespace: its sandbox and address.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pod {
    sandbox: String,
    ip: String,
}

/// Waits until `want` pods run in the default namespace, each recorded by the ledger and
/// holding the lease of its address under its own sandbox and name, with eth0 holding
/// that address; returns name -> pod.
fn attached(c: &Cluster, want: usize) -> BTreeMap<String, Pod> {
    let mut pods = BTreeMap::new();
    let mut pool = BTreeMap::new();
    wait_until(
        150,
        &format!("{want} running pods, each recorded and leased"),
        || {
            let ips = pod_ips(c);
            let sb = c.sandboxes_in("default");
            pool = leases(c);
            pods = ips
                .iter()
                .filter_map(|(n, ip)| {
                    Some((
                        n.clone(),
                        Pod {
                            sandbox: sb.get(n)?.0.clone(),
                            ip: ip.clone(),
                        },
                    ))
                })
                .collect();
            pods.len() == want
                && pods.iter().all(|(n, p)| {
                    record_path(&p.sandbox).exists()
                        && pool.get(&p.ip)
                            == Some(&Lease {
                                container: p.sandbox.clone(),
                                pod: format!("default/{n}"),
                                ifname: "eth0".into(),
                            })
                })
        },
    );
    for (n, p) in &pods {
        let netns = record_netns(&p.sandbox).unwrap_or_else(|| panic!("{n}: no netns recorded"));
        assert_eq!(
            eth0_addr(c, &netns).as_deref(),
            Some(p.ip.as_str()),
            "{n}: eth0 in {netns}"
        );
    }
    pods
}

/// The live pods' leases, as they must be: address -> lease.
fn leases_of(pods: &BTreeMap<String, Pod>) -> BTreeMap<String, Lease> {
    pods.iter()
        .map(|(n, p)| {
            (
                p.ip.clone(),
                Lease {
                    container: p.sandbox.clone(),
                    pod: format!("default/{n}"),
                    ifname: "eth0".into(),
                },
            )
        })
        .collect()
}

/// Field 22 of /proc/PID/stat, the process's start time (cluster.sh records it with the
/// PID, so a reused PID is never taken for its process).
fn starttime(pid: &str) -> Option<String> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(") ")? + 2..];
    rest.split_whitespace().nth(19).map(String::from)
}

/// The node's kubelet dies (SIGKILL, checked against the PID and start time cluster.sh
/// recorded): the node stops answering for its pods, which run on for now.
fn kill_kubelet() {
    let rec = fs::read_to_string(Path::new(D).join("pid/kubelet")).unwrap();
    let mut f = rec.split_whitespace();
    let (pid, st) = (f.next().unwrap().to_string(), f.next().unwrap().to_string());
    assert_eq!(
        starttime(&pid).as_deref(),
        Some(st.as_str()),
        "kubelet runs"
    );
    ok(
        Command::new("kill").args(["-KILL", &pid]).output().unwrap(),
        "kill kubelet",
    );
    wait_until(20, "kubelet gone", || {
        starttime(&pid).as_deref() != Some(st.as_str())
    });
}

/// The wrappers' log with its times: (unix seconds, plugin, command, container id).
fn timed_calls() -> Vec<(f64, String, String, String)> {
    fs::read_to_string(Path::new(D).join("cni-calls.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() >= 7).then(|| {
                (
                    f[0].parse().unwrap_or(0.0),
                    f[1].to_string(),
                    f[2].to_string(),
                    f[3].to_string(),
                )
            })
        })
        .collect()
}

/// The last `n` lines of a file, for a failure's message.
fn tail(path: &Path, n: usize) -> String {
    let s = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// whereabouts' ip-control-loop as an image, FROM scratch (its own image is alpine with
/// the binaries at /; no registry here): built with podman and saved to `tar`.
fn reconciler_image(wb: &Path, tag: &str, tar: &Path) {
    let ctx = tar.parent().unwrap().join("ctx");
    fs::create_dir_all(&ctx).unwrap();
    fs::copy(wb.join("bin/ip-control-loop"), ctx.join("ip-control-loop")).unwrap();
    fs::write(
        ctx.join("Containerfile"),
        "FROM scratch\nCOPY ip-control-loop /ip-control-loop\n",
    )
    .unwrap();
    ok(
        Command::new("podman")
            .args(["build", "--quiet", "-t", tag])
            .arg(&ctx)
            .output()
            .unwrap(),
        "podman build (ip-control-loop)",
    );
    ok(
        Command::new("podman")
            .args(["save", "-o"])
            .arg(tar)
            .arg(tag)
            .output()
            .unwrap(),
        "podman save",
    );
    let _ = Command::new("podman").args(["rmi", tag]).output();
}

/// The module's doc/crds/daemonset-install.yaml (ServiceAccount, RBAC, the cron ConfigMap,
/// the DaemonSet) as kubectl reads it, changed only where this cluster needs it: the image
/// (ours, never pulled); the container runs ip-control-loop alone, as the shipped command
/// does last (its install-cni.sh, which needs the image's shell, copies the plugin and
/// writes whereabouts.d/, which cluster.sh did); the API server at 127.0.0.1 (no
/// kube-proxy: the `kubernetes` Service's address leads nowhere; the pod has the node's
/// network); and the ConfigMap's schedule `cron` instead of "30 4 * * *".
fn reconciler_manifest(c: &Cluster, wb: &Path, image: &str, cron: &str) -> String {
    let install = wb.join("install/daemonset-install.yaml");
    // One JSON document per YAML document.
    let docs = c.kubectl(&[
        "create",
        "--dry-run=client",
        "-o",
        "json",
        "-f",
        install.to_str().unwrap(),
    ]);
    let mut items: Vec<Value> = serde_json::Deserializer::from_str(&docs)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap();
    let api = c.kubectl(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]);
    let port = api.rsplit(':').next().unwrap().to_string();
    let mut kinds = Vec::new();
    for item in &mut items {
        kinds.push(item["kind"].as_str().unwrap().to_string());
        match item["kind"].as_str().unwrap() {
            "ConfigMap" => {
                assert_eq!(item["data"]["cron-expression"], "30 4 * * *");
                item["data"]["cron-expression"] = json!(cron);
            }
            "DaemonSet" => {
                let ct = &mut item["spec"]["template"]["spec"]["containers"][0];
                let shipped = ct["args"].to_string();
                assert!(
                    shipped.contains("/ip-control-loop -log-level debug"),
                    "the shipped DaemonSet no longer runs ip-control-loop: {shipped}"
                );
                ct["image"] = json!(image);
                ct["imagePullPolicy"] = json!("Never");
                ct["command"] = json!(["/ip-control-loop"]);
                ct["args"] = json!(["-log-level", "debug"]);
                ct["env"].as_array_mut().unwrap().extend([
                    json!({"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}),
                    json!({"name": "KUBERNETES_SERVICE_PORT", "value": port}),
                ]);
            }
            _ => {}
        }
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "ServiceAccount"
        ]
    );
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// The first line of the reconciler's log holding `what` (its lines begin with their
/// time), if any.
fn reconciler_line(log: &str, what: &str) -> Option<String> {
    log.lines().find(|l| l.contains(what)).map(String::from)
}

/// The agent's gc after the reboot, then whereabouts' reconciler on the same state (the
/// file's comment says what and why).
#[test]
fn after_an_unclean_reboot_gc_frees_exactly_the_old_pods_whereabouts_leases() {
    require_root!();
    let wb = whereabouts_dir();
    let c = Cluster::up_with(
        Runtime::Containerd,
        &[("CNI_LEDGER_K8S_IPAM", "whereabouts")],
    );
    let ipam = &conflist()["plugins"][0]["ipam"];
    assert_eq!(ipam["type"], "whereabouts", "cluster.sh's conflist: {ipam}");

    install_agent(&c);
    let chain = conflist();
    let bridge = chain["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "bridge")
        .expect("bridge in the chain");
    assert_eq!(bridge["ipam"]["type"], "whereabouts", "the chain: {chain}");
    apply_stdin(&c, &web(4));
    rollout(&c, "deployment/web", "default");
    let before = attached(&c, 4);
    let recorded_at = Instant::now();
    let pool_before = leases(&c);
    assert_eq!(
        pool_before,
        leases_of(&before),
        "the pool is the pods' leases"
    );
    let ips_before: BTreeMap<String, String> = before
        .iter()
        .map(|(n, p)| (p.ip.clone(), format!("default/{n}")))
        .collect();
    assert_eq!(
        reservations(&c),
        ips_before,
        "the cluster-wide reservations"
    );

    // While gc's grace runs out (the agent's gc leaves records younger than 60 s alone;
    // see tests/k8s_node.rs), the reconciler's image.
    let tmp = TempDir::new("whereabouts");
    let image = format!(
        "localhost/whereabouts-ip-control-loop:test-{}",
        std::process::id()
    );
    let image_tar = tmp.path().join("ip-control-loop.tar");
    reconciler_image(&wb, &image, &image_tar);
    let since = recorded_at.elapsed();
    if since < Duration::from_secs(GRACE_SECS + 2) {
        sleep(Duration::from_secs(GRACE_SECS + 2) - since);
    }

    // The node goes down: kubelet first; two pods are deleted while it is down, so no
    // runtime ever DELs them; their Deployment replaces them with pods of new names.
    let (agent_before, _) = agent_container(&c).expect("the agent runs");
    kill_kubelet();
    let gone: Vec<String> = before.keys().take(2).cloned().collect();
    let kept: Vec<String> = before.keys().skip(2).cloned().collect();
    let mut del = vec![
        "delete",
        "pod",
        "-n",
        "default",
        "--force",
        "--grace-period=0",
    ];
    del.extend(gone.iter().map(String::as_str));
    c.kubectl(&del);
    let t = Instant::now();
    let reboot_unix = now();
    ok(
        cluster_sh(&["restart", "--lose-runtime-state"]),
        "cluster.sh restart --lose-runtime-state",
    );
    let node_back = Instant::now();
    eprintln!(
        "whereabouts: node rebooted (runtime state lost) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for p in before.values() {
        assert!(record_path(&p.sandbox).exists(), "the reboot took a record");
    }

    wait_until(180, "the agent's pod running again, Ready", || {
        agent_container(&c).is_some_and(|(id, _)| id != agent_before) && agent_ready(&c)
    });
    let mut after = attached(&c, 4);
    for n in &kept {
        assert!(after.contains_key(n), "{n} not started again: {after:?}");
    }
    for n in &gone {
        assert!(!after.contains_key(n), "{n} back though deleted");
    }
    for (n, p) in &after {
        assert!(
            !before.values().any(|o| o.sandbox == p.sandbox),
            "{n} kept its old sandbox across the reboot"
        );
    }
    // The old boot's records all go (by the agent's gc: the runtime knows none of them),
    // and the pool ends as exactly the live pods' leases (of the sandboxes live then:
    // kubelet may have made a pod a new one meanwhile).
    let t = Instant::now();
    let live_leases = |c: &Cluster| {
        let sb = c.sandboxes_in("default");
        let pods: BTreeMap<String, Pod> = pod_ips(c)
            .into_iter()
            .filter_map(|(n, ip)| {
                let sandbox = sb.get(&n)?.0.clone();
                Some((n, Pod { sandbox, ip }))
            })
            .collect();
        leases_of(&pods)
    };
    while !(before.values().all(|p| !record_path(&p.sandbox).exists())
        && leases(&c) == live_leases(&c))
    {
        if t.elapsed() > Duration::from_secs(180) {
            panic!(
                "not after 180 s: the old boot's records and leases released\n\
                 live pods {after:?}\nold pods {before:?}\npool {:?}\nrecords {:?}\n\
                 agent's log:\n{}\nwhereabouts' log (end):\n{}",
                leases(&c),
                records(),
                c.kubectl(&["-n", "kube-system", "logs", "daemonset/cni-ledger"]),
                tail(&Path::new(D).join("log/whereabouts.log"), 60)
            );
        }
        sleep(Duration::from_millis(250));
    }
    let released = Instant::now();
    let still = attached(&c, 4);
    if still != after {
        eprintln!("whereabouts: pods given new sandboxes meanwhile: {after:?} -> {still:?}");
        after = still;
    }
    let pool_after = leases(&c);
    let ips_after: BTreeMap<String, String> = after
        .iter()
        .map(|(n, p)| (p.ip.clone(), format!("default/{n}")))
        .collect();
    assert_eq!(reservations(&c), ips_after, "the cluster-wide reservations");

    // Each old sandbox's DEL reached whereabouts, replayed by the agent (stale by
    // netns-missing: the runtime never heard of them again).
    let calls_now = timed_calls();
    let log = c.kubectl(&["-n", "kube-system", "logs", "daemonset/cni-ledger"]);
    for p in before.values() {
        assert!(
            calls_now.iter().any(|(t, pl, cmd, id)| *t >= reboot_unix
                && pl == "whereabouts"
                && cmd == "DEL"
                && *id == p.sandbox),
            "no whereabouts DEL of the old sandbox {}",
            p.sandbox
        );
        let key = format!("gc: {NETWORK}/{}/eth0: ", p.sandbox);
        assert!(
            log.contains(&format!("{key}stale (netns-missing"))
                && log.contains(&format!("{key}replayed")),
            "{} not replayed as stale by netns-missing:\n{log}",
            p.sandbox
        );
    }
    // The deleted pods' leases are gone, by those DELs.
    for n in &gone {
        let ip = &before[n].ip;
        assert!(
            pool_after
                .get(ip)
                .is_none_or(|l| l.pod != format!("default/{n}")),
            "{n}'s lease of {ip} stays: {pool_after:?}"
        );
    }
    // The hazard: an old sandbox of a pod that lives on under the same name. Its replayed
    // DEL came after the pod's new ADD (whereabouts gave the lease to the new sandbox:
    // the DEL, by container ID, finds nothing) or before it (it freed the old lease; the
    // ADD took a lease anew). Either way the live pod holds its lease (checked above).
    let (mut after_add, mut before_add) = (0, 0);
    let wb_log = fs::read_to_string(Path::new(D).join("log/whereabouts.log")).unwrap();
    for n in &kept {
        let old = &before[n].sandbox;
        let new = &after[n].sandbox;
        let at = |pl: &str, cmd: &str, id: &str| {
            calls_now
                .iter()
                .filter(|(_, p, c, i)| p == pl && c == cmd && i == id)
                .map(|x| x.0)
                .fold(None, |m: Option<f64>, t| Some(m.map_or(t, |m| m.max(t))))
                .unwrap()
        };
        if at("whereabouts", "DEL", old) > at("whereabouts", "ADD", new) {
            after_add += 1;
            assert!(
                wb_log.contains(&format!(
                    "Failed to find allocation for container ID: {old}"
                )),
                "whereabouts' log does not say the DEL of {n}'s old sandbox {old} found nothing"
            );
        } else {
            before_add += 1;
        }
    }
    let kept_address = kept
        .iter()
        .filter(|n| before[*n].ip == after[*n].ip)
        .count();
    assert_no_del_of_live(&c);
    let failed = sandbox_failures(&c);
    assert!(failed.is_empty(), "sandboxes failed: {failed:#?}");
    let old_ips: BTreeSet<&String> = gone.iter().map(|n| &before[n].ip).collect();
    eprintln!(
        "FIGURE whereabouts gc: pool of {} leases before the reboot; after it the agent's gc \
         freed the {} leases of the deleted pods ({:?}) {:.1} s after the node came back; \
         the pool is then exactly the {} live pods' leases; {} pods started again under \
         their names: the replayed DEL of their old sandbox came after their new ADD in \
         {after_add} (a no-op: the lease had passed to the new sandbox) and before it in \
         {before_add}; {kept_address} of them kept their address; DELs of a live sandbox: 0",
        pool_before.len(),
        gone.len(),
        old_ips,
        (released - node_back).as_secs_f64(),
        pool_after.len(),
        kept.len(),
    );

    // whereabouts' own reconciler on the state the reboot left: the deleted pods' leases
    // written back as they were (and their reservations), which is what the pool would
    // hold now had nothing released them. The agent keeps out of it: their records are
    // gone. The two pods started again carry the annotation Multus writes for a network
    // (a secondary one, what whereabouts' reconciler is written for); the two new ones
    // carry none, as on this node, where whereabouts serves the pod network and no
    // Multus runs.
    let pool_name = c.kubectl(&[
        "get",
        POOLS,
        "-n",
        WB_NS,
        "-o",
        "jsonpath={.items[0].metadata.name}",
    ]);
    let base: Ipv4Addr = c
        .kubectl(&[
            "get",
            POOLS,
            "-n",
            WB_NS,
            &pool_name,
            "-o",
            "jsonpath={.spec.range}",
        ])
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let offset = |ip: &str| u32::from(ip.parse::<Ipv4Addr>().unwrap()) - u32::from(base);
    // At its own address; at the lowest free one if a pod started after the reboot holds
    // it (when gc freed it before that pod's ADD): the reconciler judges a lease by its
    // podRef and address, not by which address it is.
    let mut spare = (2..255)
        .map(|o| Ipv4Addr::from(u32::from(base) + o).to_string())
        .filter(|ip| !pool_after.contains_key(ip) && !gone.iter().any(|n| before[n].ip == *ip));
    let stranded: BTreeMap<String, Lease> = gone
        .iter()
        .map(|n| {
            let own = &before[n].ip;
            let ip = if pool_after.contains_key(own) {
                spare.next().unwrap()
            } else {
                own.clone()
            };
            (ip, pool_before[own].clone())
        })
        .collect();
    let allocations: serde_json::Map<String, Value> = stranded
        .iter()
        .map(|(ip, l)| {
            (
                offset(ip).to_string(),
                json!({"id": l.container, "podref": l.pod, "ifname": l.ifname}),
            )
        })
        .collect();
    let patch = json!({"spec": {"allocations": allocations}}).to_string();
    c.kubectl(&[
        "patch", POOLS, "-n", WB_NS, &pool_name, "--type", "merge", "-p", &patch,
    ]);
    let orips: String = stranded
        .iter()
        .map(|(ip, l)| {
            format!(
                "apiVersion: whereabouts.cni.cncf.io/v1alpha1\nkind: OverlappingRangeIPReservation\n\
                 metadata: {{name: {ip}, namespace: {WB_NS}}}\nspec: {{podref: {}, ifname: eth0}}\n---\n",
                l.pod
            )
        })
        .collect();
    apply_stdin(&c, &orips);
    let mut restored = pool_after.clone();
    restored.extend(stranded.clone());
    assert_eq!(leases(&c), restored, "the pool as the reboot left it");
    let annotated: Vec<&String> = kept.iter().collect();
    for n in &annotated {
        let status = json!([
            {"name": "cni-ledger-k8s", "interface": "eth0", "ips": [after[*n].ip], "default": false}
        ]);
        c.kubectl(&[
            "annotate",
            "pod",
            "-n",
            "default",
            n,
            &format!("{NETWORK_STATUS}={status}"),
        ]);
    }
    let bare: Vec<&String> = after.keys().filter(|n| !kept.contains(n)).collect();

    // The reconciler, as the module ships it, but every minute instead of daily at 04:30.
    c.ctr(&["images", "import", image_tar.to_str().unwrap()]);
    let manifest = tmp.path().join("whereabouts.json");
    fs::write(&manifest, reconciler_manifest(&c, &wb, &image, "* * * * *")).unwrap();
    let started = Instant::now();
    c.kubectl(&["apply", "-f", manifest.to_str().unwrap()]);
    rollout(&c, "daemonset/whereabouts", "kube-system");
    let running = Instant::now();
    let mut rlog = String::new();
    wait_until(150, "a pass of whereabouts' reconciler", || {
        let out = c.kubectl_out(&["-n", "kube-system", "logs", "daemonset/whereabouts"]);
        rlog = String::from_utf8_lossy(&out.stdout).into_owned();
        rlog.contains("reconciler success") || rlog.contains("reconciler failure")
    });
    let passed = Instant::now();
    assert!(
        rlog.contains("reconciler success"),
        "whereabouts' reconciler failed:\n{rlog}"
    );
    let pool_rec = leases(&c);
    let orip_rec = reservations(&c);
    let freed: BTreeMap<&String, &Lease> = restored
        .iter()
        .filter(|(ip, _)| !pool_rec.contains_key(*ip))
        .collect();
    let live_freed: Vec<&String> = freed
        .values()
        .filter(|l| after.keys().any(|n| l.pod == format!("default/{n}")))
        .map(|l| &l.pod)
        .collect();
    eprintln!(
        "whereabouts: reconciler's pass: {:?} / {:?}",
        reconciler_line(&rlog, "starting reconciler run"),
        reconciler_line(&rlog, "successfully cleanup IPs")
    );
    eprintln!(
        "FIGURE whereabouts reconciler (ip-control-loop v0.9.2, shipped schedule daily 04:30 \
         UTC, here every minute): its first pass, at the first full minute, {:.1} s after its \
         pod ran ({:.1} s after apply) freed {} of {} leases: the {} stranded ones of \
         deleted pods, and {} of the {} live pods' (those without a Multus network-status \
         annotation: {:?}); the reservations left: {}",
        (passed - running).as_secs_f64(),
        (passed - started).as_secs_f64(),
        freed.len(),
        restored.len(),
        freed
            .keys()
            .filter(|ip| stranded.contains_key(**ip))
            .count(),
        live_freed.len(),
        after.len(),
        live_freed,
        orip_rec.len()
    );
    // What it did, as docs/EVIDENCE.md reports it: every stranded lease freed, and every
    // live pod's lease whose address no network-status annotation names.
    for ip in stranded.keys() {
        assert!(
            !pool_rec.contains_key(ip),
            "the reconciler kept the stranded {ip}"
        );
        assert!(
            !orip_rec.contains_key(ip),
            "the reconciler kept the reservation of {ip}"
        );
    }
    for n in &annotated {
        assert_eq!(
            pool_rec.get(&after[*n].ip),
            pool_after.get(&after[*n].ip),
            "the reconciler took the lease of {n}, which its annotation names"
        );
    }
    for n in &bare {
        assert!(
            !pool_rec.contains_key(&after[*n].ip),
            "the reconciler kept the lease of {n}, which no annotation names \
             (docs/EVIDENCE.md says it frees it)"
        );
    }
    // The pods it took the leases of still have their address on eth0 ...
    assert_eq!(attached_unleased(&c, &after), after.len());
    // ... and whereabouts hands those addresses out again, lowest first: as many new pods
    // as there are free addresses up to the highest it took from a live pod.
    let top = bare.iter().map(|n| offset(&after[*n].ip)).max().unwrap();
    let free_below = (2..=top)
        .filter(|o| !pool_rec.contains_key(&Ipv4Addr::from(u32::from(base) + o).to_string()))
        .count();
    let more = after.len() + free_below;
    c.kubectl(&["scale", "deployment/web", &format!("--replicas={more}")]);
    rollout(&c, "deployment/web", "default");
    let mut ips = BTreeMap::new();
    wait_until(90, &format!("{more} pods running with an address"), || {
        ips = pod_ips(&c);
        ips.len() == more
    });
    let twins: Vec<String> = ips
        .iter()
        .filter(|(n, _)| !after.contains_key(*n))
        .filter_map(|(n, ip)| {
            let (holder, _) = after.iter().find(|(_, p)| p.ip == *ip)?;
            Some(format!("{n} got {ip}, which {holder} has"))
        })
        .collect();
    eprintln!(
        "FIGURE whereabouts reconciler: {} new pods after its pass, {} of them given the \
         address of a live pod: {twins:?}",
        free_below,
        twins.len()
    );
    assert_eq!(
        twins.len(),
        live_freed.len(),
        "each live pod's address the reconciler freed is handed to a new pod"
    );
}

/// The live pods still running with the same sandbox and eth0 address; returns how many.
fn attached_unleased(c: &Cluster, pods: &BTreeMap<String, Pod>) -> usize {
    let sb = c.sandboxes_in("default");
    pods.iter()
        .filter(|(n, p)| {
            sb.get(*n).map(|s| &s.0) == Some(&p.sandbox)
                && record_netns(&p.sandbox)
                    .and_then(|ns| eth0_addr(c, &ns))
                    .as_deref()
                    == Some(p.ip.as_str())
        })
        .count()
}
