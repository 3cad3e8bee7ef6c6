//! Real balancers under test, each described by a driver file (`balancers/NAME.toml`,
//! format in `balancers/README.md`): snag fills the product's configuration from the
//! same [`balancer::Config`] the built-in balancer takes, starts it as a child process
//! in the foreground, waits until it listens, watches its own view of each backend,
//! drains through its own mechanisms, and stops it by PID.
//!
//! What a product lacks is refused with [`Unsupported`] and the file's reason, never
//! approximated.

mod act;
mod context;
pub mod figures;
pub mod file;
mod rule;
mod run;
mod spec;
mod watch;

use std::{fmt, sync::Arc};

use tokio::time::Instant;

pub use self::{
    act::http,
    context::{Context, strategy_name},
    file::Driver,
    run::{External, ProductRun},
};
use super::balancer::{self, BackendProtocol, HashKey, select::Strategy};

/// The balancer under test.
#[derive(Debug, Clone)]
pub enum Product {
    /// snag's own reference balancer, in process.
    Builtin,
    /// A product started from its driver file.
    File(Arc<Driver>),
    /// A balancer snag does not start: it is told where the parts are, and waits
    /// for it to answer on its URL.
    External(Arc<Outside>),
}

/// A balancer someone else runs (a cloud load balancer, a Kubernetes ingress).
pub struct Outside {
    /// Where clients reach it.
    pub url: String,
    /// How long a case waits for it to route to the parts it printed.
    pub wait: std::time::Duration,
    /// How the case tells the person running it where to point the balancer.
    pub announce: Arc<dyn Fn(&str) + Send + Sync>,
}

impl fmt::Debug for Outside {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outside")
            .field("url", &self.url)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl Outside {
    /// What it was configured with is its operator's business; what snag would have
    /// to do to it, snag cannot.
    pub fn require(feature: Feature) -> Result<(), Unsupported> {
        let what = match feature {
            Feature::Drain => "draining a backend on it",
            Feature::View => "reading its view of each backend",
            Feature::RetryCount => "reading its retry count",
            Feature::Restart => "killing and restarting it",
            _ => return Ok(()),
        };
        Err(Unsupported {
            product: "external".into(),
            why: format!("{what} (snag did not start it: whoever runs it does that)"),
        })
    }

    /// Where the load goes: the URL's host and port, resolved.
    pub async fn addr(&self) -> anyhow::Result<std::net::SocketAddr> {
        let uri: hyper::Uri = self
            .url
            .parse()
            .map_err(|e| anyhow::anyhow!("--external-url {:?}: {e}", self.url))?;
        anyhow::ensure!(
            uri.scheme_str() == Some("http"),
            "--external-url {:?}: the cases' load speaks http://",
            self.url
        );
        let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
        let port = uri.port_u16().unwrap_or(80);
        tokio::net::lookup_host((host, port))
            .await?
            .next()
            .ok_or_else(|| anyhow::anyhow!("--external-url {:?}: no address", self.url))
    }
}

impl Product {
    /// Its name in reports.
    pub fn name(&self) -> &str {
        match self {
            Product::Builtin => "builtin",
            Product::File(d) => &d.name,
            Product::External(_) => "external",
        }
    }

    /// Whether it is the product named `name` (`haproxy`, `nginx` …).
    pub fn is(&self, name: &str) -> bool {
        self.name() == name
    }

    /// Refuses `feature` when the product lacks it, with the file's reason.
    pub fn require(&self, feature: Feature) -> Result<(), Unsupported> {
        match self {
            Product::Builtin => Ok(()),
            // What it was configured with is its operator's business; what snag
            // would have to do to it, snag cannot.
            Product::External(_) => Outside::require(feature),
            Product::File(d) => match d.lacks(feature) {
                Some(why) => Err(Unsupported {
                    product: d.name.clone(),
                    why,
                }),
                None => Ok(()),
            },
        }
    }

    /// Whether the product has `feature`.
    pub fn has(&self, feature: Feature) -> bool {
        self.require(feature).is_ok()
    }

