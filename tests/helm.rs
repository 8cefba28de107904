//! The Helm chart, deploy/helm/cni-ledger: `helm lint --strict` is clean with the
//! default values and with every platform's values file; `helm template` with the
//! default values renders exactly the objects `kustomize build deploy/kubernetes/base`
//! builds, and with `values-<platform>.yaml` exactly those of
//! `deploy/kubernetes/overlays/<platform>` (parsed objects compared, every field); both
//! validate offline against the Kubernetes API schema (`kubernetes-validate --strict`);
//! the namespace is the release's; the values an operator changes land where they say;
//! the chart's version is the crate's; docs/KUBERNETES.md's table names every value.
//! Needs what scripts/test.sh prepares: helm v4 built by scripts/build-helm.sh (outside
//! the tree: `scripts/build-helm.sh --path` says where), Debian unstable's kustomize in
//! target/kustomize and target/test-venv (kubernetes-validate, PyYAML).
//!
//!     cargo test --features testing --test helm
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::manifests::*;
use common::*;
use serde_json::Value;

/// The release name the tests render with; the objects' names do not depend on it.
const RELEASE: &str = "cni-ledger";
/// The base's namespace, the one docs/KUBERNETES.md installs the release into.
const NAMESPACE: &str = "kube-system";

fn chart_dir() -> PathBuf {
    repo().join("deploy/helm/cni-ledger")
}

