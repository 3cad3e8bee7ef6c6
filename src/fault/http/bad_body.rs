//! `bad_body`: the backend's status and headers with a broken body.

use bytes::Bytes;
use hyper::{
    header::{self, HeaderValue},
    http::response,
};
use rand::RngExt;
use serde::{Deserialize, Serialize};

use super::{BodyStep, Exchange, HttpFault};

/// How `bad_body` breaks the body; the status and headers stay the backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadBodyMode {
    /// The first `bytes` bytes, then the connection closes (a short body).
    #[default]
    Truncate,
    /// Random bytes of the same length.
    Garbage,
    /// No body at all (Content-Length 0).
    Empty,
    /// `text` instead of the body, e.g. `{"status":"degraded"}`.
    Replace,
    /// The whole body under a Content-Length `bytes` larger, then a close.
    WrongLength,
}

/// `bad_body` attributes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BadBody {
    /// How.
    pub mode: BadBodyMode,
    /// `truncate`: bytes kept; `wrong_length`: bytes promised beyond the real length.
    pub bytes: u64,
    /// `replace`: the new body.
    pub text: String,
}

impl HttpFault for BadBody {
    fn type_name(&self) -> &'static str {
        "bad_body"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    fn validate(&self) -> Result<(), String> {
        if self.mode == BadBodyMode::WrongLength && self.bytes == 0 {
            return Err("wrong_length needs bytes > 0: the length promised beyond the body".into());
        }
        Ok(())
    }

    /// Every mode but `truncate` needs the real length: to promise more than it, or
    /// to state the new one.
    fn whole_body(&self) -> bool {
        self.mode != BadBodyMode::Truncate
    }

    fn response(&self, res: &mut response::Parts, _cx: &mut Exchange) {
        // With the whole body read, Content-Length holds its real length.
        let real = res
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0);
        let length = match self.mode {
            BadBodyMode::Truncate | BadBodyMode::Garbage => return,
            BadBodyMode::Empty => 0,
            BadBodyMode::Replace => self.text.len() as u64,
            BadBodyMode::WrongLength => real + self.bytes,
        };
        res.headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }

    fn body(&self, frame: &mut Bytes, end: bool, cx: &mut Exchange) -> BodyStep {
        match self.mode {
            BadBodyMode::Truncate => {
                let left = self.bytes.saturating_sub(cx.sent);
                if frame.len() as u64 >= left && !(end && frame.is_empty() && left > 0) {
                    frame.truncate(left as usize);
                    return BodyStep::Close;
                }
                BodyStep::Pass
            }
            BadBodyMode::Garbage => {
                let mut rng = cx.rng(b"garbage");
                *frame = (0..frame.len()).map(|_| rng.random::<u8>()).collect();
                BodyStep::Pass
            }
            BadBodyMode::Empty => {
                *frame = Bytes::new();
                BodyStep::Pass
            }
            BadBodyMode::Replace => {
                *frame = Bytes::from(self.text.clone());
                BodyStep::Pass
            }
            // The whole body, then a close where the client waits for more.
            BadBodyMode::WrongLength if end => BodyStep::Close,
            BadBodyMode::WrongLength => BodyStep::Pass,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::{exchange, head, run_body};

    fn bad(mode: BadBodyMode, bytes: u64, text: &str) -> BadBody {
        BadBody {
            mode,
            bytes,
            text: text.into(),
        }
    }

    /// As HTTP mode runs a whole-body fault: the head with the real length, then
    /// the body as one final frame.
    fn whole(fault: &BadBody, body: &[u8]) -> (Option<String>, Vec<u8>, Vec<BodyStep>) {
        assert!(fault.whole_body());
        let mut cx = exchange();
        let mut res = head(&[("content-length", &body.len().to_string())]);
        fault.response(&mut res, &mut cx);
        let length = res
            .headers
            .get("content-length")
            .map(|v| v.to_str().unwrap().to_string());
        let mut frame = Bytes::copy_from_slice(body);
        let step = fault.body(&mut frame, true, &mut cx);
        (length, frame.to_vec(), vec![step])
    }

    #[test]
    fn truncate_keeps_its_bytes_then_closes() {
        let fault = bad(BadBodyMode::Truncate, 4, "");
        assert!(!fault.whole_body());
        let (sent, steps) = run_body(&fault, &mut exchange(), &[b"abc", b"defg"]);
        assert_eq!(sent, b"abcd");
        assert_eq!(steps, [BodyStep::Pass, BodyStep::Close]);
        // A body shorter than `bytes` ends as it is.
        let (sent, steps) = run_body(&fault, &mut exchange(), &[b"ab"]);
        assert_eq!(sent, b"ab");
        assert_eq!(steps, [BodyStep::Pass, BodyStep::Pass]);
        // Zero bytes: nothing of the body at all.
        let (sent, steps) = run_body(
            &bad(BadBodyMode::Truncate, 0, ""),
            &mut exchange(),
            &[b"ab"],
        );
        assert!(sent.is_empty());
        assert_eq!(steps, [BodyStep::Close]);
    }

    #[test]
    fn wrong_length_promises_more_than_the_body_then_closes() {
        let (length, body, steps) = whole(&bad(BadBodyMode::WrongLength, 10, ""), b"hello");
        assert_eq!(length.as_deref(), Some("15"));
        assert_eq!(body, b"hello");
        assert_eq!(steps, [BodyStep::Close]);
        assert!(bad(BadBodyMode::WrongLength, 0, "").validate().is_err());
    }

    #[test]
    fn replace_empty_and_garbage_rewrite_the_body_and_its_length() {
        let (length, body, _) = whole(
            &bad(BadBodyMode::Replace, 0, "{\"ok\":false}"),
            b"{\"ok\":true}",
        );
        assert_eq!(
            (length.as_deref(), body.as_slice()),
            (Some("12"), &b"{\"ok\":false}"[..])
        );
        let (length, body, _) = whole(&bad(BadBodyMode::Empty, 0, ""), b"abc");
        assert_eq!((length.as_deref(), body.len()), (Some("0"), 0));
        let (length, body, _) = whole(&bad(BadBodyMode::Garbage, 0, ""), &[0; 64]);
        assert_eq!(length.as_deref(), Some("64"));
        assert_eq!(body.len(), 64);
        assert_ne!(body, [0; 64]);
        // The same request gets the same garbage.
        assert_eq!(whole(&bad(BadBodyMode::Garbage, 0, ""), &[0; 64]).1, body);
    }
}
