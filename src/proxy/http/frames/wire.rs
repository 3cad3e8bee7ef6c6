//! The client's stream shared by hyper and snag: hyper reads and writes through
//! [`Shim`], snag puts its own frames in at hyper's frame boundaries.

use std::{
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{Frames, Sender};

/// The client's stream, shared by hyper (through [`Shim`]) and snag (through
/// [`Wire::inject`]).
#[derive(Debug)]
pub(super) struct Io<S> {
    pub(super) inner: S,
    /// hyper's last write is waiting for the socket: snag must not write now (its
    /// write would take the socket's one writer wake-up from hyper).
    pub(super) hyper_waiting: bool,
}

/// One connection's frame layer: give hyper [`Wire::shim`], keep the rest.
pub(in crate::proxy::http) struct Wire<S> {
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
    pub(in crate::proxy::http) fn new(inner: S, frames: Arc<Mutex<Frames>>) -> Wire<S> {
        Wire {
            io: Arc::new(Mutex::new(Io {
                inner,
                hyper_waiting: false,
            })),
            frames,
        }
    }

    /// The stream hyper serves.
    pub(in crate::proxy::http) fn shim(&self) -> Shim<S> {
        Shim {
            wire: self.clone(),
            http1: false,
        }
    }

    /// Writes snag's queued frames now if hyper is at a frame boundary and not
    /// waiting on the socket, for when hyper has nothing to write; true once all
    /// are out and flushed.
    pub(in crate::proxy::http) fn inject(&self) -> bool {
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
pub(in crate::proxy::http) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().expect("no code panics holding the frame layer")
}

/// Writes snag's queued frames if hyper's bytes are at a frame boundary.
pub(super) fn write_injected<S: AsyncWrite + Unpin>(
    frames: &mut Frames,
    io: &mut Io<S>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    let boundary = frames.h2 == Some(true) && frames.outbound.to_boundary() == 0;
    if boundary && frames.settings_queued > 0 {
        // Everything queued leaves before hyper writes again: the client
        // acknowledges these SETTINGS after any of hyper's already begun.
        for _ in 0..std::mem::take(&mut frames.settings_queued) {
            frames.unacked.push_back(Sender::Snag);
        }
    }
    while boundary && !frames.inject.is_empty() {
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
pub(in crate::proxy::http) struct Shim<S> {
    wire: Wire<S>,
    /// The client spoke HTTP/1.x (its first bytes said so, for good): no frames to
    /// read or to put in, so the frame state is left alone — each read or write
    /// takes the stream's lock only.
    http1: bool,
}

impl<S: AsyncRead + Unpin> AsyncRead for Shim<S> {
    /// Never reports the end of the stream before it came: a read that yields
    /// nothing for hyper (an acknowledgement taken out, a header held) reads again.
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.http1 {
            return Pin::new(&mut lock(&self.wire.io).inner).poll_read(cx, buf);
        }
        loop {
            let filtering = {
                let mut frames = lock(&self.wire.frames);
                if !frames.ready.is_empty() {
                    let n = frames.ready.len().min(buf.remaining());
                    let (front, back) = frames.ready.as_slices();
                    let first = front.len().min(n);
                    buf.put_slice(&front[..first]);
                    buf.put_slice(&back[..n - first]);
                    frames.ready.drain(..n);
                    return Poll::Ready(Ok(()));
                }
                frames.filtering()
            };
            if !filtering {
                let before = buf.filled().len();
                std::task::ready!(Pin::new(&mut lock(&self.wire.io).inner).poll_read(cx, buf))?;
                if buf.filled().len() == before {
                    return Poll::Ready(Ok(()));
                }
                // snag's SETTINGS may have left since the check: then the bytes are
                // filtered after all.
                let mut frames = lock(&self.wire.frames);
                let Some(out) = frames.read(&buf.filled()[before..]) else {
                    let http1 = frames.h2 == Some(false);
                    drop(frames);
                    self.http1 = http1;
                    return Poll::Ready(Ok(()));
                };
                buf.set_filled(before);
                frames.ready.extend(out);
                continue;
            }
            let mut bytes = [0u8; 16 << 10];
            let mut read = ReadBuf::new(&mut bytes);
            std::task::ready!(Pin::new(&mut lock(&self.wire.io).inner).poll_read(cx, &mut read))?;
            let mut frames = lock(&self.wire.frames);
            if read.filled().is_empty() {
                // The end: what was held goes, then the end itself.
                let held = frames.inbound.held().to_vec();
                frames.inbound.passed = frames.inbound.header.len();
                if held.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                frames.ready.extend(held);
                continue;
            }
            let out = frames
                .read(read.filled())
                .unwrap_or_else(|| read.filled().to_vec());
            frames.ready.extend(out);
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Shim<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.http1 {
            let mut io = lock(&self.wire.io);
            let polled = Pin::new(&mut io.inner).poll_write(cx, buf);
            io.hyper_waiting = polled.is_pending();
            return polled;
        }
        let mut frames = lock(&self.wire.frames);
        let mut io = lock(&self.wire.io);
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
                    frames.written(&buf[..n]);
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut io = lock(&self.wire.io);
        let polled = Pin::new(&mut io.inner).poll_flush(cx);
        io.hyper_waiting = polled.is_pending();
        polled
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut lock(&self.wire.io).inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::http::frames::{GOAWAY, PREFACE, tests::frame};

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

    #[tokio::test]
    async fn an_http1_client_passes_through_untouched_once_its_first_bytes_said_so() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let frames = Arc::new(Mutex::new(Frames::default()));
        let wire = Wire::new(server, frames.clone());
        let mut shim = wire.shim();
        let first = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
        let second = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"; // bytes like h2's, too late
        client.write_all(first).await.unwrap();
        let mut got = vec![0; first.len()];
        shim.read_exact(&mut got).await.unwrap();
        assert_eq!(got, first);
        assert!(shim.http1);
        assert_eq!(frames.lock().unwrap().h2, Some(false));
        client.write_all(second).await.unwrap();
        let mut got = vec![0; second.len()];
        shim.read_exact(&mut got).await.unwrap();
        assert_eq!(got, second, "passed as they came");
        shim.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.unwrap();
        let mut answer = vec![0; 19];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, b"HTTP/1.1 200 OK\r\n\r\n");
        let frames = frames.lock().unwrap();
        assert!(frames.ready.is_empty() && frames.inject.is_empty());
    }
}
