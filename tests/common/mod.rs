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
//! All of this needs root. Each root test starts with `require_root!()`, which skips it
//! (one line per binary on stderr) for a normal user, and fails it instead under CI;
//! `require_root()` inside the harness panics should a test lack that line.
#![allow(dead_code)]

pub mod inproc;
pub mod records;
pub mod root;

// Unused in the binaries that need no root, like the rest of the harness.
#[allow(unused_imports)]
pub(crate) use root::require_root;

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
// root, binaries
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

/// The source tree (the tests read its deploy/ and scripts/, and tools under target/).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A tool scripts/test.sh fetches or makes under the tree (`made_by` says how).
pub fn tool(path: &str, made_by: &str) -> PathBuf {
    let p = repo().join(path);
    assert!(
        p.exists(),
        "{} missing: run scripts/test.sh ({made_by})",
        p.display()
    );
    p
}

/// A program of target/test-venv, the Python venv scripts/test.sh makes.
pub fn venv_bin(name: &str) -> PathBuf {
    tool(
        &format!("target/test-venv/bin/{name}"),
        "it makes target/test-venv with kubernetes-validate and PyYAML",
    )
}

/// The ingress a `portMappings` runtime arg asks for: `host_port` to the pod's 80/tcp.
pub fn port_mappings(host_port: u16) -> Value {
    json!({"portMappings": [{"hostPort": host_port, "containerPort": 80, "protocol": "tcp"}]})
}

/// The cni-ledger binary under test.
pub fn ledger_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cni-ledger"))
}

fn target_dir() -> PathBuf {
    match option_env!("CARGO_TARGET_TMPDIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
    }
}

/// Builds the libcni driver (tests/driver/) once per test binary and returns
/// its path: Debian's golang-go and golang-github-appc-cni-dev (libcni 1.1).
pub fn driver() -> PathBuf {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let go = std::env::var_os("GO").unwrap_or_else(|| "go".into());
            build_driver(
                "cni-driver",
                Path::new("/usr/share/gocode"),
                &go,
                None,
                None,
            )
        })
        .clone()
}

/// The same driver built on libcni v1.3 (drop-ins, `loadOnlyInlinedPlugins`, and with
/// the tag `cni13`, its `gc` command on `GCNetworkList`): Debian
/// unstable's golang-github-appc-cni-dev and, since bookworm's Go cannot build it,
/// unstable's Go 1.27, both unpacked under target/ by scripts/fetch-unstable.sh (as
/// scripts/test.sh does; a no-op once fetched) and never installed.
pub fn driver13() -> PathBuf {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let cni = root.join("target/libcni-1.3");
            let go = root.join("target/go-1.27");
            for (pkg, dest) in [
                ("golang-github-appc-cni-dev", &cni),
                ("golang-1.27-go", &go),
                ("golang-1.27-src", &go),
            ] {
                run_ok(
                    Command::new("bash")
                        .arg(root.join("scripts/fetch-unstable.sh"))
                        .arg(pkg)
                        .arg(dest),
                );
            }
            let goroot = go.join("usr/lib/go-1.27");
            build_driver(
                "cni-driver-1.3",
                &cni.join("usr/share/gocode"),
                goroot.join("bin/go").as_os_str(),
                Some(&goroot),
                Some("cni13"),
            )
        })
        .clone()
}

/// Builds the package in tests/driver/ in GOPATH mode against the libcni under `gopath`
/// (with the build tags `tags`, which select code needing a newer libcni), to a
/// private temp name then renamed, so test binaries running in parallel never see a
/// half-written executable.
fn build_driver(
    name: &str,
    gopath: &Path,
    go: &OsStr,
    goroot: Option<&Path>,
    tags: Option<&str>,
) -> PathBuf {
    let dir = target_dir();
    fs::create_dir_all(&dir).expect("create target dir");
    let out = dir.join(name);
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let mut cmd = Command::new(go);
    cmd.arg("build");
    if let Some(tags) = tags {
        cmd.arg("-tags").arg(tags);
    }
    // The package, not main.go alone: the other files of the directory hold the
    // per-libcni parts, chosen by the build tags.
    cmd.arg("-o")
        .arg(&tmp)
        .arg("./tests/driver")
        .env("GO111MODULE", "off")
        .env("GOPATH", gopath)
        .env("GOFLAGS", "")
        .env("GOCACHE", dir.join("go-build-cache"))
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if let Some(root) = goroot {
        // Never a newer toolchain fetched from the network.
        cmd.env("GOROOT", root).env("GOTOOLCHAIN", "local");
    }
    let res = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {go:?} (install golang-go): {e}"));
    if !res.status.success() {
        let _ = fs::remove_file(&tmp);
        panic!(
            "building the libcni driver {name} failed (needs golang-go and \
             golang-github-appc-cni-dev):\n{}{}",
            String::from_utf8_lossy(&res.stdout),
            String::from_utf8_lossy(&res.stderr)
        );
    }
    fs::rename(&tmp, &out).expect("rename driver into place");
    out
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

pub fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

// ---------------------------------------------------------------------------------------
// network namespaces
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

/// A named network namespace (`ip netns add`), deleted on drop if still present.
pub struct Netns {
    name: String,
    deleted: bool,
}

impl Netns {
    /// A new namespace named `cl-<pid>-<n>` (short: ip-netns names become mount paths).
    pub fn new() -> Netns {
        Self::with_prefix("cl")
    }

    pub fn with_prefix(prefix: &str) -> Netns {
        let name = format!("{prefix}-{}-{}", std::process::id(), next_id());
        Self::create(&name);
        Netns {
            name,
            deleted: false,
        }
    }

    fn create(name: &str) {
        let out = Command::new("ip")
            .args(["netns", "add", name])
            .output()
            .expect("run ip");
        if !out.status.success() {
            // A leftover from a killed run with a recycled pid: remove and retry once.
            let _ = Command::new("ip").args(["netns", "del", name]).output();
            run_ok(Command::new("ip").args(["netns", "add", name]));
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.name))
    }

    pub fn path_str(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Deletes the namespace now (as a reboot or a runtime losing it would).
    pub fn delete(&mut self) {
        if !self.deleted {
            run_ok(Command::new("ip").args(["netns", "del", &self.name]));
            self.deleted = true;
        }
    }

    /// Deletes the namespace and creates a new, different one at the same path.
    /// The old namespace is kept alive (an open fd) until the new one exists, so the
    /// kernel cannot hand the new namespace the freed inode number of the old one.
    pub fn replace(&mut self) {
        let old = fs::File::open(self.path()).expect("open old netns");
        run_ok(Command::new("ip").args(["netns", "del", &self.name]));
        Self::create(&self.name);
        self.deleted = false;
        drop(old);
    }

    /// (st_dev, st_ino) of the nsfs file, as the ledger records it.
    pub fn identity(&self) -> (u64, u64) {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(self.path()).expect("stat netns");
        (m.dev(), m.ino())
    }

    /// Runs a command inside this namespace (`ip netns exec`).
    pub fn exec<S: AsRef<OsStr>>(&self, prog: S) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(prog);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if !self.deleted && Path::new(&format!("/run/netns/{}", self.name)).exists() {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.name])
                .output();
        }
    }
}

