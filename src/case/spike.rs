//! The spikes of seeds/002: an open-loop rate of 100/s jumps to 900/s for three
//! seconds against a pool of 8 workers × 25 ms (320/s) with an unbounded queue, and
//! the run keeps watching after the traffic stops.

use std::time::Duration;

use super::{Bench, Case};
use crate::lab::load::{Arrivals, Kind, Report, Row, Shape};
use crate::report::EventKind;

/// The cases in this file.
pub const CASES: &[Case] = &[
    Case {
        name: "spike-step",
        source: "seeds/002",
        property: "a step from 100 to 900/s for 3 s: the generator keeps its promise, and the failure outlasts the spike — the queue it built empties seconds after the rate is back to normal",
        reference: "second 4: 567 timeouts; nothing succeeds from second 5; queue 1927 at second 7, empty at 17 s, 10 s after the spike; 737 ok of 3605",
        quick: 0.5,
        run: |b| Box::pin(spike(b, Variant::Step)),
    },
    Case {
        name: "spike-ramp",
        source: "seeds/002",
        property: "the same peak as a ramp gives a warning: slow successes before the first timeout",
        reference: "second 5: 460 answers at a mean of 522 ms with 38 timeouts; 1241 ok of 2411; queue empty 5 s after the spike",
        quick: 0.5,
        run: |b| Box::pin(spike(b, Variant::Ramp)),
    },
    Case {
        name: "spike-retry",
        source: "seeds/002",
        property: "one retry 200 ms after a timeout amplifies the spike: the peak second sends far more than is offered, successes do not rise, and TIME_WAIT sockets pile up against the port pool",
        reference: "peak 1797 sent against 907; 755 ok against 737; backlog 3913 against 1927; 7599 TIME_WAIT against a pool of 16 384",
        quick: 0.5,
        run: |b| Box::pin(spike(b, Variant::Retry)),
    },
];

#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Step,
    Ramp,
    Retry,
}

/// Rows for the seconds from `from` (case seconds of the run's clock) on.
fn after(rows: &[Row], from: f64) -> impl Iterator<Item = &Row> {
    rows.iter().filter(move |r| r.second as f64 >= from)
}

