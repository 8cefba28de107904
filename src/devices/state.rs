//! The host's own state of its devices before a pod took one, and putting it back.
//!
//! The kernel takes a link down when it leaves a namespace, and the pod's driver set its
//! MTU; the node had it up (or not) at its own MTU. The head's ADD, with
//! `returnDevices` on, keeps the host's hardware-backed links as they are then, before
//! the chain or a driver's hook can move one (`<ledgerDir>/devices/host/<stem>.json`):
//! nothing the pod can write. A returned device (matched by bus address) gets its MTU
//! and up/down back from it.
//!
//! Also gc's part when the namespace died with no DEL (`repair`): the kernel returned
//! the NIC down under its pod name; gc finds it on the host by the bus address the
//! tail recorded, renames it by the rule DEL uses, and puts its state back.

use super::{link, naming, select, Recorded};
use crate::ledger::{fsio, DeviceFile, Key, Ledger};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// `IFF_UP` as sysfs prints it in `flags`.
const IFF_UP: u32 = 0x1;
const MAX_FILE: u64 = 1 << 20;

/// A hardware-backed host link as it was when the head's ADD ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostLink {
    pub name: String,
    pub bus_address: String,
    pub mtu: u32,
    pub up: bool,
}

fn read_num(path: &Path) -> Option<u32> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The hardware-backed links under `class_net` (the host's `/sys/class/net`).
pub fn snapshot(class_net: &Path) -> Vec<HostLink> {
    let Ok(rd) = std::fs::read_dir(class_net) else {
        return Vec::new();
    };
    let mut out: Vec<HostLink> = rd
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let dir = class_net.join(&name);
            let bus = std::fs::read_link(dir.join("device")).ok()?;
            Some(HostLink {
                bus_address: bus.file_name()?.to_string_lossy().into_owned(),
                mtu: read_num(&dir.join("mtu"))?,
                up: read_num(&dir.join("flags"))? & IFF_UP != 0,
                name,
            })
        })
        .collect();
    out.sort_by(|a, b| a.bus_address.cmp(&b.bus_address));
    out
}

/// The head's part at ADD: keep the host's hardware links as they are now. A failure
/// costs only the state's return later, never the ADD.
pub fn remember(ledger: &Ledger, key: &Key) -> Result<()> {
    let links = snapshot(Path::new("/sys/class/net"));
    super::failure_note::write_keyed(ledger, DeviceFile::HostLinks, key, &links).map(drop)
}

pub fn load(ledger: &Ledger, key: &Key) -> Vec<HostLink> {
    fsio::read_nofollow(
        &ledger.device_file_path(DeviceFile::HostLinks, key),
        MAX_FILE,
    )
    .ok()
    .and_then(|b| serde_json::from_slice(&b).ok())
    .unwrap_or_default()
}

pub fn forget(ledger: &Ledger, key: &Key) {
    let _ = std::fs::remove_file(ledger.device_file_path(DeviceFile::HostLinks, key));
}

/// What a returned link was set to on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Restored {
    pub host_name: String,
    pub mtu: u32,
    pub up: bool,
}

/// Sets the host link `name` (renamed from `rename_from` first when given) to the state
/// `was`, over a socket of the calling thread's namespace, the host's.
pub fn restore(name: &str, rename_from: Option<&str>, was: &HostLink) -> Result<Restored, String> {
    let current = rename_from.unwrap_or(name);
    let index = read_num(&Path::new("/sys/class/net").join(current).join("ifindex"))
        .ok_or_else(|| format!("{current} is not on the host"))?;
    let mut conn = link::open().map_err(|e| format!("rtnetlink: {e}"))?;
    if rename_from.is_some() {
        drop_own_altname(&mut conn, index, name);
    }
    link::set(
        &mut conn,
        index,
        rename_from.map(|_| name),
        Some(was.mtu),
        was.up,
    )
    .map_err(|e| {
        format!(
            "setting {current}{} to MTU {}, {}: {e}",
            rename_from.map_or(String::new(), |_| format!(" (as {name})")),
            was.mtu,
            if was.up { "up" } else { "down" }
        )
    })?;
    Ok(Restored {
        host_name: name.to_string(),
        mtu: was.mtu,
        up: was.up,
    })
}

