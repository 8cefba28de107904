//! Replaying DEL through a recorded chain the way libcni's DelNetworkList does, except
//! that a failing plugin does not stop the others: DEL is idempotent, and the main
//! plugin's IPAM release matters most. The caller keeps the record when any failed.

use crate::conflist;
use serde::Serialize;
use serde_json::{Map, Value};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// What one DEL replay needs besides the chain itself.
pub struct Invocation<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub ifname: &'a str,
    /// The recorded namespace, only while it still is that namespace; else None.
    pub netns: Option<&'a str>,
    pub cni_args: &'a str,
    pub cni_path: &'a [PathBuf],
    pub capability_args: &'a Map<String, Value>,
    pub prev_result: Option<&'a Value>,
    pub timeout: Duration,
    /// A caller's time budget: each plugin's timeout is cut to what is left of it.
    pub deadline: Option<std::time::Instant>,
    /// Waits, before each plugin, while an ADD is in flight on the node (`courtesy`).
    pub courtesy: Option<&'a super::courtesy::Courtesy>,
}

/// Why one plugin's DEL did not succeed: its message, and its exit status when it ran
/// to an exit (none when it was never started, or was killed).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayError {
    pub message: String,
    pub exit_status: Option<i32>,
}

impl ReplayError {
    /// A failure with no exit status: the plugin never ran, or was killed.
    pub fn without_exit(message: impl Into<String>) -> ReplayError {
        ReplayError {
            message: message.into(),
            exit_status: None,
        }
    }
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ReplayError {}

/// What became of one plugin's DEL.
#[derive(Debug, Clone, PartialEq)]
pub enum DelResult {
    /// Exited 0.
    Done,
    Failed(ReplayError),
}

/// One plugin of a replayed chain and its DEL's result. Serialised as it always was:
/// `{"type", "ok", "error", "exitStatus", "source"?}`.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginOutcome {
    /// Empty when no plugin ran (no config to replay was found).
    pub plugin_type: String,
    pub result: DelResult,
    /// The file the plugin's config came from (the conflist or a drop-in), when the
    /// replayed chain names it.
    pub source: Option<String>,
}

impl PluginOutcome {
    pub fn ok(&self) -> bool {
        self.result == DelResult::Done
    }

    /// The exit status as reported: 0 for a DEL that succeeded.
    pub fn exit_status(&self) -> Option<i32> {
        match &self.result {
            DelResult::Done => Some(0),
            DelResult::Failed(e) => e.exit_status,
        }
    }

    pub fn error(&self) -> Option<&ReplayError> {
        match &self.result {
            DelResult::Done => None,
            DelResult::Failed(e) => Some(e),
        }
    }
}

impl Serialize for PluginOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            #[serde(rename = "type")]
            plugin_type: &'a str,
            ok: bool,
            error: Option<&'a str>,
            exit_status: Option<i32>,
            #[serde(skip_serializing_if = "Option::is_none")]
            source: Option<&'a str>,
        }
        Wire {
            plugin_type: &self.plugin_type,
            ok: self.ok(),
            error: self.error().map(|e| e.message.as_str()),
            exit_status: self.exit_status(),
            source: self.source.as_deref(),
        }
        .serialize(s)
    }
}

/// Runs DEL for every plugin of `list` (a loaded chain: drop-ins included) in reverse
/// order, skipping the ledger's own entries, and reports each outcome.
pub fn replay_del(list: &Value, ledger_type: &str, inv: &Invocation) -> Vec<PluginOutcome> {
    let cni_version = list.get("cniVersion").and_then(Value::as_str).unwrap_or("");
    // libcni hands cached results to DEL only from 0.4.0 on.
    let prev = inv
        .prev_result
        .filter(|_| crate::cni::version::at_least(cni_version, "0.4.0"));
    let sources = conflist::plugin_sources(list, None);
    conflist::plugins(list)
        .iter()
        .zip(sources)
        .rev()
        .filter(|(p, _)| conflist::plugin_type(p) != ledger_type)
        .map(|(plugin, source)| {
            let plugin_type = conflist::plugin_type(plugin).to_string();
            let config = plugin_config(plugin, inv.network, cni_version, inv.capability_args, prev);
            if let Some(c) = inv.courtesy {
                c.between_plugins();
            }
            let result = find_plugin(&plugin_type, inv.cni_path)
                .and_then(|bin| invoke_del(&bin, &config, inv));
            PluginOutcome {
                plugin_type,
                result: match result {
                    Ok(()) => DelResult::Done,
                    Err(e) => DelResult::Failed(e),
                },
                source,
            }
        })
        .collect()
}

