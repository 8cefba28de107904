//! cni-ledger: a chained CNI plugin that records every ADD durably, and a command-line
//! tool that replays DEL for attachments whose sandboxes vanished (docs/DESIGN.md).
//!
//! The modules are layered, each using only those below it; docs/MODULES.md has the
//! layers and what each module owns, and tests/module_graph.rs holds the code to them.

pub mod agent;
pub mod chain;
pub mod cli;
pub mod cni;
pub mod conflist;
pub mod cri;
pub mod devices;
pub mod faults;
pub mod gc;
pub mod hostlocal;
pub mod injection;
pub mod ledger;
pub mod libcni;
pub mod logging;
pub mod metrics;
pub mod node_root;
pub mod plugin;
pub mod process;
pub mod replace;
pub mod sandbox;
pub mod time;
pub mod workers;
