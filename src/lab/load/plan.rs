//! What a load run does: target, request, arrivals, stop condition, sessions.

use std::{net::SocketAddr, str::FromStr, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{
    Method, Request,
    header::{HeaderName, HeaderValue},
};
use hyper_util::rt::TokioIo;

use super::shard::Shard;

/// Where requests go: `http://HOST:PORT/PATH` or `https://…`.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// The resolved address.
    pub addr: SocketAddr,
    /// `https://`: TLS, with HOST as the name sent and checked.
    pub tls: bool,
    /// The `Host` header: `HOST:PORT` as given.
    pub host: String,
    /// Path and query.
    pub path: String,
}

impl Target {
    /// Parses and resolves an `http://` or `https://` URL; the error says what is
    /// wrong with it.
    pub async fn resolve(url: &str) -> Result<Target, String> {
        let (tls, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
            (Some(rest), _) => (false, rest),
            (_, Some(rest)) => (true, rest),
            _ => {
                return Err(format!(
                    "{url}: expected http://HOST:PORT/PATH or https://…"
                ));
            }
        };
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if host.is_empty() {
            return Err(format!("{url}: no host"));
        }
        let with_port = if host
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            host.to_string()
        } else {
            format!("{host}:{}", if tls { 443 } else { 80 })
        };
        let addr = tokio::net::lookup_host(&with_port)
            .await
            .map_err(|e| format!("{url}: cannot resolve {with_port}: {e}"))?
            .next()
            .ok_or_else(|| format!("{url}: {with_port} resolves to nothing"))?;
        if !path.starts_with('/') || path.parse::<hyper::Uri>().is_err() {
            return Err(format!("{url}: bad path {path:?}"));
        }
        Ok(Target {
            addr,
            tls,
            host: host.into(),
            path: path.into(),
        })
    }
}

/// How requests arrive.
#[derive(Debug, Clone, PartialEq)]
pub enum Arrivals {
    /// This many connections, each sending its next request when the last is answered.
    Closed {
        /// Connections (one worker each).
        connections: usize,
    },
    /// A rate in requests per second, whatever the service does.
    Open {
        /// The base rate.
        rate: f64,
        /// A spike on top of it.
        shape: Option<Shape>,
    },
}

/// A change of the open-loop rate for a window of the run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Shape {
    /// `step:PEAK@FROM..TO`: the rate is PEAK inside the window.
    Step {
        /// Requests per second inside the window.
        peak: f64,
        /// Window start, from the run's start.
        from: Duration,
        /// Window end.
        to: Duration,
    },
    /// `ramp:A..B@FROM..TO`: the rate goes from A to B in a line across the window.
    Ramp {
        /// At the window's start.
        low: f64,
        /// Reached at its end.
        high: f64,
        /// Window start.
        from: Duration,
        /// Window end.
        to: Duration,
    },
}

impl FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Shape, String> {
        let usage = || {
            format!(
                "{s:?}: expected step:PEAK@FROM..TO or ramp:LOW..HIGH@FROM..TO (e.g. step:900@4s..7s)"
            )
        };
        let (kind, rest) = s.split_once(':').ok_or_else(usage)?;
        let (rates, window) = rest.split_once('@').ok_or_else(usage)?;
        let (from, to) = window.split_once("..").ok_or_else(usage)?;
        let time =
            |t: &str| humantime::parse_duration(t).map_err(|e| format!("{s:?}: time {t:?}: {e}"));
        let (from, to) = (time(from)?, time(to)?);
        if to <= from {
            return Err(format!("{s:?}: the window must end after it starts"));
        }
        let rate = |r: &str| {
            r.parse::<f64>()
                .ok()
                .filter(|r| r.is_finite() && *r >= 0.0)
                .ok_or_else(|| format!("{s:?}: rate {r:?} is not a number ≥ 0"))
        };
        match kind {
            "step" => Ok(Shape::Step {
                peak: rate(rates)?,
                from,
                to,
            }),
            "ramp" => {
                let (low, high) = rates.split_once("..").ok_or_else(usage)?;
                Ok(Shape::Ramp {
                    low: rate(low)?,
                    high: rate(high)?,
                    from,
                    to,
                })
            }
            _ => Err(usage()),
        }
    }
}

/// Requests grouped into sessions that carry a key.
#[derive(Debug, Clone, PartialEq)]
pub struct Sessions {
    /// How many.
    pub count: u64,
    /// Requests each; `None`: as many as the run sends.
    pub per_session: Option<u64>,
    /// Carries `s0`, `s1` … when `cookie` is not set.
    pub header: HeaderName,
    /// Carries the key as `Cookie: NAME=s0`.
    pub cookie: Option<String>,
}

