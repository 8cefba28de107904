//! Adoption: records for attachments libcni's result cache knows and the ledger does
//! not (made before the ledger was installed, or while a network plugin had pushed it
//! out of the conflist), so gc can replay their DEL like any other.
//!
//! Liveness errs towards live, as everywhere. A cache file last written before this boot
//! began (by the earliest reading of that, `time::boot_began`: the clock may have been
//! stepped since) whose netns path shows nothing, or that has none, is from an earlier
//! boot (`boot-changed`). With a cached netns path (libcni 1.2 on), the namespace found
//! there now, or mounted there in another mount namespace, is the record's identity. A
//! path of this boot that shows nothing is not adopted yet (`deferred`): with no identity
//! recorded at its ADD, nothing can tell its namespace gone from one held elsewhere on
//! the node (an open file, a socket, a pinned mount), so it waits for a reboot to prove
//! it gone. Without a path, the record is live until the runtime's valid set says
//! otherwise. An existing record is never touched.
//!
//! Only networks whose chain holds the ledger are taken: a DEL of any other network
//! never reaches the ledger, so its record would outlive a clean teardown and be
//! "released" by the next gc (containerd's own `cni-loopback` beside the pod network).
//! What is left out is reported.

use super::cache::{self, CacheEntry};
use crate::cni::config::DEFAULT_PLUGIN_TYPE;
use crate::ledger::{Decoded, Key, Ledger, Record, RecordSource, Wait};
use crate::sandbox::{self, Probe};
use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Options {
    pub ledger_dir: PathBuf,
    pub cache_dir: PathBuf,
    /// The networks whose attachments are taken: those whose chain holds the ledger.
    pub networks: BTreeSet<String>,
    /// The runtime's plugin dirs (CNI_PATH) when known; else each record's is found in
    /// `PLUGIN_SEARCH_DIRS` (the cache does not keep it).
    pub cni_path: Option<String>,
    pub dry_run: bool,
}

/// Where runtimes look for CNI plugins unless told otherwise: containerd's and CRI-O's
/// default, Debian's, Fedora's, and the local administrator's (Podman's list).
pub const PLUGIN_SEARCH_DIRS: &[&str] = &[
    "/opt/cni/bin",
    "/usr/lib/cni",
    "/usr/libexec/cni",
    "/usr/local/lib/cni",
    "/usr/local/libexec/cni",
];

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
    /// The record's CNI_PATH.
    pub cni_path: String,
    /// Plugins of the chain found in none of its dirs: its replay would fail.
    pub missing_plugins: Vec<String>,
}

/// A cache entry of a network outside the scope: never adopted.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftOut {
    /// None for an unusable file that names no network of the scope.
    pub network: Option<String>,
    pub cache_file: String,
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
    /// The networks adoption took attachments of.
    pub networks: Vec<String>,
    pub adopted: Vec<Adopted>,
    /// Entries of networks whose chain does not hold the ledger.
    pub left_out: Vec<LeftOut>,
    /// Cache entries the ledger already has a record (or a damaged file) for.
    pub already_recorded: usize,
    /// Cache files that are empty, cut off or otherwise unusable: reported, never used.
    pub unusable: Vec<Unusable>,
    /// Entries of this boot whose namespace path shows nothing: not adopted until a
    /// reboot proves the namespace gone.
    pub deferred: Vec<Deferred>,
}

/// A cache entry left for now: its namespace may still be held elsewhere on the node.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Deferred {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub cache_file: String,
    pub netns: String,
}

