//! `snag balancer`: a reference HTTP balancer with the strategies the seeds compare
//! ([`select`]), active health checks with rise/fall thresholds, passive failure
//! marking (nginx's `max_fails`/`fail_timeout`), slow start, retries, drain, an
//! `x-backend` header on every response and `/lb-stats` with every state change.
//!
//! Clients speak HTTP/1.1 or HTTP/2 (prior knowledge); backends are reached over
//! pooled keep-alive HTTP/1.1. Health checks open a new connection each, as HAProxy's
//! and nginx's do, to the backend's `check` address when it has one: that is how a
//! case puts the probe path through its own interposer.

pub mod select;

use std::{
    collections::VecDeque,
    net::SocketAddr,
    pin::Pin,
    str::FromStr,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, combinators::BoxBody};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Body, Frame, Incoming, SizeHint},
    header::{self, HeaderName, HeaderValue},
};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};
use serde::Serialize;
use tokio::{net::TcpListener, time::Instant};
use tracing::info;

use self::select::{Candidate, Selector, Strategy};
use crate::shutdown::Shutdown;

/// One backend: `id=ADDR[,weight=N][,check=ADDR]`.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendSpec {
    /// Its name, in `x-backend`.
    pub id: String,
    /// Where requests go.
    pub addr: SocketAddr,
    /// Relative share for `wrr`, `least` and `consistent` (≥ 1).
    pub weight: u32,
    /// Where health checks go, when not to `addr`.
    pub check: Option<SocketAddr>,
}

impl FromStr for BackendSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<BackendSpec, String> {
        let mut parts = s.split(',');
        let first = parts.next().unwrap_or_default();
        let Some((id, addr)) = first.split_once('=') else {
            return Err(format!(
                "{s:?}: expected id=ADDR:PORT[,weight=N][,check=ADDR:PORT]"
            ));
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!("{s:?}: the id must be printable and not empty"));
        }
        let parse_addr = |what: &str, a: &str| {
            a.parse::<SocketAddr>()
                .map_err(|e| format!("{s:?}: {what} {a:?}: {e}"))
        };
        let mut spec = BackendSpec {
            id: id.into(),
            addr: parse_addr("address", addr)?,
            weight: 1,
            check: None,
        };
        for part in parts {
            match part.split_once('=') {
                Some(("weight", w)) => {
                    spec.weight = w
                        .parse()
                        .ok()
                        .filter(|w| (1..=1000).contains(w))
                        .ok_or_else(|| format!("{s:?}: weight {w:?} is not 1..=1000"))?;
                }
                Some(("check", a)) => spec.check = Some(parse_addr("check address", a)?),
                _ => {
                    return Err(format!(
                        "{s:?}: unknown part {part:?} (weight=N, check=ADDR)"
                    ));
                }
            }
        }
        Ok(spec)
    }
}

/// What the hashing strategies hash.
#[derive(Debug, Clone, PartialEq)]
pub enum HashKey {
    /// A request header's value.
    Header(HeaderName),
    /// A cookie's value.
    Cookie(String),
    /// The client's IP address.
    Source,
}

impl FromStr for HashKey {
    type Err = String;
    fn from_str(s: &str) -> Result<HashKey, String> {
        match s.split_once(':') {
            _ if s == "source" => Ok(HashKey::Source),
            Some(("header", name)) => HeaderName::from_str(name)
                .map(HashKey::Header)
                .map_err(|e| format!("{s:?}: {e}")),
            Some(("cookie", name)) if !name.is_empty() => Ok(HashKey::Cookie(name.into())),
            _ => Err(format!(
                "{s:?}: expected header:NAME, cookie:NAME or source"
            )),
        }
    }
}

/// Active health checks.
#[derive(Debug, Clone)]
pub struct HealthCheck {
    /// Between checks of one backend.
    pub interval: Duration,
    /// A check that has no full answer by then failed.
    pub timeout: Duration,
    /// Passes in a row that bring a down backend back.
    pub rise: u32,
    /// Failures in a row that take an up backend out.
    pub fall: u32,
    /// What is asked; empty: a transport check, a TCP connect and nothing more.
    pub path: String,
    /// Besides status 200, the body must contain this.
    pub expect_body: Option<String>,
}