/// udev made `name` an altname of the returned link itself (it does for a NIC back on
/// the host under another name): it must go before the link can take it as its name.
/// The request names the link, so only its own altname can go; none is no error.
fn drop_own_altname(conn: &mut super::nl::Conn, index: u32, name: &str) {
    let _ = conn.request(link::del_altname_request(index, name));
}

/// A device gc gave back after the fact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Repaired {
    /// Its name when gc found it (the pod's name, or the kernel's devN).
    pub found_as: String,
    pub bus_address: String,
    pub host_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    pub up: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The name the kernel gives a returned link: its name in the pod, else `devN`.
fn kernel_return_name(name: &str, pod_name: &str) -> bool {
    name == pod_name
        || name
            .strip_prefix("dev")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What gc's repair would do with the host's links `links` for the recorded devices
/// `recorded` (pure): (link, its host name) per device to give back. Only a link the
/// recorded bus address names, down, under the name the kernel gives a returned link
/// (its pod name or devN): a link up, or under any other name, is the host's own now.
pub fn plan<'a>(
    links: &'a [select::PodLink],
    recorded: &[Recorded],
    flags_up: &dyn Fn(&str) -> bool,
) -> Vec<(&'a select::PodLink, String)> {
    plan_by_bus(links, recorded, |r, l| {
        !flags_up(&l.name) && kernel_return_name(&l.name, &r.pod_name)
    })
}

/// What the head's DEL does (pure) with the host's links `links` for the recorded
/// devices `recorded` that a plugin of the chain moved out in its own DEL, before ours
/// ran (Debian's host-device renames it after the alias, which the pod may have
/// rewritten): (link, its host name) per device. Only a hardware link the recorded bus
/// address names, on the host (so in no pod's namespace), down (as any link is that
/// just left a namespace), under a name other than its recorded host name; never one
/// whose bus address is in `skip` (the devices this DEL itself moved back).
pub fn plan_returned<'a>(
    links: &'a [select::PodLink],
    recorded: &[Recorded],
    skip: &[String],
    flags_up: &dyn Fn(&str) -> bool,
) -> Vec<(&'a select::PodLink, String)> {
    plan_by_bus(links, recorded, |r, l| {
        !skip
            .iter()
            .any(|s| Some(s.as_str()) == r.bus_address.as_deref())
            && !flags_up(&l.name)
            && l.name != r.host_name
    })
}

/// Both plans: for each recorded device with a bus address, the hardware link on the
/// host at that address, if `give_back` takes it, and the host name it gets (the
/// recorded one unless another link has it; names handed out in this plan count too).
fn plan_by_bus<'a>(
    links: &'a [select::PodLink],
    recorded: &[Recorded],
    give_back: impl Fn(&Recorded, &select::PodLink) -> bool,
) -> Vec<(&'a select::PodLink, String)> {
    let mut taken: HashSet<String> = links.iter().map(|l| l.name.clone()).collect();
    let mut out = Vec::new();
    for r in recorded {
        let Some(bus) = r.bus_address.as_deref() else {
            continue;
        };
        let Some(l) = links
            .iter()
            .find(|l| l.hardware && l.bus_address.as_deref() == Some(bus))
        else {
            continue;
        };
        if !give_back(r, l) {
            continue;
        }
        taken.remove(&l.name);
        let (name, _) = naming::choose(l, Some(&r.host_name), &taken);
        taken.insert(name.clone());
        out.push((l, name));
    }
    out
}

/// Whether the host link `name` under `class_net` is up; unreadable counts as up, so
/// that it is left alone.
fn is_up(class_net: &Path, name: &str) -> bool {
    read_num(&class_net.join(name).join("flags")).is_none_or(|f| f & IFF_UP != 0)
}

/// The head's DEL, after the chain's DELs: gives the recorded devices a plugin of the
/// chain returned (see `plan_returned`) their host name and the state kept at ADD.
pub fn give_back_returned(
    ledger: &Ledger,
    key: &Key,
    recorded: &[Recorded],
    skip: &[String],
) -> Vec<Repaired> {
    let class_net = Path::new("/sys/class/net");
    let Ok(mut links) = select::scan(class_net) else {
        return Vec::new();
    };
    if let Ok(mut conn) = link::open() {
        super::fill_perm_macs(&mut conn, &mut links);
    }
    let up = |n: &str| is_up(class_net, n);
    apply(
        &plan_returned(&links, recorded, skip, &up),
        &load(ledger, key),
    )
}

