//! Socket options the relay needs that tokio does not offer: listeners that rebind
//! their port at once, a resizable accept backlog, and resets (SO_LINGER 0).

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use atomic_waker::AtomicWaker;
use socket2::{Domain, SockRef, Socket, Type};
use tokio::{
    io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf, ReadHalf, WriteHalf},
    net::{TcpListener, TcpStream},
};

/// The backlog of a listener that is accepting normally: SOMAXCONN, the longest accept
/// queue Linux gives (it caps it at net.core.somaxconn). At tokio's 1024 a balancer
/// opening thousands of connections at once, on a host too busy for snag to accept
/// them as fast, overflows the queue: the kernel drops the SYNs, each client retries
/// a second or more later, and the delay looks like the backend's.
pub const BACKLOG: i32 = 4096;

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
///
/// Or, when TCP faults act on an HTTP connection's bytes, hyper's end of an
/// in-memory pipe whose other end ([`PipeEnd`]) the relay joins to the socket: a
/// half-close or RST asked for here then reaches the client through the relay,
/// after whatever its faults still hold.
#[derive(Debug, Clone)]
pub struct Shared {
    io: Io,
    written: Arc<AtomicU64>,
}

#[derive(Debug, Clone)]
enum Io {
    Tcp(Arc<TcpStream>),
    Pipe(Arc<Mutex<DuplexStream>>, Arc<PipeSignals>),
}

/// What hyper's end of a pipe tells the relay's end besides bytes.
#[derive(Debug, Default)]
pub struct PipeSignals {
    /// Send FIN once the bytes written before it are read.
    fin: AtomicBool,
    /// Make the close an RST.
    reset: AtomicBool,
    /// The relay's reader, waiting for bytes or a signal.
    reader: AtomicWaker,
}

/// How many bytes the pipe holds each way: a write beyond it waits for the relay,
/// as a full socket buffer waits for the peer.
const PIPE_BUFFER: usize = 64 * 1024;

impl Shared {
    /// Shares `stream`.
    pub fn new(stream: TcpStream) -> Shared {
        Shared {
            io: Io::Tcp(Arc::new(stream)),
            written: Default::default(),
        }
    }

    /// An in-memory connection: hyper's end, and the end the relay joins to the
    /// client's socket.
    pub fn pipe() -> (Shared, PipeEnd) {
        let (ours, theirs) = tokio::io::duplex(PIPE_BUFFER);
        let signals = Arc::new(PipeSignals::default());
        let (read, write) = tokio::io::split(theirs);
        let shared = Shared {
            io: Io::Pipe(Arc::new(Mutex::new(ours)), signals.clone()),
            written: Default::default(),
        };
        let end = PipeEnd {
            read: PipeReader {
                inner: read,
                signals,
            },
            write: PipeWriter(write),
        };
        (shared, end)
    }

    /// (peer, local) addresses of the socket; `None` for a pipe.
    pub fn ends(&self) -> Option<(SocketAddr, SocketAddr)> {
        match &self.io {
            Io::Tcp(tcp) => Some((tcp.peer_addr().ok()?, tcp.local_addr().ok()?)),
            Io::Pipe(..) => None,
        }
    }

    /// Bytes written through it so far: lets a cut wait until what went before it
    /// has left (an HTTP/2 stream reset drops the stream's frames not yet written).
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    fn count(&self, done: io::Result<usize>) -> io::Result<usize> {
        if let Ok(n) = &done {
            self.written.fetch_add(*n as u64, Ordering::Relaxed);
        }
        done
    }

    /// Makes the socket's close send RST instead of FIN, dropping unsent data.
    pub fn reset_on_close(&self) {
        match &self.io {
            Io::Tcp(tcp) => reset_on_close(tcp),
            Io::Pipe(_, signals) => {
                signals.reset.store(true, Ordering::Release);
                signals.reader.wake();
            }
        }
    }

