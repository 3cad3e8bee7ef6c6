//! Health checks against faults on one path only: seeds/001's exclusion and rejoin,
//! and the probe blind spots of DESIGN.md — a lossy probe path (false eviction) and
//! a failing data path the probes cannot see.

use std::time::Duration;

use super::{Bench, Case, share::summary};
use crate::case::bench::Part;
use crate::lab::{balancer::HealthCheck, driver::Feature, load::Arrivals};

/// The cases in this file.
pub const CASES: &[Case] = &[
    Case {
        name: "health-exclude",
        source: "seeds/001",
        property: "an instance answering 503 on its health path leaves rotation within one check interval (plus the check's timeout) and rejoins once healthy",
        reference: "checks every 100 ms: B never appears again once its check fails ([A, C, A, C, A, C]) and rejoins at the next interval after recovery",
        quick: 0.5,
        run: |b| Box::pin(health_exclude(b)),
    },
    Case {
        name: "probe-loss",
        source: "DESIGN.md",
        property: "with 30% of health checks to b lost and its data path healthy, a strict checker (fall 1) evicts b — a false eviction; one with fall 3 rides it out more often",
        reference: "the question of DESIGN.md §1: does the balancer evict a healthy backend when only its probe path is lossy?",
        quick: 1.0, // few checks in a shorter run make the comparison a coin toss
        run: |b| Box::pin(probe_loss(b)),
    },
    Case {
        name: "data-loss",
        source: "DESIGN.md",
        property: "with 30% of b's data requests failing 503 and its probes passing, the balancer keeps b in rotation while clients fail",
        reference: "the question of DESIGN.md §1: does the balancer keep sending traffic to a backend whose probe passes while real requests fail?",
        quick: 0.5,
        run: |b| Box::pin(data_loss(b)),
    },
    Case {
        name: "grpc-probe-loss",
        source: "DESIGN.md",
        property: "b's gRPC health checks (grpc.health.v1) lost, then answered NOT_SERVING, 30% of the time while every gRPC call to b is served: a checker with fall 1 evicts b under each (a false eviction), no call fails, and b rejoins between evictions",
        reference: "the probe blind spot of DESIGN.md §1 with gRPC's health protocol, as Traefik (mode grpc), Envoy (grpc_health_check) and Kubernetes (grpc probes) check: is a backend evicted when only its health service is flaky?",
        quick: 1.0, // few checks in a shorter run make an eviction a coin toss
        run: |b| Box::pin(grpc_probe_loss(b)),
    },
    Case {
        name: "hysteresis",
        source: "DESIGN.md",
        property: "b's checks take 150 or 250 ms around a 200 ms timeout, its data path healthy: rise/fall 1 flaps, rise/fall 3 flaps under half as often",
        reference: "seeds/004: a backend must not flap while latency hovers around the threshold",
        quick: 1.0, // few checks in a shorter run make the comparison a coin toss
        run: |b| Box::pin(hysteresis(b)),
    },
];

fn checks(interval_ms: u64, fall: u32) -> HealthCheck {
    HealthCheck {
        interval: Duration::from_millis(interval_ms),
        timeout: Duration::from_millis(200),
        rise: 1,
        fall,
        path: "/health".into(),
        expect_body: None,
        grpc: false,
    }
}

async fn health_exclude(b: &mut Bench) -> anyhow::Result<()> {
    let file = include_str!("../../faults/case-health-exclude.toml");
    b.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
    let rules = checks(100, 1);
    let slack = (rules.interval + rules.timeout).as_secs_f64();
    let (lb, _) = b.balancer(|c| c.health = Some(rules)).await?;
    let mut plan = b.plan(lb, "/");
    plan.arrivals = Arrivals::Closed { connections: 6 };
    plan.duration = b.secs(7.0);
    let r = b.load("rr, checks every 100 ms", plan).await?;
    let (sick, well) = (b.timeline_s(2.0), b.timeline_s(5.0));
    let t = b.transitions("b");
    let down = t.iter().find(|t| t.to == "down" && t.at_s >= sick - 0.05);
    let up = t.iter().find(|t| t.to == "up" && t.at_s >= well - 0.05);
    match down {
        Some(d) => b.check(
            "b leaves rotation within interval + timeout of its first 503",
            d.at_s - sick <= slack,
            format!(
                "{:.0} ms after the fault (limit {:.0} ms)",
                (d.at_s - sick) * 1000.0,
                slack * 1000.0
            ),
        ),
        None => b.check(
            "b leaves rotation",
            false,
            "the balancer never marked b down",
        ),
    }
    let during = b.data_between("b", sick + slack + 0.1, well - 0.05);
    b.check(
        "no request reaches b while it is out",
        during == 0 && down.is_some(),
        format!(
            "{during} data requests relayed to b between {:.1} s and {:.1} s",
            sick + slack + 0.1,
            well
        ),
    );
    match up {
        Some(u) => {
            let after = b.data_between("b", u.at_s + 0.1, b.now_s());
            b.check(
                "b rejoins after it is healthy again, and is served",
                u.at_s - well <= slack && after > 0,
                format!(
                    "back {:.0} ms after recovery; {after} requests since",
                    (u.at_s - well) * 1000.0
                ),
            );
        }
        None => b.check("b rejoins", false, "the balancer never marked b up again"),
    }
    b.check(
        "clients see no errors",
        r.errors == 0,
        format!("{} errors; b's data path never failed", r.errors),
    );
    b.figure("load", summary(&r));
    Ok(())
}