/// gc's part when the namespace of a record made in this boot is gone and no DEL
/// returned its devices: the kernel returned each NIC down under its pod name. Finds
/// them on the host by the bus address the tail recorded and gives them back their
/// host name and state. Never a link that is up, nor one under another name.
pub fn repair(ledger: &Ledger, key: &Key, recorded: &[Recorded]) -> Vec<Repaired> {
    let class_net = Path::new("/sys/class/net");
    let Ok(mut links) = select::scan(class_net) else {
        return Vec::new();
    };
    if let Ok(mut conn) = link::open() {
        super::fill_perm_macs(&mut conn, &mut links);
    }
    let up = |n: &str| is_up(class_net, n);
    apply(&plan(&links, recorded, &up), &load(ledger, key))
}

/// Renames each planned link and puts back its state from `states` (by bus address).
fn apply(planned: &[(&select::PodLink, String)], states: &[HostLink]) -> Vec<Repaired> {
    let mut out = Vec::new();
    for (l, name) in planned {
        let name = name.clone();
        let bus = l.bus_address.clone().unwrap_or_default();
        let was = states.iter().find(|s| s.bus_address == bus);
        let rename = (l.name != name).then_some(l.name.as_str());
        // Without the host's state from ADD, only the name comes back, and it stays down.
        let res = match was {
            Some(w) => restore(&name, rename, w).map(|r| (Some(r.mtu), r.up)),
            None => restore_name_only(&name, rename).map(|()| (None, false)),
        };
        out.push(match res {
            Ok((mtu, up)) => Repaired {
                found_as: l.name.clone(),
                bus_address: bus,
                host_name: name,
                mtu,
                up,
                error: None,
            },
            Err(e) => Repaired {
                found_as: l.name.clone(),
                bus_address: bus,
                host_name: name,
                mtu: None,
                up: false,
                error: Some(e),
            },
        });
    }
    out
}

fn restore_name_only(name: &str, rename_from: Option<&str>) -> Result<(), String> {
    let Some(from) = rename_from else {
        return Ok(());
    };
    let index = read_num(&Path::new("/sys/class/net").join(from).join("ifindex"))
        .ok_or_else(|| format!("{from} is not on the host"))?;
    let mut conn = link::open().map_err(|e| format!("rtnetlink: {e}"))?;
    drop_own_altname(&mut conn, index, name);
    link::set(&mut conn, index, Some(name), None, false)
        .map_err(|e| format!("renaming {from} to {name}: {e}"))
}

