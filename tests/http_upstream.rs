//! HTTP mode's HTTP/1.1 upstream leg: keep-alive connections pooled and reused, more
//! opened for concurrent requests, and none reused that the upstream closed or that
//! a client left in the middle of a body. Observers: a backend that counts the
//! connections it accepted and closed, curl, and `ss` for snag's sockets.

mod common;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use common::{curl, until, within};
use snag::proxy::Mode;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpSocket, TcpStream},
};

/// What the backend counted.
#[derive(Default)]
struct Counts {
    accepted: AtomicUsize,
    /// Connections it closed itself (`/close` asks for it, after the answer).
    closed: AtomicUsize,
    requests: AtomicUsize,
}

/// An HTTP/1.1 backend: `/big` answers 1 MiB, `/huge` 16 MiB, `/slow` answers 300 ms
/// late, `/close` answers and then closes the connection 50 ms later without saying so
/// (as a keep-alive timeout does), `/close-now` at once, `/empty` answers 204; anything
/// else `ok`. HEAD gets the head only.
async fn backend() -> (SocketAddr, Arc<Counts>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let seen = counts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            seen.accepted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer(stream, seen.clone()));
        }
    });
    (addr, counts)
}

async fn answer(stream: TcpStream, counts: Arc<Counts>) {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    while let Some(request) = common::read_request(&mut r).await {
        let (method, path) = (request.method, request.path);
        counts.requests.fetch_add(1, Ordering::SeqCst);
        if path == "/slow" {
            // Slow on purpose: the behaviour under test is requests in flight together.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let (status, answer) = match path.as_str() {
            "/big" => ("200 OK", vec![b'x'; 1 << 20]),
            "/huge" => ("200 OK", vec![b'x'; 16 << 20]),
            "/empty" => ("204 No Content", Vec::new()),
            _ => ("200 OK", b"ok".to_vec()),
        };
        let mut head = format!("HTTP/1.1 {status}\r\n");
        if status.starts_with("200") {
            head.push_str(&format!("Content-Length: {}\r\n", answer.len()));
        }
        head.push_str("\r\n");
        if w.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        if method != "HEAD" && w.write_all(&answer).await.is_err() {
            return;
        }
        if path == "/close" || path == "/close-now" {
            // The keep-alive timeout, on purpose: a close nobody announced.
            if path == "/close" {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            drop((r, w));
            counts.closed.fetch_add(1, Ordering::SeqCst);
            return;
        }
    }
}

async fn http_proxy(upstream: SocketAddr) -> SocketAddr {
    let mut config = common::config("h", upstream, &[]);
    config.mode = Mode::Http;
    common::serve(config, snag::proxy::RunContext::new(1))
        .await
        .0
}

async fn get(proxy: SocketAddr, path: &str, extra: &[&str]) -> common::Curl {
    curl(&format!("http://{proxy}{path}"), extra).await
}

/// snag's sockets to `backend` in `state`, as `ss` lists them.
fn sockets_to(backend: SocketAddr, state: &str) -> usize {
    let out = std::process::Command::new("ss")
        .args(["-Htn", "state", state, "dst", &backend.to_string()])
        .output()
        .expect("ss is installed (iproute2)");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[tokio::test]
async fn sequential_requests_share_one_upstream_connection_and_concurrent_ones_open_more() {
    within(20, async {
        let (backend, counts) = backend().await;
        let proxy = http_proxy(backend).await;
        // Each curl is a client connection of its own; the upstream leg is pooled.
        for path in ["/", "/", "/empty", "/"] {
            let got = get(proxy, path, &[]).await;
            assert_eq!(got.exit, 0, "{}", got.stderr);
        }
        let head = get(proxy, "/big", &["-I"]).await;
        assert_eq!((head.exit, head.status), (0, 200), "{}", head.stderr);
        assert_eq!(counts.requests.load(Ordering::SeqCst), 5);
        assert_eq!(
            counts.accepted.load(Ordering::SeqCst),
            1,
            "one kept-alive connection"
        );

        let together: Vec<_> = (0..4)
            .map(|_| tokio::spawn(async move { get(proxy, "/slow", &[]).await }))
            .collect();
        for got in together {
            let got = got.await.unwrap();
            assert_eq!((got.exit, got.status), (0, 200), "{}", got.stderr);
        }
        // One request per connection at a time: the idle one and three new ones.
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 4);
        assert_eq!(get(proxy, "/", &[]).await.body, b"ok");
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 4, "all four kept");
    })
    .await;
}

