//! Command-line types: clap derive, and cross-field checks only.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{
    fault::{Fault, ProbeRules},
    proxy::{Mode, drain::DrainAt, relay::OnUpstreamError},
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
    /// Events and captures.
    #[command(flatten)]
    pub evidence: EvidenceArgs,
    /// Serve bytes received and sent per proxy and direction on /metrics.
    #[arg(long)]
    pub proxy_metrics: bool,
    /// Serve the process's memory and open descriptors on /metrics.
    #[arg(long)]
    pub runtime_metrics: bool,
    /// What the client gets when an upstream refuses, times out or resets.
    #[arg(long, value_enum, default_value_t = OnUpstreamError::Reset)]
    pub on_upstream_error: OnUpstreamError,
    /// Longest wait for an upstream to accept, e.g. 5s or 500ms.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
}

/// Reads the command line. Invoked as `toxiproxy-server`, or as `snag serve
/// --toxiproxy-flags`, it takes Toxiproxy's Go-style flags (`-host=0.0.0.0`,
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
    #[arg(long, value_enum, default_value_t = Mode::Tcp, conflicts_with = "file")]
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
    /// What the client gets when the upstream refuses, times out or resets.
    #[arg(long, value_enum, default_value_t = OnUpstreamError::Reset)]
    pub on_upstream_error: OnUpstreamError,
    /// Longest wait for the upstream to accept, e.g. 5s or 500ms.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
}

impl ProxyArgs {
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
