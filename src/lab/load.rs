//! `snag load`: a load generator that tells its own failures from the service's.
//!
//! A run composes three independent choices (STYLE: no copy of the loop per mode):
//! - arrivals: closed loop (N connections, each sends when its last answer is in,
//!   like wrk) or open loop (a rate over time, each request sent at its intended
//!   instant whether or not earlier ones have been answered, like seeds/002);
//! - a stop condition: the traffic window, and optionally a request count;
//! - sessions: requests carry one of N session keys (header or cookie).
//!
//! Latency is measured from the intended send time, so a slow service cannot hide
//! behind a generator that waited for it (coordinated omission). Errors are
//! classified by kind; a failure that belongs to the generator (ephemeral ports
//! exhausted, too many requests in flight) is counted apart, never as the service's.

mod merge;
mod plan;
pub mod remote;
mod report;
mod request;
mod shard;
mod tally;

use std::{
    io,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{
    Request,
    client::conn::http1::SendRequest,
    header::{self, HeaderName},
};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpStream, sync::Notify, time::Instant};

use self::tally::{Outcome, Tally};
pub use self::{
    merge::{FORMAT, ShardResult, merge},
    plan::{Arrivals, Plan, Sessions, Shape, Target, cookie_name},
    report::{Host, Kind, Lag, Report, Row},
    shard::Shard,
};
use crate::shutdown::Shutdown;

