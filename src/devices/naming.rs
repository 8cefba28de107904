//! Which name a returned link gets on the host: pure.
//!
//! Never a name the pod could have chosen: the pod is root in its namespace and can
//! rename a link or rewrite its `ifalias` after ADD (to `cni0`, say, and break every
//! later ADD on the node's bridge). In order: the host name recorded when the chain
//! completed (`Recorded`, the alias a driver left before the pod's containers could
//! run) when valid and free on the host; else udev's predictable name from the PCI
//! address (`enp3s0`, `enp3s0f1`, `enP1p175s31f7d1`); else from the permanent hardware
//! address (`enx<mac>`; the current MAC is the pod's to set, so never that); else the
//! first free `devN`. A clash is never resolved by renaming a host link.

use super::select::{pci_address, PodLink};
use std::collections::HashSet;

/// `IFNAMSIZ` less the terminating NUL.
const MAX_IFNAME: usize = 15;

/// Why a link got its host name (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Recorded,
    Slot,
    BusAddress,
    Mac,
    Counter,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Recorded => "name recorded at ADD",
            Source::Slot => "hotplug slot",
            Source::BusAddress => "bus address",
            Source::Mac => "permanent MAC address",
            Source::Counter => "first free devN",
        }
    }
}

/// The kernel's `dev_valid_name`: 1–15 bytes, not `.` or `..`, no `/`, `:` or whitespace.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_IFNAME
        && name != "."
        && name != ".."
        && !name
            .bytes()
            .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
}

/// udev's path name (systemd's net_id) for an Ethernet link at a PCI address:
/// `en[P<domain>]p<bus>s<slot>[f<function>][d<dev_port>]`, the function given when not
/// 0 or when the device is multi-function, the port when not 0.
pub fn from_bus_address(addr: &str, multifunction: bool, dev_port: u32) -> Option<String> {
    let (d, b, s, f) = pci_address(addr)?;
    let mut name = String::from("en");
    if d != 0 {
        name.push_str(&format!("P{d}"));
    }
    name.push_str(&format!("p{b}s{s}"));
    if f != 0 || multifunction {
        name.push_str(&format!("f{f}"));
    }
    if dev_port != 0 {
        name.push_str(&format!("d{dev_port}"));
    }
    valid_ifname(&name).then_some(name)
}

/// udev's slot name (net_id's `ID_NET_NAME_SLOT`), which its default policy prefers to
/// the path name: `en[P<domain>]s<slot>[f<function>][d<dev_port>]`.
pub fn from_slot(addr: &str, slot: u32, multifunction: bool, dev_port: u32) -> Option<String> {
    let (d, _, _, f) = pci_address(addr)?;
    let mut name = String::from("en");
    if d != 0 {
        name.push_str(&format!("P{d}"));
    }
    name.push_str(&format!("s{slot}"));
    if f != 0 || multifunction {
        name.push_str(&format!("f{f}"));
    }
    if dev_port != 0 {
        name.push_str(&format!("d{dev_port}"));
    }
    valid_ifname(&name).then_some(name)
}

/// udev's MAC name: `enx` and the 12 hex digits of an Ethernet address.
pub fn from_mac(mac: &str) -> Option<String> {
    let hex: String = mac.split(':').collect();
    let ok = hex.len() == 12
        && mac.split(':').all(|p| p.len() == 2)
        && hex.bytes().all(|b| b.is_ascii_hexdigit())
        && hex.bytes().any(|b| b != b'0');
    ok.then(|| format!("enx{}", hex.to_ascii_lowercase()))
}

