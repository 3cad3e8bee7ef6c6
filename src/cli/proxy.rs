//! The flags of the interposer's commands: `proxy`, `serve`, `ctl`, `demo`.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Subcommand};

use crate::{
    fault::{
        Fault, ProbeRules,
        config::{ProxyConfig, UpstreamProtocol},
        drain::{Drain, DrainAt},
    },
    proxy::{Mode, relay::OnUpstreamError},
    tls::{ListenTls, UpstreamTls},
};

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
        /// default /health, /healthz, /ready, /api/v1/health, /grpc.health.v1.Health/Check.
        #[arg(long = "probe-path", value_name = "PATH")]
        probe_paths: Vec<String>,
        /// A capture of this proxy alone, in the server's files directory.
        #[arg(long, value_name = "FILE")]
        capture: Option<String>,
    },
    /// Drain a proxy: MODE[:timeout=MS,new=refuse|ignore,rate=KBPS,grace=MS], MODE one
    /// of graceful, slow, deadline, abrupt, readiness.
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
        /// Read the counts since the last reset and start a new window: each call
        /// then shows one window.
        #[arg(long)]
        reset: bool,
    },
    /// Switch a proxy's capture on or off: new connections are captured from now
    /// on, or not; open ones stay as they are.
    Capture {
        /// The proxy.
        name: String,
        /// on or off.
        #[arg(value_parser = ["on", "off"])]
        state: String,
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
    /// Also run load shards that `snag case --topology` sends (`POST /load`): this
    /// host becomes one of the case's generators.
    #[arg(long)]
    pub generator: bool,
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
    /// default /health, /healthz, /ready, /api/v1/health, /grpc.health.v1.Health/Check.
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
    /// In http mode, TLS on the listener(s) with this PEM certificate chain (ALPN h2
    /// and http/1.1); needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key", conflicts_with_all = ["file", "tls_generate"])]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(
        long,
        value_name = "FILE",
        requires = "tls_cert",
        conflicts_with = "file"
    )]
    pub tls_key: Option<PathBuf>,
    /// In http mode, TLS with a certificate made for this run, for localhost,
    /// 127.0.0.1, ::1 and each --tls-name; the CA that signed it is written to
    /// CA_FILE for the client to trust.
    #[arg(long, value_name = "CA_FILE", conflicts_with = "file")]
    pub tls_generate: Option<PathBuf>,
    /// Another name for the certificate --tls-generate makes (repeatable).
    #[arg(
        long = "tls-name",
        value_name = "NAME",
        requires = "tls_generate",
        conflicts_with = "file"
    )]
    pub tls_names: Vec<String>,
    /// In http mode, the protocol spoken to the upstream: h1, h2c (HTTP/2 in clear),
    /// h2 (HTTP/2 over TLS, by ALPN), or auto (over TLS what ALPN agrees, in clear
    /// what the client spoke).
    #[arg(
        long,
        default_value = "h1",
        value_name = "h1|h2c|h2|auto",
        conflicts_with = "file"
    )]
    pub upstream_protocol: UpstreamProtocol,
    /// In http mode, TLS to the upstream, verified against the system's roots unless
    /// --upstream-ca or --upstream-insecure says otherwise.
    #[arg(long, conflicts_with = "file")]
    pub upstream_tls: bool,
    /// The name sent in SNI and checked in the upstream's certificate (default: the
    /// upstream's host); implies --upstream-tls.
    #[arg(long, value_name = "NAME", conflicts_with = "file")]
    pub upstream_sni: Option<String>,
    /// Trust this CA (PEM) for the upstream's certificate; implies --upstream-tls.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["file", "upstream_insecure"])]
    pub upstream_ca: Option<PathBuf>,
    /// Accept any certificate from the upstream; implies --upstream-tls.
    #[arg(long, conflicts_with = "file")]
    pub upstream_insecure: bool,
    /// In http mode, requests with this method are probes, e.g. HEAD (repeatable).
    #[arg(long = "probe-method", value_name = "METHOD", conflicts_with = "file")]
    pub probe_methods: Vec<String>,
    /// Drain the proxy: MODE[:timeout=MS,new=refuse|ignore,rate=KBPS,grace=MS][@OFFSET],
    /// MODE one of graceful, slow, deadline, abrupt, readiness (probes fail for grace
    /// ms first); e.g. deadline:timeout=2000@5s.
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
        config.tls = ListenTls::from_flags(
            self.tls_cert.as_ref(),
            self.tls_key.as_ref(),
            self.tls_generate.as_ref(),
            &self.tls_names,
        );
        config.upstream_protocol = self.upstream_protocol;
        let upstream_tls = self.upstream_tls
            || self.upstream_sni.is_some()
            || self.upstream_ca.is_some()
            || self.upstream_insecure;
        config.upstream_tls = upstream_tls.then(|| UpstreamTls {
            sni: self.upstream_sni.clone(),
            ca: self.upstream_ca.clone(),
            insecure: self.upstream_insecure,
        });
        config
            .check_legs()
            .map_err(|e| crate::UsageError(format!("{e} (--mode, --tls-*, --upstream-*)")))?;
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
    /// Append the secrets of every TLS session here (NSS key log format), so that
    /// Wireshark or `tshark -o tls.keylog_file:FILE` decrypts the capture.
    #[arg(long, value_name = "FILE", env = "SSLKEYLOGFILE")]
    pub tls_keylog: Option<PathBuf>,
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
