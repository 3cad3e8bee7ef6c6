//! The flags of the lab's and the cases' commands.

use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

use clap::{Args, Subcommand};

/// `snag soak`.
#[derive(Debug, Args)]
pub struct SoakArgs {
    /// How long the load runs, e.g. 10m or 60s.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Connections held open through snag at once, split over four proxies (TCP and
    /// HTTP, each with byte-preserving and destructive faults).
    #[arg(long, default_value_t = 9000)]
    pub connections: usize,
    /// Rounds (an echo there and back, or a request) per second over all connections.
    #[arg(long, default_value_t = 4000)]
    pub rate: u64,
    /// How often a drain begins (it lasts 5 s); the first comes at half this.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub drain_every: Duration,
    /// Where the JSON figures, the HTML chart and snag's log go.
    #[arg(long, default_value = "reports/soak")]
    pub report_dir: PathBuf,
    /// Seed for every random choice; printed when not given.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// `snag case`.
#[derive(Debug, Args)]
pub struct CaseArgs {
    /// `list`, `all`, or case names separated by commas (e.g. share-rr,sticky).
    pub name: String,
    /// The balancers under test, separated by commas; every case runs against each:
    /// builtin, haproxy, nginx, caddy, traefik (drivers in balancers/), a driver
    /// file of your own (./mine.toml), or external (one you start: the case prints
    /// where to point it and waits for it on --external-url).
    #[arg(long, default_value = "builtin", value_delimiter = ',')]
    pub balancer: Vec<crate::lab::driver::Product>,
    /// With --balancer external: where the cases' load reaches it.
    #[arg(long, default_value = "http://127.0.0.1:8080/")]
    pub external_url: String,
    /// With --balancer external: how long a case waits for it to answer from the
    /// backends it printed.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub external_wait: Duration,
    /// Shorter runs (for CI) that keep each property meaningful.
    #[arg(long, conflicts_with = "long")]
    pub quick: bool,
    /// Ten times the written durations and timelines: rare events (a false eviction
    /// once a minute) show in 60 s, not in 6 s.
    #[arg(long)]
    pub long: bool,
    /// Where the HTML report and one JSON file per case go.
    #[arg(long, default_value = "reports")]
    pub report_dir: PathBuf,
    /// Seed for every random choice; printed when not given.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Every part's listening ports (interposers, probe listeners, backends, the
    /// balancer and its admin port) from FIRST-LAST, e.g. 41000-41999; the
    /// generator's source ports stay the kernel's ephemeral range.
    #[arg(long, default_value = "any", value_parser = port_range)]
    pub port_range: crate::lab::listen::Ports,
    /// What the balancer speaks to the backends' interposers in every case that
    /// leaves it open: h1, h2c, or h2 (over TLS, with a CA and certificate made for
    /// the run); the HTTP/2 cases take h2 from it and speak h2c otherwise.
    #[arg(long)]
    pub backend_protocol: Option<crate::lab::balancer::BackendProtocol>,
    /// A TOML file naming the parts that run elsewhere, already started: backends
    /// (`snag backend`) by address, interposers by the control API of the `snag
    /// serve` to make them in and where they listen there. Parts it does not name
    /// start here.
    #[arg(long, value_name = "FILE")]
    pub topology: Option<PathBuf>,
}

/// `snag backend`.
#[derive(Debug, Args)]
pub struct BackendArgs {
    /// Its name, in `x-instance` and every body.
    #[arg(long, env = "SNAG_BACKEND_ID")]
    pub id: String,
    /// Where it listens (port 0: the OS chooses; the address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// Added to every data request, e.g. 50ms.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub delay: Duration,
    /// Serve data requests with this many workers, one request at a time each.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub workers: Option<u32>,
    /// What one request takes a worker, e.g. 25ms.
    #[arg(long, default_value = "25ms", value_parser = humantime::parse_duration, requires = "workers")]
    pub work: Duration,
    /// Requests that may wait for a worker: a number or `unbounded`; past it, 503.
    #[arg(long, default_value = "unbounded", requires = "workers")]
    pub queue: QueueBound,
    /// Answers 200, or 503 while unhealthy (`POST /admin/health`).
    #[arg(long, default_value = "/health")]
    pub health_path: String,
    /// Start with the dependency broken: data requests answer 200 with an error body.
    #[arg(long)]
    pub dependency_broken: bool,
    /// TLS with this PEM certificate chain (ALPN h2 and http/1.1); needs --tls-key.
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_key",
        conflicts_with = "tls_generate"
    )]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// TLS with a certificate made for this run, for localhost, 127.0.0.1, ::1 and
    /// each --tls-name; the CA that signed it is written to CA_FILE.
    #[arg(long, value_name = "CA_FILE")]
    pub tls_generate: Option<std::path::PathBuf>,
    /// Another name for the certificate --tls-generate makes (repeatable).
    #[arg(long = "tls-name", value_name = "NAME", requires = "tls_generate")]
    pub tls_names: Vec<String>,
}

