//! The cases of seeds/000: shares behind a balancer over three self-naming instances.

use std::time::Duration;

use super::{Bench, Case};
use crate::lab::driver::Feature;
use crate::lab::{
    balancer::select::Strategy,
    load::{Arrivals, Report, Sessions},
};
use crate::report::EventKind;

/// The cases in this file.
pub const CASES: &[Case] = &[
    Case {
        name: "share-rr",
        source: "seeds/000",
        property: "round robin over identical instances gives even shares, and the instances, the balancer, the interposers and the client count the same",
        reference: "37 678 requests: a 33.3%, b 33.3%, c 33.3%, one request apart",
        quick: 0.4,
        run: |b| Box::pin(share_rr(b)),
    },
    Case {
        name: "slow-rr",
        source: "seeds/000",
        property: "with one instance 50 ms slower, round robin keeps an even share while throughput collapses",
        reference: "33.3/33.3/33.4% at 580.4 requests/s against 7 533.6 with identical instances",
        quick: 0.4,
        run: |b| Box::pin(slow(b, Strategy::Rr)),
    },
    Case {
        name: "slow-least",
        source: "seeds/000",
        property: "least connections starves an instance 50 ms slower, and gives it its share back once it recovers",
        reference: "a 53.6%, b 45.9%, c 0.5% at 10 411.6 requests/s",
        quick: 0.4,
        run: |b| Box::pin(slow(b, Strategy::Least)),
    },
    Case {
        name: "sticky",
        source: "seeds/000",
        property: "4 sessions × 300 requests over 3 instances: every session stays on one instance",
        reference: "a 600, b 300, c 300 (50/25/25, the best split); s1=a s2=b s3=c s4=a",
        quick: 0.34,
        run: |b| Box::pin(sticky(b)),
    },
    Case {
        name: "kill-during-run",
        source: "seeds/000",
        property: "one instance of three stops 2 s into a 6 s run: the error share is set by the health check's interval",
        reference: "errors 29.7% with checks off, 2.5% at 1000 ms, 30 of 60 808 at 200 ms",
        quick: 0.5,
        run: |b| Box::pin(kill_during_run(b)),
    },
];

/// Shares by `x-backend`, percent of named answers.
fn shares(r: &Report) -> Vec<(String, f64)> {
    r.backends
        .iter()
        .map(|s| (s.name.clone(), s.share_percent))
        .collect()
}

fn listed(shares: &[(String, f64)]) -> String {
    let parts: Vec<String> = shares.iter().map(|(n, s)| format!("{n} {s:.1}%")).collect();
    parts.join(", ")
}

/// One line of the generator's figures.
pub(super) fn summary(r: &Report) -> String {
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    format!(
        "{} requests, {} ok, {} errors, {:.0} ok/s; p50 {} ms, p95 {} ms, p99 {} ms",
        r.sent,
        r.ok,
        r.errors,
        r.requests_per_s,
        ms(r.latency_ms.p50),
        ms(r.latency_ms.p95),
        ms(r.latency_ms.p99)
    )
}

async fn share_rr(b: &mut Bench) -> anyhow::Result<()> {
    let parts = b.parts(&["a", "b", "c"], None, |_, _| {}).await?;
    let (lb, balancer) = b.balancer(|c| c.strategy = Strategy::Rr).await?;
    let mut plan = b.plan(lb, "/");
    plan.arrivals = Arrivals::Closed { connections: 12 };
    plan.duration = b.secs(5.0);
    let r = b.load("round robin, 12 connections", plan).await?;
    let shares = shares(&r);
    let even = shares.len() == 3 && shares.iter().all(|(_, s)| (s - 100.0 / 3.0).abs() <= 1.0);
    b.check("every share within ±1% of 33.3%", even, listed(&shares));
    let named: u64 = r.backends.iter().map(|s| s.by_backend).sum();
    let both = r.backends.iter().all(|s| s.by_backend == s.by_instance);
    let header = b.product().require(Feature::BackendHeader);
    match &header {
        Ok(()) => b.check(
            "x-backend and x-instance agree on every answer",
            r.disagreements.is_empty() && both && named == r.ok,
            format!(
                "{} disagreements in {named} named answers",
                r.disagreements.len()
            ),
        ),
        Err(e) => b.note(format!(
            "{e}; the counts below compare the client, the interposers and the instances"
        )),
    }
    // The built-in balancer counts per backend; the products are compared through
    // the client's x-backend instead, where they set it.
    let stats = balancer.builtin().map(|b| b.stats());
    let mut agree = true;
    let mut counts = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let client = r
            .backends
            .iter()
            .find(|s| s.name == p.name)
            .map_or(0, |s| s.by_instance);
        let lb = match &stats {
            Some(stats) => stats["backends"][i]["requests"].as_u64().unwrap_or(0),
            None if header.is_err() => client,
            None => r
                .backends
                .iter()
                .find(|s| s.name == p.name)
                .map_or(0, |s| s.by_backend),
        };
        let relayed = p.stats().await?.requests.get("data").copied().unwrap_or(0);
        let served = p.backend.served().await?;
        agree &= client == lb && lb == relayed && relayed == served;
        let lb = if header.is_ok() || stats.is_some() {
            lb.to_string()
        } else {
            "—".into()
        };
        counts.push(format!("{} {client}/{lb}/{relayed}/{served}", p.name));
    }
    b.check(
        "client, balancer, interposer and instance counts agree",
        agree,
        format!("client/balancer/interposer/instance: {}", counts.join(", ")),
    );
    b.check("no errors", r.errors == 0, format!("{} errors", r.errors));
    b.figure("load", summary(&r));
    Ok(())
}

