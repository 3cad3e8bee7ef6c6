//! `snag load` on the command line: the plan from flags, a row a second, the summary.

use std::{path::PathBuf, time::SystemTime};

use anyhow::Context;
use bytes::Bytes;

use crate::{
    UsageError,
    cli::{LoadArgs, LoadCommand},
    lab::load::{
        self as lab, Arrivals, Kind, Plan, Report, Row, Sessions, Shape, ShardResult, Target,
    },
    shutdown::Shutdown,
};

/// Runs `snag load` until its plan is done or `shutdown`, or merges shards' results.
pub async fn run(args: LoadArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    if let Some(LoadCommand::Merge { results, json }) = args.merge {
        return merge(&results, json);
    }
    let (json, start_at, result) = (args.json, args.start_at, args.result.clone());
    let host = args
        .host_name
        .clone()
        .unwrap_or_else(lab::remote::host_name);
    let plan = plan(args).await?;
    if !json {
        say!("{}", describe(&plan));
    }
    if let Some(at) = start_at {
        wait_until(at, json, &shutdown).await?;
    }
    let started_at_ms = lab::remote::unix_ms(SystemTime::now());
    if !json {
        say!("{}", Row::header());
    }
    let finished = lab::run(plan, shutdown, |row| {
        if !json {
            say!("{}", row.line());
        }
    })
    .await;
    if let Some(path) = result {
        let result = finished.result(&host, started_at_ms);
        std::fs::write(&path, serde_json::to_vec_pretty(&result)?)
            .with_context(|| format!("writing the result to {}", path.display()))?;
    }
    if json {
        say!("{}", serde_json::to_string_pretty(&finished.report)?);
    } else {
        finished.report.print();
    }
    Ok(())
}

