//! ADD: record the attachment durably (write-ahead), then pass the result on.

use super::conf_memo::{self, Memo};
use super::{busy, empty_result, ledger_error};
use crate::cni::config::{NetConf, OnLedgerError, DEFAULT_CONF_DIR};
use crate::cni::env::CmdArgs;
use crate::cni::error::CniError;
use crate::conflist;
use crate::ledger::{Key, Ledger, Record, Wait};
use crate::sandbox::{self, Probe};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

pub fn add(conf: &NetConf, args: &CmdArgs) -> Result<Value, CniError> {
    // Taken first: the chain's duration counts from the start of its first plugin.
    let started_boot_ns = crate::time::since_boot_ns();
    let result = conf
        .prev_result
        .clone()
        .unwrap_or_else(|| empty_result(&conf.cni_version));
    match record(conf, args, started_boot_ns) {
        Ok(()) => Ok(result),
        Err(e) if conf.on_ledger_error == OnLedgerError::Warn => {
            // An error let through, not a warning: it must reach the runtime's log.
            crate::error!(
                "ADD {}/{}/{}: not recorded, going on (onLedgerError=warn): {e}",
                conf.name,
                args.container_id,
                args.ifname
            );
            Ok(result)
        }
        Err(e) => Err(e),
    }
}

fn conf_dir(conf: &NetConf) -> PathBuf {
    conf.conf_dir
        .clone()
        .or_else(|| std::env::var_os("NETCONFPATH").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONF_DIR))
}

fn record(conf: &NetConf, args: &CmdArgs, started_boot_ns: Option<u64>) -> Result<(), CniError> {
    let ledger = Ledger::open_for_write(&conf.ledger_dir).map_err(ledger_error)?;
    // What gc would refuse to replay from, ADD refuses to record in (gc's own check).
    ledger.check_trusted().map_err(ledger_error)?;
    let key = Key::new(&conf.name, &args.container_id, &args.ifname);
    let stem = key.stem();
    let wait = Wait::AtMost(Duration::from_millis(conf.lock_timeout_ms));
    let _lock = ledger
        .lock(&stem, wait)
        .map_err(ledger_error)?
        .ok_or_else(|| busy(&key))?;

    let boot_id = sandbox::boot_id()
        .map_err(|e| ledger_error(anyhow::Error::new(e).context("reading the boot ID")))?;
    let why_none = match sandbox::probe(&args.netns) {
        Probe::Namespace(id) => Ok(id),
        Probe::Missing => Err("nothing is there".to_string()),
        Probe::NotNamespace => Err("it is no namespace file".to_string()),
        Probe::Unknown(e) => Err(e),
    };
    let netns_id = why_none
        .map_err(|why| {
            crate::warn!(
                "ADD {key}: netns {}: {why}; recorded without identity",
                args.netns
            )
        })
        .ok();

    // The snapshot guard is held until the record naming the snapshot is durable, so a
    // concurrent sweep cannot delete the snapshot in between.
    let dir = conf_dir(conf);
    let began = std::time::SystemTime::now();
    let guard = ledger.snapshot_guard_shared().map_err(ledger_error)?;
    let mut remembered = None;
    let chain = match conf_memo::recall(&ledger, &conf.name, &dir) {
        Some(memo) => Chain {
            snapshot: Some(memo.snapshot),
            conf_file: Some(memo.conf_file.display().to_string()),
            tail: memo.tail,
        },
        None => {
            let (chain, memo) = load_chain(conf, &key, &ledger, &dir)?;
            remembered = memo;
            chain
        }
    };
    let now = crate::time::now();
    let rec = Record {
        network: key.network.clone(),
        container_id: key.container_id.clone(),
        ifname: key.ifname.clone(),
        netns: args.netns.clone(),
        netns_id,
        boot_id,
        cni_args: args.args.clone(),
        cni_path: args.path.clone(),
        cni_version: conf.cni_version.clone(),
        runtime_config: conf.runtime_config.clone(),
        ledger_type: conf.plugin_type.clone(),
        snapshot: chain.snapshot,
        conf_file: chain.conf_file,
        created_at: crate::time::rfc3339(now),
        // One reading of the boot clock for both: the same instant, two resolutions.
        created_boot_secs: started_boot_ns.map(|ns| ns / 1_000_000_000),
        created_boot_ns: started_boot_ns,
        add_id: add_id(),
        tail: chain.tail,
        chain: None,
        gc: None,
        source: None,
        cache_file: None,
        chain_digest: None,
    };
    ledger.write(&rec).map_err(ledger_error)?;
    drop(guard);
    if let Some(memo) = remembered {
        conf_memo::remember(&ledger, &conf.name, &dir, &memo, began, conf_memo::SETTLED);
    }
    // The host's devices as they are before the chain or a driver's hook can move one,
    // for their state's return (only with returnDevices: nothing else pays for it).
    if conf.return_devices.is_some() {
        if let Err(e) = crate::devices::state::remember(&ledger, &key) {
            crate::warn!("ADD {key}: cannot keep the host's device state: {e:#}");
        }
    }
    crate::info!("ADD {key}: recorded (netns {})", args.netns);
    Ok(())
}

