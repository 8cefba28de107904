//! The tail entry (`"role": "tail"`, last in the chain; docs/CHAIN.md). ADD: the chain's
//! result arrives as prevResult and is passed on unchanged; the tail's note on the
//! head's record (`Ledger::put_note`) says it completed, with that result and the time
//! the chain took. DEL (first in DEL's reversed order): the note says a DEL began. Neither ever fails the runtime's call: the head's record is
//! the write-ahead record and stands on its own; a tail that cannot write says why at
//! `warn`. CHECK passes; GC and STATUS are the head's to answer, once per chain.

use super::empty_result;
use crate::cni::config::NetConf;
use crate::cni::env::{CmdArgs, Command};
use crate::cni::error::CniError;
use crate::ledger::record::ChainNote;
use crate::ledger::{Decoded, Key, Ledger, Wait};
use serde_json::Value;
use std::fmt;
use std::time::Duration;

pub fn dispatch(cmd: Command, conf: &NetConf, args: &CmdArgs) -> Result<Option<Value>, CniError> {
    match cmd {
        Command::Add => Ok(Some(add(conf, args))),
        Command::Del => {
            del(conf, args);
            Ok(None)
        }
        // The head checks the record; the tail has nothing of its own to check. GC and
        // STATUS come to every entry of the chain: the head answers them (a second GC
        // from the tail would sweep twice, against the same valid list).
        Command::Check | Command::Gc | Command::Status => Ok(None),
        Command::Version => unreachable!("handled before config parsing"),
    }
}

/// Why the tail wrote nothing.
#[derive(Debug)]
enum NotNoted {
    /// Another holds the key (a gc replay) longer than `lockTimeoutMs`.
    Busy,
    /// The head wrote no record (its ADD warned and went on, or the ledger is elsewhere).
    NoRecord,
    /// The record is damaged or of a newer format: not rewritten.
    Unusable(String),
    Ledger(anyhow::Error),
}

impl fmt::Display for NotNoted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotNoted::Busy => write!(f, "the attachment is held by a cni-ledger gc replay"),
            NotNoted::NoRecord => write!(f, "no record (the head recorded nothing)"),
            NotNoted::Unusable(why) => write!(f, "the record is unusable ({why})"),
            NotNoted::Ledger(e) => write!(f, "{e:#}"),
        }
    }
}

fn key(conf: &NetConf, args: &CmdArgs) -> Key {
    Key {
        network: conf.name.clone(),
        container_id: args.container_id.clone(),
        ifname: args.ifname.clone(),
    }
}

/// Writes the attachment's note under its key lock: the `chain` the record reads with
/// now (an earlier note of this ADD, or what the record holds), changed by `note`. Not
/// flushed: the record already holds all a replay needs, and a flush was most of the
/// tail's cost (docs/CHAIN.md, Cost). The record itself is never rewritten here.
/// With `restore` (the tail's ADD), a record a DEL or GC retired while this ADD was
/// still in the chain is moved back first: the ADD is about to succeed.
fn rewrite(
    conf: &NetConf,
    key: &Key,
    wait: Wait,
    restore: bool,
    note: impl FnOnce(&mut ChainNote, &crate::ledger::Record),
) -> Result<(), NotNoted> {
    let ledger = Ledger::at(&conf.ledger_dir);
    let stem = key.stem();
    let lock = ledger
        .lock(&stem, wait)
        .map_err(NotNoted::Ledger)?
        .ok_or(NotNoted::Busy)?;
    let rec = match ledger.read(&stem).map_err(NotNoted::Ledger)? {
        Some(Decoded::Ok(rec)) => rec,
        None if restore => restore_retired(&ledger, &lock, &stem, key)?,
        None => return Err(NotNoted::NoRecord),
        Some(Decoded::Damaged(d)) => return Err(NotNoted::Unusable(d.reason.as_str().into())),
        Some(Decoded::Newer(format)) => return Err(NotNoted::Unusable(format!("format {format}"))),
        Some(Decoded::Unreadable(why)) => return Err(NotNoted::Unusable(why)),
    };
    let mut chain = rec.chain.clone().unwrap_or_default();
    note(&mut chain, &rec);
    ledger.put_note(&rec, &chain).map_err(NotNoted::Ledger)
}

