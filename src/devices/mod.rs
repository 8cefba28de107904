//! Handing devices back to the host at DEL (plugin option `returnDevices`).
//!
//! A device driver (a DRA network driver, an SR-IOV device plugin) may have moved
//! physical NICs, VFs and RDMA devices into the pod's namespace. Some runtimes delete the
//! namespace before the driver's own teardown hook runs, and the kernel then returns a
//! NIC down and renamed, and strands an RDMA device in exclusive mode. The ledger's DEL
//! runs last in the chain while the namespace still exists, so it moves them back here.
//!
//! `select` and `naming` are pure; `link` and `rdma` speak netlink; this module enters
//! the namespace on a thread of its own and keeps what could not be moved (`failure_note`).

pub mod failure_note;
pub mod link;
pub mod naming;
pub mod nl;
pub mod rdma;
pub mod select;
pub mod state;

use crate::ledger::{Key, Ledger};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// The `returnDevices` option when on: extra name patterns beside hardware-backed links.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spec {
    pub names: Vec<String>,
}

/// Parses `returnDevices`: `true`, `false`, or `{"names": ["pattern", ...]}`.
/// Ok(None) means off.
pub fn parse_option(v: &Value) -> Result<Option<Spec>, String> {
    match v {
        Value::Null | Value::Bool(false) => Ok(None),
        Value::Bool(true) => Ok(Some(Spec::default())),
        Value::Object(o) => {
            if let Some(k) = o.keys().find(|k| *k != "names") {
                return Err(format!("returnDevices: unknown key {k:?}"));
            }
            let names = match o.get("names") {
                None => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|p| match p.as_str() {
                        Some(s) if !s.is_empty() && s.len() <= 64 => Ok(s.to_string()),
                        _ => Err(format!(
                            "returnDevices.names: {p} is not a pattern (a string of 1-64 bytes)"
                        )),
                    })
                    .collect::<Result<_, _>>()?,
                Some(other) => {
                    return Err(format!(
                        "returnDevices.names must be an array of patterns, not {other}"
                    ))
                }
            };
            Ok(Some(Spec { names }))
        }
        other => Err(format!(
            "returnDevices must be true, false or {{\"names\": [...]}}, not {other}"
        )),
    }
}

/// The option as the ledger's own entry of a conflist has it (for gc's replay, which
/// skips the ledger in the chain and so does its part here). Bad values count as off:
/// ADD refused them already.
pub fn spec_in_chain(list: &Value, ledger_type: &str) -> Option<Spec> {
    let entry = list
        .get("plugins")?
        .as_array()?
        .iter()
        .find(|p| p.get("type").and_then(Value::as_str) == Some(ledger_type))?;
    parse_option(entry.get("returnDevices")?).ok().flatten()
}

/// What sort of device was handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// A network interface (a NIC, a VF).
    Netdev,
    /// An RDMA device.
    Rdma,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Netdev => "netdev",
            DeviceKind::Rdma => "rdma",
        }
    }
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device put back into the host's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub kind: DeviceKind,
    pub pod_name: String,
    pub host_name: String,
    /// Why it got `host_name` (netdevs only).
    pub source: Option<naming::Source>,
    pub bus_address: Option<String>,
}

/// A device that could not be put back, or a step that failed before any device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub device: String,
    pub bus_address: Option<String>,
    pub error: String,
}

#[derive(Debug, Default)]
pub struct Outcome {
    pub moved: Vec<Moved>,
    pub failures: Vec<Failure>,
    /// What the RDMA side found when it found nothing to move.
    pub rdma_note: Option<String>,
    /// Links whose alias at DEL is not the host name recorded when the chain completed.
    pub mismatches: Vec<Mismatch>,
    /// Virtual links a `names` pattern matched that the tail's note did not record: made
    /// in the namespace after ADD (by the pod), so left there to die with it.
    pub left: Vec<Left>,
}

/// A virtual link left in the pod's namespace: not recorded at ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Left {
    pub pod_name: String,
    pub ifindex: u32,
}

