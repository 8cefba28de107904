//! Per-attachment locks: one flock'd file per key under `locks/`. A crashed holder's
//! lock dies with its file descriptor, so nothing stays locked after a crash.
//!
//! Lock files are removed when their record is removed. To make that safe, a holder
//! re-checks after locking that the path still names the file it locked; if someone
//! unlinked it meanwhile, it starts over on the new file.

use super::fsio::at;
use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub enum Wait {
    /// Return None at once when the key is held.
    No,
    /// Poll up to this long, then return None.
    Upto(Duration),
}

#[derive(Debug)]
pub struct KeyLock {
    file: File,
    path: PathBuf,
}

fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(at("opening lock", path))
}

fn still_linked(file: &File, path: &Path) -> io::Result<bool> {
    let held = file.metadata()?;
    match std::fs::symlink_metadata(path) {
        Ok(now) => Ok(now.ino() == held.ino() && now.dev() == held.dev()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(at("examining", path)(e)),
    }
}

impl KeyLock {
    pub fn acquire(path: &Path, wait: Wait) -> io::Result<Option<KeyLock>> {
        let deadline = match wait {
            Wait::No => None,
            Wait::Upto(d) => Some(Instant::now() + d),
        };
        let mut pause = Duration::from_micros(500);
        loop {
            let file = open_lock_file(path)?;
            match file.try_lock() {
                Ok(()) => {
                    if still_linked(&file, path)? {
                        return Ok(Some(KeyLock {
                            file,
                            path: path.to_path_buf(),
                        }));
                    }
                    continue; // unlinked by the previous holder: lock the new file
                }
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(at("locking", path)(e)),
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

    /// Unlinks the lock file while still holding it, then releases it; for when the
    /// record it guards is gone. Waiters re-check the link and move to a fresh file.
    pub fn release_and_remove(self) {
        let _ = std::fs::remove_file(&self.path);
        drop(self.file);
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
    fn second_holder_is_refused_until_release() {
        let dir = std::env::temp_dir().join(format!("cl-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k.lock");
        let a = KeyLock::acquire(&p, Wait::No).unwrap().unwrap();
        assert!(KeyLock::acquire(&p, Wait::No).unwrap().is_none());
        assert!(KeyLock::acquire(&p, Wait::Upto(Duration::from_millis(30)))
            .unwrap()
            .is_none());
        a.release_and_remove();
        assert!(!p.exists());
        let b = KeyLock::acquire(&p, Wait::No).unwrap().unwrap();
        drop(b);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
