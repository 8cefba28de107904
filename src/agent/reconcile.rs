//! One reconcile pass: the binary installed in each CNI bin dir, the ledger dir usable,
//! the ledger first in each chosen conflist, the attachments made while it was not
//! counted, and the status `/readyz` shows, each a step of its own. A pass is
//! idempotent: a file that already is as the agent left it costs one read.

use super::conflists::Conflists;
use super::install::Installer;
use super::{conf, readiness, unrecorded, ConfStatus, Options, Shared, Status};
use crate::ledger::Ledger;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub struct Reconciler<'a> {
    opts: &'a Options,
    shared: &'a Shared,
    conflists: Conflists<'a>,
    installer: Installer,
    /// The files the last pass showed in the metrics.
    shown: Vec<PathBuf>,
    /// The unrecorded count has run once (at start it runs even when nothing was written).
    gap_counted: bool,
    /// The drop-in directories of the chosen networks, for the watch.
    dropin_dirs: Vec<PathBuf>,
}

/// What the conflists step found.
#[derive(Default)]
struct ConflistsPass {
    /// When the pass wants to run again at the latest (a backoff ending, a fight to settle).
    wake: Option<Instant>,
    wrote: bool,
    networks: Vec<String>,
    /// Only a network whose chain holds the ledger has its attachments adopted: no DEL
    /// of any other would ever reach the record.
    injected_networks: BTreeSet<String>,
}

