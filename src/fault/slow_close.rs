//! `slow_close`: data passes; the source's FIN reaches the destination `delay` ms late.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::stage::{Chunk, Stage, Step};

/// Attributes of `slow_close`, as Toxiproxy names them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlowClose {
    /// How long the close is held, ms.
    pub delay: u64,
}

/// Per-connection state of `slow_close`.
#[derive(Debug)]
pub struct SlowCloseStage {
    delay: Duration,
}

impl SlowClose {
    /// The stage for one connection direction.
    pub fn stage(&self) -> SlowCloseStage {
        SlowCloseStage {
            delay: Duration::from_millis(self.delay),
        }
    }
}

impl Stage for SlowCloseStage {
    fn chunk(&mut self, chunk: Chunk, out: &mut Vec<Step>) {
        out.push(Step::Send(chunk));
    }

    fn eof(&mut self, at: Instant, out: &mut Vec<Step>) {
        out.push(Step::Finish {
            at: at + self.delay,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::tests::chunk_at;

    #[test]
    fn slow_close_holds_the_fin_only() {
        let t0 = Instant::now();
        let mut stage = SlowClose { delay: 40 }.stage();
        let mut out = Vec::new();
        stage.chunk(chunk_at(t0, b"a"), &mut out);
        stage.eof(t0, &mut out);
        let fin = t0 + Duration::from_millis(40);
        assert_eq!(
            out,
            [Step::Send(chunk_at(t0, b"a")), Step::Finish { at: fin }]
        );
    }
}
