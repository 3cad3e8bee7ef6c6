//! `latency`: hold each chunk `latency` ± `jitter` ms after it arrived.

use std::time::Duration;

use rand::{RngExt, rngs::SmallRng};
use serde::{Deserialize, Serialize};

use super::stage::{Chunk, Stage, Step};

/// Attributes of `latency`, as Toxiproxy names them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Latency {
    /// Added delay, ms.
    pub latency: u64,
    /// Uniform spread around `latency`, ms: each chunk gets `latency + U[-jitter, jitter)`.
    pub jitter: u64,
}

/// Per-connection state of `latency`.
#[derive(Debug)]
pub struct LatencyStage {
    latency: Duration,
    jitter_ms: u64,
    rng: SmallRng,
}

impl Latency {
    /// The stage for one connection direction.
    pub fn stage(&self, rng: SmallRng) -> LatencyStage {
        LatencyStage {
            latency: Duration::from_millis(self.latency),
            jitter_ms: self.jitter,
            rng,
        }
    }
}

impl LatencyStage {
    fn delay(&mut self) -> Duration {
        if self.jitter_ms == 0 {
            return self.latency;
        }
        let spread = Duration::from_millis(self.rng.random_range(0..2 * self.jitter_ms));
        let jitter = Duration::from_millis(self.jitter_ms);
        (self.latency + spread).saturating_sub(jitter)
    }
}

impl Stage for LatencyStage {
    fn chunk(&mut self, mut chunk: Chunk, out: &mut Vec<Step>) {
        // From arrival: delays of successive chunks overlap, they never pile up.
        chunk.due += self.delay();
        out.push(Step::Send(chunk));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::tests::{chunk_at, sends};
    use rand::SeedableRng;
    use tokio::time::Instant;

    #[test]
    fn latency_delays_each_chunk_from_arrival() {
        let t0 = Instant::now();
        let mut stage = Latency {
            latency: 50,
            jitter: 0,
        }
        .stage(SmallRng::seed_from_u64(1));
        let mut out = Vec::new();
        stage.chunk(chunk_at(t0, b"a"), &mut out);
        stage.chunk(chunk_at(t0 + Duration::from_millis(10), b"b"), &mut out);
        let dues: Vec<_> = sends(&out).iter().map(|c| c.due - t0).collect();
        assert_eq!(dues, [Duration::from_millis(50), Duration::from_millis(60)]);
    }

    #[test]
    fn jitter_stays_within_its_bounds() {
        let t0 = Instant::now();
        let mut stage = Latency {
            latency: 100,
            jitter: 20,
        }
        .stage(SmallRng::seed_from_u64(7));
        let mut out = Vec::new();
        for _ in 0..500 {
            stage.chunk(chunk_at(t0, b"x"), &mut out);
        }
        let dues: Vec<_> = sends(&out)
            .iter()
            .map(|c| (c.due - t0).as_millis())
            .collect();
        assert!(dues.iter().all(|d| (80..120).contains(d)), "{dues:?}");
        assert!(dues.iter().any(|d| *d < 90) && dues.iter().any(|d| *d > 110));
    }
}
