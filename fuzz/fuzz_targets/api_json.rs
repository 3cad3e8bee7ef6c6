//! Control-API bodies, every endpoint that reads one: the first byte picks the
//! endpoint, the rest is the body. Each input runs against a fresh API holding proxy
//! `p` (loopback, TCP) with toxic `t`; any answer is fine, a panic or a 5xx other
//! than a listen failure is not.
#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use hyper::Method;
use libfuzzer_sys::fuzz_target;
use snag::{
    api::{self, Api},
    proxy::RunContext,
    shutdown::Shutdown,
};

const ENDPOINTS: &[(&str, &str)] = &[
    ("POST", "/proxies"),
    ("POST", "/populate"),
    ("POST", "/proxies/p"),
    ("PATCH", "/proxies/p"),
    ("POST", "/proxies/p/toxics"),
    ("POST", "/proxies/p/toxics/t"),
    ("PATCH", "/proxies/p/toxics/t"),
    ("POST", "/proxies/p/drain"),
];

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Runtime::new().expect("a runtime"))
}

fn files() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("snag-fuzz-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

fuzz_target!(|input: &[u8]| {
    let Some((&pick, body)) = input.split_first() else {
        return;
    };
    let (method, path) = ENDPOINTS[usize::from(pick) % ENDPOINTS.len()];
    let method: Method = method.parse().expect("a method");
    runtime().block_on(async {
        let shutdown = Shutdown::new();
        // Files named in bodies go to a scratch directory of the target's own.
        let settings = api::Settings {
            files: Some(files()),
            ..api::Settings::default()
        };
        let api = Api::new(RunContext::new(1), settings, shutdown.clone());
        let setup = [
            (
                "POST",
                "/proxies",
                r#"{"name":"p","listen":"127.0.0.1:0","upstream":"127.0.0.1:9"}"#,
            ),
            (
                "POST",
                "/proxies/p/toxics",
                r#"{"name":"t","type":"latency","attributes":{"latency":1}}"#,
            ),
        ];
        for (m, p, b) in setup {
            let reply = api::call(&api, &m.parse().unwrap(), p, &Bytes::from(b)).await;
            assert!(reply.status().is_success(), "setup {p}: {}", reply.status());
        }
        let reply = api::call(&api, &method, path, &Bytes::copy_from_slice(body)).await;
        let status = reply.status().as_u16();
        // 500 is how Toxiproxy reports a listen that failed; above it is never right.
        assert!(status <= 500, "{method} {path}: {status}");
        shutdown.trigger();
        api.stop().await;
        for entry in std::fs::read_dir(files()).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
    });
});
