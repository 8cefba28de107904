//! DEL drops the record (it runs last: every other plugin's DEL has succeeded);
//! CHECK insists that one exists.

use super::{busy, ledger_error};
use crate::cni::config::NetConf;
use crate::cni::env::CmdArgs;
use crate::cni::error::{self, CniError};
use crate::ledger::{Decoded, Key, Ledger, Wait};
use std::time::Duration;

fn key(conf: &NetConf, args: &CmdArgs) -> Key {
    Key {
        network: conf.name.clone(),
        container_id: args.container_id.clone(),
        ifname: args.ifname.clone(),
    }
}

pub fn del(conf: &NetConf, args: &CmdArgs) -> Result<(), CniError> {
    let ledger = Ledger::at(&conf.ledger_dir);
    if !ledger.records_dir().is_dir() {
        return Ok(()); // nothing was ever recorded here
    }
    let key = key(conf, args);
    let stem = key.stem();
    let wait = Wait::Upto(Duration::from_millis(conf.lock_timeout_ms));
    let lock = ledger
        .lock(&stem, wait)
        .map_err(ledger_error)?
        .ok_or_else(|| busy(&key))?;
    match ledger.read(&stem).map_err(ledger_error)? {
        None => {}
        Some(Decoded::Ok(rec)) => {
            // Before the record goes: devices a driver moved into the pod come back
            // while the namespace still exists (the chain's DELs have all run).
            if let Some(spec) = &conf.return_devices {
                if let Some(netns) = devices_netns(&rec, &args.netns) {
                    crate::devices::at_del(&ledger, &key, &netns, spec, "DEL");
                }
            }
            ledger.remove(&stem).map_err(ledger_error)?;
            crate::info!("DEL {key}: record removed");
        }
        Some(Decoded::Newer(_)) => {
            ledger.remove(&stem).map_err(ledger_error)?;
            crate::info!("DEL {key}: record removed");
        }
        Some(Decoded::Damaged(reason, detail)) => {
            // The runtime tore the attachment down, but a damaged file is never dropped
            // unseen: it goes to quarantine for an operator to look at.
            let to = ledger
                .quarantine(&ledger.record_path(&stem))
                .map_err(ledger_error)?;
            crate::warn!(
                "DEL {key}: record was damaged ({reason}: {detail}); quarantined to {}",
                to.display()
            );
        }
    }
    lock.release_and_remove();
    Ok(())
}

/// The namespace to take devices from: CNI_NETNS, only when it is the recorded path and
/// that path still is the recorded namespace in this boot (gc's rule), so devices are
/// never taken out of some other namespace.
fn devices_netns(rec: &crate::ledger::Record, cni_netns: &str) -> Option<String> {
    if cni_netns.is_empty() || cni_netns != rec.netns {
        return None;
    }
    let boot = crate::sandbox::boot_id().ok()?;
    crate::sandbox::replay_netns(&rec.boot_id, &rec.netns, rec.netns_id, &boot)
}

pub fn check(conf: &NetConf, args: &CmdArgs) -> Result<(), CniError> {
    let key = key(conf, args);
    match Ledger::at(&conf.ledger_dir)
        .read(&key.stem())
        .map_err(ledger_error)?
    {
        Some(Decoded::Ok(_)) => Ok(()),
        Some(Decoded::Damaged(reason, _)) => Err(CniError::new(
            error::IO_FAILURE,
            format!("ledger record is damaged ({reason})"),
            key.to_string(),
        )),
        _ => Err(CniError::new(
            error::UNKNOWN_CONTAINER,
            "no ledger record for this attachment",
            key.to_string(),
        )),
    }
}
