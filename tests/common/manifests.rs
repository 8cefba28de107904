//! The Kubernetes manifests as tools read them, for `manifest` and `helm`: kustomize's
//! build of deploy/kubernetes, PyYAML's reading of YAML, `kubernetes-validate --strict`,
//! and the agent's container and args in a DaemonSet.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{describe, repo, tool, venv_bin, TempDir};
use serde_json::Value;

pub fn kubernetes_dir() -> PathBuf {
    repo().join("deploy/kubernetes")
}

/// `out`, once it is known to have succeeded; `what` names it in the failure.
pub fn ok(out: Output, what: &str) -> Output {
    assert!(out.status.success(), "{what}: {}", describe(&out));
    out
}

/// `kustomize build DIR` (DIR under deploy/kubernetes), as YAML text.
pub fn kustomize_build(dir: &str) -> String {
    let kustomize = tool(
        "target/kustomize/usr/bin/kustomize",
        "it unpacks Debian unstable's kustomize there with scripts/fetch-unstable.sh",
    );
    let out = ok(
        Command::new(kustomize)
            .arg("build")
            .arg(kubernetes_dir().join(dir))
            .output()
            .unwrap(),
        &format!("kustomize build {dir}"),
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `kubernetes-validate --strict` over YAML text; `what` names it in the failure.
pub fn validate(yaml: &str, what: &str) {
    let tmp = TempDir::new("manifest");
    let file = tmp.path().join("manifest.yaml");
    fs::write(&file, yaml).unwrap();
    let out = ok(
        Command::new(venv_bin("kubernetes-validate"))
            .arg("--strict")
            .arg(&file)
            .output()
            .unwrap(),
        &format!("kubernetes-validate --strict of {what}"),
    );
    // It exits 0 over a file without any resource: make sure it judged the DaemonSet.
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("daemonset/cni-ledger"),
        "kubernetes-validate of {what} did not validate the DaemonSet: {said}"
    );
}

/// The documents of a YAML file, as JSON (PyYAML's reading).
pub fn documents_of(file: &Path) -> Vec<Value> {
    let out = ok(
        Command::new(venv_bin("python3"))
            .args([
                "-c",
                "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
            ])
            .arg(file)
            .output()
            .unwrap(),
        "reading YAML",
    );
    let docs: Value = serde_json::from_slice(&out.stdout).unwrap();
    docs.as_array().unwrap().clone()
}

/// The documents of a YAML stream, as JSON.
pub fn documents(yaml: &str) -> Vec<Value> {
    let tmp = TempDir::new("manifest");
    let file = tmp.path().join("manifest.yaml");
    fs::write(&file, yaml).unwrap();
    documents_of(&file)
}

/// The one DaemonSet among `docs`.
pub fn daemonset(docs: &[Value]) -> Value {
    let mut found = docs.iter().filter(|d| d["kind"] == "DaemonSet");
    let ds = found.next().expect("a DaemonSet").clone();
    assert!(found.next().is_none(), "one DaemonSet, not more");
    ds
}

/// The DaemonSet's one container, the agent.
pub fn agent(ds: &Value) -> &Value {
    let containers = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1, "one container, the agent");
    assert_eq!(containers[0]["name"], "agent");
    &containers[0]
}

/// The agent's args.
pub fn args(ds: &Value) -> Vec<String> {
    agent(ds)["args"]
        .as_array()
        .expect("args, a list")
        .iter()
        .map(|a| a.as_str().expect("args are strings").to_string())
        .collect()
}
