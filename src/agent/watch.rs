//! The agent's loop: a reconcile pass, then a wait for whatever may call for the next
//! one. The conf dir (not the files: an installer that replaces a file by rename makes
//! a new inode) is watched with inotify and re-armed when the directory itself goes
//! away; so is each chosen network's drop-in directory `<conf dir>/<network>/` (its
//! plugins join the chain, and the head's capabilities with them), armed after each
//! pass, a new one found by the conf dir's `IN_CREATE`; a periodic resync catches
//! anything the watch missed; a pass may ask to run again sooner (a backoff ending).
//! Another source of wake-ups is one more fd in the wait's poll set (see `run`).

use super::reconcile::Reconciler;
use super::{Options, Shared, Stop};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Events that arrive together (a write, then a rename) are taken in one pass.
const DEBOUNCE: Duration = Duration::from_millis(20);
/// How often to retry arming the watch while the conf dir is missing.
const REARM: Duration = Duration::from_secs(1);

/// The conf dir's watcher: reconciles, then waits on inotify, the resync or a stop.
pub struct ConfWatcher<'a> {
    opts: &'a Options,
    shared: &'a Shared,
    inotify: Option<Inotify>,
    /// The conf dir's own watch: its going away calls for re-arming everything.
    conf_wd: Option<WatchDescriptor>,
    /// The drop-in directories watched now.
    dropin_wds: BTreeMap<PathBuf, WatchDescriptor>,
    reconciler: Reconciler<'a>,
}

/// What a watched directory's changes are seen by.
fn watch_flags() -> AddWatchFlags {
    AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

impl<'a> ConfWatcher<'a> {
    pub fn new(opts: &'a Options, shared: &'a Shared) -> ConfWatcher<'a> {
        ConfWatcher {
            opts,
            shared,
            inotify: None,
            conf_wd: None,
            dropin_wds: BTreeMap::new(),
            reconciler: Reconciler::new(opts, shared),
        }
    }

    fn arm(&mut self) {
        if self.inotify.is_some() {
            return;
        }
        // IN_CREATE: a drop-in directory made (a file in it is seen by its own watch).
        let flags = watch_flags() | AddWatchFlags::IN_CREATE;
        let armed = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).and_then(|i| {
            let wd = i.add_watch(&self.opts.conf_dir, flags)?;
            Ok((i, wd))
        });
        match armed {
            Ok((i, wd)) => {
                self.inotify = Some(i);
                self.conf_wd = Some(wd);
                self.dropin_wds.clear();
            }
            Err(e) => crate::warn!(
                "agent: cannot watch {} ({e}); retrying every {}s, resync meanwhile",
                self.opts.conf_dir.display(),
                REARM.as_secs()
            ),
        }
    }

    /// Reads pending events; false when the watch is gone and must be re-armed.
    fn drain(&mut self) -> bool {
        let Some(ino) = &self.inotify else {
            return false;
        };
        let mut alive = true;
        while let Ok(events) = ino.read_events() {
            if events.is_empty() {
                break;
            }
            for ev in events {
                let gone = ev.mask.intersects(
                    AddWatchFlags::IN_IGNORED
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF,
                );
                if !gone {
                    continue;
                }
                if Some(ev.wd) == self.conf_wd {
                    alive = false;
                } else {
                    // A drop-in directory gone: armed again once it is back.
                    self.dropin_wds.retain(|_, wd| *wd != ev.wd);
                }
            }
        }
        if !alive {
            crate::warn!(
                "agent: {} was removed or moved; re-arming the watch",
                self.opts.conf_dir.display()
            );
            self.inotify = None;
            self.conf_wd = None;
            self.dropin_wds.clear();
        }
        alive
    }

    /// Watches the drop-in directories of the last pass's networks that exist, and no
    /// others; true when it armed a new one (what changed in it before is read by one
    /// more pass).
    fn arm_dropins(&mut self) -> bool {
        let Some(ino) = &self.inotify else {
            return false;
        };
        let mut armed = false;
        let want = self.reconciler.dropin_dirs();
        let stale: Vec<PathBuf> = self
            .dropin_wds
            .keys()
            .filter(|d| !want.contains(d))
            .cloned()
            .collect();
        for d in stale {
            if let Some(wd) = self.dropin_wds.remove(&d) {
                let _ = ino.rm_watch(wd);
            }
        }
        for d in want {
            if self.dropin_wds.contains_key(d) {
                continue;
            }
            // Missing now: the conf dir's IN_CREATE brings a pass that arms it.
            if let Ok(wd) = ino.add_watch(d, watch_flags()) {
                self.dropin_wds.insert(d.clone(), wd);
                armed = true;
            }
        }
        armed
    }

    pub fn run(mut self, stop: &Stop) {
        loop {
            self.shared.health.beat(&self.shared.health.watch);
            self.arm();
            let wake = self.reconciler.pass();
            if self.arm_dropins() {
                continue;
            }
            let now = Instant::now();
            let mut deadline = now + self.opts.resync;
            if self.inotify.is_none() {
                deadline = deadline.min(now + REARM);
            }
            if let Some(w) = wake {
                deadline = deadline.min(w);
            }
            // Wait for an event, the next deadline, or a stop.
            loop {
                if stop.requested() {
                    return;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let timeout = PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                    .unwrap_or(PollTimeout::MAX);
                let mut fds = vec![PollFd::new(stop.fd(), PollFlags::POLLIN)];
                if let Some(i) = &self.inotify {
                    fds.push(PollFd::new(i.as_fd(), PollFlags::POLLIN));
                }
                let _ = nix::poll::poll(&mut fds, timeout);
                let event = fds
                    .get(1)
                    .and_then(|f| f.revents())
                    .is_some_and(|r| r.contains(PollFlags::POLLIN));
                if stop.requested() {
                    return;
                }
                if event {
                    std::thread::sleep(DEBOUNCE);
                    self.drain();
                    break;
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
        }
    }
}
