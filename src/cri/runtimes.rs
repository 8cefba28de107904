//! Which CRI runtimes a node has, and what they say together: the sandbox list that
//! may judge records, and the networks it may judge.
//!
//! A runtime's list may only judge the networks that runtime sets up. The agent guesses
//! them from its conf dir; a runtime that says what it loaded (containerd's verbose
//! `Status` carries its CNI configuration: conf dir and network names) narrows that
//! guess, and one that loads another conf dir judges nothing at all. The rule errs
//! towards live: any runtime that does not answer means no judgement.

use super::{api, block_on, connect, unary, AdoptedChains, Judgement, UNANSWERED};
use anyhow::{Context, Result};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often a CRI call in progress looks at the caller's stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Where the CRI runtimes listen unless configured otherwise: containerd, CRI-O (which
/// documents `/var/run/crio/crio.sock`; `/var/run` is a link to `/run` on most nodes),
/// k3s's and rke2's embedded containerd, and cri-dockerd. Only containerd says which
/// networks it serves; the others judge nothing unless named (`Served::Reported`).
pub const DEFAULT_SOCKETS: [&str; 6] = [
    "run/containerd/containerd.sock",
    "run/crio/crio.sock",
    "var/run/crio/crio.sock",
    "run/k3s/containerd/containerd.sock",
    "run/cri-dockerd.sock",
    "var/run/cri-dockerd.sock",
];

/// The endpoints of the default sockets that exist under `root` now (`/` on the node;
/// `/proc/1/root` in a container that shares the node's PID namespace), each socket
/// once however many of its names exist.
pub fn discover(root: &Path) -> Vec<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut seen = HashSet::new();
    DEFAULT_SOCKETS
        .iter()
        .filter_map(|rel| {
            let path = root.join(rel);
            let md = std::fs::metadata(&path).ok()?;
            let new = md.file_type().is_socket() && seen.insert((md.dev(), md.ino()));
            new.then(|| format!("unix://{}", path.display()))
        })
        .collect()
}

/// A socket that speaks gRPC but serves no CRI `RuntimeService` (Docker's containerd
/// runs with its CRI plugin disabled): no runtime of pods at all.
#[derive(Debug)]
pub struct NotCri;

impl std::fmt::Display for NotCri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("it serves no CRI RuntimeService (Unimplemented)")
    }
}

impl std::error::Error for NotCri {}

/// What one runtime said.
pub(super) struct Reply {
    pub(super) sandboxes: HashMap<String, i32>,
    /// Its loaded CNI configuration, when it says.
    served: Option<Loaded>,
}

/// A runtime's loaded CNI configuration, as it reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Loaded {
    conf_dir: Option<String>,
    networks: HashSet<String>,
    /// Per network, the `chain_digest` of the conflist it loaded.
    chains: HashMap<String, String>,
}

pub(super) async fn ask(endpoint: &str, want_served: bool, timeout: Duration) -> Result<Reply> {
    let channel = connect(endpoint, timeout).await?;
    let resp: api::ListPodSandboxResponse = unary(
        channel.clone(),
        api::LIST_POD_SANDBOX,
        api::ListPodSandboxRequest::default(),
    )
    .await
    .map_err(|s| match s.code() {
        tonic::Code::Unimplemented => anyhow::Error::new(NotCri),
        code => anyhow::anyhow!("{code}: {}", s.message()),
    })
    .with_context(|| format!("{endpoint}: ListPodSandbox"))?;
    let sandboxes = resp.items.into_iter().map(|s| (s.id, s.state)).collect();
    let mut served = None;
    if want_served {
        let status: Result<api::StatusResponse, _> =
            unary(channel, api::STATUS, api::StatusRequest { verbose: true }).await;
        served = status.ok().and_then(|s| loaded(&s.info));
    }
    Ok(Reply { sandboxes, served })
}

