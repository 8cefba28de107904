//! Who on the node still holds a network namespace that its path no longer shows.
//!
//! A runtime in a mount namespace of its own (`MountFlags=slave`, `PrivateMounts`, a
//! snap, a nested node) pins `/run/netns/<name>` with a mount that gc's mount namespace
//! never sees: the path is missing, is the empty file the bind mount covers, or shows the
//! node's own namespace mounted at the same path. The pod's
//! namespace is alive all the same, held by its processes or by that mount. So before a
//! record of this boot is judged missing, not a namespace or replaced, the node is searched: every
//! process's `ns/net`, and the nsfs mounts of every mount namespace (each `mountinfo`
//! read once). A match of device and inode is confirmed by the recorded cookie through a
//! path that reaches the namespace; a cookie that cannot be read errs towards live.
//!
//! The index is built at most once per gc or list run, and only when some record would
//! otherwise be called gone: live records never pay for it.

use super::{identity, NsId};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Holders kept per namespace: enough that one exiting between the scan and the check
/// leaves others to check, few enough that the host namespace's thousands of processes
/// cost no memory.
const HOLDERS_PER_NS: usize = 4;

/// What keeps a namespace alive, as a path into it shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// A process whose network namespace it is.
    Process { pid: u32 },
    /// A thread of a process (after setns) whose network namespace it is.
    Thread { pid: u32, tid: u32 },
    /// An nsfs mount in the mount namespace of `pid`, at `mount_point` as that process
    /// sees it.
    Mount { pid: u32, mount_point: String },
}

impl Holder {
    /// A path from here that reaches the namespace.
    fn path(&self, proc: &Path) -> PathBuf {
        match self {
            Holder::Process { pid } => proc.join(format!("{pid}/ns/net")),
            Holder::Thread { pid, tid } => proc.join(format!("{pid}/task/{tid}/ns/net")),
            Holder::Mount { pid, mount_point } => proc
                .join(format!("{pid}/root"))
                .join(mount_point.trim_start_matches('/')),
        }
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::Process { pid } => write!(f, "held by pid {pid}"),
            Holder::Thread { pid, tid } => write!(f, "held by thread {tid} of pid {pid}"),
            Holder::Mount { pid, mount_point } => {
                write!(
                    f,
                    "mounted at {mount_point} in the mount namespace of pid {pid}"
                )
            }
        }
    }
}

/// (st_dev, st_ino) of an nsfs file.
type Key = (u64, u64);

#[derive(Default)]
struct Index {
    holders: HashMap<Key, Vec<Holder>>,
    /// nsfs mounts by mount point (as each mount namespace shows it), kept apart from
    /// `holders` so that a namespace's processes never crowd its mounts out: a record
    /// with no recorded identity can be found only by its path.
    mounts: HashMap<String, Vec<(Key, u32)>>,
}

impl Index {
    fn add(&mut self, key: Key, holder: Holder) {
        let v = self.holders.entry(key).or_default();
        if v.len() < HOLDERS_PER_NS {
            v.push(holder);
        }
    }

    fn add_mount(&mut self, key: Key, pid: u32, mount_point: String) {
        let v = self.mounts.entry(mount_point.clone()).or_default();
        if v.len() < HOLDERS_PER_NS && !v.iter().any(|(k, _)| *k == key) {
            v.push((key, pid));
        }
        self.add(key, Holder::Mount { pid, mount_point });
    }
}

/// The node's namespaces and their holders, read from `/proc` (the node's, once gc has
/// entered `--node-root`; the DaemonSet has the host's PID namespace) when first needed.
pub struct NodeIndex {
    proc: PathBuf,
    /// Processes and mounts.
    main: OnceLock<Index>,
    /// Threads: read only when a namespace is in neither processes nor mounts.
    threads: OnceLock<Index>,
}

impl fmt::Debug for NodeIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeIndex")
            .field("proc", &self.proc)
            .field("built", &self.main.get().is_some())
            .finish()
    }
}

impl Default for NodeIndex {
    fn default() -> Self {
        NodeIndex::new()
    }
}

impl NodeIndex {
    pub fn new() -> NodeIndex {
        NodeIndex::at(PathBuf::from("/proc"))
    }

    pub fn at(proc: PathBuf) -> NodeIndex {
        NodeIndex {
            proc,
            main: OnceLock::new(),
            threads: OnceLock::new(),
        }
    }

