//! What a driver file's templates are filled from: the case's balancer
//! configuration, in plain fields (documented in `balancers/README.md`).

use std::{net::SocketAddr, path::Path};

use serde::Serialize;

use crate::lab::balancer::{self, BackendProtocol, HashKey, select::Strategy};

/// An address, whole and in parts.
#[derive(Debug, Clone, Serialize)]
pub struct Addr {
    /// `127.0.0.1:8080`, `[::1]:8080`.
    pub addr: String,
    /// `127.0.0.1`, `::1`.
    pub host: String,
    /// `8080`.
    pub port: u16,
}

impl From<SocketAddr> for Addr {
    fn from(a: SocketAddr) -> Addr {
        Addr {
            addr: a.to_string(),
            host: a.ip().to_string(),
            port: a.port(),
        }
    }
}

/// One backend.
#[derive(Debug, Clone, Serialize)]
pub struct Backend {
    /// Its name (`x-backend`).
    pub id: String,
    /// Where requests go: `addr`, `host`, `port`.
    #[serde(flatten)]
    pub at: Addr,
    /// Its weight (≥ 1).
    pub weight: u32,
    /// Where health checks go (its probe listener; `at` when it has none).
    pub check: Addr,
    /// Taken out of rotation by a drain.
    pub draining: bool,
}

/// The hash key of `hash` and `consistent`.
#[derive(Debug, Clone, Serialize)]
pub struct Hash {
    /// `header`, `cookie` or `source`.
    pub kind: &'static str,
    /// The header's or cookie's name; empty for `source`.
    pub name: String,
}

/// Active health checks.
#[derive(Debug, Clone, Serialize)]
pub struct Health {
    /// Between checks, ms.
    pub interval_ms: u64,
    /// A check's time limit, ms.
    pub timeout_ms: u64,
    /// Passes in a row that bring a backend back.
    pub rise: u32,
    /// Failures in a row that take it out.
    pub fall: u32,
    /// The path asked; empty: a TCP connect only.
    pub path: String,
    /// Besides a 200, the body must contain this.
    pub expect_body: Option<String>,
    /// Checks by gRPC's health protocol (grpc.health.v1.Health/Check), not `path`.
    pub grpc: bool,
}

/// Everything a template may name.
#[derive(Debug, Clone, Serialize)]
pub struct Context {
    /// The run's directory: the configuration, sockets and logs.
    pub dir: String,
    /// The configuration file, in `dir`.
    pub config_file: String,
    /// Where clients connect.
    pub listen: Addr,
    /// A free loopback port for the product's own API.
    pub admin: Addr,
    /// rr, wrr, least, ip-hash, hash, consistent, random2.
    pub strategy: &'static str,
    /// What `hash` and `consistent` hash.
    pub hash: Hash,
    /// Active checks, or none.
    pub health: Option<Health>,
    /// Failures that take a backend out passively; 0: off.
    pub max_fails: u32,
    /// The window of `max_fails` and how long it stays out, ms.
    pub fail_timeout_ms: u64,
    /// The same in whole seconds, rounded up (at least 1).
    pub fail_timeout_s: u64,
    /// Weight ramp of a backend coming back, ms; 0: off.
    pub slow_start_ms: u64,
    /// Other backends tried after a failure.
    pub retries: u32,
    /// Time limit for a backend's response head, ms.
    pub timeout_ms: u64,
    /// h1, h2c or h2 to the backends.
    pub protocol: &'static str,
    /// The CA that signed the backends' certificates (PEM path), for h2.
    pub backend_ca: Option<String>,
    /// The pool, in order.
    pub backends: Vec<Backend>,
    /// In `[drain]` and `[maintenance]`: the backend acted on.
    pub backend: Option<Backend>,
    /// In `[drain]`: whether it is taken out (true) or put back.
    pub draining: bool,
    /// In `applied_when`: the body `applied_url` answered.
    pub answer: String,
    /// In `[reload]`: the configuration just written, for a product that takes it
    /// over its API.
    pub config: String,
}

