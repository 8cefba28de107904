//! `cni-ledger agent`: one long-running process per node (a Kubernetes DaemonSet, or a
//! systemd service) that keeps the node covered with no hand work:
//!
//! - installs the plugin binary into the CNI bin dir(s) from its own executable;
//! - keeps the ledger first in the chosen conflist(s), watching the conf dir (inotify,
//!   plus a periodic resync) and backing off from a writer that keeps reverting it;
//! - counts attachments libcni's cache has and the ledger does not (made while it was
//!   out of the chain, mostly);
//! - runs gc at start and every `gc_interval`;
//! - serves `/metrics`, `/healthz` and `/readyz`, read-only, and the probes alone on
//!   `--probe-listen` when given, so that clients of the metrics port cannot starve
//!   kubelet's probes; `/healthz` fails when the watcher or gc thread has ended.
//!
//! None of this is reachable from the plugin face: `main` selects the plugin when
//! `CNI_COMMAND` is set before any CLI code runs.

mod chain_tracker;
pub mod chain_watch;
pub mod conf;
mod conflists;
mod gc_loop;
mod http;
pub mod install;
mod readiness;
mod reconcile;
pub mod revert_backoff;
pub mod unrecorded;
mod watch;

use anyhow::{Context, Result};
use nix::sys::signal::{SigSet, Signal};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use conf::Choice;
pub use http::parse_listen;
pub use readiness::{ConfStatus, Status};

pub struct Options {
    pub bin_dirs: Vec<PathBuf>,
    pub conf_dir: PathBuf,
    pub choice: Choice,
    pub plugin_type: String,
    pub listen: SocketAddr,
    /// A listener of its own for `/healthz` and `/readyz` (kubelet's probes).
    pub probe_listen: Option<SocketAddr>,
    pub gc_interval: Duration,
    pub resync: Duration,
    /// gc's options; also names the ledger dir and libcni's cache dir.
    pub gc: crate::gc::Options,
    pub uninstall: bool,
    /// The CRI runtimes asked for their pod sandboxes before each gc run.
    pub cri: CriEndpoints,
    /// The networks they judge; empty: the chosen conflists' networks that the runtime
    /// says it serves (or all of them, for a runtime that does not say).
    pub cri_networks: Vec<String>,
    /// `--no-tail`: place no tail entry, and take out one that is there.
    pub no_tail: bool,
}

/// Which CRI runtimes the agent asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CriEndpoints {
    /// The default sockets of the runtimes in `cri::DEFAULT_SOCKETS`, those that exist at each gc run
    /// (the node's own: the agent runs in the node's root, `--node-root`).
    Auto,
    /// None: no record is judged by a sandbox list.
    Off,
    Given(Vec<String>),
}

/// State shared by the agent's threads. The server only reads it.
pub struct Shared {
    pub metrics: crate::metrics::Metrics,
    /// Written by the watcher, a whole pass at a time.
    pub status: Mutex<Status>,
    /// Written by the gc loop after each run.
    pub cri_refused: Mutex<Option<String>>,
    pub health: ThreadHealth,
}

impl Shared {
    pub fn status(&self) -> Status {
        let mut status = self.status.lock().map(|s| s.clone()).unwrap_or_default();
        status.cri_refused = self.cri_refused.lock().ok().and_then(|r| r.clone());
        status
    }
}

/// Whether the agent's working threads still run, for `/healthz`. Only an ended thread
/// fails it: a gc run blocked in replays (each bounded by `--timeout`) or a watcher in
/// a long backoff is alive, and restarting the agent for being slow would only cut
/// replays short. The last progress is shown to the reader, not judged.
pub struct ThreadHealth {
    start: Instant,
    pub watch: Heartbeat,
    pub gc: Heartbeat,
    /// The chain watcher: its metrics stop silently if it ends, so it is judged too.
    pub chain: Heartbeat,
}

impl Default for ThreadHealth {
    fn default() -> Self {
        ThreadHealth {
            start: Instant::now(),
            watch: Heartbeat::new("watch"),
            gc: Heartbeat::new("gc"),
            chain: Heartbeat::new("chain-watch"),
        }
    }
}

impl ThreadHealth {
    /// Alive, and one line per thread for the response body.
    pub fn report(&self) -> (bool, String) {
        let now = self.start.elapsed();
        let mut ok = true;
        let mut body = String::new();
        for t in [&self.watch, &self.gc, &self.chain] {
            let line = match t.state.load(Ordering::SeqCst) {
                RUNNING => match t.last_progress() {
                    None => format!("ok {} thread running, no loop completed yet", t.name),
                    Some(at) => format!(
                        "ok {} thread running, last loop started {}s ago",
                        t.name,
                        now.saturating_sub(at).as_secs()
                    ),
                },
                state => {
                    ok = false;
                    let how = if state == PANICKED {
                        "panicked"
                    } else {
                        "exited"
                    };
                    format!("FAIL {} thread {how}", t.name)
                }
            };
            body.push_str(&line);
            body.push('\n');
        }
        (ok, body)
    }