/// The plugin's own object plus what libcni injects: name, cniVersion, prevResult, and
/// runtimeConfig = the capability args the plugin declares (only when non-empty).
pub fn plugin_config(
    plugin: &Value,
    network: &str,
    cni_version: &str,
    capability_args: &Map<String, Value>,
    prev_result: Option<&Value>,
) -> Value {
    let mut obj = plugin.as_object().cloned().unwrap_or_default();
    obj.insert("name".into(), Value::from(network));
    obj.insert("cniVersion".into(), Value::from(cni_version));
    if let Some(prev) = prev_result {
        obj.insert("prevResult".into(), prev.clone());
    }
    let runtime: Map<String, Value> = conflist::declared_capabilities(plugin)
        .into_iter()
        .filter_map(|cap| capability_args.get(&cap).map(|v| (cap, v.clone())))
        .collect();
    if !runtime.is_empty() {
        obj.insert("runtimeConfig".into(), Value::Object(runtime));
    }
    Value::Object(obj)
}

/// A plugin type is a bare file name found in one of the CNI_PATH directories; a type
/// like `../../bin/sh` or `/bin/sh` is refused.
pub fn find_plugin(plugin_type: &str, dirs: &[PathBuf]) -> Result<PathBuf, ReplayError> {
    let bare = !plugin_type.is_empty()
        && plugin_type != "."
        && plugin_type != ".."
        && !plugin_type.contains(['/', '\0']);
    if !bare {
        return Err(ReplayError::without_exit(format!(
            "refusing plugin type \"{plugin_type}\": not a bare name"
        )));
    }
    for dir in dirs.iter().filter(|d| d.is_absolute()) {
        let candidate = dir.join(plugin_type);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(ReplayError::without_exit(format!(
        "plugin {plugin_type} not found in CNI_PATH {}",
        std::env::join_paths(dirs)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default()
    )))
}

const MAX_OUTPUT: u64 = 1 << 20;

fn drain(mut r: impl Read + Send + 'static) -> std::io::Result<mpsc::Receiver<Vec<u8>>> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new().spawn(move || {
        let mut buf = Vec::new();
        let _ = (&mut r).take(MAX_OUTPUT).read_to_end(&mut buf);
        let _ = tx.send(buf);
    })?;
    Ok(rx)
}

fn kill_group(pid: i32) {
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

fn invoke_del(bin: &Path, config: &Value, inv: &Invocation) -> Result<(), ReplayError> {
    let now = std::time::Instant::now();
    let Some(timeout) = super::capped_timeout(inv.timeout, inv.deadline, now) else {
        return Err(ReplayError::without_exit(
            "not started: the time budget ran out",
        ));
    };
    let mut cmd = Command::new(bin);
    // Like libcni: the caller's environment plus the CNI variables, none inherited.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CNI_") {
            cmd.env_remove(k);
        }
    }
    let path = std::env::join_paths(inv.cni_path).unwrap_or_default();
    cmd.env("CNI_COMMAND", "DEL")
        .env("CNI_CONTAINERID", inv.container_id)
        .env("CNI_NETNS", inv.netns.unwrap_or(""))
        .env("CNI_IFNAME", inv.ifname)
        .env("CNI_ARGS", inv.cni_args)
        .env("CNI_PATH", path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout kills whatever it started too.
        .process_group(0);
    let spawned = {
        let _no_exec_written = crate::process::spawn_guard();
        cmd.spawn()
    };
    let mut child = spawned
        .map_err(|e| ReplayError::without_exit(format!("cannot run {}: {e}", bin.display())))?;
    let pid = child.id() as i32;
    let stdin = serde_json::to_vec(config).unwrap_or_default();
    // All three were set to Stdio::piped() above; spawn gives each a pipe.
    let (Some(mut pipe), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        kill_group(pid);
        let _ = child.wait();
        return Err(ReplayError::without_exit(format!(
            "{} started without its stdio pipes",
            bin.display()
        )));
    };
    let (tx, rx) = mpsc::channel();
    // Threads: stdin writer, two readers, and a waiter, so the timeout needs no polling.
    let started = (|| {
        let writer = std::thread::Builder::new().spawn(move || {
            use std::io::Write;
            let _ = pipe.write_all(&stdin);
        })?;
        let out = drain(stdout)?;
        let err = drain(stderr)?;
        std::thread::Builder::new().spawn(move || {
            let _ = tx.send(child.wait());
        })?;
        Ok::<_, std::io::Error>((writer, out, err))
    })();
    let (writer, out, err) = match started {
        Ok(t) => t,
        Err(e) => {
            kill_group(pid);
            return Err(ReplayError::without_exit(format!(
                "cannot start a thread to run it: {e}"
            )));
        }
    };
    let status = match rx.recv_timeout(timeout) {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => {
            return Err(ReplayError::without_exit(format!(
                "waiting for {}: {e}",
                bin.display()
            )))
        }
        Err(_) => {
            kill_group(pid);
            let _ = rx.recv();
            let why = if timeout < inv.timeout {
                format!(
                    "killed after {:.1}s: the time budget ran out",
                    timeout.as_secs_f64()
                )
            } else {
                format!("timed out after {}s and was killed", timeout.as_secs())
            };
            return Err(ReplayError::without_exit(why));
        }
    };
    let _ = writer.join();
    let stdout = out.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
    let stderr = err.recv_timeout(Duration::from_secs(1)).unwrap_or_default();
    if status.success() {
        return Ok(());
    }
    Err(ReplayError {
        message: describe_failure(&stdout, &stderr),
        exit_status: status.code(),
    })
}

