//! The matrix of seeds/004 (health check, draining and failover): LB-01 … LB-08.
//! The document sets no figures; each case states the threshold it holds the
//! balancer to.

pub(super) mod drain;
mod failing;

use std::time::Duration;

use self::{
    drain::lb05,
    failing::{lb02, lb03, lb04, lb08},
};
use super::{Bench, Case, share::summary};
use crate::lab::{
    balancer::{HealthCheck, select::Strategy},
    load::{Arrivals, Report},
};

/// The cases in this file.
pub const CASES: &[Case] = &[
    Case {
        name: "LB-01",
        source: "seeds/004",
        property: "baseline: every share within ±2% of even, p99 under 20 ms, no errors",
        reference: "LB-01: correct distribution, no errors; pass on p99 and fairness within thresholds",
        quick: 0.5,
        run: |b| Box::pin(lb01(b)),
    },
    Case {
        name: "LB-02",
        source: "seeds/004",
        property: "a backend process stops and comes back: detection, removal and restoration within the checker's bounds",
        reference: "LB-02: the probe removes the target; detection and restoration within the SLA",
        quick: 0.5,
        run: |b| Box::pin(lb02(b)),
    },
    Case {
        name: "LB-03",
        source: "seeds/004",
        property: "the app answers 200 with a broken body: transport and status checks keep it, a synthetic transaction that reads the body removes it",
        reference: "LB-03: business health detects it; no more traffic to the failing backend",
        quick: 0.5,
        run: |b| Box::pin(lb03(b)),
    },
    Case {
        name: "LB-04",
        source: "seeds/004",
        property: "a backend 300 ms slow against a 200 ms balancer timeout with one retry, at 300 requests/s: without passive marking every request to it is retried; with max_fails 3 retries stay within a 5% budget",
        reference: "LB-04: no queue or retry storm; errors, latency and the retry budget",
        quick: 0.5,
        run: |b| Box::pin(lb04(b)),
    },
    Case {
        name: "LB-05",
        source: "seeds/004",
        property: "drain a backend under keep-alive GETs, POSTs carrying transaction ids and HTTP/2 streams on long-lived connections: no request or new stream reaches it after the drain, in-flight ones finish, no reset, no duplicate",
        reference: "LB-05: no new connections (L4) or requests (L7); existing flows by policy; resets within the threshold",
        quick: 0.5,
        run: |b| Box::pin(lb05(b)),
    },
    Case {
        name: "LB-06",
        source: "seeds/004",
        property: "the balancer process dies and restarts: clients fail only while it is gone, and are served within a second of its return",
        reference: "LB-06: loss and restoration within the SLA (one machine: the process is killed and restarted; a VIP failover needs two hosts)",
        quick: 0.6,
        run: |b| Box::pin(lb06(b)),
    },
    Case {
        name: "LB-07",
        source: "seeds/004",
        property: "stickiness with one hot session: the skew on its backend is measured and reported, not hidden in an average",
        reference: "LB-07: the distribution is observed and alerted on; no silent overload",
        quick: 0.5,
        run: |b| Box::pin(lb07(b)),
    },
    Case {
        name: "LB-08",
        source: "seeds/004",
        property: "a target comes back: one removal and one return (no flapping), and slow start ramps it up instead of a surge",
        reference: "LB-08: warm-up / ramp is safe; no flapping, no surge",
        quick: 0.5,
        run: |b| Box::pin(lb08(b)),
    },
];

fn checks(interval_ms: u64, path: &str, rise: u32, fall: u32) -> HealthCheck {
    HealthCheck {
        interval: Duration::from_millis(interval_ms),
        timeout: Duration::from_millis(200),
        rise,
        fall,
        path: path.into(),
        expect_body: None,
        grpc: false,
    }
}

fn even(r: &Report, n: usize, within: f64) -> (bool, String) {
    let fair = 100.0 / n as f64;
    let ok = r.backends.len() == n
        && r.backends
            .iter()
            .all(|s| (s.share_percent - fair).abs() <= within);
    let listed: Vec<String> = r
        .backends
        .iter()
        .map(|s| format!("{} {:.1}%", s.name, s.share_percent))
        .collect();
    (ok, listed.join(", "))
}

async fn lb01(b: &mut Bench) -> anyhow::Result<()> {
    b.parts(&["a", "b", "c"], None, |_, _| {}).await?;
    let (lb, _) = b
        .balancer(|c| c.health = Some(checks(500, "/health", 2, 3)))
        .await?;
    let mut plan = b.plan(lb, "/");
    plan.arrivals = Arrivals::Closed { connections: 8 };
    plan.duration = b.secs(6.0);
    let r = b.load("baseline, 8 connections", plan).await?;
    let (fair, listed) = even(&r, 3, 2.0);
    b.check("every share within ±2% of 33.3%", fair, listed);
    let p99 = r.latency_ms.p99.unwrap_or(f64::INFINITY);
    b.check("p99 under 20 ms", p99 < 20.0, format!("p99 {p99:.2} ms"));
    b.check("no errors", r.errors == 0, format!("{} errors", r.errors));
    b.figure("load", summary(&r));
    Ok(())
}

