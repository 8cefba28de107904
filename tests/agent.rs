//! `cni-ledger agent` as a real process on scratch conf, bin and ledger dirs: it puts the
//! ledger first and keeps it there through rewrites (plain write and rename) within a
//! second, backs off from a writer that never stops, installs its binary while an old
//! copy runs (and removes the old temp files of an interrupted install), survives its
//! own restart, uninstalls, replays a reboot's leftovers at start while a failing
//! plugin backs off, and exits promptly on SIGTERM while a CRI runtime hangs. Needs
//! root, curl and promtool.
//!
//!     cargo test --features testing --test agent
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agent_common::*;
use common::*;
use serde_json::{json, Value};

const SECOND: Duration = Duration::from_secs(1);

fn agent_args(f: &Fixture, bin_dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut v = dir_args(bin_dir, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

#[test]
fn agent_keeps_the_ledger_first_through_rewrites_and_an_add_after_is_recorded() {
    require_root!();
    let f = Fixture::new();
    let plain = plain_conflist(&f);
    write_in_place(&f.conf_file, &plain);
    let bin = preinstalled_bin(&f);
    let log = f.tmp.path().join("agent.log");
    let t0 = Instant::now();
    let mut agent = Agent::start(&ledger_bin(), &agent_args(&f, &bin, &[]), &log, None);
    wait_for(2 * SECOND, || ledger_first(&f.conf_file))
        .unwrap_or_else(|| panic!("never injected:\n{}", agent.log_text()));
    let first = t0.elapsed();
    eprintln!("FIGURE agent start to injected: {first:?}");
    assert!(first < SECOND, "first injection took {first:?}");
    assert_eq!(
        types_in(&f.conf_file),
        ["cni-ledger", "bridge", "portmap", "cni-ledger"],
        "not inject's transform (head first, tail last)"
    );
    let doc: Value = serde_json::from_slice(&fs::read(&f.conf_file).unwrap()).unwrap();
    assert_eq!(
        doc["plugins"][0]["capabilities"],
        json!({"portMappings": true})
    );
    assert_eq!(mode_of(&f.conf_file), 0o644, "mode not kept");

    // Slow clients holding every connection they can get stall neither the watcher nor gc.
    let hogs: Vec<std::net::TcpStream> = (0..40)
        .filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", agent.port)).ok())
        .collect();

    // A plain write (open, truncate, write), as calico's install-cni does.
    let t = Instant::now();
    write_in_place(&f.conf_file, &plain);
    let took = wait_for(2 * SECOND, || ledger_first(&f.conf_file))
        .unwrap_or_else(|| panic!("not re-injected after a plain write:\n{}", agent.log_text()));
    eprintln!("FIGURE plain rewrite to re-injection: {:?}", t.elapsed());
    assert!(
        took < SECOND,
        "re-injection after a plain write took {took:?}"
    );

    // A new file renamed over it, as tools that write atomically do.
    write_by_rename(&f.conf_file, &plain, ".installer-tmp");
    let took = wait_for(2 * SECOND, || ledger_first(&f.conf_file))
        .unwrap_or_else(|| panic!("not re-injected after a rename:\n{}", agent.log_text()));
    eprintln!("FIGURE rename rewrite to re-injection: {took:?}");
    assert!(took < SECOND, "re-injection after a rename took {took:?}");
    drop(hogs);
    assert!(
        !list_dir(&f.conf_dir).iter().any(|n| n.contains("tmp")),
        "temp files left: {:?}",
        list_dir(&f.conf_dir)
    );

    // An ADD through libcni now is recorded.
    let ns = Netns::new();
    f.add("c-after", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD through libcni: {e}"));
    assert!(
        f.record_path("c-after", "eth0").exists(),
        "ADD not recorded"
    );

    let m = agent.metrics();
    promtool_check(&m);
    let file = f.conf_file.display().to_string();
    assert_eq!(
        sample(
            &m,
            &format!("cni_ledger_conflist_reverts_total{{file=\"{file}\"}}")
        ),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            &format!("cni_ledger_conflist_injections_total{{file=\"{file}\"}}")
        ),
        Some(3.0),
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            &format!("cni_ledger_conflist_injected{{file=\"{file}\"}}")
        ),
        Some(1.0)
    );
    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 200, "{body}");
    let log = agent.log_text();
    assert!(log.contains("written in place"), "{log}");
    assert!(log.contains("replaced by rename"), "{log}");
    assert_eq!(agent.stop(10).code(), Some(0));
    f.del("c-after", "eth0", Some(&ns.path_str()), None)
        .unwrap();
}

