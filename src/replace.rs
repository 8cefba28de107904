//! Replacing a file another writer may also write (a runtime's conflist, a drop-in):
//! read it with the identity it had (`read_for_edit`), and put an edit in place only if
//! the file still is what was read (`replace_if_unchanged`, a compare-and-swap by
//! `renameat2(RENAME_EXCHANGE)`), or replace it whole (`write_replacing`). Always by a
//! temp file renamed over the name, so a reader never sees half a file; never through
//! a symlink. The temp files are fsio's (src/ledger/fsio.rs).

use crate::ledger::fsio::FileId;
use anyhow::{bail, Context, Result};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// What a symlink at `path` points to, when `path` is one. Conflists reached through a
/// link belong to whatever manages the link's target (a ConfigMap's `..data/`, a
/// package, a configuration-management store): they are read, never replaced.
pub fn symlink_target(path: &Path) -> Option<std::path::PathBuf> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_symlink())
        .map(|_| std::fs::read_link(path).unwrap_or_default())
}

pub(crate) fn refuse_symlink(path: &Path) -> Result<()> {
    if let Some(target) = symlink_target(path) {
        bail!(
            "{} is a symbolic link to {}: not replaced by a regular file and not written \
             through (its target belongs to whatever manages it); put the ledger in the \
             target's source, or pass the target itself",
            path.display(),
            target.display()
        );
    }
    Ok(())
}

/// Replaces `path` by a temp file (same mode, fsynced) renamed over it, then fsyncs the
/// directory: a reader sees the old bytes or the new, never a mix. A symlink is refused,
/// never replaced by a regular file. Returns the new file's inode number.
pub fn write_replacing(path: &Path, bytes: &[u8]) -> Result<u64> {
    use crate::ledger::fsio;
    refuse_symlink(path)?;
    let dir = parent_dir(path);
    let name = path.file_name().context("no file name")?.to_string_lossy();
    let mode = std::fs::metadata(path)
        .map_err(fsio::at("examining", path))?
        .permissions()
        .mode()
        & 0o7777;
    // The ledger's atomic write: a hidden temporary name without the .conflist ending
    // (runtimes ignore it while it is written), fsync, rename, directory fsync.
    fsio::write_atomic_mode(dir, &name, bytes, "conflist", mode)?;
    // The inode the agent takes for its own write (a rewrite by another writer has another).
    Ok(std::fs::symlink_metadata(path)
        .map_err(fsio::at("examining", path))?
        .ino())
}

pub(crate) fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// A conflist as read for an edit: the bytes, and the file they were read from.
#[derive(Debug, Clone)]
pub struct ReadConf {
    pub bytes: Vec<u8>,
    id: FileId,
    mode: u32,
}

impl ReadConf {
    pub fn ino(&self) -> u64 {
        self.id.ino
    }
    /// The permission bits the file had.
    pub fn mode(&self) -> u32 {
        self.mode
    }
}

/// Larger than any conflist; a bigger file is not read whole.
const READ_LIMIT: u64 = 16 << 20;

/// Reads `path` (a regular file: a symlink is refused) with the identity it had while
/// it was read; a file that changed during the read is read again.
pub fn read_for_edit(path: &Path) -> Result<ReadConf> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tries = 0;
    loop {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        let before = f
            .metadata()
            .with_context(|| format!("examining {}", path.display()))?;
        if !before.is_file() {
            bail!("{} is not a regular file", path.display());
        }
        let mut bytes = Vec::with_capacity(before.len() as usize);
        (&mut f)
            .take(READ_LIMIT)
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading {}", path.display()))?;
        let after = f
            .metadata()
            .with_context(|| format!("examining {}", path.display()))?;
        tries += 1;
        if FileId::of(&before) == FileId::of(&after) || tries >= 3 {
            return Ok(ReadConf {
                bytes,
                id: FileId::of(&after),
                mode: after.mode() & 0o7777,
            });
        }
    }
}

/// What `replace_if_unchanged` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Replaced {
    /// The new bytes are in place; the inode of the new file.
    Done { ino: u64 },
    /// Another writer changed the file after it was read: nothing of theirs was
    /// replaced; read it again and plan again. Says what was seen.
    Changed(String),
}

/// Why `path` no longer is what `read` saw, if it is not (None: unchanged).
pub fn changed_since(path: &Path, read: &ReadConf) -> Option<String> {
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => return Some(format!("gone ({e})")),
    };
    if m.file_type().is_symlink() {
        return Some("now a symbolic link".into());
    }
    if FileId::of(&m) != read.id {
        return Some(if m.ino() != read.id.ino || m.dev() != read.id.dev {
            "replaced by another file".into()
        } else {
            "written in place".into()
        });
    }
    match read_for_edit(path) {
        Ok(now) if now.bytes == read.bytes => None,
        Ok(_) => Some("written in place".into()),
        Err(e) => Some(format!("unreadable ({e:#})")),
    }
}

/// Whether the file now at `tmp` is the very file `read` saw, unchanged (after a
/// rename or an exchange moved it there; the move itself changes only its ctime).
pub fn is_what_was_read(tmp: &Path, read: &ReadConf) -> bool {
    let Ok(m) = std::fs::symlink_metadata(tmp) else {
        return false;
    };
    m.is_file()
        && (m.dev(), m.ino(), m.len(), (m.mtime(), m.mtime_nsec()))
            == (read.id.dev, read.id.ino, read.id.len, read.id.mtime)
        && read_for_edit(tmp).is_ok_and(|now| now.bytes == read.bytes)
}

