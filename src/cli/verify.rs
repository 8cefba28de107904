//! `cni-ledger verify`: read every record and snapshot, report damage, change nothing.

use crate::ledger::{Damage, Decoded, Entry, Ledger, Snapshot};
use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_os_t = super::ledger_dir_default())]
    ledger_dir: PathBuf,
}

/// What the records (or the retired records) say, as `verify` reports it.
#[derive(Default)]
struct Tally {
    problems: Vec<String>,
    newer: Vec<String>,
    referenced: std::collections::HashSet<String>,
}

impl Tally {
    /// Counts one entry: true when it is a whole record of this format.
    fn entry(&mut self, e: Entry) -> bool {
        let path = e.path.display();
        match e.decoded {
            Decoded::Ok(r) => {
                self.referenced.extend(r.snapshot);
                return true;
            }
            // Not damage: left whole for the binary that wrote it (after a rollback).
            Decoded::Newer(v) => self.newer.push(format!(
                "{path}: format {v}, newer format, left for a newer binary"
            )),
            Decoded::Damaged(Damage { reason, detail }) => {
                self.problems.push(format!("{path}: {reason}: {detail}"))
            }
            Decoded::Unreadable(error) => {
                self.problems.push(format!("{path}: unreadable: {error}"))
            }
        }
        false
    }
}

pub fn run(args: Args) -> Result<i32> {
    let ledger = Ledger::at(&args.ledger_dir);
    let mut tally = Tally::default();
    let mut records = 0usize;
    ledger.for_each(|e| records += usize::from(tally.entry(e)))?;
    // Records set aside while their ADD was in the chain (docs/CHAIN.md): held to the
    // same integrity rules, counted apart.
    let mut retired = 0usize;
    ledger.for_each_retired(|e| retired += usize::from(tally.entry(e)))?;
    let Tally {
        mut problems,
        newer,
        referenced,
    } = tally;
    let hashes = ledger.snapshot_hashes()?;
    for hash in &hashes {
        if let Snapshot::Damaged(reason) = ledger.get_snapshot(hash)? {
            problems.push(format!(
                "{}: {reason}",
                ledger.snapshot_path(hash).display()
            ));
        }
    }
    for missing in referenced.iter().filter(|h| !hashes.contains(h)) {
        outln!("note: snapshot {missing} is referenced but missing (gc falls back to the libcni cache or the conflist)");
    }
    let leftovers = ledger.temp_files().len();
    let quarantined = std::fs::read_dir(ledger.quarantine_dir())
        .map(|rd| rd.count())
        .unwrap_or(0);
    for p in &problems {
        outln!("damaged: {p}");
    }
    if retired > 0 {
        outln!("note: {retired} retired record(s): set aside by a DEL or GC while their ADD was in the chain (gc acts on them)");
    }
    for n in &newer {
        outln!("newer: {n}");
    }
    // The count of newer ones only when there are some: the line stays as it always was.
    let newer = match newer.len() {
        0 => String::new(),
        n => format!(", {n} newer-format record(s) (not damage)"),
    };
    outln!(
        "{records} record(s){newer}, {} snapshot(s), {} damaged, {quarantined} in quarantine, {leftovers} temporary file(s)",
        hashes.len(),
        problems.len()
    );
    Ok(if problems.is_empty() { 0 } else { 1 })
}
