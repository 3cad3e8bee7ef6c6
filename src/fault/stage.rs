//! The contract between the relay and a fault: chunks in, steps out, no I/O.
//!
//! A stage never touches a socket or a clock. It is handed chunks stamped with the
//! instant they may leave and returns [`Step`]s; the relay in `proxy/relay.rs` owns
//! sockets, timers, ordering and half-close. That keeps every stage deterministic and
//! testable without a runtime.

use std::fmt;

use bytes::Bytes;
use tokio::time::Instant;

/// Bytes read from one side, and the earliest instant they may leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The bytes, exactly as read.
    pub data: Bytes,
    /// The earliest instant the relay may write them.
    pub due: Instant,
}

/// What a stage asks the relay to do. The relay never sends a chunk before the one
/// ahead of it, whatever its `due`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Write these bytes at or after `due`.
    Send(Chunk),
    /// Half-close towards the destination (FIN) at `at`, after everything ahead of it.
    Finish {
        /// When.
        at: Instant,
    },
    /// RST on both legs (SO_LINGER 0) at `at`, dropping whatever is still queued.
    /// Skips the rest of the chain.
    Reset {
        /// When.
        at: Instant,
    },
}

impl Step {
    /// The instant this step may happen.
    pub fn due(&self) -> Instant {
        match self {
            Step::Send(c) => c.due,
            Step::Finish { at } | Step::Reset { at } => *at,
        }
    }
}

/// One fault on one direction of one connection. No I/O, no clock reads, no global
/// RNG: randomness comes from the seeded RNG it was built with.
pub trait Stage: Send + fmt::Debug {
    /// The connection opened (or the stage was added to it) at `now`; schedule
    /// time-based steps here.
    fn start(&mut self, _now: Instant, _out: &mut Vec<Step>) {}
    /// A chunk arrived from the previous stage.
    fn chunk(&mut self, chunk: Chunk, out: &mut Vec<Step>);
    /// The source sent FIN at `at`. Default: pass it on.
    fn eof(&mut self, at: Instant, out: &mut Vec<Step>) {
        out.push(Step::Finish { at })
    }
}