impl BackendArgs {
    /// The TLS the flags ask for, if any.
    pub fn tls(&self) -> Option<crate::tls::ListenTls> {
        crate::tls::ListenTls::from_flags(
            self.tls_cert.as_ref(),
            self.tls_key.as_ref(),
            self.tls_generate.as_ref(),
            &self.tls_names,
        )
    }
}

/// `--queue N|unbounded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBound(pub Option<usize>);

impl std::str::FromStr for QueueBound {
    type Err = String;
    fn from_str(s: &str) -> Result<QueueBound, String> {
        match s {
            "unbounded" => Ok(QueueBound(None)),
            n => n
                .parse()
                .map(|n| QueueBound(Some(n)))
                .map_err(|_| format!("{n:?} is neither a number nor `unbounded`")),
        }
    }
}

/// `snag balancer`.
#[derive(Debug, Args)]
pub struct BalancerArgs {
    /// Where it listens (port 0: the OS chooses; the address is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// A backend: `id=ADDR:PORT[,weight=N][,check=ADDR:PORT]`; repeat for each.
    #[arg(long = "backend", required = true)]
    pub backends: Vec<crate::lab::balancer::BackendSpec>,
    /// rr, wrr, least, ip-hash, hash, consistent or random2.
    #[arg(long, default_value = "rr")]
    pub strategy: crate::lab::balancer::select::Strategy,
    /// What hash and consistent hash: header:NAME, cookie:NAME or source.
    #[arg(long, default_value = "header:x-session")]
    pub hash_key: crate::lab::balancer::HashKey,
    /// Turns active health checks on, one per backend at this interval.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub health_interval: Option<Duration>,
    /// A check without a full answer by then failed.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub health_timeout: Duration,
    /// Passes in a row that bring a backend back.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub rise: u32,
    /// Failures in a row that take it out.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub fall: u32,
    /// What a check asks; '' for a transport check (TCP connect only).
    #[arg(long, default_value = "/health")]
    pub health_path: String,
    /// Besides status 200, a check's body must contain this.
    #[arg(long)]
    pub health_expect_body: Option<String>,
    /// Check by gRPC's health protocol (grpc.health.v1.Health/Check over HTTP/2,
    /// TLS with --backend-protocol h2): healthy is SERVING.
    #[arg(long, conflicts_with = "health_expect_body")]
    pub health_grpc: bool,
    /// Transport failures within --fail-timeout that take a backend out for as long
    /// (nginx's max_fails); 0: off.
    #[arg(long, default_value_t = 0)]
    pub max_fails: u32,
    /// See --max-fails.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub fail_timeout: Duration,
    /// A backend coming back ramps its weight up over this long.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub slow_start: Duration,
    /// Other backends tried after a failure (connect failures always, others only for
    /// idempotent methods).
    #[arg(long, default_value_t = 0)]
    pub retries: u32,
    /// A backend without a response head by then failed (504).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Seed for random2.
    #[arg(long)]
    pub seed: Option<u64>,
    /// What it speaks to the backends: h1 (pooled keep-alive), h2c (HTTP/2 in
    /// clear), h2 (HTTP/2 over TLS by ALPN).
    #[arg(long, default_value = "h1", value_name = "h1|h2c|h2")]
    pub backend_protocol: crate::lab::balancer::BackendProtocol,
    /// h2: trust backends' certificates signed by this CA (PEM), e.g. a snag
    /// backend's --tls-generate file; default: the system's roots.
    #[arg(long, value_name = "FILE")]
    pub backend_ca: Option<std::path::PathBuf>,
}

