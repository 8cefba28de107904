//! Which name a returned link gets on the host: pure.
//!
//! In order: the alias (drivers and device plugins leave the host name there) when it is
//! a valid name free on the host; else the link's current name if free; else a name
//! derived from its bus address; else the first free `devN`. A clash is never resolved
//! by renaming a host link.

use super::select::PodLink;
use std::collections::HashSet;

/// `IFNAMSIZ` less the terminating NUL.
const MAX_IFNAME: usize = 15;

/// Why a link got its host name (for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Alias,
    Current,
    BusAddress,
    Counter,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Alias => "alias",
            Source::Current => "current name",
            Source::BusAddress => "bus address",
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

/// A name after systemd's path scheme for a PCI address: `enp<bus>s<slot>f<fn>`, with
/// `P<domain>` first when the domain is not 0 (the function is always given).
pub fn from_bus_address(addr: &str) -> Option<String> {
    let (d, b, s, f) = pci_address(addr)?;
    let name = if d == 0 {
        format!("enp{b}s{s}f{f}")
    } else {
        format!("enP{d}p{b}s{s}f{f}")
    };
    valid_ifname(&name).then_some(name)
}

/// The host name for `link`, given the names `taken` on the host (including those
/// already chosen for other links of the same teardown).
pub fn choose(link: &PodLink, taken: &HashSet<String>) -> (String, Source) {
    let free = |n: &str| valid_ifname(n) && !taken.contains(n);
    if let Some(alias) = link.alias.as_deref().filter(|a| free(a)) {
        return (alias.to_string(), Source::Alias);
    }
    if free(&link.name) {
        return (link.name.clone(), Source::Current);
    }
    if let Some(name) = link
        .pci_address
        .as_deref()
        .and_then(from_bus_address)
        .filter(|n| free(n))
    {
        return (name, Source::BusAddress);
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
        }
    }

    fn taken(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn alias_when_valid_and_free() {
        let l = link("net1", Some("ens9f0"), Some("0000:03:00.0"));
        assert_eq!(
            choose(&l, &taken(&["lo", "eth0"])),
            ("ens9f0".into(), Source::Alias)
        );
    }

    #[test]
    fn taken_alias_falls_back_to_the_current_name_then_the_bus_address() {
        let l = link("net1", Some("ens9f0"), Some("0000:03:00.0"));
        assert_eq!(
            choose(&l, &taken(&["ens9f0"])),
            ("net1".into(), Source::Current)
        );
        assert_eq!(
            choose(&l, &taken(&["ens9f0", "net1"])),
            ("enp3s0f0".into(), Source::BusAddress)
        );
        assert_eq!(
            choose(&l, &taken(&["ens9f0", "net1", "enp3s0f0", "dev0"])),
            ("dev1".into(), Source::Counter)
        );
    }

    #[test]
    fn invalid_aliases_are_ignored() {
        for alias in [
            "has space",
            "a/b",
            "a:b",
            "toolongforanifname",
            ".",
            "..",
            "",
        ] {
            let l = link("net1", Some(alias), None);
            assert_eq!(
                choose(&l, &taken(&[])),
                ("net1".into(), Source::Current),
                "{alias:?}"
            );
        }
    }

    #[test]
    fn virtual_link_without_bus_address_gets_a_counter_name() {
        let l = link("dev0", Some("ens9f0"), None);
        assert_eq!(
            choose(&l, &taken(&["ens9f0", "dev0"])),
            ("dev1".into(), Source::Counter)
        );
    }

    #[test]
    fn a_virtio_nic_is_named_by_its_pci_parent() {
        let mut l = link("net1", None, Some("virtio2"));
        l.pci_address = Some("0000:00:03.0".into());
        assert_eq!(
            choose(&l, &taken(&["net1"])),
            ("enp0s3f0".into(), Source::BusAddress)
        );
    }

    #[test]
    fn bus_address_names() {
        assert_eq!(
            from_bus_address("0000:03:00.1").as_deref(),
            Some("enp3s0f1")
        );
        assert_eq!(
            from_bus_address("0001:af:1f.7").as_deref(),
            Some("enP1p175s31f7")
        );
        assert_eq!(from_bus_address("virtio3"), None);
        assert_eq!(from_bus_address("0000:03:00"), None);
        assert_eq!(from_bus_address("ffff:ff:ff.7"), None); // enP65535p255s255f7: too long
        assert!(valid_ifname("eth0") && !valid_ifname("eth0\n"));
    }
}
