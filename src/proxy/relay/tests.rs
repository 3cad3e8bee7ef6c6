//! The relay over in-memory pipes under paused time: exact stage timing, half-close in
//! both orders, held chunks released by a fault change, and resets on the right legs.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf, duplex, split},
    sync::watch,
    task::JoinHandle,
    time::Instant,
};

use super::*;
use bytes::Bytes;

use crate::fault::{Direction, Scope};

/// The relay's end of an in-memory connection; remembers whether its close was made a
/// reset.
struct Pipe {
    read: ReadHalf<DuplexStream>,
    write: WriteHalf<DuplexStream>,
    reset: Arc<AtomicBool>,
}

impl Source for ReadHalf<DuplexStream> {}
impl Sink for WriteHalf<DuplexStream> {}

impl Stream for Pipe {
    type Reader<'a> = &'a mut ReadHalf<DuplexStream>;
    type Writer<'a> = &'a mut WriteHalf<DuplexStream>;

    fn halves(&mut self) -> (Self::Reader<'_>, Self::Writer<'_>) {
        (&mut self.read, &mut self.write)
    }

    fn reset_on_close(&self) {
        self.reset.store(true, Ordering::Relaxed);
    }

    fn ends(&self) -> Option<(SocketAddr, SocketAddr)> {
        None
    }
}

/// A relay between two pipes, the test holding the far end of each.
struct Rig {
    /// What the client holds.
    client: DuplexStream,
    /// What the upstream holds.
    upstream: DuplexStream,
    faults: watch::Sender<Arc<Vec<Arc<Fault>>>>,
    control: Arc<Control>,
    client_reset: Arc<AtomicBool>,
    upstream_reset: Arc<AtomicBool>,
    relay: JoinHandle<Outcome>,
}

fn faults(specs: &[&str]) -> Arc<Vec<Arc<Fault>>> {
    Arc::new(
        specs
            .iter()
            .map(|s| Arc::new(s.parse::<Fault>().unwrap()))
            .collect(),
    )
}

fn pipe() -> (Pipe, DuplexStream, Arc<AtomicBool>) {
    let (ours, theirs) = duplex(1 << 20);
    let (read, write) = split(ours);
    let reset = Arc::new(AtomicBool::new(false));
    let pipe = Pipe {
        read,
        write,
        reset: reset.clone(),
    };
    (pipe, theirs, reset)
}

/// The one connection of a test.
fn conn_id() -> ConnId<'static> {
    ConnId {
        seed: 1,
        proxy: "p",
        conn: 0,
        class: Scope::Any,
    }
}

fn rig(specs: &[&str], policy: OnUpstreamError) -> Rig {
    let (mut client_pipe, client, client_reset) = pipe();
    let (mut upstream_pipe, upstream, upstream_reset) = pipe();
    let (tx, rx) = watch::channel(faults(specs));
    let control = Arc::new(Control::default());
    let relay = tokio::spawn({
        let control = control.clone();
        async move {
            let id = conn_id();
            run(
                &mut client_pipe,
                &mut upstream_pipe,
                &rx,
                &control,
                id,
                policy,
                Evidence::default(),
            )
            .await
        }
    });
    Rig {
        client,
        upstream,
        faults: tx,
        control,
        client_reset,
        upstream_reset,
        relay,
    }
}

async fn read_exact(from: &mut DuplexStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0; n];
    from.read_exact(&mut buf).await.unwrap();
    buf
}

async fn at_eof(from: &mut DuplexStream) -> bool {
    let mut buf = [0; 16];
    from.read(&mut buf).await.unwrap() == 0
}