/// The host name for `link`, given the name recorded for it when the chain completed
/// and the names `taken` on the host (including those already chosen for other links of
/// the same teardown). The link's own name and alias are never used: the pod sets both.
pub fn choose(link: &PodLink, recorded: Option<&str>, taken: &HashSet<String>) -> (String, Source) {
    let free = |n: &str| valid_ifname(n) && !taken.contains(n);
    if let Some(name) = recorded.filter(|n| free(n)) {
        return (name.to_string(), Source::Recorded);
    }
    if let Some(name) = link
        .pci_address
        .as_deref()
        .zip(link.pci_slot)
        .and_then(|(a, s)| from_slot(a, s, link.pci_multifunction, link.dev_port))
        .filter(|n| free(n))
    {
        return (name, Source::Slot);
    }
    if let Some(name) = link
        .pci_address
        .as_deref()
        .and_then(|a| from_bus_address(a, link.pci_multifunction, link.dev_port))
        .filter(|n| free(n))
    {
        return (name, Source::BusAddress);
    }
    if let Some(name) = link
        .perm_mac
        .as_deref()
        .and_then(from_mac)
        .filter(|n| free(n))
    {
        return (name, Source::Mac);
    }
    // A host has far fewer than 2^32 links, so a free devN always exists.
    let mut i = 0u32;
    while !free(&format!("dev{i}")) && i < u32::MAX {
        i += 1;
    }
    (format!("dev{i}"), Source::Counter)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(name: &str, alias: Option<&str>, bus: Option<&str>) -> PodLink {
        PodLink {
            name: name.into(),
            ifindex: 7,
            alias: alias.map(Into::into),
            bus_address: bus.map(Into::into),
            pci_address: bus.map(Into::into),
            hardware: bus.is_some(),
            loopback: false,
            pci_multifunction: false,
            dev_port: 0,
            perm_mac: Some("02:AB:cd:00:00:07".into()),
            pci_slot: None,
            sysfs_ino: None,
        }
    }

    fn taken(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_recorded_name_when_valid_and_free() {
        let l = link("net1", Some("cni0"), Some("0000:03:00.0"));
        assert_eq!(
            choose(&l, Some("ens9f0"), &taken(&["lo", "eth0"])),
            ("ens9f0".into(), Source::Recorded)
        );
    }

    #[test]
    fn the_slot_name_before_the_path_name() {
        // A virtio NIC in QEMU's hotplug slot 9: udev names it ens9, not enp0s9.
        let mut l = link("net1", Some("cni0"), Some("0000:00:09.0"));
        l.pci_slot = Some(9);
        assert_eq!(choose(&l, None, &taken(&[])), ("ens9".into(), Source::Slot));
        assert_eq!(
            choose(&l, None, &taken(&["ens9"])),
            ("enp0s9".into(), Source::BusAddress)
        );
        assert_eq!(
            from_slot("0000:03:00.1", 4, false, 0).as_deref(),
            Some("ens4f1")
        );
        assert_eq!(
            from_slot("0001:03:00.0", 4, true, 2).as_deref(),
            Some("enP1s4f0d2")
        );
    }

    #[test]
    fn never_the_alias_or_the_current_name() {
        // The pod wrote both; nothing was recorded: the neutral names, in order.
        let l = link("cni0", Some("cni0"), Some("0000:03:00.0"));
        assert_eq!(
            choose(&l, None, &taken(&[])),
            ("enp3s0".into(), Source::BusAddress)
        );
        assert_eq!(
            choose(&l, None, &taken(&["enp3s0"])),
            ("enx02abcd000007".into(), Source::Mac)
        );
        assert_eq!(
            choose(&l, None, &taken(&["enp3s0", "enx02abcd000007", "dev0"])),
            ("dev1".into(), Source::Counter)
        );
        // A taken or invalid recorded name falls back the same way.
        for rec in [
            "eth0",
            "has space",
            "a/b",
            "a:b",
            "toolongforanifname",
            ".",
            "..",
        ] {
            assert_eq!(
                choose(&l, Some(rec), &taken(&["eth0"])),
                ("enp3s0".into(), Source::BusAddress),
                "{rec:?}"
            );
        }
    }

    #[test]
    fn link_without_bus_address_is_named_by_its_permanent_mac() {
        let l = link("dev0", Some("ens9f0"), None);
        assert_eq!(
            choose(&l, None, &taken(&["dev0"])),
            ("enx02abcd000007".into(), Source::Mac)
        );
        // A virtual link has no permanent address (none, or all zero): devN.
        for perm in [None, Some("00:00:00:00:00:00".to_string())] {
            let mut no_mac = l.clone();
            no_mac.perm_mac = perm;
            assert_eq!(
                choose(&no_mac, None, &taken(&["dev0"])),
                ("dev1".into(), Source::Counter)
            );
        }
    }

    #[test]
    fn a_virtio_nic_is_named_by_its_pci_parent() {
        let mut l = link("net1", None, Some("virtio2"));
        l.pci_address = Some("0000:00:03.0".into());
        assert_eq!(
            choose(&l, None, &taken(&["net1"])),
            ("enp0s3".into(), Source::BusAddress)
        );
    }

    #[test]
    fn bus_address_names_as_udev_gives_them() {
        assert_eq!(
            from_bus_address("0000:00:01.0", false, 0).as_deref(),
            Some("enp0s1")
        );
        assert_eq!(
            from_bus_address("0000:03:00.0", true, 0).as_deref(),
            Some("enp3s0f0")
        );
        assert_eq!(
            from_bus_address("0000:03:00.1", false, 0).as_deref(),
            Some("enp3s0f1")
        );
        assert_eq!(
            from_bus_address("0000:03:00.1", true, 1).as_deref(),
            Some("enp3s0f1d1")
        );
        assert_eq!(
            from_bus_address("0001:af:1f.7", false, 0).as_deref(),
            Some("enP1p175s31f7")
        );
        assert_eq!(from_bus_address("virtio3", false, 0), None);
        assert_eq!(from_bus_address("0000:03:00", false, 0), None);
        // enP65535p255s255f7: too long.
        assert_eq!(from_bus_address("ffff:ff:ff.7", false, 0), None);
        assert!(valid_ifname("eth0") && !valid_ifname("eth0\n"));
    }

    /// What udev's names need: the PCI header type (multi-function) and `dev_port`, read
    /// from sysfs, never from the link's name or alias; and not the current `address`
    /// there, which the pod can set (the permanent one comes from rtnetlink).
    #[test]
    fn scan_reads_what_predictable_names_need() {
        let t = crate::devices::select::fake::Tree::new("udev");
        t.link("net1", 3, 1, "cni0", Some("0000:03:00.0"));
        t.link("net2", 4, 1, "", Some("0000:04:00.0"));
        t.link("net3", 5, 1, "", Some("pci0000:00/0000:00:03.0/virtio2"));
        let config = |bus: &str, header: u8| {
            let mut c = vec![0u8; 64];
            c[crate::devices::select::PCI_HEADER_TYPE] = header;
            std::fs::write(t.root.join("devices").join(bus).join("config"), c).unwrap();
        };
        config("0000:03:00.0", 0x80);
        config("0000:04:00.0", 0x00);
        config("pci0000:00/0000:00:03.0", 0x80);
        std::fs::write(t.class_net().join("net1/dev_port"), "1\n").unwrap();
        let links = crate::devices::select::scan(&t.class_net()).unwrap();
        let by = |n: &str| links.iter().find(|l| l.name == n).unwrap().clone();
        let (n1, n2, n3) = (by("net1"), by("net2"), by("net3"));
        assert!(n1.pci_multifunction && !n2.pci_multifunction && n3.pci_multifunction);
        assert_eq!((n1.dev_port, n2.dev_port), (1, 0));
        assert_eq!(n1.perm_mac, None);
        let none = HashSet::new();
        assert_eq!(
            choose(&n1, None, &none),
            ("enp3s0f0d1".into(), Source::BusAddress)
        );
        assert_eq!(
            choose(&n2, None, &none),
            ("enp4s0".into(), Source::BusAddress)
        );
        assert_eq!(
            choose(&n3, None, &none),
            ("enp0s3f0".into(), Source::BusAddress)
        );
    }

    #[test]
    fn mac_names() {
        assert_eq!(
            from_mac("52:54:00:12:34:56").as_deref(),
            Some("enx525400123456")
        );
        assert_eq!(from_mac("00:00:00:00:00:00"), None);
        // Not Ethernet: an InfiniBand address is 20 bytes.
        assert_eq!(
            from_mac("00:00:10:49:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:01"),
            None
        );
        assert_eq!(from_mac("zz:00:00:00:00:01"), None);
    }
}
