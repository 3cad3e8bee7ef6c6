//! What a load run counted: per-second rows, latency histograms, errors by kind,
//! answers per backend, sessions, and the port pool before, during and after.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use hdrhistogram::Histogram;
use tokio::time::Instant;

use super::{
    plan::{Arrivals, Plan},
    report::{Disagreement, Kind, Lag, Latency, Ports, Report, Row, SessionReport, Share},
};
use crate::ports;

mod saved;
pub use saved::Saved;

/// How one attempt ended.
#[derive(Debug)]
pub(super) struct Outcome {
    pub(super) error: Option<Kind>,
    pub(super) backend: Option<String>,
    pub(super) instance: Option<String>,
}

impl Outcome {
    pub(super) fn failed(kind: Kind) -> Outcome {
        Outcome {
            error: Some(kind),
            backend: None,
            instance: None,
        }
    }

    pub(super) fn named(self, backend: Option<String>, instance: Option<String>) -> Outcome {
        Outcome {
            backend,
            instance,
            ..self
        }
    }

    /// Transport failures and timeouts are retried; an HTTP answer is not.
    pub(super) fn retryable(&self) -> bool {
        self.error.is_some_and(|k| {
            !matches!(
                k,
                Kind::Status(_)
                    | Kind::Grpc(_)
                    | Kind::BadBody
                    | Kind::Overload
                    | Kind::Descriptors
                    | Kind::Tls
            )
        })
    }
}

struct Second {
    sent: u64,
    retries: u64,
    ok: u64,
    errors: BTreeMap<Kind, u64>,
    latency: Histogram<u64>,
    depth: Option<i64>,
    /// Sockets towards the target at the second's end: in TIME_WAIT, and in use.
    time_wait: Option<usize>,
    in_use: Option<usize>,
}

impl Second {
    fn new() -> Second {
        Second {
            sent: 0,
            retries: 0,
            ok: 0,
            errors: BTreeMap::new(),
            latency: histogram(),
            depth: None,
            time_wait: None,
            in_use: None,
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("bounds are valid")
}

/// Microseconds to milliseconds, rounded to the microsecond.
fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Where another generator's tally was counted, for [`Tally::merge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Machine {
    /// On this tally's machine: its socket counts are of the same sockets.
    Same,
    /// Elsewhere: its sockets are others.
    Other,
}

/// The running counts.
pub(super) struct Tally {
    seconds: Vec<Second>,
    offered: Vec<f64>,
    latency: Histogram<u64>,
    /// How late each transaction's first attempt left against its intended instant.
    lag: Histogram<u64>,
    errors: BTreeMap<Kind, u64>,
    answers: BTreeMap<(Option<String>, Option<String>), u64>,
    sessions: BTreeMap<u64, BTreeMap<String, u64>>,
    sent: u64,
    retries: u64,
    ok: u64,
}

impl Tally {
    pub(super) fn new(plan: &Plan) -> Tally {
        let seconds = match plan.arrivals {
            Arrivals::Open { .. } => plan.duration.as_secs_f64().ceil() as u64,
            Arrivals::Closed { .. } => 0,
        };
        let offered = (0..seconds)
            .map(|s| {
                let from = Duration::from_secs(s);
                plan.offered(from, (from + Duration::from_secs(1)).min(plan.duration))
            })
            .collect();
        Tally {
            seconds: Vec::new(),
            offered,
            latency: histogram(),
            lag: histogram(),
            errors: BTreeMap::new(),
            answers: BTreeMap::new(),
            sessions: BTreeMap::new(),
            sent: 0,
            retries: 0,
            ok: 0,
        }
    }

    fn at(&mut self, second: usize) -> &mut Second {
        while self.seconds.len() <= second {
            self.seconds.push(Second::new());
        }
        &mut self.seconds[second]
    }

    pub(super) fn sent(&mut self, second: usize, retry: bool) {
        let s = self.at(second);
        s.sent += 1;
        s.retries += u64::from(retry);
        self.sent += 1;
        self.retries += u64::from(retry);
    }

    /// A transaction's first attempt left at `started`, meant for `intended`.
    pub(super) fn left(&mut self, intended: Instant, started: Instant) {
        let us = started.saturating_duration_since(intended).as_micros() as u64;
        self.lag.saturating_record(us.max(1));
    }

