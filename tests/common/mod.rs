//! Shared harness for cni-ledger's integration tests.
//!
//! Everything runs against real parts (docs/DESIGN.md §9): network namespaces made with
//! `ip netns add`, the plugins of Debian's `containernetworking-plugins` in /usr/lib/cni,
//! and libcni itself through the small Go driver in `tests/driver/`.
//!
//! Isolation: every test gets its own "host" network namespace (`TestHost`). Bridges,
//! veths and portmap's iptables rules are created inside it, never in the real host's
//! network namespace; the namespace dies with the test. Files live in a per-test temp
//! dir (`TempDir`), removed on drop (set `CL_KEEP_TMP=1` to keep it for debugging).
//!
//! All of this needs root (only `inproc`, the no-root tier's, does not). Each root test
//! starts with `require_root!()` (root.rs), which skips it (one line per binary on
//! stderr) for a normal user and fails it instead under CI; `require_root()` inside the
//! harness panics should a test lack that line.
//!
//! Here: `Fixture` and its chain, temp dirs, running processes and plugins. Beside it:
//! `tools` (cni-ledger, the libcni drivers, fetched tools), `netns` (`Netns`,
//! `TestHost`), `containerd` (its config), `records` (reading ledger files), `root`,
//! `inproc` (the plugin in-process over a temp ledger). See tests/README.md.
#![allow(dead_code)]

pub mod containerd;
pub mod inproc;
pub mod manifests;
pub mod netns;
pub mod records;
pub mod root;
pub mod slowadd;
pub mod tools;

// One `use common::*` reaches them all; each binary uses some (as with dead_code above).
#[allow(unused_imports)]
pub use containerd::*;
#[allow(unused_imports)]
pub use netns::*;
#[allow(unused_imports)]
pub(crate) use root::{require_root, require_tools};
#[allow(unused_imports)]
pub use tools::*;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use serde_json::{json, Value};

pub const CNI_PLUGIN_DIR: &str = "/usr/lib/cni";
pub const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A process-unique small number, used for names (netns, bridges, subnets, dirs).
pub fn next_id() -> usize {
    COUNTER.fetch_add(1, Ordering::SeqCst)
}

// ---------------------------------------------------------------------------------------
// root (see root.rs for require_root!)
// ---------------------------------------------------------------------------------------

/// Panics with a clear message unless running as root: the backstop inside the root
/// harnesses (`Fixture`, ...) for a test that forgot `require_root!()`.
pub fn require_root() {
    let euid = root::euid();
    if euid != 0 {
        panic!(
            "this test needs root (euid is {euid}): it creates network namespaces, bridges \
             and iptables rules; run scripts/test.sh as root"
        );
    }
}

// ---------------------------------------------------------------------------------------
// temp dir
// ---------------------------------------------------------------------------------------

/// A self-made temporary directory, removed (recursively) on drop.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let base = std::env::temp_dir();
        for _ in 0..100 {
            let path = base.join(format!("cl-{tag}-{}-{}", std::process::id(), next_id()));
            match fs::create_dir(&path) {
                Ok(()) => {
                    set_mode(&path, 0o700);
                    return TempDir { path };
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("create temp dir {}: {e}", path.display()),
            }
        }
        panic!("could not create a temp dir under {}", base.display());
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("CL_KEEP_TMP").is_some() {
            eprintln!("CL_KEEP_TMP: keeping {}", self.path.display());
            return;
        }
        let _ = fs::remove_dir_all(&self.path);
    }
}

pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, path.display()));
}

/// Installs the test plugin `testdata/plugins/<name>` into `dir` (mode 0755).
pub fn install_test_plugin(dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/plugins")
            .join(name),
        &to,
    )
    .unwrap_or_else(|e| panic!("install {name}: {e}"));
    set_mode(&to, 0o755);
    to
}

pub fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

// ---------------------------------------------------------------------------------------
// processes
// ---------------------------------------------------------------------------------------

/// Runs `cmd`; panics with its output unless it succeeds.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

// ---------------------------------------------------------------------------------------
// fixture
// ---------------------------------------------------------------------------------------

