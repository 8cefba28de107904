//! Installing the plugin binary into the host's CNI bin dirs from the agent's own
//! executable. Never written in place: a runtime may be executing the old copy (a write
//! would fail with ETXTBSY, or worse, tear it); a temp file, fsynced, renamed over the old
//! name leaves a running copy its own inode and every new exec a whole file. No child of
//! the agent (a gc replay) is forked while the temp file is open for writing, or it would
//! hold it open past the rename and make the runtime's exec fail with ETXTBSY.
//!
//! An agent killed between the temp file's creation and the rename leaves it behind:
//! the agent removes its own such files once they are old (`sweep_temps`).

use anyhow::{Context, Result};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// A temp file of ours this long unmodified is a leftover: an install takes well under
/// a second, so no agent or installer still writing one (another agent during a rolling
/// update, say) is ever raced.
const TEMP_MAX_AGE: Duration = Duration::from_secs(600);
/// How often a bin dir is looked at for leftovers (and at the agent's first check): a
/// killed agent's temp file is fresh when its successor starts.
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// What the agent last verified in one bin dir; a change of any of these re-checks bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    mode: u32,
}

fn seen(path: &Path) -> Option<Seen> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some(Seen {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        mode: m.mode(),
    })
}

pub struct Installer {
    source: PathBuf,
    name: String,
    verified: Vec<(PathBuf, Option<Seen>)>,
    /// When each bin dir (as in `verified`) was last swept of leftover temp files.
    swept: Vec<Option<Instant>>,
    /// Where the agent itself was started from (under systemd: the bin dir itself).
    running_from: Option<PathBuf>,
}

impl Installer {
    pub fn new(source: PathBuf, name: &str, dirs: &[PathBuf]) -> Installer {
        Installer {
            source,
            name: name.to_string(),
            verified: dirs.iter().map(|d| (d.clone(), None)).collect(),
            swept: vec![None; dirs.len()],
            running_from: std::fs::read_link("/proc/self/exe").ok().map(|p| {
                let s = p.to_string_lossy();
                PathBuf::from(s.strip_suffix(" (deleted)").unwrap_or(&s))
            }),
        }
    }

    /// Makes every bin dir hold the same bytes as the source; returns per dir whether it
    /// is installed now. Cheap when nothing changed since the last check (one lstat).
    pub fn ensure(&mut self) -> Vec<(PathBuf, Result<()>)> {
        let mut source: Option<Vec<u8>> = None;
        let mut out = Vec::new();
        for ((dir, last), swept) in self.verified.iter_mut().zip(&mut self.swept) {
            if swept.is_none_or(|t| t.elapsed() >= SWEEP_EVERY) {
                *swept = Some(Instant::now());
                for p in sweep_temps(dir, &self.name, SystemTime::now()) {
                    crate::info!(
                        "agent: removed {}, a temp file an interrupted install left",
                        p.display()
                    );
                }
            }
            let target = dir.join(&self.name);
            let now = seen(&target);
            // Started from this very file: nothing to install, and a newer binary put
            // there (an upgrade) must not be overwritten by the older one running.
            if self.running_from.as_ref() == Some(&target) {
                if *last != now && last.is_some() {
                    crate::warn!(
                        "agent: {} changed since the agent started (an upgrade?); restart the agent to run it",
                        target.display()
                    );
                }
                *last = now;
                out.push((dir.clone(), Ok(())));
                continue;
            }
            if now.is_some() && *last == now {
                out.push((dir.clone(), Ok(())));
                continue;
            }
            let result = (|| -> Result<()> {
                if source.is_none() {
                    source = Some(std::fs::read(&self.source).with_context(|| {
                        format!("reading own executable {}", self.source.display())
                    })?);
                }
                let bytes = source.as_deref().unwrap_or_default();
                let same = std::fs::symlink_metadata(&target)
                    .is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
                    && std::fs::read(&target).is_ok_and(|b| b == bytes);
                if !same {
                    replace_executable(dir, &self.name, bytes)?;
                    crate::info!("agent: installed {}", target.display());
                }
                *last = seen(&target);
                Ok(())
            })();
            if result.is_err() {
                *last = None;
            }
            out.push((dir.clone(), result));
        }
        out
    }
}

/// Whether `file` is a name `replace_executable` gives a temp file for `name`:
/// `.tmp.<name>.<pid>.<seq>` (`fsio::write_temp`'s).
fn is_own_temp(file: &str, name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = file
        .strip_prefix(crate::ledger::fsio::TMP_PREFIX)
        .and_then(|r| r.strip_prefix(name))
        .and_then(|r| r.strip_prefix('.'))
    else {
        return false;
    };
    rest.split_once('.')
        .is_some_and(|(pid, seq)| digits(pid) && digits(seq))
}

