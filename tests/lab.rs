//! The lab's parts against each other on 127.0.0.1: backends that name themselves,
//! the reference balancer's strategies and health checks, and the load generator's
//! arrivals and error classification.

mod common;

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use common::{http, refusing_port, until, within};
use snag::{
    lab::{
        backend::{self, Backend},
        balancer::{self, BackendSpec, Balancer, HealthCheck, select::Strategy},
        load::{self, Arrivals, Kind, Plan, Report, Sessions, Target},
    },
    shutdown::Shutdown,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

async fn start_backend(
    id: &str,
    tune: impl FnOnce(&mut backend::Config),
) -> (SocketAddr, Arc<Backend>) {
    let mut config = backend::Config::new(id);
    tune(&mut config);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let backend = Backend::new(config);
    tokio::spawn(backend::serve(listener, backend.clone(), Shutdown::never()));
    (addr, backend)
}

fn config(backends: &[(&str, SocketAddr, u32)], strategy: Strategy) -> balancer::Config {
    let backends = backends
        .iter()
        .map(|(id, addr, weight)| BackendSpec {
            id: id.to_string(),
            addr: *addr,
            weight: *weight,
            check: None,
        })
        .collect();
    balancer::Config {
        strategy,
        ..balancer::Config::new(backends, 1)
    }
}

async fn plan(addr: SocketAddr, path: &str) -> Plan {
    let mut plan = Plan::new(
        Target::resolve(&format!("http://{addr}{path}"))
            .await
            .unwrap(),
    );
    plan.duration = Duration::from_secs(30);
    plan
}

async fn load(plan: Plan) -> Report {
    load::run(plan, Shutdown::never(), |_| {}).await.report
}

fn by_backend(report: &Report) -> BTreeMap<String, (u64, u64)> {
    report
        .backends
        .iter()
        .map(|b| (b.name.clone(), (b.by_backend, b.by_instance)))
        .collect()
}

/// A server that hands each accepted connection to `each`.
async fn raw_server<F, Fut>(each: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(each(stream));
        }
    });
    addr
}