/// containerd's `cniconfig`: `{"PluginConfDir": …, "Networks":[{"Config":{"Name":…}}]}`.
fn loaded(info: &HashMap<String, String>) -> Option<Loaded> {
    let doc: serde_json::Value = serde_json::from_str(info.get("cniconfig")?).ok()?;
    let entries = doc.get("Networks")?.as_array()?;
    let networks = entries
        .iter()
        .filter_map(|n| n.pointer("/Config/Name")?.as_str().map(String::from))
        .collect();
    // `Source` is the conflist text as loaded, the same bytes libcni caches at ADD.
    let chains = entries
        .iter()
        .filter_map(|n| {
            let name = n.pointer("/Config/Name")?.as_str()?;
            let source = n.pointer("/Config/Source")?.as_str()?;
            let list = crate::conflist::parse(source.as_bytes())?;
            Some((
                name.to_string(),
                crate::conflist::chain_digest(&list, crate::cni::config::DEFAULT_PLUGIN_TYPE),
            ))
        })
        .collect();
    let conf_dir = doc
        .get("PluginConfDir")
        .and_then(|d| d.as_str())
        .map(String::from);
    Some(Loaded {
        conf_dir,
        networks,
        chains,
    })
}

/// Which of the wanted networks a judgement covers.
#[derive(Debug, Clone, Copy)]
pub enum Served<'a> {
    /// All of them: the operator named them (`--cri-network`).
    Any,
    /// Only those a runtime says it loads from this conf dir. A runtime that does not
    /// say (CRI-O, cri-dockerd) judges nothing when it was only discovered (a stray
    /// runtime on the node must not judge the pods of another), and when named, only
    /// the conf dir's default network, the one it sets pods up in (never Podman's).
    Reported {
        conf_dir: &'a Path,
        /// The network of the conf dir's first conflist, libcni's default choice.
        default_network: Option<&'a str>,
        /// The endpoints were found at default sockets, not named by the operator.
        discovered: bool,
    },
}

/// What one endpoint answered, for the report and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub endpoint: String,
    /// Sandboxes it lists; None when it did not answer.
    pub sandboxes: Option<usize>,
}

#[derive(Debug, Clone, Default)]
pub struct Consulted {
    /// None unless every endpoint answered and some network is left to judge.
    pub judgement: Option<Judgement>,
    pub answers: Vec<Answer>,
    /// Discovered sockets that serve no CRI at all: left out, not "did not answer".
    pub not_cri: Vec<String>,
}

/// Asks every endpoint, then judges as `merge` says. `discovered`: the endpoints were
/// found, not named, so one that turns out to serve no CRI is simply not a runtime.
pub fn consult(
    endpoints: &[String],
    networks: &[String],
    served: Served,
    discovered: bool,
    timeout: Duration,
) -> Consulted {
    let never = AtomicBool::new(false);
    consult_until(endpoints, networks, served, discovered, timeout, &never).unwrap_or_default()
}

/// `ask`, given up (None) once `stop` is set: a stopping agent does not wait out the
/// timeout of a runtime that accepts and never answers.
async fn ask_until(
    endpoint: &str,
    want_served: bool,
    timeout: Duration,
    stop: &AtomicBool,
) -> Option<Result<Reply>> {
    let mut call = Box::pin(ask(endpoint, want_served, timeout));
    loop {
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        if let Ok(reply) = tokio::time::timeout(STOP_POLL, &mut call).await {
            return Some(reply);
        }
    }
}

/// `consult`, given up once `stop` is set (None: nothing judged, nothing counted as
/// unanswered; the caller is stopping).
pub fn consult_until(
    endpoints: &[String],
    networks: &[String],
    served: Served,
    discovered: bool,
    timeout: Duration,
    stop: &AtomicBool,
) -> Option<Consulted> {
    let fetched_at = crate::time::now();
    let want_served = matches!(served, Served::Reported { .. });
    let mut not_cri = Vec::new();
    let mut replies = Vec::new();
    for e in endpoints {
        let reply = match block_on(ask_until(e, want_served, timeout, stop)) {
            Ok(Some(reply)) => reply,
            Ok(None) => return None,
            Err(err) => Err(err),
        };
        match &reply {
            Err(err) if discovered && err.is::<NotCri>() => not_cri.push(e.clone()),
            Err(_) => {
                UNANSWERED.fetch_add(1, Ordering::Relaxed);
                replies.push((e.clone(), reply));
            }
            Ok(_) => replies.push((e.clone(), reply)),
        }
    }
    let mut consulted = merge(replies, networks, served, fetched_at);
    consulted.not_cri = not_cri;
    Some(consulted)
}

