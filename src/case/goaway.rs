//! The cases where a backend ends a connection the balancer holds (#16): HTTP/2
//! GOAWAY — gracefully, after every Nth stream, naming streams in flight as
//! unprocessed, or closing with streams still open — and HTTP/1.1's keep-alive
//! timeout racing the balancer's reuse. The evidence: the client's answers by kind,
//! the interposers' GOAWAY and stream accounting, duplicates by transaction id, and
//! the balancer's own view of b.

use std::time::Duration;

use super::{Bench, Case, share::summary};
use crate::case::bench::Part;
use crate::{
    events::Stats,
    lab::{
        balancer::{BackendProtocol, select::Strategy},
        load::{Arrivals, Report},
    },
};

/// The cases in this file.
pub const CASES: &[Case] = &[
    Case {
        name: "goaway-drain",
        source: "seeds/004",
        property: "LB-05 over HTTP/2 to the backends: b drained by the balancer, then a graceful GOAWAY on its connections under keep-alive GETs, POSTs with transaction ids and HTTP/2 streams: no client error, no duplicate, nothing new reaches b, and the balancer's view of b never turns DOWN",
        reference: "LB-05: no new connections (L4) or requests (L7); existing flows by policy; resets within the threshold — here the existing flows end by GOAWAY",
        quick: 0.5,
        run: |b| Box::pin(super::lb::drain::goaway_drain(b)),
    },
    Case {
        name: "goaway-every-n",
        source: "DESIGN.md",
        property: "every backend sends GOAWAY after 40 streams on each connection (AWS ALB's 10,000, scaled down), the streams after the 40th unprocessed: no client error and no duplicate; client errors per 10,000 requests reported",
        reference: "AWS ALB closes an HTTP/2 connection with GOAWAY after 10,000 requests; clients that do not retry the unprocessed streams see sporadic 502s",
        quick: 0.5,
        run: |b| Box::pin(every_n(b)),
    },
    Case {
        name: "goaway-unprocessed",
        source: "DESIGN.md",
        property: "b's GOAWAY names a last stream below the ones in flight: the unprocessed streams never reached b and are retried elsewhere, not answered 5xx, and none is processed twice",
        reference: "RFC 9113 §6.8: streams above last-stream-id were not processed and can be retried, even non-idempotent ones",
        quick: 0.5,
        run: |b| Box::pin(unprocessed(b)),
    },
    Case {
        name: "goaway-no-error",
        source: "DESIGN.md",
        property: "b ends each connection after 20 streams with a graceful NO_ERROR GOAWAY: no client sees an error, the balancer does not mark b down, and b keeps its share",
        reference: "a NO_ERROR GOAWAY is a connection's orderly end, not a failure of the backend",
        quick: 0.5,
        run: |b| Box::pin(no_error(b)),
    },
    Case {
        name: "goaway-open-streams",
        source: "DESIGN.md",
        property: "b sends GOAWAY INTERNAL_ERROR and closes with streams still open: what the clients see, by kind; a POST that b may have processed is never replayed (no duplicate)",
        reference: "streams at or below last-stream-id may have been processed: only idempotent ones may be retried",
        quick: 0.5,
        run: |b| Box::pin(open_streams(b)),
    },
    Case {
        name: "keepalive-race",
        source: "DESIGN.md",
        property: "HTTP/1.1 backends close keep-alive connections idle for 10 ms, just as the balancer reuses them, under 300 requests/s open loop: no GET fails (a GET on a connection the backend was closing is retried), no transaction is processed twice; failed GETs and POSTs per 10,000 reported",
        reference: "a backend keep-alive timeout shorter than the balancer's idle timeout: sporadic 502s on reused connections (AWS ALB, nginx and Node.js incidents)",
        quick: 0.5,
        run: |b| Box::pin(keepalive_race(b)),
    },
];

/// What a GOAWAY run gives the checks.
struct Seen {
    gets: Report,
    posts: Report,
    /// Each interposer's accounting, a, b, c.
    stats: Vec<Stats>,
    /// b's changes to DOWN in the balancer's view.
    downs: Vec<String>,
    /// Requests the balancer retried, where it counts them.
    retries: Option<u64>,
}

impl Seen {
    /// Client errors the balancer is answerable for: those less the requests that
    /// failed between snag's interposers and the backends (snag's side of the
    /// wire, which the report names apart).
    fn errors(&self) -> u64 {
        (self.gets.errors + self.posts.errors).saturating_sub(self.snag_errors())
    }

    /// Requests an interposer could not relay to its backend.
    fn snag_errors(&self) -> u64 {
        self.stats.iter().map(|s| s.upstream_errors).sum()
    }

