//! Is a sandbox still there? The boot ID and the identity of a network namespace.
//!
//! Every rule here errs towards *live*: only positive evidence that the namespace is
//! gone (another boot, no file, something else at the path) makes a record stale. And a
//! replayed DEL may be pointed at the namespace only when an identity the kernel never
//! reuses within a boot says it is the recorded one (`Liveness::verified`).

pub mod holders;
pub mod identity;
mod kernel;

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// What names one network namespace during one boot. Device and inode are what the
/// path showed at ADD; they are reused by later namespaces, so they can only ever prove
/// that a namespace is *not* the recorded one. The cookie, and for `/proc/<pid>/` paths
/// the process start time, are never reused within a boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
    /// The namespace cookie (NS_GET_ID ioctl, else SO_NETNS_COOKIE); absent where the
    /// kernel offers neither, and in records written before cni-ledger read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<u64>,
    /// Start time (clock ticks since boot) of the process a `/proc/<pid>/` path names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_start: Option<u64>,
}

pub fn boot_id() -> io::Result<String> {
    if let Some(id) = crate::faults::boot_id_override() {
        return Ok(id);
    }
    read_boot_id(Path::new(BOOT_ID_PATH))
}

/// One open, one read and one close on every ADD (`read_to_string` adds a stat and two
/// reads): the ID is 36 characters and a newline, which procfs returns in one read.
fn read_boot_id(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut file = File::open(path)?;
    let mut buf = [0u8; 128];
    let mut len = 0;
    while len < buf.len() && !buf[..len].contains(&b'\n') {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let text = std::str::from_utf8(&buf[..len])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(text.trim().to_string())
}

#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// A namespace file (nsfs) with this identity.
    Namespace(NsId),
    /// Nothing at the path.
    Missing,
    /// Something that is not a namespace (a leftover mount point file, say).
    NotNamespace,
    /// Could not tell (permission, I/O): treated as live.
    Unknown(String),
}

/// Opens what a netns path names, for fstat and the cookie ioctl. Called only once the
/// path's device and inode were seen to be the recorded nsfs file's (or nsfs was
/// checked), so nothing else, such as a device node, is ever opened.
fn open_ns(path: &str) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)
}

fn is_nsfs(path: &str) -> Result<bool, nix::errno::Errno> {
    nix::sys::statfs::statfs(Path::new(path))
        .map(|fs| fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// Everything ADD records about the namespace at `path` now. The strong parts are best
/// effort: what the kernel cannot give is left out, and the record is then judged on
/// what it has (never passed its namespace on replay without a cookie).
pub fn probe(path: &str) -> Probe {
    if path.is_empty() {
        return Probe::Missing;
    }
    match is_nsfs(path) {
        Ok(true) => {}
        Ok(false) => return Probe::NotNamespace,
        Err(nix::errno::Errno::ENOENT) => return Probe::Missing,
        Err(e) => return Probe::Unknown(e.to_string()),
    }
    let file = match open_ns(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Probe::Missing,
        Err(e) => return Probe::Unknown(e.to_string()),
    };
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => return Probe::Unknown(e.to_string()),
    };
    let pid_start = identity::proc_task_dir(path).and_then(|d| identity::start_time(d).ok());
    Probe::Namespace(NsId {
        dev: meta.dev(),
        ino: meta.ino(),
        cookie: identity::netns_cookie(&file).ok(),
        pid_start,
    })
}

/// Why a record is stale (serialised as `as_str` says).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    BootChanged,
    NetnsMissing,
    NetnsReplaced,
    NetnsNotNamespace,
    NotValid,
    NotInRuntime,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BootChanged => "boot-changed",
            Reason::NetnsMissing => "netns-missing",
            Reason::NetnsReplaced => "netns-replaced",
            Reason::NetnsNotNamespace => "netns-not-namespace",
            Reason::NotValid => "not-valid",
            Reason::NotInRuntime => "not-in-runtime",
        }
    }
}