/// A returnable link as recorded when the chain completed (the tail's ADD), before the
/// pod's containers could run, with its host name: what its alias said then (empty: it
/// had no valid alias, and DEL names it neutrally; only virtual links are recorded so).
/// Matched at DEL by bus address, ifindex and the sysfs inode, none of which the pod
/// can change (unlike the link's name and alias), nor choose for a link it makes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Recorded {
    pub pod_name: String,
    pub ifindex: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus_address: Option<String>,
    pub host_name: String,
    /// Absent in notes of older releases (and then not compared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sysfs_ino: Option<u64>,
}

impl Recorded {
    fn is(&self, l: &select::PodLink) -> bool {
        self.ifindex == l.ifindex
            && self.bus_address == l.bus_address
            && self.sysfs_ino.is_none_or(|i| l.sysfs_ino == Some(i))
    }

    /// The recorded host name, if one was (see the struct).
    fn name(&self) -> Option<&str> {
        Some(self.host_name.as_str()).filter(|n| !n.is_empty())
    }
}

/// The recorded names a chain note holds (`chain.devices`); none when it holds none or
/// they do not decode.
pub fn recorded_in(devices: Option<&Value>) -> Vec<Recorded> {
    devices
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// What the tail recorded of the pod's links, as DEL uses it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recording {
    pub links: Vec<Recorded>,
    /// The list is whole (`chain.links`): a virtual link not on it was made after ADD.
    /// False for a note without it (no tail, an older release's, a tail that could not
    /// look): then every link the option selects goes, as before.
    pub whole: bool,
}

impl Recording {
    /// From a record's tail note: `links` when there (a list that does not decode counts
    /// as empty: the tail looked), else the named links of `devices`.
    pub fn of(chain: Option<&crate::ledger::record::ChainNote>) -> Recording {
        match chain.and_then(|c| c.links.as_ref()) {
            Some(v) => Recording {
                links: serde_json::from_value(v.clone()).unwrap_or_default(),
                whole: true,
            },
            None => Recording {
                links: recorded_in(chain.and_then(|c| c.devices.as_ref())),
                whole: false,
            },
        }
    }

    /// The links with a host name: what `chain.devices` holds.
    pub fn named(&self) -> Vec<Recorded> {
        self.links
            .iter()
            .filter(|r| r.name().is_some())
            .cloned()
            .collect()
    }
}

/// A link whose alias at DEL disagrees with its recorded host name: the pod rewrote it
/// (or the driver did after ADD). The alias is not used either way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mismatch {
    pub pod_name: String,
    pub alias: Option<String>,
    pub recorded: String,
}

fn failure(device: &str, bus_address: Option<String>, error: impl std::fmt::Display) -> Failure {
    Failure {
        device: device.to_string(),
        bus_address,
        error: error.to_string(),
    }
}

/// Moves the devices in the namespace at `netns` back to the namespace this process
/// runs in (the host's), if the namespace opened there has the cookie `cookie` (the
/// record's): what is entered is exactly what was checked, however the path changes in
/// between. With a whole `recorded` list, a virtual link goes only if it is on it;
/// otherwise every link `spec` selects goes. Never fails: what goes wrong is in
/// `Outcome::failures`.
pub fn return_devices(netns: &str, cookie: u64, spec: &Spec, recorded: &Recording) -> Outcome {
    let fail = |step: &str, e: &dyn std::fmt::Display| Outcome {
        failures: vec![failure("-", None, format!("{step}: {e}"))],
        ..Outcome::default()
    };
    // The calling thread is in the host's namespace: its handle is where devices go,
    // and a socket made here keeps talking to the host from any thread.
    let host_ns = match File::open("/proc/thread-self/ns/net") {
        Ok(f) => f,
        Err(e) => return fail("opening the host's namespace", &e),
    };
    let host_names = match link::open().and_then(|mut c| link::names(&mut c)) {
        Ok(n) => n,
        Err(e) => return fail("listing the host's links", &e),
    };
    let pod_ns = match File::open(netns) {
        Ok(f) => f,
        Err(e) => return fail(&format!("opening {netns}"), &e),
    };
    match crate::sandbox::identity::netns_cookie(&pod_ns) {
        Ok(c) if c == cookie => {}
        Ok(c) => {
            return fail(
                &format!("{netns} is not the recorded namespace now"),
                &format_args!("cookie {c}, recorded {cookie}; nothing moved"),
            )
        }
        Err(e) => return fail(&format!("reading the cookie of {netns}"), &e),
    }
    let patterns = spec.names.clone();
    let recorded = recorded.clone();
    // setns changes the calling thread's namespace for good, and whatever it runs or
    // spawns later inherits it: so it happens only on this thread, which then ends.
    let worker = std::thread::Builder::new()
        .name("return-devices".into())
        .spawn(move || {
            move_to_host_from_pod_ns(&pod_ns, &host_ns, host_names, &patterns, &recorded)
        });
    match worker {
        Ok(handle) => handle
            .join()
            .unwrap_or_else(|_| fail("device return", &"panicked")),
        Err(e) => fail("starting the namespace thread", &e),
    }
}