/// The ingress a `portMappings` runtime arg asks for: `host_port` to the pod's 80/tcp.
pub fn port_mappings(host_port: u16) -> Value {
    json!({"portMappings": [{"hostPort": host_port, "containerPort": 80, "protocol": "tcp"}]})
}

/// What the fixture's conflist looks like.
#[derive(Clone)]
pub struct ChainSpec {
    /// Include bridge + host-local after the ledger.
    pub bridge: bool,
    /// Include portmap (capabilities portMappings, snat false) after the bridge.
    pub portmap: bool,
    /// Further plugin objects appended at the end of the chain.
    pub extra: Vec<Value>,
    /// Extra keys merged into the ledger's own entry (e.g. onLedgerError).
    pub ledger_opts: serde_json::Map<String, Value>,
    /// cniVersion of the conflist.
    pub cni_version: String,
}

impl Default for ChainSpec {
    fn default() -> Self {
        ChainSpec {
            bridge: true,
            portmap: true,
            extra: Vec::new(),
            ledger_opts: serde_json::Map::new(),
            cni_version: "1.0.0".into(),
        }
    }
}

impl ChainSpec {
    /// `[cni-ledger, bridge+host-local, portmap]`
    pub fn full() -> Self {
        Self::default()
    }

    /// `[cni-ledger]` alone (no capabilities declared: nothing else handles them).
    pub fn ledger_only() -> Self {
        ChainSpec {
            bridge: false,
            portmap: false,
            ..Self::default()
        }
    }

    pub fn with_extra(mut self, plugin: Value) -> Self {
        self.extra.push(plugin);
        self
    }

    pub fn with_ledger_opt(mut self, key: &str, v: Value) -> Self {
        self.ledger_opts.insert(key.to_string(), v);
        self
    }
}

// ---------------------------------------------------------------------------------------
// the base of every test world
// ---------------------------------------------------------------------------------------

/// What every test world has, whether it drives the ledger through libcni and Debian's
/// plugins (`Fixture`) or invokes it directly beside a counting plugin (tests/rel's
/// `World`): a ledger directory and the CLI run on it.
pub trait LedgerHome {
    fn ledger_dir(&self) -> &Path;

    /// `cni-ledger <args...> --ledger-dir <ledger>`, ready to run or to add to.
    fn cli_command(&self, args: &[&str]) -> Command;

    fn records_dir(&self) -> PathBuf {
        self.ledger_dir().join("records")
    }

    fn snapshots_dir(&self) -> PathBuf {
        self.ledger_dir().join("snapshots")
    }

    fn quarantine_dir(&self) -> PathBuf {
        self.ledger_dir().join("quarantine")
    }

    /// `cni-ledger list --json`, parsed; panics (with the output) unless it succeeds.
    fn list_json(&self) -> Vec<Value> {
        let out = self
            .cli_command(&["list", "--json"])
            .output()
            .expect("run cni-ledger");
        assert!(
            out.status.success(),
            "cni-ledger list --json failed: {}",
            describe(&out)
        );
        match serde_json::from_slice::<Value>(&out.stdout) {
            Ok(Value::Array(a)) => a,
            other => panic!(
                "list --json did not print an array ({other:?}): {}",
                describe(&out)
            ),
        }
    }
}

/// The ledger's own conflist entry, as every test world writes it.
pub fn ledger_entry(ledger_dir: &Path, conf_dir: &Path, log_file: &Path) -> Value {
    json!({
        "type": "cni-ledger",
        "ledgerDir": ledger_dir,
        "confDir": conf_dir,
        "logFile": log_file,
        // The tests read what ADD and DEL log; the default (`error`) is quiet.
        "logLevel": "info",
    })
}

impl LedgerHome for Fixture {
    fn ledger_dir(&self) -> &Path {
        &self.ledger_dir
    }

    /// Run inside the fixture's host namespace.
    fn cli_command(&self, args: &[&str]) -> Command {
        self.ledger_cmd(args)
    }
}

