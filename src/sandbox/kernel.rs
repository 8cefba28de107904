//! The kernel calls of the node-wide namespace search that no safe wrapper offers:
//! reopening a network namespace from its nsfs file handle (Linux 6.18+), and the
//! network namespace of a socket another process holds (`pidfd_getfd`, Linux 5.6+, and
//! `SIOCGSKNS`).

use nix::errno::Errno;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `FILEID_NSFS` (include/linux/exportfs.h): the handle type nsfs gives its files.
const FILEID_NSFS: i32 = 0xf1;
/// `CLONE_NEWNET`, the type field of a network namespace's handle.
const NS_TYPE_NET: u32 = 0x4000_0000;
/// `SIOCGSKNS` (include/uapi/linux/sockios.h): an fd of a socket's network namespace.
const SIOCGSKNS: nix::libc::c_ulong = 0x894C;
/// `struct nsfs_file_handle`: the namespace's 64-bit ID, its type and its inode number.
const NSFS_HANDLE_BYTES: usize = 16;

/// `struct file_handle` with room for any handle nsfs gives (`MAX_HANDLE_SZ` is 128).
#[repr(C)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; 128],
}

impl FileHandle {
    fn empty() -> FileHandle {
        FileHandle {
            handle_bytes: 128,
            handle_type: 0,
            f_handle: [0; 128],
        }
    }

    /// The handle of the network namespace with this ID and inode number, as nsfs
    /// encodes it: the ID never repeats within a boot, so only that namespace can ever
    /// be reopened through it.
    fn net(ns_id: u64, ino: u32) -> FileHandle {
        let mut h = FileHandle::empty();
        h.handle_bytes = NSFS_HANDLE_BYTES as u32;
        h.handle_type = FILEID_NSFS;
        h.f_handle[..8].copy_from_slice(&ns_id.to_ne_bytes());
        h.f_handle[8..12].copy_from_slice(&NS_TYPE_NET.to_ne_bytes());
        h.f_handle[12..16].copy_from_slice(&ino.to_ne_bytes());
        h
    }

    fn bytes(&self) -> (i32, &[u8]) {
        let len = (self.handle_bytes as usize).min(self.f_handle.len());
        (self.handle_type, &self.f_handle[..len])
    }
}

/// The handle the kernel gives for the namespace file at `path` (followed): what
/// `net_handle` must reproduce for the kernel's encoding to be the one assumed here.
// name_to_handle_at(2) has no safe wrapper.
#[allow(unsafe_code)]
fn handle_of(path: &str) -> Result<FileHandle, Errno> {
    let c = std::ffi::CString::new(path).map_err(|_| Errno::EINVAL)?;
    let mut h = FileHandle::empty();
    let mut mount_id: nix::libc::c_int = 0;
    // SAFETY: `c` is a NUL-terminated string, `h` is a `struct file_handle` whose
    // `handle_bytes` says how much room follows its header, and `mount_id` is a valid
    // int; all outlive the call.
    let rc = unsafe {
        nix::libc::name_to_handle_at(
            nix::libc::AT_FDCWD,
            c.as_ptr(),
            (&mut h as *mut FileHandle).cast(),
            &mut mount_id,
            nix::libc::AT_SYMLINK_FOLLOW,
        )
    };
    Errno::result(rc).map(|_| h)
}

/// Whether the kernel encodes a network namespace's handle as (ID, type, inode) with
/// the ID being the cookie recorded at ADD: checked on our own namespace, whose cookie
/// and inode are known, before any handle built from a record is trusted.
pub fn handle_encoding_matches(own_ns: &str, cookie: u64, ino: u64) -> bool {
    let Ok(ino) = u32::try_from(ino) else {
        return false;
    };
    let Ok(got) = handle_of(own_ns) else {
        return false;
    };
    got.bytes() == FileHandle::net(cookie, ino).bytes()
}

/// What reopening a namespace by its handle said.
#[derive(Debug)]
pub enum Reopen {
    /// It is alive: something on the node holds it. The namespace, opened.
    Alive(File),
    /// ESTALE: no live namespace has that ID and inode.
    Stale,
    /// The kernel would not say (no nsfs handles, no permission, …).
    Unknown,
}

