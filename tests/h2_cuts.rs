//! An HTTP/2 cut seen by nghttp (nghttp2's client, not snag): the frames a fault lets
//! through leave before the RST_STREAM that ends the stream. Twenty connections each,
//! because a reset that raced its own stream's HEADERS and DATA lost only some of the
//! time (16 of 20 connections once carried nothing but the RST_STREAM).

mod common;

use common::{http_backend, within};
use snag::{
    proxy::{Mode, RunContext},
    tls::ListenTls,
};

const BODY: &str = "0123456789abcdefghijklmnopqrstuvwxyz";

/// What nghttp received on stream 1, in order: `HEADERS`, `DATA <length>`,
/// `RST_STREAM <code>`.
fn frames(log: &str) -> Vec<String> {
    let lines: Vec<&str> = log.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.contains("stream_id=1>") || !line.contains(" recv ") {
            continue;
        }
        let length = || {
            line.split("<length=")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .unwrap_or("?")
                .to_string()
        };
        if line.contains("recv HEADERS frame") {
            out.push("HEADERS".to_string());
        } else if line.contains("recv DATA frame") {
            out.push(format!("DATA {}", length()));
        } else if line.contains("recv RST_STREAM frame") {
            let code = lines
                .get(i + 1)
                .and_then(|l| l.split("error_code=").nth(1))
                .and_then(|r| r.split('(').next())
                .unwrap_or("?");
            out.push(format!("RST_STREAM {code}"));
        }
    }
    out
}

/// Twenty nghttp connections through a proxy with `fault`, one request each, ten
/// in clear (h2c) and ten over TLS (where rustls buffers what hyper writes): the
/// frames each saw on its stream.
async fn twenty(fault: &str) -> Vec<Vec<String>> {
    let (backend, _) = http_backend(BODY).await;
    let mut config = common::config("c", backend, &[fault]);
    config.mode = Mode::Http;
    let (clear, _snag) = common::serve(config.clone(), RunContext::new(1)).await;
    let ca = std::env::temp_dir().join(format!("snag-h2-cuts-{}-{fault}.pem", std::process::id()));
    config.tls = Some(ListenTls::Generated {
        ca_out: ca.clone(),
        names: Vec::new(),
    });
    let (tls, _snag) = common::serve(config, RunContext::new(1)).await;
    let _ = std::fs::remove_file(&ca);
    let mut seen = Vec::new();
    for n in 0..20 {
        // nghttp does not verify the certificate: the CA is not needed here.
        let url = if n % 2 == 0 {
            format!("http://{clear}/")
        } else {
            format!("https://localhost:{}/", tls.port())
        };
        let out = tokio::process::Command::new("nghttp")
            .args(["-v", "-n", "--no-dep", "-t", "10"])
            .arg(url)
            .output()
            .await
            .expect("nghttp is installed (scripts/install-deps.sh)");
        seen.push(frames(&String::from_utf8_lossy(&out.stdout)));
    }
    seen
}

fn expect_all(seen: &[Vec<String>], expected: &[&str]) {
    for (n, frames) in seen.iter().enumerate() {
        assert_eq!(
            frames,
            expected,
            "connection {n} of {}: {seen:?}",
            seen.len()
        );
    }
}

#[tokio::test]
async fn truncate_sends_its_bytes_then_resets() {
    within(60, async {
        let seen = twenty("bad_body:mode=truncate,bytes=10").await;
        expect_all(&seen, &["HEADERS", "DATA 10", "RST_STREAM INTERNAL_ERROR"]);
    })
    .await;
}

#[tokio::test]
async fn truncate_to_nothing_still_sends_the_head() {
    within(60, async {
        let seen = twenty("bad_body:mode=truncate,bytes=0").await;
        expect_all(&seen, &["HEADERS", "RST_STREAM INTERNAL_ERROR"]);
    })
    .await;
}

#[tokio::test]
async fn wrong_length_sends_the_whole_body_then_resets() {
    within(60, async {
        let seen = twenty("bad_body:mode=wrong_length,bytes=100").await;
        let data = format!("DATA {}", BODY.len());
        expect_all(&seen, &["HEADERS", &data, "RST_STREAM INTERNAL_ERROR"]);
    })
    .await;
}

#[tokio::test]
async fn reset_mid_response_sends_its_bytes_then_resets() {
    within(60, async {
        let seen = twenty("reset_mid_response:bytes=7").await;
        expect_all(&seen, &["HEADERS", "DATA 7", "RST_STREAM INTERNAL_ERROR"]);
    })
    .await;
}