async fn probe_loss(b: &mut Bench) -> anyhow::Result<()> {
    let mut evictions = Vec::new();
    for fall in [1, 3] {
        let mut run = b.sub();
        let file = include_str!("../../faults/case-probe-loss.toml");
        let parts = run.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
        let (lb, _) = run.balancer(|c| c.health = Some(checks(100, fall))).await?;
        let mut plan = run.plan(lb, "/");
        plan.arrivals = Arrivals::Closed { connections: 6 };
        plan.duration = run.secs(6.0);
        let label = format!("checker with fall {fall}");
        let r = run.load(&label, plan).await?;
        let downs = run
            .transitions("b")
            .iter()
            .filter(|t| t.to == "down")
            .count();
        let stats = parts[1].stats().await?;
        let lost = stats.probes.iter().filter(|p| p.status == 0).count();
        let data_5xx = stats.responses.get("5xx").copied().unwrap_or(0);
        let share = r.share_of("b");
        b.figure(
            label,
            format!(
                "b evicted {downs} times; {lost} of its last {} probes lost; b served {share:.1}% with {data_5xx} data errors; {}",
                stats.probes.len(),
                summary(&r)
            ),
        );
        evictions.push((downs, r.errors, data_5xx));
        b.absorb(run).await;
    }
    let (strict, tolerant) = (evictions[0], evictions[1]);
    b.check(
        "the strict checker evicts b although its data path is healthy (false eviction)",
        strict.0 > 0 && strict.2 == 0,
        format!("{} evictions, {} data errors at b", strict.0, strict.2),
    );
    b.check(
        "clients see no errors: the loss is on the probe path only",
        strict.1 == 0 && tolerant.1 == 0,
        format!("{} and {} errors", strict.1, tolerant.1),
    );
    b.check(
        "fall 3 evicts less often than fall 1",
        tolerant.0 < strict.0,
        format!("{} against {} evictions", tolerant.0, strict.0),
    );
    Ok(())
}

async fn grpc_probe_loss(b: &mut Bench) -> anyhow::Result<()> {
    // gRPC is HTTP/2 from the client on.
    b.product().require(Feature::ClientH2c)?;
    let runs = [
        (
            "gRPC checks lost",
            include_str!("../../faults/case-grpc-probe-loss.toml"),
        ),
        (
            "gRPC checks NOT_SERVING",
            include_str!("../../faults/case-grpc-not-serving.toml"),
        ),
    ];
    // Per run: evictions of b, returns of b, client errors, b's share.
    let mut seen = Vec::new();
    for (label, file) in runs {
        let mut run = b.sub();
        run.speak_http2();
        let parts = run.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
        let rules = HealthCheck {
            grpc: true,
            ..checks(100, 1)
        };
        let (lb, _) = run.balancer(|c| c.health = Some(rules)).await?;
        let mut plan = run.plan(lb, "/snag.Backend/Echo");
        plan.http2 = true;
        plan.grpc = true;
        plan.arrivals = Arrivals::Closed { connections: 6 };
        plan.duration = run.secs(6.0);
        let r = run.load(&format!("gRPC calls, {label}"), plan).await?;
        let t = run.transitions("b");
        let downs = t.iter().filter(|t| t.to == "down").count();
        let ups = t.iter().filter(|t| t.to == "up").count();
        let stats = parts[1].stats().await?;
        let lost = stats.probes.iter().filter(|p| p.status == 0).count();
        let told = stats.fault_hits.get("not-serving").copied().unwrap_or(0);
        let share = r.share_of("b");
        b.figure(
            label,
            format!(
                "b evicted {downs} times, back {ups} times; of its last {} checks {lost} lost, {told} told NOT_SERVING; b served {share:.1}% of the calls; {}",
                stats.probes.len(),
                summary(&r)
            ),
        );
        seen.push((downs, ups, r.errors, share));
        b.absorb(run).await;
    }
    let (lost, told) = (seen[0], seen[1]);
    b.check(
        "lost gRPC checks evict b although its calls pass (false eviction)",
        lost.0 > 0,
        format!("{} evictions", lost.0),
    );
    b.check(
        "NOT_SERVING answers evict b although its calls pass (false eviction)",
        told.0 > 0,
        format!("{} evictions", told.0),
    );
    b.check(
        "no gRPC call fails: the fault is on the health service only",
        lost.2 == 0 && told.2 == 0,
        format!("{} and {} failed calls", lost.2, told.2),
    );
    b.check(
        "b rejoins between evictions and serves calls",
        lost.1 > 0 && told.1 > 0 && lost.3 > 0.0 && told.3 > 0.0,
        format!(
            "back {} and {} times; {:.1}% and {:.1}% of the calls",
            lost.1, told.1, lost.3, told.3
        ),
    );
    Ok(())
}

