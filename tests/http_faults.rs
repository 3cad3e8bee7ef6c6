//! HTTP mode and its faults, observed by curl and by a backend that records what
//! reached it: neither is snag.

mod common;

use std::{io, net::SocketAddr, time::Duration};

use common::{curl, http, http_backend, within};
use snag::proxy::{Mode, RunContext};
use tokio::{io::AsyncReadExt, io::AsyncWriteExt, net::TcpStream, time::Instant};

async fn http_proxy(upstream: SocketAddr, faults: &[&str]) -> SocketAddr {
    let mut config = common::config("h", upstream, faults);
    config.mode = Mode::Http;
    common::serve(config, RunContext::new(1)).await.0
}

#[tokio::test]
async fn requests_pass_exactly_minus_hop_by_hop_headers() {
    within(10, async {
        let (backend, seen) = http_backend("hello").await;
        let proxy = http_proxy(backend, &[]).await;
        let reply = http(
            proxy,
            "POST",
            "/echo?x=1",
            "payload",
            &[
                ("Connection", "close, x-hop"),
                ("x-hop", "1"),
                ("x-end", "2"),
            ],
        )
        .await;
        assert_eq!((reply.status, reply.body.as_str()), (200, "payload"));
        assert_eq!(reply.header("x-instance"), Some("backend-a"));
        let got = seen.lock().unwrap()[0].clone();
        assert_eq!(
            (got.method.as_str(), got.path.as_str(), got.body.as_slice()),
            ("POST", "/echo?x=1", b"payload".as_slice())
        );
        let names: Vec<&str> = got.headers.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            names.contains(&"x-end") && !names.contains(&"x-hop"),
            "{names:?}"
        );
        assert_eq!(
            got.headers
                .iter()
                .find(|(k, _)| k == "host")
                .map(|(_, v)| v.as_str()),
            Some(proxy.to_string().as_str())
        );
        // Over cleartext HTTP/2 too, with curl as the client.
        let h2 = curl(&format!("http://{proxy}/"), &["--http2-prior-knowledge"]).await;
        assert_eq!(
            (h2.exit, h2.status, h2.version.as_str(), h2.body.as_slice()),
            (0, 200, "2", b"hello".as_slice()),
            "{}",
            h2.stderr
        );
    })
    .await;
}

#[tokio::test]
async fn http_status_answers_without_reaching_the_upstream() {
    within(10, async {
        let (backend, seen) = http_backend("hello").await;
        let proxy = http_proxy(backend, &["http_status:status=503"]).await;
        let got = curl(&format!("http://{proxy}/"), &[]).await;
        assert_eq!((got.exit, got.status), (0, 503), "{}", got.stderr);
        assert!(seen.lock().unwrap().is_empty());
    })
    .await;
}

#[tokio::test]
async fn truncate_and_wrong_length_give_a_200_with_a_body_error() {
    within(10, async {
        let (backend, _) = http_backend("0123456789abcdef").await;
        let proxy = http_proxy(backend, &["bad_body:mode=truncate,bytes=6"]).await;
        let got = curl(&format!("http://{proxy}/"), &[]).await;
        assert_eq!(
            (got.exit, got.status, got.body.as_slice()),
            (18, 200, b"012345".as_slice()),
            "{}",
            got.stderr
        );

        let proxy = http_proxy(backend, &["bad_body:mode=wrong_length,bytes=10"]).await;
        let got = curl(&format!("http://{proxy}/"), &[]).await;
        assert_eq!(
            (got.exit, got.status, got.body.as_slice()),
            (18, 200, b"0123456789abcdef".as_slice()),
            "{}",
            got.stderr
        );
        assert!(got.stderr.contains("10 bytes remaining"), "{}", got.stderr);
    })
    .await;
}

#[tokio::test]
async fn replace_empty_and_garbage_keep_the_status_and_change_the_body() {
    within(10, async {
        let (backend, _) = http_backend("{\"status\":\"ok\"}").await;
        let proxy = http_proxy(backend, &["bad_body:mode=replace,text=degraded"]).await;
        let got = curl(&format!("http://{proxy}/"), &[]).await;
        assert_eq!(
            (got.exit, got.status, got.body.as_slice()),
            (0, 200, b"degraded".as_slice())
        );
        let proxy = http_proxy(backend, &["bad_body:mode=empty"]).await;
        assert_eq!(curl(&format!("http://{proxy}/"), &[]).await.body, b"");
        let proxy = http_proxy(backend, &["bad_body:mode=garbage"]).await;
        let got = curl(&format!("http://{proxy}/"), &[]).await;
        assert_eq!((got.exit, got.status, got.body.len()), (0, 200, 15));
        assert_ne!(got.body, b"{\"status\":\"ok\"}");
    })
    .await;
}