    /// Refuses `config` when it asks for something the product lacks.
    pub fn check(&self, config: &balancer::Config) -> Result<(), Unsupported> {
        Feature::needed(config)
            .into_iter()
            .try_for_each(|f| self.require(f))
    }
}

impl std::str::FromStr for Product {
    type Err = String;
    fn from_str(s: &str) -> Result<Product, String> {
        if s == "builtin" {
            return Ok(Product::Builtin);
        }
        if s == "external" {
            // The command sets its URL and wait from its own flags.
            return Ok(Product::External(Arc::new(Outside {
                url: "http://127.0.0.1:8080/".into(),
                wait: std::time::Duration::from_secs(120),
                announce: Arc::new(|_| {}),
            })));
        }
        if let Some(driver) = Driver::bundled(s) {
            return Ok(Product::File(Arc::new(driver.map_err(|e| e.to_string())?)));
        }
        if s.contains('/') || s.ends_with(".toml") {
            let driver = Driver::load(std::path::Path::new(s)).map_err(|e| e.to_string())?;
            return Ok(Product::File(Arc::new(driver)));
        }
        let names: Vec<&str> = file::BUNDLED.iter().map(|(n, _)| *n).collect();
        Err(format!(
            "unknown balancer {s:?}; one of builtin, {}, external, or a driver file's path (./mine.toml)",
            names.join(", ")
        ))
    }
}

impl fmt::Display for Product {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a case may ask of a balancer; a driver file's `[unsupported]` table names
/// the ones its product lacks, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Active health checks of any kind.
    ActiveChecks,
    /// Active checks that ask a path over HTTP.
    HttpChecks,
    /// Active checks that only connect.
    TcpChecks,
    /// Active checks by gRPC's health protocol.
    GrpcChecks,
    /// gRPC checks over TLS, when the backends speak h2.
    GrpcChecksTls,
    /// Rise and fall counts other than 1.
    RiseFall,
    /// Checks that look for a string in the body.
    CheckBody,
    /// Taking a backend out after failures of real requests.
    PassiveMarking,
    /// Ramping a returning backend's weight.
    SlowStart,
    /// Trying another backend after a failure.
    Retries,
    /// A count of the requests it retried, which a case reads.
    RetryCount,
    /// Draining one backend on a running product.
    Drain,
    /// Its own view of each backend, read while it runs.
    View,
    /// Weights other than 1.
    Weights,
    /// Answers name the backend that served them in `x-backend`.
    BackendHeader,
    /// Killing the product's process and starting it again.
    Restart,
    /// HTTP/2 in clear from clients (prior knowledge) beside HTTP/1.1 on one port.
    ClientH2c,
    /// The strategies.
    StrategyRr,
    /// See [`Feature::StrategyRr`].
    StrategyWrr,
    /// See [`Feature::StrategyRr`].
    StrategyLeast,
    /// See [`Feature::StrategyRr`].
    StrategyIpHash,
    /// See [`Feature::StrategyRr`].
    StrategyHash,
    /// See [`Feature::StrategyRr`].
    StrategyConsistent,
    /// See [`Feature::StrategyRr`].
    StrategyRandom2,
    /// Hashing a request header's value.
    HashHeader,
    /// Hashing a cookie's value.
    HashCookie,
    /// Hashing the client's address.
    HashSource,
    /// HTTP/2 in clear to the backends.
    H2c,
    /// HTTP/2 over TLS to the backends.
    H2,
}

impl Feature {
    /// Every feature, in the order the README lists them.
    pub const ALL: [Feature; 29] = [
        Feature::ActiveChecks,
        Feature::HttpChecks,
        Feature::TcpChecks,
        Feature::GrpcChecks,
        Feature::GrpcChecksTls,
        Feature::RiseFall,
        Feature::CheckBody,
        Feature::PassiveMarking,
        Feature::SlowStart,
        Feature::Retries,
        Feature::RetryCount,
        Feature::Drain,
        Feature::View,
        Feature::Weights,
        Feature::BackendHeader,
        Feature::Restart,
        Feature::ClientH2c,
        Feature::StrategyRr,
        Feature::StrategyWrr,
        Feature::StrategyLeast,
        Feature::StrategyIpHash,
        Feature::StrategyHash,
        Feature::StrategyConsistent,
        Feature::StrategyRandom2,
        Feature::HashHeader,
        Feature::HashCookie,
        Feature::HashSource,
        Feature::H2c,
        Feature::H2,
    ];

