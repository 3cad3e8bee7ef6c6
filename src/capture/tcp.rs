//! Synthetic Ethernet/IP/TCP frames for one leg of a connection, with sequence and
//! acknowledgement numbers kept consistent, so Wireshark reassembles each stream to
//! exactly the bytes snag read and wrote.

use std::net::{IpAddr, SocketAddr};

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;

/// Largest payload of one synthetic segment: big enough to keep captures small, small
/// enough for an IPv4 total length.
pub const SEGMENT: usize = 16_384;

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
    pub fn handshake(&mut self) -> Vec<Vec<u8>> {
        let syn = self.segment(Peer::Initiator, SYN, &[]);
        self.next[0] = self.next[0].wrapping_add(1);
        let syn_ack = self.segment(Peer::Acceptor, SYN | ACK, &[]);
        self.next[1] = self.next[1].wrapping_add(1);
        let ack = self.segment(Peer::Initiator, ACK, &[]);
        vec![syn, syn_ack, ack]
    }

    /// Segments carrying `data` from `from`, in order.
    pub fn data(&mut self, from: Peer, data: &[u8]) -> Vec<Vec<u8>> {
        data.chunks(SEGMENT)
            .map(|part| {
                let frame = self.segment(from, PSH | ACK, part);
                let i = from as usize;
                self.next[i] = self.next[i].wrapping_add(part.len() as u32);
                frame
            })
            .collect()
    }

    /// FIN from `from`.
    pub fn fin(&mut self, from: Peer) -> Vec<u8> {
        let frame = self.segment(from, FIN | ACK, &[]);
        let i = from as usize;
        self.next[i] = self.next[i].wrapping_add(1);
        frame
    }

    /// RST from `from`.
    pub fn rst(&mut self, from: Peer) -> Vec<u8> {
        self.segment(from, RST | ACK, &[])
    }

    fn segment(&self, from: Peer, flags: u8, payload: &[u8]) -> Vec<u8> {
        let (src, dst, seq, ack) = match from {
            Peer::Initiator => (self.a, self.b, self.next[0], self.next[1]),
            Peer::Acceptor => (self.b, self.a, self.next[1], self.next[0]),
        };
        let ack = if flags & ACK != 0 { ack } else { 0 };
        frame(src, dst, seq, ack, flags, payload)
    }
}

/// An Ethernet frame with an IPv4 or IPv6 packet holding one TCP segment.
fn frame(
    src: SocketAddr,
    dst: SocketAddr,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut tcp = Vec::with_capacity(20 + payload.len());
    tcp.extend_from_slice(&src.port().to_be_bytes());
    tcp.extend_from_slice(&dst.port().to_be_bytes());
    tcp.extend_from_slice(&seq.to_be_bytes());
    tcp.extend_from_slice(&ack.to_be_bytes());
    tcp.push(5 << 4); // data offset: 20 bytes, no options
    tcp.push(flags);
    tcp.extend_from_slice(&65535u16.to_be_bytes()); // window
    tcp.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
    tcp.extend_from_slice(payload);

    let mut out = Vec::with_capacity(14 + 40 + tcp.len());
    out.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01]); // dst, src MAC
    match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let sum = checksum(&[
                &s.octets(),
                &d.octets(),
                &[0, 6],
                &(tcp.len() as u16).to_be_bytes(),
                &tcp,
            ]);
            tcp[16..18].copy_from_slice(&sum.to_be_bytes());
            out.extend_from_slice(&[0x08, 0x00]);
            let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 6, 0, 0];
            ip[2..4].copy_from_slice(&((20 + tcp.len()) as u16).to_be_bytes());
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let sum = checksum(&[&ip]);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            out.extend_from_slice(&ip);
        }
        (s, d) => {
            let (s, d) = (to_v6(s), to_v6(d));
            let len = (tcp.len() as u32).to_be_bytes();
            let sum = checksum(&[&s, &d, &len, &[0, 0, 0, 6], &tcp]);
            tcp[16..18].copy_from_slice(&sum.to_be_bytes());
            out.extend_from_slice(&[0x86, 0xdd]);
            out.extend_from_slice(&[0x60, 0, 0, 0]);
            out.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
            out.extend_from_slice(&[6, 64]);
            out.extend_from_slice(&s);
            out.extend_from_slice(&d);
        }
    }
    out.extend_from_slice(&tcp);
    out
}

fn to_v6(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The Internet checksum (RFC 1071) over the concatenation of `parts`. Every part
/// but the last has an even length here (addresses, lengths, headers), so each is
/// summed as whole 16-bit words.
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum: u64 = 0;
    for part in parts {
        let mut words = part.chunks_exact(2);
        for w in &mut words {
            sum += u64::from(u16::from_be_bytes([w[0], w[1]]));
        }
        if let [last] = words.remainder() {
            sum += u64::from(u16::from_be_bytes([*last, 0]));
        }
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksums_verify_to_zero() {
        let a: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:80".parse().unwrap();
        let mut leg = Leg::new(a, b, [100, 900]);
        leg.handshake();
        let frame = &leg.data(Peer::Initiator, b"hello")[0];
        let ip = &frame[14..34];
        assert_eq!(checksum(&[ip]), 0);
        let tcp = &frame[34..];
        let len = (tcp.len() as u16).to_be_bytes();
        assert_eq!(checksum(&[&ip[12..16], &ip[16..20], &[0, 6], &len, tcp]), 0);
        // seq of the data follows the SYN: isn + 1.
        assert_eq!(u32::from_be_bytes(tcp[4..8].try_into().unwrap()), 101);
        assert_eq!(u32::from_be_bytes(tcp[8..12].try_into().unwrap()), 901);
    }
}