/// `snag load merge`: the report of shards' results taken together.
fn merge(paths: &[PathBuf], json: bool) -> anyhow::Result<()> {
    let mut results = Vec::new();
    for path in paths {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let result: ShardResult = serde_json::from_slice(&bytes).map_err(|e| {
            UsageError(format!(
                "{}: not a result of snag load --result ({e})",
                path.display()
            ))
        })?;
        results.push(result);
    }
    let report = lab::merge(results).map_err(UsageError)?;
    if json {
        say!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    say!(
        "snag load merge: {} generators, {} {} loop",
        report.hosts.len(),
        report.target,
        report.mode
    );
    say!("{}", Row::header());
    for row in &report.rows {
        say!("{}", row.line());
    }
    report.print();
    Ok(())
}

/// Waits for the wall clock to reach `at`, saying so; one already past by more
/// than a second is an error (shards meant to start together would not).
async fn wait_until(at: SystemTime, json: bool, shutdown: &Shutdown) -> anyhow::Result<()> {
    if let (Ok(wait), false) = (at.duration_since(SystemTime::now()), json) {
        say!("waiting {:.1} s for --start-at", wait.as_secs_f64());
    }
    lab::remote::wait_until(at, shutdown)
        .await
        .map_err(|why| UsageError(format!("--start-at: {why}")).into())
}

async fn plan(args: LoadArgs) -> anyhow::Result<Plan> {
    let usage = |why: String| anyhow::Error::from(UsageError(why));
    let url = args.url.clone().unwrap_or_default();
    let target = Target::resolve(&url).await.map_err(usage)?;
    if let Some(watch) = args.watch
        && watch < args.duration
    {
        return Err(usage(format!(
            "--watch {watch:?} is shorter than --duration {:?}; it is the whole observation, traffic included",
            args.duration
        )));
    }
    let arrivals = match args.rate {
        Some(rate) if !(rate.is_finite() && rate > 0.0) => {
            return Err(usage(format!("--rate {rate}: must be a number above 0")));
        }
        Some(rate) => {
            if let Some(Shape::Step { to, .. } | Shape::Ramp { to, .. }) = args.shape
                && to > args.duration
            {
                return Err(usage(format!(
                    "--shape ends at {to:?}, after the traffic window (--duration {:?})",
                    args.duration
                )));
            }
            Arrivals::Open {
                rate,
                shape: args.shape,
            }
        }
        None => Arrivals::Closed {
            connections: args.connections as usize,
        },
    };
    let stats_url = match &args.stats_url {
        Some(url) => match Target::resolve(url).await.map_err(usage)? {
            t if t.tls => {
                return Err(usage(format!("--stats-url {url}: polled in clear only")));
            }
            t => Some(t),
        },
        None => None,
    };
    if !target.tls && (args.cacert.is_some() || args.insecure) {
        return Err(usage(format!(
            "--cacert and --insecure are for https:// targets; {url} is in clear"
        )));
    }
    let tls = if target.tls {
        let trust = crate::tls::UpstreamTls {
            ca: args.cacert.clone(),
            insecure: args.insecure,
            sni: None,
        };
        let alpn: &[&[u8]] = if args.http2 || args.grpc {
            &[b"h2"]
        } else {
            &[b"http/1.1"]
        };
        Some(crate::tls::client(&trust, alpn, None).map_err(|e| usage(format!("TLS: {e}")))?)
    } else {
        None
    };
    let seed = args.seed.unwrap_or_else(crate::seed::fresh);
    let mut plan = Plan::new(target);
    plan.method = args.method;
    plan.headers = args.headers;
    plan.body = args.body.map(Bytes::from).unwrap_or_default();
    plan.arrivals = arrivals;
    plan.duration = args.duration;
    plan.requests = args.requests;
    plan.sessions = args.sessions.map(|count| Sessions {
        count,
        per_session: args.per_session,
        header: args.session_header,
        cookie: args.session_cookie,
    });
    plan.deadline = args.deadline;
    plan.retries = args.retries;
    plan.retry_delay = args.retry_delay;
    plan.txn_header = args.txn_header;
    plan.new_connection = args.new_connection;
    plan.http2 = args.http2 || args.grpc;
    plan.grpc = args.grpc;
    plan.tls = tls;
    plan.expect_body = args.expect_body;
    plan.stats_url = stats_url;
    // A count ends the run when it is reached; without one the window does.
    plan.watch = args.watch.unwrap_or(if plan.total().is_some() {
        std::time::Duration::ZERO
    } else {
        args.duration
    });
    plan.max_inflight = args.max_inflight;
    plan.seed = seed;
    match args.shard {
        Some(shard) => plan
            .sharded(shard)
            .map_err(|e| usage(format!("--shard {shard}: {e}"))),
        None => Ok(plan),
    }
}

/// The run in one line, as it starts.
fn describe(plan: &Plan) -> String {
    let arrivals = match &plan.arrivals {
        Arrivals::Closed { connections } => match &plan.sessions {
            Some(s) => format!("closed loop, {} sessions (one connection each)", s.count),
            None => format!("closed loop, {connections} connections"),
        },
        Arrivals::Open { rate, shape } => {
            let shape = match shape {
                Some(Shape::Step { peak, from, to }) => {
                    format!(", {peak}/s from {from:?} to {to:?}")
                }
                Some(Shape::Ramp {
                    low,
                    high,
                    from,
                    to,
                }) => format!(", ramp {low}/s → {high}/s from {from:?} to {to:?}"),
                None => String::new(),
            };
            format!("open loop, {rate}/s{shape}")
        }
    };
    let mut line = format!(
        "snag load: {} http://{}{} for {:?}",
        arrivals, plan.target.host, plan.target.path, plan.duration
    );
    if plan.watch > plan.duration {
        line += &format!(", watching {:?}", plan.watch);
    }
    if let Some(d) = plan.deadline {
        line += &format!(", deadline {d:?}");
    }
    if plan.retries > 0 {
        line += &format!(", {} retries after {:?}", plan.retries, plan.retry_delay);
    }
    if plan.shard.count > 1 {
        line += &format!(", shard {} (its share)", plan.shard);
    }
    line + &format!(" (seed {})", plan.seed)
}

fn count(kinds: &std::collections::BTreeMap<Kind, u64>, pick: impl Fn(Kind) -> bool) -> u64 {
    kinds
        .iter()
        .filter(|(k, _)| pick(**k))
        .map(|(_, n)| n)
        .sum()
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

impl Row {
    /// The table's header.
    pub fn header() -> String {
        format!(
            "{:>4} {:>8} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>5} {:>6} {:>9} {:>8} {:>6} {:>9}",
            "s",
            "offered",
            "sent",
            "ok",
            "timeout",
            "refused",
            "reset",
            "status",
            "other",
            "gen",
            "retry",
            "mean ms",
            "p99 ms",
            "depth",
            "TIME_WAIT"
        )
    }

    /// One line of the table.
    pub fn line(&self) -> String {
        let e = &self.errors;
        format!(
            "{:>4} {:>8} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>5} {:>6} {:>9} {:>8} {:>6} {:>9}",
            self.second,
            opt(self.offered, 0),
            self.sent,
            self.ok,
            count(e, |k| k == Kind::Timeout),
            count(e, |k| k == Kind::Refused),
            count(e, |k| k == Kind::Reset),
            count(e, |k| matches!(k, Kind::Status(_) | Kind::Grpc(_))),
            count(e, |k| matches!(
                k,
                Kind::Closed | Kind::Body | Kind::BadBody | Kind::Tls | Kind::Other
            )),
            count(e, Kind::generator),
            self.retries,
            opt(self.mean_ms, 1),
            opt(self.p99_ms, 1),
            self.depth.map_or("-".into(), |d| d.to_string()),
            self.time_wait.map_or("-".into(), |t| t.to_string()),
        )
    }
}

impl Report {
    /// The end-of-run summary for people.
    pub fn print(&self) {
        say!();
        let offered = self
            .offered
            .map_or(String::new(), |o| format!("offered {o}, "));
        say!(
            "requests   {offered}sent {} (retries {}), ok {}, errors {} ({} service, {} generator), {:.1} ok/s{}",
            self.sent,
            self.retries,
            self.ok,
            self.errors,
            self.service_errors,
            self.generator_errors,
            self.requests_per_s,
            if self.unfinished > 0 {
                format!(", {} still in flight at the end", self.unfinished)
            } else {
                String::new()
            }
        );
        let l = &self.latency_ms;
        say!(
            "latency    p50 {} ms, p90 {} ms, p99 {} ms, p99.9 {} ms, max {} ms (from intended send time)",
            opt(l.p50, 2),
            opt(l.p90, 2),
            opt(l.p99, 2),
            opt(l.p99_9, 2),
            opt(l.max, 2)
        );
        if let Some(lag) = &self.send_lag_ms {
            say!(
                "sent late  p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms behind schedule{}",
                lag.p50,
                lag.p99,
                lag.max,
                if lag.late() {
                    " — the generator fell behind: its host is too busy for timing figures"
                } else {
                    ""
                }
            );
        }
        if !self.errors_by_kind.is_empty() {
            let kinds: Vec<String> = self
                .errors_by_kind
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            say!("errors     {}", kinds.join(", "));
        }
        if self.errors_by_kind.contains_key(&Kind::Ports) {
            say!(
                "           the generator ran out of ephemeral ports (EADDRNOTAVAIL): those failures are the generator's, not the service's"
            );
        }
        if !self.backends.is_empty() {
            say!(
                "{:<10} {:>10} {:>11} {:>8}",
                "backend",
                "x-backend",
                "x-instance",
                "share"
            );
            for b in &self.backends {
                say!(
                    "{:<10} {:>10} {:>11} {:>7.1}%",
                    b.name,
                    b.by_backend,
                    b.by_instance,
                    b.share_percent
                );
            }
        }
        for d in &self.disagreements {
            say!(
                "warning: {} answers said x-backend {} but x-instance {}",
                d.answers,
                d.backend,
                d.instance
            );
        }
        if !self.sessions.is_empty() {
            let spread = self
                .sessions
                .iter()
                .filter(|s| s.backends.len() > 1)
                .count();
            say!(
                "sessions   {} sessions, {} on one backend each{}",
                self.sessions.len(),
                self.sessions.len() - spread,
                if spread > 0 {
                    format!(", {spread} spread over several")
                } else {
                    String::new()
                }
            );
        }
        if !self.hosts.is_empty() {
            self.print_hosts();
            return;
        }
        match &self.ports {
            Some(p) => say!(
                "ports      towards {}: TIME_WAIT {} before, {} after (peak {}); in use peak {} of {} ({} left after)",
                p.dest,
                p.time_wait_before,
                p.time_wait_after,
                p.peak_time_wait,
                p.peak_in_use,
                p.pool,
                p.headroom_after
            ),
            None => say!("ports      could not read sockets on this system"),
        }
    }

    /// Each generator's own counts and port pool, in a merged report.
    fn print_hosts(&self) {
        say!(
            "{:<16} {:>5} {:>9} {:>7} {:>9} {:>7} {:>22} {:>18} {:>10}",
            "host",
            "shard",
            "ok",
            "errors",
            "generator",
            "late ms",
            "TIME_WAIT before/after",
            "ports in use peak",
            "left after"
        );
        for h in &self.hosts {
            let (time_wait, in_use, left) = match &h.ports {
                Some(p) => (
                    format!(
                        "{}/{} (peak {})",
                        p.time_wait_before, p.time_wait_after, p.peak_time_wait
                    ),
                    format!("{} of {}", p.peak_in_use, p.pool),
                    p.headroom_after.to_string(),
                ),
                None => ("-".into(), "-".into(), "-".into()),
            };
            say!(
                "{:<16} {:>5} {:>9} {:>7} {:>9} {:>7} {:>22} {:>18} {:>10}",
                h.host,
                h.shard,
                h.ok,
                h.errors,
                h.generator_errors,
                h.started_after_ms,
                time_wait,
                in_use,
                left
            );
        }
        say!(
            "           (late ms: when each began after the first; ports: each host's own pool towards the target)"
        );
    }
}
