//! One connection: two directions, each `read → chain → ordered queue → write`, with
//! half-close kept (a FIN one way while the other still flows) and resets made real.
//!
//! With no stage on a direction the relay takes a fast path: wait until the source is
//! readable, read into a per-thread buffer, write straight on. An idle connection
//! then holds no buffer at all. As soon as a fault applies, the direction switches to
//! the staged path, and back once its chain and queue are empty again.

mod control;
mod fast;
mod flow;
mod rest;
mod stream;
#[cfg(test)]
mod tests;
mod timer;

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use self::flow::Flow;
pub use self::{
    control::{Control, Waiter},
    stream::{Sink, Source, Stream},
};
use crate::{
    capture::{self, CLIENT_LEG, Record, UPSTREAM_LEG, tap::Notes, tcp::Peer},
    events::Counters,
    fault::{ConnId, Direction, Fault},
};

/// Where a relay reports what it sees besides its [`Outcome`].
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    /// The capture, if one is on: every packet, with a comment naming the faults
    /// that acted on it.
    pub tap: Option<mpsc::Sender<Record>>,
    /// Bytes the capture keeps of each packet (0: all): the unfaulted path copies
    /// only those out of its buffer.
    pub snaplen: usize,
    /// The proxy's counters: a fault counts a connection as hit the first time it
    /// acts on it.
    pub counters: Option<Arc<Counters>>,
    /// HTTP mode's comments for the next bytes to the client (the HTTP faults that
    /// acted on them), when the relay carries its client leg.
    pub notes: Option<Arc<Notes>>,
}

/// The proxy's live fault list, as the relay watches it.
pub type Faults = watch::Receiver<Arc<Vec<Arc<Fault>>>>;

/// Who did something to a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Whoever connected to us (often the balancer).
    Client,
    /// Whom we dialled.
    Upstream,
    /// snag itself, because a fault said so.
    Snag,
}

/// How a connection ended: data, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Both sides sent FIN and it was passed on.
    Eof,
    /// Someone reset it.
    Reset {
        /// Who.
        by: Side,
    },
    /// A fault ended it (limit_data, timeout, reset_peer, down …).
    Fault {
        /// The fault, or the faults applied to the direction that ended.
        name: String,
    },
    /// snag shut down.
    Shutdown,
}

/// What to do to the client when the upstream refuses or resets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnUpstreamError {
    /// RST the client, as a direct connection would have seen.
    #[default]
    Reset,
    /// Close the client with FIN.
    Close,
}

impl std::str::FromStr for OnUpstreamError {
    type Err = String;
    fn from_str(s: &str) -> Result<OnUpstreamError, String> {
        match s {
            "reset" => Ok(OnUpstreamError::Reset),
            "close" => Ok(OnUpstreamError::Close),
            _ => Err(format!("`{s}` is neither reset nor close")),
        }
    }
}

/// Totals of one relayed connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// How it ended.
    pub ending: Ending,
    /// Bytes written to the upstream.
    pub sent_up: u64,
    /// Bytes written to the client.
    pub sent_down: u64,
    /// Bytes read from the client.
    pub received_up: u64,
    /// Bytes read from the upstream.
    pub received_down: u64,
    /// Faults that applied to it at any time, in order.
    pub applied: Vec<String>,
    /// Faults that acted on it (delayed, split, cut, held or dropped something,
    /// closed or reset it), in the order they first did.
    pub hit: Vec<String>,
    /// Whether snag reset it because a fault said so.
    pub fault_reset: bool,
}

/// How much a direction may hold in its queue before it stops reading, so a slow
/// link is felt by the sender through TCP flow control.
const QUEUE_LIMIT: usize = 256 * 1024;
/// Read size of both paths.
const READ_SIZE: usize = 64 * 1024;

/// How one direction ended.
#[derive(Debug)]
enum End {
    /// The source's FIN was passed on.
    Eof,
    /// A fault closed it towards the destination.
    Closed,
    /// A read or write failed: that side reset the connection.
    PeerReset(Side),
    /// A stage asked for RST.
    Reset,
    /// The proxy went `down`.
    Down(String),
    /// The other direction ended the connection.
    Aborted,
    /// A drain reset it.
    Drained,
    Shutdown,
}

