//! The node's view of the file system, for gc and the agent run in a container.
//!
//! Every path cni-ledger judges or uses was named by somebody on the node: the runtime
//! named the netns path (`/var/run/netns/<n>`, `/proc/<pid>/ns/net`) in the node's mount
//! namespace, and the conflists, libcni's cache, the plugin dirs and the CRI sockets are
//! the node's files. A container's own root has none of them, or other files at the same
//! names (a scratch image has no `/var/run` at all). So, given the node's root (with the
//! host's PID namespace, `/proc/1/root`), gc and the agent enter it — `chroot`, before
//! they read any path — and from then on every lookup, absolute symlinks included
//! (`/var/run` → `/run`), resolves exactly as on the node, with the node's mounts as
//! they come and go. The replayed plugins inherit that root.

use std::path::{Path, PathBuf};

/// Why the node's root could not be entered: gc and the agent then refuse to run
/// rather than judge paths in a view that is not the node's.
#[derive(Debug)]
pub enum EnterError {
    /// The root is not a directory we can open (wrong path, no hostPID, not privileged).
    NotADirectory(PathBuf, std::io::Error),
    /// chroot(2) or chdir(2) failed (CAP_SYS_CHROOT missing).
    Chroot(PathBuf, nix::errno::Errno),
    /// Entered, but the node's `/proc` is not there: `/proc/<pid>/ns/net` paths and the
    /// boot ID could not be read as the node has them.
    NoProc(PathBuf),
}

impl std::fmt::Display for EnterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnterError::NotADirectory(root, e) => write!(
                f,
                "node root {}: {e} (in a container: hostPID and privileged are needed)",
                root.display()
            ),
            EnterError::Chroot(root, e) => write!(f, "entering node root {}: {e}", root.display()),
            EnterError::NoProc(root) => write!(
                f,
                "node root {}: no procfs at /proc inside it; not a node's root",
                root.display()
            ),
        }
    }
}

impl std::error::Error for EnterError {}

/// Makes `root` this process's root directory (and working directory), for every
/// thread. Called before anything reads a path; a root that already is ours (gc on the
/// node itself) changes nothing.
pub fn enter(root: &Path) -> Result<(), EnterError> {
    let md = std::fs::metadata(root).map_err(|e| EnterError::NotADirectory(root.into(), e))?;
    if !md.is_dir() {
        let e = std::io::Error::from_raw_os_error(nix::libc::ENOTDIR);
        return Err(EnterError::NotADirectory(root.into(), e));
    }
    nix::unistd::chroot(root).map_err(|e| EnterError::Chroot(root.into(), e))?;
    nix::unistd::chdir("/").map_err(|e| EnterError::Chroot(root.into(), e))?;
    let proc_ok = nix::sys::statfs::statfs("/proc")
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC);
    if !proc_ok {
        return Err(EnterError::NoProc(root.into()));
    }
    crate::info!(
        "entered the node's root {}: every path is the node's",
        root.display()
    );
    Ok(())
}
