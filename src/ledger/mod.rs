//! The ledger: a directory of durable, checksummed records, one file per attachment.
//!
//! ```text
//! <ledgerDir>/                   0700 root
//!   records/<net>:<cid>:<if>.json  one record (see record.rs), 0600
//!   snapshots/<sha256>.json      exact conflist bytes, named by their sha256, shared
//!   locks/keys                   a byte-range lock per attachment; locks/.snapshots for sweeps
//!   quarantine/<name>.<secs>     damaged files moved aside, never acted on
//!   notes/<net>:<cid>:<if>.json    the tail entry's notes on the chain (chain_note.rs), made on first use
//!   retired/<net>:<cid>:<if>.json  records set aside while their ADD may still complete
//!                                (retired.rs), made on first use
//! ```
//!
//! Every write of a record or snapshot is temp + fsync + rename + directory fsync; every
//! removal fsyncs the directory. A note is the exception: it is never flushed, and losing
//! it costs no replay. ADD and DEL touch one record and one lock file: O(1) in the
//! ledger's size.

mod chain_note;
pub mod fsio;
pub mod lock;
mod quarantine;
pub mod record;
mod retired;

use anyhow::{bail, Context, Result};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::PoisonError;

pub use lock::{KeyLock, SnapshotGuard, Wait};

/// The per-attachment files of `devices/` (src/devices/), one of each kind per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceFile {
    /// Devices DEL could not give back (`devices/`).
    Failure,
    /// The host's hardware links as the head found them at ADD (`devices/host/`).
    HostLinks,
    /// Links whose alias disagreed with the recorded host name (`devices/alias-mismatch/`).
    AliasMismatch,
    /// Devices gc gave back after the fact (`devices/repaired/`).
    Repaired,
}
pub use quarantine::{Damaged, Quarantine};
pub use record::{Damage, DamageReason, Decoded, Key, Record, RecordSource};

/// Threads for a scan: the work is syscalls on cached files, so a few cores suffice.
pub fn scan_jobs() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4)
}

const RECORD_EXT: &str = ".json";
/// The one file every attachment lock is a byte of (lock.rs).
const KEY_LOCKS: &str = "keys";
/// A record is a few KiB; anything larger is not one of ours.
const MAX_RECORD: u64 = 4 << 20;
const MAX_SNAPSHOT: u64 = 4 << 20;

#[derive(Debug, Clone)]
pub struct Ledger {
    root: PathBuf,
}

/// A snapshot as `get_snapshot` read it, shaped like a record's `Decoded`.
#[derive(Debug)]
pub enum Snapshot {
    /// Intact: its bytes hash to its name.
    Ok(Vec<u8>),
    /// Not to be used, to be quarantined; the reason is a short word.
    Damaged(&'static str),
    /// No such file.
    Missing,
}

/// One file found in `records/`.
#[derive(Debug)]
pub struct Entry {
    pub stem: String,
    pub path: PathBuf,
    pub decoded: Decoded,
}

/// An entry of `records/` no writer can ever make a good record of, whatever its
/// name's ending: a name that is not UTF-8 (no key has one; read back by a lossy name
/// it would be another file), or a directory. Found as foreign files, so quarantine
/// moves them by path without a key's lock, once, instead of reporting them forever.
fn odd_entry(item: &std::fs::DirEntry, name: &str) -> Option<Damage> {
    if item.file_name().to_str().is_none() {
        return Some(Damage::new(
            DamageReason::ForeignFile,
            format!("a file name that is not UTF-8 ({name})"),
        ));
    }
    match item.file_type() {
        // An ADD's rename cannot replace a directory: it is no record, ever.
        Ok(t) if t.is_dir() => Some(Damage::new(
            DamageReason::ForeignFile,
            "a directory stands in place of a record",
        )),
        _ => None,
    }
}

fn mkdir_private(path: &Path) -> io::Result<bool> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

impl Ledger {
    /// A handle that does not touch the disk (for reading a ledger that may not exist).
    pub fn at(root: impl Into<PathBuf>) -> Ledger {
        Ledger { root: root.into() }
    }

