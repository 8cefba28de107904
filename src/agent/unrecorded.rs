//! Attachments the ledger has no record of: made while it was out of the chain (most
//! often), by an ADD under `onLedgerError: warn`, or whose record went other than by
//! their DEL. libcni caches every ADD's result (`<cacheDir>/results/<net>-<cid>-<ifname>`,
//! which names the attachment inside), so an entry of an injected network with no record
//! is one gc could never replay. After every (re)injection those made without the
//! ledger are adopted into it, and what is left is counted and logged.

use crate::ledger::Ledger;
use std::collections::BTreeMap;
use std::path::Path;

/// Per network among `networks`, the libcni cache entries that have no record.
pub fn count_by_network(
    cache_dir: &Path,
    ledger: &Ledger,
    networks: &[String],
) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = networks.iter().map(|n| (n.clone(), 0)).collect();
    let Ok(rd) = std::fs::read_dir(cache_dir.join("results")) else {
        return out;
    };
    for item in rd.flatten() {
        let Some(key) = crate::libcni::cache::attachment_key(&item.path()) else {
            continue;
        };
        let Some(count) = out.get_mut(&key.network) else {
            continue;
        };
        if !matches!(ledger.read(&key.stem()), Ok(Some(_))) {
            *count += 1;
        }
    }
    out
}

/// Runs after every (re)injection: adopts the attachments of the `injected` networks
/// libcni's cache has and the ledger lacks (`cni-ledger adopt`), then counts what is still unrecorded (unusable
/// cache files, keys busy at that moment).
pub fn after_injection(
    cache_dir: &Path,
    ledger: &Ledger,
    networks: &[String],
    injected: std::collections::BTreeSet<String>,
    cni_path: &str,
) -> BTreeMap<String, u64> {
    let opts = crate::libcni::adopt::Options {
        ledger_dir: ledger.root().to_path_buf(),
        cache_dir: cache_dir.to_path_buf(),
        networks: injected,
        // The bin dirs the agent serves are the runtime's.
        cni_path: Some(cni_path.to_string()).filter(|p| !p.is_empty()),
        dry_run: false,
    };
    match crate::libcni::adopt::run(&opts) {
        Ok(r) => {
            let made = r
                .adopted
                .iter()
                .filter(|a| a.action == crate::libcni::adopt::AdoptAction::Adopted)
                .count();
            if made > 0 {
                crate::info!("agent: adopted {made} attachment(s) from libcni's cache");
            }
        }
        Err(e) => crate::error!("agent: adopting from libcni's cache: {e:#}"),
    }
    let counts = count_by_network(cache_dir, ledger, networks);
    for (net, n) in &counts {
        if *n > 0 {
            crate::warn!(
                "agent: network {net}: {n} attachment(s) in libcni's cache ({}) still have no \
                 record (unusable cache files, busy keys, or deferred: a path of this boot \
                 that shows no namespace): gc cannot replay them",
                cache_dir.join("results").display()
            );
        }
    }
    counts
}