/// Which identity decided a record's liveness (shown by `list --json` and gc's report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Evidence {
    /// Recorded in another boot.
    BootId,
    /// Nothing at the path (or the process it names has exited).
    Path,
    /// Something at the path that is not a namespace.
    Filesystem,
    /// Device/inode differ (stale); or they match and nothing stronger was recorded
    /// (live, but never verified: a replay gets no namespace).
    DevIno,
    /// The process at a `/proc/<pid>/` path started at another time: a recycled PID.
    PidStart,
    /// The namespace cookie differs (stale), or matches (live and verified).
    Cookie,
    /// The path could not be examined now (permission, I/O): live, not verified.
    Unreadable,
    /// Neither the path nor the directory that would hold it can be seen from here: not
    /// the node's view, so no evidence (live, not verified).
    Unseen,
    /// The path shows nothing, no namespace or another one, but something elsewhere on the
    /// node holds the recorded namespace (`sandbox::holders`): live, not verified.
    Held,
    /// The runtime's valid list does not name the attachment.
    ValidList,
    /// The CRI runtime has no such pod sandbox.
    Runtime,
}

impl Evidence {
    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::BootId => "boot-id",
            Evidence::Path => "path",
            Evidence::Filesystem => "filesystem",
            Evidence::DevIno => "dev-ino",
            Evidence::PidStart => "pid-start",
            Evidence::Cookie => "cookie",
            Evidence::Unreadable => "unreadable",
            Evidence::Unseen => "unseen",
            Evidence::Held => "held",
            Evidence::ValidList => "valid-list",
            Evidence::Runtime => "runtime",
        }
    }
}

/// The verdict on one record's namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// None: live.
    pub reason: Option<Reason>,
    pub evidence: Evidence,
    /// The namespace at the path is the recorded one by its cookie, checked just now:
    /// the only case in which a replayed DEL may be given the path.
    pub verified: bool,
}

impl Liveness {
    fn stale(reason: Reason, evidence: Evidence) -> Liveness {
        Liveness {
            reason: Some(reason),
            evidence,
            verified: false,
        }
    }
    fn live(evidence: Evidence) -> Liveness {
        Liveness {
            reason: None,
            evidence,
            verified: false,
        }
    }
}

/// Rules 1–3 of "when is a sandbox gone" (docs/DESIGN.md): boot, path, identity.
pub fn liveness(
    record_boot: &str,
    netns: &str,
    recorded: Option<NsId>,
    current_boot: &str,
) -> Liveness {
    if record_boot != current_boot {
        return Liveness::stale(Reason::BootChanged, Evidence::BootId);
    }
    // Only an adopted record can lack a path (ADD requires CNI_NETNS): with nothing to
    // probe, the boot ID and the runtime's lists alone can say it is gone.
    if netns.is_empty() {
        return Liveness::live(Evidence::BootId);
    }
    // stat first: whatever is not the recorded nsfs file is judged without opening it.
    let meta = match std::fs::metadata(netns) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return nothing_at(netns),
        Err(_) => return Liveness::live(Evidence::Unreadable),
    };
    let same_file = |m: &std::fs::Metadata, id: &NsId| m.dev() == id.dev && m.ino() == id.ino;
    let was = match recorded {
        Some(was) if same_file(&meta, &was) => was,
        // Another file at the path, or nothing recorded at ADD: only its kind can tell.
        _ => {
            return match is_nsfs(netns) {
                Ok(true) if recorded.is_some() => {
                    Liveness::stale(Reason::NetnsReplaced, Evidence::DevIno)
                }
                // Without a recorded identity a namespace at the path counts as live.
                Ok(true) => Liveness::live(Evidence::DevIno),
                Ok(false) => Liveness::stale(Reason::NetnsNotNamespace, Evidence::Filesystem),
                Err(nix::errno::Errno::ENOENT) => {
                    Liveness::stale(Reason::NetnsMissing, Evidence::Path)
                }
                Err(_) => Liveness::live(Evidence::Unreadable),
            };
        }
    };
    // Same device and inode: necessary, never sufficient. A recycled PID first (no
    // namespace needs to be opened for it), then the cookie.
    if let (Some(start), Some(dir)) = (was.pid_start, identity::proc_task_dir(netns)) {
        match identity::start_time(dir) {
            Ok(now) if now != start => {
                return Liveness::stale(Reason::NetnsReplaced, Evidence::PidStart)
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Liveness::stale(Reason::NetnsMissing, Evidence::Path)
            }
            Err(_) => return Liveness::live(Evidence::Unreadable),
        }
    }
    let Some(cookie) = was.cookie else {
        return Liveness::live(Evidence::DevIno);
    };
    let file = match open_ns(netns) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Liveness::stale(Reason::NetnsMissing, Evidence::Path)
        }
        Err(_) => return Liveness::live(Evidence::Unreadable),
    };
    // Should the path have changed since the stat, the cookie judges what was opened:
    // only the recorded namespace has the recorded cookie.
    match identity::netns_cookie(&file) {
        Ok(now) if now == cookie => Liveness {
            reason: None,
            evidence: Evidence::Cookie,
            verified: true,
        },
        Ok(_) => Liveness::stale(Reason::NetnsReplaced, Evidence::Cookie),
        Err(_) => Liveness::live(Evidence::Unreadable),
    }
}