    /// Ends a connection snag chose to end without an RST: FIN now, then what the
    /// peer still sends (a stream it opened before our GOAWAY reached it, a PING
    /// ack) is read and dropped until it closes too, for up to 2 s. Closing a socket
    /// with unread bytes makes the kernel send RST, and an RST makes the peer drop
    /// what it had not read yet — the GOAWAY frame that said those streams were not
    /// processed among it.
    pub fn close_lingering(&self) {
        let Io::Tcp(tcp) = &self.io else {
            // A pipe's FIN goes through the relay, which reads the socket on.
            self.shutdown_write();
            return;
        };
        self.shutdown_write();
        let tcp = tcp.clone();
        tokio::spawn(async move {
            let mut sink = [0u8; 4096];
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
            loop {
                let readable = tokio::time::timeout_at(deadline, tcp.readable()).await;
                if !matches!(readable, Ok(Ok(()))) {
                    return;
                }
                match tcp.try_read(&mut sink) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
        });
    }

    /// Sends FIN now; reading goes on.
    pub fn shutdown_write(&self) {
        match &self.io {
            Io::Tcp(tcp) => {
                let _ = SockRef::from(&**tcp).shutdown(std::net::Shutdown::Write);
            }
            Io::Pipe(_, signals) => {
                signals.fin.store(true, Ordering::Release);
                signals.reader.wake();
            }
        }
    }
}

fn lock(pipe: &Mutex<DuplexStream>) -> std::sync::MutexGuard<'_, DuplexStream> {
    pipe.lock().expect("no code panics holding a pipe")
}

impl AsyncRead for Shared {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let tcp = match &self.io {
            Io::Tcp(tcp) => tcp,
            Io::Pipe(pipe, _) => return Pin::new(&mut *lock(pipe)).poll_read(cx, buf),
        };
        loop {
            ready!(tcp.poll_read_ready(cx))?;
            let want = buf.remaining();
            let mut read = false;
            let outcome = tcp.try_io(tokio::io::Interest::READABLE, || {
                // Into the unfilled part as it is: zeroing it first would cost a
                // memset of hyper's whole read buffer on every read.
                let n = tcp.try_read_buf(buf)?;
                read = true;
                if 0 < n && n < want {
                    // A short read drained the socket: told WouldBlock, tokio waits
                    // for the next edge instead of letting the next poll cost a read
                    // that would only say EAGAIN (one per request, before).
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(())
            });
            if read {
                return Poll::Ready(Ok(()));
            }
            if let Err(e) = outcome
                && e.kind() != io::ErrorKind::WouldBlock
            {
                return Poll::Ready(Err(e));
            }
        }
    }
}

impl AsyncWrite for Shared {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let tcp = match &self.io {
            Io::Tcp(tcp) => tcp,
            Io::Pipe(pipe, _) => {
                let done = ready!(Pin::new(&mut *lock(pipe)).poll_write(cx, data));
                return Poll::Ready(self.count(done));
            }
        };
        loop {
            ready!(tcp.poll_write_ready(cx))?;
            match tcp.try_write(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(self.count(done)),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let tcp = match &self.io {
            Io::Tcp(tcp) => tcp,
            Io::Pipe(pipe, _) => {
                let done = ready!(Pin::new(&mut *lock(pipe)).poll_write_vectored(cx, data));
                return Poll::Ready(self.count(done));
            }
        };
        loop {
            ready!(tcp.poll_write_ready(cx))?;
            match tcp.try_write_vectored(data) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                done => return Poll::Ready(self.count(done)),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shutdown_write();
        Poll::Ready(Ok(()))
    }
}

/// The relay's end of [`Shared::pipe`].
#[derive(Debug)]
pub struct PipeEnd {
    pub(super) read: PipeReader,
    pub(super) write: PipeWriter,
}

/// What the relay reads of hyper's bytes: then EOF once hyper's end asked for a
/// FIN and everything before it was read, or closed; an error (as a reset socket
/// gives) if the close was to be an RST.
#[derive(Debug)]
pub struct PipeReader {
    inner: ReadHalf<DuplexStream>,
    signals: Arc<PipeSignals>,
}

/// What the relay writes the client's bytes to.
#[derive(Debug)]
pub struct PipeWriter(WriteHalf<DuplexStream>);

impl AsyncRead for PipeReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        self.signals.reader.register(cx.waker());
        let reset = || io::Error::from(io::ErrorKind::ConnectionReset);
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() == before => {
                if self.signals.reset.load(Ordering::Acquire) {
                    return Poll::Ready(Err(reset()));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.signals.fin.load(Ordering::Acquire) => Poll::Ready(Ok(())),
            other => other,
        }
    }
}

impl AsyncWrite for PipeWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
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
