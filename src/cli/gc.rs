//! `cni-ledger gc`: replay DEL for every stale record and report what became of it.

use crate::gc::{self, Report};
use anyhow::{Context, Result};
use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_os_t = super::ledger_dir_default())]
    ledger_dir: PathBuf,
    /// Decide and report, but change nothing and run no plugin.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON object instead of the human summary.
    #[arg(long)]
    json: bool,
    /// Ignore backoff: retry every stale record now.
    #[arg(long)]
    now: bool,
    /// Also retry records marked failed.
    #[arg(long)]
    retry_failed: bool,
    /// Only records of this network.
    #[arg(long)]
    network: Option<String>,
    #[command(flatten)]
    replay: super::replay_flags::ReplayFlags,
    /// JSON array of {"containerID","ifname"} still valid in the --network NAME it
    /// requires: that network's unlisted records are stale, no other network's.
    // A list names no network: applied to all, it would make every record of every
    // other network stale at once.
    #[arg(long, value_name = "FILE", requires = "network")]
    valid_attachments: Option<PathBuf>,
    /// Where to look for today's conflist when neither snapshot nor cache has one.
    #[arg(long, value_name = "DIR")]
    conf_dir: Option<PathBuf>,
    /// Append log lines here instead of stderr.
    #[arg(long, value_name = "FILE")]
    log_file: Option<PathBuf>,
    /// Ask this CRI runtime (unix:///PATH) which pod sandboxes exist: records of the
    /// --cri-network networks whose container ID is none of them, and that have no
    /// namespace path to show them live, are stale.
    #[arg(long, value_name = "unix:///PATH", requires = "cri_network")]
    cri_endpoint: Option<String>,
    /// A network the CRI runtime serves (repeatable).
    #[arg(long, value_name = "NAME", requires = "cri_endpoint")]
    cri_network: Vec<String>,
    /// Also write the run's metrics here in node_exporter's textfile format (the agent's
    /// /metrics names; counters, and the last completed run's time, continue from the
    /// file's previous values), by rename.
    #[arg(long, value_name = "PATH")]
    metrics_file: Option<PathBuf>,
}

fn read_valid(path: &PathBuf) -> Result<HashSet<(String, String)>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let list = serde_json::from_slice(&bytes)
        .and_then(gc::valid_set)
        .with_context(|| {
            format!(
                "{}: expected [{{\"containerID\",\"ifname\"}}]",
                path.display()
            )
        })?;
    Ok(list)
}

pub fn run(args: Args) -> Result<i32> {
    crate::logging::init(args.log_file.as_deref());
    let mut opts = gc::Options::new(args.ledger_dir);
    opts.dry_run = args.dry_run;
    opts.ignore_backoff = args.now;
    opts.retry_failed = args.retry_failed;
    opts.network = args.network;
    opts.valid = args
        .valid_attachments
        .as_ref()
        .map(read_valid)
        .transpose()?;
    opts.conf_dir = args.conf_dir;
    args.replay.apply(&mut opts)?;
    // The runtime's list is fetched before the scan, so a record is never judged by a
    // list older than itself (and records made since are not judged by it at all).
    let mut cri = None;
    let mut answers = Vec::new();
    if let Some(endpoint) = &args.cri_endpoint {
        crate::cri::socket_path(endpoint)?;
        let consulted = crate::cri::consult(
            std::slice::from_ref(endpoint),
            &args.cri_network,
            crate::cri::Served::Any,
            false,
            crate::cri::TIMEOUT,
        );
        opts.cri = consulted.judgement;
        answers = consulted.answers;
        let sandboxes = answers.first().and_then(|a| a.sandboxes);
        cri = Some(gc::CriSummary {
            endpoint: endpoint.clone(),
            answered: sandboxes.is_some(),
            sandboxes,
        });
    }
    let started = std::time::Instant::now();
    let mut result = gc::run(&opts);
    if let Some(path) = &args.metrics_file {
        let left = result.as_mut().ok().and_then(|r| r.records_left.take());
        write_metrics(
            path,
            &opts,
            result.as_ref().ok(),
            left,
            &answers,
            started.elapsed(),
        );
    }
    let mut report = result?;
    report.cri = cri;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(&report);
    }
    Ok(report.exit_code())
}

