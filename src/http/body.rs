//! A response body with a fault plan applied: paced, cut, or reset partway.

use std::{
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::Sleep;

use super::{Conn, Failure, ReplyBody};
use crate::proxy::{
    Proxy,
    drain::{Drain, DrainMode},
    socket,
};

/// How a response body is to be broken.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Wait before the first body chunk.
    pub(super) first: Duration,
    /// Wait before every body chunk.
    pub(super) each: Duration,
    /// After this many body bytes, end the connection: FIN or RST.
    pub(super) cut: Option<(u64, Cut)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cut {
    Close,
    Reset,
}

/// The upstream's body with the plan applied.
///
/// A cut happens in three polls: the last bytes go out; then one `Pending` (with a
/// wake-up) so hyper flushes them to the socket; then the end. An HTTP/1.1 close is
/// a FIN through the duplicated descriptor while the body stays open, so the client
/// sees a short body and EOF; a reset sets SO_LINGER 0 and fails the body, so hyper's
/// close is an RST. On HTTP/2 a failed body is an RST_STREAM for that stream alone.
pub(super) struct Faulted {
    inner: ReplyBody,
    plan: Plan,
    sent: u64,
    wait: Option<Pin<Box<Sleep>>>,
    cutting: Cutting,
    h2: bool,
    socket: Option<socket::Shared>,
    /// Consulted per chunk: a slow drain paces responses already in flight.
    proxy: Arc<Proxy>,
    /// A chunk waiting out its pause.
    held: Option<Bytes>,
    /// The capture, to record a reset in.
    tap: Option<(tokio::sync::mpsc::Sender<crate::capture::Record>, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cutting {
    No,
    Flush,
    Now,
    Done,
}

impl Faulted {
    pub(super) fn new(inner: ReplyBody, plan: Plan, conn: &Conn, h2: bool) -> Faulted {
        let delay = plan.first;
        let socket = plan.cut.map(|_| conn.socket.clone());
        let wait = (!delay.is_zero()).then(|| Box::pin(tokio::time::sleep(delay)));
        let cutting = if plan.cut.is_some_and(|(limit, _)| limit == 0) {
            Cutting::Flush
        } else {
            Cutting::No
        };
        Faulted {
            inner,
            plan,
            sent: 0,
            wait,
            cutting,
            h2,
            socket,
            proxy: conn.proxy.clone(),
            held: None,
            tap: conn.tap.clone(),
        }
    }

    fn cut(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Failure>>> {
        match self.cutting {
            Cutting::Flush => {
                self.cutting = Cutting::Now;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Cutting::Now => {
                self.cutting = Cutting::Done;
                let how = self.plan.cut.map(|(_, how)| how);
                if how == Some(Cut::Close) && !self.h2 {
                    if let Some(socket) = &self.socket {
                        socket.shutdown_write();
                    }
                    // The connection ends when the client, seeing the FIN, closes.
                    return Poll::Pending;
                }
                if how == Some(Cut::Reset)
                    && let Some(socket) = &self.socket
                {
                    socket.reset_on_close();
                    super::record_reset(&self.tap, "reset_mid_response");
                    self.proxy.counters().fault_reset();
                    self.proxy.event(
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
        // Order matters: a pause first, then the chunk it held, then a due cut.
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
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                let Ok(mut data) = frame.into_data() else {
                    return Poll::Ready(None); // trailers: not relayed
                };
                if let Some((limit, _)) = this.plan.cut {
                    let left = limit.saturating_sub(this.sent);
                    if data.len() as u64 >= left {
                        data.truncate(left as usize);
                        this.cutting = Cutting::Flush;
                    }
                }
                this.sent += data.len() as u64;
                // Held before it goes, not after: the last chunk is paced too.
                let mut pause = this.plan.each;
                if let Some(Drain {
                    mode: DrainMode::Slow,
                    rate,
                    ..
                }) = this.proxy.draining()
                {
                    pause += Duration::from_nanos(data.len() as u64 * 1_000_000 / rate.max(1));
                }
                if pause.is_zero() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                this.held = Some(data);
                let mut wait = Box::pin(tokio::time::sleep(pause));
                if wait.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(this.held.take().map(|d| Ok(Frame::data(d))));
                }
                this.wait = Some(wait);
                Poll::Pending
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e))),
            // A reset due after more bytes than the body has still happens: the
            // client must see a reset, not a complete answer.
            None if matches!(this.plan.cut, Some((_, Cut::Reset))) => {
                this.cutting = Cutting::Flush;
                this.cut(cx)
            }
            None => Poll::Ready(None),
        }
    }

    fn size_hint(&self) -> SizeHint {
        if self.plan.cut.is_some() {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}
