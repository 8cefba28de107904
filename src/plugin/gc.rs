//! CNI 1.1 GC: the runtime names the attachments that are still valid for this network;
//! every other record of the network is stale and its DEL is replayed.

use crate::cni::config::NetConf;
use crate::cni::error::{self, CniError};
use crate::gc;

pub fn gc(conf: &NetConf) -> Result<(), CniError> {
    let list = conf
        .raw
        .get("cni.dev/valid-attachments")
        .or_else(|| conf.raw.get("cni.dev/attachments"))
        .cloned()
        .unwrap_or_else(|| serde_json::json!([]));
    let valid = gc::valid_set(list).map_err(|e| {
        CniError::new(
            error::INVALID_NETWORK_CONFIG,
            "invalid cni.dev/valid-attachments",
            e.to_string(),
        )
    })?;
    let mut opts = gc::Options::new(conf.ledger_dir.clone());
    opts.network = Some(conf.name.clone());
    opts.valid = Some(valid);
    opts.conf_dir = conf.conf_dir.clone();
    opts.grace_secs = conf.gc_grace_secs as i64;
    let report = gc::run(&opts).map_err(|e| CniError::from_anyhow(error::IO_FAILURE, &e))?;
    crate::info!(
        "GC {}: {} stale, {} replayed, {} retrying, {} failed",
        conf.name,
        report.summary.stale,
        report.summary.replayed,
        report.summary.retrying,
        report.summary.failed
    );
    Ok(())
}
