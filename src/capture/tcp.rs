//! Synthetic Ethernet/IP/TCP frames for one leg of a connection, with sequence and
//! acknowledgement numbers kept consistent, so Wireshark reassembles each stream to
//! exactly the bytes snag read and wrote.

use std::net::{IpAddr, SocketAddr};

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;

/// Largest payload of one synthetic segment: big enough to keep captures small (a
/// relay's 64 KiB read is two packets: what loopback's GSO sends is larger still),
/// small enough for an IPv4 total length.
pub const SEGMENT: usize = 32_768;

/// One leg: the side that connected (`a`) and the side that accepted (`b`).
#[derive(Debug, Clone)]
pub struct Leg {
    a: SocketAddr,
    b: SocketAddr,
    /// Next sequence number of each side.
    next: [u32; 2],
}

/// Which side of a leg sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// The side that connected.
    Initiator,
    /// The side that accepted.
    Acceptor,
}

impl Leg {
    /// A leg from `a` (connecting) to `b`, with initial sequence numbers `isn`.
    pub fn new(a: SocketAddr, b: SocketAddr, isn: [u32; 2]) -> Leg {
        Leg { a, b, next: isn }
    }

    /// SYN, SYN-ACK, ACK.
    pub fn handshake(&mut self) -> [Frame<'static>; 3] {
        let syn = self.segment(Peer::Initiator, SYN, &[]);
        self.next[0] = self.next[0].wrapping_add(1);
        let syn_ack = self.segment(Peer::Acceptor, SYN | ACK, &[]);
        self.next[1] = self.next[1].wrapping_add(1);
        let ack = self.segment(Peer::Initiator, ACK, &[]);
        [syn, syn_ack, ack]
    }

    /// Segments carrying `data` from `from`, in order.
    pub fn data<'a>(&mut self, from: Peer, data: &'a [u8]) -> Vec<Frame<'a>> {
        self.payload(from, &Payload::whole(data))
    }

    /// Segments carrying `payload` from `from`, in order: as long as the bytes
    /// relayed, holding what the payload kept of each.
    pub fn payload<'a>(&mut self, from: Peer, payload: &Payload<&'a [u8]>) -> Vec<Frame<'a>> {
        let mut frames = Vec::with_capacity(payload.len.div_ceil(SEGMENT));
        let mut kept: &'a [u8] = payload.kept;
        let mut left = payload.len;
        while left > 0 {
            let len = left.min(SEGMENT);
            let (part, rest) = kept.split_at(len.min(payload.keep).min(kept.len()));
            kept = rest;
            let mut frame = self.segment(from, PSH | ACK, part);
            frame.set_payload_len(len);
            frames.push(frame);
            let i = from as usize;
            self.next[i] = self.next[i].wrapping_add(len as u32);
            left -= len;
        }
        frames
    }

    /// FIN from `from`.
    pub fn fin(&mut self, from: Peer) -> Frame<'static> {
        let frame = self.segment(from, FIN | ACK, &[]);
        let i = from as usize;
        self.next[i] = self.next[i].wrapping_add(1);
        frame
    }

    /// RST from `from`.
    pub fn rst(&mut self, from: Peer) -> Frame<'static> {
        self.segment(from, RST | ACK, &[])
    }

    fn segment<'a>(&self, from: Peer, flags: u8, payload: &'a [u8]) -> Frame<'a> {
        let (src, dst, seq, ack) = match from {
            Peer::Initiator => (self.a, self.b, self.next[0], self.next[1]),
            Peer::Acceptor => (self.b, self.a, self.next[1], self.next[0]),
        };
        let ack = if flags & ACK != 0 { ack } else { 0 };
        Frame::new(src, dst, seq, ack, flags, payload)
    }
}

