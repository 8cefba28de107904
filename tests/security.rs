//! Security of the ledger (docs/DESIGN.md §4, §8): private files and directories whatever the
//! umask, gc refuses a ledger anyone but root could have written, symlinks planted in
//! the ledger are never followed out of it, and plugin types that are not bare names
//! are never executed.
//!
//!     cargo test --features testing --test security

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod rel;

use common::*;
use rel::*;
use serde_json::json;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

/// Runs the binary as a plugin under umask 000, so only its own modes count.
fn add_with_umask0(w: &World, cid: &str, netns: &str) {
    let mut c = Command::new("sh");
    c.args(["-c", "umask 000; exec \"$0\" \"$@\""])
        .arg(ledger_bin())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", cid)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_NETNS", netns)
        .env("CNI_PATH", w.cni_path());
    let out = run_with_stdin(c, &w.stdin());
    assert!(out.status.success(), "ADD {cid}: {}", describe(&out));
}

fn gc_umask0(w: &World) -> std::process::Output {
    let args = w.gc_args(&[]);
    let mut c = Command::new("sh");
    c.args(["-c", "umask 000; exec \"$0\" \"$@\""])
        .arg(ledger_bin())
        .args(&args)
        .arg("--ledger-dir")
        .arg(&w.ledger_dir)
        .env_remove("CNI_COMMAND");
    c.output().unwrap()
}

fn modes(dir: &Path) -> Vec<(String, bool, u32)> {
    let mut v = Vec::new();
    fn rec(d: &Path, v: &mut Vec<(String, bool, u32)>) {
        for e in fs::read_dir(d).unwrap().flatten() {
            let m = fs::symlink_metadata(e.path()).unwrap();
            v.push((
                e.path().display().to_string(),
                m.is_dir(),
                m.permissions().mode() & 0o7777,
            ));
            if m.is_dir() {
                rec(&e.path(), v);
            }
        }
    }
    let m = fs::metadata(dir).unwrap();
    v.push((
        dir.display().to_string(),
        true,
        m.permissions().mode() & 0o7777,
    ));
    rec(dir, &mut v);
    v
}

#[test]
fn ledger_files_are_0600_and_dirs_0700_whatever_the_umask() {
    require_root!();
    let w = World::new("sec", "sec", "0");
    let live = Netns::with_prefix("cls");
    let mut gone = Netns::with_prefix("cls");
    add_with_umask0(&w, "live", &live.path_str());
    add_with_umask0(&w, "stale", &gone.path_str());
    add_with_umask0(&w, "failing", &gone.path_str());
    add_with_umask0(&w, "damaged", &gone.path_str());
    gone.delete();
    fs::write(w.record_path("damaged"), b"{\"format\":1,").unwrap();
    w.set_fail("failing", true);
    // replay (removal + snapshot sweep), failed replay (record rewrite), quarantine
    let g = gc_umask0(&w);
    assert_eq!(g.status.code(), Some(1), "{}", describe(&g));
    assert!(w.record_path("failing").exists());
    assert!(!w.record_path("stale").exists());
    assert_eq!(w.quarantine().len(), 1);
    let all = modes(&w.ledger_dir);
    let mut files = 0;
    for (path, is_dir, mode) in &all {
        if path.contains("/quarantine/") {
            // moved aside as they were: the planted one has the test's own mode
            continue;
        }
        if *is_dir {
            assert_eq!(*mode, 0o700, "directory {path} has mode {mode:o}");
        } else {
            files += 1;
            assert_eq!(*mode, 0o600, "file {path} has mode {mode:o}");
        }
    }
    assert!(files >= 4, "{all:?}");
    for (path, _, _) in &all {
        let m = fs::symlink_metadata(path).unwrap();
        assert_eq!((m.uid(), m.gid()), (0, 0), "{path} is not root's");
    }
    // Observation only: the plugin's log file (outside the ledger) follows the umask.
    let log_mode = fs::metadata(&w.plugin_log).unwrap().permissions().mode() & 0o777;
    eprintln!(
        "NOTE security: plugin logFile created under umask 000 has mode {log_mode:o} \
         (ledger files: 0600, dirs: 0700)"
    );
}