    /// Marks `t`'s loop as making progress now.
    pub fn beat(&self, t: &Heartbeat) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        t.last_ms.store(ms, Ordering::SeqCst);
        let n = t.beats.fetch_add(1, Ordering::SeqCst) + 1;
        thread_fault(t.name, n);
    }
}

const RUNNING: u8 = 0;
const EXITED: u8 = 1;
const PANICKED: u8 = 2;
const NEVER: u64 = u64::MAX;

pub struct Heartbeat {
    name: &'static str,
    state: AtomicU8,
    /// Milliseconds from the agent's start to the top of the last loop; NEVER before.
    last_ms: AtomicU64,
    beats: AtomicU64,
}

impl Heartbeat {
    fn new(name: &'static str) -> Heartbeat {
        Heartbeat {
            name,
            state: AtomicU8::new(RUNNING),
            last_ms: AtomicU64::new(NEVER),
            beats: AtomicU64::new(0),
        }
    }

    fn last_progress(&self) -> Option<Duration> {
        let ms = self.last_ms.load(Ordering::SeqCst);
        (ms != NEVER).then(|| Duration::from_millis(ms))
    }

    /// Held by the thread for its whole life: dropped on return or unwind, it records
    /// which.
    fn running(&self) -> Running<'_> {
        self.state.store(RUNNING, Ordering::SeqCst);
        Running(self)
    }
}

struct Running<'a>(&'a Heartbeat);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let state = if std::thread::panicking() {
            // The panic message went to stderr; the log file should say it too.
            crate::error!("agent: the {} thread panicked; /healthz fails", self.0.name);
            PANICKED
        } else {
            EXITED
        };
        self.0.state.store(state, Ordering::SeqCst);
    }
}

/// `CNI_LEDGER_TEST_THREAD_PANIC=<thread>:<n>` (testing builds only) panics the named
/// thread (`watch` or `gc`) at the top of its n-th loop, as a bug would.
#[cfg(feature = "testing")]
fn thread_fault(name: &str, beat: u64) {
    let Ok(spec) = std::env::var("CNI_LEDGER_TEST_THREAD_PANIC") else {
        return;
    };
    let (thread, nth) = spec.split_once(':').unwrap_or((spec.as_str(), "1"));
    if thread == name && nth.parse::<u64>().unwrap_or(1) == beat {
        panic!("CNI_LEDGER_TEST_THREAD_PANIC: {name} thread at loop {beat}");
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
fn thread_fault(_name: &str, _beat: u64) {}

/// Shutdown request, visible to a sleeping loop (condvar), a poll (pipe) and gc (flag).
pub struct Stop {
    flag: Arc<AtomicBool>,
    lock: Mutex<()>,
    cv: Condvar,
    pipe: (OwnedFd, OwnedFd),
}

impl Stop {
    pub fn new() -> Result<Stop> {
        let pipe = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).context("pipe")?;
        Ok(Stop {
            flag: Arc::new(AtomicBool::new(false)),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            pipe,
        })
    }

    pub fn request(&self) {
        let _guard = self.lock.lock();
        self.flag.store(true, Ordering::SeqCst);
        self.cv.notify_all();
        let _ = nix::unistd::write(&self.pipe.1, b"x");
    }

    pub fn requested(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Sleeps up to `d`; true when stopped.
    pub fn sleep(&self, d: Duration) -> bool {
        let Ok(guard) = self.lock.lock() else {
            return true;
        };
        let _ = self
            .cv
            .wait_timeout_while(guard, d, |_| !self.flag.load(Ordering::SeqCst));
        self.requested()
    }

    /// Readable once a stop was requested.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.pipe.0.as_fd()
    }

    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }
}

/// The ledger's entry options: a non-default ledger or conf dir is written into it, so
/// the plugin (run by the runtime) uses the same ones as the agent.
fn entry_dirs(opts: &Options) -> (Option<PathBuf>, Option<PathBuf>) {
    let ledger = (opts.gc.ledger_dir != Path::new(crate::cni::config::DEFAULT_LEDGER_DIR))
        .then(|| opts.gc.ledger_dir.clone());
    let conf = (opts.conf_dir != Path::new(crate::cni::config::DEFAULT_CONF_DIR))
        .then(|| opts.conf_dir.clone());
    (ledger, conf)
}

/// `--uninstall`: takes the ledger out of the chosen conflist(s). The binary stays: DEL
/// of a pod added through the old chain still runs it from libcni's cached config.
fn uninstall(opts: &Options) -> Result<i32> {
    let files = conf::choose(&opts.conf_dir, &opts.choice, &opts.bin_dirs)?;
    let mut status = 0;
    for f in &files {
        let r = (|| -> Result<bool> {
            let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            let planned = crate::injection::plan(
                f,
                &bytes,
                &opts.plugin_type,
                &crate::injection::EntryOptions::default(),
                true,
            )?;
            // The ledger's drop-ins (tail, docs/CHAIN.md; head of a chain of drop-ins) go too.
            let mut dropped = false;
            for d in [&planned.tail_dropin, &planned.head_dropin]
                .into_iter()
                .flatten()
                .filter(|d| d.changed)
            {
                d.apply()?;
                dropped = true;
            }
            if planned.changed {
                crate::replace::write_replacing(f, planned.text.as_bytes())?;
            }
            Ok(planned.changed || dropped)
        })();
        match r {
            Ok(true) => crate::info!("agent: {}: ledger removed", f.display()),
            Ok(false) => crate::info!("agent: {}: no ledger in it; unchanged", f.display()),
            Err(e) => {
                crate::error!("agent: {}: {e:#}", f.display());
                status = 1;
            }
        }
    }
    if files.is_empty() {
        crate::info!(
            "agent: no network configuration in {}; nothing to remove",
            opts.conf_dir.display()
        );
    }
    Ok(status)
}