/// How the balancer behaves.
#[derive(Debug, Clone)]
pub struct Config {
    /// The pool, in order.
    pub backends: Vec<BackendSpec>,
    /// How a backend is chosen.
    pub strategy: Strategy,
    /// What `ip-hash`, `hash` and `consistent` hash (`ip-hash` always hashes the source).
    pub hash_key: HashKey,
    /// Active checks; `None`: off.
    pub health: Option<HealthCheck>,
    /// Transport failures within `fail_timeout` that take a backend out for
    /// `fail_timeout`; 0: passive marking off.
    pub max_fails: u32,
    /// See `max_fails`.
    pub fail_timeout: Duration,
    /// A backend coming back ramps its weight from nothing over this long.
    pub slow_start: Duration,
    /// Other backends tried after a failure: always after a connect failure, after
    /// other failures only for idempotent methods.
    pub retries: u32,
    /// A backend that has not answered with a response head by then failed (504).
    pub timeout: Duration,
    /// Seeds `random2`.
    pub seed: u64,
}

impl Config {
    /// Round robin over `backends` without checks, marking, slow start or retries;
    /// 10 s for a response head; `hash_key` the `x-session` header.
    pub fn new(backends: Vec<BackendSpec>, seed: u64) -> Config {
        Config {
            backends,
            strategy: Strategy::Rr,
            hash_key: HashKey::Header(HeaderName::from_static("x-session")),
            health: None,
            max_fails: 0,
            fail_timeout: Duration::from_secs(10),
            slow_start: Duration::ZERO,
            retries: 0,
            timeout: Duration::from_secs(10),
            seed,
        }
    }
}

/// A backend's state as the balancer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Takes new requests.
    Up,
    /// Failed its checks or was marked failed.
    Down,
    /// Finishes what it has, takes nothing new.
    Draining,
}

/// One change of a backend's state.
#[derive(Debug, Clone, Serialize)]
pub struct Transition {
    /// Milliseconds since the balancer started.
    pub at_ms: f64,
    /// Before.
    pub from: State,
    /// After.
    pub to: State,
    /// What caused it.
    pub why: String,
}

#[derive(Debug)]
struct Member {
    healthy: bool,
    passes: u32,
    fails_in_row: u32,
    failures: VecDeque<Instant>,
    down_until: Option<Instant>,
    draining: bool,
    state: State,
    up_since: Instant,
    inflight: u64,
    requests: u64,
    errors: u64,
    checks: u64,
    last_check: Option<String>,
    transitions: Vec<Transition>,
}

#[derive(Debug)]
struct Pool {
    selector: Selector,
    members: Vec<Member>,
    requests: u64,
    no_backend: u64,
    retries: u64,
}

/// A running balancer's state.
#[derive(Debug)]
pub struct Balancer {
    config: Config,
    started: Instant,
    pool: Mutex<Pool>,
    client: Client<HttpConnector, Full<Bytes>>,
}

type Reply = Response<BoxBody<Bytes, hyper::Error>>;

impl Balancer {
    /// A balancer with every backend up.
    pub fn new(config: Config) -> Arc<Balancer> {
        let started = Instant::now();
        let names: Vec<(&str, u32)> = config
            .backends
            .iter()
            .map(|b| (b.id.as_str(), b.weight))
            .collect();
        let rng = crate::seed::rng(config.seed, &[b"balancer"]);
        let selector = Selector::new(config.strategy, &names, rng);
        let members = config
            .backends
            .iter()
            .map(|_| Member {
                healthy: true,
                passes: 0,
                fails_in_row: 0,
                failures: VecDeque::new(),
                down_until: None,
                draining: false,
                state: State::Up,
                up_since: started.checked_sub(config.slow_start).unwrap_or(started),
                inflight: 0,
                requests: 0,
                errors: 0,
                checks: 0,
                last_check: None,
                transitions: Vec::new(),
            })
            .collect();
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .build(connector);
        Arc::new(Balancer {
            started,
            pool: Mutex::new(Pool {
                selector,
                members,
                requests: 0,
                no_backend: 0,
                retries: 0,
            }),
            client,
            config,
        })
    }

