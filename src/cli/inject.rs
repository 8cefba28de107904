//! `cni-ledger inject`: put the ledger first in a conflist, declaring the union of the
//! chain's capabilities (and nothing else: runtimes read a declared capability as "the
//! chain handles it"), and its tail entry last (docs/CHAIN.md; `--no-tail` leaves it out
//! or takes it out). Idempotent; `--remove` undoes it. A conflist whose chain runs at a
//! `cniVersion` the ledger does not serve is refused. Files are replaced by rename, so a
//! runtime watching the directory never reads half a file.

use crate::injection::{plan, EntryOptions};
use crate::replace::write_replacing;
use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Conflist files (.conflist, or .conf/.json holding a "plugins" list).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Take the ledger out instead.
    #[arg(long)]
    remove: bool,
    /// Print the result instead of writing it.
    #[arg(long)]
    dry_run: bool,
    /// The ledger's plugin type (its binary name in the CNI bin dir).
    #[arg(long = "type", default_value = crate::cni::config::DEFAULT_PLUGIN_TYPE)]
    plugin_type: String,
    /// Write this `ledgerDir` into the entry (default: the plugin's default).
    #[arg(long)]
    ledger_dir: Option<PathBuf>,
    /// Write this `confDir` into the entry, for a conf dir other than /etc/cni/net.d.
    #[arg(long)]
    conf_dir: Option<PathBuf>,
    /// No tail entry: the chain's completion and duration are not recorded (an existing
    /// tail is taken out).
    #[arg(long)]
    no_tail: bool,
}

pub fn run(args: Args) -> Result<i32> {
    let mut status = 0;
    let opts = EntryOptions {
        ledger_dir: args.ledger_dir.as_deref(),
        conf_dir: args.conf_dir.as_deref(),
        no_tail: args.no_tail,
    };
    for path in &args.files {
        let result = (|| -> Result<&'static str> {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let planned = plan(path, &bytes, &args.plugin_type, &opts, args.remove)?;
            // A chain at a version the ledger does not serve would fail every ADD in the
            // ledger, first in it (DESIGN §8: do no harm); taking it out always works.
            if !args.remove {
                crate::cni::version::serves_list(&planned.doc)?;
            }
            let dropin = planned.tail_dropin.as_ref().filter(|d| d.changed);
            // A conflist whose chain is all drop-ins keeps its bytes: its head is a
            // drop-in of its own.
            let head = planned.head_dropin.as_ref().filter(|d| d.changed);
            let changed = planned.changed || dropin.is_some() || head.is_some();
            if args.dry_run {
                out!("{}", planned.text);
                for d in [head, dropin].into_iter().flatten() {
                    match &d.want {
                        Some(text) => out!("# {}:\n{text}", d.path.display()),
                        None => outln!("# {}: removed", d.path.display()),
                    }
                }
                return Ok(if changed {
                    "would change (dry run)"
                } else {
                    "unchanged (dry run)"
                });
            }
            if !changed {
                return Ok("unchanged");
            }
            // A head drop-in comes first and goes last, so the chain never has the tail
            // without the head. A drop-in tail goes before the conflist changes and comes
            // after: in between the chain has no tail (its records are untracked), never
            // two.
            if let Some(d) = head.filter(|d| d.want.is_some()) {
                d.apply()?;
            }
            if let Some(d) = dropin.filter(|d| d.want.is_none()) {
                d.apply()?;
            }
            if planned.changed {
                write_replacing(path, planned.text.as_bytes())?;
            }
            if let Some(d) = dropin.filter(|d| d.want.is_some()) {
                d.apply()?;
            }
            if let Some(d) = head.filter(|d| d.want.is_none()) {
                d.apply()?;
            }
            Ok(if args.remove {
                "ledger removed"
            } else {
                "ledger injected"
            })
        })();
        match result {
            Ok(what) => errln!("{}: {what}", path.display()),
            Err(e) => {
                errln!("{}: refused: {e:#}", path.display());
                status = 1;
            }
        }
    }
    Ok(status)
}
