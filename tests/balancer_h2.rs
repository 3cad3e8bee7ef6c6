//! The built-in balancer speaking HTTP/2 to its backends, in clear and over TLS, and
//! handling GOAWAY as HTTP/2 means it: seen through snag's interposer (what it sent
//! and declared unprocessed, transaction ids seen twice) and the backend's own count.

mod common;

use std::{net::SocketAddr, sync::Arc};

use common::within;
use snag::{
    lab::{
        backend::{self, Backend},
        balancer::{self, BackendProtocol, BackendSpec, Balancer},
        load::{self, Arrivals, Plan, Report, Target},
    },
    proxy::{Mode, RunContext},
    shutdown::Shutdown,
};
use tokio::net::TcpListener;

async fn start_backend(tls: Option<tokio_rustls::TlsAcceptor>) -> (SocketAddr, Arc<Backend>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let backend = Backend::new(backend::Config::new("b"));
    tokio::spawn(backend::serve_tls(
        listener,
        backend.clone(),
        tls,
        Shutdown::never(),
    ));
    (addr, backend)
}

async fn start_balancer(
    to: SocketAddr,
    tune: impl FnOnce(&mut balancer::Config),
) -> (SocketAddr, Arc<Balancer>) {
    let spec = BackendSpec {
        id: "b".into(),
        addr: to,
        weight: 1,
        check: None,
    };
    let mut config = balancer::Config::new(vec![spec], 1);
    tune(&mut config);
    common::start_balancer(config).await
}

/// `n` POSTs with transaction ids over `connections` client connections.
async fn posts(to: SocketAddr, n: u64, connections: usize) -> Report {
    let mut plan = Plan::new(Target::resolve(&format!("http://{to}/")).await.unwrap());
    plan.arrivals = Arrivals::Closed { connections };
    plan.requests = Some(n);
    plan.duration = std::time::Duration::from_secs(30);
    plan.method = hyper::Method::POST;
    plan.body = bytes::Bytes::from_static(b"order");
    plan.txn_header = Some(hyper::header::HeaderName::from_static("x-request-id"));
    load::run(plan, Shutdown::never(), |_| {}).await.report
}

#[tokio::test]
async fn streams_a_goaway_declared_unprocessed_are_sent_again_and_count_as_no_failure() {
    within(60, async {
        let (backend_addr, backend) = start_backend(None).await;
        // Between balancer and backend: snag, sending GOAWAY on every connection's
        // 10th stream with a last-stream-id below the streams already in flight.
        let mut config = common::config(
            "b",
            backend_addr,
            &["goaway:after_streams=10,last_stream=below_inflight"],
        );
        config.mode = Mode::Http;
        let (snag_addr, snag) = common::serve(config, RunContext::new(1)).await;
        // One failure would take the backend out: none may count.
        let (lb, balancer) = start_balancer(snag_addr, |c| {
            c.protocol = BackendProtocol::H2c;
            c.max_fails = 1;
        })
        .await;
        let report = posts(lb, 300, 8).await;
        assert_eq!(
            (report.sent, report.ok),
            (300, 300),
            "{:?}",
            report.errors_by_kind
        );
        let stats = snag.counters().snapshot();
        assert!(stats.goaways >= 2, "{stats:?}");
        assert!(
            stats.streams_unprocessed >= 1,
            "nothing was in flight: {stats:?}"
        );
        // Each POST reached the backend once: the unprocessed ones never did.
        assert!(stats.duplicates.is_empty(), "{:?}", stats.duplicates);
        assert_eq!(backend.served(), 300);
        let lb_stats = balancer.stats();
        assert_eq!(lb_stats["protocol"], "h2c");
        assert_eq!(
            lb_stats["unprocessed_replays"].as_u64(),
            Some(stats.streams_unprocessed),
            "{lb_stats}"
        );
        assert_eq!(lb_stats["backends"][0]["errors"], 0, "{lb_stats}");
        assert_eq!(lb_stats["backends"][0]["state"], "up", "{lb_stats}");
    })
    .await;
}

/// An h2c backend that breaks HTTP/2 once a request's HEADERS reach it (a DATA
/// frame on stream 0): the client must end the connection with its own GOAWAY
/// PROTOCOL_ERROR. Counts the requests that reached it.
async fn protocol_breaking_backend() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = heads.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let heads = counted.clone();
            tokio::spawn(async move {
                // SETTINGS, empty; then the client's preface and its frames.
                stream
                    .write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
                    .await
                    .unwrap();
                let mut preface = [0; 24];
                if stream.read_exact(&mut preface).await.is_err() {
                    return;
                }
                let mut header = [0; 9];
                while stream.read_exact(&mut header).await.is_ok() {
                    let len = u32::from_be_bytes([0, header[0], header[1], header[2]]);
                    let mut payload = vec![0; len as usize];
                    if stream.read_exact(&mut payload).await.is_err() {
                        return;
                    }
                    if header[3] == 0x1 {
                        heads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let _ = stream.write_all(&[0, 0, 1, 0, 0, 0, 0, 0, 0, b'x']).await;
                    }
                }
            });
        }
    });
    (addr, heads)
}

#[tokio::test]
async fn a_goaway_the_balancer_sent_itself_never_replays_a_post() {
    within(30, async {
        let (backend_addr, heads) = protocol_breaking_backend().await;
        let (lb, balancer) = start_balancer(backend_addr, |c| {
            c.protocol = BackendProtocol::H2c;
            c.max_fails = 0;
        })
        .await;
        let reply = common::http(lb, "POST", "/orders", "{}", &[("x-request-id", "t-1")]).await;
        // The backend had the POST: its failure is no sign it was not processed.
        assert_eq!(reply.status, 502, "{}", reply.body);
        assert!(reply.body.contains("protocol error"), "{}", reply.body);
        assert_eq!(heads.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(balancer.stats()["unprocessed_replays"], 0);
    })
    .await;
}

#[tokio::test]
async fn h2_over_tls_checks_the_backends_certificate() {
    within(30, async {
        let dir = std::env::temp_dir().join(format!("snag-balancer-h2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        let identity = snag::tls::Identity::generate(&[], &ca).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(snag::tls::server(identity, None).unwrap());
        let (backend_addr, backend) = start_backend(Some(acceptor)).await;
        let (lb, balancer) = start_balancer(backend_addr, |c| {
            c.protocol = BackendProtocol::H2;
            c.backend_ca = Some(ca.clone());
        })
        .await;
        let report = posts(lb, 20, 2).await;
        assert_eq!(
            (report.sent, report.ok),
            (20, 20),
            "{:?}",
            report.errors_by_kind
        );
        assert_eq!(backend.served(), 20);
        assert_eq!(balancer.stats()["protocol"], "h2");
        // Without the run's CA the system's roots do not trust it: 502s that say TLS.
        let (lb, _) = start_balancer(backend_addr, |c| c.protocol = BackendProtocol::H2).await;
        let reply = common::http(lb, "GET", "/", "", &[]).await;
        assert_eq!(reply.status, 502);
        assert!(reply.body.contains("TLS to backend"), "{}", reply.body);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}
