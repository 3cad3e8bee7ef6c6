//! A stream that records what crosses it: HTTP mode's legs, whose bytes hyper reads
//! and writes, are captured by wrapping their sockets in one of these.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::PollSender;

use super::{Record, now, tcp::Peer};

/// `S`, with every read, write and FIN recorded on one leg of a capture. Waits for
/// room in the capture's queue before each, so nothing is dropped.
pub struct Tapped<S> {
    inner: S,
    /// `None`: a plain stream, nothing recorded.
    tx: Option<PollSender<Record>>,
    conn: u64,
    leg: usize,
    /// Which side of the leg snag is.
    us: Peer,
    /// Comments for the next bytes written.
    notes: Option<std::sync::Arc<Notes>>,
}

/// Comments waiting for the next bytes a tapped stream writes. HTTP mode adds the
/// name of a fault when it acts, so the packet that carries the fault's effect (an
/// answer in the backend's place, a held head, a cut body, a GOAWAY) says so.
#[derive(Debug, Default)]
pub struct Notes(std::sync::Mutex<Vec<String>>);

impl Notes {
    /// `note` goes on the next bytes written.
    pub fn add(&self, note: String) {
        let mut notes = self
            .0
            .lock()
            .expect("no code panics holding the notes lock");
        if !notes.contains(&note) {
            notes.push(note);
        }
    }

    /// What is waiting, joined, if anything.
    pub fn take(&self) -> Option<String> {
        let mut notes = self
            .0
            .lock()
            .expect("no code panics holding the notes lock");
        (!notes.is_empty()).then(|| {
            let joined = notes.join("; ");
            notes.clear();
            joined
        })
    }
}

impl<S> Tapped<S> {
    /// Records `inner`'s traffic as leg `leg` of capture connection `conn`, where snag
    /// is `us`.
    pub fn new(
        inner: S,
        tx: tokio::sync::mpsc::Sender<Record>,
        conn: u64,
        leg: usize,
        us: Peer,
    ) -> Tapped<S> {
        Tapped {
            inner,
            tx: Some(PollSender::new(tx)),
            conn,
            leg,
            us,
            notes: None,
        }
    }

    /// With `notes` put on the bytes it writes next.
    pub fn with_notes(mut self, notes: std::sync::Arc<Notes>) -> Tapped<S> {
        self.notes = Some(notes);
        self
    }

    /// `inner` as it is, recording nothing.
    pub fn plain(inner: S) -> Tapped<S> {
        Tapped {
            inner,
            tx: None,
            conn: 0,
            leg: 0,
            us: Peer::Initiator,
            notes: None,
        }
    }

    /// The stream inside.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn them(&self) -> Peer {
        match self.us {
            Peer::Initiator => Peer::Acceptor,
            Peer::Acceptor => Peer::Initiator,
        }
    }

    /// Waits for room for one record; `false` when the capture has closed.
    fn room(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        match &mut self.tx {
            Some(tx) => Poll::Ready(ready!(tx.poll_reserve(cx)).is_ok()),
            None => Poll::Ready(false),
        }
    }

    fn record(&mut self, record: Record) {
        if let Some(tx) = &mut self.tx {
            let _ = tx.send_item(record);
        }
    }

    fn data(&self, from: Peer, data: &[u8]) -> Record {
        Record::Data {
            conn: self.conn,
            leg: self.leg,
            from,
            data: Bytes::copy_from_slice(data),
            note: None,
            at: now(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tapped<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let open = ready!(self.room(cx));
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        if open {
            let read = &buf.filled()[before..];
            let record = if read.is_empty() {
                Record::Fin {
                    conn: self.conn,
                    leg: self.leg,
                    from: self.them(),
                    note: None,
                    at: now(),
                }
            } else {
                self.data(self.them(), read)
            };
            self.record(record);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tapped<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let open = ready!(self.room(cx));
        let n = ready!(Pin::new(&mut self.inner).poll_write(cx, buf))?;
        if open && n > 0 {
            let mut record = self.data(self.us, &buf[..n]);
            if let (Record::Data { note, .. }, Some(notes)) = (&mut record, &self.notes) {
                *note = notes.take();
            }
            self.record(record);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let open = ready!(self.room(cx));
        ready!(Pin::new(&mut self.inner).poll_shutdown(cx))?;
        if open {
            let record = Record::Fin {
                conn: self.conn,
                leg: self.leg,
                from: self.us,
                note: None,
                at: now(),
            };
            self.record(record);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S> Drop for Tapped<S> {
    fn drop(&mut self) {
        // Best effort: a Close that does not fit only leaves the writer holding the
        // leg's sequence numbers until the capture ends.
        if let Some(tx) = self.tx.as_ref().and_then(PollSender::get_ref) {
            let _ = tx.try_send(Record::Close { conn: self.conn });
        }
    }
}

impl hyper_util::client::legacy::connect::Connection for Tapped<tokio::net::TcpStream> {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.inner.connected()
    }
}
