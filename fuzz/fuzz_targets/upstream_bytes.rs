//! Raw bytes an upstream answers an HTTP-mode request with: response heads, interim
//! responses, lengths, chunked bodies with trailers, garbage, an early close. snag
//! answers the client (the response, or a 502 that says why) or cuts its body; its
//! tasks never panic (the fuzzer's panic hook aborts on a panic in any thread).
#![no_main]

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use libfuzzer_sys::fuzz_target;
use snag::{
    fault::Mode,
    fault::config::ProxyConfig,
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
    /// What the upstream answers the next request with.
    answer: Arc<Mutex<Vec<u8>>>,
}

fn bench() -> &'static Bench {
    static BENCH: OnceLock<Bench> = OnceLock::new();
    BENCH.get_or_init(|| {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let answer = Arc::new(Mutex::new(Vec::new()));
        let proxy = runtime.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
            let upstream = listener.local_addr().expect("an address");
            let answers = answer.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((mut stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let answer = answers.lock().expect("no panics").clone();
                    tokio::spawn(async move {
                        // The request head, then the answer, then the close.
                        let mut request = [0u8; 4096];
                        let _ = stream.read(&mut request).await;
                        let _ = stream.write_all(&answer).await;
                        let _ = stream.shutdown().await;
                    });
                }
            });
            let any = "127.0.0.1:0".parse().expect("an address");
            let mut config = ProxyConfig::new("p", any, upstream.to_string());
            config.mode = Mode::Http;
            let proxy = Proxy::new(config, RunContext::new(1)).expect("a proxy");
            let listener = proxy::socket::bind("127.0.0.1:0".parse().unwrap()).expect("a port");
            let addr = listener.local_addr().expect("an address");
            tokio::spawn(proxy::serve(listener, proxy, Shutdown::never()));
            addr
        });
        Bench {
            runtime,
            proxy,
            answer,
        }
    })
}

fuzz_target!(|bytes: &[u8]| {
    let bench = bench();
    *bench.answer.lock().expect("no panics") = bytes.to_vec();
    bench.runtime.block_on(async {
        let mut stream = TcpStream::connect(bench.proxy).await.expect("snag accepts");
        let _ = stream
            .write_all(b"GET /x HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
            .await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut answer)).await;
    });
});
