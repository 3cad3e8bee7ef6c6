//! A faulted direction at rest: nothing queued or scheduled, waiting for its source
//! without the staged path's state ([`super::flow`]). What it reads here goes
//! through the chain at once, and what comes back due now goes straight on: a fault
//! whose effect is nil costs a read, the chain and a write, no trip through the
//! queue and the runtime.

use std::{cell::RefCell, collections::VecDeque};

use bytes::{Buf, Bytes};
use tokio::time::Instant;

use super::{
    End, Sink, Source, Waiter,
    flow::{Flow, Which},
    stream::try_read_some,
};
use crate::fault::{
    Chain,
    chain::Staged,
    stage::{Chunk, Step},
};

thread_local! {
    /// What the chain gave back for one read: per thread, not per read or per flow.
    static STEPS: RefCell<Vec<Staged>> = const { RefCell::new(Vec::new()) };
}

impl<R: Source, W: Sink> Flow<'_, R, W> {
    /// Faults apply but nothing is queued or scheduled, and the source is a socket
    /// whose readiness can be awaited on its own.
    pub(super) fn at_rest(&self) -> bool {
        self.queue.is_empty()
            && self.reset_at.is_none()
            && !self.src_done
            && self.src.tcp().is_some()
    }

    /// Waits, at rest, until the source is readable, the faults change or the
    /// connection is told something, without the staged path's state: an idle
    /// faulted connection then costs what an unfaulted one does (the staged future
    /// is some hundred bytes a direction). What the source has is read here too,
    /// unless it is captured; while the chain gives it back due now and the
    /// destination takes it at once (a nil fault), the direction stays at rest.
    /// `None`: on to the staged path, for what has to wait.
    pub(super) async fn rest(&mut self) -> Option<End> {
        // The queue's room too: four steps' worth, a quarter KiB a direction.
        self.queue = VecDeque::new();
        let control = self.control;
        loop {
            let seen = control.seen();
            if let Some(end) = control.stopped() {
                return Some(end);
            }
            if self.faults.has_changed().unwrap_or(true) {
                return self.sync(true);
            }
            let src = self.src.tcp()?;
            tokio::select! {
                biased;
                _ = control.signalled(Waiter::Relay, seen) => continue,
                _ = src.readable() => {}
            }
            // The staged path records what it reads as it reads it.
            if self.tap.is_some() {
                return None;
            }
            match try_read_some(src) {
                Ok(Some(data)) => self.took(data, Instant::now()),
                Ok(None) => {}
                Err(_) => return Some(End::PeerReset(self.side(Which::Src))),
            }
            if !self.at_rest() {
                return None;
            }
        }
    }

    /// What was read from the source at `now` (empty: its FIN), given to the chain.
    pub(super) fn took(&mut self, data: Bytes, now: Instant) {
        if data.is_empty() {
            self.src_done = true;
            self.stage(now, |chain, out| chain.eof(now, out));
        } else {
            self.received += data.len() as u64;
            self.stage(now, |chain, out| chain.chunk(Chunk { data, due: now }, out));
        }
    }

    /// What the chain makes of something read at `now`: written at once where
    /// [`Flow::send_now`] can, queued otherwise.
    fn stage(&mut self, now: Instant, run: impl FnOnce(&mut Chain, &mut Vec<Staged>)) {
        STEPS.with_borrow_mut(|out| {
            run(&mut self.chain, out);
            self.send_now(out, now);
            self.enqueue(out.drain(..));
        });
    }

    /// Writes the chain's one step for a read now, if it is a chunk due now, nothing
    /// is queued or scheduled before it, nothing is captured and the destination is
    /// a socket with room: a nil fault's chunks then pass without a trip through the
    /// queue and the runtime. What is not written stays in `steps`, for the queue.
    fn send_now(&mut self, steps: &mut Vec<Staged>, now: Instant) {
        let [
            Staged {
                step: Step::Send(chunk),
                by,
            },
        ] = steps.as_mut_slice()
        else {
            return;
        };
        // Read again only where the read's instant is too early: a chunk due a few
        // ns after it (a bandwidth far above the link) is due by now.
        if chunk.due > now && chunk.due > Instant::now()
            || chunk.data.is_empty()
            || !self.queue.is_empty()
            || self.reset_at.is_some()
            || self.tap.is_some()
        {
            return;
        }
        let Some(dst) = self.dst.tcp() else {
            return;
        };
        // An error, or no room, is the queue's write to meet: it waits, or ends the
        // direction as any write does.
        if let Ok(n) = dst.try_write(&chunk.data) {
            self.sent += n as u64;
            if n < chunk.data.len() {
                chunk.data.advance(n);
            } else {
                let by = by.take();
                steps.clear();
                self.acted(by.as_ref());
            }
        }
    }
}