/// A cookie's name is a token (RFC 6265 §4.1.1): what else it held would make a
/// `Cookie` header no server reads, or none at all.
pub fn cookie_name(s: &str) -> Result<String, String> {
    const SEPARATORS: &str = "()<>@,;:\\\"/[]?={}";
    if s.is_empty() {
        return Err("a cookie's name cannot be empty".into());
    }
    match s
        .chars()
        .find(|c| !c.is_ascii_graphic() || SEPARATORS.contains(*c))
    {
        Some(c) => Err(format!(
            "{c:?} cannot be in a cookie's name (letters, digits and !#$%&'*+-.^_`|~ can)"
        )),
        None => Ok(s.to_string()),
    }
}

/// A whole run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Where.
    pub target: Target,
    /// The method.
    pub method: Method,
    /// Extra request headers.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The request body.
    pub body: Bytes,
    /// How requests arrive.
    pub arrivals: Arrivals,
    /// The traffic window.
    pub duration: Duration,
    /// Stop after this many transactions (retries not counted).
    pub requests: Option<u64>,
    /// Session keys.
    pub sessions: Option<Sessions>,
    /// A request with no full answer by then is a timeout, and its connection closed.
    pub deadline: Option<Duration>,
    /// Retries after a transport failure or timeout (never after an HTTP status).
    pub retries: u32,
    /// Wait before a retry.
    pub retry_delay: Duration,
    /// Gives each transaction a unique id in this header; retries keep it.
    pub txn_header: Option<HeaderName>,
    /// A new connection per transaction, closed by the generator after the answer.
    pub new_connection: bool,
    /// Speak HTTP/2: with prior knowledge in clear, agreed by ALPN over TLS; each
    /// connection carries its requests as streams.
    pub http2: bool,
    /// Each request is a unary gRPC call to the target's path (HTTP/2, POST, the
    /// body as its one message); a non-zero `grpc-status` is an error.
    pub grpc: bool,
    /// TLS to an `https://` target, offering `h2` (with `http2`) or `http/1.1`.
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// A 2xx whose body lacks this text is a bad-body error.
    pub expect_body: Option<String>,
    /// Polled once a second for a JSON `depth`.
    pub stats_url: Option<Target>,
    /// Keep reporting until this long after the start (≥ the traffic window).
    pub watch: Duration,
    /// Open loop: requests in flight beyond this are not sent (a generator failure).
    pub max_inflight: u64,
    /// Makes transaction ids unique across runs.
    pub seed: u64,
    /// This generator's share of the run, when several send it.
    pub shard: Shard,
}

impl Plan {
    /// A closed-loop GET of `target` on one connection for one second.
    pub fn new(target: Target) -> Plan {
        Plan {
            target,
            method: Method::GET,
            headers: Vec::new(),
            body: Bytes::new(),
            arrivals: Arrivals::Closed { connections: 1 },
            duration: Duration::from_secs(1),
            requests: None,
            sessions: None,
            deadline: None,
            retries: 0,
            retry_delay: Duration::from_millis(200),
            txn_header: None,
            new_connection: false,
            http2: false,
            grpc: false,
            tls: None,
            expect_body: None,
            stats_url: None,
            watch: Duration::ZERO,
            max_inflight: 10_000,
            seed: 0,
            shard: Shard::WHOLE,
        }
    }

    /// This plan as `shard` sends its share: its part of the connections (or, with
    /// sessions, the sessions it owns), of the open-loop rate and of a count of
    /// transactions. `Err` when the shard would have nothing to send.
    pub fn sharded(mut self, shard: Shard) -> Result<Plan, String> {
        let total = self.total();
        let n = shard.count as f64;
        match (&mut self.arrivals, &self.sessions) {
            (Arrivals::Closed { .. }, Some(sessions)) if sessions.count < shard.count => {
                return Err(format!(
                    "{} sessions (one connection each) cannot be spread over {} shards",
                    sessions.count, shard.count
                ));
            }
            (Arrivals::Closed { .. }, Some(_)) => {}
            (Arrivals::Closed { connections }, None) => {
                let mine = shard.share(*connections as u64);
                if mine == 0 {
                    return Err(format!(
                        "{connections} connections cannot be spread over {} shards",
                        shard.count
                    ));
                }
                *connections = mine as usize;
            }
            (Arrivals::Open { rate, shape }, _) => {
                *rate /= n;
                match shape {
                    Some(Shape::Step { peak, .. }) => *peak /= n,
                    Some(Shape::Ramp { low, high, .. }) => (*low, *high) = (*low / n, *high / n),
                    None => {}
                }
            }
        }
        if let Some(total) = total {
            let mine = shard.share(total);
            if mine == 0 {
                return Err(format!(
                    "{total} transactions cannot be spread over {} shards",
                    shard.count
                ));
            }
            self.requests = Some(mine);
        }
        self.shard = shard;
        Ok(self)
    }