/// One test's world: a host namespace, a temp dir with conf dir, ledger dir, libcni
/// cache dir, host-local dataDir, log file and a CNI bin dir holding `cni-ledger`.
pub struct Fixture {
    pub host: TestHost,
    pub tmp: TempDir,
    pub network: String,
    pub conf_dir: PathBuf,
    pub conf_file: PathBuf,
    pub ledger_dir: PathBuf,
    pub cache_dir: PathBuf,
    pub ipam_dir: PathBuf,
    pub bin_dir: PathBuf,
    pub log_file: PathBuf,
    pub bridge: String,
    /// e.g. "198.18.7" — the /24 is `<prefix>.0/24`, gateway `<prefix>.1`.
    pub subnet_prefix: String,
    pub spec: ChainSpec,
    /// The libcni driver the fixture's add/del/check/load run (`driver()` unless set).
    pub driver: PathBuf,
}

impl Fixture {
    /// `[cni-ledger, bridge+host-local, portmap]`
    pub fn new() -> Fixture {
        Self::with_spec(ChainSpec::full())
    }

    pub fn ledger_only() -> Fixture {
        Self::with_spec(ChainSpec::ledger_only())
    }

    pub fn with_spec(spec: ChainSpec) -> Fixture {
        require_root();
        let _ = driver(); // build early: a build failure should be the first message
        let host = TestHost::new();
        let tmp = TempDir::new("t");
        let n = next_id();
        let pid = std::process::id();
        let root = tmp.path().to_path_buf();
        let conf_dir = root.join("net.d");
        let cache_dir = root.join("cni-cache");
        let ipam_dir = root.join("ipam");
        let bin_dir = root.join("bin");
        for d in [&conf_dir, &cache_dir, &ipam_dir, &bin_dir] {
            fs::create_dir_all(d).unwrap();
        }
        std::os::unix::fs::symlink(ledger_bin(), bin_dir.join("cni-ledger"))
            .expect("symlink cni-ledger into the bin dir");
        // Unique per test (even across binaries) though each lives in its own host netns.
        let bridge = format!("clb{}x{}", pid % 1_000_000, n % 1000);
        assert!(bridge.len() <= 15, "bridge name too long: {bridge}");
        let idx = (pid as usize * 7 + n) % 512; // 512 /24s in 198.18.0.0/15
        let subnet_prefix = format!("{}.{}.{}", 198, 18 + idx / 256, idx % 256);
        let mut f = Fixture {
            host,
            network: "cltest".to_string(),
            conf_file: conf_dir.join("10-cltest.conflist"),
            ledger_dir: root.join("ledger"),
            log_file: root.join("ledger.log"),
            conf_dir,
            cache_dir,
            ipam_dir,
            bin_dir,
            bridge,
            subnet_prefix,
            spec: spec.clone(),
            driver: driver(),
            tmp,
        };
        f.write_conflist(&f.conflist(&spec));
        f
    }

    pub fn subnet(&self) -> String {
        format!("{}.0/24", self.subnet_prefix)
    }

    pub fn gateway(&self) -> String {
        format!("{}.1", self.subnet_prefix)
    }

    /// The ledger's own conflist entry (as written into the conflist).
    pub fn ledger_entry(&self, spec: &ChainSpec) -> Value {
        let mut e = ledger_entry(&self.ledger_dir, &self.conf_dir, &self.log_file);
        if spec.portmap {
            e["capabilities"] = json!({"portMappings": true});
        }
        for (k, v) in &spec.ledger_opts {
            e[k] = v.clone();
        }
        e
    }

    /// Installs the test plugin `testdata/plugins/<name>` into the CNI bin dir.
    pub fn install_test_plugin(&self, name: &str) -> PathBuf {
        install_test_plugin(&self.bin_dir, name)
    }

    /// The tail entry as `inject` writes it for the fixture's head.
    pub fn tail_entry(&self) -> Value {
        json!({
            "type": "cni-ledger",
            "role": "tail",
            "ledgerDir": self.ledger_dir,
            "logFile": self.log_file,
            "logLevel": "info",
        })
    }

