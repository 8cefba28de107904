//! ADD's memo of the chain it last snapshotted: which snapshot the network's conflist
//! is, trusted while the kernel's identity of every file `conflist::find` read to find
//! it is unchanged. An ADD that can trust it skips listing, reading, parsing and
//! hashing the conflist (docs/EVIDENCE.md, "The conflist remembered").
//!
//! Exactness rests on one rule, git's "racily clean" rule: an identity (device, inode,
//! size, mtime, ctime) is remembered only if its ctime is older than the moment the
//! ADD began minus `SETTLED`. Any change made later (a write, a rename into place, a
//! chmod, an entry added to the directory) sets the ctime to the time of the change, so
//! it cannot leave the remembered identity standing, even where timestamps are coarse.
//! Only local file systems are trusted: a network file system may answer a stat from a
//! cache that a read would have revalidated.
//!
//! The memo is a cache: a missing, unreadable or stale memo costs the full load, never
//! a record; it is written fsynced and renamed into place, so it is whole or absent.

use crate::conflist;
use crate::ledger::fsio::FileId;
use crate::ledger::{record, Ledger};
use nix::sys::statfs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long before the ADD began a remembered file must have last changed. Above the
/// coarsest timestamp a local Linux file system keeps (FAT's 2 s).
pub const SETTLED: Duration = Duration::from_secs(3);

const MAGIC: &str = "cni-ledger-conf-memo 1";
/// A memo is a few hundred bytes; one longer than this is not recalled.
const MAX_MEMO: usize = 8 * 1024;

/// What a full load of the network's chain gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Memo {
    /// The snapshot's hash (its name in `snapshots/`) and size.
    pub snapshot: String,
    pub snapshot_len: u64,
    /// The conflist file the chain came from.
    pub conf_file: PathBuf,
    /// Whether the chain holds the ledger's tail entry.
    pub tail: bool,
}

/// The identity of `path` as `find` reads it: symlinks followed.
fn identity(path: &Path) -> io::Result<FileId> {
    std::fs::metadata(path).map(|m| FileId::of(&m))
}

fn settled_before(id: &FileId, limit: SystemTime) -> bool {
    let Ok(limit) = limit.duration_since(SystemTime::UNIX_EPOCH) else {
        return false;
    };
    id.ctime < (limit.as_secs() as i64, i64::from(limit.subsec_nanos()))
}

/// One line of the memo: the tag, the identity's seven numbers, then the path.
fn id_line(tag: &str, id: &FileId, path: &str) -> String {
    format!(
        "{tag} {} {} {} {} {} {} {} {path}\n",
        id.dev, id.ino, id.len, id.mtime.0, id.mtime.1, id.ctime.0, id.ctime.1
    )
}

/// Parses what `id_line` wrote after the tag.
fn parse_id(rest: &str) -> Option<(FileId, &str)> {
    let mut it = rest.splitn(8, ' ');
    let mut n = || it.next()?.parse::<i64>().ok();
    let id = FileId {
        dev: u64::try_from(n()?).ok()?,
        ino: u64::try_from(n()?).ok()?,
        len: u64::try_from(n()?).ok()?,
        mtime: (n()?, n()?),
        ctime: (n()?, n()?),
    };
    let path = it.next().filter(|p| !p.is_empty())?;
    Some((id, path))
}

/// A small file, read without a stat for a size hint or a zeroed buffer. A symlink is
/// not followed.
fn read_small(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    let mut buf = Vec::with_capacity(MAX_MEMO);
    f.take(MAX_MEMO as u64).read_to_end(&mut buf)?;
    if buf.len() == MAX_MEMO {
        return Err(io::Error::other("memo too long"));
    }
    Ok(buf)
}

fn memo_path(ledger: &Ledger, network: &str, conf_dir: &Path) -> PathBuf {
    ledger.memo_path(&memo_name(network, conf_dir))
}

/// One memo per network and conf dir: two runtimes' conf dirs naming the same network
/// do not overwrite each other's. Not `.json`: the snapshot sweep and `verify` look at
/// `<hash>.json` names only.
fn memo_name(network: &str, conf_dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let dir_hash = record::sha256_hex(conf_dir.as_os_str().as_bytes());
    format!(".conf-memo.{network}.{}", &dir_hash[..16])
}

