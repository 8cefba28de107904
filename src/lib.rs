//! cni-ledger: a chained CNI plugin that records every ADD durably, and a command-line
//! tool that replays DEL for attachments whose sandboxes vanished (docs/DESIGN.md).

pub mod adopt;
pub mod agent;
pub mod cli;
pub mod cni;
pub mod conflist;
pub mod cri;
pub mod devices;
pub mod faults;
// Their `expect`s state invariants (piped stdio, unpoisoned locks); to be taken out
// when the gc engine gets its own folder (issue 12).
#[allow(clippy::expect_used)]
pub mod gc;
pub mod injection;
pub mod ledger;
pub mod logging;
pub mod plugin;
pub mod record_cache;
#[allow(clippy::expect_used)]
pub mod replay;
pub mod sandbox;
pub mod time;
pub mod workers;
