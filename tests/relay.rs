//! The relay without faults and across fault changes: bytes, half-close, resets.

mod common;

use std::{io, time::Duration};

use common::{echo_server, pattern, spawn_proxy, within};
use proptest::prelude::*;
use snag::proxy::{RunContext, relay::OnUpstreamError};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

#[tokio::test]
async fn passthrough_relays_every_byte_both_ways() {
    within(20, async {
        let (proxy, _) = spawn_proxy(echo_server().await, &[]).await;
        let data = pattern(8 << 20, 1);
        assert!(common::round_trip(proxy, &data).await == data);
    })
    .await;
}

#[tokio::test]
async fn nil_faults_relay_every_byte_both_ways() {
    // Their chunks come back from the chain due at once, so the relay writes them as
    // it reads them, without its queue (a partial write is the relay's unit tests').
    within(60, async {
        for fault in [
            "latency:latency=0",
            "bandwidth:rate=100000000",
            "slicer:average_size=1048576,size_variation=0,delay=0",
        ] {
            let (proxy, _) = spawn_proxy(echo_server().await, &[fault]).await;
            let data = pattern(8 << 20, 2);
            assert!(common::round_trip(proxy, &data).await == data, "{fault}");
        }
    })
    .await;
}

#[tokio::test]
async fn client_half_close_still_gets_the_whole_answer() {
    within(10, async {
        // A server that reads to EOF, then answers, then closes.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await; // the answer comes late on purpose
            s.write_all(format!("got {} bytes", got.len()).as_bytes())
                .await
                .unwrap();
        });
        let (proxy, _) = spawn_proxy(backend, &[]).await;
        let answer = common::round_trip(proxy, &[7; 100_000]).await;
        assert_eq!(answer, b"got 100000 bytes");
    })
    .await;
}

#[tokio::test]
async fn server_half_close_leaves_the_client_direction_open() {
    within(10, async {
        // A server that says hello, half-closes, and then reads what the client sends.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            let (mut r, mut w) = s.into_split();
            w.write_all(b"hello").await.unwrap();
            w.shutdown().await.unwrap();
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            tx.send(got).unwrap();
        });
        let (proxy, _) = spawn_proxy(backend, &[]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let mut hello = Vec::new();
        client.read_to_end(&mut hello).await.unwrap(); // EOF: the server's FIN came through
        assert_eq!(hello, b"hello");
        client.write_all(b"still here").await.unwrap();
        client.shutdown().await.unwrap();
        assert_eq!(rx.await.unwrap(), b"still here");
    })
    .await;
}

#[tokio::test]
async fn refused_upstream_resets_the_client_or_closes_it() {
    within(10, async {
        let (dead, _held) = common::refusing_port();
        let (proxy, _) = spawn_proxy(dead, &[]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        let err = client.read(&mut [0; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);

        let mut context = RunContext::new(1);
        context.on_upstream_error = OnUpstreamError::Close;
        let (proxy, _) = common::serve(common::config("p", dead, &[]), context).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        assert_eq!(client.read(&mut [0; 8]).await.unwrap(), 0);
    })
    .await;
}

#[tokio::test]
async fn upstream_reset_mid_stream_reaches_the_client_as_a_reset() {
    within(10, async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0; 4];
            s.read_exact(&mut buf).await.unwrap();
            snag::proxy::socket::reset_on_close(&s);
            drop(s); // RST
        });
        let (proxy, _) = spawn_proxy(backend, &[]).await;
        let mut client = TcpStream::connect(proxy).await.unwrap();
        client.write_all(b"ping").await.unwrap();
        let err = client.read(&mut [0; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
    })
    .await;
}

#[tokio::test]
async fn faults_added_and_removed_at_run_time_reach_open_connections() {
    within(10, async {
        let (addr, proxy) = spawn_proxy(echo_server().await, &[]).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        common::rtt(&mut client).await;
        proxy
            .add_fault("latency:latency=150".parse().unwrap())
            .unwrap();
        let slow = common::rtt(&mut client).await;
        assert!(slow >= Duration::from_millis(150), "{slow:?}");
        // Made to hold a message a minute, past the test's deadline; removing it must
        // release the message now (the paused-time tests in `relay` time it exactly).
        proxy.remove_fault("latency_downstream").unwrap();
        proxy
            .add_fault("latency:latency=60000".parse().unwrap())
            .unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0; 4];
        let early = tokio::time::timeout(Duration::from_millis(200), client.read_exact(&mut buf));
        assert!(early.await.is_err(), "the minute's latency did not hold");
        proxy.remove_fault("latency_downstream").unwrap();
        client.read_exact(&mut buf).await.unwrap();
        common::rtt(&mut client).await;
        // And the listener never closed: new connections work throughout.
        let mut other = TcpStream::connect(addr).await.unwrap();
        common::rtt(&mut other).await;
    })
    .await;
}

#[tokio::test]
async fn an_idle_faulted_connection_still_hears_a_fault_change() {
    within(10, async {
        let (addr, proxy) = spawn_proxy(echo_server().await, &["latency:latency=1"]).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        // Both directions have relayed and wait with nothing held: at rest.
        common::rtt(&mut client).await;
        proxy.add_fault("down".parse().unwrap()).unwrap();
        let mut buf = [0; 1];
        let closed = client.read(&mut buf).await;
        assert!(
            matches!(closed, Ok(0) | Err(_)),
            "the connection outlived `down`: {closed:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn removing_a_stalling_fault_releases_what_it_held() {
    within(10, async {
        let (addr, proxy) = spawn_proxy(echo_server().await, &["bandwidth:rate=0"]).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"held").await.unwrap();
        let mut buf = [0; 4];
        let stalled = tokio::time::timeout(Duration::from_millis(300), client.read(&mut buf)).await;
        assert!(stalled.is_err(), "rate 0 let data through");
        proxy.remove_fault("bandwidth_downstream").unwrap();
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"held");
    })
    .await;
}

const PRESERVING: &[&str] = &[
    "latency:latency=3,jitter=2",
    "latency:latency=1,stream=upstream",
    "slicer:average_size=700,size_variation=300,delay=100",
    "slicer:average_size=50,size_variation=10,delay=0,stream=upstream",
    "bandwidth:rate=50000",
    "bandwidth:rate=80000,stream=upstream",
    "loss:probability=0.05,rto=2,segment=4000",
    "loss:probability=0.1,rto=1,stream=upstream",
    "slow_close:delay=5",
    "slow_close:delay=5,stream=upstream",
    "latency:latency=2,toxicity=0.5",
    "latency:latency=0",
    "bandwidth:rate=100000000,stream=upstream",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn byte_preserving_chains_never_change_a_byte(
        picks in proptest::sample::subsequence((0..PRESERVING.len()).collect::<Vec<_>>(), 0..=5),
        order in any::<u64>(),
        len in 0usize..300_000,
        seed in any::<u32>(),
    ) {
        let mut picks = picks;
        // Order matters in a chain; shuffle the chosen stages by the drawn number.
        picks.sort_by_key(|i| (*i as u64).wrapping_mul(order | 1).rotate_left(7));
        let specs: Vec<String> = picks.iter().enumerate().map(|(n, i)| format!("{},name=f{n}", PRESERVING[*i])).collect();
        let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
        let data = pattern(len, seed);
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let got = runtime.block_on(within(30, async {
            let (proxy, _) = common::serve(common::config("p", echo_server().await, &specs), RunContext::new(u64::from(seed))).await;
            common::round_trip(proxy, &data).await
        }));
        prop_assert!(got == data, "chain {specs:?} changed {len} bytes");
    }
}
