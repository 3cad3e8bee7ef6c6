//! What the relay needs of a connection: two halves to read and write, a way to make
//! its close a reset, and its addresses for the capture. A `TcpStream` is the real
//! one, and the only one that gets the unfaulted path's direct `recv`; tests relay
//! over in-memory pipes under paused time.

use std::{
    cell::RefCell,
    future::poll_fn,
    io,
    net::SocketAddr,
    pin::Pin,
    task::{Poll, ready},
};

use bytes::{Bytes, BytesMut};
use tokio::{
    io::{AsyncRead, AsyncWrite, Interest},
    net::{TcpStream, tcp},
};
use tokio_util::io::poll_read_buf;

use super::READ_SIZE;

thread_local! {
    /// The read buffer of both paths: one per worker thread, none per connection.
    pub(super) static BUF: RefCell<Vec<u8>> = RefCell::new(vec![0; READ_SIZE]);
    /// Where the faulted path reads: one per worker thread too.
    static STAGED: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// From this size on, a read's bytes leave the per-thread buffer as they are, not as
/// a copy: bulk transfers then copy nothing, and a chunk holds at most four times
/// its size while it is queued.
const HAND_OFF: usize = READ_SIZE / 4;

/// Reads what `src` has, up to [`READ_SIZE`], into a per-thread buffer; empty at the
/// end of the stream. The buffer is borrowed only inside each poll, so a connection
/// waiting here holds none: a buffer per connection kept 64 KiB reserved in every
/// idle faulted connection and left the allocator fragmented after they closed. A
/// small read is copied out at its size; a large one takes the buffer's bytes along.
pub(super) async fn read_some<R: Source>(src: &mut R) -> io::Result<Bytes> {
    poll_fn(|cx| {
        STAGED.with_borrow_mut(|buf| {
            buf.clear();
            buf.reserve(READ_SIZE);
            let n = ready!(poll_read_buf(Pin::new(&mut *src), cx, buf))?;
            Poll::Ready(Ok(take(buf, n)))
        })
    })
    .await
}

/// What [`read_some`] reads, read from a socket now if it has anything (`None` if
/// not), without a future. A read shorter than the room it had drained the socket:
/// tokio is told so, as its own `poll_read` does, and waits for the next edge
/// instead of costing a read that would only say EAGAIN.
pub(super) fn try_read_some(src: &TcpStream) -> io::Result<Option<Bytes>> {
    STAGED.with_borrow_mut(|buf| {
        buf.clear();
        buf.reserve(READ_SIZE);
        let room = buf.capacity();
        let mut read = None;
        let tried = src.try_io(Interest::READABLE, || {
            let n = src.try_read_buf(buf)?;
            read = Some(n);
            if n > 0 && n < room {
                Err(io::ErrorKind::WouldBlock.into())
            } else {
                Ok(())
            }
        });
        match (read, tried) {
            (Some(n), _) => Ok(Some(take(buf, n))),
            (None, Err(e)) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            (None, _) => Ok(None),
        }
    })
}

/// The `n` bytes just read into `buf`: a small read copied out at its size, a
/// large one taking the buffer's bytes along.
fn take(buf: &mut BytesMut, n: usize) -> Bytes {
    if n >= HAND_OFF {
        buf.split_to(n).freeze()
    } else {
        Bytes::copy_from_slice(&buf[..n])
    }
}

/// One end of a relayed connection.
pub trait Stream {
    /// The half the relay reads from.
    type Reader<'a>: Source
    where
        Self: 'a;
    /// The half the relay writes to.
    type Writer<'a>: Sink
    where
        Self: 'a;

    /// Both halves, borrowed for the length of the relay.
    fn halves(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>);

    /// Makes the next close send RST instead of FIN, dropping unsent data.
    fn reset_on_close(&self);

    /// (peer, local) addresses, where it has them: the capture's endpoints.
    fn ends(&self) -> Option<(SocketAddr, SocketAddr)>;
}

/// A readable half.
pub trait Source: AsyncRead + Unpin {
    /// The socket under it, if any: the unfaulted path then reads with `recv` into a
    /// per-thread buffer instead of a buffer of its own.
    fn tcp(&self) -> Option<&TcpStream> {
        None
    }
}

/// A writable half.
pub trait Sink: AsyncWrite + Unpin {
    /// The socket under it, if any: the unfaulted path writes to it without awaiting.
    fn tcp(&self) -> Option<&TcpStream> {
        None
    }
}

impl Stream for TcpStream {
    type Reader<'a> = tcp::ReadHalf<'a>;
    type Writer<'a> = tcp::WriteHalf<'a>;

    fn halves(&mut self) -> (tcp::ReadHalf<'_>, tcp::WriteHalf<'_>) {
        self.split()
    }

    fn reset_on_close(&self) {
        super::super::socket::reset_on_close(self);
    }

    fn ends(&self) -> Option<(SocketAddr, SocketAddr)> {
        Some((self.peer_addr().ok()?, self.local_addr().ok()?))
    }
}

impl Source for tcp::ReadHalf<'_> {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl Sink for tcp::WriteHalf<'_> {
    fn tcp(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl<S: Source + ?Sized> Source for &mut S {
    fn tcp(&self) -> Option<&TcpStream> {
        (**self).tcp()
    }
}

impl<S: Sink + ?Sized> Sink for &mut S {
    fn tcp(&self) -> Option<&TcpStream> {
        (**self).tcp()
    }
}

/// The relay's end of an HTTP connection's in-memory pipe (see
/// [`socket::Shared::pipe`](super::super::socket::Shared::pipe)): no addresses, and
/// a reset made by hyper's end, which the relay passes on to the client.
impl Stream for super::super::socket::PipeEnd {
    type Reader<'a> = &'a mut super::super::socket::PipeReader;
    type Writer<'a> = &'a mut super::super::socket::PipeWriter;

    fn halves(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>) {
        (&mut self.read, &mut self.write)
    }

    fn reset_on_close(&self) {}

    fn ends(&self) -> Option<(SocketAddr, SocketAddr)> {
        None
    }
}

impl Source for super::super::socket::PipeReader {}
impl Sink for super::super::socket::PipeWriter {}
