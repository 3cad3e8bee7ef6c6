//! Captures: both legs of every relayed connection written to pcapng, built from what
//! snag really read and wrote, annotated with the faults that touched each packet.
//!
//! Connections send [`Record`]s through a bounded channel to one writer thread that
//! owns the file, so no task waits on the disk; when the writer falls behind, the
//! relay waits for it instead of losing a packet.

pub mod tap;
pub mod tcp;

use std::{
    borrow::Cow,
    collections::HashMap,
    fs::File,
    io::{self, BufWriter, Read, Write},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;
use pcap_file::{
    DataLink,
    pcapng::{
        PcapNgWriter,
        blocks::{
            enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption},
            interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption},
        },
    },
};
use tokio::sync::mpsc;

use self::tcp::{Frame, Leg, Payload, Peer};

/// Where and how much to capture.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The file; rotated ones are `NAME.1.pcapng`, `NAME.2.pcapng` …
    pub path: PathBuf,
    /// Start a new file once one holds this many bytes; `None`: one file.
    pub max_bytes: Option<u64>,
    /// Bytes kept of each packet (headers included); 0 = all.
    pub snaplen: u32,
}

/// Which leg of a connection: client↔snag or snag↔upstream.
pub const CLIENT_LEG: usize = 0;
/// snag↔upstream.
pub const UPSTREAM_LEG: usize = 1;

/// What a connection tells the writer.
#[derive(Debug)]
pub enum Record {
    /// A leg opened: initiator and acceptor. A TCP-mode connection opens both of
    /// its legs under one key; in HTTP mode client and upstream connections are not
    /// paired, and each is a key with one leg.
    OpenLeg {
        /// Connection number.
        conn: u64,
        /// Which leg.
        leg: usize,
        /// Who connected, and to whom.
        ends: (SocketAddr, SocketAddr),
        /// When.
        at: Duration,
    },
    /// Bytes crossed a leg.
    Data {
        /// Connection number.
        conn: u64,
        /// Which leg.
        leg: usize,
        /// Which side sent them.
        from: Peer,
        /// Exactly what was read or written.
        data: Bytes,
        /// The faults that touched them, if any.
        note: Option<String>,
        /// When.
        at: Duration,
    },
    /// Bytes read on one leg and written, unchanged, on the other: the fast path's
    /// record, one message for both packets.
    Pass {
        /// Connection number.
        conn: u64,
        /// Where they were read, and from which side.
        read: (usize, Peer),
        /// Where they were written, and by which side.
        written: (usize, Peer),
        /// The bytes, or what the capture keeps of them.
        data: Payload<Bytes>,
        /// A comment for the written packet.
        note: Option<String>,
        /// When.
        at: Duration,
    },
    /// A FIN on a leg.
    Fin {
        /// Connection number.
        conn: u64,
        /// Which leg.
        leg: usize,
        /// Which side.
        from: Peer,
        /// Why, if a fault.
        note: Option<String>,
        /// When.
        at: Duration,
    },
    /// An RST on a leg.
    Rst {
        /// Connection number.
        conn: u64,
        /// Which leg.
        leg: usize,
        /// Which side.
        from: Peer,
        /// Why, if a fault.
        note: Option<String>,
        /// When.
        at: Duration,
    },
    /// TLS session keys, lines of the NSS key log format: a decryption secrets
    /// block, so Wireshark decrypts what follows without a key log file.
    Secrets(String),
    /// The connection is over; its legs are forgotten.
    Close {
        /// Connection number.
        conn: u64,
    },
}

/// A connection's key in a capture shared by several proxies: the proxy's name mixed
/// into its connection number.
pub fn key(proxy: &str, conn: u64) -> u64 {
    use rand::RngExt;
    crate::seed::rng(conn, &[proxy.as_bytes(), b"capture"]).random()
}

/// The wall clock as pcapng wants it.
pub fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// An open capture.
#[derive(Debug)]
pub struct Capture {
    /// Bytes kept of each packet; 0 = all.
    snaplen: u32,
    tx: Mutex<Option<mpsc::Sender<Record>>>,
    writer: Mutex<Option<std::thread::JoinHandle<io::Result<()>>>>,
}

/// pcapng's decryption secrets block, and its secrets type for a TLS key log.
const DECRYPTION_SECRETS: u32 = 0x0000_000A;
const TLS_KEY_LOG: u32 = 0x544c_534b;

/// Records buffered between the relays and the writer: some milliseconds of traffic.
const QUEUE: usize = 16_384;
/// Records the writer takes at a time.
const BATCH: usize = 1024;
/// How long the writer waits after a partial batch.
const REST: Duration = Duration::from_millis(1);

