//! The process's start: what std's runtime start did that this binary still needs, now
//! that its entry point is C's `main` (src/main.rs). Standard descriptors 0–2 are open,
//! and a write to a closed pipe fails with EPIPE instead of killing the process. And
//! the lock that keeps spawned children from holding a new executable open for writing.

use nix::fcntl::{fcntl, FcntlArg};
use nix::sys::signal::{signal, SigHandler, Signal};
use std::os::fd::IntoRawFd;

/// Called first in `main`, before any other thread exists.
pub fn prepare() {
    keep_standard_fds_open();
    ignore_sigpipe();
}

/// As std's start does: a runtime that closes the read end of our stdout, or a replayed
/// plugin that exits without reading its stdin, gives EPIPE, not death by signal. std's
/// spawn sets SIGPIPE back to its default in every child, so the plugins a replay runs
/// start as they do under a runtime. (Blocking it instead would be passed on to them.)
#[allow(unsafe_code)]
fn ignore_sigpipe() {
    // SAFETY: SIG_IGN installs no handler, so no code of ours ever runs on the signal,
    // and this runs before any other thread exists.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
}

/// A closed 0, 1 or 2 would be handed to the next file opened, and a record or lock file
/// could then receive what is meant for stdout or stderr: each is pointed at /dev/null
/// instead. Opening takes the lowest free number, so each open fills the next closed one.
fn keep_standard_fds_open() {
    let closed = (0..3)
        .filter(|&fd| fcntl(fd, FcntlArg::F_GETFD).is_err())
        .count();
    for _ in 0..closed {
        let null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null");
        match null {
            // Kept open for the life of the process, as the descriptor it stands in for.
            Ok(null) => {
                let _ = null.into_raw_fd();
            }
            // No /dev/null (a bare chroot): nothing better to stand in; go on as before.
            Err(_) => break,
        }
    }
}

/// Shared while a child is spawned, exclusive while an executable is written (the agent
/// installing the plugin). A child holds a copy of every descriptor from its fork until
/// its exec closes them (`O_CLOEXEC` acts only at exec): forked while the temp file's
/// write descriptor was open, it would keep the file open for writing after the rename,
/// and a runtime's exec of the plugin in that window would fail with ETXTBSY.
static EXEC_WRITE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held around `Command::spawn`.
pub fn spawn_guard() -> std::sync::RwLockReadGuard<'static, ()> {
    EXEC_WRITE
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Held from opening an executable for writing until that descriptor is closed.
pub fn exec_write_guard() -> std::sync::RwLockWriteGuard<'static, ()> {
    EXEC_WRITE
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