/// `liveness`, and for a record of this boot whose path shows nothing, no namespace or
/// another namespace (rules 2 and 3), a search of the node for the recorded namespace first:
/// anything that holds it (a process, thread, open file or socket, a mount in another mount
/// namespace) makes it live, with the holder to show (DESIGN §5).
pub fn liveness_on_node(
    record_boot: &str,
    netns: &str,
    recorded: Option<NsId>,
    current_boot: &str,
    node: &holders::NodeIndex,
) -> (Liveness, Option<holders::Holder>) {
    let l = liveness(record_boot, netns, recorded, current_boot);
    // Another namespace at the path is searched for too: a runtime with private mounts
    // pins the pod there while the node's path holds some other namespace.
    if !matches!(
        l.reason,
        Some(Reason::NetnsMissing | Reason::NetnsNotNamespace | Reason::NetnsReplaced)
    ) {
        return (l, None);
    }
    let holder = match recorded {
        Some(id) => node.find(&id),
        // No identity to search by (an adopted attachment whose path was not seen from
        // here): a namespace mounted at its path elsewhere is taken for it.
        None => node.mounted_at(netns).map(|(_, h)| h),
    };
    match holder {
        Some(holder) => (Liveness::live(Evidence::Held), Some(holder)),
        None => (l, None),
    }
}

/// Nothing at `netns`: gone only if we can see where it would be. A path is the node's
/// (the runtime named it in the node's mount namespace); from a view that lacks its
/// directory (a container without the node's root, a `/var/run` that is not there) its
/// absence tells nothing, so the record is live. A `/proc/<pid>/` path's directory is
/// the node's procfs: with it there, a missing pid is a process that has exited.
fn nothing_at(netns: &str) -> Liveness {
    let path = Path::new(netns);
    let holder = if identity::proc_task_dir(netns).is_some() {
        nix::sys::statfs::statfs("/proc")
            .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC)
    } else {
        path.parent()
            .and_then(|d| std::fs::metadata(d).ok())
            .is_some_and(|m| m.is_dir())
    };
    if holder {
        Liveness::stale(Reason::NetnsMissing, Evidence::Path)
    } else {
        Liveness::live(Evidence::Unseen)
    }
}

