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

/// Which file, in which state, as `stat` gives it: a change of any field is a change of
/// the file (a write, a rename over it, a chmod). Timestamps are coarse: a user that
/// must see every change also compares bytes or lets the ctime settle first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl FileId {
    pub fn of(m: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// Names the path an I/O error is about, in the spirit of netavark's `fs_err!`: a bare
/// "Permission denied" from deep in a write does not say which of five files it was.
/// The kind is kept, so callers can still match on it.
/// Use: `.map_err(at("fsync", dir))`.
pub fn at<'a>(op: &'a str, path: &'a Path) -> impl FnOnce(io::Error) -> io::Error + 'a {
    move |e| io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

pub fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(at("fsync directory", dir))
}

/// Creates `dir` and its missing ancestors with `mode` (explicit, not the umask's
/// default) and fsyncs the parent of each directory it created: a directory entry is
/// durable only once its parent is synced, and a record fsynced into a directory whose
/// own entry is lost would be lost with it. Returns whether it created anything.
pub fn create_dir_all_durable(dir: &Path, mode: u32) -> io::Result<bool> {
    use std::os::unix::fs::DirBuilderExt;
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(p) = cur.filter(|p| !p.as_os_str().is_empty()) {
        match std::fs::symlink_metadata(p) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(p),
            Err(e) => return Err(at("examining", p)(e)),
        }
        cur = p.parent();
    }
    for p in missing.iter().rev() {
        match std::fs::DirBuilder::new().mode(mode).create(p) {
            // A concurrent creator's entry may not be durable yet either: sync it too.
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(at("creating", p)(e)),
        }
    }
    for p in &missing {
        if let Some(parent) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
            fsync_dir(parent)?;
        }
    }
    Ok(!missing.is_empty())
}

/// Writes `bytes` to `dir/name`: temp file (0600, no symlink follow), fsync, rename,
/// fsync of the directory. `what` names the crash points (`record`, `snapshot`).
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8], what: &str) -> io::Result<()> {
    write_atomic_mode(dir, name, bytes, what, 0o600)
}

/// `write_atomic` giving the file `mode` exactly (whatever the umask), e.g. an edited
/// file's own mode.
pub fn write_atomic_mode(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    what: &str,
    mode: u32,
) -> io::Result<()> {
    rename_into_place(dir, name, bytes, what, mode, true)?;
    fsync_dir(dir)?;
    crash_point(&format!("{what}.dir-synced"));
    Ok(())
}

/// `write_atomic` without the directory's fsync, for replacing a file whose current
/// version is durable and may stand in for the new one after a power cut. The temp file
/// is fsynced before the rename, so whichever version survives is whole; the rename is
/// made durable by the directory's next fsync (the next record written there) or the
/// file system's next commit. Saves one of the two flushes of `write_atomic`.
pub fn replace_atomic(dir: &Path, name: &str, bytes: &[u8], what: &str) -> io::Result<()> {
    rename_into_place(dir, name, bytes, what, 0o600, true)
}

/// For notes whose loss costs nothing a replay needs (the tail entry's chain notes,
/// `Ledger::put_note`): a temp file renamed over `dir/name`, neither flushed. Readers
/// see the old file or the new one whole; after a power cut the name may hold the old
/// bytes, the new, or an empty or torn file (XFS, for one, logs the rename before the
/// data), so its reader must take anything it cannot decode for no note at all.
pub fn replace_unsynced(dir: &Path, name: &str, bytes: &[u8], what: &str) -> io::Result<()> {
    rename_into_place(dir, name, bytes, what, 0o600, false)
}

/// A temp file with `bytes` (fsynced when `sync`), renamed over `dir/name`: every
/// atomic write's first half.
fn rename_into_place(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    what: &str,
    mode: u32,
    sync: bool,
) -> io::Result<()> {
    let tmp = create_temp(dir, name, bytes, what, mode, sync)?;
    let target = dir.join(name);
    if let Err(e) = std::fs::rename(&tmp, &target) {
        let _ = std::fs::remove_file(&tmp);
        return Err(at("renaming over", &target)(e));
    }
    crash_point(&format!("{what}.renamed"));
    Ok(())
}

/// How many fresh temp names to try before giving up: a name is taken only by a
/// leftover of a dead process that had our pid (a container's agent is often pid 1).
const TEMP_TRIES: usize = 8;

/// Writes `bytes` to a new temp file `dir/.tmp.<name>.<pid>.<seq>` with `mode` exactly,
/// fsynced, and returns its path; the caller renames it into place (or removes it).
/// Created with `O_EXCL` and `O_NOFOLLOW`: an existing file or a symlink planted under
/// the name is never opened, let alone written through. A taken name (a dead writer's
/// leftover, kept for `verify` to report) moves on to the next sequence number.
pub fn write_temp(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    what: &str,
    mode: u32,
) -> io::Result<std::path::PathBuf> {
    create_temp(dir, name, bytes, what, mode, true)
}

