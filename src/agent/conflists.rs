//! Keeping one chosen conflist with the ledger first, a file at a time: read, plan,
//! write only what is unchanged since the read, read back. A `.conf` holding a single
//! plugin is converted to a `.conflist`; a symbolic link is read through, never written;
//! a writer that keeps reverting the file is backed off from (`revert_backoff`).

use super::revert_backoff::{Reinject, RevertBackoff};
use super::{Options, Shared};
use crate::injection::{self, EntryOptions};
use anyhow::Context;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// How many times one pass starts over on a file another writer keeps changing between
/// the agent's read and its write; past that, that writer's next event brings a pass.
const RESTARTS: usize = 5;

#[derive(Default)]
pub struct FileState {
    /// The bytes as the agent last verified them injected; None while it is not ours.
    ours: Option<Vec<u8>>,
    /// The document the agent left there (for telling what another writer changed).
    ours_doc: Option<Value>,
    ours_ino: Option<u64>,
    /// The drop-ins `ours` was planned with: the plan depends on them too.
    ours_dropins: Option<DropinView>,
    /// A single-plugin `.conf` the agent converted into a `.conflist`.
    converted: bool,
    pub revert_backoff: RevertBackoff,
    pub error: Option<String>,
    /// The chain runs at a cniVersion the ledger does not serve: the version as shown
    /// (`version::Unserved::shown`); the file is left without the ledger.
    pub unsupported: Option<String>,
    /// While `unsupported`: the agent took the ledger out of it (kept for `/readyz`).
    took_out: bool,
}

/// The drop-in directory of a conflist as a plan sees it: the other writers' drop-ins
/// and the ledger's own tail drop-in. A change to either calls for a new plan even when
/// the conflist's bytes are unchanged: a drop-in that comes or goes changes the chain's
/// capabilities (the head declares their union) and where the tail goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct DropinView {
    others: Vec<(PathBuf, Option<Vec<u8>>)>,
    tail: Option<Vec<u8>>,
    head: Option<Vec<u8>>,
}

impl DropinView {
    /// As it stands on disk for the conflist `path` holding `bytes`.
    fn read(path: &Path, bytes: &[u8]) -> DropinView {
        if path.extension().is_none_or(|e| e != "conflist") {
            return DropinView::default();
        }
        let Ok(doc) = serde_json::from_slice::<Value>(bytes) else {
            return DropinView::default();
        };
        let mut others = crate::conflist::dropin_state(path, &doc);
        let mut take = |name: &str| {
            others
                .iter()
                .position(|(p, _)| p.file_name().is_some_and(|f| f == name))
                .and_then(|i| others.remove(i).1)
        };
        let tail = take(injection::TAIL_DROPIN);
        let head = take(injection::HEAD_DROPIN);
        DropinView { others, tail, head }
    }
}

/// What one file's pass came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOutcome {
    /// The file that now holds the network (a converted `.conf` becomes a `.conflist`).
    pub file: PathBuf,
    /// The ledger is verified first in its chain.
    pub injected: bool,
    /// Anything was written.
    pub wrote: bool,
    /// The network's name, when the file could be read.
    pub network: Option<String>,
}

impl FileOutcome {
    fn new(file: PathBuf, injected: bool, wrote: bool, network: Option<String>) -> FileOutcome {
        FileOutcome {
            file,
            injected,
            wrote,
            network,
        }
    }
}

/// The chosen files as the agent last left them.
pub struct Conflists<'a> {
    opts: &'a Options,
    shared: &'a Shared,
    files: BTreeMap<PathBuf, FileState>,
    entry_ledger: Option<PathBuf>,
    entry_conf: Option<PathBuf>,
}

fn types(doc: &Value) -> String {
    let t: Vec<&str> = crate::conflist::plugins(doc)
        .iter()
        .map(crate::conflist::plugin_type)
        .collect();
    format!("[{}]", t.join(", "))
}

