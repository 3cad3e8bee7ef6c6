//! A response body on its way to the client through the body hooks of the HTTP
//! faults that apply to it: each frame passed, rewritten, held or cut, and paced
//! by a slow drain.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{
    HeaderMap,
    body::{Body, Frame, SizeHint},
};
use tokio::time::Sleep;

use super::{Failure, connection::Conn, goaway::Processing, hits::Hits, upstream::UpstreamBody};
use crate::fault::{
    Fault,
    drain::{Drain, DrainMode},
    http::{BodyStep, Exchange},
};

/// The longest an HTTP/2 cut waits for the frames before it to be written: long
/// enough for a busy host, short enough that a client that stopped reading gets its
/// reset soon.
const FLUSH_WAIT: Duration = Duration::from_secs(1);

/// The fewest bytes an HTTP/2 HEADERS frame takes: its 9-byte header and one byte of
/// HPACK (`:status 200` indexed).
const HEADERS_MIN: u64 = 10;
/// A frame's header.
const FRAME_HEADER: u64 = 9;

/// A response body as snag sends it: an answer of its own, or the upstream's
/// through the faults. One allocation per forwarded response, not a box a layer.
pub(super) enum ReplyBody {
    Answer {
        data: Full<Bytes>,
        /// Boxed: rare, and a response is moved a few times on its way to hyper.
        trailers: Option<Box<HeaderMap>>,
    },
    Forwarded(Box<Faulted>),
}

impl ReplyBody {
    /// `bytes` in one frame, then `trailers` if any.
    pub(super) fn answer(bytes: Bytes, trailers: Option<HeaderMap>) -> ReplyBody {
        ReplyBody::Answer {
            data: Full::new(bytes),
            trailers: trailers.map(Box::new),
        }
    }
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = Failure;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Failure>>> {
        match self.get_mut() {
            ReplyBody::Answer { data, trailers } => match ready!(full(data, cx)) {
                Some(frame) => Poll::Ready(Some(frame)),
                None => Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(*t)))),
            },
            ReplyBody::Forwarded(body) => Pin::new(&mut **body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReplyBody::Answer { data, trailers } => data.is_end_stream() && trailers.is_none(),
            ReplyBody::Forwarded(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReplyBody::Answer { data, .. } => data.size_hint(),
            ReplyBody::Forwarded(body) => body.size_hint(),
        }
    }
}

/// What the body hooks read.
pub(super) enum Source {
    /// The upstream's body as it arrives.
    Streamed(UpstreamBody),
    /// All of it in one frame, read beforehand because a hook asked for it whole.
    Whole(Full<Bytes>),
}

/// `data`'s frame, in snag's error type.
fn full(
    data: &mut Full<Bytes>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, Failure>>> {
    Pin::new(data)
        .poll_frame(cx)
        .map(|f| f.map(|r| r.map_err(|never| match never {})))
}

impl Source {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Failure>>> {
        match self {
            Source::Streamed(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(Failure::Upstream))),
            Source::Whole(data) => full(data, cx),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Source::Streamed(body) => body.size_hint(),
            Source::Whole(data) => data.size_hint(),
        }
    }
}

/// How a hook ended the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Close,
    Reset,
}

/// The upstream's body with the hooks applied.
///
/// A cut happens in three polls: the last bytes go out; then one `Pending` (with a
/// wake-up) so hyper flushes them to the socket; then the end. An HTTP/1.1 close is
/// a FIN through the shared socket while the body stays open, so the client sees a
/// short body and EOF; a reset sets SO_LINGER 0 and fails the body, so hyper's
/// close is an RST. On HTTP/2 a failed body is an RST_STREAM for that stream alone.
pub(super) struct Faulted {
    inner: Source,
    faults: Vec<Arc<Fault>>,
    cx: Exchange,
    /// The hooks have seen the end of the body.
    ended: bool,
    wait: Option<Pin<Box<Sleep>>>,
    /// A frame waiting out its hold.
    held: Option<Bytes>,
    cut: Option<Cut>,
    cutting: Cutting,
    /// HTTP/2: the socket's bytes written before this response's head was handed
    /// to hyper.
    written_before: u64,
    /// HTTP/2: how many bytes the socket must have written before the stream is
    /// reset (this response's HEADERS and DATA at the least), and until when to wait.
    flushing: Option<(u64, tokio::time::Instant)>,
    h2: bool,
    /// Its socket, its proxy (consulted per frame: a slow drain paces responses
    /// already in flight) and the capture to record a reset in.
    conn: Arc<Conn>,
    /// The upstream's trailers (gRPC's status), sent after the last data.
    trailers: Option<HeaderMap>,
    /// The faults that acted on this exchange.
    hits: Hits,
    /// Held until the body is done: a graceful GOAWAY's close waits for it.
    _processing: Processing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cutting {
    No,
    Flush,
    Now,
    Done,
}

impl Faulted {
    pub(super) fn new(
        inner: Source,
        faults: Vec<Arc<Fault>>,
        cx: Exchange,
        conn: &Arc<Conn>,
        h2: bool,
        hits: Hits,
        processing: Processing,
    ) -> Faulted {
        let wait = (!cx.hold_body.is_zero()).then(|| Box::pin(tokio::time::sleep(cx.hold_body)));
        Faulted {
            inner,
            faults,
            cx,
            ended: false,
            wait,
            held: None,
            cut: None,
            cutting: Cutting::No,
            written_before: conn.socket.written(),
            flushing: None,
            h2,
            conn: conn.clone(),
            trailers: None,
            hits,
            _processing: processing,
        }
    }

