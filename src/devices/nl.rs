//! A blocking request/reply exchange with the kernel over one netlink socket.
//!
//! A netlink socket acts on the network namespace it was created in, whatever thread
//! uses it later: that is what lets one socket talk to the host while another, made on
//! the thread inside the pod's namespace, talks to the pod.

use netlink_sys::{Socket, SocketAddr};
use std::io;

pub const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 1;
pub const NLM_F_ACK: u16 = 4;
pub const NLM_F_DUMP: u16 = 0x300;

pub struct Conn {
    sock: Socket,
    seq: u32,
}

/// One message of a reply: its type and its whole bytes (header included).
pub struct Frame {
    pub kind: u16,
    pub bytes: Vec<u8>,
}

impl Frame {
    pub fn payload(&self) -> &[u8] {
        &self.bytes[NLMSG_HDRLEN..]
    }
}

impl Conn {
    pub fn open(protocol: isize) -> io::Result<Conn> {
        let mut sock = Socket::new(protocol)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Conn { sock, seq: 0 })
    }

    /// Sends `msg` (a whole netlink message; its sequence number is set here) and
    /// returns the reply's messages, up to `NLMSG_DONE` for a dump or the ACK otherwise.
    /// A kernel error becomes the matching `io::Error` (errno).
    pub fn request(&mut self, mut msg: Vec<u8>) -> io::Result<Vec<Frame>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        msg[8..12].copy_from_slice(&seq.to_ne_bytes());
        let flags = u16::from_ne_bytes([msg[6], msg[7]]);
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        self.sock.send(&msg, 0)?;
        let mut frames = Vec::new();
        loop {
            let (buf, _) = self.sock.recv_from_full()?;
            let mut at = 0;
            while at + NLMSG_HDRLEN <= buf.len() {
                let len =
                    u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
                if len < NLMSG_HDRLEN || at + len > buf.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "truncated netlink message",
                    ));
                }
                let frame = &buf[at..at + len];
                at += (len + 3) & !3;
                let kind = u16::from_ne_bytes([frame[4], frame[5]]);
                let fseq = u32::from_ne_bytes([frame[8], frame[9], frame[10], frame[11]]);
                if fseq != seq {
                    continue; // a late answer to an earlier request
                }
                match kind {
                    NLMSG_ERROR => {
                        let code = frame
                            .get(NLMSG_HDRLEN..NLMSG_HDRLEN + 4)
                            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                            .unwrap_or(0);
                        if code != 0 {
                            return Err(io::Error::from_raw_os_error(-code));
                        }
                        return Ok(frames); // the ACK
                    }
                    NLMSG_DONE => return Ok(frames),
                    _ => frames.push(Frame {
                        kind,
                        bytes: frame.to_vec(),
                    }),
                }
            }
            if !dump && !frames.is_empty() && flags & NLM_F_ACK == 0 {
                return Ok(frames);
            }
        }
    }
}
