//! `cni-ledger agent`: the long-running node agent (see `crate::agent`).

use crate::agent::{self, Choice, CriEndpoints};
use anyhow::Result;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// CNI bin dir to install the plugin binary into (repeatable).
    #[arg(
        long = "cni-bin-dir",
        value_name = "DIR",
        default_value = "/opt/cni/bin"
    )]
    bin_dirs: Vec<PathBuf>,
    /// The runtime's CNI conf dir.
    #[arg(long, value_name = "DIR", default_value = crate::cni::config::DEFAULT_CONF_DIR)]
    conf_dir: PathBuf,
    /// Which conflist to keep the ledger in: the runtimes' choice (`first`: the file each
    /// of containerd, CRI-O and Podman loads by its own rule, every one of them), `all`, or
    /// a file or network name.
    #[arg(long, value_name = "NAME|all", default_value = "first")]
    conflist: Choice,
    #[arg(long, default_value_os_t = super::ledger_dir_default())]
    ledger_dir: PathBuf,
    /// Address for /metrics, /healthz and /readyz: `IPv4:PORT`, `[IPv6]:PORT`, or a bare
    /// `IPv6:PORT` as `$(NODE_IP):9657` gives on an IPv6 node (the part after the last
    /// `:` is the port).
    #[arg(long, default_value = "127.0.0.1:9657", value_parser = agent::parse_listen)]
    listen: SocketAddr,
    /// A listener of its own for kubelet's probes, /healthz and /readyz only, with its
    /// own connection budget, so that clients of --listen cannot starve them. Same
    /// address forms as --listen. Default: none (the probes are on --listen only).
    #[arg(long, value_name = "ADDR:PORT", value_parser = agent::parse_listen)]
    probe_listen: Option<SocketAddr>,
    /// Seconds between gc runs (the first runs at start).
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    gc_interval: u64,
    /// Seconds between full checks besides the inotify watch.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    resync: u64,
    /// Take the ledger out of the chosen conflist(s) and exit.
    #[arg(long)]
    uninstall: bool,
    /// The ledger's plugin type (its binary name in the CNI bin dir).
    #[arg(long = "type", default_value = crate::cni::config::DEFAULT_PLUGIN_TYPE)]
    plugin_type: String,
    #[command(flatten)]
    replay: super::replay_flags::ReplayFlags,
    /// Append log lines here instead of stderr.
    #[arg(long, value_name = "FILE")]
    log_file: Option<PathBuf>,
    /// CRI runtimes asked which pod sandboxes exist before each gc run (repeatable):
    /// `auto` (the default sockets of containerd, CRI-O, k3s/rke2 and cri-dockerd,
    /// those that exist), `none`, or unix:///PATH.
    #[arg(
        long = "cri-endpoint",
        value_name = "auto|none|unix:///PATH",
        default_value = "auto"
    )]
    cri_endpoints: Vec<String>,
    /// A network the CRI runtime judges (repeatable). Default: the chosen conflists'
    /// networks that the runtime says it serves.
    #[arg(long = "cri-network", value_name = "NAME")]
    cri_networks: Vec<String>,
    /// Place no tail entry in the chosen conflists (and take out one that is there): the
    /// chain's completion and duration are then not recorded (docs/CHAIN.md).
    #[arg(long)]
    no_tail: bool,
}

fn cri_endpoints(given: &[String]) -> Result<CriEndpoints> {
    if given.iter().any(|e| e == "none") {
        return Ok(CriEndpoints::Off);
    }
    let explicit: Vec<String> = given.iter().filter(|e| *e != "auto").cloned().collect();
    if explicit.is_empty() {
        return Ok(CriEndpoints::Auto);
    }
    anyhow::ensure!(
        explicit.len() == given.len(),
        "--cri-endpoint auto cannot be combined with explicit endpoints"
    );
    for e in &explicit {
        crate::cri::socket_path(e)?;
    }
    Ok(CriEndpoints::Given(explicit))
}

pub fn run(args: Args) -> Result<i32> {
    crate::logging::init(args.log_file.as_deref());
    let mut gc = crate::gc::Options::new(args.ledger_dir);
    gc.conf_dir = Some(args.conf_dir.clone());
    args.replay.apply(&mut gc)?;
    agent::run(agent::Options {
        bin_dirs: args.bin_dirs,
        conf_dir: args.conf_dir,
        choice: args.conflist,
        plugin_type: args.plugin_type,
        listen: args.listen,
        probe_listen: args.probe_listen,
        gc_interval: Duration::from_secs(args.gc_interval.max(1)),
        resync: Duration::from_secs(args.resync.max(1)),
        gc,
        uninstall: args.uninstall,
        cri: cri_endpoints(&args.cri_endpoints)?,
        cri_networks: args.cri_networks,
        no_tail: args.no_tail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_endpoint_values() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(cri_endpoints(&v(&["auto"])).unwrap(), CriEndpoints::Auto);
        assert_eq!(
            cri_endpoints(&v(&["auto", "none"])).unwrap(),
            CriEndpoints::Off
        );
        assert_eq!(
            cri_endpoints(&v(&["unix:///run/a.sock", "unix:///run/b.sock"])).unwrap(),
            CriEndpoints::Given(v(&["unix:///run/a.sock", "unix:///run/b.sock"]))
        );
        assert!(cri_endpoints(&v(&["auto", "unix:///run/a.sock"])).is_err());
        assert!(cri_endpoints(&v(&["/run/a.sock"])).is_err());
    }
}
