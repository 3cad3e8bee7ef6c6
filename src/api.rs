//! The control API: Toxiproxy's v2 HTTP API, wire-compatible so its client libraries
//! work unchanged, with snag's own fault types (`loss`, `syn_drop`, `down`) offered as
//! extra toxic types through the same endpoints.
//!
//! Calls are serialised by one async lock: a call that restarts a proxy waits for its
//! connections to close before the next call sees the state.

pub mod client;
pub mod registry;
mod toxic;

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{
    Method, Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::Value;
use tokio::{net::TcpListener, sync::Mutex};
use tracing::{debug, info};

use self::registry::{ProxyInput, Registry};
use crate::{proxy::RunContext, shutdown::Shutdown};

/// The version `/version` reports: Toxiproxy's API level, then snag's own. Clients
/// parse it as semver (Ruby picks PATCH for ≥ 2.6.0); the suffix is allowed, as in
/// distribution builds' `2.8.0-debdeps`.
pub const VERSION: &str = concat!("2.12.0-snag.", env!("CARGO_PKG_VERSION"));

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 1 << 20;

/// A call that failed; each variant knows its status. Rendered as
/// `{"error": "...", "status": N}` as Toxiproxy renders it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body did not decode.
    #[error("bad request body: {0}")]
    BadBody(String),
    /// A required field was missing.
    #[error("missing required field: {0}")]
    Missing(&'static str),
    /// A required field was missing in the Nth proxy of a populate.
    #[error("missing required field: {0} at proxy {1}")]
    MissingAt(&'static str, usize),
    /// `stream` was neither upstream nor downstream.
    #[error("stream was invalid, can be either upstream or downstream")]
    BadStream,
    /// Unknown toxic type.
    #[error("invalid toxic type")]
    BadType,
    /// Attributes snag cannot run.
    #[error("{0}")]
    Invalid(String),
    /// No such proxy.
    #[error("proxy not found")]
    ProxyNotFound,
    /// No such toxic.
    #[error("toxic not found")]
    ToxicNotFound,
    /// Name taken.
    #[error("proxy already exists")]
    ProxyExists,
    /// Name taken, in either direction.
    #[error("toxic already exists")]
    ToxicExists,
    /// The listener could not be opened.
    #[error("{0}")]
    Listen(String),
    /// Body over [`BODY_LIMIT`].
    #[error("request body larger than {BODY_LIMIT} bytes")]
    TooLarge,
    /// A token is set and the request did not carry it.
    #[error("unauthorized")]
    Unauthorized,
    /// The body did not arrive within the time allowed.
    #[error("request body not received within {0:?}")]
    SlowBody(Duration),
    /// No such file in the files directory.
    #[error("file not found")]
    FileNotFound,
    /// No load run of that name is on (not begun, or over).
    #[error("load run not found")]
    RunNotFound,
}

impl Error {
    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Error::ProxyNotFound
            | Error::ToxicNotFound
            | Error::FileNotFound
            | Error::RunNotFound => StatusCode::NOT_FOUND,
            Error::ProxyExists | Error::ToxicExists => StatusCode::CONFLICT,
            Error::Listen(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Error::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Unauthorized => StatusCode::UNAUTHORIZED,
            Error::SlowBody(_) => StatusCode::REQUEST_TIMEOUT,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// The API's state.
pub struct Api {
    registry: Mutex<Registry>,
    token: Option<String>,
    requests: AtomicU64,
    metrics: Metrics,
    header_timeout: Duration,
    /// `Some` when `POST /load` runs load shards (they stop with the API's
    /// shutdown) and `GET /load/RUN` tells how far one has got.
    generator: Option<crate::lab::load::remote::Generator>,
}

/// Who may call the API, what it serves and where its files go.
#[derive(Debug, Clone)]
pub struct Settings {
    /// With a token, every request must carry `Authorization: Bearer TOKEN`.
    pub token: Option<String>,
    /// Which `/metrics` families are served.
    pub metrics: Metrics,
    /// The directory that capture and event files named through the API are confined
    /// to; `None`: the API takes no file names.
    pub files: Option<PathBuf>,
    /// How long a client may take to send a request's headers, and then its body:
    /// a slow client (slowloris) is cut off, not waited on.
    pub header_timeout: Duration,
    /// Whether `POST /load` runs load shards sent by a case elsewhere.
    pub generator: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            token: None,
            metrics: Metrics::default(),
            files: None,
            header_timeout: Duration::from_secs(10),
            generator: false,
        }
    }
}

/// Which `/metrics` families are served; with none, `/metrics` is 404 as in Toxiproxy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Metrics {
    /// Bytes received and sent per proxy and direction (`-proxy-metrics`).
    pub proxy: bool,
    /// The process's memory and descriptors (`-runtime-metrics`).
    pub runtime: bool,
}

impl Api {
    /// An API with no proxies yet, whose proxies run in `context` and stop on
    /// `shutdown`.
    pub fn new(context: RunContext, settings: Settings, shutdown: Shutdown) -> Arc<Api> {
        Arc::new(Api {
            generator: settings
                .generator
                .then(|| crate::lab::load::remote::Generator::new(shutdown.clone())),
            registry: Mutex::new(Registry::new(context, settings.files, shutdown)),
            token: settings.token,
            requests: AtomicU64::new(0),
            metrics: settings.metrics,
            header_timeout: settings.header_timeout,
        })
    }

    /// Creates or replaces proxies as `POST /populate` does.
    pub async fn populate(&self, inputs: Vec<ProxyInput>) -> Result<(), Error> {
        self.registry
            .lock()
            .await
            .populate(inputs)
            .await
            .map(drop)
            .map_err(|(e, _)| e)
    }

    /// Creates the proxies of a fault file with their faults, and plays their
    /// timelines from now.
    pub async fn load(
        &self,
        scenario: &crate::fault::file::Scenario,
        shutdown: &Shutdown,
    ) -> Result<(), Error> {
        let mut registry = self.registry.lock().await;
        let t0 = tokio::time::Instant::now();
        for spec in &scenario.proxies {
            registry.create_config(spec.config.clone()).await?;
            let proxy = registry.proxy(&spec.config.name)?;
            tokio::spawn(crate::proxy::play(
                proxy,
                spec.timeline.clone(),
                t0,
                shutdown.clone(),
            ));
        }
        Ok(())
    }

    /// Once the shutdown has fired, waits for every proxy to stop (each gives its
    /// open connections the shutdown grace period).
    pub async fn stop(&self) {
        self.registry.lock().await.stop_all().await;
    }

    /// Every proxy, as `GET /proxies` shows them.
    pub async fn proxies(&self) -> Value {
        serde_json::to_value(self.registry.lock().await.list()).expect("views serialise")
    }
}

/// Serves the API on `listener` until `shutdown`; then stops every proxy.
pub async fn serve(listener: TcpListener, api: Arc<Api>, shutdown: Shutdown) -> anyhow::Result<()> {
    let what = format!("control API {}", listener.local_addr()?);
    info!(addr = %listener.local_addr()?, "control api listening");
    let mut errors = crate::proxy::socket::AcceptErrors::default();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.wait() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => {
                    errors.accepted(&what);
                    a
                }
                Err(err) => {
                    let wait = errors.failed(&what, &err);
                    tokio::select! {
                        _ = shutdown.wait() => break,
                        _ = tokio::time::sleep(wait) => continue,
                    }
                }
            },
        };
        let api = api.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let timeout = api.header_timeout;
            let service = service_fn(move |req| {
                let api = api.clone();
                async move { Ok::<_, Infallible>(handle(&api, req, peer).await) }
            });
            let conn = http1::Builder::new()
                .header_read_timeout(timeout)
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                done = conn => if let Err(err) = done { debug!(%err, "api connection ended") },
                _ = shutdown.wait() => {}
            }
        });
    }
    api.stop().await;
    Ok(())
}

