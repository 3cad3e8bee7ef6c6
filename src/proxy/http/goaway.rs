//! One HTTP/2 connection's `goaway` as it plays out: which streams are let in,
//! the GOAWAYs and PING written through the frame layer, and the close.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::Notify,
};

use super::frames::{Frames, MAX_STREAM, Wire, lock};
use crate::{
    fault::http::{Close, GoawayPlan, LastStream},
    proxy::Proxy,
};

/// How often the close waits re-check what only the bytes tell (a PING answered, a
/// frame written while hyper is idle).
const TICK: Duration = Duration::from_millis(1);

/// How long the close waits for hyper to hand over the streams at or below the
/// last one: it hands each over as it reads it, so this bounds only a stream hyper
/// refused before any exchange saw it.
const HANDOVER_MAX: Duration = Duration::from_secs(5);

/// Shared by a connection's exchanges and its serving loop.
#[derive(Debug, Default)]
pub(super) struct H2Conn {
    pub(super) frames: Arc<Mutex<Frames>>,
    state: Mutex<State>,
    changed: Notify,
    /// snag queued frames of its own for the frame layer.
    queued: Notify,
    /// Streams forwarded whose responses have not finished.
    processing: AtomicU64,
    /// Set with the plan: from then on the close waits for `processing` to fall.
    planned: AtomicBool,
    /// Which streams, by their number on the connection, have decided whether
    /// they go upstream: all up to the first, and those beyond it.
    decided: Mutex<(u64, std::collections::BTreeSet<u64>)>,
}

/// A stream's place in the order of decisions, taken when hyper hands the stream
/// over (so a stream dropped before it ever ran still lets the next one go): it
/// waits its turn in [`Turn::wait`], and the next stream's begins when it is dropped.
pub(super) struct Turn {
    conn: Arc<H2Conn>,
    number: u64,
}

impl Turn {
    /// The stream's number on its connection, from 1.
    pub(super) fn number(&self) -> u64 {
        self.number
    }

    /// Waits until every stream before this one has decided.
    pub(super) async fn wait(&self) {
        loop {
            let woken = self.conn.changed.notified();
            let prefix = self
                .conn
                .decided
                .lock()
                .expect("no code panics holding the turn")
                .0;
            if prefix + 1 >= self.number {
                return;
            }
            woken.await;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut decided = self
            .conn
            .decided
            .lock()
            .expect("no code panics holding the turn");
        let (prefix, ahead) = &mut *decided;
        ahead.insert(self.number);
        while ahead.remove(&(*prefix + 1)) {
            *prefix += 1;
        }
        drop(decided);
        self.conn.changed.notify_waiters();
    }
}

#[derive(Debug, Default)]
struct State {
    /// The GOAWAY under way and the fault that asked for it.
    plan: Option<(GoawayPlan, String)>,
    /// The last stream let in, once declared.
    last: Option<u32>,
    /// The highest stream forwarded upstream.
    forwarded: u32,
    /// How many streams, by their number on the connection, are at or below the
    /// last one: each must have decided before `processing` says all is answered
    /// (one the frame layer saw but no exchange has forwarded yet counts nothing
    /// there).
    below_last: u64,
}

/// A forwarded stream's response; the close waits for it to finish.
pub(super) struct Processing(Arc<H2Conn>);

impl Drop for Processing {
    fn drop(&mut self) {
        self.0.processing.fetch_sub(1, Ordering::SeqCst);
        // Only a planned close waits for the count. Without a plan, a wake would
        // poll the serving loop's waits once more for every response.
        if self.0.planned.load(Ordering::SeqCst) {
            self.0.changed.notify_waiters();
        }
    }
}

impl H2Conn {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .expect("no code panics holding the goaway state")
    }

    /// The id of the stream that carries the next exchange, and its turn; `None`
    /// if the frame layer saw no new stream for it.
    pub(super) fn next_stream(self: &Arc<Self>) -> Option<(u32, Turn)> {
        let (id, number) = lock(&self.frames).take_opened()?;
        Some((
            id,
            Turn {
                conn: self.clone(),
                number,
            },
        ))
    }

    /// Whether stream `id` is above a declared last stream: unprocessed, it must
    /// never reach the upstream.
    pub(super) fn unprocessed(&self, id: u32) -> bool {
        id > 0 && self.state().last.is_some_and(|last| id > last)
    }

    /// Stream `id` goes upstream now, unless a GOAWAY declared it unprocessed
    /// meanwhile (`None`: hold it).
    pub(super) fn forward(self: &Arc<Self>, id: u32) -> Option<Processing> {
        let mut state = self.state();
        if id > 0 && state.last.is_some_and(|last| id > last) {
            return None;
        }
        state.forwarded = state.forwarded.max(id);
        self.processing.fetch_add(1, Ordering::SeqCst);
        Some(Processing(self.clone()))
    }

