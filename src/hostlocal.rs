//! host-local IPAM's allocator, as far as the ledger needs it (the address headroom of
//! src/metrics/headroom.rs): which ranges a network's host-local hands addresses out
//! of, and which addresses its data dir holds reserved. Its rules, as it applies them:
//! - the ranges are the ipam's `ranges` (a list of range sets, each a list of ranges),
//!   preceded by the old single-range keys (`subnet`, `rangeStart`, `rangeEnd`,
//!   `gateway`) when `subnet` is given;
//! - a range's subnet must be a network address (no host bits) with at least two host
//!   bits; `rangeStart` defaults to the network address + 1, `rangeEnd` to the last
//!   address (for IPv4 the one before the broadcast address), both inside the subnet;
//! - `gateway` defaults to the network address + 1 and is never handed out;
//! - reservations are files in `<dataDir>/<network name>/` (`dataDir` defaults to
//!   `/var/lib/cni/networks`) named by the address; `last_reserved_ip.<n>` and `lock`
//!   live there too and are not reservations.
//!
//! - a plugin that declares the `ipRanges` capability also gets the ranges the runtime
//!   passes (`runtimeConfig.ipRanges`), as range sets put before its own: a node whose
//!   pod CIDR comes from the runtime has them only there. They are known from the
//!   records (the ledger records the runtime config of every ADD), as `RuntimeRanges`.

use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// One range a host-local can hand addresses out of, canonical (defaults filled in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

/// The host-local pool of one network: its ranges and where it keeps reservations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    pub network: String,
    /// `<dataDir>/<network>`.
    pub dir: PathBuf,
    pub ranges: Vec<Range>,
}

/// Per network, the distinct range objects runtimes passed in `runtimeConfig.ipRanges`
/// of its recorded ADDs (each as the runtime gave it, before canonicalisation).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeRanges(BTreeMap<String, Vec<Value>>);

impl RuntimeRanges {
    /// Notes the `ipRanges` (a list of range sets) of one record's runtime config.
    pub fn add(&mut self, network: &str, ip_ranges: Option<&Value>) {
        let objs = ip_ranges
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_array)
            .flatten();
        for obj in objs {
            self.insert(network, obj);
        }
    }

    /// Merges another scan's findings (the ledger is scanned by several workers).
    pub fn merge(&mut self, other: RuntimeRanges) {
        for (network, objs) in &other.0 {
            for obj in objs {
                self.insert(network, obj);
            }
        }
    }

    fn insert(&mut self, network: &str, obj: &Value) {
        let seen = self.0.entry(network.to_string()).or_default();
        if !seen.contains(obj) {
            seen.push(obj.clone());
        }
    }

    fn of(&self, network: &str) -> &[Value] {
        self.0.get(network).map_or(&[], Vec::as_slice)
    }
}

#[derive(Debug)]
pub enum HeadroomError {
    /// A range host-local itself would refuse; the network's other ranges still count.
    InvalidRange {
        network: String,
        range: String,
        why: String,
    },
    /// The data dir could not be listed (other than its absence: no reservation yet).
    DataDir {
        dir: PathBuf,
        source: std::io::Error,
    },
}

impl std::fmt::Display for HeadroomError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeadroomError::InvalidRange {
                network,
                range,
                why,
            } => write!(f, "network {network}: host-local range {range}: {why}"),
            HeadroomError::DataDir { dir, source } => {
                write!(
                    f,
                    "listing host-local's data dir {}: {source}",
                    dir.display()
                )
            }
        }
    }
}

impl std::error::Error for HeadroomError {}

impl Range {
    /// Addresses host-local can hand out: start to end, inclusive, less the gateway.
    pub fn size(&self) -> u128 {
        let (s, e) = (bits(self.start), bits(self.end));
        let span = e.saturating_sub(s).saturating_add(1);
        span - u128::from(self.contains(self.gateway))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        same_family(ip, self.start) && bits(self.start) <= bits(ip) && bits(ip) <= bits(self.end)
    }

    pub fn label(&self) -> String {
        format!("{}-{}", self.start, self.end)
    }
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
}

fn from_bits(v4: bool, v: u128) -> IpAddr {
    if v4 {
        IpAddr::V4(Ipv4Addr::from(v as u32))
    } else {
        IpAddr::V6(Ipv6Addr::from(v))
    }
}

fn parse_ip(v: Option<&Value>, what: &str) -> Result<Option<IpAddr>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => s
            .parse::<IpAddr>()
            .map(|ip| Some(canonical(ip)))
            .map_err(|_| format!("{what} {s:?} is not an IP address")),
        Some(other) => Err(format!("{what} {other} is not a string")),
    }
}

