//! What an operator relies on at the plugin's edge: a quiet ADD by default (the runtime's
//! journal gets a line per pod otherwise), errors that always reach the runtime, and a
//! ledger directory chain that survives a power cut right after the first ADD.
//! Needs root (namespaces).
//!
//!     cargo test --features testing --test operator

// Tests may unwrap: a panic is a failed test with its message ([lints] in Cargo.toml).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::process::Command;

use common::*;
use serde_json::json;
// -----------------------------------------------------------------------------------------

#[test]
fn add_with_default_options_writes_nothing_to_stderr_and_log_level_info_does() {
    require_root!();
    let f = Fixture::ledger_only();
    let ns = Netns::new();
    let netns = ns.path_str();
    // The fixture asks for logLevel info and a log file: take both out.
    let mut quiet = f.plugin_stdin("1.0.0");
    let obj = quiet.as_object_mut().unwrap();
    obj.remove("logLevel");
    obj.remove("logFile");
    let out = f.run_plugin(
        &f.plugin_env("ADD", "c-quiet", "eth0", Some(&netns)),
        &serde_json::to_vec(&quiet).unwrap(),
    );
    assert!(out.status.success(), "{}", describe(&out));
    assert!(
        out.stderr.is_empty(),
        "default ADD wrote to stderr: {}",
        describe(&out)
    );
    assert_eq!(f.record_files().len(), 1, "the quiet ADD is recorded");
    let out = f.run_plugin(
        &f.plugin_env("DEL", "c-quiet", "eth0", None),
        &serde_json::to_vec(&quiet).unwrap(),
    );
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{}",
        describe(&out)
    );

    // logLevel info: the ADD says what it recorded, on stderr without a log file.
    let mut info = quiet.clone();
    info["logLevel"] = json!("info");
    let out = f.run_plugin(
        &f.plugin_env("ADD", "c-info", "eth0", Some(&netns)),
        &serde_json::to_vec(&info).unwrap(),
    );
    assert!(out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.contains(" info ") && l.contains("c-info")),
        "no info line for the ADD on stderr: {}",
        describe(&out)
    );
    assert!(
        out.stdout.starts_with(b"{"),
        "stdout is CNI JSON only: {}",
        describe(&out)
    );

    // An error reaches stderr even with a log file and the default level, and the log.
    let mut failing = quiet.clone();
    let blocker = f.tmp.path().join("blocker");
    fs::write(&blocker, b"a file, not a directory").unwrap();
    failing["ledgerDir"] = json!(blocker.join("ledger"));
    failing["logFile"] = json!(f.log_file);
    let out = f.run_plugin(
        &f.plugin_env("ADD", "c-err", "eth0", Some(&netns)),
        &serde_json::to_vec(&failing).unwrap(),
    );
    assert_eq!(cni_error_code(&out), 5, "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.contains(" error ") && l.contains("CNI error 5")),
        "the error is not on stderr: {}",
        describe(&out)
    );
    assert!(f.log().contains("CNI error 5"), "log file: {:?}", f.log());
}

#[test]
fn the_first_add_fsyncs_every_directory_it_created() {
    require_root!();
    let f = Fixture::ledger_only();
    let ns = Netns::new();
    // Two ancestors that do not exist yet, then the ledger itself.
    let top = f.tmp.path().join("var");
    let ledger = top.join("lib").join("ledger");
    let mut stdin = f.plugin_stdin("1.0.0");
    stdin["ledgerDir"] = json!(ledger);
    let trace = f.tmp.path().join("strace.out");
    let mut c = Command::new("strace");
    c.args(["-f", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(&trace)
        .arg(ledger_bin())
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .envs(f.plugin_env("ADD", "c-dur", "eth0", Some(&ns.path_str())));
    let out = run_with_stdin(c, &serde_json::to_vec(&stdin).unwrap());
    assert!(
        out.status.success(),
        "ADD under strace (apt install strace): {}",
        describe(&out)
    );
    assert!(ledger
        .join("records")
        .join("cltest:c-dur:eth0.json")
        .is_file());
    // `-y` prints each fd as fd<path>: collect the directories that were fsynced.
    let text = fs::read_to_string(&trace).unwrap();
    let synced: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("fsync(") && l.ends_with("= 0"))
        .filter_map(|l| l.split_once('<')?.1.split_once('>').map(|(p, _)| p))
        .collect();
    // The parent of every new directory, and the directory of the new record.
    for dir in [
        f.tmp.path().to_path_buf(), // holds the new var/
        top.clone(),                // holds lib/
        top.join("lib"),            // holds ledger/
        ledger.clone(),             // holds records/ and the others
        ledger.join("records"),     // holds the record
    ] {
        let want = dir.display().to_string();
        assert!(
            synced.contains(&want.as_str()),
            "{want} was not fsynced; fsyncs seen:\n{}",
            synced.join("\n")
        );
    }
}

#[test]
fn an_add_let_through_by_on_ledger_error_warn_still_reports_the_error() {
    require_root!();
    let f = Fixture::ledger_only();
    let ns = Netns::new();
    let blocker = f.tmp.path().join("blocker");
    fs::write(&blocker, b"a file, not a directory").unwrap();
    let mut stdin = f.plugin_stdin("1.0.0");
    let obj = stdin.as_object_mut().unwrap();
    obj.remove("logLevel");
    obj.remove("logFile");
    stdin["ledgerDir"] = json!(blocker.join("ledger"));
    stdin["onLedgerError"] = json!("warn");
    let out = f.run_plugin(
        &f.plugin_env("ADD", "c-warn", "eth0", Some(&ns.path_str())),
        &serde_json::to_vec(&stdin).unwrap(),
    );
    assert!(out.status.success(), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .any(|l| l.contains(" error ") && l.contains("not recorded")),
        "an unrecorded ADD is silent at the default level: {}",
        describe(&out)
    );
}

/// `cni-ledger gc | head -1`: the reader gone before the CLI writes. Every command that
/// prints ends quietly (no panic, no error message) with 141, the status of a tool a
/// closed pipe ended; gc has done its work all the same (its report comes last).
#[test]
fn cli_output_into_a_closed_pipe_ends_quietly() {
    require_root!();
    let f = Fixture::ledger_only();
    let ns = Netns::new();
    f.add("c-pipe", "eth0", Some(&ns.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    let gone = Netns::new();
    f.add("c-gone", "eth0", Some(&gone.path_str()), None)
        .unwrap_or_else(|e| panic!("ADD: {e}"));
    drop(gone);
    let cache = f.cache_dir.display().to_string();
    for args in [
        vec!["list"],
        vec!["list", "--json"],
        vec!["verify"],
        vec!["gc", "--grace", "0", "--cni-cache-dir", &cache],
        vec!["gc", "--json", "--cni-cache-dir", &cache],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = f.ledger_cmd(&args).stdout(writer).output().unwrap();
        assert_eq!(out.status.code(), Some(141), "{args:?}: {}", describe(&out));
        // gc's log lines may be there; no panic, no error about the pipe.
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe") && !err.contains("rror"),
            "{args:?}: {}",
            describe(&out)
        );
    }
    // The first gc did its work: the gone pod's record was replayed and dropped.
    assert_eq!(f.record_files().len(), 1, "{:?}", f.record_files());
}