/// What the record says of the chain the ADD ran in.
struct Chain {
    /// The snapshot's hash.
    snapshot: Option<String>,
    /// The conflist the chain came from.
    conf_file: Option<String>,
    /// Whether the chain holds the ledger's tail entry.
    tail: bool,
}

const NO_CHAIN: Chain = Chain {
    snapshot: None,
    conf_file: None,
    tail: false,
};

/// The chain named `conf.name` loaded from `dir` and snapshotted; and what to remember
/// of it when the load was clean (no warning that the next ADD should repeat).
fn load_chain(
    conf: &NetConf,
    key: &Key,
    ledger: &Ledger,
    dir: &std::path::Path,
) -> Result<(Chain, Option<Memo>), CniError> {
    match conflist::find(dir, &conf.name) {
        Ok(Some(found)) if chain_includes(&found.list, &conf.plugin_type) => {
            let clean = warn_capabilities(conf, &found.list);
            let tail = crate::chain::holds_tail(&found.list, &conf.plugin_type);
            // The chain as libcni v1.3 loaded it, drop-ins included, is what a replay runs.
            let bytes = found.snapshot_bytes();
            let hash = ledger.put_snapshot(&bytes).map_err(ledger_error)?;
            let memo = (clean && !found.has_dropins()).then(|| Memo {
                snapshot: hash.clone(),
                snapshot_len: bytes.len() as u64,
                conf_file: found.path.clone(),
                tail,
            });
            let conf_file = found.path.display().to_string();
            let chain = Chain {
                snapshot: Some(hash),
                conf_file: Some(conf_file),
                tail,
            };
            Ok((chain, memo))
        }
        Ok(Some(found)) => {
            crate::warn!(
                "ADD {key}: {} is named {} but has no {} entry; not snapshotting it",
                found.path.display(),
                conf.name,
                conf.plugin_type
            );
            Ok((NO_CHAIN, None))
        }
        Ok(None) => {
            crate::warn!(
                "ADD {key}: no conflist named {} in {}; recording without a snapshot",
                conf.name,
                dir.display()
            );
            Ok((NO_CHAIN, None))
        }
        Err(e) => {
            // A drop-in libcni cannot parse lands here too, in libcni's words.
            crate::warn!(
                "ADD {key}: cannot load the chain from {}: {e:#}; recording without a snapshot",
                dir.display()
            );
            Ok((NO_CHAIN, None))
        }
    }
}

/// Unique per ADD; needs no secrecy, only to differ from every earlier ADD of the key.
fn add_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}-{:x}", std::process::id())
}

fn chain_includes(list: &Value, ledger_type: &str) -> bool {
    conflist::plugins(list)
        .iter()
        .any(|p| conflist::plugin_type(p) == ledger_type)
}

/// The ledger only receives capability args it declares; a later plugin's capability
/// it lacks could not be replayed. One it declares that nobody else does would make
/// runtimes believe the chain handles it.
/// Returns whether it had nothing to say.
fn warn_capabilities(conf: &NetConf, list: &Value) -> bool {
    let mut clean = true;
    let mut others = std::collections::BTreeSet::new();
    for plugin in conflist::plugins(list) {
        if conflist::plugin_type(plugin) == conf.plugin_type {
            continue;
        }
        for cap in conflist::declared_capabilities(plugin) {
            if !conf.capabilities.contains(&cap) {
                clean = false;
                crate::warn!(
                    "network {}: plugin {} declares capability {cap} that cni-ledger does not; its args cannot be replayed",
                    conf.name,
                    conflist::plugin_type(plugin)
                );
            }
            others.insert(cap);
        }
    }
    for cap in &conf.capabilities {
        if !others.contains(cap) {
            clean = false;
            crate::warn!(
                "network {}: cni-ledger declares capability {cap} that no other plugin declares; remove it",
                conf.name
            );
        }
    }
    clean
}
