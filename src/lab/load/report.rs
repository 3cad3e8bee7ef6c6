//! What a load run reports: errors by kind, per-second rows, latency, send lag,
//! shares, sessions and the port pool. Plain data, serialised as `snag load --json`
//! and into the cases' JSON.

use std::{collections::BTreeMap, fmt, io, net::SocketAddr};

use serde::{Deserialize, Serialize};

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// No full answer within the deadline (or a connect timeout).
    Timeout,
    /// ECONNREFUSED.
    Refused,
    /// ECONNRESET or EPIPE.
    Reset,
    /// The connection closed before a response.
    Closed,
    /// A response with a status outside 2xx.
    Status(u16),
    /// A gRPC call answered with this non-zero `grpc-status`.
    Grpc(u8),
    /// The body broke off.
    Body,
    /// A 2xx whose body lacks the expected text.
    BadBody,
    /// EADDRNOTAVAIL: the generator's ephemeral ports are exhausted.
    Ports,
    /// EMFILE/ENFILE: the generator is out of descriptors.
    Descriptors,
    /// The open loop had too many requests in flight and did not send this one.
    Overload,
    /// The TLS handshake failed: a certificate not trusted or not for the name,
    /// no common ALPN protocol (HTTP/2 asked, HTTP/1.1 offered), not TLS at all.
    Tls,
    /// Anything else.
    Other,
}

impl Kind {
    /// Every kind that carries no code.
    pub const WITHOUT_CODE: [Kind; 11] = [
        Kind::Timeout,
        Kind::Refused,
        Kind::Reset,
        Kind::Closed,
        Kind::Body,
        Kind::BadBody,
        Kind::Ports,
        Kind::Descriptors,
        Kind::Overload,
        Kind::Tls,
        Kind::Other,
    ];

    /// Whether the generator failed, not the service.
    pub fn generator(self) -> bool {
        matches!(self, Kind::Ports | Kind::Descriptors | Kind::Overload)
    }

    /// Classifies a socket error.
    pub fn of_io(err: &io::Error) -> Kind {
        match err.raw_os_error() {
            Some(libc_errno::ECONNREFUSED) => Kind::Refused,
            Some(libc_errno::EADDRNOTAVAIL) => Kind::Ports,
            Some(libc_errno::ECONNRESET | libc_errno::EPIPE) => Kind::Reset,
            Some(libc_errno::ETIMEDOUT) => Kind::Timeout,
            Some(libc_errno::EMFILE | libc_errno::ENFILE) => Kind::Descriptors,
            _ => match err.kind() {
                io::ErrorKind::ConnectionRefused => Kind::Refused,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe => Kind::Reset,
                io::ErrorKind::TimedOut => Kind::Timeout,
                io::ErrorKind::UnexpectedEof => Kind::Closed,
                io::ErrorKind::AddrNotAvailable => Kind::Ports,
                _ => Kind::Other,
            },
        }
    }

    /// Classifies an HTTP client error by the socket error under it, if any.
    pub fn of_hyper(err: &hyper::Error) -> Kind {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<io::Error>() {
                return Kind::of_io(io);
            }
            source = e.source();
        }
        if err.is_incomplete_message() || err.is_closed() || err.is_canceled() {
            Kind::Closed
        } else if err.is_timeout() {
            Kind::Timeout
        } else {
            Kind::Other
        }
    }
}