/// `write_temp`, its fsync left out when `sync` is false.
fn create_temp(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    what: &str,
    mode: u32,
    sync: bool,
) -> io::Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let mut tries = 0;
    let (tmp, mut f) = loop {
        let tmp = dir.join(format!(
            "{TMP_PREFIX}{name}.{}.{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries + 1 < TEMP_TRIES => {
                tries += 1;
            }
            Err(e) => return Err(at("creating", &tmp)(e)),
        }
    };
    let result = (|| {
        if mode != 0o600 {
            // The umask may have taken bits the caller asked for.
            f.set_permissions(std::fs::Permissions::from_mode(mode))
                .map_err(at("chmod", &tmp))?;
        }
        f.write_all(bytes).map_err(at("writing", &tmp))?;
        crash_point(&format!("{what}.tmp-written"));
        if sync {
            f.sync_all().map_err(at("fsync", &tmp))?;
            crash_point(&format!("{what}.tmp-synced"));
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(tmp)
}

/// Removes `dir/name` durably. Ok(false) when it was not there.
pub fn remove_durable(dir: &Path, name: &str) -> io::Result<bool> {
    let path = dir.join(name);
    match std::fs::remove_file(&path) {
        Ok(()) => {
            crash_point("remove.unlinked");
            fsync_dir(dir)?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(at("removing", &path)(e)),
    }
}

/// Reads a regular file without following a symlink planted in its place. Sized from
/// fstat, so a record costs one read (plus the one that sees the end), not a series of
/// growing ones: scans of 100,000 records are dominated by these syscalls.
const NOT_A_FILE: &str = "not a regular file";

fn not_a_file() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, NOT_A_FILE)
}

/// The error `read_nofollow` and `read_listed_file` give for what is not a regular file.
pub fn is_not_a_file(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData && e.to_string() == NOT_A_FILE
}

pub fn read_nofollow(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC | nix::libc::O_NONBLOCK)
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(not_a_file());
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
#[allow(unsafe_code)]
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
    // One of the crate's few unsafe blocks, each allowed by name ([lints] in Cargo.toml).
    // SAFETY: `fd` was just returned by a successful openat and is owned by nothing
    // else; the File takes sole ownership and closes it once.
    let f = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    // A FIFO or device under a record's name: opened without blocking, never read.
    if !f.metadata()?.is_file() {
        return Err(not_a_file());
    }
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
    fn mode_keeping_write_and_errors_that_name_their_path() {
        let dir = std::env::temp_dir().join(format!("cl-fsio-m-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_atomic_mode(&dir, "c.conflist", b"{}", "conflist", 0o664).unwrap();
        let mode = std::fs::metadata(dir.join("c.conflist"))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777,
            0o664
        );
        let missing = dir.join("no-such-dir");
        let e = write_atomic(&missing, "x", b"1", "record").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(
            e.to_string().contains(&missing.display().to_string()),
            "{e}"
        );
        let e = fsync_dir(&missing).unwrap_err();
        assert!(e.to_string().contains("no-such-dir"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn creating_a_chain_reports_what_it_made() {
        let base = std::env::temp_dir().join(format!("cl-fsio-c-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let deep = base.join("a/b/c");
        assert!(create_dir_all_durable(&deep, 0o755).unwrap());
        assert!(deep.is_dir());
        assert!(!create_dir_all_durable(&deep, 0o755).unwrap());
        std::fs::write(base.join("file"), b"").unwrap();
        let e = create_dir_all_durable(&base.join("file/x"), 0o755).unwrap_err();
        assert!(e.to_string().contains("file/x"), "{e}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn temp_files_never_open_an_existing_name_or_follow_a_planted_link() {
        let dir = std::env::temp_dir().join(format!("cl-fsio-x-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        // Plant a link and a file under the next names this process would take.
        let probe = write_temp(&dir, "n", b"", "test", 0o600).unwrap();
        std::fs::remove_file(&probe).unwrap();
        let seq: u64 = probe
            .to_string_lossy()
            .rsplit('.')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let planted =
            |k: u64| dir.join(format!("{TMP_PREFIX}n.{}.{}", std::process::id(), seq + k));
        std::os::unix::fs::symlink(&victim, planted(1)).unwrap();
        std::fs::write(planted(2), b"other").unwrap();
        let tmp = write_temp(&dir, "n", b"new", "test", 0o600).unwrap();
        assert!(tmp != planted(1) && tmp != planted(2), "{}", tmp.display());
        assert_eq!(std::fs::read(&tmp).unwrap(), b"new");
        assert_eq!(
            std::fs::read(&victim).unwrap(),
            b"keep",
            "written through a link"
        );
        assert_eq!(std::fs::read(planted(2)).unwrap(), b"other");
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
