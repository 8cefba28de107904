//! kubelet's probes against a real `cni-ledger agent`: on `--probe-listen` they answer
//! within kubelet's default 1 s timeout while idle clients fill the metrics port and
//! keep arriving at the probe port; `/healthz` fails, naming the thread, once the gc or
//! watcher thread has died; both listeners take a bare IPv6 `ADDR:PORT` as kubelet
//! writes `$(NODE_IP):PORT` on an IPv6 node. Needs root and curl.
//!
//!     cargo test --features testing --test agent_probes
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::collections::VecDeque;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_common::*;
use common::*;
use serde_json::json;

const SECOND: Duration = Duration::from_secs(1);
/// kubelet's default `timeoutSeconds` for a probe.
const PROBE_TIMEOUT: Duration = SECOND;

/// Scratch bin, conf, ledger and cache dirs with one plain conflist; the agent's flags
/// for them, without a CRI runtime (one this machine may run is not the test's).
fn setup(tmp: &TempDir) -> (Vec<String>, PathBuf) {
    let conf = tmp.path().join("net.d");
    let bin = tmp.path().join("bin");
    fs::create_dir_all(&conf).unwrap();
    fs::create_dir_all(&bin).unwrap();
    fs::copy(ledger_bin(), bin.join("cni-ledger")).unwrap();
    let file = conf.join("10-n.conflist");
    let plain = json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "bridge", "bridge": "clpb0"}]});
    fs::write(&file, serde_json::to_vec_pretty(&plain).unwrap()).unwrap();
    let args = dir_args(
        &bin,
        &conf,
        &tmp.path().join("ledger"),
        &tmp.path().join("cache"),
    );
    (args, file)
}

/// GET `path` as kubelet's HTTP prober does (new connection, `Connection: close`), all
/// within `PROBE_TIMEOUT`: Ok((status, body)), or Err(what went wrong) as kubelet would
/// count a failed probe.
fn probe(addr: SocketAddr, path: &str) -> Result<(u32, String), String> {
    let t0 = Instant::now();
    let left = || {
        PROBE_TIMEOUT
            .checked_sub(t0.elapsed())
            .filter(|d| !d.is_zero())
    };
    let mut s =
        TcpStream::connect_timeout(&addr, PROBE_TIMEOUT).map_err(|e| format!("connect: {e}"))?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.31\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    s.set_write_timeout(left()).map_err(|e| e.to_string())?;
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let Some(d) = left() else {
            return Err(format!("no full answer within {PROBE_TIMEOUT:?}"));
        };
        s.set_read_timeout(Some(d)).map_err(|e| e.to_string())?;
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) => return Err(format!("read after {:?}: {e}", t0.elapsed())),
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((code, body))
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Opens `n` connections to `addr` that never send a byte; keeps at most `keep`,
/// closing the oldest.
fn hog(held: &mut VecDeque<TcpStream>, addr: SocketAddr, n: usize, keep: usize) {
    for _ in 0..n {
        if let Ok(s) = TcpStream::connect_timeout(&addr, SECOND) {
            held.push_back(s);
        }
    }
    while held.len() > keep {
        held.pop_front();
    }
}

#[test]
fn probes_answer_within_their_timeout_while_idle_clients_fill_the_metrics_and_probe_ports() {
    require_root!();
    let tmp = TempDir::new("agprobe");
    let (mut args, file) = setup(&tmp);
    let probe_port = free_port();
    args.extend(["--probe-listen".into(), format!("127.0.0.1:{probe_port}")]);
    let log = tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &args, &log, None);
    let probes = local(probe_port);
    wait_for(10 * SECOND, || {
        probe(probes, "/readyz").is_ok_and(|(c, _)| c == 200)
    })
    .unwrap_or_else(|| panic!("never ready on the probe port:\n{}", agent.log_text()));
    assert!(ledger_first(&file));
    // The probe port serves the probes only.
    assert_eq!(probe(probes, "/metrics").unwrap().0, 404);

    let (mut on_metrics, mut on_probes) = (VecDeque::new(), VecDeque::new());
    hog(&mut on_metrics, local(agent.port), 64, 64);
    hog(&mut on_probes, probes, 64, 64);
    // The metrics port is full: a probe there would fail, which is what this is about.
    let starved = probe(local(agent.port), "/healthz");
    assert!(
        !matches!(starved, Ok((200, _))),
        "64 idle clients did not fill the metrics port: {starved:?}"
    );

    // Several seconds, past the metrics port's 5 s header timeout and the probe port's
    // 2 s, with fresh idle clients arriving at both ports all the time.
    let t0 = Instant::now();
    let mut rounds = 0;
    while t0.elapsed() < 8 * SECOND {
        hog(&mut on_metrics, local(agent.port), 16, 64);
        hog(&mut on_probes, probes, 16, 64);
        for (path, want) in [
            ("/healthz", "ok gc thread running"),
            ("/readyz", "ok ledger first in"),
        ] {
            match probe(probes, path) {
                Ok((200, body)) if body.contains(want) => {}
                other => panic!(
                    "{path} on the probe port, round {rounds} at {:?}: {other:?}\n{}",
                    t0.elapsed(),
                    agent.log_text()
                ),
            }
        }
        rounds += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("FIGURE {rounds} probe rounds under 128 idle clients, each pair within 1 s");
    drop(on_metrics);
    drop(on_probes);
    wait_for(10 * SECOND, || agent.get("/healthz").0 == 200).expect("metrics port did not recover");
    assert_eq!(agent.stop(10).code(), Some(0));
}