/// One connection to the target.
enum Conn {
    H1(SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Conn {
    fn is_closed(&self) -> bool {
        match self {
            Conn::H1(c) => c.is_closed(),
            Conn::H2(c) => c.is_closed(),
        }
    }

    async fn send(
        &mut self,
        request: Request<Full<Bytes>>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, hyper::Error> {
        match self {
            Conn::H1(c) => {
                c.ready().await?;
                c.send_request(request).await
            }
            Conn::H2(c) => {
                c.ready().await?;
                c.send_request(request).await
            }
        }
    }
}

/// What every request task shares.
struct Run {
    plan: Plan,
    template: request::Template,
    start: Instant,
    tally: Mutex<Tally>,
    pool: Mutex<Vec<Conn>>,
    inflight: AtomicU64,
    /// Told when the last transaction in flight finishes.
    idle: Notify,
    issued: AtomicU64,
    stop: AtomicBool,
}

impl Run {
    fn second(&self, at: Instant) -> usize {
        (at.saturating_duration_since(self.start).as_secs()) as usize
    }

    fn tally(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().expect("no code panics holding the tally")
    }

    /// Takes the next transaction number (run-wide, when shards share the run), or
    /// `None` once the plan's count is reached.
    fn next(&self) -> Option<u64> {
        let seq = self.issued.fetch_add(1, Relaxed);
        match self.plan.total() {
            Some(total) if seq >= total => None,
            _ => Some(self.plan.shard.global(seq)),
        }
    }
}

/// A run that ended: its report, and its counts as a shard writes them.
pub struct Finished {
    /// What it measured.
    pub report: Report,
    tally: tally::Saved,
    traffic: Duration,
    shard: Shard,
}

impl Finished {
    /// What a shard writes for the merge: `host` names where it ran, and its traffic
    /// began at `started_at_ms` (since the Unix epoch).
    pub fn result(&self, host: &str, started_at_ms: u64) -> ShardResult {
        ShardResult {
            format: FORMAT.to_string(),
            host: host.to_string(),
            shard: self.shard,
            started_at_ms,
            target: self.report.target.clone(),
            open: self.report.mode == "open",
            elapsed_s: self.report.elapsed_s,
            traffic_s: self.traffic.as_secs_f64(),
            unfinished: self.report.unfinished,
            ports: self.report.ports.clone(),
            sockets: crate::ports::socket_table(),
            tally: self.tally.clone(),
        }
    }
}

/// Runs `plan` until its traffic and watch windows are over or `shutdown`; `row` is
/// called once a second with the second that just ended.
pub async fn run(plan: Plan, shutdown: Shutdown, mut row: impl FnMut(&Row)) -> Finished {
    let ports_before = tally::ports(plan.target.addr);
    let run = Arc::new(Run {
        tally: Mutex::new(Tally::new(&plan)),
        start: Instant::now(),
        pool: Mutex::new(Vec::new()),
        inflight: AtomicU64::new(0),
        idle: Notify::new(),
        issued: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        template: request::Template::new(&plan),
        plan,
    });
    let mut traffic = tokio::spawn(arrivals(run.clone()));
    let mut ticks =
        tokio::time::interval_at(run.start + Duration::from_secs(1), Duration::from_secs(1));
    let mut stats = plan::StatsPoller::new(run.plan.stats_url.clone());
    let mut traffic_end: Option<Duration> = None;
    let mut shown = 0;
    loop {
        tokio::select! {
            _ = shutdown.wait() => break,
            _ = ticks.tick() => {
                let second = run.second(Instant::now()).saturating_sub(1);
                let depth = stats.depth().await;
                let ports = tally::ports(run.plan.target.addr);
                run.tally().observe(second, depth, ports.as_ref());
                for s in shown..=second {
                    row(&run.tally().row(s));
                }
                shown = second + 1;
            }
            _ = &mut traffic, if traffic_end.is_none() => {
                traffic_end = Some(run.start.elapsed());
            }
            _ = run.idle.notified(), if traffic_end.is_some() => {}
        }
        let Some(end) = traffic_end else { continue };
        let elapsed = run.start.elapsed();
        if run.inflight.load(Relaxed) == 0 && elapsed >= run.plan.watch {
            break;
        }
        if elapsed >= run.plan.watch.max(end) + run.plan.grace() {
            break; // requests still in flight past every deadline: the report says so
        }
    }
    run.stop.store(true, Relaxed);
    traffic.abort();
    let ports_after = tally::ports(run.plan.target.addr);
    let last = run.tally().seconds();
    for s in shown..last {
        row(&run.tally().row(s));
    }
    let elapsed = run.start.elapsed();
    let traffic = traffic_end.unwrap_or(elapsed);
    let inflight = run.inflight.load(Relaxed);
    let tally = run.tally();
    let plan = &run.plan;
    let report = tally.report(
        &format!("http://{}{}", plan.target.host, plan.target.path),
        matches!(plan.arrivals, Arrivals::Open { .. }),
        elapsed,
        traffic,
        inflight,
        ports_before.zip(ports_after),
    );
    Finished {
        report,
        tally: tally.save(),
        traffic,
        shard: plan.shard,
    }
}

/// Sends the plan's traffic; returns when its window or count is over.
async fn arrivals(run: Arc<Run>) {
    match run.plan.arrivals.clone() {
        Arrivals::Closed { connections } => {
            // With sessions, worker i is session i (of those this shard owns).
            let workers: Vec<u64> = match &run.plan.sessions {
                Some(sessions) => (0..sessions.count)
                    .filter(|s| run.plan.shard.owns(*s))
                    .collect(),
                None => (0..connections as u64).collect(),
            };
            let workers: Vec<_> = workers
                .into_iter()
                .map(|worker| {
                    let run = run.clone();
                    tokio::spawn(async move {
                        let mut slot = None;
                        let session = run.plan.sessions.as_ref().map(|_| worker);
                        let quota = run.plan.sessions.as_ref().and_then(|s| s.per_session);
                        let mut sent = 0;
                        while !run.stop.load(Relaxed)
                            && run.start.elapsed() < run.plan.duration
                            && quota.is_none_or(|q| sent < q)
                        {
                            let Some(seq) = run.next() else { break };
                            run.inflight.fetch_add(1, Relaxed);
                            transaction(&run, &mut slot, Instant::now(), seq, session).await;
                            sent += 1;
                        }
                    })
                })
                .collect();
            for worker in workers {
                let _ = worker.await;
            }
        }
        Arrivals::Open { .. } => {
            // Every millisecond, issue the requests whose intended instants passed:
            // the k-th is due when the offered count (the rate's integral) reaches k.
            let mut ticks = tokio::time::interval(Duration::from_millis(1));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let (mut t0, mut owed0) = (Duration::ZERO, 0.0);
            let mut issued = 0u64;
            loop {
                ticks.tick().await;
                let t1 = run.start.elapsed().min(run.plan.duration);
                let owed1 = owed0 + run.plan.offered(t0, t1);
                // The epsilon keeps float sums from dropping the last request of a window.
                while (issued as f64) + 1.0 <= owed1 + 1e-6 {
                    let k = (issued + 1) as f64;
                    let frac = if owed1 > owed0 {
                        ((k - owed0) / (owed1 - owed0)).clamp(0.0, 1.0)
                    } else {
                        1.0
                    };
                    let intended = run.start + t0 + (t1 - t0).mul_f64(frac);
                    issued += 1;
                    let Some(seq) = run.next() else { return };
                    open_request(&run, intended, seq);
                }
                (t0, owed0) = (t1, owed1);
                if t1 >= run.plan.duration || run.stop.load(Relaxed) {
                    return;
                }
            }
        }
    }
}

/// One open-loop request on a pooled connection, in its own task.
fn open_request(run: &Arc<Run>, intended: Instant, seq: u64) {
    if run.inflight.load(Relaxed) >= run.plan.max_inflight {
        let mut tally = run.tally();
        let s = run.second(intended);
        tally.sent(s, false);
        tally.outcome(s, intended, Outcome::failed(Kind::Overload), None);
        return;
    }
    // Counted before the task runs: the last request of a window is otherwise not
    // yet in flight when the traffic task ends, and the run would end without it.
    run.inflight.fetch_add(1, Relaxed);
    let run = run.clone();
    tokio::spawn(async move {
        let mut slot = run
            .pool
            .lock()
            .expect("no code panics holding the pool")
            .pop();
        let session = run.plan.session_of(seq);
        transaction(&run, &mut slot, intended, seq, session).await;
        if let Some(conn) = slot {
            run.pool
                .lock()
                .expect("no code panics holding the pool")
                .push(conn);
        }
    });
}

/// One transaction: the request and its retries, recorded. The caller has counted
/// it in flight; it counts itself out.
async fn transaction(
    run: &Run,
    slot: &mut Option<Conn>,
    intended: Instant,
    seq: u64,
    session: Option<u64>,
) {
    let plan = &run.plan;
    let mut attempt = 0;
    loop {
        let started = Instant::now();
        {
            let mut tally = run.tally();
            tally.sent(run.second(started), attempt > 0);
            if attempt == 0 {
                tally.left(intended, started);
            }
        }
        let exchange = exchange(run, slot, seq, session);
        let outcome = match plan.deadline {
            Some(deadline) => match tokio::time::timeout(deadline, exchange).await {
                Ok(outcome) => outcome,
                Err(_) => {
                    *slot = None; // abandoned mid-request: the connection cannot be reused
                    Outcome::failed(Kind::Timeout)
                }
            },
            None => exchange.await,
        };
        let retry = outcome.retryable() && attempt < plan.retries && !run.stop.load(Relaxed);
        run.tally()
            .outcome(run.second(Instant::now()), intended, outcome, session);
        if !retry {
            break;
        }
        attempt += 1;
        tokio::time::sleep(plan.retry_delay).await;
    }
    if plan.new_connection {
        *slot = None;
    }
    if run.inflight.fetch_sub(1, Relaxed) == 1 {
        run.idle.notify_one();
    }
}

/// Sends one request on `slot` (dialling when empty) and reads the whole answer.
async fn exchange(run: &Run, slot: &mut Option<Conn>, seq: u64, session: Option<u64>) -> Outcome {
    let plan = &run.plan;
    if slot.as_ref().is_none_or(|c| c.is_closed()) {
        match dial(plan).await {
            Ok(conn) => *slot = Some(conn),
            Err(kind) => return Outcome::failed(kind),
        }
    }
    let conn = slot.as_mut().expect("dialled above");
    let response = match conn.send(run.template.request(plan, seq, session)).await {
        Ok(response) => response,
        Err(err) => {
            *slot = None;
            return Outcome::failed(Kind::of_hyper(&err));
        }
    };
    let status = response.status();
    // Names made once: looked up by a string, each name is parsed again.
    static X_BACKEND: HeaderName = HeaderName::from_static("x-backend");
    static X_INSTANCE: HeaderName = HeaderName::from_static("x-instance");
    static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
    let name = |h: &HeaderName| {
        response
            .headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (backend, instance) = (name(&X_BACKEND), name(&X_INSTANCE));
    // A trailers-only gRPC answer carries its status in the head.
    let head_status = name(&GRPC_STATUS);
    let closing = response
        .headers()
        .get(header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let (body, grpc_status) = match response.into_body().collect().await {
        Ok(body) => {
            let from_trailers = body
                .trailers()
                .and_then(|t| t.get(&GRPC_STATUS)?.to_str().ok().map(str::to_owned));
            (body.to_bytes(), from_trailers.or(head_status))
        }
        Err(err) => {
            *slot = None;
            let kind = match Kind::of_hyper(&err) {
                Kind::Reset => Kind::Reset,
                _ => Kind::Body,
            };
            return Outcome::failed(kind).named(backend, instance);
        }
    };
    if closing {
        *slot = None;
    }
    let kind = if !status.is_success() {
        Some(Kind::Status(status.as_u16()))
    } else if plan.grpc {
        // No status at all is INTERNAL, as gRPC's own clients take it.
        match grpc_status.and_then(|c| c.parse::<u8>().ok()).unwrap_or(13) {
            0 => None,
            code => Some(Kind::Grpc(code)),
        }
    } else if plan
        .expect_body
        .as_ref()
        .is_some_and(|text| !memchr_contains(&body, text.as_bytes()))
    {
        Some(Kind::BadBody)
    } else {
        None
    };
    Outcome {
        error: kind,
        backend,
        instance,
    }
}

fn memchr_contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// A new connection to the plan's target: TCP, TLS for `https://` (its ALPN must
/// agree to what the plan speaks), then HTTP/1.1 or HTTP/2.
async fn dial(plan: &Plan) -> Result<Conn, Kind> {
    let stream = TcpStream::connect(plan.target.addr)
        .await
        .map_err(|e| Kind::of_io(&e))?;
    let _ = stream.set_nodelay(true);
    let Some(config) = plan.tls.clone().filter(|_| plan.target.tls) else {
        return handshake(TokioIo::new(stream), plan.http2).await;
    };
    let name = crate::tls::server_name(None, &plan.target.host).map_err(|_| Kind::Tls)?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await
        .map_err(|e| match e.kind() {
            // rustls says InvalidData for what the peer sent: a certificate it
            // cannot trust, no common protocol, not TLS at all.
            io::ErrorKind::InvalidData => Kind::Tls,
            _ => Kind::of_io(&e),
        })?;
    let agreed = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
    if plan.http2 && !agreed {
        // It offered h2 alone: a server that agreed to nothing speaks HTTP/1.1.
        return Err(Kind::Tls);
    }
    handshake(TokioIo::new(tls), plan.http2).await
}

async fn handshake<S>(io: TokioIo<S>, http2: bool) -> Result<Conn, Kind>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if http2 {
        let (sender, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                .await
                .map_err(|e| Kind::of_hyper(&e))?;
        tokio::spawn(conn);
        return Ok(Conn::H2(sender));
    }
    let (sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| Kind::of_hyper(&e))?;
    tokio::spawn(conn);
    Ok(Conn::H1(sender))
}
