//! Who on the node still holds a network namespace that its path no longer shows.
//!
//! A runtime in a mount namespace of its own (`MountFlags=slave`, `PrivateMounts`, a
//! snap, a nested node) pins `/run/netns/<name>` with a mount that gc's mount namespace
//! never sees; a process may keep a namespace open as a file, or by a socket it made
//! there; a mount namespace no process is in any more may still hold a mount of it. The
//! pod's namespace is alive all the same (DESIGN §5). So before a record of this boot is
//! judged missing, not a namespace or replaced, the node is asked:
//!
//! - where the kernel reopens a namespace from its nsfs file handle (Linux 6.18+), that
//!   is the answer: the handle names the namespace by its ID, which no other ever has,
//!   and reopens it exactly while anything holds it. It is used only once this kernel
//!   has shown, on a namespace made for the purpose, that a socket alone is enough
//!   (`Handles::probe`);
//! - otherwise `/proc` is searched, in tiers read only when the one before found
//!   nothing: every process's `ns/net` and the nsfs mounts of every mount namespace,
//!   including mount namespaces reached only through a mount of their `ns/mnt`; then every
//!   thread, those of an exited leader too; then every open file descriptor, and the
//!   namespace of every socket (`pidfd_getfd`, `SIOCGSKNS`). A match of device and inode
//!   is confirmed by the recorded cookie through the holder; a cookie that cannot be read,
//!   or a socket that cannot be looked at, errs towards live.
//!
//! The index is built at most once per gc or list run, and only when some record would
//! otherwise be called gone: live records never pay for it.

use super::kernel::{self, Pidfd, Reopen};
use super::{identity, NsId};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Holders kept per namespace: enough that one exiting between the scan and the check
/// leaves others to check, few enough that the host namespace's thousands of processes
/// cost no memory.
const HOLDERS_PER_NS: usize = 4;

/// How many mount namespaces deep a pin is followed (a mount namespace pinned only from
/// inside another pinned one, and so on).
const PIN_DEPTH: usize = 8;

/// (st_dev, st_ino) of an nsfs file.
type Key = (u64, u64);

/// A way into a mount namespace: a path to its nsfs file, seen from the mount namespace
/// before it (ours for the first pin of a chain), which must still be `key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    path: String,
    key: Key,
}

/// What keeps a namespace alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// The kernel reopened it from its file handle: something holds it.
    Kernel,
    /// A process whose network namespace it is.
    Process { pid: u32 },
    /// A thread of a process (after setns) whose network namespace it is.
    Thread { pid: u32, tid: u32 },
    /// An nsfs mount in the mount namespace of `pid`, at `mount_point` as that process
    /// sees it.
    Mount { pid: u32, mount_point: String },
    /// An nsfs mount in a mount namespace that no process needs to be in, kept by a
    /// mount or an open file of its `ns/mnt`, reached through `pins`.
    PinnedMount { pins: Vec<Pin>, mount_point: String },
    /// An open file of a process.
    File { pid: u32, fd: u32 },
    /// A socket made in it, open in a process.
    Socket { pid: u32, fd: u32 },
    /// Something that could not be looked into (permission): it may hold it.
    Unseen { what: String },
}

impl Holder {
    /// A path from here that reaches the namespace, for the holders that have one.
    fn path(&self, proc: &Path) -> Option<PathBuf> {
        Some(match self {
            Holder::Process { pid } => proc.join(format!("{pid}/ns/net")),
            Holder::Thread { pid, tid } => proc.join(format!("{pid}/task/{tid}/ns/net")),
            Holder::Mount { pid, mount_point } => proc
                .join(format!("{pid}/root"))
                .join(mount_point.trim_start_matches('/')),
            Holder::File { pid, fd } => proc.join(format!("{pid}/fd/{fd}")),
            Holder::Kernel
            | Holder::PinnedMount { .. }
            | Holder::Socket { .. }
            | Holder::Unseen { .. } => return None,
        })
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Holder::Kernel => write!(f, "held on the node (the kernel reopens it)"),
            Holder::Process { pid } => write!(f, "held by pid {pid}"),
            Holder::Thread { pid, tid } => write!(f, "held by thread {tid} of pid {pid}"),
            Holder::Mount { pid, mount_point } => {
                write!(
                    f,
                    "mounted at {mount_point} in the mount namespace of pid {pid}"
                )
            }
            Holder::PinnedMount { pins, mount_point } => {
                let via: Vec<&str> = pins.iter().map(|p| p.path.as_str()).collect();
                write!(
                    f,
                    "mounted at {mount_point} in the mount namespace pinned at {}",
                    via.join(", then ")
                )
            }
            Holder::File { pid, fd } => write!(f, "open as fd {fd} of pid {pid}"),
            Holder::Socket { pid, fd } => write!(f, "held by a socket, fd {fd} of pid {pid}"),
            Holder::Unseen { what } => write!(f, "perhaps held by {what}, which could not be read"),
        }
    }
}

