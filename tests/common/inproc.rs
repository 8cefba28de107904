//! The plugin in-process, for the no-root tier (tests/inprocess.rs): `World` is one
//! network's ledger and conf dir in a `tempfile` dir; each call runs
//! `cni_ledger::plugin::run_with` with the env and stdin given and returns the exit
//! status and what was printed. Records are read back and their checksum verified
//! here, independently of the product's decoder.

use serde_json::{json, Value};
use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::rc::Rc;

/// What one run of the plugin answered.
#[derive(Debug, Default)]
pub struct Answer {
    pub status: i32,
    pub out: String,
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}, stdout {:?}", self.status, self.out)
    }
}

impl Answer {
    /// The one JSON line the answer must be, and nothing else.
    pub fn json(&self) -> Value {
        assert!(
            self.out.ends_with('\n') && self.out.lines().count() == 1,
            "stdout must be exactly one JSON line: {self}"
        );
        serde_json::from_str(&self.out)
            .unwrap_or_else(|e| panic!("stdout is no JSON ({e}): {self}"))
    }

    /// Success with nothing on stdout, as DEL, CHECK, STATUS and GC answer.
    pub fn assert_quiet_success(&self) {
        assert!(
            self.status == 0 && self.out.is_empty(),
            "expected exit 0 and empty stdout: {self}"
        );
    }
}

/// Asserts that `a` is one CNI error object with `code`, in the spec's shape: exit
/// status 1, `cniVersion`, `code`, a non-empty `msg` and, only when there is something
/// to say, a non-empty `details`; no other key. Returns it.
pub fn cni_error(a: &Answer, code: u64) -> Value {
    assert_eq!(a.status, 1, "an error exits 1: {a}");
    let v = a.json();
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {a}"));
    assert_eq!(v["code"].as_u64(), Some(code), "{a}");
    assert!(v["cniVersion"].is_string(), "{a}");
    assert!(v["msg"].as_str().is_some_and(|m| !m.is_empty()), "{a}");
    if let Some(d) = obj.get("details") {
        assert!(d.as_str().is_some_and(|d| !d.is_empty()), "details: {a}");
    }
    for k in obj.keys() {
        assert!(
            ["cniVersion", "code", "msg", "details"].contains(&k.as_str()),
            "unexpected key {k}: {a}"
        );
    }
    v
}

/// Debian's host-local: a real plugin that needs no root (it only writes its dataDir).
pub fn host_local_bin() -> PathBuf {
    Path::new(super::CNI_PLUGIN_DIR).join("host-local")
}

/// Lets gc trust a ledger this process's user owns: it refuses any other owner than
/// root, and the tier runs as whoever runs `cargo test` (test builds only).
fn trust_own_ledgers() {
    #[cfg(feature = "testing")]
    cni_ledger::faults::trust_ledger_owner(nix::unistd::geteuid().as_raw());
}

/// One network's ledger, conf dir and host-local dataDir under a temp dir (shared by
/// the worlds of other networks made with `other_network`).
pub struct World {
    pub dir: Rc<tempfile::TempDir>,
    pub ledger: PathBuf,
    pub conf_dir: PathBuf,
    pub ipam_dir: PathBuf,
    pub network: String,
}

impl World {
    pub fn new() -> World {
        trust_own_ledgers();
        let dir = tempfile::Builder::new()
            .prefix("cl-inproc-")
            .tempdir()
            .expect("create a temp dir");
        Self::in_dir(Rc::new(dir), "pods")
    }

    /// Another network on the same ledger and conf dir.
    pub fn new_network_in(w: &World, network: &str) -> World {
        Self::in_dir(w.dir.clone(), network)
    }

    fn in_dir(dir: Rc<tempfile::TempDir>, network: &str) -> World {
        let conf_dir = dir.path().join("net.d");
        fs::create_dir_all(&conf_dir).unwrap();
        World {
            ledger: dir.path().join("ledger"),
            ipam_dir: dir.path().join("ipam"),
            conf_dir,
            network: network.to_string(),
            dir,
        }
    }