/// One line saying what another writer changed in a file the agent had injected.
fn describe_change(ours: Option<&Value>, theirs: &Value, replaced: bool) -> String {
    let mut parts = vec![format!("plugins now {}", types(theirs))];
    if let (Some(o), Some(t)) = (ours.and_then(Value::as_object), theirs.as_object()) {
        let mut keys: Vec<&str> = o
            .keys()
            .chain(t.keys())
            .map(String::as_str)
            .filter(|k| *k != "plugins" && o.get(*k) != t.get(*k))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        if !keys.is_empty() {
            parts.push(format!("also changed: {}", keys.join(", ")));
        }
        let theirs_others: Vec<&Value> = crate::conflist::plugins(theirs).iter().collect();
        let ours_others: Vec<&Value> = crate::conflist::plugins(ours.unwrap_or(&Value::Null))
            .iter()
            .skip(1)
            .collect();
        if theirs_others != ours_others && !theirs_others.is_empty() {
            parts.push("the other plugins' entries differ too".into());
        }
    }
    parts.push(if replaced {
        "replaced by rename (a new file)".into()
    } else {
        "written in place".into()
    });
    parts.join("; ")
}

impl<'a> Conflists<'a> {
    pub fn new(opts: &'a Options, shared: &'a Shared) -> Conflists<'a> {
        let (entry_ledger, entry_conf) = super::entry_dirs(opts);
        Conflists {
            opts,
            shared,
            files: BTreeMap::new(),
            entry_ledger,
            entry_conf,
        }
    }

    /// The state of a file a pass has seen.
    pub fn state(&self, file: &Path) -> Option<&FileState> {
        self.files.get(file)
    }

    /// Brings one chosen file into shape.
    pub fn reconcile_file(&mut self, path: &Path, now: Instant) -> FileOutcome {
        for _ in 0..RESTARTS {
            if let Some(done) = self.attempt(path, now) {
                return done;
            }
        }
        let st = self.files.entry(path.to_path_buf()).or_default();
        st.error = Some(
            "another writer kept changing it while the ledger was being put in; \
             trying again at its next change"
                .into(),
        );
        FileOutcome::new(path.to_path_buf(), false, false, None)
    }

    /// One read-plan-write of `path`; None when another writer changed the file between
    /// the read and the write (nothing of theirs was replaced): start over.
    fn attempt(&mut self, path: &Path, now: Instant) -> Option<FileOutcome> {
        if let Some(target) = crate::replace::symlink_target(path) {
            return Some(self.check_symlinked(path, &target));
        }
        // Set again below while the version stays unserved; any other finding replaces it.
        self.files
            .entry(path.to_path_buf())
            .or_default()
            .unsupported = None;
        let read = match crate::replace::read_for_edit(path) {
            Ok(r) => r,
            Err(e) => {
                let st = self.files.entry(path.to_path_buf()).or_default();
                st.error = Some(format!("{e:#}"));
                return Some(FileOutcome::new(path.to_path_buf(), false, false, None));
            }
        };
        let bytes = read.bytes.clone();
        let ino = Some(read.ino());
        let view = DropinView::read(path, &bytes);
        {
            let st = self.files.entry(path.to_path_buf()).or_default();
            if st.ours.as_deref() == Some(&bytes[..]) && st.ours_dropins.as_ref() == Some(&view) {
                if st.revert_backoff.settle(now) {
                    crate::info!(
                        "agent: {}: quiet again; the fight with another writer is over",
                        path.display()
                    );
                }
                let net = st
                    .ours_doc
                    .as_ref()
                    .and_then(|d| d["name"].as_str().map(String::from));
                return Some(FileOutcome::new(path.to_path_buf(), true, false, net));
            }
        }
        let doc: Value = match serde_json::from_slice(&bytes) {
            Ok(d) => d,
            Err(e) => {
                let st = self.files.entry(path.to_path_buf()).or_default();
                st.error = Some(format!("not JSON: {e}"));
                return Some(FileOutcome::new(path.to_path_buf(), false, false, None));
            }
        };
        let net = doc["name"].as_str().map(String::from);
        let single = injection::conflist_from_conf(&doc);
        // Checked on the chain as the runtime runs it (a single-plugin file as libcni's
        // one-plugin list), before anything is written (DESIGN §8).
        if let Err(why) = crate::cni::version::serves_list(single.as_ref().unwrap_or(&doc)) {
            return self.unserved(path, &read, &doc, why, net);
        }
        self.files.entry(path.to_path_buf()).or_default().took_out = false;
        if let Some(list) = single {
            return self.convert(path, &read, &list, now, net);
        }
        let entry = EntryOptions {
            ledger_dir: self.entry_ledger.as_deref(),
            conf_dir: self.entry_conf.as_deref(),
            no_tail: self.opts.no_tail,
        };
        let mut planned = match injection::plan(path, &bytes, &self.opts.plugin_type, &entry, false)
        {
            Ok(p) => p,
            Err(e) => {
                let st = self.files.entry(path.to_path_buf()).or_default();
                st.error = Some(format!("{e:#}"));
                return Some(FileOutcome::new(path.to_path_buf(), false, false, net));
            }
        };
        // What the plan was made from: the drop-ins as read, our own as planned.
        let want = |d: &Option<injection::TailDropin>| {
            d.as_ref()
                .and_then(|d| d.want.clone())
                .map(String::into_bytes)
        };
        let planned_view = DropinView {
            tail: want(&planned.tail_dropin),
            head: want(&planned.head_dropin),
            ..view
        };
        // A conflist whose chain is all drop-ins gets its head as one (written before
        // the tail, so a chain never has the tail alone); one left from such a conflist
        // goes.
        if let Some(d) = planned.head_dropin.take().filter(|d| d.changed) {
            apply_tail_dropin(&d);
        }
        // The drop-in tail of a network with drop-ins (docs/CHAIN.md): an old one goes
        // before the conflist changes, a new one comes after, so there are never two.
        let dropin = planned.tail_dropin.take().filter(|d| d.changed);
        if let Some(d) = dropin.as_ref().filter(|d| d.want.is_none()) {
            apply_tail_dropin(d);
        }
        let st = self.files.entry(path.to_path_buf()).or_default();
        if !planned.changed {
            if let Some(d) = dropin.as_ref().filter(|d| d.want.is_some()) {
                apply_tail_dropin(d);
            }
            // A head in a drop-in is first only if no other drop-in sorts before it.
            if let Some(why) = not_first(path, &self.opts.plugin_type) {
                st.ours = None;
                st.error = Some(why);
                return Some(FileOutcome::new(path.to_path_buf(), false, false, net));
            }
            st.ours = Some(bytes);
            st.ours_doc = Some(planned.doc);
            st.ours_ino = ino;
            st.ours_dropins = Some(planned_view);
            st.error = None;
            return Some(FileOutcome::new(path.to_path_buf(), true, false, net));
        }
        // Ours byte for byte, planned anew for a drop-in that came or went: no revert.
        if st.ours.is_some() && st.ours.as_deref() != Some(&bytes[..]) {
            let replaced = ino != st.ours_ino;
            let what = describe_change(st.ours_doc.as_ref(), &planned.doc, replaced);
            if !Self::on_revert(self.shared, path, st, &what, now) {
                return Some(FileOutcome::new(path.to_path_buf(), false, false, net));
            }
            // Not ours any more: starting over within this pass is not another revert.
            st.ours = None;
        }
        if st.revert_backoff.waiting_until(now).is_some() {
            return Some(FileOutcome::new(path.to_path_buf(), false, false, net));
        }
        let ok = write_verified(
            path,
            &read,
            &planned.text,
            &self.opts.plugin_type,
            &entry,
            st,
            self.shared,
        )?;
        st.ours_dropins = Some(planned_view);
        if let Some(d) = dropin.as_ref().filter(|d| ok && d.want.is_some()) {
            apply_tail_dropin(d);
        }
        Some(FileOutcome::new(path.to_path_buf(), ok, true, net))
    }

    /// A chosen file whose chain runs at a cniVersion the ledger does not serve: left
    /// without the ledger, byte for byte; one that has it (put there by an older release,
    /// or by hand) gets it taken out, which gives back the chain that worked without it
    /// (with it, every ADD fails in the ledger, and every DEL too). None: another writer
    /// changed the file meanwhile, start over.
    fn unserved(
        &mut self,
        path: &Path,
        read: &crate::replace::ReadConf,
        doc: &Value,
        why: crate::cni::version::Unserved,
        net: Option<String>,
    ) -> Option<FileOutcome> {
        let plugin_type = self.opts.plugin_type.as_str();
        let has_ledger = crate::conflist::plugins(doc)
            .iter()
            .any(|p| crate::conflist::plugin_type(p) == plugin_type);
        let took_out = self.files.get(path).is_some_and(|st| st.took_out);
        let mut error = if took_out {
            format!(
                "{why}: {plugin_type} was in its chain (failing every ADD) and was taken \
                 out; give the conflist a cniVersion the ledger serves to have it recorded"
            )
        } else {
            format!(
                "{why}: left as it is, without {plugin_type} (every ADD of the chain would \
                 fail in it); give the conflist a cniVersion the ledger serves to have it \
                 recorded"
            )
        };
        let mut wrote = false;
        if has_ledger {
            let out = injection::plan(
                path,
                &read.bytes,
                plugin_type,
                &EntryOptions::default(),
                true,
            )
            .and_then(|mut planned| {
                for d in [planned.tail_dropin.take(), planned.head_dropin.take()]
                    .into_iter()
                    .flatten()
                    .filter(|d| d.changed)
                {
                    d.apply()?;
                }
                if !planned.changed {
                    return Ok(Some(false));
                }
                match crate::replace::replace_if_unchanged(path, read, planned.text.as_bytes())? {
                    crate::replace::Replaced::Done { .. } => Ok(Some(true)),
                    crate::replace::Replaced::Changed(_) => Ok(None),
                }
            });
            match out {
                Ok(None) => return None,
                Ok(Some(w)) => {
                    wrote = w;
                    crate::warn!(
                        "agent: {}: {why}, yet {plugin_type} was in its chain, failing every \
                         ADD: taken out, the chain is as it was without it",
                        path.display()
                    );
                    error = format!(
                        "{why}: {plugin_type} was in its chain (failing every ADD) and was \
                         taken out; give the conflist a cniVersion the ledger serves to have \
                         it recorded"
                    );
                }
                Err(e) => {
                    error = format!(
                        "{why}, and {plugin_type} is in its chain, failing every ADD; taking \
                         it out failed: {e:#}"
                    );
                }
            }
        }
        let st = self.files.entry(path.to_path_buf()).or_default();
        st.ours = None;
        st.ours_doc = None;
        st.ours_ino = None;
        st.unsupported = Some(why.shown());
        st.took_out |= wrote;
        if st.error.as_deref() != Some(error.as_str()) && !wrote {
            crate::warn!("agent: {}: {error}", path.display());
        }
        st.error = Some(error);
        Some(FileOutcome::new(path.to_path_buf(), false, wrote, net))
    }

    /// A chosen file that is a symbolic link: read through it, never written (see
    /// `replace::symlink_target`). Verified injected when the target already has the
    /// ledger first, else shown in `/readyz` with what to do.
    fn check_symlinked(&mut self, path: &Path, target: &Path) -> FileOutcome {
        let entry = EntryOptions {
            ledger_dir: self.entry_ledger.as_deref(),
            conf_dir: self.entry_conf.as_deref(),
            no_tail: self.opts.no_tail,
        };
        let planned = std::fs::read(path)
            .with_context(|| format!("reading {} through the link", path.display()))
            .and_then(|b| injection::plan(path, &b, &self.opts.plugin_type, &entry, false));
        let net = planned
            .as_ref()
            .ok()
            .and_then(|p| p.doc["name"].as_str().map(String::from));
        let unserved = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|d| crate::cni::version::serves_list(&d).err());
        let st = self.files.entry(path.to_path_buf()).or_default();
        // Not the agent's to keep: a later regular file here starts afresh.
        st.ours = None;
        st.ours_doc = None;
        st.ours_ino = None;
        st.unsupported = unserved.as_ref().map(|u| u.shown());
        let error = match planned {
            _ if unserved.is_some() => Some(format!(
                "a symbolic link to {}: {}: left as it is, without {}",
                target.display(),
                unserved
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                self.opts.plugin_type
            )),
            Ok(p) if !p.changed => None,
            Ok(_) | Err(_) => Some(format!(
                "a symbolic link to {}: left as it is, without the ledger (the agent neither \
                 replaces a link with a regular file nor writes into its target, which \
                 belongs to whatever manages it, e.g. a ConfigMap's ..data/); put {} first \
                 in the target's source, or choose a regular file with --conflist",
                target.display(),
                self.opts.plugin_type
            )),
        };
        if error.is_some() && st.error != error {
            crate::warn!(
                "agent: {}: {}",
                path.display(),
                error.as_deref().unwrap_or_default()
            );
        }
        st.error = error;
        FileOutcome::new(path.to_path_buf(), st.error.is_none(), false, net)
    }

    /// Counts a revert; false when the re-injection must wait (a fight).
    fn on_revert(
        shared: &Shared,
        path: &Path,
        st: &mut FileState,
        what: &str,
        now: Instant,
    ) -> bool {
        let label = path.display().to_string();
        shared.metrics.reverts.with_label_values(&[&label]).inc();
        match st.revert_backoff.on_revert(now) {
            Reinject::Now => {
                crate::info!(
                    "agent: {}: another writer took the ledger out ({what}); injecting again",
                    path.display()
                );
                true
            }
            Reinject::Backoff { wait, started } => {
                // Not ours until re-injected: changes meanwhile are not further reverts.
                st.ours = None;
                if started {
                    crate::warn!(
                        "agent: {}: another writer reverted it {} times within {} min ({what}); \
                         backing off, {}s doubling up to {} min, instead of fighting. Find that \
                         writer (a network plugin's installer regenerating its conflist from a \
                         template, e.g. calico-node's install-cni, Cilium or Multus on restart) \
                         and put cni-ledger in its template, or choose another file with --conflist",
                        path.display(),
                        super::revert_backoff::LIMIT + 1,
                        super::revert_backoff::WINDOW.as_secs() / 60,
                        wait.as_secs(),
                        super::revert_backoff::MAX_BACKOFF.as_secs() / 60,
                    );
                } else {
                    crate::info!(
                        "agent: {}: reverted again ({what}); next injection in {}s",
                        path.display(),
                        wait.as_secs()
                    );
                }
                false
            }
        }
    }

    /// A single-plugin `.conf` becomes `<stem>.conflist` with the ledger first (written
    /// before the `.conf` is moved aside, so the runtime always finds a network), and
    /// the `.conf` is renamed to `<name>.cni-ledger-converted`, an ending runtimes ignore.
    fn convert(
        &mut self,
        path: &Path,
        read: &crate::replace::ReadConf,
        list: &Value,
        now: Instant,
        net: Option<String>,
    ) -> Option<FileOutcome> {
        let ino = Some(read.ino());
        let target = path.with_extension("conflist");
        let aside = path.with_file_name(format!(
            "{}.cni-ledger-converted",
            path.file_name().unwrap_or_default().to_string_lossy()
        ));
        let entry = EntryOptions {
            ledger_dir: self.entry_ledger.as_deref(),
            conf_dir: self.entry_conf.as_deref(),
            no_tail: self.opts.no_tail,
        };
        let st = self.files.entry(path.to_path_buf()).or_default();
        if st.converted {
            let what = describe_change(None, list, ino != st.ours_ino);
            if !Self::on_revert(
                self.shared,
                path,
                st,
                &format!("the single-plugin file is back; {what}"),
                now,
            ) {
                st.converted = true;
                return Some(FileOutcome::new(path.to_path_buf(), false, false, net));
            }
        }
        if st.revert_backoff.waiting_until(now).is_some() {
            return Some(FileOutcome::new(path.to_path_buf(), false, false, net));
        }
        let result = (|| -> anyhow::Result<Option<String>> {
            let new = injection::transform(list, &self.opts.plugin_type, &entry, false)?;
            let mut text = serde_json::to_string_pretty(&new)?;
            text.push('\n');
            // Converting an older version than the one there now would lose the newer.
            if let Some(why) = crate::replace::changed_since(path, read) {
                crate::info!(
                    "agent: {}: {why} after it was read; reading it again",
                    path.display()
                );
                return Ok(None);
            }
            let made = match std::fs::read(&target) {
                Ok(b) if b == text.as_bytes() => None,
                Ok(_) => anyhow::bail!(
                    "cannot convert this single-plugin file: {} exists already",
                    target.display()
                ),
                Err(_) => Some(write_new(&target, read, text.as_bytes())?),
            };
            std::fs::rename(path, &aside)
                .with_context(|| format!("renaming {} aside", path.display()))?;
            if !crate::replace::is_what_was_read(&aside, read) {
                // A newer .conf landed between the check and the move: it goes back (unless
                // a newer one still is in place), the conversion is undone, and it starts over.
                if std::fs::hard_link(&aside, path).is_ok() {
                    let _ = std::fs::remove_file(&aside);
                }
                if let Some(ino) = made {
                    if std::fs::symlink_metadata(&target).is_ok_and(|m| m.ino() == ino) {
                        let _ = std::fs::remove_file(&target);
                    }
                }
                crate::ledger::fsio::fsync_dir(path.parent().unwrap_or(Path::new(".")))?;
                crate::info!(
                    "agent: {}: replaced while being converted; the other writer's version was \
                     put back; reading it again",
                    path.display()
                );
                return Ok(None);
            }
            crate::ledger::fsio::fsync_dir(path.parent().unwrap_or(Path::new(".")))?;
            Ok(Some(text))
        })();
        match result {
            Ok(None) => None,
            Ok(Some(_)) => {
                st.converted = true;
                st.ours_ino = None;
                st.error = None;
                crate::info!(
                    "agent: {}: single-plugin configuration converted to {} with the ledger first \
                     (original kept as {})",
                    path.display(),
                    target.display(),
                    aside.display()
                );
                let label = target.display().to_string();
                self.shared
                    .metrics
                    .injections
                    .with_label_values(&[&label])
                    .inc();
                // Verify and adopt the new file as ours.
                let done = self.reconcile_file(&target, now);
                Some(FileOutcome {
                    wrote: true,
                    network: net,
                    ..done
                })
            }
            Err(e) => {
                st.error = Some(format!("{e:#}"));
                crate::error!("agent: {}: {e:#}", path.display());
                Some(FileOutcome::new(path.to_path_buf(), false, false, net))
            }
        }
    }
}