/// An IPv4-mapped IPv6 address is the IPv4 address, as Go's `To4` makes it.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One range object (`subnet`, `rangeStart`, `rangeEnd`, `gateway`), canonicalised as
/// host-local does; Err says why host-local would refuse it.
pub fn range(obj: &Value) -> Result<Range, String> {
    let subnet = obj
        .get("subnet")
        .and_then(Value::as_str)
        .ok_or("no subnet")?;
    let (addr, len) = subnet
        .split_once('/')
        .ok_or_else(|| format!("subnet {subnet:?} is not a CIDR"))?;
    let addr = canonical(
        addr.parse::<IpAddr>()
            .map_err(|_| format!("subnet {subnet:?} is not a CIDR"))?,
    );
    let width: u32 = if addr.is_ipv4() { 32 } else { 128 };
    let ones: u32 = len
        .parse()
        .ok()
        .filter(|l| *l <= width)
        .ok_or_else(|| format!("subnet {subnet:?} has no valid prefix length"))?;
    if ones > width - 2 {
        return Err(format!("subnet {subnet} too small to allocate from"));
    }
    let host_mask: u128 = (1u128 << (width - ones)) - 1;
    let net = bits(addr);
    if net & host_mask != 0 {
        return Err(format!("subnet {subnet} has host bits set"));
    }
    let v4 = addr.is_ipv4();
    let last = net | host_mask;
    let in_subnet = |ip: IpAddr| same_family(ip, addr) && (net..=last).contains(&bits(ip));
    let gateway = parse_ip(obj.get("gateway"), "gateway")?.unwrap_or(from_bits(v4, net + 1));
    let start = parse_ip(obj.get("rangeStart"), "rangeStart")?.unwrap_or(from_bits(v4, net + 1));
    // IPv4's broadcast address is never handed out.
    let default_end = from_bits(v4, if v4 { last - 1 } else { last });
    let end = parse_ip(obj.get("rangeEnd"), "rangeEnd")?.unwrap_or(default_end);
    for (what, ip) in [("rangeStart", start), ("rangeEnd", end)] {
        if !in_subnet(ip) {
            return Err(format!("{what} {ip} is not in {subnet}"));
        }
    }
    if bits(start) > bits(end) {
        return Err(format!("rangeStart {start} is after rangeEnd {end}"));
    }
    Ok(Range {
        start,
        end,
        gateway,
    })
}

/// The host-local pools of a network configuration (a conflist, or a single plugin's
/// conf): one per plugin whose `ipam.type` is `host-local`, with the ranges host-local
/// would refuse left out and said why, and the ranges the runtime passed to a plugin
/// that declares `ipRanges` counted too (each range once).
pub fn pools(conf: &Value, runtime: &RuntimeRanges) -> (Vec<Pool>, Vec<HeadroomError>) {
    let mut pools = Vec::new();
    let mut errors = Vec::new();
    let Some(network) = conf.get("name").and_then(Value::as_str) else {
        return (pools, errors);
    };
    let plugins: Vec<&Value> = match conf.get("plugins").and_then(Value::as_array) {
        Some(list) => list.iter().collect(),
        None => vec![conf],
    };
    for plugin in plugins {
        let Some(ipam) = plugin.get("ipam") else {
            continue;
        };
        if ipam.get("type").and_then(Value::as_str) != Some("host-local") {
            continue;
        }
        let mut objs: Vec<&Value> = Vec::new();
        let takes_runtime_ranges = plugin
            .get("capabilities")
            .and_then(|c| c.get("ipRanges"))
            .and_then(Value::as_bool)
            == Some(true);
        if takes_runtime_ranges {
            objs.extend(runtime.of(network));
        }
        if ipam.get("subnet").is_some() {
            objs.push(ipam);
        }
        for set in ipam
            .get("ranges")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            objs.extend(set.as_array().into_iter().flatten());
        }
        let mut ranges: Vec<Range> = Vec::new();
        for obj in objs {
            match range(obj) {
                // A runtime's range may also be configured: one series per label.
                Ok(r) if ranges.iter().any(|seen| seen.label() == r.label()) => {}
                Ok(r) => ranges.push(r),
                Err(why) => errors.push(HeadroomError::InvalidRange {
                    network: network.to_string(),
                    range: obj
                        .get("subnet")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_string(),
                    why,
                }),
            }
        }
        let data_dir = ipam
            .get("dataDir")
            .and_then(Value::as_str)
            .filter(|d| !d.is_empty())
            .unwrap_or(DEFAULT_DATA_DIR);
        pools.push(Pool {
            network: network.to_string(),
            dir: Path::new(data_dir).join(network),
            ranges,
        });
    }
    (pools, errors)
}