pub fn run(opts: &Options) -> Result<Report> {
    let mut report = Report {
        dry_run: opts.dry_run,
        networks: opts.networks.iter().cloned().collect(),
        ..Report::default()
    };
    let files = cache::result_files(&opts.cache_dir)
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
    let booted_at = crate::time::boot_began()?;
    // One search of the node per run, made only if an entry's path shows no namespace.
    let node = sandbox::holders::NodeIndex::new();
    let mut recorded = None;
    for path in files {
        let entry = match cache::read_entry(&path) {
            Ok(e) if opts.networks.contains(&e.network) => e,
            Ok(e) => {
                report.left_out.push(LeftOut {
                    network: Some(e.network),
                    cache_file: path.display().to_string(),
                });
                continue;
            }
            Err(_) if !named_in_scope(&path, &opts.networks) => {
                report.left_out.push(LeftOut {
                    network: None,
                    cache_file: path.display().to_string(),
                });
                continue;
            }
            Err(_) if recorded_names(&ledger, &mut recorded)?.contains(&file_name(&path)) => {
                // The record is the attachment's; its replay removes the file.
                report.already_recorded += 1;
                continue;
            }
            // Removed since the listing: libcni finished a DEL (or gc a replay).
            Err(_) if std::fs::symlink_metadata(&path).is_err() => continue,
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
        let key = Key::new(&entry.network, &entry.container_id, &entry.ifname);
        if ledger.read(&key.stem())?.is_some() {
            report.already_recorded += 1;
            continue;
        }
        if added_through_the_ledger(&entry) {
            crate::info!(
                "adopt: {key}: its chain held the ledger, but its record is gone (removed by \
                 its DEL or gc, after which libcni drops {}, or by other means); not adopted",
                path.display()
            );
            continue;
        }
        let (cni_path, missing_plugins) = cni_path_for(&entry, opts.cni_path.as_deref());
        if !missing_plugins.is_empty() {
            crate::warn!(
                "adopt: {key}: plugin(s) {} of its chain found in none of {cni_path}; \
                 its replay will fail until they are there",
                missing_plugins.join(", ")
            );
        }
        let rec = record_for(&entry, &boot, booted_at, &cni_path, &node);
        // As gc will judge it: a pod pinned in another mount namespace is live.
        let reason =
            sandbox::liveness_on_node(&rec.boot_id, &rec.netns, rec.netns_id, &boot, &node)
                .0
                .reason;
        if rec.netns_id.is_none()
            && rec.boot_id == boot
            && matches!(
                reason,
                Some(sandbox::Reason::NetnsMissing | sandbox::Reason::NetnsNotNamespace)
            )
        {
            crate::info!(
                "adopt: {key}: nothing at {}, and no identity to search the node for: \
                 not adopted until a reboot proves it gone",
                rec.netns
            );
            report.deferred.push(Deferred {
                network: key.network,
                container_id: key.container_id,
                ifname: key.ifname,
                cache_file: path.display().to_string(),
                netns: rec.netns,
            });
            continue;
        }
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
            cni_path,
            missing_plugins,
        });
    }
    let mut left: std::collections::BTreeMap<&str, usize> = Default::default();
    for l in &report.left_out {
        *left.entry(l.network.as_deref().unwrap_or("?")).or_default() += 1;
    }
    for (net, n) in left {
        crate::info!(
            "adopt: left out {n} cache entr{} of network {net}: its chain does not hold \
             this ledger, so no DEL of it would ever reach the record",
            if n == 1 { "y" } else { "ies" }
        );
    }
    Ok(report)
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The cache file names (`<net>-<cid>-<ifname>`) of the attachments the ledger has a
/// record (or a damaged file) for, read once when first needed.
fn recorded_names<'a>(
    ledger: &Ledger,
    names: &'a mut Option<std::collections::HashSet<String>>,
) -> Result<&'a std::collections::HashSet<String>> {
    if names.is_none() {
        let mut out = std::collections::HashSet::new();
        ledger.for_each(|e| {
            let parts: Vec<&str> = e.stem.splitn(3, ':').collect();
            let name = match &e.decoded {
                Decoded::Ok(rec) => Some(format!(
                    "{}-{}-{}",
                    rec.network, rec.container_id, rec.ifname
                )),
                _ if parts.len() == 3 => Some(parts.join("-")),
                _ => None,
            };
            out.extend(name);
        })?;
        *names = Some(out);
    }
    Ok(names.get_or_insert_with(Default::default))
}