/// Writes the injected text in place of the file `read` came from, unless another
/// writer changed that file since (None: start over, nothing of theirs replaced), and
/// reads it back; true when verified.
fn write_verified(
    path: &Path,
    read: &crate::replace::ReadConf,
    text: &str,
    plugin_type: &str,
    entry: &EntryOptions,
    st: &mut FileState,
    shared: &Shared,
) -> Option<bool> {
    let label = path.display().to_string();
    let ino = match crate::replace::replace_if_unchanged(path, read, text.as_bytes()) {
        Ok(crate::replace::Replaced::Done { ino }) => ino,
        Ok(crate::replace::Replaced::Changed(why)) => {
            crate::info!("agent: {label}: {why} after it was read; reading it again");
            return None;
        }
        Err(e) => {
            crate::error!("agent: {label}: {e:#}");
            st.error = Some(format!("{e:#}"));
            return Some(false);
        }
    };
    crate::info!("agent: {label}: ledger injected");
    shared.metrics.injections.with_label_values(&[&label]).inc();
    // Ours from here: a writer that changes it even before the read-back below has
    // reverted it, and its event brings the next pass.
    st.ours = Some(text.as_bytes().to_vec());
    st.ours_doc = serde_json::from_str(text).ok();
    st.ours_ino = Some(ino);
    let back = std::fs::read(path).unwrap_or_default();
    if back == text.as_bytes() {
        st.error = None;
        return Some(true);
    }
    let injected =
        injection::plan(path, &back, plugin_type, entry, false).is_ok_and(|p| !p.changed);
    if !injected {
        st.error = Some("changed again right after the injection".into());
    }
    Some(injected)
}