fn write_metrics(
    path: &std::path::Path,
    opts: &gc::Options,
    report: Option<&Report>,
    left: Option<gc::RecordsLeft>,
    cri: &[crate::cri::Answer],
    took: Duration,
) {
    let m = crate::metrics::Metrics::new();
    m.observe_cri(cri);
    match report {
        Some(r) => m.observe_gc(r, took.as_secs_f64()),
        None => m.observe_gc_error(took.as_secs_f64()),
    }
    let ledger = crate::ledger::Ledger::at(&opts.ledger_dir);
    // The run's own scan counted what it left; a run that scanned nothing (an error,
    // no ledger) leaves the counting to one walk here, as before.
    let runtime_ranges = match left {
        Some(left) => m.observe_records_left(&ledger, left, true),
        None => m.observe_ledger_and_failed_left(&ledger, opts.chain_left_after_secs),
    };
    let conf_dir = opts
        .conf_dir
        .as_deref()
        .unwrap_or(std::path::Path::new(crate::cni::config::DEFAULT_CONF_DIR));
    match crate::conflist::loadable(conf_dir) {
        Ok(confs) => m.observe_confs_headroom(&confs, &runtime_ranges, true),
        Err(e) => crate::warn!("gc: headroom: {e:#}"),
    }
    if let Err(e) = m.write_file(path) {
        crate::error!("gc: writing metrics to {}: {e:#}", path.display());
    }
}

fn print_human(r: &Report) {
    let s = &r.summary;
    let (done, n) = if r.dry_run {
        ("would replay", s.would_replay)
    } else {
        ("replayed", s.replayed)
    };
    // The unreadable count only when there are some: the line stays as it always was.
    let unreadable = match s.unreadable {
        0 => String::new(),
        n => format!(", unreadable {n}"),
    };
    let newer = match s.newer {
        0 => String::new(),
        n => format!(", newer format {n}"),
    };
    outln!(
        "{}stale {}, {} {}, retrying {}, failed {}, skipped {}, live {}, damaged {}{unreadable}{newer}",
        if r.dry_run { "dry run: " } else { "" },
        s.stale,
        done,
        n,
        s.retrying,
        s.failed,
        s.skipped,
        s.live,
        s.damaged
    );
    if let Some(c) = &r.cri {
        match c.sandboxes {
            Some(n) => outln!("cri: {} lists {n} pod sandbox(es)", c.endpoint),
            None => outln!(
                "cri: {} did not answer; nothing judged by it this run",
                c.endpoint
            ),
        }
    }
    if let Some(why) = &r.cri_refused {
        outln!("cri: {why}");
    }
    for h in &r.held {
        outln!(
            "live: {}/{}/{}: {} not seen from here, namespace {}",
            h.network,
            h.container_id,
            h.ifname,
            h.netns,
            h.held_by
        );
    }
    if !r.records.is_empty() {
        let rows: Vec<Vec<String>> = r
            .records
            .iter()
            .map(|rec| {
                let detail = match rec.action {
                    gc::Action::Replayed => format!(
                        "via {} ({}){}",
                        rec.config_source.map_or("-", gc::ConfigSource::as_str),
                        rec.plugins
                            .iter()
                            .map(|p| p.plugin_type.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        if rec.devices.is_empty() {
                            String::new()
                        } else {
                            format!(
                                "; devices given back: {}",
                                crate::devices::state::summary(&rec.devices)
                            )
                        }
                    ),
                    gc::Action::Retrying
                    | gc::Action::Failed
                    | gc::Action::SkipBackoff
                    | gc::Action::SkipFailed => format!(
                        "try {} {}{}",
                        rec.attempts,
                        rec.last_error.as_deref().unwrap_or(""),
                        rec.next_attempt_at
                            .as_deref()
                            .filter(|_| !matches!(
                                rec.action,
                                gc::Action::Failed | gc::Action::SkipFailed
                            ))
                            .map(|t| format!("; next at {t}"))
                            .unwrap_or_default()
                    ),
                    _ => String::new(),
                };
                vec![
                    rec.network.clone(),
                    rec.container_id.clone(),
                    rec.ifname.clone(),
                    rec.reason.as_str().to_string(),
                    rec.action.to_string(),
                    detail,
                ]
            })
            .collect();
        outln!();
        super::print_table(
            &[
                "NETWORK",
                "CONTAINER",
                "IFNAME",
                "REASON",
                "ACTION",
                "DETAIL",
            ],
            &rows,
        );
    }
    for u in &r.unreadable {
        outln!(
            "unreadable: {} ({}); left in place, read again next run",
            u.file,
            u.error
        );
    }
    for n in &r.newer {
        outln!("newer: {} (format {}): {}", n.file, n.format, n.reason);
    }
    for d in &r.damaged {
        outln!(
            "damaged: {} ({}){}",
            d.file,
            d.reason,
            d.quarantined_to
                .as_ref()
                .map(|q| format!(" -> {q}"))
                .unwrap_or_default()
        );
    }
}
