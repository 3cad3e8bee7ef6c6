//! snag: a fault-injection interposer and load-balancer test bench.
//!
//! # Layout
//!
//! - [`cli`]: clap types; [`run`] dispatches a parsed [`cli::Cli`].
//! - [`proxy`]: one listener per upstream, listener faults, and [`proxy::relay`], which
//!   moves bytes of one connection through the fault stages.
//! - [`fault`]: what a fault is, its inline form, the per-direction chain, one file
//!   per stage, and [`fault::file`] for `faults/*.toml`.
//! - [`api`]: the Toxiproxy-compatible control API (`snag serve`); [`ctl`], its client.
//! - [`case`]: the documented cases end to end (`snag case`, the README's main job),
//!   reported by [`report`] in the terminal, JSON and HTML.
//! - [`lab`]: self-naming backends, the reference balancer, the load generator, and
//!   [`lab::driver`] for HAProxy and nginx; [`demo`]: a fault timeline against echo.
//! - [`soak`]: thousands of connections through a `snag serve` process, faults
//!   changing, leaks and lost bytes looked for.
//! - [`capture`], [`events`], [`ports`]: the evidence; [`shutdown`], [`seed`]: leaves
//!   every long-lived task and random choice uses.

#![warn(missing_docs)]
#![deny(unsafe_code)]

/// `println!` that never panics: output to a closed pipe (`snag ports | head`) is
/// dropped instead of aborting the run.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub mod api;
pub mod capture;
pub mod case;
pub mod cli;
pub mod ctl;
pub mod demo;
pub mod events;
pub mod fault;
pub mod http;
pub mod lab;
pub mod ports;
pub mod proxy;
pub mod report;
pub mod seed;
pub mod shutdown;
pub mod soak;

use std::sync::Arc;

use anyhow::Context;
use tokio::time::Instant;

use crate::{
    cli::{Cli, Command, ProxyArgs, ServeArgs},
    fault::file::{Action, Change, ProxySpec, Scenario},
    proxy::{Options, Proxy},
    shutdown::Shutdown,
};

/// Runs one subcommand until it is done or `shutdown` fires.
pub async fn run(cli: Cli, shutdown: Shutdown) -> anyhow::Result<()> {
    match cli.command {
        Command::Proxy(args) => run_proxies(*args, shutdown).await,
        Command::Demo(args) => demo::run(args, shutdown).await,
        Command::Serve(args) => serve_api(args, shutdown).await,
        Command::Ctl(args) => ctl::run(args).await,
        Command::Ports(args) => ports_report(args, shutdown).await,
        Command::Backend(args) => lab::run_backend(args, shutdown).await,
        Command::Balancer(args) => lab::run_balancer(*args, shutdown).await,
        Command::Load(args) => lab::load::main(*args, shutdown).await,
        Command::Case(args) => case::run(args, shutdown).await,
        Command::Soak(args) => soak::run(args, shutdown).await,
    }
}

async fn ports_report(args: cli::PortsArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    loop {
        let report = ports::report(&ports::sockets()?, ports::Limits::read()?, args.dest);
        if args.json {
            say!(
                "{}",
                serde_json::to_string(&report).expect("reports serialise")
            );
        } else {
            print_ports(&report);
        }
        let Some(every) = args.watch else {
            return Ok(());
        };
        tokio::select! {
            _ = shutdown.wait() => return Ok(()),
            _ = tokio::time::sleep(every) => {}
        }
    }
}

fn print_ports(r: &ports::Report) {
    let states: Vec<String> = r.states.iter().map(|(s, n)| format!("{s} {n}")).collect();
    say!(
        "sockets by state: {}",
        if states.is_empty() {
            "none".into()
        } else {
            states.join(", ")
        }
    );
    let l = r.limits;
    say!(
        "ephemeral ports {}–{}: {} per destination (a port in use towards one destination is free towards another); tcp_tw_reuse {}, tcp_fin_timeout {} s",
        l.ephemeral.0,
        l.ephemeral.1,
        r.pool,
        l.tw_reuse,
        l.fin_timeout
    );
    say!(
        "{:<46}  {:>7}  {:>9}  {:>8}  {:>6}",
        "destination",
        "in use",
        "TIME_WAIT",
        "headroom",
        "used"
    );
    for d in r.destinations.iter().take(20) {
        say!(
            "{:<46}  {:>7}  {:>9}  {:>8}  {:>5.1} %",
            d.dest.to_string(),
            d.ports_in_use,
            d.time_wait,
            d.headroom,
            d.used_percent
        );
    }
    if r.destinations.len() > 20 {
        say!("… and {} more destinations", r.destinations.len() - 20);
    }
    say!();
}

/// The event log and the capture of a run, opened before its proxies start and
/// closed, complete, after they stop.
struct Evidence {
    events: Option<Arc<events::EventLog>>,
    capture: Option<Arc<capture::Capture>>,
}

