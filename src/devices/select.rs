//! Which links inside a pod's namespace go back to the host: pure, over a directory
//! shaped like `/sys/class/net` (the real one seen from inside the pod's namespace, or a
//! fake tree in tests).

use std::io;
use std::path::Path;

/// `ARPHRD_LOOPBACK` from `<linux/if_arp.h>`, as sysfs prints it in `type`.
const ARPHRD_LOOPBACK: u32 = 772;
/// `IFF_LOOPBACK` from `<linux/if.h>`, as sysfs prints it in `flags`.
const IFF_LOOPBACK: u32 = 0x8;

/// One link as sysfs shows it inside the namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodLink {
    pub name: String,
    pub ifindex: u32,
    /// `ifalias`: where drivers and device plugins leave the link's host name.
    pub alias: Option<String>,
    /// The bus address of the backing device (`device` link's target, e.g. `0000:03:00.1`).
    pub bus_address: Option<String>,
    /// The PCI address the device sits at: the bus address itself for a NIC or VF, the
    /// nearest PCI ancestor for a device on another bus (virtio-net: `0000:00:03.0`).
    pub pci_address: Option<String>,
    /// A `device` entry exists: the netdev is backed by hardware (NIC, SR-IOV VF).
    pub hardware: bool,
    pub loopback: bool,
    /// The PCI device has several functions (its header type's bit 7): udev then names
    /// function 0 with `f0` too.
    pub pci_multifunction: bool,
    /// `dev_port`: which port of a PCI function that drives several (0: the first).
    pub dev_port: u32,
    /// The permanent hardware address (rtnetlink's, filled by `devices::fill_perm_macs`;
    /// sysfs has none), for the `enx<mac>` name of a link with no PCI address. Never the
    /// current `address`: a process in the pod can set that.
    pub perm_mac: Option<String>,
    /// The hotplug slot number firmware gives the PCI device's slot (`/sys/bus/pci/slots/
    /// N/address`), from which udev names the link `ens<N>` before any path name.
    pub pci_slot: Option<u32>,
    /// The inode number of the link's sysfs directory: the kernel numbers each new one
    /// afresh (never reused in a boot), keeps it across renames and namespace moves, and
    /// no process chooses it, unlike the ifindex (`ip link add ... index N`).
    pub sysfs_ino: Option<u64>,
}

/// The number of the hotplug slot at PCI address `addr` (`DDDD:BB:SS.F`), as udev's
/// net_id finds it: the numeric directory under `slots` whose `address` is `DDDD:BB:SS`.
fn pci_slot(slots: &Path, addr: &str) -> Option<u32> {
    let (prefix, _) = addr.rsplit_once('.')?;
    std::fs::read_dir(slots).ok()?.flatten().find_map(|e| {
        let n: u32 = e.file_name().to_str()?.parse().ok()?;
        (n > 0 && read_trimmed(&e.path().join("address")).as_deref() == Some(prefix)).then_some(n)
    })
}

/// The parts of a PCI address `DDDD:BB:SS.F` (hex): domain, bus, slot, function.
pub fn pci_address(addr: &str) -> Option<(u32, u32, u32, u32)> {
    let (rest, func) = addr.rsplit_once('.')?;
    let mut parts = rest.split(':');
    let (domain, bus, slot) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || domain.len() != 4
        || bus.len() != 2
        || slot.len() != 2
        || func.len() != 1
    {
        return None;
    }
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    Some((hex(domain)?, hex(bus)?, hex(slot)?, hex(func)?))
}

/// PCI config space offset of the header type, whose bit 7 marks a multi-function device.
pub(crate) const PCI_HEADER_TYPE: usize = 0x0e;

/// Whether the PCI device at `dir` (its sysfs directory) is multi-function, as udev's
/// net_id reads it: from the header type in its config space.
fn pci_multifunction(dir: &Path) -> bool {
    std::fs::read(dir.join("config"))
        .ok()
        .and_then(|c| c.get(PCI_HEADER_TYPE).copied())
        .is_some_and(|t| t & 0x80 != 0)
}

fn read_trimmed(path: &Path) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim_end_matches('\n').to_string();
    (!s.is_empty()).then_some(s)
}