/// A file that did not exist under this name, made from a fresh O_EXCL temp (mode of
/// the file `like` was read from) linked into place, which fails rather than replace a
/// file another writer created meanwhile. Returns its inode. Not yet durable: the
/// caller fsyncs the directory.
fn write_new(path: &Path, like: &crate::replace::ReadConf, bytes: &[u8]) -> anyhow::Result<u64> {
    use crate::ledger::fsio;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = fsio::write_temp(dir, &name, bytes, "conflist", like.mode())?;
    let linked = std::fs::hard_link(&tmp, path);
    let ino = std::fs::symlink_metadata(&tmp).map(|m| m.ino());
    let _ = std::fs::remove_file(&tmp);
    linked.with_context(|| format!("creating {}", path.display()))?;
    // The directory is fsynced by the caller, once the conversion is complete.
    ino.with_context(|| format!("examining {}", path.display()))
}

/// Writes or removes one of the ledger's drop-ins (tail or head) as planned; a failure is
/// logged and tried again on the next pass (until then a tail's records are untracked,
/// and a chain without its head drop-in shows as not injected).
fn apply_tail_dropin(d: &injection::TailDropin) {
    match d.apply() {
        Ok(()) if d.want.is_some() => crate::info!("agent: {}: placed", d.path.display()),
        Ok(()) => crate::info!("agent: {}: removed", d.path.display()),
        Err(e) => crate::warn!("agent: {e:#}"),
    }
}

