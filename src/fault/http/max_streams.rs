//! `max_streams`: a SETTINGS frame that lowers MAX_CONCURRENT_STREAMS in the middle
//! of an HTTP/2 connection, as a backend under pressure does. The client must stop
//! opening streams beyond it (RFC 9113 §5.1.2); snag only says it, so a client that
//! goes on regardless shows in its own log and the upstream's count.

use hyper::http::request;
use serde::{Deserialize, Serialize};

use super::{Exchange, HttpFault, Reply};

/// `max_streams` attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MaxStreams {
    /// The new MAX_CONCURRENT_STREAMS (0 lets no new stream open).
    pub value: u32,
    /// The SETTINGS goes when a connection's Nth stream arrives.
    pub after_streams: u64,
}

impl Default for MaxStreams {
    fn default() -> Self {
        MaxStreams {
            value: 1,
            after_streams: 1,
        }
    }
}

impl HttpFault for MaxStreams {
    fn type_name(&self) -> &'static str {
        "max_streams"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    fn validate(&self) -> Result<(), String> {
        super::check_after_streams(self.after_streams)
    }

    /// On the connection's Nth stream, which goes on as it would; HTTP/1.1 has no
    /// streams to limit and passes.
    fn request(&self, _req: &request::Parts, cx: &mut Exchange) -> Option<Reply> {
        if super::nth_http2_stream(cx, self.after_streams) {
            cx.max_streams = Some(self.value);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::exchange;

    #[test]
    fn asks_once_per_connection_on_its_nth_http2_stream() {
        let fault: MaxStreams =
            serde_json::from_value(serde_json::json!({ "value": 2, "after_streams": 3 })).unwrap();
        let req = hyper::Request::get("/").body(()).unwrap().into_parts().0;
        let asked: Vec<(u64, Option<u32>)> = (1..=5)
            .map(|n| {
                let mut cx = exchange();
                (cx.h2, cx.on_conn) = (true, n);
                assert!(fault.request(&req, &mut cx).is_none(), "the stream goes on");
                (n, cx.max_streams)
            })
            .filter(|(_, asked)| asked.is_some())
            .collect();
        assert_eq!(asked, [(3, Some(2))]);
        let mut cx = exchange();
        cx.on_conn = 3;
        fault.request(&req, &mut cx);
        assert_eq!(cx.max_streams, None, "HTTP/1.1 passes");
        assert!(
            MaxStreams {
                after_streams: 0,
                value: 1
            }
            .validate()
            .is_err()
        );
    }
}
