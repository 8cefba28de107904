//! The read-only HTTP endpoints, on up to two listeners, each with its own thread,
//! runtime, accept loop and connection budget:
//!
//! - `--listen` serves `/metrics`, `/healthz` and `/readyz` to whoever reaches the node's
//!   address. The node network may carry slow or hostile clients, so it bounds what one
//!   can hold: `MAX_CONNECTIONS` at once (further ones are closed at accept),
//!   `HEADER_TIMEOUT` to send a request head of at most `MAX_REQUEST_BYTES`,
//!   `CONNECTION_TIMEOUT` in all.
//! - `--probe-listen` serves `/healthz` and `/readyz` only, for kubelet's probes. Pods
//!   that fill the metrics port's budget never reach its budget; when its own
//!   `PROBE_MAX_CONNECTIONS` are taken, the oldest connection is closed to make room
//!   rather than the new one refused: kubelet sends its request as soon as it connects
//!   and is answered at once, so the oldest is the one most likely idle, and a burst
//!   of idle clients delays a probe by nothing instead of by a header timeout.
//!
//! One request per connection, and no request body is ever read. The servers share
//! nothing with the watcher or gc but a status snapshot, the threads' liveness and the
//! metric values, so a client can never stall either. No request changes anything.

use super::Shared;
use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const MAX_CONNECTIONS: usize = 32;
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(15);
/// kubelet probes a few times per period; a handful of slots covers liveness,
/// readiness and startup probes landing together.
pub const PROBE_MAX_CONNECTIONS: usize = 8;
/// kubelet writes its request right after connecting, and gives up after its probe
/// timeout (1 s by default).
pub const PROBE_HEADER_TIMEOUT: Duration = Duration::from_secs(2);
pub const PROBE_CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
/// hyper's smallest read buffer; a request head must fit in it.
pub const MAX_REQUEST_BYTES: usize = 8192;

/// What one listener serves and how it bounds its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerRole {
    /// `--listen`: metrics and both probes; refuses connections beyond its budget.
    Main,
    /// `--probe-listen`: the probes only; evicts its oldest connection when full.
    Probes,
}

impl ListenerRole {
    fn max_connections(self) -> usize {
        match self {
            ListenerRole::Main => MAX_CONNECTIONS,
            ListenerRole::Probes => PROBE_MAX_CONNECTIONS,
        }
    }

    fn timeouts(self) -> (Duration, Duration) {
        match self {
            ListenerRole::Main => (HEADER_TIMEOUT, CONNECTION_TIMEOUT),
            ListenerRole::Probes => (PROBE_HEADER_TIMEOUT, PROBE_CONNECTION_TIMEOUT),
        }
    }
}

/// `ADDR:PORT` for `--listen` and `--probe-listen`: `1.2.3.4:9657`, `[fd00::1]:9657`, or
/// a bare IPv6 address followed by `:PORT`, as kubelet writes `$(NODE_IP):9657` on an
/// IPv6 node (`fd00::1:9657`). In the bare form the part after the last `:` is always
/// the port, so a port is required and `fd00::1:9657` means `[fd00::1]:9657`, never
/// the address `fd00::1:9657` on a default port; write the brackets to say otherwise.
pub fn parse_listen(s: &str) -> Result<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bad = || format!("{s:?} is not ADDR:PORT (1.2.3.4:9657, [fd00::1]:9657 or fd00::1:9657)");
    let (host, port) = s.rsplit_once(':').with_context(bad)?;
    let ip: Ipv6Addr = host.parse().with_context(bad)?;
    let port: u16 = port.parse().with_context(bad)?;
    Ok(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0)))
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn code(ok: bool) -> StatusCode {
    if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

fn respond<B>(shared: &Shared, role: ListenerRole, req: &Request<B>) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "read-only: GET or HEAD\n".into(),
        );
        r.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return r;
    }
    match (req.uri().path(), role) {
        ("/metrics", ListenerRole::Main) => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            shared.metrics.encode(),
        ),
        ("/healthz", _) => {
            let (alive, body) = shared.health.report();
            text(code(alive), PLAIN, body)
        }
        ("/readyz", _) => {
            let (ready, body) = shared.status().readiness();
            text(code(ready), PLAIN, body)
        }
        (_, ListenerRole::Main) => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: /metrics, /healthz, /readyz\n".into(),
        ),
        (_, ListenerRole::Probes) => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: /healthz, /readyz (metrics are on --listen)\n".into(),
        ),
    }
}

/// The connections a listener holds, oldest first (ids only grow).
type Open = Arc<Mutex<BTreeMap<u64, tokio::task::AbortHandle>>>;

/// Serves `role` on `listener` until the process exits; runs on the calling thread.
pub fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    role: ListenerRole,
) -> Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the HTTP runtime")?;
    let (header_timeout, connection_timeout) = role.timeouts();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let open: Open = Arc::default();
        let mut next_id: u64 = 0;
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and the like: wait instead of spinning on accept.
                    crate::warn!("agent: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let Ok(mut held) = open.lock() else {
                continue;
            };
            if held.len() >= role.max_connections() {
                match role {
                    ListenerRole::Main => {
                        drop(stream);
                        continue;
                    }
                    ListenerRole::Probes => {
                        if let Some((_, oldest)) = held.pop_first() {
                            oldest.abort();
                        }
                    }
                }
            }
            let id = next_id;
            next_id += 1;
            let (shared, open_now) = (shared.clone(), open.clone());
            // Registered under the lock the task takes to deregister itself, so a
            // connection that ends at once never leaves a stale entry behind.
            let task = tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let r = respond(&shared, role, &req);
                    async move { Ok::<_, Infallible>(r) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout)
                    .max_buf_size(MAX_REQUEST_BYTES)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), svc);
                let _ = tokio::time::timeout(connection_timeout, conn).await;
                if let Ok(mut held) = open_now.lock() {
                    held.remove(&id);
                }
            });
            held.insert(id, task.abort_handle());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        let ok = |s: &str| parse_listen(s).unwrap_or_else(|e| panic!("{s}: {e:#}"));
        assert_eq!(ok("127.0.0.1:9657"), "127.0.0.1:9657".parse().unwrap());
        assert_eq!(ok("[fd00::1]:9657"), "[fd00::1]:9657".parse().unwrap());
        // kubelet's $(NODE_IP):9657 on IPv6 nodes: the last group is the port.
        assert_eq!(ok("fd00::1:9657"), "[fd00::1]:9657".parse().unwrap());
        assert_eq!(
            ok("2001:db8::5:9657"),
            "[2001:db8::5]:9657".parse().unwrap()
        );
        assert_eq!(ok("::1:9658"), "[::1]:9658".parse().unwrap());
        assert_eq!(ok(":::9657"), "[::]:9657".parse().unwrap());
        assert_eq!(
            ok("2001:db8:1:2:3:4:5:6:80"),
            "[2001:db8:1:2:3:4:5:6]:80".parse().unwrap()
        );
        assert_eq!(
            ok("::ffff:10.0.0.1:9657"),
            "[::ffff:10.0.0.1]:9657".parse().unwrap()
        );
        for bad in [
            "",
            "9657",
            "fd00::1",         // a bare address alone: its last group is taken as a port
            "fd00::1:99999",   // port out of range
            "fd00::1:abcd",    // not a decimal port
            "10.0.0.1",        // no port
            "10.0.0.1:9657:1", // IPv4 with two ports
            "[fd00::1]9657",
            "node-1:9657", // names are not resolved
            "fd00::1%eth0:9657",
        ] {
            assert!(parse_listen(bad).is_err(), "{bad:?} accepted");
        }
    }
}
