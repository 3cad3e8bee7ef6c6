//! `limit_data`: pass the first `bytes` bytes, then close towards the destination.

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::stage::{Chunk, Stage, Step};

/// Attributes of `limit_data`, as Toxiproxy names them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitData {
    /// How many bytes pass in this direction before it is closed.
    pub bytes: u64,
}

/// Per-connection state of `limit_data`.
#[derive(Debug)]
pub struct LimitDataStage {
    left: u64,
    closed: bool,
}

impl LimitData {
    /// The stage for one connection direction.
    pub fn stage(&self) -> LimitDataStage {
        LimitDataStage {
            left: self.bytes,
            closed: false,
        }
    }
}

impl LimitDataStage {
    fn close(&mut self, at: Instant, out: &mut Vec<Step>) {
        if !self.closed {
            self.closed = true;
            out.push(Step::Finish { at });
        }
    }
}

impl Stage for LimitDataStage {
    fn start(&mut self, now: Instant, out: &mut Vec<Step>) {
        if self.left == 0 {
            self.close(now, out);
        }
    }

    fn chunk(&mut self, mut chunk: Chunk, out: &mut Vec<Step>) {
        if self.closed {
            return;
        }
        let take = (chunk.data.len() as u64).min(self.left);
        self.left -= take;
        let due = chunk.due;
        chunk.data.truncate(take as usize);
        out.push(Step::Send(chunk));
        if self.left == 0 {
            self.close(due, out);
        }
    }

    fn eof(&mut self, at: Instant, out: &mut Vec<Step>) {
        self.close(at, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::tests::chunk_at;

    #[test]
    fn limit_data_truncates_then_finishes_once() {
        let t0 = Instant::now();
        let mut stage = LimitData { bytes: 5 }.stage();
        let mut out = Vec::new();
        stage.start(t0, &mut out);
        stage.chunk(chunk_at(t0, b"abc"), &mut out);
        stage.chunk(chunk_at(t0, b"defg"), &mut out);
        stage.chunk(chunk_at(t0, b"hij"), &mut out);
        stage.eof(t0, &mut out);
        assert_eq!(
            out,
            [
                Step::Send(chunk_at(t0, b"abc")),
                Step::Send(chunk_at(t0, b"de")),
                Step::Finish { at: t0 }
            ]
        );
    }
}