async fn spike(b: &mut Bench, variant: Variant) -> anyhow::Result<()> {
    let parts = b
        .parts(&["s"], None, |_, c| {
            c.workers = Some(8);
            c.work = Duration::from_millis(25);
        })
        .await?;
    let (lb, _) = b.balancer(|c| c.timeout = Duration::from_secs(60)).await?;
    let (from, to) = (b.secs(4.0), b.secs(7.0));
    let shape = match variant {
        Variant::Ramp => Shape::Ramp {
            low: 100.0,
            high: 900.0,
            from,
            to,
        },
        _ => Shape::Step {
            peak: 900.0,
            from,
            to,
        },
    };
    let mut plan = b.plan(lb, "/api");
    plan.arrivals = Arrivals::Open {
        rate: 100.0,
        shape: Some(shape),
    };
    plan.duration = b.secs(12.0);
    plan.watch = b.secs(28.0);
    plan.deadline = Some(Duration::from_secs(1));
    plan.stats_url = Some(crate::lab::load::Target {
        addr: parts[0].backend_addr,
        tls: false,
        host: parts[0].backend_addr.to_string(),
        path: "/stats".into(),
    });
    if variant == Variant::Retry {
        plan.retries = 1;
        plan.retry_delay = Duration::from_millis(200);
    }
    b.event(EventKind::Action, "spike starts");
    let label = match variant {
        Variant::Step => "step 100 → 900/s",
        Variant::Ramp => "ramp 100 → 900/s",
        Variant::Retry => "step 100 → 900/s, one retry after 200 ms",
    };
    let r = b.load(label, plan).await?;
    let spike_end = to.as_secs_f64();
    let offered = r.offered.unwrap_or(0);
    let first_sends = r.sent - r.retries;
    let kept = first_sends.abs_diff(offered) as f64 <= offered as f64 * 0.01;
    b.check(
        "the generator kept its promise: first sends within 1% of offered",
        kept,
        format!("{first_sends} sent of {offered} offered"),
    );
    let empty = after(&r.rows, spike_end)
        .find(|row| row.depth == Some(0))
        .map(|row| row.second);
    let depth_peak = r.rows.iter().filter_map(|row| row.depth).max().unwrap_or(0);
    let first_ok = after(&r.rows, spike_end)
        .find(|row| row.ok > 0 && row.errors.is_empty())
        .map(|row| row.second);
    b.figure(
        "queue",
        match empty {
            Some(s) => format!(
                "peak {depth_peak}; empty at {s} s, {:.1} s after the spike ended",
                s as f64 - spike_end
            ),
            None => format!("peak {depth_peak}; still not empty when the watch ended"),
        },
    );
    b.figure(
        "first clean second after the spike",
        first_ok.map_or("none while traffic lasted".into(), |s| format!("{s} s")),
    );
    let timeouts = r.errors_by_kind.get(&Kind::Timeout).copied().unwrap_or(0);
    b.figure(
        "totals",
        format!(
            "offered {offered}, sent {} (retries {}), ok {}, timeouts {timeouts}",
            r.sent, r.retries, r.ok
        ),
    );
    match variant {
        Variant::Step => {
            b.check(
                "the failure outlasts the spike: the queue empties more than a second after it ends",
                empty.is_none_or(|s| s as f64 > spike_end + 1.0) && depth_peak > 0,
                format!(
                    "queue peak {depth_peak}, empty at {}",
                    empty.map_or("never".into(), |s| format!("{s} s (spike ended at {spike_end:.1} s)"))
                ),
            );
        }
        Variant::Ramp => {
            let base = mean_before(&r, from.as_secs_f64());
            let first_timeout = r
                .rows
                .iter()
                .find(|row| row.errors.contains_key(&Kind::Timeout))
                .map(|row| row.second);
            let warning = r
                .rows
                .iter()
                .take_while(|row| Some(row.second) != first_timeout)
                .find(|row| row.ok > 0 && row.mean_ms.is_some_and(|m| m >= 5.0 * base));
            b.check(
                "a warning second: successes at 5× the base latency before the first timeout",
                warning.is_some(),
                match warning {
                    Some(w) => format!(
                        "second {}: {} ok at {:.0} ms mean (base {base:.0} ms); first timeout at {}",
                        w.second,
                        w.ok,
                        w.mean_ms.unwrap_or(0.0),
                        first_timeout.map_or("none".into(), |s| format!("{s} s"))
                    ),
                    None => format!("no slow second before the first timeout (base {base:.0} ms)"),
                },
            );
        }
        Variant::Retry => {
            // The second where retries weigh most against what was offered.
            let worst = r
                .rows
                .iter()
                .filter_map(|row| row.offered.filter(|o| *o > 0.0).map(|o| (row, o)))
                .max_by(|a, b| (a.0.sent as f64 / a.1).total_cmp(&(b.0.sent as f64 / b.1)));
            match worst {
                Some((row, offered)) => b.check(
                    "retries amplify the spike: a second sends over 1.5× its offered rate",
                    row.sent as f64 > 1.5 * offered,
                    format!(
                        "second {}: {} sent ({} retries) against {offered:.0} offered",
                        row.second, row.sent, row.retries
                    ),
                ),
                None => b.check(
                    "retries amplify the spike",
                    false,
                    "no second offered traffic",
                ),
            }
            match &r.ports {
                Some(p) => {
                    b.check(
                        "abandoned connections leave TIME_WAIT sockets, counted against the pool",
                        p.peak_time_wait > p.time_wait_before,
                        format!(
                            "TIME_WAIT towards the balancer: {} before, peak {}, {} after, of a pool of {}",
                            p.time_wait_before, p.peak_time_wait, p.time_wait_after, p.pool
                        ),
                    );
                }
                None => b.check("TIME_WAIT is counted", false, "sockets could not be read"),
            }
        }
    }
    Ok(())
}

/// Mean latency of the seconds before `t`, ms.
fn mean_before(r: &Report, t: f64) -> f64 {
    let rows: Vec<f64> = r
        .rows
        .iter()
        .filter(|row| (row.second as f64) < t)
        .filter_map(|row| row.mean_ms)
        .collect();
    if rows.is_empty() {
        return f64::INFINITY;
    }
    rows.iter().sum::<f64>() / rows.len() as f64
}