/// The memo of `network` loaded from `conf_dir`, if every identity it names is still
/// the kernel's and its snapshot is in place. Call with the snapshot guard held, so
/// that a sweep cannot remove the snapshot before the record naming it is written.
pub fn recall(ledger: &Ledger, network: &str, conf_dir: &Path) -> Option<Memo> {
    let bytes = read_small(&memo_path(ledger, network, conf_dir)).ok()?;
    let text = std::str::from_utf8(&bytes).ok()?;
    let mut lines = text.lines();
    (lines.next()? == MAGIC).then_some(())?;
    (lines.next()?.strip_prefix("network ")? == network).then_some(())?;
    (Path::new(lines.next()?.strip_prefix("confdir ")?) == conf_dir).then_some(())?;
    let (snapshot, snapshot_len) = lines.next()?.strip_prefix("snapshot ")?.split_once(' ')?;
    let snapshot_len = snapshot_len.parse().ok()?;
    let conf_file = PathBuf::from(lines.next()?.strip_prefix("conffile ")?);
    let tail = match lines.next()? {
        "tail 1" => true,
        "tail 0" => false,
        _ => return None,
    };
    let mut ended = false;
    for line in lines {
        if ended {
            return None;
        }
        if line == "end" {
            ended = true;
        } else if let Some(path) = line.strip_prefix("absent ") {
            match std::fs::symlink_metadata(path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                _ => return None,
            }
        } else {
            let (tag, rest) = line.split_once(' ')?;
            if tag != "dir" && tag != "file" {
                return None;
            }
            let (id, path) = parse_id(rest)?;
            if identity(Path::new(path)).ok()? != id {
                return None;
            }
        }
    }
    ended.then_some(())?;
    // The snapshot must be there, whole: a sweep or a quarantine may have taken it.
    let meta = std::fs::symlink_metadata(ledger.snapshot_path(snapshot)).ok()?;
    (meta.is_file() && meta.len() == snapshot_len).then_some(())?;
    Some(Memo {
        snapshot: snapshot.to_string(),
        snapshot_len,
        conf_file,
        tail,
    })
}

/// Remembers `memo`, the outcome of a full load of `network` from `conf_dir` begun at
/// `began`, if every file the load depended on had settled by `began - settled` and
/// lies on a local file system; else leaves any older memo, which no longer matches.
/// Best effort: a memo that cannot be written only costs later ADDs the full load.
pub fn remember(
    ledger: &Ledger,
    network: &str,
    conf_dir: &Path,
    memo: &Memo,
    began: SystemTime,
    settled: Duration,
) {
    if let Some(text) = describe(network, conf_dir, memo, began - settled) {
        let name = memo_name(network, conf_dir);
        if let Err(e) = ledger.put_memo(&name, text.as_bytes()) {
            crate::debug!("conflist memo of {network} not written: {e}");
        }
    }
}

