//! Everything the CLI writes to stdout and stderr. SIGPIPE is ignored (src/process.rs),
//! so a reader that went away (`cni-ledger gc | head -1`) shows as EPIPE on the next
//! write, where `println!` panics. Here the first failed write stops all further output
//! of that stream and the run goes on: gc's work is done before its report is printed,
//! and never left half done because no one reads the report.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// The exit status a CLI run whose stdout reader went away ends with, when it would
/// otherwise have ended with 0: 128 + SIGPIPE, the status a shell shows for a tool the
/// signal ended (`yes | head -1`). Quiet, as such a tool is, and non-zero, as coreutils
/// are when SIGPIPE is ignored: a script under `set -o pipefail` learns that output
/// was lost, and a status that already says more (1: damage, failures) is kept.
pub const PIPE_CLOSED: i32 = 141;

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

/// Whether a write to stdout failed: what was left unwritten was lost.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// The run's exit status, once stdout may have closed under it.
pub fn exit_status(code: i32) -> i32 {
    if code == 0 && stdout_closed() {
        PIPE_CLOSED
    } else {
        code
    }
}

/// Stdout as a writer that never fails: the first error closes it for the rest of the
/// run and every later write is dropped. Buffer it (`BufWriter`) for many small writes.
pub struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !stdout_closed() {
            let mut out = io::stdout().lock();
            if out.write_all(buf).and_then(|()| out.flush()).is_err() {
                STDOUT_CLOSED.store(true, Ordering::Relaxed);
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One piece of stdout (`out!`, `outln!`).
pub fn print(args: fmt::Arguments<'_>) {
    let _ = Stdout.write_fmt(args);
}

/// One piece of stderr (`errln!`): a closed stderr drops it, as a closed stdout does.
pub fn eprint(args: fmt::Arguments<'_>) {
    if STDERR_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    if io::stderr().lock().write_fmt(args).is_err() {
        STDERR_CLOSED.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_stdout_only_changes_a_zero_status() {
        STDOUT_CLOSED.store(false, Ordering::Relaxed);
        assert_eq!(exit_status(0), 0);
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
        assert_eq!(exit_status(0), PIPE_CLOSED);
        assert_eq!(exit_status(1), 1);
        assert_eq!(exit_status(2), 2);
        STDOUT_CLOSED.store(false, Ordering::Relaxed);
    }
}
