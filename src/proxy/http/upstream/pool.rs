//! HTTP/1.1 upstream connections, pooled per listener and driven by the exchange that
//! uses them.
//!
//! hyper-util's pooled client runs every connection in a task of its own: a request
//! crossed from the client connection's task to that task and its answer came back
//! the same way, two wake-ups (often across worker threads) per request, and at 32
//! connections the machine spent more time switching threads than in snag. Here the
//! task that sends a request polls the connection itself: while it waits for the
//! head, and through the response body ([`Driven`]) until the body ends, when the
//! connection goes back to the pool. An idle connection is polled by the pool's
//! sweeper, so an upstream's close is seen and the socket closed while nobody uses it.

use std::{
    future::{Future, poll_fn},
    pin::Pin,
    sync::{Arc, Mutex, Weak},
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use hyper::{
    Request, Response, Uri,
    body::{Body, Frame, Incoming, SizeHint},
    client::conn::http1,
};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::{BoxError, Connector, Leg};

/// How long an idle connection is kept (hyper-util's pool kept them as long).
const IDLE: Duration = Duration::from_secs(90);
/// How often the sweeper looks at idle connections besides when one of them wakes it.
const SWEEP: Duration = Duration::from_millis(250);

/// The idle HTTP/1.1 connections to one upstream.
pub struct Pool {
    connector: Connector,
    idle: Mutex<Vec<Idle>>,
}

struct Idle {
    conn: Driver,
    since: Instant,
}

/// The future that carries a connection's requests.
type Connection = Pin<Box<http1::Connection<TokioIo<Leg>, Incoming>>>;

/// One connection: the sender of its requests and the future that carries them.
struct Driver {
    send: http1::SendRequest<Incoming>,
    /// `None` once it ended.
    conn: Option<Connection>,
}

impl Driver {
    /// Polls the connection; `false` once it ended (closed or failed).
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        if let Some(conn) = &mut self.conn
            && conn.as_mut().poll(cx).is_ready()
        {
            self.conn = None;
        }
        self.conn.is_some()
    }

    /// Whether it can carry another request once ready.
    fn usable(&mut self, cx: &mut Context<'_>) -> bool {
        self.drive(cx) && self.open()
    }

    /// Whether it was open when last driven.
    fn open(&self) -> bool {
        self.conn.is_some() && !self.send.is_closed()
    }
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

    /// Sends `req` on an idle connection, or a new one; a request an idle connection
    /// closed on before sending it goes once more, on a new connection.
    pub async fn send(
        self: &Arc<Pool>,
        mut req: Request<Incoming>,
    ) -> Result<Response<Driven>, BoxError> {
        if req.uri().scheme().is_some() {
            *req.uri_mut() = origin_form(req.uri());
        }
        let (mut conn, mut reused) = match self.take().await {
            Some(conn) => (conn, true),
            None => (self.connect().await?, false),
        };
        loop {
            let mut err = match exchange(&mut conn, req).await {
                Ok(response) => return Ok(self.driven(conn, response)),
                Err(err) => err,
            };
            match err.take_message() {
                Some(unsent) if reused => {
                    (req, conn, reused) = (unsent, self.connect().await?, false);
                }
                _ => return Err(err.into_error().into()),
            }
        }
    }

    fn driven(self: &Arc<Pool>, conn: Driver, response: Response<Incoming>) -> Response<Driven> {
        response.map(|body| Driven {
            body,
            conn: Some(conn),
            pool: Arc::downgrade(self),
        })
    }

    /// The most recently used idle connection that is open and ready for a request.
    /// One still busy (its last request's body still going up after the answer
    /// ended) goes back beneath the others, for the sweeper to drive.
    async fn take(&self) -> Option<Driver> {
        poll_fn(|cx| Poll::Ready(self.take_ready(cx))).await
    }

    fn take_ready(&self, cx: &mut Context<'_>) -> Option<Driver> {
        let mut idle = self.lock();
        let mut busy = Vec::new();
        let found = loop {
            let Some(mut entry) = idle.pop() else {
                break None;
            };
            // Not driven here: it was when its last response ended, and the sweeper
            // drives it on any wake-up since. One that ended unseen fails the send,
            // which then goes on a new connection.
            if !entry.conn.open() {
                continue;
            }
            match entry.conn.send.poll_ready(cx) {
                Poll::Ready(Ok(())) => break Some(entry.conn),
                Poll::Ready(Err(_)) => {}
                Poll::Pending => busy.push(entry),
            }
        };
        idle.splice(0..0, busy.into_iter().rev());
        found
    }

    async fn connect(&self) -> Result<Driver, BoxError> {
        let io = tower_service::Service::call(&mut self.connector.clone(), Uri::default()).await?;
        let (send, conn) = http1::handshake(io).await?;
        Ok(Driver {
            send,
            conn: Some(Box::pin(conn)),
        })
    }

    fn put(&self, conn: Driver) {
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

    /// Polls each idle connection with `cx`, dropping those that ended or idled too long.
    fn sweep(&self, cx: &mut Context<'_>) {
        self.lock()
            .retain_mut(|idle| idle.since.elapsed() < IDLE && idle.conn.usable(cx));
    }
}

/// Sends `req` on `conn`, polling the connection until the response head is in.
async fn exchange(
    conn: &mut Driver,
    req: Request<Incoming>,
) -> Result<Response<Incoming>, hyper::client::conn::TrySendError<Request<Incoming>>> {
    let mut response = std::pin::pin!(conn.send.try_send_request(req));
    poll_fn(|cx| {
        // An error of the connection reaches the response future: only it says.
        conn.drive(cx);
        response.as_mut().poll(cx)
    })
    .await
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

/// `/path?query`: what an HTTP/1.1 request line names on a connection to the origin.
fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(path) => Uri::from(path.clone()),
        None => Uri::from_static("/"),
    }
}

/// A response body from a pooled connection, which it drives; the connection goes
/// back to the pool when the body ends, and closes if the body is dropped before.
pub struct Driven {
    body: Incoming,
    conn: Option<Driver>,
    pool: Weak<Pool>,
}

impl Driven {
    /// Back to the pool, if it was open when last driven. Not driven here: the
    /// poll that read the body's end has driven it, and hyper made it idle then.
    fn release(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if conn.open()
            && let Some(pool) = self.pool.upgrade()
        {
            pool.put(conn);
        }
    }
}

impl Body for Driven {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let mut polled = Pin::new(&mut this.body).poll_frame(cx);
        if polled.is_pending()
            && let Some(conn) = &mut this.conn
        {
            // The body asked for more: the connection reads it, then the body has it.
            conn.drive(cx);
            polled = Pin::new(&mut this.body).poll_frame(cx);
        }
        match &polled {
            Poll::Ready(None) => this.release(),
            Poll::Ready(Some(Ok(_))) if this.body.is_end_stream() => this.release(),
            Poll::Ready(Some(Err(_))) => this.conn = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        // An empty body (204, HEAD, length 0) is never polled: it ended all the same.
        if self.body.is_end_stream() {
            self.release();
        }
    }
}
