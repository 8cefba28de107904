//! Network namespaces of the test's own: `Netns` (`ip netns add`) and `TestHost`, the
//! private "host" namespace where a test's bridges, veths and iptables rules live.

use super::*;

/// Waits, up to 3 s, while the kernel still reopens the namespace `id` after its last
/// holder let go: its teardown takes a few ms more (longer under load), and until then
/// the kernel rightly calls it held, so gc keeps its record for one more run. Tests that
/// expect a deleted namespace to be gone now wait that out; a namespace something still
/// holds costs the 3 s.
pub fn settle(id: Option<cni_ledger::sandbox::NsId>) {
    let Some(id) = id else { return };
    let node = cni_ledger::sandbox::holders::NodeIndex::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while node.find(&id).is_some() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
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

    /// Deletes the namespace now (as a reboot or a runtime losing it would), and waits
    /// out the kernel's teardown of it when nothing else holds it.
    pub fn delete(&mut self) {
        if !self.deleted {
            let id = self.ns_id();
            run_ok(Command::new("ip").args(["netns", "del", &self.name]));
            self.deleted = true;
            settle(id);
        }
    }

    /// The namespace's identity as the ledger records it, while its path shows it.
    fn ns_id(&self) -> Option<cni_ledger::sandbox::NsId> {
        match cni_ledger::sandbox::probe(&self.path_str()) {
            cni_ledger::sandbox::Probe::Namespace(id) => Some(id),
            _ => None,
        }
    }

    /// Deletes the namespace and creates a new, different one at the same path.
    /// The old namespace is kept alive (an open fd) until the new one exists, so the
    /// kernel cannot hand the new namespace the freed inode number of the old one.
    pub fn replace(&mut self) {
        let id = self.ns_id();
        let old = fs::File::open(self.path()).expect("open old netns");
        run_ok(Command::new("ip").args(["netns", "del", &self.name]));
        Self::create(&self.name);
        self.deleted = false;
        drop(old);
        settle(id);
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
