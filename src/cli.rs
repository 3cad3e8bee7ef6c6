//! Command-line types: clap derive, and cross-field checks only.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

use crate::{fault::Fault, proxy::relay::OnUpstreamError};

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
    Proxy(ProxyArgs),
    /// Start an echo upstream and a proxy with a fault file's timeline, probe through
    /// it, and show what each fault did.
    Demo(DemoArgs),
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
    /// A fault file (faults/*.toml): several proxies, their faults and a timeline.
    #[arg(long, env = "SNAG_FILE")]
    pub file: Option<PathBuf>,
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
