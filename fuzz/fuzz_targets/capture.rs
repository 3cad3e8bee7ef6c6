//! The capture writer fed any sequence of opens, data, passes, FINs, RSTs and closes,
//! with any rotation size: every file reads back with pcap-file, and each direction
//! of each leg reassembles, in sequence order, to exactly the bytes it was given.
#![no_main]

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use pcap_file::pcapng::{Block, PcapNgReader};
use snag::capture::{
    Capture, Record, Settings,
    tcp::{Payload, Peer},
};

/// The bytes of the input, read front to back; zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let (first, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        *first
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

type Flow = (SocketAddr, SocketAddr);

fn ends(instance: u16) -> Flow {
    let (a, b): (IpAddr, IpAddr) = if instance % 2 == 0 {
        ([127, 0, 0, 1].into(), [127, 0, 0, 2].into())
    } else {
        (
            std::net::Ipv6Addr::LOCALHOST.into(),
            [0xfd00, 0, 0, 0, 0, 0, 0, 2].into(),
        )
    };
    (
        SocketAddr::new(a, 1000 + instance),
        SocketAddr::new(b, 2000 + instance),
    )
}

fn flow(ends: Flow, from: Peer) -> Flow {
    match from {
        Peer::Initiator => ends,
        Peer::Acceptor => (ends.1, ends.0),
    }
}

fn dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("snag-fuzz-capture-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    dir
}

fuzz_target!(|bytes: &[u8]| {
    let mut input = Input(bytes);
    let dir = dir();
    for entry in std::fs::read_dir(&dir).expect("the temp dir").flatten() {
        let _ = std::fs::remove_file(entry.path());
    }
    let path = dir.join("cap.pcapng");
    let max = u64::from(input.byte()) * 64;
    let settings = Settings {
        path: path.clone(),
        max_bytes: (max > 0).then_some(max),
        snaplen: 0,
    };
    let capture = Capture::create(settings).expect("the capture opens");
    let tx = capture.sender().expect("an open capture has a sender");
    let mut open: HashMap<(u64, usize), Flow> = HashMap::new();
    let mut expected: HashMap<Flow, Vec<u8>> = HashMap::new();
    let mut instance = 0u16;
    let at = Duration::from_secs(1_700_000_000);
    let mut ops = 0;
    while !input.is_empty() && ops < 200 {
        ops += 1;
        let op = input.byte();
        let conn = u64::from(op >> 4 & 3);
        let leg = usize::from(op >> 6 & 1);
        let from = if op >> 7 == 1 {
            Peer::Acceptor
        } else {
            Peer::Initiator
        };
        let record = match op % 6 {
            0 => {
                instance += 1;
                let e = ends(instance);
                open.insert((conn, leg), e);
                Record::OpenLeg {
                    conn,
                    leg,
                    ends: e,
                    at,
                }
            }
            1 | 2 => {
                let len = usize::from(input.byte()) * 160 + usize::from(input.byte());
                let fill = input.byte();
                let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                if op % 6 == 1 {
                    let note = (input.byte() % 4 == 0).then(|| format!("fault {fill} ✓"));
                    if let Some(e) = open.get(&(conn, leg)) {
                        expected
                            .entry(flow(*e, from))
                            .or_default()
                            .extend_from_slice(&data);
                    }
                    Record::Data {
                        conn,
                        leg,
                        from,
                        data: Bytes::from(data),
                        note,
                        at,
                    }
                } else {
                    let written = (
                        1 - leg,
                        if input.byte() % 2 == 0 {
                            Peer::Initiator
                        } else {
                            Peer::Acceptor
                        },
                    );
                    for (l, f) in [(leg, from), written] {
                        if let Some(e) = open.get(&(conn, l)) {
                            expected
                                .entry(flow(*e, f))
                                .or_default()
                                .extend_from_slice(&data);
                        }
                    }
                    Record::Pass {
                        conn,
                        read: (leg, from),
                        written,
                        data: Payload::whole(Bytes::from(data)),
                        note: None,
                        at,
                    }
                }
            }
            3 => Record::Fin {
                conn,
                leg,
                from,
                note: None,
                at,
            },
            4 => Record::Rst {
                conn,
                leg,
                from,
                note: Some("reset_peer".into()),
                at,
            },
            _ => {
                open.remove(&(conn, 0));
                open.remove(&(conn, 1));
                Record::Close { conn }
            }
        };
        tx.blocking_send(record).expect("the writer is running");
    }
    drop(tx);
    capture.close().expect("the capture closes cleanly");

    let mut got: HashMap<Flow, Vec<u8>> = HashMap::new();
    let mut next_seq: HashMap<Flow, u32> = HashMap::new();
    for index in 0.. {
        let file = if index == 0 {
            path.clone()
        } else {
            dir.join(format!("cap.{index}.pcapng"))
        };
        let Ok(data) = std::fs::read(&file) else {
            break;
        };
        let mut reader = PcapNgReader::new(&data[..]).expect("a pcapng section header");
        while let Some(block) = reader.next_block() {
            let block = block.expect("every block reads back");
            let Block::EnhancedPacket(packet) = block else {
                continue;
            };
            assert_eq!(
                packet.original_len as usize,
                packet.data.len(),
                "snaplen 0 keeps all"
            );
            let (f, seq, flags, payload) = parse(&packet.data);
            if flags & 0x02 != 0 {
                next_seq.insert(f, seq.wrapping_add(1));
                continue;
            }
            if let Some(next) = next_seq.get_mut(&f) {
                assert_eq!(seq, *next, "flow {f:?}: segments follow each other");
                *next = next.wrapping_add(payload.len() as u32) + u32::from(flags & 0x01);
            }
            got.entry(f).or_default().extend_from_slice(payload);
        }
    }
    expected.retain(|_, v| !v.is_empty());
    got.retain(|_, v| !v.is_empty());
    assert_eq!(got.len(), expected.len(), "flows with data");
    for (f, want) in &expected {
        assert!(
            got.get(f) == Some(want),
            "flow {f:?}: {} bytes back, {} sent",
            got.get(f).map_or(0, Vec::len),
            want.len()
        );
    }
});

/// Flow, sequence number, flags and payload of a synthetic Ethernet frame.
fn parse(frame: &[u8]) -> (Flow, u32, u8, &[u8]) {
    let ip = &frame[14..];
    let (src, dst, tcp) = match ip[0] >> 4 {
        4 => {
            let ihl = usize::from(ip[0] & 15) * 4;
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let src = IpAddr::from(<[u8; 4]>::try_from(&ip[12..16]).unwrap());
            let dst = IpAddr::from(<[u8; 4]>::try_from(&ip[16..20]).unwrap());
            (src, dst, &ip[ihl..total])
        }
        6 => {
            let len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let src = IpAddr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
            let dst = IpAddr::from(<[u8; 16]>::try_from(&ip[24..40]).unwrap());
            (src, dst, &ip[40..40 + len])
        }
        v => panic!("IP version {v}"),
    };
    let sport = u16::from_be_bytes([tcp[0], tcp[1]]);
    let dport = u16::from_be_bytes([tcp[2], tcp[3]]);
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let offset = usize::from(tcp[12] >> 4) * 4;
    let flags = tcp[13];
    (
        (SocketAddr::new(src, sport), SocketAddr::new(dst, dport)),
        seq,
        flags,
        &tcp[offset..],
    )
}