#[derive(Default)]
struct Index {
    holders: HashMap<Key, Vec<Holder>>,
    /// nsfs mounts by mount point (as each mount namespace shows it), kept apart from
    /// `holders` so that a namespace's processes never crowd its mounts out: a record
    /// with no recorded identity can be found only by its path.
    mounts: HashMap<String, Vec<(Key, Holder)>>,
    /// The mount namespaces whose mounts were read.
    mount_namespaces: HashSet<Key>,
    /// Every nsfs mount point seen, of any kind of namespace: a descriptor opened through
    /// one reads back as that path (or `/` once it is detached), not as `net:[inode]`.
    nsfs_points: HashSet<String>,
    /// The first holder that could not be looked into.
    unseen: Option<Holder>,
}

impl Index {
    fn add(&mut self, key: Key, holder: Holder) {
        let v = self.holders.entry(key).or_default();
        if v.len() < HOLDERS_PER_NS {
            v.push(holder);
        }
    }

    fn add_mount(&mut self, key: Key, mount_point: String, holder: Holder) {
        let v = self.mounts.entry(mount_point).or_default();
        if v.len() < HOLDERS_PER_NS && !v.iter().any(|(k, _)| *k == key) {
            v.push((key, holder.clone()));
        }
        self.add(key, holder);
    }

    fn unseen(&mut self, what: String) {
        self.unseen.get_or_insert(Holder::Unseen { what });
    }
}

/// The kernel's nsfs file handles, once this kernel has shown they can be trusted.
struct Handles {
    /// Any open nsfs file: it names the mount handles are decoded on.
    nsfs: File,
}

impl Handles {
    /// Whether to ask the kernel directly: it encodes a namespace's handle as (ID, type,
    /// inode) with the ID being the cookie records carry, reopens our own namespace
    /// from one, and reopens a namespace that only a socket holds (the weakest holder;
    /// processes, threads, mounts and open files all pin a namespace as strongly).
    fn probe(proc: &Path) -> Option<Handles> {
        if crate::faults::ns_handles_disabled() {
            return None;
        }
        let own_path = proc.join("self/ns/net");
        let nsfs = File::open(&own_path).ok()?;
        let cookie = identity::ioctl_cookie(&nsfs).ok()?;
        let ino = nsfs.metadata().ok()?.ino();
        // Records may carry the cookie from SO_NETNS_COOKIE: it must be the same ID.
        if identity::socket_cookie(&nsfs).ok()? != cookie
            || !kernel::handle_encoding_matches(&own_path.to_string_lossy(), cookie, ino)
        {
            return None;
        }
        if !matches!(kernel::reopen_net(&nsfs, cookie, ino), Reopen::Alive(_)) {
            return None;
        }
        socket_alone_reopens(&nsfs).then_some(Handles { nsfs })
    }
}