    /// Transactions to send in all, if bounded by count.
    pub fn total(&self) -> Option<u64> {
        let sessions = self
            .sessions
            .as_ref()
            .and_then(|s| s.per_session.map(|n| n * s.count));
        match (self.requests, sessions) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The open-loop rate at `t` from the start, per second; `None` in a closed loop.
    pub fn rate_at(&self, t: Duration) -> Option<f64> {
        let Arrivals::Open { rate, shape } = &self.arrivals else {
            return None;
        };
        Some(match shape {
            Some(Shape::Step { peak, from, to }) if (*from..*to).contains(&t) => *peak,
            Some(Shape::Ramp {
                low,
                high,
                from,
                to,
            }) if (*from..*to).contains(&t) => {
                low + (high - low) * (t - *from).as_secs_f64() / (*to - *from).as_secs_f64()
            }
            _ => *rate,
        })
    }

    /// Requests offered between `t0` and `t1`: the rate's integral (0 in a closed loop),
    /// exact across the shape's edges, so the counts of consecutive windows add up to
    /// the whole (a numeric sum lost up to a quarter of a request at each edge, and
    /// the run one request).
    pub fn offered(&self, t0: Duration, t1: Duration) -> f64 {
        let Arrivals::Open { rate, shape } = &self.arrivals else {
            return 0.0;
        };
        if t1 <= t0 {
            return 0.0;
        }
        let (a, b) = (t0.as_secs_f64(), t1.as_secs_f64());
        let base = rate * (b - a);
        // The part of [a, b] inside the shape's window, and what it adds there.
        let inside = |from: Duration, to: Duration| {
            let (lo, hi) = (a.max(from.as_secs_f64()), b.min(to.as_secs_f64()));
            (hi > lo).then_some((lo, hi))
        };
        match shape {
            Some(Shape::Step { peak, from, to }) => match inside(*from, *to) {
                Some((lo, hi)) => base + (peak - rate) * (hi - lo),
                None => base,
            },
            Some(Shape::Ramp {
                low,
                high,
                from,
                to,
            }) => match inside(*from, *to) {
                Some((lo, hi)) => {
                    let (f, span) = (from.as_secs_f64(), (*to - *from).as_secs_f64());
                    let at = |t: f64| low + (high - low) * (t - f) / span;
                    // A straight line: its mean over [lo, hi] is the mean of its ends.
                    base + ((at(lo) + at(hi)) / 2.0 - rate) * (hi - lo)
                }
                None => base,
            },
            None => base,
        }
    }

    /// How long after the traffic window the run waits for late answers.
    pub fn grace(&self) -> Duration {
        let attempt = self.deadline.unwrap_or(Duration::from_secs(10));
        attempt * (self.retries + 1) + self.retry_delay * self.retries + Duration::from_secs(1)
    }

    /// The session of an open-loop transaction.
    pub fn session_of(&self, seq: u64) -> Option<u64> {
        self.sessions.as_ref().map(|s| seq % s.count)
    }
}

/// Reads a queue depth from a stats URL once a second.
pub(super) struct StatsPoller {
    target: Option<Target>,
}

impl StatsPoller {
    pub(super) fn new(target: Option<Target>) -> StatsPoller {
        StatsPoller { target }
    }

