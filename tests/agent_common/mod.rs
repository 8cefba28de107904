//! Running `cni-ledger agent` in tests: a real process on scratch dirs, listening on a
//! free loopback port, talked to with curl (inside the test's host namespace when the
//! agent runs there), stopped with SIGTERM.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::common::{ledger_bin, Fixture};
use serde_json::Value;

pub struct Agent {
    pub child: Option<Child>,
    pub port: u16,
    /// The network namespace it runs in (None: the test's own).
    pub netns: Option<String>,
    pub log: PathBuf,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Agent {
    /// Starts `cni-ledger agent ARGS --listen 127.0.0.1:<port> --log-file LOG` and waits
    /// until /healthz answers.
    pub fn start(bin: &Path, args: &[String], log: &Path, netns: Option<&str>) -> Agent {
        let c = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        Self::spawn(c, args, log, netns)
    }

    /// The same in the network namespace `netns` and the mount namespace of the file
    /// `mnt` (`/proc/PID/ns/mnt`), with nsenter, which execs the agent (`ip netns exec`
    /// would make a mount namespace of its own).
    pub fn start_in_mounts(
        bin: &Path,
        args: &[String],
        log: &Path,
        netns: &str,
        mnt: &str,
    ) -> Agent {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount={mnt}"))
            .arg(format!("--net=/run/netns/{netns}"))
            .arg(bin);
        Self::spawn(c, args, log, Some(netns))
    }

    fn spawn(mut c: Command, args: &[String], log: &Path, netns: Option<&str>) -> Agent {
        let port = free_port();
        c.arg("agent")
            .args(args)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--log-file")
            .arg(log)
            .env_remove("CNI_COMMAND")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = c.spawn().expect("spawn cni-ledger agent");
        let mut a = Agent {
            child: Some(child),
            port,
            netns: netns.map(String::from),
            log: log.to_path_buf(),
        };
        let t0 = Instant::now();
        while a.get("/healthz").0 != 200 {
            if let Some(st) = a.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("agent exited at start ({st}):\n{}", a.log_text());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "agent never answered /healthz:\n{}",
                a.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        a
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// (HTTP status, body) of GET `path`; status 0 when nothing answered.
    pub fn get(&self, path: &str) -> (u32, String) {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "curl"]);
                c
            }
            None => Command::new("curl"),
        };
        let out = c
            .args(["-s", "--max-time", "5", "-w", "\n%{http_code}", &url])
            .output()
            .expect("run curl (install curl)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    pub fn metrics(&self) -> String {
        let (code, body) = self.get("/metrics");
        assert_eq!(code, 200, "/metrics: {body}");
        body
    }

    /// user+system CPU seconds the agent has used so far.
    pub fn cpu_secs(&self) -> f64 {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = after.split_whitespace().collect();
        let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
        ticks / 100.0
    }

    /// SIGTERM, then the exit status (within `secs`).
    pub fn stop(&mut self, secs: u64) -> ExitStatus {
        let mut child = self.child.take().expect("agent running");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if t0.elapsed() > Duration::from_secs(secs) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "agent did not exit within {secs}s of SIGTERM:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The value of one sample (`name{labels}` exactly as printed) in a text exposition.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.rsplit_once(' ').filter(|(s, _)| *s == series))
        .and_then(|(_, v)| v.parse().ok())
}

/// `promtool check metrics` over the text; panics with its complaint when it rejects it.
pub fn promtool_check(text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool (Debian package prometheus)");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics rejected:\n{}{}\n--- input ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The plugin types of a conflist file, in order.
pub fn types_in(path: &Path) -> Vec<String> {
    let doc: Value = match fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
    {
        Some(d) => d,
        None => return Vec::new(),
    };
    doc["plugins"]
        .as_array()
        .map(|p| {
            p.iter()
                .map(|e| e["type"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

pub fn ledger_first(path: &Path) -> bool {
    types_in(path).first().map(String::as_str) == Some("cni-ledger")
}

/// Polls until `cond` holds; returns how long it took, or None after `limit`.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    loop {
        if cond() {
            return Some(t0.elapsed());
        }
        if t0.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The fixture's chain without the ledger: `[bridge+host-local, portmap]`.
pub fn plain_conflist(f: &Fixture) -> Value {
    let mut doc = f.conflist(&f.spec);
    doc["plugins"].as_array_mut().unwrap().remove(0);
    doc
}

/// Writes `doc` over `path` in place, as an editor or `cat >` would.
pub fn write_in_place(path: &Path, doc: &Value) {
    fs::write(path, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
}

/// Writes `doc` to `tmp_name` beside `path`, then renames it over `path`, as an
/// installer replacing the file whole would.
pub fn write_by_rename(path: &Path, doc: &Value, tmp_name: &str) {
    let tmp = path.with_file_name(tmp_name);
    fs::write(&tmp, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
    fs::rename(&tmp, path).unwrap();
}

/// A bin dir already holding the binary under test, so the agent's start is not a copy.
pub fn preinstalled_bin(f: &Fixture) -> PathBuf {
    let dir = f.tmp.path().join("agent-bin");
    fs::create_dir_all(&dir).unwrap();
    fs::copy(ledger_bin(), dir.join("cni-ledger")).unwrap();
    dir
}

/// The agent's directories, and no CRI runtime: one this machine may run is not the test's.
pub fn dir_args(bin: &Path, conf: &Path, ledger: &Path, cache: &Path) -> Vec<String> {
    let mut v = Vec::new();
    for (flag, dir) in [
        ("--cni-bin-dir", bin),
        ("--conf-dir", conf),
        ("--ledger-dir", ledger),
        ("--cni-cache-dir", cache),
    ] {
        v.push(flag.to_string());
        v.push(dir.display().to_string());
    }
    v.extend(["--cri-endpoint".to_string(), "none".to_string()]);
    v
}
