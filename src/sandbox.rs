//! Is a sandbox still there? The boot ID and the identity of a network namespace.
//!
//! Every rule here errs towards *live*: only positive evidence that the namespace is
//! gone (another boot, no file, another namespace at the path) makes a record stale.

use serde::{Deserialize, Serialize};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Device and inode of an nsfs file: what names one network namespace during one boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
}

pub fn boot_id() -> io::Result<String> {
    if let Some(id) = crate::faults::boot_id_override() {
        return Ok(id);
    }
    Ok(std::fs::read_to_string(BOOT_ID_PATH)?.trim().to_string())
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

pub fn probe(path: &str) -> Probe {
    probe_expecting(path, None)
}

/// Like `probe`, but a file with exactly the `expected` device and inode is known to be
/// that nsfs file without asking statfs: one syscall per live record in a scan.
fn probe_expecting(path: &str, expected: Option<NsId>) -> Probe {
    if path.is_empty() {
        return Probe::Missing;
    }
    let meta = match std::fs::metadata(Path::new(path)) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Probe::Missing,
        Err(e) => return Probe::Unknown(e.to_string()),
    };
    let id = NsId {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    if expected == Some(id) {
        return Probe::Namespace(id);
    }
    match nix::sys::statfs::statfs(Path::new(path)) {
        Ok(fs) if fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC => Probe::Namespace(id),
        Ok(_) => Probe::NotNamespace,
        Err(nix::errno::Errno::ENOENT) => Probe::Missing,
        Err(e) => Probe::Unknown(e.to_string()),
    }
}

/// Why a record is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Rules 1–3 of DESIGN §5: None means live.
pub fn staleness(
    record_boot: &str,
    netns: &str,
    recorded: Option<NsId>,
    current_boot: &str,
) -> Option<Reason> {
    if record_boot != current_boot {
        return Some(Reason::BootChanged);
    }
    // Only an adopted record can lack a path (ADD requires CNI_NETNS): with nothing to
    // probe, the boot ID and the runtime's lists alone can say it is gone.
    if netns.is_empty() {
        return None;
    }
    match probe_expecting(netns, recorded) {
        Probe::Missing => Some(Reason::NetnsMissing),
        Probe::NotNamespace => Some(Reason::NetnsNotNamespace),
        // Without a recorded identity we cannot tell a new namespace from the old one.
        Probe::Namespace(now) => match recorded {
            Some(was) if was != now => Some(Reason::NetnsReplaced),
            _ => None,
        },
        Probe::Unknown(_) => None,
    }
}

/// The namespace path to hand a replayed DEL: the recorded one only while it still is
/// the recorded namespace in this boot; otherwise none, so no plugin ever enters a
/// different, possibly live, namespace.
pub fn replay_netns(
    record_boot: &str,
    netns: &str,
    recorded: Option<NsId>,
    current_boot: &str,
) -> Option<String> {
    if record_boot != current_boot {
        return None;
    }
    match (probe(netns), recorded) {
        (Probe::Namespace(now), Some(was)) if now == was => Some(netns.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_namespace_is_nsfs() {
        let Probe::Namespace(id) = probe("/proc/self/ns/net") else {
            panic!("/proc/self/ns/net is not nsfs here");
        };
        assert_eq!(staleness("b", "/proc/self/ns/net", Some(id), "b"), None);
        assert_eq!(
            staleness(
                "b",
                "/proc/self/ns/net",
                Some(NsId {
                    dev: id.dev,
                    ino: id.ino + 1
                }),
                "b"
            ),
            Some(Reason::NetnsReplaced)
        );
        assert_eq!(
            replay_netns("b", "/proc/self/ns/net", Some(id), "b").as_deref(),
            Some("/proc/self/ns/net")
        );
        assert_eq!(replay_netns("a", "/proc/self/ns/net", Some(id), "b"), None);
    }

    #[test]
    fn rules_err_towards_live_and_boot_wins() {
        assert_eq!(
            staleness("a", "/proc/self/ns/net", None, "b"),
            Some(Reason::BootChanged)
        );
        assert_eq!(
            staleness("b", "/nonexistent/netns", None, "b"),
            Some(Reason::NetnsMissing)
        );
        assert_eq!(
            staleness("b", "/proc/self/status", None, "b"),
            Some(Reason::NetnsNotNamespace)
        );
        // No recorded identity: a namespace at the path counts as live.
        assert_eq!(staleness("b", "/proc/self/ns/net", None, "b"), None);
        assert_eq!(replay_netns("b", "/proc/self/ns/net", None, "b"), None);
    }

    #[test]
    fn boot_id_is_readable() {
        assert!(!boot_id().unwrap().is_empty());
    }
}
