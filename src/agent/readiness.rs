//! What `/readyz` says: the last reconcile pass's findings (binaries installed, the
//! ledger first in each chosen conflist, the ledger dir usable) as one status, and the
//! check of the ledger dir itself.

use crate::ledger::Ledger;
use std::path::{Path, PathBuf};

/// What `/readyz` reports; written by the watcher, read by the server.
#[derive(Debug, Default, Clone)]
pub struct Status {
    /// Per CNI bin dir: None when it holds our binary, else why not.
    pub binaries: Vec<(PathBuf, Option<String>)>,
    pub conflists: Vec<ConfStatus>,
    /// Why no conflist was chosen, when none was.
    pub conf_error: Option<String>,
    /// Why the ledger dir is not usable, when it is not.
    pub ledger_error: Option<String>,
    /// The first reconcile has run.
    pub checked: bool,
    /// Why the last gc run judged nothing by the CRI runtimes' list, when it did not
    /// (kept by the gc loop in `Shared::cri_refused`, filled in by `Shared::status`).
    pub cri_refused: Option<String>,
    /// Per runtime and libcni, the conflist it loads (`conf::Chosen::rules`).
    pub rules: Vec<super::conf::RuleChoice>,
}

#[derive(Debug, Clone)]
pub struct ConfStatus {
    pub file: PathBuf,
    pub injected: bool,
    pub fighting: bool,
    pub error: Option<String>,
    /// The chain runs at a cniVersion the ledger does not serve (the version as shown).
    pub unsupported: Option<String>,
    /// A runtime uses this file (or may): a rule's choice, or the one asked for.
    pub runtimes: bool,
}

impl Status {
    /// Ready, and one line per check for the response body.
    pub fn readiness(&self) -> (bool, String) {
        let mut ok = self.checked;
        let mut lines = Vec::new();
        if !self.checked {
            lines.push("not yet checked".to_string());
        }
        for (dir, err) in &self.binaries {
            match err {
                None => lines.push(format!("ok binary installed in {}", dir.display())),
                Some(e) => {
                    ok = false;
                    lines.push(format!("FAIL binary in {}: {e}", dir.display()));
                }
            }
        }
        if let Some(e) = &self.conf_error {
            ok = false;
            lines.push(format!("FAIL conflist: {e}"));
        }
        for c in &self.conflists {
            let f = c.file.display();
            if let (Some(v), false) = (&c.unsupported, c.runtimes) {
                // Left as it works; not the chain the runtime's pods get.
                let why = c.error.as_deref().unwrap_or_default();
                lines.push(format!("WARN {f}: unsupported cniVersion {v}: {why}"));
            } else if let Some(v) = &c.unsupported {
                ok = false;
                let why = c.error.as_deref().unwrap_or_default();
                lines.push(format!("FAIL {f}: unsupported cniVersion {v}: {why}"));
            } else if c.fighting {
                ok = false;
                lines.push(format!(
                    "FAIL {f}: another writer keeps reverting it; backing off"
                ));
            } else if !c.injected {
                ok = false;
                let why = c.error.as_deref().unwrap_or("not injected yet");
                lines.push(format!("FAIL {f}: {why}"));
            } else {
                lines.push(format!("ok ledger first in {f} (verified)"));
            }
        }
        lines.extend(self.rule_lines());
        match &self.ledger_error {
            None if self.checked => lines.push("ok ledger dir usable".into()),
            None => {}
            Some(e) => {
                ok = false;
                lines.push(format!("FAIL ledger dir: {e}"));
            }
        }
        // Not a readiness failure: the agent is doing its job by refusing.
        if let Some(why) = &self.cri_refused {
            lines.push(format!("WARN cri: {why}"));
        }
        let mut body = lines.join("\n");
        body.push('\n');
        (ok, body)
    }
}

impl Status {
    /// What the runtimes' rules came to: one line when they agree, a warning naming each
    /// file and who loads it when they differ, and one for each rule the agent cannot
    /// settle. Warnings only: every file a rule names is kept, and judged, above.
    fn rule_lines(&self) -> Vec<String> {
        use std::collections::BTreeMap;
        let mut lines = Vec::new();
        let mut picks: BTreeMap<&Path, Vec<String>> = BTreeMap::new();
        let mut none = Vec::new();
        for r in &self.rules {
            match &r.file {
                Some(f) => picks.entry(f.as_path()).or_default().push(r.label()),
                None => none.push(r.label()),
            }
        }
        match picks.len() {
            0 => {}
            1 if none.is_empty() => {
                let f = picks.keys().next().map(|f| f.display().to_string());
                lines.push(format!(
                    "ok every runtime rule loads {}",
                    f.unwrap_or_default()
                ));
            }
            _ => {
                let mut parts: Vec<String> = picks
                    .iter()
                    .map(|(f, who)| format!("{} by {}", f.display(), who.join(", ")))
                    .collect();
                if !none.is_empty() {
                    parts.push(format!("none by {}", none.join(", ")));
                }
                lines.push(format!(
                    "WARN runtimes load different conflists: {}; the ledger is kept first in each",
                    parts.join("; ")
                ));
            }
        }
        for r in self.rules.iter().filter(|r| !r.unsure.is_empty()) {
            let why: Vec<String> = r
                .unsure
                .iter()
                .map(|(f, why)| format!("{}: {why}", f.display()))
                .collect();
            let all: Vec<String> = r.candidates().map(|f| f.display().to_string()).collect();
            lines.push(format!(
                "WARN cannot tell which conflist {} loads ({}); the ledger is kept first in each it may be: {}",
                r.label(),
                why.join("; "),
                all.join(", ")
            ));
        }
        lines
    }
}