#[tokio::test]
async fn an_upstream_closing_an_idle_connection_costs_no_request_and_snag_closes_its_end() {
    within(20, async {
        let (backend, counts) = backend().await;
        let proxy = http_proxy(backend).await;
        for round in 1..=3 {
            let got = get(proxy, "/close", &[]).await;
            assert_eq!(
                (got.exit, got.status),
                (0, 200),
                "round {round}: {}",
                got.stderr
            );
            until(5, "the backend closed its connection", || {
                counts.closed.load(Ordering::SeqCst) == round
            })
            .await;
            // Nobody uses the connection now: snag sees the FIN and closes its end
            // instead of leaving it in CLOSE-WAIT.
            until(5, "snag closed its end", || {
                sockets_to(backend, "close-wait") == 0
            })
            .await;
        }
        assert_eq!(
            counts.accepted.load(Ordering::SeqCst),
            3,
            "none reused after its close"
        );
        assert_eq!(sockets_to(backend, "established"), 0);
    })
    .await;
}

#[tokio::test]
async fn a_request_right_after_an_unannounced_close_goes_on_a_new_connection() {
    within(30, async {
        let (backend, counts) = backend().await;
        let proxy = http_proxy(backend).await;
        // The next request is taken from the pool while the close may still be on
        // its way or unread: it must never be the one that fails.
        for round in 1..=20 {
            for path in ["/close-now", "/"] {
                let got = get(proxy, path, &[]).await;
                assert_eq!(
                    (got.exit, got.status, got.body.as_slice()),
                    (0, 200, &b"ok"[..]),
                    "round {round}, {path}: {}",
                    got.stderr
                );
            }
        }
        assert_eq!(
            counts.requests.load(Ordering::SeqCst),
            40,
            "none sent twice"
        );
        assert!(counts.accepted.load(Ordering::SeqCst) >= 20);
    })
    .await;
}