    /// Its name in a driver file.
    pub fn name(self) -> &'static str {
        match self {
            Feature::ActiveChecks => "active_checks",
            Feature::HttpChecks => "http_checks",
            Feature::TcpChecks => "tcp_checks",
            Feature::GrpcChecks => "grpc_checks",
            Feature::GrpcChecksTls => "grpc_checks_tls",
            Feature::RiseFall => "rise_fall",
            Feature::CheckBody => "check_body",
            Feature::PassiveMarking => "passive_marking",
            Feature::SlowStart => "slow_start",
            Feature::Retries => "retries",
            Feature::RetryCount => "retry_count",
            Feature::Drain => "drain",
            Feature::View => "view",
            Feature::Weights => "weights",
            Feature::BackendHeader => "backend_header",
            Feature::Restart => "restart",
            Feature::ClientH2c => "client_h2c",
            Feature::StrategyRr => "strategy_rr",
            Feature::StrategyWrr => "strategy_wrr",
            Feature::StrategyLeast => "strategy_least",
            Feature::StrategyIpHash => "strategy_ip_hash",
            Feature::StrategyHash => "strategy_hash",
            Feature::StrategyConsistent => "strategy_consistent",
            Feature::StrategyRandom2 => "strategy_random2",
            Feature::HashHeader => "hash_header",
            Feature::HashCookie => "hash_cookie",
            Feature::HashSource => "hash_source",
            Feature::H2c => "h2c",
            Feature::H2 => "h2",
        }
    }

    /// The feature named `name` in a driver file.
    pub fn from_name(name: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.name() == name)
    }

    /// What running `config` asks of a product.
    pub fn needed(config: &balancer::Config) -> Vec<Feature> {
        let mut out = Vec::new();
        if let Some(h) = &config.health {
            out.push(Feature::ActiveChecks);
            out.push(if h.grpc {
                Feature::GrpcChecks
            } else if h.path.is_empty() {
                Feature::TcpChecks
            } else {
                Feature::HttpChecks
            });
            if h.grpc && config.protocol == BackendProtocol::H2 {
                out.push(Feature::GrpcChecksTls);
            }
            if h.rise > 1 || h.fall > 1 {
                out.push(Feature::RiseFall);
            }
            if h.expect_body.is_some() {
                out.push(Feature::CheckBody);
            }
        }
        if config.max_fails > 0 {
            out.push(Feature::PassiveMarking);
        }
        if !config.slow_start.is_zero() {
            out.push(Feature::SlowStart);
        }
        if config.retries > 0 {
            out.push(Feature::Retries);
        }
        if config.backends.iter().any(|b| b.weight != 1) {
            out.push(Feature::Weights);
        }
        out.push(match config.strategy {
            Strategy::Rr => Feature::StrategyRr,
            Strategy::Wrr => Feature::StrategyWrr,
            Strategy::Least => Feature::StrategyLeast,
            Strategy::IpHash => Feature::StrategyIpHash,
            Strategy::Hash => Feature::StrategyHash,
            Strategy::Consistent => Feature::StrategyConsistent,
            Strategy::Random2 => Feature::StrategyRandom2,
        });
        if matches!(config.strategy, Strategy::Hash | Strategy::Consistent) {
            out.push(match config.hash_key {
                HashKey::Header(_) => Feature::HashHeader,
                HashKey::Cookie(_) => Feature::HashCookie,
                HashKey::Source => Feature::HashSource,
            });
        }
        match config.protocol {
            BackendProtocol::H1 => {}
            BackendProtocol::H2c => out.push(Feature::H2c),
            BackendProtocol::H2 => out.push(Feature::H2),
        }
        out
    }
}

/// A configuration the product cannot express; the case reports it as not supported.
#[derive(Debug, thiserror::Error)]
#[error("{product} cannot run this case: {why}")]
pub struct Unsupported {
    /// Which product.
    pub product: String,
    /// What it lacks.
    pub why: String,
}

/// A backend's state change as the product reported it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When snag saw it.
    pub at: Instant,
    /// The backend.
    pub id: String,
    /// Its status before, in the product's words (`UP`, `DOWN`, `DRAIN` …).
    pub from: String,
    /// After.
    pub to: String,
}
