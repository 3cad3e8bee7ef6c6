//! Command-line types: clap derive, and cross-field checks only.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{
    fault::{
        Fault, ProbeRules,
        config::ProxyConfig,
        drain::{Drain, DrainAt},
    },
    proxy::{Mode, relay::OnUpstreamError},
};

/// snag: a fault-injection interposer and load-balancer test bench.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// One variant per subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Relay TCP connections to an upstream through fault stages.
    Proxy(Box<ProxyArgs>),
    /// Start an echo upstream and a proxy with a fault file's timeline, probe through
    /// it, and show what each fault did.
    Demo(DemoArgs),
    /// Serve the control API (Toxiproxy v2 compatible) and the proxies it creates.
    Serve(ServeArgs),
    /// Talk to a running control API (snag serve, or Toxiproxy).
    Ctl(CtlArgs),
    /// Sockets by TCP state, TIME_WAIT per destination, and the ephemeral port pool.
    Ports(PortsArgs),
    /// An HTTP backend that names itself (x-instance), with delay, a worker pool and
    /// health and dependency switches.
    Backend(BackendArgs),
    /// A reference HTTP balancer: the seeds' strategies, health checks, slow start.
    Balancer(Box<BalancerArgs>),
    /// A load generator, closed or open loop, that tells its failures from the service's.
    Load(Box<LoadArgs>),
    /// Run the documented balancer and load cases end to end, and report.
    Case(CaseArgs),
    /// Hold thousands of connections through a `snag serve` process while faults
    /// change every second and drains come and go; check it leaks nothing and loses
    /// no byte (scripts/soak.sh).
    Soak(SoakArgs),
}

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
    /// The balancers under test: builtin, haproxy, nginx, or several separated by
    /// commas; every case runs against each.
    #[arg(long, default_value = "builtin", value_delimiter = ',')]
    pub balancer: Vec<crate::lab::driver::Product>,
    /// Shorter runs (for CI) that keep each property meaningful.
    #[arg(long)]
    pub quick: bool,
    /// Where the HTML report and one JSON file per case go.
    #[arg(long, default_value = "reports")]
    pub report_dir: PathBuf,
    /// Seed for every random choice; printed when not given.
    #[arg(long)]
    pub seed: Option<u64>,
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
}

/// `snag load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// http://HOST:PORT/PATH
    pub url: String,
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
    #[arg(long)]
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
    /// Speak HTTP/2 with prior knowledge (cleartext); requests are streams.
    #[arg(long)]
    pub http2: bool,
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

/// `snag ctl`.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The control API's address.
    #[arg(long, env = "SNAG_API", default_value = "127.0.0.1:8474")]
    pub api: std::net::SocketAddr,
    /// Sent as `Authorization: Bearer TOKEN`.
    #[arg(long, env = "SNAG_TOKEN")]
    pub token: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// One `snag ctl` action.
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// List proxies and their faults.
    List,
    /// Create a proxy.
    Create {
        /// Its name.
        name: String,
        /// Where it listens (port 0: the OS chooses).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Where it relays to, host:port.
        #[arg(long, value_parser = crate::fault::file::host_port)]
        upstream: String,
        /// Create it without listening.
        #[arg(long)]
        disabled: bool,
        /// `tcp` relays bytes; `http` terminates HTTP and takes the HTTP faults.
        #[arg(long, default_value = "tcp", value_name = "tcp|http")]
        mode: Mode,
        /// A second listener for health probes alone (port 0: the OS chooses).
        #[arg(long, value_name = "ADDR")]
        probe_listen: Option<String>,
        /// In http mode, requests to this path are health probes (repeatable);
        /// default /health, /healthz, /ready, /api/v1/health.
        #[arg(long = "probe-path", value_name = "PATH")]
        probe_paths: Vec<String>,
        /// A capture of this proxy alone, in the server's files directory.
        #[arg(long, value_name = "FILE")]
        capture: Option<String>,
    },
    /// Drain a proxy: MODE[:timeout=MS,new=refuse|ignore,rate=KBPS], MODE one of
    /// graceful, slow, deadline, abrupt.
    Drain {
        /// The proxy.
        name: String,
        /// e.g. graceful, or deadline:timeout=2000,new=ignore.
        drain: Drain,
    },
    /// End a proxy's drain: it accepts again.
    Undrain {
        /// The proxy.
        name: String,
    },
    /// A proxy's counters: connections, requests by class, statuses, resets, probes.
    Stats {
        /// The proxy.
        name: String,
    },
    /// Enable a disabled proxy, or disable an enabled one.
    Toggle {
        /// The proxy.
        name: String,
    },
    /// Add a fault, written as for `snag proxy --fault`.
    Add {
        /// The proxy.
        name: String,
        /// TYPE[:key=value,...], e.g. latency:latency=100,stream=upstream.
        fault: Fault,
    },
    /// Remove a fault by name.
    Remove {
        /// The proxy.
        name: String,
        /// The fault's name.
        fault: String,
    },
    /// Delete a proxy.
    Delete {
        /// The proxy.
        name: String,
    },
    /// Enable every proxy and remove every fault.
    Reset,
}