/// The namespace path to hand a replayed DEL: the recorded one only while its cookie
/// says it still is the recorded namespace in this boot; otherwise none, so no plugin
/// ever enters a different, possibly live, namespace.
pub fn replay_netns(
    record_boot: &str,
    netns: &str,
    recorded: Option<NsId>,
    current_boot: &str,
) -> Option<String> {
    liveness(record_boot, netns, recorded, current_boot)
        .verified
        .then(|| netns.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_id_reads_as_read_to_string_does() {
        let whole = std::fs::read_to_string(BOOT_ID_PATH).unwrap();
        assert_eq!(read_boot_id(Path::new(BOOT_ID_PATH)).unwrap(), whole.trim());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("id");
        std::fs::write(&file, "no-newline").unwrap();
        assert_eq!(read_boot_id(&file).unwrap(), "no-newline");
        std::fs::write(&file, "x".repeat(300)).unwrap();
        assert_eq!(read_boot_id(&file).unwrap().len(), 128);
    }

    #[test]
    fn reasons_and_evidence_serialise_as_their_names() {
        use Reason::*;
        for r in [
            BootChanged,
            NetnsMissing,
            NetnsReplaced,
            NetnsNotNamespace,
            NotValid,
            NotInRuntime,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        use Evidence::*;
        for e in [
            BootId, Path, Filesystem, DevIno, PidStart, Cookie, Unreadable, Unseen, Held,
            ValidList, Runtime,
        ] {
            assert_eq!(serde_json::to_value(e).unwrap(), e.as_str());
        }
    }

    fn own() -> NsId {
        let Probe::Namespace(id) = probe("/proc/self/ns/net") else {
            panic!("/proc/self/ns/net is not nsfs here");
        };
        id
    }

    #[test]
    fn own_namespace_is_verified_by_its_cookie() {
        let id = own();
        assert!(id.cookie.is_some(), "this kernel gives a netns cookie");
        let l = liveness("b", "/proc/self/ns/net", Some(id), "b");
        assert_eq!(l.reason, None);
        assert_eq!(l.evidence, Evidence::Cookie);
        assert!(l.verified);
        assert_eq!(
            replay_netns("b", "/proc/self/ns/net", Some(id), "b").as_deref(),
            Some("/proc/self/ns/net")
        );
        assert_eq!(replay_netns("a", "/proc/self/ns/net", Some(id), "b"), None);
    }

    #[test]
    fn same_dev_ino_with_another_cookie_is_replaced() {
        let mut id = own();
        id.cookie = id.cookie.map(|c| c + 1);
        let l = liveness("b", "/proc/self/ns/net", Some(id), "b");
        assert_eq!(l.reason, Some(Reason::NetnsReplaced));
        assert_eq!(l.evidence, Evidence::Cookie);
        assert_eq!(replay_netns("b", "/proc/self/ns/net", Some(id), "b"), None);
    }

    #[test]
    fn a_recycled_pid_is_replaced_by_its_start_time() {
        let path = format!("/proc/{}/ns/net", std::process::id());
        let Probe::Namespace(mut id) = probe(&path) else {
            panic!("{path} is not nsfs");
        };
        assert!(id.pid_start.is_some());
        id.pid_start = id.pid_start.map(|s| s + 1);
        let l = liveness("b", &path, Some(id), "b");
        assert_eq!(l.reason, Some(Reason::NetnsReplaced));
        assert_eq!(l.evidence, Evidence::PidStart);
    }

    #[test]
    fn old_records_are_judged_by_dev_ino_but_never_verified() {
        let mut id = own();
        id.cookie = None;
        let l = liveness("b", "/proc/self/ns/net", Some(id), "b");
        assert_eq!(
            (l.reason, l.evidence, l.verified),
            (None, Evidence::DevIno, false)
        );
        id.ino += 1;
        let l = liveness("b", "/proc/self/ns/net", Some(id), "b");
        assert_eq!(l.reason, Some(Reason::NetnsReplaced));
        assert_eq!(l.evidence, Evidence::DevIno);
    }

    #[test]
    fn rules_err_towards_live_and_boot_wins() {
        let reason =
            |boot: &str, path: &str, id: Option<NsId>| liveness(boot, path, id, "b").reason;
        assert_eq!(
            reason("a", "/proc/self/ns/net", None),
            Some(Reason::BootChanged)
        );
        // Nothing at a path whose directory is there: gone. Its directory not there
        // either (not the node's view): no evidence.
        assert_eq!(
            reason("b", "/proc/self/nonexistent-netns", None),
            Some(Reason::NetnsMissing)
        );
        let l = liveness("b", "/nonexistent/netns", None, "b");
        assert_eq!((l.reason, l.evidence), (None, Evidence::Unseen));
        assert_eq!(
            reason("a", "/nonexistent/netns", None),
            Some(Reason::BootChanged)
        );
        // A /proc/<pid> path of a process that has exited is gone: /proc is there.
        assert_eq!(
            reason("b", "/proc/4194305/ns/net", None),
            Some(Reason::NetnsMissing)
        );
        assert_eq!(
            reason("b", "", None),
            None,
            "no path: judged by boot and runtime"
        );
        assert_eq!(
            reason("b", "/proc/self/status", None),
            Some(Reason::NetnsNotNamespace)
        );
        assert_eq!(
            reason("b", "/proc/self/status", Some(own())),
            Some(Reason::NetnsNotNamespace)
        );
        // No recorded identity: a namespace at the path counts as live, unverified.
        let l = liveness("b", "/proc/self/ns/net", None, "b");
        assert_eq!((l.reason, l.verified), (None, false));
        assert_eq!(replay_netns("b", "/proc/self/ns/net", None, "b"), None);
    }

    #[test]
    fn boot_id_is_readable() {
        assert!(!boot_id().unwrap().is_empty());
    }
}
