//! `snag soak`: thousands of connections held through a `snag serve` process of its
//! own while faults are added, changed and removed through the API every second and
//! a drain comes every minute; then the load stops and the process is checked for
//! what it kept: descriptors, connections, memory. Every echoed byte is checked at
//! its offset, so a lost or changed byte shows.
//!
//! Four proxies share the connections: `tcp-clean` (byte-preserving faults: every
//! round must come back intact), `tcp-chaos` (resets, truncation, timeouts: rounds
//! may end early, but no byte may change), `http-clean` (delays, and the drains: every
//! answer must be the request's body) and `http-chaos` (503s, broken bodies, resets,
//! swallowed requests: snag must keep answering).

mod checks;
mod churn;
mod client;
mod observe;
mod page;
mod tally;
mod target;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, bail};
use http_body_util::{BodyExt, Full};
use tokio::{net::TcpListener, task::JoinHandle, time::Instant};

pub use self::{observe::Missed, tally::Counts, target::Sample};
use self::{
    observe::{observe, settle},
    tally::Tally,
    target::Target,
};
use crate::{UsageError, report::Check, shutdown::Shutdown};

/// The four proxies: name, mode, whether every round must succeed.
const PROXIES: [(&str, &str, bool); 4] = [
    ("tcp-clean", "tcp", true),
    ("tcp-chaos", "tcp", false),
    ("http-clean", "http", true),
    ("http-chaos", "http", false),
];

/// How long each drain lasts before it is ended.
const DRAIN_FOR: Duration = Duration::from_secs(5);

/// Descriptors snag may hold beyond its baseline and its idle upstream pool once the
/// load has stopped: the runtime's own come and go.
const FD_SLACK: u64 = 8;

/// How a soak runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long the load runs.
    pub duration: Duration,
    /// Connections held open at once, split over the four proxies.
    pub connections: usize,
    /// Rounds per second over all connections.
    pub rate: u64,
    /// How often a drain begins; the first comes at half this.
    pub drain_every: Duration,
    /// Where the figures, the chart and snag's log go.
    pub report_dir: PathBuf,
    /// Seeds every random choice.
    pub seed: u64,
}

/// What the soak tells as it goes; the command prints it.
#[derive(Debug)]
pub enum Note<'a> {
    /// The descriptor limit: the soft limit it was, the hard limit now in force.
    Descriptors {
        /// Before.
        was: u64,
        /// Now.
        now: u64,
    },
    /// The target is up with its proxies; the load has not begun.
    TargetUp {
        /// Its PID.
        pid: u32,
        /// How many proxies it has.
        proxies: usize,
        /// It, sampled.
        baseline: &'a Sample,
    },
    /// The load begins.
    LoadBegins {
        /// Connections held.
        connections: usize,
        /// Over how many proxies.
        proxies: usize,
        /// Rounds per second in all.
        rate: u64,
        /// How long each drain lasts.
        drain_for: Duration,
        /// How often a drain begins.
        drain_every: Duration,
        /// How long the load runs.
        duration: Duration,
    },
    /// One second of the load.
    Second(&'a Row),
    /// A sample that could not be read while snag was still running (on a busy
    /// host an API call can take longer than its 10 s); the load goes on.
    SampleMissed(&'a Missed),
}

/// One sampled second, with what the clients had counted by then.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// The target, sampled.
    pub sample: Sample,
    /// Bytes checked at their offsets so far.
    pub verified_bytes: u64,
    /// Rounds a fault or a drain ended so far.
    pub ended: u64,
    /// Rounds that failed or came back changed so far.
    pub failed: u64,
}

/// What a soak found.
#[derive(Debug)]
pub struct Findings {
    /// Every check, passed or not.
    pub checks: Vec<Check>,
    /// The JSON figures.
    pub figures: PathBuf,
    /// The HTML chart.
    pub chart: PathBuf,
}