    /// How it was configured.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().expect("no code panics holding the pool")
    }

    /// The pool, with passive marks that ran out lifted.
    fn lock_fresh(&self, now: Instant) -> std::sync::MutexGuard<'_, Pool> {
        let mut pool = self.lock();
        for index in 0..pool.members.len() {
            self.refresh(&mut pool, index, now, "fail_timeout over");
        }
        pool
    }

    /// Recomputes backend `index`'s state; a change is a transition caused by `why`.
    fn refresh(&self, pool: &mut Pool, index: usize, now: Instant, why: &str) {
        let m = &mut pool.members[index];
        if m.down_until.is_some_and(|until| until <= now) {
            m.down_until = None;
        }
        let state = if m.draining {
            State::Draining
        } else if !m.healthy || m.down_until.is_some() {
            State::Down
        } else {
            State::Up
        };
        if state != m.state {
            if state == State::Up && m.state == State::Down {
                m.up_since = now;
            }
            let at_ms = (now - self.started).as_secs_f64() * 1000.0;
            info!(backend = %self.config.backends[index].id, from = ?m.state, to = ?state, why, "backend state");
            m.transitions.push(Transition {
                at_ms,
                from: m.state,
                to: state,
                why: why.into(),
            });
            m.state = state;
        }
    }

    /// Marks backend `id` draining (`true`) or back in rotation; `false` if no such id.
    pub fn set_draining(&self, id: &str, draining: bool) -> bool {
        let Some(index) = self.config.backends.iter().position(|b| b.id == id) else {
            return false;
        };
        let mut pool = self.lock();
        pool.members[index].draining = draining;
        let why = if draining { "drain" } else { "undrain" };
        self.refresh(&mut pool, index, Instant::now(), why);
        true
    }

    /// `/lb-stats`: the strategy and every backend's state, counts and transitions.
    pub fn stats(&self) -> serde_json::Value {
        let now = Instant::now();
        let pool = self.lock_fresh(now);
        let backends: Vec<_> = self
            .config
            .backends
            .iter()
            .zip(&pool.members)
            .map(|(spec, m)| {
                serde_json::json!({
                    "id": spec.id,
                    "addr": spec.addr.to_string(),
                    "check": spec.check.unwrap_or(spec.addr).to_string(),
                    "weight": spec.weight,
                    "effective_weight": self.weight(spec, m, now) as f64 / 1000.0,
                    "state": m.state,
                    "healthy": m.healthy,
                    "draining": m.draining,
                    "inflight": m.inflight,
                    "requests": m.requests,
                    "errors": m.errors,
                    "checks": m.checks,
                    "last_check": m.last_check,
                    "transitions": m.transitions,
                })
            })
            .collect();
        serde_json::json!({
            "strategy": self.config.strategy.to_string(),
            "uptime_ms": (now - self.started).as_secs_f64() * 1000.0,
            "requests": pool.requests,
            "no_backend": pool.no_backend,
            "retries": pool.retries,
            "health_checks": self.config.health.as_ref().map(|h| serde_json::json!({
                "interval_ms": h.interval.as_secs_f64() * 1000.0,
                "timeout_ms": h.timeout.as_secs_f64() * 1000.0,
                "rise": h.rise,
                "fall": h.fall,
                "path": h.path,
                "expect_body": h.expect_body,
            })),
            "backends": backends,
        })
    }

    /// Weight in thousandths, scaled down during slow start (never to nothing).
    fn weight(&self, spec: &BackendSpec, m: &Member, now: Instant) -> u64 {
        let full = u64::from(spec.weight) * 1000;
        let slow = self.config.slow_start;
        let since = now.saturating_duration_since(m.up_since);
        if slow.is_zero() || since >= slow {
            full
        } else {
            ((full as f64 * since.as_secs_f64() / slow.as_secs_f64()) as u64).max(1)
        }
    }

    /// Chooses a backend not in `tried` and counts the request on it.
    fn choose(&self, key: Option<&[u8]>, tried: &[bool]) -> Option<usize> {
        let now = Instant::now();
        let mut pool = self.lock_fresh(now);
        let candidates: Vec<Candidate> = self
            .config
            .backends
            .iter()
            .zip(&pool.members)
            .zip(tried)
            .map(|((spec, m), tried)| Candidate {
                usable: m.state == State::Up && !tried,
                weight: self.weight(spec, m, now),
                inflight: m.inflight,
            })
            .collect();
        let chosen = pool.selector.pick(&candidates, key);
        if let Some(index) = chosen {
            let m = &mut pool.members[index];
            m.inflight += 1;
            m.requests += 1;
        }
        chosen
    }

    /// A request to backend `index` is over.
    fn done(&self, index: usize) {
        self.lock().members[index].inflight -= 1;
    }

    /// A request to backend `index` failed in transport; passive marking.
    fn failed(&self, index: usize, why: &str) {
        let now = Instant::now();
        let mut pool = self.lock();
        let (max_fails, window) = (self.config.max_fails, self.config.fail_timeout);
        let m = &mut pool.members[index];
        m.errors += 1;
        if max_fails == 0 {
            return;
        }
        m.failures.push_back(now);
        while m
            .failures
            .front()
            .is_some_and(|&t| now.saturating_duration_since(t) > window)
        {
            m.failures.pop_front();
        }
        if m.failures.len() >= max_fails as usize {
            m.failures.clear();
            m.down_until = Some(now + window);
            self.refresh(
                &mut pool,
                index,
                now,
                &format!("{max_fails} failures: {why}"),
            );
        }
    }

    /// One health check's result for backend `index`.
    fn checked(&self, index: usize, result: Result<(), String>, rules: &HealthCheck) {
        let now = Instant::now();
        let mut pool = self.lock();
        let m = &mut pool.members[index];
        m.checks += 1;
        let why = match &result {
            Ok(()) => {
                m.passes += 1;
                m.fails_in_row = 0;
                if !m.healthy && m.passes >= rules.rise {
                    m.healthy = true;
                }
                format!("{} checks passed", m.passes)
            }
            Err(err) => {
                m.fails_in_row += 1;
                m.passes = 0;
                if m.healthy && m.fails_in_row >= rules.fall {
                    m.healthy = false;
                }
                format!("{} checks failed, last: {err}", m.fails_in_row)
            }
        };
        m.last_check = Some(match result {
            Ok(()) => "ok".into(),
            Err(err) => err,
        });
        self.refresh(&mut pool, index, now, &why);
    }
}

