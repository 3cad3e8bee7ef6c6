//! One direction of one connection: `read → chain → ordered queue → write`, on the
//! staged path while a fault applies (waiting at rest in [`super::rest`]), on the
//! fast path ([`super::fast`]) otherwise.

use std::{collections::VecDeque, sync::Arc};

use bytes::Bytes;
use tokio::{io::AsyncWriteExt, sync::mpsc, time::Instant};

use super::{
    Control, End, Evidence, Faults, QUEUE_LIMIT, Side, Sink, Source, Waiter, stream::read_some,
    timer::Timer,
};
use crate::{
    capture::{self, CLIENT_LEG, Record, UPSTREAM_LEG, tap::Notes, tcp::Peer},
    events::Counters,
    fault::{
        Chain, ConnId, Direction, Fault, Kind,
        chain::{ActedBy, Staged},
        stage::Step,
    },
};

/// One direction of one connection.
pub(super) struct Flow<'a, R, W> {
    pub(super) dir: Direction,
    pub(super) src: R,
    pub(super) dst: W,
    pub(super) faults: Faults,
    pub(super) control: &'a Control,
    pub(super) id: ConnId<'a>,
    pub(super) chain: Chain,
    pub(super) queue: VecDeque<Staged>,
    pub(super) queued: usize,
    pub(super) reset_at: Option<Instant>,
    /// The faults that asked for the reset at `reset_at`.
    pub(super) reset_by: Option<Arc<ActedBy>>,
    /// The faults whose reset ended the direction.
    hit_reset: Option<Arc<ActedBy>>,
    pub(super) src_done: bool,
    /// A FIN towards the destination is queued (or was sent).
    pub(super) fin_queued: bool,
    pub(super) sent: u64,
    pub(super) received: u64,
    /// The faults that applied at any time, by name: the chain's own, not copies of
    /// their names, which every faulted connection would hold while it is open.
    pub(super) applied: Vec<Arc<Fault>>,
    /// The faults that acted on something this direction did, in the order they first did.
    pub(super) hit: Vec<String>,
    pub(super) tap: Option<mpsc::Sender<Record>>,
    /// Bytes the capture keeps of each packet; 0 = all.
    pub(super) snaplen: usize,
    counters: Option<Arc<Counters>>,
    /// HTTP mode's comments for bytes written to the client, when this direction
    /// writes to the client and a capture is on.
    notes: Option<Arc<Notes>>,
    /// The connection's key in the capture, computed once.
    pub(super) capture_key: u64,
    /// The clock staged chunks leave by: precise where bytes meet a real socket.
    timer: Timer,
}

impl<'a, R: Source, W: Sink> Flow<'a, R, W> {
    pub(super) fn new(
        dir: Direction,
        src: R,
        dst: W,
        faults: Faults,
        control: &'a Control,
        id: ConnId<'a>,
        evidence: &Evidence,
    ) -> Self {
        let tap = evidence.tap.clone();
        let timer = if src.tcp().is_some() || dst.tcp().is_some() {
            Timer::Precise
        } else {
            Timer::Runtime
        };
        Flow {
            timer,
            dir,
            src,
            dst,
            faults,
            control,
            id,
            chain: Chain::default(),
            queue: VecDeque::new(),
            queued: 0,
            reset_at: None,
            reset_by: None,
            hit_reset: None,
            src_done: false,
            fin_queued: false,
            sent: 0,
            received: 0,
            capture_key: if tap.is_some() {
                capture::key(id.proxy, id.conn)
            } else {
                0
            },
            tap,
            snaplen: evidence.snaplen,
            counters: evidence.counters.clone(),
            notes: evidence
                .notes
                .clone()
                .filter(|_| dir == Direction::Downstream && evidence.tap.is_some()),
            applied: Vec::new(),
            hit: Vec::new(),
        }
    }

    pub(super) fn side(&self, of: Which) -> Side {
        match (self.dir, of) {
            (Direction::Upstream, Which::Src) | (Direction::Downstream, Which::Dst) => Side::Client,
            _ => Side::Upstream,
        }
    }

    /// The (leg, sender) of bytes read from the source, and of bytes written.
    pub(super) fn legs(&self) -> ((usize, Peer), (usize, Peer)) {
        match self.dir {
            Direction::Upstream => (
                (CLIENT_LEG, Peer::Initiator),
                (UPSTREAM_LEG, Peer::Initiator),
            ),
            Direction::Downstream => ((UPSTREAM_LEG, Peer::Acceptor), (CLIENT_LEG, Peer::Acceptor)),
        }
    }

    /// The record of bytes read (`Which::Src`) or written (`Which::Dst`), if capturing.
    pub(super) fn data_record(
        &self,
        which: Which,
        data: Bytes,
        note: Option<String>,
    ) -> Option<Record> {
        self.tap.as_ref()?;
        let (leg, from) = if matches!(which, Which::Src) {
            self.legs().0
        } else {
            self.legs().1
        };
        Some(Record::Data {
            conn: self.capture_key,
            leg,
            from,
            data,
            note,
            at: capture::now(),
        })
    }

