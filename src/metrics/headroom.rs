//! Address headroom of host-local IPAM, as the metrics carry it: for each range a
//! network's host-local hands addresses out of, how many it can hand out (`size`) and
//! how many its data dir holds reserved (`used`), so that an operator is warned before
//! a node runs out. host-local's own rules (its ranges, defaults, data dir, the ranges a
//! runtime passes) are src/hostlocal.rs.

pub use crate::hostlocal::RuntimeRanges;
use crate::hostlocal::{pools, HeadroomError, Pool};
use serde_json::Value;
use std::collections::HashSet;
use std::path::PathBuf;

/// One range's figures, as the metrics carry them.
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    pub network: String,
    /// `<rangeStart>-<rangeEnd>`: ranges of a network never overlap, so this names one.
    pub range: String,
    pub used: u128,
    pub size: u128,
}

impl Usage {
    /// The free share, 0 to 1.
    pub fn headroom(&self) -> f64 {
        if self.size == 0 {
            return 0.0;
        }
        self.size.saturating_sub(self.used) as f64 / self.size as f64
    }
}

/// Counts the pool's reservations per range: one listing of its data dir, no file read.
pub fn measure(pool: &Pool) -> Result<Vec<Usage>, HeadroomError> {
    let reserved = pool.reserved()?;
    Ok(pool
        .ranges
        .iter()
        .map(|r| Usage {
            network: pool.network.clone(),
            range: r.label(),
            used: reserved.iter().filter(|ip| r.contains(**ip)).count() as u128,
            size: r.size(),
        })
        .collect())
}

/// Headroom of every network of these configurations (a conf dir's that load, in the
/// runtime's order) that uses host-local, each network once (the first file that names
/// it), with what could not be measured said why.
pub fn of_confs(confs: &[(PathBuf, Value)], runtime: &RuntimeRanges) -> (Vec<Usage>, Vec<String>) {
    let mut usages = Vec::new();
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    for (_, doc) in confs {
        let name = doc.get("name").and_then(Value::as_str).unwrap_or_default();
        if !seen.insert(name.to_string()) {
            continue;
        }
        let (pools, errors) = pools(doc, runtime);
        problems.extend(errors.iter().map(ToString::to_string));
        for pool in pools {
            match measure(&pool) {
                Ok(u) => usages.extend(u),
                Err(e) => problems.push(e.to_string()),
            }
        }
    }
    (usages, problems)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostlocal::Range;
    use serde_json::json;

    #[test]
    fn used_counts_address_files_only_and_per_range() {
        let tmp = std::env::temp_dir().join(format!("headroom-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let conf = json!({"name": "pods", "plugins": [{"type": "bridge", "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": "10.0.0.0/29"}], [{"subnet": "fd00::/124"}]],
            "dataDir": tmp.to_str().unwrap()
        }}]});
        let (pools, errors) = pools(&conf, &RuntimeRanges::default());
        assert!(errors.is_empty());
        // No data dir yet: nothing reserved.
        let u = measure(&pools[0]).unwrap();
        assert_eq!((u[0].used, u[0].size), (0, 5));
        assert_eq!(u[0].headroom(), 1.0);
        let dir = tmp.join("pods");
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "10.0.0.2",
            "10.0.0.3",
            "10.0.0.6",
            "10.0.0.9", // another subnet's: not this range's
            "fd00::2",
            "lock",
            "last_reserved_ip.0",
            "last_reserved_ip.1",
            "10.0.0.4.tmp",
        ] {
            std::fs::write(dir.join(name), "cid\r\neth0").unwrap();
        }
        let u = measure(&pools[0]).unwrap();
        assert_eq!(u[0].range, "10.0.0.1-10.0.0.6");
        assert_eq!((u[0].used, u[0].size), (3, 5));
        assert!((u[0].headroom() - 0.4).abs() < 1e-9);
        assert_eq!(u[1].range, "fd00::1-fd00::f");
        assert_eq!((u[1].used, u[1].size), (1, 14));
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn each_network_once_the_first_configuration_naming_it() {
        let conf = |subnet: &str| {
            json!({"cniVersion": "1.0.0", "name": "pods", "plugins": [{"type": "bridge",
                "ipam": {"type": "host-local", "subnet": subnet, "dataDir": "/nonexistent"}}]})
        };
        let confs = [
            (PathBuf::from("10-pods.conflist"), conf("10.0.0.0/24")),
            (PathBuf::from("20-old.conflist"), conf("10.9.0.0/24")),
        ];
        let (usages, problems) = of_confs(&confs, &RuntimeRanges::default());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(usages.len(), 1);
        assert_eq!(usages[0].range, "10.0.0.1-10.0.0.254");
        assert_eq!(usages[0].used, 0, "no data dir: nothing reserved yet");
    }

    #[test]
    fn ranges_a_runtime_passed_count_where_the_plugin_takes_them() {
        let mut runtime = RuntimeRanges::default();
        let passed = json!([[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd10::/120"}]]);
        // Every pod of the node is given the same ranges: each counts once.
        runtime.add("pods", Some(&passed));
        runtime.add("pods", Some(&passed));
        runtime.add("pods", None);
        runtime.add("other", Some(&json!([[{"subnet": "10.9.0.0/24"}]])));
        let mut second_scan = RuntimeRanges::default();
        second_scan.add("pods", Some(&json!([[{"subnet": "10.244.1.0/24"}]])));
        runtime.merge(second_scan);
        let conf = |caps: Value, ipam: Value| {
            json!({"name": "pods", "plugins": [
                {"type": "cni-ledger", "capabilities": {"ipRanges": true}},
                {"type": "bridge", "capabilities": caps, "ipam": ipam}]})
        };
        let labels = |conf: &Value| -> Vec<String> {
            let (pools, errors) = pools(conf, &runtime);
            assert!(errors.is_empty(), "{errors:?}");
            pools[0].ranges.iter().map(Range::label).collect()
        };
        // A pod CIDR only the runtime knows: without the records there would be no range.
        let only_runtime = conf(json!({"ipRanges": true}), json!({"type": "host-local"}));
        assert_eq!(
            labels(&only_runtime),
            ["10.244.1.1-10.244.1.254", "fd10::1-fd10::ff"]
        );
        // host-local puts the runtime's range sets before its own; one configured
        // alike is one range, one series.
        let both = conf(
            json!({"ipRanges": true}),
            json!({"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "10.0.0.0/24"}]]}),
        );
        assert_eq!(
            labels(&both),
            [
                "10.244.1.1-10.244.1.254",
                "fd10::1-fd10::ff",
                "10.0.0.1-10.0.0.254"
            ]
        );
        // A plugin that does not declare the capability is never given them.
        let undeclared = conf(
            json!({"portMappings": true}),
            json!({"type": "host-local", "subnet": "10.0.0.0/24"}),
        );
        assert_eq!(labels(&undeclared), ["10.0.0.1-10.0.0.254"]);
    }
}
