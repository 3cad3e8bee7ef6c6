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
mod client;
mod page;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rand::RngExt;
use serde::Serialize;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpListener,
    time::Instant,
};

use crate::{UsageError, cli::SoakArgs, shutdown::Shutdown};

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

/// What the clients of one proxy saw.
#[derive(Debug, Default)]
pub struct Tally {
    /// Rounds that came back whole and right.
    ok: AtomicU64,
    /// Bytes checked at their offsets.
    verified: AtomicU64,
    /// Received bytes that differed from those sent: never allowed.
    corrupted: AtomicU64,
    /// Rounds a fault or a drain ended (chaos proxies; HTTP connections a drain
    /// closed under a request).
    ended: AtomicU64,
    /// Rounds that failed where nothing allowed it.
    failed: AtomicU64,
    /// Connects refused (a drain closes the listener).
    refused: AtomicU64,
    /// Connections opened.
    connections: AtomicU64,
}

impl Tally {
    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// The counts now.
    fn counts(&self) -> Counts {
        Counts {
            ok: Tally::get(&self.ok),
            verified: Tally::get(&self.verified),
            corrupted: Tally::get(&self.corrupted),
            ended: Tally::get(&self.ended),
            failed: Tally::get(&self.failed),
            refused: Tally::get(&self.refused),
            connections: Tally::get(&self.connections),
        }
    }
}

/// A [`Tally`] read at one moment.
#[derive(Debug, Clone, Copy, Serialize)]
struct Counts {
    ok: u64,
    #[serde(rename = "verified_bytes")]
    verified: u64,
    corrupted: u64,
    #[serde(rename = "ended_by_fault_or_drain")]
    ended: u64,
    failed: u64,
    refused: u64,
    connections: u64,
}

/// One second of the target process, as sampled.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Sample {
    /// Seconds since the load began.
    pub t: f64,
    /// Connections snag has open (its stats).
    pub connections: u64,
    /// Resident memory, MiB.
    pub rss_mib: f64,
    /// Open descriptors.
    pub fds: u64,
    /// OS threads.
    pub threads: u64,
    /// Tasks alive in its runtime.
    pub tasks: u64,
    /// Rounds that came back right in this second, all proxies.
    pub ok_per_s: u64,
}

/// The `snag serve` under test: our child, ended by its PID.
struct Target {
    child: tokio::process::Child,
    pid: u32,
    api: Api,
    stderr: PathBuf,
}

/// A client of the target's control API, shared by the sampler, the fault churn
/// and the drains.
#[derive(Clone)]
struct Api {
    addr: SocketAddr,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
}

impl Api {
    /// One call; the status and the body, within 10 s.
    async fn call(&self, method: &str, path: &str, body: &str) -> anyhow::Result<(u16, String)> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))?;
        let call = async {
            let response = self.client.request(request).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
        };
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .with_context(|| format!("{method} {path}: no answer within 10 s"))?
    }

    /// A call that must succeed; what went wrong, in a line, if it did not.
    async fn expect_2xx(&self, method: &str, path: &str, body: &str) -> Result<(), String> {
        match self.call(method, path, body).await {
            Ok((status, _)) if (200..300).contains(&status) => Ok(()),
            Ok((status, reply)) => Err(format!("{method} {path}: {status} {}", reply.trim())),
            Err(err) => Err(format!("{err:#}")),
        }
    }
}

