//! `cni-ledger adopt`: records for attachments in libcni's cache that the ledger lacks.

use crate::adopt::{self, AdoptAction, Report};
use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_os_t = super::ledger_dir_default())]
    ledger_dir: PathBuf,
    /// libcni's cache directory (its results/ are read).
    #[arg(long, default_value = crate::cni::config::DEFAULT_CNI_CACHE_DIR, value_name = "DIR")]
    cni_cache_dir: PathBuf,
    /// CNI_PATH for replays of adopted records (libcni's cache does not keep it).
    #[arg(long, default_value = "/opt/cni/bin", value_name = "DIRS")]
    cni_path: String,
    /// Report what would be adopted; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Append log lines here instead of stderr.
    #[arg(long, value_name = "FILE")]
    log_file: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<i32> {
    crate::logging::init(args.log_file.as_deref());
    let report = adopt::run(&adopt::Options {
        ledger_dir: args.ledger_dir,
        cache_dir: args.cni_cache_dir,
        cni_path: args.cni_path,
        dry_run: args.dry_run,
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(&report);
    }
    // Unusable cache files need an operator's look, as damaged records do.
    Ok(if report.unusable.is_empty() { 0 } else { 1 })
}

fn print_human(r: &Report) {
    let verb = if r.dry_run { "would adopt" } else { "adopted" };
    let n = r
        .adopted
        .iter()
        .filter(|a| match a.action {
            AdoptAction::Adopted | AdoptAction::WouldAdopt => true,
            AdoptAction::Busy | AdoptAction::Exists | AdoptAction::Gone => false,
        })
        .count();
    println!(
        "{}{verb} {n}, already recorded {}, unusable {}",
        if r.dry_run { "dry run: " } else { "" },
        r.already_recorded,
        r.unusable.len()
    );
    if !r.adopted.is_empty() {
        let rows: Vec<Vec<String>> = r
            .adopted
            .iter()
            .map(|a| {
                vec![
                    a.network.clone(),
                    a.container_id.clone(),
                    a.ifname.clone(),
                    a.action.to_string(),
                    a.state.to_string(),
                    a.reason.unwrap_or("-").to_string(),
                    a.cache_file.clone(),
                ]
            })
            .collect();
        println!();
        super::print_table(
            &[
                "NETWORK",
                "CONTAINER",
                "IFNAME",
                "ACTION",
                "STATE",
                "REASON",
                "CACHE FILE",
            ],
            &rows,
        );
    }
    for u in &r.unusable {
        println!("unusable: {} ({})", u.file, u.reason);
    }
}
