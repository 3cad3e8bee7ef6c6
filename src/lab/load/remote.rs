//! A shard of a run sent to a generator elsewhere: the plan as JSON, the generator's
//! side (wait for the start, run, answer its result), and the sender's.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use bytes::Bytes;
use hyper::{
    Method,
    header::{HeaderName, HeaderValue},
};
use serde::{Deserialize, Serialize};

use super::{Arrivals, Plan, Sessions, Shape, Shard, ShardResult, Target};
use crate::shutdown::Shutdown;

/// What a generator elsewhere is asked to run: the whole plan, its shard of it, and
/// the wall-clock instant the shards begin together.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardRequest {
    /// The plan, whole.
    pub plan: PlanWire,
    /// This generator's share.
    pub shard: Shard,
    /// When every shard begins, ms since the Unix epoch.
    pub start_at_ms: u64,
    /// What the result calls this host; `None`: its own name.
    #[serde(default)]
    pub host: Option<String>,
    /// A name the sender gives this run, to ask how far it has got
    /// (`GET /load/RUN`); `None`: not asked.
    #[serde(default)]
    pub run: Option<String>,
}

/// How far a shard's run has got: its seconds so far, and its counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Seconds of traffic and watch over.
    pub second: usize,
    /// Requests sent.
    pub sent: u64,
    /// Answered well.
    pub ok: u64,
    /// Failed.
    pub errors: u64,
}

/// A generator's side of the API: the shards it runs for cases elsewhere, and
/// how far each named one has got.
pub struct Generator {
    shutdown: Shutdown,
    runs: Arc<Mutex<BTreeMap<String, Progress>>>,
}

impl Generator {
    /// Runs stop with `shutdown`.
    pub fn new(shutdown: Shutdown) -> Generator {
        Generator {
            shutdown,
            runs: Arc::default(),
        }
    }

    /// Runs `request`'s shard from its start instant, as `snag load --shard
    /// --start-at --result` would, and answers its result; its progress is told
    /// by [`Generator::progress`] while it runs.
    pub async fn serve(&self, request: ShardRequest) -> Result<ShardResult, String> {
        let host = request.host.clone().unwrap_or_else(host_name);
        let plan = Plan::try_from(request.plan)?.sharded(request.shard)?;
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(request.start_at_ms);
        let _told = request.run.clone().map(|run| Told::new(&self.runs, run));
        wait_until(at, &self.shutdown).await?;
        let started_at_ms = unix_ms(SystemTime::now());
        let (runs, run) = (self.runs.clone(), request.run);
        let finished = super::run(plan, self.shutdown.clone(), |row| {
            let Some(run) = &run else { return };
            let mut runs = runs.lock().expect("no panic holds it");
            if let Some(p) = runs.get_mut(run) {
                p.second = row.second + 1;
                p.sent += row.sent;
                p.ok += row.ok;
                p.errors += row.errors.values().sum::<u64>();
            }
        })
        .await;
        Ok(finished.result(&host, started_at_ms))
    }

    /// How far the run named `run` has got; `None` when no such run is on.
    pub fn progress(&self, run: &str) -> Option<Progress> {
        self.runs
            .lock()
            .expect("no panic holds it")
            .get(run)
            .cloned()
    }
}

/// A run's entry among those whose progress is told, for as long as it runs.
struct Told {
    runs: Arc<Mutex<BTreeMap<String, Progress>>>,
    run: String,
}

impl Told {
    fn new(runs: &Arc<Mutex<BTreeMap<String, Progress>>>, run: String) -> Told {
        let mut all = runs.lock().expect("no panic holds it");
        all.insert(run.clone(), Progress::default());
        Told {
            runs: runs.clone(),
            run,
        }
    }
}

impl Drop for Told {
    fn drop(&mut self) {
        if let Ok(mut runs) = self.runs.lock() {
            runs.remove(&self.run);
        }
    }
}

/// A [`Plan`] as JSON. TLS to the target is left out: a client configuration
/// made here (its CA) does not travel.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanWire {
    addr: SocketAddr,
    host: String,
    path: String,
    method: String,
    headers: Vec<(String, String)>,
    /// The body as UTF-8 when it is, else lossily: the cases send text.
    body: String,
    arrivals: ArrivalsWire,
    duration_ms: u64,
    requests: Option<u64>,
    sessions: Option<SessionsWire>,
    deadline_ms: Option<u64>,
    retries: u32,
    retry_delay_ms: u64,
    txn_header: Option<String>,
    new_connection: bool,
    http2: bool,
    grpc: bool,
    expect_body: Option<String>,
    stats_url: Option<(SocketAddr, String, String)>,
    watch_ms: u64,
    max_inflight: u64,
    seed: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "loop", rename_all = "snake_case", deny_unknown_fields)]