/// `snag serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the control API.
    #[arg(long, env = "SNAG_API", default_value = "127.0.0.1:8474")]
    pub listen: std::net::SocketAddr,
    /// Proxies to create at start: Toxiproxy's JSON config (a list of proxies, as
    /// POST /populate takes) when the name ends in .json, else a snag fault file.
    #[arg(long, env = "SNAG_CONFIG")]
    pub config: Option<PathBuf>,
    /// Seed for every random choice; printed when not given.
    #[arg(long, env = "SNAG_SEED")]
    pub seed: Option<u64>,
    /// Require `Authorization: Bearer TOKEN` on every API request.
    #[arg(long, env = "SNAG_TOKEN")]
    pub token: Option<String>,
    /// Allow a non-loopback API address without --token.
    #[arg(long)]
    pub insecure_remote: bool,
    /// The directory that capture and event files named through the API go to; a
    /// name that would leave it (`..`, an absolute path, a symlink) is refused.
    #[arg(long, value_name = "DIR", default_value = "captures")]
    pub files_dir: PathBuf,
    /// How long a client may take to send a request's headers, and then its body.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_timeout: Duration,
    /// Events and captures.
    #[command(flatten)]
    pub evidence: EvidenceArgs,
    /// Serve bytes received and sent per proxy and direction on /metrics.
    #[arg(long)]
    pub proxy_metrics: bool,
    /// Serve the process's memory and open descriptors on /metrics.
    #[arg(long)]
    pub runtime_metrics: bool,
    /// How proxies treat upstreams and shutdown.
    #[command(flatten)]
    pub run: RunArgs,
}

/// How every proxy of a run treats upstreams and shutdown.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// What the client gets when an upstream refuses, times out or resets.
    #[arg(long, default_value = "reset", value_name = "reset|close")]
    pub on_upstream_error: OnUpstreamError,
    /// Longest wait for an upstream to accept, e.g. 5s or 500ms.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// On SIGINT or SIGTERM, how long open connections may finish before they are
    /// reset (a second signal resets them at once), e.g. 10s; 0s closes them at once.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,
}

/// Whether `arg` is one of toxiproxy-server's single-dash flags (`-host`, `-port=8474`).
fn is_toxiproxy_flag(arg: &str) -> bool {
    let Some(name) = arg.strip_prefix('-').filter(|n| !n.starts_with('-')) else {
        return false;
    };
    let name = name.split_once('=').map_or(name, |(n, _)| n);
    matches!(
        name,
        "host" | "port" | "config" | "seed" | "proxy-metrics" | "runtime-metrics"
    )
}

