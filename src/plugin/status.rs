//! STATUS: the plugin is available only while the ledger can be written.

use crate::cni::config::NetConf;
use crate::cni::error::{self, CniError};
use crate::ledger::{fsio, Ledger};

pub fn status(conf: &NetConf) -> Result<(), CniError> {
    let unavailable = |e: anyhow::Error| {
        CniError::new(
            error::NOT_AVAILABLE,
            "the ledger cannot be written",
            format!("{e:#}"),
        )
    };
    let ledger = Ledger::open_for_write(&conf.ledger_dir).map_err(unavailable)?;
    let dir = ledger.records_dir();
    let name = format!("{}status-probe.{}", fsio::TMP_PREFIX, std::process::id());
    std::fs::write(dir.join(&name), b"")
        .and_then(|()| std::fs::remove_file(dir.join(&name)))
        .map_err(|e| {
            unavailable(anyhow::Error::new(e).context(format!("probing {}", dir.display())))
        })
}
