//! `bandwidth`: pace one direction of one connection to `rate` KB/s.

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::stage::{Chunk, Stage, Step};

/// Attributes of `bandwidth`, as Toxiproxy names them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Bandwidth {
    /// KB/s, K = 1000. 0 stalls the direction: no byte passes while the fault is on.
    pub rate: u64,
}

/// Per-connection state of `bandwidth`.
#[derive(Debug)]
pub struct BandwidthStage {
    /// Bytes per second; 0 = stall.
    rate: u64,
    /// When the link is free again after the last slice it carried.
    free_at: Option<Instant>,
}

/// How long after `due` an unpaced chunk is held when the rate is 0: far enough to be
/// "never" for any run, near enough not to overflow `Instant`. A fault change releases it.
const STALL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Bandwidth {
    /// The stage for one connection direction.
    pub fn stage(&self) -> BandwidthStage {
        BandwidthStage {
            rate: self.rate.saturating_mul(1000),
            free_at: None,
        }
    }
}

impl Stage for BandwidthStage {
    fn chunk(&mut self, chunk: Chunk, out: &mut Vec<Step>) {
        if self.rate == 0 {
            out.push(Step::Send(Chunk {
                data: chunk.data,
                due: chunk.due + STALL,
            }));
            return;
        }
        // Slices of 100 ms worth of bytes, as Toxiproxy sends them, so a large chunk
        // trickles out instead of leaving in one burst at the end.
        let slice = (self.rate / 10).max(1) as usize;
        let mut at = self.free_at.map_or(chunk.due, |free| free.max(chunk.due));
        let mut data: Bytes = chunk.data;
        while !data.is_empty() {
            let part = data.split_to(slice.min(data.len()));
            at += Duration::from_nanos(part.len() as u64 * 1_000_000_000 / self.rate);
            out.push(Step::Send(Chunk {
                data: part,
                due: at,
            }));
        }
        self.free_at = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::tests::{chunk_at, sends};

    #[test]
    fn bandwidth_spreads_a_large_chunk_over_time() {
        let t0 = Instant::now();
        let mut stage = Bandwidth { rate: 10 }.stage(); // 10,000 B/s, 1,000 B slices
        let mut out = Vec::new();
        stage.chunk(chunk_at(t0, &[0; 2500]), &mut out);
        let got: Vec<_> = sends(&out)
            .iter()
            .map(|c| (c.data.len(), c.due - t0))
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(got, [(1000, ms(100)), (1000, ms(200)), (500, ms(250))]);
        // The next chunk queues behind the first: the link is busy until 250 ms.
        out.clear();
        stage.chunk(chunk_at(t0 + ms(10), &[0; 100]), &mut out);
        assert_eq!(sends(&out)[0].due - t0, ms(260));
    }

    #[test]
    fn rate_zero_stalls_the_data() {
        let t0 = Instant::now();
        let mut out = Vec::new();
        Bandwidth { rate: 0 }
            .stage()
            .chunk(chunk_at(t0, b"x"), &mut out);
        assert!(sends(&out)[0].due - t0 > Duration::from_secs(3600 * 24 * 365));
    }
}
