//! Devices that could not be returned, kept after the record is gone.
//!
//! DEL drops the attachment's record (the runtime is done with it) and gc removes it
//! after a replay, so a failure cannot live on the record. It goes to a small note,
//! `<ledgerDir>/devices/<stem>.json`, written like every ledger file (temp, fsync,
//! rename, directory fsync, 0600), which `list` shows until an operator removes it.

use super::Failure;
use crate::ledger::{fsio, DeviceFile, Key, Ledger};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

const MAX_NOTE: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Note {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub netns: String,
    pub at: String,
    pub failures: Vec<Failure>,
}

pub fn write(ledger: &Ledger, key: &Key, netns: &str, failures: &[Failure]) -> Result<PathBuf> {
    let note = Note {
        network: key.network.clone(),
        container_id: key.container_id.clone(),
        ifname: key.ifname.clone(),
        netns: netns.to_string(),
        at: crate::time::rfc3339(crate::time::now()),
        failures: failures.to_vec(),
    };
    write_keyed(ledger, DeviceFile::Failure, key, &note)
}

/// Writes `value` as `key`'s file of this kind (`Ledger::device_file_path`),
/// atomically, its directory made (checked) as needed. One line of JSON.
pub(super) fn write_keyed(
    ledger: &Ledger,
    kind: DeviceFile,
    key: &Key,
    value: &impl Serialize,
) -> Result<PathBuf> {
    let top = ledger.devices_dir();
    let dir = ledger.device_files_dir(kind);
    mkdir_checked(&top, ledger.root())?;
    if dir != top {
        mkdir_checked(&dir, &top)?;
    }
    let dir = dir.as_path();
    let name = Ledger::device_file_name(key);
    let mut bytes = serde_json::to_vec(value)?;
    bytes.push(b'\n');
    fsio::write_atomic(dir, &name, &bytes, "devices")
        .with_context(|| format!("writing {}", dir.join(&name).display()))?;
    Ok(dir.join(name))
}

pub(super) fn mkdir_checked(dir: &Path, parent: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => fsio::fsync_dir(parent)?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            // Never write through a symlink planted in the ledger.
            let meta = std::fs::symlink_metadata(dir)
                .with_context(|| format!("checking {}", dir.display()))?;
            anyhow::ensure!(meta.is_dir(), "{} is not a directory", dir.display());
        }
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    Ok(())
}

pub fn write_mismatches(
    ledger: &Ledger,
    key: &Key,
    mismatches: &[super::Mismatch],
) -> Result<PathBuf> {
    let body = serde_json::json!({
        "network": key.network, "containerId": key.container_id, "ifname": key.ifname,
        "at": crate::time::rfc3339(crate::time::now()), "mismatches": mismatches,
    });
    // Kept, one file per attachment, until an operator removes them (counted by the
    // metric `cni_ledger_device_alias_mismatches`).
    write_keyed(ledger, DeviceFile::AliasMismatch, key, &body)
}

/// How many attachments' alias mismatches are kept.
pub fn mismatch_count(ledger: &Ledger) -> usize {
    ledger.device_file_count(DeviceFile::AliasMismatch)
}

/// Every note, oldest first; one that does not read or decode is reported as such.
pub fn read_all(ledger: &Ledger) -> Vec<(PathBuf, Result<Note, String>)> {
    let mut out: Vec<(PathBuf, Result<Note, String>)> = ledger
        .device_files(DeviceFile::Failure)
        .into_iter()
        .map(|path| {
            let note = read(&path);
            (path, note)
        })
        .collect();
    out.sort_by(|a, b| {
        let at = |n: &Result<Note, String>| n.as_ref().map(|n| n.at.clone()).unwrap_or_default();
        (at(&a.1), &a.0).cmp(&(at(&b.1), &b.0))
    });
    out
}

fn read(path: &Path) -> Result<Note, String> {
    let bytes = fsio::read_nofollow(path, MAX_NOTE).map_err(|e| e.to_string())?;
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

/// One line per failure: `device (bus address): error`.
pub fn summary(note: &Note) -> String {
    note.failures
        .iter()
        .map(|f| {
            format!(
                "{} ({}): {}",
                f.device,
                f.bus_address.as_deref().unwrap_or("-"),
                f.error
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// `list`'s state for an attachment whose devices were not all returned.
pub const STATE: &str = "devices-left";

/// The note as a `list --json` element.
pub fn json_row(path: &Path, note: &Result<Note, String>) -> serde_json::Value {
    match note {
        Ok(n) => serde_json::json!({
            "network": n.network, "containerId": n.container_id, "ifname": n.ifname,
            "netns": n.netns, "state": STATE, "reason": summary(n), "at": n.at,
            "devices": n.failures, "file": path.display().to_string(),
        }),
        Err(e) => serde_json::json!({
            "state": STATE, "reason": format!("unreadable note: {e}"),
            "file": path.display().to_string(),
        }),
    }
}

/// The note as a `list` table row (NETWORK CONTAINER IFNAME STATE REASON AGE NETNS).
pub fn table_row(path: &Path, note: &Result<Note, String>, now: i64) -> Vec<String> {
    match note {
        Ok(n) => vec![
            n.network.clone(),
            n.container_id.clone(),
            n.ifname.clone(),
            STATE.into(),
            summary(n),
            crate::time::parse_rfc3339(&n.at)
                .map(|t| crate::time::age(now - t))
                .unwrap_or_else(|| "-".into()),
            n.netns.clone(),
        ],
        Err(e) => vec![
            "-".into(),
            path.display().to_string(),
            "-".into(),
            STATE.into(),
            format!("unreadable note: {e}"),
            "-".into(),
            "-".into(),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_and_read_back() {
        let root = std::env::temp_dir().join(format!("cl-note-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let ledger = Ledger::at(&root);
        let key = Key::new("n", "c", "eth0");
        let f = Failure {
            device: "net1".into(),
            bus_address: Some("0000:03:00.0".into()),
            error: "Invalid argument".into(),
        };
        let path = write(&ledger, &key, "/run/netns/x", std::slice::from_ref(&f)).unwrap();
        assert_eq!(path, root.join("devices/n:c:eth0.json"));
        let all = read_all(&ledger);
        assert_eq!(all.len(), 1);
        let note = all[0].1.as_ref().unwrap();
        assert_eq!(note.failures, vec![f]);
        assert_eq!(summary(note), "net1 (0000:03:00.0): Invalid argument");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