/// Only when every runtime answered is anything judged (a sandbox of a silent runtime
/// would look absent), against the union of their sandboxes, for the wanted networks
/// that some runtime serving our conf dir loads.
fn merge(
    replies: Vec<(String, Result<Reply>)>,
    networks: &[String],
    served: Served,
    fetched_at: i64,
) -> Consulted {
    let mut answers = Vec::new();
    let mut sandboxes: HashMap<String, i32> = HashMap::new();
    let mut judged: HashSet<String> = HashSet::new();
    let mut chains: HashMap<String, HashSet<String>> = HashMap::new();
    let mut all_answered = !replies.is_empty();
    for (endpoint, reply) in replies {
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                crate::error!(
                    "cri: the runtime did not answer ({e:#}); nothing is judged by sandbox lists this run"
                );
                answers.push(Answer {
                    endpoint,
                    sandboxes: None,
                });
                all_answered = false;
                continue;
            }
        };
        answers.push(Answer {
            endpoint: endpoint.clone(),
            sandboxes: Some(reply.sandboxes.len()),
        });
        let covers = covered(&endpoint, reply.served.as_ref(), networks, served);
        if let Some(loaded) = &reply.served {
            for net in &covers {
                if let Some(d) = loaded.chains.get(net) {
                    chains.entry(net.clone()).or_default().insert(d.clone());
                }
            }
        }
        judged.extend(covers);
        for (id, state) in reply.sandboxes {
            // Ready (0) wins over not-ready: neither is absent, and ready is the truer
            // word if two runtimes disagree.
            let e = sandboxes.entry(id).or_insert(state);
            *e = (*e).min(state);
        }
    }
    let mut judged: Vec<String> = judged.into_iter().collect();
    judged.sort();
    let endpoints: Vec<&str> = answers.iter().map(|a| a.endpoint.as_str()).collect();
    let judgement = if !all_answered {
        None
    } else if judged.is_empty() {
        crate::info!(
            "cri: {} serve(s) none of the networks {}; nothing is judged by sandbox lists",
            endpoints.join(", "),
            networks.join(", ")
        );
        None
    } else {
        crate::info!(
            "cri: {} list(s) {} pod sandbox(es); judging networks {}",
            endpoints.join(", "),
            sandboxes.len(),
            judged.join(", ")
        );
        let adopted = match served {
            Served::Any => AdoptedChains::Any,
            Served::Reported { .. } => AdoptedChains::Loaded(chains),
        };
        Some(Judgement {
            networks: judged.into_iter().collect(),
            sandboxes,
            fetched_at,
            adopted,
        })
    };
    Consulted {
        judgement,
        answers,
        ..Consulted::default()
    }
}

/// The wanted networks one runtime's list may judge.
fn covered(
    endpoint: &str,
    loaded: Option<&Loaded>,
    wanted: &[String],
    served: Served,
) -> Vec<String> {
    let Served::Reported {
        conf_dir,
        default_network,
        discovered,
    } = served
    else {
        return wanted.to_vec();
    };
    let Some(loaded) = loaded else {
        if discovered {
            crate::info!(
                "cri: {endpoint} does not say which networks it serves and was not named with --cri-endpoint: its sandboxes judge nothing"
            );
            return Vec::new();
        }
        return wanted
            .iter()
            .filter(|n| Some(n.as_str()) == default_network)
            .cloned()
            .collect();
    };
    if let Some(theirs) = &loaded.conf_dir {
        if !same_dir(conf_dir, theirs) {
            crate::info!(
                "cri: {endpoint} loads {theirs}, not {}: its sandboxes judge nothing here",
                conf_dir.display()
            );
            return Vec::new();
        }
    }
    wanted
        .iter()
        .filter(|n| loaded.networks.contains(*n))
        .cloned()
        .collect()
}

