//! A namespace that anything on the node still holds is alive (issue 37; docs/DESIGN.md
//! §5), whatever holds it. Each case makes a pod through the real chain ([cni-ledger,
//! bridge+host-local] via libcni), gives its namespace one holder, removes its path
//! (`ip netns del`), and checks that nothing calls the pod gone:
//!
//! 1. `fd`: an open fd of a process in the host namespace (`sleep 600 3</run/netns/X`);
//! 2. `socket`: a UDP socket a process made inside it before it went back to its own
//!    namespace and closed every namespace fd (`testdata/holders/holder.c socket`);
//! 3. `mntns`: a bind mount of it in a mount namespace no process is in any more, kept
//!    only by an nsfs mount of that namespace's `ns/mnt` (`unshare --mount=FILE`);
//! 4. `zombie`: a thread that entered it, of a process whose leader has exited (the
//!    leader a zombie: `holder.c thread`).
//!
//! Judged, in this order, by `list --json` (live, `held`, a `heldBy`), `gc --grace 0`
//! (replays nothing: the record, the host-local address file, the host ends of the
//! veths on the bridge and, where a path from here reaches the pod, its eth0 address all
//! stay), the CNI GC verb through libcni v1.3 with a valid list naming the pod's
//! attachments (DESIGN: the list is the runtime's explicit word, so it names them), the
//! agent (`--gc-interval 1`, two gc runs), and `adopt` over a libcni cache entry of a
//! second interface of the pod made with the ledger out of the chain (adopted live or left
//! alone, never stale; a gc after keeps it). Then the control: the holder released, the
//! namespace dies and gc replays DEL and frees the address, so each case can fail.
//!
//! Every case runs twice: as is (on Linux ≥ 6.18 the namespace is reopened by the kernel
//! from the recorded namespace id) and with `CNI_LEDGER_TEST_NO_NS_HANDLES=1` in the
//! environment of every cni-ledger process (the search of /proc: fds, sockets, orphaned
//! mount namespaces, threads of zombie leaders), one `#[test]` per case and mode. A
//! failed check does not stop the test at once: `list` only reads, so the first gc runs
//! after it whatever it said, and every check of a step is reported before the test
//! stops at the end of the first step that can replay with a check failed.
//!
//! Needs root, gcc, and libcni v1.3 under target/ (`driver13()`).
//!
//!     cargo test --features testing --test holders -- --nocapture
// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use agent_common::{dir_args, preinstalled_bin, sample, wait_for, Agent};
use common::*;
use serde_json::{json, Value};

/// Turns the kernel's namespace handles off: only the search of /proc is left.
const NO_HANDLES: &str = "CNI_LEDGER_TEST_NO_NS_HANDLES";
const CID: &str = "c-held";
/// Added through the chain: it has a record.
const IF_RECORDED: &str = "eth0";
/// Added with the ledger out of the chain: only libcni's cache knows it, for `adopt`.
const IF_CACHED: &str = "eth1";

#[test]
fn held_by_an_open_fd() {
    require_root!();
    run(Kind::Fd, Mode::Handles);
}

#[test]
fn held_by_an_open_fd_found_by_the_proc_search() {
    require_root!();
    run(Kind::Fd, Mode::Search);
}

#[test]
fn held_by_a_socket() {
    require_root!();
    run(Kind::Socket, Mode::Handles);
}

#[test]
fn held_by_a_socket_found_by_the_proc_search() {
    require_root!();
    run(Kind::Socket, Mode::Search);
}

#[test]
fn mounted_in_a_mount_namespace_no_process_is_in() {
    require_root!();
    run(Kind::OrphanMounts, Mode::Handles);
}

#[test]
fn mounted_in_a_mount_namespace_no_process_is_in_found_by_the_proc_search() {
    require_root!();
    run(Kind::OrphanMounts, Mode::Search);
}

#[test]
fn held_by_a_thread_of_a_zombie_leader() {
    require_root!();
    run(Kind::ZombieLeader, Mode::Handles);
}

#[test]
fn held_by_a_thread_of_a_zombie_leader_found_by_the_proc_search() {
    require_root!();
    run(Kind::ZombieLeader, Mode::Search);
}

