//! Which network configuration the node uses. Runtimes differ:
//!
//! - containerd (go-cni) lists the `.conf`, `.conflist` and `.json` files of the conf dir
//!   together, sorted by name, and loads the first (one that does not load leaves it
//!   without a network; the agent takes the first that loads, which covers that too);
//! - CRI-O (ocicni) lists the same files and takes the first that loads, has plugins and
//!   passes libcni's `ValidateNetworkList`: every plugin's binary found in its bin dirs;
//! - Podman (containers/common, CNI backend) does the same over `.conflist` files only,
//!   whose network name must also be a valid Podman name.
//!
//! Each loads with its own libcni: before v1.3 (no drop-ins) or v1.3 (drop-ins, and a
//! `.conflist` with no `plugins` key). The agent computes each runtime's choice under
//! each libcni and keeps the ledger in all of them (`Chosen`): an extra injected file is
//! harmless, the used one left out is the harm. A binary it cannot judge (a stat failing
//! other than "not found") leaves the choice open: the files it could be are all kept,
//! and `/readyz` and `cni_ledger_conflist_choice_unknown` say so. `--conflist` overrides
//! the choice with a file or a network name, or takes `all`.

use crate::conflist::Libcni;
use anyhow::Result;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// The ones the runtimes use: per runtime and libcni, the file it loads.
    First,
    /// Every file that loads.
    All,
    /// The file of this name in the conf dir, else the file whose network has this name.
    Named(String),
}

impl std::str::FromStr for Choice {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Choice, Self::Err> {
        Ok(match s {
            "" | "first" => Choice::First,
            "all" => Choice::All,
            name => Choice::Named(name.to_string()),
        })
    }
}

/// A runtime whose rule for picking its conflist the agent knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Runtime {
    Containerd,
    CriO,
    Podman,
}

impl Runtime {
    pub const ALL: [Runtime; 3] = [Runtime::Containerd, Runtime::CriO, Runtime::Podman];

    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Podman => "podman",
        }
    }
}

/// One runtime's choice under one libcni.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleChoice {
    pub runtime: Runtime,
    pub libcni: Libcni,
    /// The file it loads; None when it loads none.
    pub file: Option<PathBuf>,
    /// Files before `file` it may load instead, and why the agent cannot tell.
    pub unsure: Vec<(PathBuf, String)>,
}

impl RuleChoice {
    /// `containerd/libcni-1.3`, as `/readyz` names a rule.
    pub fn label(&self) -> String {
        format!("{}/libcni-{}", self.runtime.as_str(), self.libcni.as_str())
    }

    /// Every file this runtime may load: the unsure ones and the chosen one.
    pub fn candidates(&self) -> impl Iterator<Item = &PathBuf> {
        self.unsure.iter().map(|(p, _)| p).chain(self.file.iter())
    }
}

/// What the agent keeps the ledger in, and why.
#[derive(Debug, Clone, Default)]
pub struct Chosen {
    /// The files, by name, each once.
    pub files: Vec<PathBuf>,
    /// Per runtime and libcni, its choice (empty for a file named by `--conflist`).
    pub rules: Vec<RuleChoice>,
    /// The files some runtime loads (or may): every file for a `--conflist NAME`.
    pub used: BTreeSet<PathBuf>,
}

pub fn choose(dir: &Path, choice: &Choice, bin_dirs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    Ok(chosen(dir, choice, bin_dirs)?.files)
}

/// The configuration files of `dir` runtimes list, sorted by name as Go's
/// `sort.Strings` sorts them.
fn listed(dir: &Path) -> Result<Vec<PathBuf>> {
    use std::os::unix::ffi::OsStrExt;
    let mut out: Vec<PathBuf> = crate::conflist::candidates(dir)?
        .into_iter()
        .filter(|(p, _)| !p.is_dir())
        .map(|(p, _)| p)
        .collect();
    out.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    Ok(out)
}

/// Podman's network names (`define.NameRegex`): `[a-zA-Z0-9][a-zA-Z0-9_.-]*`.
fn podman_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Whether libcni's `FindInPath` finds `plugin` in `bin_dirs` (a regular file, links
/// followed). Err: a stat failed other than "not found", so the agent cannot tell.
fn binary_found(plugin: &str, bin_dirs: &[PathBuf]) -> std::result::Result<bool, String> {
    if plugin.is_empty() || plugin.contains('/') {
        return Ok(false);
    }
    let mut unknown = None;
    for dir in bin_dirs {
        let path = dir.join(plugin);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => return Ok(true),
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) => {}
            Err(e) => unknown = Some(format!("cannot examine {}: {e}", path.display())),
        }
    }
    unknown.map_or(Ok(false), Err)
}