/// Where scripts/build-helm.sh puts helm (it builds nothing when asked `--path`).
fn helm_path() -> PathBuf {
    let out = ok(
        Command::new("bash")
            .arg(repo().join("scripts/build-helm.sh"))
            .arg("--path")
            .output()
            .unwrap(),
        "scripts/build-helm.sh --path",
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The first line of each test: the path of helm, or a return from the test (skipped,
/// or failed under CI, as `require_tools!`) when helm, kustomize or the venv is missing.
macro_rules! require_helm {
    () => {{
        let helm = helm_path();
        if !common::root::tools_or_skip(&[
            helm.to_str().unwrap(),
            "target/kustomize",
            "target/test-venv",
        ]) {
            return;
        }
        Helm::new(helm)
    }};
}

/// helm, with its cache, config and data dirs in a temp dir of its own (never the
/// user's ~/.cache/helm, ~/.config/helm: no repositories, no plugins).
struct Helm {
    bin: PathBuf,
    home: TempDir,
}

impl Helm {
    fn new(bin: PathBuf) -> Helm {
        Helm {
            bin,
            home: TempDir::new("helm-home"),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        let home = self.home.path();
        Command::new(&self.bin)
            .args(args)
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    }

    /// `helm template` of the chart in `namespace` with `args` (values files, --set).
    fn template(&self, namespace: &str, args: &[&str]) -> String {
        let chart = chart_dir();
        let mut all = vec![
            "template",
            RELEASE,
            chart.to_str().unwrap(),
            "--namespace",
            namespace,
        ];
        all.extend_from_slice(args);
        let out = ok(self.run(&all), &format!("helm {}", all.join(" ")));
        String::from_utf8(out.stdout).unwrap()
    }
}

/// `values-<platform>.yaml` in the chart, as an argument of helm.
fn values_file(platform: &str) -> String {
    chart_dir()
        .join(format!("values-{platform}.yaml"))
        .to_str()
        .unwrap()
        .to_string()
}

/// The objects of a YAML stream in a fixed order (kind, namespace, name), so that two
/// renderings compare as sets of objects, whatever order each tool writes them in.
fn objects(yaml: &str) -> Vec<Value> {
    let mut docs = documents(yaml);
    let key = |d: &Value| {
        format!(
            "{}/{}/{}",
            d["kind"].as_str().unwrap_or(""),
            d["metadata"]["namespace"].as_str().unwrap_or(""),
            d["metadata"]["name"].as_str().unwrap_or("")
        )
    };
    docs.sort_by_key(key);
    let keys: Vec<String> = docs.iter().map(key).collect();
    let mut unique = keys.clone();
    unique.dedup();
    assert_eq!(keys, unique, "one object of each kind and name");
    docs
}

/// Both renderings are the same objects; on a difference, names the first object that
/// differs and shows both, whole.
fn assert_same_objects(helm: &[Value], kustomize: &[Value], what: &str) {
    let names = |docs: &[Value]| -> Vec<String> {
        docs.iter()
            .map(|d| format!("{} {}", d["kind"], d["metadata"]["name"]))
            .collect()
    };
    assert_eq!(
        names(helm),
        names(kustomize),
        "{what}: helm template renders other objects than kustomize builds"
    );
    for (h, k) in helm.iter().zip(kustomize) {
        assert!(
            h == k,
            "{what}: {} {} differs:\n--- helm template ---\n{}\n--- kustomize build ---\n{}",
            k["kind"],
            k["metadata"]["name"],
            serde_json::to_string_pretty(h).unwrap(),
            serde_json::to_string_pretty(k).unwrap()
        );
    }
}

/// The platforms: every overlay dir of deploy/kubernetes/overlays, sorted.
fn overlays() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(kubernetes_dir().join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn the_chart_version_is_the_crates() {
    let chart = fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap();
    let field = |name: &str| -> String {
        let prefix = format!("{name}:");
        let mut found = chart.lines().filter_map(|l| l.strip_prefix(&prefix));
        let value = found
            .next()
            .unwrap_or_else(|| panic!("Chart.yaml has no {name}"))
            .trim()
            .trim_matches('"')
            .to_string();
        assert!(found.next().is_none(), "Chart.yaml: {name} given twice");
        value
    };
    assert_eq!(field("apiVersion"), "v2");
    assert_eq!(field("name"), "cni-ledger");
    let crate_version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        field("version"),
        crate_version,
        "Chart.yaml's version is Cargo.toml's"
    );
    assert_eq!(
        field("appVersion"),
        crate_version,
        "Chart.yaml's appVersion is the image tag scripts/build-image.sh builds"
    );
}

#[test]
fn helm_lint_is_clean_with_every_values_file() {
    let helm = require_helm!();
    let chart = chart_dir();
    let mut runs: Vec<Vec<String>> = vec![vec![]];
    for p in overlays() {
        runs.push(vec!["--values".into(), values_file(&p)]);
    }
    for extra in runs {
        let mut all = vec!["lint", "--strict", chart.to_str().unwrap()];
        all.extend(extra.iter().map(String::as_str));
        let out = helm.run(&all);
        let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "helm {}:\n{said}", all.join(" "));
        assert!(
            said.contains("1 chart(s) linted, 0 chart(s) failed"),
            "helm {}:\n{said}",
            all.join(" ")
        );
        for level in ["[WARNING]", "[ERROR]"] {
            assert!(!said.contains(level), "helm {}:\n{said}", all.join(" "));
        }
    }
}

#[test]
fn default_values_render_the_kustomize_base() {
    let helm = require_helm!();
    let rendered = helm.template(NAMESPACE, &[]);
    validate(&rendered, "helm template (default values)");
    let built = kustomize_build("base");
    validate(&built, "kustomize build base");
    assert_same_objects(
        &objects(&rendered),
        &objects(&built),
        "default values against deploy/kubernetes/base",
    );
    // The file README.md applies is the base (tests/manifest.rs), so the chart is it too.
    let flat = fs::read_to_string(kubernetes_dir().join("cni-ledger.yaml")).unwrap();
    assert_same_objects(
        &objects(&rendered),
        &objects(&flat),
        "default values against deploy/kubernetes/cni-ledger.yaml",
    );
}

#[test]
fn each_platform_values_file_renders_its_overlay() {
    let helm = require_helm!();
    let platforms = overlays();
    assert!(!platforms.is_empty());
    for p in &platforms {
        let file = values_file(p);
        assert!(
            Path::new(&file).exists(),
            "deploy/kubernetes/overlays/{p} has no values file in the chart: {file}"
        );
        let rendered = helm.template(NAMESPACE, &["--values", &file]);
        validate(
            &rendered,
            &format!("helm template --values values-{p}.yaml"),
        );
        let built = kustomize_build(&format!("overlays/{p}"));
        assert_same_objects(
            &objects(&rendered),
            &objects(&built),
            &format!("values-{p}.yaml against deploy/kubernetes/overlays/{p}"),
        );
    }
    // And every platform values file is an overlay's.
    let mut files: Vec<String> = fs::read_dir(chart_dir())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            name.strip_prefix("values-")
                .and_then(|n| n.strip_suffix(".yaml"))
                .map(str::to_string)
        })
        .collect();
    files.sort();
    assert_eq!(files, platforms, "values-<platform>.yaml, one per overlay");
}

#[test]
fn every_object_is_in_the_release_namespace_or_the_override() {
    let helm = require_helm!();
    for (ns, args, want) in [
        ("cni-system", vec![], "cni-system"),
        (
            "default",
            vec!["--set", "namespaceOverride=node-agents"],
            "node-agents",
        ),
    ] {
        let mut args: Vec<&str> = args;
        let openshift = values_file("openshift");
        args.extend(["--values", &openshift]);
        let docs = objects(&helm.template(ns, &args));
        assert_eq!(docs.len(), 3, "DaemonSet, ServiceAccount, RoleBinding");
        for d in &docs {
            assert_eq!(d["metadata"]["namespace"], want, "{}", d["kind"]);
        }
        let rb = docs.iter().find(|d| d["kind"] == "RoleBinding").unwrap();
        assert_eq!(rb["subjects"][0]["namespace"], want);
        assert_eq!(rb["subjects"][0]["name"], "cni-ledger");
    }
}

#[test]
fn the_values_an_operator_changes_land_where_they_say() {
    let helm = require_helm!();
    let rendered = helm.template(
        NAMESPACE,
        &[
            "--set",
            "image.repository=registry.example/cni-ledger,image.tag=0.2.0,image.pullPolicy=Always",
            "--set",
            "agent.metricsPort=19657,agent.probePort=19658,agent.jobs=8",
            "--set",
            "agent.cniBinDir=/usr/libexec/cni,agent.confDir=/etc/cni/custom.d",
            "--set",
            "agent.criEndpoint=unix:///run/containerd/containerd.sock",
            "--set",
            "agent.extraArgs[0]=--resync=10",
            "--set",
            "resources.limits.memory=512Mi,priorityClassName=system-cluster-critical",
            "--set",
            "nodeSelector.kubernetes\\.io/os=linux,maxUnavailable=2",
            "--set",
            "commonLabels.team=net,podLabels.tier=node,podAnnotations.note=x",
            "--set",
            "imagePullSecrets[0].name=regcred",
        ],
    );
    validate(&rendered, "helm template with values set");
    let ds = daemonset(&documents(&rendered));
    let c = agent(&ds);
    assert_eq!(c["image"], "registry.example/cni-ledger:0.2.0");
    assert_eq!(c["imagePullPolicy"], "Always");
    assert_eq!(
        args(&ds),
        [
            "--listen=$(NODE_IP):19657",
            "--probe-listen=127.0.0.1:19658",
            "--node-root=/proc/1/root",
            "--cni-bin-dir=/usr/libexec/cni",
            "--conf-dir=/etc/cni/custom.d",
            "--ledger-dir=/var/lib/cni-ledger",
            "--cni-cache-dir=/var/lib/cni",
            "--gc-interval=300",
            "--jobs=8",
            "--cri-endpoint=unix:///run/containerd/containerd.sock",
            "--resync=10",
        ]
    );
    assert_eq!(c["ports"][0]["containerPort"], 19657);
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], 19658);
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], 19658);
    assert_eq!(c["resources"]["limits"]["memory"], "512Mi");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["priorityClassName"], "system-cluster-critical");
    assert_eq!(spec["nodeSelector"]["kubernetes.io/os"], "linux");
    assert_eq!(spec["imagePullSecrets"][0]["name"], "regcred");
    assert_eq!(
        ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        2
    );
    let meta = &ds["spec"]["template"]["metadata"];
    assert_eq!(meta["annotations"]["prometheus.io/port"], "19657");
    assert_eq!(meta["annotations"]["note"], "x");
    assert_eq!(meta["labels"]["tier"], "node");
    assert_eq!(meta["labels"]["team"], "net");
    assert_eq!(ds["metadata"]["labels"]["team"], "net");
    // The selector never moves: a DaemonSet's selector cannot change on upgrade.
    assert_eq!(
        ds["spec"]["selector"],
        serde_json::json!({"matchLabels": {"app.kubernetes.io/name": "cni-ledger"}})
    );
    // Every flag the chart can pass is one the agent has.
    let help = String::from_utf8(
        ok(
            Command::new(ledger_bin())
                .args(["agent", "--help"])
                .output()
                .unwrap(),
            "cni-ledger agent --help",
        )
        .stdout,
    )
    .unwrap();
    for a in args(&ds) {
        let name = a.trim_start_matches("--").split('=').next().unwrap();
        assert!(
            help.contains(&format!("--{name} ")) || help.contains(&format!("--{name}=")),
            "cni-ledger agent has no --{name}:\n{help}"
        );
    }
    // A RoleBinding for the SCC without a service account to bind is refused.
    let out = helm.run(&[
        "template",
        RELEASE,
        chart_dir().to_str().unwrap(),
        "--set",
        "openshift.sccPrivileged=true",
    ]);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs a service account"),
        "{}",
        describe(&out)
    );
}

/// The dotted paths of values.yaml's leaves (a list or an empty map is a leaf).
fn leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v.as_object() {
        Some(map) if !map.is_empty() => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(v, &path, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

#[test]
fn docs_name_every_value_of_the_chart() {
    require_tools!("target/test-venv");
    let values = documents_of(&chart_dir().join("values.yaml"));
    assert_eq!(values.len(), 1, "values.yaml is one document");
    let mut paths = Vec::new();
    leaves(&values[0], "", &mut paths);
    let doc = fs::read_to_string(repo().join("docs/KUBERNETES.md")).unwrap();
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !doc.contains(&format!("| `{p}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/KUBERNETES.md's values table (a row `| `name` | ...`) lacks {missing:?}"
    );
}