    /// Opens for writing, creating the directory tree (0700) on first use.
    pub fn open_for_write(root: &Path) -> Result<Ledger> {
        let ledger = Ledger::at(root);
        if ledger.records_dir().is_dir() && ledger.locks_dir().is_dir() {
            return Ok(ledger);
        }
        if let Some(parent) = root.parent() {
            // Explicit mode: under a umask of 000 these would be world-writable, and
            // anyone could then rename the ledger away. Every new ancestor is fsynced.
            fsio::create_dir_all_durable(parent, 0o755)?;
        }
        if mkdir_private(root).with_context(|| format!("creating {}", root.display()))? {
            if let Some(parent) = root.parent() {
                fsio::fsync_dir(parent)?;
            }
        }
        let mut created = false;
        for dir in [
            ledger.records_dir(),
            ledger.snapshots_dir(),
            ledger.locks_dir(),
            ledger.quarantine_dir(),
        ] {
            created |=
                mkdir_private(&dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        if created {
            fsio::fsync_dir(root)?;
        }
        Ok(ledger)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn records_dir(&self) -> PathBuf {
        self.root.join("records")
    }
    pub fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }
    pub fn locks_dir(&self) -> PathBuf {
        self.root.join("locks")
    }
    pub fn quarantine_dir(&self) -> PathBuf {
        self.root.join("quarantine")
    }
    pub fn record_path(&self, stem: &str) -> PathBuf {
        self.records_dir().join(format!("{stem}{RECORD_EXT}"))
    }
    /// The directories an ADD writes into (its record, the conflist's snapshot, the
    /// key's lock): what readiness checks are there and writable.
    pub fn add_dirs(&self) -> [PathBuf; 3] {
        [self.records_dir(), self.snapshots_dir(), self.locks_dir()]
    }

    /// The metadata of the directory records are in (following a symlink): DEL's first
    /// look, telling no ledger from one it cannot reach.
    pub fn records_metadata(&self) -> io::Result<std::fs::Metadata> {
        std::fs::metadata(self.records_dir())
    }

    /// Whether a record could be written now (STATUS): a temp file made and removed
    /// where records are written; the error names the directory.
    pub fn probe_writable(&self) -> Result<()> {
        let dir = self.records_dir();
        let name = format!("{}status-probe.{}", fsio::TMP_PREFIX, std::process::id());
        std::fs::write(dir.join(&name), b"")
            .and_then(|()| std::fs::remove_file(dir.join(&name)))
            .with_context(|| format!("probing {}", dir.display()))
    }

    /// Where the device notes and the host's links kept at ADD live (src/devices/).
    pub fn devices_dir(&self) -> PathBuf {
        self.root.join("devices")
    }

    /// The directory of one kind of per-attachment file of `devices/`.
    pub fn device_files_dir(&self, kind: DeviceFile) -> PathBuf {
        let top = self.devices_dir();
        match kind {
            DeviceFile::Failure => top,
            DeviceFile::HostLinks => top.join("host"),
            DeviceFile::AliasMismatch => top.join("alias-mismatch"),
            DeviceFile::Repaired => top.join("repaired"),
        }
    }

    /// The name of `key`'s file of any kind in `device_files_dir`.
    pub fn device_file_name(key: &Key) -> String {
        format!("{}{RECORD_EXT}", key.stem())
    }

    /// `key`'s file of this kind.
    pub fn device_file_path(&self, kind: DeviceFile, key: &Key) -> PathBuf {
        self.device_files_dir(kind)
            .join(Ledger::device_file_name(key))
    }

    /// The files of this kind, as listed now (writes in progress left out; empty when
    /// the directory cannot be listed), in no order.
    pub fn device_files(&self, kind: DeviceFile) -> Vec<PathBuf> {
        let Ok(rd) = std::fs::read_dir(self.device_files_dir(kind)) else {
            return Vec::new();
        };
        rd.flatten()
            .filter(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                n.ends_with(RECORD_EXT) && !n.starts_with(fsio::TMP_PREFIX)
            })
            .map(|e| e.path())
            .collect()
    }

    /// How many files of this kind there are (a temp file never ends in `.json`).
    pub fn device_file_count(&self, kind: DeviceFile) -> usize {
        std::fs::read_dir(self.device_files_dir(kind))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(RECORD_EXT))
                    .count()
            })
            .unwrap_or(0)
    }

    /// The stem of a file name in `records/`; None for a temp file of a write in
    /// progress (they start with a dot and never end in `.json`) or a foreign name.
    pub fn record_stem(name: &str) -> Option<&str> {
        name.strip_suffix(RECORD_EXT)
            .filter(|s| !s.starts_with('.'))
    }

    /// The stems of `records/` with each file's mtime, as listed now, lazily: one
    /// listing, and a stat per stem taken (gc's look for an ADD in flight stops at the
    /// first). A file that cannot be stat'ed is left out; nothing when `records/`
    /// cannot be listed.
    pub fn record_stems_modified(&self) -> impl Iterator<Item = (String, std::time::SystemTime)> {
        std::fs::read_dir(self.records_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let stem = Ledger::record_stem(e.file_name().to_str()?)?.to_string();
                let made = e.metadata().and_then(|m| m.modified()).ok()?;
                Some((stem, made))
            })
    }

    /// The stems of `records/`, as listed now (empty when it cannot be listed): what a
    /// reader that wants intact records only (metrics, the agent's watcher) walks.
    pub fn record_stems(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.records_dir()) else {
            return Vec::new();
        };
        rd.filter_map(|e| e.ok())
            .filter_map(|e| Some(Ledger::record_stem(e.file_name().to_str()?)?.to_string()))
            .collect()
    }

    /// `stem`'s record if it is intact and of a format this binary knows, with the
    /// tail's note on it (`with_note`); None for anything else, which gc and `list`
    /// deal with. Its name is not checked against its key.
    pub fn read_intact(&self, stem: &str) -> Option<Record> {
        let bytes = fsio::read_nofollow(&self.record_path(stem), MAX_RECORD).ok()?;
        let mut rec = match record::decode(&bytes) {
            Decoded::Ok(r) => *r,
            _ => return None,
        };
        self.with_note(stem, &mut rec);
        Some(rec)
    }

    /// The path of the plugin's conflist memo `name` (src/plugin/conf_memo.rs), kept in
    /// `snapshots/` under a name that is not `.json`, which the snapshot sweep and
    /// `verify` take for snapshots.
    pub fn memo_path(&self, name: &str) -> PathBuf {
        self.snapshots_dir().join(name)
    }

    /// Replaces the memo `name` atomically.
    pub fn put_memo(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        fsio::replace_atomic(&self.snapshots_dir(), name, bytes, "memo")
    }

    pub fn lock(&self, stem: &str, wait: Wait) -> Result<Option<KeyLock>> {
        let path = self.locks_dir().join(KEY_LOCKS);
        KeyLock::acquire(&path, stem, wait)
            .with_context(|| format!("locking {stem} in {}", path.display()))
    }

    pub fn snapshot_guard_shared(&self) -> Result<SnapshotGuard> {
        let path = self.locks_dir().join(".snapshots");
        SnapshotGuard::shared(&path).with_context(|| format!("locking {}", path.display()))
    }

    /// Reads one record; Ok(None) when there is none.
    pub fn read(&self, stem: &str) -> Result<Option<Decoded>> {
        let path = self.record_path(stem);
        let read = crate::faults::read_error(&format!("{stem}{RECORD_EXT}"))
            .map_or_else(|| fsio::read_nofollow(&path, MAX_RECORD), Err);
        match read {
            Ok(bytes) => Ok(Some(self.with_note_of(stem, record::decode(&bytes)))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                Ok(Some(Decoded::Damaged(Damage::new(
                    DamageReason::Symlink,
                    "a symlink stands in place of a record",
                ))))
            }
            // A FIFO or directory under the record's name: damage (DEL quarantines it),
            // not an I/O error that would fail every DEL of the key.
            Err(e) if fsio::is_not_a_file(&e) || e.raw_os_error() == Some(nix::libc::EISDIR) => {
                Ok(Some(Decoded::Damaged(Damage::new(
                    DamageReason::NotAFile,
                    "not a regular file",
                ))))
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    pub fn write(&self, rec: &Record) -> Result<()> {
        self.put_record(rec, fsio::write_atomic, "writing")
    }

    /// Encodes `rec` and stores it under its key's name by `put` (one of fsio's atomic
    /// writes); `doing` names the act in the error.
    fn put_record(
        &self,
        rec: &Record,
        put: fn(&Path, &str, &[u8], &str) -> io::Result<()>,
        doing: &str,
    ) -> Result<()> {
        let stem = rec.key().stem();
        put(
            &self.records_dir(),
            &format!("{stem}{RECORD_EXT}"),
            &record::encode(rec),
            "record",
        )
        .with_context(|| format!("{doing} record {}", self.record_path(&stem).display()))
    }

    /// Removes a record durably, then the tail's note on it; Ok(false) when there was
    /// no record.
    pub fn remove(&self, stem: &str) -> Result<bool> {
        let removed = fsio::remove_durable(&self.records_dir(), &format!("{stem}{RECORD_EXT}"))
            .with_context(|| format!("removing {}", self.record_path(stem).display()))?;
        self.drop_note(stem);
        Ok(removed)
    }

    /// A record's name checked, and the tail's note merged in (`with_note`).
    fn with_note_of(&self, stem: &str, decoded: Decoded) -> Decoded {
        match check_name(stem, decoded) {
            Decoded::Ok(mut rec) => {
                self.with_note(stem, &mut rec);
                Decoded::Ok(rec)
            }
            other => other,
        }
    }

    /// Visits every record file; O(n), one file in memory at a time. Temporary files
    /// of writes in progress (or cut off by a crash) are not records and are skipped.
    pub fn for_each(&self, mut visit: impl FnMut(Entry)) -> Result<()> {
        let Some((dir, rd)) = self.list_records()? else {
            return Ok(());
        };
        for item in rd {
            let item = item.with_context(|| format!("listing {}", self.records_dir().display()))?;
            if let Some(entry) = self.entry(&dir, &item) {
                visit(entry);
            }
        }
        Ok(())
    }

    /// `for_each` on `jobs` threads, each with its own accumulator (returned in a Vec):
    /// a scan is bound by per-file syscalls, which parallelise. Memory stays one file
    /// per worker plus what the accumulators keep.
    pub fn scan<T: Send>(
        &self,
        jobs: usize,
        init: impl Fn() -> T + Sync,
        visit: impl Fn(&mut T, Entry) + Sync,
    ) -> Result<Vec<T>> {
        let Some((dir, rd)) = self.list_records()? else {
            return Ok(vec![init()]);
        };
        let rd = std::sync::Mutex::new(rd);
        let failure = std::sync::Mutex::new(None);
        let accs = crate::workers::run(jobs, || {
            let mut acc = init();
            loop {
                let next = rd.lock().unwrap_or_else(PoisonError::into_inner).next();
                match next {
                    None => break,
                    Some(Err(e)) => {
                        *failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                        break;
                    }
                    Some(Ok(item)) => {
                        if let Some(entry) = self.entry(&dir, &item) {
                            visit(&mut acc, entry);
                        }
                    }
                }
            }
            acc
        });
        if let Some(e) = failure.into_inner().unwrap_or_else(PoisonError::into_inner) {
            return Err(e).with_context(|| format!("listing {}", self.records_dir().display()));
        }
        Ok(accs)
    }

    /// The records directory, open (for openat) and being listed.
    fn list_records(&self) -> Result<Option<(std::fs::File, std::fs::ReadDir)>> {
        let dir = self.records_dir();
        let listed = std::fs::File::open(&dir).and_then(|f| Ok((f, std::fs::read_dir(&dir)?)));
        match listed {
            Ok(both) => Ok(Some(both)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("listing {}", dir.display())),
        }
    }

    fn entry(&self, dir: &std::fs::File, item: &std::fs::DirEntry) -> Option<Entry> {
        let name = item.file_name().to_string_lossy().into_owned();
        if name.starts_with(fsio::TMP_PREFIX) {
            return None;
        }
        let path = item.path();
        if let Some(odd) = odd_entry(item, &name) {
            return Some(Entry {
                stem: name,
                path,
                decoded: Decoded::Damaged(odd),
            });
        }
        let Some(stem) = name.strip_suffix(RECORD_EXT) else {
            return Some(Entry {
                stem: name.clone(),
                path,
                decoded: Decoded::Damaged(Damage::new(
                    DamageReason::ForeignFile,
                    "not a record file name",
                )),
            });
        };
        let decoded = match item.file_type() {
            Ok(t) if t.is_symlink() => Decoded::Damaged(Damage::new(
                DamageReason::Symlink,
                "a symlink stands in place of a record",
            )),
            Ok(t) if !t.is_file() => {
                Decoded::Damaged(Damage::new(DamageReason::NotAFile, "not a regular file"))
            }
            _ => match crate::faults::read_error(&name).map_or_else(
                || fsio::read_listed_file(dir, &item.file_name(), MAX_RECORD),
                Err,
            ) {
                Ok(bytes) => self.with_note_of(stem, record::decode(&bytes)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return None, // removed since listed
                Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                    Decoded::Damaged(Damage::new(
                        DamageReason::Symlink,
                        "a symlink stands in place of a record",
                    ))
                }
                // A FIFO, socket or device the listing did not type (opened without
                // blocking, then refused by its fstat).
                Err(e) if fsio::is_not_a_file(&e) => {
                    Decoded::Damaged(Damage::new(DamageReason::NotAFile, "not a regular file"))
                }
                // The read failed, not the content: left where it is for the next run.
                Err(e) => Decoded::Unreadable(e.to_string()),
            },
        };
        Some(Entry {
            stem: stem.to_string(),
            path,
            decoded,
        })
    }

    /// Stores a conflist snapshot (content-addressed) and returns its sha256. An intact
    /// copy is reused; a damaged one is replaced.
    pub fn put_snapshot(&self, bytes: &[u8]) -> Result<String> {
        let hash = record::sha256_hex(bytes);
        match self.get_snapshot(&hash) {
            Ok(Snapshot::Ok(_)) => return Ok(hash),
            // Rebuildable from its name, but damage is reported, never silently overwritten.
            Ok(Snapshot::Damaged(reason)) => {
                self.quarantine_snapshot(&hash, reason, "ledger (rewriting it):")
            }
            Ok(Snapshot::Missing) | Err(_) => {}
        }
        fsio::write_atomic(
            &self.snapshots_dir(),
            &format!("{hash}.json"),
            bytes,
            "snapshot",
        )
        .with_context(|| format!("writing snapshot {hash}"))?;
        Ok(hash)
    }

    pub fn snapshot_path(&self, hash: &str) -> PathBuf {
        self.snapshots_dir().join(format!("{hash}.json"))
    }

    /// Reads a snapshot and checks it against its name; Err only when it cannot be read.
    pub fn get_snapshot(&self, hash: &str) -> Result<Snapshot> {
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(Snapshot::Damaged("bad-name"));
        }
        let path = self.snapshot_path(hash);
        match fsio::read_nofollow(&path, MAX_SNAPSHOT) {
            Ok(bytes) if record::sha256_hex(&bytes) == hash => Ok(Snapshot::Ok(bytes)),
            Ok(_) => Ok(Snapshot::Damaged("checksum-mismatch")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Snapshot::Missing),
            Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                Ok(Snapshot::Damaged("symlink"))
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Lists snapshot file names (hash stems) present on disk.
    pub fn snapshot_hashes(&self) -> Result<Vec<String>> {
        let dir = self.snapshots_dir();
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
        };
        let mut out = Vec::new();
        for item in rd {
            let item = item.with_context(|| format!("listing {}", dir.display()))?;
            let name = item.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(RECORD_EXT) {
                if !name.starts_with(fsio::TMP_PREFIX) {
                    out.push(stem.to_string());
                }
            }
        }
        Ok(out)
    }

    /// Removes snapshots no record refers to, of all of them or `only` of these. Skipped
    /// (Ok(0)) while any ADD holds the shared guard, so an ADD never refers to a
    /// snapshot that was just deleted.
    pub fn sweep_snapshots(
        &self,
        only: Option<&std::collections::HashSet<String>>,
    ) -> Result<usize> {
        let guard_path = self.locks_dir().join(".snapshots");
        let Some(_guard) = SnapshotGuard::try_exclusive(&guard_path)? else {
            return Ok(0);
        };
        let mut used = std::collections::HashSet::new();
        let mut unread = 0;
        let mut untold = 0;
        let mut note_use = |e: Entry| match e.decoded {
            Decoded::Ok(r) => used.extend(r.snapshot),
            // Its snapshot is unknown, and it is still a record: any may be its.
            Decoded::Unreadable(_) => unread += 1,
            // Left for the newer binary, with the chain it will replay.
            Decoded::Newer(_) => match newer_record_snapshots(&e.path) {
                Some(hashes) => used.extend(hashes),
                None => untold += 1,
            },
            Decoded::Damaged(..) => {}
        };
        self.for_each(&mut note_use)?;
        // A retired record may still be replayed, by its snapshot.
        self.for_each_retired(&mut note_use)?;
        if unread > 0 {
            crate::warn!("snapshot sweep skipped: {unread} record(s) could not be read");
            return Ok(0);
        }
        if untold > 0 {
            crate::warn!(
                "snapshot sweep skipped: {untold} newer-format record(s) name snapshots this binary cannot tell"
            );
            return Ok(0);
        }
        let mut removed = 0;
        for hash in self.snapshot_hashes()? {
            if only.is_none_or(|o| o.contains(&hash))
                && !used.contains(&hash)
                && fsio::remove_durable(&self.snapshots_dir(), &format!("{hash}.json"))?
            {
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes temporary files left by writers that died mid-write (crash, kill). The
    /// writer's pid is in the name; a file of a live process is a write in progress.
    pub fn remove_orphan_temps(&self) -> usize {
        let mut removed = 0;
        for (dir, name) in self.temp_files() {
            // .tmp.<name>.<pid>.<seq>
            let pid = name.rsplit('.').nth(1).and_then(|p| p.parse::<u32>().ok());
            let Some(pid) = pid else { continue };
            if Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            if fsio::remove_durable(&dir, &name).unwrap_or(false) {
                removed += 1;
            }
        }
        removed
    }

    /// The temporary files, each as its directory and name, in the directories the
    /// ledger writes by temporary file and rename: where a crash can leave one behind.
    pub fn temp_files(&self) -> Vec<(PathBuf, String)> {
        let mut found = Vec::new();
        for dir in [
            self.records_dir(),
            self.snapshots_dir(),
            self.notes_dir(),
            self.retired_dir(),
        ] {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for item in rd.flatten() {
                let name = item.file_name().to_string_lossy().into_owned();
                if name.starts_with(fsio::TMP_PREFIX) {
                    found.push((dir.clone(), name));
                }
            }
        }
        found
    }

    /// gc executes binaries as root on the ledger's word, so the ledger must be root's
    /// alone: owned by root and writable by no one else, at every level.
    pub fn check_trusted(&self) -> Result<()> {
        for dir in [
            self.root.clone(),
            self.records_dir(),
            self.snapshots_dir(),
            self.locks_dir(),
            self.notes_dir(),
            self.retired_dir(),
        ] {
            let meta = match std::fs::metadata(&dir) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("checking {}", dir.display())),
            };
            if !crate::faults::trusted_owner(meta.uid()) {
                bail!(
                    "refusing ledger: {} is owned by uid {}, not root",
                    dir.display(),
                    meta.uid()
                );
            }
            if meta.permissions().mode() & 0o022 != 0 {
                bail!(
                    "refusing ledger: {} is writable by group or others (mode {:o})",
                    dir.display(),
                    meta.permissions().mode() & 0o7777
                );
            }
        }
        Ok(())
    }
}

/// A record stored under another key's name is not trusted either.
fn check_name(stem: &str, decoded: Decoded) -> Decoded {
    match decoded {
        Decoded::Ok(r) if r.key().stem() != stem => Decoded::Damaged(Damage::new(
            DamageReason::Misnamed,
            format!("file {stem} holds the record of {}", r.key()),
        )),
        other => other,
    }
}

/// The snapshots a newer-format record may name (`record::newer_view`); None when that
/// cannot be told, and every snapshot must then be kept. A file gone since the listing
/// names none.
fn newer_record_snapshots(path: &Path) -> Option<Vec<String>> {
    match fsio::read_nofollow(path, MAX_RECORD) {
        Ok(bytes) => record::newer_view(&bytes)
            .filter(|v| v.snapshots_known)
            .map(|v| v.hashes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Some(Vec::new()),
        Err(_) => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ledger in a scratch directory that is removed when the test is done with it,
    /// passed or failed.
    pub(crate) struct TmpLedger(Ledger);

    impl std::ops::Deref for TmpLedger {
        type Target = Ledger;
        fn deref(&self) -> &Ledger {
            &self.0
        }
    }

    impl Drop for TmpLedger {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0.root());
        }
    }

    pub(crate) fn tmp_ledger(tag: &str) -> TmpLedger {
        let root = std::env::temp_dir().join(format!("cl-ledger-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        TmpLedger(Ledger::open_for_write(&root).unwrap())
    }

    #[test]
    fn write_read_remove() {
        let l = tmp_ledger("wrr");
        let r = record::sample();
        l.write(&r).unwrap();
        let stem = r.key().stem();
        assert!(matches!(l.read(&stem).unwrap(), Some(Decoded::Ok(_))));
        let mode = std::fs::metadata(l.record_path(&stem))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(l.remove(&stem).unwrap());
        assert!(l.read(&stem).unwrap().is_none());
    }

    #[test]
    fn record_stems_with_mtimes_leave_writes_in_progress_and_foreign_names_out() {
        let l = tmp_ledger("stems-mtime");
        let r = record::sample();
        l.write(&r).unwrap();
        let dir = l.records_dir();
        std::fs::write(dir.join(".tmp.n:c:eth0.json.1.0"), b"x").unwrap();
        std::fs::write(dir.join(".hidden.json"), b"x").unwrap();
        std::fs::write(dir.join("foreign.txt"), b"x").unwrap();
        let made = std::fs::metadata(l.record_path(&r.key().stem()))
            .and_then(|m| m.modified())
            .unwrap();
        let found: Vec<_> = l.record_stems_modified().collect();
        assert_eq!(found, [(r.key().stem(), made)]);
    }

    #[test]
    fn each_device_file_kind_has_its_own_directory_and_names() {
        let l = tmp_ledger("device-files");
        let key = Key::new("n", "c", "eth0");
        let kinds = [
            (DeviceFile::Failure, "devices"),
            (DeviceFile::HostLinks, "devices/host"),
            (DeviceFile::AliasMismatch, "devices/alias-mismatch"),
            (DeviceFile::Repaired, "devices/repaired"),
        ];
        for (kind, dir) in kinds {
            let path = l.device_file_path(kind, &key);
            assert_eq!(path, l.root().join(dir).join("n:c:eth0.json"));
            assert_eq!(l.device_file_count(kind), 0);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, b"{}").unwrap();
            // A write in progress never ends in .json; one that does is not listed.
            std::fs::write(path.with_file_name(".tmp.n:c:eth0.json.1.0"), b"x").unwrap();
            std::fs::write(path.with_file_name(".tmp.odd.json"), b"x").unwrap();
            assert_eq!(l.device_files(kind), std::slice::from_ref(&path), "{dir}");
        }
        // The top directory's listing is its own files, not the kinds beneath it.
        assert_eq!(l.device_file_count(DeviceFile::Failure), 2);
        assert_eq!(l.device_file_count(DeviceFile::Repaired), 2);
    }

    #[test]
    fn the_intact_records_readers_list_are_the_records_only() {
        let l = tmp_ledger("intact");
        let r = record::sample();
        l.write(&r).unwrap();
        let stem = r.key().stem();
        let dir = l.records_dir();
        std::fs::write(dir.join(".tmp-half"), b"x").unwrap();
        std::fs::write(dir.join("foreign.txt"), b"x").unwrap();
        std::fs::write(dir.join("torn:c:eth0.json"), b"{").unwrap();
        let mut stems = l.record_stems();
        stems.sort();
        assert_eq!(stems, [stem.clone(), "torn:c:eth0".to_string()]);
        assert_eq!(l.read_intact(&stem).unwrap().key(), r.key());
        assert!(l.read_intact("torn:c:eth0").is_none());
        assert!(l.read_intact("absent:c:eth0").is_none());
        assert_eq!(Ledger::record_stem(".x.json"), None);
    }

    #[test]
    fn misnamed_and_damaged_records_are_not_trusted() {
        let l = tmp_ledger("dmg");
        let r = record::sample();
        std::fs::write(l.record_path("other:id:eth0"), record::encode(&r)).unwrap();
        assert!(matches!(
            l.read("other:id:eth0").unwrap(),
            Some(Decoded::Damaged(Damage {
                reason: DamageReason::Misnamed,
                ..
            }))
        ));
        let mut seen = 0;
        l.for_each(|e| {
            seen += 1;
            assert!(matches!(e.decoded, Decoded::Damaged(..)));
            let q = l.quarantine(&e.path).unwrap();
            assert!(q.starts_with(l.quarantine_dir()));
        })
        .unwrap();
        assert_eq!(seen, 1);
    }

    #[test]
    fn snapshots_are_content_addressed_and_swept() {
        let l = tmp_ledger("snap");
        let h = l.put_snapshot(b"{\"name\":\"n\"}").unwrap();
        assert_eq!(l.put_snapshot(b"{\"name\":\"n\"}").unwrap(), h);
        assert!(matches!(l.get_snapshot(&h).unwrap(), Snapshot::Ok(_)));
        std::fs::write(l.snapshot_path(&h), b"tampered").unwrap();
        assert!(matches!(
            l.get_snapshot(&h).unwrap(),
            Snapshot::Damaged("checksum-mismatch")
        ));
        // A damaged copy is quarantined, then replaced by the next writer.
        l.put_snapshot(b"{\"name\":\"n\"}").unwrap();
        assert!(matches!(l.get_snapshot(&h).unwrap(), Snapshot::Ok(_)));
        let quarantined: Vec<_> = std::fs::read_dir(l.quarantine_dir()).unwrap().collect();
        assert_eq!(quarantined.len(), 1);
        let mut r = record::sample();
        r.snapshot = Some(h.clone());
        l.write(&r).unwrap();
        let unused = l.put_snapshot(b"{}").unwrap();
        // A dead writer's temp file goes; one of a live process stays.
        let dead = l.records_dir().join(".tmp.a:b:c.json.999999999.0");
        let alive = l
            .records_dir()
            .join(format!(".tmp.a:b:c.json.{}.0", std::process::id()));
        std::fs::write(&dead, b"").unwrap();
        std::fs::write(&alive, b"").unwrap();
        assert_eq!(l.remove_orphan_temps(), 1);
        assert!(!dead.exists() && alive.exists());
        std::fs::remove_file(&alive).unwrap();
        // A sweep limited to other snapshots leaves the unused one alone.
        let elsewhere = std::collections::HashSet::from([h.clone()]);
        assert_eq!(l.sweep_snapshots(Some(&elsewhere)).unwrap(), 0);
        assert!(!matches!(
            l.get_snapshot(&unused).unwrap(),
            Snapshot::Missing
        ));
        assert_eq!(l.sweep_snapshots(None).unwrap(), 1);
        assert!(matches!(
            l.get_snapshot(&unused).unwrap(),
            Snapshot::Missing
        ));
        assert!(!matches!(l.get_snapshot(&h).unwrap(), Snapshot::Missing));
    }
}
