//! Attachments made while the ledger was out of the chain: libcni caches every ADD's
//! result (`<cacheDir>/results/<net>-<cid>-<ifname>`, which names the attachment inside),
//! so an entry of an injected network with no record is one gc could never replay.
//! For now they are counted and logged after every (re)injection; adopting them into
//! the ledger belongs here.

use crate::ledger::{Key, Ledger};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CacheHead {
    kind: String,
    container_id: String,
    if_name: String,
    network_name: String,
}

/// Per network among `networks`, the libcni cache entries that have no record.
pub fn unrecorded(cache_dir: &Path, ledger: &Ledger, networks: &[String]) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = networks.iter().map(|n| (n.clone(), 0)).collect();
    let Ok(rd) = std::fs::read_dir(cache_dir.join("results")) else {
        return out;
    };
    for item in rd.flatten() {
        let Ok(bytes) = crate::ledger::fsio::read_nofollow(&item.path(), 4 << 20) else {
            continue;
        };
        let Ok(head) = serde_json::from_slice::<CacheHead>(&bytes) else {
            continue;
        };
        let Some(count) = out.get_mut(&head.network_name) else {
            continue;
        };
        if head.kind != "cniCacheV1" {
            continue;
        }
        let key = Key {
            network: head.network_name,
            container_id: head.container_id,
            ifname: head.if_name,
        };
        if !matches!(ledger.read(&key.stem()), Ok(Some(_))) {
            *count += 1;
        }
    }
    out
}

/// Runs after every (re)injection; the one place adoption will replace.
pub fn after_injection(
    cache_dir: &Path,
    ledger: &Ledger,
    networks: &[String],
) -> BTreeMap<String, u64> {
    let counts = unrecorded(cache_dir, ledger, networks);
    for (net, n) in &counts {
        if *n > 0 {
            crate::warn!(
                "agent: network {net}: {n} attachment(s) in libcni's cache ({}) have no record: \
                 made while the ledger was out of the chain, gc cannot replay them",
                cache_dir.join("results").display()
            );
        }
    }
    counts
}
