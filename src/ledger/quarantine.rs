//! Damaged files and `quarantine/`: a record or snapshot that fails its checks is never
//! acted on and never deleted; it is moved aside here, the one way the ledger parts
//! with one, and every mover (gc, list, DEL, a snapshot's writer) goes through this file.

use super::{fsio, mkdir_private, DamageReason, Decoded, KeyLock, Ledger, Wait};
use anyhow::{Context, Result};
use std::fmt;
use std::path::{Path, PathBuf};

/// A record file found damaged (by a scan or a read): not to be acted on, to be
/// quarantined.
#[derive(Debug)]
pub struct Damaged {
    /// The key's file stem the file stands under (its name, for a foreign file).
    pub stem: String,
    pub path: PathBuf,
    pub reason: DamageReason,
    pub detail: String,
}

impl fmt::Display for Damaged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}: {})",
            self.path.display(),
            self.reason,
            self.detail
        )
    }
}

/// What became of a damaged record handed to `quarantine_damaged` or `quarantine_held`.
#[derive(Debug)]
pub enum Quarantine {
    Moved(PathBuf),
    /// Its key is locked by a writer or a replay; next time.
    Busy,
    /// Replaced (or removed) since the scan: nothing damaged is left.
    Replaced,
    /// It could not be moved (already logged); it stays, still never acted on.
    Failed(anyhow::Error),
}

impl Ledger {
    /// Quarantines a record found damaged by a scan, under the key's lock and only if it
    /// is still damaged: a concurrent ADD may have just replaced it with a good record.
    /// Logs what became of it, after `who` (`gc:`, `list:`).
    pub fn quarantine_damaged(&self, d: &Damaged, who: &str) -> Quarantine {
        self.quarantine_checked(d, who, |stem| self.read(stem))
    }

    /// `quarantine_damaged` for an entry of `retired/` (`d.path` is there): re-read
    /// there, so that a FIFO, directory or non-UTF-8 name set aside is moved once too,
    /// not reported as damage on every gc run.
    pub fn quarantine_retired(&self, d: &Damaged, who: &str) -> Quarantine {
        self.quarantine_checked(d, who, |stem| self.read_retired(stem))
    }

