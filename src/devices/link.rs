//! Netdev operations over rtnetlink (`netlink-packet-route`): the host's link names,
//! and moving a link into another namespace under a chosen name.

use super::nl::{Conn, NLMSG_HDRLEN, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_core::{Emitable, NlasIterator};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use std::collections::HashSet;
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
    let req = encode(
        RTM_GETLINK,
        NLM_F_REQUEST | NLM_F_DUMP,
        &LinkMessage::default(),
    );
    let mut out = HashSet::new();
    for frame in conn.request(req)? {
        if frame.kind != RTM_NEWLINK {
            continue;
        }
        // Only the name is needed: walk the attributes after the ifinfomsg rather than
        // decoding every attribute of every host link.
        let attrs = frame.payload().get(IFINFOMSG_LEN..).unwrap_or_default();
        for nla in NlasIterator::new(attrs) {
            let nla = nla.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if nla.kind() == IFLA_IFNAME {
                let v = nla.value();
                let v = v.split(|&b| b == 0).next().unwrap_or_default();
                out.insert(String::from_utf8_lossy(v).into_owned());
            }
        }
    }
    Ok(out)
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

    #[test]
    fn lists_own_namespace_links() {
        // Every namespace has lo; this needs no privilege.
        let mut c = open().unwrap();
        assert!(names(&mut c).unwrap().contains("lo"));
    }
}