/// Bytes relayed as a capture holds them: all of them, or, when it keeps only the
/// start of each packet, the first `keep` bytes of each [`SEGMENT`]-long piece, laid
/// end to end. A relay copies that much, not a whole read, out of its buffer.
#[derive(Debug, Clone)]
pub struct Payload<B> {
    /// Bytes relayed.
    pub len: usize,
    /// Bytes kept of each segment: [`SEGMENT`] when all are.
    pub keep: usize,
    /// What is kept.
    pub kept: B,
}

impl<B: AsRef<[u8]>> Payload<B> {
    /// All of `data`.
    pub fn whole(data: B) -> Payload<B> {
        Payload {
            len: data.as_ref().len(),
            keep: SEGMENT,
            kept: data,
        }
    }

    /// Borrowed.
    pub fn as_slice(&self) -> Payload<&[u8]> {
        Payload {
            len: self.len,
            keep: self.keep,
            kept: self.kept.as_ref(),
        }
    }
}

impl Payload<bytes::Bytes> {
    /// What a capture whose snap length is `snaplen` (0: all) keeps of `data`: each
    /// segment's first `snaplen` bytes cover its headers and the start of its payload.
    pub fn excerpt(data: &[u8], snaplen: usize) -> Payload<bytes::Bytes> {
        if snaplen == 0 || snaplen >= SEGMENT {
            return Payload::whole(bytes::Bytes::copy_from_slice(data));
        }
        let mut kept = Vec::with_capacity(data.len().div_ceil(SEGMENT) * snaplen);
        for piece in data.chunks(SEGMENT) {
            kept.extend_from_slice(&piece[..piece.len().min(snaplen)]);
        }
        Payload {
            len: data.len(),
            keep: snaplen,
            kept: kept.into(),
        }
    }
}

/// Ethernet, IPv6 and TCP headers.
const HEAD_MAX: usize = 14 + 40 + 20;

/// An Ethernet frame with an IPv4 or IPv6 packet holding one TCP segment: its headers,
/// and the payload where it already lies, so the writer copies only what it keeps.
#[derive(Debug, Clone)]
pub struct Frame<'a> {
    head: [u8; HEAD_MAX],
    head_len: usize,
    /// The pseudo-header's share of the TCP checksum, not yet folded.
    pseudo: u64,
    /// The payload, or as much of it as the capture kept.
    pub payload: &'a [u8],
    /// The whole payload's length.
    payload_len: usize,
}