    /// The `depth` field of the JSON answer; -1 when it could not be read; `None`
    /// without a stats URL.
    pub(super) async fn depth(&mut self) -> Option<i64> {
        let target = self.target.as_ref()?;
        let read = async {
            let stream = tokio::net::TcpStream::connect(target.addr).await.ok()?;
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            tokio::spawn(conn);
            let request = Request::get(target.path.as_str())
                .header(hyper::header::HOST, target.host.as_str())
                .body(Full::new(Bytes::new()))
                .ok()?;
            let body = sender
                .send_request(request)
                .await
                .ok()?
                .into_body()
                .collect()
                .await
                .ok()?
                .to_bytes();
            let json: serde_json::Value = serde_json::from_slice(&body).ok()?;
            json.get("depth")?.as_i64()
        };
        Some(
            tokio::time::timeout(Duration::from_millis(500), read)
                .await
                .ok()
                .flatten()
                .unwrap_or(-1),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_name_is_a_token_or_says_which_character_is_not() {
        assert_eq!(cookie_name("sid").as_deref(), Ok("sid"));
        assert_eq!(cookie_name("a_b-c.1~").as_deref(), Ok("a_b-c.1~"));
        assert!(cookie_name("").unwrap_err().contains("empty"));
        for (bad, shown) in [
            ("a\u{1}", "'\\u{1}'"),
            ("a b", "' '"),
            ("a=b", "'='"),
            ("é", "'é'"),
        ] {
            let err = cookie_name(bad).unwrap_err();
            assert!(err.starts_with(shown), "{bad:?}: {err}");
        }
    }

    fn target() -> Target {
        Target {
            addr: "127.0.0.1:1".parse().unwrap(),
            tls: false,
            host: "127.0.0.1:1".into(),
            path: "/".into(),
        }
    }

    #[test]
    fn step_and_ramp_offer_their_integral() {
        let mut plan = Plan::new(target());
        plan.arrivals = Arrivals::Open {
            rate: 100.0,
            shape: Some("step:900@4s..7s".parse().unwrap()),
        };
        let s = Duration::from_secs;
        assert!((plan.offered(s(0), s(4)) - 400.0).abs() < 1e-6);
        assert!((plan.offered(s(4), s(7)) - 2700.0).abs() < 1e-6);
        assert!((plan.offered(s(0), s(12)) - 3600.0).abs() < 1e-6);
        plan.arrivals = Arrivals::Open {
            rate: 100.0,
            shape: Some("ramp:100..900@4s..7s".parse().unwrap()),
        };
        // 100 → 900 over 3 s: a mean of 500/s.
        assert!((plan.offered(s(4), s(7)) - 1500.0).abs() < 1e-3);
        assert_eq!(plan.rate_at(Duration::from_millis(5500)), Some(500.0));
    }

    #[test]
    fn windows_cut_anywhere_add_up_to_the_whole_offer() {
        // The generator asks for the offer tick by tick, at instants that fall across
        // the shape's edges: the pieces must sum to the whole, or a request is lost.
        for shape in ["step:1000@1s..2s", "ramp:100..900@0.5s..2.5s"] {
            let mut plan = Plan::new(target());
            plan.arrivals = Arrivals::Open {
                rate: 500.0,
                shape: Some(shape.parse().unwrap()),
            };
            let whole = plan.offered(Duration::ZERO, Duration::from_secs(3));
            let mut t = Duration::ZERO;
            let mut sum = 0.0;
            let mut i = 0u64;
            while t < Duration::from_secs(3) {
                // Uneven ticks of 0.7 to 1.9 ms, as a busy runtime gives them.
                let next =
                    (t + Duration::from_micros(700 + (i * 389) % 1200)).min(Duration::from_secs(3));
                sum += plan.offered(t, next);
                (t, i) = (next, i + 1);
            }
            assert!((sum - whole).abs() < 1e-6, "{shape}: {sum} of {whole}");
        }
    }

    #[test]
    fn bad_shapes_say_why() {
        for (shape, why) in [
            ("step:900", "expected step"),
            ("step:x@1s..2s", "rate \"x\""),
            ("ramp:1..2@3s..1s", "must end after"),
            ("wave:1@1s..2s", "expected step"),
            ("step:5@1q..2s", "time \"1q\""),
        ] {
            let err = shape.parse::<Shape>().unwrap_err();
            assert!(err.contains(why), "{shape}: {err}");
        }
    }

    #[tokio::test]
    async fn targets_parse_or_say_why() {
        let t = Target::resolve("http://127.0.0.1:8080/a?b=1")
            .await
            .unwrap();
        assert_eq!(t.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(
            (t.host.as_str(), t.path.as_str()),
            ("127.0.0.1:8080", "/a?b=1")
        );
        let t = Target::resolve("http://127.0.0.1:9").await.unwrap();
        assert_eq!(t.path, "/");
        let t = Target::resolve("https://localhost:8443/x").await.unwrap();
        assert!(t.tls && t.host == "localhost:8443" && t.path == "/x");
        assert_eq!(
            Target::resolve("https://127.0.0.1").await.unwrap().addr,
            "127.0.0.1:443".parse().unwrap()
        );
        assert!(
            Target::resolve("ftp://x")
                .await
                .unwrap_err()
                .contains("expected http")
        );
        assert!(
            Target::resolve("http:///x")
                .await
                .unwrap_err()
                .contains("no host")
        );
    }
}