enum ArrivalsWire {
    Closed {
        connections: usize,
    },
    Open {
        rate: f64,
        /// `[peak, from_ms, to_ms]` for a step; `[low, high, from_ms, to_ms]` for a ramp.
        step: Option<(f64, u64, u64)>,
        ramp: Option<(f64, f64, u64, u64)>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionsWire {
    count: u64,
    per_session: Option<u64>,
    header: String,
    cookie: Option<String>,
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl TryFrom<&Plan> for PlanWire {
    type Error = String;

    fn try_from(plan: &Plan) -> Result<PlanWire, String> {
        if plan.tls.is_some() || plan.target.tls {
            return Err("a run over TLS cannot be sent to a generator elsewhere: its client configuration (the run's CA) is made here".into());
        }
        let arrivals = match &plan.arrivals {
            Arrivals::Closed { connections } => ArrivalsWire::Closed {
                connections: *connections,
            },
            Arrivals::Open { rate, shape } => ArrivalsWire::Open {
                rate: *rate,
                step: match shape {
                    Some(Shape::Step { peak, from, to }) => Some((*peak, ms(*from), ms(*to))),
                    _ => None,
                },
                ramp: match shape {
                    Some(Shape::Ramp {
                        low,
                        high,
                        from,
                        to,
                    }) => Some((*low, *high, ms(*from), ms(*to))),
                    _ => None,
                },
            },
        };
        let text = |v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
        Ok(PlanWire {
            addr: plan.target.addr,
            host: plan.target.host.clone(),
            path: plan.target.path.clone(),
            method: plan.method.to_string(),
            headers: plan
                .headers
                .iter()
                .map(|(n, v)| (n.to_string(), text(v)))
                .collect(),
            body: String::from_utf8_lossy(&plan.body).into_owned(),
            arrivals,
            duration_ms: ms(plan.duration),
            requests: plan.requests,
            sessions: plan.sessions.as_ref().map(|s| SessionsWire {
                count: s.count,
                per_session: s.per_session,
                header: s.header.to_string(),
                cookie: s.cookie.clone(),
            }),
            deadline_ms: plan.deadline.map(ms),
            retries: plan.retries,
            retry_delay_ms: ms(plan.retry_delay),
            txn_header: plan.txn_header.as_ref().map(|h| h.to_string()),
            new_connection: plan.new_connection,
            http2: plan.http2,
            grpc: plan.grpc,
            expect_body: plan.expect_body.clone(),
            stats_url: plan
                .stats_url
                .as_ref()
                .map(|t| (t.addr, t.host.clone(), t.path.clone())),
            watch_ms: ms(plan.watch),
            max_inflight: plan.max_inflight,
            seed: plan.seed,
        })
    }
}

impl TryFrom<PlanWire> for Plan {
    type Error = String;

    fn try_from(w: PlanWire) -> Result<Plan, String> {
        let header = |name: &str| {
            HeaderName::try_from(name).map_err(|_| format!("header name {name:?} is not valid"))
        };
        let d = Duration::from_millis;
        let mut plan = Plan::new(Target {
            addr: w.addr,
            tls: false,
            host: w.host,
            path: w.path,
        });
        plan.method = Method::from_bytes(w.method.as_bytes())
            .map_err(|_| format!("method {:?} is not valid", w.method))?;
        for (name, value) in w.headers {
            let value = HeaderValue::try_from(value.as_str())
                .map_err(|_| format!("header {name}: value {value:?} is not valid"))?;
            plan.headers.push((header(&name)?, value));
        }
        plan.body = Bytes::from(w.body);
        plan.arrivals = match w.arrivals {
            ArrivalsWire::Closed { connections } if connections > 0 => {
                Arrivals::Closed { connections }
            }
            ArrivalsWire::Closed { .. } => return Err("a closed loop needs connections".into()),
            ArrivalsWire::Open { rate, step, ramp } => {
                if !(rate.is_finite() && rate > 0.0) {
                    return Err(format!("rate {rate} is not a positive number"));
                }
                let shape = match (step, ramp) {
                    (Some((peak, from, to)), None) => Some(Shape::Step {
                        peak,
                        from: d(from),
                        to: d(to),
                    }),
                    (None, Some((low, high, from, to))) => Some(Shape::Ramp {
                        low,
                        high,
                        from: d(from),
                        to: d(to),
                    }),
                    (None, None) => None,
                    _ => return Err("a step and a ramp both: one shape at most".into()),
                };
                Arrivals::Open { rate, shape }
            }
        };
        plan.duration = d(w.duration_ms);
        plan.requests = w.requests;
        plan.sessions = match w.sessions {
            Some(s) => Some(Sessions {
                count: s.count,
                per_session: s.per_session,
                header: header(&s.header)?,
                cookie: s.cookie.as_deref().map(super::cookie_name).transpose()?,
            }),
            None => None,
        };
        plan.deadline = w.deadline_ms.map(d);
        plan.retries = w.retries;
        plan.retry_delay = d(w.retry_delay_ms);
        plan.txn_header = w.txn_header.as_deref().map(header).transpose()?;
        plan.new_connection = w.new_connection;
        plan.http2 = w.http2;
        plan.grpc = w.grpc;
        plan.expect_body = w.expect_body;
        plan.stats_url = w.stats_url.map(|(addr, host, path)| Target {
            addr,
            tls: false,
            host,
            path,
        });
        plan.watch = d(w.watch_ms);
        plan.max_inflight = w.max_inflight;
        plan.seed = w.seed;
        Ok(plan)
    }
}

/// This machine's name (a pod's, in Kubernetes).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Milliseconds since the Unix epoch of `at`.
pub fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Waits for the wall clock to reach `at`; one already past by more than a second is
/// an error (shards meant to start together would not).
pub async fn wait_until(at: SystemTime, shutdown: &Shutdown) -> Result<(), String> {
    match at.duration_since(SystemTime::now()) {
        Ok(wait) => tokio::select! {
            _ = tokio::time::sleep(wait) => Ok(()),
            _ = shutdown.wait() => Err("stopped before the start".into()),
        },
        Err(late) if late.duration() <= Duration::from_secs(1) => Ok(()),
        Err(late) => Err(format!(
            "the start was {:.1} s ago: the other shards began without this one",
            late.duration().as_secs_f64()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(plan: &Plan) -> Plan {
        let wire = PlanWire::try_from(plan).unwrap();
        let json = serde_json::to_string(&ShardRequest {
            plan: wire,
            shard: Shard::WHOLE,
            start_at_ms: 0,
            host: None,
            run: None,
        })
        .unwrap();
        let back: ShardRequest = serde_json::from_str(&json).unwrap();
        Plan::try_from(back.plan).unwrap()
    }

    #[test]
    fn a_plan_crosses_as_json_unchanged() {
        let mut plan = Plan::new(Target {
            addr: "10.0.0.1:8080".parse().unwrap(),
            tls: false,
            host: "svc".into(),
            path: "/api".into(),
        });
        plan.method = Method::POST;
        plan.headers = vec![("x-a".parse().unwrap(), "1".parse().unwrap())];
        plan.body = Bytes::from_static(b"{\"amount\":1}");
        plan.arrivals = Arrivals::Open {
            rate: 100.0,
            shape: Some(Shape::Ramp {
                low: 100.0,
                high: 900.0,
                from: Duration::from_secs(2),
                to: Duration::from_millis(3500),
            }),
        };
        plan.duration = Duration::from_secs(6);
        plan.requests = Some(40);
        plan.sessions = Some(Sessions {
            count: 4,
            per_session: Some(3),
            header: "x-session".parse().unwrap(),
            cookie: Some("sid".into()),
        });
        plan.deadline = Some(Duration::from_secs(1));
        plan.retries = 1;
        plan.txn_header = Some("x-request-id".parse().unwrap());
        plan.new_connection = true;
        plan.expect_body = Some("ok".into());
        plan.stats_url = Some(Target {
            addr: "10.0.0.2:9000".parse().unwrap(),
            tls: false,
            host: "b".into(),
            path: "/stats".into(),
        });
        plan.watch = Duration::from_secs(9);
        plan.seed = 7;
        let back = round_trip(&plan);
        assert_eq!(format!("{back:?}"), format!("{plan:?}"));
        plan.arrivals = Arrivals::Closed { connections: 12 };
        plan.http2 = true;
        let back = round_trip(&plan);
        assert_eq!(format!("{back:?}"), format!("{plan:?}"));
    }

    #[test]
    fn what_cannot_cross_says_why() {
        let mut plan = Plan::new(Target {
            addr: "10.0.0.1:443".parse().unwrap(),
            tls: true,
            host: "svc".into(),
            path: "/".into(),
        });
        let err = PlanWire::try_from(&plan).unwrap_err();
        assert!(err.contains("over TLS"), "{err}");
        plan.target.tls = false;
        let mut wire = serde_json::to_value(PlanWire::try_from(&plan).unwrap()).unwrap();
        wire["arrivals"] =
            serde_json::json!({ "loop": "open", "rate": -1.0, "step": null, "ramp": null });
        let wire: PlanWire = serde_json::from_value(wire).unwrap();
        assert_eq!(
            Plan::try_from(wire).unwrap_err(),
            "rate -1 is not a positive number"
        );
    }
}