/// Serves clients on `listener` and checks backends until `shutdown`.
pub async fn serve(listener: TcpListener, balancer: Arc<Balancer>, shutdown: Shutdown) {
    if let Some(rules) = balancer.config.health.clone() {
        for index in 0..balancer.config.backends.len() {
            let (balancer, shutdown, rules) = (balancer.clone(), shutdown.clone(), rules.clone());
            tokio::spawn(async move {
                let spec = &balancer.config.backends[index];
                let target = spec.check.unwrap_or(spec.addr);
                // The first check comes at a seeded point within the first interval,
                // as HAProxy spreads its checks: a failure then meets the checker at
                // any phase, not always just after a check.
                let mut rng =
                    crate::seed::rng(balancer.config.seed, &[b"check", spec.id.as_bytes()]);
                let phase = rules
                    .interval
                    .mul_f64(rand::RngExt::random::<f64>(&mut rng));
                let mut ticks = tokio::time::interval_at(Instant::now() + phase, rules.interval);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = shutdown.wait() => return,
                        _ = ticks.tick() => {}
                    }
                    let result = check(target, &rules).await;
                    balancer.checked(index, result, &rules);
                }
            });
        }
    }
    super::serve_http(listener, shutdown, move |req, peer| {
        let balancer = balancer.clone();
        async move { handle(req, peer, &balancer).await }
    })
    .await;
}

/// One health check: a new connection, `GET path`, status 200 and the body text.
async fn check(target: SocketAddr, rules: &HealthCheck) -> Result<(), String> {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(target)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        if rules.path.is_empty() {
            return Ok(());
        }
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        let request = Request::get(rules.path.as_str())
            .header(header::HOST, target.to_string())
            .header(header::CONNECTION, "close")
            .header(header::USER_AGENT, "snag-balancer-check")
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("request: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), 64 * 1024)
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(format!("status {}", status.as_u16()));
        }
        if let Some(text) = &rules.expect_body
            && !String::from_utf8_lossy(&body).contains(text.as_str())
        {
            return Err(format!("body lacks {text:?}"));
        }
        Ok(())
    };
    tokio::time::timeout(rules.timeout, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("timeout after {:?}", rules.timeout)))
}

/// Client bodies larger than this are refused: the balancer keeps a body to retry it.
const BODY_LIMIT: usize = 16 << 20;