    fn quarantine_checked(
        &self,
        d: &Damaged,
        who: &str,
        reread: impl FnOnce(&str) -> Result<Option<Decoded>>,
    ) -> Quarantine {
        // A file without a record's name stands for no key: no lock guards it and no
        // writer can make it good. (Read as a key, it would seem replaced, forever.)
        if d.reason == DamageReason::ForeignFile {
            let q = match d.path.symlink_metadata() {
                Ok(_) => moved(self.quarantine(&d.path)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Quarantine::Replaced,
                Err(e) => Quarantine::Failed(e.into()),
            };
            log_record(who, d, &q);
            return q;
        }
        let q = match self.lock(&d.stem, Wait::No) {
            Ok(Some(_lock)) => match self.still_not_a_file(d) {
                Some(q) => q,
                None => match reread(&d.stem) {
                    Ok(Some(Decoded::Damaged(..))) => moved(self.quarantine(&d.path)),
                    // Unreadable now is no proof of damage: it stays, for the next run.
                    Err(e) => Quarantine::Failed(e),
                    _ => Quarantine::Replaced,
                },
            },
            Ok(None) => Quarantine::Busy,
            Err(e) => Quarantine::Failed(e),
        };
        log_record(who, d, &q);
        q
    }

    /// For a record found not a regular file (a FIFO, socket or device under a record's
    /// name), what the key's holder does: moves it if it still is one (a read would
    /// only say "not a regular file" again, every run, forever), or none when an ADD
    /// has since renamed a file over it and the read decides.
    fn still_not_a_file(&self, d: &Damaged) -> Option<Quarantine> {
        if d.reason != DamageReason::NotAFile {
            return None;
        }
        match d.path.symlink_metadata() {
            Ok(m) if m.is_file() => None,
            Ok(_) => Some(moved(self.quarantine(&d.path))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(Quarantine::Replaced),
            Err(e) => Some(Quarantine::Failed(e.into())),
        }
    }

    /// Quarantines a record its caller, holding the key's lock, has just read damaged
    /// (DEL); logs it after `who`.
    pub fn quarantine_held(&self, _held: &KeyLock, d: &Damaged, who: &str) -> Quarantine {
        let q = moved(self.quarantine(&d.path));
        log_record(who, d, &q);
        q
    }

    /// Quarantines a snapshot `get_snapshot` found damaged, and logs it after `who`. A
    /// snapshot has no lock: its name is its content's hash, so no writer can make a
    /// damaged one good, only write it anew (`put_snapshot`) once this one is gone.
    pub fn quarantine_snapshot(&self, hash: &str, reason: &str, who: &str) {
        match self.quarantine(&self.snapshot_path(hash)) {
            Ok(to) => crate::warn!(
                "{who} snapshot {hash} is damaged ({reason}); quarantined to {}",
                to.display()
            ),
            Err(e) => crate::warn!(
                "{who} snapshot {hash} is damaged ({reason}) and cannot be quarantined: {e:#}"
            ),
        }
    }

    /// Moves a damaged file aside into `quarantine/`, keeping its name, and returns where
    /// it went. The file is never acted on and never deleted.
    pub(super) fn quarantine(&self, path: &Path) -> Result<PathBuf> {
        let qdir = self.quarantine_dir();
        if mkdir_private(&qdir).with_context(|| format!("creating {}", qdir.display()))? {
            fsio::fsync_dir(&self.root)?;
        }
        // The name's own bytes (not UTF-8, perhaps), and a suffix.
        let name = path
            .file_name()
            .context("quarantine: path has no file name")?;
        let now = crate::time::now();
        let named = |suffix: String| {
            let mut n = name.to_os_string();
            n.push(suffix);
            qdir.join(n)
        };
        let mut target = named(format!(".{now}"));
        let mut n = 1;
        while target.symlink_metadata().is_ok() {
            target = named(format!(".{now}.{n}"));
            n += 1;
        }
        std::fs::rename(path, &target)
            .with_context(|| format!("quarantining {} to {}", path.display(), target.display()))?;
        crate::faults::crash_point("quarantine.renamed");
        fsio::fsync_dir(&qdir)?;
        if let Some(parent) = path.parent() {
            fsio::fsync_dir(parent)?;
        }
        Ok(target)
    }
}

fn moved(result: Result<PathBuf>) -> Quarantine {
    match result {
        Ok(to) => Quarantine::Moved(to),
        Err(e) => Quarantine::Failed(e),
    }
}

fn log_record(who: &str, d: &Damaged, q: &Quarantine) {
    match q {
        Quarantine::Moved(to) => {
            crate::warn!("{who} damaged record {d} quarantined to {}", to.display())
        }
        Quarantine::Busy => crate::warn!("{who} damaged record {d} is locked; quarantine next run"),
        Quarantine::Replaced => {
            crate::info!("{who} damaged record {d} since replaced by a good record")
        }
        Quarantine::Failed(e) => {
            crate::error!("{who} damaged record {d} cannot be quarantined: {e:#}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::record;
    use crate::ledger::tests::tmp_ledger;

    #[test]
    fn a_scanned_record_is_moved_only_while_damaged_and_unlocked() {
        let l = tmp_ledger("quar");
        let r = record::sample();
        let stem = r.key().stem();
        let d = Damaged {
            stem: stem.clone(),
            path: l.record_path(&stem),
            reason: DamageReason::Undecodable,
            detail: "test".into(),
        };
        std::fs::write(&d.path, b"{").unwrap();
        {
            let _held = l.lock(&stem, Wait::No).unwrap().unwrap();
            assert!(matches!(
                l.quarantine_damaged(&d, "test:"),
                Quarantine::Busy
            ));
        }
        assert!(d.path.exists());
        // An ADD's good record since the scan is left alone.
        l.write(&r).unwrap();
        assert!(matches!(
            l.quarantine_damaged(&d, "test:"),
            Quarantine::Replaced
        ));
        assert!(d.path.exists());
        std::fs::write(&d.path, b"{").unwrap();
        let Quarantine::Moved(to) = l.quarantine_damaged(&d, "test:") else {
            panic!("a damaged record was not moved");
        };
        assert_eq!(std::fs::read(&to).unwrap(), b"{");
        assert!(!d.path.exists());
    }

    /// A file in records/ without a record's name is moved aside, not taken for a key's
    /// record "since replaced" on every run.
    #[test]
    fn a_foreign_file_is_moved() {
        let l = tmp_ledger("foreign");
        let path = l.records_dir().join("notes.txt");
        std::fs::write(&path, b"hello").unwrap();
        let mut found = Vec::new();
        l.for_each(|e| found.push(e)).unwrap();
        let [entry] = &found[..] else {
            panic!("{found:?}")
        };
        let Decoded::Damaged(damage) = &entry.decoded else {
            panic!("{found:?}")
        };
        assert_eq!(damage.reason, DamageReason::ForeignFile);
        let d = Damaged {
            stem: entry.stem.clone(),
            path: entry.path.clone(),
            reason: damage.reason,
            detail: damage.detail.clone(),
        };
        let Quarantine::Moved(to) = l.quarantine_damaged(&d, "test:") else {
            panic!("a foreign file was not moved");
        };
        assert_eq!(std::fs::read(&to).unwrap(), b"hello");
        assert!(!path.exists());
    }
}