/// An answer of the API.
pub type Reply = Response<Full<Bytes>>;

async fn handle(api: &Api, req: Request<Incoming>, peer: SocketAddr) -> Reply {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // Browsers are refused, as Toxiproxy refuses them, so no web page can drive the API.
    if agent.starts_with("Mozilla/") {
        return plain(StatusCode::FORBIDDEN, "User agent not allowed\n");
    }
    if let Some(token) = &api.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !constant_time_eq(given.as_bytes(), format!("Bearer {token}").as_bytes()) {
            return error(&Error::Unauthorized);
        }
    }
    let body = match tokio::time::timeout(api.header_timeout, read_body(req)).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return with_id(api, error(&e)),
        Err(_) => return with_id(api, error(&Error::SlowBody(api.header_timeout))),
    };
    debug!(%method, %path, %peer, "api call");
    call(api, &method, &path, &body).await
}

/// Answers one call whose body has been read (and whose caller was let in): what
/// every connection does after its checks, and what the fuzz target drives.
pub async fn call(api: &Api, method: &Method, path: &str, body: &Bytes) -> Reply {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if segments == ["metrics"] && (api.metrics.proxy || api.metrics.runtime) {
        let text = api.registry.lock().await.metrics(api.metrics);
        let mut reply = Response::new(Full::new(Bytes::from(text)));
        reply.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return with_id(api, reply);
    }
    if let (["load", ..], Some(generator)) = (segments.as_slice(), &api.generator) {
        // Not under the registry's lock: a run takes its whole length.
        let reply = match (segments.as_slice(), method) {
            (["load"], &Method::POST) => load_shard(body, generator).await,
            (["load", run], &Method::GET) => match generator.progress(run) {
                Some(progress) => json(StatusCode::OK, &progress),
                None => error(&Error::RunNotFound),
            },
            (["load"] | ["load", _], _) => empty(StatusCode::METHOD_NOT_ALLOWED),
            _ => plain(StatusCode::NOT_FOUND, "404 page not found\n"),
        };
        return with_id(api, reply);
    }
    let allowed: &[Method] = match segments.as_slice() {
        ["version"] => &[Method::GET],
        ["reset"] | ["populate"] => &[Method::POST],
        ["proxies"] => &[Method::GET, Method::POST],
        ["proxies", _] | ["proxies", _, "toxics", _] => {
            &[Method::GET, Method::POST, Method::PATCH, Method::DELETE]
        }
        ["proxies", _, "drain"] => &[Method::POST, Method::DELETE],
        ["proxies", _, "stats"] | ["proxies", _, "config"] => &[Method::GET],
        ["proxies", _, "stats", "reset"] => &[Method::POST],
        ["proxies", _, "toxics"] => &[Method::GET, Method::POST],
        ["files", _] => &[Method::GET],
        _ => return plain(StatusCode::NOT_FOUND, "404 page not found\n"),
    };
    if !allowed.contains(method) {
        let mut reply = Response::new(Full::new(Bytes::new()));
        *reply.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        return reply;
    }
    let reply = route(api, method, &segments, body).await;
    with_id(api, reply)
}