/// gc refuses each of these ledgers, and ADD refuses to record in them with gc's very
/// words (one check, `Ledger::check_trusted`), writing no record.
#[test]
fn gc_refuses_a_ledger_others_could_write() {
    require_root!();
    let w = World::new("sec", "sec", "0");
    let live = Netns::with_prefix("clsl");
    let mut gone = Netns::with_prefix("cls");
    w.add("stale", &gone.path_str(), &[]);
    gone.delete();
    let chown = |p: &Path, uid: u32, gid: u32| {
        std::os::unix::fs::chown(p, Some(uid), Some(gid)).unwrap();
    };
    let chmod = |p: &Path, mode: u32| set_mode(p, mode);
    let root = w.ledger_dir.clone();
    type Step<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Step, Step)> = vec![
        (
            "ledger dir owned by uid 65534",
            Box::new(|| chown(&root, 65534, 0)),
            Box::new(|| chown(&root, 0, 0)),
        ),
        (
            "ledger dir owned by uid 65534, group 65534",
            Box::new(|| chown(&root, 65534, 65534)),
            Box::new(|| chown(&root, 0, 0)),
        ),
        (
            "ledger dir group-writable",
            Box::new(|| chmod(&root, 0o770)),
            Box::new(|| chmod(&root, 0o700)),
        ),
        (
            "ledger dir other-writable",
            Box::new(|| chmod(&root, 0o702)),
            Box::new(|| chmod(&root, 0o700)),
        ),
        (
            "records/ owned by uid 1",
            Box::new(|| chown(&w.records_dir(), 1, 0)),
            Box::new(|| chown(&w.records_dir(), 0, 0)),
        ),
        (
            "records/ mode 0777",
            Box::new(|| chmod(&w.records_dir(), 0o777)),
            Box::new(|| chmod(&w.records_dir(), 0o700)),
        ),
        (
            "snapshots/ group-writable",
            Box::new(|| chmod(&w.snapshots_dir(), 0o720)),
            Box::new(|| chmod(&w.snapshots_dir(), 0o700)),
        ),
        (
            "locks/ owned by uid 65534",
            Box::new(|| chown(&w.ledger_dir.join("locks"), 65534, 0)),
            Box::new(|| chown(&w.ledger_dir.join("locks"), 0, 0)),
        ),
    ];
    for (i, (what, spoil, restore)) in cases.iter().enumerate() {
        spoil();
        let (g, _) = w.gc(&[], &[]);
        assert_eq!(
            g.status.code(),
            Some(2),
            "{what}: gc did not refuse: {}",
            describe(&g)
        );
        let gc_err = text(&g.stderr);
        let reason = gc_err
            .lines()
            .find_map(|l| l.find("refusing ledger").map(|at| l[at..].to_string()))
            .unwrap_or_else(|| panic!("{what}: {}", describe(&g)));
        let cid = format!("new-{i}");
        let add = w.plugin("ADD", &cid, "eth0", Some(&live.path_str()), &[]);
        assert!(
            !add.status.success(),
            "{what}: ADD recorded: {}",
            describe(&add)
        );
        let answer: serde_json::Value = serde_json::from_slice(&add.stdout).unwrap();
        let said = format!("{} {}", answer["msg"], answer["details"]);
        assert!(
            said.contains(&reason),
            "{what}: gc said {reason:?}, ADD {said}"
        );
        assert!(!w.record_path(&cid).exists(), "{what}");
        assert!(w.log_lines().is_empty(), "{what}: a plugin ran");
        assert!(w.record_path("stale").exists(), "{what}");
        restore();
    }
    // Owned by root:<another group> without group write is fine.
    chown(&root, 0, 65534);
    let (g, _) = w.gc(&[], &[]);
    assert_eq!(g.status.code(), Some(0), "{}", describe(&g));
    assert_eq!(w.log_lines().len(), 1);
    eprintln!(
        "FIGURE security: gc refused {} kinds of untrusted ledger (exit 2)",
        cases.len()
    );
}

