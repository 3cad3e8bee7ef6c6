//! `timeout`: the blackhole. Swallow every byte, answer nothing, close after `timeout`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::stage::{Chunk, Stage, Step};

/// Attributes of `timeout`, as Toxiproxy names them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timeout {
    /// Close this direction this many ms after the fault starts; 0 = never.
    pub timeout: u64,
}

/// Per-connection state of `timeout`.
#[derive(Debug)]
pub struct TimeoutStage {
    after: Option<Duration>,
}

impl Timeout {
    /// The stage for one connection direction.
    pub fn stage(&self) -> TimeoutStage {
        TimeoutStage {
            after: (self.timeout > 0).then(|| Duration::from_millis(self.timeout)),
        }
    }
}

impl Stage for TimeoutStage {
    fn start(&mut self, now: Instant, out: &mut Vec<Step>) {
        if let Some(after) = self.after {
            out.push(Step::Finish { at: now + after });
        }
    }

    fn chunk(&mut self, _chunk: Chunk, _out: &mut Vec<Step>) {}

    /// A FIN from the source is swallowed too: a blackhole tells nobody anything.
    fn eof(&mut self, _at: Instant, _out: &mut Vec<Step>) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::tests::chunk_at;

    #[test]
    fn timeout_swallows_data_and_closes_after_its_time() {
        let t0 = Instant::now();
        let mut stage = Timeout { timeout: 300 }.stage();
        let mut out = Vec::new();
        stage.start(t0, &mut out);
        stage.chunk(chunk_at(t0, b"hello"), &mut out);
        stage.eof(t0, &mut out);
        assert_eq!(
            out,
            [Step::Finish {
                at: t0 + Duration::from_millis(300)
            }]
        );
    }

    #[test]
    fn timeout_zero_never_closes() {
        let mut out = Vec::new();
        Timeout { timeout: 0 }
            .stage()
            .start(Instant::now(), &mut out);
        assert!(out.is_empty());
    }
}
