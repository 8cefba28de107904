//! Log lines to a file (plugin option `logFile`) or stderr — never stdout, which in
//! plugin mode carries only CNI JSON.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

static SINK: OnceLock<Mutex<Box<dyn Write + Send>>> = OnceLock::new();

/// Chooses the sink once per process. An unopenable log file falls back to stderr
/// (and says so there) rather than failing an ADD over logging.
pub fn init(file: Option<&Path>) {
    let sink: Box<dyn Write + Send> = match file {
        Some(path) => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
        {
            Ok(f) => Box::new(f),
            Err(e) => {
                eprintln!("cni-ledger: cannot open log file {}: {e}", path.display());
                Box::new(std::io::stderr())
            }
        },
        None => Box::new(std::io::stderr()),
    };
    let _ = SINK.set(Mutex::new(sink));
}

pub fn write(level: &str, msg: std::fmt::Arguments) {
    let line = format!(
        "{} cni-ledger[{}] {level} {msg}\n",
        crate::time::rfc3339(crate::time::now()),
        std::process::id()
    );
    match SINK.get() {
        // One write per line so concurrent plugin processes appending to one file
        // never interleave within a line (O_APPEND).
        Some(sink) => {
            if let Ok(mut w) = sink.lock() {
                let _ = w.write_all(line.as_bytes());
            }
        }
        None => {
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => { $crate::logging::write("info", format_args!($($arg)*)) };
}

#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::logging::write("warn", format_args!($($arg)*)) };
}

#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => { $crate::logging::write("error", format_args!($($arg)*)) };
}