#[test]
fn symlinks_planted_in_the_ledger_are_not_followed() {
    require_root!();
    let w = World::new("sec", "sec", "0");
    let outside = TempDir::new("outside");
    let mut gone = Netns::with_prefix("cls");
    // Valid stale records of evil-1..3, moved out of the ledger and replaced by links.
    for cid in ["evil-1", "evil-2", "evil-3", "evil-4"] {
        w.add(cid, &gone.path_str(), &[]);
    }
    let snap_name = format!("{}.json", sha256_of(&w.conflist_bytes()));
    gone.delete();
    let mut targets = Vec::new();
    for cid in ["evil-1", "evil-2", "evil-3"] {
        let target = outside.path().join(format!("{cid}.json"));
        fs::rename(w.record_path(cid), &target).unwrap();
        targets.push(target);
    }
    let link = |cid: &str| {
        let target = outside.path().join(format!("{cid}.json"));
        std::os::unix::fs::symlink(target, w.record_path(cid)).unwrap();
    };
    link("evil-1");
    // The snapshot evil-4 needs: a link to an outside copy with the right content.
    let snap_target = outside.path().join("snapshot.json");
    fs::rename(w.snapshots_dir().join(&snap_name), &snap_target).unwrap();
    std::os::unix::fs::symlink(&snap_target, w.snapshots_dir().join(&snap_name)).unwrap();
    // A lock file link: ADD must not create, truncate or lock through it.
    let lock_target = outside.path().join("lock-target");
    fs::write(&lock_target, b"keep me").unwrap();
    std::os::unix::fs::symlink(
        &lock_target,
        w.ledger_dir.join("locks/sec:evil-5:eth0.lock"),
    )
    .unwrap();
    let snapshot_before = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        (fs::read(p).unwrap(), m.ino(), m.mtime(), m.mtime_nsec())
    };
    let before: Vec<_> = targets
        .iter()
        .chain([&snap_target, &lock_target])
        .map(|p| snapshot_before(p))
        .collect();

    // verify: exit 1, names every link
    let v = w.verify();
    let vout = text(&v.stdout);
    assert_eq!(v.status.code(), Some(1), "{}", describe(&v));
    assert!(verify_names(&vout, &w.record_path("evil-1")), "{vout}");
    assert!(
        verify_names(&vout, &w.snapshots_dir().join(&snap_name)),
        "{vout}"
    );

    // list: damaged (reason symlink), quarantined, never live or stale
    let rows = w.list_json();
    let evil1 = rows
        .iter()
        .find(|r| r["file"] == json!(w.record_path("evil-1").display().to_string()))
        .unwrap_or_else(|| panic!("{rows:#?}"));
    assert_eq!(evil1["state"], "damaged", "{evil1}");
    assert_eq!(evil1["reason"], "symlink", "{evil1}");
    assert!(evil1["quarantinedTo"].is_string(), "{evil1}");
    for r in &rows {
        let cid = r["containerId"].as_str().unwrap_or("");
        assert!(
            !cid.starts_with("evil-") || cid == "evil-4",
            "list followed a link: {r}"
        );
    }

    // more links (one to a directory), found by verify and then by gc
    link("evil-2");
    link("evil-3");
    std::os::unix::fs::symlink(outside.path(), w.records_dir().join("sec:dir:eth0.json")).unwrap();
    let v = w.verify();
    let vout = text(&v.stdout);
    assert_eq!(v.status.code(), Some(1), "{}", describe(&v));
    for cid in ["evil-2", "evil-3", "dir"] {
        assert!(
            verify_names(&vout, &w.record_path(cid)),
            "verify does not name the {cid} link:\n{vout}"
        );
    }

    // gc: reports and quarantines the links, runs no plugin through them
    let (g, rep) = w.gc(&[], &[]);
    let rep = rep.unwrap_or_else(|| panic!("{}", describe(&g)));
    let damaged: Vec<&str> = rep["damaged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["file"].as_str().unwrap())
        .collect();
    for cid in ["evil-2", "evil-3", "dir"] {
        let p = w.record_path(cid).display().to_string();
        assert!(
            damaged.contains(&p.as_str()),
            "gc did not report {p}: {rep:#}"
        );
    }
    for l in w.log_lines() {
        assert_eq!(l.cid, "evil-4", "a plugin ran for a link: {l:?}");
    }
    // evil-4's snapshot was a link: it is not used (quarantined), the conflist is.
    let r4 = rep["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["containerId"] == "evil-4")
        .unwrap_or_else(|| panic!("{rep:#}"));
    assert_ne!(r4["configSource"], "snapshot", "{r4}");

    // ADD through a planted lock link fails or succeeds, but never touches its target.
    // (Locks are byte ranges of locks/keys now, so a per-key lock file is never opened;
    // run after gc, since a successful ADD rewrites the conflist's snapshot link.)
    let out = w.plugin("ADD", "evil-5", "eth0", Some("/proc/self/ns/net"), &[]);
    eprintln!(
        "NOTE security: ADD whose lock file is a planted symlink: exit {:?}, stdout {}",
        out.status.code(),
        text(&out.stdout).trim()
    );

    // the targets outside are untouched: same bytes, inode and mtime, still there
    let after: Vec<_> = targets
        .iter()
        .chain([&snap_target, &lock_target])
        .map(|p| snapshot_before(p))
        .collect();
    assert_eq!(before, after, "a file outside the ledger was touched");
    // the links themselves went to quarantine, as links
    let q = w.quarantine();
    let links = q.values().filter(|b| b.starts_with(b"symlink -> ")).count();
    assert!(links >= 5, "quarantine: {q:?}");
    for name in w.records().keys() {
        assert!(
            !name.starts_with("sec:evil-1") && !name.starts_with("sec:dir"),
            "{name}"
        );
    }
}

#[test]
fn plugin_types_that_are_not_bare_names_are_never_executed() {
    require_root!();
    let w = World::new("sec", "sec", "0");
    // A script one directory up from the CNI bin dir, reachable as "../evil".
    let evil_log = w.root().join("evil-ran");
    let evil = w.root().join("evil");
    fs::write(
        &evil,
        format!("#!/bin/sh\necho ran >> '{}'\nexit 0\n", evil_log.display()),
    )
    .unwrap();
    set_mode(&evil, 0o755);
    let bad_types = [
        "../../bin/sh".to_string(),
        "../evil".to_string(),
        evil.display().to_string(),
        "..".to_string(),
        "./counter".to_string(),
    ];
    let mut plugins = vec![json!({"type": "counter"})];
    plugins.extend(bad_types.iter().map(|t| json!({"type": t})));
    w.write_conflist(1, &plugins);
    let mut gone = Netns::with_prefix("cls");
    w.add("victim", &gone.path_str(), &[]);
    gone.delete();
    let snap = fs::read_to_string(
        w.snapshots_dir()
            .join(format!("{}.json", sha256_of(&w.conflist_bytes()))),
    )
    .unwrap();
    assert!(
        snap.contains("../../bin/sh"),
        "the snapshot holds the bad types"
    );

    let (g, rep) = w.gc(&["--max-attempts", "1"], &[]);
    let rep = rep.unwrap_or_else(|| panic!("{}", describe(&g)));
    assert_eq!(g.status.code(), Some(1), "{}", describe(&g));
    let r = &rep["records"][0];
    assert_eq!(r["configSource"], "snapshot", "{r}");
    assert_eq!(r["action"], "failed", "{r}");
    for t in &bad_types {
        let p = r["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["type"] == json!(t))
            .unwrap_or_else(|| panic!("no outcome for {t}: {r}"));
        assert_eq!(p["ok"], false, "{p}");
        assert!(
            p["error"]
                .as_str()
                .unwrap_or("")
                .contains("not a bare name"),
            "{t}: {p}"
        );
    }
    assert!(!evil_log.exists(), "a plugin type with a path was executed");
    // The good plugin of the chain still got its DEL; the record stays for an operator.
    assert_eq!(w.log_lines().len(), 1);
    assert!(w.record_path("victim").exists());
}

/// Issue #30 item 6: `logFile` is opened with O_NOFOLLOW and without blocking, and is
/// appended to only when, checked on the open file, it is a regular file root owns
/// with one name. A symlink (to a file root owns), a file another user owns, a second
/// hard link to a root file and a FIFO are each refused: the ADD still succeeds, says
/// so on stderr, and the file behind is untouched. An ordinary path is created 0600.
#[test]
fn log_file_is_never_followed_nor_appended_unless_root_owns_it_alone() {
    require_root!();
    let w = World::new("seclog", "seclog", "0");
    let ns = Netns::with_prefix("cllog");
    let dir = w.ledger_dir.parent().unwrap().join("logs");
    fs::create_dir_all(&dir).unwrap();
    let precious = dir.join("precious");
    fs::write(&precious, "precious\n").unwrap();
    std::os::unix::fs::symlink(&precious, dir.join("link.log")).unwrap();
    fs::hard_link(&precious, dir.join("hard.log")).unwrap();
    let theirs = dir.join("theirs.log");
    fs::write(&theirs, "theirs\n").unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    nix::unistd::mkfifo(
        &dir.join("fifo.log"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let add = |cid: &str, log: &Path| {
        let mut v: serde_json::Value = serde_json::from_slice(&w.stdin()).unwrap();
        v["logFile"] = json!(log);
        v["logLevel"] = json!("info");
        let out = w.plugin_with(
            &serde_json::to_vec(&v).unwrap(),
            "ADD",
            cid,
            "eth0",
            Some(&ns.path_str()),
            &[],
        );
        assert!(out.status.success(), "ADD {cid}: {}", describe(&out));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    for (cid, name, why) in [
        ("l1", "link.log", "Too many levels of symbolic links"),
        ("l2", "hard.log", "it has 2 hard links"),
        ("l3", "theirs.log", "owned by uid 65534, not 0"),
        ("l4", "fifo.log", "No such device or address"),
    ] {
        let err = add(cid, &dir.join(name));
        assert!(
            err.contains(&format!(
                "cannot open log file {}",
                dir.join(name).display()
            )) && err.contains(why),
            "{name}: {err}"
        );
    }
    assert_eq!(fs::read_to_string(&precious).unwrap(), "precious\n");
    assert_eq!(fs::read_to_string(&theirs).unwrap(), "theirs\n");
    let good = dir.join("good.log");
    let err = add("l5", &good);
    assert!(!err.contains("cannot open log file"), "{err}");
    let meta = fs::metadata(&good).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, 0));
    assert!(fs::read_to_string(&good)
        .unwrap()
        .contains("ADD seclog/l5/eth0"));
}
