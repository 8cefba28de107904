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
    /// Run the replayed plugins with this root directory (chroot): `/proc/1/root` in a
    /// container (with the host's PID namespace), so they see the node's own files.
    #[arg(long, value_name = "DIR")]
    plugin_root: Option<PathBuf>,
}

impl ReplayFlags {
    pub fn apply(self, opts: &mut gc::Options) {
        opts.grace_secs = i64::try_from(self.grace).unwrap_or(i64::MAX);
        opts.timeout = Duration::from_secs(self.timeout.max(1));
        opts.cache_dir = self.cni_cache_dir;
        opts.cni_path = self.cni_path.map(|p| std::env::split_paths(&p).collect());
        opts.max_attempts = self.max_attempts.max(1);
        opts.jobs = self.jobs.max(1);
        opts.plugin_root = self.plugin_root;
    }
}
