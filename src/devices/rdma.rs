//! The RDMA netlink family (`NETLINK_RDMA`, client `RDMA_NL_NLDEV`), encoded by hand:
//! no crate speaks it. The few messages needed: the subsystem's namespace mode, a dump
//! of the devices visible in the socket's namespace, and "move device N to namespace
//! FD". Constants are the kernel's uapi values (`rdma/rdma_netlink.h`).
//!
//! nldev messages carry their attributes right after the netlink header (no family
//! header), each a `struct nlattr` {u16 len, u16 type} padded to 4 bytes.

use super::nl::{Conn, Frame, NLMSG_HDRLEN, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use std::io;
use std::os::fd::RawFd;

/// `NETLINK_RDMA` from `linux/netlink.h`.
pub const NETLINK_RDMA: isize = 20;
/// `RDMA_NL_NLDEV`: the RDMA device interface client.
const RDMA_NL_NLDEV: u16 = 5;
const RDMA_NLDEV_CMD_GET: u16 = 1;
const RDMA_NLDEV_CMD_SET: u16 = 2;
const RDMA_NLDEV_CMD_SYS_GET: u16 = 6;
const RDMA_NLDEV_ATTR_DEV_INDEX: u16 = 1; // u32
const RDMA_NLDEV_ATTR_DEV_NAME: u16 = 2; // string
const RDMA_NLDEV_SYS_ATTR_NETNS_MODE: u16 = 66; // u8: 1 shared, 0 exclusive
const RDMA_NLDEV_NET_NS_FD: u16 = 68; // u32

/// `RDMA_NL_GET_TYPE(client, op)`.
pub const fn msg_type(op: u16) -> u16 {
    (RDMA_NL_NLDEV << 10) + op
}

fn message(op: u16, flags: u16, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut b = vec![0u8; NLMSG_HDRLEN];
    for (kind, value) in attrs {
        let len = 4 + value.len();
        b.extend_from_slice(&(len as u16).to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(value);
        b.resize((b.len() + 3) & !3, 0);
    }
    let total = b.len() as u32;
    b[0..4].copy_from_slice(&total.to_ne_bytes());
    b[4..6].copy_from_slice(&msg_type(op).to_ne_bytes());
    b[6..8].copy_from_slice(&flags.to_ne_bytes());
    // seq (8..12) is set by Conn::request; pid 0 addresses the kernel.
    b
}

pub fn sys_get_request() -> Vec<u8> {
    message(RDMA_NLDEV_CMD_SYS_GET, NLM_F_REQUEST | NLM_F_ACK, &[])
}

pub fn dev_dump_request() -> Vec<u8> {
    message(RDMA_NLDEV_CMD_GET, NLM_F_REQUEST | NLM_F_DUMP, &[])
}

pub fn set_netns_request(index: u32, ns_fd: RawFd) -> Vec<u8> {
    message(
        RDMA_NLDEV_CMD_SET,
        NLM_F_REQUEST | NLM_F_ACK,
        &[
            (RDMA_NLDEV_ATTR_DEV_INDEX, &index.to_ne_bytes()),
            (RDMA_NLDEV_NET_NS_FD, &(ns_fd as u32).to_ne_bytes()),
        ],
    )
}

/// The attributes of one nldev message payload; a malformed tail is ignored.
pub fn attrs(payload: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= payload.len() {
        let len = u16::from_ne_bytes([payload[at], payload[at + 1]]) as usize;
        let kind = u16::from_ne_bytes([payload[at + 2], payload[at + 3]]) & 0x3fff;
        if len < 4 || at + len > payload.len() {
            break;
        }
        out.push((kind, &payload[at + 4..at + len]));
        at += (len + 3) & !3;
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaDev {
    pub index: u32,
    pub name: String,
}

pub fn decode_dev(payload: &[u8]) -> Option<RdmaDev> {
    let mut index = None;
    let mut name = None;
    for (kind, v) in attrs(payload) {
        match kind {
            RDMA_NLDEV_ATTR_DEV_INDEX if v.len() >= 4 => {
                index = Some(u32::from_ne_bytes([v[0], v[1], v[2], v[3]]))
            }
            RDMA_NLDEV_ATTR_DEV_NAME => {
                let v = v.split(|&b| b == 0).next().unwrap_or_default();
                name = Some(String::from_utf8_lossy(v).into_owned())
            }
            _ => {}
        }
    }
    Some(RdmaDev {
        index: index?,
        name: name.unwrap_or_default(),
    })
}

/// Some(true) for shared mode (devices visible in every namespace, bound to none).
pub fn decode_shared_mode(payload: &[u8]) -> Option<bool> {
    attrs(payload)
        .into_iter()
        .find(|(k, v)| *k == RDMA_NLDEV_SYS_ATTR_NETNS_MODE && !v.is_empty())
        .map(|(_, v)| v[0] != 0)
}

/// What the RDMA side found in a namespace.
#[derive(Debug)]
pub enum Found {
    /// Devices bound to the namespace (exclusive mode).
    Devices(Vec<RdmaDev>),
    /// Nothing to move, and why (no RDMA subsystem, shared mode, old kernel).
    Nothing(String),
}

/// Lists the RDMA devices bound to the namespace `conn` was opened in.
pub fn bound_devices(conn: &mut Conn) -> io::Result<Found> {
    let shared = match conn.request(sys_get_request()) {
        Ok(frames) => first(&frames, RDMA_NLDEV_CMD_SYS_GET).and_then(decode_shared_mode),
        // Kernels before RDMA namespace support (5.2) do not know SYS_GET.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(nix::libc::EOPNOTSUPP | nix::libc::EINVAL)
            ) =>
        {
            return Ok(Found::Nothing(format!(
                "kernel without RDMA namespace support ({e})"
            )))
        }
        Err(e) => return Err(e),
    };
    match shared {
        Some(false) => {}
        Some(true) => {
            return Ok(Found::Nothing(
                "RDMA in shared namespace mode: devices belong to no namespace".into(),
            ))
        }
        None => {
            return Ok(Found::Nothing(
                "kernel reports no RDMA namespace mode".into(),
            ))
        }
    }
    let frames = conn.request(dev_dump_request())?;
    Ok(Found::Devices(
        frames
            .iter()
            .filter(|f| f.kind == msg_type(RDMA_NLDEV_CMD_GET))
            .filter_map(|f| decode_dev(f.payload()))
            .collect(),
    ))
}

fn first(frames: &[Frame], op: u16) -> Option<&[u8]> {
    frames
        .iter()
        .find(|f| f.kind == msg_type(op))
        .map(Frame::payload)
}

/// A socket of the RDMA family in the calling thread's namespace; Ok(None) when the
/// kernel has no RDMA subsystem (ib_core not loaded), so no RDMA device can exist.
pub fn open() -> io::Result<Option<Conn>> {
    match Conn::open(NETLINK_RDMA) {
        Ok(c) => Ok(Some(c)),
        Err(e) if e.raw_os_error() == Some(nix::libc::EPROTONOSUPPORT) => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn move_to(conn: &mut Conn, index: u32, ns_fd: RawFd) -> io::Result<()> {
    conn.request(set_netns_request(index, ns_fd)).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_ne_bytes([b[at], b[at + 1]])
    }
    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn message_types_follow_rdma_nl_get_type() {
        // RDMA_NL_GET_TYPE(RDMA_NL_NLDEV = 5, op) = (5 << 10) + op
        assert_eq!(msg_type(RDMA_NLDEV_CMD_GET), 5121);
        assert_eq!(msg_type(RDMA_NLDEV_CMD_SET), 5122);
        assert_eq!(msg_type(RDMA_NLDEV_CMD_SYS_GET), 5126);
    }

    #[test]
    fn set_netns_layout() {
        // struct nlmsghdr (16) + nlattr{8, DEV_INDEX=1} u32 + nlattr{8, NET_NS_FD=68} u32
        let b = set_netns_request(3, 12);
        assert_eq!(b.len(), 32);
        assert_eq!(u32_at(&b, 0), 32);
        assert_eq!(u16_at(&b, 4), 5122);
        assert_eq!(u16_at(&b, 6), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!((u16_at(&b, 16), u16_at(&b, 18), u32_at(&b, 20)), (8, 1, 3));
        assert_eq!(
            (u16_at(&b, 24), u16_at(&b, 26), u32_at(&b, 28)),
            (8, 68, 12)
        );
    }

    #[test]
    fn dump_and_sys_get_layout() {
        let d = dev_dump_request();
        assert_eq!((d.len(), u32_at(&d, 0)), (16, 16));
        assert_eq!(u16_at(&d, 4), 5121);
        assert_eq!(u16_at(&d, 6), NLM_F_REQUEST | NLM_F_DUMP);
        let s = sys_get_request();
        assert_eq!((s.len(), u16_at(&s, 4)), (16, 5126));
    }

    #[test]
    fn decodes_device_and_mode_attributes() {
        // DEV_INDEX=1 (u32 4), DEV_NAME=2 "mlx5_0\0" (len 11, padded to 12), then an
        // unknown nested attribute (NLA_F_NESTED set) that must be skipped.
        let mut p = Vec::new();
        p.extend_from_slice(&8u16.to_ne_bytes());
        p.extend_from_slice(&1u16.to_ne_bytes());
        p.extend_from_slice(&4u32.to_ne_bytes());
        p.extend_from_slice(&11u16.to_ne_bytes());
        p.extend_from_slice(&2u16.to_ne_bytes());
        p.extend_from_slice(b"mlx5_0\0\0");
        p.extend_from_slice(&4u16.to_ne_bytes());
        p.extend_from_slice(&(0x8000u16 | 30).to_ne_bytes());
        assert_eq!(
            decode_dev(&p),
            Some(RdmaDev {
                index: 4,
                name: "mlx5_0".into()
            })
        );
        assert_eq!(decode_dev(&p[8..]), None, "no index, no device");
        // NETNS_MODE=66 u8 (len 5, padded to 8)
        let mode = |v: u8| {
            [5u16.to_ne_bytes(), 66u16.to_ne_bytes()]
                .concat()
                .into_iter()
                .chain([v, 0, 0, 0])
                .collect::<Vec<u8>>()
        };
        assert_eq!(decode_shared_mode(&mode(1)), Some(true));
        assert_eq!(decode_shared_mode(&mode(0)), Some(false));
        assert_eq!(decode_shared_mode(&[]), None);
        assert!(attrs(&[200, 0, 1, 0, 0]).is_empty(), "overlong attribute");
    }
}
