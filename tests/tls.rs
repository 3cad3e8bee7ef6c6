//! TLS on both legs of HTTP mode and HTTP/2 to the upstream, observed by curl (ALPN,
//! certificate checks), tshark (a capture decrypted with the written keys), hyper as
//! an independent HTTP/2 client and server (trailers), and backends that record what
//! reached them.

mod common;

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use common::{curl, http_backend, within};
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Request, Response, Version, body::Frame, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use snag::{
    capture::{Capture, Settings},
    fault::config::{ProxyConfig, UpstreamProtocol},
    proxy::{self, Mode, Proxy, RunContext},
    shutdown::Shutdown,
    tls::{KeyLogFile, ListenTls, UpstreamTls},
};
use tokio::net::TcpListener;

fn scratch(test: &str) -> common::Scratch {
    common::Scratch::new(&format!("snag-tls-{test}"))
}

/// An HTTP proxy named `name` to `upstream`.
fn http_config(name: &str, upstream: SocketAddr) -> ProxyConfig {
    let mut config = common::config(name, upstream, &[]);
    config.mode = Mode::Http;
    config
}

/// TLS on the listener with a certificate made for the run; its CA goes to `ca`.
fn generated(ca: &Path) -> Option<ListenTls> {
    Some(ListenTls::Generated {
        ca_out: ca.to_path_buf(),
        names: vec!["snag.test".into()],
    })
}

fn trusting(ca: &Path) -> Option<UpstreamTls> {
    Some(UpstreamTls {
        ca: Some(ca.to_path_buf()),
        ..UpstreamTls::default()
    })
}

#[tokio::test]
async fn a_generated_certificate_serves_h2_and_http11_by_alpn_and_curl_checks_it() {
    within(20, async {
        let dir = scratch("alpn");
        let ca = dir.join("ca.pem");
        let (backend, seen) = http_backend("hello").await;
        let mut config = http_config("tls", backend);
        config.tls = generated(&ca);
        let (addr, proxy) = common::serve(config, RunContext::new(1)).await;
        let url = format!("https://127.0.0.1:{}/", addr.port());
        let ca_arg = ca.to_str().unwrap();

        let h2 = curl(&url, &["--cacert", ca_arg, "-v"]).await;
        assert_eq!(
            (h2.exit, h2.status, h2.version.as_str(), h2.body.as_slice()),
            (0, 200, "2", b"hello".as_slice()),
            "{}",
            h2.stderr
        );
        assert!(
            h2.stderr.contains("ALPN: server accepted h2"),
            "{}",
            h2.stderr
        );
        let h1 = curl(&url, &["--cacert", ca_arg, "--http1.1", "-v"]).await;
        assert_eq!(
            (h1.exit, h1.status, h1.version.as_str()),
            (0, 200, "1.1"),
            "{}",
            h1.stderr
        );
        assert!(
            h1.stderr.contains("ALPN: server accepted http/1.1"),
            "{}",
            h1.stderr
        );
        // The names it was made for, through curl's own resolver override.
        let named = curl(
            &format!("https://snag.test:{}/", addr.port()),
            &[
                "--cacert",
                ca_arg,
                "--resolve",
                &format!("snag.test:{}:127.0.0.1", addr.port()),
            ],
        )
        .await;
        assert_eq!((named.exit, named.status), (0, 200), "{}", named.stderr);
        assert_eq!(seen.lock().unwrap().len(), 3);

        // Not trusted without the CA: curl refuses (exit 60), nothing reaches the
        // backend, and snag counts the failed handshake.
        let untrusted = curl(&url, &[]).await;
        assert_eq!(untrusted.exit, 60, "{}", untrusted.stderr);
        // A client speaking plain HTTP to the TLS listener fails too.
        let plain = curl(&format!("http://127.0.0.1:{}/", addr.port()), &[]).await;
        assert_ne!(plain.exit, 0);
        common::until(5, "two TLS failures counted", || {
            proxy.counters().snapshot().tls_failures == 2
        })
        .await;
        assert_eq!(seen.lock().unwrap().len(), 3);
    })
    .await;
}

