//! The flags `gc` and `agent` share: how stale records are replayed. One definition, so
//! the two commands cannot drift apart, with the engine's own defaults.

use crate::gc;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ReplayFlags {
    /// Leave records younger than this alone (unless the node rebooted since).
    #[arg(long, default_value_t = gc::DEFAULT_GRACE_SECS, value_name = "SECS")]
    grace: u64,
    /// Kill a plugin that has not answered DEL after this long.
    #[arg(long, default_value_t = gc::DEFAULT_TIMEOUT_SECS, value_name = "SECS")]
    timeout: u64,
    /// libcni's cache directory (prevResult and config for replays; attachments made
    /// without the ledger).
    #[arg(
        long,
        default_value = crate::cni::config::DEFAULT_CNI_CACHE_DIR,
        value_name = "DIR"
    )]
    cni_cache_dir: PathBuf,
    /// Plugin directories to use instead of each record's CNI_PATH.
    #[arg(long, value_name = "DIRS")]
    cni_path: Option<String>,
    /// Attempts before a record is marked failed and left for an operator.
    #[arg(long, default_value_t = gc::DEFAULT_MAX_ATTEMPTS)]
    max_attempts: u32,
    /// Records replayed in parallel (never two replays of one record).
    #[arg(long, default_value_t = gc::DEFAULT_JOBS)]
    jobs: usize,
    /// The node's root directory, entered (chroot) before any path is read, so that
    /// every path (netns paths, conf, cache, ledger and plugin dirs, CRI sockets) is
    /// judged as the node sees it: `/proc/1/root` in a container that shares the host's
    /// PID namespace. The replayed plugins run in it too.
    #[arg(long, value_name = "DIR", alias = "plugin-root")]
    node_root: Option<PathBuf>,
    /// A record absent from the CRI runtime's sandbox list is judged gone only once it
    /// is this old: a sandbox is listed only after its RunPodSandbox returns, which
    /// kubelet lets take up to its 2-minute runtime request timeout.
    #[arg(long, default_value_t = gc::DEFAULT_CRI_MIN_AGE_SECS, value_name = "SECS")]
    cri_min_age: u64,
    /// A record whose chain's tail never came, and no DEL either, counts as a failed
    /// ADD left behind once older than this (docs/CHAIN.md).
    #[arg(long, default_value_t = crate::chain::DEFAULT_LEFT_AFTER_SECS, value_name = "SECS")]
    chain_left_after: u64,
    /// Before each replay, wait while an ADD is in flight on the node (a record young and
    /// pending: the tail has not come yet) or began less than 2 s ago, for at most this
    /// long in all per run; 0 never waits.
    #[arg(long, default_value_t = gc::courtesy::DEFAULT_YIELD_MAX_SECS, value_name = "SECS")]
    yield_max: u64,
}

impl ReplayFlags {
    /// Enters the node's root when one is given, then sets `opts`.
    pub fn apply(self, opts: &mut gc::Options) -> Result<(), crate::node_root::EnterError> {
        if let Some(root) = &self.node_root {
            crate::node_root::enter(root)?;
        }
        opts.grace_secs = i64::try_from(self.grace).unwrap_or(i64::MAX);
        opts.timeout = Duration::from_secs(self.timeout.max(1));
        opts.cache_dir = self.cni_cache_dir;
        opts.cni_path = self.cni_path.map(|p| std::env::split_paths(&p).collect());
        opts.max_attempts = self.max_attempts.max(1);
        opts.jobs = self.jobs.max(1);
        opts.cri_min_age_secs = i64::try_from(self.cri_min_age).unwrap_or(i64::MAX);
        opts.chain_left_after_secs = self.chain_left_after;
        opts.yield_max = Duration::from_secs(self.yield_max);
        Ok(())
    }
}