#[tokio::test]
async fn a_client_leaving_in_the_middle_of_a_body_closes_that_upstream_connection() {
    within(20, async {
        let (backend, counts) = backend().await;
        let proxy = http_proxy(backend).await;
        // A small receive buffer keeps the body in flight: with loopback's autotuned
        // buffers (up to 32 MiB here) a client that reads nothing can still take a
        // whole body, and the upstream connection is then rightly reused.
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(16 << 10).unwrap();
        let mut client = socket.connect(proxy).await.unwrap();
        client
            .write_all(b"GET /huge HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut first = [0; 4096];
        let n = client.read(&mut first).await.unwrap();
        assert!(
            first[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&first[..n])
        );
        drop(client);
        // The rest of that body is still on its way: the connection is not reusable.
        let got = get(proxy, "/", &[]).await;
        assert_eq!(
            (got.exit, got.body.as_slice()),
            (0, &b"ok"[..]),
            "{}",
            got.stderr
        );
        assert_eq!(counts.accepted.load(Ordering::SeqCst), 2);
        let whole = get(proxy, "/big", &[]).await;
        assert_eq!(whole.body.len(), 1 << 20, "{}", whole.stderr);
        until(5, "the abandoned connection closed", || {
            sockets_to(backend, "established") == 1
        })
        .await;
    })
    .await;
}

/// A health probe sent to `proxy`, once it arrived there (and a probe-scoped
/// `drop_request` holds it).
async fn probe_held(proxy: SocketAddr, snag: &snag::proxy::Proxy) -> TcpStream {
    let mut client = TcpStream::connect(proxy).await.unwrap();
    client
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    until(5, "the probe arrived", || {
        snag.counters().snapshot().requests.get("probe") == Some(&1)
    })
    .await;
    client
}

#[tokio::test]
async fn a_client_hanging_up_on_a_request_in_flight_ends_it() {
    within(20, async {
        let (backend, counts) = backend().await;
        let mut config = common::config("h", backend, &["drop_request:scope=probe"]);
        config.mode = Mode::Http;
        let (proxy, snag) = common::serve(config, snag::proxy::RunContext::new(1)).await;
        // The request is read in one short read; nothing more comes until the close,
        // which must reach hyper as an event, not as a read it keeps trying.
        let client = probe_held(proxy, &snag).await;
        assert_eq!(snag.counters().snapshot().probes_unanswered, 0);
        drop(client);
        until(5, "the probe ended unanswered", || {
            snag.counters().snapshot().probes_unanswered == 1
        })
        .await;
        assert_eq!(counts.requests.load(Ordering::SeqCst), 0, "never forwarded");
    })
    .await;
}

#[tokio::test]
async fn a_probe_in_flight_when_the_interposer_stops_is_not_a_lost_probe() {
    within(20, async {
        let (backend, _) = backend().await;
        let scratch = common::Scratch::new("snag-probe-cut");
        let log = snag::events::EventLog::create(&scratch.join("events.jsonl")).unwrap();
        let mut context = snag::proxy::RunContext::new(1);
        context.events = Some(log.clone());
        let mut config = common::config("h", backend, &["drop_request:scope=probe"]);
        config.mode = Mode::Http;
        let listener = snag::proxy::socket::bind(config.listen).unwrap();
        let addr = listener.local_addr().unwrap();
        let snag = snag::proxy::Proxy::new(config, context).unwrap();
        let shutdown = snag::shutdown::Shutdown::new();
        let served = tokio::spawn(snag::proxy::serve(listener, snag.clone(), shutdown.clone()));
        let mut client = probe_held(addr, &snag).await;
        // As the API's DELETE does: stop accepting and close what is open, at once.
        shutdown.close();
        served.await.unwrap().unwrap();
        // The prober saw its connection closed without an answer ...
        let mut got = Vec::new();
        let _ = client.read_to_end(&mut got).await;
        assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
        // ... but by snag's own stop, not by its fault: no lost probe.
        let stats = snag.counters().snapshot();
        assert_eq!((stats.probes_unanswered, stats.probes_failed), (0, 0));
        log.close().unwrap();
        let events = std::fs::read_to_string(scratch.join("events.jsonl")).unwrap();
        let probes: Vec<serde_json::Value> = events
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|e| e["event"] == "probe")
            .collect();
        assert_eq!(probes.len(), 1, "{events}");
        assert_eq!(probes[0]["status"], 0);
        assert_eq!(probes[0]["cut"], "the interposer stopped", "{events}");
    })
    .await;
}