fn read_number(path: &Path) -> Option<u32> {
    let s = read_trimmed(path)?;
    match s.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Reads every link under `class_net`. A link that vanishes while being read is skipped.
pub fn scan(class_net: &Path) -> io::Result<Vec<PodLink>> {
    let mut links = Vec::new();
    // `<sysfs>/bus/pci/slots` beside `<sysfs>/class/net` (PCI is not per namespace).
    let slots = class_net
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| Path::new("/sys").to_path_buf(), Path::to_path_buf)
        .join("bus/pci/slots");
    for entry in std::fs::read_dir(class_net)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue; // not a name the kernel gives a netdev
        };
        let dir = class_net.join(&name);
        let Some(ifindex) = read_number(&dir.join("ifindex")) else {
            continue;
        };
        let device = dir.join("device");
        let hardware = device.symlink_metadata().is_ok();
        let bus_address = std::fs::read_link(&device)
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()));
        // The nearest PCI ancestor of the device, and its sysfs directory.
        let pci_dir = std::fs::canonicalize(&device).ok().and_then(|p| {
            p.ancestors()
                .find(|a| {
                    a.file_name()
                        .is_some_and(|n| pci_address(&n.to_string_lossy()).is_some())
                })
                .map(Path::to_path_buf)
        });
        let pci_address = pci_dir
            .as_ref()
            .and_then(|d| d.file_name())
            .map(|n| n.to_string_lossy().into_owned());
        let pci_multifunction = pci_dir.as_deref().is_some_and(pci_multifunction);
        let loopback = name == "lo"
            || read_number(&dir.join("type")) == Some(ARPHRD_LOOPBACK)
            || read_number(&dir.join("flags")).is_some_and(|f| f & IFF_LOOPBACK != 0);
        let pci_slot = pci_address.as_deref().and_then(|a| pci_slot(&slots, a));
        links.push(PodLink {
            alias: read_trimmed(&dir.join("ifalias")),
            name,
            ifindex,
            bus_address,
            pci_address,
            hardware,
            loopback,
            pci_multifunction,
            dev_port: read_number(&dir.join("dev_port")).unwrap_or(0),
            perm_mac: None,
            pci_slot,
            sysfs_ino: std::fs::metadata(&dir).ok().map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.ino()
            }),
        });
    }
    links.sort_by_key(|l| l.ifindex);
    Ok(links)
}

/// Shell-style match of `*` (any run) and `?` (one character); nothing else is special.
pub fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The links to return: every hardware-backed one plus those a pattern names, never
/// loopback. Virtual links (veth, macvlan, ipvlan, bridge...) have no `device` entry, so
/// only a pattern can select one.
pub fn select<'a>(links: &'a [PodLink], patterns: &[String]) -> Vec<&'a PodLink> {
    links
        .iter()
        .filter(|l| !l.loopback)
        .filter(|l| l.hardware || patterns.iter().any(|p| glob(p, &l.name)))
        .collect()
}

#[cfg(test)]
pub(crate) mod fake {
    //! A temp dir shaped like `/sys/class/net` plus the devices its links point at.
    use std::path::{Path, PathBuf};

    pub struct Tree {
        pub root: PathBuf,
    }

