//! Who may run what: the root tiers start each test with `require_root!()`, which
//! skips it for a normal user (one line per test binary) and fails it under CI;
//! `require_tools!(paths)` does the same for tools scripts/test.sh puts under target/.

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
/// skipped (see `may_skip`), so `cargo test` as a normal user runs the no-root tier and
/// names each root tier it left out.
pub fn root_or_skip() -> bool {
    let euid = euid();
    euid == 0
        || !may_skip(
            &format!("needs root (euid is {euid})"),
            "needs root (run scripts/test.sh as root)",
        )
}

/// Whether the tools scripts/test.sh fetches or makes under the tree (`paths`,
/// relative to it) are all there; if not, the test is skipped (see `may_skip`).
pub fn tools_or_skip(paths: &[&str]) -> bool {
    let missing: Vec<&str> = paths
        .iter()
        .copied()
        .filter(|p| !super::repo().join(p).exists())
        .collect();
    missing.is_empty()
        || !may_skip(
            &format!("needs {}", missing.join(", ")),
            &format!(
                "needs {} (run scripts/test.sh as root once)",
                missing.join(", ")
            ),
        )
}

/// Says once per test binary, on stderr past libtest's capture (which would swallow
/// an eprintln! of a passing test), `<binary>: skipped: <line>`, and returns true.
/// Where a skip would hide a failure, with `CI` set (to anything but `false`/`0`) or
/// `CL_NO_SKIP=1`, it panics with `why` instead: no CI run passes by skipping.
fn may_skip(why: &str, line: &str) -> bool {
    let set =
        |var: &str| std::env::var(var).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    if set("CI") || set("CL_NO_SKIP") {
        panic!(
            "this test {why} and CI or CL_NO_SKIP is set, so it fails rather than skips: \
             run scripts/test.sh as root"
        );
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        let _ = writeln!(
            std::io::stderr(),
            "{}: skipped: {line}",
            env!("CARGO_CRATE_NAME")
        );
    });
    true
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

/// Whether the plugin will trust a ledger this user owns: root's always, another user's
/// only in a `testing` build (`faults::trust_ledger_owner`), since gc and the plugin
/// refuse a ledger any other user could have written. Otherwise as `may_skip`.
pub fn ledger_trust_or_skip() -> bool {
    cfg!(feature = "testing")
        || nix::unistd::geteuid().is_root()
        || !may_skip(
            "writes a ledger its user owns, which only a testing build trusts",
            "its plugin calls need a ledger the plugin trusts: run `cargo test --features testing` (or as root)",
        )
}

/// The first line of a test whose plugin calls write or act on a ledger: returns from
/// the test when `ledger_trust_or_skip` says so.
#[allow(unused_macros)]
macro_rules! require_ledger_trust {
    () => {
        if !$crate::common::root::ledger_trust_or_skip() {
            return;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use require_ledger_trust;

/// The first line of a test that needs tools under target/ (paths relative to the
/// tree): returns from the test when they are missing and `tools_or_skip` says so.
#[allow(unused_macros)]
macro_rules! require_tools {
    ($($path:expr),+ $(,)?) => {
        if !$crate::common::root::tools_or_skip(&[$($path),+]) {
            return;
        }
    };
}
#[allow(unused_imports)]
pub(crate) use require_tools;