/// The memo's text, or None when the load cannot be remembered exactly.
fn describe(network: &str, conf_dir: &Path, memo: &Memo, limit: SystemTime) -> Option<String> {
    let local = statfs::statfs(conf_dir).ok().is_some_and(|fs| {
        [
            statfs::EXT4_SUPER_MAGIC,
            statfs::XFS_SUPER_MAGIC,
            statfs::BTRFS_SUPER_MAGIC,
            statfs::F2FS_SUPER_MAGIC,
            statfs::TMPFS_MAGIC,
        ]
        .contains(&fs.filesystem_type())
    });
    if !local || network.contains('\n') {
        return None;
    }
    let utf8 = |p: &Path| {
        p.to_str()
            .filter(|s| !s.contains(['\n', '\r']))
            .map(str::to_string)
    };
    let dir_s = utf8(conf_dir)?;
    let mut text = format!(
        "{MAGIC}\nnetwork {network}\nconfdir {dir_s}\nsnapshot {} {}\nconffile {}\ntail {}\n",
        memo.snapshot,
        memo.snapshot_len,
        utf8(&memo.conf_file)?,
        u8::from(memo.tail)
    );
    let dir = identity(conf_dir).ok()?;
    settled_before(&dir, limit).then_some(())?;
    text += &id_line("dir", &dir, &dir_s);
    // Every entry `find` looked at up to the conflist it took: one changed to carry the
    // network's name would have been taken instead.
    let mut found = false;
    for (path, _) in conflist::candidates(conf_dir).ok()? {
        let id = identity(&path).ok()?;
        (id.dev == dir.dev && settled_before(&id, limit)).then_some(())?;
        text += &id_line("file", &id, &utf8(&path)?);
        if path == memo.conf_file {
            found = true;
            break;
        }
    }
    found.then_some(())?;
    if memo.conf_file.extension().is_some_and(|e| e == "conflist") {
        // A drop-in directory made later must be noticed; one that exists is not
        // remembered (its files would all need identities).
        let dropins = conflist::dropin_dir(conf_dir, network);
        match std::fs::symlink_metadata(&dropins) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            _ => return None,
        }
        text += &format!("absent {}\n", utf8(&dropins)?);
    }
    text += "end\n";
    // What `recall` would refuse to read is not written.
    (text.len() < MAX_MEMO).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::tests::{tmp_ledger, TmpLedger};

    const LIST: &str = r#"{"cniVersion":"1.0.0","name":"net","plugins":[{"type":"cni-ledger"}]}"#;

    struct World {
        ledger: TmpLedger,
        conf: PathBuf,
        memo: Memo,
    }

    fn world(tag: &str) -> World {
        // The temp dir must be on a local file system, as a node's /etc/cni/net.d is.
        let ledger = tmp_ledger(tag);
        let conf = ledger.root().join("net.d");
        std::fs::create_dir(&conf).unwrap();
        std::fs::write(conf.join("10-net.conflist"), LIST).unwrap();
        let snapshot = ledger.put_snapshot(LIST.as_bytes()).unwrap();
        let memo = Memo {
            snapshot,
            snapshot_len: LIST.len() as u64,
            conf_file: conf.join("10-net.conflist"),
            tail: false,
        };
        World { ledger, conf, memo }
    }

    /// Remembers as an ADD beginning now would, with files settled after `settled`.
    fn remember_now(w: &World, settled: Duration) {
        remember(
            &w.ledger,
            "net",
            &w.conf,
            &w.memo,
            SystemTime::now(),
            settled,
        );
    }

    /// Waits until what was just written is older than `SHORT` by the file clock.
    fn settle() {
        std::thread::sleep(SHORT * 3);
    }
    const SHORT: Duration = Duration::from_millis(40);

    #[test]
    fn a_settled_conflist_is_recalled_and_any_change_forgets_it() {
        let w = world("memo-change");
        settle();
        remember_now(&w, SHORT);
        assert_eq!(recall(&w.ledger, "net", &w.conf), Some(w.memo.clone()));
        // Another network or directory is not this memo.
        assert_eq!(recall(&w.ledger, "other", &w.conf), None);
        assert_eq!(recall(&w.ledger, "net", &w.ledger.root().join("x")), None);

        // Rewritten in place with bytes of the same length: size and inode unchanged.
        let path = w.conf.join("10-net.conflist");
        std::fs::write(&path, LIST.replace("1.0.0", "0.4.0")).unwrap();
        assert_eq!(recall(&w.ledger, "net", &w.conf), None);
        settle();
        remember_now(&w, SHORT);
        assert!(recall(&w.ledger, "net", &w.conf).is_some());

        // A file sorting first that now carries the network's name.
        std::fs::write(w.conf.join("05-other.conflist"), LIST.replace("net", "oth")).unwrap();
        assert_eq!(recall(&w.ledger, "net", &w.conf), None);
        settle();
        remember_now(&w, SHORT);
        assert!(recall(&w.ledger, "net", &w.conf).is_some());
        std::fs::write(w.conf.join("05-other.conflist"), LIST).unwrap();
        assert_eq!(recall(&w.ledger, "net", &w.conf), None);
        std::fs::remove_file(w.conf.join("05-other.conflist")).unwrap();

        // A drop-in directory made for the network.
        settle();
        remember_now(&w, SHORT);
        assert!(recall(&w.ledger, "net", &w.conf).is_some());
        std::fs::create_dir(w.conf.join("net")).unwrap();
        assert_eq!(recall(&w.ledger, "net", &w.conf), None);
    }

    #[test]
    fn files_changed_within_the_settling_time_are_not_remembered() {
        let w = world("memo-racy");
        remember_now(&w, SETTLED);
        assert_eq!(recall(&w.ledger, "net", &w.conf), None);
        assert!(!memo_path(&w.ledger, "net", &w.conf).exists());
    }

    #[test]
    fn a_memo_whose_snapshot_is_gone_or_torn_is_not_recalled() {
        let w = world("memo-snapshot");
        settle();
        remember_now(&w, SHORT);
        assert!(recall(&w.ledger, "net", &w.conf).is_some());
        let snap = w.ledger.snapshot_path(&w.memo.snapshot);
        std::fs::write(&snap, &LIST[..10]).unwrap();
        assert_eq!(recall(&w.ledger, "net", &w.conf), None);
        std::fs::remove_file(&snap).unwrap();
        assert_eq!(recall(&w.ledger, "net", &w.conf), None);
    }

    #[test]
    fn a_damaged_memo_is_not_recalled() {
        let w = world("memo-damaged");
        settle();
        remember_now(&w, SHORT);
        let path = memo_path(&w.ledger, "net", &w.conf);
        let text = std::fs::read_to_string(&path).unwrap();
        for cut in [text.len() - 4, text.len() / 2, 10] {
            std::fs::write(&path, &text[..cut]).unwrap();
            assert_eq!(recall(&w.ledger, "net", &w.conf), None, "cut at {cut}");
        }
        std::fs::write(&path, text.replace("tail 0", "tail 2")).unwrap();
        assert_eq!(recall(&w.ledger, "net", &w.conf), None);
    }
}
