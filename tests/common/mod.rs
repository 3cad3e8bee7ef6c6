//! Shared helpers: real servers on 127.0.0.1 with OS-chosen ports, and a time bound.
#![allow(dead_code)]

pub mod hosts;
pub mod process;

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use snag::{
    api,
    fault::config::ProxyConfig,
    proxy::{self, Proxy, RunContext},
    shutdown::Shutdown,
};
use tokio::net::TcpListener;

/// Serve `echo` on an ephemeral loopback port until the test ends.
pub async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap(); // ready now: bound before the task runs
    tokio::spawn(snag::lab::backend::echo(listener, Shutdown::never()));
    addr
}

/// A loopback port that refuses connections, held for as long as the returned
/// socket lives: bound but never listening, so the kernel answers a SYN with RST,
/// and no other test can take the port meanwhile (a port bound and dropped can).
pub fn refusing_port() -> (SocketAddr, socket2::Socket) {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    (addr, socket)
}

/// The control API in this process on a loopback port, seed 1, with `settings`; the
/// fault file `scenario` (its text) loaded into it first if given.
pub async fn spawn_api(settings: api::Settings, scenario: Option<&str>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = api::Api::new(RunContext::new(1), settings, Shutdown::never());
    if let Some(text) = scenario {
        let scenario = snag::fault::file::parse("test.toml", text).unwrap();
        api.load(&scenario, &Shutdown::never()).await.unwrap();
    }
    tokio::spawn(api::serve(listener, api, Shutdown::never()));
    addr
}

/// One API request on a fresh connection.
pub async fn call(api: SocketAddr, method: &str, path: &str, body: &str) -> HttpReply {
    http(api, method, path, body, &[]).await
}

/// An answer's body as JSON.
pub fn json(reply: &HttpReply) -> serde_json::Value {
    serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{e}: {:?}", reply.body))
}

/// A TCP proxy named `name` to `upstream` with `faults` (inline specs), listening
/// on an OS-chosen loopback port.
pub fn config(name: &str, upstream: SocketAddr, faults: &[&str]) -> ProxyConfig {
    let mut config = ProxyConfig::new(name, "127.0.0.1:0".parse().unwrap(), upstream.to_string());
    config.faults = faults.iter().map(|f| f.parse().unwrap()).collect();
    config
}

/// Serves the proxy `config` describes, in `context`, until the test ends.
pub async fn serve(config: ProxyConfig, context: RunContext) -> (SocketAddr, Arc<Proxy>) {
    let listener = proxy::socket::bind(config.listen).unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = Proxy::new(config, context).unwrap();
    tokio::spawn(proxy::serve(listener, proxy.clone(), Shutdown::never()));
    (addr, proxy)
}

/// A TCP proxy to `upstream` with `faults` (inline specs), seed 1.
pub async fn spawn_proxy(upstream: SocketAddr, faults: &[&str]) -> (SocketAddr, Arc<Proxy>) {
    serve(config("p", upstream, faults), RunContext::new(1)).await
}

/// Waits (at most 2 s) until connecting to `addr` is refused: the listener closed.
pub async fn refused(addr: SocketAddr) {
    within(2, async {
        loop {
            match tokio::net::TcpStream::connect(addr).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                _ => tokio::task::yield_now().await,
            }
        }
    })
    .await;
}

pub async fn within<T>(secs: u64, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("did not finish within {secs}s"))
}

/// Waits until `cond` holds, or panics after `secs`. For conditions nothing
/// announces (counters, log lines, another process's state): checked every 5 ms.
pub async fn until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    eventually(secs, what, || std::future::ready(cond().then_some(()))).await
}

/// Waits until `check` gives a value, or panics after `secs`: [`until`] for checks
/// that must await (an API call).
pub async fn eventually<T, F: Future<Output = Option<T>>>(
    secs: u64,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Round trip of one small message on an open connection to an echo: the one timer
/// the tests use. Assert only that it is at least something on loopback.
pub async fn rtt(stream: &mut tokio::net::TcpStream) -> Duration {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let t = tokio::time::Instant::now();
    stream.write_all(b"ping").await.unwrap();
    let mut buf = [0; 4];
    stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"ping");
    t.elapsed()
}

/// [`rtt`] on a new connection to `addr`.
pub async fn rtt_to(addr: SocketAddr) -> Duration {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    rtt(&mut stream).await
}

pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761).max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// One HTTP/1.1 exchange on a fresh connection, read to the server's close: an
/// observer written apart from the server, parsing the wire as a client would.
pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    extra: &[(&str, &str)],
) -> HttpReply {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a header block");
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect();
    HttpReply {
        status,
        headers,
        body: body.to_string(),
    }
}

/// A request as the test backend received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The next HTTP/1.1 request on a connection (a Content-Length body, header names
/// in lower case); `None` when it closes first.
pub async fn read_request<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> Option<Seen> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut line = String::new();
    if r.read_line(&mut line).await.unwrap_or(0) == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).await.unwrap_or(0) == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':').unwrap();
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; len];
    r.read_exact(&mut body).await.ok()?;
    Some(Seen {
        method,
        path,
        headers,
        body,
    })
}

