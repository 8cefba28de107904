//! The DaemonSet on a real Kubernetes node (issue 38, items 2, 3 and 4; issue 39 item 4,
//! Helm): a one-node Kubernetes v1.37.2 (tests/k8s/cluster.sh: etcd, API server,
//! controller-manager, scheduler, containerd 2.4.2 and kubelet, built from source by
//! scripts/build-k8s.sh and cached), its node in a mount and PID namespace of its own with
//! the standard node paths (/etc/cni/net.d, /opt/cni/bin, /var/lib/cni, /var/lib/cni-ledger,
//! /run/netns, /run/containerd) bound to dirs of the cluster's, so the shipped manifest runs
//! unchanged and the machine's own CNI dirs are never touched. Each test starts the cluster
//! and takes it down at the end, or on a panic (tests/k8s_common: one cluster per machine,
//! under a lock).
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
mod k8s_common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use k8s_common::*;
use serde_json::Value;

#[test]
fn installed_with_kubectl_the_agent_records_the_nodes_pods_and_uninstalls_cleanly() {
    require_root!();
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

    // A rolling upgrade as docs/KUBERNETES.md tells a user to make one: an overlay of their
    // own whose `images:` names the new image, applied while pods come and go.
    let overlay = TempDir::new("k8s-overlay");
    let upgraded = "localhost/cni-ledger:0.1.0-k8s-upgrade";
    fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  \
             - {}\nimages:\n  - name: localhost/cni-ledger\n    newTag: 0.1.0-k8s-upgrade\n",
            // kustomize takes a base only by a relative path.
            Path::new(&"../".repeat(overlay.path().components().count() - 1))
                .join(
                    repo()
                        .join("deploy/kubernetes/base")
                        .strip_prefix("/")
                        .unwrap()
                )
                .display()
        ),
    )
    .unwrap();
    load_upgrade_image(&c, upgraded);
    let overlay_dir = overlay.path().to_str().unwrap().to_string();
    upgrade_under_churn(&c, upgraded, || {
        c.kubectl(&["apply", "-k", &overlay_dir]);
    });
    let installed = fs::read(node("/opt/cni/bin/cni-ledger")).unwrap();
    assert!(
        installed
            .windows(upgraded.len())
            .any(|w| w == upgraded.as_bytes()),
        "the node's cni-ledger is not the upgrade's binary"
    );
    assert_eq!(attached(&c, 4), ids, "the pods after the upgrade");
    assert_no_del_of_live(&c);

    // Uninstall: kubectl delete -k of what was applied; the ledger stays first until
    // `agent --uninstall`.
    c.kubectl(&[
        "delete",
        "-k",
        &overlay_dir,
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

/// Issue 38 item 3: the node goes down uncleanly with the agent installed and pods running
/// (kubelet, containerd, the shims and the pods killed at once), and comes back with what
/// a reboot clears gone (the pods' netns mounts and /run/netns files, the bridge, this
/// network's nat rules, containerd's state dir).
///
/// "Runtime state lost": containerd's root dir is lost as well, so the runtime knows none
/// of the old sandboxes and no runtime DEL ever comes for them; the agent, once kubelet
/// restarts it, releases every attachment of the old boot (records stale by
/// `netns-missing`, host-local's addresses, DNAT rules) by replaying their DEL.
#[test]
fn after_a_reboot_that_lost_the_runtimes_state_the_agent_releases_the_old_boots_attachments() {
    reboot_under_kubelet(RuntimeState::Lost);
}

/// "The runtime keeps its state": containerd reloads the old sandboxes, NOTREADY, and
/// kubelet stops each (StopPodSandbox with its namespace gone: containerd's DEL has an
/// empty CNI_NETNS); the ledger's DEL, last in that DEL, drops the record and the chain's
/// releases the address and the DNAT rule; what the runtime does not release, gc does.
#[test]
fn after_a_reboot_that_kept_the_runtimes_state_the_old_boots_attachments_are_released() {
    reboot_under_kubelet(RuntimeState::Kept);
}

#[derive(PartialEq, Clone, Copy, Debug)]
enum RuntimeState {
    Lost,
    Kept,
}

/// Both variants: kubelet brings the pods back (new sandboxes through the chain, each
/// recorded); every attachment of the old boot is released; no live pod loses its
/// address, eth0 or record, and no DEL the plugins see names a live pod.
fn reboot_under_kubelet(state: RuntimeState) {
    require_root!();
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
    let (agent_before, _) = agent_container(&c).expect("the agent runs");
    if state == RuntimeState::Lost {
        // gc leaves records younger than its --grace (60 s; the manifest passes none)
        // alone unless the boot ID changed, which this reboot (of the node, not of the
        // machine) does not; the agent runs gc at its start, then every --gc-interval
        // (300 s). So the pods run past the grace first, as on a node up for more than a
        // minute. (With the runtime's state kept, the runtime's own DELs release them.)
        let since = recorded_at.elapsed();
        if since < Duration::from_secs(GRACE_SECS + 2) {
            sleep(Duration::from_secs(GRACE_SECS + 2) - since);
        }
    }

    // The unclean reboot.
    let t = Instant::now();
    let args: &[&str] = match state {
        RuntimeState::Lost => &["restart", "--lose-runtime-state"],
        RuntimeState::Kept => &["restart"],
    };
    let seen = calls().len();
    ok(cluster_sh(args), &format!("cluster.sh {}", args.join(" ")));
    let node_back = Instant::now();
    eprintln!(
        "k8s_node: node rebooted (runtime state {state:?}) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    if state == RuntimeState::Lost {
        for id in before.values() {
            assert!(
                record_path(id).exists(),
                "the reboot took the record of {id}: the ledger is on disk"
            );
        }
    }

    // kubelet brings the agent back: a new container, Ready.
    wait_until(180, "the agent's pod running again, Ready", || {
        agent_container(&c).is_some_and(|(id, _)| id != agent_before) && agent_ready(&c)
    });
    let agent_ready_at = Instant::now();
    // ... and the pods, new sandboxes, each recorded, with an address and eth0.
    let after = attached(&c, 4);
    for (n, id) in &after {
        assert!(
            !before.values().any(|o| o == id),
            "{n} kept its old sandbox {id} across the reboot"
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
        "FIGURE k8s reboot (runtime state {state:?}): the old boot's 4 attachments released \
         {:.1} s after the node came back, {:.1} s after the agent was Ready again",
        (released - node_back).as_secs_f64(),
        released
            .saturating_duration_since(agent_ready_at)
            .as_secs_f64()
    );
    let log = c.kubectl(&["-n", "kube-system", "logs", "daemonset/cni-ledger"]);
    let after_reboot = &calls()[seen..];
    for id in before.values() {
        let dels: Vec<&[String; 5]> = after_reboot
            .iter()
            .filter(|x| x[0] == "bridge" && x[1] == "DEL" && x[2] == *id)
            .collect();
        assert!(!dels.is_empty(), "no bridge DEL of the old sandbox {id}");
        let key = format!("gc: {NETWORK}/{id}/eth0: ");
        match state {
            // The runtime never heard of those sandboxes again: the agent's replays,
            // judged stale because their namespaces are gone (a release build: no test
            // boot ID).
            RuntimeState::Lost => {
                assert!(
                    log.contains(&format!("{key}stale (netns-missing")),
                    "{id} not judged stale by netns-missing:\n{log}"
                );
                assert!(
                    log.contains(&format!("{key}replayed")),
                    "{id} not replayed:\n{log}"
                );
            }
            // kubelet's StopPodSandbox: containerd's DEL, its namespace gone (an empty
            // CNI_NETNS), through the whole chain to the ledger last.
            RuntimeState::Kept => {
                assert!(
                    dels.iter().any(|x| x[3].is_empty()),
                    "no DEL of {id} with an empty CNI_NETNS: {dels:?}"
                );
                eprintln!(
                    "k8s_node: {id}: {} DEL(s) by the runtime; the agent's log on it: {:?}",
                    dels.len(),
                    log.lines().filter(|l| l.contains(&key)).collect::<Vec<_>>()
                );
            }
        }
    }
    let failed = sandbox_failures(&c);
    assert!(failed.is_empty(), "sandboxes failed: {failed:#?}");
    // The live pods untouched: same sandboxes, each with its record, address and eth0.
    let still = attached(&c, 4);
    assert_eq!(still, after, "the live pods after the release");
    assert!(
        !dnat_rules(&the_hostport_pod(&still).1).is_empty(),
        "the live hostPort pod lost its DNAT rule"
    );
    records_match_sandboxes(&c);
    assert_no_del_of_live(&c);
}

/// Issue 39 item 4: the Helm chart on the node, as docs/KUBERNETES.md ("With Helm") says:
/// `helm install` into kube-system puts the ledger first and records the pods; `helm
/// upgrade --set image.tag=...` rolls the agent to a new image while pods come and go
/// (no sandbox fails, no record lost, the ledger stays first); `helm uninstall` deletes the
/// chart's objects and leaves the ledger first, as `kubectl delete -k` does, until
/// `agent --uninstall`; the pods keep running.
#[test]
fn installed_with_helm_the_agent_upgrades_under_churn_and_uninstalls_as_with_kustomize() {
    require_root!();
    let helm_bin = PathBuf::from(
        ok(
            Command::new("bash")
                .arg(repo().join("scripts/build-helm.sh"))
                .arg("--path")
                .output()
                .unwrap(),
            "scripts/build-helm.sh --path",
        )
        .trim(),
    );
    let c = Cluster::up();
    let helm = |args: &[&str]| {
        ok(
            Command::new(&helm_bin)
                .args(args)
                .args(["--kubeconfig", &c.kubeconfig])
                .output()
                .unwrap(),
            &format!("helm {}", args.join(" ")),
        )
    };
    let chart = repo().join("deploy/helm/cni-ledger");
    let chart = chart.to_str().unwrap();
    // The chart's default image: localhost/cni-ledger at the chart's appVersion.
    let app_version = fs::read_to_string(repo().join("deploy/helm/cni-ledger/Chart.yaml"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("appVersion in Chart.yaml");
    load_agent_image(&c, &format!("localhost/cni-ledger:{app_version}"));
    let plain = conflist();

    helm(&[
        "install",
        "cni-ledger",
        chart,
        "-n",
        "kube-system",
        "--wait",
        "--timeout=180s",
    ]);
    rollout(&c, "daemonset/cni-ledger", "kube-system");
    wait_until(60, "the ledger first in the node's conflist", || {
        chain_types().first().map(String::as_str) == Some("cni-ledger")
    });
    apply_stdin(&c, &workloads());
    rollout(&c, "deployment/web", "default");
    rollout(&c, "deployment/hp", "default");
    let ids = attached(&c, 4);

    let tag = format!("{app_version}-helm-upgrade");
    let upgraded = format!("localhost/cni-ledger:{tag}");
    load_upgrade_image(&c, &upgraded);
    upgrade_under_churn(&c, &upgraded, || {
        helm(&[
            "upgrade",
            "cni-ledger",
            chart,
            "-n",
            "kube-system",
            "--set",
            &format!("image.tag={tag}"),
        ]);
    });
    assert_eq!(attached(&c, 4), ids, "the pods after helm upgrade");
    let history = helm(&["history", "cni-ledger", "-n", "kube-system", "-o", "json"]);
    let revisions: Value = serde_json::from_str(&history).unwrap();
    assert_eq!(revisions.as_array().unwrap().len(), 2, "{history}");

    helm(&[
        "uninstall",
        "cni-ledger",
        "-n",
        "kube-system",
        "--wait",
        "--timeout=120s",
    ]);
    wait_until(120, "the agent's pod gone", || {
        agent_container(&c).is_none()
    });
    assert!(
        c.kubectl_out(&["-n", "kube-system", "get", "daemonset", "cni-ledger"])
            .status
            .code()
            != Some(0),
        "the DaemonSet outlived helm uninstall"
    );
    assert_eq!(
        chain_types().first().map(String::as_str),
        Some("cni-ledger"),
        "docs/KUBERNETES.md: the ledger stays in the chain after helm uninstall"
    );
    ok(
        c.on_node(&[
            "/opt/cni/bin/cni-ledger",
            "agent",
            "--uninstall",
            "--conf-dir=/etc/cni/net.d",
        ]),
        "cni-ledger agent --uninstall on the node",
    );
    assert_eq!(
        conflist()["plugins"],
        plain["plugins"],
        "the chain after --uninstall"
    );
    assert_eq!(attached(&c, 4), ids, "the pods after helm uninstall");
    assert_no_del_of_live(&c);
}

/// Issue 39 item 3, kubelet on CRI-O (v1.36 from its module; cluster.sh's
/// CNI_LEDGER_K8S_RUNTIME=crio): the DaemonSet as shipped finds CRI-O's socket and keeps the
/// ledger first in the conflist CRI-O loads, kubelet's pods are recorded, and after an
/// unclean reboot (CRI-O's unit runs `crio wipe`, which after an unclean stop removes its
/// whole storage: CRI-O always comes back knowing no sandbox) every attachment of the old
/// boot is released, by CRI-O's one-shot startup GC (libcni's GCNetworkList DELs each
/// cached attachment not in its empty valid list, through the ledger) or the agent's gc,
/// and no DEL names a live pod. CRI-O maps host ports itself (its nftables table), so no
/// portmap rule is asked for here.
#[test]
fn on_a_crio_node_the_agent_records_kubelets_pods_and_a_reboot_releases_the_old_boot() {
    require_root!();
    let c = Cluster::up_on(Runtime::Crio);
    install_agent(&c);
    apply_stdin(&c, &workloads());
    rollout(&c, "deployment/web", "default");
    rollout(&c, "deployment/hp", "default");
    let before = attached(&c, 4);
    let (agent_before, _) = agent_container(&c).expect("the agent runs");
    // Its /readyz (the node's loopback: the agent has the node's network) says which
    // conflist the runtimes' rules load (CRI-O's among them): the node's, the ledger first.
    let ready = ok(
        Command::new("curl")
            .args(["-s", "http://127.0.0.1:9658/readyz"])
            .output()
            .unwrap(),
        "curl /readyz",
    );
    assert!(
        ready.contains("ok every runtime rule loads /etc/cni/net.d/10-pods.conflist")
            && ready.contains("ok ledger first in /etc/cni/net.d/10-pods.conflist"),
        "/readyz: {ready}"
    );

    let seen = calls().len();
    ok(cluster_sh(&["restart"]), "cluster.sh restart (CRI-O)");
    let node_back = Instant::now();
    wait_until(180, "the agent's pod running again, Ready", || {
        agent_container(&c).is_some_and(|(id, _)| id != agent_before) && agent_ready(&c)
    });
    let after = attached(&c, 4);
    for (n, id) in &after {
        assert!(
            !before.values().any(|o| o == id),
            "{n} kept its old sandbox {id} across CRI-O's wipe"
        );
    }
    wait_until(
        180,
        "every record and address of the old boot released",
        || {
            let held = addresses();
            before
                .values()
                .all(|id| !record_path(id).exists() && !held.values().any(|v| v == id))
        },
    );
    let dels: Vec<_> = calls()[seen..]
        .iter()
        .filter(|x| x[0] == "bridge" && x[1] == "DEL" && before.values().any(|i| *i == x[2]))
        .cloned()
        .collect();
    eprintln!(
        "FIGURE k8s reboot on CRI-O: the old boot's 4 attachments released {:.1} s after \
         the node came back; {} bridge DELs of them (CNI_NETNS {:?})",
        node_back.elapsed().as_secs_f64(),
        dels.len(),
        dels.iter().map(|x| x[3].as_str()).collect::<BTreeSet<_>>()
    );
    let failed = sandbox_failures(&c);
    assert!(failed.is_empty(), "sandboxes failed: {failed:#?}");
    assert_eq!(attached(&c, 4), after, "the live pods after the release");
    records_match_sandboxes(&c);
    assert_no_del_of_live(&c);
}
