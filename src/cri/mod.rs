//! The CRI runtime's own list of pod sandboxes, as a valid set for `gc` and `list`.
//!
//! CRI v1 is gRPC on a unix socket. The client is tonic (with prost messages) on a
//! current-thread tokio runtime that exists only for the duration of one call, and only
//! in the CLI: the plugin face (ADD, DEL) never reaches this module.
//!
//! A runtime that does not answer is no evidence at all: the caller then judges
//! nothing by it (never "everything is stale"); `unanswered()` counts such calls.

pub mod api;

use anyhow::{bail, Context, Result};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};

/// Largest ListPodSandbox answer accepted: some 100,000 sandboxes.
const MAX_RESPONSE: usize = 64 << 20;

static UNANSWERED: AtomicU64 = AtomicU64::new(0);

/// How many times a CRI runtime did not answer in this process (for metrics).
pub fn unanswered() -> u64 {
    UNANSWERED.load(Ordering::Relaxed)
}

/// `unix:///run/containerd/containerd.sock` → the socket path; nothing else is CRI here.
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    match endpoint.strip_prefix("unix://") {
        Some(p) if p.starts_with('/') => Ok(PathBuf::from(p)),
        _ => bail!("CRI endpoint {endpoint}: expected unix:///absolute/path"),
    }
}

/// A gRPC channel over the endpoint's unix socket (the authority is a placeholder:
/// the connector ignores it).
pub async fn connect(endpoint: &str, timeout: Duration) -> Result<Channel> {
    let path = socket_path(endpoint)?;
    let channel = Endpoint::from_static("http://cri.invalid")
        .connect_timeout(timeout)
        .timeout(timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .with_context(|| format!("connecting to {endpoint}"))?;
    Ok(channel)
}

/// One unary call of `method` (`/runtime.v1.RuntimeService/...`).
pub async fn unary<Req, Resp>(
    channel: Channel,
    method: &'static str,
    request: Req,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RESPONSE);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
    let path = PathAndQuery::from_static(method);
    Ok(grpc
        .unary(tonic::Request::new(request), path, codec)
        .await?
        .into_inner())
}

/// Runs `fut` on a current-thread runtime made for it.
pub fn block_on<T>(fut: impl std::future::Future<Output = T>) -> Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the CRI client runtime")?;
    Ok(rt.block_on(fut))
}

/// Sandbox ID → `PodSandboxState` of every sandbox the runtime lists.
pub fn list_sandboxes(endpoint: &str, timeout: Duration) -> Result<HashMap<String, i32>> {
    Ok(block_on(ask(endpoint, false, timeout))??.sandboxes)
}

/// Where containerd and CRI-O listen unless configured otherwise (CRI-O documents
/// `/var/run/crio/crio.sock`; `/var/run` is a link to `/run` on Debian).
pub const DEFAULT_SOCKETS: [&str; 3] = [
    "run/containerd/containerd.sock",
    "run/crio/crio.sock",
    "var/run/crio/crio.sock",
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

/// What one runtime said.
struct Reply {
    sandboxes: HashMap<String, i32>,
    /// The networks it says it serves, when it says (containerd's verbose Status has
    /// its loaded CNI configuration; CRI-O's does not).
    served: Option<HashSet<String>>,
}

async fn ask(endpoint: &str, want_served: bool, timeout: Duration) -> Result<Reply> {
    let channel = connect(endpoint, timeout).await?;
    let resp: api::ListPodSandboxResponse = unary(
        channel.clone(),
        api::LIST_POD_SANDBOX,
        api::ListPodSandboxRequest::default(),
    )
    .await
    .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))
    .with_context(|| format!("{endpoint}: ListPodSandbox"))?;
    let sandboxes = resp.items.into_iter().map(|s| (s.id, s.state)).collect();
    let mut served = None;
    if want_served {
        let status: Result<api::StatusResponse, _> =
            unary(channel, api::STATUS, api::StatusRequest { verbose: true }).await;
        served = status.ok().and_then(|s| served_networks(&s.info));
    }
    Ok(Reply { sandboxes, served })
}

