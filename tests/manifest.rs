//! The Kubernetes manifest: `deploy/kubernetes/base` and every overlay in
//! `deploy/kubernetes/overlays/<platform>` build with kustomize and validate offline
//! against the Kubernetes API schema (PyPI `kubernetes-validate`, strict); each overlay
//! names its platform's bin dir, conf dir and CRI endpoint and keeps everything else of
//! the base; the memory limit holds `--jobs` concurrent replays; and
//! `deploy/kubernetes/cni-ledger.yaml`, the file README.md applies, is the base.
//! Needs what scripts/test.sh prepares: Debian unstable's kustomize in target/kustomize
//! (scripts/fetch-unstable.sh) and target/test-venv (kubernetes-validate, PyYAML).
//!
//!     cargo test --features testing --test manifest
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::process::Command;

use common::manifests::*;
use common::*;
use serde_json::Value;

/// The agent's own resident memory, idle or in a gc run (docs/EVIDENCE.md: 3.9 MiB
/// idle, 6.4 MiB after its first gc on a full node of 110 live and 110 stale), rounded up.
const AGENT_MIB: u64 = 7;
/// The cgroup peak of one replay with Debian's plugins, rounded up: bridge+host-local's
/// DEL peaks at 9.4 MiB, portmap's (with its iptables calls) at 6.5 MiB, cold page
/// cache, GOMAXPROCS=64 (scripts/measure-replay-memory.sh).
const REPLAY_PEAK_MIB: u64 = 10;
/// How far above the need the limit must stay: Go plugins' heaps vary with their
/// inputs and the node's CPUs, and an OOM kill leaves a DEL half-done.
const MARGIN: u64 = 2;

const PLATFORMS: [Platform; 3] = [
    Platform {
        name: "k3s",
        bin_dir: "/var/lib/rancher/k3s/data/current/bin",
        conf_dir: "/var/lib/rancher/k3s/agent/etc/cni/net.d",
        cri_endpoint: Some("unix:///run/k3s/containerd/containerd.sock"),
        service_account: None,
    },
    Platform {
        name: "openshift",
        bin_dir: "/var/lib/cni/bin",
        conf_dir: "/etc/kubernetes/cni/net.d",
        // CRI-O judges only when named: its Status cannot say which networks it serves.
        cri_endpoint: Some("unix:///var/run/crio/crio.sock"),
        service_account: Some("cni-ledger"),
    },
    Platform {
        name: "gke",
        bin_dir: "/home/kubernetes/bin",
        conf_dir: "/etc/cni/net.d",
        cri_endpoint: None,
        service_account: None,
    },
];

struct Platform {
    name: &'static str,
    bin_dir: &'static str,
    conf_dir: &'static str,
    cri_endpoint: Option<&'static str>,
    service_account: Option<&'static str>,
}

/// The value of `--name=` in args, when given (args are `--flag=value` items).
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let prefix = format!("--{name}=");
    let mut found = args.iter().filter_map(|a| a.strip_prefix(&prefix));
    let value = found.next();
    assert!(found.next().is_none(), "--{name} given more than once");
    value
}

/// A Kubernetes memory quantity in bytes (the suffixes a manifest uses).
fn bytes(quantity: &str) -> u64 {
    let (digits, unit) = quantity.split_at(
        quantity
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(quantity.len()),
    );
    let n: u64 = digits
        .parse()
        .unwrap_or_else(|e| panic!("memory quantity {quantity:?}: {e}"));
    let scale: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        other => panic!("memory quantity {quantity:?}: unit {other:?} not handled here"),
    };
    n * scale
}