/// The test's own stand-in for the host network namespace. The driver (libcni and the
/// plugins it runs) and `cni-ledger gc` run inside it, so bridges, veth peers and
/// iptables rules never touch the real host.
pub struct TestHost {
    ns: Netns,
}

impl TestHost {
    pub fn new() -> TestHost {
        let ns = Netns::with_prefix("clh");
        run_ok(ns.exec("ip").args(["link", "set", "lo", "up"]));
        TestHost { ns }
    }

    pub fn name(&self) -> &str {
        self.ns.name()
    }

    /// `ip netns exec <host> <prog>`
    pub fn cmd<S: AsRef<OsStr>>(&self, prog: S) -> Command {
        self.ns.exec(prog)
    }

    /// `iptables-save` inside the host namespace.
    /// `iptables-save -t nat` without its `# Generated/Completed on <time>` comments, so
    /// two dumps of the same ruleset compare equal.
    pub fn iptables_save(&self) -> String {
        let out = run_ok(self.cmd("iptables-save").arg("-t").arg("nat"));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect()
    }

    /// Lines of the nat table that mention the container (portmap's comment names it).
    pub fn nat_lines_for(&self, cid: &str) -> Vec<String> {
        self.iptables_save()
            .lines()
            .filter(|l| l.contains(&format!(r#"id: \"{cid}\""#)))
            .map(str::to_string)
            .collect()
    }

    /// `iptables-save` of every table inside the host namespace.
    pub fn iptables_save_all(&self) -> String {
        let out = run_ok(&mut self.cmd("iptables-save"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether a link of that name exists inside the host namespace.
    pub fn has_link(&self, name: &str) -> bool {
        self.cmd("ip")
            .args(["link", "show", "dev", name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }
}

// ---------------------------------------------------------------------------------------
// fixture
// ---------------------------------------------------------------------------------------

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

    /// `cni-ledger gc --json --cni-cache-dir <cache> <args...>` in the host namespace.
    pub fn gc(&self, args: &[&str]) -> (Output, Option<Value>) {
        let cache = self.cache_dir.to_string_lossy().into_owned();
        let mut all = vec!["gc", "--json", "--cni-cache-dir", cache.as_str()];
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

/// Which containerd a test runs: the config format and plugin names differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerdVersion {
    /// Debian bookworm's containerd 1.6 (config `version = 2`, one CRI plugin).
    V1_6,
    /// Debian unstable's containerd 2.x (config `version = 3`, CRI split in runtime and
    /// images plugins).
    V2,
}

/// A config.toml for a containerd of the test's own: root, state and sockets under
/// `dir`, gRPC at `address`, the CRI plugin's CNI dirs as given, in `version`'s format.
pub fn containerd_config(
    version: ContainerdVersion,
    dir: &Path,
    address: &str,
    bin_dir: &Path,
    conf_dir: &Path,
    sandbox_image: &str,
) -> String {
    let d = dir.display();
    let bin = bin_dir.display();
    let conf = conf_dir.display();
    let common = format!(
        r#"root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{address}"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = "{d}/debug.sock"
"#
    );
    // restrict_oom_score_adj: never below containerd's own OOM score. Lowering it needs
    // CAP_SYS_RESOURCE, which a CI machine (itself a container) may not have.
    match version {
        ContainerdVersion::V1_6 => format!(
            r#"version = 2
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
{common}[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
"#
        ),
        // NRI is off: it would listen at the machine's /var/run/nri/nri.sock.
        ContainerdVersion::V2 => format!(
            r#"version = 3
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.nri.v1.nri"]
{common}[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{sandbox_image}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{conf}"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#
        ),
    }
}