/// Swaps the two names atomically (`renameat2(RENAME_EXCHANGE)`).
fn exchange(a: &Path, b: &Path) -> nix::Result<()> {
    nix::fcntl::renameat2(None, a, None, b, nix::fcntl::RenameFlags::RENAME_EXCHANGE)
}

/// Replaces `path` with `bytes` only if it still is exactly what `read` saw: another
/// writer's version, written after the read (renamed over it or written in place), is
/// never replaced by an edit of the older one. Checked just before the swap, and again
/// after it, on what the swap displaced: the new file and the old are exchanged
/// atomically, so the displaced file is exactly what stood there at that instant; if it
/// is not what was read, the swap is undone and the caller starts over. (Where the
/// filesystem cannot exchange, the check before a plain rename is all there is.)
/// Same mode, fsynced, directory fsynced, as `write_replacing`.
pub fn replace_if_unchanged(path: &Path, read: &ReadConf, bytes: &[u8]) -> Result<Replaced> {
    use crate::ledger::fsio;
    let dir = parent_dir(path);
    let name = path.file_name().context("no file name")?.to_string_lossy();
    let tmp = fsio::write_temp(dir, &name, bytes, "conflist", read.mode)?;
    let discard = |why: String| -> Result<Replaced> {
        let _ = std::fs::remove_file(&tmp);
        Ok(Replaced::Changed(why))
    };
    let ours = match std::fs::symlink_metadata(&tmp) {
        Ok(m) => m.ino(),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("examining {}", tmp.display()));
        }
    };
    if let Some(why) = changed_since(path, read) {
        return discard(why);
    }
    match exchange(&tmp, path) {
        Ok(()) => {}
        Err(
            nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS | nix::errno::Errno::EOPNOTSUPP,
        ) => {
            // No exchange on this filesystem: the re-check above must do.
            if let Err(e) = std::fs::rename(&tmp, path) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e).with_context(|| format!("renaming over {}", path.display()));
            }
            fsio::fsync_dir(dir)?;
            return Ok(Replaced::Done { ino: ours });
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e)
                .with_context(|| format!("exchanging {} with {}", tmp.display(), path.display()));
        }
    }
    if is_what_was_read(&tmp, read) {
        // The old file, now under the temp name.
        std::fs::remove_file(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
        fsio::fsync_dir(dir)?;
        return Ok(Replaced::Done { ino: ours });
    }
    let put_back = || {
        exchange(&tmp, path).with_context(|| {
            format!(
                "putting back {} (kept as {})",
                path.display(),
                tmp.display()
            )
        })
    };
    // Another writer's file was displaced: put it back.
    put_back()?;
    let back_is_ours = std::fs::symlink_metadata(&tmp).is_ok_and(|m| m.ino() == ours)
        && std::fs::read(&tmp).is_ok_and(|b| b == bytes);
    if !back_is_ours {
        // A newer write still landed on the name after the swap (a rename over it, or
        // a write into the new file): that one is the latest; it goes back in place.
        put_back()?;
    }
    // Left under the temp name: our own edit, or the older of the other writer's two.
    let _ = std::fs::remove_file(&tmp);
    fsio::fsync_dir(dir)?;
    Ok(Replaced::Changed(
        "replaced while the edit was being put in place; the other writer's version was put back"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("cl-replace-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_edit_replaces_only_the_file_it_was_planned_from() {
        let dir = scratch("cas");
        let path = dir.join("10-n.conflist");
        std::fs::write(&path, b"v1").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let read = read_for_edit(&path).unwrap();
        assert!(matches!(
            replace_if_unchanged(&path, &read, b"v1+ledger").unwrap(),
            Replaced::Done { .. }
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"v1+ledger");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o7777, 0o640);

        // Written in place after the read (same length: only bytes and times tell).
        let read = read_for_edit(&path).unwrap();
        std::fs::write(&path, b"v2+ledger").unwrap();
        assert!(matches!(
            replace_if_unchanged(&path, &read, b"stale").unwrap(),
            Replaced::Changed(_)
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"v2+ledger");

        // Replaced by rename after the read.
        let read = read_for_edit(&path).unwrap();
        std::fs::write(dir.join("other"), b"v3").unwrap();
        std::fs::rename(dir.join("other"), &path).unwrap();
        assert!(matches!(
            replace_if_unchanged(&path, &read, b"stale").unwrap(),
            Replaced::Changed(_)
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"v3");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            [std::ffi::OsString::from("10-n.conflist")],
            "temp files left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symlinked_conflist_is_never_replaced_by_a_regular_file() {
        let dir = scratch("link");
        std::fs::create_dir_all(dir.join("..data")).unwrap();
        std::fs::write(dir.join("..data/10-n.conflist"), b"{}").unwrap();
        let link = dir.join("10-n.conflist");
        std::os::unix::fs::symlink("..data/10-n.conflist", &link).unwrap();
        let e = write_replacing(&link, b"new").unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e:#}");
        assert!(
            read_for_edit(&link).is_err(),
            "read through a link for an edit"
        );
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            std::fs::read(dir.join("..data/10-n.conflist")).unwrap(),
            b"{}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