/// A second snag with TLS to the first: the upstream leg is HTTP/2 over TLS, and
/// the capture of it decrypts with the keys it carries, or with the key log.
#[tokio::test]
async fn h2_over_tls_to_the_upstream_is_captured_and_decrypts_by_itself_or_with_the_key_log() {
    within(30, async {
        let dir = scratch("h2");
        let ca = dir.join("ca.pem");
        let (backend, seen) = http_backend("hello").await;
        let mut front = http_config("front", backend);
        front.tls = generated(&ca);
        let (front_addr, front_proxy) = common::serve(front, RunContext::new(1)).await;

        let pcap = dir.join("leg.pcapng");
        let keys = dir.join("keys.log");
        let _ = std::fs::remove_file(&keys);
        let capture = Arc::new(
            Capture::create(Settings {
                path: pcap.clone(),
                max_bytes: None,
                snaplen: 0,
            })
            .unwrap(),
        );
        let mut context = RunContext::new(1);
        context.capture = Some(capture.clone());
        context.keylog = Some(KeyLogFile::open(&keys).unwrap());
        let mut config = http_config("edge", front_addr);
        config.upstream_protocol = UpstreamProtocol::H2;
        config.upstream_tls = trusting(&ca);
        let proxy = Proxy::new(config, context).unwrap();
        let listener = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Shutdown::new();
        let task = tokio::spawn(proxy::serve(listener, proxy.clone(), stop.clone()));

        for _ in 0..3 {
            let got = curl(&format!("http://{addr}/x"), &[]).await;
            assert_eq!(
                (got.exit, got.status, got.body.as_slice()),
                (0, 200, b"hello".as_slice()),
                "{}",
                got.stderr
            );
        }
        // One pooled HTTP/2 connection carried the three; the client's Host arrived
        // at the backend as it was sent.
        assert_eq!(front_proxy.counters().snapshot().connections, 1);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 3);
        let host = seen[0]
            .headers
            .iter()
            .find(|(k, _)| k == "host")
            .map(|(_, v)| v.clone());
        assert_eq!(host.as_deref(), Some(addr.to_string().as_str()));

        stop.trigger();
        task.await.unwrap().unwrap();
        capture.close().unwrap();
        let keylog = std::fs::read_to_string(&keys).unwrap();
        assert!(keylog.contains("CLIENT_TRAFFIC_SECRET_0 "), "{keylog}");

        // tshark reads HTTP/2 HEADERS on the leg to the front proxy, three requests
        // with :path /x: from the capture alone (it carries the keys as decryption
        // secrets blocks), and from the capture stripped of them with the key log.
        let paths = |pcap: &Path, keylog: Option<&Path>| {
            let mut tshark = std::process::Command::new("tshark");
            tshark.arg("-r").arg(pcap);
            if let Some(keys) = keylog {
                tshark.args(["-o", &format!("tls.keylog_file:{}", keys.display())]);
            }
            let out = tshark
                .args(["-d", &format!("tcp.port=={},tls", front_addr.port())])
                .args(["-Y", "http2", "-T", "fields", "-e", "http2.headers.path"])
                .output()
                .expect("tshark is installed (scripts/install-deps.sh)");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| l.trim().to_string())
                .collect::<Vec<_>>()
        };
        let x = vec!["/x".to_string(); 3];
        assert_eq!(paths(&pcap, None), x, "the capture decrypts by itself");
        let stripped = dir.join("stripped.pcapng");
        let out = std::process::Command::new("editcap")
            .arg("--discard-all-secrets")
            .arg(&pcap)
            .arg(&stripped)
            .output()
            .expect("editcap is installed with tshark");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(paths(&stripped, Some(&keys)), x, "the key log decrypts it");
        // Without either it is TLS only.
        assert!(paths(&stripped, None).is_empty());
    })
    .await;
}

