//! `reset_mid_response`: the head and the first `bytes` of the body, then RST.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{BodyStep, Exchange, HttpFault};

/// `reset_mid_response` attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResetMidResponse {
    /// Body bytes that pass before the reset.
    pub bytes: u64,
}

impl HttpFault for ResetMidResponse {
    fn type_name(&self) -> &'static str {
        "reset_mid_response"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    fn body(&self, frame: &mut Bytes, end: bool, cx: &mut Exchange) -> BodyStep {
        let left = self.bytes.saturating_sub(cx.sent);
        if frame.len() as u64 >= left {
            frame.truncate(left as usize);
            return BodyStep::Reset;
        }
        // A reset due after more bytes than the body has still happens: the client
        // must see a reset, not a complete answer.
        if end { BodyStep::Reset } else { BodyStep::Pass }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::{exchange, run_body};

    #[test]
    fn resets_after_its_bytes_across_frames() {
        let fault = ResetMidResponse { bytes: 5 };
        let (sent, steps) = run_body(&fault, &mut exchange(), &[b"abc", b"defgh", b"ij"]);
        assert_eq!(sent, b"abcde");
        assert_eq!(steps, [BodyStep::Pass, BodyStep::Reset]);
    }

    #[test]
    fn resets_at_the_end_of_a_body_shorter_than_its_bytes() {
        let fault = ResetMidResponse { bytes: 100 };
        let (sent, steps) = run_body(&fault, &mut exchange(), &[b"abc"]);
        assert_eq!(sent, b"abc");
        assert_eq!(steps, [BodyStep::Pass, BodyStep::Reset]);
    }

    #[test]
    fn zero_bytes_resets_before_the_first_byte() {
        let (sent, steps) = run_body(&ResetMidResponse { bytes: 0 }, &mut exchange(), &[b"abc"]);
        assert!(sent.is_empty());
        assert_eq!(steps, [BodyStep::Reset]);
    }
}
