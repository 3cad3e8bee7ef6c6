//! Captures read back two ways: by pcap-file here, reassembling every leg to the bytes
//! relayed, and by Debian's tshark, an observer that is not snag at all.

mod common;

use std::{collections::HashMap, net::SocketAddr, path::Path, sync::Arc};

use common::{echo_server, pattern, process::Process, within};
use pcap_file::pcapng::{Block, PcapNgReader};
use snag::{
    capture::{Capture, Settings},
    proxy::{self, Proxy, RunContext},
    shutdown::Shutdown,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// One TCP segment out of a captured frame.
struct Segment {
    src: SocketAddr,
    dst: SocketAddr,
    seq: u32,
    flags: u8,
    payload: Vec<u8>,
    comment: Option<String>,
}

fn segments(path: &Path) -> Vec<Segment> {
    let mut reader = PcapNgReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut out = Vec::new();
    while let Some(block) = reader.next_block() {
        let Block::EnhancedPacket(p) = block.unwrap() else {
            continue;
        };
        let f = &p.data;
        assert_eq!(&f[12..14], &[0x08, 0x00], "IPv4 on loopback");
        let ip = &f[14..];
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        let addr = |b: &[u8], port: &[u8]| {
            SocketAddr::from((
                [b[0], b[1], b[2], b[3]],
                u16::from_be_bytes([port[0], port[1]]),
            ))
        };
        let tcp = &ip[ihl..total.min(ip.len())]; // a snap length may cut the frame
        let offset = usize::from(tcp[12] >> 4) * 4;
        let comment = p.options.iter().find_map(|o| match o {
            pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption::Comment(c) => {
                Some(c.to_string())
            }
            _ => None,
        });
        out.push(Segment {
            src: addr(&ip[12..16], &tcp[0..2]),
            dst: addr(&ip[16..20], &tcp[2..4]),
            seq: u32::from_be_bytes(tcp[4..8].try_into().unwrap()),
            flags: tcp[13],
            payload: tcp[offset..].to_vec(),
            comment,
        });
    }
    out
}

/// A scratch folder for one test, and a capture (all of every frame) in it.
fn capture_in(test: &str, file: &str) -> (std::path::PathBuf, std::path::PathBuf, Arc<Capture>) {
    let dir = std::env::temp_dir().join(format!("snag-test-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file);
    let capture = Capture::create(Settings {
        path: path.clone(),
        max_bytes: None,
        snaplen: 0,
    })
    .unwrap();
    (dir, path, Arc::new(capture))
}

/// The bytes of each one-way flow, in sequence order, checking there is no gap.
fn streams(segments: &[Segment]) -> HashMap<(SocketAddr, SocketAddr), Vec<u8>> {
    let mut next: HashMap<(SocketAddr, SocketAddr), u32> = HashMap::new();
    let mut out: HashMap<(SocketAddr, SocketAddr), Vec<u8>> = HashMap::new();
    for s in segments {
        let key = (s.src, s.dst);
        if s.flags & 0x02 != 0 {
            next.insert(key, s.seq.wrapping_add(1)); // SYN
            out.entry(key).or_default();
            continue;
        }
        if s.payload.is_empty() {
            continue;
        }
        let want = next.get_mut(&key).expect("data after a SYN");
        assert_eq!(s.seq, *want, "a gap or overlap in {key:?}");
        *want = want.wrapping_add(s.payload.len() as u32);
        out.entry(key).or_default().extend_from_slice(&s.payload);
    }
    out
}

#[tokio::test]
async fn both_legs_reassemble_to_the_bytes_relayed_and_resets_are_annotated() {
    within(30, async {
        let (dir, path, capture) = capture_in("capture", "run.pcapng");
        let mut context = RunContext::new(1);
        context.capture = Some(capture.clone());
        let upstream = echo_server().await;
        let proxy = Proxy::new(common::config("cap", upstream, &[]), context).unwrap();
        let listener = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Shutdown::new();
        let task = tokio::spawn(proxy::serve(listener, proxy.clone(), stop.clone()));

        // One clean connection: 300 KB each way, half-closed by the client.
        let data = pattern(300_000, 9);
        let client = TcpStream::connect(addr).await.unwrap();
        let client_addr = client.local_addr().unwrap();
        let (mut r, mut w) = client.into_split();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&sent).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut echoed = Vec::new();
        r.read_to_end(&mut echoed).await.unwrap();
        writer.await.unwrap();
        assert!(echoed == data);

        // One reset by a fault, after latency: both faults annotate what they touched.
        proxy
            .add_fault("latency:latency=20".parse().unwrap())
            .unwrap();
        proxy
            .add_fault("reset_peer:timeout=100".parse().unwrap())
            .unwrap();
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"doomed").await.unwrap();
        assert!(c.read(&mut [0; 16]).await.is_err());

        stop.trigger();
        task.await.unwrap().unwrap();
        capture.close().unwrap();

        let segs = segments(&path);
        let flows = streams(&segs);
        assert_eq!(flows[&(client_addr, addr)], data, "client → snag");
        assert_eq!(flows[&(addr, client_addr)], data, "snag → client");
        let upstream_leg: Vec<_> = flows
            .keys()
            .filter(|(s, d)| *d == upstream && s.port() != 0)
            .collect();
        assert_eq!(upstream_leg.len(), 2, "{:?}", flows.keys());
        for key in upstream_leg {
            let back = (key.1, key.0);
            if flows[key].len() == data.len() {
                assert_eq!(flows[key], data, "snag → upstream");
                assert_eq!(flows[&back], data, "upstream → snag");
            }
        }
        let resets: Vec<&Segment> = segs.iter().filter(|s| s.flags & 0x04 != 0).collect();
        assert_eq!(resets.len(), 2, "an RST on each leg");
        assert!(resets.iter().all(|s| {
            s.comment
                .as_deref()
                .is_some_and(|c| c.contains("reset_peer"))
        }));
        assert!(
            segs.iter()
                .any(|s| s.comment.as_deref().is_some_and(|c| c.contains("latency")))
        );

        // tshark reads it without a complaint, sees four conversations (two legs of two
        // connections), the comments, and the same bytes when it follows the stream.
        let run = |args: &[&str]| common::tshark(&path, args);
        let conv = run(&["-q", "-z", "conv,tcp"]);
        assert_eq!(
            conv.lines().filter(|l| l.contains("<->")).count(),
            4,
            "{conv}"
        );
        // Every IP and TCP checksum verifies, the TCP ones computed over whole payloads.
        let checks = run(&[
            "-o",
            "ip.check_checksum:TRUE",
            "-o",
            "tcp.check_checksum:TRUE",
            "-T",
            "fields",
            "-e",
            "ip.checksum.status",
            "-e",
            "tcp.checksum.status",
        ]);
        assert!(checks.lines().count() >= 10, "{checks}");
        assert!(checks.lines().all(|l| l == "1\t1"), "{checks}");
        let comments = run(&["-Y", "frame.comment", "-T", "fields", "-e", "frame.comment"]);
        assert!(
            comments.contains("reset_peer_downstream") && comments.contains("latency_downstream"),
            "{comments}"
        );
        let follow = run(&["-q", "-z", &format!("follow,tcp,raw,{client_addr},{addr}")]);
        let mut from_client = Vec::new();
        for line in follow
            .lines()
            .skip_while(|l| !l.starts_with("Node 1:"))
            .skip(1)
        {
            if line.starts_with('=') {
                break;
            }
            if !line.starts_with('\t') {
                from_client.extend(
                    (0..line.len() / 2)
                        .map(|i| u8::from_str_radix(&line[2 * i..2 * i + 2], 16).unwrap()),
                );
            }
        }
        assert!(
            from_client == data,
            "tshark's reassembly of client → snag differs ({} bytes)",
            from_client.len()
        );
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test]
async fn a_bounded_capture_rotates_into_numbered_files_that_each_read_back() {
    within(20, async {
        let dir = std::env::temp_dir().join(format!("snag-test-{}-rotate", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("small.pcapng");
        let settings = Settings {
            path: path.clone(),
            max_bytes: Some(4_000),
            snaplen: 128,
        };
        let capture = Arc::new(Capture::create(settings).unwrap());
        let mut context = RunContext::new(1);
        context.capture = Some(capture.clone());
        let proxy = Proxy::new(common::config("rot", echo_server().await, &[]), context).unwrap();
        let listener = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Shutdown::new();
        let task = tokio::spawn(proxy::serve(listener, proxy, stop.clone()));
        for _ in 0..5 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(&[1; 2_000]).await.unwrap();
            c.read_exact(&mut [0; 2_000]).await.unwrap();
        }
        stop.trigger();
        task.await.unwrap().unwrap();
        capture.close().unwrap();
        let files: Vec<_> = (0..)
            .map(|i| {
                if i == 0 {
                    path.clone()
                } else {
                    dir.join(format!("small.{i}.pcapng"))
                }
            })
            .take_while(|p| p.exists())
            .collect();
        assert!(files.len() >= 2, "{files:?}");
        for file in &files {
            let frames = segments(file).len();
            assert!(frames > 0, "{}", file.display());
            let mut reader = PcapNgReader::new(std::fs::File::open(file).unwrap()).unwrap();
            while let Some(block) = reader.next_block() {
                if let Block::EnhancedPacket(p) = block.unwrap() {
                    assert!(p.data.len() <= 128, "snaplen kept {} bytes", p.data.len());
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// Starts `snag ARGS`, waits for its line containing `marker`; the process and that
/// line.
async fn start(args: &[&str], marker: &str) -> (Process, String) {
    let mut snag = Process::spawn(common::process::snag(args));
    let line = snag
        .line(10, |l| l.contains(marker).then(|| l.to_string()))
        .await;
    (snag, line)
}

/// Ctrl-C, and a clean exit.
async fn interrupt(mut snag: Process) {
    snag.signal(nix::sys::signal::Signal::SIGINT);
    assert!(snag.exit(10).await.success());
}

#[tokio::test]
async fn a_fault_file_and_the_api_server_take_a_capture_too() {
    within(30, async {
        let dir = std::env::temp_dir().join(format!("snag-test-{}-capture-config", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let echo = echo_server().await;
        let from_file = dir.join("file.pcapng");
        let config = dir.join("f.toml");
        std::fs::write(
            &config,
            format!(
                "[capture]\npath = \"{}\"\n\n[[proxy]]\nname = \"a\"\nlisten = \"127.0.0.1:0\"\nupstream = \"{echo}\"\n",
                from_file.display()
            ),
        )
        .unwrap();
        let (child, row) = start(&["proxy", "--seed", "1", "--file", config.to_str().unwrap()], "127.0.0.1").await;
        let addr: SocketAddr = row.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"via the file").await.unwrap();
        c.read_exact(&mut [0; 12]).await.unwrap();
        drop(c);
        interrupt(child).await;
        let flows = streams(&segments(&from_file));
        assert!(flows.values().any(|b| b == b"via the file"), "{:?}", flows.keys());

        let from_api = dir.join("api.pcapng");
        let cap = from_api.to_str().unwrap().to_string();
        let (child, line) = start(&["serve", "--listen", "127.0.0.1:0", "--seed", "1", "--capture", &cap], "control API on").await;
        let api: SocketAddr = line.split("http://").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        let body = format!(r#"{{"name":"b","listen":"127.0.0.1:0","upstream":"{echo}"}}"#);
        let created = common::http(api, "POST", "/proxies", &body, &[]).await;
        let listen: SocketAddr = serde_json::from_str::<serde_json::Value>(&created.body).unwrap()["listen"].as_str().unwrap().parse().unwrap();
        let first = listen;
        assert!(created.body.contains(r#""capture":true"#), "{}", created.body);
        let mut c = TcpStream::connect(listen).await.unwrap();
        c.write_all(b"via the api").await.unwrap();
        c.read_exact(&mut [0; 11]).await.unwrap();
        drop(c);
        // A proxy created with "capture": false stays out of the capture.
        let body = format!(r#"{{"name":"c","listen":"127.0.0.1:0","upstream":"{echo}","capture":false}}"#);
        let created = common::http(api, "POST", "/proxies", &body, &[]).await;
        assert!(!created.body.contains("capture"), "{}", created.body);
        let listen: SocketAddr = serde_json::from_str::<serde_json::Value>(&created.body).unwrap()["listen"].as_str().unwrap().parse().unwrap();
        let mut c = TcpStream::connect(listen).await.unwrap();
        c.write_all(b"not captured").await.unwrap();
        c.read_exact(&mut [0; 12]).await.unwrap();
        drop(c);
        // Switched on and off while running: c's next connection is captured, b's
        // (through `snag ctl capture`) is not.
        let on = common::http(api, "POST", "/proxies/c", r#"{"capture":true}"#, &[]).await;
        assert_eq!(on.status, 200, "{}", on.body);
        assert!(on.body.contains(r#""capture":true"#), "{}", on.body);
        let api_at = api.to_string();
        let mut ctl = Process::spawn(common::process::snag(&["ctl", "--api", &api_at, "capture", "b", "off"]));
        assert!(ctl.exit(10).await.success());
        for (at, text) in [(listen, &b"c switched on"[..]), (first, &b"b switched off"[..])] {
            let mut c = TcpStream::connect(at).await.unwrap();
            c.write_all(text).await.unwrap();
            c.read_exact(&mut vec![0; text.len()]).await.unwrap();
        }
        interrupt(child).await;
        let flows = streams(&segments(&from_api));
        assert!(flows.values().any(|b| b == b"via the api"), "{:?}", flows.keys());
        assert!(!flows.values().any(|b| b == b"not captured"), "{:?}", flows.keys());
        assert!(flows.values().any(|b| b == b"c switched on"), "{:?}", flows.keys());
        assert!(!flows.values().any(|b| b == b"b switched off"), "{:?}", flows.keys());
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test]
async fn http_mode_captures_client_legs_and_pooled_upstream_legs() {
    within(30, async {
        let (dir, path, capture) = capture_in("capture-http", "http.pcapng");
        let (backend, _) = common::http_backend("captured body").await;
        let mut context = RunContext::new(1);
        context.capture = Some(capture.clone());
        let mut config =
            common::config("web", backend, &["reset_mid_response:bytes=3,scope=probe"]);
        config.mode = snag::proxy::Mode::Http;
        let proxy = Proxy::new(config, context).unwrap();
        let listener = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Shutdown::new();
        let task = tokio::spawn(proxy::serve(listener, proxy, stop.clone()));
        assert_eq!(
            common::http(addr, "GET", "/orders", "", &[]).await.body,
            "captured body"
        );
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut got = Vec::new();
        assert!(c.read_to_end(&mut got).await.is_err(), "the probe is reset");
        stop.trigger();
        task.await.unwrap().unwrap();
        capture.close().unwrap();

        let segs = segments(&path);
        let flows = streams(&segs);
        let to_snag: Vec<&Vec<u8>> = flows
            .iter()
            .filter(|((_, d), _)| *d == addr)
            .map(|(_, b)| b)
            .collect();
        assert!(
            to_snag
                .iter()
                .any(|b| b.starts_with(b"GET /orders HTTP/1.1")),
            "client leg"
        );
        let from_snag: Vec<&Vec<u8>> = flows
            .iter()
            .filter(|((s, _), _)| *s == addr)
            .map(|(_, b)| b)
            .collect();
        assert!(
            from_snag.iter().any(|b| b.ends_with(b"captured body")),
            "client leg answer"
        );
        let upstream: Vec<&Vec<u8>> = flows
            .iter()
            .filter(|((_, d), _)| *d == backend)
            .map(|(_, b)| b)
            .collect();
        assert!(
            upstream
                .iter()
                .any(|b| String::from_utf8_lossy(b).contains("GET /orders HTTP/1.1")),
            "upstream leg"
        );
        let reset = segs
            .iter()
            .find(|s| s.flags & 0x04 != 0)
            .expect("an RST on the probe's leg");
        assert_eq!(reset.src, addr);
        assert!(
            reset
                .comment
                .as_deref()
                .is_some_and(|c| c.contains("reset_mid_response")),
            "{:?}",
            reset.comment
        );
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test]
async fn a_tcp_frame_names_only_the_faults_that_acted_on_it() {
    within(30, async {
        let (dir, path, capture) = capture_in("capture-acted", "acted.pcapng");
        let mut context = RunContext::new(1);
        context.capture = Some(capture.clone());
        let upstream = echo_server().await;
        // Both on the way back: latency=0 changes nothing, limit_data cuts at 8 bytes.
        let proxy = Proxy::new(
            common::config(
                "acted",
                upstream,
                &["latency:latency=0", "limit_data:bytes=8"],
            ),
            context,
        )
        .unwrap();
        let listener = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Shutdown::new();
        let task = tokio::spawn(proxy::serve(listener, proxy.clone(), stop.clone()));
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"hello").await.unwrap();
        let mut five = [0; 5];
        c.read_exact(&mut five).await.unwrap();
        c.write_all(b"0123456789").await.unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"012", "limit_data let 8 bytes through in all");
        stop.trigger();
        task.await.unwrap().unwrap();
        capture.close().unwrap();

        // Seen by tshark: the untouched echo carries no comment; the cut piece and the
        // FIN after it name limit_data alone.
        let comments = common::tshark_comments(&path);
        let from_snag: Vec<&String> = comments
            .iter()
            .filter(|(port, _)| *port == addr.port())
            .map(|(_, c)| c)
            .collect();
        assert!(!from_snag.is_empty(), "{comments:?}");
        assert!(
            from_snag
                .iter()
                .all(|c| *c == "snag: limit_data_downstream"),
            "{comments:?}"
        );
        let segs = segments(&path);
        let hello = segs
            .iter()
            .find(|s| s.src == addr && s.payload == b"hello")
            .expect("the echo of hello");
        assert_eq!(hello.comment, None);
        let hits = &proxy.counters().snapshot().fault_hits;
        assert_eq!(
            hits.iter().collect::<Vec<_>>(),
            [(&"limit_data_downstream".to_string(), &1)]
        );
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test]
async fn http_faults_name_the_packets_they_touched_and_count_what_they_hit() {
    within(30, async {
        let (dir, path, capture) = capture_in("capture-http-hits", "hits.pcapng");
        let (backend, _) = common::http_backend("a body of some length").await;
        let mut context = RunContext::new(1);
        context.capture = Some(capture.clone());
        let mut config = common::config(
            "web",
            backend,
            &[
                "http_delay:delay=0",
                "bad_body:mode=truncate,bytes=6,scope=data",
                "http_status:status=503,scope=probe",
            ],
        );
        config.mode = snag::proxy::Mode::Http;
        let proxy = Proxy::new(config, context).unwrap();
        let listener = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Shutdown::new();
        let task = tokio::spawn(proxy::serve(listener, proxy.clone(), stop.clone()));
        for _ in 0..2 {
            let mut c = TcpStream::connect(addr).await.unwrap();
            c.write_all(b"GET /orders HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.unwrap();
            assert!(
                got.ends_with(b"\r\n\r\na body"),
                "{}",
                String::from_utf8_lossy(&got)
            );
        }
        assert_eq!(
            common::http(addr, "GET", "/healthz", "", &[]).await.status,
            503
        );
        stop.trigger();
        task.await.unwrap().unwrap();
        capture.close().unwrap();

        let comments = common::tshark_comments(&path);
        let from_snag = |name: &str| {
            comments
                .iter()
                .filter(|(port, c)| *port == addr.port() && c.contains(name))
                .count()
        };
        assert_eq!(from_snag("bad_body_downstream"), 2, "{comments:?}");
        assert_eq!(from_snag("http_status_downstream"), 1, "{comments:?}");
        assert_eq!(from_snag("http_delay"), 0, "{comments:?}");
        let hits = proxy.counters().snapshot().fault_hits;
        assert_eq!(hits.get("bad_body_downstream"), Some(&2), "{hits:?}");
        assert_eq!(hits.get("http_status_downstream"), Some(&1), "{hits:?}");
        assert_eq!(hits.get("http_delay_downstream"), None, "{hits:?}");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test]
async fn a_snap_length_keeps_the_start_of_each_packet_and_every_length() {
    within(60, async {
        let dir =
            std::env::temp_dir().join(format!("snag-test-{}-capture-snaplen", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let echo = echo_server().await;
        let path = dir.join("cut.pcapng");
        let (echo_at, file) = (echo.to_string(), path.to_str().unwrap().to_string());
        let args = [
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &echo_at,
            "--seed",
            "1",
            "--capture",
            &file,
            "--snaplen",
            "128",
        ];
        let (child, row) = start(&args, "127.0.0.1").await;
        let addr: SocketAddr = row.split_whitespace().nth(1).unwrap().parse().unwrap();
        // Enough for reads of many segments each on the unfaulted path.
        let sent = pattern(300_000, 7);
        let back = common::round_trip(addr, &sent).await;
        assert_eq!(back, sent);
        interrupt(child).await;

        // tshark: every frame cut to 128 bytes, each direction of each leg carrying
        // every byte by its lengths, no gap or overlap in the sequence numbers, and
        // every IP header checksum right.
        let fields = common::tshark(
            &path,
            &[
                "-o",
                "ip.check_checksum:TRUE",
                "-T",
                "fields",
                "-e",
                "frame.cap_len",
                "-e",
                "tcp.len",
                "-e",
                "ip.src",
                "-e",
                "tcp.srcport",
                "-e",
                "tcp.dstport",
                "-e",
                "tcp.analysis.flags",
                "-e",
                "ip.checksum.status",
            ],
        );
        let mut carried: HashMap<(String, String), usize> = HashMap::new();
        for line in fields.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            assert!(f[0].parse::<usize>().unwrap() <= 128, "{line}");
            assert!(f[5].is_empty(), "tshark flagged a segment: {line}");
            assert_eq!(f[6], "1", "{line}");
            *carried
                .entry((f[3].to_string(), f[4].to_string()))
                .or_default() += f[1].parse::<usize>().unwrap();
        }
        let full: Vec<_> = carried.values().filter(|&&n| n == sent.len()).collect();
        assert_eq!(full.len(), 4, "{carried:?}");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}
