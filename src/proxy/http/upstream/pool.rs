//! HTTP/1.1 upstream connections, pooled per listener and driven by the exchange that
//! uses them.
//!
//! The task that sends a request does the connection's IO itself, in snag's own
//! HTTP/1.1 ([`super::h1`]): it writes the request, reads the response head, and the
//! response body ([`Driven`]) reads on until the body ends, when the connection goes
//! back to the pool. An idle connection is polled by the pool's sweeper, so an
//! upstream's close is seen and the socket closed while nobody uses it.

use std::{
    future::poll_fn,
    io,
    pin::Pin,
    sync::{Arc, Mutex, Weak},
    task::{Context, Poll, ready},
    time::Duration,
};

use bytes::{Buf, Bytes, BytesMut};
use hyper::{
    HeaderMap, Method, Response, Uri,
    body::{Body, Frame, SizeHint},
    http::request,
};
use tokio::{io::AsyncWrite, time::Instant};

use super::{
    BoxError, Connector, Leg, Outbound,
    h1::{self, Chunked, Framing, Piece, Sending},
};

/// How long an idle connection is kept (hyper-util's pool kept them as long).
const IDLE: Duration = Duration::from_secs(90);
/// How often the sweeper looks at idle connections besides when one of them wakes it.
const SWEEP: Duration = Duration::from_millis(250);
/// What one read asks for at least.
const READ: usize = 8 * 1024;

/// The idle HTTP/1.1 connections to one upstream.
pub struct Pool {
    connector: Connector,
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// One upstream connection and what it read beyond the last response.
struct Conn {
    io: Leg,
    buf: BytesMut,
}

impl Conn {
    /// Reads what the upstream sent into the buffer; `Ready(Ok(0))` at its close.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ / 2 {
            self.buf.reserve(READ);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }

    /// Writes all of `bytes`, from `*at` on.
    fn poll_write_all(
        &mut self,
        cx: &mut Context<'_>,
        bytes: &[u8],
        at: &mut usize,
    ) -> Poll<io::Result<()>> {
        while *at < bytes.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &bytes[*at..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *at += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Whether an idle connection can carry a request: the upstream has neither
    /// closed it nor sent anything unasked. Costs no read while nothing came (the
    /// last read drained the socket, and the runtime waits for the next event).
    fn idle_open(&mut self, cx: &mut Context<'_>) -> bool {
        self.buf.is_empty() && self.poll_read(cx).is_pending()
    }
}

/// A request that failed on its connection, and whether it may go again on
/// another: nothing of it was written.
struct Failed {
    error: BoxError,
    unsent: bool,
}

impl Pool {
    /// A pool connecting through `connector`, with its sweeper running until the
    /// pool is dropped.
    pub fn new(connector: Connector) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            connector,
            idle: Mutex::new(Vec::new()),
        });
        tokio::spawn(sweep(Arc::downgrade(&pool)));
        pool
    }

    /// Sends the request with head `parts` and `body` on an idle connection, or a
    /// new one; a request an idle connection closed on before any of it was written
    /// goes once more, on a new connection.
    pub async fn send(
        self: &Arc<Pool>,
        parts: &request::Parts,
        mut body: Outbound,
    ) -> Result<Response<Driven>, BoxError> {
        let mut head = Vec::with_capacity(256 + 64 * parts.headers.len());
        let sending = h1::encode_request(parts, body.is_end_stream(), &mut head);
        let (mut conn, mut reused) = match self.take().await {
            Some(conn) => (conn, true),
            None => (self.connect().await?, false),
        };
        loop {
            let mut exchange = Exchange::new(&head, sending);
            match poll_fn(|cx| exchange.poll(cx, &mut conn, &mut body, &parts.method)).await {
                Ok(response) => {
                    let sent = exchange.sent;
                    return Ok(self.driven(conn, response, sent));
                }
                Err(Failed { unsent: true, .. }) if reused => {
                    (conn, reused) = (self.connect().await?, false);
                }
                Err(failed) => return Err(failed.error),
            }
        }
    }

    fn driven(self: &Arc<Pool>, conn: Conn, head: h1::Head, sent: bool) -> Response<Driven> {
        let state = match head.framing {
            Framing::Empty | Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Length(n),
            Framing::Chunked => State::Chunked(Chunked::default()),
            Framing::Close => State::Close,
        };
        let mut response = Response::new(Driven {
            conn: Some(conn),
            state,
            reusable: head.keep_alive && sent,
            pool: Arc::downgrade(self),
        });
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = head.headers;
        response
    }

    /// The most recently used idle connection that is open.
    async fn take(&self) -> Option<Conn> {
        poll_fn(|cx| Poll::Ready(self.take_ready(cx))).await
    }

    fn take_ready(&self, cx: &mut Context<'_>) -> Option<Conn> {
        let mut idle = self.lock();
        while let Some(mut entry) = idle.pop() {
            if entry.conn.idle_open(cx) {
                return Some(entry.conn);
            }
        }
        None
    }

    async fn connect(&self) -> Result<Conn, BoxError> {
        let io = tower_service::Service::call(&mut self.connector.clone(), Uri::default()).await?;
        Ok(Conn {
            io: io.into_inner(),
            buf: BytesMut::with_capacity(READ),
        })
    }

    fn put(&self, conn: Conn) {
        self.lock().push(Idle {
            conn,
            since: Instant::now(),
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle
            .lock()
            .expect("no code panics holding the idle connections")
    }

    /// Polls each idle connection with `cx`, dropping those that ended, sent
    /// something unasked or idled too long.
    fn sweep(&self, cx: &mut Context<'_>) {
        self.lock()
            .retain_mut(|idle| idle.since.elapsed() < IDLE && idle.conn.idle_open(cx));
    }
}

/// One request on one connection, until its response head is in: the head, then
/// the body as the client sends it, while the response is read (an upstream may
/// answer before it read the whole body).
struct Exchange<'a> {
    head: &'a [u8],
    sending: Sending,
    /// Bytes of `head`, then of `out`, written so far.
    at: usize,
    head_done: bool,
    /// Encoded body bytes waiting to be written.
    out: Vec<u8>,
    /// Data of a length-framed body waiting to be written.
    data: Bytes,
    /// The whole request was written.
    sent: bool,
}

