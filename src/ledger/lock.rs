//! Per-attachment locks: byte-range locks on one file, `locks/keys`, one byte per key at
//! an offset taken from the key's sha256. An ADD therefore creates no file to lock: a
//! lock file per key cost every ADD a second inode allocation and directory entry, as
//! much kernel work as its record (bench/add-floor.sh). Open file description locks
//! (`F_OFD_SETLK`) belong to the open file, like `flock`: released on close and when the
//! holder dies, so a crash leaves nothing locked, and exclusive between two opens in one
//! process (gc's worker threads). Two keys share a byte only if 62 bits of their sha256
//! agree; they would then merely wait for each other.

use super::fsio::at;
use nix::fcntl::{fcntl, FcntlArg};
use nix::libc;
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long `KeyLock::acquire` may wait for a held key.
pub enum Wait {
    /// Return None at once when the key is held.
    No,
    /// Poll up to this long, then return None.
    AtMost(Duration),
}

/// Holds one key's byte until dropped.
#[derive(Debug)]
pub struct KeyLock {
    _file: File,
}

fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(at("opening lock", path))
}

/// The key's byte: below 2^62, so any off_t holds it.
fn offset(key: &str) -> i64 {
    let d = Sha256::digest(key.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    (u64::from_be_bytes(b) >> 2) as i64
}

/// Ok(true): locked; Ok(false): held by another open file.
fn try_lock_byte(file: &File, at_byte: i64) -> io::Result<bool> {
    let range = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: at_byte,
        l_len: 1,
        l_pid: 0, // must be 0 for OFD locks
    };
    match fcntl(file.as_raw_fd(), FcntlArg::F_OFD_SETLK(&range)) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

impl KeyLock {
    /// Locks `key`'s byte of the lock file at `path`, waiting as `wait` says.
    pub fn acquire(path: &Path, key: &str, wait: Wait) -> io::Result<Option<KeyLock>> {
        let deadline = match wait {
            Wait::No => None,
            Wait::AtMost(d) => Some(Instant::now() + d),
        };
        let file = open_lock_file(path)?;
        let at_byte = offset(key);
        let mut pause = Duration::from_micros(500);
        loop {
            if try_lock_byte(&file, at_byte).map_err(at("locking", path))? {
                return Ok(Some(KeyLock { _file: file }));
            }
            match deadline {
                Some(d) if Instant::now() < d => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                _ => return Ok(None),
            }
        }
    }

    /// Releases the lock once the record it guards is gone. (Each key once had a lock
    /// file, unlinked here; with byte-range locks there is nothing left to remove.)
    pub fn release_and_remove(self) {
        drop(self);
    }
}

/// The lock that keeps a snapshot sweep from deleting a snapshot an ADD is about to
/// reference: ADDs hold it shared (never waiting on each other), a sweep exclusive.
pub struct SnapshotGuard(#[allow(dead_code)] File);

impl SnapshotGuard {
    pub fn shared(path: &Path) -> io::Result<SnapshotGuard> {
        let f = open_lock_file(path)?;
        f.lock_shared().map_err(at("locking", path))?;
        Ok(SnapshotGuard(f))
    }

    pub fn try_exclusive(path: &Path) -> io::Result<Option<SnapshotGuard>> {
        let f = open_lock_file(path)?;
        match f.try_lock() {
            Ok(()) => Ok(Some(SnapshotGuard(f))),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(at("locking", path)(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_until_release_and_other_keys_are_free() {
        let dir = std::env::temp_dir().join(format!("cl-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("keys");
        let a = KeyLock::acquire(&p, "n:c1:eth0", Wait::No)
            .unwrap()
            .unwrap();
        // Another open of the file, as another process or gc thread would have.
        assert!(KeyLock::acquire(&p, "n:c1:eth0", Wait::No)
            .unwrap()
            .is_none());
        assert!(
            KeyLock::acquire(&p, "n:c1:eth0", Wait::AtMost(Duration::from_millis(30)))
                .unwrap()
                .is_none()
        );
        let other = KeyLock::acquire(&p, "n:c2:eth0", Wait::No).unwrap();
        assert!(other.is_some(), "a different key is not held");
        a.release_and_remove();
        let b = KeyLock::acquire(&p, "n:c1:eth0", Wait::No)
            .unwrap()
            .unwrap();
        drop(b);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "one lock file");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn offsets_are_stable_and_fit_an_off_t() {
        // Processes of different builds must agree on a key's byte.
        assert_eq!(offset("n:c1:eth0"), offset("n:c1:eth0"));
        assert_ne!(offset("n:c1:eth0"), offset("n:c2:eth0"));
        assert!(offset("x") >= 0);
    }
}