    pub(super) fn outcome(
        &mut self,
        second: usize,
        intended: Instant,
        outcome: Outcome,
        session: Option<u64>,
    ) {
        let s = self.at(second);
        match outcome.error {
            None => {
                let us = intended.elapsed().as_micros().max(1) as u64;
                s.ok += 1;
                s.latency.saturating_record(us);
                self.latency.saturating_record(us);
                self.ok += 1;
            }
            Some(kind) => {
                *s.errors.entry(kind).or_default() += 1;
                *self.errors.entry(kind).or_default() += 1;
            }
        }
        if let Some(session) = session
            && let Some(name) = outcome.backend.as_ref().or(outcome.instance.as_ref())
        {
            *self
                .sessions
                .entry(session)
                .or_default()
                .entry(name.clone())
                .or_default() += 1;
        }
        if outcome.backend.is_some() || outcome.instance.is_some() {
            *self
                .answers
                .entry((outcome.backend, outcome.instance))
                .or_default() += 1;
        }
    }

    pub(super) fn observe(
        &mut self,
        second: usize,
        depth: Option<i64>,
        ports: Option<&ports::Destination>,
    ) {
        let s = self.at(second);
        s.depth = depth;
        s.time_wait = ports.map(|p| p.time_wait);
        s.in_use = ports.map(|p| p.ports_in_use);
    }

    /// Seconds with anything in them.
    pub(super) fn seconds(&self) -> usize {
        self.seconds.len()
    }

    pub(super) fn row(&self, second: usize) -> Row {
        let offered = self.offered.get(second).copied();
        let Some(s) = self.seconds.get(second) else {
            return Row {
                second,
                offered,
                sent: 0,
                retries: 0,
                ok: 0,
                errors: BTreeMap::new(),
                mean_ms: None,
                p99_ms: None,
                depth: None,
                time_wait: None,
            };
        };
        let latency = (s.ok > 0).then_some(&s.latency);
        Row {
            second,
            offered,
            sent: s.sent,
            retries: s.retries,
            ok: s.ok,
            errors: s.errors.clone(),
            mean_ms: latency.map(|h| h.mean() / 1000.0),
            p99_ms: latency.map(|h| ms(h.value_at_quantile(0.99))),
            depth: s.depth,
            time_wait: s.time_wait,
        }
    }

    /// The report of a run of `target`, open or closed loop; `ends`: the port pool
    /// towards it before and after, if sockets could be read.
    pub(super) fn report(
        &self,
        target: &str,
        open: bool,
        elapsed: Duration,
        traffic: Duration,
        unfinished: u64,
        ends: Option<(ports::Destination, ports::Destination)>,
    ) -> Report {
        let rows = (0..self.seconds.len()).map(|s| self.row(s)).collect();
        let mut backends: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut disagreements = Vec::new();
        for ((backend, instance), n) in &self.answers {
            if let Some(b) = backend {
                backends.entry(b.clone()).or_default().0 += n;
            }
            if let Some(i) = instance {
                backends.entry(i.clone()).or_default().1 += n;
            }
            if let (Some(b), Some(i)) = (backend, instance)
                && b != i
            {
                disagreements.push(Disagreement {
                    backend: b.clone(),
                    instance: i.clone(),
                    answers: *n,
                });
            }
        }
        let named: u64 = self.answers.values().sum();
        let backends = backends
            .into_iter()
            .map(|(name, (by_backend, by_instance))| Share {
                share_percent: 100.0 * by_backend.max(by_instance) as f64 / named.max(1) as f64,
                name,
                by_backend,
                by_instance,
            })
            .collect();
        let sessions = self
            .sessions
            .iter()
            .map(|(session, seen)| SessionReport {
                session: format!("s{session}"),
                requests: seen.values().sum(),
                backends: seen.clone(),
            })
            .collect();
        let generator_errors = self
            .errors
            .iter()
            .filter(|(k, _)| k.generator())
            .map(|(_, n)| n)
            .sum();
        let errors: u64 = self.errors.values().sum();
        let h = &self.latency;
        let pct = |q: f64| (self.ok > 0).then(|| ms(h.value_at_quantile(q)));
        Report {
            target: target.to_string(),
            mode: if open { "open" } else { "closed" },
            elapsed_s: elapsed.as_secs_f64(),
            // The seconds' offers add up to the whole window's (Plan::offered).
            offered: open.then(|| self.offered.iter().sum::<f64>().round() as u64),
            sent: self.sent,
            retries: self.retries,
            ok: self.ok,
            errors,
            service_errors: errors - generator_errors,
            generator_errors,
            unfinished,
            errors_by_kind: self.errors.clone(),
            requests_per_s: self.ok as f64 / traffic.as_secs_f64().max(1e-3),
            send_lag_ms: Lag::of(&self.lag).filter(|_| open),
            latency_ms: Latency {
                p50: pct(0.5),
                p90: pct(0.9),
                p95: pct(0.95),
                p99: pct(0.99),
                p99_9: pct(0.999),
                max: (self.ok > 0).then(|| ms(h.max())),
                mean: (self.ok > 0).then(|| h.mean() / 1000.0),
            },
            backends,
            disagreements,
            sessions,
            ports: ends.map(|(before, after)| {
                let peak = self
                    .seconds
                    .iter()
                    .map(|s| (s.in_use.unwrap_or(0), s.time_wait.unwrap_or(0)))
                    .chain([&before, &after].map(|p| (p.ports_in_use, p.time_wait)))
                    .fold((0, 0), |(u, t), (in_use, time_wait)| {
                        (u.max(in_use), t.max(time_wait))
                    });
                Ports {
                    dest: after.dest,
                    pool: (after.headroom + after.ports_in_use as i64).max(0) as u64,
                    time_wait_before: before.time_wait,
                    time_wait_after: after.time_wait,
                    in_use_before: before.ports_in_use,
                    in_use_after: after.ports_in_use,
                    peak_in_use: peak.0,
                    peak_time_wait: peak.1,
                    headroom_after: after.headroom,
                }
            }),
            rows,
            hosts: Vec::new(),
        }
    }