    fn sent(&self) -> u64 {
        self.gets.sent + self.posts.sent
    }

    fn duplicates(&self) -> usize {
        self.stats.iter().map(|s| s.duplicates.len()).sum()
    }

    fn goaways(&self) -> u64 {
        self.stats.iter().map(|s| s.goaways).sum()
    }

    fn unprocessed(&self) -> u64 {
        self.stats.iter().map(|s| s.streams_unprocessed).sum()
    }

    fn errors_by_kind(&self) -> String {
        let mut kinds = self.gets.errors_by_kind.clone();
        for (k, n) in &self.posts.errors_by_kind {
            *kinds.entry(*k).or_default() += n;
        }
        if kinds.is_empty() {
            return "none".into();
        }
        kinds
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Three backends behind interposers playing `file`, a balancer speaking h2c to
/// them (round robin, passive marking after 3 failures, one retry), and keep-alive
/// GETs beside POSTs with transaction ids for 4 s, 6 connections each.
async fn run(b: &mut Bench, file: &'static str) -> anyhow::Result<Seen> {
    b.speak_http2();
    run_with(b, file, Arrivals::Closed { connections: 6 }, 3).await
}

/// `max_fails`: passive marking after that many failures in 10 s (0: off).
async fn run_with(
    b: &mut Bench,
    file: &'static str,
    arrivals: Arrivals,
    max_fails: u32,
) -> anyhow::Result<Seen> {
    let parts = b.parts(&["a", "b", "c"], Some(file), |_, _| {}).await?;
    let (lb, balancer) = b
        .balancer(|c| {
            c.strategy = Strategy::Rr;
            c.max_fails = max_fails;
            c.fail_timeout = Duration::from_secs(10);
            c.retries = 1;
            c.timeout = Duration::from_secs(2);
        })
        .await?;
    let mut gets = b.plan(lb, "/");
    gets.arrivals = arrivals;
    gets.duration = b.secs(4.0);
    let posts = b.posts_with_ids(&gets);
    let how = match gets.arrivals {
        Arrivals::Closed { connections } => format!("{connections} connections"),
        Arrivals::Open { rate, .. } => format!("{rate:.0}/s open loop"),
    };
    let mut reports = b
        .loads(vec![
            (format!("keep-alive GETs, {how}"), gets),
            (format!("POSTs with x-request-id, {how}"), posts),
        ])
        .await?
        .into_iter();
    let (gets, posts) = (
        reports.next().expect("two runs"),
        reports.next().expect("two runs"),
    );
    let stats = Part::stats_of(&parts).await?;
    let downs = b
        .transitions("b")
        .into_iter()
        .filter(|t| t.to == "down")
        .map(|t| format!("{:.2} s {} → down ({})", t.at_s, t.from, t.why))
        .collect();
    let retries = balancer.retries().await;
    let seen = Seen {
        gets,
        posts,
        stats,
        downs,
        retries,
    };
    b.figure("GETs", summary(&seen.gets));
    b.figure("POSTs", summary(&seen.posts));
    b.figure(
        "GOAWAY",
        format!(
            "{} sent, {} streams declared unprocessed; the balancer retried {}",
            seen.goaways(),
            seen.unprocessed(),
            seen.retries
                .map_or("an uncounted number of".to_string(), |n| n.to_string())
        ),
    );
    b.figure("client errors", seen.errors_by_kind());
    if seen.snag_errors() > 0 {
        b.note(format!(
            "{} requests failed between snag's interposers and the backends (upstream_errors): not counted against the balancer",
            seen.snag_errors()
        ));
    }
    Ok(seen)
}

fn no_duplicate(b: &mut Bench, seen: &Seen) {
    b.check(
        "no transaction processed twice",
        seen.duplicates() == 0 && seen.posts.sent > 0,
        format!(
            "{} ids seen twice among {} POSTs",
            seen.duplicates(),
            seen.posts.sent
        ),
    );
}

fn not_down(b: &mut Bench, seen: &Seen) {
    b.check(
        "the balancer does not mark b down for a GOAWAY",
        seen.downs.is_empty(),
        if seen.downs.is_empty() {
            "no DOWN in the balancer's view of b".to_string()
        } else {
            seen.downs.join("; ")
        },
    );
}

async fn every_n(b: &mut Bench) -> anyhow::Result<()> {
    let seen = run(b, include_str!("../../faults/case-goaway-every-n.toml")).await?;
    let per_10k = seen.errors() as f64 * 10_000.0 / seen.sent().max(1) as f64;
    b.check(
        "no client error: the streams after each 40th are retried",
        seen.errors() == 0 && seen.goaways() > 0,
        format!(
            "{} errors in {} requests ({per_10k:.1} per 10,000) over {} GOAWAYs",
            seen.errors(),
            seen.sent(),
            seen.goaways()
        ),
    );
    no_duplicate(b, &seen);
    b.figure("per 10,000", format!("{per_10k:.1} client errors"));
    Ok(())
}

async fn unprocessed(b: &mut Bench) -> anyhow::Result<()> {
    let seen = run(b, include_str!("../../faults/case-goaway-unprocessed.toml")).await?;
    let status_5xx: u64 = [&seen.gets, &seen.posts]
        .iter()
        .flat_map(|r| r.errors_by_kind.iter())
        .filter(|(k, _)| matches!(k, crate::lab::load::Kind::Status(s) if *s >= 500))
        .map(|(_, n)| n)
        .sum();
    b.check(
        "the unprocessed streams are retried, not answered with an error",
        seen.errors() == 0 && seen.unprocessed() > 0,
        format!(
            "{} streams declared unprocessed; {} client errors ({status_5xx} of them 5xx)",
            seen.unprocessed(),
            seen.errors()
        ),
    );
    no_duplicate(b, &seen);
    Ok(())
}

async fn no_error(b: &mut Bench) -> anyhow::Result<()> {
    let seen = run(b, include_str!("../../faults/case-goaway-no-error.toml")).await?;
    b.check(
        "no client error: a NO_ERROR GOAWAY loses nothing",
        seen.errors() == 0 && seen.goaways() > 0,
        format!(
            "{} errors over {} GOAWAYs ({})",
            seen.errors(),
            seen.goaways(),
            seen.errors_by_kind()
        ),
    );
    not_down(b, &seen);
    let served: Vec<u64> = seen
        .stats
        .iter()
        .map(|s| s.requests.get("data").copied().unwrap_or(0))
        .collect();
    let share = 100.0 * served[1] as f64 / served.iter().sum::<u64>().max(1) as f64;
    b.check(
        "b keeps its share: at least 25% of the requests (a third is even)",
        share >= 25.0,
        format!(
            "b relayed {share:.1}% ({} of {})",
            served[1],
            served.iter().sum::<u64>()
        ),
    );
    no_duplicate(b, &seen);
    Ok(())
}

async fn open_streams(b: &mut Bench) -> anyhow::Result<()> {
    let seen = run(
        b,
        include_str!("../../faults/case-goaway-open-streams.toml"),
    )
    .await?;
    no_duplicate(b, &seen);
    b.note(format!(
        "what the clients saw: {} errors in {} requests ({}); GETs may be retried, POSTs at or below the last stream id must not be",
        seen.errors(),
        seen.sent(),
        seen.errors_by_kind()
    ));
    Ok(())
}

async fn keepalive_race(b: &mut Bench) -> anyhow::Result<()> {
    // Keep-alive timeouts racing reuse are HTTP/1.1's.
    b.speak(BackendProtocol::H1);
    let open = Arrivals::Open {
        rate: 150.0,
        shape: None,
    };
    // Passive marking off: the question is the 502s, not what marking makes of them.
    let seen = run_with(
        b,
        include_str!("../../faults/case-keepalive-race.toml"),
        open,
        0,
    )
    .await?;
    let closed: u64 = seen
        .stats
        .iter()
        .map(|s| s.fault_hits.get("keepalive_timeout").copied().unwrap_or(0))
        .sum();
    let per_10k = |errors: u64, sent: u64| errors as f64 * 10_000.0 / sent.max(1) as f64;
    b.check(
        "GETs see no error: a GET sent on a connection the backend was closing is retried",
        seen.gets.errors == 0 && closed > 0,
        format!(
            "{} errors in {} GETs ({:.1} per 10,000) while the backends closed {closed} idle connections",
            seen.gets.errors,
            seen.gets.sent,
            per_10k(seen.gets.errors, seen.gets.sent)
        ),
    );
    no_duplicate(b, &seen);
    b.figure(
        "per 10,000",
        format!(
            "{:.1} failed GETs, {:.1} failed POSTs ({})",
            per_10k(seen.gets.errors, seen.gets.sent),
            per_10k(seen.posts.errors, seen.posts.sent),
            seen.errors_by_kind()
        ),
    );
    b.note("a POST that went out on a connection the backend was closing may or may not have been read: retrying it risks a duplicate, so a balancer answering 502 is within its rights; keeping its idle timeout below the backends' keep-alive timeout is the cure");
    Ok(())
}