/// Runs the soak and judges it; `Err` only when it could not run.
pub async fn run(
    settings: &Settings,
    shutdown: Shutdown,
    note: &mut dyn FnMut(Note),
) -> anyhow::Result<Findings> {
    let limit = prepare(settings, note)?;
    let backends = Backends::start().await?;
    let seed = settings.seed;
    let (mut target, listens) = start_target(settings, &backends).await?;
    let baseline = target.sample().await?;
    note(Note::TargetUp {
        pid: target.pid,
        proxies: PROXIES.len(),
        baseline: &baseline,
    });

    let tallies: Arc<[Tally; 4]> = Arc::new(Default::default());
    let clients = Shutdown::new();
    let handles = spawn_clients(settings, &listens, &tallies, clients.clone());
    note(Note::LoadBegins {
        connections: settings.connections,
        proxies: PROXIES.len(),
        rate: settings.rate,
        drain_for: DRAIN_FOR,
        drain_every: settings.drain_every,
        duration: settings.duration,
    });

    let started = Instant::now();
    let host_mark = crate::host::Mark::now();
    let api_calls = Arc::new(AtomicU64::new(0));
    let api_errors = Arc::new(Mutex::default());
    let churning = tokio::spawn(churn::churn(
        target.api.clone(),
        seed,
        api_calls.clone(),
        api_errors.clone(),
        clients.clone(),
    ));
    let drains: Arc<Mutex<Vec<f64>>> = Arc::default();
    let draining = tokio::spawn(churn::drain_every(
        target.api.clone(),
        settings.drain_every,
        started,
        drains.clone(),
        api_errors.clone(),
        clients.clone(),
    ));
    let (samples, missed, interrupted) = observe(
        &mut target,
        &tallies,
        started,
        settings.duration,
        &shutdown,
        note,
    )
    .await;
    let load_s = started.elapsed().as_secs_f64();
    let host = host_mark
        .zip(crate::host::Mark::now())
        .map(|(a, b)| a.until(&b));
    let alive_under_load = target.alive();

    // The load stops: every client closes its connection.
    clients.trigger();
    let _ = churning.await;
    let _ = draining.await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for handle in handles {
        let _ = tokio::time::timeout_at(deadline, handle).await;
    }
    let (end, pooled) =
        match settle(&target, &baseline, backends.http, target::pooled_upstreams).await {
            Ok((end, pooled)) => (Ok(end), pooled),
            Err(err) => (Err(err), 0),
        };
    let stderr = std::fs::read_to_string(&target.stderr).unwrap_or_default();
    let exit = if target.alive() {
        target.stop(15).await.map_err(|e| e.to_string())
    } else {
        Err("snag serve had already exited".into())
    };
    backends.stop.trigger();

    let counts = tallies.each_ref().map(Tally::counts);
    let calls = api_calls.load(Ordering::Relaxed);
    let api_failures = api_errors.lock().map(|e| e.clone()).unwrap_or_default();
    let observed = checks::Observed {
        target_connections: settings.connections,
        alive_under_load,
        stderr,
        counts,
        calls,
        api_failures,
        baseline,
        end,
        pooled,
        samples: &samples,
        host,
        exit,
        interrupted,
        load_s,
    };
    let (checks, plateau) = checks::judge(&observed);
    let end = observed.end;
    let drains = drains.lock().map(|d| d.clone()).unwrap_or_default();
    let report = serde_json::json!({
        "seed": seed,
        "connections": settings.connections,
        "rate": settings.rate,
        "duration_s": load_s,
        "descriptor_limit": limit,
        "baseline": baseline,
        "after": end.as_ref().ok(),
        "after_unread": end.as_ref().err(),
        "plateau_rss_mib": plateau,
        "host": host,
        "proxies": PROXIES.iter().enumerate().map(|(i, (name, _, _))| (name.to_string(), counts[i])).collect::<BTreeMap<_, _>>(),
        "api_calls": calls,
        "drains_at_s": drains,
        "checks": checks,
        "samples": samples,
        "missed_samples": missed,
    });
    let figures = settings.report_dir.join("soak.json");
    std::fs::write(&figures, serde_json::to_string_pretty(&report)? + "\n")?;
    let chart = settings.report_dir.join("index.html");
    std::fs::write(&chart, page::html(&samples, &drains, &checks, &report))?;
    Ok(Findings {
        checks,
        figures,
        chart,
    })
}

