//! A recycled PID or a reused namespace inode must never pass for the recorded sandbox
//! (issue 8). Each test makes the hazard certain before it judges anything:
//!
//! - the kernel gives a new namespace the lowest free nsfs inode number, so the test
//!   fills every lower free number with throwaway UTS namespaces (one number each) and
//!   then creates the new network namespace, which gets the dead one's number;
//! - the dead sandbox's PID is handed out again by writing `ns_last_pid`.
//!
//! The chain is `[cni-ledger, cl-nsguard{bridge+host-local}]`: cl-nsguard
//! (testdata/plugins) refuses any DEL whose CNI_NETNS is not the namespace its ADD set up,
//! before bridge could delete anything there, so a regression fails loudly. Needs root.
//!
//!     cargo test --features testing --test identity
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cni_ledger::ledger::record::{self, Decoded};
use common::*;
use serde_json::{json, Value};

/// The reproductions steer PID and inode allocation: nothing else in this binary may
/// create processes or namespaces meanwhile.
static SERIAL: Mutex<()> = Mutex::new(());

const GUARD: &str = "cl-nsguard";

// -----------------------------------------------------------------------------------------
// processes and allocation
// -----------------------------------------------------------------------------------------

/// A child process killed and reaped on drop.
struct Proc(Option<Child>);

impl Proc {
    fn pid(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// Kills it and waits until it is reaped (its namespaces are released then).
    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `cmd`, which must end by exec'ing `sleep`, and waits until it has (so every
/// namespace it makes exists).
fn start(mut cmd: Command) -> Proc {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let p = Proc(Some(child));
    let comm = format!("/proc/{}/comm", p.pid());
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::read_to_string(&comm)
        .map(|c| c.trim() != "sleep")
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "{cmd:?} did not reach sleep");
        std::thread::sleep(Duration::from_millis(2));
    }
    p
}

fn sleeper(prefix: &[&str]) -> Command {
    let mut c = Command::new(prefix[0]);
    c.args(&prefix[1..]).args(["sleep", "600"]);
    c
}

const NS_LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";

/// Starts `cmd` as process `pid`, by making `pid - 1` the last PID handed out. None when
/// another process took the PID first (the caller tries again).
fn start_as_pid(pid: u32, cmd: Command) -> Option<Proc> {
    let before = fs::read_to_string(NS_LAST_PID).expect("read ns_last_pid");
    fs::write(NS_LAST_PID, (pid - 1).to_string()).expect("write ns_last_pid");
    let p = start(cmd);
    fs::write(NS_LAST_PID, before.trim()).expect("restore ns_last_pid");
    (p.pid() == pid).then_some(p)
}

fn ino(path: &str) -> u64 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {path}: {e}"))
        .ino()
}

/// Takes every free nsfs inode number below `target` with a UTS namespace (one number
/// each), so that the next namespace created gets `target`. None while `target` is
/// still taken (a dead network namespace is freed asynchronously by the kernel).
fn fill_below(target: u64) -> Option<Vec<Proc>> {
    let mut fillers = Vec::new();
    for _ in 0..20_000 {
        let mut p = start(sleeper(&["unshare", "--uts"]));
        let got = ino(&format!("/proc/{}/ns/uts", p.pid()));
        if got == target {
            p.kill(); // frees exactly `target`, now the lowest free number
            return Some(fillers);
        }
        if got > target {
            return None;
        }
        fillers.push(p);
    }
    panic!("more than 20,000 free inode numbers below {target}");
}