fn ms(d: std::time::Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

/// A strategy's name on the command line and in templates.
pub fn strategy_name(s: Strategy) -> &'static str {
    match s {
        Strategy::Rr => "rr",
        Strategy::Wrr => "wrr",
        Strategy::Least => "least",
        Strategy::IpHash => "ip-hash",
        Strategy::Hash => "hash",
        Strategy::Consistent => "consistent",
        Strategy::Random2 => "random2",
    }
}

/// A protocol's name.
pub fn protocol_name(p: BackendProtocol) -> &'static str {
    match p {
        BackendProtocol::H1 => "h1",
        BackendProtocol::H2c => "h2c",
        BackendProtocol::H2 => "h2",
    }
}

impl Context {
    /// The context of `config`, listening on `listen`, with the product's API on
    /// `admin`, its files in `dir`, and the `draining` backends marked.
    pub fn new(
        config: &balancer::Config,
        listen: SocketAddr,
        admin: SocketAddr,
        dir: &Path,
        config_file: &str,
        draining: &[String],
    ) -> Context {
        let hash = match &config.hash_key {
            HashKey::Header(name) => Hash {
                kind: "header",
                name: name.as_str().into(),
            },
            HashKey::Cookie(name) => Hash {
                kind: "cookie",
                name: name.clone(),
            },
            HashKey::Source => Hash {
                kind: "source",
                name: String::new(),
            },
        };
        Context {
            dir: dir.display().to_string(),
            config_file: dir.join(config_file).display().to_string(),
            listen: listen.into(),
            admin: admin.into(),
            strategy: strategy_name(config.strategy),
            hash,
            health: config.health.as_ref().map(|h| Health {
                interval_ms: ms(h.interval),
                timeout_ms: ms(h.timeout),
                rise: h.rise,
                fall: h.fall,
                path: h.path.clone(),
                expect_body: h.expect_body.clone(),
                grpc: h.grpc,
            }),
            max_fails: config.max_fails,
            fail_timeout_ms: ms(config.fail_timeout),
            fail_timeout_s: config.fail_timeout.as_secs_f64().ceil().max(1.0) as u64,
            slow_start_ms: if config.slow_start.is_zero() {
                0
            } else {
                ms(config.slow_start)
            },
            retries: config.retries,
            timeout_ms: ms(config.timeout),
            protocol: protocol_name(config.protocol),
            backend_ca: config.backend_ca.as_ref().map(|p| p.display().to_string()),
            backends: config
                .backends
                .iter()
                .map(|b| Backend {
                    id: b.id.clone(),
                    at: b.addr.into(),
                    weight: b.weight,
                    check: b.check.unwrap_or(b.addr).into(),
                    draining: draining.contains(&b.id),
                })
                .collect(),
            backend: None,
            draining: false,
            answer: String::new(),
            config: String::new(),
        }
    }

    /// A context for checking templates: every option on, or every option off.
    pub fn sample(on: bool) -> Context {
        let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let mut config = balancer::Config::new(
            vec![
                balancer::BackendSpec {
                    id: "a".into(),
                    addr: addr(9001),
                    weight: 1,
                    check: Some(addr(9101)),
                },
                balancer::BackendSpec {
                    id: "b".into(),
                    addr: addr(9002),
                    weight: 2,
                    check: None,
                },
            ],
            1,
        );
        if on {
            config.strategy = Strategy::Consistent;
            config.health = Some(balancer::HealthCheck {
                interval: std::time::Duration::from_millis(200),
                timeout: std::time::Duration::from_millis(100),
                rise: 2,
                fall: 3,
                path: "/health".into(),
                expect_body: Some("ok".into()),
                grpc: true,
            });
            config.max_fails = 3;
            config.slow_start = std::time::Duration::from_secs(5);
            config.retries = 1;
            config.protocol = BackendProtocol::H2;
            config.backend_ca = Some("/tmp/ca.pem".into());
        }
        let drained = if on { vec!["b".to_string()] } else { vec![] };
        Context::new(
            &config,
            addr(8080),
            addr(8081),
            Path::new("/tmp/snag-sample"),
            "product.conf",
            &drained,
        )
    }
}

/// The backend a sample `[drain]` acts on.
pub fn backend_sample(on: bool) -> Backend {
    let c = Context::sample(on);
    c.backends[if on { 1 } else { 0 }].clone()
}