impl Pool {
    /// The addresses reserved in the pool's data dir: one listing, no file read.
    pub fn reserved(&self) -> Result<HashSet<IpAddr>, HeadroomError> {
        let pool = self;
        let mut reserved: HashSet<IpAddr> = HashSet::new();
        match std::fs::read_dir(&pool.dir) {
            Ok(rd) => {
                for entry in rd {
                    let entry = entry.map_err(|source| HeadroomError::DataDir {
                        dir: pool.dir.clone(),
                        source,
                    })?;
                    // Reservations are named by the address; `lock`, `last_reserved_ip.N`
                    // and anything else do not parse as one.
                    if let Some(ip) = entry
                        .file_name()
                        .to_str()
                        .and_then(|n| n.parse::<IpAddr>().ok())
                    {
                        reserved.insert(canonical(ip));
                    }
                }
            }
            // No reservation was ever made.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(HeadroomError::DataDir {
                    dir: pool.dir.clone(),
                    source,
                })
            }
        }
        Ok(reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn defaults_leave_out_network_gateway_and_broadcast() {
        let r = range(&json!({"subnet": "10.1.2.0/24"})).unwrap();
        assert_eq!(r.start, ip("10.1.2.1"));
        assert_eq!(r.end, ip("10.1.2.254"));
        assert_eq!(r.gateway, ip("10.1.2.1"));
        // .1 to .254 is 254 addresses; the gateway .1 is one of them.
        assert_eq!(r.size(), 253);
        let r = range(&json!({"subnet": "10.1.2.0/30"})).unwrap();
        assert_eq!(r.size(), 1, ".1 gateway, .2 free, .3 broadcast");
    }

    #[test]
    fn explicit_bounds_and_a_gateway_outside_them() {
        let r = range(&json!({
            "subnet": "10.10.0.0/16",
            "rangeStart": "10.10.1.20",
            "rangeEnd": "10.10.3.50",
            "gateway": "10.10.0.254"
        }))
        .unwrap();
        // 10.10.1.20..=10.10.3.50: 236 + 256 + 51.
        assert_eq!(r.size(), 236 + 256 + 51);
        let r = range(&json!({
            "subnet": "10.10.0.0/24",
            "rangeStart": "10.10.0.10",
            "rangeEnd": "10.10.0.19",
            "gateway": "10.10.0.15"
        }))
        .unwrap();
        assert_eq!(
            r.size(),
            9,
            "a gateway inside the range is never handed out"
        );
    }

    #[test]
    fn ipv6_keeps_its_last_address() {
        let r = range(&json!({"subnet": "fd00:1::/120"})).unwrap();
        assert_eq!(r.start, ip("fd00:1::1"));
        assert_eq!(r.end, ip("fd00:1::ff"));
        assert_eq!(r.size(), 254);
        let big = range(&json!({"subnet": "fd00::/64"})).unwrap();
        assert_eq!(big.size(), (1u128 << 64) - 2);
    }

    #[test]
    fn ranges_host_local_refuses() {
        for (obj, why) in [
            (json!({"subnet": "10.0.0.0/31"}), "too small"),
            (json!({"subnet": "10.0.0.5/24"}), "host bits"),
            (
                json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.1"}),
                "not in",
            ),
            (
                json!({"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.8"}),
                "after",
            ),
            (
                json!({"subnet": "fd00::/64", "rangeEnd": "10.0.0.8"}),
                "not in",
            ),
            (json!({"rangeStart": "10.0.0.1"}), "no subnet"),
        ] {
            let e = range(&obj).unwrap_err();
            assert!(e.contains(why), "{obj}: {e}");
        }
    }

    #[test]
    fn pools_read_the_old_keys_then_ranges_and_the_data_dir() {
        let conf = json!({
            "cniVersion": "1.0.0",
            "name": "pods",
            "plugins": [
                {"type": "cni-ledger"},
                {"type": "bridge", "ipam": {
                    "type": "host-local",
                    "subnet": "10.0.0.0/24",
                    "ranges": [[{"subnet": "10.0.1.0/24"}, {"subnet": "10.0.0.0/33"}], [{"subnet": "fd00::/120"}]],
                    "dataDir": "/run/ipam"
                }},
                {"type": "macvlan", "ipam": {"type": "dhcp"}},
                {"type": "portmap"}
            ]
        });
        let (pools, errors) = pools(&conf, &RuntimeRanges::default());
        assert_eq!(pools.len(), 1);
        assert_eq!(pools[0].dir, Path::new("/run/ipam/pods"));
        let labels: Vec<_> = pools[0].ranges.iter().map(Range::label).collect();
        assert_eq!(
            labels,
            [
                "10.0.0.1-10.0.0.254",
                "10.0.1.1-10.0.1.254",
                "fd00::1-fd00::ff"
            ]
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].to_string().contains("10.0.0.0/33"));
        let single = json!({"name": "one", "type": "bridge",
            "ipam": {"type": "host-local", "subnet": "192.168.0.0/24"}});
        let (pools, _) = super::pools(&single, &RuntimeRanges::default());
        assert_eq!(pools[0].dir, Path::new(DEFAULT_DATA_DIR).join("one"));
    }
}