#[test]
fn agent_backs_off_from_a_writer_reverting_every_100ms_and_does_not_spin() {
    require_root!();
    let f = Fixture::new();
    let plain = plain_conflist(&f);
    write_in_place(&f.conf_file, &plain);
    let bin = preinstalled_bin(&f);
    let log = f.tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &agent_args(&f, &bin, &[]), &log, None);
    wait_for(2 * SECOND, || ledger_first(&f.conf_file)).expect("never injected");
    let cpu0 = agent.cpu_secs();
    let fight = Duration::from_secs(6);
    let t0 = Instant::now();
    let mut writes = 0;
    let mut readyz_during = (0, String::new());
    let mut metrics_during = String::new();
    while t0.elapsed() < fight {
        write_in_place(&f.conf_file, &plain);
        writes += 1;
        std::thread::sleep(Duration::from_millis(100));
        if writes == 40 {
            readyz_during = agent.get("/readyz");
            metrics_during = agent.metrics();
        }
    }
    let cpu = agent.cpu_secs() - cpu0;
    let text = agent.log_text();
    let rewrites = text.matches("ledger injected").count() - 1;
    eprintln!(
        "FIGURE fight: {writes} reverts in {fight:?}, agent rewrote {rewrites} times, CPU {cpu:.2}s"
    );
    // Without backoff it would have rewritten once per revert.
    assert!(
        rewrites >= 5,
        "{rewrites} rewrites: too few to be a fight\n{text}"
    );
    assert!(
        rewrites <= 12,
        "{rewrites} rewrites for {writes} reverts: no backoff\n{text}"
    );
    assert!(cpu < 0.5, "agent used {cpu:.2}s CPU in a {fight:?} fight");
    let diag: Vec<&str> = text.lines().filter(|l| l.contains("backing off")).collect();
    assert_eq!(diag.len(), 1, "one diagnosis line wanted:\n{text}");
    assert!(
        diag[0].contains(&f.conf_file.display().to_string()) && diag[0].contains("plugins now"),
        "{}",
        diag[0]
    );
    let file = f.conf_file.display().to_string();
    assert_eq!(
        sample(
            &metrics_during,
            &format!("cni_ledger_conflist_fight{{file=\"{file}\"}}")
        ),
        Some(1.0),
        "{metrics_during}"
    );
    promtool_check(&metrics_during);
    assert_eq!(readyz_during.0, 503, "{}", readyz_during.1);
    assert!(
        readyz_during.1.contains("keeps reverting"),
        "{}",
        readyz_during.1
    );
    let m = agent.metrics();
    let reverts = sample(
        &m,
        &format!("cni_ledger_conflist_reverts_total{{file=\"{file}\"}}"),
    )
    .unwrap();
    assert!(reverts >= 6.0 && reverts <= rewrites as f64 + 1.0, "{m}");
    assert_eq!(agent.stop(10).code(), Some(0));
}

fn sha(path: &Path) -> String {
    sha256_hex(path)
}

