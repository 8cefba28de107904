//! Adoption: records for attachments libcni's result cache knows and the ledger does
//! not (made before the ledger was installed, or while a network plugin had pushed it
//! out of the conflist), so gc can replay their DEL like any other.
//!
//! Liveness errs towards live, as everywhere: with a cached netns path (libcni 1.2 on),
//! the namespace found there now is the record's identity, and nothing there makes it
//! stale (`netns-missing`), whatever the file's date; without one, a cache file last
//! written before this boot began (by the earliest reading of that, `boot_began`: the
//! clock may have been stepped since) is from an earlier boot (`boot-changed`);
//! otherwise the record is live until the runtime's valid set says otherwise. An
//! existing record is never touched.

use crate::cni::config::DEFAULT_PLUGIN_TYPE;
use crate::gc::libcni_cache::{self, CacheEntry};
use crate::ledger::{Decoded, Key, Ledger, Record, Wait};
use crate::sandbox::{self, Probe};
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

pub const SOURCE_ADOPTED: &str = "adopted";

#[derive(Debug, Clone)]
pub struct Options {
    pub ledger_dir: PathBuf,
    pub cache_dir: PathBuf,
    /// CNI_PATH for replays of adopted records (the cache does not keep it).
    pub cni_path: String,
    pub dry_run: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Adopted {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub cache_file: String,
    pub action: AdoptAction,
    pub state: &'static str,
    pub reason: Option<&'static str>,
}

/// What became of one cache entry without a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdoptAction {
    Adopted,
    /// Dry run: would have been adopted.
    WouldAdopt,
    /// An ADD, DEL or gc held its key; the next run tries again.
    Busy,
    /// A record was made meanwhile (counted as already recorded, not listed).
    Exists,
    /// The cache entry was removed meanwhile, by a gc that released the attachment
    /// (not listed).
    Gone,
}

impl AdoptAction {
    pub fn as_str(self) -> &'static str {
        match self {
            AdoptAction::Adopted => "adopted",
            AdoptAction::WouldAdopt => "would-adopt",
            AdoptAction::Busy => "busy",
            AdoptAction::Exists => "exists",
            AdoptAction::Gone => "gone",
        }
    }
}

impl std::fmt::Display for AdoptAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unusable {
    pub file: String,
    pub reason: String,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub dry_run: bool,
    pub adopted: Vec<Adopted>,
    /// Cache entries the ledger already has a record (or a damaged file) for.
    pub already_recorded: usize,
    /// Cache files that are empty, cut off or otherwise unusable: reported, never used.
    pub unusable: Vec<Unusable>,
}

/// When the current boot began (Unix seconds), from `btime` in /proc/stat: the clock
/// now less the time since boot, so a step of the clock moves it too.
pub fn boot_time() -> Result<i64> {
    if let Some(t) = crate::faults::btime_override() {
        return Ok(t);
    }
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
        .context("no btime in /proc/stat")
}

/// Directories whose filesystem is made anew at every boot (devtmpfs by the kernel
/// itself, tmpfs by early boot), so their birth time is a reading of the clock as the
/// boot began.
const BOOT_FRESH_DIRS: &[&str] = &["/dev", "/run"];

/// The earliest this boot can have begun (Unix seconds), for judging a cache file by its
/// date. `btime` alone moves with the clock: stepped forward after boot (a first NTP
/// sync on a node without a good RTC, a VM resumed from a snapshot), it would pass the
/// files this boot wrote before the step and make their pods "from an earlier boot".
/// The births of /dev and /run were stamped by the clock as it was then; the earliest
/// of all is taken. Each can only move the line back, towards "this boot" (live).
pub fn boot_began() -> Result<i64> {
    let btime = boot_time()?;
    Ok(BOOT_FRESH_DIRS
        .iter()
        .filter_map(|d| born_this_boot(d))
        .fold(btime, i64::min))
}

/// The birth time of `dir`, when it is the root of a tmpfs (devtmpfs is one too) and
/// the kernel keeps birth times there: a /dev on disk was born at install, not at boot.
fn born_this_boot(dir: &str) -> Option<i64> {
    let fs = nix::sys::statfs::statfs(dir).ok()?;
    if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return None;
    }
    let born = std::fs::metadata(dir).ok()?.created().ok()?;
    let secs = born.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    i64::try_from(secs).ok().filter(|&s| s > 0)
}