    pub fn bridge_entry(&self) -> Value {
        json!({
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": true,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": self.ipam_dir,
                "ranges": [[{"subnet": self.subnet(), "gateway": self.gateway()}]],
            }
        })
    }

    pub fn portmap_entry() -> Value {
        json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": false})
    }

    pub fn conflist(&self, spec: &ChainSpec) -> Value {
        let mut plugins = vec![self.ledger_entry(spec)];
        if spec.bridge {
            plugins.push(self.bridge_entry());
        }
        if spec.portmap {
            plugins.push(Self::portmap_entry());
        }
        plugins.extend(spec.extra.iter().cloned());
        json!({"cniVersion": spec.cni_version, "name": self.network, "plugins": plugins})
    }

    /// (Re)writes the fixture's conflist file.
    pub fn write_conflist(&mut self, v: &Value) {
        let bytes = serde_json::to_vec_pretty(v).unwrap();
        fs::write(&self.conf_file, bytes).unwrap();
    }

    /// Sets a key of the ledger's conflist entry and rewrites the conflist.
    pub fn set_ledger_opt(&mut self, key: &str, v: Value) {
        self.spec.ledger_opts.insert(key.to_string(), v);
        let spec = self.spec.clone();
        self.write_conflist(&self.conflist(&spec));
    }

    /// Points the ledger at another directory and rewrites the conflist.
    pub fn set_ledger_dir(&mut self, dir: &Path) {
        self.ledger_dir = dir.to_path_buf();
        let spec = self.spec.clone();
        self.write_conflist(&self.conflist(&spec));
    }

    pub fn conflist_bytes(&self) -> Vec<u8> {
        fs::read(&self.conf_file).unwrap()
    }

    /// `CNI_PATH` for the driver: the dir holding `cni-ledger`, then /usr/lib/cni.
    pub fn cni_path(&self) -> String {
        format!("{}:{}", self.bin_dir.display(), CNI_PLUGIN_DIR)
    }

    /// Expected record file for an attachment of this fixture's network.
    pub fn record_path(&self, cid: &str, ifname: &str) -> PathBuf {
        self.records_dir()
            .join(format!("{}:{cid}:{ifname}.json", self.network))
    }

    /// Names of the files in records/ (empty if the dir does not exist).
    pub fn record_files(&self) -> Vec<String> {
        list_dir(&self.records_dir())
            .into_iter()
            .filter(|n| !n.starts_with('.'))
            .collect()
    }

    /// Names of every file in records/, hidden temp files included.
    pub fn record_dir_entries(&self) -> Vec<String> {
        list_dir(&self.records_dir())
    }

    pub fn quarantine_files(&self) -> Vec<String> {
        list_dir(&self.quarantine_dir())
    }

    /// libcni's cached result file for an attachment.
    pub fn cache_result_path(&self, cid: &str, ifname: &str) -> PathBuf {
        self.cache_dir
            .join("results")
            .join(format!("{}-{cid}-{ifname}", self.network))
    }

    /// host-local's per-network dir in the fixture's dataDir.
    pub fn ipam_net_dir(&self) -> PathBuf {
        self.ipam_dir.join(&self.network)
    }

    /// Addresses host-local has reserved (files named like IPs).
    pub fn ipam_addresses(&self) -> Vec<String> {
        list_dir(&self.ipam_net_dir())
            .into_iter()
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect()
    }

    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_file).unwrap_or_default()
    }

    // --- libcni through the driver --------------------------------------------------

    /// A driver command (run inside the host namespace) for `verb`.
    pub fn driver_cmd(
        &self,
        verb: &str,
        cid: &str,
        ifname: &str,
        netns: Option<&str>,
        cap_args: Option<&Value>,
    ) -> Command {
        let mut c = self.host.cmd(&self.driver);
        c.arg(verb)
            .arg("--conf-dir")
            .arg(&self.conf_dir)
            .arg("--net")
            .arg(&self.network)
            .arg("--cid")
            .arg(cid)
            .arg("--ifname")
            .arg(ifname)
            .arg("--cni-path")
            .arg(self.cni_path())
            .arg("--cache-dir")
            .arg(&self.cache_dir);
        if let Some(ns) = netns {
            c.arg("--netns").arg(ns);
        }
        if let Some(ca) = cap_args {
            c.arg("--cap-args").arg(ca.to_string());
        }
        c.stdin(Stdio::null());
        c
    }

    fn driver_result(verb: &str, mut c: Command) -> Result<Output, String> {
        let out = c
            .output()
            .unwrap_or_else(|e| panic!("run driver {verb}: {e}"));
        if out.status.success() {
            Ok(out)
        } else {
            Err(format!(
                "driver {verb} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            ))
        }
    }

    /// libcni AddNetworkList; Ok(result JSON) or Err(libcni's error text).
    pub fn add(
        &self,
        cid: &str,
        ifname: &str,
        netns: Option<&str>,
        cap_args: Option<&Value>,
    ) -> Result<Value, String> {
        let out = Self::driver_result("add", self.driver_cmd("add", cid, ifname, netns, cap_args))?;
        serde_json::from_slice(&out.stdout).map_err(|e| {
            format!(
                "driver add printed no JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// libcni DelNetworkList.
    pub fn del(
        &self,
        cid: &str,
        ifname: &str,
        netns: Option<&str>,
        cap_args: Option<&Value>,
    ) -> Result<(), String> {
        Self::driver_result("del", self.driver_cmd("del", cid, ifname, netns, cap_args)).map(|_| ())
    }

    /// libcni CheckNetworkList.
    pub fn check(
        &self,
        cid: &str,
        ifname: &str,
        netns: Option<&str>,
        cap_args: Option<&Value>,
    ) -> Result<(), String> {
        Self::driver_result(
            "check",
            self.driver_cmd("check", cid, ifname, netns, cap_args),
        )
        .map(|_| ())
    }

    /// libcni LoadConfList: the plugin types of the fixture's network.
    pub fn load(&self) -> Result<Vec<String>, String> {
        let out = Command::new(&self.driver)
            .args(["load", "--conf-dir"])
            .arg(&self.conf_dir)
            .arg("--net")
            .arg(&self.network)
            .output()
            .expect("run driver load");
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
    }

    // --- the CLI ------------------------------------------------------------------------

    /// `cni-ledger <args...> --ledger-dir <ledger>`, run inside the host namespace.
    pub fn ledger(&self, args: &[&str]) -> Output {
        let mut c = self.ledger_cmd(args);
        c.output().expect("run cni-ledger")
    }

    /// The same as a Command, to add env or more arguments.
    pub fn ledger_cmd(&self, args: &[&str]) -> Command {
        let mut c = self.host.cmd(ledger_bin());
        c.args(args).arg("--ledger-dir").arg(&self.ledger_dir);
        c.env_remove("CNI_COMMAND").stdin(Stdio::null());
        c
    }

    /// `cni-ledger gc --json --yield-max 0 --cni-cache-dir <cache> <args...>` in the host
    /// namespace. Without the wait for ADDs in flight: a test's gc right after its own ADD
    /// would otherwise wait for it (5 s for a chain without a tail); the wait is
    /// tests/recovery.rs's, with its own gc command line.
    pub fn gc(&self, args: &[&str]) -> (Output, Option<Value>) {
        let cache = self.cache_dir.to_string_lossy().into_owned();
        let mut all = vec![
            "gc",
            "--json",
            "--yield-max",
            "0",
            "--cni-cache-dir",
            cache.as_str(),
        ];
        all.extend_from_slice(args);
        let out = self.ledger(&all);
        let v = serde_json::from_slice(&out.stdout).ok();
        (out, v)
    }

    /// The list row of one attachment.
    pub fn list_row(&self, cid: &str, ifname: &str) -> Option<Value> {
        self.list_json()
            .into_iter()
            .find(|r| r["containerId"] == json!(cid) && r["ifname"] == json!(ifname))
    }

    // --- the plugin face, invoked directly ----------------------------------------------

    /// A plugin stdin document for the ledger's own entry, as libcni would build it.
    pub fn plugin_stdin(&self, cni_version: &str) -> Value {
        let mut v = self.ledger_entry(&self.spec);
        v["cniVersion"] = json!(cni_version);
        v["name"] = json!(self.network);
        v
    }

    /// The CNI env for a verb (CNI_PATH = the fixture's path).
    pub fn plugin_env(
        &self,
        command: &str,
        cid: &str,
        ifname: &str,
        netns: Option<&str>,
    ) -> Vec<(String, String)> {
        let mut env = vec![
            ("CNI_COMMAND".to_string(), command.to_string()),
            ("CNI_CONTAINERID".to_string(), cid.to_string()),
            ("CNI_IFNAME".to_string(), ifname.to_string()),
            ("CNI_PATH".to_string(), self.cni_path()),
        ];
        if let Some(ns) = netns {
            env.push(("CNI_NETNS".to_string(), ns.to_string()));
        }
        env
    }

    /// The env of a STATUS call: CNI_COMMAND and CNI_PATH only.
    pub fn status_env(&self) -> Vec<(String, String)> {
        vec![
            ("CNI_COMMAND".to_string(), "STATUS".to_string()),
            ("CNI_PATH".to_string(), self.cni_path()),
        ]
    }

    /// Runs the binary as a plugin: the given env only (plus PATH), `stdin` piped in.
    pub fn run_plugin(&self, env: &[(String, String)], stdin: &[u8]) -> Output {
        run_plugin(env, stdin)
    }
}

/// Runs cni-ledger as a plugin with exactly `env` (plus PATH) and `stdin`.
pub fn run_plugin(env: &[(String, String)], stdin: &[u8]) -> Output {
    let mut c = Command::new(ledger_bin());
    c.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    run_with_stdin(c, stdin)
}

/// Runs cni-ledger as a plugin in a private mount namespace in which `dir` has been
/// bind-mounted read-only onto itself. The mount vanishes with the process: nothing to
/// clean up, nothing visible to the rest of the machine.
pub fn run_plugin_with_ro_dir(dir: &Path, env: &[(String, String)], stdin: &[u8]) -> Output {
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@""#)
        .arg("sh")
        .arg(dir)
        .arg(ledger_bin())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    run_with_stdin(c, stdin)
}

/// Runs a command with `stdin` written from a thread (a child that exits without
/// reading all of it is fine: the write error is ignored).
pub fn run_with_stdin(mut c: Command, stdin: &[u8]) -> Output {
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    let mut pipe = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&data);
        drop(pipe);
    });
    let out = child.wait_with_output().expect("wait for child");
    let _ = writer.join();
    out
}

/// Every regular file (or symlink) below `dir`, as paths relative to it.
pub fn walk_files(dir: &Path) -> Vec<String> {
    fn rec(base: &Path, d: &Path, out: &mut Vec<String>) {
        let Ok(rd) = fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            let ft = match e.file_type() {
                Ok(t) => t,
                Err(_) => continue,
            };
            if ft.is_dir() {
                rec(base, &p, out);
            } else {
                out.push(
                    p.strip_prefix(base)
                        .unwrap_or(&p)
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    let mut v = Vec::new();
    rec(dir, dir, &mut v);
    v.sort();
    v
}

/// The running kernel's boot ID.
pub fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_string()
}

/// Parses a plugin's stdout as a CNI error and returns its code (panics otherwise).
pub fn cni_error_code(out: &Output) -> u64 {
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not a CNI error JSON ({e}): {}", describe(out)));
    v["code"]
        .as_u64()
        .unwrap_or_else(|| panic!("CNI error without numeric code: {}", describe(out)))
}

/// Human-readable dump of a process output, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn list_dir(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// sha256 hex of a file, via coreutils' sha256sum (tests use std + serde_json only).
pub fn sha256_hex(path: &Path) -> String {
    let out = run_ok(Command::new("sha256sum").arg(path));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Count of values per key, handy for summarising list output.
pub fn count_by(rows: &[Value], key: &str) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in rows {
        *m.entry(r[key].as_str().unwrap_or("null").to_string())
            .or_insert(0) += 1;
    }
    m
}

/// The address (without prefix length) of a CNI result's first IP.
pub fn first_ip(result: &Value) -> String {
    let cidr = result["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no ips[0].address in {result:#}"));
    cidr.split('/').next().unwrap_or(cidr).to_string()
}

/// Waits up to `secs` for a process to be gone. A zombie counts as gone: it was killed
/// and holds nothing; an orphan's zombie waits for its reaper, which on the test machine
/// is a PID 1 that reaps only every ~1.8 s.
pub fn process_gone(pid: u32, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return true;
        };
        // The state is the field after the ")" closing the command name.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if matches!(state, Some('Z' | 'X')) {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