impl Capture {
    /// Creates the file and starts the writer thread.
    pub fn create(settings: Settings) -> io::Result<Capture> {
        let snaplen = settings.snaplen;
        let mut out = Output::open(&settings, 0)?;
        let (tx, mut rx) = mpsc::channel::<Record>(QUEUE);
        let writer = std::thread::Builder::new()
            .name("snag-capture".into())
            .spawn(move || {
                let mut legs: HashMap<(u64, usize), Leg> = HashMap::new();
                let mut batch = Vec::with_capacity(BATCH);
                while rx.blocking_recv_many(&mut batch, BATCH) > 0 {
                    let full = batch.len() == BATCH;
                    for record in batch.drain(..) {
                        out.record(record, &mut legs, &settings)?;
                    }
                    // Waking this thread for every record costs the relays a futex
                    // call each; resting lets a millisecond of records gather, so
                    // under load a send rarely has a sleeper to wake.
                    if !full {
                        std::thread::sleep(REST);
                    }
                }
                out.finish()
            })?;
        Ok(Capture {
            snaplen,
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Bytes kept of each packet; 0 = all.
    pub fn snaplen(&self) -> usize {
        self.snaplen as usize
    }

    /// A sender for one connection's records; `None` once the capture is closed.
    pub fn sender(&self) -> Option<mpsc::Sender<Record>> {
        self.tx
            .lock()
            .expect("no code panics holding the capture sender")
            .clone()
    }

    /// Waits until every record sent so far is written, then flushes and closes the
    /// file. Call after the proxies have stopped: their connections hold senders.
    pub fn close(&self) -> io::Result<()> {
        drop(
            self.tx
                .lock()
                .expect("no code panics holding the capture sender")
                .take(),
        );
        match self
            .writer
            .lock()
            .expect("no code panics holding the writer")
            .take()
        {
            Some(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("capture writer panicked"))),
            None => Ok(()),
        }
    }
}

/// The file being written, and rotation.
struct Output {
    writer: PcapNgWriter<BufWriter<File>>,
    written: u64,
    index: u32,
    path: PathBuf,
    /// TLS key log lines for this file, written as a decryption secrets block
    /// ahead of the packets when the file is sealed (Wireshark uses a block's keys
    /// only on packets after it, and the keys come after the handshake's packets).
    secrets: String,
    /// The frame being written, reused.
    frame: Vec<u8>,
}

fn pcap_err(e: pcap_file::PcapError) -> io::Error {
    io::Error::other(e.to_string())
}

impl Output {
    fn open(settings: &Settings, index: u32) -> io::Result<Output> {
        let path = rotated(&settings.path, index);
        // Large enough that a busy capture writes in few system calls.
        let file = BufWriter::with_capacity(1 << 18, File::create(&path)?);
        let mut writer = PcapNgWriter::new(file).map_err(pcap_err)?;
        let interface = InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: settings.snaplen,
            options: vec![
                InterfaceDescriptionOption::IfName(Cow::Borrowed("snag")),
                InterfaceDescriptionOption::IfDescription(Cow::Borrowed(
                    "synthetic frames of what snag read and wrote on each leg",
                )),
                InterfaceDescriptionOption::IfTsResol(9),
            ],
        };
        let written = writer.write_pcapng_block(interface).map_err(pcap_err)? as u64;
        Ok(Output {
            writer,
            written,
            index,
            path,
            secrets: String::new(),
            frame: Vec::new(),
        })
    }

    fn record(
        &mut self,
        record: Record,
        legs: &mut HashMap<(u64, usize), Leg>,
        settings: &Settings,
    ) -> io::Result<()> {
        match record {
            Record::Data {
                conn,
                leg,
                from,
                data,
                note,
                at,
            } => self.data(
                legs.get_mut(&(conn, leg)),
                from,
                &Payload::whole(&data[..]),
                at,
                note.as_deref(),
                settings,
            )?,
            Record::OpenLeg {
                conn,
                leg,
                ends: (a, b),
                at,
            } => {
                let mut l = Leg::new(a, b, [isn(conn, leg, 0), isn(conn, leg, 1)]);
                for frame in l.handshake() {
                    self.packet(frame, at, None, settings)?;
                }
                legs.insert((conn, leg), l);
            }
            Record::Pass {
                conn,
                read,
                written,
                data,
                note,
                at,
            } => {
                for ((leg, from), note) in [(read, None), (written, note.as_deref())] {
                    let leg = legs.get_mut(&(conn, leg));
                    self.data(leg, from, &data.as_slice(), at, note, settings)?;
                }
            }
            Record::Fin {
                conn,
                leg,
                from,
                note,
                at,
            } => {
                let frame = legs.get_mut(&(conn, leg)).map(|l| l.fin(from));
                self.packet_if(frame, at, note.as_deref(), settings)?;
            }
            Record::Rst {
                conn,
                leg,
                from,
                note,
                at,
            } => {
                let frame = legs.get_mut(&(conn, leg)).map(|l| l.rst(from));
                self.packet_if(frame, at, note.as_deref(), settings)?;
            }
            Record::Secrets(lines) => self.secrets.push_str(&lines),
            Record::Close { conn } => {
                legs.remove(&(conn, CLIENT_LEG));
                legs.remove(&(conn, UPSTREAM_LEG));
            }
        }
        Ok(())
    }

    /// One frame, if its leg was known.
    fn packet_if(
        &mut self,
        frame: Option<Frame>,
        at: Duration,
        note: Option<&str>,
        settings: &Settings,
    ) -> io::Result<()> {
        match frame {
            Some(frame) => self.packet(frame, at, note, settings),
            None => Ok(()),
        }
    }

    /// The segments of `data` sent by `from` on `leg`, if the leg is known.
    fn data(
        &mut self,
        leg: Option<&mut Leg>,
        from: Peer,
        data: &Payload<&[u8]>,
        at: Duration,
        note: Option<&str>,
        settings: &Settings,
    ) -> io::Result<()> {
        for frame in leg.map(|l| l.payload(from, data)).unwrap_or_default() {
            self.packet(frame, at, note, settings)?;
        }
        Ok(())
    }

    fn packet(
        &mut self,
        mut frame: Frame,
        at: Duration,
        note: Option<&str>,
        settings: &Settings,
    ) -> io::Result<()> {
        let len = frame.wire_len();
        let kept = match settings.snaplen as usize {
            0 => len,
            snaplen => len.min(snaplen),
        };
        if kept == len {
            frame.checksum();
        }
        let head = frame.head();
        self.frame.clear();
        self.frame.extend_from_slice(&head[..kept.min(head.len())]);
        self.frame
            .extend_from_slice(&frame.payload[..kept.saturating_sub(head.len())]);
        let block = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: at,
            original_len: len as u32,
            data: Cow::Borrowed(&self.frame),
            options: note
                .map(|n| vec![EnhancedPacketOption::Comment(Cow::Borrowed(n))])
                .unwrap_or_default(),
        };
        self.written += self.writer.write_pcapng_block(block).map_err(pcap_err)? as u64;
        if settings.max_bytes.is_some_and(|max| self.written >= max) {
            let next = Output::open(settings, self.index + 1)?;
            std::mem::replace(self, next).finish()?;
        }
        Ok(())
    }

