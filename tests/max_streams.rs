//! `max_streams` on the wire: nghttp (nghttp2's client) receives snag's SETTINGS in
//! the middle of a connection, acknowledges it, and the connection goes on; hyper's
//! h2 client (not snag's code) obeys it, sending one stream at a time.

mod common;

use std::{net::SocketAddr, time::Duration};

use common::{http_backend, within};
use snag::proxy::{Mode, RunContext};

async fn proxy(
    upstream: SocketAddr,
    fault: &str,
) -> (SocketAddr, std::sync::Arc<snag::proxy::Proxy>) {
    let mut config = common::config("m", upstream, &[fault]);
    config.mode = Mode::Http;
    common::serve(config, RunContext::new(1)).await
}

/// The values of MAX_CONCURRENT_STREAMS in the SETTINGS frames nghttp received, in
/// order.
fn max_streams_received(log: &str) -> Vec<u32> {
    let mut values = Vec::new();
    let mut in_recv_settings = false;
    for line in log.lines() {
        if line.contains("] recv ") || line.contains("] send ") {
            in_recv_settings = line.contains("recv SETTINGS frame");
        } else if in_recv_settings
            && let Some(v) = line
                .trim()
                .strip_prefix("[SETTINGS_MAX_CONCURRENT_STREAMS(0x03):")
        {
            values.push(v.trim_end_matches(']').parse().unwrap());
        }
    }
    values
}

#[tokio::test]
async fn nghttp_gets_the_lowered_limit_mid_connection_and_the_connection_goes_on() {
    within(20, async {
        let (backend, seen) = http_backend("hello").await;
        let (addr, snag) = proxy(backend, "max_streams:value=1,after_streams=2").await;
        let out = tokio::process::Command::new("nghttp")
            .args(["-v", "-n", "--no-dep", "-m", "5", "-t", "10"])
            // Slow answers: nghttp acknowledges SETTINGS as it reads them, but
            // one read holding the answers too ends it before it sends the ack.
            // snag writes its SETTINGS while hyper waits on the backend.
            .arg(format!("http://{addr}/slow?ms=200"))
            .output()
            .await
            .expect("nghttp is installed (scripts/install-deps.sh)");
        let log = String::from_utf8_lossy(&out.stdout);
        // hyper's own SETTINGS first (200), then snag's.
        assert_eq!(max_streams_received(&log), [200, 1], "{log}");
        // nghttp acknowledged both; snag kept its acknowledgement from hyper, which
        // would have ended the connection with a PROTOCOL_ERROR GOAWAY.
        assert_eq!(
            log.matches("send SETTINGS frame <length=0, flags=0x01")
                .count(),
            2,
            "{log}"
        );
        assert!(!log.contains("recv GOAWAY"), "{log}");
        let answered = log
            .lines()
            .filter(|l| l.contains("recv (stream_id=") && l.contains(":status: 200"))
            .count();
        assert_eq!(answered, 5, "{log}");
        assert_eq!(seen.lock().unwrap().len(), 5);
        assert_eq!(snag.counters().snapshot().settings_sent, 1);
    })
    .await;
}

#[tokio::test]
async fn an_h2_client_that_obeys_it_sends_one_stream_at_a_time() {
    within(30, async {
        let (backend, seen) = http_backend("hello").await;
        let (addr, _snag) = proxy(backend, "max_streams:value=1").await;
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(connection);
        let get = |path: &str| {
            hyper::Request::get(format!("http://{addr}{path}"))
                .body(())
                .unwrap()
        };
        // The first stream makes snag send the SETTINGS, ahead of its answer.
        let (first, _) = client.send_request(get("/"), true).unwrap();
        let mut body = first.await.unwrap().into_body();
        while body.data().await.is_some() {}
        // Four slow streams at once: obeying a limit of one, the client opens each
        // only when the one before has ended.
        let start = tokio::time::Instant::now();
        let mut answers = Vec::new();
        for _ in 0..4 {
            client = client.ready().await.unwrap();
            let (answer, _) = client.send_request(get("/slow?ms=300"), true).unwrap();
            answers.push(tokio::spawn(async move {
                let mut body = answer.await.unwrap().into_body();
                while body.data().await.is_some() {}
            }));
        }
        for answer in answers {
            answer.await.unwrap();
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(4 * 300),
            "four 300 ms streams one after another take at least 1.2 s: {took:?}"
        );
        assert_eq!(seen.lock().unwrap().len(), 5);
    })
    .await;
}
