//! A real containerd driven over CRI as kubelet drives it, for the tests that need pods
//! made by a runtime: Debian bookworm's containerd 1.6 or, unpacked under target/ (never
//! installed), Debian unstable's containerd 2.x, with its own root, state dir, socket and
//! config, a sandbox image built here (a static `pause` compiled with gcc, imported with
//! `ctr images import` under the configured `sandbox_image`: no registry is reachable),
//! and mount namespaces of the test's (`PrivateRun`) where node paths such as
//! `/run/containerd` or `/etc/cni/net.d` are fresh tmpfs, so the machine's stay untouched.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::common::*;
use cni_ledger::cri::{self, api::PodSandboxMetadata};
use serde_json::json;

pub use crate::common::ContainerdVersion;

pub mod node;

pub const SANDBOX_IMAGE: &str = "registry.invalid/cni-ledger-test/pause:1";
const RUN: &str = "/runtime.v1.RuntimeService/RunPodSandbox";
const STOP: &str = "/runtime.v1.RuntimeService/StopPodSandbox";
const REMOVE: &str = "/runtime.v1.RuntimeService/RemovePodSandbox";

// The messages kubelet sends, with the field numbers of runtime.v1's api.proto.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PortMapping {
    #[prost(int32, tag = "1")]
    pub protocol: i32,
    #[prost(int32, tag = "2")]
    pub container_port: i32,
    #[prost(int32, tag = "3")]
    pub host_port: i32,
    #[prost(string, tag = "4")]
    pub host_ip: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(message, repeated, tag = "5")]
    pub port_mappings: Vec<PortMapping>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

/// StopPodSandboxRequest and RemovePodSandboxRequest: `string pod_sandbox_id = 1`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SandboxIdRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// The dir holding `version`'s containerd, its runc shim and ctr; None: the system's,
/// on PATH. containerd 2.x is Debian unstable's .deb unpacked into target/containerd-2 by
/// scripts/fetch-unstable.sh (as scripts/test.sh does; a no-op once fetched): its Go
/// binaries need only libc and a runc, bookworm's.
pub fn containerd_bin_dir(version: ContainerdVersion) -> Option<PathBuf> {
    static V2: OnceLock<PathBuf> = OnceLock::new();
    match version {
        ContainerdVersion::V1_6 => None,
        ContainerdVersion::V2 => Some(
            V2.get_or_init(|| {
                let root = Path::new(env!("CARGO_MANIFEST_DIR"));
                let dest = root.join("target/containerd-2");
                run_ok(
                    Command::new("bash")
                        .arg(root.join("scripts/fetch-unstable.sh"))
                        .arg("containerd")
                        .arg(&dest),
                );
                dest.join("usr/bin")
            })
            .clone(),
        ),
    }
}

/// A static pause binary in a one-layer image, as a `docker save` archive.
pub fn build_pause_image(dir: &Path) -> PathBuf {
    let img = dir.join("img");
    fs::create_dir_all(img.join("rootfs")).unwrap();
    let src = img.join("pause.c");
    fs::write(
        &src,
        "#include <signal.h>\n#include <unistd.h>\n\
         static void bye(int s) { (void)s; _exit(0); }\n\
         int main(void) { signal(SIGTERM, bye); signal(SIGINT, bye); for (;;) pause(); }\n",
    )
    .unwrap();
    run_ok(
        Command::new("gcc")
            .args(["-static", "-Os", "-s", "-o"])
            .arg(img.join("rootfs/pause"))
            .arg(&src),
    );
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(img.join("rootfs"))
            .arg("-cf")
            .arg(img.join("layer.tar"))
            .arg("pause"),
    );
    let diff_id = sha256_hex(&img.join("layer.tar"));
    let config = json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    });
    fs::write(img.join("config.json"), config.to_string()).unwrap();
    let manifest =
        json!([{"Config": "config.json", "RepoTags": [SANDBOX_IMAGE], "Layers": ["layer.tar"]}]);
    fs::write(img.join("manifest.json"), manifest.to_string()).unwrap();
    let tarball = dir.join("pause.tar");
    run_ok(
        Command::new("tar")
            .arg("-C")
            .arg(&img)
            .arg("-cf")
            .arg(&tarball)
            .args(["manifest.json", "config.json", "layer.tar"]),
    );
    tarball
}

/// A mount namespace of the test's where `/run/containerd` is a fresh tmpfs, so a
/// containerd can listen at its default socket without touching the machine's. It
/// lives as long as its holder process (`sleep`).
pub struct PrivateRun {
    holder: Child,
    /// The machine's paths it mounts over.
    dirs: Vec<PathBuf>,
}

