//! LB-05 and goaway-drain: a backend drained under keep-alive GETs, POSTs with
//! transaction ids and HTTP/2 streams, the balancer speaking HTTP/1.1 to it, or
//! HTTP/2 so that the interposer's drain is a GOAWAY.

use std::time::Duration;

use crate::{
    case::{Bench, bench::Part, share::summary},
    lab::driver::Feature,
    lab::{balancer::select::Strategy, load::Arrivals},
};

pub(super) async fn lb05(b: &mut Bench) -> anyhow::Result<()> {
    drain_under_load(b, include_str!("../../../faults/case-LB-05.toml")).await?;
    b.note("the balancer speaks HTTP/1.1 to the backends in this case: the interposer's drain closes those connections with `Connection: close`; goaway-drain is the same drain over HTTP/2 to the backends");
    Ok(())
}

/// goaway-drain: LB-05 over h2c to the backends, so that the interposer's drain is
/// a graceful GOAWAY on the balancer's connections to b; besides LB-05's checks,
/// the GOAWAY and the connections closing after it are no failure of b.
pub(crate) async fn goaway_drain(b: &mut Bench) -> anyhow::Result<()> {
    b.speak_http2();
    let parts = drain_under_load(b, include_str!("../../../faults/case-goaway-drain.toml")).await?;
    let downs: Vec<String> = b
        .transitions("b")
        .into_iter()
        .filter(|t| t.to == "down")
        .map(|t| format!("{:.2} s {} → {} ({})", t.at_s, t.from, t.to, t.why))
        .collect();
    b.check(
        "the balancer does not take the GOAWAY for a failure: b never turns DOWN",
        downs.is_empty(),
        if downs.is_empty() {
            "no DOWN in the balancer's view of b".to_string()
        } else {
            downs.join("; ")
        },
    );
    let b_stats = parts[1].stats().await?;
    b.figure(
        "GOAWAY",
        format!(
            "{} sent on the balancer's connections to b ({} connections in all)",
            b_stats.goaways, b_stats.connections
        ),
    );
    Ok(())
}

/// The drain itself and LB-05's checks; the parts.
async fn drain_under_load(b: &mut Bench, file: &'static str) -> anyhow::Result<Vec<Part>> {
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
    let posts = b.posts_with_ids(&gets);
    let mut streams = gets.clone();
    streams.http2 = true;
    streams.arrivals = Arrivals::Closed { connections: 4 };
    let mut runs = vec![
        ("keep-alive GETs, 6 connections".into(), gets),
        ("POSTs with x-request-id, 6 connections".into(), posts),
    ];
    match b.product().require(Feature::ClientH2c) {
        Ok(()) => runs.push(("HTTP/2 streams, 4 long-lived connections".into(), streams)),
        Err(e) => b.note(format!("{e}: the HTTP/2 streams run is left out")),
    }
    let reports = b.loads(runs).await?;
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
    let stats = Part::stats_of(&parts).await?;
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
    Ok(parts)
}