/// Reads the command line. Invoked as `toxiproxy-server`, as `snag serve
/// --toxiproxy-flags`, or as `snag serve` followed by one of them, it takes Toxiproxy's Go-style flags (`-host=0.0.0.0`,
/// `-port 8474`, `-config f.json`, `-seed 1`), so scripts and containers written for
/// Toxiproxy start snag unchanged. Its Docker image listens on every interface, so
/// there `-host` other than loopback is allowed without a token, as in Toxiproxy.
pub fn args(argv: Vec<String>) -> Vec<String> {
    let invoked = argv
        .first()
        .map(|a| a.rsplit('/').next().unwrap_or(a).to_string());
    let rest: Vec<String> = if invoked.as_deref() == Some("toxiproxy-server") {
        argv[1..].to_vec()
    } else if argv.get(1).map(String::as_str) == Some("serve")
        && argv.get(2).map(String::as_str) == Some("--toxiproxy-flags")
    {
        argv[3..].to_vec()
    } else if argv.get(1).map(String::as_str) == Some("serve")
        && argv[2..].iter().any(|a| is_toxiproxy_flag(a))
    {
        // `snag serve -host 127.0.0.1 -port 8474`, as scripts written for
        // toxiproxy-server say it; clap would read `-host` as `-h` and print help.
        argv[2..].to_vec()
    } else {
        return argv;
    };
    let (mut host, mut port) = ("localhost".to_string(), "8474".to_string());
    let mut out = vec!["snag".to_string(), "serve".to_string()];
    let mut items = rest.into_iter();
    while let Some(item) = items.next() {
        let flag = item.trim_start_matches('-').to_string();
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.clone(), None),
        };
        let mut value = || value.clone().or_else(|| items.next()).unwrap_or_default();
        match name.as_str() {
            "host" => host = value(),
            "port" => port = value(),
            "config" => out.extend(["--config".to_string(), value()]),
            "seed" => out.extend(["--seed".to_string(), value()]),
            "version" => out = vec!["snag".to_string(), "--version".to_string()],
            "proxy-metrics" | "runtime-metrics" => out.push(format!("--{name}")),
            _ => out.push(item),
        }
    }
    let host = if host == "localhost" {
        "127.0.0.1".to_string()
    } else {
        host
    };
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host
    };
    out.extend([
        "--listen".to_string(),
        format!("{host}:{port}"),
        "--insecure-remote".to_string(),
    ]);
    out
}

/// `snag proxy`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Address to listen on (port 0: the OS chooses, and snag prints it).
    #[arg(
        long,
        env = "SNAG_LISTEN",
        required_unless_present = "file",
        conflicts_with = "file"
    )]
    pub listen: Option<std::net::SocketAddr>,
    /// Where to relay to, host:port.
    #[arg(
        long,
        env = "SNAG_UPSTREAM",
        required_unless_present = "file",
        conflicts_with = "file",
        value_parser = crate::fault::file::host_port
    )]
    pub upstream: Option<String>,
    /// The proxy's name, used in logs and fault seeds.
    #[arg(long, default_value = "proxy", conflicts_with = "file")]
    pub name: String,
    /// A fault, as TYPE[:key=value,...], e.g. latency:latency=50,jitter=10,stream=upstream.
    /// Repeat for a chain; faults apply in the order given.
    #[arg(long = "fault", value_name = "SPEC", conflicts_with = "file")]
    pub faults: Vec<Fault>,
    /// tcp relays bytes through the TCP faults; http terminates HTTP/1.1 and h2c
    /// and applies the HTTP faults per request.
    #[arg(
        long,
        default_value = "tcp",
        value_name = "tcp|http",
        conflicts_with = "file"
    )]
    pub mode: Mode,
    /// A second listener for the balancer's health checks: everything on it is a
    /// probe, so TCP and listener faults scoped probe or data can tell them apart.
    #[arg(long, value_name = "ADDR", conflicts_with = "file")]
    pub probe_listen: Option<std::net::SocketAddr>,
    /// In http mode, requests to this path are health probes (repeat for several);
    /// default /health, /healthz, /ready, /api/v1/health.
    #[arg(long = "probe-path", value_name = "PATH", conflicts_with = "file")]
    pub probe_paths: Vec<String>,
    /// In http mode, requests whose header NAME contains TEXT are probes, e.g.
    /// user-agent=kube-probe (repeatable).
    #[arg(long = "probe-header", value_name = "NAME=TEXT", conflicts_with = "file", value_parser = name_value)]
    pub probe_headers: Vec<(String, String)>,
    /// In http mode, a request header carrying a transaction id (repeatable; default
    /// x-request-id and idempotency-key): an id seen twice is a duplicate.
    #[arg(long = "id-header", value_name = "NAME", conflicts_with = "file")]
    pub id_headers: Vec<String>,
    /// In http mode, the name the backend should give in x-instance (default: the
    /// proxy's --name); responses naming another are counted as disagreements.
    #[arg(long, value_name = "NAME", conflicts_with = "file")]
    pub instance: Option<String>,
    /// In http mode, requests with this method are probes, e.g. HEAD (repeatable).
    #[arg(long = "probe-method", value_name = "METHOD", conflicts_with = "file")]
    pub probe_methods: Vec<String>,
    /// Drain the proxy: MODE[:timeout=MS,new=refuse|ignore,rate=KBPS][@OFFSET], MODE
    /// one of graceful, slow, deadline, abrupt; e.g. deadline:timeout=2000@5s.
    #[arg(long, value_name = "SPEC", conflicts_with = "file")]
    pub drain: Option<DrainAt>,
    /// A fault file (faults/*.toml): several proxies, their faults and a timeline.
    #[arg(long, env = "SNAG_FILE")]
    pub file: Option<PathBuf>,
    /// Write every proxy's counters here as JSON when snag exits.
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
    /// Events and captures.
    #[command(flatten)]
    pub evidence: EvidenceArgs,
    /// Seed for every random choice (toxicity, jitter …); printed when not given.
    #[arg(long, env = "SNAG_SEED")]
    pub seed: Option<u64>,
    /// How the proxies treat upstreams and shutdown.
    #[command(flatten)]
    pub run: RunArgs,
}

