//! The command-line face: selected when `CNI_COMMAND` is not set.

/// `print!` through `out::print`: safe when stdout's reader has gone.
macro_rules! out {
    ($($t:tt)*) => { $crate::cli::out::print(format_args!($($t)*)) };
}

/// `println!` through `out::print`.
macro_rules! outln {
    () => { $crate::cli::out::print(format_args!("\n")) };
    ($($t:tt)*) => { $crate::cli::out::print(format_args!("{}\n", format_args!($($t)*))) };
}

/// `eprintln!` through `out::eprint`.
macro_rules! errln {
    ($($t:tt)*) => { $crate::cli::out::eprint(format_args!("{}\n", format_args!($($t)*))) };
}

mod adopt;
mod agent;
mod gc;
mod inject;
mod list;
mod out;
mod replay_flags;
mod verify;

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// `--help` and the man page's DESCRIPTION: the face clap does not see, and the files.
const LONG_ABOUT: &str = "\
Records every CNI ADD durably and replays DEL for sandboxes that vanished.

With CNI_COMMAND set, cni-ledger is a chained CNI plugin: listed first in a conflist \
(see `cni-ledger inject`), it writes a record of every ADD to its ledger before any \
other plugin allocates anything, and drops the record on DEL. Without CNI_COMMAND it \
is this command-line tool: `gc` replays DEL through the recorded chain for every record \
whose sandbox is gone (run at boot and every 5 minutes by cni-ledger-gc.timer), `list` \
and `verify` inspect the ledger, `inject` edits conflists.

The ledger lives in /var/lib/cni-ledger (records/, snapshots/, locks/, quarantine/); \
conflists are read from /etc/cni/net.d. Plugin options (ledgerDir, confDir, logFile, \
logLevel, onLedgerError, capabilities, gcGraceSecs, gcBudgetSecs, lockTimeoutMs) go in the ledger's \
own conflist entry.";

#[derive(Parser)]
#[command(
    name = "cni-ledger",
    version,
    about = "Records every CNI ADD durably and replays DEL for sandboxes that vanished",
    long_about = LONG_ABOUT
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List recorded attachments with their liveness.
    List(list::Args),
    /// Replay DEL for every recorded attachment whose sandbox is gone.
    Gc(gc::Args),
    /// Put cni-ledger first in conflists (or take it out with --remove).
    Inject(inject::Args),
    /// Check every record and snapshot; exit 1 on any damage. Changes nothing.
    Verify(verify::Args),
    /// Make records for attachments in libcni's cache that the ledger lacks.
    Adopt(adopt::Args),
    /// Keep this node covered: install the binary, keep the ledger in the chain, run gc,
    /// serve metrics.
    Agent(agent::Args),
}

/// The CLI's clap definition, for the generated man pages and completions.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

pub fn ledger_dir_default() -> PathBuf {
    PathBuf::from(crate::cni::config::DEFAULT_LEDGER_DIR)
}

/// Runs the CLI; returns the exit status (2 for usage and ledger errors).
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
                _ => 2,
            };
        }
    };
    let result = match cli.command {
        Cmd::List(a) => list::run(a),
        Cmd::Gc(a) => gc::run(a),
        Cmd::Inject(a) => inject::run(a),
        Cmd::Verify(a) => verify::run(a),
        Cmd::Adopt(a) => adopt::run(a),
        Cmd::Agent(a) => agent::run(a),
    };
    match result {
        Ok(code) => out::exit_status(code),
        // An error from writing stdout is the reader gone: quiet, as a closed pipe is.
        Err(_) if out::stdout_closed() => out::PIPE_CLOSED,
        Err(e) => {
            errln!("cni-ledger: {e:#}");
            2
        }
    }
}

fn display_width(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.chars().count()
    }
}

/// Prints rows as columns padded to the widest cell, through one buffer: stdout is
/// line-buffered, and a 100,000-row table must not cost 100,000 writes.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    use std::io::Write;
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(display_width(cell));
        }
    }
    let mut out = std::io::BufWriter::new(out::Stdout);
    let mut line = String::new();
    let mut emit = |row: &[&str]| {
        line.clear();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = w.saturating_sub(display_width(cell)) + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    };
    emit(header);
    for row in rows {
        emit(&row.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let _ = out.flush();
}
