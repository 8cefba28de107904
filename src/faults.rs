//! Crash points for fault-injection tests. Compiled in only with the `testing` feature;
//! in release builds `crash_point` is an empty inline function.
//!
//! `CNI_LEDGER_TEST_CRASH_AT=<point>[:<n>]` kills the process with SIGKILL the n-th time
//! (default: first) it passes `<point>`, as a power cut or OOM kill would.

#[cfg(feature = "testing")]
pub fn crash_point(point: &str) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static PASSED: AtomicU32 = AtomicU32::new(0);
    let Ok(spec) = std::env::var("CNI_LEDGER_TEST_CRASH_AT") else {
        return;
    };
    let (name, nth) = match spec.split_once(':') {
        Some((n, k)) => (n, k.parse::<u32>().unwrap_or(1)),
        None => (spec.as_str(), 1),
    };
    if name == point && PASSED.fetch_add(1, Ordering::SeqCst) + 1 == nth {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub fn crash_point(_point: &str) {}

/// `CNI_LEDGER_TEST_READ_ERRNO=<errno>:<name>`: reading the ledger file `<name>`
/// (`records/<name>`) fails with that errno, as a failing disk or an exhausted fd
/// table would make it.
#[cfg(feature = "testing")]
pub fn read_error(name: &str) -> Option<std::io::Error> {
    let spec = std::env::var("CNI_LEDGER_TEST_READ_ERRNO").ok()?;
    let (errno, target) = spec.split_once(':')?;
    let errno = errno.parse().ok()?;
    (target == name).then(|| std::io::Error::from_raw_os_error(errno))
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub fn read_error(_name: &str) -> Option<std::io::Error> {
    None
}

/// `CNI_LEDGER_TEST_BTIME=<unix secs>` replaces `btime` of /proc/stat, as a clock
/// stepped since boot moves it.
#[cfg(feature = "testing")]
pub fn btime_override() -> Option<i64> {
    std::env::var("CNI_LEDGER_TEST_BTIME").ok()?.parse().ok()
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub fn btime_override() -> Option<i64> {
    None
}

/// The boot ID source may be replaced in test builds only.
#[cfg(feature = "testing")]
pub fn boot_id_override() -> Option<String> {
    std::env::var("CNI_LEDGER_TEST_BOOT_ID").ok()
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub fn boot_id_override() -> Option<String> {
    None
}

/// Whether `uid` may own the ledger gc executes plugins on the word of: root, and in
/// test builds also the one uid a test process named with `trust_ledger_owner`, so the
/// no-root tier (tests/inprocess.rs) can run the GC verb over a ledger its user owns.
/// No environment variable or flag reaches it: only code linked into the test can.
#[cfg(feature = "testing")]
pub fn trusted_owner(uid: u32) -> bool {
    uid == 0 || TRUSTED_OWNER.get() == Some(&uid)
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub fn trusted_owner(uid: u32) -> bool {
    uid == 0
}

#[cfg(feature = "testing")]
static TRUSTED_OWNER: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Trusts a ledger owned by `uid` for the rest of this process (test builds only).
#[cfg(feature = "testing")]
pub fn trust_ledger_owner(uid: u32) {
    let _ = TRUSTED_OWNER.set(uid);
}

/// `CNI_LEDGER_TEST_NO_NS_HANDLES` (any value) makes the node-wide namespace search
/// ignore nsfs file handles, so tests on a kernel that has them exercise the /proc search
/// that older kernels rely on.
#[cfg(feature = "testing")]
pub fn ns_handles_disabled() -> bool {
    std::env::var_os("CNI_LEDGER_TEST_NO_NS_HANDLES").is_some()
}

#[cfg(not(feature = "testing"))]
#[inline(always)]
pub fn ns_handles_disabled() -> bool {
    false
}
