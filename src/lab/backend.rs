//! `snag backend`: an HTTP server that names itself, for the cases to count, and the
//! echo server the tests relay through.
//!
//! Every data request is answered `{"id":"a"}` with `x-instance: a`, after `delay`
//! and, with a worker pool, after waiting its turn for one of `workers` slots that
//! each take `work`: the spike target of seeds/002 is 8 workers × 25 ms. Queued work
//! is not cancelled when its caller leaves, as on a real server: a spike's backlog
//! drains after the traffic stops.
//!
//! Routes beside data requests: `GET /count` and `/reset` (data requests served),
//! `GET /stats` (in flight, queue depth, completed, how it was started), the health
//! path (200 or 503), `POST /admin/health {"healthy":false}`, `POST /admin/dependency
//! {"broken":true}` (data requests answer 200 with an error body while health stays
//! 200) and `POST /admin/delay {"ms":50}`.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Response, StatusCode, body::Incoming};
use serde::Deserialize;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
    sync::{Semaphore, oneshot},
};

use crate::shutdown::Shutdown;

/// How a backend behaves.
#[derive(Debug, Clone)]
pub struct Config {
    /// Its name, in `x-instance` and every body.
    pub id: String,
    /// Added to every data request.
    pub delay: Duration,
    /// A pool of this many workers serves data requests one at a time each.
    pub workers: Option<usize>,
    /// What one request takes a worker.
    pub work: Duration,
    /// Requests that may wait for a worker; `None`: unbounded. Past it: 503.
    pub queue: Option<usize>,
    /// Answers 200, or 503 while unhealthy.
    pub health_path: String,
    /// Data requests answer 200 with an error body (health stays 200).
    pub dependency_broken: bool,
}

impl Config {
    /// A backend named `id` that answers at once.
    pub fn new(id: &str) -> Config {
        Config {
            id: id.into(),
            delay: Duration::ZERO,
            workers: None,
            work: Duration::ZERO,
            queue: None,
            health_path: "/health".into(),
            dependency_broken: false,
        }
    }
}

/// A backend's state: what the routes read and change.
#[derive(Debug)]
pub struct Backend {
    config: Config,
    delay_us: AtomicU64,
    healthy: AtomicBool,
    broken: AtomicBool,
    served: AtomicU64,
    health_checks: AtomicU64,
    busy: AtomicU64,
    depth: AtomicU64,
    completed: AtomicU64,
    rejected: AtomicU64,
    pool: Option<Arc<Semaphore>>,
    /// How much longer than its delay each delayed request slept, µs: the host's
    /// scheduling, not the backend's work.
    overslept: std::sync::Mutex<hdrhistogram::Histogram<u64>>,
}