impl Evidence {
    /// Opens what the flags ask for; a capture from the flags wins over a file's.
    fn open(
        args: &cli::EvidenceArgs,
        file_capture: Option<capture::Settings>,
    ) -> anyhow::Result<Evidence> {
        let events = match &args.events {
            Some(path) => Some(
                events::EventLog::create(path)
                    .with_context(|| format!("could not create {}", path.display()))?,
            ),
            None => None,
        };
        let capture = match args.capture().or(file_capture) {
            Some(settings) => {
                let path = settings.path.clone();
                let capture = capture::Capture::create(settings)
                    .with_context(|| format!("could not create {}", path.display()))?;
                Some(Arc::new(capture))
            }
            None => None,
        };
        Ok(Evidence { events, capture })
    }

    /// Proxy options that send events and captures here.
    fn options(
        &self,
        on_upstream_error: proxy::relay::OnUpstreamError,
        connect_timeout: std::time::Duration,
        shutdown_timeout: std::time::Duration,
    ) -> Options {
        Options {
            on_upstream_error,
            connect_timeout,
            shutdown_timeout,
            events: self.events.clone(),
            capture: self.capture.clone(),
            ..Options::default()
        }
    }

    /// Writes out what is queued and closes both files.
    fn close(self) -> anyhow::Result<()> {
        if let Some(capture) = self.capture {
            capture.close().context("could not finish the capture")?;
        }
        if let Some(log) = self.events {
            log.close().context("could not finish the event log")?;
        }
        Ok(())
    }
}

/// A command line whose values are each fine but do not go together.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

async fn serve_api(args: ServeArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    if !args.listen.ip().is_loopback() && args.token.is_none() && !args.insecure_remote {
        return Err(UsageError(format!(
            "--listen {}: the control API would be reachable from other hosts; give --token TOKEN, or --insecure-remote if that is meant",
            args.listen
        ))
        .into());
    }
    let scenario = match &args.config {
        Some(path) if path.extension().is_some_and(|e| e == "json") => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("could not read {}", path.display()))?;
            let inputs: Vec<api::registry::ProxyInput> =
                serde_json::from_str(&text).map_err(|e| {
                    UsageError(format!(
                        "{}:{}:{}: {e}",
                        path.display(),
                        e.line(),
                        e.column()
                    ))
                })?;
            Some(Err(inputs))
        }
        Some(path) => Some(Ok(fault::file::load(path)?)),
        None => None,
    };
    let file_seed = match &scenario {
        Some(Ok(s)) => s.seed,
        _ => None,
    };
    let seed = args.seed.or(file_seed).unwrap_or_else(|| {
        let seed = seed::fresh();
        say!("seed {seed} (pass --seed {seed} to repeat this run's random choices)");
        seed
    });
    let file_capture = match &scenario {
        Some(Ok(s)) => s.capture.clone(),
        _ => None,
    };
    let evidence = Evidence::open(&args.evidence, file_capture)?;
    let options = evidence.options(
        args.on_upstream_error,
        args.connect_timeout,
        args.shutdown_timeout,
    );
    let listener = proxy::socket::bind(args.listen)
        .with_context(|| format!("control API: could not bind {}", args.listen))?;
    let metrics = api::Metrics {
        proxy: args.proxy_metrics,
        runtime: args.runtime_metrics,
    };
    let settings = api::Settings {
        token: args.token.clone(),
        metrics,
        files: Some(args.files_dir.clone()),
        header_timeout: args.header_timeout,
    };
    let api = api::Api::new(seed, options, settings, shutdown.clone());
    match scenario {
        Some(Err(inputs)) => api.populate(inputs).await.context("config")?,
        Some(Ok(scenario)) => api.load(&scenario, &shutdown).await.context("config")?,
        None => {}
    }
    say!(
        "control API on http://{} (Toxiproxy v2 compatible, version {})",
        listener.local_addr()?,
        api::VERSION
    );
    api::serve(listener, api, shutdown).await?;
    evidence.close()
}

/// Whether `err` is the user's input being wrong (exit code 2) rather than a failure.
pub fn is_usage_error(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|e| e.is::<fault::file::Error>() || e.is::<UsageError>())
}