async fn slow(b: &mut Bench, strategy: Strategy) -> anyhow::Result<()> {
    let parts = b.parts(&["a", "b", "c"], None, |_, _| {}).await?;
    let (lb, _) = b.balancer(|c| c.strategy = strategy).await?;
    let mut plan = b.plan(lb, "/");
    plan.arrivals = Arrivals::Closed { connections: 12 };
    plan.duration = b.secs(4.0);
    let even = b.load("identical instances", plan.clone()).await?;
    parts[2]
        .backend
        .set_delay(Duration::from_millis(50))
        .await?;
    b.event(EventKind::Fault, "c: 50 ms slower");
    let slow = b.load("c 50 ms slower", plan.clone()).await?;
    let c = |r: &Report| {
        shares(r)
            .iter()
            .find(|(n, _)| n == "c")
            .map_or(0.0, |s| s.1)
    };
    let drop = slow.requests_per_s / even.requests_per_s.max(1.0);
    b.figure("identical", summary(&even));
    b.figure("c slower", summary(&slow));
    b.figure("throughput", format!("{:.2}× of identical instances", drop));
    match strategy {
        Strategy::Rr => {
            let shares = shares(&slow);
            let level =
                shares.len() == 3 && shares.iter().all(|(_, s)| (s - 100.0 / 3.0).abs() <= 1.0);
            b.check("shares stay within ±1% of 33.3%", level, listed(&shares));
            // Round robin sends every third request to c: with 12 connections it
            // cannot answer more than 3 × 12 per 50 ms, however fast a and b are.
            // (How far that is below the identical run depends on the CPU: 0.4× here
            // on a quiet machine, 0.6× beside two busy loops; the source's 0.08×.)
            let cap = 3.0 * 12.0 / 0.050;
            b.check(
                "throughput collapses to what the slow instance allows",
                slow.requests_per_s <= cap * 1.05,
                format!(
                    "{:.0} → {:.0} ok/s; at most {cap:.0} with every third request 50 ms slow",
                    even.requests_per_s, slow.requests_per_s
                ),
            );
        }
        _ => {
            // Round robin would give it 33%; the source measured 0.5%. A third of
            // its even share keeps the property clear with room for a machine whose
            // fast instances are slowed by other work too (10.2% beside two busy loops).
            b.check(
                "the slow instance gets under 11.1% (a third of its even share)",
                c(&slow) < 100.0 / 9.0,
                listed(&shares(&slow)),
            );
            parts[2].backend.set_delay(Duration::ZERO).await?;
            b.event(EventKind::Fault, "c: recovered");
            let back = b.load("c recovered", plan).await?;
            b.figure("c recovered", summary(&back));
            b.check(
                "after recovery it gets at least 25% again",
                c(&back) >= 25.0,
                listed(&shares(&back)),
            );
            b.check(
                "throughput holds above half while c is slow",
                drop >= 0.5,
                format!(
                    "{:.0} → {:.0} ok/s",
                    even.requests_per_s, slow.requests_per_s
                ),
            );
        }
    }
    Ok(())
}

