//! `reset_peer`: a real TCP RST on both legs, on the first data in this direction.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::stage::{Chunk, Stage, Step};

/// Attributes of `reset_peer`, as Toxiproxy names them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResetPeer {
    /// Wait this many ms after the first chunk (or FIN) in this direction, then reset.
    pub timeout: u64,
}

/// Per-connection state of `reset_peer`.
#[derive(Debug)]
pub struct ResetPeerStage {
    after: Duration,
    fired: bool,
}

impl ResetPeer {
    /// The stage for one connection direction.
    pub fn stage(&self) -> ResetPeerStage {
        ResetPeerStage {
            after: Duration::from_millis(self.timeout),
            fired: false,
        }
    }
}

impl ResetPeerStage {
    fn fire(&mut self, at: Instant, out: &mut Vec<Step>) {
        if !self.fired {
            self.fired = true;
            out.push(Step::Reset {
                at: at + self.after,
            });
        }
    }
}

impl Stage for ResetPeerStage {
    /// The triggering chunk and everything after it are dropped, as a reset drops
    /// whatever the kernel had not yet delivered.
    fn chunk(&mut self, chunk: Chunk, out: &mut Vec<Step>) {
        self.fire(chunk.due, out);
    }

    fn eof(&mut self, at: Instant, out: &mut Vec<Step>) {
        self.fire(at, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::tests::chunk_at;

    #[test]
    fn reset_peer_fires_once_on_first_chunk() {
        let t0 = Instant::now();
        let mut stage = ResetPeer { timeout: 20 }.stage();
        let mut out = Vec::new();
        stage.chunk(chunk_at(t0, b"a"), &mut out);
        stage.chunk(chunk_at(t0, b"b"), &mut out);
        stage.eof(t0, &mut out);
        assert_eq!(
            out,
            [Step::Reset {
                at: t0 + Duration::from_millis(20)
            }]
        );
    }
}