/// errno values, named as in C (nix's `Errno` as plain numbers for matching).
mod libc_errno {
    use nix::errno::Errno;
    pub const ECONNREFUSED: i32 = Errno::ECONNREFUSED as i32;
    pub const EADDRNOTAVAIL: i32 = Errno::EADDRNOTAVAIL as i32;
    pub const ECONNRESET: i32 = Errno::ECONNRESET as i32;
    pub const EPIPE: i32 = Errno::EPIPE as i32;
    pub const ETIMEDOUT: i32 = Errno::ETIMEDOUT as i32;
    pub const EMFILE: i32 = Errno::EMFILE as i32;
    pub const ENFILE: i32 = Errno::ENFILE as i32;
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Timeout => f.write_str("timeout"),
            Kind::Refused => f.write_str("refused"),
            Kind::Reset => f.write_str("reset"),
            Kind::Closed => f.write_str("closed"),
            Kind::Status(code) => write!(f, "http {code}"),
            Kind::Grpc(code) => write!(f, "grpc {code}"),
            Kind::Body => f.write_str("body"),
            Kind::BadBody => f.write_str("bad body"),
            Kind::Ports => f.write_str("ports exhausted (generator)"),
            Kind::Descriptors => f.write_str("descriptors exhausted (generator)"),
            Kind::Overload => f.write_str("too many in flight (generator)"),
            Kind::Tls => f.write_str("tls"),
            Kind::Other => f.write_str("other"),
        }
    }
}

impl std::str::FromStr for Kind {
    type Err = String;

    /// What `Display` wrote.
    fn from_str(s: &str) -> Result<Kind, String> {
        let bad = |_| format!("error kind {s:?}: bad code");
        if let Some(c) = s.strip_prefix("http ") {
            return c.parse().map(Kind::Status).map_err(bad);
        }
        if let Some(c) = s.strip_prefix("grpc ") {
            return c.parse().map(Kind::Grpc).map_err(bad);
        }
        Kind::WITHOUT_CODE
            .into_iter()
            .find(|k| k.to_string() == s)
            .ok_or_else(|| format!("error kind {s:?}: not one snag counts"))
    }
}

impl Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One second of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Seconds since the start.
    pub second: usize,
    /// Open loop: requests offered in this second.
    pub offered: Option<f64>,
    /// Attempts sent in this second, retries included.
    pub sent: u64,
    /// Of those, retries.
    pub retries: u64,
    /// Successes completed in this second.
    pub ok: u64,
    /// Failures completed in this second, by kind.
    pub errors: BTreeMap<Kind, u64>,
    /// Mean latency of this second's successes, ms from the intended send time.
    pub mean_ms: Option<f64>,
    /// Their 99th percentile, ms.
    pub p99_ms: Option<f64>,
    /// Queue depth read from the stats URL (-1: unreadable).
    pub depth: Option<i64>,
    /// Sockets towards the target in TIME_WAIT, from any process.
    pub time_wait: Option<usize>,
}

/// How late sends left against their intended instants, ms.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct Lag {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// The latest.
    pub max: f64,
}

impl Lag {
    /// A generator this late at the 99th percentile was not keeping its schedule:
    /// its tick is 1 ms, so on an idle machine sends leave within about that.
    pub const LATE_P99_MS: f64 = 10.0;

    /// The figures of a histogram of µs; `None` when it is empty.
    pub fn of(h: &hdrhistogram::Histogram<u64>) -> Option<Lag> {
        let ms = |us: u64| us as f64 / 1000.0;
        (!h.is_empty()).then(|| Lag {
            p50: ms(h.value_at_quantile(0.5)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
        })
    }

    /// Whether the generator fell behind its schedule.
    pub fn late(&self) -> bool {
        self.p99 >= Lag::LATE_P99_MS
    }
}

/// Latency percentiles of successes, ms from the intended send time.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 95th.
    pub p95: Option<f64>,
    /// 99th.
    pub p99: Option<f64>,
    /// 99.9th.
    pub p99_9: Option<f64>,
    /// Slowest.
    pub max: Option<f64>,
    /// Mean.
    pub mean: Option<f64>,
}

/// Answers that named one backend, by the balancer's header and the instance's own.
#[derive(Debug, Clone, Serialize)]
pub struct Share {
    /// The name.
    pub name: String,
    /// Answers with `x-backend: name`.
    pub by_backend: u64,
    /// Answers with `x-instance: name`.
    pub by_instance: u64,
    /// Of all named answers, percent.
    pub share_percent: f64,
}

/// Answers where the balancer and the instance named different backends.
#[derive(Debug, Clone, Serialize)]
pub struct Disagreement {
    /// `x-backend`.
    pub backend: String,
    /// `x-instance`.
    pub instance: String,
    /// How many answers.
    pub answers: u64,
}