    /// Whether the recorded namespace is alive somewhere on the node: the holder that
    /// shows it, or None when no holder has its device and inode, or every one that has
    /// them is provably another namespace (another cookie) or no longer there.
    pub fn find(&self, id: &NsId) -> Option<Holder> {
        let main = self.main.get_or_init(|| build_main(&self.proc));
        let (found, mut vanished) = self.confirm_any(main, id);
        if found.is_some() {
            return found;
        }
        let threads = self.threads.get_or_init(|| build_threads(&self.proc));
        let (found, gone) = self.confirm_any(threads, id);
        if found.is_some() {
            return found;
        }
        vanished |= gone;
        if !vanished {
            return None;
        }
        // A holder seen in the index has exited or let go since. nsfs inode numbers are
        // reused (lowest free first), so a short-lived process in a namespace that now has
        // the recorded one's inode proves nothing once it is gone; but the recorded
        // namespace may also have moved to a holder the index never saw. Look once more,
        // afresh: what holds it now is found, and a holder gone again holds nothing.
        [build_main(&self.proc), build_threads(&self.proc)]
            .iter()
            .find_map(|fresh| self.confirm_any(fresh, id).0)
    }

    /// A network namespace mounted at `path` in some mount namespace on the node, with
    /// its identity read through that mount now: for a record that has no recorded
    /// identity (an adopted attachment whose path gc's mount namespace cannot see). The
    /// path alone is weaker than an identity: a mount another mount namespace made at the
    /// same path would be taken for it, which keeps a record (a leak), never frees one.
    pub fn mounted_at(&self, path: &str) -> Option<(NsId, Holder)> {
        let main = self.main.get_or_init(|| build_main(&self.proc));
        // mountinfo shows the path resolved: containerd names `/var/run/netns/cni-…`,
        // and `/var/run` is a link to `/run` on every current distribution.
        let (mount_point, mounts) = std::iter::once(path.to_string())
            .chain(
                path.strip_prefix("/var/run/")
                    .map(|rest| format!("/run/{rest}")),
            )
            .find_map(|p| main.mounts.get(&p).map(|m| (p, m)))?;
        mounts.iter().find_map(|&(key, pid)| {
            let holder = Holder::Mount {
                pid,
                mount_point: mount_point.clone(),
            };
            let through = holder.path(&self.proc);
            let super::Probe::Namespace(id) = super::probe(&through.to_string_lossy()) else {
                return None;
            };
            // Still the mount the index saw; its start time is the holder's, not the
            // attachment's (the recorded path is no /proc path).
            ((id.dev, id.ino) == key).then_some((
                NsId {
                    pid_start: None,
                    ..id
                },
                holder,
            ))
        })
    }