#[tokio::test]
async fn a_probe_scoped_fault_leaves_data_alone_and_the_reverse() {
    within(10, async {
        let (backend, _) = http_backend("fine").await;
        let proxy = http_proxy(backend, &["http_status:status=503,scope=probe"]).await;
        assert_eq!(
            curl(&format!("http://{proxy}/healthz"), &[]).await.status,
            503
        );
        assert_eq!(
            curl(&format!("http://{proxy}/api/orders"), &[])
                .await
                .status,
            200
        );
        let proxy = http_proxy(backend, &["http_status:status=500,scope=data"]).await;
        assert_eq!(
            curl(&format!("http://{proxy}/health"), &[]).await.status,
            200
        );
        assert_eq!(
            curl(&format!("http://{proxy}/api/orders"), &[])
                .await
                .status,
            500
        );
    })
    .await;
}

/// `nghttp -v ARGS`: the HEADERS, DATA and RST_STREAM frames it received, in order,
/// and its whole log.
async fn nghttp(args: &[&str]) -> (Vec<String>, String) {
    let out = tokio::process::Command::new("nghttp")
        .arg("-v")
        .args(args)
        .output()
        .await
        .expect("nghttp is installed (scripts/install-deps.sh)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let frames = text
        .lines()
        .filter_map(|l| l.split("recv ").nth(1)?.split(" frame").next())
        .filter(|f| matches!(*f, "HEADERS" | "DATA" | "RST_STREAM"))
        .map(String::from)
        .collect();
    (frames, text)
}

#[tokio::test]
async fn reset_mid_response_sends_the_head_and_part_of_the_body_then_rst() {
    within(10, async {
        let (backend, _) = http_backend("0123456789abcdef").await;
        let proxy = http_proxy(backend, &["reset_mid_response:bytes=4"]).await;
        let got = curl(&format!("http://{proxy}/"), &[]).await;
        assert_eq!((got.exit, got.status), (56, 200), "{}", got.stderr);
        assert!(got.stderr.contains("reset"), "{}", got.stderr);
        assert!(b"0123".starts_with(&got.body), "{:?}", got.body);
        // Over HTTP/2 the same fault resets the one stream, after its head and first
        // bytes: the frames in the order nghttp received them. (curl's status for a
        // stream reset right after its head is racy on a busy host: it can drop the
        // head it had not yet handed to the transfer.)
        let (frames, text) = nghttp(&[&format!("http://{proxy}/")]).await;
        assert_eq!(frames, ["HEADERS", "DATA", "RST_STREAM"], "{text}");
        assert!(text.contains("error_code=INTERNAL_ERROR"), "{text}");
    })
    .await;
}

#[tokio::test]
async fn refused_stream_resets_http2_streams_with_refused_stream_before_the_upstream() {
    within(10, async {
        let (backend, seen) = http_backend("hello").await;
        let mut config = common::config("h", backend, &["refused_stream:toxicity=1"]);
        config.mode = Mode::Http;
        let (proxy, snag) = common::serve(config, RunContext::new(1)).await;
        // nghttp sees only the RST_STREAM, with REFUSED_STREAM, on each of its streams.
        let (frames, text) = nghttp(&[
            "-n",
            &format!("http://{proxy}/a"),
            &format!("http://{proxy}/b"),
        ])
        .await;
        assert_eq!(frames, ["RST_STREAM", "RST_STREAM"], "{text}");
        assert_eq!(
            text.matches("error_code=REFUSED_STREAM(0x07)").count(),
            2,
            "{text}"
        );
        assert!(
            seen.lock().unwrap().is_empty(),
            "nothing reached the upstream"
        );
        assert_eq!(snag.counters().snapshot().streams_refused, 2);
        // HTTP/1.1 has no stream to refuse: it passes, and is not counted as hit.
        let h1 = curl(&format!("http://{proxy}/"), &[]).await;
        assert_eq!((h1.status, h1.body.as_slice()), (200, b"hello".as_slice()));
        assert_eq!(
            snag.counters()
                .snapshot()
                .fault_hits
                .get("refused_stream_downstream"),
            Some(&2)
        );
    })
    .await;
}

/// Reads one HTTP/1.1 response (Content-Length body) from `c`: its head, lower case.
async fn response_head(c: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(
            c.read(&mut byte).await.unwrap(),
            1,
            "closed mid-head: {got:?}"
        );
        got.push(byte[0]);
    }
    let head = String::from_utf8(got).unwrap().to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |n| n.trim().parse().unwrap());
    let mut body = vec![0; len];
    c.read_exact(&mut body).await.unwrap();
    head
}