/// Makes a namespace that only a socket holds (the thread that made it has exited and
/// closed everything else) and asks the kernel to reopen it by its handle.
fn socket_alone_reopens(nsfs: &File) -> bool {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    let made = std::thread::scope(|s| {
        s.spawn(|| -> Option<_> {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
            let ns = File::open("/proc/thread-self/ns/net").ok()?;
            let cookie = identity::ioctl_cookie(&ns).ok()?;
            let ino = ns.metadata().ok()?.ino();
            let sock = socket(
                AddressFamily::Inet,
                SockType::Datagram,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .ok()?;
            Some((sock, cookie, ino, nix::unistd::gettid()))
        })
        .join()
        .ok()
        .flatten()
    });
    let Some((sock, cookie, ino, tid)) = made else {
        return false;
    };
    // join() returns once the thread has run its last code; its namespaces are let go
    // a little later in its exit, and its task directory goes after that.
    let task = format!("/proc/self/task/{tid}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while Path::new(&task).exists() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let alive = matches!(kernel::reopen_net(nsfs, cookie, ino), Reopen::Alive(_));
    drop(sock);
    alive
}

/// The node's namespaces and their holders, read from `/proc` (the node's, once gc has
/// entered `--node-root`; the DaemonSet has the host's PID namespace) when first needed.
pub struct NodeIndex {
    proc: PathBuf,
    handles: OnceLock<Option<Handles>>,
    /// Processes and mounts.
    main: OnceLock<Index>,
    /// Threads: read only when a namespace is in neither processes nor mounts.
    threads: OnceLock<Index>,
    /// Open files and sockets: read only when no process, mount or thread has it.
    files: OnceLock<Index>,
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
            handles: OnceLock::new(),
            main: OnceLock::new(),
            threads: OnceLock::new(),
            files: OnceLock::new(),
        }
    }

    /// Whether the recorded namespace is alive somewhere on the node: the holder that
    /// shows it, or None when the kernel says no such namespace lives, or no holder has
    /// its device and inode, or every one that has them is provably another namespace
    /// (another cookie) or no longer there.
    pub fn find(&self, id: &NsId) -> Option<Holder> {
        let handles = self.handles.get_or_init(|| Handles::probe(&self.proc));
        if let (Some(h), Some(cookie)) = (handles, id.cookie) {
            match kernel::reopen_net(&h.nsfs, cookie, id.ino) {
                Reopen::Alive(f) if f.metadata().is_ok_and(|m| m.dev() == id.dev) => {
                    // Alive for certain; name a process or mount that holds it when the
                    // first, cheap tier shows one, for the operator reading the report.
                    let named = self.confirm_any(self.main(), id).0;
                    return Some(named.unwrap_or(Holder::Kernel));
                }
                Reopen::Stale => return None,
                // Not answered: the search below decides.
                Reopen::Alive(_) | Reopen::Unknown => {}
            }
        }
        self.search(id)
    }

    fn main(&self) -> &Index {
        self.main.get_or_init(|| build_main(&self.proc))
    }

    fn search(&self, id: &NsId) -> Option<Holder> {
        let mut vanished = false;
        for tier in 0..3 {
            let index = match tier {
                0 => self.main(),
                1 => self.threads.get_or_init(|| build_threads(&self.proc)),
                _ => self
                    .files
                    .get_or_init(|| build_files(&self.proc, self.main())),
            };
            let (found, gone) = self.confirm_any(index, id);
            if found.is_some() {
                return found;
            }
            vanished |= gone;
        }
        if vanished {
            // A holder seen in the index has exited or let go since. nsfs inode numbers
            // are reused (lowest free first), so a short-lived process in a namespace that
            // now has the recorded one's inode proves nothing once it is gone; but the
            // recorded namespace may also have moved to a holder the index never saw.
            // Look once more, afresh: what holds it now is found, and a holder gone again
            // holds nothing.
            let main = build_main(&self.proc);
            let fresh = [build_threads(&self.proc), build_files(&self.proc, &main)];
            if let Some(found) = std::iter::once(&main)
                .chain(&fresh)
                .find_map(|index| self.confirm_any(index, id).0)
            {
                return Some(found);
            }
        }
        // Nothing found, but something could not be looked into: it may be the holder.
        [self.main.get(), self.threads.get(), self.files.get()]
            .into_iter()
            .flatten()
            .find_map(|index| index.unseen.clone())
    }

    /// A network namespace mounted at `path` in some mount namespace on the node, with
    /// its identity read through that mount now: for a record that has no recorded
    /// identity (an adopted attachment whose path gc's mount namespace cannot see). The
    /// path alone is weaker than an identity: a mount another mount namespace made at the
    /// same path would be taken for it, which keeps a record (a leak), never frees one.
    pub fn mounted_at(&self, path: &str) -> Option<(NsId, Holder)> {
        let main = self.main();
        // mountinfo shows the path resolved: containerd names `/var/run/netns/cni-…`,
        // and `/var/run` is a link to `/run` on every current distribution.
        let mounts = std::iter::once(path.to_string())
            .chain(
                path.strip_prefix("/var/run/")
                    .map(|rest| format!("/run/{rest}")),
            )
            .find_map(|p| main.mounts.get(&p))?;
        mounts.iter().find_map(|(key, holder)| {
            // Still the mount the index saw; the start time is no part of it (the
            // recorded path is no /proc path).
            let file = self.open(holder, *key).ok()?;
            Some((
                NsId {
                    dev: key.0,
                    ino: key.1,
                    cookie: identity::netns_cookie(&file).ok(),
                    pid_start: None,
                },
                holder.clone(),
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
            match self.confirm(h, id) {
                Confirm::Same | Confirm::Unsure => return (Some(h.clone()), vanished),
                Confirm::Gone => vanished = true,
                Confirm::Other => {}
            }
        }
        (None, vanished)
    }

    fn confirm(&self, holder: &Holder, id: &NsId) -> Confirm {
        let file = match self.open(holder, (id.dev, id.ino)) {
            Ok(f) => f,
            Err(c) => return c,
        };
        let Some(cookie) = id.cookie else {
            return Confirm::Unsure;
        };
        match identity::netns_cookie(&file) {
            Ok(now) if now == cookie => Confirm::Same,
            Ok(_) => Confirm::Other,
            Err(_) => Confirm::Unsure,
        }
    }

    /// The namespace file the holder shows now, if it still is the nsfs file `key`.
    fn open(&self, holder: &Holder, key: Key) -> Result<File, Confirm> {
        match holder {
            Holder::Socket { pid, fd } => {
                let pidfd = Pidfd::open(*pid).map_err(|e| gone_or_unsure(&e))?;
                match pidfd.socket_netns(*fd as i32) {
                    Ok(Some(file)) => is_key(file, key),
                    // No longer a socket: the descriptor was closed and reused.
                    Ok(None) => Err(Confirm::Gone),
                    Err(e) => Err(gone_or_unsure(&e)),
                }
            }
            Holder::PinnedMount { pins, mount_point } => {
                let at = Path::new(mount_point);
                in_mount_ns(&self.proc, pins, || open_checked(at, key))
                    .unwrap_or_else(|e| Err(gone_or_unsure(&e)))
            }
            Holder::Kernel | Holder::Unseen { .. } => Err(Confirm::Unsure),
            _ => match holder.path(&self.proc) {
                Some(path) => open_checked(&path, key),
                None => Err(Confirm::Unsure),
            },
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Confirm {
    /// The recorded cookie, read through the holder.
    Same,
    /// Not provable either way (no recorded cookie, no permission): counted as live,
    /// since device and inode matched a moment ago.
    Unsure,
    /// Provably another namespace: the cookie read through the holder is another.
    Other,
    /// The holder no longer shows that namespace: its process exited, its descriptor was
    /// closed, or the path now shows something else. It holds nothing now.
    Gone,
}

/// A holder that has exited or let go (Gone), or one that could not be asked (Unsure).
fn gone_or_unsure(e: &io::Error) -> Confirm {
    use nix::libc::{EBADF, ENOENT, ESRCH};
    match e.raw_os_error() {
        Some(ESRCH | ENOENT | EBADF) => Confirm::Gone,
        _ if e.kind() == io::ErrorKind::NotFound => Confirm::Gone,
        _ => Confirm::Unsure,
    }
}

fn is_key(file: File, key: Key) -> Result<File, Confirm> {
    match file.metadata() {
        Ok(m) if (m.dev(), m.ino()) == key => Ok(file),
        Ok(_) => Err(Confirm::Gone),
        Err(_) => Err(Confirm::Unsure),
    }
}

/// Opens the nsfs file at `path` if it still is `key`. stat before open: what the path
/// shows now is opened only if it still is the nsfs file seen in the index (nothing else,
/// a device node say, is ever opened). Nothing or something else there now: the holder
/// let go.
fn open_checked(path: &Path, key: Key) -> Result<File, Confirm> {
    match std::fs::metadata(path) {
        Ok(m) if (m.dev(), m.ino()) == key => {}
        Ok(_) => return Err(Confirm::Gone),
        Err(e) => return Err(gone_or_unsure(&e)),
    }
    let file = super::open_ns(&path.to_string_lossy()).map_err(|_| Confirm::Unsure)?;
    match file.metadata() {
        Ok(m) if (m.dev(), m.ino()) == key => Ok(file),
        _ => Err(Confirm::Unsure),
    }
}

/// Runs `f` on a thread of its own inside the mount namespace that `pins` reach, with
/// its working directory at the node's `/proc` (that mount namespace may have none): a
/// thread that unshares its file system context may enter a mount namespace alone, and it
/// ends right after, so nothing else ever runs there.
fn in_mount_ns<T: Send>(proc: &Path, pins: &[Pin], f: impl FnOnce() -> T + Send) -> io::Result<T> {
    let proc_dir = File::open(proc)?;
    std::thread::scope(|s| {
        s.spawn(move || -> io::Result<T> {
            use nix::sched::CloneFlags;
            nix::sched::unshare(CloneFlags::CLONE_FS)?;
            for pin in pins {
                let ns = open_checked(Path::new(&pin.path), pin.key).map_err(|c| {
                    io::Error::from(match c {
                        Confirm::Gone => io::ErrorKind::NotFound,
                        _ => io::ErrorKind::PermissionDenied,
                    })
                })?;
                nix::sched::setns(&ns, CloneFlags::CLONE_NEWNS)?;
            }
            nix::unistd::fchdir(proc_dir.as_raw_fd())?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("a mount namespace reader panicked")))
    })
}

/// The namespace a `/proc/<pid>/ns/<kind>` link names, as (nsfs device, inode). The link
/// is read, not followed: `readlink` gives `net:[inode]` without making the kernel open
/// the namespace (half the cost of a stat over thousands of processes), and every
/// namespace lives on the one nsfs device.
fn link_key(path: &Path, nsfs_dev: u64) -> io::Result<Key> {
    let target = std::fs::read_link(path)?;
    let ino = target
        .to_str()
        .and_then(|t| ns_link_ino(t, "net"))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a namespace link"))?;
    Ok((nsfs_dev, ino))
}

/// The inode in a namespace link's text `<kind>:[<inode>]`.
fn ns_link_ino(target: &str, kind: &str) -> Option<u64> {
    target
        .strip_prefix(kind)?
        .strip_prefix(":[")?
        .strip_suffix(']')?
        .parse()
        .ok()
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

/// Every process's network namespace, and the nsfs mounts of every mount namespace,
/// those reached only through a pin too. Processes that exit meanwhile are skipped: what
/// they held is either held by another or gone.
fn build_main(proc: &Path) -> Index {
    let mut index = Index::default();
    let Some(dev) = nsfs_dev(proc) else {
        return index;
    };
    let mut pins = Vec::new();
    for pid in pids(proc) {
        let dir = proc.join(pid.to_string());
        if let Ok(key) = link_key(&dir.join("ns/net"), dev) {
            index.add(key, Holder::Process { pid });
        }
        let Ok(mnt) = std::fs::read_link(dir.join("ns/mnt")) else {
            continue;
        };
        let Some(mnt) = mnt.to_str().and_then(|t| ns_link_ino(t, "mnt")) else {
            continue;
        };
        if !index.mount_namespaces.insert((dev, mnt)) {
            continue;
        }
        // A process that exits before this read leaves its mount namespace unread; it
        // may have been its last, and then its mounts are gone with it.
        let Ok(text) = std::fs::read_to_string(dir.join("mountinfo")) else {
            index.mount_namespaces.remove(&(dev, mnt));
            continue;
        };
        for m in nsfs_mounts(&text) {
            index.nsfs_points.insert(m.mount_point.clone());
            let root = dir.join("root").join(m.mount_point.trim_start_matches('/'));
            match m.kind {
                NsKind::Net => index.add_mount(
                    m.key,
                    m.mount_point.clone(),
                    Holder::Mount {
                        pid,
                        mount_point: m.mount_point,
                    },
                ),
                NsKind::Mnt => pins.push(vec![Pin {
                    path: root.to_string_lossy().into_owned(),
                    key: m.key,
                }]),
            }
        }
    }
    follow_pins(proc, pins, &mut index);
    index
}

/// Reads the mount namespaces that `chains` reach and no process was seen in, and the
/// ones pinned inside those: their network namespace mounts are holders too.
fn follow_pins(proc: &Path, chains: Vec<Vec<Pin>>, index: &mut Index) {
    let mut queue: VecDeque<Vec<Pin>> = chains.into();
    while let Some(chain) = queue.pop_front() {
        let Some(last) = chain.last().map(|p| p.key) else {
            continue;
        };
        if chain.len() > PIN_DEPTH || !index.mount_namespaces.insert(last) {
            continue;
        }
        let text = match in_mount_ns(proc, &chain, || {
            std::fs::read_to_string("thread-self/mountinfo")
        }) {
            Ok(Ok(text)) => text,
            Ok(Err(e)) | Err(e) => {
                index.mount_namespaces.remove(&last);
                // EINVAL: another kind of namespace (a descriptor read back as a path).
                let other_kind = e.raw_os_error() == Some(nix::libc::EINVAL);
                if !other_kind && gone_or_unsure(&e) == Confirm::Unsure {
                    let at = chain.last().map(|p| p.path.as_str()).unwrap_or_default();
                    index.unseen(format!("the mount namespace pinned at {at}"));
                }
                continue;
            }
        };
        for m in nsfs_mounts(&text) {
            index.nsfs_points.insert(m.mount_point.clone());
            match m.kind {
                NsKind::Net => index.add_mount(
                    m.key,
                    m.mount_point.clone(),
                    Holder::PinnedMount {
                        pins: chain.clone(),
                        mount_point: m.mount_point,
                    },
                ),
                NsKind::Mnt => {
                    let mut next = chain.clone();
                    next.push(Pin {
                        path: m.mount_point,
                        key: m.key,
                    });
                    queue.push_back(next);
                }
            }
        }
    }
}

/// The threads of every process with more than one: a thread can setns alone, and live
/// on after its process's leader has exited (a zombie whose own links can no longer be
/// read).
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
        let own = link_key(&proc.join(format!("{pid}/ns/net")), dev).ok();
        for tid in pids(&task).into_iter().filter(|t| *t != pid) {
            if let Ok(key) = link_key(&task.join(format!("{tid}/ns/net")), dev) {
                if Some(key) != own {
                    index.add(key, Holder::Thread { pid, tid });
                }
            }
        }
    }
    index
}

/// Every open file descriptor that is a network namespace, every socket whose network
/// namespace is not its process's own, and the mount namespaces held open as files that
/// `main` (processes and mounts) has not read.
fn build_files(proc: &Path, main: &Index) -> Index {
    let mut index = Index {
        mount_namespaces: main.mount_namespaces.clone(),
        ..Index::default()
    };
    let Some(dev) = nsfs_dev(proc) else {
        return index;
    };
    let mut pins = Vec::new();
    for pid in pids(proc) {
        let fd_dir = proc.join(format!("{pid}/fd"));
        let Ok(dir) = std::fs::read_dir(&fd_dir) else {
            continue;
        };
        let mut sockets = Vec::new();
        for entry in dir.flatten() {
            let Some(fd) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            let Some(target) = target.to_str() else {
                continue;
            };
            let pin = |key| {
                vec![Pin {
                    path: entry.path().to_string_lossy().into_owned(),
                    key,
                }]
            };
            if let Some(ino) = ns_link_ino(target, "net") {
                index.add((dev, ino), Holder::File { pid, fd });
            } else if let Some(ino) = ns_link_ino(target, "mnt") {
                pins.push(pin((dev, ino)));
            } else if target.starts_with("socket:[") {
                sockets.push(fd);
            } else if target == "/" || main.nsfs_points.contains(target) {
                // Opened through a bind mount: only a stat tells what it is (the rest of
                // the paths are left unstatted: a stat can hang on a dead NFS server).
                let Ok(m) = std::fs::metadata(entry.path()) else {
                    continue;
                };
                if m.dev() == dev {
                    // Either kind: a network namespace's key matches records, a mount
                    // namespace's is followed (any other kind is skipped there).
                    index.add((dev, m.ino()), Holder::File { pid, fd });
                    pins.push(pin((dev, m.ino())));
                }
            }
        }
        if !sockets.is_empty() {
            index_sockets(proc, dev, pid, &sockets, &mut index);
        }
    }
    follow_pins(proc, pins, &mut index);
    index
}

/// The network namespaces of one process's sockets that are not its own namespace.
fn index_sockets(proc: &Path, dev: u64, pid: u32, sockets: &[u32], index: &mut Index) {
    let own = link_key(&proc.join(format!("{pid}/ns/net")), dev).ok();
    let pidfd = match Pidfd::open(pid) {
        Ok(p) => p,
        Err(e) if gone_or_unsure(&e) == Confirm::Gone => return,
        Err(_) => return index.unseen(format!("the sockets of pid {pid}")),
    };
    for &fd in sockets {
        match pidfd.socket_netns(fd as i32) {
            Ok(Some(ns)) => {
                let Ok(m) = ns.metadata() else { continue };
                let key = (m.dev(), m.ino());
                if Some(key) != own {
                    index.add(key, Holder::Socket { pid, fd });
                }
            }
            Ok(None) => {}
            Err(e) if gone_or_unsure(&e) == Confirm::Gone => {}
            Err(_) => index.unseen(format!("socket fd {fd} of pid {pid}")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NsKind {
    Net,
    Mnt,
}

/// One nsfs mount of a `mountinfo`.
#[derive(Debug, PartialEq, Eq)]
struct NsMount {
    kind: NsKind,
    key: Key,
    mount_point: String,
}

/// The network and mount namespaces mounted in one `mountinfo`: lines whose file system
/// is nsfs and whose root is `net:[inode]` or `mnt:[inode]`, with the mount's device and
/// its mount point.
fn nsfs_mounts(mountinfo: &str) -> Vec<NsMount> {
    mountinfo.lines().filter_map(nsfs_mount).collect()
}

fn nsfs_mount(line: &str) -> Option<NsMount> {
    // id parent major:minor root mount-point options [optional...] - fstype source super
    let (left, right) = line.split_once(" - ")?;
    if right.split(' ').next()? != "nsfs" {
        return None;
    }
    let mut f = left.split(' ');
    let (_id, _parent, dev, root, mount_point) =
        (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let (kind, ino) = match (ns_link_ino(root, "net"), ns_link_ino(root, "mnt")) {
        (Some(ino), _) => (NsKind::Net, ino),
        (None, Some(ino)) => (NsKind::Mnt, ino),
        (None, None) => return None,
    };
    let (major, minor) = dev.split_once(':')?;
    let dev = nix::sys::stat::makedev(major.parse().ok()?, minor.parse().ok()?);
    Some(NsMount {
        kind,
        key: (dev, ino),
        mount_point: unescape(mount_point),
    })
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
        let got = nsfs_mounts(text);
        let dev = nix::sys::stat::makedev(0, 4);
        let m = |kind, ino, at: &str| NsMount {
            kind,
            key: (dev, ino),
            mount_point: at.to_string(),
        };
        assert_eq!(
            got,
            vec![
                m(NsKind::Net, 4026532288, "/run/netns/cl-1"),
                m(NsKind::Net, 4026532300, "/run/netns/with space"),
                m(NsKind::Mnt, 4026532400, "/run/mnt-pin"),
                m(NsKind::Net, 4026532301, "/tmp/x"),
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

    /// The /proc search alone, as on a kernel without nsfs handles.
    fn search_only() -> NodeIndex {
        let index = NodeIndex::new();
        let _ = index.handles.set(None);
        index
    }

    /// A namespace made by a thread that has exited since, held only by what
    /// `keep` made inside it (returned to the caller). Needs root.
    fn held_only_by<T: Send>(keep: impl FnOnce() -> T + Send) -> (NsId, T) {
        let (id, kept, tid) = std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                let super::super::Probe::Namespace(id) =
                    super::super::probe("/proc/thread-self/ns/net")
                else {
                    panic!("/proc/thread-self/ns/net is not nsfs");
                };
                (id, keep(), nix::unistd::gettid())
            })
            .join()
            .unwrap()
        });
        while Path::new(&format!("/proc/self/task/{tid}")).exists() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        (id, kept)
    }

    /// An open file of the namespace, and a socket made in it, each hold it alone: the
    /// search finds them, the kernel's handle reopens it, and once they are closed
    /// neither finds anything.
    #[test]
    fn an_open_file_or_a_socket_alone_holds_a_namespace() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let me = std::process::id();
        let (id, file) = held_only_by(|| File::open("/proc/thread-self/ns/net").unwrap());
        let fd = file.as_raw_fd() as u32;
        assert_eq!(search_only().find(&id), Some(Holder::File { pid: me, fd }));
        let kernel = NodeIndex::new().find(&id);
        // Where the kernel's handles are trusted (Linux 6.18+ here), it answers alone.
        let handles = Handles::probe(Path::new("/proc")).is_some();
        eprintln!("nsfs handles trusted on this kernel: {handles}");
        if handles {
            assert_eq!(kernel, Some(Holder::Kernel));
        }
        assert!(matches!(kernel, Some(Holder::Kernel | Holder::File { .. })));
        drop(file);
        assert_eq!(search_only().find(&id), None);
        assert_eq!(NodeIndex::new().find(&id), None);

        use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
        let (id, sock) = held_only_by(|| {
            socket(
                AddressFamily::Inet,
                SockType::Datagram,
                SockFlag::SOCK_CLOEXEC,
                None,
            )
            .unwrap()
        });
        let fd = sock.as_raw_fd() as u32;
        assert_eq!(
            search_only().find(&id),
            Some(Holder::Socket { pid: me, fd })
        );
        let kernel = NodeIndex::new().find(&id);
        assert!(matches!(
            kernel,
            Some(Holder::Kernel | Holder::Socket { .. })
        ));
        drop(sock);
        assert_eq!(search_only().find(&id), None);
        assert_eq!(NodeIndex::new().find(&id), None);
    }

    /// A namespace mounted only inside a mount namespace no process is in, which only a
    /// bind mount of its `ns/mnt` keeps (`unshare --mount=FILE`), is found through that
    /// pin; once the pin is gone, nothing holds it. Needs root and util-linux.
    #[test]
    fn a_mount_in_a_pinned_mount_namespace_holds_a_namespace() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let sh = |script: &str| {
            let st = std::process::Command::new("sh")
                .args(["-c", script])
                .status()
                .unwrap();
            assert!(st.success(), "{script}");
        };
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let (id, file) = held_only_by(|| File::open("/proc/thread-self/ns/net").unwrap());
        let src = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
        sh(&format!(
            "mkdir {d}/pin && mount --bind {d}/pin {d}/pin && mount --make-private {d}/pin \
             && touch {d}/pin/mnt {d}/target \
             && unshare --mount={d}/pin/mnt --propagation private mount --bind {src} {d}/target"
        ));
        drop(file);
        let found = search_only().find(&id);
        let cleanup = format!("umount {d}/pin/mnt; umount {d}/pin");
        match &found {
            Some(Holder::PinnedMount { pins, mount_point }) => {
                assert_eq!(pins.len(), 1);
                assert_eq!(mount_point, &format!("{d}/target"));
            }
            other => {
                sh(&cleanup);
                panic!("found {other:?}");
            }
        }
        assert!(NodeIndex::new().find(&id).is_some());
        sh(&cleanup);
        assert_eq!(search_only().find(&id), None);
        assert_eq!(NodeIndex::new().find(&id), None);
    }

    fn own() -> NsId {
        let super::super::Probe::Namespace(id) = super::super::probe("/proc/self/ns/net") else {
            panic!("/proc/self/ns/net is not nsfs here");
        };
        id
    }

    #[test]
    fn a_process_holds_its_namespace_and_a_cookie_tells_another() {
        let index = search_only();
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
        let found = search_only().find(&id);
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
        let index = search_only();
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
            Some(PathBuf::from("/proc/99/root/run/netns/x"))
        );
    }
}
