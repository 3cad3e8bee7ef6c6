//! `snag balancer`: a reference HTTP balancer with the strategies the seeds compare
//! ([`select`]), active health checks with rise/fall thresholds, passive failure
//! marking (nginx's `max_fails`/`fail_timeout`), slow start, retries, drain, an
//! `x-backend` header on every response and `/lb-stats` with every state change.
//!
//! Clients speak HTTP/1.1 or HTTP/2 (prior knowledge); backends are reached over
//! pooled keep-alive HTTP/1.1, or HTTP/2 in clear or over TLS ([`client`]), where a
//! GOAWAY or REFUSED_STREAM is handled as HTTP/2 means it: new streams go on a new
//! connection, a stream the backend declared unprocessed is sent again (whatever its
//! method), and none of it counts as the backend failing. Health checks open a new connection each, as HAProxy's
//! and nginx's do, to the backend's `check` address when it has one: that is how a
//! case puts the probe path through its own interposer.

mod client;
mod config;
mod health;
mod pool;
pub mod select;
mod serving;

use std::sync::{Arc, Mutex};

use tokio::{net::TcpListener, time::Instant};

use self::pool::Pool;
pub use self::{
    config::{BackendProtocol, BackendSpec, Config, HashKey, HealthCheck},
    pool::{State, Transition},
};
use crate::shutdown::Shutdown;

/// A running balancer's state.
#[derive(Debug)]
pub struct Balancer {
    config: Config,
    started: Instant,
    pool: Mutex<Pool>,
    client: client::Backends,
    /// Dials one backend on a new connection, as its gRPC health checks do.
    connector: client::Connector,
}

impl Balancer {
    /// A balancer with every backend up; `Err` says why its TLS to the backends
    /// cannot be set up.
    pub fn new(config: Config) -> Result<Arc<Balancer>, String> {
        let started = Instant::now();
        let connector = client::connector(&config)?;
        let client = client::backends(&config, connector.clone());
        Ok(Arc::new(Balancer {
            started,
            pool: Mutex::new(Pool::new(&config, started)),
            client,
            connector,
            config,
        }))
    }

    /// How it was configured.
    pub fn config(&self) -> &Config {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().expect("no code panics holding the pool")
    }

    /// Marks backend `id` draining (`true`) or back in rotation; `false` if no such id.
    pub fn set_draining(&self, id: &str, draining: bool) -> bool {
        let Some(index) = self.config.backends.iter().position(|b| b.id == id) else {
            return false;
        };
        self.lock().set_draining(index, draining, Instant::now());
        true
    }

    /// `/lb-stats`: the strategy and every backend's state, counts and transitions.
    pub fn stats(&self) -> serde_json::Value {
        let now = Instant::now();
        let mut pool = self.lock();
        pool.lift_expired(now);
        let backends: Vec<_> = self
            .config
            .backends
            .iter()
            .zip(&pool.members)
            .enumerate()
            .map(|(index, (spec, m))| {
                serde_json::json!({
                    "id": spec.id,
                    "addr": spec.addr.to_string(),
                    "check": spec.check.unwrap_or(spec.addr).to_string(),
                    "weight": spec.weight,
                    "effective_weight": pool.weight(index, now) as f64 / 1000.0,
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
            "protocol": match self.config.protocol {
                BackendProtocol::H1 => "h1",
                BackendProtocol::H2c => "h2c",
                BackendProtocol::H2 => "h2",
            },
            "unprocessed_replays": pool.replays,
            "stale_connection_replays": pool.stale_replays,
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

    /// Chooses a backend not in `tried` and counts the request on it.
    fn choose(&self, key: Option<&[u8]>, tried: &[bool]) -> Option<usize> {
        self.lock().choose(key, tried, Instant::now())
    }

    /// A request to backend `index` is over.
    fn done(&self, index: usize) {
        self.lock().done(index);
    }

    /// A request to backend `index` failed in transport; passive marking.
    fn failed(&self, index: usize, why: &str) {
        self.lock().failed(index, why, Instant::now());
    }
}

/// Serves clients on `listener` and checks backends until `shutdown`.
pub async fn serve(listener: TcpListener, balancer: Arc<Balancer>, shutdown: Shutdown) {
    if let Some(rules) = &balancer.config.health {
        for index in 0..balancer.config.backends.len() {
            health::spawn(balancer.clone(), index, rules.clone(), shutdown.clone());
        }
    }
    super::serve_http(listener, shutdown, move |req, peer| {
        let balancer = balancer.clone();
        async move { serving::handle(req, peer, &balancer).await }
    })
    .await;
}