    /// Flushes the file and, if TLS keys came, puts them in a decryption secrets
    /// block after the section and interface headers, ahead of every packet: the
    /// file is copied once.
    fn finish(mut self) -> io::Result<()> {
        self.writer.get_mut().flush()?;
        if self.secrets.is_empty() {
            return Ok(());
        }
        let big = self.writer.section().endianness == pcap_file::Endianness::Big;
        drop(self.writer);
        let word = |n: u32| {
            if big {
                n.to_be_bytes()
            } else {
                n.to_le_bytes()
            }
        };
        let mut original = std::io::BufReader::new(File::open(&self.path)?);
        // The section header and the interface description: two blocks, each with
        // its total length at bytes 4..8.
        let mut head = Vec::new();
        for _ in 0..2 {
            let mut start = [0u8; 8];
            original.read_exact(&mut start)?;
            let len = [start[4], start[5], start[6], start[7]];
            let len = if big {
                u32::from_be_bytes(len)
            } else {
                u32::from_le_bytes(len)
            } as usize;
            let mut rest = vec![0u8; len.saturating_sub(8)];
            original.read_exact(&mut rest)?;
            head.extend(start);
            head.extend(rest);
        }
        let data = self.secrets.as_bytes();
        let padded = data.len().div_ceil(4) * 4;
        let total = (8 + 8 + padded + 4) as u32;
        let mut block = Vec::with_capacity(total as usize);
        block.extend(word(DECRYPTION_SECRETS));
        block.extend(word(total));
        block.extend(word(TLS_KEY_LOG));
        block.extend(word(data.len() as u32));
        block.extend(data);
        block.resize(8 + 8 + padded, 0);
        block.extend(word(total));
        let sealed = self.path.with_extension("sealing");
        let mut out = BufWriter::new(File::create(&sealed)?);
        out.write_all(&head)?;
        out.write_all(&block)?;
        io::copy(&mut original, &mut out)?;
        out.flush()?;
        drop(out);
        std::fs::rename(&sealed, &self.path)
    }
}

/// `cap.pcapng`, then `cap.1.pcapng`, `cap.2.pcapng` …
fn rotated(path: &Path, index: u32) -> PathBuf {
    if index == 0 {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!("{stem}.{index}{ext}"))
}

/// A fixed initial sequence number per connection, leg and side: captures of the same
/// run compare byte for byte.
fn isn(conn: u64, leg: usize, side: u64) -> u32 {
    let mut rng = crate::seed::rng(conn, &[&(leg as u64).to_le_bytes(), &side.to_le_bytes()]);
    rand::RngExt::random(&mut rng)
}
