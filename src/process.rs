//! The process's start: what std's runtime start did that this binary still needs, now
//! that its entry point is C's `main` (src/main.rs). Standard descriptors 0–2 are open,
//! and a write to a closed pipe fails with EPIPE instead of killing the process.

use nix::fcntl::{fcntl, FcntlArg};
use nix::sys::signal::{SigSet, Signal};
use std::os::fd::IntoRawFd;

/// Called first in `main`, before any thread exists (threads inherit the signal mask).
pub fn prepare() {
    keep_standard_fds_open();
    // Blocked, not ignored (the safe call): a runtime that closes the read end of our
    // stdout, or a replayed plugin that exits without reading its stdin, then gives us
    // EPIPE, as under std's start. Children start with an empty mask and SIGPIPE at its
    // default: std's spawn resets both, so the plugins a replay runs see no difference.
    let mut pipe = SigSet::empty();
    pipe.add(Signal::SIGPIPE);
    // Fails only for an invalid set; this one is valid.
    let _ = pipe.thread_block();
}

/// A closed 0, 1 or 2 would be handed to the next file opened, and a record file could
/// then receive what is meant for stdout: each is pointed at /dev/null instead. Opening
/// takes the lowest free number, so each open fills the next closed one of the three.
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