impl<'a> Exchange<'a> {
    fn new(head: &'a [u8], sending: Sending) -> Exchange<'a> {
        Exchange {
            head,
            sending,
            at: 0,
            head_done: false,
            out: Vec::new(),
            data: Bytes::new(),
            sent: false,
        }
    }

    fn failed(&self, error: impl Into<BoxError>) -> Failed {
        Failed {
            error: error.into(),
            // Once the head is done, `at` counts the body's bytes.
            unsent: !self.head_done && self.at == 0,
        }
    }

    fn poll(
        &mut self,
        cx: &mut Context<'_>,
        conn: &mut Conn,
        body: &mut Outbound,
        method: &Method,
    ) -> Poll<Result<h1::Head, Failed>> {
        if let Poll::Ready(Err(e)) = self.poll_send(cx, conn, body) {
            return Poll::Ready(Err(e));
        }
        loop {
            // Nothing read yet is the usual case at first (the request just went):
            // no parse then.
            if !conn.buf.is_empty() {
                match h1::parse_head(&mut conn.buf, method) {
                    Ok(Some(head)) => return Poll::Ready(Ok(head)),
                    Ok(None) => {}
                    Err(e) => return Poll::Ready(Err(self.failed(e))),
                }
            }
            match ready!(conn.poll_read(cx)) {
                Ok(0) if conn.buf.is_empty() => {
                    return Poll::Ready(Err(
                        self.failed("the upstream closed the connection before it answered")
                    ));
                }
                Ok(0) => {
                    return Poll::Ready(Err(self.failed(
                        "the upstream closed the connection in the middle of the response head",
                    )));
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(self.failed(e))),
            }
        }
    }

    /// Writes what there is of the request; `Ready(Ok)` once all of it went.
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        conn: &mut Conn,
        body: &mut Outbound,
    ) -> Poll<Result<(), Failed>> {
        if !self.head_done {
            match ready!(conn.poll_write_all(cx, self.head, &mut self.at)) {
                Ok(()) => (self.head_done, self.at) = (true, 0),
                Err(e) => return Poll::Ready(Err(self.failed(e))),
            }
            if self.sending == Sending::Nothing {
                self.sent = true;
            }
        }
        while !self.sent {
            if !self.data.is_empty() {
                let mut at = 0;
                let written = conn.poll_write_all(cx, &self.data, &mut at);
                self.data.advance(at);
                ready!(written).map_err(|e| self.failed(e))?;
                continue;
            }
            if self.at < self.out.len() {
                let written = conn.poll_write_all(cx, &self.out, &mut self.at);
                ready!(written).map_err(|e| self.failed(e))?;
                continue;
            }
            self.out.clear();
            self.at = 0;
            match ready!(Pin::new(&mut *body).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if self.sending == Sending::Chunked => {
                        h1::encode_chunk(&data, &mut self.out);
                    }
                    Ok(data) => self.data = data,
                    Err(frame) => {
                        if let (Sending::Chunked, Ok(trailers)) =
                            (self.sending, frame.into_trailers())
                        {
                            h1::encode_last_chunk(Some(&trailers), &mut self.out);
                            self.sending = Sending::Nothing;
                        }
                    }
                },
                Some(Err(e)) => {
                    return Poll::Ready(Err(
                        self.failed(format!("the client's request body failed: {e}"))
                    ));
                }
                None if self.sending == Sending::Chunked => {
                    h1::encode_last_chunk(None, &mut self.out);
                    self.sending = Sending::Nothing;
                }
                None if self.out.is_empty() => self.sent = true,
                None => {}
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// The sweeper: on every wake-up of an idle connection and every [`SWEEP`], until
/// the pool is gone.
async fn sweep(pool: Weak<Pool>) {
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    poll_fn(|cx| {
        loop {
            let Some(pool) = pool.upgrade() else {
                return Poll::Ready(());
            };
            pool.sweep(cx);
            drop(pool);
            if tick.poll_tick(cx).is_pending() {
                return Poll::Pending;
            }
        }
    })
    .await
}

/// Where a response body is.
enum State {
    Length(u64),
    Chunked(Chunked),
    Close,
    Done,
}

/// A response body from a pooled connection, which it reads; the connection goes
/// back to the pool when the body ends, and closes if the body is dropped before.
pub struct Driven {
    conn: Option<Conn>,
    state: State,
    /// The connection may carry another request once the body ended.
    reusable: bool,
    pool: Weak<Pool>,
}

impl Driven {
    /// The body ended: the connection goes back to the pool if it may.
    fn release(&mut self) {
        self.state = State::Done;
        let Some(conn) = self.conn.take() else {
            return;
        };
        // Bytes after the response that nobody asked for: the connection is not
        // in a state to reuse.
        if self.reusable
            && conn.buf.is_empty()
            && let Some(pool) = self.pool.upgrade()
        {
            pool.put(conn);
        }
    }

    fn fail(&mut self, why: impl Into<BoxError>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.conn = None;
        self.state = State::Done;
        Poll::Ready(Some(Err(why.into())))
    }
}

impl Body for Driven {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = &mut this.conn else {
                return Poll::Ready(None);
            };
            match &mut this.state {
                State::Done => {
                    this.release();
                    return Poll::Ready(None);
                }
                State::Length(left) if !conn.buf.is_empty() => {
                    let n = (*left).min(conn.buf.len() as u64) as usize;
                    let data = conn.buf.split_to(n).freeze();
                    *left -= n as u64;
                    if *left == 0 {
                        this.release();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                State::Chunked(chunked) => match chunked.next(&mut conn.buf) {
                    Ok(Some(Piece::Data(data))) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Some(Piece::End(trailers))) => {
                        this.release();
                        return Poll::Ready(trailers.map(|t: HeaderMap| Ok(Frame::trailers(t))));
                    }
                    Ok(None) => {}
                    Err(e) => return this.fail(e),
                },
                State::Close if !conn.buf.is_empty() => {
                    let data = conn.buf.split().freeze();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                State::Length(_) | State::Close => {}
            }
            let Some(conn) = &mut this.conn else {
                return Poll::Ready(None);
            };
            match ready!(conn.poll_read(cx)) {
                Ok(0) if matches!(this.state, State::Close) => {
                    this.conn = None;
                    this.state = State::Done;
                    return Poll::Ready(None);
                }
                Ok(0) => {
                    return this
                        .fail("the upstream closed the connection before the response body's end");
                }
                Ok(_) => {}
                Err(e) => return this.fail(e),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
            State::Length(n) => SizeHint::with_exact(n),
            // Not exact 0: a 304's or a HEAD's Content-Length speaks of the
            // representation, and the server half passes a head it cannot check.
            _ => SizeHint::default(),
        }
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        // An empty body (204, HEAD, length 0) is never polled: it ended all the same.
        if matches!(self.state, State::Done) {
            self.release();
        }
    }
}