#[test]
fn binary_replaced_under_a_running_copy_restart_keeps_injection_uninstall_removes_it() {
    require_root!();
    let f = Fixture::new();
    let plain = plain_conflist(&f);
    write_in_place(&f.conf_file, &plain);
    let bin = f.tmp.path().join("agent-bin");
    fs::create_dir_all(&bin).unwrap();
    let old = bin.join("cni-ledger");
    fs::copy("/bin/sleep", &old).unwrap();
    // The old copy is executing: writing to it would fail with ETXTBSY.
    let mut running = Command::new(&old).arg("30").spawn().unwrap();
    let old_ino = fs::metadata(&old).unwrap().ino();
    let log = f.tmp.path().join("agent.log");
    let args = agent_args(&f, &bin, &[]);
    let mut agent = Agent::start(&ledger_bin(), &args, &log, None);
    wait_for(Duration::from_secs(20), || {
        fs::metadata(&old).is_ok_and(|m| m.ino() != old_ino) && ledger_first(&f.conf_file)
    })
    .unwrap_or_else(|| panic!("binary not installed:\n{}", agent.log_text()));
    assert_eq!(
        sha(&old),
        sha(&ledger_bin()),
        "installed binary differs (torn?)"
    );
    assert_eq!(mode_of(&old), 0o755);
    assert_eq!(list_dir(&bin), ["cni-ledger"], "temp files left");
    assert!(
        running.try_wait().unwrap().is_none(),
        "the running old copy died"
    );
    let out = Command::new(&old).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("cni-ledger"));
    assert!(!agent.log_text().contains("ETXTBSY") && !agent.log_text().contains("busy"));
    let _ = running.kill();
    let _ = running.wait();

    // Its own restart leaves the conflist injected (and untouched).
    assert_eq!(agent.stop(10).code(), Some(0));
    assert!(
        ledger_first(&f.conf_file),
        "the agent removed itself on exit"
    );
    let before = (
        fs::read(&f.conf_file).unwrap(),
        fs::metadata(&f.conf_file).unwrap().ino(),
    );
    let mut agent = Agent::start(&ledger_bin(), &args, &log, None);
    wait_for(5 * SECOND, || agent.get("/readyz").0 == 200)
        .unwrap_or_else(|| panic!("not ready after restart: {}", agent.get("/readyz").1));
    let after = (
        fs::read(&f.conf_file).unwrap(),
        fs::metadata(&f.conf_file).unwrap().ino(),
    );
    assert!(before == after, "restart rewrote an injected conflist");
    assert_eq!(agent.stop(10).code(), Some(0));
    assert!(ledger_first(&f.conf_file));

    // --uninstall takes it out: the chain is as it was.
    let out = Command::new(ledger_bin())
        .arg("agent")
        .args(&args)
        .arg("--uninstall")
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let now: Value = serde_json::from_slice(&fs::read(&f.conf_file).unwrap()).unwrap();
    assert_eq!(now, plain, "uninstall did not restore the chain");
}

/// An agent killed between writing its binary's temp file and the rename leaves the
/// file in the bin dir. The next agent removes its own such files once 10 minutes old,
/// and nothing else: not a fresh one (another agent may be writing it), not another
/// writer's temp or install.sh's, not a symlink under its pattern, not a directory.
#[test]
fn an_old_temp_file_of_its_own_in_the_bin_dir_goes_and_nothing_else_does() {
    require_root!();
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    let f = Fixture::new();
    write_in_place(&f.conf_file, &plain_conflist(&f));
    let bin = f.tmp.path().join("agent-bin");
    fs::create_dir_all(&bin).unwrap();
    // Unmodified for an hour (of the link itself, for a symlink).
    let age = |p: &Path| {
        let t = TimeSpec::from_duration(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                - Duration::from_secs(3600),
        );
        utimensat(None, p, &t, &t, UtimensatFlags::NoFollowSymlink).unwrap();
    };
    let put = |name: &str, old: bool| {
        let p = bin.join(name);
        fs::write(&p, b"partial binary").unwrap();
        if old {
            age(&p);
        }
    };
    put(".tmp.cni-ledger.4242.0", true); // the leftover
    put(".tmp.cni-ledger.4243.0", false); // being written now
    put(".tmp.bridge.4242.0", true); // another writer's
    put(".cni-ledger.Ab12Cd", true); // install.sh's mktemp
    put("host-local", true);
    let outside = f.tmp.path().join("outside");
    fs::write(&outside, b"not in the bin dir").unwrap();
    age(&outside);
    std::os::unix::fs::symlink(&outside, bin.join(".tmp.cni-ledger.4242.1")).unwrap();
    age(&bin.join(".tmp.cni-ledger.4242.1"));
    fs::create_dir(bin.join(".tmp.cni-ledger.4242.2")).unwrap();
    age(&bin.join(".tmp.cni-ledger.4242.2"));

    let log = f.tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &agent_args(&f, &bin, &[]), &log, None);
    wait_for(Duration::from_secs(20), || {
        agent.get("/readyz").0 == 200 && bin.join("cni-ledger").exists()
    })
    .unwrap_or_else(|| panic!("not ready:\n{}", agent.log_text()));
    assert_eq!(
        list_dir(&bin),
        [
            ".cni-ledger.Ab12Cd",
            ".tmp.bridge.4242.0",
            ".tmp.cni-ledger.4242.1",
            ".tmp.cni-ledger.4242.2",
            ".tmp.cni-ledger.4243.0",
            "cni-ledger",
            "host-local",
        ],
        "{}",
        agent.log_text()
    );
    assert!(bin.join(".tmp.cni-ledger.4242.1").is_symlink());
    assert_eq!(fs::read(&outside).unwrap(), b"not in the bin dir");
    let text = agent.log_text();
    assert!(
        text.contains(&format!(
            "agent: removed {}, a temp file an interrupted install left",
            bin.join(".tmp.cni-ledger.4242.0").display()
        )),
        "{text}"
    );
    assert_eq!(agent.stop(10).code(), Some(0));
}

