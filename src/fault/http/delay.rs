//! `http_delay`: hold the response head, its first body byte, or every body frame.

use std::time::Duration;

use bytes::Bytes;
use hyper::http::response;
use serde::{Deserialize, Serialize};

use super::{BodyStep, Exchange, HttpFault};

/// Where `http_delay` waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DelayAt {
    /// Before the response head goes to the client.
    #[default]
    Headers,
    /// After the head, before the first body byte.
    Body,
    /// Before every body chunk.
    Chunk,
}

/// `http_delay` attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpDelay {
    /// How long, ms.
    pub delay: u64,
    /// Where.
    pub at: DelayAt,
}

impl HttpDelay {
    fn duration(&self) -> Duration {
        Duration::from_millis(self.delay)
    }
}

impl HttpFault for HttpDelay {
    fn type_name(&self) -> &'static str {
        "http_delay"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    fn response(&self, _res: &mut response::Parts, cx: &mut Exchange) {
        match self.at {
            DelayAt::Headers => cx.hold_head += self.duration(),
            DelayAt::Body => cx.hold_body += self.duration(),
            DelayAt::Chunk => {}
        }
    }

    fn body(&self, frame: &mut Bytes, _end: bool, _cx: &mut Exchange) -> BodyStep {
        // Every chunk, the last one too; the empty end of a body is no chunk.
        if self.at == DelayAt::Chunk && !frame.is_empty() {
            BodyStep::Hold(self.duration())
        } else {
            BodyStep::Pass
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::{exchange, head, run_body};

    fn delay(at: DelayAt) -> HttpDelay {
        HttpDelay { delay: 40, at }
    }

    #[test]
    fn headers_and_body_delays_add_to_the_holds_of_the_exchange() {
        let mut cx = exchange();
        delay(DelayAt::Headers).response(&mut head(&[]), &mut cx);
        delay(DelayAt::Body).response(&mut head(&[]), &mut cx);
        delay(DelayAt::Body).response(&mut head(&[]), &mut cx);
        assert_eq!(cx.hold_head, Duration::from_millis(40));
        assert_eq!(cx.hold_body, Duration::from_millis(80));
        let (sent, steps) = run_body(&delay(DelayAt::Body), &mut cx, &[b"ab"]);
        assert_eq!(
            (sent.as_slice(), steps),
            (&b"ab"[..], vec![BodyStep::Pass; 2])
        );
    }

    #[test]
    fn a_chunk_delay_holds_every_chunk_and_not_the_end() {
        let (sent, steps) = run_body(&delay(DelayAt::Chunk), &mut exchange(), &[b"a", b"b"]);
        assert_eq!(sent, b"ab");
        let hold = BodyStep::Hold(Duration::from_millis(40));
        assert_eq!(steps, [hold, hold, BodyStep::Pass]);
    }
}
