//! `cni-ledger list`: every record with its liveness (DESIGN §5 rules 1–3).
//! Damaged records are quarantined as they are found and listed as `damaged`; a record
//! that cannot be read just now (I/O error, no fd) is listed `unreadable` and left.
//!
//! `--json` streams one object per record as the scan finds it, so memory does not grow
//! with the ledger; the table is sorted and so holds its (short) cells.

use crate::conflist;
use crate::ledger::{Damage, Damaged, Decoded, Ledger, Quarantine, Record, RecordSource};
use crate::sandbox;
use anyhow::Result;
use serde::Serialize;
use serde_json::{Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(clap::Args)]
pub struct Args {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
    #[arg(long, default_value_os_t = super::ledger_dir_default())]
    ledger_dir: PathBuf,
    /// Also show what this CRI runtime (unix:///PATH) says of each sandbox.
    #[arg(long, value_name = "unix:///PATH", requires = "cri_network")]
    cri_endpoint: Option<String>,
    /// A network the CRI runtime serves (repeatable).
    #[arg(long, value_name = "NAME", requires = "cri_endpoint")]
    cri_network: Vec<String>,
    /// A record whose chain's tail never came, and no DEL either, is listed
    /// `failed-left` once older than this (docs/CHAIN.md).
    #[arg(long, value_name = "SECS", default_value_t = crate::chain::DEFAULT_LEFT_AFTER_SECS)]
    chain_left_after: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Row<'a> {
    network: &'a str,
    container_id: &'a str,
    ifname: &'a str,
    netns: &'a str,
    created_at: &'a str,
    runtime_config: &'a Map<String, Value>,
    cni_args: &'a str,
    snapshot: Option<&'a str>,
    state: &'static str,
    reason: Option<&'static str>,
    /// Which identity decided `state` (see `sandbox::Evidence`).
    identity: &'static str,
    /// The namespace's cookie proved it the recorded one just now.
    netns_verified: bool,
    /// What keeps a live record's namespace alive when its path shows none from here (a
    /// runtime's private mount): "held by pid N", "mounted at P in the mount namespace of
    /// pid N". Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    held_by: Option<String>,
    attempts: u32,
    last_error: Option<&'a str>,
    next_attempt_at: Option<&'a str>,
    failed: bool,
    file: String,
    /// `adopted` for a record made by `cni-ledger adopt`, else null.
    source: Option<&'a str>,
    cache_file: Option<&'a str>,
    /// The snapshot's chain, plugin by plugin with the file each config came from (the
    /// conflist or a drop-in); null without a readable snapshot.
    #[serde(serialize_with = "shared_chain")]
    chain: Option<Arc<Vec<ChainPlugin>>>,
    /// With --cri-endpoint: `ready`, `notready` or `absent` for the runtime's networks.
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_state: Option<&'static str>,
    /// What the tail entry says of the chain's ADD (`chain::State`): `completed`,
    /// `pending`, `failed-left`, `tearing-down` or `untracked`.
    chain_state: &'static str,
    /// Seconds the chain's ADD took, head to tail; null unless completed in this boot.
    add_seconds: Option<f64>,
    chain_completed_at: Option<&'a str>,
    del_began_at: Option<&'a str>,
}

#[derive(Serialize)]
struct ChainPlugin {
    #[serde(rename = "type")]
    plugin_type: String,
    source: Option<String>,
}

fn shared_chain<S: serde::Serializer>(
    chain: &Option<Arc<Vec<ChainPlugin>>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    chain.as_deref().serialize(s)
}

/// The chain of each snapshot, read once per list however many records share it.
#[derive(Default)]
struct Chains(Mutex<std::collections::HashMap<String, Option<Arc<Vec<ChainPlugin>>>>>);