/// What an h2-capable test server saw of each request.
#[derive(Debug, Clone)]
struct Heard {
    version: Version,
    body: Vec<u8>,
    trailers: Option<HeaderMap>,
}

/// An HTTP/1.1 and h2c server written with hyper (not snag): records each request
/// with its body and trailers, and answers `hello` with a `grpc-status: 0` trailer.
async fn h2_server() -> (SocketAddr, Arc<Mutex<Vec<Heard>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let log = heard.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let log = log.clone();
                    async move {
                        let version = req.version();
                        let collected = req.into_body().collect().await?;
                        let trailers = collected.trailers().cloned();
                        log.lock().unwrap().push(Heard {
                            version,
                            body: collected.to_bytes().to_vec(),
                            trailers,
                        });
                        let mut end = HeaderMap::new();
                        end.insert("grpc-status", "0".parse().unwrap());
                        Ok::<_, hyper::Error>(Response::new(Frames::new(b"hello", end)))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, heard)
}

/// A body of given frames (data, then trailers).
struct Frames(std::collections::VecDeque<Frame<Bytes>>);

impl Frames {
    fn new(data: &'static [u8], trailers: HeaderMap) -> Frames {
        Frames(
            [
                Frame::data(Bytes::from_static(data)),
                Frame::trailers(trailers),
            ]
            .into(),
        )
    }
}

impl hyper::body::Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// An h2c request from hyper's client with `body` and a trailer; the answer's body
/// and trailers.
async fn h2c_call(addr: SocketAddr, body: &'static [u8]) -> (Vec<u8>, Option<HeaderMap>) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut end = HeaderMap::new();
    end.insert("x-checksum", "abc".parse().unwrap());
    let req = Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/call"))
        .header("te", "trailers")
        .body(Frames::new(body, end))
        .unwrap();
    let reply = send.send_request(req).await.unwrap();
    assert_eq!(reply.status(), 200);
    let collected = reply.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    (collected.to_bytes().to_vec(), trailers)
}

#[tokio::test]
async fn h2c_to_the_upstream_carries_trailers_both_ways() {
    within(20, async {
        let (server, heard) = h2_server().await;
        let mut config = http_config("h2c", server);
        config.upstream_protocol = UpstreamProtocol::H2c;
        let (addr, _) = common::serve(config, RunContext::new(1)).await;
        let (body, trailers) = h2c_call(addr, b"ping").await;
        assert_eq!(body, b"hello");
        assert_eq!(
            trailers
                .as_ref()
                .and_then(|t| t.get("grpc-status"))
                .map(|v| v.to_str().unwrap()),
            Some("0")
        );
        let first = heard.lock().unwrap().clone();
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].version, Version::HTTP_2);
        assert_eq!(first[0].body, b"ping");
        assert_eq!(
            first[0]
                .trailers
                .as_ref()
                .and_then(|t| t.get("x-checksum"))
                .map(|v| v.to_str().unwrap()),
            Some("abc")
        );
        // An HTTP/1.1 client is carried over h2c as well.
        let got = curl(&format!("http://{addr}/"), &[]).await;
        assert_eq!(
            (got.exit, got.status, got.body.as_slice()),
            (0, 200, b"hello".as_slice())
        );
        let versions: Vec<Version> = heard.lock().unwrap().iter().map(|h| h.version).collect();
        assert_eq!(versions, [Version::HTTP_2, Version::HTTP_2]);
    })
    .await;
}

#[tokio::test]
async fn auto_in_clear_speaks_to_the_upstream_as_the_client_spoke() {
    within(20, async {
        let (server, heard) = h2_server().await;
        let mut config = http_config("auto", server);
        config.upstream_protocol = UpstreamProtocol::Auto;
        let (addr, _) = common::serve(config, RunContext::new(1)).await;
        let h1 = curl(&format!("http://{addr}/"), &[]).await;
        let h2 = curl(&format!("http://{addr}/"), &["--http2-prior-knowledge"]).await;
        assert_eq!(
            (h1.status, h2.status),
            (200, 200),
            "{} {}",
            h1.stderr,
            h2.stderr
        );
        let versions: Vec<Version> = heard.lock().unwrap().iter().map(|h| h.version).collect();
        assert_eq!(versions, [Version::HTTP_11, Version::HTTP_2]);
    })
    .await;
}