#[test]
fn reboot_under_the_agent_start_up_gc_replays_and_a_failing_plugin_backs_off_while_ready() {
    require_root!();
    let mut f = Fixture::new();
    f.install_test_plugin("cl-probe");
    let old_boot = "00000000-0000-0000-0000-00000000b007";
    let add_in_old_boot = |f: &Fixture, cid: &str, ns: &Netns| {
        let mut c = f.driver_cmd("add", cid, "eth0", Some(&ns.path_str()), None);
        c.env("CNI_LEDGER_TEST_BOOT_ID", old_boot);
        let out = c.output().unwrap();
        assert!(out.status.success(), "ADD {cid}: {}", describe(&out));
        let res: Value = serde_json::from_slice(&out.stdout).unwrap();
        first_ip(&res)
    };
    // pod1 under the plain chain; pod2 under a chain whose last plugin refuses DEL.
    let ns1 = Netns::new();
    let ip1 = add_in_old_boot(&f, "pod1", &ns1);
    let marker = f.tmp.path().join("fail-del");
    fs::write(&marker, b"").unwrap();
    f.spec.extra = vec![json!({"type": "cl-probe", "failDelMarker": marker})];
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
    let ns2 = Netns::new();
    let ip2 = add_in_old_boot(&f, "pod2", &ns2);
    assert_eq!(f.record_files().len(), 2);

    // The agent starts in the "rebooted" host: its start-up gc replays both.
    let log = f.tmp.path().join("agent.log");
    let bin = f.bin_dir.clone();
    let mut agent = Agent::start(
        &ledger_bin(),
        &agent_args(&f, &bin, &["--gc-interval", "1"]),
        &log,
        Some(f.host.name()),
    );
    wait_for(Duration::from_secs(10), || {
        !f.record_path("pod1", "eth0").exists()
    })
    .unwrap_or_else(|| panic!("pod1 not replayed:\n{}", agent.log_text()));
    assert!(
        !f.ipam_addresses().contains(&ip1),
        "pod1's address not released"
    );
    // pod2's chain fails: kept, with backoff, while the agent stays ready.
    wait_for(Duration::from_secs(5), || {
        sample(&agent.metrics(), "cni_ledger_gc_runs_total{result=\"ok\"}").unwrap_or(0.0) >= 3.0
    })
    .unwrap_or_else(|| panic!("gc loop not running:\n{}", agent.log_text()));
    let rec: Value =
        serde_json::from_slice(&fs::read(f.record_path("pod2", "eth0")).unwrap()).unwrap();
    let gc = &rec["record"]["gc"];
    assert_eq!(gc["attempts"], json!(1), "retried without backoff: {gc}");
    assert!(gc["nextAttemptAt"].is_string(), "{gc}");
    assert!(
        gc["lastError"]
            .as_str()
            .unwrap()
            .contains("cl-probe refuses DEL"),
        "{gc}"
    );
    assert!(
        !f.ipam_addresses().contains(&ip2),
        "bridge's IPAM release skipped because cl-probe failed"
    );
    let (code, body) = agent.get("/readyz");
    assert_eq!(code, 200, "a failing plugin made the agent unready: {body}");

    let m = agent.metrics();
    promtool_check(&m);
    let want = [
        ("cni_ledger_replays_total{outcome=\"replayed\"}", 1.0),
        ("cni_ledger_replays_total{outcome=\"retrying\"}", 1.0),
        ("cni_ledger_stale_records{reason=\"boot-changed\"}", 1.0),
        ("cni_ledger_records{network=\"cltest\"}", 1.0),
        ("cni_ledger_quarantined_files", 0.0),
    ];
    for (series, v) in want {
        assert_eq!(sample(&m, series), Some(v), "{series}\n{m}");
    }
    assert!(sample(&m, "cni_ledger_gc_last_success_timestamp_seconds").unwrap() > 1.7e9);
    assert_eq!(agent.stop(10).code(), Some(0));

    // A cron node's numbers: gc --metrics-file, the same names, through promtool.
    let prom = f.tmp.path().join("cni-ledger.prom");
    let gc_to_file = || {
        f.host
            .cmd(ledger_bin())
            .args(["gc", "--now", "--ledger-dir"])
            .arg(&f.ledger_dir)
            .arg("--cni-cache-dir")
            .arg(&f.cache_dir)
            .arg("--conf-dir")
            .arg(&f.conf_dir)
            .arg("--metrics-file")
            .arg(&prom)
            .env_remove("CNI_COMMAND")
            .output()
            .unwrap()
    };
    for _ in 0..2 {
        let out = gc_to_file();
        assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    }
    let text = fs::read_to_string(&prom).unwrap();
    promtool_check(&text);
    assert_eq!(mode_of(&prom), 0o644);
    let want = [
        ("cni_ledger_replays_total{outcome=\"retrying\"}", 2.0),
        ("cni_ledger_gc_runs_total{result=\"ok\"}", 2.0),
        ("cni_ledger_stale_records{reason=\"boot-changed\"}", 1.0),
        ("cni_ledger_records{network=\"cltest\"}", 1.0),
    ];
    for (series, v) in want {
        assert_eq!(sample(&text, series), Some(v), "{series}\n{text}");
    }
    // Headroom is of the fixture's conf dir alone, never of the machine's own networks.
    let headroom: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("cni_ledger_address_headroom_ratio{"))
        .collect();
    assert!(!headroom.is_empty(), "{text}");
    assert!(
        headroom
            .iter()
            .all(|l| l.contains(&format!("network=\"{}\"", f.network))),
        "{text}"
    );
    // A run the ledger refuses (records/ group-writable) completes nothing: the file
    // keeps the last completed run's time, not 0 ("never").
    let last = "cni_ledger_gc_last_success_timestamp_seconds";
    let ok_at = sample(&text, last).unwrap();
    assert!(ok_at > 1.7e9, "{text}");
    set_mode(&f.records_dir(), 0o770);
    let out = gc_to_file();
    set_mode(&f.records_dir(), 0o700);
    assert!(!out.status.success(), "{}", describe(&out));
    let text = fs::read_to_string(&prom).unwrap();
    assert_eq!(
        sample(&text, "cni_ledger_gc_runs_total{result=\"error\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, last), Some(ok_at), "{text}");
    assert_eq!(
        list_dir(f.tmp.path())
            .iter()
            .filter(|n| n.contains(".prom"))
            .count(),
        1
    );
    let _ = std::io::stderr().flush();
}

#[test]
fn a_single_plugin_conf_becomes_a_conflist_with_the_ledger_first() {
    require_root!();
    let tmp = TempDir::new("agconf");
    let conf = tmp.path().join("net.d");
    let bin = tmp.path().join("bin");
    fs::create_dir_all(&conf).unwrap();
    fs::create_dir_all(&bin).unwrap();
    fs::copy(ledger_bin(), bin.join("cni-ledger")).unwrap();
    let single =
        json!({"cniVersion": "0.4.0", "name": "single", "type": "bridge", "bridge": "clsg0"});
    let orig = conf.join("10-single.conf");
    fs::write(&orig, serde_json::to_vec(&single).unwrap()).unwrap();
    let args = dir_args(
        &bin,
        &conf,
        &tmp.path().join("ledger"),
        &tmp.path().join("cache"),
    );
    let log = tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &args, &log, None);
    let list = conf.join("10-single.conflist");
    wait_for(2 * SECOND, || ledger_first(&list))
        .unwrap_or_else(|| panic!("not converted:\n{}", agent.log_text()));
    let doc: Value = serde_json::from_slice(&fs::read(&list).unwrap()).unwrap();
    assert_eq!(doc["name"], "single");
    assert_eq!(doc["cniVersion"], "0.4.0");
    assert_eq!(
        doc["plugins"][1], single,
        "the plugin's own object is not kept whole"
    );
    assert!(
        !orig.exists(),
        "the .conf still comes first for the runtime"
    );
    assert_eq!(
        list_dir(&conf),
        ["10-single.conf.cni-ledger-converted", "10-single.conflist"]
    );
    wait_for(2 * SECOND, || agent.get("/readyz").0 == 200)
        .unwrap_or_else(|| panic!("not ready: {}", agent.get("/readyz").1));
    assert_eq!(agent.stop(10).code(), Some(0));
}