/// The limit holds --jobs concurrent replays plus the agent, with the margin.
fn assert_memory_limit_fits_the_replays(ds: &Value, what: &str) {
    let args = args(ds);
    let jobs: u64 = match flag(&args, "jobs") {
        Some(j) => j.parse().unwrap(),
        None => cni_ledger::gc::DEFAULT_JOBS as u64,
    };
    let limit = agent(ds)["resources"]["limits"]["memory"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no memory limit"));
    let need_mib = AGENT_MIB + jobs * REPLAY_PEAK_MIB;
    assert!(
        bytes(limit) >= (MARGIN * need_mib) << 20,
        "{what}: memory limit {limit} is under {MARGIN} x ({AGENT_MIB} MiB agent + {jobs} jobs x \
         {REPLAY_PEAK_MIB} MiB per replay) = {} MiB",
        MARGIN * need_mib
    );
}

#[test]
fn the_manifest_the_readme_applies_is_the_base_as_kustomize_builds_it() {
    require_tools!("target/kustomize", "target/test-venv");
    let applied = fs::read_to_string(kubernetes_dir().join("cni-ledger.yaml")).unwrap();
    let base = fs::read_to_string(kubernetes_dir().join("base/cni-ledger.yaml")).unwrap();
    assert!(
        applied == base,
        "deploy/kubernetes/cni-ledger.yaml must be a copy of deploy/kubernetes/base/cni-ledger.yaml: \
         cp deploy/kubernetes/base/cni-ledger.yaml deploy/kubernetes/cni-ledger.yaml"
    );
    assert_eq!(
        documents(&applied),
        documents(&kustomize_build("base")),
        "deploy/kubernetes/cni-ledger.yaml differs from `kustomize build deploy/kubernetes/base`"
    );
}

#[test]
fn manifest_validates_against_the_kubernetes_schema_and_says_what_the_issue_asks() {
    require_tools!("target/kustomize", "target/test-venv");
    let yaml = fs::read_to_string(kubernetes_dir().join("cni-ledger.yaml")).unwrap();
    validate(&yaml, "deploy/kubernetes/cni-ledger.yaml");
    let ds = daemonset(&documents(&yaml));
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(ds["metadata"]["namespace"], "kube-system");
    assert_eq!(spec["priorityClassName"], "system-node-critical");
    assert_eq!(spec["tolerations"][0]["operator"], "Exists");
    assert_eq!(
        ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        1
    );
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["hostPID"], true);
    assert_eq!(spec["automountServiceAccountToken"], false);
    let c = agent(&ds);
    assert_eq!(c["securityContext"]["privileged"], true);
    // The agent enters the node's root itself: no host path is mounted, so none can
    // show it a view of the node other than the node's own.
    assert!(spec["volumes"].is_null(), "no volumes: {}", spec["volumes"]);
    assert!(
        c["volumeMounts"].is_null(),
        "no volumeMounts: {}",
        c["volumeMounts"]
    );
    let args = args(&ds);
    assert_eq!(flag(&args, "node-root"), Some("/proc/1/root"));
    assert_eq!(flag(&args, "plugin-root"), None);
    assert_eq!(flag(&args, "listen"), Some("$(NODE_IP):9657"));
    assert_eq!(flag(&args, "probe-listen"), Some("127.0.0.1:9658"));
    for a in &args {
        assert!(
            a.starts_with("--") && a.contains('='),
            "args are --flag=value items: {a:?}"
        );
    }
    // Probes on their own loopback listener, which kubelet reaches with hostNetwork.
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["host"], "127.0.0.1", "{probe}");
        assert_eq!(get["port"], 9658, "{probe}");
        assert_eq!(get["path"], path, "{probe}");
    }
    assert_eq!(c["ports"][0]["containerPort"], 9657);
    assert_eq!(c["env"][0]["name"], "NODE_IP");
    assert_eq!(
        c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "status.hostIP"
    );
    assert_memory_limit_fits_the_replays(&ds, "deploy/kubernetes/cni-ledger.yaml");
    let annotations = &ds["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "9657");
}