/// The ledger dir exists (or can be made), is trusted, and each directory a write goes
/// to is a directory the agent can write: an ADD whose snapshot or record cannot be
/// stored fails, so a ledger broken underneath (`snapshots/` removed, a directory made
/// read-only) must show in `/readyz` rather than at the next pod's start. Not repaired:
/// a directory that vanished is damage an operator should look at (records may refer
/// to snapshots it held).
pub fn ledger_usable(dir: &Path) -> anyhow::Result<()> {
    let ledger = Ledger::open_for_write(dir)?;
    ledger.check_trusted()?;
    for sub in ledger.add_dirs() {
        let meta = std::fs::metadata(&sub).map_err(|e| {
            anyhow::anyhow!(
                "{} is missing ({e}): ADDs cannot be recorded; restore it (mkdir -m 0700) \
                 and check the ledger with `cni-ledger verify`",
                sub.display()
            )
        })?;
        if !meta.is_dir() {
            anyhow::bail!(
                "{} is not a directory: ADDs cannot be recorded",
                sub.display()
            );
        }
        nix::unistd::access(&sub, nix::unistd::AccessFlags::W_OK)
            .map_err(|e| anyhow::anyhow!("{} is not writable: {e}", sub.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_status() -> Status {
        Status {
            binaries: vec![(PathBuf::from("/opt/cni/bin"), None)],
            conflists: vec![ConfStatus {
                file: PathBuf::from("/etc/cni/net.d/10-a.conflist"),
                injected: true,
                fighting: false,
                error: None,
                unsupported: None,
                runtimes: true,
            }],
            conf_error: None,
            ledger_error: None,
            checked: true,
            cri_refused: None,
            rules: Vec::new(),
        }
    }

    #[test]
    fn ready_only_when_every_check_passes() {
        assert!(ready_status().readiness().0);
        assert!(
            !Status::default().readiness().0,
            "ready before the first check"
        );
        let mut s = ready_status();
        s.conflists[0].fighting = true;
        let (ok, body) = s.readiness();
        assert!(!ok && body.contains("keeps reverting"), "{body}");
        let mut s = ready_status();
        s.conflists[0].injected = false;
        assert!(!s.readiness().0);
        let mut s = ready_status();
        s.binaries[0].1 = Some("EACCES".into());
        assert!(!s.readiness().0);
        let mut s = ready_status();
        s.ledger_error = Some("not trusted".into());
        assert!(!s.readiness().0);
        let mut s = ready_status();
        s.conflists.clear();
        s.conf_error = Some("no network configuration".into());
        assert!(!s.readiness().0);
        // Left without the ledger for its version: fails only for the runtime's file.
        let mut s = ready_status();
        s.conflists[0].injected = false;
        s.conflists[0].unsupported = Some("0.2.0".into());
        let (ok, body) = s.readiness();
        assert!(
            !ok && body.contains("FAIL") && body.contains("0.2.0"),
            "{body}"
        );
        s.conflists[0].runtimes = false;
        let (ok, body) = s.readiness();
        assert!(
            ok && body.contains("WARN") && body.contains("0.2.0"),
            "{body}"
        );
    }

    #[test]
    fn rules_that_differ_or_cannot_tell_warn_naming_files_and_rules() {
        use super::super::conf::{RuleChoice, Runtime};
        use crate::conflist::Libcni;
        let rule = |runtime, file: &str, unsure: Vec<(PathBuf, String)>| RuleChoice {
            runtime,
            libcni: Libcni::V1_3,
            file: Some(PathBuf::from(file)),
            unsure,
        };
        let mut s = ready_status();
        s.rules = vec![
            rule(Runtime::Containerd, "/a", vec![]),
            rule(Runtime::CriO, "/a", vec![]),
        ];
        let (ok, body) = s.readiness();
        assert!(
            ok && body.contains("ok every runtime rule loads /a"),
            "{body}"
        );
        s.rules[1] = rule(
            Runtime::CriO,
            "/b",
            vec![(PathBuf::from("/a"), "EIO".into())],
        );
        let (ok, body) = s.readiness();
        assert!(ok, "{body}");
        assert!(
            body.contains("WARN runtimes load different conflists: /a by containerd/libcni-1.3; /b by cri-o/libcni-1.3"),
            "{body}"
        );
        assert!(
            body.contains("WARN cannot tell which conflist cri-o/libcni-1.3 loads (/a: EIO)")
                && body.contains("may be: /a, /b"),
            "{body}"
        );
    }
}
