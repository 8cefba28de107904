//! Helpers of the reliability tests (tests/crash.rs, tests/damage.rs, tests/load.rs,
//! tests/security.rs), on top of tests/common.
//!
//! A `World` is one ledger with its conf dir and a CNI bin dir holding a *counting
//! plugin*: a bash CNI plugin that appends one line per DEL it is asked for
//! (`DEL <tag> <cid> <ifname> args=<CNI_ARGS> netns=<CNI_NETNS>`), fails on demand (a
//! flag file named after the container ID), and detects two DELs of one attachment at once
//! (`flock -n` on a per-key lock file; an overlap is logged as `OVERLAP`). The ledger
//! binary is invoked directly as a plugin (CNI_COMMAND + stdin), like libcni would.
//! `World` shares tests/common's base (`LedgerHome`, the ledger entry, the plugin runner)
//! with `Fixture`.
#![allow(dead_code)]

use crate::common::{describe, ledger_bin, ledger_entry, run_plugin, LedgerHome, TempDir};
// Shared with the no-root tier; re-exported for the reliability tests (not all read records).
#[allow(unused_imports)]
pub use crate::common::records::{decode_record, identity, sha256_of};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Deterministic PRNG (splitmix64): every run tries the same inputs.
pub struct Prng(u64);

impl Prng {
    pub fn new(seed: u64) -> Prng {
        Prng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..hi` (hi exclusive, hi > lo).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        assert!(hi > lo, "empty range {lo}..{hi}");
        lo + (self.next() % (hi - lo) as u64) as usize
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// One parsed line of the counting plugin's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// DEL, FAIL or OVERLAP
    pub what: String,
    pub tag: String,
    pub cid: String,
    pub ifname: String,
    /// CNI_ARGS as replayed (the tests put an op id in it at ADD).
    pub args: String,
    pub netns: String,
}

/// Writes the counting plugin as `<bin_dir>/<type_name>`.
pub fn install_counter(
    bin_dir: &Path,
    type_name: &str,
    tag: &str,
    log: &Path,
    fail_dir: &Path,
    lock_dir: &Path,
    sleep_secs: &str,
) {
    let script = format!(
        r#"#!/bin/bash
# Counting CNI plugin for cni-ledger's reliability tests: logs every DEL it gets.
LOG='{log}'
FAIL='{fail}'
LOCKS='{locks}'
cat >/dev/null
case "$CNI_COMMAND" in
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}}'; exit 0 ;;
ADD) echo '{{"cniVersion":"1.0.0"}}'; exit 0 ;;
DEL) ;;
*) exit 0 ;;
esac
line="{tag} $CNI_CONTAINERID $CNI_IFNAME args=$CNI_ARGS netns=$CNI_NETNS"
if [ -e "$FAIL/$CNI_CONTAINERID" ]; then
	echo "FAIL $line" >>"$LOG"
	echo '{{"cniVersion":"1.0.0","code":99,"msg":"counter told to fail"}}'
	exit 1
fi
exec 9>>"$LOCKS/$CNI_CONTAINERID:$CNI_IFNAME.lock"
flock -n 9 || echo "OVERLAP $line" >>"$LOG"
sleep {sleep_secs}
echo "DEL $line" >>"$LOG"
exit 0
"#,
        log = log.display(),
        fail = fail_dir.display(),
        locks = lock_dir.display(),
    );
    let path = bin_dir.join(type_name);
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
}

pub struct World {
    pub tmp: TempDir,
    pub network: String,
    pub conf_dir: PathBuf,
    pub conf_file: PathBuf,
    pub ledger_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub cache_dir: PathBuf,
    pub plugin_log: PathBuf,
    pub counter_log: PathBuf,
    pub fail_dir: PathBuf,
    pub lock_dir: PathBuf,
}

impl World {
    /// A world whose conflist is `[cni-ledger, counter]` (variant 0).
    pub fn new(tag: &str, network: &str, counter_sleep: &str) -> World {
        let tmp = TempDir::new(tag);
        let root = tmp.path().to_path_buf();
        let w = World {
            network: network.to_string(),
            conf_dir: root.join("net.d"),
            conf_file: root.join("net.d").join(format!("10-{network}.conflist")),
            ledger_dir: root.join("ledger"),
            bin_dir: root.join("bin"),
            cache_dir: root.join("cni-cache"),
            plugin_log: root.join("plugin.log"),
            counter_log: root.join("counter.log"),
            fail_dir: root.join("fail"),
            lock_dir: root.join("counter-locks"),
            tmp,
        };
        for d in [
            &w.conf_dir,
            &w.bin_dir,
            &w.cache_dir,
            &w.fail_dir,
            &w.lock_dir,
        ] {
            fs::create_dir_all(d).unwrap();
        }
        fs::write(&w.counter_log, b"").unwrap();
        install_counter(
            &w.bin_dir,
            "counter",
            "a",
            &w.counter_log,
            &w.fail_dir,
            &w.lock_dir,
            counter_sleep,
        );
        w.write_conflist(0, &[json!({"type": "counter"})]);
        w
    }

    pub fn root(&self) -> &Path {
        self.tmp.path()
    }

    /// The ledger's own conflist entry.
    pub fn ledger_entry(&self) -> Value {
        let mut e = ledger_entry(&self.ledger_dir, &self.conf_dir, &self.plugin_log);
        e["lockTimeoutMs"] = json!(3000);
        e
    }

    /// `[cni-ledger, plugins...]`; `variant` changes the bytes (and so the snapshot).
    pub fn conflist(&self, variant: u32, plugins: &[Value]) -> Value {
        let mut all = vec![self.ledger_entry()];
        all.extend(plugins.iter().cloned());
        json!({"cniVersion": "1.0.0", "name": self.network, "variant": variant, "plugins": all})
    }

    pub fn write_conflist(&self, variant: u32, plugins: &[Value]) {
        let v = self.conflist(variant, plugins);
        fs::write(&self.conf_file, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    }

    pub fn conflist_bytes(&self) -> Vec<u8> {
        fs::read(&self.conf_file).unwrap()
    }

    /// What libcni hands the ledger on stdin.
    pub fn stdin(&self) -> Vec<u8> {
        let mut v = self.ledger_entry();
        v["cniVersion"] = json!("1.0.0");
        v["name"] = json!(self.network);
        serde_json::to_vec(&v).unwrap()
    }

    pub fn cni_path(&self) -> String {
        self.bin_dir.display().to_string()
    }

    /// The tail entry of this world's conflists (docs/CHAIN.md).
    pub fn tail_entry(&self) -> Value {
        let mut e = self.ledger_entry();
        e["role"] = json!("tail");
        e
    }

    /// What libcni hands the tail: its entry and the chain's result so far.
    pub fn tail_stdin(&self, prev_result: &Value) -> Vec<u8> {
        let mut v = self.tail_entry();
        v["cniVersion"] = json!("1.0.0");
        v["name"] = json!(self.network);
        v["prevResult"] = prev_result.clone();
        serde_json::to_vec(&v).unwrap()
    }

    /// Runs the binary as a plugin (only the CNI env, PATH and `extra`).
    pub fn plugin(
        &self,
        command: &str,
        cid: &str,
        ifname: &str,
        netns: Option<&str>,
        extra: &[(&str, &str)],
    ) -> Output {
        self.plugin_with(&self.stdin(), command, cid, ifname, netns, extra)
    }

    /// `plugin` with another entry's stdin (e.g. `tail_stdin`).
    pub fn plugin_with(
        &self,
        stdin: &[u8],
        command: &str,
        cid: &str,
        ifname: &str,
        netns: Option<&str>,
        extra: &[(&str, &str)],
    ) -> Output {
        let mut env: Vec<(String, String)> = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", cid),
            ("CNI_IFNAME", ifname),
        ]
        .iter()
        .chain(netns.map(|ns| ("CNI_NETNS", ns)).iter())
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        env.push(("CNI_PATH".into(), self.cni_path()));
        run_plugin(&env, stdin)
    }

    /// ADD that must succeed.
    pub fn add(&self, cid: &str, netns: &str, extra: &[(&str, &str)]) {
        let out = self.plugin("ADD", cid, "eth0", Some(netns), extra);
        assert!(out.status.success(), "ADD {cid} failed: {}", describe(&out));
    }

    /// DEL that must succeed.
    pub fn del(&self, cid: &str) {
        let out = self.plugin("DEL", cid, "eth0", None, &[]);
        assert!(out.status.success(), "DEL {cid} failed: {}", describe(&out));
    }

    /// `cni-ledger <args> --ledger-dir <ledger>` with `extra` env.
    pub fn cli(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        let mut c = self.cli_cmd(args);
        for (k, v) in extra {
            c.env(k, v);
        }
        c.output().expect("run cni-ledger")
    }

    pub fn cli_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(ledger_bin());
        c.args(args)
            .arg("--ledger-dir")
            .arg(&self.ledger_dir)
            .env_remove("CNI_COMMAND")
            .env_remove("CNI_LEDGER_TEST_CRASH_AT")
            .env_remove("CNI_LEDGER_TEST_BOOT_ID")
            .stdin(Stdio::null());
        c
    }

    /// `gc --json --grace 0 --now --yield-max 0 --cni-cache-dir <world cache> <args>`.
    /// These worlds are full of ADDs a crash or a damage cut short, which look in flight
    /// to gc's wait for new pods (up to a minute per run); what gc then does is the same
    /// without the wait, which tests/recovery.rs holds to account.
    pub fn gc_args(&self, args: &[&str]) -> Vec<String> {
        let mut all: Vec<String> = [
            "gc",
            "--json",
            "--grace",
            "0",
            "--now",
            "--yield-max",
            "0",
            "--cni-cache-dir",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        all.push(self.cache_dir.display().to_string());
        all.extend(args.iter().map(|s| s.to_string()));
        all
    }

    pub fn gc(&self, args: &[&str], extra: &[(&str, &str)]) -> (Output, Option<Value>) {
        let all = self.gc_args(args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        let out = self.cli(&refs, extra);
        let v = serde_json::from_slice(&out.stdout).ok();
        (out, v)
    }

    pub fn verify(&self) -> Output {
        self.cli(&["verify"], &[])
    }

    pub fn record_name(&self, cid: &str) -> String {
        format!("{}:{cid}:eth0.json", self.network)
    }
    pub fn record_path(&self, cid: &str) -> PathBuf {
        self.records_dir().join(self.record_name(cid))
    }

    /// Non-temporary files of records/ (name → bytes; a symlink is not followed).
    pub fn records(&self) -> BTreeMap<String, Vec<u8>> {
        files_of(&self.records_dir(), false)
    }
    pub fn snapshots(&self) -> BTreeMap<String, Vec<u8>> {
        files_of(&self.snapshots_dir(), false)
    }
    pub fn quarantine(&self) -> BTreeMap<String, Vec<u8>> {
        files_of(&self.quarantine_dir(), true)
    }
    /// Temporary files (`.tmp.*`) left in records/, snapshots/ and notes/.
    pub fn temp_files(&self) -> Vec<String> {
        let mut v = Vec::new();
        for d in [
            self.records_dir(),
            self.snapshots_dir(),
            self.ledger_dir.join("notes"),
        ] {
            for n in crate::common::list_dir(&d) {
                if n.starts_with(".tmp.") {
                    v.push(n);
                }
            }
        }
        v
    }

    pub fn log_lines(&self) -> Vec<LogLine> {
        parse_log(&fs::read_to_string(&self.counter_log).unwrap_or_default())
    }

    pub fn set_fail(&self, cid: &str, fail: bool) {
        let p = self.fail_dir.join(cid);
        if fail {
            fs::write(p, b"").unwrap();
        } else {
            let _ = fs::remove_file(p);
        }
    }

    pub fn clear_fail(&self) {
        for n in crate::common::list_dir(&self.fail_dir) {
            let _ = fs::remove_file(self.fail_dir.join(n));
        }
    }
}

impl LedgerHome for World {
    fn ledger_dir(&self) -> &Path {
        &self.ledger_dir
    }

    fn cli_command(&self, args: &[&str]) -> Command {
        self.cli_cmd(args)
    }
}

/// name → bytes of the regular files (and symlinks, as their target path) in `dir`;
/// temporary files are included only with `with_hidden`.
pub fn files_of(dir: &Path, with_hidden: bool) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    for n in crate::common::list_dir(dir) {
        if !with_hidden && n.starts_with('.') {
            continue;
        }
        let p = dir.join(&n);
        let meta = fs::symlink_metadata(&p).unwrap();
        let bytes = if meta.file_type().is_symlink() {
            format!("symlink -> {}", fs::read_link(&p).unwrap().display()).into_bytes()
        } else {
            fs::read(&p).unwrap_or_default()
        };
        m.insert(n, bytes);
    }
    m
}

pub fn parse_log(text: &str) -> Vec<LogLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let parts: Vec<&str> = l.splitn(6, ' ').collect();
            assert!(parts.len() == 6, "bad counter log line {l:?}");
            LogLine {
                what: parts[0].to_string(),
                tag: parts[1].to_string(),
                cid: parts[2].to_string(),
                ifname: parts[3].to_string(),
                args: parts[4].trim_start_matches("args=").to_string(),
                netns: parts[5].trim_start_matches("netns=").to_string(),
            }
        })
        .collect()
}

/// The number of temporary files `verify` reports in its summary line.
pub fn verify_temp_count(stdout: &str) -> Option<usize> {
    let summary = stdout.lines().last()?;
    let (head, _) = summary.rsplit_once(" temporary file(s)")?;
    head.rsplit(' ').next()?.parse().ok()
}

/// Whether `stdout` of `verify` names `path` among the damaged.
pub fn verify_names(stdout: &str, path: &Path) -> bool {
    let p = path.display().to_string();
    stdout
        .lines()
        .any(|l| l.starts_with("damaged: ") && l.contains(&p))
}

pub fn exit_code(out: &Output) -> Option<i32> {
    out.status.code()
}

pub fn killed_by_sigkill(out: &Output) -> bool {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal() == Some(9)
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}
