//! The agent's loop: a reconcile pass, then a wait for whatever may call for the next
//! one. The conf dir (not the files: an installer that replaces a file by rename makes
//! a new inode) is watched with inotify and re-armed when the directory itself goes
//! away; a periodic resync catches anything the watch missed; a pass may ask to run
//! again sooner (a backoff ending). Another source of wake-ups is one more fd in the
//! wait's poll set (see `run`).

use super::reconcile::Reconciler;
use super::{Options, Shared, Stop};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::os::fd::AsFd;
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
    reconciler: Reconciler<'a>,
}

impl<'a> ConfWatcher<'a> {
    pub fn new(opts: &'a Options, shared: &'a Shared) -> ConfWatcher<'a> {
        ConfWatcher {
            opts,
            shared,
            inotify: None,
            reconciler: Reconciler::new(opts, shared),
        }
    }

    fn arm(&mut self) {
        if self.inotify.is_some() {
            return;
        }
        let flags = AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF
            | AddWatchFlags::IN_ONLYDIR;
        let armed = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).and_then(|i| {
            i.add_watch(&self.opts.conf_dir, flags)?;
            Ok(i)
        });
        match armed {
            Ok(i) => self.inotify = Some(i),
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
                if ev.mask.intersects(
                    AddWatchFlags::IN_IGNORED
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF,
                ) {
                    alive = false;
                }
            }
        }
        if !alive {
            crate::warn!(
                "agent: {} was removed or moved; re-arming the watch",
                self.opts.conf_dir.display()
            );
            self.inotify = None;
        }
        alive
    }

    pub fn run(mut self, stop: &Stop) {
        loop {
            self.shared.health.beat(&self.shared.health.watch);
            self.arm();
            let wake = self.reconciler.pass();
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