async fn handle(req: Request<Incoming>, peer: SocketAddr, balancer: &Arc<Balancer>) -> Reply {
    let path = req.uri().path();
    if path == "/lb-stats" {
        return reply(StatusCode::OK, "none", &balancer.stats());
    }
    if let Some(rest) = path.strip_prefix("/lb-admin/backends/") {
        let draining = match *req.method() {
            Method::POST => true,
            Method::DELETE => false,
            _ => {
                let body =
                    serde_json::json!({"error": "POST or DELETE /lb-admin/backends/ID/drain"});
                return reply(StatusCode::METHOD_NOT_ALLOWED, "none", &body);
            }
        };
        let id = rest.strip_suffix("/drain").unwrap_or(rest);
        return if balancer.set_draining(id, draining) {
            reply(StatusCode::OK, id, &balancer.stats())
        } else {
            let body = serde_json::json!({"error": format!("no backend {id:?}")});
            reply(StatusCode::NOT_FOUND, "none", &body)
        };
    }
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, BODY_LIMIT).collect().await {
        Ok(body) => body.to_bytes(),
        Err(err) => {
            let body = serde_json::json!({"error": format!("could not read the body: {err}")});
            return reply(StatusCode::BAD_REQUEST, "none", &body);
        }
    };
    let key: Option<Vec<u8>> = match (balancer.config.strategy, &balancer.config.hash_key) {
        (Strategy::IpHash, _) | (_, HashKey::Source) => Some(peer.ip().to_string().into_bytes()),
        (_, HashKey::Header(name)) => parts.headers.get(name).map(|v| v.as_bytes().to_vec()),
        (_, HashKey::Cookie(name)) => cookie(&parts.headers, name),
    };
    let key = key.filter(|_| balancer.config.strategy.keyed());
    let idempotent = matches!(
        parts.method,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS
    );
    let n = balancer.config.backends.len();
    let mut tried = vec![false; n];
    let mut last: Option<(usize, StatusCode, String)> = None;
    balancer.lock().requests += 1;
    for attempt in 0..=balancer.config.retries {
        let Some(index) = balancer.choose(key.as_deref(), &tried) else {
            break;
        };
        if attempt > 0 {
            balancer.lock().retries += 1;
        }
        tried[index] = true;
        let spec = &balancer.config.backends[index];
        let mut upstream = Request::builder().method(parts.method.clone()).uri(format!(
            "http://{}{}",
            spec.addr,
            parts.uri.path_and_query().map_or("/", |p| p.as_str())
        ));
        for (name, value) in &parts.headers {
            if !HOP_BY_HOP.contains(name) {
                upstream = upstream.header(name, value);
            }
        }
        let upstream = upstream
            .header("x-forwarded-for", peer.ip().to_string())
            .body(Full::new(body.clone()))
            .expect("method, uri and headers come from a parsed request");
        let sent = tokio::time::timeout(balancer.config.timeout, balancer.client.request(upstream));
        match sent.await {
            Ok(Ok(response)) => {
                let (mut head, incoming) = response.into_parts();
                for name in HOP_BY_HOP {
                    head.headers.remove(name);
                }
                if let Ok(value) = HeaderValue::from_str(&spec.id) {
                    head.headers.insert("x-backend", value);
                }
                let body = Tracked {
                    body: incoming,
                    _guard: Guard {
                        balancer: balancer.clone(),
                        index,
                    },
                };
                return Response::from_parts(head, body.boxed());
            }
            Ok(Err(err)) => {
                balancer.done(index);
                let connect = err.is_connect();
                let why = format!("{err:#}");
                balancer.failed(index, &why);
                last = Some((index, StatusCode::BAD_GATEWAY, why));
                if !(connect || idempotent) {
                    break;
                }
            }
            Err(_) => {
                balancer.done(index);
                let why = format!("no response within {:?}", balancer.config.timeout);
                balancer.failed(index, &why);
                last = Some((index, StatusCode::GATEWAY_TIMEOUT, why));
                if !idempotent {
                    break;
                }
            }
        }
    }
    match last {
        Some((index, status, why)) => {
            let id = &balancer.config.backends[index].id;
            reply(
                status,
                id,
                &serde_json::json!({"error": why, "backend": id}),
            )
        }
        None => {
            balancer.lock().no_backend += 1;
            reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "none",
                &serde_json::json!({"error": "no backend available"}),
            )
        }
    }
}

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

fn cookie(headers: &hyper::HeaderMap, name: &str) -> Option<Vec<u8>> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_bytes().to_vec())
}

fn reply(status: StatusCode, backend: &str, body: &serde_json::Value) -> Reply {
    super::json(status, ("x-backend", backend), body)
        .map(|b| b.map_err(|never| match never {}).boxed())
}

/// Counts a request in flight on its backend until its response body is done.
struct Guard {
    balancer: Arc<Balancer>,
    index: usize,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.balancer.done(self.index);
    }
}

/// A backend's response body, streamed to the client, with its [`Guard`].
struct Tracked {
    body: Incoming,
    _guard: Guard,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Guard({})", self.index)
    }
}
