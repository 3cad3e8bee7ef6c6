//! `loss`: what a lost segment does to a TCP stream, without corrupting it.
//!
//! On a real link a lost segment is retransmitted after the retransmission timeout
//! (RTO), and every byte behind it waits: the receiver sees a stall, never a hole.
//! This stage cuts each chunk into `segment`-byte pieces and loses each piece with
//! `probability`; a lost piece, and everything queued behind it, leaves one RTO
//! later, and a retransmission may be lost again with the same probability, each
//! time after twice the previous RTO (exponential backoff), at most 8 times in a row.
//!
//! What it cannot emulate: fast retransmit after three duplicate ACKs (every loss
//! costs a full RTO here), the congestion window shrinking after a loss, SACK, and
//! loss of SYN, FIN or pure ACKs. The kernel under it still sees a clean link.

use std::time::Duration;

use rand::{RngExt, rngs::SmallRng};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::stage::{Chunk, Stage, Step};

/// Attributes of `loss`, snag's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Loss {
    /// Chance that one segment is lost, 0.0–1.0.
    pub probability: f64,
    /// First retransmission timeout, ms; it doubles on each consecutive loss.
    pub rto: u64,
    /// Segment size, bytes (an Ethernet MSS by default).
    pub segment: u64,
}

impl Default for Loss {
    fn default() -> Self {
        Loss {
            probability: 0.0,
            rto: 200,
            segment: 1448,
        }
    }
}

/// Longest run of losses of one segment; a real stack gives up around here too.
const MAX_RETRIES: u32 = 8;

/// Per-connection state of `loss`.
#[derive(Debug)]
pub struct LossStage {
    probability: f64,
    rto: Duration,
    segment: usize,
    /// Nothing leaves before the segment ahead of it has been delivered.
    free_at: Option<Instant>,
    rng: SmallRng,
}

impl Loss {
    /// The stage for one connection direction.
    pub fn stage(&self, rng: SmallRng) -> LossStage {
        LossStage {
            probability: self.probability,
            rto: Duration::from_millis(self.rto),
            segment: self.segment.max(1) as usize,
            free_at: None,
            rng,
        }
    }
}

impl Stage for LossStage {
    fn chunk(&mut self, chunk: Chunk, out: &mut Vec<Step>) {
        let mut data = chunk.data;
        while !data.is_empty() {
            let part = data.split_to(self.segment.min(data.len()));
            let mut at = self.free_at.map_or(chunk.due, |free| free.max(chunk.due));
            let mut rto = self.rto;
            for _ in 0..MAX_RETRIES {
                if !self.rng.random_bool(self.probability) {
                    break;
                }
                at += rto;
                rto *= 2;
            }
            self.free_at = Some(at);
            out.push(Step::Send(Chunk {
                data: part,
                due: at,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::tests::{chunk_at, sends};
    use rand::SeedableRng;

    #[test]
    fn loss_stalls_the_stream_without_changing_a_byte() {
        let t0 = Instant::now();
        let cfg = Loss {
            probability: 0.3,
            rto: 200,
            segment: 100,
        };
        let mut stage = cfg.stage(SmallRng::seed_from_u64(11));
        let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut out = Vec::new();
        stage.chunk(chunk_at(t0, &data), &mut out);
        let pieces = sends(&out);
        let joined: Vec<u8> = pieces.iter().flat_map(|c| c.data.to_vec()).collect();
        assert_eq!(joined, data);
        let stalls = pieces.windows(2).filter(|w| w[1].due > w[0].due).count()
            + usize::from(pieces[0].due > t0);
        // 100 segments at 30 %: about 30 first losses; far from 0 and from 100.
        assert!((15..50).contains(&stalls), "{stalls} stalls");
        assert!(pieces.windows(2).all(|w| w[1].due >= w[0].due));
    }

    #[test]
    fn consecutive_losses_back_off_exponentially() {
        let t0 = Instant::now();
        let mut stage = Loss {
            probability: 1.0,
            rto: 10,
            segment: 10,
        }
        .stage(SmallRng::seed_from_u64(1));
        let mut out = Vec::new();
        stage.chunk(chunk_at(t0, b"0123456789"), &mut out);
        // 10 + 20 + … + 1280 ms: eight retransmissions, then it goes through.
        assert_eq!(sends(&out)[0].due - t0, Duration::from_millis(10 * 255));
    }
}