async fn data_loss(b: &mut Bench) -> anyhow::Result<()> {
    let file = include_str!("../../faults/case-data-loss.toml");
    let parts = b.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
    let (lb, _) = b.balancer(|c| c.health = Some(checks(100, 1))).await?;
    let mut plan = b.plan(lb, "/");
    plan.arrivals = Arrivals::Closed { connections: 6 };
    plan.duration = b.secs(5.0);
    let r = b.load("rr, checks every 100 ms", plan).await?;
    let t = b.transitions("b");
    b.check(
        "b is never taken out of rotation: its probes pass",
        t.is_empty(),
        format!("{} state changes", t.len()),
    );
    let client_503 = r
        .errors_by_kind
        .get(&crate::lab::load::Kind::Status(503))
        .copied()
        .unwrap_or(0);
    let by_proxy: Vec<u64> = Part::stats_of(&parts)
        .await?
        .iter()
        .map(|s| s.responses.get("5xx").copied().unwrap_or(0))
        .collect();
    b.check(
        "clients fail, and every failure came from b",
        client_503 > 0 && by_proxy[0] == 0 && by_proxy[2] == 0 && by_proxy[1] == client_503,
        format!(
            "{client_503} answers 503 at the client; 5xx relayed by a/b/c: {}/{}/{}",
            by_proxy[0], by_proxy[1], by_proxy[2]
        ),
    );
    let share = 100.0 * r.errors as f64 / r.sent.max(1) as f64;
    b.figure(
        "error share",
        format!("{share:.1}% of requests (b's third × 30%: about 10%)"),
    );
    b.figure("load", summary(&r));
    Ok(())
}

async fn hysteresis(b: &mut Bench) -> anyhow::Result<()> {
    let mut flaps = Vec::new();
    for threshold in [1, 3] {
        let mut run = b.sub();
        let file = include_str!("../../faults/case-hysteresis.toml");
        run.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
        let (lb, _) = run
            .balancer(|c| {
                let mut rules = checks(100, threshold);
                rules.rise = threshold;
                c.health = Some(rules);
            })
            .await?;
        let mut plan = run.plan(lb, "/");
        plan.arrivals = Arrivals::Closed { connections: 4 };
        plan.duration = run.secs(8.0);
        let label = format!("rise {threshold}, fall {threshold}");
        let r = run.load(&label, plan).await?;
        let changes = run.transitions("b").len();
        b.figure(
            label,
            format!("{changes} state changes of b; {}", summary(&r)),
        );
        flaps.push((changes, r.errors));
        b.absorb(run).await;
    }
    b.check(
        "rise/fall 1 flaps: at least 4 state changes",
        flaps[0].0 >= 4,
        format!("{} state changes", flaps[0].0),
    );
    b.check(
        "rise/fall 3 flaps under half as often",
        flaps[1].0 * 2 < flaps[0].0,
        format!("{} against {}", flaps[1].0, flaps[0].0),
    );
    b.check(
        "clients see no errors: only the probe path is slow",
        flaps[0].1 == 0 && flaps[1].1 == 0,
        format!("{} and {} errors", flaps[0].1, flaps[1].1),
    );
    Ok(())
}
