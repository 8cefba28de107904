//! `cni-ledger adopt`: records for attachments in libcni's cache that the ledger lacks.

use crate::libcni::adopt::{self, AdoptAction, Report};
use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_os_t = super::ledger_dir_default())]
    ledger_dir: PathBuf,
    /// libcni's cache directory (its results/ are read).
    #[arg(long, default_value = crate::cni::config::DEFAULT_CNI_CACHE_DIR, value_name = "DIR")]
    cni_cache_dir: PathBuf,
    /// The runtime's CNI conf dir: the networks whose chain holds this ledger are adopted.
    #[arg(long, value_name = "DIR", default_value = crate::cni::config::DEFAULT_CONF_DIR)]
    conf_dir: PathBuf,
    /// Adopt this network's attachments (repeatable) instead of those of the networks in
    /// --conf-dir whose chain holds this ledger.
    #[arg(long = "network", value_name = "NAME")]
    networks: Vec<String>,
    /// The ledger's plugin type (its binary name in the CNI bin dir).
    #[arg(long = "type", default_value = crate::cni::config::DEFAULT_PLUGIN_TYPE)]
    plugin_type: String,
    /// The runtime's plugin dirs, as CNI_PATH of the adopted records (libcni's cache does
    /// not keep it). Default: $CNI_PATH if set, else per record the dirs of
    /// /opt/cni/bin, /usr/lib/cni, /usr/libexec/cni, /usr/local/lib/cni and
    /// /usr/local/libexec/cni that hold its chain's plugins.
    #[arg(long, value_name = "DIRS")]
    cni_path: Option<String>,
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
    let networks = if args.networks.is_empty() {
        adopt::ledger_networks(&args.conf_dir, &args.ledger_dir, &args.plugin_type)?
    } else {
        args.networks.into_iter().collect()
    };
    let cni_path = args
        .cni_path
        .or_else(|| std::env::var("CNI_PATH").ok())
        .filter(|p| !p.is_empty());
    let report = adopt::run(&adopt::Options {
        ledger_dir: args.ledger_dir,
        cache_dir: args.cni_cache_dir,
        networks,
        cni_path,
        dry_run: args.dry_run,
    })?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
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
    outln!(
        "{}{verb} {n}, already recorded {}, unusable {}, left out {}, deferred {}",
        if r.dry_run { "dry run: " } else { "" },
        r.already_recorded,
        r.unusable.len(),
        r.left_out.len(),
        r.deferred.len()
    );
    if r.networks.is_empty() {
        outln!(
            "no network's chain holds this ledger: nothing taken (inject it, or name --network)"
        );
    } else {
        outln!("networks: {}", r.networks.join(", "));
    }
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
                    a.cni_path.clone(),
                    a.cache_file.clone(),
                ]
            })
            .collect();
        outln!();
        super::print_table(
            &[
                "NETWORK",
                "CONTAINER",
                "IFNAME",
                "ACTION",
                "STATE",
                "REASON",
                "CNI_PATH",
                "CACHE FILE",
            ],
            &rows,
        );
    }
    for d in &r.deferred {
        outln!(
            "deferred: {}/{}/{}: nothing at {} and no identity to find it by elsewhere on \
             the node: adopted once a reboot proves it gone",
            d.network,
            d.container_id,
            d.ifname,
            d.netns
        );
    }
    for a in r.adopted.iter().filter(|a| !a.missing_plugins.is_empty()) {
        outln!(
            "warning: {}/{}/{}: plugin(s) {} found in none of {}: its replay will fail",
            a.network,
            a.container_id,
            a.ifname,
            a.missing_plugins.join(", "),
            a.cni_path
        );
    }
    for u in &r.unusable {
        outln!("unusable: {} ({})", u.file, u.reason);
    }
    let mut left: std::collections::BTreeMap<&str, usize> = Default::default();
    for l in &r.left_out {
        *left
            .entry(l.network.as_deref().unwrap_or("(unusable)"))
            .or_default() += 1;
    }
    for (net, n) in left {
        outln!("left out: {n} of network {net} (its chain does not hold this ledger)");
    }
}