/// `snag load`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct LoadArgs {
    /// `snag load merge …` instead of a run.
    #[command(subcommand)]
    pub merge: Option<LoadCommand>,
    /// http://HOST:PORT/PATH or https://HOST:PORT/PATH
    #[arg(required = true)]
    pub url: Option<String>,
    /// Closed loop: connections, each sending when its last answer is in.
    #[arg(short = 'c', long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub connections: u32,
    /// Traffic window, e.g. 5s.
    #[arg(short = 'd', long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Stop after this many transactions.
    #[arg(short = 'n', long)]
    pub requests: Option<u64>,
    /// Open loop: requests per second, sent whether or not earlier ones were answered.
    #[arg(long)]
    pub rate: Option<f64>,
    /// A spike on the open-loop rate: step:PEAK@FROM..TO or ramp:LOW..HIGH@FROM..TO.
    #[arg(long, requires = "rate")]
    pub shape: Option<crate::lab::load::Shape>,
    /// Keep reporting until this long after the start (queue depth, late answers).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub watch: Option<Duration>,
    /// A request without a full answer by then is a timeout; its connection is closed.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub deadline: Option<Duration>,
    /// Retries after a timeout or transport failure (never after an HTTP status).
    #[arg(long, default_value_t = 0)]
    pub retries: u32,
    /// Wait before a retry.
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    pub retry_delay: Duration,
    /// Session keys s0, s1 … spread over the requests.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub sessions: Option<u64>,
    /// Requests per session (closed loop: one connection per session).
    #[arg(long, requires = "sessions")]
    pub per_session: Option<u64>,
    /// The header that carries the session key.
    #[arg(long, default_value = "x-session")]
    pub session_header: hyper::header::HeaderName,
    /// Carry the session key in this cookie instead.
    #[arg(long, value_parser = crate::lab::load::cookie_name)]
    pub session_cookie: Option<String>,
    /// The request method.
    #[arg(long, default_value = "GET")]
    pub method: hyper::Method,
    /// The request body.
    #[arg(long)]
    pub body: Option<String>,
    /// An extra request header, `Name: value`; repeat for more.
    #[arg(short = 'H', long = "header", value_parser = header_line)]
    pub headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    /// Gives every transaction a unique id in this header (retries keep it).
    #[arg(long)]
    pub txn_header: Option<hyper::header::HeaderName>,
    /// A new connection for every transaction, closed by the generator.
    #[arg(long)]
    pub new_connection: bool,
    /// Speak HTTP/2: with prior knowledge in clear, agreed by ALPN over https://
    /// (only h2 is offered then); requests are streams.
    #[arg(long)]
    pub http2: bool,
    /// Each request a unary gRPC call to the URL's path (e.g. /snag.Backend/Echo),
    /// over HTTP/2, with --body as its message; a non-zero grpc-status is an error.
    #[arg(long)]
    pub grpc: bool,
    /// https://: trust the server's certificate if this CA (PEM) signed it; default:
    /// the system's roots.
    #[arg(long, value_name = "FILE")]
    pub cacert: Option<std::path::PathBuf>,
    /// https://: take any certificate (no check at all).
    #[arg(long, conflicts_with = "cacert")]
    pub insecure: bool,
    /// A 2xx answer whose body lacks this text counts as a bad-body error.
    #[arg(long)]
    pub expect_body: Option<String>,
    /// Polled once a second for a JSON `depth` (e.g. a snag backend's /stats).
    #[arg(long)]
    pub stats_url: Option<String>,
    /// Open loop: requests in flight beyond this are not sent (a generator failure).
    #[arg(long, default_value_t = 10_000)]
    pub max_inflight: u64,
    /// One JSON report at the end instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Makes transaction ids unique across runs; printed when not given.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Send this generator's share of the run: shard I of N (I from 0), or N alone
    /// with I from $JOB_COMPLETION_INDEX (a Kubernetes Indexed Job's pods). Each
    /// takes its part of the connections or the rate, of -n and of the sessions.
    #[arg(long, value_name = "I/N", requires = "result")]
    pub shard: Option<crate::lab::load::Shard>,
    /// Begin at this wall-clock instant (RFC 3339, or seconds since the Unix epoch),
    /// so that generators on several hosts start together without talking.
    #[arg(long, value_name = "TIME", value_parser = wall_clock)]
    pub start_at: Option<SystemTime>,
    /// Write the result here for `snag load merge`: counts, per-second rows and
    /// latency histograms (HdrHistogram V2), as JSON.
    #[arg(long, value_name = "FILE")]
    pub result: Option<PathBuf>,
    /// The host the result names; default: this machine's name.
    #[arg(long, value_name = "NAME")]
    pub host_name: Option<String>,
}

