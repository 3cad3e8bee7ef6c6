//! A separate probe listener: faults scoped `probe` hit what the balancer's health
//! checker sees, faults scoped `data` what clients see, in TCP and HTTP mode.

mod common;

use std::{io, net::SocketAddr, sync::Arc, time::Duration};

use common::{echo_server, http, http_backend, within};
use snag::{
    proxy::{self, Mode, Proxy, RunContext},
    shutdown::Shutdown,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::timeout,
};

/// A proxy with a data listener and a probe listener: (data, probes, proxy).
async fn two_listeners(
    upstream: SocketAddr,
    mode: Mode,
    faults: &[&str],
) -> (SocketAddr, SocketAddr, Arc<Proxy>) {
    let data = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let probes = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let (data_addr, probe_addr) = (data.local_addr().unwrap(), probes.local_addr().unwrap());
    let mut config = common::config("p", upstream, faults);
    config.mode = mode;
    config.probe_listen = Some(probe_addr);
    let proxy = Proxy::new(config, RunContext::new(1)).unwrap();
    tokio::spawn(proxy::serve(data, proxy.clone(), Shutdown::never()));
    tokio::spawn(proxy::serve_probes(
        probes,
        proxy.clone(),
        Shutdown::never(),
    ));
    (data_addr, probe_addr, proxy)
}

async fn echoes(addr: SocketAddr) -> io::Result<()> {
    let mut c = TcpStream::connect(addr).await?;
    c.write_all(b"ping").await?;
    let mut buf = [0; 4];
    c.read_exact(&mut buf).await?;
    assert_eq!(&buf, b"ping");
    Ok(())
}

#[tokio::test]
async fn a_probe_scoped_syn_drop_times_out_health_checks_only() {
    within(15, async {
        let (data, probes, _) =
            two_listeners(echo_server().await, Mode::Tcp, &["syn_drop:scope=probe"]).await;
        let mut timed_out = false;
        for _ in 0..5 {
            if timeout(Duration::from_millis(300), TcpStream::connect(probes))
                .await
                .is_err()
            {
                timed_out = true;
                break;
            }
        }
        assert!(timed_out, "a probe connect went through");
        echoes(data).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn data_scoped_faults_spare_the_probe_listener() {
    within(10, async {
        let (data, probes, proxy) =
            two_listeners(echo_server().await, Mode::Tcp, &["reset_peer:scope=data"]).await;
        assert_eq!(
            echoes(data).await.unwrap_err().kind(),
            io::ErrorKind::ConnectionReset
        );
        echoes(probes).await.unwrap();
        proxy.remove_fault("reset_peer_downstream").unwrap();
        proxy.add_fault("down:scope=data".parse().unwrap()).unwrap();
        common::refused(data).await;
        echoes(probes).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn every_request_on_the_probe_listener_is_a_probe() {
    within(10, async {
        let (backend, _) = http_backend("ok").await;
        let (data, probes, proxy) =
            two_listeners(backend, Mode::Http, &["http_status:status=503,scope=probe"]).await;
        assert_eq!(http(probes, "GET", "/orders", "", &[]).await.status, 503);
        assert_eq!(http(data, "GET", "/orders", "", &[]).await.status, 200);
        let stats = proxy.counters().snapshot();
        assert_eq!((stats.requests["probe"], stats.requests["data"]), (1, 1));
    })
    .await;
}