    /// Whether a `goaway` is under way on this connection.
    pub(super) fn planned(&self) -> bool {
        self.state().plan.is_some()
    }

    /// Fault `fault` asked for `plan` on stream `id`, the `number`th of the
    /// connection; true if this stream is then unprocessed. Only the first GOAWAY
    /// of a connection plays.
    pub(super) fn start(
        &self,
        plan: GoawayPlan,
        (id, number): (u32, u64),
        fault: &str,
        proxy: &Proxy,
    ) -> bool {
        let mut state = self.state();
        if state.plan.is_some() {
            return state.last.is_some_and(|last| id > last);
        }
        state.plan = Some((plan, fault.to_string()));
        self.planned.store(true, Ordering::SeqCst);
        let mut frames = lock(&self.frames);
        let last = match plan.last_stream {
            LastStream::Current => Some(id),
            LastStream::BelowInflight => Some(state.forwarded),
            LastStream::Graceful => None,
        };
        match last {
            Some(last) => {
                state.last = Some(last);
                // Every stream before this one has decided (it waited its turn).
                state.below_last = number;
                frames.goaway(last, plan.error_code);
                goaway_sent(proxy, fault, last, plan.error_code, true);
            }
            None => {
                frames.goaway(MAX_STREAM, plan.error_code);
                frames.ping();
                goaway_sent(proxy, fault, MAX_STREAM, plan.error_code, true);
            }
        }
        drop(frames);
        self.changed.notify_waiters();
        last.is_some_and(|last| id > last)
    }

    /// Fault `fault` lowers MAX_CONCURRENT_STREAMS to `max`: a SETTINGS frame at
    /// hyper's next frame boundary, or at once if hyper is idle.
    pub(super) fn max_streams(&self, max: u32, fault: &str, proxy: &Proxy) {
        lock(&self.frames).max_streams(max);
        proxy.counters().settings_sent();
        proxy.event(
            "settings_sent",
            serde_json::json!({ "fault": fault, "max_concurrent_streams": max }),
        );
        self.queued.notify_waiters();
    }

    /// Writes snag's queued frames while hyper has nothing to write (a stream whose
    /// answer is slow to come). Never resolves.
    pub(super) async fn inject<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        wire: &Wire<S>,
    ) -> std::convert::Infallible {
        loop {
            let woken = self.queued.notified();
            if lock(&self.frames).injecting() && !wire.inject() {
                tokio::time::sleep(TICK).await;
                continue;
            }
            woken.await;
        }
    }

    /// Resolves when the connection must close: after the GOAWAY (both for a
    /// graceful one) has been written and, as planned, its streams finished and the
    /// delay passed. Pending forever if no `goaway` fires.
    pub(super) async fn closing<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        wire: &Wire<S>,
        proxy: &Proxy,
    ) {
        let (plan, fault) = loop {
            let woken = self.changed.notified();
            if let Some(plan) = self.state().plan.clone() {
                break plan;
            }
            woken.await;
        };
        if plan.last_stream == LastStream::Graceful {
            // The second step, one round trip later: the PING's answer.
            loop {
                wire.inject();
                let acked = lock(&self.frames).ping_acked;
                if acked {
                    break;
                }
                tokio::time::sleep(TICK).await;
            }
            let mut frames = lock(&self.frames);
            let last = frames.max_opened;
            {
                let mut state = self.state();
                state.last = Some(last);
                state.below_last = frames.opened_count();
            }
            frames.goaway(last, plan.error_code);
            drop(frames);
            goaway_sent(proxy, &fault, last, plan.error_code, false);
        }
        while !wire.inject() {
            tokio::time::sleep(TICK).await;
        }
        if plan.close == Close::AfterStreamsFinish {
            // The streams up to the last one decide (hyper may not have handed the
            // latest over yet), then those forwarded finish.
            let handover = tokio::time::Instant::now() + HANDOVER_MAX;
            loop {
                let woken = self.changed.notified();
                let below_last = self.state().below_last;
                let decided = self
                    .decided
                    .lock()
                    .expect("no code panics holding the turn")
                    .0
                    >= below_last
                    || tokio::time::Instant::now() >= handover;
                if decided && self.processing.load(Ordering::SeqCst) == 0 {
                    break;
                }
                tokio::select! {
                    () = woken => {}
                    () = tokio::time::sleep_until(handover), if !decided => {}
                }
            }
        }
        tokio::time::sleep(plan.delay_close).await;
    }
}