impl<'a> Reconciler<'a> {
    pub fn new(opts: &'a Options, shared: &'a Shared) -> Reconciler<'a> {
        Reconciler {
            opts,
            shared,
            conflists: Conflists::new(opts, shared),
            installer: Installer::new(
                PathBuf::from("/proc/self/exe"),
                &opts.plugin_type,
                &opts.bin_dirs,
            ),
            shown: Vec::new(),
            gap_counted: false,
            dropin_dirs: Vec::new(),
        }
    }

    /// One pass over binary, ledger dir and conflists; returns when it wants to run
    /// again at the latest (a backoff ending, a fight to settle).
    pub fn pass(&mut self) -> Option<Instant> {
        let now = Instant::now();
        let mut status = Status {
            checked: true,
            ..Status::default()
        };
        status.binaries = self.install_binaries();
        status.ledger_error = readiness::ledger_usable(&self.opts.gc.ledger_dir)
            .err()
            .map(|e| format!("{e:#}"));
        let chosen = self.choose(&mut status);
        self.forget_unchosen(&chosen.files);
        let pass = self.keep_conflists(&chosen, now, &mut status);
        let wake = pass.wake;
        self.dropin_dirs = pass
            .networks
            .iter()
            .map(|n| crate::conflist::dropin_dir(&self.opts.conf_dir, n))
            .collect();
        self.count_gap(pass);
        if let Ok(mut s) = self.shared.status.lock() {
            *s = status;
        }
        wake
    }

    /// The drop-in directories of the networks the last pass kept (whether or not they
    /// exist): a change in one changes the chain the runtime loads.
    pub fn dropin_dirs(&self) -> &[PathBuf] {
        &self.dropin_dirs
    }

    /// The plugin binary in each CNI bin dir: None where it is in place, else why not.
    fn install_binaries(&mut self) -> Vec<(PathBuf, Option<String>)> {
        let mut binaries = Vec::new();
        for (dir, r) in self.installer.ensure() {
            let label = dir.display().to_string();
            self.shared
                .metrics
                .binary_installed
                .with_label_values(&[&label])
                .set(r.is_ok() as i64);
            if let Err(e) = &r {
                crate::error!("agent: installing into {label}: {e:#}");
            }
            binaries.push((dir, r.err().map(|e| format!("{e:#}"))));
        }
        binaries
    }

    /// The conflists to keep the ledger in; none (and why, in `status`) when there is
    /// nothing to choose. Each runtime rule's choice goes into `status` and the metrics.
    fn choose(&self, status: &mut Status) -> conf::Chosen {
        let chosen = match conf::chosen(&self.opts.conf_dir, &self.opts.choice, &self.opts.bin_dirs)
        {
            Ok(c) => c,
            Err(e) => {
                status.conf_error = Some(format!("{e:#}"));
                conf::Chosen::default()
            }
        };
        if chosen.files.is_empty() && status.conf_error.is_none() {
            status.conf_error = Some(format!(
                "no network configuration in {}{}",
                self.opts.conf_dir.display(),
                match &self.opts.choice {
                    conf::Choice::Named(n) => format!(" named {n}"),
                    _ => String::new(),
                }
            ));
        }
        let m = &self.shared.metrics;
        // Whole families each pass: a rule's earlier file must not linger as chosen.
        m.conflist_chosen.reset();
        m.choice_unknown.reset();
        for r in &chosen.rules {
            let (runtime, libcni) = (r.runtime.as_str(), r.libcni.as_str());
            if let Some(f) = &r.file {
                let label = f.display().to_string();
                m.conflist_chosen
                    .with_label_values(&[label.as_str(), runtime, libcni])
                    .set(1);
            }
            m.choice_unknown
                .with_label_values(&[runtime, libcni])
                .set(i64::from(!r.unsure.is_empty()));
        }
        if chosen.rules.iter().any(|r| !r.unsure.is_empty()) {
            crate::warn!(
                "agent: cannot tell which conflist some runtimes load; keeping the ledger in each it may be ({})",
                chosen
                    .rules
                    .iter()
                    .flat_map(|r| r.unsure.iter().map(|(f, why)| format!("{}: {why}", f.display())))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        status.rules = chosen.rules.clone();
        chosen
    }

    /// Files no longer chosen leave the per-file metrics.
    fn forget_unchosen(&self, chosen: &[PathBuf]) {
        for gone in self.shown.iter().filter(|p| !chosen.contains(p)) {
            let label = gone.display().to_string();
            let _ = self.shared.metrics.injected.remove_label_values(&[&label]);
            let _ = self.shared.metrics.fight.remove_label_values(&[&label]);
            let _ = self
                .shared
                .metrics
                .unsupported_version
                .remove_label_values(&[&label]);
        }
    }

    /// Brings each chosen file into shape, and shows each in the metrics and `status`.
    fn keep_conflists(
        &mut self,
        chosen: &conf::Chosen,
        now: Instant,
        status: &mut Status,
    ) -> ConflistsPass {
        let mut pass = ConflistsPass::default();
        let mut shown = Vec::new();
        for path in &chosen.files {
            // A file a runtime uses (or may): failing on it fails readiness.
            let runtimes = chosen.used.contains(path);
            let done = self.conflists.reconcile_file(path, now);
            pass.wrote |= done.wrote;
            if done.injected {
                // With a tail, the chain's series exist from here on (a rate must see
                // the first ADD).
                if let (Some(net), false) = (&done.network, self.opts.no_tail) {
                    self.shared.metrics.zero_chain_series(net);
                }
                pass.injected_networks.extend(done.network.clone());
            }
            pass.networks.extend(done.network);
            // one() made the state for this file.
            let Some(st) = self.conflists.state(&done.file) else {
                continue;
            };
            if let Some(until) = st.revert_backoff.waiting_until(now) {
                pass.wake = Some(pass.wake.map_or(until, |w| w.min(until)));
            }
            if st.revert_backoff.fighting() {
                let settle = now + Duration::from_secs(1);
                pass.wake = Some(pass.wake.map_or(settle, |w| w.min(settle)));
            }
            let label = done.file.display().to_string();
            let m = &self.shared.metrics;
            m.injected
                .with_label_values(&[&label])
                .set(done.injected as i64);
            m.fight
                .with_label_values(&[&label])
                .set(st.revert_backoff.fighting() as i64);
            m.unsupported_version
                .with_label_values(&[&label])
                .set(st.unsupported.is_some() as i64);
            m.reverts.with_label_values(&[&label]).inc_by(0);
            m.injections.with_label_values(&[&label]).inc_by(0);
            status.conflists.push(ConfStatus {
                file: done.file.clone(),
                injected: done.injected,
                fighting: st.revert_backoff.fighting(),
                error: st.error.clone(),
                unsupported: st.unsupported.clone(),
                runtimes,
            });
            shown.push(done.file);
        }
        self.shown = shown;
        pass
    }

    /// Counts the attachments libcni's cache knows and the ledger does not, after a
    /// write and once at start.
    fn count_gap(&mut self, pass: ConflistsPass) {
        if !(pass.wrote || (!self.gap_counted && !pass.networks.is_empty())) {
            return;
        }
        self.gap_counted = true;
        let counts = unrecorded::after_injection(
            &self.opts.gc.cache_dir,
            &Ledger::at(&self.opts.gc.ledger_dir),
            &pass.networks,
            pass.injected_networks,
            &std::env::join_paths(&self.opts.bin_dirs)
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        for (net, n) in counts {
            self.shared
                .metrics
                .unrecorded
                .with_label_values(&[&net])
                .set(n as i64);
        }
    }
}