/// Reads one request head; returns it.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
            break;
        }
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[tokio::test]
async fn backend_names_itself_counts_and_switches_health_and_dependency() {
    within(10, async {
        let (addr, backend) = start_backend("a", |_| {}).await;
        let r = http(addr, "GET", "/anything", "", &[]).await;
        assert_eq!((r.status, r.header("x-instance")), (200, Some("a")));
        assert_eq!(r.body.trim(), r#"{"id":"a"}"#);
        http(addr, "POST", "/x", "payload", &[]).await;
        let count = http(addr, "GET", "/count", "", &[]).await;
        assert!(count.body.contains(r#""served":2"#), "{}", count.body);
        assert_eq!(http(addr, "GET", "/health", "", &[]).await.status, 200);
        let off = http(addr, "POST", "/admin/health", r#"{"healthy":false}"#, &[]).await;
        assert_eq!(off.status, 200);
        assert_eq!(http(addr, "GET", "/health", "", &[]).await.status, 503);
        http(addr, "POST", "/admin/dependency", r#"{"broken":true}"#, &[]).await;
        let broken = http(addr, "GET", "/", "", &[]).await;
        assert_eq!(broken.status, 200);
        assert!(
            broken.body.contains("dependency unavailable"),
            "{}",
            broken.body
        );
        let bad = http(addr, "POST", "/admin/health", r#"{"healthy":"no"}"#, &[]).await;
        assert_eq!(bad.status, 400);
        assert!(
            bad.body.contains("/admin/health: invalid type"),
            "{}",
            bad.body
        );
        let reset = http(addr, "GET", "/reset", "", &[]).await;
        assert!(reset.body.contains(r#""served":3"#), "{}", reset.body);
        assert_eq!(backend.served(), 0);
    })
    .await;
}

#[tokio::test]
async fn worker_pool_serves_at_most_workers_over_work_and_bounds_its_queue() {
    within(20, async {
        let (addr, _) = start_backend("w", |c| {
            c.workers = Some(8);
            c.work = Duration::from_millis(25);
        })
        .await;
        let mut p = plan(addr, "/").await;
        p.arrivals = Arrivals::Closed { connections: 32 };
        p.duration = Duration::from_secs(2);
        let report = load(p).await;
        // 8 workers × 25 ms = 320 requests a second at most.
        let rate = report.ok as f64 / 2.0;
        assert!((200.0..=330.0).contains(&rate), "{rate} requests/s");

        let (addr, backend) = start_backend("q", |c| {
            c.workers = Some(1);
            c.work = Duration::from_millis(200);
            c.queue = Some(2);
        })
        .await;
        let mut p = plan(addr, "/").await;
        p.arrivals = Arrivals::Closed { connections: 6 };
        p.requests = Some(6);
        let report = load(p).await;
        // One working, two waiting; the other three are refused with 503 at once.
        assert_eq!(
            report.errors_by_kind.get(&Kind::Status(503)),
            Some(&3),
            "{report:?}"
        );
        assert_eq!(report.ok, 3);
        assert_eq!(backend.served(), 6);
    })
    .await;
}

#[tokio::test]
async fn round_robin_is_exactly_even_and_three_sources_agree() {
    within(20, async {
        let mut pool = Vec::new();
        for id in ["a", "b", "c"] {
            pool.push((id, start_backend(id, |_| {}).await));
        }
        let specs: Vec<_> = pool.iter().map(|(id, (addr, _))| (*id, *addr, 1)).collect();
        let (lb, _) = common::start_balancer(config(&specs, Strategy::Rr)).await;
        let mut p = plan(lb, "/").await;
        p.arrivals = Arrivals::Closed { connections: 4 };
        p.requests = Some(300);
        let report = load(p).await;
        assert_eq!(report.ok, 300);
        assert!(report.disagreements.is_empty());
        for (id, (_, backend)) in &pool {
            assert_eq!(by_backend(&report)[*id], (100, 100), "{id}");
            assert_eq!(backend.served(), 100, "{id} counted by itself");
        }
    })
    .await;
}

#[tokio::test]
async fn weighted_round_robin_follows_nginx_smooth_sequence() {
    within(10, async {
        let mut specs = Vec::new();
        for (id, weight) in [("a", 5), ("b", 1), ("c", 1)] {
            specs.push((id, start_backend(id, |_| {}).await.0, weight));
        }
        let (lb, _) = common::start_balancer(config(&specs, Strategy::Wrr)).await;
        let mut seq = String::new();
        for _ in 0..14 {
            seq += http(lb, "GET", "/", "", &[])
                .await
                .header("x-backend")
                .unwrap();
        }
        assert_eq!(seq, "aabacaaaabacaa");
    })
    .await;
}

#[tokio::test]
async fn consistent_hash_remaps_only_the_removed_backends_keys() {
    within(20, async {
        let mut specs = Vec::new();
        for id in ["a", "b", "c", "d"] {
            specs.push((id, start_backend(id, |_| {}).await.0, 1));
        }
        let (lb, balancer) = common::start_balancer(config(&specs, Strategy::Consistent)).await;
        let route = |key: String| async move {
            let r = http(lb, "GET", "/", "", &[("x-session", &key)]).await;
            r.header("x-backend").unwrap().to_string()
        };
        let mut before = Vec::new();
        for i in 0..120 {
            before.push(route(format!("k{i}")).await);
        }
        assert!(before.iter().any(|b| b == "d"));
        assert!(balancer.set_draining("d", true));
        let mut moved = 0;
        for (i, was) in before.iter().enumerate() {
            let now = route(format!("k{i}")).await;
            if was == "d" {
                assert_ne!(now, "d");
                moved += 1;
            } else {
                assert_eq!(&now, was, "k{i} moved off a backend that stayed");
            }
        }
        assert_eq!(moved, before.iter().filter(|b| *b == "d").count());
    })
    .await;
}

#[tokio::test]
async fn hash_on_a_session_header_or_cookie_keeps_each_session_on_one_backend() {
    within(20, async {
        let mut specs = Vec::new();
        for id in ["a", "b", "c"] {
            specs.push((id, start_backend(id, |_| {}).await.0, 1));
        }
        let mut by_cookie = config(&specs, Strategy::Hash);
        by_cookie.hash_key = "cookie:sid".parse().unwrap();
        for (cfg, cookie) in [
            (config(&specs, Strategy::Hash), None),
            (by_cookie, Some("sid")),
        ] {
            let (lb, _) = common::start_balancer(cfg).await;
            let mut p = plan(lb, "/").await;
            p.sessions = Some(Sessions {
                count: 4,
                per_session: Some(50),
                header: "x-session".parse().unwrap(),
                cookie: cookie.map(String::from),
            });
            let report = load(p).await;
            assert_eq!(report.ok, 200);
            assert_eq!(report.sessions.len(), 4);
            for s in &report.sessions {
                assert_eq!(s.requests, 50);
                assert_eq!(s.backends.len(), 1, "{cookie:?}: {s:?}");
            }
        }
    })
    .await;
}

#[tokio::test]
async fn least_connections_starves_a_slow_backend() {
    within(20, async {
        let (a, _) = start_backend("a", |_| {}).await;
        let (b, _) = start_backend("b", |_| {}).await;
        let (c, _) = start_backend("c", |c| c.delay = Duration::from_millis(50)).await;
        let (lb, _) = common::start_balancer(config(
            &[("a", a, 1), ("b", b, 1), ("c", c, 1)],
            Strategy::Least,
        ))
        .await;
        let mut p = plan(lb, "/").await;
        p.arrivals = Arrivals::Closed { connections: 8 };
        p.duration = Duration::from_secs(1);
        let report = load(p).await;
        let shares = by_backend(&report);
        let slow = shares.get("c").map_or(0, |s| s.0) as f64 / report.ok as f64;
        // Round robin gives it a third. Its share under least connections follows
        // how fast the others answer, which a busy machine slows: a tenth is starved
        // with room to spare.
        assert!(
            slow < 0.10,
            "slow backend got {:.1}% of {}",
            slow * 100.0,
            report.ok
        );
    })
    .await;
}

fn transitions(balancer: &Balancer, id: &str) -> Vec<serde_json::Value> {
    let stats = balancer.stats();
    stats["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == id)
        .unwrap()["transitions"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn health_checks_remove_after_fall_and_restore_after_rise() {
    within(20, async {
        let (a, _) = start_backend("a", |_| {}).await;
        let (b, backend_b) = start_backend("b", |_| {}).await;
        let mut cfg = config(&[("a", a, 1), ("b", b, 1)], Strategy::Rr);
        cfg.health = Some(HealthCheck {
            interval: Duration::from_millis(50),
            timeout: Duration::from_millis(200),
            rise: 2,
            fall: 3,
            path: "/health".into(),
            expect_body: None,
            grpc: false,
        });
        cfg.slow_start = Duration::from_secs(30);
        let (lb, balancer) = common::start_balancer(cfg).await;
        backend_b.set_healthy(false);
        until(5, "b marked down", || {
            transitions(&balancer, "b").len() == 1
        })
        .await;
        let down = &transitions(&balancer, "b")[0];
        assert_eq!(
            (down["from"].as_str(), down["to"].as_str()),
            (Some("up"), Some("down"))
        );
        assert!(
            down["why"]
                .as_str()
                .unwrap()
                .starts_with("3 checks failed, last: status 503")
        );
        for _ in 0..10 {
            assert_eq!(
                http(lb, "GET", "/", "", &[]).await.header("x-backend"),
                Some("a")
            );
        }
        backend_b.set_healthy(true);
        until(5, "b back up", || transitions(&balancer, "b").len() == 2).await;
        let up = &transitions(&balancer, "b")[1];
        assert_eq!(up["why"], "2 checks passed");
        // Slow start: back, but with a sliver of its weight.
        let stats = balancer.stats();
        let weight = stats["backends"][1]["effective_weight"].as_f64().unwrap();
        assert!(
            weight < 0.1,
            "effective weight {weight} right after recovery"
        );
    })
    .await;
}

#[tokio::test]
async fn passive_marking_takes_out_a_refusing_backend_and_retries_hide_it() {
    within(10, async {
        let (a, _) = start_backend("a", |_| {}).await;
        let (dead, _held) = refusing_port();
        let mut cfg = config(&[("a", a, 1), ("dead", dead, 1)], Strategy::Rr);
        cfg.max_fails = 1;
        cfg.retries = 1;
        let (lb, balancer) = common::start_balancer(cfg).await;
        for _ in 0..6 {
            let r = http(lb, "GET", "/", "", &[]).await;
            assert_eq!((r.status, r.header("x-backend")), (200, Some("a")));
        }
        let t = transitions(&balancer, "dead");
        assert_eq!(t.len(), 1);
        assert!(
            t[0]["why"].as_str().unwrap().starts_with("1 failures:"),
            "{t:?}"
        );
        assert_eq!(balancer.stats()["backends"][1]["errors"], 1);
        assert_eq!(balancer.stats()["retries"], 1);
    })
    .await;
}

#[tokio::test]
async fn open_loop_sends_what_it_offers() {
    within(20, async {
        let (addr, _) = start_backend("a", |_| {}).await;
        let mut p = plan(addr, "/").await;
        p.arrivals = Arrivals::Open {
            rate: 500.0,
            shape: Some("step:1000@1s..2s".parse().unwrap()),
        };
        p.duration = Duration::from_secs(3);
        let report = load(p).await;
        assert_eq!(report.offered, Some(2000));
        // Every request offered, the last one of the window too.
        assert_eq!(report.sent, 2000);
        assert_eq!(report.ok, report.sent);
        let second: Vec<u64> = report.rows.iter().map(|r| r.sent).collect();
        assert!(second[1].abs_diff(1000) <= 10, "{second:?}");
    })
    .await;
}

#[tokio::test]
async fn load_classifies_every_error_kind() {
    within(30, async {
        async fn kinds(addr: SocketAddr, tune: impl FnOnce(&mut Plan)) -> Report {
            let mut p = plan(addr, "/").await;
            p.requests = Some(3);
            tune(&mut p);
            load(p).await
        }
        let expect = |report: &Report, kind: Kind| {
            assert_eq!(
                report.errors_by_kind,
                BTreeMap::from([(kind, 3)]),
                "{kind}: {report:?}"
            );
            assert_eq!(report.generator_errors, 0);
        };
        let (refusing, _held) = refusing_port();
        expect(&kinds(refusing, |_| {}).await, Kind::Refused);

        let (slow, _) = start_backend("s", |c| c.delay = Duration::from_millis(500)).await;
        let report = kinds(slow, |p| p.deadline = Some(Duration::from_millis(50))).await;
        expect(&report, Kind::Timeout);

        let reset = raw_server(|mut s| async move {
            read_head(&mut s).await;
            socket2::SockRef::from(&s)
                .set_linger(Some(Duration::ZERO))
                .unwrap();
        })
        .await;
        expect(&kinds(reset, |_| {}).await, Kind::Reset);

        let closed = raw_server(|mut s| async move {
            read_head(&mut s).await;
        })
        .await;
        expect(&kinds(closed, |_| {}).await, Kind::Closed);

        let short = raw_server(|mut s| async move {
            read_head(&mut s).await;
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
                .await;
        })
        .await;
        expect(&kinds(short, |_| {}).await, Kind::Body);

        let (sick, b) = start_backend("x", |_| {}).await;
        b.set_healthy(false);
        let mut p = plan(sick, "/health").await;
        p.requests = Some(3);
        expect(&load(p).await, Kind::Status(503));

        b.set_dependency_broken(true);
        let report = kinds(sick, |p| p.expect_body = Some(r#"{"id":"x"}"#.into())).await;
        expect(&report, Kind::BadBody);

        let (slow, _) = start_backend("o", |c| c.delay = Duration::from_millis(300)).await;
        let mut p = plan(slow, "/").await;
        p.arrivals = Arrivals::Open {
            rate: 100.0,
            shape: None,
        };
        p.duration = Duration::from_millis(200);
        p.max_inflight = 5;
        let report = load(p).await;
        assert_eq!(report.ok, 5, "{report:?}");
        assert_eq!(report.generator_errors, report.errors);
        assert_eq!(
            report.errors_by_kind.get(&Kind::Overload),
            Some(&(report.sent - 5))
        );
    })
    .await;
}

#[tokio::test]
async fn retries_resend_the_same_transaction_id() {
    within(10, async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let silent = raw_server(move |mut s| {
            let tx = tx.clone();
            async move {
                let head = read_head(&mut s).await;
                let id = head
                    .lines()
                    .find_map(|l| l.strip_prefix("x-request-id: "))
                    .unwrap_or("none")
                    .to_string();
                let _ = tx.send(id);
                let _ = s.read(&mut [0; 1]).await; // never answers
            }
        })
        .await;
        let mut p = plan(silent, "/").await;
        p.requests = Some(3);
        p.deadline = Some(Duration::from_millis(50));
        p.retries = 1;
        p.retry_delay = Duration::from_millis(10);
        p.txn_header = Some("x-request-id".parse().unwrap());
        let report = load(p).await;
        assert_eq!((report.sent, report.retries), (6, 3));
        let mut seen = BTreeMap::<String, u32>::new();
        while let Ok(id) = rx.try_recv() {
            *seen.entry(id).or_default() += 1;
        }
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert!(seen.values().all(|&n| n == 2), "{seen:?}");
    })
    .await;
}

/// EADDRNOTAVAIL, provoked in a network namespace of the test's own with ten
/// ephemeral ports and no TIME_WAIT reuse: the generator's failure, not the service's.
#[test]
fn port_exhaustion_is_the_generators_failure() {
    let ns = format!("snag-test-{}", std::process::id());
    let ip = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .status()
            .expect("`ip` runs (iproute2; scripts/install-deps.sh installs it)")
    };
    assert!(
        ip(&["netns", "add", &ns]).success(),
        "creating a network namespace needs root"
    );
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "delete", &self.0])
                .status();
        }
    }
    let _cleanup = Cleanup(ns.clone());
    let snag = env!("CARGO_BIN_EXE_snag");
    // The backend binds port 0 and prints where; the script waits for that line
    // (bounded) before loading it.
    let script = format!(
        r#"set -e
ip link set lo up
sysctl -qw net.ipv4.ip_local_port_range="40000 40009" net.ipv4.tcp_tw_reuse=0
out=$(mktemp)
{snag} backend --id a > "$out" &
pid=$!
for _ in $(seq 200); do grep -q listening "$out" && break; sleep 0.01; done
addr=$(grep -o '127.0.0.1:[0-9]*' "$out")
{snag} load "http://$addr/" -c 1 -n 30 --new-connection --json
kill $pid
rm -f "$out""#
    );
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "bash", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ports = report["errors_by_kind"]["ports exhausted (generator)"]
        .as_u64()
        .unwrap_or(0);
    // Ten ports, one of them the backend's listener: nine connections, then none.
    assert_eq!(report["ok"], 9, "{report:#}");
    assert_eq!(ports, 21, "{report:#}");
    assert_eq!(report["service_errors"], 0);
    assert_eq!(report["generator_errors"], 21);
}

#[tokio::test]
async fn balancer_and_backend_speak_http2_and_drain_through_the_admin_route() {
    within(20, async {
        let (a, _) = start_backend("a", |_| {}).await;
        let (b, _) = start_backend("b", |_| {}).await;
        let (lb, balancer) =
            common::start_balancer(config(&[("a", a, 1), ("b", b, 1)], Strategy::Rr)).await;
        let h2 = common::curl(
            &format!("http://{a}/"),
            &["--http2-prior-knowledge", "-D", "/dev/stderr"],
        )
        .await;
        assert_eq!((h2.exit, h2.status, h2.version.as_str()), (0, 200, "2"));
        assert!(h2.stderr.contains("x-instance: a"), "{}", h2.stderr);
        let h2 = common::curl(
            &format!("http://{lb}/"),
            &["--http2-prior-knowledge", "-D", "/dev/stderr"],
        )
        .await;
        assert_eq!((h2.exit, h2.status, h2.version.as_str()), (0, 200, "2"));
        assert!(h2.stderr.contains("x-backend: "), "{}", h2.stderr);

        let drained = http(lb, "POST", "/lb-admin/backends/b/drain", "", &[]).await;
        assert_eq!(drained.status, 200);
        for _ in 0..6 {
            assert_eq!(
                http(lb, "GET", "/", "", &[]).await.header("x-backend"),
                Some("a")
            );
        }
        let t = transitions(&balancer, "b");
        assert_eq!(
            (t[0]["to"].as_str(), t[0]["why"].as_str()),
            (Some("draining"), Some("drain"))
        );
        assert_eq!(
            http(lb, "DELETE", "/lb-admin/backends/b/drain", "", &[])
                .await
                .status,
            200
        );
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..4 {
            seen.insert(
                http(lb, "GET", "/", "", &[])
                    .await
                    .header("x-backend")
                    .unwrap()
                    .to_string(),
            );
        }
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(
            http(lb, "POST", "/lb-admin/backends/zz/drain", "", &[])
                .await
                .status,
            404
        );
    })
    .await;
}

#[tokio::test]
async fn load_speaks_http2_when_asked() {
    within(10, async {
        let (h2, _) = start_backend("a", |_| {}).await;
        let mut p = plan(h2, "/").await;
        p.http2 = true;
        p.requests = Some(20);
        let report = load(p.clone()).await;
        assert_eq!((report.ok, report.errors), (20, 0), "{report:?}");
        // A server that speaks only HTTP/1.1 cannot answer it.
        let (h1_only, _) = common::http_backend("hello").await;
        p.target = Target::resolve(&format!("http://{h1_only}/"))
            .await
            .unwrap();
        p.requests = Some(3);
        p.deadline = Some(Duration::from_millis(500));
        let report = load(p).await;
        assert_eq!(report.ok, 0, "{report:?}");
        assert_eq!(report.errors, 3);
    })
    .await;
}

#[tokio::test]
async fn a_request_count_ends_the_run_when_it_is_reached() {
    within(30, async {
        let (addr, _) = start_backend("a", |_| {}).await;
        // Through the CLI: `-n` once waited out the default 10 s window after its
        // 200 requests, printing empty rows.
        let url = format!("http://{addr}/");
        let command = common::process::snag(&["load", &url, "-n", "200", "-c", "4", "--json"]);
        let (code, stdout) = common::process::Process::run(command, 20).await;
        assert_eq!(code, 0, "{stdout}");
        let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(report["sent"], 200, "{report}");
        assert_eq!(report["ok"], 200, "{report}");
        let seconds = report["rows"].as_array().unwrap().len();
        assert!(
            seconds < 10,
            "{seconds} rows for 200 requests on loopback: {report}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_backend_reports_how_late_its_delays_ended() {
    within(20, async {
        let (addr, backend) = start_backend("d", |c| c.delay = Duration::from_millis(20)).await;
        assert!(backend.overslept().is_none(), "nothing slept yet");
        let before = http(addr, "GET", "/stats", "", &[]).await;
        assert!(
            before.body.contains(r#""overslept_ms":null"#),
            "{}",
            before.body
        );
        for _ in 0..5 {
            let t = tokio::time::Instant::now();
            assert_eq!(http(addr, "GET", "/x", "", &[]).await.status, 200);
            assert!(t.elapsed() >= Duration::from_millis(20));
        }
        let lag = backend.overslept().expect("five delays ended");
        assert!(
            lag.p50 > 0.0 && lag.p99 >= lag.p50 && lag.max >= lag.p99,
            "{lag:?}"
        );
        let stats: serde_json::Value =
            serde_json::from_str(&http(addr, "GET", "/stats", "", &[]).await.body).unwrap();
        assert_eq!(stats["overslept_ms"]["max"].as_f64(), Some(lag.max));
    })
    .await;
}