/// Whether an unusable cache file's name (`<net>-<cid>-<ifname>`) may be of a network
/// in scope; a network name may hold `-`, so any prefix match counts (errs towards
/// reporting it).
fn named_in_scope(path: &Path, networks: &BTreeSet<String>) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    networks.iter().any(|net| {
        name.strip_prefix(net.as_str())
            .is_some_and(|r| r.starts_with('-'))
    })
}

/// The networks in `conf_dir` whose chain (as libcni picks a network's file: the first
/// by its order) holds the ledger of type `ledger_type` recording into `ledger_dir`.
/// A chain whose ledger records elsewhere is logged and left out: its records are not
/// this ledger's to replay.
pub fn ledger_networks(
    conf_dir: &Path,
    ledger_dir: &Path,
    ledger_type: &str,
) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    let rd = match std::fs::read_dir(conf_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names),
        Err(e) => return Err(e).with_context(|| format!("listing {}", conf_dir.display())),
    };
    for item in rd {
        let path = item
            .with_context(|| format!("listing {}", conf_dir.display()))?
            .path();
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !["conflist", "conf", "json"].contains(&ext) {
            continue;
        }
        let Some(list) = std::fs::read(&path)
            .ok()
            .and_then(|b| crate::conflist::parse(&b))
        else {
            continue;
        };
        if let Some(name) = list["name"].as_str() {
            names.insert(name.to_string());
        }
    }
    let mut out = BTreeSet::new();
    for name in names {
        let Some(found) = crate::conflist::find(conf_dir, &name)? else {
            continue;
        };
        let Some(entry) = crate::conflist::plugins(&found.list)
            .iter()
            .find(|p| crate::conflist::plugin_type(p) == ledger_type)
        else {
            continue;
        };
        let records_into = entry
            .get("ledgerDir")
            .and_then(Value::as_str)
            .unwrap_or(crate::cni::config::DEFAULT_LEDGER_DIR);
        if same_dir(Path::new(records_into), ledger_dir) {
            out.insert(name);
        } else {
            crate::warn!(
                "adopt: network {name} ({}): its ledger records into {records_into}, not {}; \
                 left out",
                found.path.display(),
                ledger_dir.display()
            );
        }
    }
    Ok(out)
}

fn same_dir(a: &Path, b: &Path) -> bool {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    a == b || real(a) == real(b)
}

/// The plugin binaries a chain runs: each entry's type and its IPAM plugin's (which
/// the main plugin finds through the same CNI_PATH), the ledger's own left out.
fn chain_plugins(list: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in crate::conflist::plugins(list) {
        let ipam = p
            .get("ipam")
            .and_then(|i| i.get("type"))
            .and_then(Value::as_str);
        for t in [Some(crate::conflist::plugin_type(p)), ipam]
            .into_iter()
            .flatten()
        {
            if t != DEFAULT_PLUGIN_TYPE && !out.iter().any(|o| o == t) {
                out.push(t.to_string());
            }
        }
    }
    out
}

/// Whether `dir` holds an executable plugin `name` (a bare file name, as replay runs it).
fn holds_plugin(dir: &Path, name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return false;
    }
    std::fs::metadata(dir.join(name))
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The CNI_PATH of an adopted record and the plugins of its chain found in none of its
/// dirs. The runtime's dirs when known; else the search dirs that hold any of the
/// chain's plugins, followed, when some plugin is found nowhere, by the other search
/// dirs (so that installing it in any of them later lets the replay run).
pub fn cni_path_for(entry: &CacheEntry, known: Option<&str>) -> (String, Vec<String>) {
    let plugins = crate::conflist::parse(&entry.config_bytes)
        .map(|l| chain_plugins(&l))
        .unwrap_or_default();
    cni_path_among(&plugins, known, PLUGIN_SEARCH_DIRS)
}

