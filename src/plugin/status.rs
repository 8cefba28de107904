//! STATUS: the plugin is available only while the ledger can be written.

use crate::cni::config::NetConf;
use crate::cni::error::{self, CniError};
use crate::ledger::Ledger;

pub fn status(conf: &NetConf) -> Result<(), CniError> {
    let unavailable = |e: anyhow::Error| {
        CniError::new(
            error::NOT_AVAILABLE,
            "the ledger cannot be written",
            format!("{e:#}"),
        )
    };
    let ledger = Ledger::open_for_write(&conf.ledger_dir).map_err(unavailable)?;
    ledger.probe_writable().map_err(unavailable)
}