impl Backend {
    /// A backend that is healthy.
    pub fn new(config: Config) -> Arc<Backend> {
        Arc::new(Backend {
            delay_us: AtomicU64::new(config.delay.as_micros() as u64),
            healthy: AtomicBool::new(true),
            broken: AtomicBool::new(config.dependency_broken),
            served: AtomicU64::new(0),
            health_checks: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            depth: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            pool: config.workers.map(|n| Arc::new(Semaphore::new(n))),
            overslept: std::sync::Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                    .expect("bounds are valid"),
            ),
            config,
        })
    }

    /// Its name.
    pub fn id(&self) -> &str {
        &self.config.id
    }

    /// Data requests received (rejected ones included).
    pub fn served(&self) -> u64 {
        self.served.load(Relaxed)
    }

    /// Makes the health path answer 200 (`true`) or 503.
    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Relaxed);
    }

    /// Makes data requests answer 200 with an error body, or normally again.
    pub fn set_dependency_broken(&self, broken: bool) {
        self.broken.store(broken, Relaxed);
    }

    /// Changes the delay added to every data request.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_us.store(delay.as_micros() as u64, Relaxed);
    }

    /// How late its delays ended, once it has slept at all: on an idle host a sleep
    /// ends within a timer tick of its due time, so a late one is the host at work.
    pub fn overslept(&self) -> Option<crate::lab::load::Lag> {
        crate::lab::load::Lag::of(&*self.overslept.lock().ok()?)
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::json!({
            "id": self.config.id,
            "served": self.served.load(Relaxed),
            "inflight": self.busy.load(Relaxed),
            "depth": self.depth.load(Relaxed),
            "completed": self.completed.load(Relaxed),
            "rejected": self.rejected.load(Relaxed),
            "health_checks": self.health_checks.load(Relaxed),
            "healthy": self.healthy.load(Relaxed),
            "dependency_broken": self.broken.load(Relaxed),
            "delay_ms": self.delay_us.load(Relaxed) as f64 / 1000.0,
            "overslept_ms": self.overslept(),
            // How it was started, for whoever drives it from elsewhere.
            "workers": self.config.workers,
            "work_ms": self.config.work.as_secs_f64() * 1000.0,
            "queue": self.config.queue,
            "health_path": self.config.health_path,
        })
    }

    /// Waits for a worker and its work; `false` when the queue is full. The work runs
    /// in its own task, so it completes (and holds its worker) even if the caller
    /// leaves.
    async fn work(self: &Arc<Self>) -> bool {
        let Some(pool) = &self.pool else {
            return true;
        };
        // Taken here, not in the task, so that the queue check and the count it
        // reads change together.
        let permit = pool.clone().try_acquire_owned().ok();
        if permit.is_none() {
            if self
                .config
                .queue
                .is_some_and(|limit| self.depth.load(Relaxed) >= limit as u64)
            {
                self.rejected.fetch_add(1, Relaxed);
                return false;
            }
            self.depth.fetch_add(1, Relaxed);
        }
        let (done, finished) = oneshot::channel();
        let (pool, backend) = (pool.clone(), self.clone());
        tokio::spawn(async move {
            let permit = match permit {
                Some(permit) => permit,
                None => {
                    let permit = pool.acquire_owned().await;
                    backend.depth.fetch_sub(1, Relaxed);
                    permit.expect("the pool's semaphore is never closed")
                }
            };
            backend.busy.fetch_add(1, Relaxed);
            tokio::time::sleep(backend.config.work).await;
            backend.busy.fetch_sub(1, Relaxed);
            backend.completed.fetch_add(1, Relaxed);
            drop(permit);
            let _ = done.send(());
        });
        let _ = finished.await;
        true
    }
}