/// How cni-ledger finds a namespace its path no longer shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// As built: the kernel's handles first (Linux ≥ 6.18), the search otherwise.
    Handles,
    /// `CNI_LEDGER_TEST_NO_NS_HANDLES=1`: the search of /proc only.
    Search,
}

impl Mode {
    fn apply(self, c: &mut Command) -> &mut Command {
        match self {
            Mode::Handles => c.env_remove(NO_HANDLES),
            Mode::Search => c.env(NO_HANDLES, "1"),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What alone holds the pod's namespace once its path is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Fd,
    Socket,
    OrphanMounts,
    ZombieLeader,
}

impl Kind {
    fn index(self) -> usize {
        self as usize
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Fd => "fd",
            Kind::Socket => "sk",
            Kind::OrphanMounts => "mn",
            Kind::ZombieLeader => "zl",
        }
    }
}

// ---------------------------------------------------------------------------------------
// the holders
// ---------------------------------------------------------------------------------------

/// testdata/holders/holder.c, built once per test binary (to a temp name, then renamed).
fn holder_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = PathBuf::from(option_env!("CARGO_TARGET_TMPDIR").unwrap_or("target/tmp"));
        fs::create_dir_all(&dir).unwrap();
        let out = dir.join("cl-holder");
        let tmp = dir.join(format!("cl-holder.{}.tmp", std::process::id()));
        let src = repo().join("testdata/holders/holder.c");
        let res = Command::new("gcc")
            .args(["-O2", "-Wall", "-pthread", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("cannot run gcc (install gcc): {e}"));
        assert!(
            res.status.success(),
            "gcc {}: {}",
            src.display(),
            describe(&res)
        );
        fs::rename(&tmp, &out).unwrap();
        out
    })
    .clone()
}

/// The one thing that keeps the pod's namespace alive. Released on drop.
enum Holder {
    /// A child of the test: killed by its `Child`, which stays ours (its PID cannot be
    /// reused) until it is waited for. `net` is a path into the pod's namespace through
    /// it (an fd, a thread's `ns/net`); none reaches it through a socket.
    Process {
        child: Option<Child>,
        net: Option<String>,
    },
    /// The pod's namespace bind-mounted at `target` in a mount namespace no process is
    /// in, whose `ns/mnt` is mounted at `pin` (inside `dir`, a private bind mount).
    Mounts {
        dir: PathBuf,
        pin: PathBuf,
        target: PathBuf,
        up: bool,
    },
}