/// Whether the runtime's conf dir (a node path: gc and the agent run in the node's
/// root) is ours: the same directory, not the same spelling. Unreadable is not the same.
fn same_dir(ours: &Path, theirs: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(ours), std::fs::metadata(theirs)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn scratch(tag: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("cl-cri-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        root
    }

    #[test]
    fn discovers_each_default_socket_once() {
        use std::os::unix::net::UnixListener;
        let root = scratch("discover");
        std::fs::create_dir_all(root.join("run/containerd")).unwrap();
        std::fs::create_dir_all(root.join("run/crio")).unwrap();
        std::fs::create_dir_all(root.join("var")).unwrap();
        assert!(discover(&root).is_empty());
        // A plain file where a socket belongs is no runtime.
        std::fs::write(root.join("run/containerd/containerd.sock"), "").unwrap();
        assert!(discover(&root).is_empty());
        std::fs::remove_file(root.join("run/containerd/containerd.sock")).unwrap();
        let _a = UnixListener::bind(root.join("run/containerd/containerd.sock")).unwrap();
        let _b = UnixListener::bind(root.join("run/crio/crio.sock")).unwrap();
        // /var/run -> ../run: CRI-O's documented name reaches the same socket.
        std::os::unix::fs::symlink("../run", root.join("var/run")).unwrap();
        let ep = |rel: &str| format!("unix://{}", root.join(rel).display());
        assert_eq!(
            discover(&root),
            [
                ep("run/containerd/containerd.sock"),
                ep("run/crio/crio.sock")
            ]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn what_containerd_says_it_loaded() {
        // The shape containerd 1.6 answers in Status(verbose) info["cniconfig"].
        let source = r#"{"cniVersion":"1.0.0","name":"mynet","plugins":[{"type":"cni-ledger"},{"type":"bridge","bridge":"cni0"}]}"#;
        let cniconfig = serde_json::json!({
            "PluginDirs": ["/opt/cni/bin"], "PluginConfDir": "/etc/cni/net.d",
            "Networks": [
                {"Config": {"Name": "cni-loopback", "Plugins": []}, "IFName": "lo"},
                {"Config": {"Name": "mynet", "Plugins": [], "Source": source}, "IFName": "eth0"},
            ],
        });
        let info = HashMap::from([("cniconfig".to_string(), cniconfig.to_string())]);
        // The chain as libcni cached it before the ledger was injected digests alike.
        let before_inject = crate::conflist::parse(
            br#"{"name":"mynet","cniVersion":"1.0.0","plugins":[{"bridge":"cni0","type":"bridge"}]}"#,
        )
        .unwrap();
        assert_eq!(
            loaded(&info),
            Some(Loaded {
                conf_dir: Some("/etc/cni/net.d".into()),
                networks: HashSet::from(["cni-loopback".into(), "mynet".into()]),
                chains: HashMap::from([(
                    "mynet".into(),
                    crate::conflist::chain_digest(&before_inject, "cni-ledger")
                )]),
            })
        );
        // CRI-O, or a runtime that does not say: unknown, not "serves nothing".
        assert_eq!(loaded(&HashMap::new()), None);
        let bad = HashMap::from([("cniconfig".to_string(), "{".to_string())]);
        assert_eq!(loaded(&bad), None);
    }

    fn reply(ids: &[(&str, i32)], served: Option<(&Path, &[&str])>) -> Result<Reply> {
        Ok(Reply {
            sandboxes: ids.iter().map(|(i, s)| (i.to_string(), *s)).collect(),
            served: served.map(|(dir, nets)| Loaded {
                conf_dir: Some(dir.display().to_string()),
                networks: nets.iter().map(|n| n.to_string()).collect(),
                chains: nets
                    .iter()
                    .map(|n| (n.to_string(), format!("{n}-chain")))
                    .collect(),
            }),
        })
    }

    fn nets(j: &Judgement) -> Vec<&str> {
        let mut v: Vec<&str> = j.networks.iter().map(String::as_str).collect();
        v.sort();
        v
    }

    #[test]
    fn runtimes_judge_only_the_networks_they_load_from_our_conf_dir() {
        let root = scratch("merge");
        let ours = root.join("net.d");
        let other = root.join("other.d");
        std::fs::create_dir_all(&ours).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        // Another spelling of our dir is our dir.
        std::os::unix::fs::symlink(&ours, root.join("alias.d")).unwrap();
        let wanted = ["pods".to_string(), "podman".to_string()];
        let served = Served::Reported {
            conf_dir: &ours,
            default_network: Some("pods"),
            discovered: false,
        };
        let ep = |n: &str| format!("unix:///run/{n}.sock");

        // containerd loads pods (not podman's network) from our dir, via the alias.
        let alias = root.join("alias.d");
        let c = merge(
            vec![(ep("a"), reply(&[("p1", 0)], Some((&alias, &["pods"]))))],
            &wanted,
            served,
            100,
        );
        let j = c.judgement.unwrap();
        assert_eq!(nets(&j), ["pods"]);
        assert_eq!(c.answers[0].sandboxes, Some(1));
        // Adopted records of pods are judged only if their chain is the loaded one.
        assert_eq!(
            j.adopted,
            AdoptedChains::Loaded(HashMap::from([(
                "pods".into(),
                HashSet::from(["pods-chain".into()])
            )]))
        );

        // A runtime loading another dir judges nothing, even with the same network name.
        let c = merge(
            vec![(ep("a"), reply(&[], Some((&other, &["pods"]))))],
            &wanted,
            served,
            100,
        );
        assert!(c.judgement.is_none());
        assert_eq!(c.answers[0].sandboxes, Some(0));

        // One that does not say (CRI-O), named by the operator, judges the conf dir's
        // default network only (never Podman's); with a second runtime, the sandboxes
        // are the union and ready wins.
        let c = merge(
            vec![
                (ep("a"), reply(&[("p1", 1)], Some((&ours, &["pods"])))),
                (ep("b"), reply(&[("p1", 0), ("p2", 1)], None)),
            ],
            &wanted,
            served,
            100,
        );
        let j = c.judgement.unwrap();
        assert_eq!(nets(&j), ["pods"]);
        assert_eq!(
            j.sandboxes,
            HashMap::from([("p1".into(), 0), ("p2".into(), 1)])
        );
        // CRI-O names no chain: an adopted podman record is never found absent.
        let AdoptedChains::Loaded(chains) = &j.adopted else {
            panic!("{:?}", j.adopted)
        };
        assert!(!chains.contains_key("podman"), "{chains:?}");
        let c = merge(
            vec![(ep("b"), reply(&[("p1", 0)], None))],
            &wanted,
            served,
            100,
        );
        assert_eq!(nets(&c.judgement.unwrap()), ["pods"]);

        // The same runtime found only by discovery judges nothing at all.
        let discovered = Served::Reported {
            conf_dir: &ours,
            default_network: Some("pods"),
            discovered: true,
        };
        let c = merge(
            vec![(ep("b"), reply(&[("p1", 0)], None))],
            &wanted,
            discovered,
            100,
        );
        assert!(c.judgement.is_none());
        assert_eq!(c.answers[0].sandboxes, Some(1));

        // Any runtime silent: nothing judged, whatever the others said.
        let c = merge(
            vec![
                (ep("a"), reply(&[("p1", 0)], Some((&ours, &["pods"])))),
                (ep("b"), Err(anyhow::anyhow!("connection refused"))),
            ],
            &wanted,
            served,
            100,
        );
        assert!(c.judgement.is_none());
        assert_eq!(c.answers[1].sandboxes, None);

        // Networks the operator named are judged as named.
        let c = merge(
            vec![(ep("a"), reply(&[], Some((&other, &["x"]))))],
            &wanted,
            Served::Any,
            100,
        );
        let j = c.judgement.unwrap();
        assert_eq!(nets(&j), ["podman", "pods"]);
        assert_eq!(j.adopted, AdoptedChains::Any);
        assert!(merge(Vec::new(), &wanted, Served::Any, 100)
            .judgement
            .is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_stop_gives_up_the_call_to_a_runtime_that_never_answers() {
        use std::os::unix::net::UnixListener;
        use std::sync::Arc;
        let root = scratch("hung");
        // Bound and never accepted: connections wait in the backlog, unanswered.
        let path = root.join("hung.sock");
        let _hung = UnixListener::bind(&path).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            flag.store(true, Ordering::SeqCst);
        });
        let t0 = std::time::Instant::now();
        let consulted = consult_until(
            &[format!("unix://{}", path.display())],
            &["net1".to_string()],
            Served::Any,
            false,
            Duration::from_secs(10),
            &stop,
        );
        let took = t0.elapsed();
        setter.join().unwrap();
        assert!(consulted.is_none());
        assert!(took < Duration::from_secs(3), "took {took:?}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