/// Why a runtime validating its chains (ocicni, Podman) would refuse `list`: a plugin
/// binary missing from the bin dirs. Ok(None): it passes; Err: the agent cannot tell.
fn refused(list: &Value, bin_dirs: &[PathBuf]) -> std::result::Result<Option<String>, String> {
    let mut missing = Vec::new();
    for p in crate::conflist::plugins(list) {
        let t = crate::conflist::plugin_type(p);
        if !binary_found(t, bin_dirs)? {
            missing.push(t.to_string());
        }
    }
    missing.dedup();
    Ok((!missing.is_empty()).then(|| format!("plugin binaries not found: {}", missing.join(", "))))
}

/// The file `runtime` loads with `libcni` among `files`, of the network `net` if given.
fn rule(
    files: &[PathBuf],
    runtime: Runtime,
    libcni: Libcni,
    bin_dirs: &[PathBuf],
    net: Option<&str>,
) -> RuleChoice {
    let mut out = RuleChoice {
        runtime,
        libcni,
        file: None,
        unsure: Vec::new(),
    };
    for path in files {
        if runtime == Runtime::Podman && path.extension().is_none_or(|e| e != "conflist") {
            continue;
        }
        let Ok(list) = crate::conflist::load_for_runtime(path, libcni) else {
            continue;
        };
        let name = list.get("name").and_then(Value::as_str).unwrap_or("");
        if net.is_some_and(|n| n != name) || crate::conflist::plugins(&list).is_empty() {
            continue;
        }
        if runtime == Runtime::Podman && !podman_name(name) {
            continue;
        }
        if runtime != Runtime::Containerd {
            match refused(&list, bin_dirs) {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(why) => {
                    out.unsure.push((path.clone(), why));
                    continue;
                }
            }
        }
        out.file = Some(path.clone());
        break;
    }
    out
}

/// The chosen files with why (see the module's comment).
pub fn chosen(dir: &Path, choice: &Choice, bin_dirs: &[PathBuf]) -> Result<Chosen> {
    let files = listed(dir)?;
    let by_file = |name: &str| -> Result<Option<PathBuf>> {
        let Some(p) = files
            .iter()
            .find(|p| p.file_name().is_some_and(|f| f == name))
        else {
            return Ok(None);
        };
        let loads = Libcni::ALL
            .iter()
            .any(|l| crate::conflist::load_for_runtime(p, *l).is_ok())
            || crate::conflist::loadable(dir)?.iter().any(|(q, _)| q == p);
        Ok(loads.then(|| p.clone()))
    };
    if let Choice::Named(name) = choice {
        if let Some(p) = by_file(name)? {
            return Ok(Chosen {
                used: [p.clone()].into(),
                files: vec![p],
                rules: Vec::new(),
            });
        }
    }
    let net = match choice {
        Choice::Named(n) => Some(n.as_str()),
        _ => None,
    };
    let mut rules = Vec::new();
    for runtime in Runtime::ALL {
        for libcni in Libcni::ALL {
            rules.push(rule(&files, runtime, libcni, bin_dirs, net));
        }
    }
    let used: BTreeSet<PathBuf> = rules.iter().flat_map(|r| r.candidates().cloned()).collect();
    let mut all: BTreeSet<PathBuf> = used.clone();
    if *choice == Choice::All {
        all.extend(crate::conflist::loadable(dir)?.into_iter().map(|(p, _)| p));
    }
    let mut files: Vec<PathBuf> = all.into_iter().collect();
    {
        use std::os::unix::ffi::OsStrExt;
        files.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    }
    Ok(Chosen { files, rules, used })
}

