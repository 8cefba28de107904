//! gc at start (the boot run: the network pod may not be up yet; failed replays back off
//! as in every gc run) and every interval after, feeding the metrics. Before each run
//! the CRI runtimes are asked for their pod sandboxes, so no record is judged by a list
//! older than itself.

use super::{conf, Choice, CriEndpoints, Options, Shared, Stop};
use crate::ledger::Ledger;
use std::path::Path;
use std::time::Instant;

pub fn run(shared: &Shared, opts: &Options, stop: &Stop) {
    let mut seen = Seen::default();
    loop {
        shared.health.beat(&shared.health.gc);
        let t0 = Instant::now();
        let mut gc = opts.gc.clone();
        gc.cri = ask_runtimes(opts, shared, &mut seen, stop);
        // Stopped while a runtime was asked: no run to start, nothing to observe.
        if stop.requested() {
            return;
        }
        let mut left = None;
        match crate::gc::run(&gc) {
            Ok(mut report) => {
                shared
                    .metrics
                    .observe_gc(&report, t0.elapsed().as_secs_f64());
                left = report.records_left.take();
                if let Ok(mut refused) = shared.cri_refused.lock() {
                    *refused = report.cri_refused;
                }
            }
            Err(e) => {
                crate::error!("agent: gc: {e:#}");
                shared.metrics.observe_gc_error(t0.elapsed().as_secs_f64());
            }
        }
        // The run's scan counted the records it left; only a run that scanned none
        // leaves it to a walk of the ledger here. Failed-left ones are the watcher's.
        let ledger = Ledger::at(&opts.gc.ledger_dir);
        let runtime_ranges = match left {
            Some(left) => shared.metrics.observe_records_left(&ledger, left, false),
            None => shared.metrics.observe_ledger(&ledger),
        };
        headroom(shared, opts, &runtime_ranges);
        if stop.requested() || stop.sleep(opts.gc_interval) {
            return;
        }
    }
}

/// What the last run found, so that a change is logged once, not every run.
#[derive(Default)]
struct Seen {
    endpoints: Option<Vec<String>>,
    not_cri: Vec<String>,
}

/// The runtimes' judgement for this run (None: no runtime, or none that may judge),
/// with their answers in the metrics.
fn ask_runtimes(
    opts: &Options,
    shared: &Shared,
    seen: &mut Seen,
    stop: &Stop,
) -> Option<crate::cri::Judgement> {
    let endpoints = endpoints(opts);
    if seen.endpoints.as_ref() != Some(&endpoints) {
        if endpoints.is_empty() {
            crate::info!("agent: no CRI runtime to ask; records are judged without one");
        } else {
            crate::info!("agent: asking the CRI runtime at {}", endpoints.join(", "));
        }
        seen.endpoints = Some(endpoints.clone());
    }
    let consulted = if endpoints.is_empty() {
        None
    } else {
        // None: stopping, so nothing is observed of a call given up.
        Some(consult(opts, &endpoints, stop)?)
    };
    let not_cri = consulted.as_ref().map_or(&[][..], |c| &c.not_cri[..]);
    if not_cri != seen.not_cri.as_slice() {
        for e in not_cri {
            crate::info!(
                "agent: {e} serves no CRI RuntimeService (a containerd with its CRI plugin off): not a runtime of pods; left out"
            );
        }
        seen.not_cri = not_cri.to_vec();
    }
    // No runtime now: no `cni_ledger_cri_up` left from one that went away.
    let answers = consulted.as_ref().map_or(&[][..], |c| &c.answers[..]);
    shared.metrics.observe_cri(answers);
    consulted.and_then(|c| c.judgement)
}

fn endpoints(opts: &Options) -> Vec<String> {
    match &opts.cri {
        CriEndpoints::Off => Vec::new(),
        CriEndpoints::Given(e) => e.clone(),
        // The agent runs in the node's root (--node-root): the node's own sockets.
        CriEndpoints::Auto => crate::cri::discover(Path::new("/")),
    }
}

/// The runtimes' word on the networks concerned: the ones named, else the chosen
/// conflists' that the runtime says it serves; None once `stop` is requested, so a hung
/// runtime holds a stopping agent for a poll interval, not the CRI timeout.
fn consult(opts: &Options, endpoints: &[String], stop: &Stop) -> Option<crate::cri::Consulted> {
    use crate::cri::Served;
    // Named networks are judged as named; otherwise the runtimes say which they serve.
    let (networks, reported) = if opts.cri_networks.is_empty() {
        let nets =
            conf::networks(&opts.conf_dir, &opts.choice, &opts.bin_dirs).unwrap_or_else(|e| {
                crate::error!("agent: {e:#}; nothing is judged by sandbox lists this run");
                Vec::new()
            });
        (nets, true)
    } else {
        (opts.cri_networks.clone(), false)
    };
    if networks.is_empty() {
        return Some(crate::cri::Consulted::default());
    }
    let discovered = opts.cri == CriEndpoints::Auto;
    let default_network = conf::networks(&opts.conf_dir, &Choice::First, &opts.bin_dirs)
        .ok()
        .and_then(|n| n.into_iter().next());
    let served = if reported {
        Served::Reported {
            conf_dir: &opts.conf_dir,
            default_network: default_network.as_deref(),
            discovered,
        }
    } else {
        Served::Any
    };
    crate::cri::consult_until(
        endpoints,
        &networks,
        served,
        discovered,
        crate::cri::TIMEOUT,
        &stop.flag(),
    )
}

/// Host-local's headroom in the conf dir's networks.
fn headroom(shared: &Shared, opts: &Options, runtime: &crate::hostlocal::RuntimeRanges) {
    match crate::conflist::loadable(&opts.conf_dir) {
        Ok(confs) => shared
            .metrics
            .observe_confs_headroom(&confs, runtime, false),
        Err(e) => crate::debug!("agent: headroom: {e:#}"),
    }
}
