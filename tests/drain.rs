//! Draining, observed from outside: nghttp's frame log for GOAWAY, raw sockets for
//! `Connection: close`, resets and refusals, the backend's own record of requests.

mod common;

use std::{
    io,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use common::{Seen, echo_server, http_backend, refused, within};
use snag::{
    fault::drain::{Drain, DrainMode, NewConns},
    proxy::{self, Mode, Proxy, RunContext},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::Instant,
};

async fn spawn(
    upstream: SocketAddr,
    mode: Mode,
    instance: Option<&str>,
) -> (SocketAddr, Arc<Proxy>) {
    let mut config = common::config("h", upstream, &[]);
    config.mode = mode;
    config.instance = instance.map(String::from);
    common::serve(config, RunContext::new(1)).await
}

fn drain(mode: DrainMode, timeout: u64) -> Drain {
    Drain {
        mode,
        timeout,
        new: NewConns::Refuse,
        rate: 0,
        grace: 0,
    }
}

/// Waits until the backend has received `n` requests: the request is in flight.
async fn in_flight(seen: &Arc<Mutex<Vec<Seen>>>, n: usize) {
    within(5, async {
        while seen.lock().unwrap().len() < n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

#[tokio::test]
async fn an_h2_drain_sends_goaway_with_the_last_stream_and_lets_it_finish() {
    within(20, async {
        let (backend, seen) = http_backend("finished").await;
        let (addr, proxy) = spawn(backend, Mode::Http, None).await;
        let client = tokio::process::Command::new("nghttp")
            .args(["-v", &format!("http://{addr}/slow?ms=800")])
            .output();
        let client = tokio::spawn(client);
        in_flight(&seen, 1).await;
        proxy.drain(drain(DrainMode::Graceful, 0));
        let out = client
            .await
            .unwrap()
            .expect("nghttp is installed (scripts/install-deps.sh)");
        let log = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{log}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stream: u32 = log
            .lines()
            .find_map(|l| {
                l.split("recv (stream_id=")
                    .nth(1)
                    .filter(|r| r.contains(":status: 200"))
            })
            .and_then(|r| r.split(')').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no 200 in {log}"));
        let goaways: Vec<u32> = log
            .lines()
            .filter_map(|l| l.split("last_stream_id=").nth(1))
            .filter_map(|r| r.split(',').next()?.parse().ok())
            .collect();
        // The two-step GOAWAY: first the largest id, then the last stream served; the
        // client's own GOAWAY on exit is sent, not received, so it is not counted.
        let received: Vec<u32> = log
            .lines()
            .zip(log.lines().skip(1))
            .filter(|(frame, _)| frame.contains("recv GOAWAY"))
            .filter_map(|(_, args)| {
                args.split("last_stream_id=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        assert!(!goaways.is_empty(), "{log}");
        assert_eq!(received.last(), Some(&stream), "{log}");
        assert!(
            log.contains("finished"),
            "the in-flight stream did not complete: {log}"
        );
        refused(addr).await;
        let stats = proxy.counters().snapshot();
        assert_eq!(
            (
                stats.goaways,
                stats.requests_after_drain,
                stats.responses["2xx"]
            ),
            (1, 0, 1)
        );
    })
    .await;
}

#[tokio::test]
async fn an_h1_response_in_flight_carries_connection_close_and_the_connection_ends() {
    within(10, async {
        let (backend, seen) = http_backend("finished").await;
        let (addr, proxy) = spawn(backend, Mode::Http, None).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /slow?ms=400 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        in_flight(&seen, 1).await;
        proxy.drain(drain(DrainMode::Graceful, 0));
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).await.unwrap(); // ends: the connection is closed
        let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        assert!(answer.starts_with("http/1.1 200"), "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
        assert!(answer.ends_with("finished"), "{answer}");
        refused(addr).await;
    })
    .await;
}

#[tokio::test]
async fn a_deadline_drain_resets_what_is_still_open_and_counts_it() {
    within(10, async {
        let (backend, seen) = http_backend("too late").await;
        let (addr, proxy) = spawn(backend, Mode::Http, None).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /slow?ms=5000 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        in_flight(&seen, 1).await;
        let t = Instant::now();
        proxy.drain(drain(DrainMode::Deadline, 300));
        let err = c.read(&mut [0; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(proxy.counters().snapshot().drain_resets, 1);
    })
    .await;
}

#[tokio::test]
async fn tcp_drains_refuse_new_connections_and_finish_or_reset_open_ones() {
    within(10, async {
        let (addr, proxy) = spawn(echo_server().await, Mode::Tcp, None).await;
        let mut open = TcpStream::connect(addr).await.unwrap();
        open.write_all(b"ping").await.unwrap();
        open.read_exact(&mut [0; 4]).await.unwrap();
        proxy.drain(drain(DrainMode::Graceful, 0));
        refused(addr).await;
        // Graceful: the open connection still works.
        open.write_all(b"more").await.unwrap();
        open.read_exact(&mut [0; 4]).await.unwrap();
        // Abrupt: it is reset at once.
        proxy.drain(drain(DrainMode::Abrupt, 0));
        let err = open.read(&mut [0; 4]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        // Undrained: the listener is back.
        proxy.undrain();
        within(2, async {
            loop {
                if let Ok(mut c) = TcpStream::connect(addr).await {
                    c.write_all(b"back").await.unwrap();
                    if c.read_exact(&mut [0; 4]).await.is_ok() {
                        break;
                    }
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_slow_drain_paces_responses_in_flight() {
    within(10, async {
        let big: &'static str = Box::leak("0123456789".repeat(1_500).into_boxed_str());
        let (backend, seen) = http_backend(big).await;
        let (addr, proxy) = spawn(backend, Mode::Http, None).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /slow?ms=200 HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        in_flight(&seen, 1).await;
        let t = Instant::now();
        // 10 KB/s over 15 KB: 1.5 s.
        proxy.drain(Drain {
            mode: DrainMode::Slow,
            timeout: 0,
            new: NewConns::Refuse,
            rate: 10,
            grace: 0,
        });
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).await.unwrap();
        assert!(String::from_utf8_lossy(&answer).ends_with(big));
        let want = Duration::from_millis(big.len() as u64 / 10);
        assert!(
            t.elapsed() >= want.mul_f64(0.8),
            "{:?} for {} bytes",
            t.elapsed(),
            big.len()
        );
    })
    .await;
}

#[tokio::test]
async fn the_same_transaction_id_twice_is_one_duplicate_and_instances_are_compared() {
    within(10, async {
        let (backend, _) = http_backend("ok").await;
        let (addr, proxy) = spawn(backend, Mode::Http, None).await;
        for id in ["tx-1", "tx-2", "tx-1"] {
            let reply = common::http(addr, "POST", "/orders", "{}", &[("x-request-id", id)]).await;
            assert_eq!(reply.status, 200);
        }
        let stats = proxy.counters().snapshot();
        assert_eq!(stats.duplicates, [("tx-1".to_string(), 2)].into());
        assert_eq!(stats.requests["data"], 3);
        // The backend calls itself backend-a; this proxy knows it as "h".
        assert_eq!(
            (stats.instances["backend-a"], stats.instance_disagreements),
            (3, 3)
        );
        let (addr, proxy) = spawn(backend, Mode::Http, Some("backend-a")).await;
        common::http(addr, "GET", "/", "", &[]).await;
        assert_eq!(proxy.counters().snapshot().instance_disagreements, 0);
    })
    .await;
}

#[tokio::test]
async fn empty_tcp_connections_malformed_requests_and_the_connection_rate_are_counted() {
    within(10, async {
        let (addr, proxy) = spawn(echo_server().await, Mode::Tcp, None).await;
        drop(TcpStream::connect(addr).await.unwrap()); // an L4 health check
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"data").await.unwrap();
        c.read_exact(&mut [0; 4]).await.unwrap();
        drop(c);
        within(3, async {
            while proxy.counters().snapshot().active_connections > 0 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        let stats = proxy.counters().snapshot();
        assert_eq!((stats.empty_connections, stats.connections), (1, 2));
        assert_eq!(stats.new_connections_per_second.iter().sum::<u64>(), 2);

        let (backend, _) = http_backend("ok").await;
        let (addr, proxy) = spawn(backend, Mode::Http, None).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"NOT HTTP AT ALL\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).await.unwrap();
        within(3, async {
            while proxy.counters().snapshot().bad_requests == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn a_slow_tcp_drain_paces_open_connections() {
    within(10, async {
        let (addr, proxy) = spawn(echo_server().await, Mode::Tcp, None).await;
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        c.read_exact(&mut [0; 4]).await.unwrap();
        proxy.drain(Drain {
            mode: DrainMode::Slow,
            timeout: 0,
            new: NewConns::Refuse,
            rate: 10,
            grace: 0,
        });
        assert!(proxy.faults().iter().any(|f| f.name == proxy::SLOW_DRAIN));
        let t = Instant::now();
        let data = vec![7u8; 12_000];
        let (mut r, mut w) = c.into_split();
        let writer = tokio::spawn(async move { w.write_all(&data).await.unwrap() });
        let mut got = vec![0; 12_000];
        r.read_exact(&mut got).await.unwrap();
        writer.await.unwrap();
        // 12 KB at 10 KB/s: 1.2 s.
        assert!(
            t.elapsed() >= Duration::from_millis(1_000),
            "{:?}",
            t.elapsed()
        );
        proxy.undrain();
        assert!(proxy.faults().is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_readiness_drain_fails_probes_first_while_data_is_served_then_drains() {
    within(20, async {
        let (backend, seen) = http_backend("hello").await;
        let (addr, proxy) = spawn(backend, Mode::Http, None).await;
        // A keep-alive data connection open before the drain.
        let mut open = TcpStream::connect(addr).await.unwrap();
        proxy.drain("readiness:grace=600".parse::<Drain>().unwrap());
        let t = Instant::now();
        // Probes get 503 from snag; data reaches the backend; new connections are
        // accepted.
        let probe = common::curl(&format!("http://{addr}/health"), &[]).await;
        assert_eq!(probe.status, 503, "{}", probe.stderr);
        let data = common::curl(&format!("http://{addr}/orders"), &[]).await;
        assert_eq!(
            (data.status, data.body.as_slice()),
            (200, b"hello".as_slice())
        );
        assert_eq!(
            seen.lock()
                .unwrap()
                .iter()
                .map(|s| s.path.as_str())
                .collect::<Vec<_>>(),
            ["/orders"],
            "the probe never reached the backend"
        );
        assert!(proxy.draining().is_none() && proxy.unready());
        // Then the graceful drain: the listener refuses, no sooner than the grace.
        refused_within(addr, 5).await;
        assert!(
            t.elapsed() >= Duration::from_millis(600),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(proxy.draining().map(|d| d.mode), Some(DrainMode::Graceful));
        // The connection opened before it is closed, idle, by the drain.
        assert_eq!(open.read(&mut [0; 8]).await.unwrap(), 0);
        proxy.undrain();
        assert!(!proxy.unready());
        assert_eq!(
            common::curl(&format!("http://{addr}/health"), &[])
                .await
                .status,
            200
        );
    })
    .await;
}

#[tokio::test]
async fn a_readiness_drain_in_tcp_mode_refuses_the_probe_listener_first() {
    within(20, async {
        let upstream = echo_server().await;
        let mut config = common::config("t", upstream, &[]);
        config.probe_listen = Some("127.0.0.1:0".parse().unwrap());
        let data_listener = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let probe_listener = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let (data, probes) = (
            data_listener.local_addr().unwrap(),
            probe_listener.local_addr().unwrap(),
        );
        let proxy = Proxy::new(config, RunContext::new(1)).unwrap();
        tokio::spawn(proxy::serve_all(
            data_listener,
            Some(probe_listener),
            proxy.clone(),
            snag::shutdown::Shutdown::never(),
        ));
        proxy.drain("readiness:grace=60000".parse::<Drain>().unwrap());
        refused(probes).await;
        let mut c = TcpStream::connect(data).await.unwrap();
        c.write_all(b"ping").await.unwrap();
        let mut got = [0; 4];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ping");
        proxy.undrain();
        common::eventually(5, "the probe listener back", || async {
            TcpStream::connect(probes).await.ok()
        })
        .await;
    })
    .await;
}

/// Waits, at most `secs`, until connecting to `addr` is refused.
async fn refused_within(addr: SocketAddr, secs: u64) {
    common::eventually(secs, "the listener to refuse", || async {
        match TcpStream::connect(addr).await {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Some(()),
            _ => None,
        }
    })
    .await;
}
