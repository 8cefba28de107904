//! Log lines to a file (plugin option `logFile`) or stderr — never stdout, which in
//! plugin mode carries only CNI JSON.
//!
//! Levels filter what is written. The CLI logs at `info` (every gc decision). The plugin
//! logs at its `logLevel` option, `error` by default: whatever a plugin writes to stderr
//! lands in the runtime's journal once per pod, so a healthy ADD must write nothing.
//! Error lines always reach stderr, the runtime's channel, even with a log file, besides
//! the CNI error object on stdout.

use serde::Deserialize;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// How much is logged; each level includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    #[default]
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

/// Until the plugin sets its own, the CLI's level.
static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
/// The log file chosen by `init`; None is stderr.
static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
/// The file, opened on the first line written to it: a quiet ADD opens nothing.
static SINK: OnceLock<Mutex<Option<std::fs::File>>> = OnceLock::new();

/// Chooses the sink once per process.
pub fn init(file: Option<&Path>) {
    let _ = FILE.set(file.map(Path::to_path_buf));
}

pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn enabled(level: Level) -> bool {
    level as u8 <= LEVEL.load(Ordering::Relaxed)
}

/// The open log file, or None for stderr. An unopenable log file falls back to stderr
/// (and says so there) rather than failing an ADD over logging.
fn file_sink() -> Option<&'static Mutex<Option<std::fs::File>>> {
    let path = FILE.get()?.as_deref()?;
    Some(SINK.get_or_init(|| match open_log(path) {
        Ok(f) => Mutex::new(Some(f)),
        Err(e) => {
            eprintln!("cni-ledger: cannot open log file {}: {e}", path.display());
            Mutex::new(None)
        }
    }))
}

/// Opens `path` to append as root must: never through a symlink (`O_NOFOLLOW`), never
/// blocking (a FIFO with no reader fails at once), and, checked on the open file (no
/// race with a rename), only a regular file this process's user (root) owns with no
/// other name (a hard link to, say, /etc/shadow is not a log file).
pub fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::MetadataExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)?;
    let meta = f.metadata()?;
    let euid = nix::unistd::geteuid().as_raw();
    let refuse = |why: String| {
        Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            why,
        ))
    };
    if !meta.is_file() {
        return refuse("not a regular file".into());
    }
    if meta.uid() != euid {
        return refuse(format!("owned by uid {}, not {euid}", meta.uid()));
    }
    if meta.nlink() > 1 {
        return refuse(format!("it has {} hard links", meta.nlink()));
    }
    Ok(f)
}

pub fn write(level: Level, msg: std::fmt::Arguments) {
    if !enabled(level) {
        return;
    }
    let line = format!(
        "{} cni-ledger[{}] {} {msg}\n",
        crate::time::rfc3339(crate::time::now()),
        std::process::id(),
        level.name()
    );
    // One write per line so concurrent plugin processes appending to one file never
    // interleave within a line (O_APPEND).
    let mut to_stderr = level == Level::Error;
    match file_sink().map(Mutex::lock) {
        Some(Ok(mut guard)) => match guard.as_mut() {
            Some(f) => {
                let _ = f.write_all(line.as_bytes());
            }
            None => to_stderr = true,
        },
        Some(Err(_)) | None => to_stderr = true,
    }
    if to_stderr {
        // eprint! under `cargo test`, whose harness captures only the print macros.
        #[cfg(test)]
        eprint!("{line}");
        #[cfg(not(test))]
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => { $crate::logging::write($crate::logging::Level::Debug, format_args!($($arg)*)) };
}

#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => { $crate::logging::write($crate::logging::Level::Info, format_args!($($arg)*)) };
}

#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::logging::write($crate::logging::Level::Warn, format_args!($($arg)*)) };
}

#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => { $crate::logging::write($crate::logging::Level::Error, format_args!($($arg)*)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_ordered_and_parse_lowercase() {
        assert!(Level::Error < Level::Warn && Level::Warn < Level::Info);
        assert!(Level::Info < Level::Debug);
        let l: Level = serde_json::from_str("\"debug\"").unwrap();
        assert_eq!(l, Level::Debug);
        assert!(serde_json::from_str::<Level>("\"loud\"").is_err());
        assert_eq!(Level::default(), Level::Error);
    }
}
