//! Identities the kernel never hands out twice within a boot.
//!
//! Device and inode name a namespace only while it exists: nsfs gives a new namespace
//! the lowest free inode number, so one made after another died often gets the dead
//! one's number, and PIDs wrap. Two things do not repeat: the namespace cookie (a 64-bit
//! counter value per network namespace) and, for `/proc/<pid>/` paths, the start time
//! of the process, which tells a recycled PID from the process that had it.

use nix::errno::Errno;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};

// NS_GET_ID = _IOR(NSIO 0xb7, 13, __u64), Linux 6.18 and later. For a network
// namespace it returns the namespace's cookie, the value SO_NETNS_COOKIE gives.
nix::ioctl_read!(ns_get_id, 0xb7, 13, u64);

/// SO_NETNS_COOKIE (Linux 5.14 and later): the cookie of a socket's network namespace.
const SO_NETNS_COOKIE: nix::libc::c_int = 71;

/// Set once the kernel has said it has no NS_GET_ID, so later reads go straight to the
/// socket fallback.
static NO_NS_GET_ID: AtomicBool = AtomicBool::new(false);

/// The cookie of the network namespace that `ns` (an open nsfs file) refers to.
pub fn netns_cookie(ns: &File) -> io::Result<u64> {
    if !NO_NS_GET_ID.load(Ordering::Relaxed) {
        match ioctl_cookie(ns) {
            Ok(id) => return Ok(id),
            // An older kernel, if `ns` really is an nsfs file: its ioctl number is unknown.
            Err(Errno::ENOTTY) if is_nsfs(ns) => NO_NS_GET_ID.store(true, Ordering::Relaxed),
            Err(e) => return Err(e.into()),
        }
    }
    socket_cookie(ns)
}

fn is_nsfs(f: &File) -> bool {
    nix::sys::statfs::fstatfs(f)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

// The nsfs ioctl has no safe wrapper.
#[allow(unsafe_code)]
pub fn ioctl_cookie(ns: &File) -> Result<u64, Errno> {
    let mut id = 0u64;
    // SAFETY: the descriptor stays open (borrowed from `ns`) for the call, and the
    // kernel writes exactly one u64 into `id`, which outlives it.
    unsafe { ns_get_id(ns.as_raw_fd(), &mut id) }?;
    Ok(id)
}

/// Reads the cookie from a socket made inside the namespace. The entering happens on a
/// thread of its own that ends right after: a thread's namespace is inherited by what it
/// starts, so no thread that does anything else may ever have been moved.
// nix has no SO_NETNS_COOKIE option: getsockopt(2) directly.
#[allow(unsafe_code)]
pub fn socket_cookie(ns: &File) -> io::Result<u64> {
    let fd = ns.as_fd();
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("netns-cookie".into())
            .spawn_scoped(s, move || -> io::Result<u64> {
                nix::sched::setns(fd, nix::sched::CloneFlags::CLONE_NEWNET)?;
                use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
                let sock = socket(
                    AddressFamily::Unix,
                    SockType::Datagram,
                    SockFlag::SOCK_CLOEXEC,
                    None,
                )?;
                let mut cookie = 0u64;
                let mut len = std::mem::size_of::<u64>() as nix::libc::socklen_t;
                // SAFETY: `cookie` and `len` are valid for writes of the sizes given, and
                // the socket stays open for the call.
                let rc = unsafe {
                    nix::libc::getsockopt(
                        sock.as_raw_fd(),
                        nix::libc::SOL_SOCKET,
                        SO_NETNS_COOKIE,
                        (&mut cookie as *mut u64).cast(),
                        &mut len,
                    )
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(cookie)
            })?;
        worker
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the cookie reader panicked")))
    })
}

/// For `/proc/<pid>/…` and `/proc/<pid>/task/<tid>/…` paths, the directory of the task
/// whose start time identifies it; None for every other path.
pub fn proc_task_dir(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/proc/")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let pid_end = rest.find('/').unwrap_or(rest.len());
    if !digits(&rest[..pid_end]) {
        return None;
    }
    let mut end = "/proc/".len() + pid_end;
    if let Some(task) = rest[pid_end..].strip_prefix("/task/") {
        let tid_end = task.find('/').unwrap_or(task.len());
        if digits(&task[..tid_end]) {
            end += "/task/".len() + tid_end;
        }
    }
    Some(&path[..end])
}

/// Field 22 of `<task_dir>/stat`: when the task started, in clock ticks since boot.
pub fn start_time(task_dir: &str) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("{task_dir}/stat"))?;
    parse_start_time(&stat)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unparsable stat line"))
}

/// The command name (field 2) may hold spaces and parentheses, so fields are counted
/// from the last `)`: field 3 is the first after it, field 22 the twentieth.
fn parse_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_dirs_of_proc_paths_only() {
        assert_eq!(proc_task_dir("/proc/42/ns/net"), Some("/proc/42"));
        assert_eq!(
            proc_task_dir("/proc/42/task/43/ns/net"),
            Some("/proc/42/task/43")
        );
        assert_eq!(proc_task_dir("/proc/42/task/x/ns/net"), Some("/proc/42"));
        assert_eq!(proc_task_dir("/proc/self/ns/net"), None);
        assert_eq!(proc_task_dir("/proc/thread-self/ns/net"), None);
        assert_eq!(proc_task_dir("/proc//ns/net"), None);
        assert_eq!(proc_task_dir("/run/netns/cni-1"), None);
        assert_eq!(proc_task_dir("/var/proc/42/ns/net"), None);
    }

    #[test]
    fn start_time_is_field_22_even_with_odd_names() {
        let line =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 100";
        assert_eq!(parse_start_time(line), Some(987654));
        assert_eq!(parse_start_time("4242 (x) S 1"), None);
        assert_eq!(parse_start_time("no paren"), None);
        let own = start_time("/proc/self").unwrap();
        assert_eq!(start_time("/proc/self").unwrap(), own);
    }
}