fn cni_path_among(
    plugins: &[String],
    known: Option<&str>,
    search: &[&str],
) -> (String, Vec<String>) {
    let dirs: Vec<String> = match known {
        Some(path) => path
            .split(':')
            .filter(|d| !d.is_empty())
            .map(String::from)
            .collect(),
        None => search
            .iter()
            .filter(|d| plugins.iter().any(|p| holds_plugin(Path::new(d), p)))
            .map(|d| d.to_string())
            .collect(),
    };
    let missing: Vec<String> = plugins
        .iter()
        .filter(|p| !dirs.iter().any(|d| holds_plugin(Path::new(d), p)))
        .cloned()
        .collect();
    let path = match known {
        Some(path) => path.to_string(),
        None if missing.is_empty() => dirs.join(":"),
        None => dirs
            .iter()
            .map(String::as_str)
            .chain(
                search
                    .iter()
                    .copied()
                    .filter(|d| !dirs.iter().any(|x| x == d)),
            )
            .collect::<Vec<_>>()
            .join(":"),
    };
    (path, missing)
}

/// The record an adoption makes; judged by the same rules as every other record.
pub fn record_for(
    entry: &CacheEntry,
    boot: &str,
    booted_at: i64,
    cni_path: &str,
    node: &sandbox::holders::NodeIndex,
) -> Record {
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
        // A path to check: whatever namespace is at the path now is this boot's and taken
        // as the attachment's (the same probe ADD records); nothing there leaves no
        // identity (the caller defers such an entry of this boot); a path that cannot be
        // examined is judged live later.
        // A path that shows nothing here may be a mount in the runtime's own mount
        // namespace: its identity is taken there, so gc can find the pod by it.
        match sandbox::probe(&entry.netns) {
            Probe::Namespace(id) => (Some(id), boot.to_string()),
            Probe::Missing | Probe::NotNamespace => match node.mounted_at(&entry.netns) {
                Some((id, _)) => (Some(id), boot.to_string()),
                // Written before this boot: its namespace went with that boot.
                None if entry.written_at < booted_at => (None, String::new()),
                None => (None, boot.to_string()),
            },
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
        created_boot_ns: None,
        tail: false,
        chain: None,
        add_id: format!("adopted-{:x}-{:x}", entry.written_at, std::process::id()),
        gc: None,
        source: Some(RecordSource::Adopted),
        cache_file: Some(entry.path.display().to_string()),
        chain_digest: crate::conflist::parse(&entry.config_bytes)
            .map(|list| crate::conflist::chain_digest(&list, DEFAULT_PLUGIN_TYPE)),
    }
}

/// The cached chain holds the ledger: its ADD was recorded, so a missing record was
/// removed, most often by the attachment's DEL, which runs before libcni drops the cache
/// file (an agent restarted mid-DEL, at an upgrade, would otherwise record a deleted
/// attachment); a record removed by hand cannot be told from that.
fn added_through_the_ledger(entry: &CacheEntry) -> bool {
    crate::conflist::parse(&entry.config_bytes).is_some_and(|list| {
        crate::conflist::plugins(&list)
            .iter()
            .any(|p| crate::conflist::plugin_type(p) == DEFAULT_PLUGIN_TYPE)
    })
}

