//! The tail entry's notes on an attachment's chain (docs/CHAIN.md): when its ADD
//! completed, with what result, when its DEL began. A note lives beside the record, in
//! `notes/<stem>.json`, not in it: the record is the head's write-ahead record and is
//! only ever replaced durably, while a note is written without a flush (the flush was
//! most of the tail's cost). A power cut may cost a note, never a record.
//!
//! A note file is one line, `{"format":1,"sha256":"<hex>","note":{"addId":..,"chain":{..}}}`,
//! the hash over the exact bytes of `note`. A note that is missing, torn, of a newer
//! format or of another ADD of the same key (`addId`) is no note: readers go on as if
//! the tail had not written, which is what they do for a chain without a tail.

use super::record::{sha256_hex, ChainNote, Record};
use super::{fsio, mkdir_private, Ledger, Wait};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::io;
use std::path::PathBuf;

const FORMAT: u32 = 1;
const NOTE_EXT: &str = ".json";
/// A note holds one chain result; anything larger is not one the tail wrote.
const MAX_NOTE: u64 = 4 << 20;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Note {
    /// The ADD the note is about: a later ADD of the same key has another.
    add_id: String,
    chain: ChainNote,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    format: u32,
    sha256: String,
    #[serde(borrow)]
    note: &'a RawValue,
}

fn encode(add_id: &str, chain: &ChainNote) -> Vec<u8> {
    let note = Note {
        add_id: add_id.to_string(),
        chain: chain.clone(),
    };
    // Strings, numbers and a JSON value: serialising cannot fail.
    #[allow(clippy::expect_used)]
    let body = serde_json::to_string(&note).expect("a note always serialises");
    format!(
        "{{\"format\":{FORMAT},\"sha256\":\"{}\",\"note\":{body}}}\n",
        sha256_hex(body.as_bytes())
    )
    .into_bytes()
}

/// The note's chain if `bytes` are an intact note of this format about `add_id`.
fn decode(bytes: &[u8], add_id: &str) -> Option<ChainNote> {
    let env: Envelope = serde_json::from_slice(bytes).ok()?;
    let body = env.note.get();
    if env.format != FORMAT || sha256_hex(body.as_bytes()) != env.sha256 {
        return None;
    }
    let note: Note = serde_json::from_str(body).ok()?;
    (note.add_id == add_id).then_some(note.chain)
}

impl Ledger {
    pub fn notes_dir(&self) -> PathBuf {
        self.root.join("notes")
    }

    pub fn note_path(&self, stem: &str) -> PathBuf {
        self.notes_dir().join(format!("{stem}{NOTE_EXT}"))
    }

