//! Command-line types: clap derive, and cross-field checks only. The interposer's
//! commands (`proxy`, `serve`, `ctl`, `demo`) in [`proxy`], the lab's and the
//! cases' (`backend`, `balancer`, `load`, `ports`, `case`, `soak`) in [`lab`].

mod lab;
mod proxy;

use clap::{Parser, Subcommand};

pub use self::{
    lab::{
        BackendArgs, BalancerArgs, CaseArgs, LoadArgs, LoadCommand, PortsArgs, QueueBound,
        SoakArgs, WatchArgs,
    },
    proxy::{CtlArgs, CtlCommand, DemoArgs, EvidenceArgs, ProxyArgs, RunArgs, ServeArgs},
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
    /// Put a running balancer's own view of each backend (HAProxy's stats socket,
    /// Traefik's API, Caddy's events) on a timeline, in a setup built by hand, with
    /// evictions, time out of rotation and the requests shifted to the others.
    Watch(WatchArgs),
    /// Hold thousands of connections through a `snag serve` process while faults
    /// change every second and drains come and go; check it leaks nothing and loses
    /// no byte (scripts/soak.sh).
    Soak(SoakArgs),
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