impl Chains {
    /// `rec`'s snapshot chain. Plugins of a conflist file's own bytes came from the
    /// record's `confFile` (per record, so not shared through the cache).
    fn of(&self, ledger: &Ledger, rec: &Record) -> Option<Arc<Vec<ChainPlugin>>> {
        let hash = rec.snapshot.as_ref()?;
        let key = format!("{hash}\0{}", rec.conf_file.as_deref().unwrap_or(""));
        let mut cache = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(hit) = cache.get(&key) {
            return hit.clone();
        }
        // A damaged or missing snapshot is gc's to report and quarantine: here it is
        // only a chain not shown.
        let chain = match ledger.get_snapshot(hash) {
            Ok(crate::ledger::Snapshot::Ok(bytes)) => conflist::parse(&bytes).map(|doc| {
                let sources = conflist::plugin_sources(&doc, rec.conf_file.as_deref());
                Arc::new(
                    conflist::plugins(&doc)
                        .iter()
                        .zip(sources)
                        .map(|(p, source)| ChainPlugin {
                            plugin_type: conflist::plugin_type(p).to_string(),
                            source,
                        })
                        .collect(),
                )
            }),
            _ => None,
        };
        cache.insert(key, chain.clone());
        chain
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OtherRow {
    /// A newer-format record's key, where a tolerant read finds it.
    #[serde(flatten)]
    key: Option<KeyFields>,
    file: String,
    state: &'static str,
    reason: String,
    details: String,
    quarantined_to: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct KeyFields {
    network: String,
    container_id: String,
    ifname: String,
}

/// The key a newer-format record names, read tolerantly (`record::newer_view`).
fn newer_key(path: &std::path::Path) -> Option<KeyFields> {
    let bytes = std::fs::read(path).ok()?;
    let key = crate::ledger::record::newer_view(&bytes)?.key?;
    Some(KeyFields {
        network: key.network,
        container_id: key.container_id,
        ifname: key.ifname,
    })
}

/// The CHAIN cell: the state, and for a completed chain how long its ADD took.
fn chain_cell(row: &Row) -> String {
    match (row.chain_state, row.add_seconds) {
        ("untracked", _) => "-".into(),
        (state, Some(secs)) => format!("{state} {secs:.3}s"),
        (state, None) => state.into(),
    }
}

fn table_cells(row: &Row, now: i64) -> Vec<String> {
    let age = crate::time::parse_rfc3339(row.created_at)
        .map(|t| crate::time::age(now - t))
        .unwrap_or_else(|| "-".into());
    let mut reason = row.reason.unwrap_or("-").to_string();
    if row.attempts > 0 {
        reason = format!("{reason} (gc tries: {})", row.attempts);
    }
    if let Some(state) = row.runtime_state {
        reason = format!("{reason} (runtime: {state})");
    }
    if let Some(source) = row.source {
        reason = format!("{reason} ({source})");
    }
    if let Some(held) = &row.held_by {
        reason = format!("{reason} ({held})");
    }
    vec![
        row.network.into(),
        row.container_id.into(),
        row.ifname.into(),
        row.state.into(),
        reason,
        age,
        chain_cell(row),
        row.netns.into(),
    ]
}

fn other_cells(row: &OtherRow) -> Vec<String> {
    let note = match &row.quarantined_to {
        Some(q) => format!("quarantined: {q}"),
        // Why a record is shown but not judged (after a rollback).
        None if row.reason.starts_with("newer-format") => row.details.clone(),
        None => String::new(),
    };
    let (network, container, ifname) = match &row.key {
        Some(k) => (k.network.clone(), k.container_id.clone(), k.ifname.clone()),
        None => ("-".into(), row.file.clone(), "-".into()),
    };
    vec![
        network,
        container,
        ifname,
        row.state.into(),
        row.reason.clone(),
        "-".into(),
        "-".into(),
        note,
    ]
}

fn damaged_row(ledger: &Ledger, d: Damaged) -> OtherRow {
    let quarantined_to = match ledger.quarantine_damaged(&d, "list:") {
        Quarantine::Moved(to) => Some(to.display().to_string()),
        Quarantine::Busy | Quarantine::Replaced | Quarantine::Failed(_) => None,
    };
    OtherRow {
        key: None,
        file: d.path.display().to_string(),
        state: "damaged",
        reason: d.reason.as_str().into(),
        details: d.detail,
        quarantined_to,
    }
}

/// One row out: an element of the JSON array (`json`), else a line of the table.
fn emit(
    r: &Row,
    json: Option<&Mutex<JsonArray>>,
    cells: &mut Vec<Vec<String>>,
    now: i64,
) -> std::io::Result<()> {
    let Some(json) = json else {
        cells.push(table_cells(r, now));
        return Ok(());
    };
    let bytes = serde_json::to_vec_pretty(r).map_err(std::io::Error::from)?;
    json.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push_raw(&bytes)
}

/// Writes JSON array elements from several threads, commas and all.
struct JsonArray {
    out: std::io::BufWriter<super::out::Stdout>,
    first: bool,
}

impl JsonArray {
    /// Takes an element already serialised, so workers format outside the lock.
    fn push_raw(&mut self, element: &[u8]) -> std::io::Result<()> {
        self.out
            .write_all(if self.first { b"[\n" } else { b",\n" })?;
        self.first = false;
        self.out.write_all(element)
    }

    fn push(&mut self, v: &impl Serialize) -> std::io::Result<()> {
        self.push_raw(&serde_json::to_vec_pretty(v)?)
    }

    fn finish(mut self) -> std::io::Result<()> {
        self.out
            .write_all(if self.first { b"[]\n" } else { b"\n]\n" })?;
        self.out.flush()
    }
}

/// When a record is listed: the wall clock, and the age past which an uncompleted
/// chain is failed-left.
#[derive(Clone, Copy)]
struct Clock {
    now: i64,
    left_after: u64,
}

fn row<'a>(
    rec: &'a Record,
    boot: &str,
    clock: Clock,
    path: &Path,
    cri: Option<&crate::cri::Judgement>,
    chain: Option<Arc<Vec<ChainPlugin>>>,
    node: &sandbox::holders::NodeIndex,
) -> Row<'a> {
    let verdict = cri.and_then(|c| c.verdict(rec));
    let (mut l, holder) =
        sandbox::liveness_on_node(&rec.boot_id, &rec.netns, rec.netns_id, boot, node);
    // As gc judges it: the runtime's silence counts only where the namespace check could
    // show nothing.
    if verdict == Some(crate::cri::Verdict::Absent) && crate::cri::absence_may_judge(&l) {
        l.reason = Some(sandbox::Reason::NotInRuntime);
        l.evidence = sandbox::Evidence::Runtime;
    }
    let reason = l.reason;
    let gc = rec.gc.as_ref();
    let chain_state = crate::chain::state(rec, boot, clock.now, clock.left_after);
    let note = rec.chain.as_ref();
    Row {
        network: &rec.network,
        container_id: &rec.container_id,
        ifname: &rec.ifname,
        netns: &rec.netns,
        created_at: &rec.created_at,
        runtime_config: &rec.runtime_config,
        cni_args: &rec.cni_args,
        snapshot: rec.snapshot.as_deref(),
        state: if reason.is_some() { "stale" } else { "live" },
        reason: reason.map(|r| r.as_str()),
        identity: l.evidence.as_str(),
        netns_verified: l.verified,
        held_by: holder.map(|h| h.to_string()),
        attempts: gc.map_or(0, |g| g.attempts),
        last_error: gc.and_then(|g| g.last_error.as_deref()),
        next_attempt_at: gc.and_then(|g| g.next_attempt_at.as_deref()),
        failed: gc.is_some_and(|g| g.failed),
        file: path.display().to_string(),
        source: rec.source.as_ref().map(RecordSource::as_str),
        cache_file: rec.cache_file.as_deref(),
        chain,
        runtime_state: verdict.map(|v| v.as_str()),
        chain_state: chain_state.as_str(),
        add_seconds: match chain_state {
            crate::chain::State::Completed { add_seconds } => add_seconds,
            _ => None,
        },
        chain_completed_at: note.and_then(|n| n.completed_at.as_deref()),
        del_began_at: note.and_then(|n| n.del_began_at.as_deref()),
    }
}

/// What one list worker gathered: table rows, non-record files, damaged records.
#[derive(Default)]
struct ListRows {
    cells: Vec<Vec<String>>,
    others: Vec<OtherRow>,
    damaged: Vec<Damaged>,
    error: Option<std::io::Error>,
}

pub fn run(args: Args) -> Result<i32> {
    let ledger = Ledger::at(&args.ledger_dir);
    let boot = sandbox::boot_id()?;
    let cri = match &args.cri_endpoint {
        Some(endpoint) => {
            crate::cri::socket_path(endpoint)?;
            let j = crate::cri::judgement(endpoint, &args.cri_network, crate::cri::TIMEOUT);
            if j.is_none() {
                errln!("cni-ledger: {endpoint} did not answer; runtime state not shown");
            }
            j
        }
        None => None,
    };
    let now = crate::time::now();
    let json = Mutex::new(JsonArray {
        out: std::io::BufWriter::new(super::out::Stdout),
        first: true,
    });
    let chains = Chains::default();
    // Built only if a record of this boot shows no namespace at its path.
    let node = sandbox::holders::NodeIndex::new();
    let scans = ledger.scan(
        crate::ledger::scan_jobs(),
        ListRows::default,
        |acc, e| match e.decoded {
            Decoded::Ok(rec) => {
                // Only the JSON shows the chain: the table needs no snapshot read.
                let chain = if args.json {
                    chains.of(&ledger, &rec)
                } else {
                    None
                };
                let clock = Clock {
                    now,
                    left_after: args.chain_left_after,
                };
                let r = row(&rec, &boot, clock, &e.path, cri.as_ref(), chain, &node);
                if let Err(err) = emit(&r, args.json.then_some(&json), &mut acc.cells, now) {
                    acc.error.get_or_insert(err);
                }
            }
            Decoded::Newer(v) => acc.others.push(OtherRow {
                key: newer_key(&e.path),
                file: e.path.display().to_string(),
                state: "unknown",
                reason: format!("newer-format-{v}"),
                details: "newer format, left for a newer binary".into(),
                quarantined_to: None,
            }),
            Decoded::Damaged(Damage { reason, detail }) => acc.damaged.push(Damaged {
                stem: e.stem,
                path: e.path,
                reason,
                detail,
            }),
            // A failed read says nothing of the content: listed, left where it is.
            Decoded::Unreadable(error) => acc.others.push(OtherRow {
                key: None,
                file: e.path.display().to_string(),
                state: "unknown",
                reason: "unreadable".into(),
                details: format!("{error}; left in place, read again next run"),
                quarantined_to: None,
            }),
        },
    )?;
    let mut cells = Vec::new();
    let mut others = Vec::new();
    for scan in scans {
        if let Some(e) = scan.error {
            return Err(e.into());
        }
        cells.extend(scan.cells);
        others.extend(scan.others);
        for d in scan.damaged {
            others.push(damaged_row(&ledger, d));
        }
    }
    // Records a DEL or GC set aside while their ADD was in the chain: listed with CHAIN
    // `retired` (docs/CHAIN.md), read as they are, never quarantined from here.
    let clock = Clock {
        now,
        left_after: args.chain_left_after,
    };
    let mut retired_error = None;
    ledger.for_each_retired(|e| match e.decoded {
        Decoded::Ok(rec) => {
            let chain = if args.json {
                chains.of(&ledger, &rec)
            } else {
                None
            };
            let mut r = row(&rec, &boot, clock, &e.path, cri.as_ref(), chain, &node);
            r.chain_state = "retired";
            r.add_seconds = None;
            if let Err(err) = emit(&r, args.json.then_some(&json), &mut cells, now) {
                retired_error.get_or_insert(err);
            }
        }
        Decoded::Newer(v) => others.push(OtherRow {
            key: newer_key(&e.path),
            file: e.path.display().to_string(),
            state: "unknown",
            reason: format!("newer-format-{v}"),
            details: "a retired record written by a newer cni-ledger; left alone".into(),
            quarantined_to: None,
        }),
        Decoded::Damaged(Damage { reason, detail }) => others.push(OtherRow {
            key: None,
            file: e.path.display().to_string(),
            state: "damaged",
            reason: reason.to_string(),
            details: format!("a retired record: {detail}; gc quarantines it"),
            quarantined_to: None,
        }),
        Decoded::Unreadable(error) => others.push(OtherRow {
            key: None,
            file: e.path.display().to_string(),
            state: "unknown",
            reason: "unreadable".into(),
            details: format!("a retired record: {error}; left in place"),
            quarantined_to: None,
        }),
    })?;
    if let Some(e) = retired_error {
        return Err(e.into());
    }
    let device_notes = crate::devices::failure_note::read_all(&ledger);
    // Devices gc gave back after their namespace died with no DEL, until an operator
    // removes the note.
    let repaired = crate::devices::state::read_repaired(&ledger);
    if args.json {
        let mut json = json
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for o in &others {
            json.push(o)?;
        }
        for (path, note) in &device_notes {
            json.push(&crate::devices::failure_note::json_row(path, note))?;
        }
        for (path, n) in &repaired {
            json.push(&serde_json::json!({
                "network": n.network, "containerId": n.container_id, "ifname": n.ifname,
                "state": REPAIRED, "reason": crate::devices::state::summary(&n.devices),
                "at": n.at, "devices": n.devices, "file": path.display().to_string(),
            }))?;
        }
        json.finish()?;
        return Ok(0);
    }
    cells.sort_unstable();
    cells.extend(others.iter().map(other_cells));
    cells.extend(device_notes.iter().map(|(path, note)| {
        let mut cells = crate::devices::failure_note::table_row(path, note, now);
        // No chain to speak of: the CHAIN column, before NETNS.
        cells.insert(cells.len().saturating_sub(1), "-".into());
        cells
    }));
    cells.extend(repaired.iter().map(|(_, n)| {
        vec![
            n.network.clone(),
            n.container_id.clone(),
            n.ifname.clone(),
            REPAIRED.into(),
            crate::devices::state::summary(&n.devices),
            crate::time::parse_rfc3339(&n.at)
                .map(|t| crate::time::age(now - t))
                .unwrap_or_else(|| "-".into()),
            "-".into(),
            "-".into(),
        ]
    }));
    super::print_table(
        &[
            "NETWORK",
            "CONTAINER",
            "IFNAME",
            "STATE",
            "REASON",
            "AGE",
            "CHAIN",
            "NETNS",
        ],
        &cells,
    );
    Ok(0)
}

/// `list`'s state for an attachment whose devices gc gave back after the fact.
const REPAIRED: &str = "devices-given-back";
