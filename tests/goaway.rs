//! The `goaway` fault on the wire, seen by nghttp (nghttp2's client, not snag): the
//! GOAWAY frames with their last-stream-id and code, the PING of the two-step, what
//! was answered, and the backend's own count of what reached it. And what counts as
//! a transaction when a client cuts its stream, as hyper's does after a GOAWAY.

mod common;

use std::net::SocketAddr;

use common::{http_backend, within};
use snag::proxy::{Mode, RunContext};

async fn proxy(
    upstream: SocketAddr,
    fault: &str,
) -> (SocketAddr, std::sync::Arc<snag::proxy::Proxy>) {
    let mut config = common::config("g", upstream, &[fault]);
    config.mode = Mode::Http;
    common::serve(config, RunContext::new(1)).await
}

/// nghttp with five concurrent streams (ids 1 to 9) on one connection to `url`:
/// its log.
async fn five_streams(url: &str) -> String {
    let out = tokio::process::Command::new("nghttp")
        .args(["-v", "-n", "--no-dep", "-m", "5", "-t", "10", url])
        .output()
        .await
        .expect("nghttp is installed (scripts/install-deps.sh)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The GOAWAYs nghttp received: (last_stream_id, error code name).
fn goaways(log: &str) -> Vec<(u32, String)> {
    let lines: Vec<&str> = log.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0].contains("recv GOAWAY frame"))
        .filter_map(|w| {
            let rest = w[1].split("(last_stream_id=").nth(1)?;
            let (id, rest) = rest.split_once(", error_code=")?;
            Some((id.parse().ok()?, rest.split('(').next()?.to_string()))
        })
        .collect()
}

/// The streams nghttp got a response head on.
fn answered(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("recv (stream_id=") && l.contains(":status: 200"))
        .count()
}

#[tokio::test]
async fn current_lets_the_nth_stream_in_and_declares_the_later_ones_unprocessed() {
    within(20, async {
        let (backend, seen) = http_backend("hello").await;
        let (addr, snag) = proxy(backend, "goaway:after_streams=3,last_stream=current").await;
        let log = five_streams(&format!("http://{addr}/")).await;
        assert_eq!(goaways(&log), [(5, "NO_ERROR".to_string())], "{log}");
        assert_eq!(answered(&log), 3, "{log}");
        assert_eq!(
            seen.lock().unwrap().len(),
            3,
            "streams 7 and 9 never reached it"
        );
        let stats = snag.counters().snapshot();
        assert_eq!((stats.goaways, stats.streams_unprocessed), (1, 2));
        // It hit one connection: streams 7 and 9 found its GOAWAY under way.
        assert_eq!(
            stats.fault_hits.get("goaway_downstream"),
            Some(&1),
            "{:?}",
            stats.fault_hits
        );
    })
    .await;
}

#[tokio::test]
async fn below_inflight_declares_streams_the_client_already_sent_unprocessed() {
    within(20, async {
        let (backend, seen) = http_backend("hello").await;
        let (addr, snag) = proxy(
            backend,
            "goaway:after_streams=3,last_stream=below_inflight,error_code=11",
        )
        .await;
        let log = five_streams(&format!("http://{addr}/")).await;
        assert_eq!(
            goaways(&log),
            [(3, "ENHANCE_YOUR_CALM".to_string())],
            "{log}"
        );
        assert_eq!(answered(&log), 2, "{log}");
        // The upstream's own count: nothing above the last-stream-id reached it.
        assert_eq!(seen.lock().unwrap().len(), 2);
        assert_eq!(snag.counters().snapshot().streams_unprocessed, 3);
    })
    .await;
}

#[tokio::test]
async fn graceful_is_the_two_step_with_a_ping_and_loses_nothing() {
    within(20, async {
        let (backend, seen) = http_backend("hello").await;
        let (addr, _) = proxy(backend, "goaway:after_streams=1").await;
        // Responses that take 300 ms: the PING comes back while they are open.
        let log = five_streams(&format!("http://{addr}/slow?ms=300")).await;
        let got = goaways(&log);
        assert_eq!(got.len(), 2, "{log}");
        assert_eq!(got[0], (2147483647, "NO_ERROR".to_string()), "{log}");
        assert!(got[1].0 >= 1 && got[1].0 <= 9, "{log}");
        assert!(log.contains("recv PING frame"), "{log}");
        assert!(log.contains("send PING frame"), "nghttp answered it: {log}");
        // Every stream at or below the final last-stream-id was answered.
        assert_eq!(answered(&log), (got[1].0 as usize).div_ceil(2), "{log}");
        assert_eq!(seen.lock().unwrap().len(), answered(&log));
    })
    .await;
}

#[tokio::test]
async fn with_open_streams_closes_without_end_stream() {
    within(20, async {
        let (backend, seen) = http_backend("hello").await;
        let (addr, _) = proxy(
            backend,
            "goaway:after_streams=1,last_stream=current,close=with_open_streams,error_code=2",
        )
        .await;
        // A response that takes 2 s: the connection closes under it.
        let log = five_streams(&format!("http://{addr}/slow?ms=2000")).await;
        assert_eq!(goaways(&log), [(1, "INTERNAL_ERROR".to_string())], "{log}");
        assert_eq!(answered(&log), 0, "{log}");
        assert_eq!(seen.lock().unwrap().len(), 1, "stream 1 was processed");
    })
    .await;
}

/// A backend that answers each whole request `200 ok`, and counts the reads that
/// left a request's head there without all of its body.
async fn counting_backend() -> (SocketAddr, tokio::sync::watch::Receiver<usize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (partial, seen) = tokio::sync::watch::channel(0);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let partial = partial.clone();
            tokio::spawn(async move {
                let (mut buf, mut chunk) = (Vec::new(), [0; 4096]);
                while let Ok(n @ 1..) = stream.read(&mut chunk).await {
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if buf.len() < end + 4 + length {
                            partial.send_modify(|n| *n += 1);
                            break;
                        }
                        buf.drain(..end + 4 + length);
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn a_post_the_client_cut_before_its_body_ended_is_no_transaction() {
    within(20, async {
        let (backend, mut partial) = counting_backend().await;
        let mut config = common::config("g", backend, &[]);
        config.mode = Mode::Http;
        let (addr, snag) = common::serve(config, RunContext::new(1)).await;
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        let post = || {
            hyper::Request::post(format!("http://{addr}/orders"))
                .header("x-request-id", "t-1")
                .header("content-length", "5")
                .body(())
                .unwrap()
        };
        // The head and part of the body, then RST_STREAM CANCEL once the head has
        // reached the backend: what hyper's client does to a request it reports
        // failed when a GOAWAY arrives just after it was sent.
        let mut client = client.ready().await.unwrap();
        let (_, mut body) = client.send_request(post(), false).unwrap();
        body.send_data(bytes::Bytes::from_static(b"ord"), false)
            .unwrap();
        partial.wait_for(|n| *n >= 1).await.unwrap();
        body.send_reset(h2::Reason::CANCEL);
        // The same transaction, whole, twice.
        for expected in [serde_json::json!({}), serde_json::json!({"t-1": 2})] {
            let mut client = client.clone().ready().await.unwrap();
            let (response, mut body) = client.send_request(post(), false).unwrap();
            body.send_data(bytes::Bytes::from_static(b"order"), true)
                .unwrap();
            assert_eq!(response.await.unwrap().status(), 200);
            let duplicates = serde_json::to_value(snag.counters().snapshot().duplicates).unwrap();
            assert_eq!(duplicates, expected, "the cut request is not one");
        }
    })
    .await;
}
