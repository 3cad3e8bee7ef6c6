//! `slicer`: cut each chunk into small pieces with a pause between them.

use std::time::Duration;

use rand::{RngExt, rngs::SmallRng};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::stage::{Chunk, Stage, Step};

/// Attributes of `slicer`, as Toxiproxy names them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Slicer {
    /// Mean piece size, bytes.
    pub average_size: u64,
    /// Pieces are `average_size ± size_variation` bytes.
    pub size_variation: u64,
    /// Pause after each piece, µs.
    pub delay: u64,
}

/// Per-connection state of `slicer`.
#[derive(Debug)]
pub struct SlicerStage {
    average: u64,
    variation: u64,
    delay: Duration,
    next: Option<Instant>,
    rng: SmallRng,
}

impl Slicer {
    /// The stage for one connection direction.
    pub fn stage(&self, rng: SmallRng) -> SlicerStage {
        SlicerStage {
            average: self.average_size.max(1),
            variation: self.size_variation.min(self.average_size.saturating_sub(1)),
            delay: Duration::from_micros(self.delay),
            next: None,
            rng,
        }
    }
}

impl Stage for SlicerStage {
    fn chunk(&mut self, chunk: Chunk, out: &mut Vec<Step>) {
        let mut at = self.next.map_or(chunk.due, |next| next.max(chunk.due));
        let mut data = chunk.data;
        while !data.is_empty() {
            let size = if self.variation == 0 {
                self.average
            } else {
                self.rng
                    .random_range(self.average - self.variation..=self.average + self.variation)
            };
            let part = data.split_to((size as usize).min(data.len()));
            out.push(Step::Send(Chunk {
                data: part,
                due: at,
            }));
            at += self.delay;
        }
        self.next = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::tests::{chunk_at, sends};
    use rand::SeedableRng;

    #[test]
    fn slicer_cuts_within_bounds_and_spaces_pieces() {
        let t0 = Instant::now();
        let cfg = Slicer {
            average_size: 10,
            size_variation: 3,
            delay: 1000,
        };
        let mut stage = cfg.stage(SmallRng::seed_from_u64(3));
        let mut out = Vec::new();
        let data: Vec<u8> = (0..=255).collect();
        stage.chunk(chunk_at(t0, &data), &mut out);
        let pieces = sends(&out);
        let joined: Vec<u8> = pieces.iter().flat_map(|c| c.data.to_vec()).collect();
        assert_eq!(joined, data);
        assert!(
            pieces[..pieces.len() - 1]
                .iter()
                .all(|c| (7..=13).contains(&c.data.len()))
        );
        for (i, c) in pieces.iter().enumerate() {
            assert_eq!(c.due - t0, Duration::from_micros(1000 * i as u64));
        }
    }
}
