//! The CRI runtime's own list of pod sandboxes, as a valid set for `gc` and `list`.
//!
//! CRI v1 is gRPC on a unix socket. The client is tonic (with prost messages) on a
//! current-thread tokio runtime that exists only for the duration of one call, and only
//! in the CLI: the plugin face (ADD, DEL) never reaches this module.
//!
//! A runtime that does not answer is no evidence at all: the caller then judges
//! nothing by it (never "everything is stale"); `unanswered()` counts such calls.

pub mod api;
pub mod runtimes;

pub use runtimes::{consult, consult_until, discover, Answer, Consulted, Served};

use anyhow::{bail, Context, Result};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long a CRI runtime has to answer (gc, list and the agent alike).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Largest ListPodSandbox answer accepted: some 100,000 sandboxes.
const MAX_RESPONSE: usize = 64 << 20;

pub(crate) static UNANSWERED: AtomicU64 = AtomicU64::new(0);

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
    Ok(block_on(runtimes::ask(endpoint, false, timeout))??.sandboxes)
}

/// The runtime's word on the networks it serves, fetched before the scan.
#[derive(Debug, Clone)]
pub struct Judgement {
    pub networks: HashSet<String>,
    pub sandboxes: HashMap<String, i32>,
    /// When the list was fetched (Unix seconds): a record made since then may belong to
    /// a sandbox the list could not know yet.
    pub fetched_at: i64,
    pub adopted: AdoptedChains,
}

/// Which adopted records (made from libcni's cache, so of unknown origin) a list may
/// find absent: one runtime's attachment must not be judged by another's list just
/// because both name a network alike.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdoptedChains {
    /// Every one: the operator named the networks (`--cri-network`).
    Any,
    /// Per network, the chain digests (`conflist::chain_digest`) the runtimes report
    /// loading; an adopted record whose cached chain is none of them is not judged.
    Loaded(HashMap<String, HashSet<String>>),
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
                (before_list && self.may_find_absent(rec)).then_some(Verdict::Absent)
            }
        }
    }

    fn may_find_absent(&self, rec: &crate::ledger::Record) -> bool {
        let adopted = rec.source == Some(crate::ledger::RecordSource::Adopted);
        match &self.adopted {
            AdoptedChains::Loaded(chains) if adopted => rec
                .chain_digest
                .as_ref()
                .is_some_and(|d| chains.get(&rec.network).is_some_and(|set| set.contains(d))),
            _ => true,
        }
    }
}

/// Whether a runtime's silence (`Verdict::Absent`) may make stale a record whose
/// namespace check `l` said live (DESIGN §5). A runtime's silence is not proof: a
/// namespace shown at its path (verified by cookie, or the recorded device/inode with
/// nothing stronger recorded), held elsewhere on the node, or at a path that cannot be
/// read or seen from here may be a container the runtime runs outside CRI (`ctr run
/// --cni`, nerdctl), so only a record with no namespace path at all (adopted from a
/// cache entry that had none) is left to the list.
pub fn absence_may_judge(l: &crate::sandbox::Liveness) -> bool {
    l.reason.is_none() && l.evidence == crate::sandbox::Evidence::BootId
}

/// Asks the runtime; a runtime that does not answer yields None (logged, counted).
pub fn judgement(endpoint: &str, networks: &[String], timeout: Duration) -> Option<Judgement> {
    consult(
        &[endpoint.to_string()],
        networks,
        Served::Any,
        false,
        timeout,
    )
    .judgement
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
            adopted: AdoptedChains::Any,
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
    fn an_adopted_record_is_found_absent_only_by_a_runtime_loading_its_chain() {
        let mut rec = sample();
        rec.source = Some(crate::ledger::RecordSource::Adopted);
        rec.chain_digest = Some("d1".into());
        let t = rec.created_unix().unwrap();
        let mut j = Judgement {
            networks: HashSet::from(["net1".to_string()]),
            sandboxes: HashMap::from([("abc".to_string(), 0)]),
            fetched_at: t + 100,
            adopted: AdoptedChains::Loaded(HashMap::from([(
                "net1".to_string(),
                HashSet::from(["d0".to_string()]),
            )])),
        };
        // Listed: the runtime's state is shown whatever the chain.
        assert_eq!(j.verdict(&rec), Some(Verdict::Ready));
        j.sandboxes.clear();
        // Not listed, but another chain of the same name: not this runtime's to judge.
        assert_eq!(j.verdict(&rec), None);
        rec.chain_digest = None;
        assert_eq!(j.verdict(&rec), None);
        rec.chain_digest = Some("d0".into());
        assert_eq!(j.verdict(&rec), Some(Verdict::Absent));
        // ADD's own records are not held to it; nor anything when the operator named
        // the networks.
        rec.source = None;
        rec.chain_digest = None;
        assert_eq!(j.verdict(&rec), Some(Verdict::Absent));
        rec.source = Some(crate::ledger::RecordSource::Adopted);
        j.adopted = AdoptedChains::Any;
        assert_eq!(j.verdict(&rec), Some(Verdict::Absent));
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
