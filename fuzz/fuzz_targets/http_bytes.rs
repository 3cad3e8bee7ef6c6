//! Raw bytes sent to an HTTP-mode listener: requests, chunked bodies, h2c frames
//! after the preface. snag answers, closes or resets; its tasks never panic (the
//! fuzzer's panic hook aborts on a panic in any thread, spawned tasks included).
#![no_main]

use std::{net::SocketAddr, sync::OnceLock, time::Duration};

use libfuzzer_sys::fuzz_target;
use snag::{
    fault::Mode,
    fault::config::ProxyConfig,
    lab::backend::{self, Backend, Config},
    proxy::{self, Proxy, RunContext},
    shutdown::Shutdown,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

struct Bench {
    runtime: tokio::runtime::Runtime,
    proxy: SocketAddr,
}

fn bench() -> &'static Bench {
    static BENCH: OnceLock<Bench> = OnceLock::new();
    BENCH.get_or_init(|| {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let proxy = runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
            let upstream = listener.local_addr().expect("an address");
            tokio::spawn(backend::serve(
                listener,
                Backend::new(Config::new("b")),
                Shutdown::never(),
            ));
            let any = "127.0.0.1:0".parse().expect("an address");
            let mut config = ProxyConfig::new("p", any, upstream.to_string());
            config.mode = Mode::Http;
            config.faults = vec!["http_delay:delay=0,name=d".parse().expect("a fault")];
            let proxy = Proxy::new(config, RunContext::new(1)).expect("a proxy");
            let listener = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).expect("a port");
            let addr = listener.local_addr().expect("an address");
            tokio::spawn(proxy::serve(listener, proxy, Shutdown::never()));
            addr
        });
        Bench { runtime, proxy }
    })
}

fuzz_target!(|bytes: &[u8]| {
    let bench = bench();
    bench.runtime.block_on(async {
        let mut stream = TcpStream::connect(bench.proxy).await.expect("snag accepts");
        // snag may answer and close before reading everything: a failed write is fine.
        let _ = stream.write_all(bytes).await;
        let _ = stream.shutdown().await;
        let mut answer = Vec::new();
        // An incomplete request whose connection is half-closed ends in hyper's EOF
        // error; two seconds covers an upstream round trip.
        let _ = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut answer)).await;
    });
});
