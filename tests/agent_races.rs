//! `cni-ledger agent` racing other writers of its conflist, as a real process on scratch
//! dirs: a writer that replaces the file (by rename, or in place) while the agent is
//! injecting never loses its update; a symlinked conflist stays a symlink; a ledger
//! broken underneath the agent shows in `/readyz`. Needs root, curl.
//!
//!     cargo test --features testing --test agent_races
// Tests may unwrap: a panic there is a failed test with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod agent_common;
mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agent_common::*;
use common::*;
use serde_json::{json, Value};

const SECOND: Duration = Duration::from_secs(1);
const ROUNDS: u64 = 200;

/// The agent's directories, a short resync, and no CRI runtime (one this machine may
/// run is not the test's).
fn agent_args(f: &Fixture, bin: &Path) -> Vec<String> {
    let mut v = dir_args(bin, &f.conf_dir, &f.ledger_dir, &f.cache_dir);
    v.extend(["--resync", "1"].map(String::from));
    v
}

/// The writer's version `n`: a counter in the bridge's entry and in the bridge name,
/// so a lost version shows as an older counter.
fn version(plain: &Value, n: u64) -> Value {
    let mut doc = plain.clone();
    let bridge = &mut doc["plugins"][0];
    assert_eq!(bridge["type"], "bridge");
    bridge["writerVersion"] = json!(n);
    bridge["bridge"] = json!(format!("clr{}", n % 100_000));
    doc
}

/// The file holds the writer's version `want` whole, with the ledger first, its tail
/// (docs/CHAIN.md) last and nothing else added.
fn holds(path: &Path, want: &Value) -> bool {
    let Some(doc) = fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
    else {
        return false;
    };
    let Some(plugins) = doc["plugins"].as_array() else {
        return false;
    };
    if plugins.first().map(|p| &p["type"]) != Some(&json!("cni-ledger")) {
        return false;
    }
    let Some((tail, between)) = plugins[1..].split_last() else {
        return false;
    };
    if tail["type"] != json!("cni-ledger") || tail["role"] != json!("tail") {
        return false;
    }
    let mut rest = doc.clone();
    rest["plugins"] = Value::Array(between.to_vec());
    &rest == want
}

/// A small xorshift: the writer's timing varies round to round without a dependency.
struct Jitter(u64);
impl Jitter {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

/// `ROUNDS` rounds of a writer putting out a burst of versions, spaced so that some
/// land between the agent's read of the file and its write (the agent reads 20 ms after
/// an event, then writes and fsyncs a temp file before putting it in place). After each
/// round settles, the writer's last version is in the file, with the ledger first.
fn race(by_rename: bool) {
    // Hundreds of reverts within minutes would otherwise be a fight, and the agent
    // would back off for minutes; this test is about lost updates, not backing off.
    std::env::set_var("CNI_LEDGER_TEST_FIGHT_LIMIT", "1000000");
    let f = Fixture::new();
    let plain = plain_conflist(&f);
    let write = |doc: &Value| {
        if by_rename {
            write_by_rename(&f.conf_file, doc, ".writer-tmp")
        } else {
            write_in_place(&f.conf_file, doc)
        }
    };
    write(&version(&plain, 0));
    let bin = preinstalled_bin(&f);
    let log = f.tmp.path().join("agent.log");
    let mut agent = Agent::start(&ledger_bin(), &agent_args(&f, &bin), &log, None);
    wait_for(5 * SECOND, || holds(&f.conf_file, &version(&plain, 0)))
        .unwrap_or_else(|| panic!("never injected:\n{}", agent.log_text()));
    let mut jitter = Jitter(0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id()));
    let mut n = 0;
    for round in 1..=ROUNDS {
        let burst = 2 + jitter.next(8);
        for _ in 0..burst {
            n += 1;
            write(&version(&plain, n));
            std::thread::sleep(Duration::from_micros(jitter.next(12_000)));
        }
        let last = version(&plain, n);
        wait_for(5 * SECOND, || holds(&f.conf_file, &last)).unwrap_or_else(|| {
            panic!(
                "round {round}: the writer's last version {n} is not in the file with the \
                 ledger first:\n{}\n--- agent log ---\n{}",
                fs::read_to_string(&f.conf_file).unwrap_or_default(),
                agent.log_text()
            )
        });
        // Settled: nothing of the agent's still in flight puts an older version back.
        std::thread::sleep(Duration::from_millis(25));
        assert!(
            holds(&f.conf_file, &last),
            "round {round}: version {n} replaced after it was injected:\n{}\n--- agent log ---\n{}",
            fs::read_to_string(&f.conf_file).unwrap_or_default(),
            agent.log_text()
        );
    }
    let text = agent.log_text();
    let restarts = text.matches("reading it again").count();
    let put_back = text.matches("other writer's version was put back").count();
    eprintln!(
        "FIGURE {} writer, {ROUNDS} rounds, {n} versions: the agent started over {restarts} \
         times on a file changed between its read and its write ({put_back} seen only after \
         the swap, and undone)",
        if by_rename { "rename" } else { "in-place" }
    );
    // The race window was hit: otherwise this test proves nothing.
    assert!(restarts > 0, "the writer never hit the window:\n{text}");
    let leftovers: Vec<String> = list_dir(&f.conf_dir)
        .into_iter()
        .filter(|n| n.starts_with(".tmp."))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
    assert_eq!(agent.stop(10).code(), Some(0));
}