impl<'a> Frame<'a> {
    fn new(
        src: SocketAddr,
        dst: SocketAddr,
        seq: u32,
        ack: u32,
        flags: u8,
        payload: &'a [u8],
    ) -> Frame<'a> {
        let mut head = [0u8; HEAD_MAX];
        head[..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01]); // dst, src MAC
        let tcp_len = 20 + payload.len();
        let (tcp_at, pseudo) = match (src.ip(), dst.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                head[12..14].copy_from_slice(&[0x08, 0x00]);
                let ip = &mut head[14..34];
                ip[..12].copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0]);
                ip[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
                ip[12..16].copy_from_slice(&s.octets());
                ip[16..20].copy_from_slice(&d.octets());
                let sum = fold(sum(ip));
                ip[10..12].copy_from_slice(&sum.to_be_bytes());
                let pseudo = sum_parts(&[
                    &s.octets(),
                    &d.octets(),
                    &[0, 6],
                    &(tcp_len as u16).to_be_bytes(),
                ]);
                (34, pseudo)
            }
            (s, d) => {
                let (s, d) = (to_v6(s), to_v6(d));
                head[12..14].copy_from_slice(&[0x86, 0xdd]);
                let ip = &mut head[14..54];
                ip[..4].copy_from_slice(&[0x60, 0, 0, 0]);
                ip[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
                ip[6..8].copy_from_slice(&[6, 64]);
                ip[8..24].copy_from_slice(&s);
                ip[24..40].copy_from_slice(&d);
                let len = (tcp_len as u32).to_be_bytes();
                (54, sum_parts(&[&s, &d, &len, &[0, 0, 0, 6]]))
            }
        };
        let tcp = &mut head[tcp_at..tcp_at + 20];
        tcp[0..2].copy_from_slice(&src.port().to_be_bytes());
        tcp[2..4].copy_from_slice(&dst.port().to_be_bytes());
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        tcp[8..12].copy_from_slice(&ack.to_be_bytes());
        tcp[12] = 5 << 4; // data offset: 20 bytes, no options
        tcp[13] = flags;
        tcp[14..16].copy_from_slice(&65535u16.to_be_bytes()); // window; checksum and urgent pointer 0
        Frame {
            head,
            head_len: tcp_at + 20,
            pseudo,
            payload,
            payload_len: payload.len(),
        }
    }

    /// Ethernet, IP and TCP headers.
    pub fn head(&self) -> &[u8] {
        &self.head[..self.head_len]
    }

    /// Bytes in the whole frame.
    pub fn wire_len(&self) -> usize {
        self.head_len + self.payload_len
    }

    /// Says the payload was `len` bytes, of which this frame holds the start: the
    /// lengths in the IP header and the TCP pseudo-header follow.
    fn set_payload_len(&mut self, len: usize) {
        if len == self.payload_len {
            return;
        }
        let tcp_len = 20 + len;
        let ip = 14;
        if self.head_len == 54 {
            // IPv4: total length, then the header checksum again.
            self.head[ip + 2..ip + 4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
            self.head[ip + 10..ip + 12].fill(0);
            let sum = fold(sum(&self.head[ip..ip + 20]));
            self.head[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
        } else {
            self.head[ip + 4..ip + 6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
        }
        // The pseudo-header's length word (a 16-bit word either way: IPv6's 32-bit
        // length is below 2^16 here).
        self.pseudo = self.pseudo - (20 + self.payload_len) as u64 + tcp_len as u64;
        self.payload_len = len;
    }

    /// Fills in the TCP checksum, which covers the payload: the writer asks for it
    /// only when it keeps the whole frame, since a reader cannot verify a checksum
    /// over bytes a snap length cut off (the field stays 0 then).
    pub fn checksum(&mut self) {
        debug_assert_eq!(
            self.payload.len(),
            self.payload_len,
            "a checksum over a cut payload"
        );
        let at = self.head_len - 20;
        self.head[at + 16..at + 18].fill(0);
        let sum = fold(self.pseudo + sum(&self.head[at..self.head_len]) + sum(self.payload));
        self.head[at + 16..at + 18].copy_from_slice(&sum.to_be_bytes());
    }
}

fn to_v6(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// `bytes` as 16-bit big-endian words added up, unfolded (RFC 1071); an odd last
/// byte is padded with zero. Eight bytes at a time, as two 32-bit words: 2^16 ≡ 1 in
/// ones' complement arithmetic, so the fold gives the same checksum.
fn sum(bytes: &[u8]) -> u64 {
    let mut total: u64 = 0;
    let mut eights = bytes.chunks_exact(8);
    for w in &mut eights {
        let w = u64::from_be_bytes(w.try_into().expect("chunks of eight"));
        total += (w >> 32) + (w & 0xffff_ffff);
    }
    let mut words = eights.remainder().chunks_exact(2);
    for w in &mut words {
        total += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        total += u64::from(u16::from_be_bytes([*last, 0]));
    }
    total
}

/// The sum of `parts` laid end to end; every part has an even length.
fn sum_parts(parts: &[&[u8]]) -> u64 {
    parts.iter().map(|p| sum(p)).sum()
}

/// The Internet checksum of an unfolded sum.
fn fold(mut sum: u64) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071 the plain way, 16 bits at a time, over parts laid end to end.
    fn reference(parts: &[&[u8]]) -> u16 {
        let bytes: Vec<u8> = parts.concat();
        let mut sum: u64 = 0;
        for w in bytes.chunks(2) {
            sum += u64::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    fn whole(frame: &Frame) -> Vec<u8> {
        [frame.head(), frame.payload].concat()
    }

    #[test]
    fn checksums_verify_to_zero() {
        let a: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let mut leg = Leg::new(a, b, [100, 900]);
        for mut frame in leg.handshake() {
            frame.checksum();
            frame.checksum(); // twice: the same, not the sum of the first
            let f = whole(&frame);
            assert_eq!(reference(&[&f[14..34]]), 0);
            let len = ((f.len() - 34) as u16).to_be_bytes();
            assert_eq!(reference(&[&f[26..34], &[0, 6], &len, &f[34..]]), 0);
        }
        let mut frame = leg.data(Peer::Initiator, b"hello").remove(0);
        frame.checksum();
        let frame = whole(&frame);
        let ip = &frame[14..34];
        assert_eq!(reference(&[ip]), 0);
        let tcp = &frame[34..];
        let len = (tcp.len() as u16).to_be_bytes();
        assert_eq!(
            reference(&[&ip[12..16], &ip[16..20], &[0, 6], &len, tcp]),
            0
        );
        // seq of the data follows the SYN: isn + 1.
        assert_eq!(u32::from_be_bytes(tcp[4..8].try_into().unwrap()), 101);
        assert_eq!(u32::from_be_bytes(tcp[8..12].try_into().unwrap()), 901);
    }

    #[test]
    fn an_excerpt_makes_the_frames_of_the_whole_cut_to_the_snap_length() {
        let data: Vec<u8> = (0..2 * SEGMENT + 1000).map(|i| (i % 253) as u8).collect();
        for (a, b) in [
            ("127.0.0.1:40000", "127.0.0.1:80"),
            ("[::1]:40000", "[::1]:80"),
        ] {
            let (a, b): (SocketAddr, SocketAddr) = (a.parse().unwrap(), b.parse().unwrap());
            for n in [1, 100, SEGMENT, data.len()] {
                let (mut whole, mut cut) = (Leg::new(a, b, [5, 6]), Leg::new(a, b, [5, 6]));
                let excerpt = Payload::excerpt(&data[..n], 128);
                assert!(excerpt.kept.len() <= 3 * 128, "{n}");
                let full = whole.data(Peer::Initiator, &data[..n]);
                let kept = cut.payload(Peer::Initiator, &excerpt.as_slice());
                assert_eq!(full.len(), kept.len());
                for (f, k) in full.iter().zip(&kept) {
                    assert_eq!(f.wire_len(), k.wire_len());
                    assert_eq!(f.head(), k.head(), "{n} bytes");
                    assert_eq!(&f.payload[..f.payload.len().min(128)], k.payload);
                }
                // Both legs go on from the same sequence numbers.
                assert_eq!(
                    whole.fin(Peer::Initiator).head(),
                    cut.fin(Peer::Initiator).head()
                );
            }
        }
    }

    #[test]
    fn the_wide_checksum_matches_rfc_1071_at_every_length_and_on_ipv6() {
        let a: SocketAddr = "[::1]:40000".parse().unwrap();
        let b: SocketAddr = "[::1]:443".parse().unwrap();
        let payload: Vec<u8> = (0..SEGMENT + 3).map(|i| (i * 7 + i / 251) as u8).collect();
        for n in (0..40).chain([1023, SEGMENT - 1, SEGMENT, SEGMENT + 3]) {
            let mut leg = Leg::new(a, b, [7, 9]);
            for mut frame in leg.data(Peer::Acceptor, &payload[..n]) {
                frame.checksum();
                let f = whole(&frame);
                assert_eq!(frame.wire_len(), f.len());
                let len = ((f.len() - 54) as u32).to_be_bytes();
                let sum = reference(&[&f[22..54], &len, &[0, 0, 0, 6], &f[54..]]);
                assert_eq!(sum, 0, "{n} bytes");
            }
        }
    }
}