    impl Tree {
        pub fn new(tag: &str) -> Tree {
            let root = std::env::temp_dir().join(format!(
                "cl-sysfs-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("class/net")).unwrap();
            std::fs::create_dir_all(root.join("devices")).unwrap();
            Tree { root }
        }

        pub fn class_net(&self) -> PathBuf {
            self.root.join("class/net")
        }

        /// A link; `bus` gives it a `device` symlink to `devices/<bus>` (hardware).
        pub fn link(&self, name: &str, ifindex: u32, kind: u32, alias: &str, bus: Option<&str>) {
            let dir = self.class_net().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("ifindex"), format!("{ifindex}\n")).unwrap();
            std::fs::write(dir.join("type"), format!("{kind}\n")).unwrap();
            let flags = if kind == super::ARPHRD_LOOPBACK {
                "0x9"
            } else {
                "0x1003"
            };
            std::fs::write(dir.join("flags"), format!("{flags}\n")).unwrap();
            // sysfs shows an unset alias as an empty line.
            std::fs::write(dir.join("ifalias"), format!("{alias}\n")).unwrap();
            std::fs::write(
                dir.join("address"),
                format!("02:00:00:00:00:{ifindex:02x}\n"),
            )
            .unwrap();
            if let Some(bus) = bus {
                let target = self.root.join("devices").join(bus);
                std::fs::create_dir_all(&target).unwrap();
                std::os::unix::fs::symlink(
                    Path::new("../../../devices").join(bus),
                    dir.join("device"),
                )
                .unwrap();
            }
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::Tree;
    use super::*;

    fn names(v: &[&PodLink]) -> Vec<String> {
        v.iter().map(|l| l.name.clone()).collect()
    }

    /// A NIC, an SR-IOV VF, veth, macvlan, bridge and loopback, as sysfs shows them.
    fn pod() -> Tree {
        let t = Tree::new("select");
        t.link("lo", 1, 772, "", None);
        t.link("eth0", 2, 1, "", None); // the chain's veth
        t.link("net1", 3, 1, "ens9f0", Some("0000:03:00.0")); // a driver-moved NIC
        t.link("net2", 4, 1, "", Some("0000:03:02.1")); // a VF
        t.link("mv0", 5, 1, "", None); // macvlan
        t.link("br0", 6, 1, "", None); // bridge
        t.link("net3", 7, 1, "", Some("pci0000:00/0000:00:03.0/virtio2")); // virtio-net
        t
    }

    #[test]
    fn hardware_only_by_default_never_loopback_or_virtual() {
        let t = pod();
        let links = scan(&t.class_net()).unwrap();
        assert_eq!(links.len(), 7);
        let nic = links.iter().find(|l| l.name == "net1").unwrap();
        assert_eq!(nic.alias.as_deref(), Some("ens9f0"));
        assert_eq!(nic.bus_address.as_deref(), Some("0000:03:00.0"));
        assert!(nic.hardware && !nic.loopback);
        assert_eq!(nic.pci_address.as_deref(), Some("0000:03:00.0"));
        let virtio = links.iter().find(|l| l.name == "net3").unwrap();
        assert_eq!(virtio.bus_address.as_deref(), Some("virtio2"));
        assert_eq!(virtio.pci_address.as_deref(), Some("0000:00:03.0"));
        let eth0 = links.iter().find(|l| l.name == "eth0").unwrap();
        assert_eq!((eth0.alias.as_ref(), eth0.hardware), (None, false));
        assert_eq!(names(&select(&links, &[])), ["net1", "net2", "net3"]);
        assert_eq!(virtio.pci_slot, None);
    }

    #[test]
    fn the_hotplug_slot_of_the_pci_device() {
        let t = pod();
        // Firmware's slot 3 holds 0000:00:03; slot 0 and a name that is no number never
        // count (udev's net_id skips them too).
        for (slot, addr) in [
            ("3", "0000:00:03"),
            ("0", "0000:03:00"),
            ("x", "0000:03:02"),
        ] {
            let d = t.root.join("bus/pci/slots").join(slot);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("address"), format!("{addr}\n")).unwrap();
        }
        let links = scan(&t.class_net()).unwrap();
        let slot = |n: &str| links.iter().find(|l| l.name == n).unwrap().pci_slot;
        assert_eq!(slot("net3"), Some(3));
        assert_eq!(slot("net1"), None);
        assert_eq!(slot("net2"), None);
    }

    #[test]
    fn patterns_add_links_but_never_loopback() {
        let t = pod();
        let links = scan(&t.class_net()).unwrap();
        assert_eq!(
            names(&select(&links, &["mv*".into()])),
            ["net1", "net2", "mv0", "net3"]
        );
        assert_eq!(
            names(&select(&links, &["*".into()])),
            ["eth0", "net1", "net2", "mv0", "br0", "net3"]
        );
        // Loopback is never returned, even when hardware-looking or named.
        let t2 = Tree::new("lo");
        t2.link("lo", 1, 772, "", Some("weird"));
        let l2 = scan(&t2.class_net()).unwrap();
        assert!(select(&l2, &["lo".into()]).is_empty());
    }

    #[test]
    fn glob_matches_star_and_question_mark() {
        assert!(glob("dev*", "dev0"));
        assert!(glob("dev*", "dev"));
        assert!(!glob("dev*", "xdev0"));
        assert!(glob("*0", "dev0"));
        assert!(glob("d?v*1", "dev11"));
        assert!(!glob("d?v", "dv"));
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "axxbyy"));
        assert!(glob("*", ""));
        assert!(!glob("", "x"));
    }
}