    /// The record of a FIN read from the source or sent to the destination.
    pub(super) fn fin_record(&self, which: Which, note: Option<String>) -> Option<Record> {
        self.tap.as_ref()?;
        let (leg, from) = if matches!(which, Which::Src) {
            self.legs().0
        } else {
            self.legs().1
        };
        Some(Record::Fin {
            conn: self.capture_key,
            leg,
            from,
            note,
            at: capture::now(),
        })
    }

    /// Something the faults `by` acted on happened: the first time a fault acts on
    /// this direction, its connection counts as hit. Returns the capture comment.
    pub(super) fn acted(&mut self, by: Option<&Arc<ActedBy>>) -> Option<String> {
        let by = by?;
        for name in &by.names {
            if !self.hit.contains(name) {
                if let Some(counters) = &self.counters {
                    counters.fault_hit(name);
                }
                self.hit.push(name.clone());
            }
        }
        self.tap.is_some().then(|| by.note())
    }

    /// The comment for bytes written to the destination: the faults that acted on
    /// them, and what HTTP mode asked to be said of the next bytes to the client.
    pub(super) fn written_note(&self, acted: Option<String>) -> Option<String> {
        let http = self.notes.as_ref().and_then(|n| n.take());
        match (acted, http) {
            (Some(a), Some(h)) => Some(format!("{a}; {h}")),
            (a, h) => a.or(h),
        }
    }

    /// The faults whose reset ended this direction, joined as an ending names them.
    pub(super) fn reset_names(&self) -> Option<String> {
        self.hit_reset.as_ref().map(|by| by.names.join("+"))
    }

    pub(super) async fn run(&mut self) -> End {
        let end = self.relay().await;
        if !matches!(end, End::Eof | End::Closed) {
            // Whatever ended this direction ends the connection: stop the other one.
            self.control.abort();
        }
        end
    }

    pub(super) async fn relay(&mut self) -> End {
        if let Some(end) = self.sync(false) {
            return end;
        }
        loop {
            let end = if self.unstaged() {
                match self.fast().await {
                    None => self.sync(true),
                    end => end,
                }
            } else {
                if self.at_rest() {
                    if let Some(end) = self.rest().await {
                        return end;
                    }
                    if self.unstaged() {
                        continue;
                    }
                }
                // Boxed: its timers and queues would otherwise sit in every idle
                // connection's future; it is allocated only while something is staged.
                Box::pin(self.staged()).await
            };
            if let Some(end) = end {
                return end;
            }
        }
    }

    /// No stage acts on this direction and nothing is left of one: the fast path.
    fn unstaged(&self) -> bool {
        self.chain.is_empty() && self.queue.is_empty() && !self.src_done
    }

    /// The faulted path: one chunk, due time or fault change at a time, until the
    /// direction ends (`Some`), has nothing staged any more, or is at rest again
    /// after it acted (`None`).
    pub(super) async fn staged(&mut self) -> Option<End> {
        let control = self.control;
        // Entered at rest when a captured source became readable: its read comes first.
        let mut first = true;
        while !(self.unstaged() || !first && self.at_rest()) {
            first = false;
            // Read before the checks, so a signal between them is not lost.
            let seen = control.seen();
            if let Some(end) = control.stopped() {
                return Some(end);
            }
            if self.faults.has_changed().unwrap_or(true) {
                if let Some(end) = self.sync(true) {
                    return Some(end);
                }
                continue;
            }
            let now = Instant::now();
            let head_due = self.queue.front().map(|s| s.step.due());
            // Due already (every chunk of a `latency=0` fault): done now, not after a
            // trip through a timer. A reset due goes first, as it did when the select
            // below chose between them.
            if self.reset_at.is_some_and(|at| at <= now) {
                return Some(self.reset_now());
            }
            if head_due.is_some_and(|due| due <= now) {
                // Boxed, as the taps below: a write and a capture record held inline
                // doubled the size of this future, which every faulted direction holds.
                if let Some(end) = Box::pin(self.send_head()).await {
                    return Some(end);
                }
                continue;
            }
            let can_read = !self.src_done && self.queued < QUEUE_LIMIT;
            // What is due next; the checks above act on it once it is.
            let next = match (self.reset_at, head_due) {
                (Some(reset), Some(head)) => Some(reset.min(head)),
                (reset, head) => reset.or(head),
            };
            tokio::select! {
                biased;
                _ = control.signalled(Waiter::Relay, seen) => {}
                _ = self.timer.until(next.unwrap_or(now)), if next.is_some() => {}
                read = read_some(&mut self.src), if can_read => {
                    let now = Instant::now();
                    let Ok(data) = read else {
                        return Some(End::PeerReset(self.side(Which::Src)));
                    };
                    if self.tap.is_some() {
                        let record = if data.is_empty() {
                            self.fin_record(Which::Src, None)
                        } else {
                            self.data_record(Which::Src, data.clone(), None)
                        };
                        Box::pin(tap(&self.tap, record)).await;
                    }
                    self.took(data, now);
                }
            }
        }
        None
    }