async fn run_proxies(args: ProxyArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let scenario = match &args.file {
        Some(path) => fault::file::load(path)?,
        None => Scenario {
            seed: None,
            capture: None,
            proxies: vec![ProxySpec {
                name: args.name.clone(),
                listen: args.listen.context("--listen is required without --file")?,
                upstream: args
                    .upstream
                    .clone()
                    .context("--upstream is required without --file")?,
                faults: args.faults.clone(),
                timeline: Vec::new(),
                mode: args.mode,
                probe: args.probe_rules(),
                probe_listen: args.probe_listen,
                id_headers: (!args.id_headers.is_empty()).then(|| args.id_headers.clone()),
                instance: args.instance.clone(),
            }],
        },
    };
    let seed = args.seed.or(scenario.seed).unwrap_or_else(|| {
        let seed = seed::fresh();
        say!("seed {seed} (pass --seed {seed} to repeat this run's random choices)");
        seed
    });
    let evidence = Evidence::open(&args.evidence, scenario.capture.clone())?;
    let options = evidence.options(
        args.on_upstream_error,
        args.connect_timeout,
        args.shutdown_timeout,
    );
    let running = start(&scenario, seed, &options, &shutdown)?;
    if let (Some(spec), Some(first)) = (args.drain, running.first()) {
        let proxy = first.proxy.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(spec.at) => proxy.drain(spec.drain),
                _ = shutdown.wait() => {}
            }
        });
    }
    let width = running
        .iter()
        .map(|r| r.proxy.name.len())
        .max()
        .unwrap_or(0)
        .max(5);
    say!(
        "{:width$}  {:21}  {:21}  faults",
        "proxy",
        "listen",
        "upstream"
    );
    for r in &running {
        let faults: Vec<String> = r.proxy.faults().iter().map(|f| f.name.clone()).collect();
        say!(
            "{:width$}  {:21}  {:21}  {}",
            r.proxy.name,
            r.addr.to_string(),
            r.proxy.upstream,
            faults.join(", ")
        );
    }
    for r in running.iter().filter(|r| r.probe_addr.is_some()) {
        let at = r.probe_addr.map(|a| a.to_string()).unwrap_or_default();
        say!("{}: health probes on {at}", r.proxy.name);
    }
    let mut stats = std::collections::BTreeMap::new();
    for r in running {
        r.task.await.context("proxy task failed")??;
        stats.insert(r.proxy.name.clone(), r.proxy.counters().snapshot());
    }
    if let Some(path) = &args.stats {
        let text = serde_json::to_string_pretty(&stats).expect("stats serialise");
        std::fs::write(path, text + "\n")
            .with_context(|| format!("could not write {}", path.display()))?;
    }
    evidence.close()
}

/// A proxy started by [`start`].
pub struct Running {
    /// Its shared state, for changing faults.
    pub proxy: Arc<Proxy>,
    /// The address it actually listens on.
    pub addr: std::net::SocketAddr,
    /// The address of its probe listener, if it has one.
    pub probe_addr: Option<std::net::SocketAddr>,
    /// Ends after `shutdown`, once its connections are closed.
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// Binds and serves every proxy of `scenario`, and plays each one's timeline from now.
pub fn start(
    scenario: &Scenario,
    seed: u64,
    options: &Options,
    shutdown: &Shutdown,
) -> anyhow::Result<Vec<Running>> {
    let mut running = Vec::new();
    let t0 = Instant::now();
    for spec in &scenario.proxies {
        let listener = proxy::socket::bind(spec.listen)
            .with_context(|| format!("proxy `{}`: could not bind {}", spec.name, spec.listen))?;
        let addr = listener.local_addr()?;
        let probes = match spec.probe_listen {
            Some(at) => Some(proxy::socket::bind(at).with_context(|| {
                format!(
                    "proxy `{}`: could not bind the probe listener {at}",
                    spec.name
                )
            })?),
            None => None,
        };
        let probe_addr = probes.as_ref().map(|l| l.local_addr()).transpose()?;
        let mut options = options.clone();
        options.mode = spec.mode;
        options.probe = spec.probe.clone();
        if let Some(headers) = &spec.id_headers {
            options.id_headers = headers.iter().map(|h| h.to_ascii_lowercase()).collect();
        }
        options.instance = spec.instance.clone();
        options.probe_listen = probe_addr;
        let proxy = Proxy::new(
            spec.name.clone(),
            spec.upstream.clone(),
            seed,
            options,
            spec.faults.clone(),
        )
        .map_err(|e| UsageError(format!("proxy `{}`: {e}", spec.name)))?;
        let task = tokio::spawn(proxy::serve_all(
            listener,
            probes,
            proxy.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(play(
            proxy.clone(),
            spec.timeline.clone(),
            t0,
            shutdown.clone(),
        ));
        running.push(Running {
            proxy,
            addr,
            probe_addr,
            task,
        });
    }
    Ok(running)
}

/// Applies `timeline` to `proxy` at its offsets from `t0`, until done or `shutdown`.
pub async fn play(proxy: Arc<Proxy>, timeline: Vec<Change>, t0: Instant, shutdown: Shutdown) {
    for change in timeline {
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = tokio::time::sleep_until(t0 + change.at) => {}
        }
        let done = match change.action {
            Action::Add(fault) => proxy.add_fault(fault),
            Action::Remove(name) => proxy.remove_fault(&name).map(drop),
            Action::Drain(drain) => {
                proxy.drain(drain);
                Ok(())
            }
            Action::Undrain => {
                proxy.undrain();
                Ok(())
            }
        };
        if let Err(err) = done {
            tracing::warn!(proxy = %proxy.name, %err, "timeline change not applied");
        }
    }
}