/// Removes from `dir` the temp files an interrupted install of `name` left: our own
/// name pattern only, regular files (never a symlink or a directory) owned by this
/// user, unmodified for `TEMP_MAX_AGE` at `now`. Returns what it removed; never fails
/// (what it cannot read or remove stays, to be tried at the next sweep).
fn sweep_temps(dir: &Path, name: &str, now: SystemTime) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let uid = nix::unistd::geteuid().as_raw();
    let mut removed = Vec::new();
    for e in entries.flatten() {
        if !e.file_name().to_str().is_some_and(|f| is_own_temp(f, name)) {
            continue;
        }
        let path = e.path();
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        // A modification time in the future (a clock set back) counts as fresh.
        let old = m
            .modified()
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age >= TEMP_MAX_AGE);
        if m.file_type().is_file() && m.uid() == uid && old && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

fn replace_executable(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // A fresh O_EXCL temp: a name planted in the bin dir (a symlink to a file the agent
    // would then overwrite as root) is never opened.
    // No child is forked while its write descriptor is open (`process::exec_write_guard`).
    let tmp = {
        let _no_spawn = crate::process::exec_write_guard();
        crate::ledger::fsio::write_temp(dir, name, bytes, "binary", 0o755)?
    };
    let target = dir.join(name);
    if let Err(e) = std::fs::rename(&tmp, &target) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("replacing {}", target.display()));
    }
    crate::ledger::fsio::fsync_dir(dir).with_context(|| format!("syncing {}", dir.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn installs_once_and_again_after_a_change() {
        let dir = std::env::temp_dir().join(format!("cl-agent-inst-{}", std::process::id()));
        let bin = dir.join("bin");
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("src");
        std::fs::write(&src, b"new bytes").unwrap();
        let mut i = Installer::new(src, "cni-ledger", std::slice::from_ref(&bin));
        assert!(i.ensure()[0].1.is_ok());
        let target = bin.join("cni-ledger");
        assert_eq!(std::fs::read(&target).unwrap(), b"new bytes");
        assert_eq!(
            std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
            0o755
        );
        let ino = std::fs::metadata(&target).unwrap().ino();
        assert!(i.ensure()[0].1.is_ok());
        assert_eq!(std::fs::metadata(&target).unwrap().ino(), ino, "rewritten");
        std::fs::write(&target, b"old").unwrap();
        assert!(i.ensure()[0].1.is_ok());
        assert_eq!(std::fs::read(&target).unwrap(), b"new bytes");
        assert_eq!(std::fs::read_dir(&bin).unwrap().count(), 1, "temp left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn own_temp_names_only() {
        assert!(is_own_temp(".tmp.cni-ledger.4242.0", "cni-ledger"));
        assert!(is_own_temp(".tmp.cni-ledger.1.17", "cni-ledger"));
        for other in [
            "cni-ledger",
            ".tmp.cni-ledger",
            ".tmp.cni-ledger.4242",
            ".tmp.cni-ledger.4242.",
            ".tmp.cni-ledger.4242.0.1",
            ".tmp.cni-ledger.x.0",
            ".tmp.cni-ledger-gc.4242.0",
            ".tmp.bridge.4242.0",
            ".cni-ledger.Ab12Cd", // install.sh's mktemp
            "tmp.cni-ledger.4242.0",
        ] {
            assert!(!is_own_temp(other, "cni-ledger"), "{other}");
        }
    }

    /// By the clock `now`: a temp file of ours 10 minutes unmodified goes; one younger,
    /// or dated after `now`, stays, as do other names, symlinks and directories.
    #[test]
    fn sweeps_only_old_regular_temp_files_of_its_own() {
        let dir = std::env::temp_dir().join(format!("cl-agent-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = |n: &str| {
            std::fs::write(dir.join(n), b"x").unwrap();
            dir.join(n)
        };
        let old = file(".tmp.cni-ledger.7.0");
        let other = file(".tmp.bridge.7.0");
        let target = file("target");
        std::os::unix::fs::symlink(&target, dir.join(".tmp.cni-ledger.7.1")).unwrap();
        std::fs::create_dir(dir.join(".tmp.cni-ledger.7.2")).unwrap();
        let written = std::fs::symlink_metadata(&old).unwrap().modified().unwrap();
        let listing = || {
            let mut v: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            v.sort();
            v
        };
        let all = listing();
        let at = |after: Duration| sweep_temps(&dir, "cni-ledger", written + after);
        assert!(at(TEMP_MAX_AGE - Duration::from_secs(1)).is_empty());
        assert!(sweep_temps(&dir, "cni-ledger", written - Duration::from_secs(3600)).is_empty());
        assert_eq!(listing(), all);
        assert_eq!(at(TEMP_MAX_AGE), std::slice::from_ref(&old));
        // Everything else is old by now too, and stays.
        assert!(at(TEMP_MAX_AGE * 10).is_empty());
        assert!(!old.exists() && other.exists() && target.exists());
        assert!(dir.join(".tmp.cni-ledger.7.1").symlink_metadata().is_ok());
        assert!(dir.join(".tmp.cni-ledger.7.2").is_dir());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