    /// The first holder with the recorded device and inode that is the recorded namespace
    /// or cannot be told apart from it, and whether any such holder had gone by the time
    /// it was looked at.
    fn confirm_any(&self, index: &Index, id: &NsId) -> (Option<Holder>, bool) {
        let Some(holders) = index.holders.get(&(id.dev, id.ino)) else {
            return (None, false);
        };
        let mut vanished = false;
        for h in holders {
            match confirm(&h.path(&self.proc), id) {
                Confirm::Same | Confirm::Unsure => return (Some(h.clone()), vanished),
                Confirm::Gone => vanished = true,
                Confirm::Other => {}
            }
        }
        (None, vanished)
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Confirm {
    /// The recorded cookie, read through the holder's path.
    Same,
    /// Not provable either way (no recorded cookie, the holder gone, no permission):
    /// counted as live, since device and inode matched a moment ago.
    Unsure,
    /// Provably another namespace: the cookie read through the path is another.
    Other,
    /// The holder no longer shows that namespace: its process exited, or the path now
    /// shows something else. It holds nothing now.
    Gone,
}

fn confirm(path: &Path, id: &NsId) -> Confirm {
    let same = |m: &std::fs::Metadata| m.dev() == id.dev && m.ino() == id.ino;
    // stat before open: what the path shows now is opened only if it still is the
    // nsfs file seen in the index (nothing else, a device node say, is ever opened).
    // Nothing or something else there now: the holder let go (the caller looks again).
    match std::fs::metadata(path) {
        Ok(m) if same(&m) => {}
        Ok(_) => return Confirm::Gone,
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                || e.raw_os_error() == Some(nix::libc::ESRCH) =>
        {
            return Confirm::Gone
        }
        Err(_) => return Confirm::Unsure,
    }
    let Some(cookie) = id.cookie else {
        return Confirm::Unsure;
    };
    let Ok(file) = super::open_ns(&path.to_string_lossy()) else {
        return Confirm::Unsure;
    };
    match file.metadata() {
        Ok(m) if same(&m) => {}
        _ => return Confirm::Unsure,
    }
    match identity::netns_cookie(&file) {
        Ok(now) if now == cookie => Confirm::Same,
        Ok(_) => Confirm::Other,
        Err(_) => Confirm::Unsure,
    }
}

/// The namespace a `/proc/<pid>/ns/<kind>` link names, as (nsfs device, inode). The link
/// is read, not followed: `readlink` gives `net:[inode]` without making the kernel open
/// the namespace (half the cost of a stat over thousands of processes), and every
/// namespace lives on the one nsfs device.
fn link_key(path: &Path, nsfs_dev: u64) -> io::Result<Key> {
    let target = std::fs::read_link(path)?;
    let ino = target
        .to_str()
        .and_then(|t| t.split_once(":["))
        .and_then(|(_, rest)| rest.strip_suffix(']'))
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a namespace link"))?;
    Ok((nsfs_dev, ino))
}

/// The nsfs device, from our own namespace's file.
fn nsfs_dev(proc: &Path) -> Option<u64> {
    std::fs::metadata(proc.join("self/ns/net"))
        .ok()
        .map(|m| m.dev())
}

fn pids(proc: &Path) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// Every process's network namespace, and the nsfs mounts of every mount namespace.
/// Processes that exit meanwhile are skipped: what they held is either held by another
/// or gone.
fn build_main(proc: &Path) -> Index {
    let mut index = Index::default();
    let Some(dev) = nsfs_dev(proc) else {
        return index;
    };
    let mut mount_namespaces: HashSet<Key> = HashSet::new();
    for pid in pids(proc) {
        let dir = proc.join(pid.to_string());
        if let Ok(key) = link_key(&dir.join("ns/net"), dev) {
            index.add(key, Holder::Process { pid });
        }
        let Ok(mnt) = link_key(&dir.join("ns/mnt"), dev) else {
            continue;
        };
        if !mount_namespaces.insert(mnt) {
            continue;
        }
        // A process that exits before this read leaves its mount namespace unread; it
        // may have been its last, and then its mounts are gone with it.
        let Ok(text) = std::fs::read_to_string(dir.join("mountinfo")) else {
            mount_namespaces.remove(&mnt);
            continue;
        };
        for (key, mount_point) in nsfs_net_mounts(&text) {
            index.add_mount(key, pid, mount_point);
        }
    }
    index
}

/// The threads of every process with more than one: a thread can setns alone.
fn build_threads(proc: &Path) -> Index {
    let mut index = Index::default();
    let Some(dev) = nsfs_dev(proc) else {
        return index;
    };
    for pid in pids(proc) {
        let task = proc.join(format!("{pid}/task"));
        // procfs gives a task directory 2 + threads links: one stat skips the (most)
        // processes with a single thread, whose thread is the process already indexed.
        if !std::fs::metadata(&task).is_ok_and(|m| m.nlink() > 3) {
            continue;
        }
        let Ok(own) = link_key(&proc.join(format!("{pid}/ns/net")), dev) else {
            continue;
        };
        for tid in pids(&task).into_iter().filter(|t| *t != pid) {
            if let Ok(key) = link_key(&task.join(format!("{tid}/ns/net")), dev) {
                if key != own {
                    index.add(key, Holder::Thread { pid, tid });
                }
            }
        }
    }
    index
}

/// The network namespaces mounted in one `mountinfo`: lines whose file system is nsfs
/// and whose root is `net:[inode]`, with the mount's device and its mount point.
fn nsfs_net_mounts(mountinfo: &str) -> Vec<(Key, String)> {
    mountinfo.lines().filter_map(nsfs_net_mount).collect()
}

fn nsfs_net_mount(line: &str) -> Option<(Key, String)> {
    // id parent major:minor root mount-point options [optional...] - fstype source super
    let (left, right) = line.split_once(" - ")?;
    if right.split(' ').next()? != "nsfs" {
        return None;
    }
    let mut f = left.split(' ');
    let (_id, _parent, dev, root, mount_point) =
        (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let ino: u64 = root
        .strip_prefix("net:[")?
        .strip_suffix(']')?
        .parse()
        .ok()?;
    let (major, minor) = dev.split_once(':')?;
    let dev = nix::sys::stat::makedev(major.parse().ok()?, minor.parse().ok()?);
    Some(((dev, ino), unescape(mount_point)))
}

/// mountinfo writes space, tab, newline and backslash in a path as `\ooo` octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_nsfs_lines_give_device_inode_and_mount_point() {
        let text = "\
22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw
611 29 0:4 net:[4026532288] /run/netns/cl-1 rw shared:232 - nsfs nsfs rw
612 29 0:4 net:[4026532300] /run/netns/with\\040space rw - nsfs nsfs rw
613 29 0:4 mnt:[4026532400] /run/mnt-pin rw - nsfs nsfs rw
614 29 0:4 net:[4026532301] /tmp/x rw master:3 shared:4 - nsfs nsfs rw
";
        let got = nsfs_net_mounts(text);
        let dev = nix::sys::stat::makedev(0, 4);
        assert_eq!(
            got,
            vec![
                ((dev, 4026532288), "/run/netns/cl-1".to_string()),
                ((dev, 4026532300), "/run/netns/with space".to_string()),
                ((dev, 4026532301), "/tmp/x".to_string()),
            ]
        );
        assert_eq!(unescape("a\\134b\\011c\\"), "a\\b\tc\\");
    }

    #[test]
    fn a_namespace_link_reads_as_its_stat() {
        let proc = Path::new("/proc");
        let dev = nsfs_dev(proc).unwrap();
        let m = std::fs::metadata("/proc/self/ns/net").unwrap();
        assert_eq!(
            link_key(Path::new("/proc/self/ns/net"), dev).unwrap(),
            (m.dev(), m.ino())
        );
        assert!(link_key(Path::new("/proc/self/exe"), dev).is_err());
    }

    fn own() -> NsId {
        let super::super::Probe::Namespace(id) = super::super::probe("/proc/self/ns/net") else {
            panic!("/proc/self/ns/net is not nsfs here");
        };
        id
    }

    #[test]
    fn a_process_holds_its_namespace_and_a_cookie_tells_another() {
        let index = NodeIndex::new();
        let id = own();
        assert!(matches!(index.find(&id), Some(Holder::Process { .. })));
        // Same device and inode, another cookie: provably not the recorded namespace.
        let other = NsId {
            cookie: id.cookie.map(|c| c ^ 1),
            ..id
        };
        assert_eq!(index.find(&other), None);
        // No cookie recorded: device and inode are all there is, so live.
        let weak = NsId { cookie: None, ..id };
        assert!(index.find(&weak).is_some());
        // A namespace no one has.
        let none = NsId { ino: 1, ..id };
        assert_eq!(index.find(&none), None);
    }

    /// A namespace only one thread of a process is in (it unshared on its own) is found
    /// among the threads, once no process and no mount has it. Needs root (unshare).
    #[test]
    fn a_thread_alone_in_a_namespace_holds_it() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let tid = nix::unistd::gettid().as_raw() as u32;
            let super::super::Probe::Namespace(id) =
                super::super::probe("/proc/thread-self/ns/net")
            else {
                panic!("/proc/thread-self/ns/net is not nsfs");
            };
            tx.send((tid, id)).unwrap();
            // Stays in it until the test has looked.
            let _ = done_rx.recv();
        });
        let (tid, id) = rx.recv().unwrap();
        let found = NodeIndex::new().find(&id);
        done_tx.send(()).unwrap();
        t.join().unwrap();
        assert_eq!(
            found,
            Some(Holder::Thread {
                pid: std::process::id(),
                tid
            })
        );
    }

    /// A holder the index saw that has since exited holds nothing: nsfs inodes are
    /// reused, so a short-lived process in a namespace with the recorded one's inode
    /// must not keep a gone sandbox live. Needs root (unshare).
    #[test]
    fn a_holder_gone_since_the_index_holds_nothing() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let mut child = std::process::Command::new("unshare")
            .args(["-n", "sleep", "30"])
            .spawn()
            .unwrap();
        let ns = format!("/proc/{}/ns/net", child.id());
        // unshare execs sleep after it has entered the new namespace.
        let id = loop {
            let super::super::Probe::Namespace(id) = super::super::probe(&ns) else {
                panic!("{ns} is not nsfs");
            };
            if id.ino != own().ino {
                break id;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let index = NodeIndex::new();
        // Built while the child holds it.
        assert!(matches!(index.find(&id), Some(Holder::Process { .. })));
        child.kill().unwrap();
        child.wait().unwrap();
        // Same index, holder gone, namespace freed: found nowhere, even with no cookie
        // to tell it apart.
        assert_eq!(index.find(&id), None);
        assert_eq!(index.find(&NsId { cookie: None, ..id }), None);
    }

    #[test]
    fn holders_read_as_the_report_shows_them() {
        assert_eq!(Holder::Process { pid: 12 }.to_string(), "held by pid 12");
        assert_eq!(
            Holder::Mount {
                pid: 99,
                mount_point: "/run/netns/x".into()
            }
            .to_string(),
            "mounted at /run/netns/x in the mount namespace of pid 99"
        );
        assert_eq!(
            Holder::Mount {
                pid: 99,
                mount_point: "/run/netns/x".into()
            }
            .path(Path::new("/proc")),
            PathBuf::from("/proc/99/root/run/netns/x")
        );
    }
}
