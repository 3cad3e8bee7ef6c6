//! The matrix of seeds/004 (health check, draining and failover): LB-01 … LB-08.
//! The document sets no figures; each case states the threshold it holds the
//! balancer to.

use std::time::Duration;

use super::{Bench, Case, share::summary};
use crate::lab::{
    balancer::{HealthCheck, select::Strategy},
    load::{Arrivals, Kind, Report},
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
    let r = b.load("baseline, 8 connections", plan).await;
    let (fair, listed) = even(&r, 3, 2.0);
    b.check("every share within ±2% of 33.3%", fair, listed);
    let p99 = r.latency_ms.p99.unwrap_or(f64::INFINITY);
    b.check("p99 under 20 ms", p99 < 20.0, format!("p99 {p99:.2} ms"));
    b.check("no errors", r.errors == 0, format!("{} errors", r.errors));
    b.figure("load", summary(&r));
    Ok(())
}

async fn lb02(b: &mut Bench) -> anyhow::Result<()> {
    let file = include_str!("../../faults/case-LB-02.toml");
    b.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
    let rules = checks(500, "/health", 2, 2);
    // Down after `fall` failed checks, each at most an interval apart and a timeout
    // long; up after `rise` passes.
    let detect_limit = (rules.interval * (rules.fall) + rules.timeout).as_secs_f64();
    let restore_limit = (rules.interval * (rules.rise) + rules.timeout).as_secs_f64();
    let (lb, _) = b.balancer(|c| c.health = Some(rules)).await?;
    let mut plan = b.plan(lb, "/");
    plan.arrivals = Arrivals::Closed { connections: 8 };
    plan.duration = b.secs(8.0);
    let started = b.now_s();
    let r = b
        .load("rr, checks every 500 ms, rise 2, fall 2", plan)
        .await;
    let (stop, back) = (b.timeline_s(2.0), b.timeline_s(5.0));
    let t = b.transitions("b");
    let down = t.iter().find(|t| t.to == "down").map(|t| t.at_s);
    let up = t.iter().find(|t| t.to == "up").map(|t| t.at_s);
    let last_error = r
        .rows
        .iter()
        .filter(|row| !row.errors.is_empty())
        .map(|row| started + row.second as f64 + 1.0)
        .fold(None, |a: Option<f64>, s| Some(a.map_or(s, |a| a.max(s))));
    let served_again = b.data_between("b", up.unwrap_or(f64::MAX), b.now_s());
    match down {
        Some(d) => b.check(
            "detection within fall × interval + timeout",
            d - stop <= detect_limit + 0.05,
            format!(
                "{:.0} ms after the stop (limit {:.0} ms)",
                (d - stop) * 1000.0,
                detect_limit * 1000.0
            ),
        ),
        None => b.check("detection", false, "never marked down"),
    }
    b.check(
        "removal: clients stop failing within a second of detection",
        match (down, last_error) {
            (Some(d), Some(e)) => e <= d + 1.0,
            (Some(_), None) => true,
            _ => false,
        },
        format!(
            "last error in the second ending {} s into the case; {} errors in all ({})",
            last_error.map_or("-".into(), |e| format!("{e:.0}")),
            r.errors,
            kinds(&r)
        ),
    );
    match up {
        Some(u) => b.check(
            "restoration within rise × interval + timeout, and it is served again",
            u - back <= restore_limit + 0.05 && served_again > 0,
            format!(
                "up {:.0} ms after the restart (limit {:.0} ms); {served_again} requests since",
                (u - back) * 1000.0,
                restore_limit * 1000.0
            ),
        ),
        None => b.check("restoration", false, "never marked up again"),
    }
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

async fn lb03(b: &mut Bench) -> anyhow::Result<()> {
    let layers: [(&str, HealthCheck, bool); 3] = [
        ("transport (TCP connect)", checks(200, "", 1, 1), false),
        (
            "readiness (status of /health)",
            checks(200, "/health", 1, 1),
            false,
        ),
        (
            "synthetic transaction (body of /)",
            {
                let mut c = checks(200, "/", 1, 1);
                c.expect_body = Some("{\"id\":".into());
                c
            },
            true,
        ),
    ];
    let mut evicted = Vec::new();
    for (label, rules, synthetic) in layers {
        let mut run = b.sub();
        let file = include_str!("../../faults/case-LB-03.toml");
        run.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
        let (lb, _) = run
            .balancer(|c| {
                c.health = Some(rules);
                if synthetic {
                    // The synthetic transaction goes where clients go: the data path.
                    for backend in &mut c.backends {
                        backend.check = None;
                    }
                }
            })
            .await?;
        let mut plan = run.plan(lb, "/");
        plan.arrivals = Arrivals::Closed { connections: 6 };
        plan.duration = run.secs(5.0);
        plan.expect_body = Some("{\"id\":".into());
        let started = run.now_s();
        let r = run.load(label, plan).await;
        let broken = run.timeline_s(1.0);
        let down = run
            .transitions("b")
            .iter()
            .find(|t| t.to == "down")
            .map(|t| t.at_s);
        let bad = r.errors_by_kind.get(&Kind::BadBody).copied().unwrap_or(0);
        let late_bad: u64 = match down {
            Some(d) => r
                .rows
                .iter()
                .filter(|row| started + row.second as f64 >= d + 0.5)
                .map(|row| row.errors.get(&Kind::BadBody).copied().unwrap_or(0))
                .sum(),
            None => bad,
        };
        b.figure(
            label,
            match down {
                Some(d) => format!(
                    "b removed {:.0} ms after its body broke; {bad} bad bodies reached clients, {late_bad} after removal",
                    (d - broken) * 1000.0
                ),
                None => format!("b kept in rotation; {bad} bad bodies reached clients"),
            },
        );
        evicted.push((down.is_some(), bad, late_bad));
        b.absorb(run).await;
    }
    b.check(
        "the transport check does not notice: b stays and clients get bad bodies",
        !evicted[0].0 && evicted[0].1 > 0,
        format!("evicted: {}, {} bad bodies", evicted[0].0, evicted[0].1),
    );
    b.check(
        "the status check does not notice either",
        !evicted[1].0 && evicted[1].1 > 0,
        format!("evicted: {}, {} bad bodies", evicted[1].0, evicted[1].1),
    );
    b.check(
        "the synthetic transaction removes b, and bad bodies stop",
        evicted[2].0 && evicted[2].2 == 0,
        format!(
            "evicted: {}, {} bad bodies after removal",
            evicted[2].0, evicted[2].2
        ),
    );
    Ok(())
}

async fn lb04(b: &mut Bench) -> anyhow::Result<()> {
    if b.product() == crate::lab::driver::Product::Nginx {
        return Err(crate::lab::driver::Unsupported {
            product: b.product(),
            why: "a retry count (nginx open source does not expose one)".into(),
        }
        .into());
    }
    let mut budget = Vec::new();
    for max_fails in [0, 3] {
        let mut run = b.sub();
        let file = include_str!("../../faults/case-LB-04.toml");
        run.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
        let (lb, balancer) = run
            .balancer(|c| {
                c.timeout = Duration::from_millis(200);
                c.retries = 1;
                c.max_fails = max_fails;
                c.fail_timeout = Duration::from_secs(30);
            })
            .await?;
        // Open loop: the offered rate does not shrink while requests wait on b.
        let mut plan = run.plan(lb, "/");
        plan.arrivals = Arrivals::Open {
            rate: 300.0,
            shape: None,
        };
        plan.duration = run.secs(5.0);
        let label = if max_fails == 0 {
            "no passive marking".to_string()
        } else {
            format!("max_fails {max_fails}")
        };
        let r = run.load(&label, plan).await;
        let (retries, requests) = (balancer.retries().await.unwrap_or(0), r.sent);
        let share = 100.0 * retries as f64 / requests.max(1) as f64;
        b.figure(
            label.clone(),
            format!(
                "balancer retried {retries} of {requests} requests ({share:.1}%); {}",
                summary(&r)
            ),
        );
        budget.push((share, r.errors, r.latency_ms.p99.unwrap_or(f64::INFINITY)));
        b.absorb(run).await;
    }
    if b.product() == crate::lab::driver::Product::Haproxy {
        b.note("HAProxy retries connection failures only (retry-on defaults to conn-failure): requests to the slow server end as 504 instead of being retried; `observe layer7` counts those toward marking it down");
    }
    b.check(
        "without passive marking the slow backend costs a retry storm: over 20% of requests retried",
        budget[0].0 > 20.0,
        format!("{:.1}% retried", budget[0].0),
    );
    b.check(
        "with max_fails 3, retries stay within a 5% budget",
        budget[1].0 <= 5.0,
        format!("{:.1}% retried", budget[1].0),
    );
    b.check(
        "clients see no errors: the retry lands elsewhere",
        budget[0].1 == 0 && budget[1].1 == 0,
        format!("{} and {} errors", budget[0].1, budget[1].1),
    );
    Ok(())
}

async fn lb05(b: &mut Bench) -> anyhow::Result<()> {
    let file = include_str!("../../faults/case-LB-05.toml");
    // b is slow, so that requests are in flight on it when the drain begins.
    let parts = b
        .parts(&["a", "b", "c"], Some(file), |id, c| {
            if id == "b" {
                c.delay = Duration::from_millis(150);
            }
        })
        .await?;
    let (lb, balancer) = b.balancer(|c| c.strategy = Strategy::Rr).await?;
    let drain_at = b.timeline_s(2.0);
    let at = b.instant(drain_at);
    // Drain at 2 s; at 2.5 s, with what was in flight finished, maintenance
    // (HAProxy's `maint`) while the interposer closes b's connections.
    let maint_at = b.instant(b.timeline_s(2.5));
    let drainer = tokio::spawn(async move {
        tokio::time::sleep_until(at).await;
        balancer.set_draining("b", true).await?;
        tokio::time::sleep_until(maint_at).await;
        balancer.set_maintenance("b").await
    });
    let mut gets = b.plan(lb, "/");
    gets.arrivals = Arrivals::Closed { connections: 6 };
    gets.duration = b.secs(5.0);
    let mut posts = gets.clone();
    posts.method = hyper::Method::POST;
    posts.body = bytes::Bytes::from_static(b"{\"amount\":1}");
    posts.txn_header = Some("x-request-id".parse().expect("valid"));
    posts.seed = b.seed ^ 1;
    let mut streams = gets.clone();
    streams.http2 = true;
    streams.arrivals = Arrivals::Closed { connections: 4 };
    let reports = b
        .loads(vec![
            ("keep-alive GETs, 6 connections".into(), gets),
            ("POSTs with x-request-id, 6 connections".into(), posts),
            ("HTTP/2 streams, 4 long-lived connections".into(), streams),
        ])
        .await;
    drainer.await??;
    b.report_event(drain_at, "balancer: b set draining");
    let after = b.data_between("b", drain_at + 0.2, b.now_s());
    b.check(
        "no request reaches b once the drain has begun (200 ms for requests already sent)",
        after == 0,
        format!(
            "{after} requests relayed to b after {:.1} s",
            drain_at + 0.2
        ),
    );
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    let stats: Vec<_> = parts
        .iter()
        .map(|p| p.proxy.counters().snapshot())
        .collect();
    let resets: u64 = stats.iter().map(|s| s.drain_resets + s.fault_resets).sum();
    b.check(
        "in-flight requests finish: no client error, no reset",
        errors == 0 && resets == 0,
        format!("{errors} client errors, {resets} resets"),
    );
    let duplicates: usize = stats.iter().map(|s| s.duplicates.len()).sum();
    let posted = reports[1].sent;
    b.check(
        "no duplicate transaction",
        duplicates == 0 && posted > 0,
        format!("{duplicates} ids seen twice among {posted} POSTs"),
    );
    for (label, r) in ["GETs", "POSTs", "HTTP/2 streams"].iter().zip(&reports) {
        b.figure(*label, summary(r));
    }
    b.note("the built-in balancer speaks HTTP/1.1 to backends: the interposer's drain closes those connections with `Connection: close`; HAProxy and nginx are configured with HTTP/1.1 to backends too; GOAWAY on HTTP/2 is verified by tests/drain.rs with an HTTP/2 client");
    Ok(())
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
    let r = b.load("8 connections through the balancer", plan).await;
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
        .await;
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

async fn lb08(b: &mut Bench) -> anyhow::Result<()> {
    let file = include_str!("../../faults/case-LB-08.toml");
    b.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
    let ramp = b.secs(3.0);
    let (lb, _) = b
        .balancer(|c| {
            c.strategy = Strategy::Wrr;
            c.health = Some(checks(200, "/health", 2, 1));
            c.slow_start = ramp;
        })
        .await?;
    let mut plan = b.plan(lb, "/");
    plan.arrivals = Arrivals::Closed { connections: 8 };
    plan.duration = b.secs(8.0);
    let r = b.load("wrr, slow start 3 s", plan).await;
    let t = b.transitions("b");
    let downs = t.iter().filter(|t| t.to == "down").count();
    let ups: Vec<f64> = t.iter().filter(|t| t.to == "up").map(|t| t.at_s).collect();
    b.check(
        "one removal and one return: no flapping",
        downs == 1 && ups.len() == 1,
        format!("{downs} down, {} up", ups.len()),
    );
    let Some(&up) = ups.first() else {
        return Ok(());
    };
    let half = 0.5;
    let early = (
        b.data_between("b", up, up + half),
        b.data_between("a", up, up + half),
    );
    let late_from = up + ramp.as_secs_f64();
    let late = (
        b.data_between("b", late_from, late_from + half),
        b.data_between("a", late_from, late_from + half),
    );
    b.check(
        "slow start: in the first half second back, b takes under half of a's requests",
        (early.0 as f64) < 0.5 * early.1 as f64,
        format!("b {} against a {}", early.0, early.1),
    );
    b.check(
        "after the ramp b takes its full share again",
        late.0 as f64 >= 0.8 * late.1 as f64,
        format!("b {} against a {}", late.0, late.1),
    );
    let mut surge = 0.0f64;
    let mut at = up;
    while at + 0.2 <= late_from + half {
        let (bb, aa) = (
            b.data_between("b", at, at + 0.2),
            b.data_between("a", at, at + 0.2),
        );
        if aa > 0 {
            surge = surge.max(bb as f64 / aa as f64);
        }
        at += 0.2;
    }
    b.check(
        "no surge: in no 200 ms window does b take over 1.2× a's requests",
        surge <= 1.2,
        format!("at most {surge:.2}× a's"),
    );
    b.figure("load", summary(&r));
    Ok(())
}
