//! HAProxy, nginx, Caddy and Traefik under the same cases as the built-in balancer,
//! through the real binary in `--quick` mode: their configuration filled from their
//! driver files (`balancers/`), started and stopped by PID, their own view of each
//! backend read back into the report.

mod common;

use std::path::Path;

/// Runs `snag case` against `balancer`; the report directory.
fn run(cases: &str, balancer: &str) -> std::path::PathBuf {
    run_with(cases, balancer, &[])
}

/// [`run`] with more arguments.
fn run_with(cases: &str, balancer: &str, more: &[&str]) -> std::path::PathBuf {
    // Each run its own directory: a test may run the same product twice.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "snag-drivers-{}-{}-{}",
        balancer.replace(',', "-"),
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let mut command = common::process::snag(&[
        "case",
        cases,
        "--balancer",
        balancer,
        "--quick",
        "--seed",
        "11",
    ]);
    command.args(more);
    command.arg("--report-dir").arg(&dir);
    // Its verdicts are read from the report files, not from the exit code.
    common::process::run_blocking(command, 300);
    dir
}

fn report(dir: &Path, name: &str) -> serde_json::Value {
    let path = dir.join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn events(r: &serde_json::Value) -> Vec<String> {
    r["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["what"].as_str().unwrap().to_string())
        .collect()
}

/// A pass, or a case the report did not judge because the machine was busy — with
/// the evidence that says so.
fn assert_pass(r: &serde_json::Value) {
    let name = format!("{}@{}", r["name"], r["balancer_under_test"]);
    if r["verdict"] == "host-busy" {
        assert!(
            r["host_evidence"].as_array().is_some_and(|e| !e.is_empty()),
            "{name}: HOST without evidence"
        );
        eprintln!(
            "{name}: not judged on this busy machine: {}",
            r["host_evidence"]
        );
        return;
    }
    assert_eq!(
        r["verdict"], "pass",
        "{name}: {:#}\n{:#}",
        r["checks"], r["notes"]
    );
}

/// One test, so that the products never run at the same time and compete for the
/// two cores the cases' timings assume.
#[test]
fn the_products_run_the_cases_they_can() {
    haproxy_runs_the_cases_it_can_and_its_own_view_is_in_the_report();
    nginx_runs_share_and_kill_and_refuses_what_it_lacks();
    caddy_runs_share_checks_and_drain_and_its_events_are_its_view();
    traefik_runs_share_checks_and_drain_through_its_watched_file();
    an_external_balancer_started_by_hand_on_the_printed_addresses_passes();
    every_listening_port_of_a_run_stays_in_its_port_range_as_ss_sees_it();
    every_product_checks_and_serves_over_h2_with_the_runs_ca();
    watch_puts_a_hand_built_haproxys_view_on_a_timeline_with_its_figures();
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `snag watch` on a setup built by hand: two `snag backend`s behind an HAProxy
/// whose configuration the test wrote, load through it, and b killed.
fn watch_puts_a_hand_built_haproxys_view_on_a_timeline_with_its_figures() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(watch_hand_built());
}

async fn watch_hand_built() {
    use common::process::{Process, snag};
    let dir = std::env::temp_dir().join(format!("snag-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (pa, pb, pf) = (free_port(), free_port(), free_port());
    let a = Process::spawn(snag(&[
        "backend",
        "--id",
        "a",
        "--listen",
        &format!("127.0.0.1:{pa}"),
    ]));
    let b = Process::spawn(snag(&[
        "backend",
        "--id",
        "b",
        "--listen",
        &format!("127.0.0.1:{pb}"),
    ]));
    let config = format!(
        "global\n  stats socket {}/admin.sock mode 600 level admin\ndefaults\n  mode http\n  timeout connect 1s\n  timeout client 10s\n  timeout server 10s\n  timeout check 200ms\nfrontend fe\n  bind 127.0.0.1:{pf}\n  default_backend be\nbackend be\n  option httpchk GET /health\n  server a 127.0.0.1:{pa} check inter 100ms rise 2 fall 2\n  server b 127.0.0.1:{pb} check inter 100ms rise 2 fall 2\n",
        dir.display()
    );
    std::fs::write(dir.join("haproxy.cfg"), config).unwrap();
    let haproxy_log = std::fs::File::create(dir.join("haproxy.log")).unwrap();
    let mut haproxy = tokio::process::Command::new("haproxy")
        .args(["-db", "-f"])
        .arg(dir.join("haproxy.cfg"))
        .stdout(haproxy_log.try_clone().unwrap())
        .stderr(haproxy_log)
        .kill_on_drop(true)
        .spawn()
        .expect("haproxy starts (scripts/install-deps.sh)");
    // Ready when it answers through to a backend.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while snag::lab::driver::http("GET", &format!("http://127.0.0.1:{pf}/"), "")
        .await
        .map_or(true, |(status, _)| status != 200)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "haproxy never served"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let report = dir.join("watch.json");
    let mut watch = Process::spawn(snag(&[
        "watch",
        "--balancer",
        "haproxy",
        "--dir",
        dir.to_str().unwrap(),
        "--duration",
        "5s",
        "--report",
        report.to_str().unwrap(),
    ]));
    watch
        .line(10, |l| {
            l.starts_with("watching haproxy's view").then_some(())
        })
        .await;
    let mut load = Process::spawn(snag(&[
        "load",
        &format!("http://127.0.0.1:{pf}/"),
        "-c",
        "4",
        "--duration",
        "4s",
    ]));
    // Once the first second of load is in, b's health check fails; a second of
    // load after HAProxy takes it out, it passes again.
    let health = |healthy: bool| {
        let url = format!("http://127.0.0.1:{pb}/admin/health");
        async move {
            let body = format!("{{\"healthy\":{healthy}}}");
            let (status, _) = snag::lab::driver::http("POST", &url, &body).await.unwrap();
            assert_eq!(status, 200);
        }
    };
    load.line(10, |l| l.trim_start().starts_with("0 ").then_some(()))
        .await;
    health(false).await;
    watch
        .line(10, |l| l.contains("b  UP → DOWN").then_some(()))
        .await;
    load.line(10, |l| l.trim_start().starts_with("2 ").then_some(()))
        .await;
    health(true).await;
    watch
        .line(10, |l| l.contains("b  DOWN → UP").then_some(()))
        .await;
    assert!(
        watch.exit(30).await.success(),
        "{}",
        watch.stdout.join("\n")
    );
    load.exit(30).await;
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let fig = |id: &str| {
        r["figures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("{id}: {r:#}"))
            .clone()
    };
    let (fa, fb) = (fig("a"), fig("b"));
    assert_eq!(fb["evictions"], 1, "{r:#}");
    assert_eq!(fb["state"], "UP", "{r:#}");
    assert!(fb["out_s"].as_f64().unwrap() > 0.5, "{r:#}");
    assert!(fb["requests"].as_u64().unwrap() > 0, "{r:#}");
    assert!(fb["shifted"].as_u64().unwrap() > 0, "{r:#}");
    assert_eq!(fa["evictions"], 0, "{r:#}");
    assert!(
        r["events"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["what"] == "haproxy: b UP → DOWN" && e["kind"] == "balancer"),
        "{r:#}"
    );
    // HAProxy's own log says the same.
    let log = std::fs::read_to_string(dir.join("haproxy.log")).unwrap();
    assert!(log.contains("Server be/b is DOWN"), "{log}");
    let table = watch.stdout.join("\n");
    assert!(table.contains("shifted to others"), "{table}");
    let _ = haproxy.start_kill();
    let _ = haproxy.wait().await;
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--backend-protocol h2`: each product speaks HTTP/2 over TLS to the interposers,
/// trusting the CA made for the run, and its health checks go over TLS too.
fn every_product_checks_and_serves_over_h2_with_the_runs_ca() {
    let dir = run_with(
        "health-exclude,grpc-probe-loss",
        "builtin,haproxy,caddy,traefik",
        &["--backend-protocol", "h2"],
    );
    assert_pass(&report(&dir, "health-exclude"));
    assert_pass(&report(&dir, "grpc-probe-loss"));
    for (name, config_has) in [
        ("haproxy", "alpn h2 check-ssl check-alpn h2"),
        ("caddy", "\"root_ca_pem_files\""),
        ("traefik", "url = \"https://"),
    ] {
        let r = report(&dir, &format!("health-exclude@{name}"));
        assert_pass(&r);
        product(&r, name, config_has);
        // The interposers, which speak only TLS here, answered the product's checks;
        // a check its 200 ms timeout or its stop cut short mid-handshake on a busy
        // host counts as a TLS failure, so only most must have made it.
        for part in ["a", "b", "c"] {
            let p = &r["interposers"][part];
            let probes = p["requests"]["probe"].as_u64().unwrap();
            let failed = p["tls_failures"].as_u64().unwrap();
            assert!(probes > 0 && failed < probes, "{name} {part}: {p:#}");
        }
    }
    // Traefik's gRPC checks do not do TLS: N/A with what it did.
    let grpc = report(&dir, "grpc-probe-loss@traefik");
    assert_eq!(grpc["verdict"], "unsupported");
    assert!(
        grpc["notes"][0]
            .as_str()
            .unwrap()
            .contains("server preface"),
        "{:#}",
        grpc["notes"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--balancer external`: the case prints where its parts are and waits; here the
/// "someone else" is `snag balancer`, started by the test on those addresses.
fn an_external_balancer_started_by_hand_on_the_printed_addresses_passes() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}/");
        let dir = std::env::temp_dir().join(format!("snag-external-{}", std::process::id()));
        let mut command = common::process::snag(&[
            "case",
            "share-rr",
            "--balancer",
            "external",
            "--external-url",
            &url,
            "--external-wait",
            "60s",
            "--quick",
            "--seed",
            "11",
        ]);
        command.arg("--report-dir").arg(&dir);
        let mut case = common::process::Process::spawn(command);
        case.line(60, |l| {
            l.contains("point your balancer at these backends")
                .then_some(())
        })
        .await;
        let mut backends = Vec::new();
        while backends.len() < 3 {
            let spec = case
                .line(10, |l| {
                    let words: Vec<&str> = l.split_whitespace().collect();
                    match words[..] {
                        [id, data, probe] if data.parse::<std::net::SocketAddr>().is_ok() => {
                            Some(format!("{id}={data},check={probe}"))
                        }
                        _ => None,
                    }
                })
                .await;
            backends.push(spec);
        }
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec!["balancer", "--listen", &listen, "--strategy", "rr"];
        for b in &backends {
            args.extend(["--backend", b.as_str()]);
        }
        let balancer = common::process::Process::spawn(common::process::snag(&args));
        let status = case.exit(120).await;
        drop(balancer);
        let r = report(&dir, "share-rr@external");
        assert_pass(&r);
        assert!(status.success(), "{}", case.stdout.join("\n"));
        assert!(
            r["notes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n.as_str().unwrap().contains("ran outside snag")),
            "{:#}",
            r["notes"]
        );
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// The product's run as the JSON report has it: the driver, the version its own
/// command printed, and the configuration it was given.
fn product(r: &serde_json::Value, name: &str, config_has: &str) {
    let p = &r["products"][0];
    assert_eq!(p["name"], name, "{p:#}");
    assert_eq!(p["driver"], format!("balancers/{name}.toml"));
    assert!(!p["version"].as_str().unwrap().is_empty(), "{p:#}");
    assert!(
        p["config"].as_str().unwrap().contains(config_has),
        "{}",
        p["config"]
    );
}

/// A case ran to a verdict on the product, configured as `config_has` says. Whether
/// a drain or a GOAWAY case passes is the product's behaviour (Traefik's reload can
/// route a request or two to the drained server after its API shows the change),
/// not the driver's: the README's table shows what each did.
fn ran(r: &serde_json::Value, name: &str, config_has: &str) {
    let verdict = r["verdict"].as_str().unwrap();
    assert!(
        ["pass", "fail", "host-busy"].contains(&verdict),
        "{name}: {verdict}: {:#}",
        r["notes"]
    );
    assert!(!r["checks"].as_array().unwrap().is_empty(), "{name}");
    product(r, name, config_has);
}

fn caddy_runs_share_checks_and_drain_and_its_events_are_its_view() {
    let dir = run("share-rr,health-exclude,LB-05,LB-08,goaway-drain", "caddy");
    ran(
        &report(&dir, "goaway-drain@caddy"),
        "caddy",
        "\"versions\": [\"h2c\"]",
    );
    ran(
        &report(&dir, "LB-05@caddy"),
        "caddy",
        "\"handler\": \"reverse_proxy\"",
    );
    for case in ["share-rr", "health-exclude"] {
        let r = report(&dir, &format!("{case}@caddy"));
        assert_pass(&r);
        product(&r, "caddy", "\"handler\": \"reverse_proxy\"");
    }
    // Its `unhealthy` and `healthy` events, read from its log, are the timeline.
    let exclude = events(&report(&dir, "health-exclude@caddy"));
    assert!(
        exclude.iter().any(|e| e == "caddy: b UP → DOWN"),
        "{exclude:?}"
    );
    assert!(
        exclude.iter().any(|e| e == "caddy: b DOWN → UP"),
        "{exclude:?}"
    );
    // The drain is a reload through its admin API, timed.
    let drain = events(&report(&dir, "LB-05@caddy"));
    assert!(
        drain
            .iter()
            .any(|e| e.starts_with("caddy: drain b: done in ")),
        "{drain:?}"
    );
    let slow = report(&dir, "LB-08@caddy");
    assert_eq!(slow["verdict"], "unsupported");
    assert!(
        slow["notes"][0]
            .as_str()
            .unwrap()
            .contains("no weight ramp")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn traefik_runs_share_checks_and_drain_through_its_watched_file() {
    let dir = run(
        "share-rr,health-exclude,LB-05,probe-loss,goaway-drain,grpc-probe-loss",
        "traefik",
    );
    ran(
        &report(&dir, "goaway-drain@traefik"),
        "traefik",
        "url = \"h2c://",
    );
    ran(
        &report(&dir, "LB-05@traefik"),
        "traefik",
        "[http.services.be.loadBalancer]",
    );
    for case in ["share-rr", "health-exclude"] {
        let r = report(&dir, &format!("{case}@traefik"));
        assert_pass(&r);
        product(&r, "traefik", "[http.services.be.loadBalancer]");
    }
    // Its gRPC health checks, answered by b's interposer, evict b falsely.
    let grpc = report(&dir, "grpc-probe-loss@traefik");
    assert_pass(&grpc);
    product(&grpc, "traefik", "mode = \"grpc\"");
    // It names no backend in its answers: the share check says so instead of failing.
    let share = report(&dir, "share-rr@traefik");
    assert!(
        share["notes"][0]
            .as_str()
            .unwrap()
            .contains("does not name the server"),
        "{:#}",
        share["notes"]
    );
    let exclude = events(&report(&dir, "health-exclude@traefik"));
    assert!(
        exclude.iter().any(|e| e == "traefik: b UP → DOWN"),
        "{exclude:?}"
    );
    let drain = events(&report(&dir, "LB-05@traefik"));
    assert!(
        drain
            .iter()
            .any(|e| e.starts_with("traefik: drain b: done in ")),
        "{drain:?}"
    );
    let loss = report(&dir, "probe-loss@traefik");
    assert_eq!(loss["verdict"], "unsupported");
    assert!(
        loss["notes"][0]
            .as_str()
            .unwrap()
            .contains("first failed check")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn haproxy_runs_the_cases_it_can_and_its_own_view_is_in_the_report() {
    let cases =
        "share-rr,sticky,health-exclude,kill-during-run,LB-03,LB-05,probe-loss,goaway-drain";
    let dir = run(cases, "haproxy");
    for case in cases.split(',') {
        let r = report(&dir, &format!("{case}@haproxy"));
        assert_pass(&r);
        assert_eq!(r["balancer_under_test"], "haproxy");
    }
    // HAProxy's own state, read from its stats socket, is in the timeline.
    let exclude = events(&report(&dir, "health-exclude@haproxy"));
    assert!(
        exclude.iter().any(|e| e == "haproxy: b UP → DOWN"),
        "{exclude:?}"
    );
    assert!(
        exclude.iter().any(|e| e == "haproxy: b DOWN → UP"),
        "{exclude:?}"
    );
    // And its own log lines about the server.
    assert!(
        exclude.iter().any(|e| e.starts_with(
            "haproxy log: Server be/b is DOWN, reason: Layer7 wrong status, code: 503"
        )),
        "{exclude:?}"
    );
    let goaway = report(&dir, "goaway-drain@haproxy");
    product(&goaway, "haproxy", " proto h2");
    // gRPC checks it has not: N/A with the driver file's reason.
    let dir_grpc = run("grpc-probe-loss", "haproxy");
    let grpc = report(&dir_grpc, "grpc-probe-loss@haproxy");
    assert_eq!(grpc["verdict"], "unsupported");
    assert!(
        grpc["notes"][0]
            .as_str()
            .unwrap()
            .contains("grpc-status trailer"),
        "{:#}",
        grpc["notes"]
    );
    let _ = std::fs::remove_dir_all(&dir_grpc);
    // The drain went through its runtime API.
    let drain = events(&report(&dir, "LB-05@haproxy"));
    assert!(
        drain.iter().any(|e| e == "haproxy: b UP → DRAIN"),
        "{drain:?}"
    );
    assert!(
        drain.iter().any(|e| e == "haproxy: b DRAIN → MAINT"),
        "{drain:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn nginx_runs_share_and_kill_and_refuses_what_it_lacks() {
    let dir = run(
        "share-rr,kill-during-run,health-exclude,goaway-drain",
        "nginx",
    );
    let goaway = report(&dir, "goaway-drain@nginx");
    assert_eq!(goaway["verdict"], "unsupported");
    assert!(
        goaway["notes"][0]
            .as_str()
            .unwrap()
            .contains("HTTP/2 to the backends")
    );
    assert_pass(&report(&dir, "share-rr@nginx"));
    let kill = report(&dir, "kill-during-run@nginx");
    assert_pass(&kill);
    assert!(
        kill["notes"][0]
            .as_str()
            .unwrap()
            .contains("no active health checks"),
        "{:#}",
        kill["notes"]
    );
    let exclude = report(&dir, "health-exclude@nginx");
    assert_eq!(exclude["verdict"], "unsupported");
    assert!(
        exclude["notes"][0]
            .as_str()
            .unwrap()
            .contains("passive ones only")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The listening ports `ss` shows for process `pid` and its children.
fn listening(pid: u32) -> Vec<u16> {
    let out = std::process::Command::new("ss")
        .args(["-Htlnp"])
        .output()
        .expect("ss runs");
    let parent = |p: u32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| {
                // After the command name in parentheses: state, then the parent's PID.
                let rest = &s[s.rfind(')')? + 2..];
                rest.split(' ').nth(1)?.parse::<u32>().ok()
            })
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| {
            line.split("pid=").skip(1).any(|p| {
                let p: u32 = p
                    .split(|c: char| !c.is_ascii_digit())
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                p == pid || parent(p) == Some(pid)
            })
        })
        .filter_map(|line| {
            let local = line.split_whitespace().nth(3)?;
            local.rsplit(':').next()?.parse().ok()
        })
        .collect()
}

/// `--port-range`: what `ss` sees listening, snag's and HAProxy's, stays inside.
fn every_listening_port_of_a_run_stays_in_its_port_range_as_ss_sees_it() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(ports_in_range());
}

async fn ports_in_range() {
    let dir = std::env::temp_dir().join(format!("snag-port-range-{}", std::process::id()));
    let mut command = common::process::snag(&[
        "case",
        "share-rr,health-exclude",
        "--balancer",
        "haproxy",
        "--quick",
        "--port-range",
        "42100-42139",
    ]);
    command.arg("--report-dir").arg(&dir);
    let mut snag = common::process::Process::spawn(command);
    let pid = snag.pid();
    let mut seen = std::collections::BTreeSet::new();
    let watcher = tokio::spawn(async move {
        let mut seen = std::collections::BTreeSet::new();
        loop {
            seen.extend(listening(pid));
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            if std::fs::metadata(format!("/proc/{pid}")).is_err() {
                return seen;
            }
        }
    });
    snag.exit(300).await;
    seen.extend(watcher.await.unwrap());
    // Backends, interposers and their probe listeners, HAProxy and its stats port.
    assert!(seen.len() >= 8, "{seen:?}");
    assert!(
        seen.iter().all(|p| (42100..=42139).contains(p)),
        "ports outside 42100-42139: {seen:?}"
    );
    for case in ["share-rr", "health-exclude"] {
        assert_pass(&report(&dir, &format!("{case}@haproxy")));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