async fn route(api: &Api, method: &Method, segments: &[&str], body: &Bytes) -> Reply {
    let mut registry = api.registry.lock().await;
    let result = match (method, segments) {
        (_, ["version"]) => {
            let mut reply = Response::new(Full::new(Bytes::from(format!(
                "{{\"version\": \"{VERSION}\"}}\n"
            ))));
            reply.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json;charset=utf-8"),
            );
            return reply;
        }
        (_, ["reset"]) => registry
            .reset()
            .await
            .map(|()| empty(StatusCode::NO_CONTENT)),
        (_, ["populate"]) => {
            let inputs: Vec<ProxyInput> = match decode(body) {
                Ok(i) => i,
                Err(e) => return populate_error(&e, None),
            };
            let empty_input = inputs.is_empty();
            return match registry.populate(inputs).await {
                Ok(_) if empty_input => {
                    json(StatusCode::CREATED, &serde_json::json!({ "proxies": null }))
                }
                Ok(done) => json(StatusCode::CREATED, &serde_json::json!({ "proxies": done })),
                Err((e, done)) => populate_error(&e, Some(done).filter(|d| !d.is_empty())),
            };
        }
        (&Method::GET, ["proxies"]) => Ok(json(StatusCode::OK, &registry.list())),
        (_, ["proxies"]) => match decode::<ProxyInput>(body) {
            Ok(input) => registry
                .create(input)
                .await
                .map(|p| json(StatusCode::CREATED, &p)),
            Err(e) => Err(e),
        },
        (&Method::GET, ["proxies", name]) => registry.get(name).map(|p| json(StatusCode::OK, &p)),
        (&Method::DELETE, ["proxies", name]) => registry
            .delete(name)
            .await
            .map(|()| empty(StatusCode::NO_CONTENT)),
        (_, ["proxies", name]) => match registry.get(name).and_then(|_| decode::<ProxyInput>(body))
        {
            Ok(input) => registry
                .update(name, input)
                .await
                .map(|p| json(StatusCode::OK, &p)),
            Err(e) => Err(e),
        },
        (&Method::POST, ["proxies", name, "drain"]) => registry.proxy(name).and_then(|proxy| {
            let drain: crate::fault::drain::Drain = decode(body)?;
            drain.validate().map_err(Error::Invalid)?;
            proxy.drain(drain);
            Ok(json(StatusCode::OK, &serde_json::json!({ "drain": drain })))
        }),
        (_, ["proxies", name, "drain"]) => registry.proxy(name).map(|proxy| {
            proxy.undrain();
            empty(StatusCode::NO_CONTENT)
        }),
        (_, ["proxies", name, "config"]) => registry
            .proxy(name)
            .map(|proxy| json(StatusCode::OK, &proxy.live_config())),
        (_, ["proxies", name, "stats"]) => registry
            .proxy(name)
            .map(|proxy| json(StatusCode::OK, &proxy.counters().snapshot())),
        // The window since the last reset, and a new one from now.
        (_, ["proxies", name, "stats", "reset"]) => registry
            .proxy(name)
            .map(|proxy| json(StatusCode::OK, &proxy.counters().reset())),
        (&Method::GET, ["proxies", name, "toxics"]) => {
            registry.toxics(name).map(|t| json(StatusCode::OK, &t))
        }
        (_, ["proxies", name, "toxics"]) => registry
            .get(name)
            .and_then(|_| decode::<Value>(body))
            .and_then(|v| registry.add_toxic(name, &v))
            .map(|t| json(StatusCode::OK, &t)),
        (&Method::GET, ["proxies", name, "toxics", toxic]) => registry
            .toxic(name, toxic)
            .map(|t| json(StatusCode::OK, &t)),
        (&Method::DELETE, ["proxies", name, "toxics", toxic]) => registry
            .delete_toxic(name, toxic)
            .map(|()| empty(StatusCode::NO_CONTENT)),
        (_, ["proxies", name, "toxics", toxic]) => registry
            .toxic(name, toxic)
            .and_then(|_| decode::<Value>(body))
            .and_then(|v| registry.update_toxic(name, toxic, &v))
            .map(|t| json(StatusCode::OK, &t)),
        // A proxy's own capture or event log, for whoever cannot read this disk.
        (_, ["files", name]) => registry.file(name).map(|bytes| {
            let mut reply = Response::new(Full::new(Bytes::from(bytes)));
            reply.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            reply
        }),
        _ => unreachable!("handle matched the path already"),
    };
    result.unwrap_or_else(|e| error(&e))
}