pub fn run(opts: &Options) -> Result<Report> {
    let mut report = Report {
        dry_run: opts.dry_run,
        ..Report::default()
    };
    let files = libcni_cache::result_files(&opts.cache_dir)
        .with_context(|| format!("listing {}", opts.cache_dir.join("results").display()))?;
    let ledger = if opts.dry_run {
        Ledger::at(&opts.ledger_dir)
    } else {
        Ledger::open_for_write(&opts.ledger_dir)?
    };
    if ledger.root().exists() {
        ledger.check_trusted()?;
    }
    let boot = sandbox::boot_id().context("reading the boot ID")?;
    let booted_at = boot_began()?;
    for path in files {
        let entry = match libcni_cache::read_entry(&path) {
            Ok(e) => e,
            Err(reason) => {
                crate::warn!(
                    "adopt: {}: {reason}; not adopted, never acted on",
                    path.display()
                );
                report.unusable.push(Unusable {
                    file: path.display().to_string(),
                    reason,
                });
                continue;
            }
        };
        let key = Key {
            network: entry.network.clone(),
            container_id: entry.container_id.clone(),
            ifname: entry.ifname.clone(),
        };
        if ledger.read(&key.stem())?.is_some() {
            report.already_recorded += 1;
            continue;
        }
        let rec = record_for(&entry, &boot, booted_at, &opts.cni_path);
        let reason = sandbox::liveness(&rec.boot_id, &rec.netns, rec.netns_id, &boot).reason;
        let action = if opts.dry_run {
            AdoptAction::WouldAdopt
        } else {
            create(&ledger, &key, &rec, &entry)?
        };
        match action {
            AdoptAction::Exists => {
                report.already_recorded += 1;
                continue;
            }
            AdoptAction::Gone => continue,
            AdoptAction::Adopted | AdoptAction::WouldAdopt | AdoptAction::Busy => {}
        }
        crate::info!(
            "adopt: {key}: {action} from {} ({})",
            path.display(),
            reason.map_or("live", |r| r.as_str())
        );
        report.adopted.push(Adopted {
            network: key.network,
            container_id: key.container_id,
            ifname: key.ifname,
            cache_file: path.display().to_string(),
            action,
            state: if reason.is_some() { "stale" } else { "live" },
            reason: reason.map(|r| r.as_str()),
        });
    }
    Ok(report)
}

/// The record an adoption makes; judged by the same rules as every other record.
pub fn record_for(entry: &CacheEntry, boot: &str, booted_at: i64, cni_path: &str) -> Record {
    let (netns_id, boot_id) = if entry.netns.is_empty() {
        // No namespace to look at: the file's date is the only evidence of its boot,
        // against the earliest the boot can have begun (`boot_began`). The earlier
        // boot's ID is unknown; any other value than this boot's says so.
        let boot_id = if entry.written_at < booted_at {
            String::new()
        } else {
            boot.to_string()
        };
        (None, boot_id)
    } else {
        // A path to check: its namespace, not the file's date, says which boot this is.
        // Whatever namespace is at the path now is this boot's and taken as the
        // attachment's (the same probe ADD records); nothing there leaves no identity
        // and the path missing; a path that cannot be examined is judged live later.
        match sandbox::probe(&entry.netns) {
            Probe::Namespace(id) => (Some(id), boot.to_string()),
            _ => (None, boot.to_string()),
        }
    };
    Record {
        network: entry.network.clone(),
        container_id: entry.container_id.clone(),
        ifname: entry.ifname.clone(),
        netns: entry.netns.clone(),
        netns_id,
        boot_id,
        cni_args: entry.cni_args.clone(),
        cni_path: cni_path.to_string(),
        cni_version: entry.cni_version.clone(),
        runtime_config: entry.capability_args.clone(),
        // Not in the cached chain (or it would have a record); skipped on replay if it is.
        ledger_type: DEFAULT_PLUGIN_TYPE.into(),
        snapshot: None,
        conf_file: None,
        // When libcni finished the ADD: grace and age count from there.
        created_at: crate::time::rfc3339(entry.written_at),
        created_boot_secs: None,
        add_id: format!("adopted-{:x}-{:x}", entry.written_at, std::process::id()),
        gc: None,
        source: Some(SOURCE_ADOPTED.into()),
        cache_file: Some(entry.path.display().to_string()),
        chain_digest: crate::conflist::parse(&entry.config_bytes)
            .map(|list| crate::conflist::chain_digest(&list, DEFAULT_PLUGIN_TYPE)),
    }
}