/// Checks the settings against this machine, raises the descriptor limit and makes
/// the report directory; the limit in force.
fn prepare(settings: &Settings, note: &mut dyn FnMut(Note)) -> anyhow::Result<u64> {
    if settings.connections < 4 {
        return Err(UsageError("--connections: at least 4, one per proxy".into()).into());
    }
    let (was, limit) = target::raise_nofile()?;
    note(Note::Descriptors { was, now: limit });
    // Each connection holds a descriptor here (the client) and one more at the
    // backends here, and two in snag; both processes need the same headroom.
    let need = settings.connections as u64 * 2 + 256;
    if limit < need {
        return Err(UsageError(format!(
            "--connections {}: needs {need} descriptors in each process, and the hard limit is {limit}",
            settings.connections
        ))
        .into());
    }
    std::fs::create_dir_all(&settings.report_dir)
        .with_context(|| format!("could not create {}", settings.report_dir.display()))?;
    Ok(limit)
}

/// A backend's listener, with the longest accept queue the kernel allows. Thousands
/// of connections arrive in the first seconds; at tokio's 1024 the queue overflowed
/// while this process, beside the load it makes, was slow to accept, the kernel
/// dropped snag's SYNs, and snag rightly gave up on the upstream after its connect
/// timeout (a 2-core VM: 165 and 143 failed rounds on the clean proxies) — the
/// soak measured its own backends.
async fn backend_listener() -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    crate::proxy::socket::set_backlog(&listener, crate::proxy::socket::BACKLOG)?;
    Ok(listener)
}

/// The backends behind the four proxies, in this process: an echo for TCP, and an
/// HTTP server that answers each request with its body.
struct Backends {
    stop: Shutdown,
    tcp: SocketAddr,
    http: SocketAddr,
}

impl Backends {
    async fn start() -> anyhow::Result<Backends> {
        let stop = Shutdown::new();
        let tcp_backend = backend_listener().await?;
        let tcp = tcp_backend.local_addr()?;
        tokio::spawn(crate::lab::backend::echo(tcp_backend, stop.clone()));
        let http_backend = backend_listener().await?;
        let http = http_backend.local_addr()?;
        tokio::spawn(crate::lab::serve_http(
            http_backend,
            stop.clone(),
            |req, _| async move {
                let body = req
                    .into_body()
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                hyper::Response::new(Full::new(body))
            },
        ));
        Ok(Backends { stop, tcp, http })
    }
}

/// Starts `snag serve` and makes the four proxies through its API; their addresses.
async fn start_target(
    settings: &Settings,
    backends: &Backends,
) -> anyhow::Result<(Target, Vec<SocketAddr>)> {
    let target = Target::start(&settings.report_dir, settings.seed).await?;
    let mut listens = Vec::new();
    for (name, mode, _) in PROXIES {
        let upstream = if mode == "tcp" {
            backends.tcp
        } else {
            backends.http
        };
        let body = serde_json::json!({ "name": name, "listen": "127.0.0.1:0", "upstream": upstream.to_string(), "mode": mode });
        let (status, reply) = target
            .api
            .call("POST", "/proxies", &body.to_string())
            .await?;
        if status != 201 {
            bail!("creating {name}: {status} {reply}");
        }
        let view: serde_json::Value = serde_json::from_str(&reply)?;
        listens.push(view["listen"].as_str().unwrap_or_default().parse()?);
    }
    Ok((target, listens))
}

/// One client task per connection, dealt round the proxies.
fn spawn_clients(
    settings: &Settings,
    listens: &[SocketAddr],
    tallies: &Arc<[Tally; 4]>,
    stop: Shutdown,
) -> Vec<JoinHandle<()>> {
    let block = Arc::new(client::block(settings.seed));
    let mean_pause =
        Duration::from_secs_f64(settings.connections as f64 / settings.rate.max(1) as f64);
    (0..settings.connections)
        .map(|i| {
            let which = i % PROXIES.len();
            let (_, mode, clean) = PROXIES[which];
            let client = client::Client {
                addr: listens[which],
                index: i as u64,
                http: mode == "http",
                clean,
                tally: tallies.clone(),
                which,
                block: block.clone(),
                mean_pause,
                // Connects spread over the first seconds, 2000 a second: the accept
                // queues stay short.
                start_after: Duration::from_micros(i as u64 * 500),
                seed: settings.seed,
            };
            tokio::spawn(client.run(stop.clone()))
        })
        .collect()
}
