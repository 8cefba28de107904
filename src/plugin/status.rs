//! STATUS: the plugin is available only while the ledger can be written, unless the
//! conf lets ADD go on without it (`onLedgerError: warn`).

use crate::cni::config::{NetConf, OnLedgerError};
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
    let writable = Ledger::open_for_write(&conf.ledger_dir)
        .map_err(unavailable)
        .and_then(|ledger| ledger.probe_writable().map_err(unavailable));
    match writable {
        // ADD goes on without a record under `warn`: a STATUS that said "not available"
        // would stop the runtime from starting pods ADD would have let through
        // (containerd 2.x turns it into NetworkReady=false, the node goes NotReady).
        Err(e) if conf.on_ledger_error == OnLedgerError::Warn => {
            // Logged as ADD logs it: an error let through must reach the runtime's log.
            crate::error!(
                "STATUS {}: {}: {}; available anyway (onLedgerError=warn)",
                conf.name,
                e.msg,
                e.details
            );
            Ok(())
        }
        other => other,
    }
}