/// The plugin's CNI error message when it printed one, else the end of its stderr.
fn describe_failure(stdout: &[u8], stderr: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(stdout) {
        if let Some(msg) = v.get("msg").and_then(Value::as_str) {
            let code = v.get("code").and_then(Value::as_u64).unwrap_or(0);
            return match v.get("details").and_then(Value::as_str) {
                Some(d) if !d.is_empty() => format!("code {code}: {msg}: {d}"),
                _ => format!("code {code}: {msg}"),
            };
        }
    }
    let text = String::from_utf8_lossy(if stderr.is_empty() { stdout } else { stderr });
    let text = text.trim();
    let tail: String = text
        .chars()
        .rev()
        .take(500)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if tail.is_empty() {
        "failed without output".into()
    } else {
        tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn outcomes_serialise_as_they_always_did() {
        let done = PluginOutcome {
            plugin_type: "bridge".into(),
            result: DelResult::Done,
            source: Some("/etc/cni/net.d/10-k8s.conflist".into()),
        };
        assert_eq!(
            serde_json::to_string(&done).unwrap(),
            r#"{"type":"bridge","ok":true,"error":null,"exitStatus":0,"source":"/etc/cni/net.d/10-k8s.conflist"}"#
        );
        let failed = PluginOutcome {
            plugin_type: "portmap".into(),
            result: DelResult::Failed(ReplayError {
                message: "code 11: no".into(),
                exit_status: Some(1),
            }),
            source: None,
        };
        assert_eq!(
            serde_json::to_string(&failed).unwrap(),
            r#"{"type":"portmap","ok":false,"error":"code 11: no","exitStatus":1}"#
        );
        let killed = PluginOutcome {
            plugin_type: String::new(),
            result: DelResult::Failed(ReplayError::without_exit("timed out")),
            source: None,
        };
        assert_eq!(
            serde_json::to_string(&killed).unwrap(),
            r#"{"type":"","ok":false,"error":"timed out","exitStatus":null}"#
        );
        for (s, name) in [
            (crate::gc::ConfigSource::Snapshot, "snapshot"),
            (crate::gc::ConfigSource::Cache, "cache"),
            (crate::gc::ConfigSource::Conflist, "conflist"),
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), json!(name));
            assert_eq!(s.as_str(), name);
        }
    }

    #[test]
    fn runtime_config_is_the_declared_capabilities_only() {
        let caps = json!({"portMappings":[{"hostPort":1}],"bandwidth":{"x":1}});
        let plugin = json!({"type":"portmap","capabilities":{"portMappings":true},"snat":false});
        let c = plugin_config(&plugin, "n", "1.0.0", caps.as_object().unwrap(), None);
        assert_eq!(c["runtimeConfig"], json!({"portMappings":[{"hostPort":1}]}));
        assert_eq!(c["name"], "n");
        assert_eq!(c["snat"], false);
        let bridge = json!({"type":"bridge"});
        let c = plugin_config(
            &bridge,
            "n",
            "1.0.0",
            caps.as_object().unwrap(),
            Some(&json!({"ips":[]})),
        );
        assert!(c.get("runtimeConfig").is_none());
        assert_eq!(c["prevResult"], json!({"ips":[]}));
    }

    #[test]
    fn only_bare_names_are_executed() {
        // A plugin dir of the test's own, not the machine's /bin.
        let root = std::env::temp_dir().join(format!("cl-replay-bare-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("p"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(bin.join("p"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dirs = [bin.clone()];
        for bad in ["", ".", "..", "../bin/p", "/bin/p", "bin/p"] {
            assert!(find_plugin(bad, &dirs).is_err(), "{bad}");
        }
        assert_eq!(find_plugin("p", &dirs).unwrap(), bin.join("p"));
        // The same dir spelled relative to the working directory is not searched.
        let cwd = std::env::current_dir().unwrap();
        let up = "../".repeat(cwd.components().count() - 1);
        let relative = PathBuf::from(up).join(bin.strip_prefix("/").unwrap());
        assert!(relative.is_relative() && relative.join("p").is_file());
        assert!(
            find_plugin("p", &[relative]).is_err(),
            "relative dirs are ignored"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn failures_are_described_by_cni_error_or_stderr() {
        assert_eq!(
            describe_failure(br#"{"code":7,"msg":"bad","details":"x"}"#, b""),
            "code 7: bad: x"
        );
        assert_eq!(describe_failure(b"", b"boom\n"), "boom");
        assert_eq!(describe_failure(b"", b""), "failed without output");
    }
}