/// Why the chain of the conflist `path` as libcni v1.3 loads it (drop-ins included)
/// does not start with the ledger's head, if it does not; None for a file that is not
/// a `.conflist` (its inline head is what was planned) or that v1.3 cannot load (the
/// plan judged it).
fn not_first(path: &Path, plugin_type: &str) -> Option<String> {
    if path.extension().is_none_or(|e| e != "conflist") {
        return None;
    }
    let list = crate::conflist::load_for_runtime(path, crate::conflist::Libcni::V1_3).ok()?;
    let first = crate::conflist::plugins(&list).first()?;
    if crate::chain::is_head(first, plugin_type) {
        return None;
    }
    Some(format!(
        "the chain as libcni v1.3 loads it starts with {}, not {plugin_type}: a drop-in \
         sorts before the ledger's head drop-in {}; rename it to sort after",
        crate::conflist::plugin_type(first),
        injection::HEAD_DROPIN
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_revert_is_described_by_what_changed() {
        let ours = json!({"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"cni-ledger"},{"type":"calico"}]});
        let theirs = json!({"cniVersion":"0.3.1","name":"k8s","plugins":[{"type":"calico"}]});
        assert_eq!(
            describe_change(Some(&ours), &theirs, true),
            "plugins now [calico]; also changed: cniVersion; replaced by rename (a new file)"
        );
        let theirs =
            json!({"cniVersion":"1.0.0","name":"k8s","plugins":[{"type":"calico","mtu":1400}]});
        assert_eq!(
            describe_change(Some(&ours), &theirs, false),
            "plugins now [calico]; the other plugins' entries differ too; written in place"
        );
    }
}