/// Keeps what gc repaired, one file per attachment, until an operator removes it:
/// `list` shows them, the metric `cni_ledger_devices_given_back` counts them.
pub fn write_repaired(ledger: &Ledger, key: &Key, repaired: &[Repaired]) -> Result<PathBuf> {
    let body = RepairNote {
        network: key.network.clone(),
        container_id: key.container_id.clone(),
        ifname: key.ifname.clone(),
        at: crate::time::rfc3339(crate::time::now()),
        devices: repaired.to_vec(),
    };
    super::failure_note::write_keyed(ledger, DeviceFile::Repaired, key, &body)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RepairNote {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub at: String,
    pub devices: Vec<Repaired>,
}

pub fn read_repaired(ledger: &Ledger) -> Vec<(PathBuf, RepairNote)> {
    let mut out: Vec<(PathBuf, RepairNote)> = ledger
        .device_files(DeviceFile::Repaired)
        .into_iter()
        .filter_map(|p| {
            let b = fsio::read_nofollow(&p, MAX_FILE).ok()?;
            Some((p, serde_json::from_slice(&b).ok()?))
        })
        .collect();
    out.sort_by(|a, b| (&a.1.at, &a.0).cmp(&(&b.1.at, &b.0)));
    out
}

pub fn repaired_count(ledger: &Ledger) -> usize {
    ledger.device_file_count(DeviceFile::Repaired)
}

/// One line per device: `net1 (0000:00:05.0) -> enp0s5, up, MTU 1500`.
pub fn summary(devices: &[Repaired]) -> String {
    devices
        .iter()
        .map(|d| {
            let state = match (&d.error, d.mtu) {
                (Some(e), _) => format!("failed: {e}"),
                (None, Some(m)) => format!("{}, MTU {m}", if d.up { "up" } else { "down" }),
                (None, None) => "down (no host state recorded)".into(),
            };
            format!(
                "{} ({}) -> {}, {state}",
                d.found_as, d.bus_address, d.host_name
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(name: &str, bus: &str) -> select::PodLink {
        select::PodLink {
            name: name.into(),
            ifindex: 3,
            alias: Some("cni0".into()),
            bus_address: Some(bus.into()),
            pci_address: Some("0000:00:05.0".into()),
            hardware: true,
            loopback: false,
            pci_multifunction: false,
            dev_port: 0,
            perm_mac: Some("52:54:00:12:34:56".into()),
            pci_slot: None,
            sysfs_ino: None,
        }
    }

    fn rec(pod: &str, bus: &str, host: &str) -> Recorded {
        Recorded {
            pod_name: pod.into(),
            ifindex: 9,
            bus_address: Some(bus.into()),
            host_name: host.into(),
            sysfs_ino: None,
        }
    }

    #[test]
    fn plan_takes_only_a_down_link_under_the_kernels_return_name() {
        let links = vec![
            l("net1", "virtio1"),
            l("enp0s6", "virtio2"),
            l("dev3", "virtio3"),
        ];
        let down = |_: &str| false;
        let recorded = vec![
            rec("net1", "virtio1", "enp0s5"),
            // Its name is not the pod's nor devN: the host's own now.
            rec("net2", "virtio2", "enp0s7"),
            rec("net3", "virtio3", "enp0s8"),
            // Nothing on the host with that bus address: still in some namespace.
            rec("net4", "virtio4", "enp0s9"),
        ];
        let p = plan(&links, &recorded, &down);
        let got: Vec<(&str, &str)> = p
            .iter()
            .map(|(l, n)| (l.name.as_str(), n.as_str()))
            .collect();
        assert_eq!(got, vec![("net1", "enp0s5"), ("dev3", "enp0s8")]);
        // A link that is up is never touched.
        let up = |n: &str| n == "net1";
        let p = plan(&links, &recorded, &up);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0.name, "dev3");
    }

    #[test]
    fn plan_never_takes_a_name_in_use_and_never_the_alias() {
        let links = vec![l("net1", "virtio1"), l("enp0s5", "other")];
        let p = plan(&links, &[rec("net1", "virtio1", "enp0s5")], &|_| false);
        // enp0s5 is taken: the next rule (the bus address) names it, never "cni0".
        assert_eq!(p.len(), 1);
        assert_ne!(p[0].1, "enp0s5");
        assert_ne!(p[0].1, "cni0");
        assert_eq!(p[0].1, "enx525400123456");
    }

    /// The host's `/sys/class/net` after host-device's DEL: the NIC it returned as
    /// `cni0` (the alias the pod wrote), down; the primary NIC, up; another pod's NIC
    /// returned by the kernel, down; a recorded NIC still in some pod (absent here).
    #[test]
    fn the_head_del_takes_only_a_recorded_device_returned_down_under_another_name() {
        let t = super::select::fake::Tree::new("returned");
        t.link("lo", 1, 772, "", None);
        t.link("ens8", 2, 1, "", Some("pci0000:00/0000:00:08.0/virtio1"));
        t.link(
            "cni0",
            3,
            1,
            "cni0",
            Some("pci0000:00/0000:00:09.0/virtio2"),
        );
        t.link("net1", 4, 1, "", Some("pci0000:00/0000:00:0a.0/virtio3"));
        t.link("ens11", 5, 1, "", Some("pci0000:00/0000:00:0b.0/virtio4"));
        t.link("veth0", 6, 1, "", None);
        let down = |n: &str| {
            std::fs::write(t.class_net().join(n).join("flags"), "0x1002\n").unwrap();
        };
        down("cni0");
        down("net1");
        down("ens11");
        down("veth0");
        let links = select::scan(&t.class_net()).unwrap();
        let up = |n: &str| is_up(&t.class_net(), n);
        let names = |p: &[(&select::PodLink, String)]| -> Vec<(String, String)> {
            p.iter().map(|(l, n)| (l.name.clone(), n.clone())).collect()
        };
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        // Recorded in this pod: the NIC host-device moved (virtio2) and one that never
        // came back (virtio9). net1 (virtio3) is another pod's, returned by the kernel.
        let recorded = vec![
            rec("net1", "virtio2", "ens9"),
            rec("net2", "virtio9", "ens12"),
        ];
        assert_eq!(
            names(&plan_returned(&links, &recorded, &[], &up)),
            [pair("cni0", "ens9")]
        );
        // Never a device the record does not name, whatever its state or name; never
        // the primary NIC (up), even were it recorded.
        let primary = vec![rec("net1", "virtio1", "ens9")];
        assert!(plan_returned(&links, &primary, &[], &up).is_empty());
        // Up, or already under its recorded name: the host's own; left alone.
        let at_home = vec![rec("net1", "virtio4", "ens11")];
        assert!(plan_returned(&links, &at_home, &[], &up).is_empty());
        std::fs::write(t.class_net().join("cni0/flags"), "0x1003\n").unwrap();
        assert!(plan_returned(&links, &recorded, &[], &up).is_empty());
        down("cni0");
        // Moved back by this DEL itself: not taken twice.
        assert!(plan_returned(&links, &recorded, &["virtio2".into()], &up).is_empty());
        // The recorded name is taken: the neutral name (udev's, from the PCI parent),
        // never the alias or the current name.
        let taken = vec![rec("net1", "virtio2", "ens8")];
        assert_eq!(
            names(&plan_returned(&links, &taken, &[], &up)),
            [pair("cni0", "enp0s9")]
        );
        // Any name other than the recorded one counts, not only the pod's or devN.
        let recorded3 = vec![rec("net1", "virtio3", "ens10")];
        assert_eq!(
            names(&plan_returned(&links, &recorded3, &[], &up)),
            [pair("net1", "ens10")]
        );
        // Without a recorded bus address nothing can be matched: never by name.
        let mut no_bus = rec("cni0", "x", "ens9");
        no_bus.bus_address = None;
        assert!(plan_returned(&links, &[no_bus], &[], &up).is_empty());
    }

    #[test]
    fn set_request_layout() {
        let b = link::set_request(5, Some("enp0s5"), Some(1500), true);
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), 19);
        // ifinfomsg: flags IFF_UP, change IFF_UP.
        assert_eq!(u32::from_ne_bytes(b[24..28].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(b[28..32].try_into().unwrap()), 1);
        let attrs = &b[32..];
        assert_eq!(attrs[..4], [11, 0, 3, 0]);
        assert_eq!(&attrs[4..11], b"enp0s5\0");
        // IFLA_MTU (4) = 1500 after the padded name.
        assert_eq!(attrs[12..16], [8, 0, 4, 0]);
        assert_eq!(u32::from_ne_bytes(attrs[16..20].try_into().unwrap()), 1500);
    }

    #[test]
    fn del_altname_request_layout() {
        let b = link::del_altname_request(5, "ens9");
        // RTM_DELLINKPROP (109); IFLA_PROP_LIST (52, nested) holding IFLA_ALT_IFNAME (53).
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), 109);
        assert_eq!(i32::from_ne_bytes(b[20..24].try_into().unwrap()), 5);
        let attrs = &b[32..];
        assert_eq!(u16::from_ne_bytes([attrs[2], attrs[3]]), 52 | 0x8000);
        assert_eq!(u16::from_ne_bytes([attrs[6], attrs[7]]), 53);
        assert_eq!(&attrs[8..13], b"ens9\0");
    }

    #[test]
    fn snapshot_reads_only_hardware_links() {
        let root = std::env::temp_dir().join(format!("cl-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let net = root.join("class/net");
        for (n, hw, mtu, flags) in [
            ("eth0", true, "1500", "0x1003"),
            ("veth1", false, "1500", "0x1003"),
            ("enp0s5", true, "9000", "0x1002"),
        ] {
            let d = net.join(n);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("mtu"), format!("{mtu}\n")).unwrap();
            std::fs::write(d.join("flags"), format!("{flags}\n")).unwrap();
            if hw {
                std::os::unix::fs::symlink(
                    format!("../../devices/pci0000:00/bus-{n}"),
                    d.join("device"),
                )
                .unwrap();
            }
        }
        let s = snapshot(&net);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            s,
            vec![
                HostLink {
                    name: "enp0s5".into(),
                    bus_address: "bus-enp0s5".into(),
                    mtu: 9000,
                    up: false
                },
                HostLink {
                    name: "eth0".into(),
                    bus_address: "bus-eth0".into(),
                    mtu: 1500,
                    up: true
                },
            ]
        );
    }
}