/// Per machine path a `PrivateRun` of this process mounts over: how many live ones do,
/// and whether one made the path (it was missing). A made path is removed by the last
/// one out only: removing a directory detaches every mount on it in every mount
/// namespace (Linux ≥ 3.18), so an earlier removal would take another test's tmpfs.
static OVER: Mutex<Option<HashMap<PathBuf, (usize, bool)>>> = Mutex::new(None);

/// Whether any process of the machine's (another test binary's, say) has a mount at
/// `dir` in its mount namespace.
fn mounted_anywhere(dir: &Path) -> bool {
    let Ok(procs) = fs::read_dir("/proc") else {
        return true;
    };
    procs.flatten().any(|e| {
        fs::read_to_string(e.path().join("mountinfo"))
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(4).map(Path::new) == Some(dir))
    })
}

impl PrivateRun {
    /// `/run/containerd` private: a containerd there listens at its default socket.
    pub fn new() -> PrivateRun {
        Self::over(&["/run/containerd"])
    }

    /// A fresh tmpfs over each of `dirs` (made on the machine first when missing, and
    /// removed again after the last of this process's `PrivateRun`s over it), in a
    /// mount namespace of its own.
    pub fn over(dirs: &[&str]) -> PrivateRun {
        let mut over = OVER.lock().unwrap_or_else(|e| e.into_inner());
        for d in dirs {
            let e = over
                .get_or_insert_with(HashMap::new)
                .entry(PathBuf::from(d))
                .or_insert((0, false));
            if !Path::new(d).exists() {
                fs::create_dir_all(d).unwrap();
                e.1 = true;
            }
            e.0 += 1;
        }
        drop(over);
        let mounts: Vec<String> = dirs
            .iter()
            .map(|d| format!("mount -t tmpfs -o mode=0755 cl-test {d}"))
            .collect();
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "{} && echo up && exec sleep infinity",
                mounts.join(" && ")
            ))
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare");
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "up", "private mounts not made: {dirs:?}");
        PrivateRun {
            holder,
            dirs: dirs.iter().map(PathBuf::from).collect(),
        }
    }

    /// Its root as the test reaches it; the node's root for an agent that is given it.
    pub fn root(&self) -> String {
        format!("/proc/{}/root", self.holder.id())
    }

    pub fn mnt(&self) -> String {
        format!("/proc/{}/ns/mnt", self.holder.id())
    }

    /// A path in the private mount namespace, as the test (outside it) reaches it.
    pub fn reach(&self, path: &str) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.holder.id())).join(path.trim_start_matches('/'))
    }
}

impl Drop for PrivateRun {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        let mut over = OVER.lock().unwrap_or_else(|e| e.into_inner());
        let Some(over) = over.as_mut() else {
            return;
        };
        for d in self.dirs.iter().rev() {
            let Some(e) = over.get_mut(d) else {
                continue;
            };
            e.0 -= 1;
            if e.0 == 0 {
                // Left in place while a mount of another process is on it.
                if e.1 && !mounted_anywhere(d) {
                    let _ = fs::remove_dir(d);
                }
                over.remove(d);
            }
        }
    }
}

/// The fields of `/proc/<pid>/stat` after the command name (the state first).
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// A process as the test met it: its PID and start time (clock ticks since boot),
/// which a process reusing the PID later does not share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: u32,
    pub start: u64,
}

impl Proc {
    pub fn of(pid: u32) -> Option<Proc> {
        // `starttime` is field 22, the 20th after the command name.
        let start = stat_fields(pid)?.get(19)?.parse().ok()?;
        Some(Proc { pid, start })
    }

    pub fn parent(&self) -> Option<u32> {
        stat_fields(self.pid)?.get(1)?.parse().ok()
    }

    /// Still the process the test met, and not yet exited.
    pub fn alive(&self) -> bool {
        Proc::of(self.pid) == Some(*self) && !process_gone(self.pid, 0)
    }