#[test]
fn a_writer_renaming_its_version_over_the_conflist_never_loses_it() {
    require_root!();
    race(true);
}

#[test]
fn a_writer_rewriting_the_conflist_in_place_never_loses_it() {
    require_root!();
    race(false);
}

fn is_symlink(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// A conflist that is a symlink into a ConfigMap-like `..data/` dir is read, never
/// replaced by a regular file nor written through: `/readyz` says why the ledger is not
/// in it, and once the link's source has the ledger first the agent is ready.
#[test]
fn a_symlinked_conflist_stays_a_symlink_and_readyz_says_why() {
    require_root!();
    let f = Fixture::new();
    let plain = plain_conflist(&f);
    let name = f.conf_file.file_name().unwrap().to_owned();
    // kubelet's projection: <dir>/..<stamp>/<file>, ..data -> ..<stamp>, <file> -> ..data/<file>
    let stamp1 = f.conf_dir.join("..2026_12_03_01");
    fs::create_dir(&stamp1).unwrap();
    write_in_place(&stamp1.join(&name), &plain);
    std::os::unix::fs::symlink("..2026_12_03_01", f.conf_dir.join("..data")).unwrap();
    let _ = fs::remove_file(&f.conf_file);
    std::os::unix::fs::symlink(Path::new("..data").join(&name), &f.conf_file).unwrap();
    let source_bytes = fs::read(stamp1.join(&name)).unwrap();

    let bin = preinstalled_bin(&f);
    let log = f.tmp.path().join("agent.log");
    let agent = Agent::start(&ledger_bin(), &agent_args(&f, &bin), &log, None);
    let mut last = (0, String::new());
    wait_for(5 * SECOND, || {
        last = agent.get("/readyz");
        last.0 == 503 && last.1.contains("symbolic link")
    })
    .unwrap_or_else(|| panic!("/readyz: {last:?}\n{}", agent.log_text()));
    assert!(
        last.1.lines().any(|l| l.starts_with("FAIL")
            && l.contains(&f.conf_file.display().to_string())
            && l.contains("..data/")),
        "{}",
        last.1
    );
    // Several resyncs later: still a link, its target untouched, no file made beside it.
    std::thread::sleep(3 * SECOND);
    assert!(is_symlink(&f.conf_file), "the link was replaced");
    assert_eq!(fs::read(stamp1.join(&name)).unwrap(), source_bytes);
    assert_eq!(
        list_dir(&f.conf_dir),
        [
            "..2026_12_03_01".to_string(),
            "..data".into(),
            name.to_string_lossy().into_owned()
        ],
        "{}",
        agent.log_text()
    );

    // The ConfigMap now has the ledger first (kubelet writes a new stamp dir and swaps
    // ..data by rename): ready, and still a link.
    let stamp2 = f.conf_dir.join("..2026_12_03_02");
    fs::create_dir(&stamp2).unwrap();
    write_in_place(&stamp2.join(&name), &plain);
    let out = Command::new(ledger_bin())
        .arg("inject")
        .arg("--ledger-dir")
        .arg(&f.ledger_dir)
        .arg("--conf-dir")
        .arg(&f.conf_dir)
        .arg(stamp2.join(&name))
        .env_remove("CNI_COMMAND")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::os::unix::fs::symlink("..2026_12_03_02", f.conf_dir.join("..data_tmp")).unwrap();
    fs::rename(f.conf_dir.join("..data_tmp"), f.conf_dir.join("..data")).unwrap();
    wait_for(5 * SECOND, || {
        last = agent.get("/readyz");
        last.0 == 200
    })
    .unwrap_or_else(|| panic!("/readyz: {last:?}\n{}", agent.log_text()));
    assert!(last.1.contains("ok ledger first in"), "{}", last.1);
    assert!(is_symlink(&f.conf_file), "the link was replaced");
    assert!(ledger_first(&f.conf_file));
}

/// `/readyz` reports a ledger whose `snapshots/` was removed (or replaced by a file),
/// naming it, and is ready again once it is restored.
#[test]
fn a_ledger_broken_underneath_the_agent_shows_in_readyz() {
    require_root!();
    let f = Fixture::new();
    write_in_place(&f.conf_file, &plain_conflist(&f));
    let bin = preinstalled_bin(&f);
    let log = f.tmp.path().join("agent.log");
    let agent = Agent::start(&ledger_bin(), &agent_args(&f, &bin), &log, None);
    let mut last = (0, String::new());
    let ready = |last: &mut (u32, String)| {
        *last = agent.get("/readyz");
        last.0 == 200
    };
    wait_for(5 * SECOND, || ready(&mut last))
        .unwrap_or_else(|| panic!("/readyz: {last:?}\n{}", agent.log_text()));
    let snapshots = f.ledger_dir.join("snapshots");
    let aside = f.ledger_dir.join("snapshots.aside");
    assert!(snapshots.is_dir());

    fs::rename(&snapshots, &aside).unwrap();
    let named = |last: &mut (u32, String), what: &str| {
        *last = agent.get("/readyz");
        last.0 == 503
            && last.1.lines().any(|l| {
                l.starts_with("FAIL ledger dir")
                    && l.contains(&snapshots.display().to_string())
                    && l.contains(what)
            })
    };
    wait_for(5 * SECOND, || named(&mut last, "missing"))
        .unwrap_or_else(|| panic!("snapshots/ removed, /readyz: {last:?}"));
    assert!(!snapshots.exists(), "the agent recreated it: damage hidden");

    fs::write(&snapshots, b"").unwrap();
    wait_for(5 * SECOND, || named(&mut last, "not a directory"))
        .unwrap_or_else(|| panic!("snapshots/ a file, /readyz: {last:?}"));

    fs::remove_file(&snapshots).unwrap();
    fs::rename(&aside, &snapshots).unwrap();
    wait_for(5 * SECOND, || ready(&mut last))
        .unwrap_or_else(|| panic!("restored, /readyz: {last:?}\n{}", agent.log_text()));
    assert!(last.1.contains("ok ledger dir usable"), "{}", last.1);

    // records/ on a read-only mount (root may write anything else).
    let records = f.ledger_dir.join("records");
    let ro = ReadOnlyMount::new(&records);
    wait_for(5 * SECOND, || {
        last = agent.get("/readyz");
        last.0 == 503
            && last.1.lines().any(|l| {
                l.starts_with("FAIL ledger dir")
                    && l.contains(&records.display().to_string())
                    && l.contains("not writable")
            })
    })
    .unwrap_or_else(|| panic!("records/ read-only, /readyz: {last:?}"));
    drop(ro);
    wait_for(5 * SECOND, || ready(&mut last))
        .unwrap_or_else(|| panic!("records/ writable again, /readyz: {last:?}"));
}

/// `dir` bind-mounted read-only over itself, unmounted on drop (also on a failed test,
/// so the temp dir can be removed).
struct ReadOnlyMount(PathBuf);
impl ReadOnlyMount {
    fn new(dir: &Path) -> ReadOnlyMount {
        let mount = |args: &[&str]| {
            let st = Command::new("mount").args(args).status().unwrap();
            assert!(st.success(), "mount {args:?}");
        };
        let d = dir.to_str().unwrap();
        mount(&["--bind", d, d]);
        let m = ReadOnlyMount(dir.to_path_buf());
        mount(&["-o", "remount,bind,ro", d]);
        m
    }
}
impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