/// The record of this ADD that a DEL or GC retired while the ADD was in the chain, moved
/// back into `records/` (the caller holds the key and found no record there). The tail
/// cannot tell its ADD's `addId`: a retired record of this boot that no tail completed
/// is this ADD's, since a newer ADD of the key would have left a record in `records/`.
fn restore_retired(
    ledger: &Ledger,
    lock: &crate::ledger::KeyLock,
    stem: &str,
    key: &Key,
) -> Result<Box<crate::ledger::Record>, NotNoted> {
    let rec = match ledger.read_retired(stem).map_err(NotNoted::Ledger)? {
        Some(Decoded::Ok(rec)) => rec,
        None => return Err(NotNoted::NoRecord),
        Some(Decoded::Damaged(d)) => return Err(NotNoted::Unusable(d.reason.as_str().into())),
        Some(Decoded::Newer(format)) => return Err(NotNoted::Unusable(format!("format {format}"))),
        Some(Decoded::Unreadable(why)) => return Err(NotNoted::Unusable(why)),
    };
    let boot = crate::sandbox::boot_id().map_err(|e| NotNoted::Ledger(e.into()))?;
    if rec.boot_id != boot || rec.chain.as_ref().is_some_and(|c| c.completed_at.is_some()) {
        return Err(NotNoted::NoRecord);
    }
    ledger
        .restore_retired(lock, stem)
        .map_err(NotNoted::Ledger)?;
    crate::warn!(
        "ADD {key}: tail: a DEL or GC came while this ADD was in the chain; its record is restored"
    );
    Ok(rec)
}

fn add(conf: &NetConf, args: &CmdArgs) -> Value {
    let completed_boot_ns = crate::time::since_boot_ns();
    let result = conf
        .prev_result
        .clone()
        .unwrap_or_else(|| empty_result(&conf.cni_version));
    let key = key(conf, args);
    let this_boot = crate::sandbox::boot_id().ok();
    let wait = Wait::AtMost(Duration::from_millis(conf.lock_timeout_ms));
    let completed = rewrite(conf, &key, wait, true, |chain, rec| {
        chain.completed_at = Some(crate::time::rfc3339(crate::time::now()));
        chain.completed_boot_ns = completed_boot_ns;
        // Both stamps are on CLOCK_BOOTTIME: comparable only within the recorded boot.
        chain.add_seconds = match (completed_boot_ns, &this_boot) {
            (Some(done), Some(boot)) if *boot == rec.boot_id => {
                crate::chain::add_seconds(rec.created_boot_ns, done)
            }
            _ => None,
        };
        chain.result = conf.prev_result.clone();
        let links = device_links(conf, args, &key, rec);
        // `devices` as every release reads it (the named links); `links` whole, which
        // only this release's DEL reads.
        chain.devices = links.as_ref().and_then(|l| {
            let named = crate::devices::Recording {
                links: l.clone(),
                whole: true,
            }
            .named();
            serde_json::to_value(named).ok()
        });
        chain.links = links.and_then(|l| serde_json::to_value(l).ok());
    });
    match completed {
        Ok(()) => crate::info!("ADD {key}: chain completed"),
        Err(e) => crate::warn!("ADD {key}: tail: chain completion not recorded: {e}"),
    }
    result
}

/// With `returnDevices` on in the head's entry: the pod's returnable links now, with
/// their host names, before its containers run (DEL names them so, never by what the
/// pod wrote since, and returns no virtual link the pod made after).
fn device_links(
    conf: &NetConf,
    args: &CmdArgs,
    key: &Key,
    rec: &crate::ledger::Record,
) -> Option<Vec<crate::devices::Recorded>> {
    let spec = crate::devices::spec_of_record(&Ledger::at(&conf.ledger_dir), rec)?;
    match crate::devices::record_names(&args.netns, &spec) {
        Ok(links) => Some(links),
        Err(e) => {
            crate::warn!("ADD {key}: tail: device names not recorded ({e}); DEL will give them neutral names and return every link the option selects, virtual ones the pod makes too");
            None
        }
    }
}

fn del(conf: &NetConf, args: &CmdArgs) {
    let key = key(conf, args);
    let began_boot_ns = crate::time::since_boot_ns();
    // No wait: a key held now is a gc replay of this very attachment, whose record is
    // going anyway; the head's DEL waits for it and answers the runtime.
    let noted = rewrite(conf, &key, Wait::No, false, |chain, _| {
        chain.del_began_at = Some(crate::time::rfc3339(crate::time::now()));
        chain.del_began_boot_ns = began_boot_ns;
    });
    match noted {
        Ok(()) => crate::info!("DEL {key}: tail: DEL began"),
        // DEL is called for what was never added, and again after a DEL: no record is
        // the usual case then, not worth a warning.
        Err(NotNoted::NoRecord) => crate::debug!("DEL {key}: tail: no record"),
        Err(e) => crate::warn!("DEL {key}: tail: DEL's start not recorded: {e}"),
    }
}