    /// Its children, from every thread's `/proc/<pid>/task/<tid>/children`; each checked
    /// to have it as its parent once met (its PID was not reused in between).
    pub fn children(&self) -> Vec<Proc> {
        fs::read_dir(format!("/proc/{}/task", self.pid))
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|t| {
                fs::read_to_string(t.path().join("children"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .filter_map(|c| c.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .filter_map(Proc::of)
            .filter(|c| c.parent() == Some(self.pid))
            .collect()
    }
}

/// `roots` still alive and every process descending from them now.
pub fn tree(roots: &[Proc]) -> Vec<Proc> {
    let mut out: Vec<Proc> = Vec::new();
    let mut todo: Vec<Proc> = roots.iter().copied().filter(Proc::alive).collect();
    while let Some(p) = todo.pop() {
        if !out.contains(&p) {
            todo.extend(p.children());
            out.push(p);
        }
    }
    out
}

/// The runtime's processes, killed on drop (containerd's own drop stops only a
/// containerd still running): the ones the test started or met, each with whatever
/// descends from it then. containerd, and per pod its pause process and the shim that
/// is its parent (the shim daemonizes, so it is no child of containerd's). Each is
/// known by PID and start time, never by its namespaces: a namespace's inode is reused
/// once it is gone, and another test's runtime may have it then. The cgroups runc made
/// for pods killed behind containerd's back are removed once empty.
pub struct RuntimeProcs {
    roots: Vec<Proc>,
    cgroups: Vec<PathBuf>,
}

impl RuntimeProcs {
    pub fn new(containerd: u32) -> RuntimeProcs {
        RuntimeProcs {
            roots: Proc::of(containerd).into_iter().collect(),
            cgroups: Vec::new(),
        }
    }

    /// A pod's pause process, its shim (returned), and its cgroups (named by its
    /// sandbox `id`).
    pub fn add_pause(&mut self, pid: u32, id: &str) -> Proc {
        let pause = Proc::of(pid).unwrap_or_else(|| panic!("pause {pid} is gone"));
        let shim = pause.parent().and_then(Proc::of).expect("pause's parent");
        let comm = fs::read_to_string(format!("/proc/{}/comm", shim.pid)).unwrap_or_default();
        assert!(
            comm.starts_with("containerd-shim"),
            "pause's parent: {comm}"
        );
        self.roots.extend([pause, shim]);
        for line in fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .unwrap_or_default()
            .lines()
        {
            let mut f = line.splitn(3, ':').skip(1);
            let (Some(ctrls), Some(path)) = (f.next(), f.next()) else {
                continue;
            };
            if !path.ends_with(id) {
                continue;
            }
            let ctrl = if ctrls.is_empty() {
                "unified"
            } else {
                ctrls.trim_start_matches("name=")
            };
            for root in [format!("/sys/fs/cgroup/{ctrl}"), "/sys/fs/cgroup".into()] {
                let dir = PathBuf::from(format!("{root}{path}"));
                if dir.is_dir() {
                    self.cgroups.push(dir);
                    break;
                }
            }
        }
        shim
    }

    pub fn signal(procs: &[Proc]) {
        for p in procs {
            if p.alive() {
                let _ = Command::new("kill")
                    .args(["-KILL", &p.pid.to_string()])
                    .output();
            }
        }
    }

    /// `procs` and their descendants, waited for.
    pub fn kill(procs: &[Proc]) {
        let all = tree(procs);
        Self::signal(&all);
        for p in &all {
            assert!(process_gone(p.pid, 10), "pid {} did not exit", p.pid);
        }
    }

    /// Another process the test started (containerd started again, a container's
    /// conmon), with whatever descends from it.
    pub fn add(&mut self, pid: u32) {
        self.roots
            .extend(Proc::of(pid).filter(|p| !self.roots.contains(p)));
    }

    /// Those still running of the ones met, and their descendants.
    pub fn alive(&self) -> Vec<Proc> {
        tree(&self.roots)
    }

    /// Every process of the runtime.
    pub fn kill_all(&mut self) {
        Self::kill(&std::mem::take(&mut self.roots));
    }
}

impl Drop for RuntimeProcs {
    fn drop(&mut self) {
        Self::signal(&tree(&self.roots));
        for dir in &self.cgroups {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while dir.exists()
                && fs::remove_dir(dir).is_err()
                && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// containerd running in the test host namespace; stopped by PID on drop.
pub struct Containerd {
    pub dir: PathBuf,
    pub version: ContainerdVersion,
    child: Option<Child>,
    /// Its gRPC socket, as the test reaches it.
    socket: PathBuf,
}

impl Containerd {
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn configure(f: &Fixture) -> PathBuf {
        Self::configure_at(f, None)
    }

    /// containerd 1.6's config; `address`: its gRPC socket (default: in its own dir).
    pub fn configure_at(f: &Fixture, address: Option<&str>) -> PathBuf {
        Self::configure_version(ContainerdVersion::V1_6, f, address)
    }

    /// `version`'s config on the fixture's CNI dirs; `address` as for `configure_at`.
    pub fn configure_version(
        version: ContainerdVersion,
        f: &Fixture,
        address: Option<&str>,
    ) -> PathBuf {
        let dir = f.tmp.path().join("containerd");
        let d = dir.display();
        let address = address.map_or_else(|| format!("{d}/containerd.sock"), String::from);
        Self::configure_dirs_version(version, &dir, &address, &f.bin_dir, &f.conf_dir)
    }

    /// containerd 1.6's config in `dir`, with these CNI bin and conf dirs (as it sees them).
    pub fn configure_dirs(dir: &Path, address: &str, bin_dir: &Path, conf_dir: &Path) -> PathBuf {
        Self::configure_dirs_version(ContainerdVersion::V1_6, dir, address, bin_dir, conf_dir)
    }

    pub fn configure_dirs_version(
        version: ContainerdVersion,
        dir: &Path,
        address: &str,
        bin_dir: &Path,
        conf_dir: &Path,
    ) -> PathBuf {
        fs::create_dir_all(dir).unwrap();
        let config = containerd_config(version, dir, address, bin_dir, conf_dir, SANDBOX_IMAGE);
        fs::write(dir.join("config.toml"), config).unwrap();
        dir.to_path_buf()
    }

    pub fn start(f: &Fixture, dir: &Path) -> Containerd {
        Self::start_in(f, dir, None)
    }

    /// containerd 1.6 started in `private`'s mount namespace, listening at the default
    /// socket there.
    pub fn start_in(f: &Fixture, dir: &Path, private: Option<&PrivateRun>) -> Containerd {
        Self::start_version(ContainerdVersion::V1_6, f, dir, private)
    }

    /// `version`'s containerd on its config in `dir`, as `start_in` starts it.
    pub fn start_version(
        version: ContainerdVersion,
        f: &Fixture,
        dir: &Path,
        private: Option<&PrivateRun>,
    ) -> Containerd {
        Self::launch_version(version, dir, f.host.name(), private, Self::DEFAULT_SOCKET)
    }

    /// Where containerd listens unless configured otherwise.
    pub const DEFAULT_SOCKET: &'static str = "/run/containerd/containerd.sock";

    /// containerd 1.6 started in the network namespace `/run/netns/<netns>` and, when
    /// given, in `private`'s mount namespace, listening at `socket` there (as configured).
    pub fn launch(
        dir: &Path,
        netns: &str,
        private: Option<&PrivateRun>,
        socket: &str,
    ) -> Containerd {
        Self::launch_version(ContainerdVersion::V1_6, dir, netns, private, socket)
    }

    /// `version`'s containerd, as `launch` starts it.
    pub fn launch_version(
        version: ContainerdVersion,
        dir: &Path,
        netns: &str,
        private: Option<&PrivateRun>,
        socket: &str,
    ) -> Containerd {
        Self::launch_with(version, dir, netns, private, socket, false)
    }

    /// `version`'s containerd as a unit with `MountFlags=slave` (or `PrivateMounts`) runs
    /// it: in a mount namespace of its own (`unshare -m --propagation slave`) made inside
    /// `node`'s, so the netns pins it mounts under `/run/netns` are seen by it, its shims
    /// and their children only; the files under them are the node's.
    pub fn launch_own_mounts(
        version: ContainerdVersion,
        dir: &Path,
        netns: &str,
        node: &PrivateRun,
        socket: &str,
    ) -> Containerd {
        Self::launch_with(version, dir, netns, Some(node), socket, true)
    }

    fn launch_with(
        version: ContainerdVersion,
        dir: &Path,
        netns: &str,
        private: Option<&PrivateRun>,
        socket: &str,
        own_mounts: bool,
    ) -> Containerd {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("containerd.log"))
            .unwrap();
        // Only the network namespace is the test host's: `ip netns exec` would also
        // remount /sys and hide the cgroup mounts runc needs. nsenter execs containerd,
        // so the child's PID is containerd's.
        let mut cmd = Command::new("nsenter");
        if let Some(p) = private {
            cmd.arg(format!("--mount={}", p.mnt()));
        }
        let socket = match private {
            Some(p) => p.reach(socket),
            None => dir.join("containerd.sock"),
        };
        let bin_dir = containerd_bin_dir(version);
        if let Some(bin) = &bin_dir {
            // Its own runc shim, which containerd looks up on PATH, not the system's.
            let path = std::env::var("PATH").unwrap_or_default();
            cmd.env("PATH", format!("{}:{path}", bin.display()));
        }
        let containerd =
            bin_dir.map_or_else(|| PathBuf::from("containerd"), |b| b.join("containerd"));
        cmd.arg(format!("--net=/run/netns/{netns}"));
        if own_mounts {
            // unshare execs containerd: the child's PID is still containerd's.
            cmd.args(["unshare", "--mount", "--propagation", "slave"]);
        }
        let child = cmd
            .arg(containerd)
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        let c = Containerd {
            dir: dir.to_path_buf(),
            version,
            child: Some(child),
            socket,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !c.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not come up:\n{}",
                fs::read_to_string(dir.join("containerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        c
    }

    /// containerd's PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The PID of the sandbox's task (its pause process), as `ctr tasks ls` shows it.
    pub fn task_pid(&self, id: &str) -> u32 {
        task_pid_in(&self.ctr(&["tasks", "ls"]), id)
    }

    /// Killed as a crash kills it: its socket stays, and nothing answers there.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Removes the sandbox's state behind the runtime's back (as `crio wipe` does) and
    /// stops containerd: started again, it has forgotten the sandbox, whose namespace stays.
    pub fn forget_and_stop(&mut self, id: &str) {
        let _ = self.ctr(&["tasks", "rm", "-f", id]);
        let out = self.ctr(&["containers", "rm", id]);
        assert!(out.status.success(), "{}", describe(&out));
        self.stop();
    }

    pub fn ctr(&self, args: &[&str]) -> std::process::Output {
        let ctr = containerd_bin_dir(self.version)
            .map_or_else(|| PathBuf::from("ctr"), |b| b.join("ctr"));
        Command::new(ctr)
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .unwrap()
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    pub fn run_sandbox(&self, name: &str, host_port: i32) -> String {
        let req = RunPodSandboxRequest {
            config: Some(PodSandboxConfig {
                metadata: Some(PodSandboxMetadata {
                    name: name.into(),
                    uid: format!("uid-{name}"),
                    namespace: "default".into(),
                    attempt: 0,
                }),
                hostname: name.into(),
                log_directory: self.dir.join("logs").join(name).display().to_string(),
                port_mappings: vec![PortMapping {
                    protocol: 0,
                    container_port: 80,
                    host_port,
                    host_ip: String::new(),
                }],
            }),
            runtime_handler: String::new(),
        };
        let resp: RunPodSandboxResponse = self
            .call(RUN, req)
            .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}\n{}", self.log()));
        resp.pod_sandbox_id
    }

    pub fn stop_and_remove(&self, id: &str) {
        let req = SandboxIdRequest {
            pod_sandbox_id: id.into(),
        };
        let _: Empty = self
            .call(STOP, req.clone())
            .unwrap_or_else(|e| panic!("StopPodSandbox: {e}"));
        let _: Empty = self
            .call(REMOVE, req)
            .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}"));
    }

    /// One CRI call, as kubelet makes it: retried while containerd's CRI plugin, which
    /// finishes starting (recovering its sandboxes) after the socket answers, says it is
    /// not initialized yet, for up to 30 s.
    pub fn call<Req, Resp>(&self, method: &'static str, req: Req) -> Result<Resp, String>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let endpoint = self.endpoint();
            let req = req.clone();
            let answer = cri::block_on(async move {
                let ch = cri::connect(&endpoint, Duration::from_secs(60))
                    .await
                    .map_err(|e| format!("{e:#}"))?;
                cri::unary(ch, method, req)
                    .await
                    .map_err(|s| format!("{}: {}", s.code(), s.message()))
            })
            .unwrap();
            match answer {
                Err(e) if e.contains("not initialized yet") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                answer => return answer,
            }
        }
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // A failed assertion must not leave pause processes and namespaces behind.
        if std::thread::panicking() && self.child.is_some() {
            if let Ok(all) = cri::list_sandboxes(&self.endpoint(), Duration::from_secs(10)) {
                for id in all.keys() {
                    let req = SandboxIdRequest {
                        pod_sandbox_id: id.clone(),
                    };
                    let _: Result<Empty, _> = self.call(STOP, req.clone());
                    let _: Result<Empty, _> = self.call(REMOVE, req);
                }
            }
        }
        self.stop();
    }
}

/// The DaemonSet of deploy/kubernetes/cni-ledger.yaml as JSON (read with the test venv's
/// PyYAML): the tests run the agent with its args, so the two cannot drift.
pub fn daemonset() -> serde_json::Value {
    let manifest = repo().join("deploy/kubernetes/cni-ledger.yaml");
    let out = run_ok(
        Command::new(venv_bin("python3"))
            .args([
                "-c",
                "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
            ])
            .arg(&manifest),
    );
    let docs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    docs.as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet in the manifest")
        .clone()
}

/// The PID of task `id` in the output of `ctr tasks ls`.
pub fn task_pid_in(out: &std::process::Output, id: &str) -> u32 {
    assert!(out.status.success(), "{}", describe(out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&id)).then(|| f.get(1)?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no task {id}: {}", describe(out)))
}