/// Relays between `client` and `upstream` until both directions end, then leaves the
/// sockets ready to drop: with SO_LINGER 0 set where the ending was a reset.
pub async fn run<C: Stream, U: Stream>(
    client: &mut C,
    upstream: &mut U,
    faults: &Faults,
    control: &Control,
    id: ConnId<'_>,
    policy: OnUpstreamError,
    evidence: Evidence,
) -> Outcome {
    let tap = evidence.tap.clone();
    if let Some(tx) = &tap {
        // A leg without addresses (an in-memory pipe to HTTP mode) is not captured:
        // the capture writer passes over what is recorded on a leg it never opened.
        let conn = capture::key(id.proxy, id.conn);
        let legs = [
            (CLIENT_LEG, client.ends()),
            (UPSTREAM_LEG, upstream.ends().map(|(p, u)| (u, p))),
        ];
        for (leg, ends) in legs {
            if let Some(ends) = ends {
                let _ = tx
                    .send(Record::OpenLeg {
                        conn,
                        leg,
                        ends,
                        at: capture::now(),
                    })
                    .await;
            }
        }
    }
    let (mut applied, mut hit) = (Vec::new(), Vec::new());
    let mut reset_by;
    let (up, down) = {
        let (client_r, client_w) = client.halves();
        let (upstream_r, upstream_w) = upstream.halves();
        let mut up = Flow::new(
            Direction::Upstream,
            client_r,
            upstream_w,
            faults.clone(),
            control,
            id,
            &evidence,
        );
        let mut down = Flow::new(
            Direction::Downstream,
            upstream_r,
            client_w,
            faults.clone(),
            control,
            id,
            &evidence,
        );
        // One task for both: they share the Control's relay waker (`Waiter::Relay`).
        let (a, b) = tokio::join!(up.run(), down.run());
        for faults in [&up.applied, &down.applied] {
            for fault in faults {
                if !applied.contains(&fault.name) {
                    applied.push(fault.name.clone());
                }
            }
        }
        hit.append(&mut up.hit);
        hit.append(&mut down.hit);
        reset_by = match (&a, &b) {
            (End::Reset, _) => up.reset_names(),
            (_, End::Reset) => down.reset_names(),
            _ => None,
        };
        ((a, up.sent, up.received), (b, down.sent, down.received))
    };
    let names = || applied.join("+");
    let mut fault_reset = false;
    let ending = match (&up.0, &down.0) {
        (End::Drained, _) | (_, End::Drained) => {
            client.reset_on_close();
            upstream.reset_on_close();
            Ending::Fault {
                name: "drain".into(),
            }
        }
        (End::Reset, _) | (_, End::Reset) => {
            client.reset_on_close();
            upstream.reset_on_close();
            fault_reset = true;
            Ending::Fault {
                name: reset_by.take().unwrap_or_else(names),
            }
        }
        (End::PeerReset(Side::Upstream), _) | (_, End::PeerReset(Side::Upstream)) => {
            if policy == OnUpstreamError::Reset {
                client.reset_on_close();
            }
            Ending::Reset { by: Side::Upstream }
        }
        (End::PeerReset(by), _) | (_, End::PeerReset(by)) => {
            upstream.reset_on_close();
            Ending::Reset { by: *by }
        }
        (End::Down(name), _) | (_, End::Down(name)) => Ending::Fault { name: name.clone() },
        (End::Shutdown, _) | (_, End::Shutdown) => Ending::Shutdown,
        (End::Closed, _) | (_, End::Closed) => Ending::Fault { name: names() },
        _ => Ending::Eof,
    };
    if let Some(tx) = &tap {
        let conn = capture::key(id.proxy, id.conn);
        let rst = |leg, from, note: Option<String>| Record::Rst {
            conn,
            leg,
            from,
            note,
            at: capture::now(),
        };
        let by_snag = |why: String| {
            let note = Some(format!("snag: {why}"));
            [
                rst(CLIENT_LEG, Peer::Acceptor, note.clone()),
                rst(UPSTREAM_LEG, Peer::Initiator, note),
            ]
        };
        let resets: Vec<Record> = match &ending {
            Ending::Fault { name } if fault_reset || name == "drain" => {
                by_snag(name.clone()).into()
            }
            Ending::Reset { by: Side::Upstream } => {
                let mut r = vec![rst(UPSTREAM_LEG, Peer::Acceptor, None)];
                if policy == OnUpstreamError::Reset {
                    // HTTP mode over a pipe: the reset is HTTP mode's, and it said why.
                    let why = evidence.notes.as_ref().and_then(|n| n.take());
                    r.push(rst(
                        CLIENT_LEG,
                        Peer::Acceptor,
                        Some(why.unwrap_or_else(|| "snag: upstream reset, passed on".into())),
                    ));
                }
                r
            }
            Ending::Reset { .. } => vec![
                rst(CLIENT_LEG, Peer::Initiator, None),
                rst(
                    UPSTREAM_LEG,
                    Peer::Initiator,
                    Some("snag: client reset, passed on".into()),
                ),
            ],
            _ => Vec::new(),
        };
        for record in resets.into_iter().chain([Record::Close { conn }]) {
            let _ = tx.send(record).await;
        }
    }
    Outcome {
        ending,
        sent_up: up.1,
        sent_down: down.1,
        received_up: up.2,
        received_down: down.2,
        applied,
        hit,
        fault_reset,
    }
}