/// Enters the namespace `pod_ns` on the calling thread (which must be one of its own,
/// ending after) and mounts a sysfs that shows it.
fn enter(pod_ns: &File) -> Result<(), String> {
    use nix::mount::{mount, MsFlags};
    use nix::sched::{setns, unshare, CloneFlags};
    // /sys/class/net lists the links of the namespace whose process mounted that sysfs,
    // not the caller's: so mount one from inside, in a mount namespace of this thread
    // alone (slave, so nothing propagates to the host). The `device` entry read there is
    // exactly "backed by a device" on every kernel (IFLA_PARENT_DEV_NAME says the same
    // but only from 5.15), and sysfs also gives the bus address and the alias.
    setns(pod_ns, CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("entering the namespace: {e}"))
        .and_then(|()| {
            unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("private mount namespace: {e}"))
        })
        .and_then(|()| {
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_SLAVE,
                None::<&str>,
            )
            .map_err(|e| format!("making mounts private: {e}"))
        })
        .and_then(|()| {
            mount(
                Some("sysfs"),
                "/sys",
                Some("sysfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            )
            .map_err(|e| format!("mounting the namespace's sysfs: {e}"))
        })
}

/// Runs on the dedicated thread: enter the pod's namespace, get a sysfs that shows it,
/// move RDMA devices and then netdevs to `host_ns` (see `return_devices`).
fn move_to_host_from_pod_ns(
    pod_ns: &File,
    host_ns: &File,
    mut taken: HashSet<String>,
    patterns: &[String],
    recorded: &Recording,
) -> Outcome {
    let mut out = Outcome::default();
    if let Err(e) = enter(pod_ns) {
        out.failures.push(failure("-", None, e));
        return out;
    }
    let host_fd = host_ns.as_raw_fd();

    // RDMA first, so that a NIC and its RDMA device are back together.
    return_rdma(&mut out, host_fd);

    let links = match select::scan(Path::new("/sys/class/net")) {
        Ok(l) => l,
        Err(e) => {
            out.failures
                .push(failure("-", None, format!("reading /sys/class/net: {e}")));
            return out;
        }
    };
    if select::select(&links, patterns).is_empty() {
        return out;
    }
    let mut conn = match link::open() {
        Ok(c) => c,
        Err(e) => {
            out.failures.push(failure(
                "-",
                None,
                format!("rtnetlink in the namespace: {e}"),
            ));
            return out;
        }
    };
    let mut links = links;
    fill_perm_macs(&mut conn, &mut links);
    for l in select::select(&links, patterns) {
        let found = recorded.links.iter().find(|r| r.is(l));
        // A virtual link the tail did not record was made after ADD, by the pod: what it
        // does may decide nothing on the host. (A hardware one the kernel would return
        // at the namespace's end anyway.)
        if !l.hardware && recorded.whole && found.is_none() {
            out.left.push(Left {
                pod_name: l.name.clone(),
                ifindex: l.ifindex,
            });
            continue;
        }
        let rec = found.and_then(Recorded::name);
        if let Some(rec) = rec.filter(|r| l.alias.as_deref() != Some(*r)) {
            out.mismatches.push(Mismatch {
                pod_name: l.name.clone(),
                alias: l.alias.clone(),
                recorded: rec.to_string(),
            });
        }
        let (name, source) = naming::choose(l, rec, &taken);
        match link::move_to(&mut conn, l.ifindex, host_fd, &name) {
            Ok(()) => {
                taken.insert(name.clone());
                out.moved.push(Moved {
                    kind: DeviceKind::Netdev,
                    pod_name: l.name.clone(),
                    host_name: name,
                    source: Some(source),
                    bus_address: l.bus_address.clone(),
                });
            }
            Err(e) => {
                // The kernel moves first and renames in the target namespace after: a
                // link gone from here went to the host under its own name.
                let error = if Path::new("/sys/class/net").join(&l.name).exists() {
                    format!("moving to the host as {name}: {e}")
                } else {
                    format!(
                        "moved to the host as {}, but not renamed {name}: {e}",
                        l.name
                    )
                };
                out.failures
                    .push(failure(&l.name, l.bus_address.clone(), error));
            }
        }
    }
    out
}

/// Gives each of `links` its permanent hardware address, as `conn`'s namespace has it.
/// Unreadable counts as none: the link then gets the name after the MAC's (`devN`),
/// which is neutral too.
pub(crate) fn fill_perm_macs(conn: &mut nl::Conn, links: &mut [select::PodLink]) {
    let perm = link::perm_addresses(conn).unwrap_or_default();
    for l in links {
        l.perm_mac = perm.get(&l.ifindex).cloned();
    }
}

/// Moves every RDMA device bound to the thread's namespace (exclusive mode) to `host_fd`.
fn return_rdma(out: &mut Outcome, host_fd: std::os::fd::RawFd) {
    let mut conn = match rdma::open() {
        Ok(Some(c)) => c,
        Ok(None) => {
            out.rdma_note = Some("no RDMA subsystem".into());
            return;
        }
        Err(e) => {
            out.failures
                .push(failure("rdma", None, format!("RDMA netlink: {e}")));
            return;
        }
    };
    let devs = match rdma::bound_devices(&mut conn) {
        Ok(rdma::Found::Devices(devs)) if !devs.is_empty() => devs,
        Ok(rdma::Found::Devices(_)) => {
            out.rdma_note = Some("no RDMA devices in the namespace".into());
            return;
        }
        Ok(rdma::Found::Nothing(why)) => {
            out.rdma_note = Some(why);
            return;
        }
        Err(e) => {
            out.failures
                .push(failure("rdma", None, format!("listing RDMA devices: {e}")));
            return;
        }
    };
    for d in devs {
        let bus = bus_of(&Path::new("/sys/class/infiniband").join(&d.name));
        match rdma::move_to(&mut conn, d.index, host_fd) {
            Ok(()) => out.moved.push(Moved {
                kind: DeviceKind::Rdma,
                host_name: d.name.clone(),
                pod_name: d.name,
                source: None,
                bus_address: bus,
            }),
            Err(e) => out.failures.push(failure(&d.name, bus, e)),
        }
    }
}

fn bus_of(sysfs_dir: &Path) -> Option<String> {
    std::fs::read_link(sysfs_dir.join("device"))
        .ok()
        .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// The tail's part at ADD: the links `spec` would return from the namespace at `netns`
/// and their host names (aliases), read now, when the chain has completed and before
/// the pod's containers run. A hardware link without a valid alias is not recorded (DEL
/// gives it a neutral name); a virtual one is, with an empty host name (DEL returns only
/// the virtual links recorded, and names that one neutrally).
pub fn record_names(netns: &str, spec: &Spec) -> Result<Vec<Recorded>, String> {
    let pod_ns = File::open(netns).map_err(|e| format!("opening {netns}: {e}"))?;
    let patterns = spec.names.clone();
    // Its own thread, for setns (see `return_devices`).
    std::thread::Builder::new()
        .name("record-devices".into())
        .spawn(move || {
            enter(&pod_ns)?;
            let links = select::scan(Path::new("/sys/class/net"))
                .map_err(|e| format!("reading /sys/class/net: {e}"))?;
            Ok(select::select(&links, &patterns)
                .into_iter()
                .filter_map(|l| {
                    let alias = l.alias.as_deref().filter(|a| naming::valid_ifname(a));
                    if alias.is_none() && l.hardware {
                        return None;
                    }
                    Some(Recorded {
                        pod_name: l.name.clone(),
                        ifindex: l.ifindex,
                        bus_address: l.bus_address.clone(),
                        host_name: alias.unwrap_or_default().to_string(),
                        sysfs_ino: l.sysfs_ino,
                    })
                })
                .collect())
        })
        .map_err(|e| format!("starting the namespace thread: {e}"))?
        .join()
        .unwrap_or_else(|_| Err("panicked".into()))
}

/// `returnDevices` as the head's entry of the chain `rec` was recorded with has it (the
/// tail's own entry does not carry the option). None: off, or the snapshot is unusable.
pub fn spec_of_record(ledger: &Ledger, rec: &crate::ledger::Record) -> Option<Spec> {
    let hash = rec.snapshot.as_deref()?;
    // The tail's hot path: most chains do without the option, and for them one read
    // of a small cached file is all it costs (no checksum, no parse).
    let path = ledger.snapshot_path(hash);
    let raw = crate::ledger::fsio::read_nofollow(&path, 4 << 20).ok()?;
    if !raw.windows(13).any(|w| w == b"returnDevices") {
        return None;
    }
    let crate::ledger::Snapshot::Ok(bytes) = ledger.get_snapshot(hash).ok()? else {
        return None;
    };
    let list: Value = serde_json::from_slice(&bytes).ok()?;
    spec_in_chain(&list, &rec.ledger_type)
}

/// DEL's (and gc's replayed DEL's) part: return the devices of the attachment `key`
/// from `netns`, log each, and keep failures where `list` shows them. Never fails.
pub fn at_del(ledger: &Ledger, key: &Key, netns: &str, spec: &Spec, who: &str) {
    // The record is still there (devices go back before it does): its cookie names the
    // one namespace devices may be taken from.
    // The record reads with the tail's note, which holds the names recorded at ADD.
    let (cookie, recording) = match ledger.read(&key.stem()) {
        Ok(Some(crate::ledger::Decoded::Ok(rec))) => (
            rec.netns_id.and_then(|id| id.cookie),
            Recording::of(rec.chain.as_ref()),
        ),
        _ => (None, Recording::default()),
    };
    let out = match cookie {
        Some(cookie) => return_devices(netns, cookie, spec, &recording),
        None => Outcome {
            failures: vec![failure(
                "-",
                None,
                "the record's namespace cookie cannot be read; nothing moved",
            )],
            ..Outcome::default()
        },
    };
    // Back on the host: each netdev gets the MTU and up/down the host had it in when the
    // head's ADD ran (matched by bus address), else stays down as the kernel leaves it.
    let states = state::load(ledger, key);
    let mut out = out;
    for m in &out.moved {
        let was = (m.kind == DeviceKind::Netdev)
            .then(|| {
                states
                    .iter()
                    .find(|s| Some(&s.bus_address) == m.bus_address.as_ref())
            })
            .flatten();
        let how = match was.map(|w| state::restore(&m.host_name, None, w)) {
            Some(Ok(r)) => format!("{}, MTU {}", if r.up { "up" } else { "down" }, r.mtu),
            Some(Err(e)) => {
                out.failures.push(failure(
                    &m.host_name,
                    m.bus_address.clone(),
                    format!("returned, but not restored: {e}"),
                ));
                "down".into()
            }
            None => "down".into(),
        };
        crate::info!(
            "{who} {key}: returned {} {} ({}) to the host as {}{}, {how}",
            m.kind,
            m.pod_name,
            m.bus_address.as_deref().unwrap_or("no bus address"),
            m.host_name,
            m.source
                .map(|s| format!(" (by {})", s.as_str()))
                .unwrap_or_default()
        );
    }
    // A plugin of the chain may have moved a recorded device out in its own DEL, before
    // this one, under a name the pod could choose (host-device: the alias).
    let skip: Vec<String> = out
        .moved
        .iter()
        .filter(|m| m.kind == DeviceKind::Netdev)
        .filter_map(|m| m.bus_address.clone())
        .collect();
    give_back_returned(ledger, key, &recording.named(), &skip, who);
    state::forget(ledger, key);
    for m in &out.mismatches {
        crate::warn!(
            "{who} {key}: device {}: its alias is {} but {} was recorded when the chain completed; the alias is not used",
            m.pod_name,
            m.alias.as_deref().map_or("unset".into(), |a| format!("{a:?}")),
            m.recorded
        );
    }
    if !out.mismatches.is_empty() {
        if let Err(e) = failure_note::write_mismatches(ledger, key, &out.mismatches) {
            crate::error!("{who} {key}: cannot keep the alias mismatches: {e:#}");
        }
    }
    for l in &out.left {
        crate::info!(
            "{who} {key}: link {} (ifindex {}) left in the pod: not recorded at ADD",
            l.pod_name,
            l.ifindex
        );
    }
    if let Some(why) = &out.rdma_note {
        crate::info!("{who} {key}: RDMA: none to return ({why})");
    }
    for f in &out.failures {
        crate::error!(
            "{who} {key}: could not return device {} ({}): {}",
            f.device,
            f.bus_address.as_deref().unwrap_or("no bus address"),
            f.error
        );
    }
    if out.moved.is_empty() && out.failures.is_empty() {
        crate::info!("{who} {key}: no devices to return from {netns}");
    }
    if !out.failures.is_empty() {
        if let Err(e) = failure_note::write(ledger, key, netns, &out.failures) {
            crate::error!("{who} {key}: cannot keep the device failures: {e:#}");
        }
    }
}

/// The head's DEL, after the chain's DELs: the recorded devices a plugin of the chain
/// returned to the host itself, under a name other than their recorded host name, get
/// that name (or the neutral one) and the host's state back (`state::plan_returned`).
/// Logs each; never fails.
pub fn give_back_returned(
    ledger: &Ledger,
    key: &Key,
    recorded: &[Recorded],
    skip: &[String],
    who: &str,
) {
    if recorded.is_empty() {
        return;
    }
    for d in state::give_back_returned(ledger, key, recorded, skip) {
        match &d.error {
            None => crate::info!(
                "{who} {key}: device {} ({}), returned to the host by the chain's DEL, given back as {}",
                d.found_as,
                d.bus_address,
                state::summary(std::slice::from_ref(&d))
            ),
            Some(e) => crate::error!(
                "{who} {key}: could not give back device {} ({}), returned by the chain's DEL, as {}: {e}",
                d.found_as,
                d.bus_address,
                d.host_name
            ),
        }
    }
}

/// gc's part for a record whose namespace died in this boot with no DEL (see
/// `state::repair`): logs each device and keeps what was done where `list` shows it.
pub fn repair_after_the_fact(
    ledger: &Ledger,
    rec: &crate::ledger::Record,
    who: &str,
) -> Vec<state::Repaired> {
    let key = rec.key();
    let recorded = recorded_in(rec.chain.as_ref().and_then(|c| c.devices.as_ref()));
    let done = if recorded.is_empty() {
        Vec::new()
    } else {
        state::repair(ledger, &key, &recorded)
    };
    for d in &done {
        match &d.error {
            None => crate::info!(
                "{who} {key}: gave back device {} ({}), returned by the kernel when the namespace went, as {}",
                d.found_as,
                d.bus_address,
                state::summary(std::slice::from_ref(d))
            ),
            Some(e) => crate::error!(
                "{who} {key}: could not give back device {} ({}) as {}: {e}",
                d.found_as,
                d.bus_address,
                d.host_name
            ),
        }
    }
    if !done.is_empty() {
        if let Err(e) = state::write_repaired(ledger, &key, &done) {
            crate::error!("{who} {key}: cannot keep what was given back: {e:#}");
        }
    }
    state::forget(ledger, &key);
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn option_values() {
        assert_eq!(parse_option(&json!(false)), Ok(None));
        assert_eq!(parse_option(&json!(null)), Ok(None));
        assert_eq!(parse_option(&json!(true)), Ok(Some(Spec::default())));
        assert_eq!(
            parse_option(&json!({"names": ["dev*", "ib?"]})),
            Ok(Some(Spec {
                names: vec!["dev*".into(), "ib?".into()]
            }))
        );
        assert_eq!(parse_option(&json!({})), Ok(Some(Spec::default())));
        for bad in [
            json!("yes"),
            json!(1),
            json!({"names": "dev*"}),
            json!({"names": [""]}),
            json!({"names": [3]}),
            json!({"nmes": []}),
        ] {
            assert!(parse_option(&bad).is_err(), "{bad}");
        }
    }

    fn link(ifindex: u32, ino: Option<u64>) -> select::PodLink {
        select::PodLink {
            name: "net1".into(),
            ifindex,
            alias: None,
            bus_address: None,
            pci_address: None,
            hardware: false,
            loopback: false,
            pci_multifunction: false,
            dev_port: 0,
            perm_mac: None,
            pci_slot: None,
            sysfs_ino: ino,
        }
    }

    #[test]
    fn a_recorded_link_is_known_by_ifindex_bus_address_and_sysfs_inode() {
        let r: Recorded = serde_json::from_value(
            json!({"podName": "net1", "ifindex": 5, "hostName": "", "sysfsIno": 77}),
        )
        .unwrap();
        assert!(r.is(&link(5, Some(77))));
        assert_eq!(r.name(), None);
        // The pod deleted it and made another with the same ifindex: a new inode.
        assert!(!r.is(&link(5, Some(78))));
        assert!(!r.is(&link(5, None)));
        assert!(!r.is(&link(6, Some(77))));
        // An older release's note has no inode: ifindex and bus address decide.
        let old: Recorded =
            serde_json::from_value(json!({"podName": "net1", "ifindex": 5, "hostName": "ens9f0"}))
                .unwrap();
        assert!(old.is(&link(5, Some(78))) && old.is(&link(5, None)));
        assert_eq!(old.name(), Some("ens9f0"));
        // What older releases read: the fields they know, the inode an extra one.
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            json!({"podName": "net1", "ifindex": 5, "hostName": "", "sysfsIno": 77})
        );
        assert_eq!(
            serde_json::to_value(&old).unwrap(),
            json!({"podName": "net1", "ifindex": 5, "hostName": "ens9f0"})
        );
    }

    #[test]
    fn only_a_links_list_is_whole_and_devices_keeps_the_named() {
        use crate::ledger::record::ChainNote;
        let note = |devices: Option<Value>, links: Option<Value>| ChainNote {
            devices,
            links,
            ..ChainNote::default()
        };
        // No tail, or one that could not look.
        assert_eq!(Recording::of(None), Recording::default());
        assert_eq!(Recording::of(Some(&note(None, None))), Recording::default());
        // An older release's note: its named links, not whole.
        let old = Recording::of(Some(&note(
            Some(json!([{"podName": "a", "ifindex": 2, "hostName": "b"}])),
            None,
        )));
        assert!(!old.whole);
        assert_eq!(old.links.len(), 1);
        // This release's: `links` rules, even empty; undecodable counts as empty.
        let empty = Recording::of(Some(&note(Some(json!([])), Some(json!([])))));
        assert!(empty.whole && empty.links.is_empty());
        let odd = Recording::of(Some(&note(None, Some(json!({"x": 1})))));
        assert!(odd.whole && odd.links.is_empty());
        let both = Recording::of(Some(&note(
            Some(json!([{"podName": "a", "ifindex": 2, "hostName": "b"}])),
            Some(json!([
                {"podName": "a", "ifindex": 2, "hostName": "b", "sysfsIno": 7},
                {"podName": "v", "ifindex": 3, "hostName": "", "sysfsIno": 8}
            ])),
        )));
        assert!(both.whole);
        assert_eq!(both.links.len(), 2);
        // What `devices` keeps (and older releases read): the named one only.
        assert_eq!(both.named().len(), 1);
        assert_eq!(both.named()[0].host_name, "b");
    }

    #[test]
    fn option_found_in_the_ledger_entry_of_a_chain() {
        let list = json!({"plugins": [
            {"type": "cni-ledger", "returnDevices": {"names": ["dev*"]}},
            {"type": "bridge", "returnDevices": false}
        ]});
        assert_eq!(
            spec_in_chain(&list, "cni-ledger"),
            Some(Spec {
                names: vec!["dev*".into()]
            })
        );
        assert_eq!(spec_in_chain(&list, "bridge"), None);
        assert_eq!(
            spec_in_chain(&json!({"plugins": [{"type": "x"}]}), "x"),
            None
        );
    }
}
