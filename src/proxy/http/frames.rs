//! The smallest HTTP/2 frame layer that lets snag send what hyper has no call for: a
//! GOAWAY with any last-stream-id and code, a PING to time the two-step of RFC 9113
//! §6.8, and a SETTINGS frame mid-connection. It sits between hyper and the client's
//! bytes (above TLS), reads the frames both ways, and puts its own frames between
//! hyper's at frame boundaries. It changes nothing of hyper's or the client's but
//! one thing: the client's acknowledgement of snag's SETTINGS, which hyper never
//! sent and would take for a protocol error, is kept from it. On an HTTP/1.1
//! connection it only passes bytes.

mod wire;

pub(super) use self::wire::{Wire, lock};

use std::collections::VecDeque;

/// The client's connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
/// The payload of snag's own PINGs: neither hyper's keep-alive nor its shutdown ping.
pub(super) const PING_PAYLOAD: [u8; 8] = *b"snag-gwy";
/// The highest stream id: a GOAWAY that lets every stream in.
pub(super) const MAX_STREAM: u32 = (1 << 31) - 1;

/// A frame as the parser sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen<'a> {
    /// A frame's header is complete: its type, flags and stream.
    Head(u8, u8, u32),
    /// A PING is complete: its flags and payload.
    Ping(u8, &'a [u8]),
}

/// What is known of one direction's frames.
#[derive(Debug)]
struct Parser {
    /// The header of the frame being read, as far as it came.
    header: Vec<u8>,
    /// How much of `header` has been passed on (when filtering, a header is held
    /// until it is whole and known to be kept).
    passed: usize,
    /// Payload bytes of the current frame still to come.
    left: usize,
    /// The current frame's type, flags and stream.
    current: Option<(u8, u8, u32)>,
    /// The current frame is passed on.
    keep: bool,
    /// A PING's payload, as far as it came.
    ping: Vec<u8>,
}

impl Default for Parser {
    fn default() -> Self {
        Parser {
            header: Vec::with_capacity(HEADER),
            passed: 0,
            left: 0,
            current: None,
            keep: true,
            ping: Vec::new(),
        }
    }
}