/// gc inside the agent's image enters the node's own root (`--node-root /proc/1/root`,
/// with the host's PID namespace) before reading any path, and runs the chain's plugins
/// there: a directory that is no node's root (no procfs in it) is refused before
/// anything is judged, and a process's real root works.
#[test]
fn gc_enters_the_node_root_and_replays_there() {
    require_root!();
    let mut f = Fixture::ledger_only();
    f.install_test_plugin("cl-probe");
    let probe_log = f.tmp.path().join("probe.log");
    f.spec.extra = vec![json!({"type": "cl-probe", "logFile": probe_log})];
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
    let ns = Netns::new();
    let mut c = f.driver_cmd("add", "c-root", "eth0", Some(&ns.path_str()), None);
    c.env(
        "CNI_LEDGER_TEST_BOOT_ID",
        "00000000-0000-0000-0000-00000000b007",
    );
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    let gc = |root: &Path| {
        f.host
            .cmd(ledger_bin())
            .args(["gc", "--now", "--json", "--node-root"])
            .arg(root)
            .arg("--ledger-dir")
            .arg(&f.ledger_dir)
            .arg("--cni-cache-dir")
            .arg(&f.cache_dir)
            .env_remove("CNI_COMMAND")
            .output()
            .unwrap()
    };
    let empty = f.tmp.path().join("empty-root");
    fs::create_dir_all(&empty).unwrap();
    let out = gc(&empty);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a node's root"),
        "{}",
        describe(&out)
    );
    assert!(
        !fs::read_to_string(&probe_log)
            .unwrap_or_default()
            .contains("DEL"),
        "cl-probe ran though the node's root was not entered"
    );
    assert_eq!(f.record_files().len(), 1);
    // Another process's root, as /proc/1/root is the node's in the DaemonSet (PID 1
    // itself may be out of reach on a test machine): this test process's.
    let out = gc(Path::new(&format!("/proc/{}/root", std::process::id())));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["records"][0]["action"], "replayed", "{rep:#}");
    assert!(fs::read_to_string(&probe_log)
        .unwrap()
        .contains("DEL cid=c-root"));
    assert!(f.record_files().is_empty());
}

