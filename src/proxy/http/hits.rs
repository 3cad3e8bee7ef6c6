//! Which HTTP faults acted on one exchange: each counts it once in the proxy's
//! `fault_hits`, and puts its name on the client-leg bytes that carry its effect
//! in the capture.

use std::sync::Arc;

use hyper::{HeaderMap, StatusCode, http::response};

use super::connection::Conn;
use crate::fault::{Fault, http::Exchange};

/// The faults that have acted on one exchange so far.
pub(super) struct Hits {
    /// Its connection's (the proxy's counters and the capture's notes through it):
    /// a clone of the proxy's Arc would write to a line every worker shares.
    conn: Arc<Conn>,
    /// HTTP/2: the stream, named in the capture's comment (streams interleave).
    stream: u32,
    counted: Vec<Arc<Fault>>,
}

impl Hits {
    pub(super) fn new(conn: Arc<Conn>, stream: u32) -> Hits {
        Hits {
            conn,
            stream,
            counted: Vec::new(),
        }
    }

    /// `fault` acted on the exchange: counted the first time, and noted for the
    /// capture each time (the next bytes to the client carry what it did).
    pub(super) fn acted(&mut self, fault: &Arc<Fault>) {
        if !self.counted.iter().any(|f| Arc::ptr_eq(f, fault)) {
            self.conn.proxy.counters().fault_hit(&fault.name);
            self.counted.push(fault.clone());
        }
        if let Some(notes) = &self.conn.notes {
            notes.add(match self.stream {
                0 => format!("snag: {}", fault.name),
                id => format!("snag: {} (stream {id})", fault.name),
            });
        }
    }
}

/// What a response hook may change, to tell whether it did.
#[derive(PartialEq)]
pub(super) struct Seen {
    status: StatusCode,
    headers: HeaderMap,
    exchange: (
        std::time::Duration,
        std::time::Duration,
        Option<std::time::Duration>,
    ),
}

impl Seen {
    pub(super) fn of(parts: &response::Parts, cx: &Exchange) -> Seen {
        Seen {
            status: parts.status,
            headers: parts.headers.clone(),
            exchange: (cx.hold_head, cx.hold_body, cx.close_if_idle),
        }
    }
}
