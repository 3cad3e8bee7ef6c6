//! `keepalive_close`: the ends of HTTP/1.1 keep-alive that race a balancer reusing
//! the connection — `Connection: close` on every Nth response of a connection, or a
//! connection closed once it has been idle a while (as a backend's keep-alive
//! timeout does), so a request sent just then meets a closed connection.

use std::time::Duration;

use hyper::{
    header::{CONNECTION, HeaderValue},
    http::response,
};
use serde::{Deserialize, Serialize};

use super::{Exchange, HttpFault};

/// `keepalive_close` attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeepaliveClose {
    /// `Connection: close` on the Nth, 2Nth … response of each connection; 0: never.
    pub every: u64,
    /// Close the connection when no request follows a response for this many ms
    /// (counted from the response head); 0: never.
    pub idle: u64,
}

impl Default for KeepaliveClose {
    /// nginx's `keepalive_requests` was 100 for years.
    fn default() -> Self {
        KeepaliveClose {
            every: 100,
            idle: 0,
        }
    }
}

impl HttpFault for KeepaliveClose {
    fn type_name(&self) -> &'static str {
        "keepalive_close"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    fn validate(&self) -> Result<(), String> {
        if self.every == 0 && self.idle == 0 {
            return Err("give `every` (responses) or `idle` (ms), or both".into());
        }
        Ok(())
    }

    /// HTTP/2 ends connections with GOAWAY (the `goaway` fault): its responses pass.
    fn response(&self, res: &mut response::Parts, cx: &mut Exchange) {
        if cx.h2 {
            return;
        }
        if self.every > 0 && cx.on_conn.is_multiple_of(self.every) {
            res.headers
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        if self.idle > 0 {
            let idle = Duration::from_millis(self.idle);
            cx.close_if_idle = Some(cx.close_if_idle.map_or(idle, |d| d.min(idle)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::{exchange, head};

    #[test]
    fn every_nth_response_of_a_connection_says_close() {
        let fault = KeepaliveClose { every: 3, idle: 0 };
        let closes: Vec<u64> = (1..=7)
            .filter(|n| {
                let mut cx = exchange();
                cx.on_conn = *n;
                let mut res = head(&[]);
                fault.response(&mut res, &mut cx);
                res.headers.get(CONNECTION).is_some_and(|v| v == "close")
            })
            .collect();
        assert_eq!(closes, [3, 6]);
    }

    #[test]
    fn idle_asks_for_the_shortest_close_and_http2_passes() {
        let mut cx = exchange();
        KeepaliveClose {
            every: 0,
            idle: 500,
        }
        .response(&mut head(&[]), &mut cx);
        KeepaliveClose {
            every: 0,
            idle: 200,
        }
        .response(&mut head(&[]), &mut cx);
        KeepaliveClose {
            every: 0,
            idle: 900,
        }
        .response(&mut head(&[]), &mut cx);
        assert_eq!(cx.close_if_idle, Some(Duration::from_millis(200)));
        let mut h2 = head(&[]);
        let mut cx = exchange();
        cx.h2 = true;
        KeepaliveClose {
            every: 1,
            idle: 100,
        }
        .response(&mut h2, &mut cx);
        assert!(h2.headers.get(CONNECTION).is_none() && cx.close_if_idle.is_none());
        assert!(KeepaliveClose { every: 0, idle: 0 }.validate().is_err());
    }
}