async fn sticky(b: &mut Bench) -> anyhow::Result<()> {
    b.parts(&["a", "b", "c"], None, |_, _| {}).await?;
    let (lb, _) = b.balancer(|c| c.strategy = Strategy::Hash).await?;
    let per_session = if b.quick { 100 } else { 300 };
    let mut plan = b.plan(lb, "/");
    plan.duration = Duration::from_secs(60);
    plan.sessions = Some(Sessions {
        count: 4,
        per_session: Some(per_session),
        header: "x-session".parse().expect("valid"),
        cookie: None,
    });
    let r = b.load("4 sessions, hash on x-session", plan).await?;
    let placed: Vec<String> = r
        .sessions
        .iter()
        .map(|s| {
            format!(
                "{}={}",
                s.session,
                s.backends.keys().cloned().collect::<Vec<_>>().join("+")
            )
        })
        .collect();
    b.check(
        "every session stays on one instance",
        r.sessions.len() == 4 && r.sessions.iter().all(|s| s.backends.len() == 1),
        placed.join(" "),
    );
    b.check(
        "every request answered",
        r.ok == 4 * per_session,
        format!("{} of {} ok", r.ok, 4 * per_session),
    );
    let split = shares(&r);
    let best = split.iter().map(|(_, s)| *s).fold(0.0, f64::max);
    b.figure(
        "split",
        format!(
            "{} (50/25/25 is the best four sessions allow over three)",
            listed(&split)
        ),
    );
    b.figure("busiest instance", format!("{best:.1}% of requests"));
    Ok(())
}

async fn kill_during_run(b: &mut Bench) -> anyhow::Result<()> {
    let mut shares = Vec::new();
    // nginx open source has no active checks: it runs with them off and with its
    // passive marking instead, and the report says so.
    let passive = !b.product().has(Feature::ActiveChecks);
    let intervals: &[Option<u64>] = if passive {
        &[None, None]
    } else {
        &[None, Some(1000), Some(200)]
    };
    for (i, &interval) in intervals.iter().enumerate() {
        let marking = passive && i == 1;
        let label = match interval {
            None if marking => "passive marking (max_fails 1)".to_string(),
            None => "health checks off".to_string(),
            Some(ms) => format!("checks every {ms} ms"),
        };
        // Fresh parts per run: the file's timeline (c stops at 2 s) starts with them.
        let mut run = b.sub();
        let file = include_str!("../../faults/case-kill-during-run.toml");
        run.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
        let rules = interval.map(|ms| crate::lab::balancer::HealthCheck {
            interval: Duration::from_millis(ms),
            timeout: Duration::from_millis(200),
            rise: 1,
            fall: 1,
            path: "/health".into(),
            expect_body: None,
            grpc: false,
        });
        let (lb, _) = run
            .balancer(|c| {
                c.health = rules.clone();
                if marking {
                    c.max_fails = 1;
                }
            })
            .await?;
        let mut plan = run.plan(lb, "/");
        plan.arrivals = Arrivals::Closed { connections: 12 };
        plan.duration = run.secs(6.0);
        let started = run.now_s();
        let r = run.load(&label, plan).await?;
        let killed = run.timeline_s(2.0);
        let share = 100.0 * r.errors as f64 / r.sent.max(1) as f64;
        let mut detail = format!("{share:.2}% errors ({} of {})", r.errors, r.sent);
        if let Some(rules) = &rules {
            let limit = (rules.interval + rules.timeout).as_secs_f64();
            match run.transitions("c").iter().find(|t| t.to == "down") {
                Some(down) => {
                    let detect = down.at_s - killed;
                    // Seconds of the load's clock wholly after the detection.
                    let clean_from = (down.at_s - started + 1.0).ceil() as usize;
                    let late: u64 = r
                        .rows
                        .iter()
                        .filter(|row| row.second >= clean_from)
                        .map(|row| row.errors.values().sum::<u64>())
                        .sum();
                    detail += &format!(", detected after {:.0} ms", detect * 1000.0);
                    b.check(
                        format!("{label}: c is out within interval + timeout, and errors stop"),
                        detect <= limit + 0.05 && late == 0,
                        format!(
                            "detected {:.0} ms after the stop (limit {:.0} ms); {late} errors after",
                            detect * 1000.0,
                            limit * 1000.0
                        ),
                    );
                }
                None => b.check(
                    format!("{label}: c is taken out"),
                    false,
                    "never marked down",
                ),
            }
        }
        b.figure(label.clone(), format!("{detail}; {}", summary(&r)));
        shares.push(share);
        b.absorb(run).await;
    }
    b.check(
        "with checks off the dead instance keeps its turns: over 10% errors, more than with any checker",
        shares[0] > 10.0 && shares[1..].iter().all(|s| shares[0] > *s),
        if passive {
            format!("{:.1}% off, {:.2}% with passive marking", shares[0], shares[1])
        } else {
            format!(
                "{:.1}% off, {:.2}% at 1000 ms, {:.2}% at 200 ms",
                shares[0], shares[1], shares[2]
            )
        },
    );
    if passive {
        b.note("nginx open source has no active health checks, so the 1000 ms and 200 ms checkers cannot run; its passive marking (max_fails 1, fail_timeout 10 s) ran instead");
    }
    b.note("the dead share can exceed the third the instance was owed: a refused connection answers faster than a served one, so it takes more turns");
    Ok(())
}
