//! A containerd config of the test's own (root, state, sockets, CNI dirs), in the
//! format of Debian bookworm's 1.6 or unstable's 2.x (tests/cri_common runs it).

use super::*;

/// Which containerd a test runs: the config format and plugin names differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerdVersion {
    /// Debian bookworm's containerd 1.6 (config `version = 2`, one CRI plugin).
    V1_6,
    /// Debian unstable's containerd 2.x (config `version = 3`, CRI split in runtime and
    /// images plugins).
    V2,
}

/// A config.toml for a containerd of the test's own: root, state and sockets under
/// `dir`, gRPC at `address`, the CRI plugin's CNI dirs as given, in `version`'s format.
pub fn containerd_config(
    version: ContainerdVersion,
    dir: &Path,
    address: &str,
    bin_dir: &Path,
    conf_dir: &Path,
    sandbox_image: &str,
) -> String {
    let d = dir.display();
    let bin = bin_dir.display();
    let conf = conf_dir.display();
    let common = format!(
        r#"root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{address}"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = "{d}/debug.sock"
"#
    );
    // restrict_oom_score_adj: never below containerd's own OOM score. Lowering it needs
    // CAP_SYS_RESOURCE, which a CI machine (itself a container) may not have.
    match version {
        ContainerdVersion::V1_6 => format!(
            r#"version = 2
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
{common}[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin}"
    conf_dir = "{conf}"
"#
        ),
        // NRI is off: it would listen at the machine's /var/run/nri/nri.sock.
        ContainerdVersion::V2 => format!(
            r#"version = 3
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.nri.v1.nri"]
{common}[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{sandbox_image}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{conf}"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#
        ),
    }
}
