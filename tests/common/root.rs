//! Who may run what: the root tiers start each test with `require_root!()`, which
//! skips it for a normal user (one line per test binary) and fails it under CI.

use std::fs;
use std::io::Write;

/// The effective uid, read from /proc (no libc dependency).
pub fn euid() -> u32 {
    let status = fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|s| s.parse::<u32>().ok())
        .expect("parse euid from /proc/self/status")
}

/// Whether a test that needs root may go on. As root: yes. Otherwise the test is
/// skipped, and the binary says so once on stderr, past libtest's capture, so
/// `cargo test` as a normal user runs the no-root tier and names each root tier it
/// left out. Where a skip would hide a failure, with `CI` set (to anything but
/// `false`/`0`) or `CL_NO_SKIP=1`, a missing root fails the test instead.
pub fn root_or_skip() -> bool {
    let euid = euid();
    if euid == 0 {
        return true;
    }
    let set =
        |var: &str| std::env::var(var).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    if set("CI") || set("CL_NO_SKIP") {
        panic!(
            "this test needs root (euid is {euid}) and CI or CL_NO_SKIP is set, so it fails \
             rather than skips: run scripts/test.sh as root"
        );
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        // Straight to the stream: libtest would swallow eprintln! of a passing test.
        let _ = writeln!(
            std::io::stderr(),
            "{}: skipped: needs root (run scripts/test.sh as root)",
            env!("CARGO_CRATE_NAME")
        );
    });
    false
}

/// The first line of every test that needs root: returns from the test (which then
/// passes) when `root_or_skip` says so.
#[allow(unused_macros)]
macro_rules! require_root {
    () => {
        if !$crate::common::root::root_or_skip() {
            return;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use require_root;