/// Serves `backend` on `listener` until `shutdown`, which stops accepting and drops
/// every open connection at once, as a killed process would.
pub async fn serve(listener: TcpListener, backend: Arc<Backend>, shutdown: Shutdown) {
    serve_tls(listener, backend, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is given: HTTP/2 (and so gRPC) or HTTP/1.1 as
/// ALPN agrees.
pub async fn serve_tls(
    listener: TcpListener,
    backend: Arc<Backend>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: Shutdown,
) {
    super::serve_https(listener, tls, shutdown, move |req, _| {
        let backend = backend.clone();
        async move { answer(req, &backend).await }
    })
    .await;
}

/// Request bodies larger than this are refused: the lab's requests are small.
const BODY_LIMIT: usize = 1 << 20;

async fn answer(req: Request<Incoming>, backend: &Arc<Backend>) -> Reply {
    let id = backend.config.id.as_str();
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, BODY_LIMIT).collect().await {
        Ok(body) => body.to_bytes(),
        Err(err) => {
            return json(
                StatusCode::BAD_REQUEST,
                id,
                &serde_json::json!({"id": id, "error": format!("could not read the body: {err}")}),
            )
            .map(BodyExt::boxed_unsync);
        }
    };
    if crate::fault::http::grpc::is_call(&parts) {
        return grpc(&parts, &body, backend).await;
    }
    http(&parts, &body, backend)
        .await
        .map(BodyExt::boxed_unsync)
}

/// A plain HTTP request: the routes of the module's doc.
async fn http(
    parts: &hyper::http::request::Parts,
    body: &[u8],
    backend: &Arc<Backend>,
) -> Response<Full<Bytes>> {
    let id = backend.config.id.as_str();
    let path = parts.uri.path();
    match (&parts.method, path) {
        (_, p) if p == backend.config.health_path => {
            backend.health_checks.fetch_add(1, Relaxed);
            let healthy = backend.healthy.load(Relaxed);
            let status = if healthy {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            json(
                status,
                id,
                &serde_json::json!({"id": id, "healthy": healthy}),
            )
        }
        (&Method::GET, "/count") | (&Method::GET, "/reset") => {
            let served = if path == "/reset" {
                backend.served.swap(0, Relaxed)
            } else {
                backend.served.load(Relaxed)
            };
            let delay = backend.delay_us.load(Relaxed) as f64 / 1000.0;
            json(
                StatusCode::OK,
                id,
                &serde_json::json!({"id": id, "served": served, "delay_ms": delay}),
            )
        }
        (&Method::GET, "/stats") => json(StatusCode::OK, id, &backend.stats()),
        (&Method::POST, admin) if admin.starts_with("/admin/") => {
            match change(admin, body, backend) {
                Ok(()) => json(StatusCode::OK, id, &backend.stats()),
                Err(why) => json(
                    StatusCode::BAD_REQUEST,
                    id,
                    &serde_json::json!({"id": id, "error": why}),
                ),
            }
        }
        _ => match backend.data().await {
            Data::QueueFull => json(
                StatusCode::SERVICE_UNAVAILABLE,
                id,
                &serde_json::json!({"id": id, "error": "queue full"}),
            ),
            Data::Broken => json(
                StatusCode::OK,
                id,
                &serde_json::json!({"id": id, "error": "dependency unavailable"}),
            ),
            Data::Done => json(StatusCode::OK, id, &serde_json::json!({"id": id})),
        },
    }
}

/// How a data request went.
enum Data {
    Done,
    /// The worker pool's queue was full.
    QueueFull,
    /// Served, but the dependency is broken.
    Broken,
}

impl Backend {
    /// A data request: counted, delayed, worked, and told whether the dependency
    /// is broken.
    async fn data(self: &Arc<Self>) -> Data {
        self.served.fetch_add(1, Relaxed);
        let delay = Duration::from_micros(self.delay_us.load(Relaxed));
        if !delay.is_zero() {
            let due = tokio::time::Instant::now() + delay;
            tokio::time::sleep_until(due).await;
            let late = tokio::time::Instant::now().saturating_duration_since(due);
            if let Ok(mut h) = self.overslept.lock() {
                h.saturating_record((late.as_micros() as u64).max(1));
            }
        }
        if !self.work().await {
            return Data::QueueFull;
        }
        if self.broken.load(Relaxed) {
            Data::Broken
        } else {
            Data::Done
        }
    }
}

/// The unary gRPC method: answers `ID:` and the request's message.
pub const GRPC_ECHO: &str = "/snag.Backend/Echo";

/// A gRPC call over HTTP/2: the health check (SERVING, or NOT_SERVING while
/// unhealthy, for any service name), [`GRPC_ECHO`] as a data request, and
/// UNIMPLEMENTED for anything else. A broken dependency is UNAVAILABLE, a full
/// queue RESOURCE_EXHAUSTED.
async fn grpc(parts: &hyper::http::request::Parts, body: &[u8], backend: &Arc<Backend>) -> Reply {
    use crate::fault::http::grpc;
    let id = backend.config.id.as_str();
    let message = match body {
        [0, a, b, c, d, rest @ ..]
            if u32::from_be_bytes([*a, *b, *c, *d]) as usize == rest.len() =>
        {
            rest
        }
        _ => {
            return grpc_reply(
                id,
                Bytes::new(),
                grpc::status(13, "a request of one uncompressed message was expected"),
            );
        }
    };
    let answer = match parts.uri.path() {
        grpc::HEALTH_CHECK => {
            backend.health_checks.fetch_add(1, Relaxed);
            // HealthCheckResponse { status = 1 }: SERVING 1, NOT_SERVING 2.
            let status = if backend.healthy.load(Relaxed) { 1 } else { 2 };
            return grpc_reply(id, grpc::frame(&[0x08, status]), grpc::status(0, ""));
        }
        GRPC_ECHO => backend.data().await,
        other => {
            return grpc_reply(
                id,
                Bytes::new(),
                grpc::status(12, &format!("{other}: not a method of snag backend {id}")),
            );
        }
    };
    match answer {
        Data::QueueFull => grpc_reply(id, Bytes::new(), grpc::status(8, "queue full")),
        Data::Broken => grpc_reply(id, Bytes::new(), grpc::status(14, "dependency unavailable")),
        Data::Done => {
            let mut reply = format!("{id}:").into_bytes();
            reply.extend_from_slice(message);
            grpc_reply(id, grpc::frame(&reply), grpc::status(0, ""))
        }
    }
}

/// What the backend answers with: a whole body, and trailers for gRPC.
pub type Reply =
    Response<http_body_util::combinators::UnsyncBoxBody<Bytes, std::convert::Infallible>>;

/// A gRPC answer from backend `id`: the message (if any), then the status in
/// trailers.
fn grpc_reply(id: &str, message: Bytes, status: hyper::HeaderMap) -> Reply {
    let mut named = hyper::HeaderMap::new();
    if let Ok(value) = hyper::header::HeaderValue::from_str(id) {
        named.insert("x-instance", value);
    }
    let head = crate::fault::http::grpc::head(Bytes::new(), named);
    let trailers = std::future::ready(Some(Ok(status)));
    head.map(|_| Full::new(message).with_trailers(trailers).boxed_unsync())
}

/// `POST /admin/…`: what changed, or why not.
fn change(path: &str, body: &[u8], backend: &Backend) -> Result<(), String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Health {
        healthy: bool,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Dependency {
        broken: bool,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Delay {
        ms: f64,
    }
    let bad = |e: serde_json::Error| format!("{path}: {e}");
    match path {
        "/admin/health" => {
            let h: Health = serde_json::from_slice(body).map_err(bad)?;
            backend.set_healthy(h.healthy);
        }
        "/admin/dependency" => {
            let d: Dependency = serde_json::from_slice(body).map_err(bad)?;
            backend.set_dependency_broken(d.broken);
        }
        "/admin/delay" => {
            let d: Delay = serde_json::from_slice(body).map_err(bad)?;
            if !(0.0..=3_600_000.0).contains(&d.ms) {
                return Err(format!("{path}: ms must be between 0 and 3600000"));
            }
            backend.set_delay(Duration::from_secs_f64(d.ms / 1000.0));
        }
        _ => {
            return Err(format!(
                "{path}: no such admin route (health, dependency, delay)"
            ));
        }
    }
    Ok(())
}

/// A JSON answer that names the instance.
fn json(status: StatusCode, id: &str, body: &serde_json::Value) -> Response<Full<Bytes>> {
    super::json(status, ("x-instance", id), body)
}

/// Echoes every byte back on each accepted connection until `shutdown`; a client's
/// FIN is answered with FIN once everything before it was echoed.
pub async fn echo(listener: TcpListener, shutdown: Shutdown) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((mut stream, _)) = accepted else {
            continue;
        };
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut buf = vec![0; 16 * 1024];
            loop {
                let n = tokio::select! {
                    _ = shutdown.wait() => return,
                    n = stream.read(&mut buf) => match n {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    },
                };
                if stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            let _ = stream.shutdown().await;
        });
    }
}