fn kinds(r: &Report) -> String {
    let parts: Vec<String> = r
        .errors_by_kind
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

async fn lb06(b: &mut Bench) -> anyhow::Result<()> {
    b.parts(&["a", "b", "c"], None, |_, _| {}).await?;
    let (lb, _) = b.balancer(|_| {}).await?;
    let mut plan = b.plan(lb, "/");
    plan.arrivals = Arrivals::Closed { connections: 8 };
    plan.duration = b.secs(8.0);
    plan.deadline = Some(Duration::from_millis(500));
    let started = b.now_s();
    let (kill_s, back_s) = (
        started + b.secs(2.5).as_secs_f64(),
        started + b.secs(3.5).as_secs_f64(),
    );
    let restart = b.kill_and_restart(kill_s, back_s)?;
    let r = b.load("8 connections through the balancer", plan).await?;
    let restarted = restart.await??;
    b.report_event(kill_s, "balancer killed");
    let back = b.adopt(restarted);
    // Whole seconds of the load's clock before the kill and after the return (a
    // second's row counts what completed in it).
    let before = (kill_s - started - 0.05).floor().max(0.0) as usize;
    let clean_from = (back - started + 1.0).ceil() as usize;
    let errors_in = |range: &dyn Fn(usize) -> bool| -> u64 {
        r.rows
            .iter()
            .filter(|row| range(row.second))
            .map(|row| row.errors.values().sum::<u64>())
            .sum()
    };
    let early = errors_in(&|s| s < before);
    let late = errors_in(&|s| s >= clean_from);
    b.check(
        "clients fail only while the balancer is gone",
        early == 0 && late == 0 && r.errors > 0,
        format!(
            "{} errors during the outage ({}); {early} before it, {late} after",
            r.errors,
            kinds(&r)
        ),
    );
    let served = r
        .rows
        .iter()
        .filter(|row| row.second >= clean_from)
        .all(|row| row.ok > 0);
    b.check(
        "served again within a second of its return",
        served && late == 0,
        format!(
            "restarted {:.0} ms after the kill; every second from {clean_from} s on has answers",
            (back - kill_s) * 1000.0
        ),
    );
    b.figure("outage", format!("{:.2} s with no balancer", back - kill_s));
    b.figure("load", summary(&r));
    b.note("on one machine the balancer process is killed and restarted; a VIP failover between two nodes needs two hosts");
    Ok(())
}

async fn lb07(b: &mut Bench) -> anyhow::Result<()> {
    b.parts(&["a", "b", "c"], None, |_, _| {}).await?;
    let (lb, _) = b.balancer(|c| c.strategy = Strategy::Hash).await?;
    let mut spread = b.plan(lb, "/");
    spread.duration = b.secs(5.0);
    spread.sessions = Some(crate::lab::load::Sessions {
        count: 6,
        per_session: None,
        header: "x-session".parse().expect("valid"),
        cookie: None,
    });
    let mut hot = b.plan(lb, "/");
    hot.duration = b.secs(5.0);
    hot.arrivals = Arrivals::Closed { connections: 6 };
    hot.headers = vec![(
        "x-session".parse().expect("valid"),
        "hot".parse().expect("valid"),
    )];
    let reports = b
        .loads(vec![
            ("6 sessions, one connection each".into(), spread),
            ("one hot session on 6 connections".into(), hot),
        ])
        .await?;
    let hot_backends: Vec<&str> = reports[1]
        .backends
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    b.check(
        "the hot session stays on one backend",
        hot_backends.len() == 1,
        format!("on {}", hot_backends.join(", ")),
    );
    let mut totals: std::collections::BTreeMap<String, u64> = Default::default();
    for r in &reports {
        for s in &r.backends {
            *totals.entry(s.name.clone()).or_default() += s.by_backend;
        }
    }
    let all: u64 = totals.values().sum();
    let (name, most) = totals
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(n, c)| (n.clone(), 100.0 * *c as f64 / all.max(1) as f64))
        .unwrap_or_default();
    b.check(
        "the skew is measured: the hot backend carries over 45% against a fair 33.3%",
        most > 45.0,
        format!("{name} {most:.1}% of {all} requests"),
    );
    b.note(format!("hotspot: {name} carries {most:.1}% of requests while an even split would give it 33.3%; stickiness put one heavy client there"));
    for (label, r) in ["spread sessions", "hot session"].iter().zip(&reports) {
        b.figure(*label, summary(r));
    }
    Ok(())
}
