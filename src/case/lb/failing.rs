//! LB-02, LB-03, LB-04 and LB-08: a backend stops, breaks its body, slows down or
//! comes back, and the balancer's checks and passive marking must see it.

use std::time::Duration;

use super::{checks, kinds};
use crate::{
    case::{Bench, share::summary},
    lab::{
        balancer::{HealthCheck, select::Strategy},
        load::{Arrivals, Kind},
    },
};

pub(super) async fn lb02(b: &mut Bench) -> anyhow::Result<()> {
    let file = include_str!("../../../faults/case-LB-02.toml");
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
        .await?;
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

pub(super) async fn lb03(b: &mut Bench) -> anyhow::Result<()> {
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
        let file = include_str!("../../../faults/case-LB-03.toml");
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
        let r = run.load(label, plan).await?;
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

pub(super) async fn lb04(b: &mut Bench) -> anyhow::Result<()> {
    b.product()
        .require(crate::lab::driver::Feature::RetryCount)?;
    let mut budget = Vec::new();
    for max_fails in [0, 3] {
        let mut run = b.sub();
        let file = include_str!("../../../faults/case-LB-04.toml");
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
        let r = run.load(&label, plan).await?;
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
    if b.product().is("haproxy") {
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

pub(super) async fn lb08(b: &mut Bench) -> anyhow::Result<()> {
    let file = include_str!("../../../faults/case-LB-08.toml");
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
    let r = b.load("wrr, slow start 3 s", plan).await?;
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