/// The network names of the chosen files (the records' `network`).
pub fn networks(dir: &Path, choice: &Choice, bin_dirs: &[PathBuf]) -> Result<Vec<String>> {
    let mut names: Vec<String> = chosen(dir, choice, bin_dirs)?
        .files
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .filter_map(|b| serde_json::from_slice::<Value>(&b).ok())
        .filter_map(|d| d["name"].as_str().map(String::from))
        .collect();
    names.dedup();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_loadable_by_name_across_extensions() {
        let dir = std::env::temp_dir().join(format!("cl-agent-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let w = |n: &str, s: &str| std::fs::write(dir.join(n), s).unwrap();
        w("05-broken.conflist", "{not json");
        w("07-empty.conflist", r#"{"name":"e","plugins":[]}"#);
        w(
            "08-numver.conflist",
            r#"{"cniVersion":1,"name":"v","plugins":[{"type":"bridge"}]}"#,
        );
        w("10-b.conf", r#"{"name":"b","type":"bridge"}"#);
        w(
            "20-a.conflist",
            r#"{"name":"a","plugins":[{"type":"bridge"}]}"#,
        );
        w("99-notes.txt", r#"{"name":"t","type":"bridge"}"#);
        let first = choose(&dir, &Choice::First, &[]).unwrap();
        assert_eq!(first, vec![dir.join("10-b.conf")]);
        assert_eq!(choose(&dir, &Choice::All, &[]).unwrap().len(), 2);
        assert_eq!(
            choose(&dir, &"a".parse().unwrap(), &[]).unwrap(),
            vec![dir.join("20-a.conflist")]
        );
        assert_eq!(
            choose(&dir, &"20-a.conflist".parse().unwrap(), &[]).unwrap(),
            vec![dir.join("20-a.conflist")]
        );
        assert!(choose(&dir, &"zz".parse().unwrap(), &[])
            .unwrap()
            .is_empty());
        assert_eq!(networks(&dir, &Choice::First, &[]).unwrap(), ["b"]);
        assert_eq!(networks(&dir, &Choice::All, &[]).unwrap(), ["b", "a"]);
        assert_eq!(
            networks(&dir, &"20-a.conflist".parse().unwrap(), &[]).unwrap(),
            ["a"]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn each_runtime_rule_under_each_libcni() {
        let root = std::env::temp_dir().join(format!("cl-agent-rules-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (dir, bin) = (root.join("net.d"), root.join("bin"));
        std::fs::create_dir_all(dir.join("drop")).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("bridge"), b"").unwrap();
        let w = |n: &str, s: &str| std::fs::write(dir.join(n), s).unwrap();
        // Drop-ins alone (v1.3 only), then a missing binary, then one that passes.
        w("05-drop.conflist", r#"{"name":"drop"}"#);
        w("drop/10-b.conf", r#"{"type":"bridge"}"#);
        w(
            "10-miss.conflist",
            r#"{"name":"miss","plugins":[{"type":"absent"}]}"#,
        );
        w(
            "20-ok.conflist",
            r#"{"name":"ok","plugins":[{"type":"bridge"}]}"#,
        );
        let c = chosen(&dir, &Choice::First, std::slice::from_ref(&bin)).unwrap();
        let pick = |rt: Runtime, l: Libcni| {
            let r = c
                .rules
                .iter()
                .find(|r| r.runtime == rt && r.libcni == l)
                .unwrap();
            r.file
                .as_ref()
                .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        };
        assert_eq!(
            pick(Runtime::Containerd, Libcni::V1_3).as_deref(),
            Some("05-drop.conflist")
        );
        assert_eq!(
            pick(Runtime::Containerd, Libcni::V1_1).as_deref(),
            Some("10-miss.conflist")
        );
        assert_eq!(
            pick(Runtime::CriO, Libcni::V1_3).as_deref(),
            Some("05-drop.conflist")
        );
        assert_eq!(
            pick(Runtime::CriO, Libcni::V1_1).as_deref(),
            Some("20-ok.conflist")
        );
        assert_eq!(
            pick(Runtime::Podman, Libcni::V1_1).as_deref(),
            Some("20-ok.conflist")
        );
        assert_eq!(c.files.len(), 3);
        // A binary that cannot be examined (a link loop): each file it may be is kept.
        std::fs::remove_file(dir.join("05-drop.conflist")).unwrap();
        std::os::unix::fs::symlink(bin.join("absent"), bin.join("absent")).unwrap();
        let c = chosen(&dir, &Choice::First, std::slice::from_ref(&bin)).unwrap();
        let crio = c.rules.iter().find(|r| r.runtime == Runtime::CriO).unwrap();
        assert_eq!(crio.unsure.len(), 1, "{crio:?}");
        assert_eq!(crio.candidates().count(), 2);
        assert!(c.used.contains(&dir.join("10-miss.conflist")));
        // A network name: each rule's first file of that network.
        let c = chosen(&dir, &"ok".parse().unwrap(), std::slice::from_ref(&bin)).unwrap();
        assert_eq!(c.files, vec![dir.join("20-ok.conflist")]);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