impl ProxyArgs {
    /// The one proxy the flags describe (without --file).
    pub fn config(&self) -> anyhow::Result<ProxyConfig> {
        use anyhow::Context as _;
        let listen = self.listen.context("--listen is required without --file")?;
        let upstream = self
            .upstream
            .clone()
            .context("--upstream is required without --file")?;
        let mut config = ProxyConfig::new(&self.name, listen, upstream);
        config.mode = self.mode;
        config.probe = self.probe_rules();
        config.probe_listen = self.probe_listen;
        if !self.id_headers.is_empty() {
            config.set_id_headers(&self.id_headers);
        }
        config.instance = self.instance.clone();
        config.faults = self.faults.clone();
        Ok(config)
    }

    /// The probe rules the flags give: the default paths unless --probe-path is given.
    pub fn probe_rules(&self) -> ProbeRules {
        let mut rules = ProbeRules::default();
        if !self.probe_paths.is_empty() {
            rules.paths = self.probe_paths.clone();
        }
        rules.headers = self.probe_headers.iter().cloned().collect();
        rules.methods = self.probe_methods.clone();
        rules
    }
}

fn name_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => {
            Ok((name.to_ascii_lowercase(), value.to_string()))
        }
        _ => Err(format!("`{s}` is not NAME=TEXT")),
    }
}

/// Where a run leaves its evidence: events and captures.
#[derive(Debug, Args)]
pub struct EvidenceArgs {
    /// Append events (faults changed, drains, GOAWAYs, resets, probes) here as JSON
    /// lines with timestamps.
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// Capture both legs of every connection to this pcapng file.
    #[arg(long, value_name = "FILE")]
    pub capture: Option<PathBuf>,
    /// Start a new capture file (NAME.1.pcapng, NAME.2.pcapng …) once one holds this
    /// many bytes.
    #[arg(long, value_name = "BYTES", requires = "capture")]
    pub capture_max_bytes: Option<u64>,
    /// Bytes kept of each captured packet, headers included; 0 keeps all.
    #[arg(long, value_name = "BYTES", default_value_t = 0, requires = "capture")]
    pub snaplen: u32,
}

impl EvidenceArgs {
    /// The capture the flags ask for, if any.
    pub fn capture(&self) -> Option<crate::capture::Settings> {
        self.capture.clone().map(|path| crate::capture::Settings {
            path,
            max_bytes: self.capture_max_bytes,
            snaplen: self.snaplen,
        })
    }
}

/// `snag demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The fault file whose first proxy and timeline the demo plays; its upstream is
    /// replaced by the demo's own echo backend.
    #[arg(long, default_value = "faults/demo.toml")]
    pub file: PathBuf,
    /// Seed for every random choice; defaults to the file's, else a fresh one.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Time between probe connections.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    pub every: Duration,
}