/// A plain HTTP/1.1 backend written for the tests (keep-alive, Content-Length
/// bodies): answers `body` (or, on /echo, the request's body) and records every
/// request it received.
pub async fn http_backend(body: &'static str) -> (SocketAddr, Arc<std::sync::Mutex<Vec<Seen>>>) {
    use tokio::io::{AsyncWriteExt, BufReader};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let log = log.clone();
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut r = BufReader::new(r);
                while let Some(Seen {
                    method,
                    path,
                    headers,
                    body: got,
                }) = read_request(&mut r).await
                {
                    let answer = if path.split('?').next() == Some("/echo") {
                        got.clone()
                    } else {
                        body.as_bytes().to_vec()
                    };
                    // /slow?ms=N answers N ms late (500 by default): a request in flight.
                    let slow = path.strip_prefix("/slow").map(|q| {
                        q.strip_prefix("?ms=")
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(500)
                    });
                    log.lock().unwrap().push(Seen {
                        method,
                        path,
                        headers,
                        body: got,
                    });
                    if let Some(ms) = slow {
                        // Slow on purpose: the behaviour under test is a request in flight.
                        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
                    }
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nx-instance: backend-a\r\n\r\n",
                        answer.len()
                    );
                    if w.write_all(head.as_bytes()).await.is_err()
                        || w.write_all(&answer).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (addr, seen)
}

/// What curl (an HTTP client independent of snag) saw.
#[derive(Debug)]
pub struct Curl {
    /// curl's exit code: 0, or 18 (short body), 52 (empty reply), 56 (reset) …
    pub exit: i32,
    pub status: u16,
    pub version: String,
    pub body: Vec<u8>,
    pub stderr: String,
}

pub async fn curl(url: &str, extra: &[&str]) -> Curl {
    let out = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "5",
            "-o",
            "-",
            "-w",
            "\n%{http_code} %{http_version}",
        ])
        .args(extra)
        .arg(url)
        .output()
        .await
        .expect("curl is installed (scripts/install-deps.sh)");
    let mut stdout = out.stdout;
    let cut = stdout.iter().rposition(|b| *b == b'\n').unwrap();
    let tail = String::from_utf8(stdout.split_off(cut)).unwrap();
    let mut tail = tail.split_whitespace();
    Curl {
        exit: out.status.code().unwrap_or(-1),
        status: tail.next().unwrap().parse().unwrap(),
        version: tail.next().unwrap_or("").to_string(),
        body: stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Loads an HTML report in headless Chromium and reads the mark its script leaves on
/// `<body>` once it ran to its end: chart lines drawn with length, of all.
pub fn charts_drawn(html: &std::path::Path) -> (u32, u32) {
    let out = std::process::Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}", html.display()))
        .stderr(std::process::Stdio::null())
        .output()
        .expect("chromium is installed (scripts/install-deps.sh)");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(dom.contains("<svg"), "no SVG in the page");
    let mark = dom
        .split("data-charts=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("the page's script did not run: no data-charts mark"));
    let (drawn, lines) = mark.split_once('/').expect("drawn/all");
    (drawn.parse().unwrap(), lines.parse().unwrap())
}

/// What tshark prints for `args` over the capture at `path`; it must not complain.
pub fn tshark(path: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("tshark")
        .arg("-r")
        .arg(path)
        .args(args)
        .output()
        .expect("tshark is installed (scripts/install-deps.sh)");
    let stderr = String::from_utf8_lossy(&out.stderr).replace(
        "Running as user \"root\" and group \"root\". This could be dangerous.",
        "",
    );
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "tshark {args:?}: {stderr}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Each commented frame's source port and comment, as tshark reads them.
pub fn tshark_comments(path: &std::path::Path) -> Vec<(u16, String)> {
    tshark(
        path,
        &[
            "-Y",
            "frame.comment",
            "-T",
            "fields",
            "-e",
            "tcp.srcport",
            "-e",
            "frame.comment",
        ],
    )
    .lines()
    .filter_map(|l| {
        let (port, comment) = l.split_once('\t')?;
        Some((port.parse().ok()?, comment.to_string()))
    })
    .collect()
}

/// The built-in balancer with `config`, on a loopback port, until the test ends.
pub async fn start_balancer(
    config: snag::lab::balancer::Config,
) -> (SocketAddr, Arc<snag::lab::balancer::Balancer>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let balancer = snag::lab::balancer::Balancer::new(config).unwrap();
    tokio::spawn(snag::lab::balancer::serve(
        listener,
        balancer.clone(),
        snag::shutdown::Shutdown::never(),
    ));
    (addr, balancer)
}

/// Writes `data`, half-closes, and reads everything back until EOF.
pub async fn round_trip(addr: SocketAddr, data: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = stream.into_split();
    let writer = {
        let data = data.to_vec();
        tokio::spawn(async move {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
        })
    };
    let mut got = Vec::new();
    r.read_to_end(&mut got).await.unwrap();
    writer.await.unwrap();
    got
}

/// A directory of one test's own under the temporary directory, removed with
/// everything in it when the test ends (also when it fails): a test run leaves
/// nothing behind in /tmp.
pub struct Scratch(std::path::PathBuf);

impl Scratch {
    /// `NAME-PID`, made empty.
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
