//! DEL drops the record (it runs last: every other plugin's DEL has succeeded), or
//! retires it while its ADD may still complete;
//! CHECK insists that one exists.

use super::{busy, ledger_error};
use crate::cni::config::NetConf;
use crate::cni::env::CmdArgs;
use crate::cni::error::{self, CniError};
use crate::ledger::{Damage, Damaged, Decoded, Key, Ledger, Wait};
use std::time::Duration;

pub fn del(conf: &NetConf, args: &CmdArgs) -> Result<(), CniError> {
    let ledger = Ledger::at(&conf.ledger_dir);
    let key = Key::new(&conf.name, &args.container_id, &args.ifname);
    match ledger.records_metadata() {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            unreachable_ledger(&key, &ledger, "records is not a directory");
            return Ok(());
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::info!(
                "DEL {key}: no ledger at {}; nothing was recorded there",
                ledger.root().display()
            );
            return Ok(());
        }
        Err(e) => {
            unreachable_ledger(&key, &ledger, &e.to_string());
            return Ok(());
        }
    }
    let stem = key.stem();
    let wait = Wait::AtMost(Duration::from_millis(conf.lock_timeout_ms));
    let lock = match ledger.lock(&stem, wait) {
        Ok(Some(lock)) => lock,
        Ok(None) => return Err(busy(&key)),
        Err(e) => {
            unreachable_ledger(&key, &ledger, &format!("{e:#}"));
            return Ok(());
        }
    };
    let found = match ledger.read(&stem) {
        Ok(found) => found,
        Err(e) => {
            unreachable_ledger(&key, &ledger, &format!("{e:#}"));
            return Ok(());
        }
    };
    match found {
        None => {}
        Some(Decoded::Ok(rec)) => {
            // Before the record goes: devices a driver moved into the pod come back
            // while the namespace still exists (the chain's DELs have all run).
            if let Some(spec) = &conf.return_devices {
                match devices_netns(&rec, &args.netns) {
                    Some(netns) => crate::devices::at_del(&ledger, &key, &netns, spec, "DEL"),
                    // No namespace to take devices from; a plugin of the chain may still
                    // have returned one itself. Then the host's state kept at ADD goes.
                    None => {
                        let recorded = crate::devices::recorded_in(
                            rec.chain.as_ref().and_then(|c| c.devices.as_ref()),
                        );
                        // Only in the record's boot: after a reboot the NIC booted on the
                        // host, and nothing of the record is to be done to it.
                        if crate::sandbox::boot_id().is_ok_and(|b| b == rec.boot_id) {
                            crate::devices::give_back_returned(
                                &ledger,
                                &key,
                                &recorded,
                                &[],
                                "DEL",
                            );
                        }
                        crate::devices::state::forget(&ledger, &key)
                    }
                }
            }
            // An ADD still in the chain (the runtime gave up on a slow sandbox) may yet
            // succeed and hold what this DEL released nothing of: its record is set
            // aside for its tail to restore, not dropped (docs/CHAIN.md).
            let gone = if in_flight(&rec) {
                ledger
                    .retire(&lock, &stem)
                    .map(|()| "record retired: its ADD has not completed")
            } else {
                ledger.remove(&stem).map(|_| "record removed")
            };
            match gone {
                Ok(what) => crate::info!("DEL {key}: {what}"),
                Err(e) => {
                    unreachable_ledger(&key, &ledger, &format!("{e:#}"));
                    return Ok(());
                }
            }
        }
        // Never from a read (its error comes as Err, above); for the match's sake.
        Some(Decoded::Unreadable(why)) => {
            unreachable_ledger(&key, &ledger, &why);
            return Ok(());
        }
        // Written by a newer binary (this one was rolled back): what its DEL must do
        // besides dropping the file is unknown here, so the record is left whole for
        // that binary's gc, whose replay of an idempotent DEL costs nothing. DEL succeeds:
        // every other plugin's DEL already has.
        Some(Decoded::Newer(format)) => crate::warn!(
            "DEL {key}: record of format {format}: newer format, left for a newer binary"
        ),
        Some(Decoded::Damaged(Damage { reason, detail })) => {
            // The runtime tore the attachment down, but a damaged file is never dropped
            // unseen: it goes to quarantine for an operator to look at.
            let damaged = Damaged {
                path: ledger.record_path(&stem),
                stem,
                reason,
                detail,
            };
            ledger.quarantine_held(&lock, &damaged, &format!("DEL {key}:"));
        }
    }
    lock.release_and_remove();
    Ok(())
}

/// Whether `rec`'s ADD may still be in the chain (`chain::may_complete`), judged on the
/// default `--chain-left-after`. A boot ID that cannot be read is taken for the record's:
/// retiring a record costs one more replay at most, removing one an ADD still needs
/// costs a leak.
fn in_flight(rec: &crate::ledger::Record) -> bool {
    let boot = crate::sandbox::boot_id().unwrap_or_else(|_| rec.boot_id.clone());
    crate::chain::may_complete(
        rec,
        &boot,
        crate::time::now(),
        crate::chain::DEFAULT_LEFT_AFTER_SECS,
    )
}

/// The namespace to take devices from: CNI_NETNS, only when it is the recorded path and
/// its cookie still proves it the recorded namespace (gc's rule), so devices are never
/// taken out of some other namespace.
fn devices_netns(rec: &crate::ledger::Record, cni_netns: &str) -> Option<String> {
    if cni_netns.is_empty() || cni_netns != rec.netns {
        return None;
    }
    let boot = crate::sandbox::boot_id().ok()?;
    crate::sandbox::replay_netns(&rec.boot_id, &rec.netns, rec.netns_id, &boot)
}

/// The plugins before us have torn the attachment down; failing DEL now would only make
/// the runtime retry a DEL that already happened. The record (if any) stays, and gc
/// replays a DEL for it later, which is harmless: DEL is idempotent.
fn unreachable_ledger(key: &Key, ledger: &Ledger, why: &str) {
    crate::error!(
        "DEL {key}: cannot reach the ledger at {} ({why}); DEL succeeds, the record (if any) is left for cni-ledger gc",
        ledger.root().display()
    );
}

pub fn check(conf: &NetConf, args: &CmdArgs) -> Result<(), CniError> {
    let key = Key::new(&conf.name, &args.container_id, &args.ifname);
    match Ledger::at(&conf.ledger_dir)
        .read(&key.stem())
        .map_err(ledger_error)?
    {
        // After a rollback: recorded, by a newer binary; failing CHECK would fail a pod
        // that is as it was.
        Some(Decoded::Ok(_) | Decoded::Newer(_)) => Ok(()),
        Some(Decoded::Damaged(Damage { reason, .. })) => Err(CniError::new(
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