/// The server's bounds: a request head over 8 KiB is refused, a client that sends
/// nothing is cut off after the header timeout (5 s), a method that is not GET or HEAD
/// changes nothing and gets 405, and while clients hog every connection slot the
/// watcher still re-injects.
#[test]
fn the_http_server_bounds_what_a_client_can_hold_and_changes_nothing() {
    require_root!();
    use std::io::Read;
    use std::net::TcpStream;
    let tmp = TempDir::new("aghttp");
    let conf = tmp.path().join("net.d");
    let bin = tmp.path().join("bin");
    fs::create_dir_all(&conf).unwrap();
    fs::create_dir_all(&bin).unwrap();
    fs::copy(ledger_bin(), bin.join("cni-ledger")).unwrap();
    let plain = json!({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "bridge", "bridge": "clhb0"}]});
    let file = conf.join("10-n.conflist");
    write_in_place(&file, &plain);
    let args = dir_args(
        &bin,
        &conf,
        &tmp.path().join("ledger"),
        &tmp.path().join("cache"),
    );
    let log = tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &args, &log, None);
    wait_for(2 * SECOND, || ledger_first(&file)).expect("never injected");
    let addr = ("127.0.0.1", agent.port);

    // An oversized request head.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(16 * 1024)
    );
    let _ = s.write_all(big.as_bytes());
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(
        !answer.contains("200 OK") && !answer.contains("cni_ledger_"),
        "a 16 KiB request head was served: {}",
        &answer[..answer.len().min(200)]
    );

    // Not GET/HEAD: refused, and nothing changed.
    let before = fs::read(&file).unwrap();
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .arg(format!("http://127.0.0.1:{}/readyz", agent.port))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "405");
    assert_eq!(fs::read(&file).unwrap(), before);

    // Silent clients hold every slot; one of them is cut off at the header timeout.
    let t0 = Instant::now();
    let mut hogs: Vec<TcpStream> = (0..40)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    // Meanwhile the watcher is not held up.
    write_by_rename(&file, &plain, ".installer-tmp");
    let took = wait_for(2 * SECOND, || ledger_first(&file))
        .unwrap_or_else(|| panic!("watcher stalled by HTTP clients:\n{}", agent.log_text()));
    assert!(took < SECOND, "{took:?}");
    let first = &mut hogs[0];
    first
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let mut buf = [0u8; 512];
    let n = first.read(&mut buf).unwrap_or(0);
    let cut = t0.elapsed();
    eprintln!("FIGURE silent client cut off after {cut:?} ({n} bytes)");
    assert!(
        cut >= Duration::from_secs(4) && cut < Duration::from_secs(12),
        "silent client held the connection for {cut:?}"
    );
    drop(hogs);
    wait_for(10 * SECOND, || agent.get("/healthz").0 == 200).expect("server did not recover");
    assert_eq!(agent.stop(10).code(), Some(0));
}