/// Runs `create` once `target` is the lowest free nsfs inode number, until what it made
/// has `target` (checked by `made`). Panics if that cannot be arranged: the hazard must
/// be certain, never assumed.
fn recreate_with_inode<T>(
    target: u64,
    mut create: impl FnMut() -> Option<T>,
    made: impl Fn(&T) -> u64,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let Some(fillers) = fill_below(target) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let got = create();
        drop(fillers);
        match got {
            Some(t) if made(&t) == target => return t,
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    panic!("could not make a namespace reuse inode number {target} within 60 s");
}

/// `ip netns del NAME` on drop, for a namespace made outside `Netns`.
struct DeleteOnDrop(String);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

// -----------------------------------------------------------------------------------------
// the fixture
// -----------------------------------------------------------------------------------------

/// `[cni-ledger, cl-nsguard{bridge+host-local}]`.
fn guarded_fixture() -> Fixture {
    let mut f = Fixture::with_spec(ChainSpec::ledger_only());
    f.install_test_plugin(GUARD);
    let state = f.tmp.path().join("guard-state");
    fs::create_dir_all(&state).unwrap();
    f.spec.extra = vec![json!({
        "type": GUARD,
        "stateDir": state,
        "logFile": guard_log_path(&f),
        "delegate": f.bridge_entry(),
    })];
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
    f
}

fn guard_log_path(f: &Fixture) -> PathBuf {
    f.tmp.path().join("guard.log")
}

fn guard_log(f: &Fixture) -> String {
    fs::read_to_string(guard_log_path(f)).unwrap_or_default()
}

fn add(f: &Fixture, cid: &str, ifname: &str, netns: &str) -> String {
    let res = f
        .add(cid, ifname, Some(netns), None)
        .unwrap_or_else(|e| panic!("ADD {cid} through libcni: {e}\nledger log:\n{}", f.log()));
    res["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no address in {res}"))
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

fn record_json(f: &Fixture, cid: &str, ifname: &str) -> Value {
    let bytes = fs::read(f.record_path(cid, ifname)).expect("read record");
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    v["record"].clone()
}

/// Rewrites a record as an older cni-ledger wrote it: device and inode only.
fn strip_strong_identity(f: &Fixture, cid: &str, ifname: &str) {
    let path = f.record_path(cid, ifname);
    let Decoded::Ok(mut rec) = record::decode(&fs::read(&path).unwrap()) else {
        panic!("record {} does not decode", path.display());
    };
    let id = rec.netns_id.as_mut().expect("recorded identity");
    assert!(id.cookie.is_some(), "ADD recorded no cookie");
    id.cookie = None;
    id.pid_start = None;
    fs::write(&path, record::encode(&rec)).unwrap();
}

/// The dead record's device and inode, as the ledger recorded them.
fn recorded_dev_ino(f: &Fixture, cid: &str, ifname: &str) -> (u64, u64) {
    let id = &record_json(f, cid, ifname)["netnsId"];
    (id["dev"].as_u64().unwrap(), id["ino"].as_u64().unwrap())
}

fn row(f: &Fixture, cid: &str, ifname: &str) -> Value {
    f.list_row(cid, ifname)
        .unwrap_or_else(|| panic!("list has no row for {cid}/{ifname}"))
}

fn valid_file(f: &Fixture, live: &[(&str, &str)]) -> String {
    let path = f.tmp.path().join("valid.json");
    let list: Vec<Value> = live
        .iter()
        .map(|(cid, ifname)| json!({"containerID": cid, "ifname": ifname}))
        .collect();
    fs::write(&path, serde_json::to_vec(&list).unwrap()).unwrap();
    path.display().to_string()
}

fn gc(f: &Fixture, args: &[&str]) -> Value {
    let mut all = vec!["--grace", "0"];
    all.extend_from_slice(args);
    let (out, v) = f.gc(&all);
    v.unwrap_or_else(|| panic!("gc printed no report: {}", describe(&out)))
}

fn report<'a>(rep: &'a Value, cid: &str) -> &'a Value {
    rep["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["containerId"] == json!(cid))
        .unwrap_or_else(|| panic!("no report entry for {cid}: {rep:#}"))
}

