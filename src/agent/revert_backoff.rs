//! Telling a one-off rewrite from a fight. Network plugins' installers rewrite their
//! conflist on start (undoing the injection once, which the agent simply redoes); a
//! writer that reverts the file again and again would otherwise make the two of them
//! spin, so past `LIMIT` reverts within `WINDOW` the agent waits before each further
//! re-injection, doubling the wait up to `MAX_BACKOFF`. Pure logic, clock passed in.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// More reverts than this within `WINDOW` is a fight.
pub const LIMIT: usize = 5;
pub const WINDOW: Duration = Duration::from_secs(600);
pub const BASE_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// A fight is over once a re-injection has stood this long (or twice the backoff).
pub const SETTLE: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub struct RevertBackoff {
    reverts: VecDeque<Instant>,
    level: u32,
    backoff_until: Option<Instant>,
    last_backoff: Duration,
}

/// What a revert means for the next re-injection.
#[derive(Debug, PartialEq, Eq)]
pub enum Reinject {
    /// Re-inject now.
    Now,
    /// Wait this long first; `started` is true for the revert that began the fight.
    Backoff { wait: Duration, started: bool },
}

/// `LIMIT`, which test builds may raise (`CNI_LEDGER_TEST_FIGHT_LIMIT`) for tests that
/// race a writer against the agent hundreds of times and are about lost updates, not
/// about backing off.
fn limit() -> usize {
    #[cfg(feature = "testing")]
    if let Some(n) = std::env::var("CNI_LEDGER_TEST_FIGHT_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    LIMIT
}

impl RevertBackoff {
    fn prune(&mut self, now: Instant) {
        while self
            .reverts
            .front()
            .is_some_and(|t| now.duration_since(*t) > WINDOW)
        {
            self.reverts.pop_front();
        }
    }

    pub fn on_revert(&mut self, now: Instant) -> Reinject {
        self.reverts.push_back(now);
        self.prune(now);
        if self.reverts.len() <= limit() {
            return Reinject::Now;
        }
        let started = self.level == 0;
        self.level += 1;
        let wait = BASE_BACKOFF
            .saturating_mul(1u32 << (self.level - 1).min(16))
            .min(MAX_BACKOFF);
        self.last_backoff = wait;
        self.backoff_until = Some(now + wait);
        Reinject::Backoff { wait, started }
    }

    /// Until when a re-injection must wait (None: it may happen now).
    pub fn waiting_until(&self, now: Instant) -> Option<Instant> {
        self.backoff_until.filter(|t| *t > now)
    }

    pub fn fighting(&self) -> bool {
        self.level > 0
    }

    pub fn level(&self) -> u32 {
        self.level
    }

    /// Called while the file is as the agent left it; ends a fight that has gone quiet.
    /// Returns true when it just ended.
    pub fn settle(&mut self, now: Instant) -> bool {
        if self.level == 0 || self.waiting_until(now).is_some() {
            return false;
        }
        let quiet = SETTLE.max(self.last_backoff * 2);
        let last = self.reverts.back().copied();
        if last.is_none_or(|t| now.duration_since(t) >= quiet) {
            self.level = 0;
            self.reverts.clear();
            self.backoff_until = None;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_reverts_are_redone_at_once_the_sixth_starts_a_doubling_backoff() {
        let t0 = Instant::now();
        let mut f = RevertBackoff::default();
        for i in 0..LIMIT {
            assert_eq!(
                f.on_revert(t0 + Duration::from_millis(i as u64 * 100)),
                Reinject::Now
            );
        }
        assert!(!f.fighting());
        let t = t0 + Duration::from_secs(1);
        assert_eq!(
            f.on_revert(t),
            Reinject::Backoff {
                wait: Duration::from_secs(1),
                started: true
            }
        );
        assert!(f.fighting());
        assert_eq!(f.waiting_until(t), Some(t + Duration::from_secs(1)));
        assert_eq!(
            f.on_revert(t + Duration::from_secs(2)),
            Reinject::Backoff {
                wait: Duration::from_secs(2),
                started: false
            }
        );
        for _ in 0..20 {
            f.on_revert(t + Duration::from_secs(3));
        }
        assert_eq!(f.last_backoff, MAX_BACKOFF);
    }

    #[test]
    fn reverts_spread_over_more_than_the_window_never_fight() {
        let t0 = Instant::now();
        let mut f = RevertBackoff::default();
        for i in 0..50u64 {
            assert_eq!(
                f.on_revert(t0 + Duration::from_secs(i * 121)),
                Reinject::Now
            );
        }
    }

    #[test]
    fn a_quiet_fight_ends() {
        let t0 = Instant::now();
        let mut f = RevertBackoff::default();
        for _ in 0..=LIMIT {
            f.on_revert(t0);
        }
        assert!(f.fighting());
        assert!(
            !f.settle(t0 + Duration::from_millis(500)),
            "still backing off"
        );
        assert!(!f.settle(t0 + Duration::from_secs(5)));
        assert!(f.settle(t0 + SETTLE));
        assert!(!f.fighting());
        assert_eq!(f.on_revert(t0 + SETTLE), Reinject::Now);
    }
}