#[tokio::test(start_paused = true)]
async fn without_faults_bytes_and_fins_pass_at_once_both_ways() {
    let mut r = rig(&[], OnUpstreamError::Reset);
    let t0 = Instant::now();
    r.client.write_all(b"ping").await.unwrap();
    assert_eq!(read_exact(&mut r.upstream, 4).await, b"ping");
    r.upstream.write_all(b"pong").await.unwrap();
    assert_eq!(read_exact(&mut r.client, 4).await, b"pong");
    r.client.shutdown().await.unwrap();
    assert!(at_eof(&mut r.upstream).await);
    r.upstream.shutdown().await.unwrap();
    assert!(at_eof(&mut r.client).await);
    let outcome = r.relay.await.unwrap();
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert_eq!(outcome.ending, Ending::Eof);
    assert_eq!((outcome.sent_up, outcome.sent_down), (4, 4));
    assert!(!r.client_reset.load(Ordering::Relaxed));
    assert!(!r.upstream_reset.load(Ordering::Relaxed));
}

/// A chunk leaves within half a timer tick of its due time (see `timer`).
fn near(elapsed: Duration, want: Duration) -> bool {
    elapsed.abs_diff(want) <= Duration::from_micros(500)
}

#[tokio::test(start_paused = true)]
async fn latency_holds_each_chunk_for_exactly_its_time() {
    let mut r = rig(
        &["latency:latency=100,stream=upstream"],
        OnUpstreamError::Reset,
    );
    let t0 = Instant::now();
    r.client.write_all(b"first").await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    r.client.write_all(b"second").await.unwrap();
    assert_eq!(read_exact(&mut r.upstream, 5).await, b"first");
    assert!(
        near(t0.elapsed(), Duration::from_millis(100)),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(read_exact(&mut r.upstream, 6).await, b"second");
    assert!(
        near(t0.elapsed(), Duration::from_millis(130)),
        "{:?}",
        t0.elapsed()
    );
    // The other way is not delayed.
    let t1 = Instant::now();
    r.upstream.write_all(b"back").await.unwrap();
    assert_eq!(read_exact(&mut r.client, 4).await, b"back");
    assert_eq!(t1.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn bandwidth_paces_a_direction_to_its_rate() {
    // 10 KB/s: 5,000 bytes take half a second.
    let mut r = rig(&["bandwidth:rate=10"], OnUpstreamError::Reset);
    let t0 = Instant::now();
    r.upstream.write_all(&[7; 5000]).await.unwrap();
    assert_eq!(read_exact(&mut r.client, 5000).await, vec![7; 5000]);
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_millis(450) && elapsed <= Duration::from_millis(510),
        "{elapsed:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_fin_follows_its_delayed_data_while_the_answer_flows_back() {
    let mut r = rig(
        &["latency:latency=50,stream=upstream"],
        OnUpstreamError::Reset,
    );
    let t0 = Instant::now();
    r.client.write_all(b"request").await.unwrap();
    r.client.shutdown().await.unwrap();
    assert_eq!(read_exact(&mut r.upstream, 7).await, b"request");
    assert!(at_eof(&mut r.upstream).await);
    assert!(
        near(t0.elapsed(), Duration::from_millis(50)),
        "{:?}",
        t0.elapsed()
    );
    // Half-closed: the upstream still answers, and the answer reaches the client.
    r.upstream.write_all(b"answer").await.unwrap();
    assert_eq!(read_exact(&mut r.client, 6).await, b"answer");
    r.upstream.shutdown().await.unwrap();
    assert!(at_eof(&mut r.client).await);
    let outcome = r.relay.await.unwrap();
    assert_eq!(outcome.ending, Ending::Eof);
    assert_eq!(outcome.applied, ["latency_upstream"]);
    assert!(!r.client_reset.load(Ordering::Relaxed));
}

#[tokio::test(start_paused = true)]
async fn an_upstream_fin_first_leaves_the_client_sending() {
    let mut r = rig(&["latency:latency=20"], OnUpstreamError::Reset);
    let t0 = Instant::now();
    r.upstream.write_all(b"bye").await.unwrap();
    r.upstream.shutdown().await.unwrap();
    assert_eq!(read_exact(&mut r.client, 3).await, b"bye");
    assert!(at_eof(&mut r.client).await);
    assert!(near(t0.elapsed(), Duration::from_millis(20)));
    r.client.write_all(b"still here").await.unwrap();
    assert_eq!(read_exact(&mut r.upstream, 10).await, b"still here");
    r.client.shutdown().await.unwrap();
    assert!(at_eof(&mut r.upstream).await);
    assert_eq!(r.relay.await.unwrap().ending, Ending::Eof);
}

#[tokio::test(start_paused = true)]
async fn removing_a_fault_releases_what_it_held_at_once() {
    let mut r = rig(
        &["latency:latency=10000,stream=upstream"],
        OnUpstreamError::Reset,
    );
    let t0 = Instant::now();
    r.client.write_all(b"held").await.unwrap();
    let reader = tokio::spawn(async move {
        let got = read_exact(&mut r.upstream, 4).await;
        (got, Instant::now())
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    r.faults.send_replace(faults(&[]));
    r.control.poke();
    let (got, at) = reader.await.unwrap();
    assert_eq!(got, b"held");
    assert_eq!(at - t0, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_blackhole_removed_lets_the_swallowed_fin_through() {
    let mut r = rig(
        &["timeout:timeout=0,stream=upstream"],
        OnUpstreamError::Reset,
    );
    r.client.write_all(b"lost").await.unwrap();
    r.client.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    r.faults.send_replace(faults(&[]));
    r.control.poke();
    // What the blackhole swallowed is gone; the FIN it held is not.
    assert!(at_eof(&mut r.upstream).await);
}

#[tokio::test(start_paused = true)]
async fn reset_peer_resets_both_legs_at_its_timeout() {
    let mut r = rig(
        &["reset_peer:timeout=200,stream=upstream"],
        OnUpstreamError::Close,
    );
    let t0 = Instant::now();
    r.client.write_all(b"x").await.unwrap();
    let outcome = r.relay.await.unwrap();
    assert!(
        near(t0.elapsed(), Duration::from_millis(200)),
        "{:?}",
        t0.elapsed()
    );
    assert!(outcome.fault_reset);
    assert_eq!(
        outcome.ending,
        Ending::Fault {
            name: "reset_peer_upstream".into()
        }
    );
    assert!(r.client_reset.load(Ordering::Relaxed));
    assert!(r.upstream_reset.load(Ordering::Relaxed));
}

#[tokio::test(start_paused = true)]
async fn an_upstream_gone_is_passed_on_as_the_policy_says() {
    for (policy, client_reset) in [
        (OnUpstreamError::Reset, true),
        (OnUpstreamError::Close, false),
    ] {
        let mut r = rig(&[], policy);
        drop(r.upstream);
        r.client.write_all(b"to nobody").await.unwrap();
        let outcome = r.relay.await.unwrap();
        assert_eq!(outcome.ending, Ending::Reset { by: Side::Upstream });
        assert_eq!(r.client_reset.load(Ordering::Relaxed), client_reset);
        assert!(!r.upstream_reset.load(Ordering::Relaxed));
    }
}

#[tokio::test(start_paused = true)]
async fn a_drain_reset_ends_a_busy_connection_on_both_legs() {
    let mut r = rig(&["latency:latency=1000"], OnUpstreamError::Reset);
    r.upstream.write_all(b"in flight").await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(r.control.reset());
    let outcome = r.relay.await.unwrap();
    assert_eq!(
        outcome.ending,
        Ending::Fault {
            name: "drain".into()
        }
    );
    assert!(r.client_reset.load(Ordering::Relaxed));
    assert!(r.upstream_reset.load(Ordering::Relaxed));
    // Nothing held was delivered: the reset dropped it.
    let mut buf = [0; 16];
    assert_eq!(r.client.read(&mut buf).await.unwrap(), 0);
}

#[tokio::test(start_paused = true)]
async fn slicer_sends_pieces_at_its_delay_apart() {
    let mut r = rig(
        &["slicer:average_size=10,size_variation=0,delay=5000"],
        OnUpstreamError::Reset,
    );
    r.upstream.write_all(&[1; 40]).await.unwrap();
    let t0 = Instant::now();
    let mut arrivals = Vec::new();
    let mut got = 0;
    while got < 40 {
        let mut buf = [0; 64];
        got += r.client.read(&mut buf).await.unwrap();
        arrivals.push((got, t0.elapsed()));
    }
    let gaps: Vec<Duration> = arrivals.windows(2).map(|w| w[1].1 - w[0].1).collect();
    assert_eq!(arrivals.len(), 4, "{arrivals:?}");
    for gap in gaps {
        assert!(near(gap, Duration::from_millis(5)), "{arrivals:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn slow_close_holds_the_fin_but_not_the_data() {
    let mut r = rig(&["slow_close:delay=300"], OnUpstreamError::Reset);
    let t0 = Instant::now();
    r.upstream.write_all(b"last").await.unwrap();
    r.upstream.shutdown().await.unwrap();
    assert_eq!(read_exact(&mut r.client, 4).await, b"last");
    assert_eq!(t0.elapsed(), Duration::ZERO);
    assert!(at_eof(&mut r.client).await);
    assert!(
        near(t0.elapsed(), Duration::from_millis(300)),
        "{:?}",
        t0.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_connection_is_hit_only_by_the_faults_that_acted_on_it() {
    // Three faults apply: latency=0 changes nothing, slicer splits what goes up, and
    // reset_peer ends the connection. Only the two that acted count it, and the
    // ending names the one that reset it, not every fault in the chain.
    let mut r = rig(
        &[
            "latency:latency=0,stream=downstream",
            "slicer:average_size=2,size_variation=0,delay=0,stream=upstream",
            "reset_peer:timeout=50,stream=downstream",
        ],
        OnUpstreamError::Close,
    );
    r.client.write_all(b"abcd").await.unwrap();
    assert_eq!(read_exact(&mut r.upstream, 4).await, b"abcd");
    // reset_peer holds what it is given and resets 50 ms after the first of it.
    r.upstream.write_all(b"back").await.unwrap();
    let outcome = r.relay.await.unwrap();
    assert_eq!(
        outcome.ending,
        Ending::Fault {
            name: "reset_peer_downstream".into()
        }
    );
    let mut hit = outcome.hit.clone();
    hit.sort();
    assert_eq!(hit, ["reset_peer_downstream", "slicer_upstream"]);
    assert_eq!(outcome.applied.len(), 3, "{:?}", outcome.applied);
}

/// A chunk due as it is read goes straight to the socket, as far as the socket takes
/// it; the rest is queued after what was written, and nothing is written twice.
#[tokio::test]
async fn a_chunk_due_at_once_is_written_as_far_as_the_socket_takes_it() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (dst, accepted) = tokio::join!(
        tokio::net::TcpStream::connect(listener.local_addr().unwrap()),
        listener.accept()
    );
    let (mut dst, (mut peer, _)) = (dst.unwrap(), accepted.unwrap());
    // Room for far less than the chunk while the peer does not read.
    socket2::SockRef::from(&dst)
        .set_send_buffer_size(4096)
        .unwrap();
    let (mut src, _client, _) = pipe();
    let (_tx, rx) = watch::channel(faults(&["latency:latency=0"]));
    let control = Control::default();
    let id = conn_id();
    let (_, write) = dst.split();
    let evidence = Evidence::default();
    let mut flow = Flow::new(
        Direction::Upstream,
        &mut src.read,
        write,
        rx,
        &control,
        id,
        &evidence,
    );
    assert!(flow.sync(false).is_none());
    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 251) as u8).collect();
    flow.took(Bytes::from(data.clone()), Instant::now());
    let written = flow.sent as usize;
    assert!(written > 0 && written < data.len(), "{written}");
    assert_eq!(flow.queued, data.len() - written);
    let reader = tokio::spawn(async move {
        let mut got = vec![0; 4 << 20];
        peer.read_exact(&mut got).await.unwrap();
        got
    });
    while !flow.queue.is_empty() {
        assert!(flow.send_head().await.is_none());
    }
    assert_eq!(flow.sent as usize, data.len());
    assert!(reader.await.unwrap() == data);
}
