//! What the soak does to the target while the load runs: faults added, changed and
//! removed every second, and a drain every so often.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use rand::RngExt;
use tokio::time::Instant;

use super::{DRAIN_FOR, PROXIES, target::Api};
use crate::shutdown::Shutdown;

/// Every second, one change per proxy through the API: a fault added, changed or
/// removed, at most three on each at a time.
pub(super) async fn churn(
    api: Api,
    seed: u64,
    calls: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Shutdown,
) {
    let mut rng = crate::seed::rng(seed, &[b"soak churn"]);
    let mut on: [Vec<(String, &'static str)>; 4] = Default::default();
    let mut next = 0u64;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.wait() => return,
            _ = tick.tick() => {}
        }
        for (i, (proxy, _, _)) in PROXIES.iter().enumerate() {
            let faults = &mut on[i];
            let roll: f64 = rng.random();
            let (method, path, body) = if faults.is_empty() || (roll < 0.5 && faults.len() < 3) {
                next += 1;
                let name = format!("f{next}");
                let (kind, attributes, toxicity) = fault_for(i, &mut rng);
                let stream = if rng.random_bool(0.5) {
                    "upstream"
                } else {
                    "downstream"
                };
                faults.push((name.clone(), kind));
                let body = serde_json::json!({ "name": name, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes });
                ("POST", format!("/proxies/{proxy}/toxics"), body.to_string())
            } else if roll < 0.75 {
                let (name, kind) = faults[rng.random_range(0..faults.len())].clone();
                let (attributes, toxicity) = loop {
                    let (k, a, t) = fault_for(i, &mut rng);
                    if k == kind {
                        break (a, t);
                    }
                };
                let body = serde_json::json!({ "toxicity": toxicity, "attributes": attributes });
                (
                    "POST",
                    format!("/proxies/{proxy}/toxics/{name}"),
                    body.to_string(),
                )
            } else {
                let (name, _) = faults.remove(rng.random_range(0..faults.len()));
                (
                    "DELETE",
                    format!("/proxies/{proxy}/toxics/{name}"),
                    String::new(),
                )
            };
            calls.fetch_add(1, Ordering::Relaxed);
            if let Err(err) = api.expect_2xx(method, &path, &body).await
                && let Ok(mut e) = errors.lock()
            {
                e.push(err);
            }
        }
    }
}

/// A fault for proxy `i`: its type, attributes and toxicity.
fn fault_for(i: usize, rng: &mut impl rand::Rng) -> (&'static str, serde_json::Value, f64) {
    use serde_json::json;
    let pick = rng.random_range(0..4u32);
    match (PROXIES[i].0, pick) {
        ("tcp-clean", 0) => (
            "latency",
            json!({ "latency": rng.random_range(0..20), "jitter": rng.random_range(0..5) }),
            1.0,
        ),
        ("tcp-clean", 1) => (
            "slicer",
            json!({ "average_size": rng.random_range(200..2000), "size_variation": 100, "delay": rng.random_range(0..2) }),
            1.0,
        ),
        ("tcp-clean", 2) => (
            "bandwidth",
            json!({ "rate": rng.random_range(1000..50_000) }),
            1.0,
        ),
        ("tcp-clean", _) => (
            "loss",
            json!({ "probability": 0.05, "rto": rng.random_range(1..20) }),
            1.0,
        ),
        ("tcp-chaos", 0) => (
            "reset_peer",
            json!({ "timeout": rng.random_range(0..500) }),
            0.05,
        ),
        ("tcp-chaos", 1) => (
            "limit_data",
            json!({ "bytes": rng.random_range(1000..100_000) }),
            0.2,
        ),
        ("tcp-chaos", 2) => (
            "timeout",
            json!({ "timeout": rng.random_range(100..2000) }),
            0.05,
        ),
        ("tcp-chaos", _) => (
            "slow_close",
            json!({ "delay": rng.random_range(10..100) }),
            1.0,
        ),
        ("http-clean", _) => (
            "http_delay",
            json!({ "delay": rng.random_range(0..20) }),
            1.0,
        ),
        (_, 0) => ("http_status", json!({ "status": 503 }), 0.1),
        (_, 1) => ("bad_body", json!({ "mode": "garbage" }), 0.1),
        (_, 2) => (
            "reset_mid_response",
            json!({ "bytes": rng.random_range(0..100) }),
            0.1,
        ),
        (_, _) => (
            "drop_request",
            json!({ "timeout": rng.random_range(10..500) }),
            0.1,
        ),
    }
}

/// A drain of `http-clean` (graceful) and `tcp-chaos` (2 s deadline) at half of
/// `every`, then each `every`; each ended after [`DRAIN_FOR`].
pub(super) async fn drain_every(
    api: Api,
    every: Duration,
    started: Instant,
    at: Arc<Mutex<Vec<f64>>>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Shutdown,
) {
    let drains = [
        ("http-clean", r#"{"mode":"graceful"}"#),
        ("tcp-chaos", r#"{"mode":"deadline","timeout":2000}"#),
    ];
    let mut next = started + every / 2;
    loop {
        tokio::select! {
            _ = stop.wait() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        if let Ok(mut a) = at.lock() {
            a.push(started.elapsed().as_secs_f64());
        }
        for (proxy, body) in drains {
            let path = format!("/proxies/{proxy}/drain");
            if let Err(e) = api.expect_2xx("POST", &path, body).await
                && let Ok(mut errs) = errors.lock()
            {
                errs.push(e);
            }
        }
        tokio::select! {
            _ = stop.wait() => {}
            _ = tokio::time::sleep(DRAIN_FOR) => {}
        }
        for (proxy, _) in drains {
            let path = format!("/proxies/{proxy}/drain");
            if let Err(e) = api.expect_2xx("DELETE", &path, "").await
                && let Ok(mut errs) = errors.lock()
            {
                errs.push(e);
            }
        }
        next += every;
    }
}