/// A TLS server (rustls, not snag) that speaks HTTP/1.1 only and answers every
/// request 200; by ALPN it agrees `http/1.1`, or (`alpn` false) takes no part.
async fn http11_only_tls(ca: &Path, alpn: bool) -> SocketAddr {
    let identity = snag::tls::Identity::generate(&[], ca).unwrap();
    let mut config = (*snag::tls::server(identity, None).unwrap()).clone();
    config.alpn_protocols = if alpn {
        vec![b"http/1.1".to_vec()]
    } else {
        Vec::new()
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = service_fn(|_req: Request<hyper::body::Incoming>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                        b"h1 only",
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn upstream_mismatches_are_502s_that_say_why() {
    within(20, async {
        let dir = scratch("mismatch");
        // h2 required, the upstream agrees http/1.1 only by ALPN.
        let ca = dir.join("h1-ca.pem");
        let h1_only = http11_only_tls(&ca, true).await;
        let mut config = http_config("alpn", h1_only);
        config.upstream_protocol = UpstreamProtocol::H2;
        config.upstream_tls = trusting(&ca);
        let (addr, proxy) = common::serve(config, RunContext::new(1)).await;
        let got = curl(&format!("http://{addr}/"), &[]).await;
        let text = String::from_utf8_lossy(&got.body);
        assert_eq!(got.status, 502, "{text}");
        // rustls refuses a client that offers only h2 with an alert; others (nginx
        // without http2) go on and choose nothing: both are said as such.
        assert!(
            text.contains("did not agree to h2 by ALPN (it refused it"),
            "{text}"
        );
        let no_alpn = http11_only_tls(&dir.join("no-alpn-ca.pem"), false).await;
        let mut config = http_config("no-alpn", no_alpn);
        config.upstream_protocol = UpstreamProtocol::H2;
        config.upstream_tls = trusting(&dir.join("no-alpn-ca.pem"));
        let (addr, _) = common::serve(config, RunContext::new(1)).await;
        let got = curl(&format!("http://{addr}/"), &[]).await;
        let text = String::from_utf8_lossy(&got.body);
        assert_eq!(got.status, 502, "{text}");
        assert!(
            text.contains("did not agree to h2 by ALPN (it chose none)"),
            "{text}"
        );
        assert_eq!(proxy.counters().snapshot().upstream_errors, 1);
        // auto takes what ALPN gave: HTTP/1.1 over TLS.
        let mut config = http_config("alpn-auto", h1_only);
        config.upstream_protocol = UpstreamProtocol::Auto;
        config.upstream_tls = trusting(&ca);
        let (addr, _) = common::serve(config, RunContext::new(1)).await;
        let got = curl(&format!("http://{addr}/"), &[]).await;
        assert_eq!(
            (got.status, got.body.as_slice()),
            (200, b"h1 only".as_slice())
        );

        // A certificate from a CA snag was not told to trust.
        let other = dir.join("other-ca.pem");
        snag::tls::Identity::generate(&[], &other).unwrap();
        let mut config = http_config("untrusted", h1_only);
        config.upstream_tls = trusting(&other);
        let (addr, _) = common::serve(config, RunContext::new(1)).await;
        let got = curl(&format!("http://{addr}/"), &[]).await;
        let text = String::from_utf8_lossy(&got.body);
        assert_eq!(got.status, 502, "{text}");
        // Signed by a CA of the same name: the signature does not hold.
        assert!(text.contains("invalid peer certificate"), "{text}");
        // The insecure switch accepts it.
        let mut config = http_config("insecure", h1_only);
        config.upstream_tls = Some(UpstreamTls {
            insecure: true,
            ..UpstreamTls::default()
        });
        let (addr, _) = common::serve(config, RunContext::new(1)).await;
        assert_eq!(curl(&format!("http://{addr}/"), &[]).await.status, 200);

        // h2c to an upstream that answers HTTP/1.1.
        let (backend, _) = http_backend("hello").await;
        let mut config = http_config("h2c", backend);
        config.upstream_protocol = UpstreamProtocol::H2c;
        let (addr, _) = common::serve(config, RunContext::new(1)).await;
        let got = curl(&format!("http://{addr}/"), &[]).await;
        let text = String::from_utf8_lossy(&got.body);
        assert_eq!(got.status, 502, "{text}");
        assert!(
            text.contains("answered HTTP/2's preface with HTTP/1.x"),
            "{text}"
        );
    })
    .await;
}

#[test]
fn settings_that_cannot_work_are_refused_when_the_proxy_is_made() {
    let dir = scratch("setup");
    let upstream: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let made = |config: ProxyConfig| {
        Proxy::new(config, RunContext::new(1))
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let mut config = http_config("k", upstream);
    config.tls = Some(ListenTls::Files {
        cert: dir.join("nope.pem"),
        key: dir.join("nope.key"),
    });
    let err = made(config).unwrap_err();
    assert!(err.contains("nope.pem: cannot read"), "{err}");
    let mut config = http_config("h2", upstream);
    config.upstream_protocol = UpstreamProtocol::H2;
    assert!(made(config).unwrap_err().contains("needs upstream TLS"));
    let mut config = common::config("tcp", upstream, &[]);
    config.upstream_tls = Some(UpstreamTls::default());
    assert!(made(config).unwrap_err().contains("need mode http"));
}

#[tokio::test]
async fn the_api_sets_up_tls_with_files_confined_to_its_directory() {
    within(20, async {
        let dir = scratch("api");
        let (backend, _) = http_backend("hello").await;
        let api = common::spawn_api(
            snag::api::Settings {
                files: Some(dir.to_path_buf()),
                ..snag::api::Settings::default()
            },
            None,
        )
        .await;
        // A TLS front with a certificate made for the run, its CA in the directory.
        let body = serde_json::json!({
            "name": "front", "listen": "127.0.0.1:0", "upstream": backend.to_string(),
            "mode": "http", "tls": { "generate": "front-ca.pem" },
        });
        let created = common::call(api, "POST", "/proxies", &body.to_string()).await;
        assert_eq!(created.status, 201, "{}", created.body);
        let front = common::json(&created);
        assert_eq!(front["tls"], true, "{front}");
        let front_addr: SocketAddr = front["listen"].as_str().unwrap().parse().unwrap();
        // A second proxy speaking h2 over TLS to it, trusting that CA by name.
        let body = serde_json::json!({
            "name": "edge", "listen": "127.0.0.1:0", "upstream": front_addr.to_string(),
            "mode": "http", "upstream_protocol": "h2", "upstream_tls": { "ca": "front-ca.pem" },
        });
        let created = common::call(api, "POST", "/proxies", &body.to_string()).await;
        assert_eq!(created.status, 201, "{}", created.body);
        let edge = common::json(&created);
        assert_eq!((edge["upstream_protocol"].as_str(), edge["upstream_tls"].as_bool()), (Some("h2"), Some(true)));
        let got = curl(&format!("http://{}/", edge["listen"].as_str().unwrap()), &[]).await;
        assert_eq!((got.status, got.body.as_slice()), (200, b"hello".as_slice()), "{}", got.stderr);
        let ca = dir.join("front-ca.pem");
        let direct = curl(&format!("https://{front_addr}/"), &["--cacert", ca.to_str().unwrap()]).await;
        assert_eq!((direct.status, direct.version.as_str()), (200, "2"), "{}", direct.stderr);

        // What cannot work is a 400 that says why.
        for (body, why) in [
            (serde_json::json!({ "name": "x1", "upstream": "127.0.0.1:9", "mode": "http", "tls": { "cert": "../etc/passwd", "key": "k.pem" } }), "not a plain relative name"),
            (serde_json::json!({ "name": "x2", "upstream": "127.0.0.1:9", "mode": "http", "tls": { "cert": "missing.pem", "key": "missing.key" } }), "missing.pem: cannot read"),
            (serde_json::json!({ "name": "x3", "upstream": "127.0.0.1:9", "mode": "http", "upstream_protocol": "h2" }), "needs upstream TLS"),
            (serde_json::json!({ "name": "x4", "upstream": "127.0.0.1:9", "upstream_tls": { "insecure": true } }), "need mode http"),
            (serde_json::json!({ "name": "x5", "upstream": "127.0.0.1:9", "mode": "http", "upstream_protocol": "h3" }), "h3"),
        ] {
            let reply = common::call(api, "POST", "/proxies", &body.to_string()).await;
            assert_eq!(reply.status, 400, "{body}: {}", reply.body);
            assert!(reply.body.contains(why), "{body}: {}", reply.body);
        }
        // Fixed at creation: another CA on update is refused.
        let reply = common::call(api, "POST", "/proxies/edge", r#"{"upstream_tls":{"ca":"other.pem"}}"#).await;
        assert_eq!(reply.status, 400, "{}", reply.body);
        assert!(reply.body.contains("upstream_tls"), "{}", reply.body);
        let same = common::call(api, "POST", "/proxies/edge", r#"{"upstream_tls":{"ca":"front-ca.pem"},"upstream_protocol":"h2"}"#).await;
        assert_eq!(same.status, 200, "{}", same.body);
    })
    .await;
}

#[tokio::test]
async fn snag_load_speaks_https_and_http2_by_alpn_and_checks_the_certificate() {
    use snag::lab::load::{self, Arrivals, Kind, Plan, Target};
    within(30, async {
        let dir = scratch("load");
        let ca = dir.join("ca.pem");
        let (backend, seen) = http_backend("hello").await;
        // refused_stream acts on HTTP/2 alone: the streams it refuses prove h2.
        let mut config = http_config("l", backend);
        config.tls = generated(&ca);
        config.faults = vec!["refused_stream".parse().unwrap()];
        let (addr, snag) = common::serve(config, RunContext::new(1)).await;
        let target = Target::resolve(&format!("https://localhost:{}/", addr.port()))
            .await
            .unwrap();
        let plan = |alpn: &[&[u8]], trust: UpstreamTls| {
            let mut p = Plan::new(target.clone());
            p.arrivals = Arrivals::Closed { connections: 2 };
            p.requests = Some(10);
            p.http2 = alpn == [b"h2".as_slice()];
            p.tls = Some(snag::tls::client(&trust, alpn, None).unwrap());
            p
        };
        let run = async |p: Plan| load::run(p, Shutdown::never(), |_| {}).await.report;

        let h1 = run(plan(&[b"http/1.1"], trusting(&ca).unwrap())).await;
        assert_eq!((h1.sent, h1.ok), (10, 10), "{:?}", h1.errors_by_kind);
        assert_eq!(seen.lock().unwrap().len(), 10);

        let h2 = run(plan(&[b"h2"], trusting(&ca).unwrap())).await;
        assert_eq!(h2.ok, 0, "{:?}", h2.errors_by_kind);
        assert_eq!(snag.counters().snapshot().streams_refused, h2.sent);

        // The system's roots do not know the run's CA: every request a TLS failure,
        // and snag counts the failed handshakes.
        let untrusted = run(plan(&[b"http/1.1"], UpstreamTls::default())).await;
        assert_eq!(
            untrusted.errors_by_kind.get(&Kind::Tls),
            Some(&untrusted.sent),
            "{:?}",
            untrusted.errors_by_kind
        );
        assert!(snag.counters().snapshot().tls_failures > 0);
        let insecure = UpstreamTls {
            insecure: true,
            ..UpstreamTls::default()
        };
        assert_eq!(run(plan(&[b"http/1.1"], insecure)).await.ok, 10);
    })
    .await;
}