impl Parser {
    /// Feeds `bytes`; `on` sees each frame once its header is complete (its answer:
    /// whether the frame is passed on) and each PING once its payload is. With
    /// `out`, what is passed on is appended to it and a header is held until whole;
    /// without, every byte passes as it came.
    fn feed(
        &mut self,
        mut bytes: &[u8],
        mut on: impl FnMut(Seen<'_>) -> bool,
        mut out: Option<&mut Vec<u8>>,
    ) {
        while !bytes.is_empty() {
            if self.left == 0 && self.current.is_none() {
                let take = (HEADER - self.header.len()).min(bytes.len());
                self.header.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.header.len() < HEADER {
                    if out.is_none() {
                        self.passed = self.header.len();
                    }
                    return;
                }
                let h = &self.header;
                let len = (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize;
                let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & MAX_STREAM;
                let (kind, flags) = (h[3], h[4]);
                self.keep = on(Seen::Head(kind, flags, stream));
                if let Some(out) = out.as_deref_mut()
                    && self.keep
                {
                    out.extend_from_slice(&self.header[self.passed..]);
                }
                self.header.clear();
                self.passed = 0;
                self.left = len;
                self.current = Some((kind, flags, stream));
            }
            let take = self.left.min(bytes.len());
            if let Some((PING, _, _)) = self.current {
                self.ping.extend_from_slice(&bytes[..take]);
            }
            if let Some(out) = out.as_deref_mut()
                && self.keep
            {
                out.extend_from_slice(&bytes[..take]);
            }
            bytes = &bytes[take..];
            self.left -= take;
            if self.left == 0 {
                if let Some((PING, flags, _)) = self.current {
                    on(Seen::Ping(flags, &self.ping));
                    self.ping.clear();
                }
                self.current = None;
            }
        }
    }

    /// Header bytes read but not yet passed on.
    fn held(&self) -> &[u8] {
        &self.header[self.passed..]
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

/// Whose SETTINGS frame the client's next acknowledgement is for: the client
/// acknowledges them in the order they were sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sender {
    Hyper,
    Snag,
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
    /// SETTINGS of snag's queued in `inject`, not yet on their way.
    settings_queued: usize,
    /// SETTINGS sent and not yet acknowledged, in order.
    unacked: VecDeque<Sender>,
    /// The client acknowledged this many SETTINGS of snag's.
    pub(super) settings_acked: u64,
    /// Bytes for hyper that a filtered read produced and hyper has not taken.
    ready: VecDeque<u8>,
}

impl Frames {
    /// The id of the next stream the client opened, for the exchange it carries,
    /// and its number on the connection from 1.
    pub(super) fn take_opened(&mut self) -> Option<(u32, u64)> {
        let id = self.opened.pop_front()?;
        self.taken += 1;
        Some((id, self.taken))
    }

    /// How many streams the client opened, taken or not.
    pub(super) fn opened_count(&self) -> u64 {
        self.taken + self.opened.len() as u64
    }

    /// Queues a GOAWAY; it leaves at the next frame boundary.
    pub(super) fn goaway(&mut self, last_stream: u32, code: u32) {
        let mut frame = header(8, GOAWAY, 0, 0);
        frame.extend_from_slice(&(last_stream & MAX_STREAM).to_be_bytes());
        frame.extend_from_slice(&code.to_be_bytes());
        self.inject.extend(frame);
        self.goaways.push((last_stream, code));
    }

    /// Queues a SETTINGS frame that sets MAX_CONCURRENT_STREAMS to `max`.
    pub(super) fn max_streams(&mut self, max: u32) {
        self.inject.extend(header(6, SETTINGS, 0, 0));
        self.inject
            .extend(SETTINGS_MAX_CONCURRENT_STREAMS.to_be_bytes());
        self.inject.extend(max.to_be_bytes());
        self.settings_queued += 1;
    }

    /// snag has frames waiting to be written.
    pub(super) fn injecting(&self) -> bool {
        !self.inject.is_empty()
    }

    /// Reads must go through [`Frames::read`]'s filter: an acknowledgement of
    /// snag's SETTINGS may come, or part of a header is held.
    fn filtering(&self) -> bool {
        self.unacked.contains(&Sender::Snag) || !self.inbound.held().is_empty()
    }

    /// Queues a PING with snag's payload.
    pub(super) fn ping(&mut self) {
        let mut frame = header(8, PING, 0, 0);
        frame.extend_from_slice(&PING_PAYLOAD);
        self.inject.extend(frame);
    }

    /// Reads the client's `bytes`. `Some`: what hyper gets instead (snag's
    /// SETTINGS acknowledgements taken out, a header cut by the read held back).
    fn read(&mut self, bytes: &[u8]) -> Option<Vec<u8>> {
        let mut out = self.filtering().then(Vec::new);
        self.read_into(bytes, out.as_mut());
        out
    }

    fn read_into(&mut self, bytes: &[u8], out: Option<&mut Vec<u8>>) {
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
        let (unacked, settings_acked) = (&mut self.unacked, &mut self.settings_acked);
        let seen = |frame: Seen<'_>| match frame {
            Seen::Head(HEADERS, _, stream) if stream > *max => {
                *max = stream;
                opened.push_back(stream);
                true
            }
            Seen::Head(SETTINGS, flags, _) if flags & ACK != 0 => {
                let ours = unacked.pop_front() == Some(Sender::Snag);
                *settings_acked += u64::from(ours);
                !ours
            }
            Seen::Ping(flags, payload) => {
                *acked |= flags & ACK != 0 && payload == PING_PAYLOAD;
                true
            }
            _ => true,
        };
        self.inbound.feed(bytes, seen, out);
    }

    /// hyper wrote `bytes`.
    fn written(&mut self, bytes: &[u8]) {
        let unacked = &mut self.unacked;
        let seen = |frame: Seen<'_>| {
            if let Seen::Head(SETTINGS, flags, _) = frame
                && flags & ACK == 0
            {
                unacked.push_back(Sender::Hyper);
            }
            true
        };
        self.outbound.feed(bytes, seen, None);
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

#[cfg(test)]
mod tests {
    use std::task::Context;

    use super::{
        wire::{Io, write_injected},
        *,
    };

    pub(super) fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
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

    #[test]
    fn the_clients_ack_of_snags_settings_is_taken_out_however_the_bytes_are_cut() {
        let hyper_settings = frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 200]);
        let ack = frame(SETTINGS, ACK, 0, &[]);
        let mut client = PREFACE.to_vec();
        client.extend(frame(SETTINGS, 0, 0, &[0; 6]));
        client.extend(frame(HEADERS, 0x5, 1, &[0x82]));
        client.extend(&ack); // for hyper's SETTINGS: hyper gets it
        client.extend(frame(HEADERS, 0x5, 3, &[0x82]));
        let ours = client.len();
        client.extend(&ack); // for snag's: taken out
        client.extend(frame(PING, ACK, 0, &PING_PAYLOAD));
        client.extend(frame(0x0, 0x1, 3, b"body"));
        let mut want = client[..ours].to_vec();
        want.extend(&client[ours + HEADER..]);
        for cut in [1, 2, 5, 8, 9, 10, 13, 20] {
            let mut frames = Frames::default();
            let mut io = Io {
                inner: Vec::new(),
                hyper_waiting: false,
            };
            let mut cx = Context::from_waker(std::task::Waker::noop());
            let (mut got, mut sent) = (Vec::new(), false);
            for (n, piece) in client.chunks(cut).enumerate() {
                if n * cut >= PREFACE.len() + 15 && !sent {
                    sent = true;
                    // hyper's SETTINGS went first, snag's after the client's first
                    // HEADERS.
                    frames.written(&hyper_settings);
                    frames.max_streams(1);
                    assert!(write_injected(&mut frames, &mut io, &mut cx).is_ready());
                }
                match frames.read(piece) {
                    Some(out) => got.extend(out),
                    None => got.extend(piece),
                }
            }
            assert_eq!(got, want, "cut {cut}");
            assert_eq!(frames.settings_acked, 1, "cut {cut}");
            assert!(
                frames.unacked.is_empty() && !frames.filtering(),
                "cut {cut}"
            );
            assert!(frames.ping_acked);
            let mut settings = header(6, SETTINGS, 0, 0);
            settings.extend([0, 3, 0, 0, 0, 1]);
            assert_eq!(io.inner, settings);
        }
    }
}
