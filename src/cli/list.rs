//! `cni-ledger list`: every record with its liveness (DESIGN §5 rules 1–3).
//! Damaged records are quarantined as they are found and listed as `damaged`.

use crate::ledger::{Decoded, Ledger, Record, Wait};
use crate::sandbox;
use anyhow::Result;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Print a JSON array instead of a table.
    #[arg(long)]
    json: bool,
    #[arg(long, default_value_os_t = super::ledger_dir_default())]
    ledger_dir: PathBuf,
}

fn row(rec: &Record, boot: &str, path: &std::path::Path) -> Value {
    let reason = sandbox::staleness(&rec.boot_id, &rec.netns, rec.netns_id, boot);
    let gc = rec.gc.clone().unwrap_or_default();
    json!({
        "network": rec.network,
        "containerId": rec.container_id,
        "ifname": rec.ifname,
        "netns": rec.netns,
        "createdAt": rec.created_at,
        "runtimeConfig": rec.runtime_config,
        "cniArgs": rec.cni_args,
        "snapshot": rec.snapshot,
        "state": if reason.is_some() { "stale" } else { "live" },
        "reason": reason.map(|r| r.as_str()),
        "attempts": gc.attempts,
        "lastError": gc.last_error,
        "nextAttemptAt": gc.next_attempt_at,
        "failed": gc.failed,
        "file": path.display().to_string(),
    })
}

fn damaged_row(
    ledger: &Ledger,
    stem: &str,
    path: &std::path::Path,
    reason: &str,
    detail: &str,
) -> Value {
    // Only under the key's lock, and only if still damaged: a writer may just have fixed it.
    let quarantined = match ledger.lock(stem, Wait::No) {
        Ok(Some(_lock)) => match ledger.read(stem) {
            Ok(Some(Decoded::Ok(_))) | Ok(None) => None,
            _ => ledger.quarantine(path).ok(),
        },
        _ => None,
    };
    crate::warn!(
        "list: damaged record {} ({reason}: {detail}){}",
        path.display(),
        quarantined
            .as_ref()
            .map(|q| format!(" quarantined to {}", q.display()))
            .unwrap_or_default()
    );
    json!({
        "file": path.display().to_string(),
        "state": "damaged",
        "reason": reason,
        "details": detail,
        "quarantinedTo": quarantined.map(|q| q.display().to_string()),
    })
}

pub fn run(args: Args) -> Result<i32> {
    let ledger = Ledger::at(&args.ledger_dir);
    let boot = sandbox::boot_id()?;
    let now = crate::time::now();
    let mut rows = Vec::new();
    let mut damaged = Vec::new();
    ledger.for_each(|e| match e.decoded {
        Decoded::Ok(rec) => rows.push(row(&rec, &boot, &e.path)),
        Decoded::Newer(v) => rows.push(json!({
            "file": e.path.display().to_string(),
            "state": "unknown",
            "reason": format!("newer-format-{v}"),
        })),
        Decoded::Damaged(reason, detail) => damaged.push((e.stem, e.path, reason, detail)),
    })?;
    for (stem, path, reason, detail) in damaged {
        rows.push(damaged_row(&ledger, &stem, &path, reason, &detail));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(0);
    }
    let s = |v: &Value| v.as_str().unwrap_or("-").to_string();
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let age = r["createdAt"]
                .as_str()
                .and_then(crate::time::parse_rfc3339)
                .map(|t| super::age(now - t))
                .unwrap_or_else(|| "-".into());
            let mut reason = s(&r["reason"]);
            if r["attempts"].as_u64().unwrap_or(0) > 0 {
                reason = format!("{reason} (gc tries: {})", r["attempts"]);
            }
            if r["state"] == "damaged" {
                vec![
                    "-".into(),
                    s(&r["file"]),
                    "-".into(),
                    "damaged".into(),
                    reason,
                    "-".into(),
                    r["quarantinedTo"]
                        .as_str()
                        .map(|q| format!("quarantined: {q}"))
                        .unwrap_or_default(),
                ]
            } else {
                vec![
                    s(&r["network"]),
                    s(&r["containerId"]),
                    s(&r["ifname"]),
                    s(&r["state"]),
                    reason,
                    age,
                    s(&r["netns"]),
                ]
            }
        })
        .collect();
    super::print_table(
        &[
            "NETWORK",
            "CONTAINER",
            "IFNAME",
            "STATE",
            "REASON",
            "AGE",
            "NETNS",
        ],
        &table,
    );
    Ok(0)
}