    /// Adds another generator's counts of the same run, second by second (their
    /// seconds start together: `--start-at`). TIME_WAIT and ports in use add up
    /// across machines, and are the larger of two counts of one machine's
    /// sockets; a queue depth is the deepest either saw.
    pub(super) fn merge(&mut self, other: Tally, machine: Machine) {
        let add = |a: &mut BTreeMap<Kind, u64>, b: &BTreeMap<Kind, u64>| {
            for (k, n) in b {
                *a.entry(*k).or_default() += n;
            }
        };
        let sum = |a: Option<usize>, b: Option<usize>| match (a, b) {
            (None, None) => None,
            (a, b) if machine == Machine::Same => a.max(b),
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        for (i, o) in other.seconds.into_iter().enumerate() {
            let s = self.at(i);
            s.sent += o.sent;
            s.retries += o.retries;
            s.ok += o.ok;
            add(&mut s.errors, &o.errors);
            s.latency.add(&o.latency).expect("histograms of one shape");
            s.depth = s.depth.max(o.depth);
            s.time_wait = sum(s.time_wait, o.time_wait);
            s.in_use = sum(s.in_use, o.in_use);
        }
        if self.offered.len() < other.offered.len() {
            self.offered.resize(other.offered.len(), 0.0);
        }
        for (a, b) in self.offered.iter_mut().zip(&other.offered) {
            *a += b;
        }
        self.latency
            .add(&other.latency)
            .expect("histograms of one shape");
        self.lag.add(&other.lag).expect("histograms of one shape");
        add(&mut self.errors, &other.errors);
        for (key, n) in other.answers {
            *self.answers.entry(key).or_default() += n;
        }
        for (session, seen) in other.sessions {
            let mine = self.sessions.entry(session).or_default();
            for (backend, n) in seen {
                *mine.entry(backend).or_default() += n;
            }
        }
        self.sent += other.sent;
        self.retries += other.retries;
        self.ok += other.ok;
    }
}

/// This destination's share of the port pool now; `None` where sockets cannot be read.
pub(super) fn ports(dest: SocketAddr) -> Option<ports::Destination> {
    let sockets = ports::sockets().ok()?;
    let limits = ports::Limits::read().ok()?;
    ports::report(&sockets, limits, Some(dest))
        .destinations
        .into_iter()
        .next()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::load::Target;

    fn plan(open: bool) -> Plan {
        let mut plan = Plan::new(Target {
            addr: "127.0.0.1:1".parse().unwrap(),
            tls: false,
            host: "a".into(),
            path: "/".into(),
        });
        if open {
            plan.arrivals = Arrivals::Open {
                rate: 100.0,
                shape: None,
            };
        }
        plan
    }

    fn lag_of(tally: &Tally, plan: &Plan) -> Option<Lag> {
        let d = Duration::from_secs(1);
        let open = matches!(plan.arrivals, Arrivals::Open { .. });
        tally.report("http://a/", open, d, d, 0, None).send_lag_ms
    }

    #[test]
    fn sends_behind_schedule_make_the_generator_late_at_its_p99() {
        let plan = plan(true);
        let mut tally = Tally::new(&plan);
        let t0 = Instant::now();
        for i in 0..100u64 {
            let intended = t0 + Duration::from_millis(i * 10);
            // Two sends in a hundred leave 30 ms late; the rest 0.3 ms.
            let behind = if i % 50 == 0 { 30_000 } else { 300 };
            tally.left(intended, intended + Duration::from_micros(behind));
        }
        let lag = lag_of(&tally, &plan).unwrap();
        assert!((lag.p50 - 0.3).abs() < 0.01, "{lag:?}");
        assert!((lag.max - 30.0).abs() < 0.1, "{lag:?}");
        assert!(lag.late(), "{lag:?}");

        let mut on_time = Tally::new(&plan);
        for i in 0..100u64 {
            let intended = t0 + Duration::from_millis(i * 10);
            on_time.left(intended, intended + Duration::from_micros(800));
        }
        assert!(!lag_of(&on_time, &plan).unwrap().late());
    }

    #[test]
    fn a_closed_loop_has_no_schedule_to_be_late_for() {
        let plan = plan(false);
        let mut tally = Tally::new(&plan);
        let t0 = Instant::now();
        tally.left(t0, t0 + Duration::from_millis(50));
        assert!(lag_of(&tally, &plan).is_none());
    }

    #[test]
    fn tallies_saved_read_back_and_merged_count_as_one_that_saw_everything() {
        let plan = plan(true);
        let (mut whole, mut a, mut b) = (Tally::new(&plan), Tally::new(&plan), Tally::new(&plan));
        let dest = |time_wait| ports::Destination {
            dest: "127.0.0.1:1".parse().unwrap(),
            ports_in_use: time_wait + 1,
            time_wait,
            headroom: 100,
            used_percent: 1.0,
        };
        for i in 0..300u64 {
            let second = (i % 3) as usize;
            let intended = Instant::now() - Duration::from_millis(i % 40);
            let outcome = || match i % 5 {
                0 => Outcome::failed(Kind::Status(503)),
                1 => Outcome::failed(Kind::Ports),
                _ => Outcome::failed(Kind::Reset).named(None, None),
            };
            let ok = || Outcome {
                error: None,
                backend: Some(format!("b{}", i % 2)),
                instance: Some(format!("b{}", i % 2)),
            };
            for t in [&mut whole, if i % 2 == 0 { &mut a } else { &mut b }] {
                t.sent(second, i % 7 == 0);
                t.left(intended, intended + Duration::from_micros(100 + i));
                let o = if i % 3 == 0 { outcome() } else { ok() };
                t.outcome(second, intended, o, Some(i % 4));
            }
        }
        a.observe(1, Some(3), Some(&dest(10)));
        b.observe(1, Some(5), Some(&dest(20)));
        // Through the JSON a shard writes, and back.
        let through = |t: &Tally| {
            let text = serde_json::to_string(&t.save()).unwrap();
            Tally::restore(&serde_json::from_str(&text).unwrap()).unwrap()
        };
        let mut merged = through(&a);
        merged.merge(through(&b), Machine::Other);
        let d = Duration::from_secs(1);
        let (m, w) = (
            merged.report("t", true, d, d, 0, None),
            whole.report("t", true, d, d, 0, None),
        );
        assert_eq!(
            (m.sent, m.ok, m.errors, m.retries),
            (w.sent, w.ok, w.errors, w.retries)
        );
        assert_eq!(m.errors_by_kind, w.errors_by_kind);
        assert_eq!(m.generator_errors, w.generator_errors);
        assert_eq!(m.offered, Some(200), "each shard's offer adds up");
        let shares = |r: &Report| {
            r.backends
                .iter()
                .map(|s| (s.name.clone(), s.by_backend))
                .collect::<Vec<_>>()
        };
        assert_eq!(shares(&m), shares(&w));
        assert_eq!(merged.sessions, whole.sessions);
        assert_eq!(merged.latency.len(), whole.latency.len());
        assert_eq!(merged.lag.max(), whole.lag.max());
        for s in 0..3 {
            let (rm, rw) = (merged.row(s), whole.row(s));
            assert_eq!(
                (rm.sent, rm.ok, &rm.errors),
                (rw.sent, rw.ok, &rw.errors),
                "second {s}"
            );
        }
        // Each machine's sockets add up; the deepest queue is the one seen.
        let row = merged.row(1);
        assert_eq!((row.time_wait, row.depth), (Some(30), Some(5)));
        // Two counts of one machine's sockets are not two machines' sockets.
        let mut one = through(&a);
        one.merge(through(&b), Machine::Same);
        assert_eq!(
            (one.row(1).time_wait, one.seconds[1].in_use),
            (Some(20), Some(21))
        );
        assert_eq!(one.report("t", true, d, d, 0, None).sent, w.sent);
        // A histogram that is not one says so.
        let mut saved = a.save();
        saved.latency = "not base64!".into();
        let err = Tally::restore(&saved).err().unwrap();
        assert!(err.contains("latency: histogram: not base64"), "{err}");
    }
}