/// Where one session's requests went.
#[derive(Debug, Clone, Serialize)]
pub struct SessionReport {
    /// Its key.
    pub session: String,
    /// Answers that named a backend.
    pub requests: u64,
    /// Answers per backend.
    pub backends: BTreeMap<String, u64>,
}

/// The target's share of the ephemeral port pool, before, during and after.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ports {
    /// The destination.
    pub dest: SocketAddr,
    /// Ephemeral ports per destination.
    pub pool: u64,
    /// Sockets towards it in TIME_WAIT before the run.
    pub time_wait_before: usize,
    /// After.
    pub time_wait_after: usize,
    /// Ports in use towards it before.
    pub in_use_before: usize,
    /// After.
    pub in_use_after: usize,
    /// The most in use at any sample.
    pub peak_in_use: usize,
    /// The most in TIME_WAIT at any sample.
    pub peak_time_wait: usize,
    /// Ports left after.
    pub headroom_after: i64,
}

/// One generator's host in a merged report.
#[derive(Debug, Clone, Serialize)]
pub struct Host {
    /// Its name.
    pub host: String,
    /// Its shard, `I/N`.
    pub shard: String,
    /// Successes it counted.
    pub ok: u64,
    /// Failures.
    pub errors: u64,
    /// Of those, the generator's own.
    pub generator_errors: u64,
    /// When it began, ms after the first shard did.
    pub started_after_ms: u64,
    /// Its port pool towards the target.
    pub ports: Option<Ports>,
}

/// A whole run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The URL.
    pub target: String,
    /// `closed` or `open`.
    pub mode: &'static str,
    /// How long the run took, traffic and watch.
    pub elapsed_s: f64,
    /// Open loop: requests offered.
    pub offered: Option<u64>,
    /// Attempts sent, retries included.
    pub sent: u64,
    /// Of those, retries.
    pub retries: u64,
    /// Successes.
    pub ok: u64,
    /// Failures.
    pub errors: u64,
    /// Failures that are the service's.
    pub service_errors: u64,
    /// Failures that are the generator's (ports, descriptors, overload).
    pub generator_errors: u64,
    /// Transactions still in flight when the run ended.
    pub unfinished: u64,
    /// Failures by kind.
    pub errors_by_kind: BTreeMap<Kind, u64>,
    /// Successes per second of traffic (until the last request was sent).
    pub requests_per_s: f64,
    /// Latency of successes.
    pub latency_ms: Latency,
    /// Open loop: how late the generator sent against its schedule. Late sends are
    /// the generator's host at work, not the service: latency still counts from the
    /// intended instant, but a property judged on timing cannot be.
    pub send_lag_ms: Option<Lag>,
    /// Answers per backend.
    pub backends: Vec<Share>,
    /// Where `x-backend` and `x-instance` disagree.
    pub disagreements: Vec<Disagreement>,
    /// Where each session went.
    pub sessions: Vec<SessionReport>,
    /// The port pool; `None` where sockets cannot be read.
    pub ports: Option<Ports>,
    /// Every second.
    pub rows: Vec<Row>,
    /// Merged from several generators: each one's host, counts and port pool
    /// (`ports` is then `None`: each host has a pool of its own).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<Host>,
}

impl Report {
    /// The percentage of the answers `backend` gave (0 if it gave none).
    pub fn share_of(&self, backend: &str) -> f64 {
        self.backends
            .iter()
            .find(|s| s.name == backend)
            .map_or(0.0, |s| s.share_percent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_kind_reads_back_from_what_it_writes() {
        for kind in Kind::WITHOUT_CODE
            .into_iter()
            .chain([Kind::Status(503), Kind::Grpc(14)])
        {
            assert_eq!(kind.to_string().parse::<Kind>(), Ok(kind));
        }
        assert!("http x".parse::<Kind>().unwrap_err().contains("bad code"));
        assert!("grpc 300".parse::<Kind>().unwrap_err().contains("bad code"));
        assert!(
            "gremlins"
                .parse::<Kind>()
                .unwrap_err()
                .contains("not one snag counts")
        );
    }
}
