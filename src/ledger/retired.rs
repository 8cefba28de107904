//! Records set aside while their ADD may still be in the chain (docs/CHAIN.md, "An ADD
//! still in the chain"). A DEL or a GC that would remove the record of a chain with a
//! tail that has not completed moves it to `retired/<stem>.json` instead: if that ADD
//! still succeeds, its tail moves the record back (`restore_retired`) and completes it;
//! if not, gc replays it once its sandbox is gone and drops it.
//!
//! A retired record is the same file, moved whole by one rename, so it keeps the
//! record's integrity rules (checksum, name, format). Both directories are fsynced after
//! each move: a power cut leaves the record in one place or the other, never neither.

use super::{fsio, mkdir_private, Entry, KeyLock, Ledger, RECORD_EXT};
use super::{Decoded, Record, MAX_RECORD};
use anyhow::{Context, Result};
use std::io;
use std::path::PathBuf;

impl Ledger {
    pub fn retired_dir(&self) -> PathBuf {
        self.root.join("retired")
    }

    pub fn retired_path(&self, stem: &str) -> PathBuf {
        self.retired_dir().join(format!("{stem}{RECORD_EXT}"))
    }

    /// Moves `stem`'s record from `records/` to `retired/` (replacing an older retired
    /// one of the key), then drops the tail's note on it. The caller holds the key.
    pub fn retire(&self, _held: &KeyLock, stem: &str) -> Result<()> {
        let dir = self.retired_dir();
        if mkdir_private(&dir).with_context(|| format!("creating {}", dir.display()))? {
            fsio::fsync_dir(&self.root)?;
        }
        let from = self.record_path(stem);
        let to = self.retired_path(stem);
        std::fs::rename(&from, &to)
            .with_context(|| format!("retiring {} to {}", from.display(), to.display()))?;
        crate::faults::crash_point("retire.renamed");
        // The new name first: until both are flushed a power cut may keep either, and
        // each is a whole record.
        fsio::fsync_dir(&dir)?;
        fsio::fsync_dir(&self.records_dir())?;
        self.drop_note(stem);
        Ok(())
    }

    /// Moves `stem`'s retired record back into `records/`. The caller holds the key and
    /// has seen that `records/` holds no record of it.
    pub fn restore_retired(&self, _held: &KeyLock, stem: &str) -> Result<()> {
        let from = self.retired_path(stem);
        let to = self.record_path(stem);
        std::fs::rename(&from, &to)
            .with_context(|| format!("restoring {} to {}", from.display(), to.display()))?;
        crate::faults::crash_point("restore.renamed");
        fsio::fsync_dir(&self.records_dir())?;
        fsio::fsync_dir(&self.retired_dir())?;
        Ok(())
    }

    /// Reads `stem`'s retired record; Ok(None) when there is none. No note is merged:
    /// retiring dropped it.
    pub fn read_retired(&self, stem: &str) -> Result<Option<Decoded>> {
        let path = self.retired_path(stem);
        match fsio::read_nofollow(&path, MAX_RECORD) {
            Ok(bytes) => Ok(Some(super::check_name(stem, super::record::decode(&bytes)))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                Ok(Some(Decoded::Damaged(super::Damage::new(
                    super::DamageReason::Symlink,
                    "a symlink stands in place of a record",
                ))))
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Stores a retired record again (gc's failed attempt at it), durably.
    pub fn write_retired(&self, rec: &Record) -> Result<()> {
        let stem = rec.key().stem();
        fsio::write_atomic(
            &self.retired_dir(),
            &format!("{stem}{RECORD_EXT}"),
            &super::record::encode(rec),
            "record",
        )
        .with_context(|| format!("writing {}", self.retired_path(&stem).display()))
    }

    /// Removes `stem`'s retired record durably; Ok(false) when there was none.
    pub fn drop_retired(&self, stem: &str) -> Result<bool> {
        fsio::remove_durable(&self.retired_dir(), &format!("{stem}{RECORD_EXT}"))
            .with_context(|| format!("removing {}", self.retired_path(stem).display()))
    }

    /// Whether `records/` holds a file under `stem`'s name (any doubt says yes).
    pub fn has_record_file(&self, stem: &str) -> bool {
        !matches!(std::fs::symlink_metadata(self.record_path(stem)),
            Err(e) if e.kind() == io::ErrorKind::NotFound)
    }

    /// Visits every retired record, as `for_each` visits records. A ledger without
    /// `retired/` has none.
    pub fn for_each_retired(&self, mut visit: impl FnMut(Entry)) -> Result<()> {
        let dir = self.retired_dir();
        let listed = std::fs::File::open(&dir).and_then(|f| Ok((f, std::fs::read_dir(&dir)?)));
        let (file, rd) = match listed {
            Ok(both) => both,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
        };
        for item in rd {
            let item = item.with_context(|| format!("listing {}", dir.display()))?;
            if let Some(entry) = self.entry(&file, &item) {
                visit(entry);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::ledger::tests::tmp_ledger;
    use crate::ledger::{record, Decoded, Wait};

    #[test]
    fn a_record_retires_and_comes_back_whole() {
        let l = tmp_ledger("retire");
        let mut rec = record::sample();
        rec.tail = true;
        let stem = rec.key().stem();
        l.write(&rec).unwrap();
        let lock = l.lock(&stem, Wait::No).unwrap().unwrap();
        l.retire(&lock, &stem).unwrap();
        assert!(l.read(&stem).unwrap().is_none());
        assert!(!l.has_record_file(&stem));
        match l.read_retired(&stem).unwrap() {
            Some(Decoded::Ok(r)) => assert_eq!(*r, rec),
            other => panic!("{other:?}"),
        }
        let mut seen = Vec::new();
        l.for_each_retired(|e| seen.push(e.stem)).unwrap();
        assert_eq!(seen, vec![stem.clone()]);

        l.restore_retired(&lock, &stem).unwrap();
        assert!(matches!(l.read(&stem).unwrap(), Some(Decoded::Ok(r)) if *r == rec));
        assert!(l.read_retired(&stem).unwrap().is_none());

        // A damaged retired file reads damaged, as a record would.
        l.retire(&lock, &stem).unwrap();
        std::fs::write(l.retired_path(&stem), b"{\"format\":1}").unwrap();
        assert!(matches!(
            l.read_retired(&stem).unwrap(),
            Some(Decoded::Damaged(..))
        ));
        assert!(l.drop_retired(&stem).unwrap());
        assert!(!l.drop_retired(&stem).unwrap());
    }
}
