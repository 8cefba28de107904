//! The read-only HTTP endpoints. The node network may carry slow or hostile clients, so
//! the server bounds what one can hold: `MAX_CONNECTIONS` at once (further ones are
//! closed at accept), `HEADER_TIMEOUT` to send a request head of at most
//! `MAX_REQUEST_BYTES`, `CONNECTION_TIMEOUT` in all, one request per connection, and no
//! request body is ever read. It runs on its own thread and runtime and shares nothing
//! with the watcher or gc but a status snapshot and the metric values, so a client can
//! never stall either. No request changes anything.

use super::Shared;
use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

pub const MAX_CONNECTIONS: usize = 32;
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(15);
/// hyper's smallest read buffer; a request head must fit in it.
pub const MAX_REQUEST_BYTES: usize = 8192;

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn respond<B>(shared: &Shared, req: &Request<B>) -> Response<Full<Bytes>> {
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
    match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            shared.metrics.encode(),
        ),
        "/healthz" => text(StatusCode::OK, PLAIN, "ok\n".into()),
        "/readyz" => {
            let (ready, body) = shared.status().readiness();
            let code = if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(code, PLAIN, body)
        }
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: /metrics, /healthz, /readyz\n".into(),
        ),
    }
}

pub fn serve(listener: std::net::TcpListener, shared: Arc<Shared>) -> Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the HTTP runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
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
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                drop(stream);
                continue;
            };
            let shared = shared.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let r = respond(&shared, &req);
                    async move { Ok::<_, Infallible>(r) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .max_buf_size(MAX_REQUEST_BYTES)
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), svc);
                let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
                drop(slot);
            });
        }
    })
}
