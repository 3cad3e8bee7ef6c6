//! TCP faults in HTTP mode: latency, bandwidth, slicer and reset_peer on the client
//! leg's bytes, under HTTP/1.1 and HTTP/2, and the HTTP faults' FIN and RST through
//! them. Observers: curl, raw sockets, a backend that records what reached it, and
//! tshark on the capture.

mod common;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use common::{curl, http_backend, within};
use snag::{
    capture::{Capture, Settings},
    proxy::{Mode, Proxy, RunContext},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::Instant,
};

async fn http_proxy(upstream: SocketAddr, faults: &[&str]) -> (SocketAddr, Arc<Proxy>) {
    http_proxy_in(upstream, faults, RunContext::new(1)).await
}

async fn http_proxy_in(
    upstream: SocketAddr,
    faults: &[&str],
    context: RunContext,
) -> (SocketAddr, Arc<Proxy>) {
    let mut config = common::config("h", upstream, faults);
    config.mode = Mode::Http;
    common::serve(config, context).await
}

/// Sends one HTTP/1.1 request on a new connection and reads until the server closes
/// or resets: the bytes, and whether it ended in a reset.
async fn raw(addr: SocketAddr, path: &str) -> (Vec<u8>, bool) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    loop {
        match c.read(&mut buf).await {
            Ok(0) => return (got, false),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (got, true),
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn latency_delays_answers_over_http1_and_http2_and_counts_the_connections_it_hit() {
    within(20, async {
        let (backend, _) = http_backend("hello").await;
        let (proxy, snag) = http_proxy(backend, &["latency:latency=200"]).await;
        for extra in [&[][..], &["--http2-prior-knowledge"][..]] {
            let started = Instant::now();
            let got = curl(&format!("http://{proxy}/"), extra).await;
            assert_eq!(
                (got.exit, got.status, got.body.as_slice()),
                (0, 200, b"hello".as_slice()),
                "{extra:?}: {}",
                got.stderr
            );
            assert!(
                started.elapsed() >= Duration::from_millis(200),
                "{extra:?}: {:?}",
                started.elapsed()
            );
        }
        let stats = snag.counters().snapshot();
        assert_eq!(stats.fault_hits.get("latency_downstream"), Some(&2));
        // Removed, it acts on nothing new; added again through the proxy, it acts on
        // the connections that follow.
        snag.remove_fault("latency_downstream").unwrap();
        assert_eq!(curl(&format!("http://{proxy}/"), &[]).await.status, 200);
        snag.add_fault("latency:latency=150".parse().unwrap())
            .unwrap();
        let started = Instant::now();
        assert_eq!(curl(&format!("http://{proxy}/"), &[]).await.status, 200);
        assert!(started.elapsed() >= Duration::from_millis(150));
    })
    .await;
}

#[tokio::test]
async fn slicer_and_bandwidth_pace_the_bytes_of_an_answer() {
    within(20, async {
        let (backend, _) = http_backend("hello").await;
        // One byte a millisecond: the head and body (over 100 bytes) take 100 ms.
        let (proxy, _) = http_proxy(
            backend,
            &["slicer:average_size=1,size_variation=0,delay=1000"],
        )
        .await;
        let started = Instant::now();
        let (got, reset) = raw(proxy, "/").await;
        assert!(!reset && got.ends_with(b"hello"), "{got:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(got.len() as u64 - 1),
            "{} bytes in {:?}",
            got.len(),
            started.elapsed()
        );
        // 1 KB/s: the request (about 40 bytes) takes 40 ms to reach hyper.
        let (proxy, _) = http_proxy(backend, &["bandwidth:rate=1,stream=upstream"]).await;
        let started = Instant::now();
        let (got, _) = raw(proxy, "/").await;
        assert!(got.ends_with(b"hello"), "{got:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(30),
            "{:?}",
            started.elapsed()
        );
    })
    .await;
}

#[tokio::test]
async fn reset_peer_resets_the_client_before_its_request_reaches_the_upstream() {
    within(20, async {
        let (backend, seen) = http_backend("hello").await;
        let (proxy, snag) = http_proxy(backend, &["reset_peer:timeout=50,stream=upstream"]).await;
        let started = Instant::now();
        let (got, reset) = raw(proxy, "/").await;
        assert!(reset && got.is_empty(), "{got:?}");
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(seen.lock().unwrap().is_empty(), "nothing reached it");
        let stats = snag.counters().snapshot();
        assert_eq!(stats.fault_resets, 1);
        assert_eq!(stats.fault_hits.get("reset_peer_upstream"), Some(&1));
    })
    .await;
}

#[tokio::test]
async fn http_faults_close_and_reset_through_a_delayed_client_leg() {
    within(20, async {
        let (backend, _) = http_backend("hello").await;
        // A truncated body is a short body and a FIN, after the latency.
        let (proxy, _) = http_proxy(
            backend,
            &["latency:latency=100", "bad_body:mode=truncate,bytes=3"],
        )
        .await;
        let started = Instant::now();
        let (got, reset) = raw(proxy, "/").await;
        assert!(!reset, "a FIN, not a reset");
        assert!(
            got.starts_with(b"HTTP/1.1 200") && got.ends_with(b"\r\n\r\nhel"),
            "{}",
            String::from_utf8_lossy(&got)
        );
        assert!(started.elapsed() >= Duration::from_millis(100));
        // A reset mid-response is an RST once the bytes before it have gone.
        let (proxy, _) = http_proxy(
            backend,
            &["latency:latency=100", "reset_mid_response:bytes=3"],
        )
        .await;
        let (got, reset) = raw(proxy, "/").await;
        assert!(reset, "{}", String::from_utf8_lossy(&got));
        // And over HTTP/2 the same cut is an RST_STREAM: curl sees the stream fail.
        let h2 = curl(&format!("http://{proxy}/"), &["--http2-prior-knowledge"]).await;
        assert_ne!(h2.exit, 0, "{}", h2.stderr);
    })
    .await;
}

#[tokio::test]
async fn the_relay_captures_the_client_leg_as_it_left_with_both_kinds_of_comment() {
    within(30, async {
        let dir = std::env::temp_dir().join(format!("snag-test-{}-http-bytes", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bytes.pcapng");
        let capture = Arc::new(
            Capture::create(Settings {
                path: path.clone(),
                max_bytes: None,
                snaplen: 0,
            })
            .unwrap(),
        );
        let mut context = RunContext::new(1);
        context.capture = Some(capture.clone());
        let (backend, _) = http_backend("hello").await;
        let mut config = common::config(
            "h",
            backend,
            &["latency:latency=20", "http_status:status=503"],
        );
        config.mode = Mode::Http;
        let snag = Proxy::new(config, context).unwrap();
        let listener = snag::proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let proxy = listener.local_addr().unwrap();
        let stop = snag::shutdown::Shutdown::new();
        let task = tokio::spawn(snag::proxy::serve(listener, snag, stop.clone()));
        let (got, _) = raw(proxy, "/").await;
        assert!(got.starts_with(b"HTTP/1.1 503"), "{got:?}");
        stop.trigger();
        task.await.unwrap().unwrap();
        capture.close().unwrap();
        let comments = common::tshark_comments(&path);
        let (port, answer) = comments
            .iter()
            .find(|(_, c)| c.contains("http_status_downstream"))
            .unwrap_or_else(|| panic!("{comments:?}"));
        assert_eq!(*port, proxy.port(), "{comments:?}");
        assert!(answer.contains("latency_downstream"), "{comments:?}");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}