/// The base's args with the platform's paths and endpoint in place of the base's.
fn expected_args(base: &[String], p: &Platform) -> Vec<String> {
    let mut want: Vec<String> = base
        .iter()
        .map(|a| {
            if a.starts_with("--cni-bin-dir=") {
                format!("--cni-bin-dir={}", p.bin_dir)
            } else if a.starts_with("--conf-dir=") {
                format!("--conf-dir={}", p.conf_dir)
            } else {
                a.clone()
            }
        })
        .filter(|a| p.cri_endpoint.is_none() || !a.starts_with("--cri-endpoint="))
        .collect();
    if let Some(e) = p.cri_endpoint {
        want.push(format!("--cri-endpoint={e}"));
    }
    want
}

/// The DaemonSet without what an overlay may change: the args, the service account.
fn without_platform_fields(ds: &Value) -> Value {
    let mut ds = ds.clone();
    let spec = ds["spec"]["template"]["spec"].as_object_mut().unwrap();
    spec.remove("serviceAccountName");
    spec["containers"][0]
        .as_object_mut()
        .unwrap()
        .remove("args");
    ds
}

#[test]
fn each_overlay_builds_validates_and_names_its_platform_paths() {
    require_tools!("target/kustomize", "target/test-venv");
    let base = daemonset(&documents(&kustomize_build("base")));
    let base_args = args(&base);
    for p in &PLATFORMS {
        let dir = format!("overlays/{}", p.name);
        let yaml = kustomize_build(&dir);
        validate(&yaml, &dir);
        let docs = documents(&yaml);
        let ds = daemonset(&docs);
        let got = args(&ds);
        assert_eq!(flag(&got, "cni-bin-dir"), Some(p.bin_dir), "{dir}");
        assert_eq!(flag(&got, "conf-dir"), Some(p.conf_dir), "{dir}");
        assert_eq!(flag(&got, "cri-endpoint"), p.cri_endpoint, "{dir}");
        assert_eq!(
            got,
            expected_args(&base_args, p),
            "{dir}: the base's args, the platform's paths and endpoint in their place"
        );
        assert_eq!(
            without_platform_fields(&ds),
            without_platform_fields(&base),
            "{dir} changes the DaemonSet beyond the agent's args and service account"
        );
        let spec = &ds["spec"]["template"]["spec"];
        assert_eq!(
            spec["serviceAccountName"].as_str(),
            p.service_account,
            "{dir}"
        );
        if let Some(sa) = p.service_account {
            assert!(
                docs.iter()
                    .any(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == sa),
                "{dir}: the service account {sa} it runs as"
            );
        }
        assert_memory_limit_fits_the_replays(&ds, &dir);
    }
    // Every overlay in the tree is one checked here.
    let mut overlays: Vec<String> = fs::read_dir(kubernetes_dir().join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    overlays.sort();
    let mut checked: Vec<String> = PLATFORMS.iter().map(|p| p.name.to_string()).collect();
    checked.sort();
    assert_eq!(overlays, checked);
}

#[test]
fn every_flag_the_base_and_overlays_pass_is_a_flag_of_the_agent() {
    require_tools!("target/kustomize", "target/test-venv");
    let out = ok(
        Command::new(ledger_bin())
            .args(["agent", "--help"])
            .output()
            .unwrap(),
        "cni-ledger agent --help",
    );
    let help = String::from_utf8(out.stdout).unwrap();
    let mut names: Vec<String> = Vec::new();
    for dir in ["base", "overlays/k3s", "overlays/openshift", "overlays/gke"] {
        let ds = daemonset(&documents(&kustomize_build(dir)));
        for a in args(&ds) {
            let name = a
                .trim_start_matches("--")
                .split('=')
                .next()
                .unwrap()
                .to_string();
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    assert!(names.iter().any(|n| n == "node-root"), "{names:?}");
    for name in &names {
        assert!(
            help.contains(&format!("--{name} ")) || help.contains(&format!("--{name}=")),
            "cni-ledger agent has no --{name}:\n{help}"
        );
    }
}
