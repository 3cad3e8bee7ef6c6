//! One connection: two directions, each `read → chain → ordered queue → write`, with
//! half-close kept (a FIN one way while the other still flows) and resets made real.
//!
//! With no stage on a direction the relay takes a fast path: wait until the source is
//! readable, read into a per-thread buffer, write straight on. An idle connection
//! then holds no buffer at all. As soon as a fault applies, the direction switches to
//! the staged path, and back once its chain and queue are empty again.

mod control;
mod fast;
mod stream;
#[cfg(test)]
mod tests;

use std::{collections::VecDeque, pin::pin, sync::Arc};

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::{mpsc, watch},
    time::{Instant, sleep_until},
};

pub use self::{
    control::Control,
    stream::{Sink, Source, Stream},
};
use crate::{
    capture::{self, CLIENT_LEG, Record, UPSTREAM_LEG, tcp::Peer},
    fault::{Chain, ConnId, Direction, Fault, Kind, stage::Chunk, stage::Step},
};

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
    tap: Option<mpsc::Sender<Record>>,
) -> Outcome {
    if let Some(tx) = &tap
        && let (Some((c, l)), Some((p, u))) = (client.ends(), upstream.ends())
    {
        let conn = capture::key(id.proxy, id.conn);
        for (leg, ends) in [(CLIENT_LEG, (c, l)), (UPSTREAM_LEG, (u, p))] {
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
    let mut applied = Vec::new();
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
            tap.clone(),
        );
        let mut down = Flow::new(
            Direction::Downstream,
            upstream_r,
            client_w,
            faults.clone(),
            control,
            id,
            tap.clone(),
        );
        let (a, b) = tokio::join!(up.run(), down.run());
        applied.extend(up.applied);
        for name in down.applied {
            if !applied.contains(&name) {
                applied.push(name);
            }
        }
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
            Ending::Fault { name: names() }
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
                    r.push(rst(
                        CLIENT_LEG,
                        Peer::Acceptor,
                        Some("snag: upstream reset, passed on".into()),
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
        fault_reset,
    }
}

/// One direction of one connection.
struct Flow<'a, R, W> {
    dir: Direction,
    src: R,
    dst: W,
    faults: Faults,
    control: &'a Control,
    id: ConnId<'a>,
    chain: Chain,
    queue: VecDeque<Step>,
    queued: usize,
    reset_at: Option<Instant>,
    src_done: bool,
    /// A FIN towards the destination is queued (or was sent).
    fin_queued: bool,
    sent: u64,
    received: u64,
    applied: Vec<String>,
    tap: Option<mpsc::Sender<Record>>,
    /// The connection's key in the capture, computed once.
    capture_key: u64,
}

impl<'a, R: Source, W: Sink> Flow<'a, R, W> {
    fn new(
        dir: Direction,
        src: R,
        dst: W,
        faults: Faults,
        control: &'a Control,
        id: ConnId<'a>,
        tap: Option<mpsc::Sender<Record>>,
    ) -> Self {
        Flow {
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
            applied: Vec::new(),
        }
    }

    fn side(&self, of: Which) -> Side {
        match (self.dir, of) {
            (Direction::Upstream, Which::Src) | (Direction::Downstream, Which::Dst) => Side::Client,
            _ => Side::Upstream,
        }
    }

    /// The (leg, sender) of bytes read from the source, and of bytes written.
    fn legs(&self) -> ((usize, Peer), (usize, Peer)) {
        match self.dir {
            Direction::Upstream => (
                (CLIENT_LEG, Peer::Initiator),
                (UPSTREAM_LEG, Peer::Initiator),
            ),
            Direction::Downstream => ((UPSTREAM_LEG, Peer::Acceptor), (CLIENT_LEG, Peer::Acceptor)),
        }
    }

    /// The record of bytes read (`Which::Src`) or written (`Which::Dst`), if capturing.
    fn data_record(&self, which: Which, data: Bytes, note: Option<String>) -> Option<Record> {
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
    fn fin_record(&self, which: Which, note: Option<String>) -> Option<Record> {
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

    /// The comment for what a faulted direction writes.
    fn note(&self) -> Option<String> {
        let names: Vec<&str> = self.chain.applied().collect();
        (!names.is_empty()).then(|| format!("snag: {}", names.join(", ")))
    }

    async fn run(&mut self) -> End {
        let end = self.relay().await;
        if !matches!(end, End::Eof | End::Closed) {
            // Whatever ended this direction ends the connection: stop the other one.
            self.control.abort();
        }
        end
    }

    async fn relay(&mut self) -> End {
        if let Some(end) = self.sync(false) {
            return end;
        }
        loop {
            let end = if self.chain.is_empty() && self.queue.is_empty() && !self.src_done {
                self.fast().await
            } else {
                // Boxed: its timers and queues would otherwise sit in every idle
                // connection's future; it is allocated only while faults are on.
                Box::pin(self.staged()).await
            };
            if let Some(end) = end {
                return end;
            }
            if let Some(end) = self.sync(true) {
                return end;
            }
        }
    }

    /// The faulted path: one chunk, due time or fault change at a time, until the
    /// direction ends (`Some`) or has nothing staged any more (`None`).
    async fn staged(&mut self) -> Option<End> {
        let control = self.control;
        while !(self.chain.is_empty() && self.queue.is_empty() && !self.src_done) {
            // Registered before the checks, so a wake-up between them is not lost.
            let mut woken = pin!(control.notify.notified());
            woken.as_mut().enable();
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
            let head_due = self.queue.front().map(Step::due);
            let can_read = !self.src_done && self.queued < QUEUE_LIMIT;
            let mut buf = BytesMut::new();
            let mut out = Vec::new();
            tokio::select! {
                biased;
                _ = woken => {}
                _ = sleep_until(timer(self.reset_at.unwrap_or(now))), if self.reset_at.is_some() => return Some(End::Reset),
                _ = sleep_until(timer(head_due.unwrap_or(now))), if head_due.is_some() => {
                    if let Some(end) = self.send_head().await {
                        return Some(end);
                    }
                }
                read = async { buf.reserve(READ_SIZE); self.src.read_buf(&mut buf).await }, if can_read => {
                    let now = Instant::now();
                    match read {
                        Ok(0) => {
                            self.src_done = true;
                            tap(&self.tap, self.fin_record(Which::Src, None)).await;
                            self.chain.eof(now, &mut out);
                        }
                        Ok(n) => {
                            self.received += n as u64;
                            let data = buf.freeze();
                            tap(&self.tap, self.data_record(Which::Src, data.clone(), None)).await;
                            self.chain.chunk(Chunk { data, due: now }, &mut out);
                        }
                        Err(_) => return Some(End::PeerReset(self.side(Which::Src))),
                    }
                    self.enqueue(out);
                }
            }
        }
        None
    }

    /// Brings the chain in line with the proxy's faults. `release`: a change of faults
    /// releases what the old chain was holding, at once, as Toxiproxy does when it
    /// interrupts its stubs; a scheduled close or reset happens at once too.
    fn sync(&mut self, release: bool) -> Option<End> {
        let faults = self.faults.borrow_and_update().clone();
        if let Some(down) = faults
            .iter()
            .find(|f| f.kind == Kind::Down && f.acts_on_listener(self.id.class))
        {
            return Some(End::Down(down.name.clone()));
        }
        let now = Instant::now();
        if release {
            for step in &mut self.queue {
                match step {
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
        for name in self.chain.applied() {
            if !self.applied.iter().any(|a| a == name) {
                self.applied.push(name.to_string());
            }
        }
        self.enqueue(out);
        None
    }

    fn enqueue(&mut self, steps: Vec<Step>) {
        for step in steps {
            match step {
                Step::Reset { at } => self.reset_at = Some(self.reset_at.map_or(at, |r| r.min(at))),
                Step::Send(c) if c.data.is_empty() => {}
                Step::Send(c) => {
                    self.queued += c.data.len();
                    self.queue.push_back(Step::Send(c));
                }
                finish => {
                    self.fin_queued = true;
                    self.queue.push_back(finish);
                }
            }
        }
    }

    /// Performs the step at the head of the queue, which is due.
    async fn send_head(&mut self) -> Option<End> {
        match self.queue.pop_front()? {
            Step::Send(chunk) => {
                self.queued -= chunk.data.len();
                let end = self.write(&chunk.data).await;
                if end.is_none() {
                    tap(
                        &self.tap,
                        self.data_record(Which::Dst, chunk.data, self.note()),
                    )
                    .await;
                }
                end
            }
            Step::Finish { .. } => {
                // A FIN the destination can no longer take is no news: it closed first.
                let _ = self.dst.shutdown().await;
                let note = if self.src_done { None } else { self.note() };
                tap(&self.tap, self.fin_record(Which::Dst, note)).await;
                Some(if self.src_done { End::Eof } else { End::Closed })
            }
            Step::Reset { .. } => Some(End::Reset),
        }
    }

    /// Writes all of `data`, or says why the direction ended first. A fault change
    /// does not interrupt it: the bytes were already released by the chain.
    async fn write(&mut self, data: &[u8]) -> Option<End> {
        let control = self.control;
        let mut written = 0;
        while written < data.len() {
            let mut woken = pin!(control.notify.notified());
            woken.as_mut().enable();
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
                _ = woken => {}
            }
        }
        None
    }
}

/// Hands `record` to the capture writer, waiting if it is behind: a capture loses no
/// packet. Takes the sender alone so the future does not borrow the whole flow.
async fn tap(tap: &Option<mpsc::Sender<Record>>, record: Option<Record>) {
    if let (Some(tx), Some(record)) = (tap, record)
        && let Err(mpsc::error::TrySendError::Full(record)) = tx.try_send(record)
    {
        // Boxed: only a full queue waits, and the wait is large to keep in every future.
        let _ = Box::pin(tx.send(record)).await;
    }
}

/// tokio's timer rounds every deadline up to its next 1 ms tick, so a chunk due at
/// `due` would leave 0.5 ms late on average, and up to 1 ms. Aiming half a tick early
/// centres the error on zero: a chunk leaves within ±0.5 ms of its due time.
fn timer(due: Instant) -> Instant {
    due.checked_sub(std::time::Duration::from_micros(500))
        .unwrap_or(due)
}

#[derive(Clone, Copy)]
enum Which {
    Src,
    Dst,
}