impl Target {
    async fn start(dir: &Path, seed: u64) -> anyhow::Result<Target> {
        let stderr = dir.join("snag.stderr.log");
        let exe = std::env::current_exe().context("where is this snag")?;
        let mut child = tokio::process::Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--runtime-metrics"])
            .args(["--seed", &seed.to_string(), "--shutdown-timeout", "3s"])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&stderr).context("the log file")?)
            .kill_on_drop(true)
            // Its own process group: a Ctrl-C at the terminal stops the soak, and the
            // soak stops snag serve, rather than both at once.
            .process_group(0)
            .spawn()
            .context("could not start snag serve")?;
        let pid = child.id().context("snag serve exited at once")?;
        let mut lines = BufReader::new(child.stdout.take().context("its stdout")?).lines();
        let api = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix("control API on http://") {
                    let addr = rest.split_whitespace().next().unwrap_or_default();
                    return addr.parse::<SocketAddr>().context("its address");
                }
            }
            bail!("snag serve ended before it listened")
        })
        .await
        .context("snag serve did not listen within 20 s")??;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        Ok(Target {
            child,
            pid,
            api: Api { addr: api, client },
            stderr,
        })
    }

    /// Its memory, descriptors, threads (from /proc), tasks and open connections
    /// (from its API).
    async fn sample(&self) -> anyhow::Result<Sample> {
        let proc = PathBuf::from(format!("/proc/{}", self.pid));
        let status = std::fs::read_to_string(proc.join("status")).context("snag is gone")?;
        let rss_kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let count = |dir: &str| std::fs::read_dir(proc.join(dir)).map_or(0, |d| d.count() as u64);
        // At once: on a busy machine each call can take a second, and a sample is
        // due every second.
        let paths = PROXIES.map(|(name, _, _)| format!("/proxies/{name}/stats"));
        let stats = |i: usize| self.api.call("GET", &paths[i], "");
        let (metrics, a, b, c, d) = tokio::join!(
            self.api.call("GET", "/metrics", ""),
            stats(0),
            stats(1),
            stats(2),
            stats(3)
        );
        let stats = [a, b, c, d];
        let tasks = metrics?
            .1
            .lines()
            .find_map(|l| l.strip_prefix("snag_tasks "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        let mut connections = 0;
        for answer in stats {
            let stats: serde_json::Value = serde_json::from_str(&answer?.1)?;
            connections += stats["active_connections"].as_u64().unwrap_or(0);
        }
        Ok(Sample {
            connections,
            rss_mib: rss_kib / 1024.0,
            fds: count("fd"),
            threads: count("task"),
            tasks,
            ..Sample::default()
        })
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then its exit status within `secs`.
    async fn stop(&mut self, secs: u64) -> anyhow::Result<std::process::ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        tokio::time::timeout(Duration::from_secs(secs), self.child.wait())
            .await
            .with_context(|| format!("snag serve did not exit within {secs} s of SIGTERM"))?
            .context("waiting for snag serve")
    }
}

/// Raises this process's descriptor limit to its hard limit (children inherit it);
/// the limit it got.
fn raise_nofile() -> anyhow::Result<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
        say!(
            "descriptors: limit raised from {soft} to {hard}, the hard limit (snag serve inherits it)"
        );
    } else {
        say!("descriptors: limit {hard}, the hard limit");
    }
    Ok(hard)
}

