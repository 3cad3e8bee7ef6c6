//! What the built-in balancer is told: its backends, strategy, hash key, checks,
//! passive marking, slow start, retries and timeouts.

use std::{net::SocketAddr, str::FromStr, time::Duration};

use hyper::header::HeaderName;

use super::select::Strategy;

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
    /// Ask by gRPC's health protocol instead (`grpc.health.v1.Health/Check` over
    /// HTTP/2, TLS when the backends speak h2): healthy is `SERVING`; `path` and
    /// `expect_body` are not used.
    pub grpc: bool,
}

/// What the balancer speaks to its backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendProtocol {
    /// HTTP/1.1 in clear, pooled keep-alive connections.
    #[default]
    H1,
    /// HTTP/2 in clear (prior knowledge), streams on few connections.
    H2c,
    /// HTTP/2 over TLS, agreed by ALPN.
    H2,
}

impl FromStr for BackendProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<BackendProtocol, String> {
        match s {
            "h1" => Ok(BackendProtocol::H1),
            "h2c" => Ok(BackendProtocol::H2c),
            "h2" => Ok(BackendProtocol::H2),
            _ => Err(format!("{s:?}: expected h1, h2c or h2")),
        }
    }
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
    /// What it speaks to the backends.
    pub protocol: BackendProtocol,
    /// `h2`: trust backends' certificates signed by this CA (PEM); default: the
    /// system's roots.
    pub backend_ca: Option<std::path::PathBuf>,
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
            protocol: BackendProtocol::H1,
            backend_ca: None,
        }
    }
}
