//! The soak's sampler: snag's figures once a second through the load, and once it
//! has let go. A sample that cannot be read while snag runs is a miss, not the end.

use std::{net::SocketAddr, time::Duration};

use tokio::time::Instant;

use super::Sample;
use super::{FD_SLACK, Note, Row, Tally, target::Target};
use crate::shutdown::Shutdown;

/// What the sampler reads: the target, or a stand-in in tests.
pub(super) trait Sampled {
    /// Its figures now.
    async fn sample(&self) -> anyhow::Result<Sample>;
    /// Whether it still runs.
    fn alive(&mut self) -> bool;
}

impl Sampled for Target {
    async fn sample(&self) -> anyhow::Result<Sample> {
        Target::sample(self).await
    }

    fn alive(&mut self) -> bool {
        Target::alive(self)
    }
}

/// A sample the soak could not read, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Missed {
    /// Seconds since the load began, when it gave up.
    pub t: f64,
    /// What went wrong.
    pub error: String,
}

/// Waits, with a deadline, for snag to let go of everything once the load has
/// stopped; the last sample and the idle upstream connections it may keep, or why
/// no sample could be read by the deadline.
pub(super) async fn settle(
    target: &impl Sampled,
    baseline: &Sample,
    http_backend: SocketAddr,
    pooled: impl Fn(SocketAddr) -> u64,
) -> Result<(Sample, u64), String> {
    let mut after = Err("no sample was read".to_string());
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match target.sample().await {
            Ok(s) => {
                let pooled = pooled(http_backend);
                let settled = s.connections == 0 && s.fds <= baseline.fds + pooled + FD_SLACK;
                after = Ok((s, pooled));
                if settled {
                    break;
                }
            }
            // A failed read says nothing about what snag let go of: the last good
            // sample stands, or the error if there is none.
            Err(err) if after.is_err() => after = Err(format!("{err:#}")),
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    after
}

/// Samples `target` and the tallies once a second (or as fast as a sample allows)
/// until `duration` from `started` has passed, a [`Note::Second`] each time; the
/// samples, those that could not be read while snag lived, and `true` if `shutdown`
/// cut it short.
pub(super) async fn observe(
    target: &mut impl Sampled,
    tallies: &[Tally; 4],
    started: Instant,
    duration: Duration,
    shutdown: &Shutdown,
    note: &mut dyn FnMut(Note),
) -> (Vec<Sample>, Vec<Missed>, bool) {
    let mut samples = Vec::new();
    let mut missed = Vec::new();
    let mut last_ok = 0;
    let mut interrupted = false;
    // The load runs for its duration on the clock: a sample a second while a sample
    // takes less (on a busy machine reading the API under load can take longer, and
    // the soak must not stretch with it).
    let mut second = 0;
    while started.elapsed() < duration {
        second = (started.elapsed().as_secs() + 1).max(second + 1);
        let next = (started + Duration::from_secs(second)).min(started + duration);
        tokio::select! {
            _ = shutdown.wait() => { interrupted = true; break }
            _ = tokio::time::sleep_until(next) => {}
        }
        let mut sample = match target.sample().await {
            Ok(sample) => sample,
            // Gone: the checks say what happened to it.
            Err(_) if !target.alive() => break,
            Err(err) => {
                let miss = Missed {
                    t: started.elapsed().as_secs_f64(),
                    error: format!("{err:#}"),
                };
                note(Note::SampleMissed(&miss));
                missed.push(miss);
                continue;
            }
        };
        let ok: u64 = tallies.iter().map(|t| Tally::get(&t.ok)).sum();
        sample.t = started.elapsed().as_secs_f64();
        sample.ok_per_s = ok - last_ok;
        last_ok = ok;
        let verified: u64 = tallies.iter().map(|t| Tally::get(&t.verified)).sum();
        let ended: u64 = tallies.iter().map(|t| Tally::get(&t.ended)).sum();
        let failed: u64 = tallies
            .iter()
            .map(|t| Tally::get(&t.failed) + Tally::get(&t.corrupted))
            .sum();
        note(Note::Second(&Row {
            sample,
            verified_bytes: verified,
            ended,
            failed,
        }));
        samples.push(sample);
    }
    (samples, missed, interrupted)
}

#[cfg(test)]
mod tests {
    use std::{
        cell::Cell,
        sync::atomic::{AtomicU64, Ordering},
    };

    use super::*;

    /// A target whose reads (counted from 1) in `fail_from..fail_until` fail, each
    /// read taking `takes`; alive or not, as `alive` says.
    struct Stub {
        reads: Cell<u32>,
        fail_from: u32,
        fail_until: u32,
        takes: Duration,
        alive: bool,
    }

    impl Stub {
        fn new(fail_from: u32, fail_until: u32, takes: Duration, alive: bool) -> Stub {
            Stub {
                reads: Cell::new(0),
                fail_from,
                fail_until,
                takes,
                alive,
            }
        }
    }

    impl Sampled for Stub {
        async fn sample(&self) -> anyhow::Result<Sample> {
            let n = self.reads.get() + 1;
            self.reads.set(n);
            tokio::time::sleep(self.takes).await;
            anyhow::ensure!(
                !(self.fail_from..self.fail_until).contains(&n),
                "GET /metrics: no answer within 10 s"
            );
            Ok(Sample {
                connections: u64::from(n),
                ..Sample::default()
            })
        }

        fn alive(&mut self) -> bool {
            self.alive
        }
    }

    async fn run(stub: &mut Stub, secs: u64) -> (Vec<Sample>, Vec<Missed>, bool, usize) {
        let tallies: [Tally; 4] = Default::default();
        tallies[0].ok.fetch_add(7, Ordering::Relaxed);
        let mut notes = 0;
        let (samples, missed, interrupted) = observe(
            stub,
            &tallies,
            Instant::now(),
            Duration::from_secs(secs),
            &Shutdown::new(),
            &mut |_| notes += 1,
        )
        .await;
        (samples, missed, interrupted, notes)
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_fails_while_snag_runs_is_a_miss_and_the_load_goes_on() {
        // The third and fourth reads time out (10 s each); snag is still running.
        let mut stub = Stub::new(3, 5, Duration::from_millis(10), true);
        let (samples, missed, interrupted, notes) = run(&mut stub, 60).await;
        assert!(!interrupted);
        assert_eq!(missed.len(), 2);
        assert_eq!(missed[0].error, "GET /metrics: no answer within 10 s");
        assert!((2.9..3.1).contains(&missed[0].t), "{}", missed[0].t);
        assert_eq!(samples.len(), 58, "a sample each second but the two missed");
        assert!(samples.last().unwrap().t >= 59.0);
        assert_eq!(notes, 60, "each second and each miss is told");
        assert_eq!(samples[0].ok_per_s, 7);
        assert_eq!(samples[1].ok_per_s, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_target_that_is_gone_ends_the_sampling() {
        let mut stub = Stub::new(3, u32::MAX, Duration::ZERO, false);
        let (samples, missed, _, _) = run(&mut stub, 60).await;
        assert_eq!(samples.len(), 2);
        assert!(
            missed.is_empty(),
            "a gone target is not a miss: the checks say"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn slow_reads_thin_the_samples_but_not_the_length_of_the_load() {
        // Each read takes 2.5 s: the one-second grid skips what has passed.
        let started = Instant::now();
        let mut stub = Stub::new(u32::MAX, u32::MAX, Duration::from_millis(2500), true);
        let (samples, missed, _, _) = run(&mut stub, 60).await;
        assert!(missed.is_empty());
        let elapsed = started.elapsed();
        assert!(
            (Duration::from_secs(60)..Duration::from_secs(63)).contains(&elapsed),
            "{elapsed:?}"
        );
        assert!((17..=21).contains(&samples.len()), "{}", samples.len());
        let t: Vec<f64> = samples.iter().map(|s| s.t).collect();
        assert!(t.windows(2).all(|w| w[1] - w[0] >= 2.5), "{t:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn settle_keeps_reading_past_a_failed_read() {
        let baseline = Sample::default();
        let backend: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let calls = AtomicU64::new(0);
        let pooled = |_| {
            calls.fetch_add(1, Ordering::Relaxed);
            0
        };
        // The first two reads fail; then snag reports one connection open
        // (connections = the read's number), never zero: the last good read stands.
        let stub = Stub::new(1, 3, Duration::ZERO, true);
        let (end, _) = settle(&stub, &baseline, backend, pooled).await.unwrap();
        assert!(end.connections > 3, "{end:?}");
        assert!(calls.load(Ordering::Relaxed) > 0);
        // No read ever succeeds: the error, not an empty sample that would pass.
        let stub = Stub::new(1, u32::MAX, Duration::ZERO, true);
        let err = settle(&stub, &baseline, backend, |_| 0).await.unwrap_err();
        assert_eq!(err, "GET /metrics: no answer within 10 s");
    }
}
