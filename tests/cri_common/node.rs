//! A node of the test's own for runtime tests that use the node's standard paths: a
//! mount namespace where they are fresh tmpfs (`PrivateRun`) and a network namespace,
//! where the node's tools run as a unit or a shell there would run them.
#![allow(dead_code)]

use std::fs;
use std::process::{Command, Output};

use super::PrivateRun;
use crate::common::*;
use serde_json::Value;

/// The node's paths, fresh for the test: install.sh's and the manifest's defaults, which
/// are also ctr's (`gocni`'s) CNI dirs and libcni's cache.
pub const NODE_DIRS: [&str; 6] = [
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/var/lib/cni",
    "/var/lib/cni-ledger",
    "/run/netns",
    "/run/containerd",
];

/// install.sh's default for `name` (`DEFAULT_BIN_DIR=/opt/cni/bin`).
pub fn install_default(name: &str) -> String {
    let script = fs::read_to_string(repo().join("install.sh")).unwrap();
    let prefix = format!("{name}=");
    script
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("install.sh sets no {name}"))
        .to_string()
}

/// The gc unit's command line as install.sh renders it with its defaults.
pub fn gc_unit_command() -> Vec<String> {
    let unit = fs::read_to_string(repo().join("packaging/systemd/cni-ledger-gc.service")).unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("the gc unit has an ExecStart");
    let binary = format!("{}/cni-ledger", install_default("DEFAULT_BIN_DIR"));
    let ledger = install_default("DEFAULT_LEDGER_DIR");
    let conf = install_default("DEFAULT_CONF_DIR");
    exec.split_whitespace()
        .map(|w| {
            w.replace("@BINARY@", &binary)
                .replace("@LEDGER_DIR@", &ledger)
                .replace("@CONF_DIR@", &conf)
        })
        .collect()
}

/// The node: its mount namespace (`PrivateRun`) and network namespace, where the node's
/// tools (cni-ledger, gc, the agent, ctr) run.
pub struct Node {
    pub mounts: PrivateRun,
    pub net: Netns,
}

impl Node {
    /// `argv` run on the node, as a unit or a shell there runs it.
    pub fn cmd(&self, argv: &[String]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount={}", self.mounts.mnt()))
            .arg(format!("--net={}", self.net.path_str()))
            .arg("--")
            .args(argv);
        c
    }

    /// The gc unit's run, plus `extra`: its exit code and JSON report.
    pub fn gc(&self, extra: &[&str]) -> (i32, Value, Output) {
        let mut argv = gc_unit_command();
        argv.extend(extra.iter().map(|s| s.to_string()));
        let out = self.cmd(&argv).output().unwrap();
        let v = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("gc printed no JSON ({e}): {}", describe(&out)));
        (out.status.code().unwrap_or(-1), v, out)
    }

    /// An operator's look, on the unit's binary and ledger: `list --json`.
    pub fn list(&self) -> Vec<Value> {
        let unit = gc_unit_command();
        let ledger = unit.iter().skip_while(|w| *w != "--ledger-dir").nth(1);
        let argv = [
            unit[0].clone(),
            "list".into(),
            "--ledger-dir".into(),
            ledger.expect("the unit names the ledger").clone(),
            "--json".into(),
        ];
        let out = self.cmd(&argv).output().unwrap();
        assert!(out.status.success(), "list: {}", describe(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The record of an attachment's eth0 in the node's ledger.
    pub fn record(&self, network: &str, id: &str) -> Option<Value> {
        let path = self
            .mounts
            .reach("/var/lib/cni-ledger/records")
            .join(format!("{network}:{id}:eth0.json"));
        let doc: Value = serde_json::from_slice(&fs::read(path).ok()?).ok()?;
        Some(doc["record"].clone())
    }

    /// The address host-local holds for an attachment: its file in the node's IPAM dir.
    pub fn address(&self, network: &str, id: &str) -> Option<String> {
        fs::read_dir(self.mounts.reach("/var/lib/cni/networks").join(network))
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| {
                e.file_name().to_string_lossy().contains('.')
                    && fs::read_to_string(e.path()).is_ok_and(|s| s.lines().next() == Some(id))
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
    }
}

/// The IPv4 address on eth0 in the network namespace of `pid`, seen from inside.
pub fn eth0_of(pid: u32) -> Option<String> {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["ip", "-j", "-4", "addr", "show", "dev", "eth0"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v[0]["addr_info"][0]["local"].as_str().map(str::to_string)
}
