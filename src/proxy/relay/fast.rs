//! The unfaulted path of one direction: no stage, no queue, no buffer of its own.
//! Between two sockets it reads with `recv` into a per-thread buffer and writes on
//! without awaiting; between other streams (the tests' pipes), and when capturing, it
//! reads and writes through the async traits.

use std::{io, os::fd::AsRawFd};

use bytes::Bytes;
use nix::{errno::Errno, sys::socket::MsgFlags};
use tokio::io::{AsyncWriteExt, Interest};

use super::{
    End, Sink, Source, Waiter,
    flow::{Flow, Which, tap},
    stream::{BUF, read_some},
};
use crate::capture::{self, Record, tcp::Payload};

impl<R: Source, W: Sink> Flow<'_, R, W> {
    /// The unfaulted path. Returns `None` when the fault list changed and the caller
    /// must sync, `Some` when the direction ended.
    pub(super) async fn fast(&mut self) -> Option<End> {
        // A capture of whole packets needs the bytes as a `Bytes` of their own:
        // `read_some` hands a large read over uncopied, where `fast_tcp` would copy
        // it out of its buffer. One with a snap length takes a little of each
        // segment, which `fast_tcp` copies out.
        if self.src.tcp().is_some()
            && self.dst.tcp().is_some()
            && (self.tap.is_none() || self.snaplen > 0)
        {
            self.fast_tcp().await
        } else {
            Box::pin(self.fast_any()).await
        }
    }

    /// The unfaulted path between any two streams: a read, a write, again.
    async fn fast_any(&mut self) -> Option<End> {
        let control = self.control;
        loop {
            let seen = control.seen();
            if let Some(end) = control.stopped() {
                return Some(end);
            }
            if self.faults.has_changed().unwrap_or(true) {
                return None;
            }
            let read = tokio::select! {
                biased;
                read = read_some(&mut self.src) => read,
                _ = control.signalled(Waiter::Relay, seen) => continue,
            };
            match read {
                Ok(data) if data.is_empty() => return Some(self.pass_fin().await),
                Ok(data) => {
                    self.received += data.len() as u64;
                    if let Some(end) = self.write(&data).await {
                        return Some(end);
                    }
                    self.tap_pass(Payload::whole(data)).await;
                }
                Err(_) => return Some(End::PeerReset(self.side(Which::Src))),
            }
        }
    }

    /// The source's FIN, passed on.
    async fn pass_fin(&mut self) -> End {
        self.src_done = true;
        tap(&self.tap, self.fin_record(Which::Src, None)).await;
        let _ = self.dst.shutdown().await;
        tap(&self.tap, self.fin_record(Which::Dst, None)).await;
        End::Eof
    }

    /// Records bytes that went through unchanged, if capturing.
    async fn tap_pass(&mut self, data: Payload<Bytes>) {
        if self.tap.is_none() || data.len == 0 {
            return;
        }
        let (read, written) = self.legs();
        let record = Record::Pass {
            conn: self.capture_key,
            read,
            written,
            data,
            note: self.written_note(None),
            at: capture::now(),
        };
        tap(&self.tap, Some(record)).await;
    }

    /// The unfaulted path between two sockets.
    async fn fast_tcp(&mut self) -> Option<End> {
        let control = self.control;
        loop {
            let seen = control.seen();
            // Checked after each transfer too, so a busy stream sees changes at once:
            // both are plain atomic loads, no lock.
            loop {
                if let Some(end) = control.stopped() {
                    return Some(end);
                }
                if self.faults.has_changed().unwrap_or(true) {
                    return None;
                }
                // `fast` calls this only between two sockets.
                let src = self.src.tcp()?;
                tokio::select! {
                    biased;
                    ready = src.readable() => {
                        if ready.is_err() {
                            return Some(End::PeerReset(self.side(Which::Src)));
                        }
                    }
                    _ = control.signalled(Waiter::Relay, seen) => break,
                }
                // Read and write without awaiting, so the per-thread buffer is never
                // held across a suspension; only what the destination cannot take at
                // once is copied out and written asynchronously. A read shorter than
                // the buffer drained the socket, so it reports WouldBlock to tokio,
                // which then waits for the next edge instead of costing another read
                // that would only say EAGAIN (tokio keeps a seen EOF or error set).
                let (Some(src), Some(dst)) = (self.src.tcp(), self.dst.tcp()) else {
                    return None;
                };
                let mut step = Fast::Again;
                let (tapping, snaplen) = (self.tap.is_some(), self.snaplen);
                let mut copy = None;
                let _ = src.try_io(Interest::READABLE, || {
                    BUF.with_borrow_mut(|buf| {
                        let n = nix::sys::socket::recv(src.as_raw_fd(), buf, MsgFlags::empty());
                        if let (true, Ok(n)) = (tapping, n) {
                            copy = Some(Payload::excerpt(&buf[..n], snaplen));
                        }
                        step = match n {
                            Ok(0) => Fast::Eof,
                            Ok(n) => match dst.try_write(&buf[..n]) {
                                Ok(w) if w == n => Fast::Wrote(n),
                                Ok(w) => Fast::Rest(w, buf[w..n].to_vec()),
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                    Fast::Rest(0, buf[..n].to_vec())
                                }
                                Err(_) => Fast::DstErr,
                            },
                            Err(Errno::EAGAIN) => Fast::Again,
                            Err(Errno::EINTR) => return Ok(()),
                            Err(_) => Fast::SrcErr,
                        };
                        match (&step, n) {
                            (Fast::Again, _) => Err(io::ErrorKind::WouldBlock.into()),
                            (Fast::Wrote(_) | Fast::Rest(..), Ok(n)) if n < buf.len() => {
                                Err(io::ErrorKind::WouldBlock.into())
                            }
                            _ => Ok(()),
                        }
                    })
                });
                match step {
                    Fast::Again => {}
                    Fast::Wrote(n) => {
                        self.received += n as u64;
                        self.sent += n as u64;
                    }
                    Fast::Rest(written, rest) => {
                        self.received += (written + rest.len()) as u64;
                        self.sent += written as u64;
                        // Boxed: rare (the destination was full), and large.
                        if let Some(end) = Box::pin(self.write(&rest)).await {
                            return Some(end);
                        }
                    }
                    Fast::Eof => return Some(self.pass_fin().await),
                    Fast::SrcErr => return Some(End::PeerReset(self.side(Which::Src))),
                    Fast::DstErr => return Some(End::PeerReset(self.side(Which::Dst))),
                }
                if let Some(data) = copy {
                    self.tap_pass(data).await;
                }
            }
        }
    }
}

enum Fast {
    Again,
    Wrote(usize),
    Rest(usize, Vec<u8>),
    Eof,
    SrcErr,
    DstErr,
}
