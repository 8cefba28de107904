//! Installing the plugin binary into the host's CNI bin dirs from the agent's own
//! executable. Never written in place: a runtime may be executing the old copy (a write
//! would fail with ETXTBSY, or worse, tear it); a temp file, fsynced, renamed over the old
//! name leaves a running copy its own inode and every new exec a whole file. No child of
//! the agent (a gc replay) is forked while the temp file is open for writing, or it would
//! hold it open past the rename and make the runtime's exec fail with ETXTBSY.

use anyhow::{Context, Result};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

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
    /// Where the agent itself was started from (under systemd: the bin dir itself).
    running_from: Option<PathBuf>,
}

impl Installer {
    pub fn new(source: PathBuf, name: &str, dirs: &[PathBuf]) -> Installer {
        Installer {
            source,
            name: name.to_string(),
            verified: dirs.iter().map(|d| (d.clone(), None)).collect(),
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
        for (dir, last) in &mut self.verified {
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
}
