//! gc at start (the boot run: the network pod may not be up yet; failed replays back off
//! as in every gc run) and every interval after, feeding the metrics.

use super::{Shared, Stop};
use crate::ledger::Ledger;
use std::time::{Duration, Instant};

pub fn run(shared: &Shared, opts: &crate::gc::Options, interval: Duration, stop: &Stop) {
    loop {
        let t0 = Instant::now();
        match crate::gc::run(opts) {
            Ok(report) => shared
                .metrics
                .observe_gc(&report, t0.elapsed().as_secs_f64()),
            Err(e) => {
                crate::error!("agent: gc: {e:#}");
                shared.metrics.observe_gc_error(t0.elapsed().as_secs_f64());
            }
        }
        shared.metrics.observe_ledger(&Ledger::at(&opts.ledger_dir));
        if stop.requested() || stop.sleep(interval) {
            return;
        }
    }
}
