//! `goaway`: end an HTTP/2 connection the ways backends do — AWS ALB after 10,000
//! streams, a graceful GOAWAY treated as an error, a GOAWAY that declares streams
//! the client already sent unprocessed, a close with streams still open.

use std::time::Duration;

use hyper::http::request;
use serde::{Deserialize, Serialize};

use super::{Exchange, HttpFault, Reply};

/// Which streams the GOAWAY lets in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LastStream {
    /// RFC 9113 §6.8's two steps: GOAWAY with the highest id and a PING, then, once
    /// the PING is answered, GOAWAY with the last stream opened: none is lost.
    #[default]
    Graceful,
    /// The stream that reached the Nth: it is processed, any later one is not.
    Current,
    /// Below the Nth: it and every later stream the client already sent are
    /// declared unprocessed and never reach the upstream.
    BelowInflight,
}

/// When the connection closes after the GOAWAY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Close {
    /// Once the streams it lets in have finished.
    #[default]
    AfterStreamsFinish,
    /// At once (after `delay_close`): what is open ends without END_STREAM.
    WithOpenStreams,
}

/// `goaway` attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Goaway {
    /// The GOAWAY goes when a connection's Nth stream arrives.
    pub after_streams: u64,
    /// Its error code: 0 NO_ERROR, 2 INTERNAL_ERROR, 11 ENHANCE_YOUR_CALM …
    pub error_code: u32,
    /// Which streams it lets in.
    pub last_stream: LastStream,
    /// When the connection closes.
    pub close: Close,
    /// ms between the (last) GOAWAY and the close.
    pub delay_close: u64,
}

impl Default for Goaway {
    fn default() -> Self {
        Goaway {
            after_streams: 100,
            error_code: 0,
            last_stream: LastStream::Graceful,
            close: Close::AfterStreamsFinish,
            delay_close: 0,
        }
    }
}

/// What HTTP mode does for a `goaway` that fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoawayPlan {
    /// Which streams it lets in.
    pub last_stream: LastStream,
    /// Its code.
    pub error_code: u32,
    /// When the connection closes.
    pub close: Close,
    /// Between the GOAWAY and the close.
    pub delay_close: Duration,
}

impl HttpFault for Goaway {
    fn type_name(&self) -> &'static str {
        "goaway"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    fn validate(&self) -> Result<(), String> {
        super::check_after_streams(self.after_streams)
    }

    /// On the connection's Nth stream; HTTP/1.1 passes (`keepalive_close` is its
    /// counterpart).
    fn request(&self, _req: &request::Parts, cx: &mut Exchange) -> Option<Reply> {
        super::nth_http2_stream(cx, self.after_streams).then(|| {
            Reply::Goaway(GoawayPlan {
                last_stream: self.last_stream,
                error_code: self.error_code,
                close: self.close,
                delay_close: Duration::from_millis(self.delay_close),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::exchange;

    #[test]
    fn fires_on_the_nth_http2_stream_of_a_connection_only() {
        let fault: Goaway = serde_json::from_value(serde_json::json!({
            "after_streams": 3, "error_code": 11, "last_stream": "below_inflight",
            "close": "with_open_streams", "delay_close": 50,
        }))
        .unwrap();
        let req = hyper::Request::get("/").body(()).unwrap().into_parts().0;
        let fired: Vec<u64> = (1..=6)
            .filter(|n| {
                let mut cx = exchange();
                cx.h2 = true;
                cx.on_conn = *n;
                fault.request(&req, &mut cx).is_some()
            })
            .collect();
        assert_eq!(fired, [3]);
        let mut cx = exchange();
        cx.h2 = true;
        cx.on_conn = 3;
        let Some(Reply::Goaway(plan)) = fault.request(&req, &mut cx) else {
            panic!("no goaway");
        };
        assert_eq!(
            plan,
            GoawayPlan {
                last_stream: LastStream::BelowInflight,
                error_code: 11,
                close: Close::WithOpenStreams,
                delay_close: Duration::from_millis(50),
            }
        );
        cx.h2 = false;
        assert!(fault.request(&req, &mut cx).is_none());
        assert!(
            Goaway {
                after_streams: 0,
                ..Goaway::default()
            }
            .validate()
            .is_err()
        );
    }
}