impl Holder {
    fn start(kind: Kind, tmp: &Path, netns: &Path) -> Holder {
        match kind {
            Kind::Fd => {
                let child = Command::new("sh")
                    .args(["-c", r#"exec sleep 600 3<"$1""#, "sh"])
                    .arg(netns)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .spawn()
                    .expect("spawn sh");
                let fd = format!("/proc/{}/fd/3", child.id());
                let h = Holder::Process {
                    child: Some(child),
                    net: Some(fd.clone()),
                };
                let want = fs::metadata(netns).unwrap().ino();
                wait_for(Duration::from_secs(5), || {
                    fs::metadata(&fd).is_ok_and(|m| m.ino() == want)
                })
                .unwrap_or_else(|| panic!("{fd} never became the pod's namespace"));
                h
            }
            Kind::Socket => {
                let (child, ino) = spawn_holder("socket", netns);
                let want = fs::metadata(netns).unwrap().ino();
                assert_eq!(ino, want, "the socket is not in the pod's namespace");
                Holder::Process {
                    child: Some(child),
                    net: None,
                }
            }
            Kind::ZombieLeader => {
                let (child, tid) = spawn_holder("thread", netns);
                let pid = child.id();
                let h = Holder::Process {
                    child: Some(child),
                    net: Some(format!("/proc/{pid}/task/{tid}/ns/net")),
                };
                // The leader has exited: /proc/PID/status says so while its thread lives.
                let status = format!("/proc/{pid}/status");
                wait_for(Duration::from_secs(5), || {
                    fs::read_to_string(&status).is_ok_and(|s| {
                        s.lines()
                            .any(|l| l.starts_with("State:") && l.contains("Z (zombie)"))
                    })
                })
                .unwrap_or_else(|| {
                    panic!(
                        "the leader of {pid} is no zombie: {}",
                        fs::read_to_string(&status).unwrap_or_default()
                    )
                });
                h
            }
            Kind::OrphanMounts => {
                let dir = tmp.join("mntns-pin");
                let pin = dir.join("mnt");
                let target = tmp.join("pod-view");
                fs::create_dir_all(&dir).unwrap();
                fs::write(&target, b"").unwrap();
                // A mount namespace's nsfs file can be bound only onto a private mount.
                run_ok(Command::new("mount").arg("--bind").arg(&dir).arg(&dir));
                let h = Holder::Mounts {
                    dir: dir.clone(),
                    pin: pin.clone(),
                    target: target.clone(),
                    up: true,
                };
                run_ok(Command::new("mount").arg("--make-private").arg(&dir));
                fs::write(&pin, b"").unwrap();
                // The only process ever in it binds the pod's namespace there and exits.
                run_ok(
                    Command::new("unshare")
                        .arg(format!("--mount={}", pin.display()))
                        .args(["--propagation", "private", "sh", "-c"])
                        .arg(r#"mount --bind "$1" "$2""#)
                        .arg("sh")
                        .arg(netns)
                        .arg(&target)
                        .stdin(Stdio::null()),
                );
                h
            }
        }
    }

    /// `args` run in the pod's network namespace through the holder; None where no path
    /// from here reaches it (a socket).
    fn in_pod(&self, args: &[&str]) -> Option<Command> {
        match self {
            Holder::Process { net, .. } => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", net.as_ref()?))
                    .arg("--")
                    .args(args);
                Some(c)
            }
            Holder::Mounts { pin, target, .. } => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--mount={}", pin.display()))
                    .args(["--", "nsenter"])
                    .arg(format!("--net={}", target.display()))
                    .arg("--")
                    .args(args);
                Some(c)
            }
        }
    }

    /// The holder gone: the process killed and reaped, or the mount namespace's last
    /// reference unmounted (its mounts, the pod's with them, go with it).
    fn release(&mut self) {
        match self {
            Holder::Process { child, .. } => {
                if let Some(mut c) = child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
            Holder::Mounts { dir, pin, up, .. } => {
                if std::mem::take(up) {
                    let _ = Command::new("umount").arg(&*pin).output();
                    let _ = Command::new("umount").arg(&*dir).output();
                }
            }
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.release();
    }
}

/// `holder MODE NETNS`, and the number it prints once it holds the namespace.
fn spawn_holder(mode: &str, netns: &Path) -> (Child, u64) {
    let mut child = Command::new(holder_bin())
        .arg(mode)
        .arg(netns)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn holder");
    let mut line = String::new();
    let read = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    let n = read
        .ok()
        .and_then(|_| line.trim().strip_prefix("ready ")?.parse().ok());
    match n {
        Some(n) => (child, n),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("holder {mode} did not get ready: {line:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// one case
// ---------------------------------------------------------------------------------------

/// Failed checks of one case, said as they happen and all reported at the end of a step.
struct Verdicts {
    tag: String,
    failed: Vec<String>,
}

impl Verdicts {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let what = what();
            eprintln!("{}: FAILED: {what}", self.tag);
            self.failed.push(what);
        }
    }

    /// After a step that reads only: says how it went, and goes on.
    fn said(&self, step: &str) {
        let n = self.failed.len();
        eprintln!(
            "{}: {step}: {}",
            self.tag,
            if n == 0 { "ok" } else { "FAILED" }
        );
    }

    /// After a step that may replay: stops the case when a check has failed, since what
    /// follows would judge what a wrong replay left behind.
    fn end_of_step(&self, step: &str) {
        assert!(
            self.failed.is_empty(),
            "{}: {} check(s) failed by the end of {step}:\n- {}",
            self.tag,
            self.failed.len(),
            self.failed.join("\n- ")
        );
        eprintln!("{}: {step}: ok", self.tag);
    }
}

/// A pod of the case's own network: its two interfaces, each an address and the host end
/// of a veth on the bridge.
struct Pod {
    ip: [String; 2],
    veth: [String; 2],
}

/// The fixture with a bridge and a subnet of the case's own (`[cni-ledger, bridge]`).
fn fixture(kind: Kind, mode: Mode) -> Fixture {
    let mut f = Fixture::with_spec(ChainSpec {
        portmap: false,
        ..ChainSpec::full()
    });
    f.bridge = format!(
        "clho{}{}x{}",
        kind.name(),
        mode.index(),
        std::process::id() % 100_000
    );
    assert!(f.bridge.len() <= 15, "{}", f.bridge);
    f.subnet_prefix = format!("10.77.{}", kind.index() * 2 + mode.index());
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
    f
}

/// The host end of the veth a bridge result made (the interface with no sandbox).
fn host_veth(result: &Value, bridge: &str) -> String {
    result["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i.get("sandbox").is_none() && i["name"] != json!(bridge))
        .and_then(|i| i["name"].as_str())
        .unwrap_or_else(|| panic!("no host veth in {result:#}"))
        .to_string()
}

/// Where `IF_CACHED`'s libcni cache entry waits for the adopt step, so that neither
/// libcni's GC nor the agent's own adoption meets it before.
fn cached_aside(f: &Fixture) -> PathBuf {
    f.tmp.path().join("cache-entry-aside")
}

/// ADDs the pod's two interfaces: `IF_CACHED` with the ledger out of the chain (libcni's
/// cache entry rewritten as libcni 1.2 and later write it, with its netns, and put aside
/// until the adopt step), then `IF_RECORDED` through the whole chain.
fn add_pod(f: &mut Fixture, ns: &Netns) -> Pod {
    let without = json!({
        "cniVersion": "1.0.0",
        "name": f.network,
        "plugins": [f.bridge_entry()],
    });
    f.write_conflist(&without);
    let cached = f
        .add(CID, IF_CACHED, Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD {IF_CACHED}: {e}"));
    let cache = f.cache_result_path(CID, IF_CACHED);
    let mut entry: Value = serde_json::from_slice(&fs::read(&cache).unwrap()).unwrap();
    entry["netns"] = json!(ns.path_str());
    fs::write(cached_aside(f), serde_json::to_vec(&entry).unwrap()).unwrap();
    fs::remove_file(&cache).unwrap();
    let spec = f.spec.clone();
    f.write_conflist(&f.conflist(&spec));
    let recorded = f
        .add(CID, IF_RECORDED, Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD {IF_RECORDED}: {e}\nlog:\n{}", f.log()));
    assert!(f.record_path(CID, IF_RECORDED).exists(), "ADD not recorded");
    assert!(
        !f.record_path(CID, IF_CACHED).exists(),
        "the ledger was in the chain"
    );
    Pod {
        ip: [first_ip(&recorded), first_ip(&cached)],
        veth: [
            host_veth(&recorded, &f.bridge),
            host_veth(&cached, &f.bridge),
        ],
    }
}

struct Case {
    // Dropped first: the mount pin lives in the fixture's temp dir.
    holder: Holder,
    f: Fixture,
    mode: Mode,
    pod: Pod,
    v: Verdicts,
}

impl Case {
    /// The pod made, held, and its path removed: only the holder keeps its namespace.
    fn new(kind: Kind, mode: Mode) -> Case {
        let mut f = fixture(kind, mode);
        // Built before the holder starts: a first build may take long.
        let _ = driver13();
        if kind != Kind::Fd {
            let _ = holder_bin();
        }
        let mut ns = Netns::with_prefix("clho");
        let pod = add_pod(&mut f, &ns);
        let holder = Holder::start(kind, f.tmp.path(), &ns.path());
        ns.delete();
        assert!(!ns.path().exists(), "{} still there", ns.path_str());
        let c = Case {
            holder,
            f,
            mode,
            pod,
            v: Verdicts {
                tag: format!("{kind:?}/{mode:?}"),
                failed: Vec::new(),
            },
        };
        // Only the holder keeps the pod now; it is alive.
        if let Some(addr) = c.eth0_in_pod() {
            assert_eq!(addr.as_ref(), Some(&c.pod.ip[0]), "eth0 in the pod");
        }
        for veth in &c.pod.veth {
            assert!(c.on_bridge().contains(veth), "{veth} gone with the path");
        }
        c
    }

    /// `cni-ledger ARGS --ledger-dir LEDGER` in the host namespace, in the case's mode.
    fn ledger(&self, args: &[&str]) -> Command {
        let mut c = self.f.ledger_cmd(args);
        self.mode.apply(&mut c);
        c
    }

    /// `gc --json --grace 0` as `Fixture::gc` runs it; its report.
    fn gc(&self) -> Value {
        let cache = self.f.cache_dir.display().to_string();
        let out = self
            .ledger(&[
                "gc",
                "--json",
                "--yield-max",
                "0",
                "--cni-cache-dir",
                &cache,
                "--grace",
                "0",
            ])
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("gc printed no JSON ({e}): {}", describe(&out)))
    }

    fn list_row(&self, ifname: &str) -> Option<Value> {
        let out = self.ledger(&["list", "--json"]).output().unwrap();
        assert!(out.status.success(), "list: {}", describe(&out));
        let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        rows.into_iter()
            .find(|r| r["containerId"] == json!(CID) && r["ifname"] == json!(ifname))
    }

    /// The links on the case's bridge.
    fn on_bridge(&self) -> Vec<String> {
        let out =
            run_ok(
                self.f
                    .host
                    .cmd("ip")
                    .args(["-j", "link", "show", "master", &self.f.bridge]),
            );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(json!([]));
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|l| l["ifname"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// eth0's IPv4 address in the pod: None where the holder gives no way in, Some(None)
    /// when the pod has no such address (or no eth0).
    fn eth0_in_pod(&self) -> Option<Option<String>> {
        let mut c = self
            .holder
            .in_pod(&["ip", "-j", "-4", "addr", "show", "dev", "eth0"])?;
        let out = c.stdin(Stdio::null()).output().unwrap();
        if !out.status.success() {
            return Some(None);
        }
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(json!([]));
        Some(v[0]["addr_info"][0]["local"].as_str().map(str::to_string))
    }

    /// Everything of the pod still there after `step`. `adopted`: whether `adopt` made
    /// a record of the cached interface, which then must stay too.
    fn kept(&mut self, step: &str, adopted: bool) {
        let leases = self.f.ipam_addresses();
        let bridge = self.on_bridge();
        let pod_addr = self.eth0_in_pod();
        let recorded = self.f.record_path(CID, IF_RECORDED).exists();
        let cached_recorded = self.f.record_path(CID, IF_CACHED).exists();
        let log = self.f.log();
        let v = &mut self.v;
        v.check(recorded, || {
            format!("{step}: removed the record of {CID}/{IF_RECORDED}")
        });
        v.check(!adopted || cached_recorded, || {
            format!("{step}: removed the adopted record of {CID}/{IF_CACHED}")
        });
        for (ip, ifname) in self.pod.ip.iter().zip([IF_RECORDED, IF_CACHED]) {
            v.check(leases.contains(ip), || {
                format!("{step}: freed {ifname}'s address {ip} (leases {leases:?})\nlog:\n{log}")
            });
        }
        for veth in &self.pod.veth {
            v.check(bridge.contains(veth), || {
                format!("{step}: took {veth} off the bridge ({bridge:?})")
            });
        }
        if let Some(addr) = pod_addr {
            let want = &self.pod.ip[0];
            v.check(addr.as_ref() == Some(want), || {
                format!("{step}: eth0 in the pod has {addr:?}, not {want}")
            });
        }
    }

    /// list: live, held, by something.
    fn judge_list(&mut self) {
        let row = self.list_row(IF_RECORDED);
        let v = &mut self.v;
        match row {
            None => v.check(false, || format!("list: no row of {CID}/{IF_RECORDED}")),
            Some(row) => {
                let row = brief(&row);
                v.check(row["state"] == json!("live"), || {
                    format!("list: state not live: {row}")
                });
                v.check(row["identity"] == json!("held"), || {
                    format!("list: identity not held: {row}")
                });
                v.check(
                    row["heldBy"].as_str().is_some_and(|s| !s.is_empty()),
                    || format!("list: no heldBy: {row}"),
                );
            }
        }
        self.v.said("list");
    }

    /// gc --grace 0: replays nothing, reports the pod held.
    fn judge_gc(&mut self, step: &str, adopted: bool) {
        let full = self.gc();
        let report = brief_report(&full);
        let v = &mut self.v;
        v.check(report["summary"]["replayed"] == json!(0), || {
            format!("{step}: replayed: {report}")
        });
        v.check(report["summary"]["stale"] == json!(0), || {
            format!("{step}: {} stale", report["summary"]["stale"])
        });
        let held = full["held"].as_array().is_some_and(|h| {
            h.iter()
                .any(|r| r["containerId"] == json!(CID) && r["ifname"] == json!(IF_RECORDED))
        });
        v.check(held, || {
            format!("{step}: {CID} not in the report's held list")
        });
        self.kept(step, adopted);
        self.v.end_of_step(step);
    }

    /// The runtime's GC through libcni v1.3's GCNetworkList, its valid list naming both
    /// of the pod's attachments (libcni itself DELs a cached attachment the list leaves
    /// out, and the runtime knows both). Debian's bridge predates GC and fails the call
    /// with its own error; what counts is what the ledger's GC did.
    fn judge_gc_verb(&mut self) {
        let mut doc: Value = serde_json::from_slice(&self.f.conflist_bytes()).unwrap();
        doc["cniVersion"] = json!("1.1.0");
        self.f.write_conflist(&doc);
        let mut gc = self.f.host.cmd(driver13());
        gc.arg("gc")
            .arg("--conf-dir")
            .arg(&self.f.conf_dir)
            .args(["--net", &self.f.network, "--timeout", "30"])
            .args(["--valid", &format!("{CID}/{IF_RECORDED}")])
            .args(["--valid", &format!("{CID}/{IF_CACHED}")])
            .arg("--cni-path")
            .arg(self.f.cni_path())
            .arg("--cache-dir")
            .arg(&self.f.cache_dir)
            .stdin(Stdio::null());
        self.mode.apply(&mut gc);
        let out = gc.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        self.v
            .check(!err.contains("failed to GC plugin cni-ledger"), || {
                format!("GC verb: the ledger's GC failed: {}", describe(&out))
            });
        self.v.check(!self.f.log().contains("replaying DEL"), || {
            format!("GC verb: replayed a DEL:\n{}", self.f.log())
        });
        let spec = self.f.spec.clone();
        self.f.write_conflist(&self.f.conflist(&spec));
        self.kept("the GC verb", false);
        self.v.end_of_step("the GC verb");
    }

    /// adopt over libcni's cache: the cached interface's entry is adopted live or left
    /// alone, never stale; the recorded interface's (its chain held the ledger) is not
    /// adopted and its record not touched. Returns whether it adopted the cached one.
    fn judge_adopt(&mut self) -> bool {
        fs::rename(
            cached_aside(&self.f),
            self.f.cache_result_path(CID, IF_CACHED),
        )
        .unwrap();
        let before = fs::read(self.f.record_path(CID, IF_RECORDED)).unwrap();
        let cache = self.f.cache_dir.display().to_string();
        let conf = self.f.conf_dir.display().to_string();
        let cni_path = self.f.cni_path();
        let out = self
            .ledger(&[
                "adopt",
                "--json",
                "--cni-cache-dir",
                &cache,
                "--conf-dir",
                &conf,
                "--cni-path",
                &cni_path,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "adopt: {}", describe(&out));
        let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
        let find = |ifname: &str| {
            rep["adopted"].as_array().and_then(|a| {
                a.iter()
                    .find(|e| e["containerId"] == json!(CID) && e["ifname"] == json!(ifname))
                    .cloned()
            })
        };
        let v = &mut self.v;
        v.check(find(IF_RECORDED).is_none(), || {
            format!("adopt: adopted the recorded {IF_RECORDED}: {rep:#}")
        });
        v.check(
            fs::read(self.f.record_path(CID, IF_RECORDED)).ok() == Some(before),
            || format!("adopt: changed the record of {IF_RECORDED}"),
        );
        let adopted = find(IF_CACHED);
        if let Some(a) = &adopted {
            v.check(a["state"] == json!("live"), || {
                format!("adopt: adopted {CID}/{IF_CACHED} as {}", brief(a))
            });
        }
        eprintln!(
            "{}: adopt {}",
            v.tag,
            match &adopted {
                Some(a) => format!("adopted {IF_CACHED} ({})", a["state"]),
                None => format!("left {IF_CACHED} alone"),
            }
        );
        // Adopted, it is the next gc's to judge.
        let adopted = self.f.record_path(CID, IF_CACHED).exists();
        self.kept("adopt", adopted);
        self.v.end_of_step("adopt");
        adopted
    }

    /// The agent (its adoption, which finds nothing to adopt yet, and two gc runs a
    /// second apart) keeps it all.
    fn judge_agent(&mut self) {
        let wrapper = self.f.tmp.path().join("cni-ledger-agent");
        let env = match self.mode {
            Mode::Handles => format!("-u {NO_HANDLES}"),
            Mode::Search => format!("{NO_HANDLES}=1"),
        };
        fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nexec env {env} {} \"$@\"\n",
                ledger_bin().display()
            ),
        )
        .unwrap();
        set_mode(&wrapper, 0o755);
        let bin = preinstalled_bin(&self.f);
        let mut args = dir_args(
            &bin,
            &self.f.conf_dir,
            &self.f.ledger_dir,
            &self.f.cache_dir,
        );
        for a in [
            "--gc-interval",
            "1",
            "--grace",
            "0",
            "--yield-max",
            "0",
            "--no-tail",
        ] {
            args.push(a.to_string());
        }
        let log = self.f.tmp.path().join("agent.log");
        let mut agent = Agent::start(&wrapper, &args, &log, Some(self.f.host.name()));
        let ran = wait_for(Duration::from_secs(15), || {
            sample(&agent.metrics(), "cni_ledger_gc_runs_total{result=\"ok\"}").unwrap_or(0.0)
                >= 2.0
        });
        assert!(
            ran.is_some(),
            "the agent's gc never ran twice:\n{}",
            agent.log_text()
        );
        assert_eq!(agent.stop(10).code(), Some(0), "{}", agent.log_text());
        let text = agent.log_text();
        self.v.check(!text.contains("replaying DEL"), || {
            format!("agent: replayed a DEL:\n{text}")
        });
        self.kept("the agent", false);
        self.v.end_of_step("the agent");
    }

    /// The control: the holder gone, the namespace dies (the kernel takes the veths with
    /// it) and gc replays DEL for the pod and frees its address.
    fn control(&mut self, adopted: bool) {
        self.holder.release();
        let veth = self.pod.veth[0].clone();
        wait_for(Duration::from_secs(10), || {
            !self.on_bridge().contains(&veth)
        })
        .unwrap_or_else(|| panic!("the pod's namespace outlived its holder"));
        let report = self.gc();
        let want = if adopted { 2 } else { 1 };
        assert_eq!(report["summary"]["replayed"], json!(want), "{report:#}");
        assert!(!self.f.record_path(CID, IF_RECORDED).exists(), "{report:#}");
        let leases = self.f.ipam_addresses();
        assert!(!leases.contains(&self.pod.ip[0]), "{leases:?}");
        if adopted {
            assert!(!leases.contains(&self.pod.ip[1]), "{leases:?}");
        }
    }
}

/// The fields of a list row or an adopted entry that say how it was judged.
fn brief(row: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for k in ["ifname", "state", "reason", "identity", "heldBy"] {
        if let Some(v) = row.get(k) {
            out.insert(k.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// A gc report's summary, held list and each record's verdict and action.
fn brief_report(report: &Value) -> Value {
    let records: Vec<Value> = report["records"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|r| {
                    json!({"ifname": r["ifname"], "reason": r["reason"],
                        "identity": r["identity"], "action": r["action"],
                        "replayNetns": r["replayNetns"]})
                })
                .collect()
        })
        .unwrap_or_default();
    json!({"summary": report["summary"], "held": report["held"], "records": records})
}

fn run(kind: Kind, mode: Mode) {
    let mut c = Case::new(kind, mode);
    c.judge_list();
    c.judge_gc("gc", false);
    c.judge_gc_verb();
    c.judge_agent();
    let adopted = c.judge_adopt();
    c.judge_gc("gc after adopt", adopted);
    c.control(adopted);
}