/// A GOAWAY queued on a connection: `first` counts the connection (a graceful
/// one's announcement counts even if the client closes before the second).
fn goaway_sent(proxy: &Proxy, fault: &str, last: u32, code: u32, first: bool) {
    if first {
        proxy.counters().goaway();
    }
    proxy.event(
        "goaway",
        serde_json::json!({ "fault": fault, "last_stream_id": last, "error_code": code }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(conn: &Arc<H2Conn>, number: u64) -> Turn {
        Turn {
            conn: conn.clone(),
            number,
        }
    }

    /// A proxy for the events, and a graceful GOAWAY that waits for its streams.
    fn graceful() -> (Arc<Proxy>, GoawayPlan) {
        let config = crate::fault::config::ProxyConfig::new(
            "p",
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:1",
        );
        let plan = GoawayPlan {
            last_stream: LastStream::Graceful,
            error_code: 0,
            close: Close::AfterStreamsFinish,
            delay_close: Duration::ZERO,
        };
        let proxy = Proxy::new(config, crate::proxy::RunContext::new(1)).unwrap();
        (proxy, plan)
    }

    #[test]
    fn a_finished_response_wakes_the_serving_loop_only_under_a_planned_close() {
        let conn = Arc::new(H2Conn::default());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // Without a plan nothing waits for the count: the response's end is silent.
        let mut changed = std::pin::pin!(conn.changed.notified());
        changed.as_mut().enable();
        drop(conn.forward(0).expect("no GOAWAY holds it"));
        assert!(changed.as_mut().poll(&mut cx).is_pending());
        assert_eq!(conn.processing.load(Ordering::SeqCst), 0);

        // With one, the close that waits for streams to finish hears each end.
        let processing = conn.forward(1).expect("below any last stream");
        let (proxy, plan) = graceful();
        assert!(!conn.start(plan, (1, 1), "g", &proxy));
        let mut changed = std::pin::pin!(conn.changed.notified());
        changed.as_mut().enable();
        drop(processing);
        assert!(changed.as_mut().poll(&mut cx).is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn streams_decide_in_the_order_they_opened_even_if_one_never_runs() {
        let conn = Arc::new(H2Conn::default());
        let (first, second, third) = (turn(&conn, 1), turn(&conn, 2), turn(&conn, 3));
        first.wait().await;
        let waiting = async {
            third.wait().await;
            tokio::time::Instant::now()
        };
        let released = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(first);
            tokio::time::sleep(Duration::from_millis(10)).await;
            // The second stream was dropped before it ever waited (the client reset
            // it): the third goes on.
            drop(second);
            tokio::time::Instant::now()
        };
        let t0 = tokio::time::Instant::now();
        let (went, last_release) = tokio::join!(waiting, released);
        assert_eq!(went, last_release);
        assert_eq!(went - t0, Duration::from_millis(20));
    }

    /// A frame as the client writes it.
    fn client_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[tokio::test(start_paused = true)]
    async fn a_graceful_close_waits_for_a_stream_below_the_last_that_hyper_has_yet_to_hand_over() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let conn = Arc::new(H2Conn::default());
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let wire = Wire::new(server, conn.frames.clone());
        let mut hyper = wire.shim();
        // What hyper reads goes through the frame layer, as in the proxy.
        let mut reads = async |bytes: Vec<u8>| {
            client.write_all(&bytes).await.unwrap();
            let mut got = vec![0; bytes.len()];
            hyper.read_exact(&mut got).await.unwrap();
        };
        let mut opening = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        opening.extend(client_frame(0x1, 0x5, 1, &[0x82]));
        reads(opening).await;
        let (id, first) = conn.next_stream().expect("stream 1 opened");
        let answering = conn.forward(id).expect("no GOAWAY yet");
        drop(first);
        let (proxy, plan) = graceful();
        assert!(!conn.start(plan, (1, 1), "g", &proxy));
        // Stream 3 left the client before the first GOAWAY reached it; then the
        // PING's answer. The frame layer has seen both, hyper has handed over neither.
        let mut late = client_frame(0x1, 0x5, 3, &[0x82]);
        late.extend(client_frame(
            0x6,
            0x1,
            0,
            &super::super::frames::PING_PAYLOAD,
        ));
        reads(late).await;
        let mut closing = std::pin::pin!(conn.closing(&wire, &proxy));
        let wait = Duration::from_millis(100);
        drop(answering);
        assert!(
            tokio::time::timeout(wait, closing.as_mut()).await.is_err(),
            "stream 3 is below the last stream and not answered: the connection stays"
        );
        assert_eq!(lock(&conn.frames).goaways, [(MAX_STREAM, 0), (3, 0)]);
        let (id, third) = conn.next_stream().expect("stream 3 handed over");
        let answering = conn.forward(id).expect("at the last stream");
        drop(third);
        assert!(tokio::time::timeout(wait, closing.as_mut()).await.is_err());
        drop(answering);
        tokio::time::timeout(wait, closing)
            .await
            .expect("closes once stream 3 is answered");
    }
}
