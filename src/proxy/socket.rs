//! Socket options the relay needs that tokio does not offer: listeners that rebind
//! their port at once, a resizable accept backlog, and resets (SO_LINGER 0).

use std::{
    io,
    net::SocketAddr,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use socket2::{Domain, SockRef, Socket, Type};
use tokio::net::{TcpListener, TcpStream};

/// The backlog of a listener that is accepting normally.
pub const BACKLOG: i32 = 1024;

/// Binds a listener on `addr` with SO_REUSEADDR, so a proxy brought back up after
/// `down` gets its port again even while old connections sit in TIME_WAIT.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// Sets the accept backlog of a listening socket. Linux takes a second `listen()` on a
/// listening socket as a new backlog and leaves the queue as it is.
pub fn set_backlog(listener: &TcpListener, backlog: i32) -> io::Result<()> {
    let backlog = nix::sys::socket::Backlog::new(backlog).map_err(io::Error::from)?;
    nix::sys::socket::listen(listener, backlog).map_err(io::Error::from)
}

/// Makes the next close of `stream` send RST instead of FIN, dropping unsent data.
pub fn reset_on_close(stream: &TcpStream) {
    // Failing here means the socket is already gone; there is nothing left to reset.
    let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// A connection's socket shared between the task that reads and writes it (hyper)
/// and the code that must reach it from elsewhere (a fault's RST, a half-close):
/// one descriptor, where duplicating it would cost a second per connection.
#[derive(Debug, Clone)]
pub struct Shared(std::sync::Arc<TcpStream>, std::sync::Arc<AtomicU64>);

impl Shared {
    /// Shares `stream`.
    pub fn new(stream: TcpStream) -> Shared {
        Shared(std::sync::Arc::new(stream), Default::default())
    }

    /// Bytes written through it so far: lets a cut wait until what went before it
    /// has left (an HTTP/2 stream reset drops the stream's frames not yet written).
    pub fn written(&self) -> u64 {
        self.1.load(Ordering::Relaxed)
    }

    fn count(&self, done: io::Result<usize>) -> io::Result<usize> {
        if let Ok(n) = &done {
            self.1.fetch_add(*n as u64, Ordering::Relaxed);
        }
        done
    }

    /// Makes the socket's close send RST instead of FIN, dropping unsent data.
    pub fn reset_on_close(&self) {
        reset_on_close(&self.0);
    }

    /// Sends FIN now; reading goes on.
    pub fn shutdown_write(&self) {
        let _ = SockRef::from(&*self.0).shutdown(std::net::Shutdown::Write);
    }
}

impl tokio::io::AsyncRead for Shared {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        loop {
            std::task::ready!(self.0.poll_read_ready(cx))?;
            // Into the unfilled part as it is: zeroing it first would cost a memset
            // of hyper's whole read buffer on every read.
            match self.0.try_read_buf(buf) {
                Ok(_) => return std::task::Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return std::task::Poll::Ready(Err(e)),
            }
        }
    }
}

impl tokio::io::AsyncWrite for Shared {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return std::task::Poll::Ready(self.count(done)),
            }
        }
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        loop {
            std::task::ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return std::task::Poll::Ready(self.count(done)),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        self.shutdown_write();
        std::task::Poll::Ready(Ok(()))
    }
}

/// What an accept loop does after `accept` fails (EMFILE, ENFILE, ENOBUFS …): wait,
/// longer after each failure in a row, while open connections go on and free
/// descriptors; say so once per [`AcceptErrors::LOG_EVERY`], not once per try.
#[derive(Debug, Default)]
pub struct AcceptErrors {
    /// Failures in a row.
    failures: u64,
    /// Failures not yet logged.
    unlogged: u64,
    logged_at: Option<tokio::time::Instant>,
}

impl AcceptErrors {
    /// How often a run of failures is logged.
    pub const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
    const FIRST_WAIT: std::time::Duration = std::time::Duration::from_millis(5);
    const LONGEST_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

    /// Notes a failure of the listener `what`; returns how long to wait before the next
    /// accept.
    pub fn failed(&mut self, what: &str, err: &io::Error) -> std::time::Duration {
        self.failures += 1;
        self.unlogged += 1;
        let now = tokio::time::Instant::now();
        if self
            .logged_at
            .is_none_or(|at| now.duration_since(at) >= Self::LOG_EVERY)
        {
            tracing::warn!(
                listener = what,
                %err,
                failures = self.unlogged,
                "accept failed; backing off while open connections go on (logged once per {} s)",
                Self::LOG_EVERY.as_secs()
            );
            self.unlogged = 0;
            self.logged_at = Some(now);
        }
        let doublings = u32::try_from(self.failures.min(16)).unwrap_or(16) - 1;
        (Self::FIRST_WAIT * 2u32.pow(doublings)).min(Self::LONGEST_WAIT)
    }

    /// Notes a success: logs the end of a run of failures.
    pub fn accepted(&mut self, what: &str) {
        if self.failures > 0 {
            tracing::warn!(listener = what, failures = self.failures, "accepting again");
            *self = AcceptErrors::default();
        }
    }
}