/// `snag load merge`.
#[derive(Debug, Subcommand)]
pub enum LoadCommand {
    /// Merge generators' results (--result files of one run's shards) into the
    /// report one generator would have printed, with each host's own port pool.
    Merge {
        /// The shards' result files.
        #[arg(required = true)]
        results: Vec<PathBuf>,
        /// One JSON report instead of tables.
        #[arg(long)]
        json: bool,
    },
}

/// An instant as RFC 3339 (`2026-12-03T15:00:00Z`) or seconds since the Unix epoch.
fn wall_clock(s: &str) -> Result<SystemTime, String> {
    if let Ok(secs) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map(|d| SystemTime::UNIX_EPOCH + d)
            .map_err(|_| format!("{s:?}: seconds since the epoch must be 0 or more"));
    }
    humantime::parse_rfc3339_weak(s).map_err(|e| {
        format!(
            "{s:?}: {e}; expected RFC 3339 (2026-12-03T15:00:00Z) or seconds since the Unix epoch"
        )
    })
}

fn header_line(s: &str) -> Result<(hyper::header::HeaderName, hyper::header::HeaderValue), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected `Name: value`"))?;
    let name = name
        .trim()
        .parse()
        .map_err(|e| format!("{s:?}: header name: {e}"))?;
    let value = value
        .trim()
        .parse()
        .map_err(|e| format!("{s:?}: header value: {e}"))?;
    Ok((name, value))
}

/// `snag watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The product: haproxy, caddy, traefik, or a driver file's path; its `[view]`
    /// (and `[log]`) rules read it.
    #[arg(long)]
    pub balancer: String,
    /// Its admin address, for a view read over HTTP (Traefik's API entry point,
    /// Caddy's admin API): the driver's `admin.addr`.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub admin: std::net::SocketAddr,
    /// The directory the driver's paths are in (its `dir`): the bundled HAProxy
    /// driver asks its stats socket at DIR/admin.sock.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// The product's log, for a view read from it (Caddy's healthy and unhealthy
    /// events) and for the lines its driver marks.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Names a backend, `id=ADDR:PORT`: the view's key is the id or contains the
    /// address. Repeat for each; without, the product's own names are kept.
    #[arg(long = "backend")]
    pub backends: Vec<crate::lab::balancer::BackendSpec>,
    /// Stop after this long, e.g. 60s; without, at Ctrl-C.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Also write the timeline and the figures here, as JSON.
    #[arg(long)]
    pub report: Option<PathBuf>,
}

/// `snag ports`.
#[derive(Debug, Args)]
pub struct PortsArgs {
    /// Only this destination's use of the pool.
    #[arg(long, value_name = "ADDR:PORT")]
    pub dest: Option<std::net::SocketAddr>,
    /// Report again at this interval until Ctrl-C, e.g. 1s.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub watch: Option<Duration>,
    /// One JSON object per report instead of tables.
    #[arg(long)]
    pub json: bool,
}

fn port_range(s: &str) -> Result<crate::lab::listen::Ports, String> {
    if s == "any" {
        return Ok(Default::default());
    }
    s.parse()
}
