//! gRPC through HTTP mode, seen by grpcio (Python's binding of gRPC's C core) as
//! both the client and the server: calls and health checks pass unchanged, over
//! h2c and TLS, and the gRPC faults give each status and NOT_SERVING.

mod common;

use std::{net::SocketAddr, path::PathBuf, process::Stdio};

use common::{
    process::{Process, run_blocking},
    within,
};
use snag::{
    fault::config::UpstreamProtocol,
    proxy::{Mode, RunContext},
    tls::ListenTls,
};

fn peer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/grpc/peer.py")
}

/// grpcio's server on a loopback port, until the test ends.
async fn grpc_server() -> (SocketAddr, Process) {
    let mut command = tokio::process::Command::new("python3");
    command.arg(peer()).arg("serve").stdin(Stdio::piped());
    let mut server = Process::spawn(command);
    let port: u16 = server.line(20, |l| l.trim().parse().ok()).await;
    (SocketAddr::from(([127, 0, 0, 1], port)), server)
}

/// One grpcio client call (`health` or `say TEXT`) to `target`: what it printed.
async fn client(args: &[&str]) -> serde_json::Value {
    let mut command = tokio::process::Command::new("python3");
    command.arg(peer()).args(args);
    let (code, out) = Process::run(command, 30).await;
    assert_eq!(code, 0, "peer.py {args:?}: {out}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// `snag load ARGS --json`: its report.
async fn load_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["load"];
    all.extend_from_slice(args);
    all.push("--json");
    let mut command = common::process::snag(&all);
    command.stderr(Stdio::null());
    let (code, out) = Process::run(command, 30).await;
    assert_eq!(code, 0, "snag {all:?}: {out}");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// An HTTP proxy with `faults`, h2c to `upstream`.
async fn grpc_proxy(
    upstream: SocketAddr,
    faults: &[&str],
) -> (SocketAddr, std::sync::Arc<snag::proxy::Proxy>) {
    let mut config = common::config("g", upstream, faults);
    config.mode = Mode::Http;
    config.upstream_protocol = UpstreamProtocol::H2c;
    common::serve(config, RunContext::new(1)).await
}

#[tokio::test]
async fn grpc_calls_and_health_checks_pass_and_checks_count_as_probes() {
    within(60, async {
        let (server, _s) = grpc_server().await;
        let (addr, proxy) = grpc_proxy(server, &[]).await;
        let target = addr.to_string();
        assert_eq!(client(&["health", &target]).await["status"], "SERVING");
        assert_eq!(client(&["say", &target, "hi"]).await["reply"], "echo:hi");
        let stats = proxy.counters().snapshot();
        assert_eq!((stats.requests["probe"], stats.requests["data"]), (1, 1));
        assert_eq!(stats.probes[0].path, "/grpc.health.v1.Health/Check");
    })
    .await;
}

#[tokio::test]
async fn grpc_over_tls_with_the_runs_certificate() {
    within(60, async {
        let dir = common::Scratch::new("snag-grpc");
        let ca = dir.join("ca.pem");
        let (server, _s) = grpc_server().await;
        let mut config = common::config("gt", server, &[]);
        config.mode = Mode::Http;
        config.upstream_protocol = UpstreamProtocol::Auto;
        config.tls = Some(ListenTls::Generated {
            ca_out: ca.clone(),
            names: Vec::new(),
        });
        let (addr, _) = common::serve(config, RunContext::new(1)).await;
        let target = format!("localhost:{}", addr.port());
        let ca = ca.to_str().unwrap();
        assert_eq!(client(&["health", &target, ca]).await["status"], "SERVING");
        assert_eq!(
            client(&["say", &target, "tls", ca]).await["reply"],
            "echo:tls"
        );
    })
    .await;
}

#[tokio::test]
async fn grpc_health_fails_the_checks_while_calls_pass() {
    within(60, async {
        let (server, _s) = grpc_server().await;
        let (addr, _) = grpc_proxy(server, &["grpc_health"]).await;
        let target = addr.to_string();
        assert_eq!(client(&["health", &target]).await["status"], "NOT_SERVING");
        assert_eq!(client(&["say", &target, "hi"]).await["reply"], "echo:hi");
        let (addr, _) = grpc_proxy(server, &["grpc_health:status=SERVICE_UNKNOWN"]).await;
        assert_eq!(
            client(&["health", &addr.to_string()]).await["status"],
            "SERVICE_UNKNOWN"
        );
    })
    .await;
}

#[tokio::test]
async fn grpc_status_answers_calls_with_the_status_and_http_faults_act_on_grpc() {
    within(60, async {
        let (server, _s) = grpc_server().await;
        // Data calls only: the health check still passes.
        let (addr, _) = grpc_proxy(
            server,
            &["grpc_status:code=14,message=down for maintenance,scope=data"],
        )
        .await;
        let target = addr.to_string();
        let said = client(&["say", &target, "hi"]).await;
        assert_eq!(
            (said["code"].as_str(), said["details"].as_str()),
            (Some("UNAVAILABLE"), Some("down for maintenance")),
            "{said}"
        );
        assert_eq!(client(&["health", &target]).await["status"], "SERVING");
        let (addr, _) = grpc_proxy(server, &["grpc_status:code=7"]).await;
        assert_eq!(
            client(&["say", &addr.to_string(), "hi"]).await["code"],
            "PERMISSION_DENIED"
        );
        // An HTTP fault on a gRPC call: a 503 is UNAVAILABLE to a gRPC client.
        let (addr, _) = grpc_proxy(server, &["http_status:status=503"]).await;
        assert_eq!(
            client(&["say", &addr.to_string(), "hi"]).await["code"],
            "UNAVAILABLE"
        );
    })
    .await;
}

#[test]
fn the_grpc_peer_is_installed() {
    let mut command = tokio::process::Command::new("python3");
    command.args(["-c", "import grpc, grpc_health.v1.health"]);
    let (code, out) = run_blocking(command, 30);
    assert_eq!(
        code, 0,
        "grpcio and grpcio-health-checking are installed (scripts/install-deps.sh): {out}"
    );
}

#[tokio::test]
async fn snag_backend_serves_grpc_health_and_a_unary_call_over_tls_and_h2c() {
    within(90, async {
        let dir = common::Scratch::new("snag-grpc-backend");
        let ca = dir.join("ca.pem");
        let ca_arg = ca.to_str().unwrap().to_string();
        let start = |extra: Vec<String>| async move {
            let mut args = vec!["backend", "--id", "g", "--listen", "127.0.0.1:0"];
            args.extend(extra.iter().map(String::as_str));
            let mut backend = Process::spawn(common::process::snag(&args));
            let addr: SocketAddr = backend
                .line(20, |l| l.split_whitespace().nth(4)?.parse().ok())
                .await;
            (addr, backend)
        };
        let (tls, _b) = start(vec!["--tls-generate".into(), ca_arg.clone()]).await;
        let target = format!("localhost:{}", tls.port());
        let ca = ca_arg.as_str();
        assert_eq!(client(&["health", &target, ca]).await["status"], "SERVING");
        assert_eq!(
            client(&["call", &target, "/snag.Backend/Echo", "hi", ca]).await["reply"],
            "g:hi"
        );
        assert_eq!(
            client(&["call", &target, "/snag.Backend/Nope", "hi", ca]).await["code"],
            "UNIMPLEMENTED"
        );
        // Unhealthy (through its admin route, over HTTPS by curl): the checks say
        // NOT_SERVING while calls still pass.
        let url = format!("https://localhost:{}/admin/health", tls.port());
        let admin = common::curl(
            &url,
            &["--cacert", ca, "-X", "POST", "-d", r#"{"healthy":false}"#],
        )
        .await;
        assert_eq!(admin.status, 200, "{}", admin.stderr);
        assert_eq!(
            client(&["health", &target, ca]).await["status"],
            "NOT_SERVING"
        );
        assert_eq!(
            client(&["call", &target, "/snag.Backend/Echo", "still", ca]).await["reply"],
            "g:still"
        );
        // snag load makes the same calls, over TLS by ALPN h2.
        let url = format!("https://localhost:{}/snag.Backend/Echo", tls.port());
        let load = load_json(&[&url, "--grpc", "--cacert", ca, "-n", "20", "-c", "2"]).await;
        assert_eq!(
            (load["sent"].as_u64(), load["ok"].as_u64()),
            (Some(20), Some(20)),
            "{load}"
        );
        // In clear it speaks h2c to gRPC clients (prior knowledge).
        let (clear, _c) = start(vec!["--dependency-broken".into()]).await;
        let target = clear.to_string();
        assert_eq!(client(&["health", &target]).await["status"], "SERVING");
        assert_eq!(
            client(&["call", &target, "/snag.Backend/Echo", "x"]).await["code"],
            "UNAVAILABLE"
        );
        let url = format!("http://{target}/snag.Backend/Echo");
        let load = load_json(&[&url, "--grpc", "-n", "10"]).await;
        assert_eq!(load["errors_by_kind"]["grpc 14"], 10, "{load}");
    })
    .await;
}