    /// Stores the tail's `chain` notes on `rec`'s ADD, replacing any earlier note of the
    /// key. Atomic for readers, not flushed (`fsio::replace_unsynced`). The caller holds
    /// the key's lock.
    pub fn put_note(&self, rec: &Record, chain: &ChainNote) -> Result<()> {
        let dir = self.notes_dir();
        let name = format!("{}{NOTE_EXT}", rec.key().stem());
        let bytes = encode(&rec.add_id, chain);
        let put = || fsio::replace_unsynced(&dir, &name, &bytes, "note");
        match put() {
            // The first note of this ledger: `notes/` is made on first use, so that ADD
            // never pays for it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.make_notes_dir()
                    .with_context(|| format!("creating {}", dir.display()))?;
                put()
            }
            other => other,
        }
        .with_context(|| format!("writing note {}", dir.join(&name).display()))
    }

    /// Makes `notes/` (0700) if it is not there yet: for the first note, and for a
    /// watch of the directory before any tail has written.
    pub fn make_notes_dir(&self) -> io::Result<()> {
        mkdir_private(&self.notes_dir()).map(|_| ())
    }

    /// The tail's notes on `rec`'s ADD, if an intact note of that ADD is stored.
    pub fn note(&self, stem: &str, rec: &Record) -> Option<ChainNote> {
        let bytes = fsio::read_nofollow(&self.note_path(stem), MAX_NOTE).ok()?;
        decode(&bytes, &rec.add_id)
    }

    /// Gives a record whose ADD ran with a tail the tail's notes: a note replaces the
    /// `chain` the record itself may hold (records amended before notes had their own
    /// file). A record without a tail has no note to read.
    pub fn with_note(&self, stem: &str, rec: &mut Record) {
        if rec.tail {
            if let Some(chain) = self.note(stem, rec) {
                rec.chain = Some(chain);
            }
        }
    }

    /// Removes `stem`'s note, if any. Not flushed: a note that comes back after a power
    /// cut belongs to an ADD no record names any more, which no reader takes, and
    /// `remove_orphan_notes` clears it.
    pub(super) fn drop_note(&self, stem: &str) {
        let _ = std::fs::remove_file(self.note_path(stem));
    }

    /// Removes the notes whose record is gone (a crash between the record's removal and
    /// its note's, a record quarantined), each under its key's lock so that a tail
    /// writing for a new ADD of the key is never undone; a key held now is skipped.
    pub fn remove_orphan_notes(&self) -> usize {
        let Ok(rd) = std::fs::read_dir(self.notes_dir()) else {
            return 0;
        };
        let mut removed = 0;
        for item in rd.flatten() {
            let name = item.file_name().to_string_lossy().into_owned();
            let Some(stem) = name
                .strip_suffix(NOTE_EXT)
                .filter(|s| !s.starts_with(fsio::TMP_PREFIX))
            else {
                continue;
            };
            // Any doubt (an error other than ENOENT) keeps the note.
            let recorded = || {
                !matches!(std::fs::symlink_metadata(self.record_path(stem)),
                    Err(e) if e.kind() == io::ErrorKind::NotFound)
            };
            // Checked again under the lock: only then can no ADD of the key be under way.
            if recorded() {
                continue;
            }
            let Ok(Some(_lock)) = self.lock(stem, Wait::No) else {
                continue;
            };
            if !recorded() && std::fs::remove_file(item.path()).is_ok() {
                removed += 1;
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::tests::{tmp_ledger, TmpLedger};
    use serde_json::json;

    fn completed() -> ChainNote {
        ChainNote {
            completed_at: Some("2026-12-05T10:00:00Z".into()),
            completed_boot_ns: Some(42),
            add_seconds: Some(0.5),
            result: Some(json!({"cniVersion": "1.0.0", "ips": []})),
            ..ChainNote::default()
        }
    }

    /// A ledger holding one record whose ADD ran with a tail, and the record's stem.
    fn recorded(tag: &str) -> (TmpLedger, Record, String) {
        let l = tmp_ledger(tag);
        let mut rec = crate::ledger::record::sample();
        rec.tail = true;
        let stem = rec.key().stem();
        l.write(&rec).unwrap();
        (l, rec, stem)
    }

    #[test]
    fn a_note_is_read_for_its_own_add_only() {
        let (l, rec, stem) = recorded("note-own-add");
        assert_eq!(l.note(&stem, &rec), None);
        l.put_note(&rec, &completed()).unwrap();
        assert_eq!(l.note(&stem, &rec), Some(completed()));

        let mut read = rec.clone();
        l.with_note(&stem, &mut read);
        assert_eq!(read.chain, Some(completed()));
        // A later ADD of the same key does not inherit the earlier ADD's note.
        let mut later = rec.clone();
        later.add_id = "01".into();
        l.with_note(&stem, &mut later);
        assert_eq!(later.chain, None);
        // A record whose ADD ran without a tail reads none.
        let mut no_tail = rec.clone();
        no_tail.tail = false;
        l.with_note(&stem, &mut no_tail);
        assert_eq!(no_tail.chain, None);
    }

    #[test]
    fn a_torn_or_altered_note_is_no_note() {
        let bytes = encode("00", &completed());
        assert_eq!(decode(&bytes, "00"), Some(completed()));
        assert_eq!(decode(&bytes, "01"), None);
        assert_eq!(decode(b"", "00"), None);
        for cut in 0..bytes.len() - 1 {
            assert_eq!(decode(&bytes[..cut], "00"), None, "cut at {cut}");
        }
        for i in 0..bytes.len() - 1 {
            let mut b = bytes.clone();
            b[i] ^= 0x01;
            let d = decode(&b, "00");
            assert!(d.is_none() || d == Some(completed()), "flip at {i}: {d:?}");
        }
        let newer = String::from_utf8(bytes)
            .unwrap()
            .replacen(r#""format":1"#, r#""format":2"#, 1);
        assert_eq!(decode(newer.as_bytes(), "00"), None);
    }

    #[test]
    fn removing_a_record_removes_its_note_and_orphans_are_swept() {
        let (l, rec, stem) = recorded("note-orphans");
        l.put_note(&rec, &completed()).unwrap();
        assert!(l.remove(&stem).unwrap());
        assert!(!l.note_path(&stem).exists());

        // A note whose record is gone (quarantined, or a crash between the two removals).
        l.write(&rec).unwrap();
        l.put_note(&rec, &completed()).unwrap();
        let mut other = rec.clone();
        other.container_id = "live".into();
        l.write(&other).unwrap();
        l.put_note(&other, &completed()).unwrap();
        std::fs::remove_file(l.record_path(&stem)).unwrap();
        assert_eq!(l.remove_orphan_notes(), 1);
        assert!(!l.note_path(&stem).exists());
        assert!(l.note_path(&other.key().stem()).exists());
    }
}
