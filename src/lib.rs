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
// The `expect`s in gc (and its replay) state invariants (piped stdio, unpoisoned locks);
// to be taken out now that the gc engine has its own folder (issue 12).
#[allow(clippy::expect_used)]
pub mod gc;
pub mod injection;
pub mod ledger;
pub mod logging;
pub mod plugin;
pub mod sandbox;
pub mod time;
pub mod workers;