/// The binary under test with `env` set, as a script: the harness starts what it is given.
fn with_env(tmp: &TempDir, env: &str) -> PathBuf {
    let script = tmp.path().join("agent-with-env");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nexec env {env} {} \"$@\"\n",
            ledger_bin().display()
        ),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn healthz_fails_naming_the_thread_once_gc_or_a_watcher_has_died() {
    require_root!();
    // The watcher also comes round on its own writes, so it dies a few loops later; the
    // chain watcher comes round at each failed-left pass (every 2 s below).
    for (thread, nth, other) in [
        ("gc", 2, "watch"),
        ("watch", 5, "gc"),
        ("chain-watch", 2, "watch"),
    ] {
        let tmp = TempDir::new("agdead");
        let (mut args, _) = setup(&tmp);
        let probe_port = free_port();
        // gc comes round every 2 s, the watcher every 1 s at least; the named thread
        // panics at the top of its nth loop, after the harness has seen /healthz 200.
        args.extend([
            "--probe-listen".into(),
            format!("127.0.0.1:{probe_port}"),
            "--gc-interval".into(),
            "2".into(),
            "--resync".into(),
            "1".into(),
            "--chain-left-after".into(),
            "2".into(),
        ]);
        let bin = with_env(
            &tmp,
            &format!("CNI_LEDGER_TEST_THREAD_PANIC={thread}:{nth}"),
        );
        let log = tmp.path().join("agent.log");
        let mut agent = Agent::start(&bin, &args, &log, None);
        let probes = local(probe_port);
        let mut last = None;
        wait_for(15 * SECOND, || {
            last = Some(probe(probes, "/healthz"));
            matches!(last, Some(Ok((503, _))))
        })
        .unwrap_or_else(|| {
            panic!(
                "/healthz never failed after the {thread} thread panicked: {last:?}\n{}",
                agent.log_text()
            )
        });
        let (_, body) = probe(probes, "/healthz").unwrap();
        assert!(
            body.contains(&format!("FAIL {thread} thread panicked")),
            "{body}"
        );
        assert!(
            body.contains(&format!("ok {other} thread running")),
            "{body}"
        );
        // The same on the metrics port.
        let (code, main_body) = agent.get("/healthz");
        assert_eq!(code, 503, "{main_body}");
        assert!(main_body.contains(&format!("FAIL {thread} thread panicked")));
        // It still shuts down cleanly on SIGTERM.
        assert!(agent.stop(10).code().is_some());
    }
}

fn wait_for_answer(url: &str, child: &mut std::process::Child, log: &Path) {
    let ok = wait_for(10 * SECOND, || {
        if let Some(st) = child.try_wait().unwrap() {
            panic!(
                "agent exited ({st}):\n{}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        Command::new("curl")
            .args([
                "-s",
                "-g",
                "--max-time",
                "1",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                url,
            ])
            .output()
            .is_ok_and(|o| o.stdout == b"200")
    });
    assert!(
        ok.is_some(),
        "{url} never answered:\n{}",
        fs::read_to_string(log).unwrap_or_default()
    );
}

#[test]
fn both_listeners_bind_a_bare_ipv6_address_followed_by_its_port() {
    require_root!();
    // --probe-listen through the harness (which takes --listen itself).
    let tmp = TempDir::new("agv6");
    let (mut args, _) = setup(&tmp);
    let probe_port = free_port();
    args.extend(["--probe-listen".into(), format!("::1:{probe_port}")]);
    let log = tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &args, &log, None);
    let (code, body) = probe(
        SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], probe_port)),
        "/healthz",
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        agent.log_text().contains(&format!("on [::1]:{probe_port}")),
        "{}",
        agent.log_text()
    );
    assert_eq!(agent.stop(10).code(), Some(0));

    // --listen as the manifest writes it, `$(NODE_IP):PORT`, on an IPv6 node.
    let tmp = TempDir::new("agv6l");
    let (args, _) = setup(&tmp);
    let port = free_port();
    let log = tmp.path().join("agent.log");
    let mut child = Command::new(ledger_bin())
        .arg("agent")
        .args(&args)
        .arg(format!("--listen=::1:{port}"))
        .arg("--log-file")
        .arg(&log)
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_answer(&format!("http://[::1]:{port}/metrics"), &mut child, &log);
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(0));
}