/// The network names in containerd's `cniconfig` (`{"Networks":[{"Config":{"Name":…}}]}`).
fn served_networks(info: &HashMap<String, String>) -> Option<HashSet<String>> {
    let doc: serde_json::Value = serde_json::from_str(info.get("cniconfig")?).ok()?;
    let names = doc
        .get("Networks")?
        .as_array()?
        .iter()
        .filter_map(|n| n.pointer("/Config/Name")?.as_str().map(String::from))
        .collect();
    Some(names)
}

/// The runtime's word on the networks it serves, fetched before the scan.
#[derive(Debug, Clone)]
pub struct Judgement {
    pub networks: HashSet<String>,
    pub sandboxes: HashMap<String, i32>,
    /// When the list was fetched (Unix seconds): a record made since then may belong to
    /// a sandbox the list could not know yet.
    pub fetched_at: i64,
}

/// What the runtime says about one record: None when it does not judge it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ready,
    NotReady,
    Absent,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ready => "ready",
            Verdict::NotReady => "notready",
            Verdict::Absent => "absent",
        }
    }
}

impl Judgement {
    /// The runtime's state of the record's sandbox, for networks the runtime serves and
    /// records made before the list was fetched (`created_at` has whole seconds).
    pub fn verdict(&self, rec: &crate::ledger::Record) -> Option<Verdict> {
        if !self.networks.contains(&rec.network) {
            return None;
        }
        match self.sandboxes.get(&rec.container_id) {
            Some(s) if *s == api::PodSandboxState::SandboxReady as i32 => Some(Verdict::Ready),
            // NOTREADY (containerd keeps them after an unclean restart) is not absent.
            Some(_) => Some(Verdict::NotReady),
            None => {
                let before_list = rec.created_unix().is_some_and(|t| t < self.fetched_at - 1);
                before_list.then_some(Verdict::Absent)
            }
        }
    }
}

/// Asks the runtime; a runtime that does not answer yields None (logged, counted).
pub fn judgement(endpoint: &str, networks: &[String], timeout: Duration) -> Option<Judgement> {
    consult(&[endpoint.to_string()], networks, Served::Any, timeout).judgement
}

/// Which of the wanted networks a judgement covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// All of them: the operator named them (`--cri-network`).
    Any,
    /// Only those the runtime says it serves, where it says (the agent's own guess from
    /// the conf dir must not make the runtime judge another caller's network, such as
    /// podman's on the same node).
    Reported,
}

/// What one endpoint answered, for the report and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub endpoint: String,
    /// Sandboxes it lists; None when it did not answer.
    pub sandboxes: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct Consulted {
    /// None unless every endpoint answered and some network is left to judge.
    pub judgement: Option<Judgement>,
    pub answers: Vec<Answer>,
}

