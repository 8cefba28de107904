//! Netdev operations over rtnetlink (`netlink-packet-route`): the host's link names,
//! links' permanent hardware addresses, and moving a link into another namespace under
//! a chosen name.

use super::nl::{Conn, NLMSG_HDRLEN, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_core::{Emitable, NlasIterator};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::RawFd;

// Message types from `linux/rtnetlink.h`.
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const RTM_DELLINKPROP: u16 = 109;
/// `struct ifinfomsg`, before a link message's attributes.
const IFINFOMSG_LEN: usize = 16;
/// `IFLA_IFNAME` from `linux/if_link.h`.
const IFLA_IFNAME: u16 = 3;
/// `IFLA_PERM_ADDRESS` (Linux 5.6): the address the driver read from the hardware. A
/// process in the pod can change the link's current address, never this one; the
/// kernel leaves it out when all zero (virtual links: veth, bridge, tap...).
const IFLA_PERM_ADDRESS: u16 = 54;

pub fn open() -> io::Result<Conn> {
    Conn::open(netlink_sys::protocols::NETLINK_ROUTE)
}

/// A link message behind a netlink header. Link messages are encoded and parsed alone,
/// not through the crate's all-families message enum, which would link in every
/// rtnetlink family (routes, qdiscs, ...) for nothing.
fn encode(kind: u16, flags: u16, link: &LinkMessage) -> Vec<u8> {
    let mut buf = vec![0; NLMSG_HDRLEN + link.buffer_len()];
    link.emit(&mut buf[NLMSG_HDRLEN..]);
    let len = buf.len() as u32;
    buf[0..4].copy_from_slice(&len.to_ne_bytes());
    buf[4..6].copy_from_slice(&kind.to_ne_bytes());
    buf[6..8].copy_from_slice(&flags.to_ne_bytes());
    buf
}

/// Every link name in the socket's namespace.
pub fn names(conn: &mut Conn) -> io::Result<HashSet<String>> {
    let mut out = HashSet::new();
    each_link_attr(conn, |_, kind, v| {
        if kind == IFLA_IFNAME {
            let v = v.split(|&b| b == 0).next().unwrap_or_default();
            out.insert(String::from_utf8_lossy(v).into_owned());
        }
    })?;
    Ok(out)
}

/// The permanent hardware address of each link of the socket's namespace that has one
/// (by ifindex), as `aa:bb:...` in lower case. A kernel before 5.6 sends none: every
/// link then falls to the naming rule after the MAC's.
pub fn perm_addresses(conn: &mut Conn) -> io::Result<HashMap<u32, String>> {
    let mut out = HashMap::new();
    each_link_attr(conn, |index, kind, v| {
        if let Some(mac) = (kind == IFLA_PERM_ADDRESS)
            .then(|| perm_address(v))
            .flatten()
        {
            out.insert(index, mac);
        }
    })?;
    Ok(out)
}

/// An `IFLA_PERM_ADDRESS` value as text; None when empty or all zero.
fn perm_address(v: &[u8]) -> Option<String> {
    let hex: Vec<String> = v.iter().map(|b| format!("{b:02x}")).collect();
    v.iter().any(|&b| b != 0).then(|| hex.join(":"))
}

/// Dumps the links of the socket's namespace and calls `f(ifindex, kind, value)` for
/// each attribute of each. Only the attributes wanted are looked at: walking them after
/// the ifinfomsg costs less than decoding every attribute of every link.
fn each_link_attr(conn: &mut Conn, mut f: impl FnMut(u32, u16, &[u8])) -> io::Result<()> {
    let req = encode(
        RTM_GETLINK,
        NLM_F_REQUEST | NLM_F_DUMP,
        &LinkMessage::default(),
    );
    for frame in conn.request(req)? {
        if frame.kind != RTM_NEWLINK {
            continue;
        }
        walk_link(frame.payload(), &mut f)?;
    }
    Ok(())
}

/// One RTM_NEWLINK payload (ifinfomsg, then attributes): `f(ifindex, kind, value)` per
/// attribute.
fn walk_link(payload: &[u8], f: &mut impl FnMut(u32, u16, &[u8])) -> io::Result<()> {
    // ifinfomsg: family (1), pad (1), type (2), index (4), flags (4), change (4).
    let index = payload
        .get(4..8)
        .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    let attrs = payload.get(IFINFOMSG_LEN..).unwrap_or_default();
    for nla in NlasIterator::new(attrs) {
        let nla = nla.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        f(index, nla.kind(), nla.value());
    }
    Ok(())
}

/// The request that moves link `index` (of the socket's namespace) into the namespace
/// `target_ns` refers to, named `name` there. The kernel takes the link down on the way
/// and applies the name in the target namespace, so no name of the source is touched.
pub fn move_request(index: u32, target_ns: RawFd, name: &str) -> Vec<u8> {
    let mut link = LinkMessage::default();
    link.header.index = index;
    link.attributes = vec![
        LinkAttribute::NetNsFd(target_ns),
        LinkAttribute::IfName(name.to_string()),
    ];
    encode(RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, &link)
}

pub fn move_to(conn: &mut Conn, index: u32, target_ns: RawFd, name: &str) -> io::Result<()> {
    conn.request(move_request(index, target_ns, name))
        .map(|_| ())
}

/// The request that sets link `index` (of the socket's namespace): its name when
/// given (the link must be down), its MTU when given, and up or down.
pub fn set_request(index: u32, name: Option<&str>, mtu: Option<u32>, up: bool) -> Vec<u8> {
    use netlink_packet_route::link::LinkFlags;
    let mut link = LinkMessage::default();
    link.header.index = index;
    link.header.change_mask = LinkFlags::Up;
    link.header.flags = if up {
        LinkFlags::Up
    } else {
        LinkFlags::empty()
    };
    if let Some(n) = name {
        link.attributes.push(LinkAttribute::IfName(n.to_string()));
    }
    if let Some(m) = mtu {
        link.attributes.push(LinkAttribute::Mtu(m));
    }
    encode(RTM_SETLINK, NLM_F_REQUEST | NLM_F_ACK, &link)
}

/// The request that removes the alternative name `name` from link `index`. udev gives a
/// NIC the kernel returned (as `net1`, say) its predictable names as altnames, and the
/// kernel refuses a rename to a name in use as anyone's altname, its own too.
pub fn del_altname_request(index: u32, name: &str) -> Vec<u8> {
    use netlink_packet_route::link::Prop;
    let mut link = LinkMessage::default();
    link.header.index = index;
    link.attributes = vec![LinkAttribute::PropList(vec![Prop::AltIfName(
        name.to_string(),
    )])];
    encode(RTM_DELLINKPROP, NLM_F_REQUEST | NLM_F_ACK, &link)
}

pub fn set(
    conn: &mut Conn,
    index: u32,
    name: Option<&str>,
    mtu: Option<u32>,
    up: bool,
) -> io::Result<()> {
    conn.request(set_request(index, name, mtu, up)).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn move_request_layout() {
        let b = move_request(7, 9, "ens9f0");
        // nlmsghdr: RTM_SETLINK (19), REQUEST|ACK; ifinfomsg with index 7; then
        // IFLA_NET_NS_FD (28) = 9 and IFLA_IFNAME (3) = "ens9f0\0".
        assert_eq!(
            u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize,
            b.len()
        );
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), 19);
        assert_eq!(u16::from_ne_bytes([b[6], b[7]]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(i32::from_ne_bytes(b[20..24].try_into().unwrap()), 7);
        let attrs = &b[32..];
        assert_eq!(attrs[..4], [8, 0, 28, 0]);
        assert_eq!(u32::from_ne_bytes(attrs[4..8].try_into().unwrap()), 9);
        assert_eq!(attrs[8..12], [11, 0, 3, 0]);
        assert_eq!(&attrs[12..19], b"ens9f0\0");
    }

    /// An RTM_NEWLINK payload as the kernel sends it: ifinfomsg for link 7, then
    /// IFLA_ADDRESS (1, the current address the pod can set), IFLA_IFNAME and
    /// IFLA_PERM_ADDRESS when given.
    fn newlink(perm: Option<[u8; 6]>) -> Vec<u8> {
        let mut p = vec![0u8; IFINFOMSG_LEN];
        p[4..8].copy_from_slice(&7i32.to_ne_bytes());
        let mut attr = |kind: u16, v: &[u8]| {
            p.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
            p.extend_from_slice(&kind.to_ne_bytes());
            p.extend_from_slice(v);
            p.resize((p.len() + 3) & !3, 0);
        };
        attr(1, &[0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee]);
        attr(IFLA_IFNAME, b"net1\0");
        if let Some(m) = perm {
            attr(IFLA_PERM_ADDRESS, &m);
        }
        p
    }

    fn perm_of(payload: &[u8]) -> Option<(u32, String)> {
        let mut found = None;
        walk_link(payload, &mut |i, k, v| {
            if k == IFLA_PERM_ADDRESS {
                found = perm_address(v).map(|m| (i, m));
            }
        })
        .unwrap();
        found
    }

    #[test]
    fn the_permanent_address_never_the_current_one() {
        let nic = newlink(Some([0x52, 0x54, 0x00, 0x12, 0x34, 0xAB]));
        assert_eq!(perm_of(&nic), Some((7, "52:54:00:12:34:ab".into())));
        // A virtual link: no permanent address, whatever its current one.
        assert_eq!(perm_of(&newlink(None)), None);
        assert_eq!(perm_of(&newlink(Some([0; 6]))), None);
        assert_eq!(perm_address(&[]), None);
    }

    /// This namespace's links, read through rtnetlink as naming reads them: a link whose
    /// address is still the permanent one its driver set (`addr_assign_type` 0, never
    /// changed since) has it as its permanent address; `lo` (all zero) has none. (A
    /// virtual link's lack of one is shown by tests/devices.rs on a veth.)
    #[test]
    fn permanent_addresses_of_this_namespace_agree_with_sysfs() {
        let mut c = open().unwrap();
        let perm = perm_addresses(&mut c).unwrap();
        let sys = std::path::Path::new("/sys/class/net");
        let read = |n: &str, f: &str| {
            std::fs::read_to_string(sys.join(n).join(f))
                .map(|s| s.trim().to_string())
                .ok()
        };
        for e in std::fs::read_dir(sys).unwrap().flatten() {
            let n = e.file_name().into_string().unwrap();
            let Some(i) = read(&n, "ifindex").and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let addr = read(&n, "address").filter(|a| a.len() == 17);
            if let (Some("0"), Some(a)) = (read(&n, "addr_assign_type").as_deref(), addr) {
                if a != "00:00:00:00:00:00" {
                    assert_eq!(perm.get(&i), Some(&a), "{n}");
                }
            }
        }
        assert_eq!(perm.get(&1), None, "lo");
    }

    #[test]
    fn lists_own_namespace_links() {
        // Every namespace has lo; this needs no privilege.
        let mut c = open().unwrap();
        assert!(names(&mut c).unwrap().contains("lo"));
    }
}