#[tokio::test]
async fn keepalive_close_ends_keep_alive_on_the_nth_response_or_when_idle() {
    within(10, async {
        let (backend, seen) = http_backend("hello").await;
        // Every 2nd response of a connection says close, and the connection ends.
        let proxy = http_proxy(backend, &["keepalive_close:every=2"]).await;
        let mut c = TcpStream::connect(proxy).await.unwrap();
        let request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        c.write_all(request).await.unwrap();
        assert!(!response_head(&mut c).await.contains("connection: close"));
        c.write_all(request).await.unwrap();
        assert!(response_head(&mut c).await.contains("connection: close"));
        assert_eq!(c.read(&mut [0; 16]).await.unwrap(), 0, "FIN after the 2nd");
        assert_eq!(seen.lock().unwrap().len(), 2);

        // Idle 300 ms after a response: the connection is closed (FIN), not before.
        let proxy = http_proxy(backend, &["keepalive_close:every=0,idle=300"]).await;
        let mut c = TcpStream::connect(proxy).await.unwrap();
        c.write_all(request).await.unwrap();
        response_head(&mut c).await;
        let t = Instant::now();
        assert_eq!(c.read(&mut [0; 16]).await.unwrap(), 0, "FIN when idle");
        assert!(
            t.elapsed() >= Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
        // A request sent as it closes meets a closed connection: the client's error.
        let write = c.write_all(request).await;
        let read = c.read(&mut [0; 16]).await;
        assert!(
            write.is_err() || !matches!(read, Ok(n) if n > 0),
            "{write:?} {read:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn drop_request_forwards_nothing_and_resets_after_its_timeout() {
    within(10, async {
        let (backend, seen) = http_backend("hello").await;
        let proxy = http_proxy(backend, &["drop_request:timeout=300"]).await;
        let t = Instant::now();
        let mut c = TcpStream::connect(proxy).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let err = c.read(&mut [0; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        assert!(seen.lock().unwrap().is_empty());
    })
    .await;
}

#[tokio::test]
async fn http_delay_holds_the_head_or_the_body() {
    within(10, async {
        let (backend, _) = http_backend("hello").await;
        for spec in [
            "http_delay:delay=200",
            "http_delay:delay=200,at=body",
            "http_delay:delay=200,at=chunk",
        ] {
            let proxy = http_proxy(backend, &[spec]).await;
            let t = Instant::now();
            let got = curl(&format!("http://{proxy}/"), &[]).await;
            assert_eq!(
                (got.exit, got.status, got.body.as_slice()),
                (0, 200, b"hello".as_slice())
            );
            assert!(
                t.elapsed() >= Duration::from_millis(200),
                "{spec}: {:?}",
                t.elapsed()
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_dead_upstream_is_a_502_and_malformed_requests_a_400() {
    within(10, async {
        let (dead, _held) = common::refusing_port();
        let proxy = http_proxy(dead, &[]).await;
        let got = curl(&format!("http://{proxy}/"), &[]).await;
        assert_eq!(got.status, 502);
        assert!(
            String::from_utf8_lossy(&got.body).contains("snag: upstream"),
            "{:?}",
            got.body
        );

        let (backend, seen) = http_backend("hello").await;
        let proxy = http_proxy(backend, &[]).await;
        let mut c = TcpStream::connect(proxy).await.unwrap();
        c.write_all(b"THIS IS NOT HTTP\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).await.unwrap();
        assert!(
            answer.starts_with(b"HTTP/1.1 400"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        assert!(seen.lock().unwrap().is_empty());
    })
    .await;
}

#[test]
fn tcp_faults_that_would_break_http_are_refused_with_the_reason() {
    let (code, _, stderr) = common::process::output(&[
        "proxy",
        "--mode",
        "http",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "127.0.0.1:1",
        "--fault",
        "limit_data:bytes=5",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("limit_data_downstream")
            && stderr.contains("mode http")
            && stderr.contains("bad_body"),
        "{stderr}"
    );
    let bad: Result<snag::fault::Fault, _> = "latency:latency=5,scope=sometimes".parse();
    assert!(
        bad.unwrap_err()
            .contains("scope `sometimes` is not any, data or probe")
    );
}

#[tokio::test]
async fn stats_and_events_files_record_probes_faults_and_requests() {
    within(20, async {
        let (backend, _) = http_backend("ok").await;
        let dir = std::env::temp_dir().join(format!("snag-test-{}-files", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (stats, events) = (dir.join("stats.json"), dir.join("events.jsonl"));
        let mut command = common::process::snag(&[
            "proxy",
            "--mode",
            "http",
            "--name",
            "web",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &backend.to_string(),
            "--seed",
            "1",
            "--fault",
            "http_status:status=503,scope=probe",
            "--id-header",
            "X-Txn",
            "--instance",
            "backend-a",
        ]);
        command
            .arg("--stats")
            .arg(&stats)
            .arg("--events")
            .arg(&events);
        let mut snag = common::process::Process::spawn(command);
        // The table's row names the bound address: ready once printed.
        let addr: SocketAddr = snag
            .line(10, |l| {
                l.strip_prefix("web ")?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
            .await;
        assert_eq!(http(addr, "GET", "/healthz", "", &[]).await.status, 503);
        let txn = [("x-txn", "a"), ("x-request-id", "b")];
        assert_eq!(
            http(addr, "GET", "/orders", "", &txn[..1]).await.status,
            200
        );
        assert_eq!(http(addr, "GET", "/orders", "", &txn).await.status, 200);
        snag.signal(nix::sys::signal::Signal::SIGINT);
        let status = snag.exit(10).await;
        assert!(status.success(), "{status:?}");

        let stats: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        let web = &stats["web"];
        assert_eq!(
            (
                web["requests"]["probe"].clone(),
                web["requests"]["data"].clone()
            ),
            (1.into(), 2.into())
        );
        assert_eq!(web["responses"]["5xx"], 1);
        assert_eq!(web["duplicates"], serde_json::json!({"a": 2}));
        assert_eq!(
            (
                web["instances"]["backend-a"].clone(),
                web["instance_disagreements"].clone()
            ),
            (2.into(), 0.into())
        );
        assert_eq!(web["probes"][0]["status"], 503);
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&events)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // A client's last connection may still be closing when the signal lands: the
        // shutdown's own events are then logged too, and are not what is checked here.
        let kinds: Vec<&str> = lines
            .iter()
            .map(|l| l["event"].as_str().unwrap())
            .filter(|k| !k.starts_with("shutdown"))
            .collect();
        assert_eq!(kinds, ["fault_added", "probe"], "{lines:?}");
        assert_eq!(
            (lines[1]["path"].clone(), lines[1]["status"].clone()),
            ("/healthz".into(), 503.into())
        );
        assert!(lines[1]["unix_ms"].as_u64().unwrap() > 1_700_000_000_000);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test]
async fn a_user_agent_rule_makes_a_probe_of_any_path() {
    within(10, async {
        let (backend, _) = http_backend("ok").await;
        let mut config = common::config("h", backend, &["http_status:status=503,scope=probe"]);
        config.mode = Mode::Http;
        config
            .probe
            .headers
            .insert("user-agent".into(), "kube-probe".into());
        let (addr, _) = common::serve(config, RunContext::new(1)).await;
        assert_eq!(
            curl(&format!("http://{addr}/"), &["-A", "kube-probe/1.29"])
                .await
                .status,
            503
        );
        assert_eq!(curl(&format!("http://{addr}/"), &[]).await.status, 200);
    })
    .await;
}

#[tokio::test]
async fn a_hyper_h2_client_sees_the_answer_and_a_truncation_as_a_body_error() {
    use http_body_util::{BodyExt, Empty};
    use hyper_util::{client::legacy::Client, rt::TokioExecutor};
    within(10, async {
        let (backend, _) = http_backend("0123456789abcdef").await;
        let client = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build_http::<Empty<bytes::Bytes>>();
        let proxy = http_proxy(backend, &[]).await;
        let res = client
            .get(format!("http://{proxy}/").parse().unwrap())
            .await
            .unwrap();
        assert_eq!(
            (res.status().as_u16(), res.version()),
            (200, hyper::Version::HTTP_2)
        );
        assert_eq!(
            res.into_body().collect().await.unwrap().to_bytes(),
            "0123456789abcdef"
        );

        let proxy = http_proxy(backend, &["bad_body:mode=truncate,bytes=4"]).await;
        let res = client
            .get(format!("http://{proxy}/").parse().unwrap())
            .await
            .unwrap();
        assert_eq!(res.status().as_u16(), 200);
        assert!(
            res.into_body().collect().await.is_err(),
            "a truncated h2 body must fail"
        );
    })
    .await;
}
