//! The smallest HTTP/2 frame layer that lets snag send what hyper has no call for: a
//! GOAWAY with any last-stream-id and code, and a PING to time the two-step of RFC
//! 9113 §6.8. It sits between hyper and the client's bytes (above TLS), reads the
//! frames both ways without changing them, and puts its own frames between hyper's
//! at frame boundaries. On an HTTP/1.1 connection it only passes bytes.

use std::{
    collections::VecDeque,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client's connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
/// The payload of snag's own PINGs: neither hyper's keep-alive nor its shutdown ping.
pub(super) const PING_PAYLOAD: [u8; 8] = *b"snag-gwy";
/// The highest stream id: a GOAWAY that lets every stream in.
pub(super) const MAX_STREAM: u32 = (1 << 31) - 1;

/// What is known of one direction's frames.
#[derive(Debug, Default)]
struct Parser {
    /// The header of the frame being read, as far as it came.
    header: Vec<u8>,
    /// Payload bytes of the current frame still to come.
    left: usize,
    /// The current frame's type, flags and stream.
    current: Option<(u8, u8, u32)>,
    /// A PING's payload, as far as it came.
    ping: Vec<u8>,
}

impl Parser {
    /// Feeds `bytes`; `on_frame` sees each frame's (type, flags, stream, PING payload)
    /// once its header (and, for PING, payload) is complete.
    fn feed(&mut self, mut bytes: &[u8], mut on_frame: impl FnMut(u8, u8, u32, &[u8])) {
        while !bytes.is_empty() {
            if self.left == 0 && self.current.is_none() {
                let take = (HEADER - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.header.len() < HEADER {
                    return;
                }
                let h = &self.header;
                let len = (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize;
                let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & MAX_STREAM;
                let (kind, flags) = (h[3], h[4]);
                self.header.clear();
                self.left = len;
                self.current = Some((kind, flags, stream));
                if kind != PING {
                    on_frame(kind, flags, stream, &[]);
                }
            }
            let take = self.left.min(bytes.len());
            if let Some((PING, _, _)) = self.current {
                self.ping.extend_from_slice(&bytes[..take]);
            }
            bytes = &bytes[take..];
            self.left -= take;
            if self.left == 0 {
                if let Some((PING, flags, stream)) = self.current {
                    on_frame(PING, flags, stream, &self.ping);
                    self.ping.clear();
                }
                self.current = None;
            }
        }
    }

    /// Bytes from here to the end of the current frame; 0 at a boundary, and
    /// `usize::MAX` inside a header (the frame's length is not known yet).
    fn to_boundary(&self) -> usize {
        if self.current.is_some() {
            self.left
        } else if self.header.is_empty() {
            0
        } else {
            usize::MAX
        }
    }
}

/// One connection's frames as snag sees them, shared with its exchanges.
#[derive(Debug, Default)]
pub(super) struct Frames {
    /// `None` until the first bytes say; `Some(false)`: not HTTP/2.
    h2: Option<bool>,
    preface_seen: usize,
    inbound: Parser,
    outbound: Parser,
    /// Streams the client opened, in order, not yet taken by an exchange.
    opened: VecDeque<u32>,
    /// Streams taken so far.
    taken: u64,
    /// The highest stream the client opened.
    pub(super) max_opened: u32,
    /// Frames of snag's waiting for the next boundary of hyper's.
    inject: VecDeque<u8>,
    /// GOAWAYs of snag's written, last-stream-id and code.
    pub(super) goaways: Vec<(u32, u32)>,
    /// snag's PING came back.
    pub(super) ping_acked: bool,
}

impl Frames {
    /// The id of the next stream the client opened, for the exchange it carries,
    /// and its number on the connection from 1.
    pub(super) fn take_opened(&mut self) -> Option<(u32, u64)> {
        let id = self.opened.pop_front()?;
        self.taken += 1;
        Some((id, self.taken))
    }

    /// Queues a GOAWAY; it leaves at the next frame boundary.
    pub(super) fn goaway(&mut self, last_stream: u32, code: u32) {
        let mut frame = header(8, GOAWAY, 0, 0);
        frame.extend_from_slice(&(last_stream & MAX_STREAM).to_be_bytes());
        frame.extend_from_slice(&code.to_be_bytes());
        self.inject.extend(frame);
        self.goaways.push((last_stream, code));
    }

    /// Queues a PING with snag's payload.
    pub(super) fn ping(&mut self) {
        let mut frame = header(8, PING, 0, 0);
        frame.extend_from_slice(&PING_PAYLOAD);
        self.inject.extend(frame);
    }

    fn read(&mut self, bytes: &[u8]) {
        let mut bytes = bytes;
        if self.h2.is_none() {
            let take = (PREFACE.len() - self.preface_seen).min(bytes.len());
            if bytes[..take] != PREFACE[self.preface_seen..self.preface_seen + take] {
                self.h2 = Some(false);
                return;
            }
            self.preface_seen += take;
            bytes = &bytes[take..];
            if self.preface_seen < PREFACE.len() {
                return;
            }
            self.h2 = Some(true);
        }
        if self.h2 != Some(true) {
            return;
        }
        let (opened, max, acked) = (&mut self.opened, &mut self.max_opened, &mut self.ping_acked);
        self.inbound.feed(bytes, |kind, flags, stream, payload| {
            if kind == HEADERS && stream > *max {
                *max = stream;
                opened.push_back(stream);
            }
            if kind == PING && flags & ACK != 0 && payload == PING_PAYLOAD {
                *acked = true;
            }
        });
    }
}

fn header(len: usize, kind: u8, flags: u8, stream: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER + len);
    h.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    h.push(kind);
    h.push(flags);
    h.extend_from_slice(&stream.to_be_bytes());
    h
}

/// The client's stream, shared by hyper (through [`Shim`]) and snag (through
/// [`Wire::inject`]).
#[derive(Debug)]
struct Io<S> {
    inner: S,
    /// hyper's last write is waiting for the socket: snag must not write now (its
    /// write would take the socket's one writer wake-up from hyper).
    hyper_waiting: bool,
}

/// One connection's frame layer: give hyper [`Wire::shim`], keep the rest.
pub(super) struct Wire<S> {
    io: Arc<Mutex<Io<S>>>,
    frames: Arc<Mutex<Frames>>,
}

impl<S> Clone for Wire<S> {
    fn clone(&self) -> Self {
        Wire {
            io: self.io.clone(),
            frames: self.frames.clone(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Wire<S> {
    pub(super) fn new(inner: S, frames: Arc<Mutex<Frames>>) -> Wire<S> {
        Wire {
            io: Arc::new(Mutex::new(Io {
                inner,
                hyper_waiting: false,
            })),
            frames,
        }
    }

    /// The stream hyper serves.
    pub(super) fn shim(&self) -> Shim<S> {
        Shim(self.clone())
    }

    /// Writes snag's queued frames now if hyper is at a frame boundary and not
    /// waiting on the socket, for when hyper has nothing to write; true once all
    /// are out and flushed.
    pub(super) fn inject(&self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut frames = lock(&self.frames);
        let mut io = lock(&self.io);
        if io.hyper_waiting {
            return false;
        }
        match write_injected(&mut frames, &mut io, &mut cx) {
            Poll::Ready(Ok(())) if frames.inject.is_empty() => {
                matches!(Pin::new(&mut io.inner).poll_flush(&mut cx), Poll::Ready(_))
            }
            _ => false,
        }
    }
}

/// Locks part of the frame layer; nothing panics while holding it.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().expect("no code panics holding the frame layer")
}

/// Writes snag's queued frames if hyper's bytes are at a frame boundary.
fn write_injected<S: AsyncWrite + Unpin>(
    frames: &mut Frames,
    io: &mut Io<S>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    while frames.h2 == Some(true) && frames.outbound.to_boundary() == 0 && !frames.inject.is_empty()
    {
        let (front, _) = frames.inject.as_slices();
        let n = std::task::ready!(Pin::new(&mut io.inner).poll_write(cx, front))?;
        if n == 0 {
            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
        }
        frames.inject.drain(..n);
    }
    Poll::Ready(Ok(()))
}

/// The client stream as hyper sees it.
pub(super) struct Shim<S>(Wire<S>);

impl<S: AsyncRead + Unpin> AsyncRead for Shim<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut lock(&self.0.io).inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled
            && buf.filled().len() > before
        {
            lock(&self.0.frames).read(&buf.filled()[before..]);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Shim<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut frames = lock(&self.0.frames);
        let mut io = lock(&self.0.io);
        if write_injected(&mut frames, &mut io, cx)?.is_pending() {
            io.hyper_waiting = true;
            return Poll::Pending;
        }
        // hyper's bytes, no further than the end of the current frame while snag has
        // a frame waiting.
        let limit = if frames.h2 == Some(true) && !frames.inject.is_empty() {
            frames.outbound.to_boundary().clamp(1, buf.len())
        } else {
            buf.len()
        };
        match Pin::new(&mut io.inner).poll_write(cx, &buf[..limit]) {
            Poll::Pending => {
                io.hyper_waiting = true;
                Poll::Pending
            }
            Poll::Ready(Ok(n)) => {
                io.hyper_waiting = false;
                if frames.h2 == Some(true) {
                    frames.outbound.feed(&buf[..n], |_, _, _, _| {});
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut io = lock(&self.0.io);
        let polled = Pin::new(&mut io.inner).poll_flush(cx);
        io.hyper_waiting = polled.is_pending();
        polled
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut lock(&self.0.io).inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = header(payload.len(), kind, flags, stream);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn new_streams_and_snags_ping_ack_are_read_however_the_bytes_are_cut() {
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(0x4, 0, 0, &[0; 6])); // SETTINGS
        wire.extend(frame(HEADERS, 0x4, 1, &[0x82]));
        wire.extend(frame(0x0, 0x1, 1, b"body")); // DATA
        wire.extend(frame(HEADERS, 0x5, 1, &[0x40])); // trailers on stream 1
        wire.extend(frame(HEADERS, 0x4, 3, &[0x82]));
        wire.extend(frame(PING, ACK, 0, b"someone!"));
        wire.extend(frame(PING, ACK, 0, &PING_PAYLOAD));
        for cut in [1, 2, 5, 9, 10, 64] {
            let mut frames = Frames::default();
            for piece in wire.chunks(cut) {
                frames.read(piece);
            }
            assert_eq!(frames.h2, Some(true));
            assert_eq!(
                (
                    frames.take_opened(),
                    frames.take_opened(),
                    frames.take_opened()
                ),
                (Some((1, 1)), Some((3, 2)), None),
                "cut {cut}"
            );
            assert!(frames.ping_acked, "cut {cut}");
        }
        let mut plain = Frames::default();
        plain.read(b"GET / HTTP/1.1\r\n");
        assert_eq!(plain.h2, Some(false));
    }

    #[tokio::test]
    async fn snags_frames_go_between_hypers_whole() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let frames = Arc::new(Mutex::new(Frames::default()));
        let wire = Wire::new(server, frames.clone());
        let mut shim = wire.shim();
        frames.lock().unwrap().read(PREFACE);
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // hyper's DATA frame, written in two pieces with a GOAWAY queued between.
        let data = frame(0x0, 0, 1, b"0123456789");
        shim.write_all(&data[..12]).await.unwrap();
        frames.lock().unwrap().goaway(1, 0);
        shim.write_all(&data[12..]).await.unwrap();
        shim.write_all(&frame(0x0, 0x1, 1, b"end")).await.unwrap();
        // hyper idle: snag writes its frame itself, at the boundary.
        frames.lock().unwrap().goaway(3, 2);
        assert!(wire.inject());
        drop((shim, wire));
        let mut got = Vec::new();
        let mut client = client;
        client.read_to_end(&mut got).await.unwrap();
        let mut want = data.clone();
        want.extend(frame(GOAWAY, 0, 0, &[0, 0, 0, 1, 0, 0, 0, 0]));
        want.extend(frame(0x0, 0x1, 1, b"end"));
        want.extend(frame(GOAWAY, 0, 0, &[0, 0, 0, 3, 0, 0, 0, 2]));
        assert_eq!(got, want);
        assert!(frames.lock().unwrap().inject.is_empty());
        assert_eq!(frames.lock().unwrap().goaways, [(1, 0), (3, 2)]);
    }
}