pub fn run(mut opts: Options) -> Result<i32> {
    if opts.uninstall {
        return uninstall(&opts);
    }
    // Blocked before any thread starts, so every thread inherits the mask and the main
    // thread alone takes them with sigwait (children get a clean mask from std).
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block().context("blocking SIGTERM/SIGINT")?;

    let listener = std::net::TcpListener::bind(opts.listen)
        .with_context(|| format!("listening on {}", opts.listen))?;
    crate::info!(
        "agent: serving /metrics /healthz /readyz on {}",
        listener.local_addr().unwrap_or(opts.listen)
    );
    let probe_listener = match opts.probe_listen {
        None => None,
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr)
                .with_context(|| format!("listening on {addr} (--probe-listen)"))?;
            crate::info!(
                "agent: serving /healthz /readyz for probes on {}",
                l.local_addr().unwrap_or(addr)
            );
            Some(l)
        }
    };
    let shared = Arc::new(Shared {
        metrics: crate::metrics::Metrics::new(),
        status: Mutex::new(Status::default()),
        cri_refused: Mutex::new(None),
        health: ThreadHealth::default(),
    });
    let stop = Arc::new(Stop::new()?);
    opts.gc.stop = Some(stop.flag());
    let opts = Arc::new(opts);

    let servers = [(Some(listener), http::ListenerRole::Main, "http")]
        .into_iter()
        .chain([(probe_listener, http::ListenerRole::Probes, "http-probes")]);
    for (listener, role, name) in servers {
        let Some(listener) = listener else { continue };
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Err(e) = http::serve(listener, shared, role) {
                    crate::error!("agent: HTTP server ({role:?}) stopped: {e:#}");
                }
            })
            .with_context(|| format!("starting the {name} thread"))?;
    }
    let watcher = {
        let (shared, stop, opts) = (shared.clone(), stop.clone(), opts.clone());
        std::thread::Builder::new()
            .name("watch".into())
            .spawn(move || {
                let _running = shared.health.watch.running();
                watch::ConfWatcher::new(&opts, &shared).run(&stop)
            })
            .context("starting the watcher")?
    };
    let gc = {
        let (shared, stop, opts) = (shared.clone(), stop.clone(), opts.clone());
        std::thread::Builder::new()
            .name("gc".into())
            .spawn(move || {
                let _running = shared.health.gc.running();
                gc_loop::run(&shared, &opts, &stop)
            })
            .context("starting the gc loop")?
    };

    let chain_watch = {
        let (shared, stop, opts) = (shared.clone(), stop.clone(), opts.clone());
        std::thread::Builder::new()
            .name("chain-watch".into())
            .spawn(move || {
                let _running = shared.health.chain.running();
                chain_watch::run(
                    &opts.gc.ledger_dir,
                    &shared.metrics,
                    opts.gc.chain_left_after_secs,
                    &stop,
                    &shared.health,
                )
            })
            .context("starting the chain watcher")?
    };

    let sig = signals.wait().context("waiting for a signal")?;
    crate::info!("agent: {sig:?}: letting replays in progress finish, then exiting");
    stop.request();
    let _ = gc.join();
    let _ = watcher.join();
    let _ = chain_watch.join();
    crate::info!("agent: stopped");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_while_both_threads_run_and_the_body_names_an_ended_one() {
        let l = ThreadHealth::default();
        {
            let _watch = l.watch.running();
            let _chain = l.chain.running();
            let gc = l.gc.running();
            let (ok, body) = l.report();
            assert!(ok, "{body}");
            assert!(
                body.contains("ok gc thread running, no loop completed yet"),
                "{body}"
            );
            l.beat(&l.gc);
            assert!(l.report().1.contains("ok gc thread running, last loop"));
            drop(gc);
            let (ok, body) = l.report();
            assert!(!ok, "{body}");
            assert!(body.contains("FAIL gc thread exited"), "{body}");
            assert!(body.contains("ok watch thread running"), "{body}");
        }
        let l = Arc::new(ThreadHealth::default());
        let l2 = l.clone();
        let r = std::thread::spawn(move || {
            let _running = l2.watch.running();
            panic!("a bug");
        })
        .join();
        assert!(r.is_err());
        let (ok, body) = l.report();
        assert!(!ok && body.contains("FAIL watch thread panicked"), "{body}");
    }
}