/// Reopens the network namespace with this ID and inode number, through `nsfs` (any
/// open nsfs file: it names the nsfs mount the handle is decoded on).
// open_by_handle_at(2) has no safe wrapper.
#[allow(unsafe_code)]
pub fn reopen_net(nsfs: &File, ns_id: u64, ino: u64) -> Reopen {
    let Ok(ino) = u32::try_from(ino) else {
        return Reopen::Unknown;
    };
    let mut h = FileHandle::net(ns_id, ino);
    let flags = nix::libc::O_RDONLY | nix::libc::O_CLOEXEC;
    // SAFETY: the mount fd stays open (borrowed from `nsfs`) for the call, and `h` is a
    // `struct file_handle` with `handle_bytes` of valid handle data after its header.
    let rc = unsafe {
        nix::libc::open_by_handle_at(nsfs.as_raw_fd(), (&mut h as *mut FileHandle).cast(), flags)
    };
    match Errno::result(rc) {
        // SAFETY: a successful open_by_handle_at returns a new descriptor that nothing
        // else owns.
        Ok(fd) => Reopen::Alive(File::from(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(Errno::ESTALE) => Reopen::Stale,
        Err(_) => Reopen::Unknown,
    }
}

/// A process, opened as a pidfd: its descriptors can be copied (with ptrace's
/// permission) until it exits, and a PID reused meanwhile is never reached through it.
pub struct Pidfd(OwnedFd);

impl Pidfd {
    // pidfd_open(2) and pidfd_getfd(2) have no wrapper in nix.
    #[allow(unsafe_code)]
    pub fn open(pid: u32) -> io::Result<Pidfd> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1;
        // no memory is passed.
        let rc = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as i32, 0) };
        let fd = Errno::result(rc)? as RawFd;
        // SAFETY: the new descriptor is ours alone.
        Ok(Pidfd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The network namespace of the socket at descriptor `fd` of the process, opened;
    /// None if that descriptor is not a socket.
    #[allow(unsafe_code)]
    pub fn socket_netns(&self, fd: i32) -> io::Result<Option<File>> {
        // SAFETY: pidfd_getfd takes a pidfd, a descriptor number and flags, and returns
        // a new descriptor (a copy of the target's) or -1; no memory is passed.
        let rc =
            unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_getfd, self.0.as_raw_fd(), fd, 0) };
        let copy = Errno::result(rc)? as RawFd;
        // SAFETY: the copy is ours alone; closed when `sock` drops.
        let sock = unsafe { OwnedFd::from_raw_fd(copy) };
        // SAFETY: SIOCGSKNS takes no argument and returns a new descriptor or -1; the
        // socket stays open (owned by `sock`) for the call.
        let rc = unsafe { nix::libc::ioctl(sock.as_raw_fd(), SIOCGSKNS as _) };
        match Errno::result(rc) {
            // SAFETY: the namespace descriptor is new and ours alone.
            Ok(ns) => Ok(Some(File::from(unsafe { OwnedFd::from_raw_fd(ns) }))),
            // Not a socket after all (the descriptor was replaced since it was read).
            Err(Errno::ENOTTY | Errno::EINVAL | Errno::ENOTSOCK) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_net_handle_is_id_type_and_inode() {
        let h = FileHandle::net(0x0102_0304_0506_0708, 0xf000_018f);
        let (ty, b) = h.bytes();
        assert_eq!(ty, 0xf1);
        assert_eq!(b.len(), 16);
        assert_eq!(&b[..8], &0x0102_0304_0506_0708u64.to_ne_bytes());
        assert_eq!(&b[8..12], &0x4000_0000u32.to_ne_bytes());
        assert_eq!(&b[12..], &0xf000_018fu32.to_ne_bytes());
    }

    /// Where the kernel has nsfs handles (6.18+) and lets us decode them, our own
    /// namespace is reopened from a handle built from its cookie and inode, and a
    /// made-up ID is stale.
    #[test]
    fn our_own_namespace_reopens_from_its_cookie() {
        let own = File::open("/proc/self/ns/net").unwrap();
        let Ok(cookie) = super::super::identity::ioctl_cookie(&own) else {
            return; // no NS_GET_ID: a kernel before 6.18
        };
        let ino = own.metadata().unwrap().ino();
        if !handle_encoding_matches("/proc/self/ns/net", cookie, ino) {
            return;
        }
        match reopen_net(&own, cookie, ino) {
            Reopen::Alive(f) => assert_eq!(f.metadata().unwrap().ino(), ino),
            Reopen::Unknown => return, // e.g. no CAP_DAC_READ_SEARCH
            other => panic!("own namespace: {other:?}"),
        }
        assert!(matches!(reopen_net(&own, u64::MAX - 1, ino), Reopen::Stale));
    }
}