    /// The reset scheduled at `reset_at` is due: it ends the direction, and the
    /// faults that asked for it have acted.
    fn reset_now(&mut self) -> End {
        self.hit_reset = self.reset_by.take();
        self.acted(self.hit_reset.clone().as_ref());
        End::Reset
    }

    /// Brings the chain in line with the proxy's faults. `release`: a change of faults
    /// releases what the old chain was holding, at once, as Toxiproxy does when it
    /// interrupts its stubs; a scheduled close or reset happens at once too.
    pub(super) fn sync(&mut self, release: bool) -> Option<End> {
        let faults = self.faults.borrow_and_update().clone();
        if let Some(down) = faults
            .iter()
            .find(|f| f.kind == Kind::Down && f.acts_on_listener(self.id.class))
        {
            return Some(End::Down(down.name.clone()));
        }
        let now = Instant::now();
        if release {
            for staged in &mut self.queue {
                match &mut staged.step {
                    Step::Send(c) => c.due = c.due.min(now),
                    Step::Finish { at } | Step::Reset { at } => *at = (*at).min(now),
                }
            }
            self.reset_at = self.reset_at.map(|at| at.min(now));
        }
        let mut out = Vec::new();
        self.chain.sync(&faults, self.dir, self.id, now, &mut out);
        if release && self.src_done && !self.fin_queued {
            // The old chain swallowed the source's FIN (a blackhole); offer it to the
            // new one, so removing the blackhole lets the close through.
            self.chain.eof(now, &mut out);
        }
        for fault in self.chain.applied() {
            if !self.applied.iter().any(|a| a.name == fault.name) {
                self.applied.push(fault.clone());
            }
        }
        self.enqueue(out);
        None
    }

    pub(super) fn enqueue(&mut self, steps: impl IntoIterator<Item = Staged>) {
        for staged in steps {
            match &staged.step {
                Step::Reset { at } => {
                    if self.reset_at.is_none_or(|r| *at < r) {
                        self.reset_at = Some(*at);
                        self.reset_by = staged.by;
                    }
                }
                Step::Send(c) if c.data.is_empty() => {}
                Step::Send(c) => {
                    self.queued += c.data.len();
                    self.queue.push_back(staged);
                }
                Step::Finish { .. } => {
                    self.fin_queued = true;
                    self.queue.push_back(staged);
                }
            }
        }
    }

    /// Performs the step at the head of the queue, which is due.
    pub(super) async fn send_head(&mut self) -> Option<End> {
        let Staged { step, by } = self.queue.pop_front()?;
        match step {
            Step::Send(chunk) => {
                self.queued -= chunk.data.len();
                let end = self.write(&chunk.data).await;
                if end.is_none() {
                    let note = self.acted(by.as_ref());
                    let note = self.written_note(note);
                    tap(&self.tap, self.data_record(Which::Dst, chunk.data, note)).await;
                }
                end
            }
            Step::Finish { .. } => {
                // A FIN the destination can no longer take is no news: it closed first.
                let _ = self.dst.shutdown().await;
                let note = self.acted(by.as_ref());
                tap(&self.tap, self.fin_record(Which::Dst, note)).await;
                Some(if self.src_done { End::Eof } else { End::Closed })
            }
            Step::Reset { .. } => {
                self.acted(by.as_ref());
                self.hit_reset = by;
                Some(End::Reset)
            }
        }
    }

    /// Writes all of `data`, or says why the direction ended first. A fault change
    /// does not interrupt it: the bytes were already released by the chain.
    pub(super) async fn write(&mut self, data: &[u8]) -> Option<End> {
        let control = self.control;
        let mut written = 0;
        while written < data.len() {
            let seen = control.seen();
            if let Some(end) = control.stopped() {
                return Some(end);
            }
            tokio::select! {
                biased;
                n = self.dst.write(&data[written..]) => match n {
                    Ok(n) if n > 0 => {
                        written += n;
                        self.sent += n as u64;
                    }
                    _ => return Some(End::PeerReset(self.side(Which::Dst))),
                },
                _ = control.signalled(Waiter::Relay, seen) => {}
            }
        }
        None
    }
}

/// Hands `record` to the capture writer, waiting if it is behind: a capture loses no
/// packet. Takes the sender alone so the future does not borrow the whole flow.
pub(super) async fn tap(tap: &Option<mpsc::Sender<Record>>, record: Option<Record>) {
    if let (Some(tx), Some(record)) = (tap, record)
        && let Err(mpsc::error::TrySendError::Full(record)) = tx.try_send(record)
    {
        // Boxed: only a full queue waits, and the wait is large to keep in every future.
        let _ = Box::pin(tx.send(record)).await;
    }
}

#[derive(Clone, Copy)]
pub(super) enum Which {
    Src,
    Dst,
}