async fn read_body(req: Request<Incoming>) -> Result<Bytes, Error> {
    match Limited::new(req.into_body(), BODY_LIMIT).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Error::TooLarge),
        Err(e) => Err(Error::BadBody(e.to_string())),
    }
}

/// Decodes a body as Go's encoding/json would accept it: unknown fields ignored,
/// `null` as absent, an empty body an error ("EOF").
fn decode<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Error> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::BadBody("EOF".into()));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = T::deserialize(&mut de).map_err(|e| Error::BadBody(e.to_string()))?;
    Ok(value)
}

/// `POST /load`: runs the shard asked for from its start instant and answers its
/// result, as `snag load --shard --start-at --result` would write it.
async fn load_shard(body: &Bytes, generator: &crate::lab::load::remote::Generator) -> Reply {
    use crate::lab::load::remote;
    let request: remote::ShardRequest = match decode(body) {
        Ok(r) => r,
        Err(e) => return error(&e),
    };
    match generator.serve(request).await {
        Ok(result) => json(StatusCode::OK, &result),
        Err(why) => error(&Error::Invalid(why)),
    }
}

fn with_id(api: &Api, mut reply: Reply) -> Reply {
    // Toxiproxy stamps every routed answer with a 20-character id (an xid).
    let n = api.requests.fetch_add(1, Ordering::Relaxed);
    let alphabet = b"0123456789abcdefghijklmnopqrstuv";
    let id: String = (0..20)
        .rev()
        .map(|i| alphabet[((n >> ((i % 12) * 5)) & 31) as usize] as char)
        .collect();
    if let Ok(v) = HeaderValue::from_str(&id) {
        reply.headers_mut().insert("x-toxiproxy-request-id", v);
    }
    reply
}

fn json(status: StatusCode, body: &impl Serialize) -> Reply {
    let bytes = serde_json::to_vec(body).expect("views serialise");
    let mut reply = Response::new(Full::new(Bytes::from(bytes)));
    *reply.status_mut() = status;
    reply.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    reply
}

fn empty(status: StatusCode) -> Reply {
    let mut reply = Response::new(Full::new(Bytes::new()));
    *reply.status_mut() = status;
    reply
}

/// A text/plain answer, as Go's http.Error and gorilla/mux write them.
fn plain(status: StatusCode, text: impl Into<Bytes>) -> Reply {
    let mut reply = Response::new(Full::new(text.into()));
    *reply.status_mut() = status;
    let headers = reply.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    reply
}

/// An error as Go's http.Error writes it: the JSON as text/plain, with a newline.
fn error(e: &Error) -> Reply {
    let body = serde_json::json!({ "error": e.to_string(), "status": e.status().as_u16() });
    plain(e.status(), format!("{body}\n"))
}

/// `/populate`'s errors are real JSON, carry the proxies done so far, and no newline.
fn populate_error(e: &Error, done: Option<Vec<registry::ProxyView>>) -> Reply {
    let body = serde_json::json!({ "error": e.to_string(), "status": e.status().as_u16(), "proxies": done });
    json(e.status(), &body)
}

/// Whether `given` equals `secret`, in a time that depends on `given`'s length only:
/// neither the secret's bytes nor its length show in how long a wrong guess takes.
fn constant_time_eq(given: &[u8], secret: &[u8]) -> bool {
    if secret.is_empty() {
        return given.is_empty();
    }
    let mut diff = given.len() ^ secret.len();
    for (i, g) in given.iter().enumerate() {
        diff |= usize::from(g ^ secret[i % secret.len()]);
    }
    diff == 0
}