/// Asks every endpoint. Only when all of them answer is anything judged: a sandbox of
/// a runtime that did not answer would look absent. Sandboxes are the union.
pub fn consult(
    endpoints: &[String],
    networks: &[String],
    served: Served,
    timeout: Duration,
) -> Consulted {
    let fetched_at = crate::time::now();
    let mut answers = Vec::new();
    let mut sandboxes: HashMap<String, i32> = HashMap::new();
    let mut judged: HashSet<String> = networks.iter().cloned().collect();
    let mut all_answered = true;
    for endpoint in endpoints {
        let reply = block_on(ask(endpoint, served == Served::Reported, timeout)).and_then(|r| r);
        match reply {
            Ok(reply) => {
                answers.push(Answer {
                    endpoint: endpoint.clone(),
                    sandboxes: Some(reply.sandboxes.len()),
                });
                if let Some(names) = &reply.served {
                    judged.retain(|n| names.contains(n));
                }
                for (id, state) in reply.sandboxes {
                    // Ready (0) wins over not-ready: neither is absent, and ready is
                    // the truer word if two runtimes disagree.
                    let e = sandboxes.entry(id).or_insert(state);
                    *e = (*e).min(state);
                }
            }
            Err(e) => {
                UNANSWERED.fetch_add(1, Ordering::Relaxed);
                crate::error!(
                    "cri: the runtime did not answer ({e:#}); nothing is judged by sandbox lists this run"
                );
                answers.push(Answer {
                    endpoint: endpoint.clone(),
                    sandboxes: None,
                });
                all_answered = false;
            }
        }
    }
    let mut judged: Vec<String> = judged.into_iter().collect();
    judged.sort();
    let judgement = if !all_answered || endpoints.is_empty() {
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
        Some(Judgement {
            networks: judged.into_iter().collect(),
            sandboxes,
            fetched_at,
        })
    };
    Consulted { judgement, answers }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::record::sample;

    #[test]
    fn endpoints_are_unix_sockets() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert!(socket_path("/run/x.sock").is_err());
        assert!(socket_path("unix://relative").is_err());
        assert!(socket_path("tcp://1.2.3.4:5").is_err());
    }

    #[test]
    fn verdicts() {
        let rec = sample(); // network net1, container abc, created 2026-12-02T17:41:33Z
        let t = rec.created_unix().unwrap();
        let mut j = Judgement {
            networks: HashSet::from(["net1".to_string()]),
            sandboxes: HashMap::from([("other".to_string(), 0)]),
            fetched_at: t + 100,
        };
        assert_eq!(j.verdict(&rec), Some(Verdict::Absent));
        j.sandboxes.insert("abc".into(), 1);
        assert_eq!(j.verdict(&rec), Some(Verdict::NotReady));
        j.sandboxes.insert("abc".into(), 0);
        assert_eq!(j.verdict(&rec), Some(Verdict::Ready));
        j.sandboxes.remove("abc");
        j.fetched_at = t + 1; // made as the list was fetched: the list may not know it
        assert_eq!(j.verdict(&rec), None);
        j.fetched_at = t + 100;
        j.networks = HashSet::from(["other-net".to_string()]);
        assert_eq!(j.verdict(&rec), None);
    }

    #[test]
    fn discovers_each_default_socket_once() {
        use std::os::unix::net::UnixListener;
        let root = std::env::temp_dir().join(format!("cl-cri-discover-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
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
        let found = discover(&root);
        let ep = |rel: &str| format!("unix://{}", root.join(rel).display());
        assert_eq!(
            found,
            [
                ep("run/containerd/containerd.sock"),
                ep("run/crio/crio.sock")
            ]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn served_networks_from_containerd_status() {
        // The shape containerd 1.6 answers in Status(verbose) info["cniconfig"].
        let cniconfig = r#"{"PluginDirs":["/opt/cni/bin"],"PluginConfDir":"/etc/cni/net.d",
            "Networks":[{"Config":{"Name":"cni-loopback","Plugins":[]},"IFName":"lo"},
                        {"Config":{"Name":"mynet","Plugins":[]},"IFName":"eth0"}]}"#;
        let info = HashMap::from([("cniconfig".to_string(), cniconfig.to_string())]);
        assert_eq!(
            served_networks(&info),
            Some(HashSet::from(["cni-loopback".into(), "mynet".into()]))
        );
        // CRI-O, or a runtime that does not say: unknown, not "serves nothing".
        assert_eq!(served_networks(&HashMap::new()), None);
        let bad = HashMap::from([("cniconfig".to_string(), "{".to_string())]);
        assert_eq!(served_networks(&bad), None);
    }

    #[test]
    fn a_runtime_that_does_not_answer_judges_nothing() {
        let before = unanswered();
        let j = judgement(
            "unix:///nonexistent/cri.sock",
            &["net1".into()],
            Duration::from_secs(2),
        );
        assert!(j.is_none());
        assert_eq!(unanswered(), before + 1);
    }
}