/// An upstream that answers each request with the canned bytes its path names and
/// then closes: responses a real server may send, and ones no server should.
async fn raw_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                let mut line = String::new();
                stream.read_line(&mut line).await.unwrap();
                let answer: &[u8] = match line.split_whitespace().nth(1).unwrap_or("") {
                    "/chunked" => b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nx-t: 1\r\n\r\n",
                    "/until-close" => b"HTTP/1.0 200 OK\r\n\r\nall of this until the close",
                    "/two-lengths" => b"HTTP/1.1 200 OK\r\ncontent-length: 3, 4\r\n\r\nabcd",
                    "/garbage" => b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
                    "/short" => b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc",
                    // The length of the representation, not of this response's body.
                    "/not-modified" => b"HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n",
                    // A length where RFC 9110 forbids one, and bytes after the head.
                    "/no-content" => b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\nhello",
                    _ => b"",
                };
                let stream = stream.get_mut();
                let _ = stream.write_all(answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn what_the_upstream_answers_reaches_the_client_and_what_is_malformed_is_a_502_that_says_why()
{
    within(20, async {
        let upstream = raw_upstream().await;
        let mut config = common::config("h", upstream, &[]);
        config.mode = Mode::Http;
        let (proxy, snag) = common::serve(config, snag::proxy::RunContext::new(1)).await;
        let url = |path: &str| format!("http://{proxy}{path}");
        // Framed by chunks after an interim response; framed by the close.
        let chunked = curl(&url("/chunked"), &[]).await;
        assert_eq!(
            (chunked.status, &chunked.body[..]),
            (200, &b"hello, world"[..])
        );
        let close = curl(&url("/until-close"), &[]).await;
        assert_eq!(
            (close.status, &close.body[..]),
            (200, &b"all of this until the close"[..])
        );
        // Responses without a body keep their head as it came, and no body.
        for (path, status) in [("/not-modified", 304), ("/no-content", 204)] {
            let got = curl(&url(path), &["--include"]).await;
            let head = String::from_utf8_lossy(&got.body);
            assert_eq!((got.exit, got.status), (0, status), "{path}: {got:?}");
            assert!(head.contains("content-length: 5\r\n"), "{path}: {head}");
            assert!(head.ends_with("\r\n\r\n"), "{path}: {head}");
        }
        // Malformed, or closed before it answered: 502, saying why.
        for (path, why) in [
            ("/two-lengths", "Content-Length is not one number"),
            ("/garbage", "response head is malformed"),
            ("/nothing", "closed the connection before it answered"),
        ] {
            let got = curl(&url(path), &[]).await;
            let body = String::from_utf8_lossy(&got.body);
            assert_eq!(got.status, 502, "{path}: {body}");
            assert!(body.contains(why), "{path}: {body}");
        }
        // A body cut short by the close: the client's transfer fails, it is not
        // completed with anything made up.
        let short = curl(&url("/short"), &[]).await;
        assert_ne!(short.exit, 0, "{short:?}");
        assert_eq!(snag.counters().snapshot().upstream_errors, 3);
    })
    .await;
}

/// Sends `GET /` on `client` and reads the answer (it has a Content-Length): its
/// status and body.
async fn ask(client: &mut BufReader<TcpStream>) -> (u16, String) {
    client
        .get_mut()
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut status = String::new();
    client.read_line(&mut status).await.unwrap();
    let mut length = 0;
    loop {
        let mut line = String::new();
        client.read_line(&mut line).await.unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    client.read_exact(&mut body).await.unwrap();
    let status = status.split(' ').nth(1).unwrap().parse().unwrap();
    (status, String::from_utf8(body).unwrap())
}

// A connection keeps its own view of the faults and each worker its own of the
// upstream, read again only when the proxy's change: each request must still see
// the ones of its moment.
#[tokio::test]
async fn on_one_client_connection_each_request_sees_the_faults_and_upstream_of_its_moment() {
    within(20, async {
        let (one, _) = common::http_backend("one").await;
        let (two, _) = common::http_backend("two").await;
        let mut config = common::config("h", one, &[]);
        config.mode = Mode::Http;
        let (proxy, snag) = common::serve(config, snag::proxy::RunContext::new(1)).await;
        let mut client = BufReader::new(TcpStream::connect(proxy).await.unwrap());
        assert_eq!(ask(&mut client).await, (200, "one".into()));
        snag.add_fault("http_status:status=503".parse().unwrap())
            .unwrap();
        assert_eq!(ask(&mut client).await.0, 503);
        snag.remove_fault("http_status_downstream").unwrap();
        assert_eq!(ask(&mut client).await, (200, "one".into()));
        snag.set_upstream(&two.to_string());
        assert_eq!(ask(&mut client).await, (200, "two".into()));
        snag.set_upstream(&one.to_string());
        assert_eq!(ask(&mut client).await, (200, "one".into()));
        // The same address again: the requests still go there.
        snag.set_upstream(&one.to_string());
        assert_eq!(ask(&mut client).await, (200, "one".into()));
        let stats = snag.counters().snapshot();
        assert_eq!(stats.requests.get("data"), Some(&6));
        assert_eq!(stats.responses.get("2xx"), Some(&5));
        assert_eq!(stats.responses.get("5xx"), Some(&1));
    })
    .await;
}
