//! Each TCP fault, proven by what a real client on a real socket sees.

mod common;

use std::{io, time::Duration};

use common::{echo_server, pattern, spawn_proxy, within};
use snag::proxy::RunContext;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    time::{Instant, timeout},
};

/// Median round trip of `n` small messages on one connection.
async fn median_rtt(addr: std::net::SocketAddr, n: usize) -> Duration {
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.set_nodelay(true).unwrap();
    let mut rtts = Vec::new();
    for _ in 0..n {
        rtts.push(common::rtt(&mut client).await);
    }
    rtts.sort();
    rtts[n / 2]
}

#[tokio::test]
async fn latency_raises_the_round_trip_by_at_least_the_latency() {
    within(20, async {
        let backend = echo_server().await;
        let direct = median_rtt(backend, 10).await;
        let (proxy, _) = spawn_proxy(
            backend,
            &["latency:latency=100", "latency:latency=50,stream=upstream"],
        )
        .await;
        let slowed = median_rtt(proxy, 10).await;
        assert!(slowed >= Duration::from_millis(150), "{slowed:?}");
        assert!(
            slowed < direct + Duration::from_millis(190),
            "{slowed:?} vs direct {direct:?}"
        );
    })
    .await;
}

/// A backend that writes `len` bytes as soon as it gets one byte, then closes.
async fn sender(len: usize) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = s.read(&mut [0; 1]).await;
                let _ = s.write_all(&pattern(len, 3)).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn bandwidth_paces_a_transfer_to_within_ten_percent() {
    within(20, async {
        // 300 KB at 150 KB/s: 2 s.
        let (proxy, _) = spawn_proxy(sender(300_000).await, &["bandwidth:rate=150"]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let t = Instant::now();
        client.write_all(b"g").await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        let took = t.elapsed().as_secs_f64();
        assert_eq!(got, pattern(300_000, 3));
        assert!(
            (1.8..2.2).contains(&took),
            "took {took:.3} s, want 2.0 s ± 10 %"
        );
    })
    .await;
}

#[tokio::test]
async fn reset_peer_makes_the_client_read_fail_with_econnreset() {
    within(10, async {
        let (proxy, p) = spawn_proxy(echo_server().await, &["reset_peer:timeout=0"]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        client.write_all(b"ping").await.unwrap();
        let err = client.read(&mut [0; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        within(3, async {
            while p.counters().snapshot().fault_resets != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn reset_peer_waits_its_timeout_and_resets_the_upstream_too() {
    within(10, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            tx.send(s.read_to_end(&mut buf).await.map_err(|e| e.kind()))
                .unwrap();
        });
        let (proxy, _) = spawn_proxy(backend, &["reset_peer:timeout=200,stream=upstream"]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let t = Instant::now();
        client.write_all(b"ping").await.unwrap();
        let err = client.read(&mut [0; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
        assert_eq!(rx.await.unwrap(), Err(io::ErrorKind::ConnectionReset));
    })
    .await;
}

#[tokio::test]
async fn down_refuses_connections_cuts_open_ones_and_comes_back() {
    within(10, async {
        let (addr, proxy) = spawn_proxy(echo_server().await, &[]).await;
        let mut open = TcpStream::connect(addr).await.unwrap();
        open.write_all(b"ping").await.unwrap();
        open.read_exact(&mut [0; 4]).await.unwrap();

        proxy.add_fault("down".parse().unwrap()).unwrap();
        assert_eq!(
            open.read(&mut [0; 4]).await.unwrap(),
            0,
            "open connection not cut"
        );
        // The listener closes when the accept loop sees the change; wait for refusal.
        let refused = async {
            loop {
                match TcpStream::connect(addr).await {
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => break,
                    Err(e) => panic!("{e}"),
                    Ok(_) => tokio::task::yield_now().await,
                }
            }
        };
        within(2, refused).await;

        proxy.remove_fault("down_downstream").unwrap();
        let back = async {
            loop {
                if let Ok(mut s) = TcpStream::connect(addr).await {
                    s.write_all(b"ping").await.unwrap();
                    if s.read_exact(&mut [0; 4]).await.is_ok() {
                        break;
                    }
                }
                tokio::task::yield_now().await;
            }
        };
        within(2, back).await;
    })
    .await;
}

#[tokio::test]
async fn syn_drop_makes_connects_time_out_while_the_port_stays_open() {
    within(15, async {
        let (addr, proxy) = spawn_proxy(echo_server().await, &["syn_drop"]).await;
        // The plug connections fill the queue before the first accept; a connect
        // that completes before that is the only way this can flake, so retry a few.
        let mut timed_out = false;
        for _ in 0..5 {
            if timeout(Duration::from_millis(300), TcpStream::connect(addr))
                .await
                .is_err()
            {
                timed_out = true;
                break;
            }
        }
        assert!(timed_out, "a connect went through syn_drop");
        // The port is not closed: a refusal would have come back at once.
        proxy.remove_fault("syn_drop_downstream").unwrap();
        let mut client = within(5, async {
            loop {
                if let Ok(Ok(s)) =
                    timeout(Duration::from_millis(500), TcpStream::connect(addr)).await
                {
                    break s;
                }
            }
        })
        .await;
        client.write_all(b"ping").await.unwrap();
        client.read_exact(&mut [0; 4]).await.unwrap();
    })
    .await;
}

/// The accept backlog of the socket listening on `addr`, as `ss` reads it (its
/// Send-Q column for a listener).
fn backlog(addr: std::net::SocketAddr) -> Option<u32> {
    let out = std::process::Command::new("ss")
        .args(["-Hltn", "src", &addr.to_string()])
        .output()
        .expect("ss is installed (iproute2)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(2)?.parse().ok()
}

/// A burst of connections larger than tokio's default backlog (1024) finds room in
/// snag's queue: the kernel's most, before a syn_drop and again after it.
#[tokio::test]
async fn the_listener_queues_as_many_connections_as_the_kernel_allows() {
    within(15, async {
        let most: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .expect("Linux")
            .trim()
            .parse()
            .unwrap();
        // 4096 on Linux 5.4 and later; a host that lowered it gets its own figure.
        let expected = most.min(4096);
        let (addr, proxy) = spawn_proxy(echo_server().await, &[]).await;
        assert_eq!(backlog(addr), Some(expected));
        proxy.add_fault("syn_drop".parse().unwrap()).unwrap();
        // syn_drop shrinks the queue to nothing and plugs it.
        common::until(5, "syn_drop to shrink the backlog", || {
            backlog(addr).is_some_and(|n| n < 1024)
        })
        .await;
        proxy.remove_fault("syn_drop_downstream").unwrap();
        common::until(5, "the backlog to come back", || {
            backlog(addr) == Some(expected)
        })
        .await;
    })
    .await;
}

#[tokio::test]
async fn limit_data_delivers_exactly_n_bytes_then_eof() {
    within(10, async {
        let (proxy, _) = spawn_proxy(sender(100_000).await, &["limit_data:bytes=12345"]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        client.write_all(b"g").await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, pattern(100_000, 3)[..12345]);
    })
    .await;
}

#[tokio::test]
async fn timeout_answers_nothing_then_closes_after_its_time() {
    within(10, async {
        let (proxy, _) = spawn_proxy(echo_server().await, &["timeout:timeout=500"]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let t = Instant::now();
        client.write_all(b"anyone?").await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty(), "blackhole answered {got:?}");
        assert!(
            t.elapsed() >= Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );

        let (proxy, _) = spawn_proxy(echo_server().await, &["timeout:timeout=0"]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        client.write_all(b"anyone?").await.unwrap();
        assert!(
            timeout(Duration::from_millis(700), client.read(&mut [0; 8]))
                .await
                .is_err()
        );
    })
    .await;
}

#[tokio::test]
async fn slow_close_delays_the_fin_but_not_the_data() {
    within(10, async {
        let (proxy, _) = spawn_proxy(echo_server().await, &["slow_close:delay=300"]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let t = Instant::now();
        client.write_all(b"bye").await.unwrap();
        client.shutdown().await.unwrap();
        client.read_exact(&mut [0; 3]).await.unwrap();
        // The data came ahead of the FIN, not with it: the FIN is still 100 ms away.
        let mut one = [0; 1];
        let fin = tokio::time::timeout(Duration::from_millis(100), client.read(&mut one));
        assert!(fin.await.is_err(), "the FIN came with the data");
        assert_eq!(client.read(&mut [0; 1]).await.unwrap(), 0);
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
    })
    .await;
}

#[tokio::test]
async fn slicer_spreads_a_message_over_its_pieces_delays() {
    within(10, async {
        // 1000 B in ~100 B pieces, 20 ms apart: at least 9 gaps, 180 ms.
        let (proxy, _) = spawn_proxy(
            sender(1000).await,
            &["slicer:average_size=100,size_variation=0,delay=20000"],
        )
        .await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let t = Instant::now();
        client.write_all(b"g").await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, pattern(1000, 3));
        assert!(
            t.elapsed() >= Duration::from_millis(180),
            "{:?}",
            t.elapsed()
        );
    })
    .await;
}

#[tokio::test]
async fn loss_stalls_the_stream_by_retransmission_timeouts() {
    within(20, async {
        // 20 segments at 30 %: about 6 first losses of at least 20 ms each (seed 1
        // fixes which); the stream must arrive whole, just late.
        let (proxy, _) = spawn_proxy(
            sender(20_000).await,
            &["loss:probability=0.3,rto=20,segment=1000"],
        )
        .await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let t = Instant::now();
        client.write_all(b"g").await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, pattern(20_000, 3));
        // About 10 first losses of 50 ms each: well over 200 ms, and nothing was lost.
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );
    })
    .await;
}

/// Which of `n` sequential connections got reset by a toxicity-0.5 `reset_peer`.
async fn reset_subset(seed: u64, n: usize) -> Vec<usize> {
    let config = common::config("p", echo_server().await, &["reset_peer:toxicity=0.5"]);
    let (proxy, _) = common::serve(config, RunContext::new(seed)).await;
    let mut hit = Vec::new();
    for i in 0..n {
        let mut client = TcpStream::connect(proxy).await.unwrap();
        client.write_all(b"ping").await.unwrap();
        match client.read_exact(&mut [0; 4]).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => hit.push(i),
            Err(e) => panic!("{e}"),
        }
    }
    hit
}

#[tokio::test]
async fn toxicity_with_a_fixed_seed_hits_a_reproducible_subset() {
    within(20, async {
        let first = reset_subset(7, 40).await;
        let again = reset_subset(7, 40).await;
        let other = reset_subset(8, 40).await;
        assert_eq!(first, again);
        assert_ne!(first, other);
        assert!(
            (8..=32).contains(&first.len()),
            "{} of 40 hit at toxicity 0.5",
            first.len()
        );
    })
    .await;
}

#[tokio::test]
async fn removing_a_blackhole_lets_the_swallowed_close_through() {
    within(10, async {
        let (proxy, p) =
            spawn_proxy(echo_server().await, &["timeout:timeout=0,stream=upstream"]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        client.write_all(b"lost").await.unwrap();
        client.shutdown().await.unwrap();
        assert!(
            timeout(Duration::from_millis(300), client.read(&mut [0; 8]))
                .await
                .is_err()
        );
        p.remove_fault("timeout_upstream").unwrap();
        // The echo server now sees the client's FIN and closes; the bytes stay lost.
        assert_eq!(client.read(&mut [0; 8]).await.unwrap(), 0);
    })
    .await;
}