/// Writes the record under the key's lock, only if there still is none and the cache
/// entry is still there: an ADD or another adopt may have made a record since the first
/// look, and a gc may have released the attachment (it removes the record and then the
/// cache entry before letting go of the key).
fn create(ledger: &Ledger, key: &Key, rec: &Record, entry: &CacheEntry) -> Result<AdoptAction> {
    let stem = key.stem();
    let Some(_lock) = ledger.lock(&stem, Wait::Upto(Duration::from_secs(5)))? else {
        crate::warn!("adopt: {key}: busy; try again later");
        return Ok(AdoptAction::Busy);
    };
    match ledger.read(&stem)? {
        None => {}
        Some(
            Decoded::Ok(_) | Decoded::Newer(_) | Decoded::Damaged(..) | Decoded::Unreadable(_),
        ) => return Ok(AdoptAction::Exists),
    }
    match std::fs::symlink_metadata(&entry.path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::info!("adopt: {key}: cache entry removed meanwhile (released); not adopted");
            return Ok(AdoptAction::Gone);
        }
        Err(e) => return Err(e).with_context(|| format!("re-checking {}", entry.path.display())),
    }
    // As in ADD: the snapshot guard is held until the record naming it is durable.
    let guard = ledger.snapshot_guard_shared()?;
    let hash = ledger.put_snapshot(&entry.config_bytes)?;
    let mut rec = rec.clone();
    rec.snapshot = Some(hash);
    ledger.write(&rec)?;
    drop(guard);
    Ok(AdoptAction::Adopted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(netns: &str, written_at: i64) -> CacheEntry {
        CacheEntry {
            path: PathBuf::from("/var/lib/cni/results/pods-abc-eth0"),
            network: "pods".into(),
            container_id: "abc".into(),
            ifname: "eth0".into(),
            netns: netns.into(),
            cni_args: "K8S_POD_NAME=p".into(),
            capability_args: Default::default(),
            config_bytes: br#"{"cniVersion":"1.0.0","name":"pods","plugins":[]}"#.to_vec(),
            cni_version: "1.0.0".into(),
            written_at,
        }
    }

    fn judged(rec: &Record) -> Option<&'static str> {
        sandbox::liveness(&rec.boot_id, &rec.netns, rec.netns_id, "b")
            .reason
            .map(|r| r.as_str())
    }

    #[test]
    fn liveness_rules_of_adoption() {
        // No netns: the file's date against the boot's start.
        assert_eq!(
            judged(&record_for(&entry("", 99), "b", 100, "/opt/cni/bin")),
            Some("boot-changed")
        );
        assert_eq!(
            judged(&record_for(&entry("", 100), "b", 100, "/opt/cni/bin")),
            None
        );
        // A netns path: what is there now is its identity.
        let live = record_for(&entry("/proc/self/ns/net", 1), "b", 100, "/opt/cni/bin");
        assert!(live.netns_id.is_some());
        assert_eq!(judged(&live), None);
        let gone = record_for(
            &entry("/run/nonexistent-netns", 1),
            "b",
            100,
            "/opt/cni/bin",
        );
        assert_eq!(judged(&gone), Some("netns-missing"));
        assert_eq!(gone.source.as_deref(), Some("adopted"));
        assert_eq!(
            gone.cache_file.as_deref(),
            Some("/var/lib/cni/results/pods-abc-eth0")
        );
        assert_eq!(gone.created_at, "1970-01-01T00:00:01Z");
    }

    #[test]
    fn a_cache_entry_removed_before_the_lock_is_not_adopted() {
        let root = std::env::temp_dir().join(format!("cl-adopt-gone-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let ledger = Ledger::open_for_write(&root).unwrap();
        // The entry as listed, then released by a gc before adopt took the key.
        let e = entry("", 100);
        let key = Key {
            network: e.network.clone(),
            container_id: e.container_id.clone(),
            ifname: e.ifname.clone(),
        };
        let rec = record_for(&e, "b", 100, "/opt/cni/bin");
        assert!(!e.path.exists());
        assert_eq!(create(&ledger, &key, &rec, &e).unwrap(), AdoptAction::Gone);
        assert!(ledger.read(&key.stem()).unwrap().is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn boot_time_is_in_the_past() {
        let t = boot_time().unwrap();
        assert!(t > 0 && t <= crate::time::now());
        let began = boot_began().unwrap();
        assert!(began > 0 && began <= t);
    }
}