/// Runs the soak; `Err` if a check failed.
pub async fn run(args: SoakArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        let seed = crate::seed::fresh();
        say!("seed {seed} (pass --seed {seed} to repeat this run's random choices)");
        seed
    });
    if args.connections < 4 {
        return Err(UsageError("--connections: at least 4, one per proxy".into()).into());
    }
    let limit = raise_nofile()?;
    // Each connection holds a descriptor here (the client) and one more at the
    // backends here, and two in snag; both processes need the same headroom.
    let need = args.connections as u64 * 2 + 256;
    if limit < need {
        return Err(UsageError(format!(
            "--connections {}: needs {need} descriptors in each process, and the hard limit is {limit}",
            args.connections
        ))
        .into());
    }
    std::fs::create_dir_all(&args.report_dir)
        .with_context(|| format!("could not create {}", args.report_dir.display()))?;

    let backends = Shutdown::new();
    let tcp_backend = TcpListener::bind("127.0.0.1:0").await?;
    let tcp_addr = tcp_backend.local_addr()?;
    tokio::spawn(crate::lab::backend::echo(tcp_backend, backends.clone()));
    let http_backend = TcpListener::bind("127.0.0.1:0").await?;
    let http_addr = http_backend.local_addr()?;
    tokio::spawn(crate::lab::serve_http(
        http_backend,
        backends.clone(),
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

    let mut target = Target::start(&args.report_dir, seed).await?;
    let mut listens = Vec::new();
    for (name, mode, _) in PROXIES {
        let upstream = if mode == "tcp" { tcp_addr } else { http_addr };
        let body = serde_json::json!({ "name": name, "listen": "127.0.0.1:0", "upstream": upstream.to_string(), "mode": mode });
        let (status, reply) = target
            .api
            .call("POST", "/proxies", &body.to_string())
            .await?;
        if status != 201 {
            bail!("creating {name}: {status} {reply}");
        }
        let view: serde_json::Value = serde_json::from_str(&reply)?;
        let listen: SocketAddr = view["listen"].as_str().unwrap_or_default().parse()?;
        listens.push(listen);
    }
    let baseline = target.sample().await?;
    say!(
        "snag serve (pid {}) with {} proxies: {:.1} MiB, {} descriptors, {} tasks before the load",
        target.pid,
        PROXIES.len(),
        baseline.rss_mib,
        baseline.fds,
        baseline.tasks
    );

    let tallies: Arc<[Tally; 4]> = Arc::new(Default::default());
    let clients = Shutdown::new();
    let block = Arc::new(client::block(seed));
    let mean_pause = Duration::from_secs_f64(args.connections as f64 / args.rate.max(1) as f64);
    let mut handles = Vec::with_capacity(args.connections);
    for i in 0..args.connections {
        let which = i % PROXIES.len();
        let (_, mode, _) = PROXIES[which];
        let client = client::Client {
            addr: listens[which],
            index: i as u64,
            http: mode == "http",
            clean: PROXIES[which].2,
            tally: tallies.clone(),
            which,
            block: block.clone(),
            mean_pause,
            // Connects spread over the first seconds, 2000 a second: the accept
            // queues stay short.
            start_after: Duration::from_micros(i as u64 * 500),
            seed,
        };
        handles.push(tokio::spawn(client.run(clients.clone())));
    }
    say!(
        "{} connections ({} per proxy), {} rounds/s in all, faults changing every second, a {} s drain every {} s, for {} s",
        args.connections,
        args.connections / PROXIES.len(),
        args.rate,
        DRAIN_FOR.as_secs(),
        args.drain_every.as_secs(),
        args.duration.as_secs()
    );

    let started = Instant::now();
    let host_mark = crate::host::Mark::now();
    let api_calls = Arc::new(AtomicU64::new(0));
    let api_errors = Arc::new(Mutex::default());
    let churning = tokio::spawn(churn(
        target.api.clone(),
        seed,
        api_calls.clone(),
        api_errors.clone(),
        clients.clone(),
    ));
    let drains: Arc<std::sync::Mutex<Vec<f64>>> = Arc::default();
    let draining = tokio::spawn(drain_every(
        target.api.clone(),
        args.drain_every,
        started,
        drains.clone(),
        api_errors.clone(),
        clients.clone(),
    ));

    say!(
        "{:>5}  {:>11}  {:>8}  {:>7}  {:>7}  {:>8}  {:>12}  {:>7}  {:>6}",
        "t s",
        "connections",
        "RSS MiB",
        "fds",
        "tasks",
        "ok/s",
        "verified MiB",
        "ended",
        "failed"
    );
    let (samples, interrupted) =
        observe(&target, &tallies, started, args.duration, &shutdown).await;
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
    // Then snag should let go of everything: wait for it, with a deadline.
    let mut after = None;
    let settle = Instant::now() + Duration::from_secs(30);
    while Instant::now() < settle {
        let Ok(s) = target.sample().await else { break };
        let pooled = pooled_upstreams(http_addr);
        let settled = s.connections == 0 && s.fds <= baseline.fds + pooled + FD_SLACK;
        after = Some((s, pooled));
        if settled {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let stderr = std::fs::read_to_string(&target.stderr).unwrap_or_default();
    let (end, pooled) = after.unwrap_or_default();
    let exit = if target.alive() {
        target.stop(15).await.map_err(|e| e.to_string())
    } else {
        Err("snag serve had already exited".into())
    };
    backends.trigger();

    let c = tallies.each_ref().map(Tally::counts);
    let calls = api_calls.load(Ordering::Relaxed);
    let api_failures = api_errors
        .lock()
        .map(|e: std::sync::MutexGuard<'_, Vec<String>>| e.clone())
        .unwrap_or_default();
    let observed = checks::Observed {
        target_connections: args.connections,
        alive_under_load,
        stderr,
        counts: c,
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
    let drains = drains.lock().map(|d| d.clone()).unwrap_or_default();
    let report = serde_json::json!({
        "seed": seed,
        "connections": args.connections,
        "rate": args.rate,
        "duration_s": load_s,
        "descriptor_limit": limit,
        "baseline": baseline,
        "after": end,
        "plateau_rss_mib": plateau,
        "host": host,
        "proxies": PROXIES.iter().enumerate().map(|(i, (name, _, _))| (name.to_string(), c[i])).collect::<BTreeMap<_, _>>(),
        "api_calls": calls,
        "drains_at_s": drains,
        "checks": checks,
        "samples": samples,
    });
    let json_path = args.report_dir.join("soak.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&report)? + "\n")?;
    let html_path = args.report_dir.join("index.html");
    std::fs::write(&html_path, page::html(&samples, &drains, &checks, &report))?;

    say!();
    let width = checks.iter().map(|c| c.what.len()).max().unwrap_or(0);
    for c in &checks {
        say!(
            "{}  {:width$}  {}",
            if c.passed { "PASS" } else { "FAIL" },
            c.what,
            c.detail
        );
    }
    say!(
        "figures: {}  chart: {}",
        json_path.display(),
        html_path.display()
    );
    let failed = checks.iter().filter(|c| !c.passed).count();
    if failed > 0 {
        bail!("{failed} of {} soak checks failed", checks.len());
    }
    Ok(())
}

/// Samples `target` and the tallies once a second (or as fast as a sample allows)
/// until `duration` from `started` has passed, printing a row each time; `true`
/// with the samples if `shutdown` cut it short.
async fn observe(
    target: &Target,
    tallies: &[Tally; 4],
    started: Instant,
    duration: Duration,
    shutdown: &Shutdown,
) -> (Vec<Sample>, bool) {
    let mut samples = Vec::new();
    let mut last_ok = 0;
    let mut interrupted = false;
    // The load runs for its duration on the clock: a sample a second while a sample
    // takes less (on a busy machine reading the API under load can take longer, and
    // the soak must not stretch with it).
    let mut second = 0;
    while started.elapsed() < duration {
        second = (started.elapsed().as_secs() + 1).max(second + 1);
        let next = (started + Duration::from_secs(second)).min(started + duration);
        tokio::select! {
            _ = shutdown.wait() => { interrupted = true; break }
            _ = tokio::time::sleep_until(next) => {}
        }
        let Ok(mut sample) = target.sample().await else {
            break; // the checks below say what happened to it
        };
        let ok: u64 = tallies.iter().map(|t| Tally::get(&t.ok)).sum();
        sample.t = started.elapsed().as_secs_f64();
        sample.ok_per_s = ok - last_ok;
        last_ok = ok;
        let verified: u64 = tallies.iter().map(|t| Tally::get(&t.verified)).sum();
        let ended: u64 = tallies.iter().map(|t| Tally::get(&t.ended)).sum();
        let failed: u64 = tallies
            .iter()
            .map(|t| Tally::get(&t.failed) + Tally::get(&t.corrupted))
            .sum();
        say!(
            "{:>5.0}  {:>11}  {:>8.1}  {:>7}  {:>7}  {:>8}  {:>12.1}  {:>7}  {:>6}",
            sample.t,
            sample.connections,
            sample.rss_mib,
            sample.fds,
            sample.tasks,
            sample.ok_per_s,
            verified as f64 / (1 << 20) as f64,
            ended,
            failed
        );
        samples.push(sample);
    }
    (samples, interrupted)
}

/// snag's idle connections to the HTTP backend: hyper's pool keeps them for 90 s,
/// and they are not a leak.
fn pooled_upstreams(http_backend: SocketAddr) -> u64 {
    crate::ports::sockets()
        .map(|sockets| {
            sockets
                .iter()
                .filter(|s| s.state == "ESTABLISHED" && s.remote == http_backend)
                .count() as u64
        })
        .unwrap_or(0)
}

/// Every second, one change per proxy through the API: a fault added, changed or
/// removed, at most three on each at a time.
async fn churn(
    api: Api,
    seed: u64,
    calls: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Shutdown,
) {
    let mut rng = crate::seed::rng(seed, &[b"soak churn"]);
    let mut on: [Vec<(String, &'static str)>; 4] = Default::default();
    let mut next = 0u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.wait() => return,
            _ = tick.tick() => {}
        }
        for (i, (proxy, _, _)) in PROXIES.iter().enumerate() {
            let faults = &mut on[i];
            let roll: f64 = rng.random();
            let (method, path, body) = if faults.is_empty() || (roll < 0.5 && faults.len() < 3) {
                next += 1;
                let name = format!("f{next}");
                let (kind, attributes, toxicity) = fault_for(i, &mut rng);
                let stream = if rng.random_bool(0.5) {
                    "upstream"
                } else {
                    "downstream"
                };
                faults.push((name.clone(), kind));
                let body = serde_json::json!({ "name": name, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes });
                ("POST", format!("/proxies/{proxy}/toxics"), body.to_string())
            } else if roll < 0.75 {
                let (name, kind) = faults[rng.random_range(0..faults.len())].clone();
                let (attributes, toxicity) = loop {
                    let (k, a, t) = fault_for(i, &mut rng);
                    if k == kind {
                        break (a, t);
                    }
                };
                let body = serde_json::json!({ "toxicity": toxicity, "attributes": attributes });
                (
                    "POST",
                    format!("/proxies/{proxy}/toxics/{name}"),
                    body.to_string(),
                )
            } else {
                let (name, _) = faults.remove(rng.random_range(0..faults.len()));
                (
                    "DELETE",
                    format!("/proxies/{proxy}/toxics/{name}"),
                    String::new(),
                )
            };
            calls.fetch_add(1, Ordering::Relaxed);
            if let Err(err) = api.expect_2xx(method, &path, &body).await
                && let Ok(mut e) = errors.lock()
            {
                e.push(err);
            }
        }
    }
}

/// A fault for proxy `i`: its type, attributes and toxicity.
fn fault_for(i: usize, rng: &mut impl rand::Rng) -> (&'static str, serde_json::Value, f64) {
    use serde_json::json;
    let pick = rng.random_range(0..4u32);
    match (PROXIES[i].0, pick) {
        ("tcp-clean", 0) => (
            "latency",
            json!({ "latency": rng.random_range(0..20), "jitter": rng.random_range(0..5) }),
            1.0,
        ),
        ("tcp-clean", 1) => (
            "slicer",
            json!({ "average_size": rng.random_range(200..2000), "size_variation": 100, "delay": rng.random_range(0..2) }),
            1.0,
        ),
        ("tcp-clean", 2) => (
            "bandwidth",
            json!({ "rate": rng.random_range(1000..50_000) }),
            1.0,
        ),
        ("tcp-clean", _) => (
            "loss",
            json!({ "probability": 0.05, "rto": rng.random_range(1..20) }),
            1.0,
        ),
        ("tcp-chaos", 0) => (
            "reset_peer",
            json!({ "timeout": rng.random_range(0..500) }),
            0.05,
        ),
        ("tcp-chaos", 1) => (
            "limit_data",
            json!({ "bytes": rng.random_range(1000..100_000) }),
            0.2,
        ),
        ("tcp-chaos", 2) => (
            "timeout",
            json!({ "timeout": rng.random_range(100..2000) }),
            0.05,
        ),
        ("tcp-chaos", _) => (
            "slow_close",
            json!({ "delay": rng.random_range(10..100) }),
            1.0,
        ),
        ("http-clean", _) => (
            "http_delay",
            json!({ "delay": rng.random_range(0..20) }),
            1.0,
        ),
        (_, 0) => ("http_status", json!({ "status": 503 }), 0.1),
        (_, 1) => ("bad_body", json!({ "mode": "garbage" }), 0.1),
        (_, 2) => (
            "reset_mid_response",
            json!({ "bytes": rng.random_range(0..100) }),
            0.1,
        ),
        (_, _) => (
            "drop_request",
            json!({ "timeout": rng.random_range(10..500) }),
            0.1,
        ),
    }
}

/// A drain of `http-clean` (graceful) and `tcp-chaos` (2 s deadline) at half of
/// `every`, then each `every`; each ended after [`DRAIN_FOR`].
async fn drain_every(
    api: Api,
    every: Duration,
    started: Instant,
    at: Arc<Mutex<Vec<f64>>>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Shutdown,
) {
    let drains = [
        ("http-clean", r#"{"mode":"graceful"}"#),
        ("tcp-chaos", r#"{"mode":"deadline","timeout":2000}"#),
    ];
    let mut next = started + every / 2;
    loop {
        tokio::select! {
            _ = stop.wait() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        if let Ok(mut a) = at.lock() {
            a.push(started.elapsed().as_secs_f64());
        }
        for (proxy, body) in drains {
            let path = format!("/proxies/{proxy}/drain");
            if let Err(e) = api.expect_2xx("POST", &path, body).await
                && let Ok(mut errs) = errors.lock()
            {
                errs.push(e);
            }
        }
        tokio::select! {
            _ = stop.wait() => {}
            _ = tokio::time::sleep(DRAIN_FOR) => {}
        }
        for (proxy, _) in drains {
            let path = format!("/proxies/{proxy}/drain");
            if let Err(e) = api.expect_2xx("DELETE", &path, "").await
                && let Ok(mut errs) = errors.lock()
            {
                errs.push(e);
            }
        }
        next += every;
    }
}
