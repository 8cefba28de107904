//! Crash-consistent file operations: a power cut at any instant leaves the old or the
//! new file, never a torn one.

use crate::faults::crash_point;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Prefix of temporary files; scans skip them and `verify` reports leftovers.
pub const TMP_PREFIX: &str = ".tmp.";

pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `bytes` to `dir/name`: temp file (0600, no symlink follow), fsync, rename,
/// fsync of the directory. `what` names the crash points (`record`, `snapshot`).
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8], what: &str) -> io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        "{TMP_PREFIX}{name}.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(bytes)?;
        crash_point(&format!("{what}.tmp-written"));
        f.sync_all()?;
        crash_point(&format!("{what}.tmp-synced"));
        std::fs::rename(&tmp, dir.join(name))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    crash_point(&format!("{what}.renamed"));
    fsync_dir(dir)?;
    crash_point(&format!("{what}.dir-synced"));
    Ok(())
}

/// Removes `dir/name` durably. Ok(false) when it was not there.
pub fn remove_durable(dir: &Path, name: &str) -> io::Result<bool> {
    match std::fs::remove_file(dir.join(name)) {
        Ok(()) => {
            crash_point("remove.unlinked");
            fsync_dir(dir)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads a regular file without following a symlink planted in its place. Sized from
/// fstat, so a record costs one read (plus the one that sees the end), not a series of
/// growing ones: scans of 100,000 records are dominated by these syscalls.
pub fn read_nofollow(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let want = meta.len().min(limit) as usize;
    let mut buf = vec![0u8; want + 1];
    let mut len = 0;
    loop {
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => {
                len += n;
                if len == buf.len() {
                    break; // grew since fstat, or over the limit: the caller sees the excess
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len.min(limit as usize));
    Ok(buf)
}

/// For scans, where the directory entry already said "regular file" (d_type, no
/// syscall): open relative to the already open directory (no path walk per file), read
/// to the end, close. `O_NOFOLLOW` still refuses a symlink swapped in since, and
/// `O_NONBLOCK` keeps a FIFO from hanging the scan.
pub fn read_listed_file(dir: &File, name: &std::ffi::OsStr, limit: u64) -> io::Result<Vec<u8>> {
    use nix::fcntl::OFlag;
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let fd = nix::fcntl::openat(
        Some(dir.as_raw_fd()),
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)?;
    // SAFETY: `fd` was just returned by a successful openat and is owned by nothing
    // else; the File takes sole ownership and closes it once.
    let f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut buf = Vec::with_capacity(8192);
    f.take(limit).read_to_end(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let dir = std::env::temp_dir().join(format!("cl-fsio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_atomic(&dir, "a", b"one", "record").unwrap();
        write_atomic(&dir, "a", b"two", "record").unwrap();
        assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(names.len(), 1);
        assert!(remove_durable(&dir, "a").unwrap());
        assert!(!remove_durable(&dir, "a").unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn temp_names_carry_the_writer_pid() {
        // Ledger::remove_orphan_temps parses this shape.
        let dir = std::env::temp_dir().join(format!("cl-fsio-t-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_atomic(&dir, "x", b"1", "record").unwrap();
        let name = format!("{TMP_PREFIX}x.{}.0", std::process::id());
        std::fs::write(dir.join(&name), b"").unwrap();
        let pid = name.strip_prefix(TMP_PREFIX).unwrap().rsplit('.').nth(1);
        assert_eq!(pid, Some(std::process::id().to_string().as_str()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn read_refuses_symlinks() {
        let dir = std::env::temp_dir().join(format!("cl-fsio-l-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("l")).unwrap();
        assert!(read_nofollow(&dir.join("l"), 100).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