#[test]
fn attachments_made_while_the_ledger_was_out_are_adopted_after_injection() {
    require_root!();
    let f = Fixture::new();
    write_in_place(&f.conf_file, &plain_conflist(&f));
    // A pod started while a network plugin had pushed the ledger out of the chain: only
    // libcni's cache knows it.
    let ns = Netns::new();
    f.add("gap", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD without the ledger: {e}"));
    assert!(f.cache_result_path("gap", "eth0").exists());
    assert!(!f.record_path("gap", "eth0").exists());

    let bin = preinstalled_bin(&f);
    let log = f.tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &agent_args(&f, &bin, &[]), &log, None);
    wait_for(5 * SECOND, || f.record_path("gap", "eth0").exists())
        .unwrap_or_else(|| panic!("not adopted:\n{}", agent.log_text()));
    let row = f.list_row("gap", "eth0").expect("listed");
    assert_eq!(row["source"], json!("adopted"), "{row:#}");
    assert_eq!(row["state"], json!("live"), "{row:#}");
    wait_for(5 * SECOND, || {
        sample(
            &agent.metrics(),
            "cni_ledger_unrecorded_attachments{network=\"cltest\"}",
        ) == Some(0.0)
    })
    .unwrap_or_else(|| panic!("gap not closed:\n{}", agent.metrics()));
    assert_eq!(agent.stop(10).code(), Some(0));
}

/// A CRI runtime that is up but hung: its socket accepts connections, holds them and
/// never answers, until dropped.
struct HungRuntime {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HungRuntime {
    fn at(path: &Path) -> HungRuntime {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (s, a) = (stop.clone(), accepted.clone());
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        held.push(conn);
                        a.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        HungRuntime {
            stop,
            accepted,
            thread: Some(thread),
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for HungRuntime {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// SIGTERM while the gc loop waits on a runtime that accepts and never answers: the
/// agent gives the call up and exits at once, not after the CRI timeout (10 s).
#[test]
fn sigterm_while_a_hung_runtime_is_asked_ends_the_agent_promptly() {
    require_root!();
    let f = Fixture::new();
    write_in_place(&f.conf_file, &plain_conflist(&f));
    let socket = f.tmp.path().join("hung-cri.sock");
    let hung = HungRuntime::at(&socket);
    let bin = preinstalled_bin(&f);
    let mut args = agent_args(&f, &bin, &[]);
    let at = args.iter().position(|a| a == "none").unwrap();
    args[at] = format!("unix://{}", socket.display());
    let log = f.tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &args, &log, None);
    // The start-up gc run is in its CRI call.
    wait_for(5 * SECOND, || hung.accepted() > 0)
        .unwrap_or_else(|| panic!("the runtime was never asked:\n{}", agent.log_text()));
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let status = agent.stop(20);
    let took = t0.elapsed();
    eprintln!("FIGURE agent exit after SIGTERM during a hung CRI call: {took:?}");
    assert_eq!(status.code(), Some(0), "{}", agent.log_text());
    assert!(took < 5 * SECOND, "took {took:?}:\n{}", agent.log_text());
    let text = agent.log_text();
    assert!(text.contains("agent: stopped"), "{text}");
}