/// Interface names and their addresses inside the namespace at `path`.
fn links_in(path: &str) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net={path}"))
        .args(["ip", "-brief", "address", "show"])
        .output()
        .expect("nsenter ip");
    assert!(out.status.success(), "{}", describe(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `links_in` once two readings 1.5 s apart agree (10 s at most).
fn settled_links_in(ns: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = links_in(ns);
    loop {
        std::thread::sleep(Duration::from_millis(1500));
        let now = links_in(ns);
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

fn assert_released(f: &Fixture, ips: &[&str]) {
    let held = f.ipam_addresses();
    for ip in ips {
        assert!(
            !held.contains(&ip.to_string()),
            "{ip} is still reserved: {held:?}"
        );
    }
}

/// The checks shared by both reproductions, once the new sandbox sits on the dead
/// one's device and inode: `dead1` is judged by the strong identity, `dead2` (its
/// strong identity stripped, as an older cni-ledger recorded it) by device/inode; gc
/// with a valid list that names only `live` releases both without giving either a
/// namespace, and the new sandbox keeps its interface, address and record.
fn assert_only_the_dead_released(
    f: &Fixture,
    new_path: &str,
    ips: (&str, &str, &str),
    dead1_by: &str,
) {
    let (dead1_ip, dead2_ip, live_ip) = ips;
    let r = row(f, "dead1", "eth0");
    assert_eq!(
        (&r["state"], &r["reason"], &r["identity"]),
        (&json!("stale"), &json!("netns-replaced"), &json!(dead1_by)),
        "{r:#}"
    );
    // An older record can only be judged on device/inode: live, but never verified.
    let r = row(f, "dead2", "eth1");
    assert_eq!(
        (&r["state"], &r["identity"], &r["netnsVerified"]),
        (&json!("live"), &json!("dev-ino"), &json!(false)),
        "{r:#}"
    );
    let r = row(f, "live", "eth0");
    assert_eq!(
        (&r["state"], &r["identity"], &r["netnsVerified"]),
        (&json!("live"), &json!("cookie"), &json!(true)),
        "{r:#}"
    );
    let links_before = links_in(new_path);
    assert!(links_before.contains(live_ip), "{links_before}");

    let valid = valid_file(f, &[("live", "eth0")]);
    let rep = gc(f, &["--network", &f.network, "--valid-attachments", &valid]);
    for (cid, reason) in [("dead1", "netns-replaced"), ("dead2", "not-valid")] {
        let r = report(&rep, cid);
        assert_eq!(
            r["action"],
            json!("replayed"),
            "{cid}: {rep:#}\n{}",
            guard_log(f)
        );
        assert_eq!(r["reason"], json!(reason), "{r:#}");
        assert_eq!(r["replayNetns"], Value::Null, "{r:#}");
    }
    assert_eq!(rep["summary"]["live"], json!(1), "{rep:#}");
    let log = guard_log(f);
    assert!(
        !log.contains("refused"),
        "a DEL was aimed at the new namespace:\n{log}"
    );
    assert!(log.contains("DEL cid=dead1 ifname=eth0 netns= ok"), "{log}");
    assert!(log.contains("DEL cid=dead2 ifname=eth1 netns= ok"), "{log}");
    assert_released(f, &[dead1_ip, dead2_ip]);
    assert!(f.ipam_addresses().contains(&live_ip.to_string()));
    assert_eq!(
        links_in(new_path),
        links_before,
        "the new sandbox's interfaces changed"
    );
    assert!(f.record_path("live", "eth0").exists());
    assert!(!f.record_path("dead1", "eth0").exists());
    assert!(!f.record_path("dead2", "eth1").exists());
}

// -----------------------------------------------------------------------------------------
// tests
// -----------------------------------------------------------------------------------------

#[test]
fn recycled_pid_in_a_namespace_on_the_dead_inode_is_replaced_and_never_entered() {
    require_root!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let f = guarded_fixture();
    // containerd's layout: the sandbox's namespace is /proc/<task pid>/ns/net.
    let mut old = start(sleeper(&["unshare", "--net"]));
    let pid = old.pid();
    let path = format!("/proc/{pid}/ns/net");
    let dead1_ip = add(&f, "dead1", "eth0", &path);
    let dead2_ip = add(&f, "dead2", "eth1", &path);
    let rec = record_json(&f, "dead1", "eth0");
    assert!(rec["netnsId"]["cookie"].is_u64(), "{rec:#}");
    assert!(rec["netnsId"]["pidStart"].is_u64(), "{rec:#}");
    strip_strong_identity(&f, "dead2", "eth1");
    let (dev, target) = recorded_dev_ino(&f, "dead1", "eth0");

    // The task dies without DEL; its PID and its namespace's inode number come back.
    old.kill();
    let new = recreate_with_inode(
        target,
        || start_as_pid(pid, sleeper(&["unshare", "--net"])),
        |p| ino(&format!("/proc/{}/ns/net", p.pid())),
    );
    assert_eq!(new.pid(), pid);
    let now = fs::metadata(&path).unwrap();
    assert_eq!(
        (now.dev(), now.ino()),
        (dev, target),
        "the hazard: same device and inode"
    );
    let live_ip = add(&f, "live", "eth0", &path);

    assert_only_the_dead_released(&f, &path, (&dead1_ip, &dead2_ip, &live_ip), "pid-start");
    drop(new);
}

#[test]
fn named_namespace_recreated_on_the_dead_inode_is_replaced_and_never_entered() {
    require_root!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let f = guarded_fixture();
    let mut ns = Netns::new();
    let path = ns.path_str();
    let dead1_ip = add(&f, "dead1", "eth0", &path);
    let dead2_ip = add(&f, "dead2", "eth1", &path);
    strip_strong_identity(&f, "dead2", "eth1");
    let (dev, target) = recorded_dev_ino(&f, "dead1", "eth0");

    // The runtime deletes the namespace without DEL and makes a new one at the same path.
    ns.delete();
    let name = ns.name().to_string();
    let _recreated = DeleteOnDrop(name.clone());
    recreate_with_inode(
        target,
        || {
            let ok = Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                return None;
            }
            let got = ino(&path);
            if got != target {
                let _ = Command::new("ip").args(["netns", "del", &name]).status();
            }
            Some(got)
        },
        |got| *got,
    );
    let now = fs::metadata(&path).unwrap();
    assert_eq!(
        (now.dev(), now.ino()),
        (dev, target),
        "the hazard: same device and inode"
    );
    let live_ip = add(&f, "live", "eth0", &path);

    assert_only_the_dead_released(&f, &path, (&dead1_ip, &dead2_ip, &live_ip), "cookie");
}

#[test]
fn pid_recycled_by_a_host_process_is_replaced_and_the_host_untouched() {
    require_root!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let f = guarded_fixture();
    let mut old = start(sleeper(&["unshare", "--net"]));
    let pid = old.pid();
    let path = format!("/proc/{pid}/ns/net");
    let ip = add(&f, "dead", "eth0", &path);
    old.kill();

    // A plain process of the (test's) host takes the PID: its namespace is the host's.
    let host_ns = format!("/run/netns/{}", f.host.name());
    let deadline = Instant::now() + Duration::from_secs(30);
    let host_proc = loop {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={host_ns}")).args(["sleep", "600"]);
        if let Some(p) = start_as_pid(pid, c) {
            break p;
        }
        assert!(Instant::now() < deadline, "could not reuse PID {pid}");
    };
    assert_eq!(
        ino(&path),
        ino(&host_ns),
        "PID {pid} is now in the host's namespace"
    );
    // The dead veth's host end went with its namespace: what is left is the host's own.
    let deadline = Instant::now() + Duration::from_secs(10);
    while links_in(&host_ns).contains("veth") {
        assert!(Instant::now() < deadline, "the dead sandbox's veth stayed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The bridge's operstate follows its last port's going a moment later (the kernel's
    // link watch runs up to a second behind): compare against the settled host.
    let host_before = settled_links_in(&host_ns);

    let r = row(&f, "dead", "eth0");
    assert_eq!(
        (&r["state"], &r["reason"]),
        (&json!("stale"), &json!("netns-replaced")),
        "{r:#}"
    );
    let rep = gc(&f, &[]);
    let r = report(&rep, "dead");
    assert_eq!(r["action"], json!("replayed"), "{rep:#}\n{}", guard_log(&f));
    assert_eq!(r["replayNetns"], Value::Null, "{r:#}");
    let log = guard_log(&f);
    assert!(log.contains("DEL cid=dead ifname=eth0 netns= ok"), "{log}");
    assert_released(&f, &[&ip]);
    assert_eq!(
        links_in(&host_ns),
        host_before,
        "the host's interfaces changed"
    );
    drop(host_proc);
}

#[test]
fn both_cookie_sources_give_the_same_value() {
    require_root!();
    // Kernels 5.14 to 6.17 have only the socket way; this kernel has both, so the
    // fallback is checked against the ioctl here.
    use cni_ledger::sandbox::identity;
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let ns = Netns::new();
    let mut seen = Vec::new();
    for path in ["/proc/self/ns/net".to_string(), ns.path_str()] {
        let f = fs::File::open(&path).unwrap();
        let by_ioctl = identity::ioctl_cookie(&f).expect("NS_GET_ID on this kernel");
        let by_socket = identity::socket_cookie(&f).expect("SO_NETNS_COOKIE");
        assert_eq!(by_ioctl, by_socket, "{path}");
        seen.push(by_ioctl);
    }
    assert_ne!(seen[0], seen[1], "two namespaces, two cookies");
    // The reader thread entered the namespace, not the test's thread.
    let mine = fs::File::open("/proc/thread-self/ns/net").unwrap();
    assert_eq!(identity::ioctl_cookie(&mine).unwrap(), seen[0]);
}