    /// The ledger's entry as the runtime sends it: name and cniVersion set.
    pub fn conf(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "name": self.network,
            "type": "cni-ledger",
            "ledgerDir": self.ledger,
            "confDir": self.conf_dir,
        })
    }

    pub fn cni_path(&self) -> String {
        super::CNI_PLUGIN_DIR.to_string()
    }

    /// The env of an attachment's command.
    pub fn env(&self, cmd: &str, cid: &str, ifname: &str, netns: &str) -> Vec<(String, String)> {
        [
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", ifname),
            ("CNI_PATH", &self.cni_path()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    pub fn call(&self, env: &[(&str, &str)], stdin: &[u8]) -> Answer {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        run(&env, stdin)
    }

    pub fn call_owned(&self, env: &[(String, String)], stdin: &[u8]) -> Answer {
        run(&env.iter().cloned().collect(), stdin)
    }

    /// `cmd` for `<cid>/eth0`, its netns a path where nothing is.
    pub fn verb(&self, cmd: &str, cid: &str, conf: &Value) -> Answer {
        let netns = self.dir.path().join("no-netns").display().to_string();
        self.call_owned(
            &self.env(cmd, cid, "eth0", &netns),
            conf.to_string().as_bytes(),
        )
    }

    pub fn add(&self, cid: &str, conf: &Value) -> Answer {
        self.verb("ADD", cid, conf)
    }

    pub fn del(&self, cid: &str) -> Answer {
        self.verb("DEL", cid, &self.conf("1.0.0"))
    }

    /// The GC verb (1.1.0) with `list` as `cni.dev/valid-attachments`.
    pub fn gc(&self, list: Value) -> Answer {
        self.gc_with("cni.dev/valid-attachments", list)
    }

    pub fn gc_with(&self, key: &str, list: Value) -> Answer {
        let mut conf = self.conf("1.1.0");
        conf[key] = list;
        self.call(&[("CNI_COMMAND", "GC")], conf.to_string().as_bytes())
    }

    /// Writes `<network>.conflist` (1.0.0, what the plugins of bookworm speak):
    /// the ledger first, then `plugins`. Returns its path.
    pub fn write_conflist(&self, plugins: &[Value]) -> PathBuf {
        let mut list = vec![json!({
            "type": "cni-ledger",
            "ledgerDir": self.ledger,
            "confDir": self.conf_dir,
        })];
        list.extend(plugins.iter().cloned());
        let conf = json!({"cniVersion": "1.0.0", "name": self.network, "plugins": list});
        let path = self.conf_dir.join(format!("{}.conflist", self.network));
        fs::write(&path, serde_json::to_vec_pretty(&conf).unwrap()).unwrap();
        path
    }

    pub fn host_local_entry(&self, subnet: &str) -> Value {
        json!({
            "type": "host-local",
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": subnet}]],
                "dataDir": self.ipam_dir,
            }
        })
    }

    /// ADD through the conflist as libcni runs it: the ledger (first) in-process, then
    /// each other plugin's binary with the previous result. Returns host-local's address.
    pub fn add_through_chain(&self, cid: &str, netns: &str) -> String {
        let path = self.conf_dir.join(format!("{}.conflist", self.network));
        let list: Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
        let mut prev: Option<Value> = None;
        for plugin in list["plugins"].as_array().unwrap() {
            let mut conf = plugin.clone();
            conf["name"] = list["name"].clone();
            conf["cniVersion"] = list["cniVersion"].clone();
            if let Some(p) = &prev {
                conf["prevResult"] = p.clone();
            }
            let env = self.env("ADD", cid, "eth0", netns);
            let out = if plugin["type"] == "cni-ledger" {
                let a = self.call_owned(&env, conf.to_string().as_bytes());
                assert_eq!(a.status, 0, "ledger ADD {cid}: {a}");
                a.out
            } else {
                let bin = Path::new(&self.cni_path()).join(plugin["type"].as_str().unwrap());
                let mut cmd = Command::new(&bin);
                cmd.env_clear().envs(env);
                let o = super::run_with_stdin(cmd, conf.to_string().as_bytes());
                assert!(
                    o.status.success(),
                    "{} ADD {cid}: {}",
                    bin.display(),
                    super::describe(&o)
                );
                String::from_utf8(o.stdout).unwrap()
            };
            prev = Some(serde_json::from_str(&out).unwrap());
        }
        let result = prev.unwrap();
        let addr = result["ips"][0]["address"]
            .as_str()
            .unwrap_or_else(|| panic!("no address in {result}"));
        addr.split('/').next().unwrap().to_string()
    }

    /// The addresses host-local holds reserved in this network.
    pub fn reserved_ips(&self) -> Vec<String> {
        let dir = self.ipam_dir.join(&self.network);
        let mut ips: Vec<String> = super::list_dir(&dir)
            .into_iter()
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect();
        ips.sort();
        ips
    }

    pub fn record_file(&self, cid: &str, ifname: &str) -> PathBuf {
        self.ledger
            .join("records")
            .join(format!("{}:{cid}:{ifname}.json", self.network))
    }

    /// The record of `<cid>/<ifname>`, None when there is no file. Panics unless the
    /// file is a format-1 envelope whose sha256 matches the record's exact bytes.
    pub fn record(&self, cid: &str, ifname: &str) -> Option<Value> {
        match fs::read(self.record_file(cid, ifname)) {
            Ok(b) => Some(super::records::decode_record(&b).unwrap_or_else(|e| {
                panic!(
                    "record {cid}/{ifname}: {e}: {}",
                    String::from_utf8_lossy(&b)
                )
            })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => panic!("read record {cid}/{ifname}: {e}"),
        }
    }

    /// Changes one character inside the record (still valid JSON): its checksum fails.
    pub fn damage(&self, cid: &str, ifname: &str) {
        let path = self.record_file(cid, ifname);
        let text = fs::read_to_string(&path).unwrap();
        let needle = format!("\"containerId\":\"{cid}\"");
        assert!(text.contains(&needle), "{text}");
        fs::write(
            &path,
            text.replace(&needle, &format!("\"containerId\":\"{cid}x\"")),
        )
        .unwrap();
    }

    /// The file names in `<ledger>/quarantine`.
    pub fn quarantined(&self) -> Vec<String> {
        super::list_dir(&self.ledger.join("quarantine"))
    }
}

fn run(env: &HashMap<String, String>, stdin: &[u8]) -> Answer {
    let getenv = |k: &str| env.get(k).cloned();
    let mut out = Vec::new();
    let status = cni_ledger::plugin::run_with(&getenv, &mut &stdin[..], &mut out);
    Answer {
        status,
        out: String::from_utf8(out).expect("stdout is UTF-8"),
    }
}

/// A process standing in for a pod: its network namespace (the test's own, which a
/// normal user may look at) at `/proc/<pid>/ns/net`. Killed on drop.
pub struct Pod {
    child: Child,
}

impl Pod {
    pub fn spawn() -> Pod {
        let child = Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("spawn sleep");
        Pod { child }
    }

    pub fn netns(&self) -> String {
        format!("/proc/{}/ns/net", self.child.id())
    }

    /// The device and inode of the namespace file.
    pub fn ns_dev_ino(&self) -> (u64, u64) {
        super::records::identity(&self.netns())
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Seconds since the epoch of an RFC 3339 UTC time (`YYYY-MM-DDTHH:MM:SS[.f]Z`).
pub fn parse_rfc3339(s: &str) -> i64 {
    let bad = format!("not RFC 3339 UTC: {s:?}");
    let s = s.strip_suffix('Z').expect(&bad);
    let (date, time) = s.split_once('T').expect(&bad);
    let num = |t: &str| t.parse::<i64>().expect(&bad);
    let d: Vec<i64> = date.split('-').map(num).collect();
    let time = time.split('.').next().unwrap();
    let t: Vec<i64> = time.split(':').map(num).collect();
    let (y, m, day) = (d[0], d[1], d[2]);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + t[0] * 3_600 + t[1] * 60 + t[2]
}