/// Writes the record under the key's lock, only if there still is none and the cache
/// entry is still there: an ADD or another adopt may have made a record since the first
/// look, and a gc may have released the attachment (it removes the record and then the
/// cache entry before letting go of the key).
fn create(ledger: &Ledger, key: &Key, rec: &Record, entry: &CacheEntry) -> Result<AdoptAction> {
    let stem = key.stem();
    let Some(_lock) = ledger.lock(&stem, Wait::AtMost(Duration::from_secs(5)))? else {
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

    fn node() -> sandbox::holders::NodeIndex {
        sandbox::holders::NodeIndex::new()
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
            judged(&record_for(
                &entry("", 99),
                "b",
                100,
                "/opt/cni/bin",
                &node()
            )),
            Some("boot-changed")
        );
        assert_eq!(
            judged(&record_for(
                &entry("", 100),
                "b",
                100,
                "/opt/cni/bin",
                &node()
            )),
            None
        );
        // A netns path: what is there now is its identity.
        let live = record_for(
            &entry("/proc/self/ns/net", 1),
            "b",
            100,
            "/opt/cni/bin",
            &node(),
        );
        assert!(live.netns_id.is_some());
        assert_eq!(judged(&live), None);
        // Nothing at the path: from an earlier boot if written before this one began;
        // otherwise missing (and `run` defers it: it may be held elsewhere).
        let gone = record_for(
            &entry("/run/nonexistent-netns", 1),
            "b",
            100,
            "/opt/cni/bin",
            &node(),
        );
        assert_eq!(judged(&gone), Some("boot-changed"));
        let this_boot = record_for(
            &entry("/run/nonexistent-netns", 100),
            "b",
            100,
            "/opt/cni/bin",
            &node(),
        );
        assert_eq!(judged(&this_boot), Some("netns-missing"));
        assert_eq!(gone.source, Some(RecordSource::Adopted));
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
        // The cache entry's path is in the temp dir too: the node's /var/lib/cni is not
        // the test's to look at (nor always readable by whoever runs it).
        let mut e = entry("", 100);
        e.path = root.join("results").join("pods-abc-eth0");
        let key = Key::new(&e.network, &e.container_id, &e.ifname);
        let rec = record_for(&e, "b", 100, "/opt/cni/bin", &node());
        assert!(!e.path.exists());
        assert_eq!(create(&ledger, &key, &rec, &e).unwrap(), AdoptAction::Gone);
        assert!(ledger.read(&key.stem()).unwrap().is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn cni_path_is_where_the_chains_plugins_are() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("cl-adopt-path-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (a, b, c) = (root.join("a"), root.join("b"), root.join("c"));
        for d in [&a, &b, &c] {
            std::fs::create_dir_all(d).unwrap();
        }
        let put = |dir: &Path, name: &str, mode: u32| {
            let p = dir.join(name);
            std::fs::write(&p, b"").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        put(&b, "bridge", 0o755);
        put(&b, "host-local", 0o755);
        put(&c, "portmap", 0o755);
        put(&a, "portmap", 0o644); // not executable: not a plugin
        let list = serde_json::json!({"name": "n", "plugins": [
            {"type": "cni-ledger"},
            {"type": "bridge", "ipam": {"type": "host-local"}},
            {"type": "portmap"},
        ]});
        let plugins = chain_plugins(&list);
        assert_eq!(plugins, ["bridge", "host-local", "portmap"]);
        let s = |p: &PathBuf| p.to_str().unwrap().to_string();
        let search = [s(&a), s(&b), s(&c)];
        let search: Vec<&str> = search.iter().map(String::as_str).collect();
        // Filtered to the dirs that hold them.
        let (path, missing) = cni_path_among(&plugins, None, &search);
        assert_eq!(path, format!("{}:{}", s(&b), s(&c)));
        assert!(missing.is_empty());
        // One found nowhere: named, and every search dir kept for when it appears.
        let more = [plugins.clone(), vec!["tuning".into()]].concat();
        let (path, missing) = cni_path_among(&more, None, &search);
        assert_eq!(path, format!("{}:{}:{}", s(&b), s(&c), s(&a)));
        assert_eq!(missing, ["tuning"]);
        // The runtime's dirs, when known, as they are.
        let (path, missing) = cni_path_among(&plugins, Some(&s(&b)), &search);
        assert_eq!(path, s(&b));
        assert_eq!(missing, ["portmap"]);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn an_entry_added_through_the_ledger_is_not_adopted_without_its_record() {
        let mut e = entry("", 100);
        assert!(!added_through_the_ledger(&e));
        e.config_bytes =
            br#"{"name":"pods","plugins":[{"type":"cni-ledger"},{"type":"bridge"}]}"#.to_vec();
        assert!(added_through_the_ledger(&e));
        e.config_bytes = b"{not json".to_vec();
        assert!(!added_through_the_ledger(&e));
    }

    #[test]
    fn unusable_files_are_judged_in_scope_by_their_name() {
        let nets: BTreeSet<String> = ["pods".to_string(), "a-b".to_string()].into();
        let in_scope = |n: &str| named_in_scope(Path::new(n), &nets);
        assert!(in_scope("/r/pods-abc-eth0"));
        assert!(in_scope("/r/a-b-c-eth0"));
        assert!(!in_scope("/r/cni-loopback-abc-lo"));
        assert!(!in_scope("/r/podsx-abc-eth0"));
    }
}