    /// With `trailers` to send after the body, for a body read whole beforehand.
    pub(super) fn with_trailers(mut self, trailers: Option<HeaderMap>) -> Faulted {
        self.trailers = trailers;
        self
    }

    /// Runs the body hooks over `frame`: what goes to the client and how long it
    /// waits first. A cut is remembered, to happen once the frame is out.
    fn hooks(&mut self, mut frame: Bytes, end: bool) -> (Bytes, Duration) {
        let mut hold = Duration::ZERO;
        for fault in &self.faults {
            let Some(hooks) = fault.kind.http() else {
                continue;
            };
            let given = (frame.as_ptr(), frame.len());
            let step = hooks.body(&mut frame, end, &mut self.cx);
            let idle = matches!(step, BodyStep::Pass) || step == BodyStep::Hold(Duration::ZERO);
            if !idle || (frame.as_ptr(), frame.len()) != given {
                self.hits.acted(fault);
            }
            match step {
                BodyStep::Pass => {}
                BodyStep::Hold(d) => hold += d,
                BodyStep::Close => {
                    self.cut = Some(Cut::Close);
                    break;
                }
                BodyStep::Reset => {
                    self.cut = Some(Cut::Reset);
                    break;
                }
            }
        }
        self.cx.sent += frame.len() as u64;
        self.ended |= end;
        if let Some(Drain {
            mode: DrainMode::Slow,
            rate,
            ..
        }) = self.conn.proxy.draining()
        {
            hold += Duration::from_nanos(frame.len() as u64 * 1_000_000 / rate.max(1));
        }
        if self.cut.is_some() {
            self.cutting = Cutting::Flush;
        }
        (frame, hold)
    }

    fn cut(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Failure>>> {
        match self.cutting {
            Cutting::Flush => {
                self.cutting = Cutting::Now;
                // Other streams' bytes count too, so this is a lower bound: the reset
                // never goes before this response's frames could have left.
                let data = if self.cx.sent > 0 {
                    FRAME_HEADER + self.cx.sent
                } else {
                    0
                };
                self.flushing = self.h2.then(|| {
                    (
                        self.written_before + HEADERS_MIN + data,
                        tokio::time::Instant::now() + FLUSH_WAIT,
                    )
                });
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Cutting::Now => {
                // h2 drops a reset stream's frames still queued: the head and the
                // last bytes would never reach the client. Wait until the socket
                // has taken them (bounded: a client that stopped reading gets the
                // reset regardless).
                if let Some((need, until)) = self.flushing
                    && self.conn.socket.written() < need
                    && tokio::time::Instant::now() < until
                {
                    let mut tick = Box::pin(tokio::time::sleep(Duration::from_millis(1)));
                    if tick.as_mut().poll(cx).is_pending() {
                        self.wait = Some(tick);
                    } else {
                        cx.waker().wake_by_ref();
                    }
                    return Poll::Pending;
                }
                self.cutting = Cutting::Done;
                if self.cut == Some(Cut::Close) && !self.h2 {
                    self.conn.socket.shutdown_write();
                    // The connection ends when the client, seeing the FIN, closes.
                    return Poll::Pending;
                }
                if self.cut == Some(Cut::Reset) {
                    self.conn.socket.reset_on_close();
                    self.conn.record_reset("reset_mid_response");
                    self.conn.proxy.counters().fault_reset();
                    self.conn.proxy.event(
                        "fault_reset",
                        serde_json::json!({ "fault": "reset_mid_response" }),
                    );
                }
                Poll::Ready(Some(Err(Failure::Fault("response cut by a fault".into()))))
            }
            Cutting::Done | Cutting::No => Poll::Pending,
        }
    }
}

impl Body for Faulted {
    type Data = Bytes;
    type Error = Failure;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Failure>>> {
        let this = self.get_mut();
        loop {
            // Order matters: a hold first, then the frame it held, then a due cut.
            if let Some(wait) = &mut this.wait {
                ready!(wait.as_mut().poll(cx));
                this.wait = None;
            }
            if let Some(data) = this.held.take() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if this.cutting != Cutting::No {
                return this.cut(cx);
            }
            if this.ended {
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            }
            let (data, hold) = match ready!(this.inner.poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let whole = matches!(this.inner, Source::Whole(_));
                        this.hooks(data, whole)
                    }
                    // Trailers end the body: the hooks see its end, then they go.
                    Err(frame) => {
                        this.trailers = frame.into_trailers().ok();
                        this.hooks(Bytes::new(), true)
                    }
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                // The hooks see the end even of an empty body: they may fill it or cut.
                None => this.hooks(Bytes::new(), true),
            };
            if !data.is_empty() {
                // Held before it goes, not after: the last frame is paced too.
                this.held = Some(data);
            }
            if !hold.is_zero() {
                this.wait = Some(Box::pin(tokio::time::sleep(hold)));
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        // A hook may shorten, lengthen or cut it: the head's Content-Length says
        // what the client is promised, and the frames may not keep to it.
        if self.faults.is_empty() {
            self.inner.size_hint()
        } else {
            SizeHint::default()
        }
    }
}
