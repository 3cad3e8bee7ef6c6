//! The control API over real HTTP, checked against Toxiproxy's wire behaviour as
//! `shared/reference/toxiproxy-api.md` records it.

mod common;

use std::{io, net::SocketAddr, time::Duration};

use common::{call, echo_server, http, json, spawn_api, within};
use snag::api;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// Creates proxy `name` to `upstream` and returns its bound address.
async fn create(api: SocketAddr, name: &str, upstream: SocketAddr) -> SocketAddr {
    let body = format!(r#"{{"name":"{name}","listen":"127.0.0.1:0","upstream":"{upstream}"}}"#);
    let reply = call(api, "POST", "/proxies", &body).await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    json(&reply)["listen"].as_str().unwrap().parse().unwrap()
}

/// Echoes one message through `addr`: proof it relays. Where a fault was just removed,
/// the test first makes that fault hold a message a minute, past the test's deadline,
/// so a fault left in place fails the test without a wall-clock upper bound.
async fn echoes(addr: SocketAddr) {
    common::rtt_to(addr).await;
}

#[tokio::test]
async fn version_is_semver_with_toxiproxys_framing() {
    within(5, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let reply = call(api, "GET", "/version", "").await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.header("content-type"),
            Some("application/json;charset=utf-8")
        );
        assert!(
            reply.body.starts_with("{\"version\": \"2.12.0-snag."),
            "{}",
            reply.body
        );
        assert!(reply.body.ends_with("\"}\n"));
        assert_eq!(
            reply.header("x-toxiproxy-request-id").map(str::len),
            Some(20)
        );
    })
    .await;
}

#[tokio::test]
async fn proxy_lifecycle_answers_as_toxiproxy_does() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let upstream = echo_server().await;
        assert_eq!(call(api, "GET", "/proxies", "").await.body, "{}");

        let reply = call(api, "POST", "/proxies", &format!(r#"{{"name":"p1","listen":"localhost:0","upstream":"{upstream}","enabled":null}}"#)).await;
        assert_eq!(reply.status, 201);
        assert_eq!(reply.header("content-type"), Some("application/json"));
        let p = json(&reply);
        let listen = p["listen"].as_str().unwrap();
        assert!(listen.starts_with("127.0.0.1:") && !listen.ends_with(":0"), "{listen}");
        let expected = format!(r#"{{"name":"p1","listen":"{listen}","upstream":"{upstream}","enabled":true,"Logger":{{}},"toxics":[]}}"#);
        assert_eq!(reply.body, expected);

        let dup = call(api, "POST", "/proxies", &format!(r#"{{"name":"p1","upstream":"{upstream}"}}"#)).await;
        assert_eq!((dup.status, dup.body.as_str()), (409, "{\"error\":\"proxy already exists\",\"status\":409}\n"));
        assert_eq!(dup.header("content-type"), Some("text/plain; charset=utf-8"));
        assert_eq!(dup.header("x-content-type-options"), Some("nosniff"));

        let list = json(&call(api, "GET", "/proxies", "").await);
        assert_eq!(list["p1"]["listen"], listen);
        assert_eq!(call(api, "GET", "/proxies/p1", "").await.body, expected);
        let missing = call(api, "GET", "/proxies/nope", "").await;
        assert_eq!((missing.status, missing.body.as_str()), (404, "{\"error\":\"proxy not found\",\"status\":404}\n"));

        let del = call(api, "DELETE", "/proxies/p1", "").await;
        assert_eq!((del.status, del.body.as_str()), (204, ""));
        assert_eq!(call(api, "DELETE", "/proxies/p1", "").await.status, 404);
        let refused = TcpStream::connect(listen).await.unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    })
    .await;
}

#[tokio::test]
async fn bad_requests_get_toxiproxys_errors() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let upstream = echo_server().await;
        let cases: &[(&str, &str, &str, u16, &str)] = &[
            ("POST", "/proxies", "", 400, "bad request body: EOF"),
            ("POST", "/proxies", "{nope", 400, "bad request body: "),
            ("POST", "/proxies", r#"{"upstream":"127.0.0.1:1"}"#, 400, "missing required field: name"),
            ("POST", "/proxies", r#"{"name":"x"}"#, 400, "missing required field: upstream"),
            ("POST", "/proxies", r#"{"name":5,"upstream":"a:1"}"#, 400, "bad request body: "),
        ];
        for (method, path, body, status, message) in cases {
            let reply = call(api, method, path, body).await;
            assert_eq!(reply.status, *status, "{body}: {}", reply.body);
            assert_eq!(json(&reply)["status"], *status);
            assert!(json(&reply)["error"].as_str().unwrap().starts_with(message), "{body}: {}", reply.body);
        }
        create(api, "p", upstream).await;
        let toxic_cases: &[(&str, u16, &str)] = &[
            ("", 400, "bad request body: EOF"),
            (r#"{"type":"latency","stream":"sideways"}"#, 400, "stream was invalid, can be either upstream or downstream"),
            (r#"{"type":"latncy"}"#, 400, "invalid toxic type"),
            (r#"{"type":"bandwidth","attributes":{"rate":1.5}}"#, 400,
             "bad request body: json: cannot unmarshal number 1.5 into Go struct field BandwidthToxic.attributes.rate of type int64"),
            (r#"{"type":"latency","attributes":{"latency":"x"}}"#, 400, "bad request body: json: cannot unmarshal string"),
            (r#"{"type":"loss","attributes":{"probability":2}}"#, 400, "probability 2 is outside"),
        ];
        for (body, status, message) in toxic_cases {
            let reply = call(api, "POST", "/proxies/p/toxics", body).await;
            assert_eq!(reply.status, *status, "{body}: {}", reply.body);
            assert!(json(&reply)["error"].as_str().unwrap().starts_with(message), "{body}: {}", reply.body);
        }
        assert_eq!(call(api, "POST", "/proxies/nope/toxics", r#"{"type":"latency"}"#).await.status, 404);
        assert_eq!(call(api, "GET", "/proxies/p/toxics/nope", "").await.body, "{\"error\":\"toxic not found\",\"status\":404}\n");

        let unknown = call(api, "GET", "/nothing", "").await;
        assert_eq!((unknown.status, unknown.body.as_str()), (404, "404 page not found\n"));
        let wrong = call(api, "PUT", "/proxies", "").await;
        assert_eq!((wrong.status, wrong.body.as_str(), wrong.header("content-type")), (405, "", None));
        let browser = http(api, "GET", "/version", "", &[("User-Agent", "Mozilla/5.0 (X11)")]).await;
        assert_eq!((browser.status, browser.body.as_str()), (403, "User agent not allowed\n"));
        let big = "x".repeat(api::BODY_LIMIT + 1);
        assert_eq!(call(api, "POST", "/proxies", &big).await.status, 413);
    })
    .await;
}

#[tokio::test]
async fn toxics_are_created_listed_updated_and_removed() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        create(api, "p", echo_server().await).await;
        let reply = call(api, "POST", "/proxies/p/toxics", r#"{"type":"latency","attributes":{"latency":100},"toxicity":null,"extra":1}"#).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, r#"{"attributes":{"latency":100,"jitter":0},"name":"latency_downstream","type":"latency","stream":"downstream","toxicity":1}"#);
        let up = call(api, "POST", "/proxies/p/toxics", r#"{"name":"cut","type":"limit_data","stream":"UPSTREAM","toxicity":0.5}"#).await;
        assert_eq!(up.body, r#"{"attributes":{"bytes":0},"name":"cut","type":"limit_data","stream":"UPSTREAM","toxicity":0.5}"#);
        let dup = call(api, "POST", "/proxies/p/toxics", r#"{"name":"cut","type":"latency","stream":"downstream"}"#).await;
        assert_eq!(dup.status, 409, "names are unique across directions");

        // Upstream chain first, then downstream, each in insertion order.
        let list = json(&call(api, "GET", "/proxies/p/toxics", "").await);
        let names: Vec<_> = list.as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["cut", "latency_downstream"]);

        // Partial update: jitter changes, latency and toxicity stay.
        let patched = call(api, "PATCH", "/proxies/p/toxics/latency_downstream", r#"{"attributes":{"jitter":5},"type":"ignored"}"#).await;
        assert_eq!(patched.body, r#"{"attributes":{"latency":100,"jitter":5},"name":"latency_downstream","type":"latency","stream":"downstream","toxicity":1}"#);
        let posted = json(&call(api, "POST", "/proxies/p/toxics/latency_downstream", r#"{"toxicity":0}"#).await);
        assert_eq!((posted["toxicity"].clone(), posted["attributes"]["jitter"].clone()), (0.into(), 5.into()));

        assert_eq!(call(api, "DELETE", "/proxies/p/toxics/cut", "").await.status, 204);
        assert_eq!(call(api, "DELETE", "/proxies/p/toxics/cut", "").await.status, 404);
        assert_eq!(json(&call(api, "GET", "/proxies/p", "").await)["toxics"].as_array().unwrap().len(), 1);
    })
    .await;
}

#[tokio::test]
async fn a_latency_toxic_added_through_the_api_delays_the_proxy_and_goes_away() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let proxy = create(api, "p", echo_server().await).await;
        echoes(proxy).await;
        let reply = call(
            api,
            "POST",
            "/proxies/p/toxics",
            r#"{"type":"latency","attributes":{"latency":200}}"#,
        )
        .await;
        assert_eq!(reply.status, 200);
        let slow = common::rtt_to(proxy).await;
        assert!(slow >= Duration::from_millis(200), "{slow:?}");
        let minute = r#"{"attributes":{"latency":60000}}"#;
        call(api, "POST", "/proxies/p/toxics/latency_downstream", minute).await;
        assert_eq!(
            call(api, "DELETE", "/proxies/p/toxics/latency_downstream", "")
                .await
                .status,
            204
        );
        echoes(proxy).await;
    })
    .await;
}

#[tokio::test]
async fn disabling_refuses_connections_and_enabling_accepts_them_again() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let proxy = create(api, "p", echo_server().await).await;
        let mut open = TcpStream::connect(proxy).await.unwrap();
        let off = json(&call(api, "POST", "/proxies/p", r#"{"enabled":false}"#).await);
        assert_eq!(off["enabled"], false);
        assert_eq!(
            off["listen"],
            proxy.to_string(),
            "listen keeps the bound address"
        );
        assert_eq!(
            TcpStream::connect(proxy).await.unwrap_err().kind(),
            io::ErrorKind::ConnectionRefused
        );
        assert_eq!(
            open.read(&mut [0; 1]).await.unwrap(),
            0,
            "open connection not closed"
        );
        let on = call(api, "PATCH", "/proxies/p", r#"{"enabled":true}"#).await;
        assert_eq!(json(&on)["enabled"], true);
        echoes(proxy).await;
    })
    .await;
}

#[tokio::test]
async fn changing_the_upstream_restarts_the_proxy_and_keeps_its_toxics() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let proxy = create(api, "p", "127.0.0.1:1".parse().unwrap()).await;
        call(
            api,
            "POST",
            "/proxies/p/toxics",
            r#"{"type":"latency","attributes":{"latency":100}}"#,
        )
        .await;
        let echo = echo_server().await;
        let moved = json(
            &call(
                api,
                "POST",
                "/proxies/p",
                &format!(r#"{{"upstream":"{echo}"}}"#),
            )
            .await,
        );
        assert_eq!(moved["upstream"], echo.to_string());
        assert_eq!(moved["toxics"][0]["name"], "latency_downstream");
        assert!(common::rtt_to(proxy).await >= Duration::from_millis(100));
    })
    .await;
}

#[tokio::test]
async fn populate_creates_keeps_and_replaces() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let echo = echo_server().await;
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let body = format!(r#"[{{"name":"a","listen":"127.0.0.1:{port}","upstream":"{echo}"}},{{"name":"b","upstream":"{echo}","enabled":false}}]"#);
        let reply = call(api, "POST", "/populate", &body).await;
        assert_eq!(reply.status, 201, "{}", reply.body);
        assert_eq!(reply.header("content-type"), Some("application/json"));
        let made = json(&reply);
        assert_eq!(made["proxies"][0]["listen"], format!("127.0.0.1:{port}"));
        assert_eq!(made["proxies"][1]["enabled"], false);
        // The same again: `a` is kept (same listen and upstream), so its toxic stays.
        call(api, "POST", "/proxies/a/toxics", r#"{"type":"latency"}"#).await;
        let again = json(&call(api, "POST", "/populate", &body).await);
        assert_eq!(again["proxies"][0]["toxics"].as_array().unwrap().len(), 1);
        echoes(format!("127.0.0.1:{port}").parse().unwrap()).await;

        let bad = call(api, "POST", "/populate", &format!(r#"[{{"name":"c","upstream":"{echo}"}},{{"name":"d"}}]"#)).await;
        assert_eq!((bad.status, bad.body.as_str()), (400, r#"{"error":"missing required field: upstream at proxy 2","status":400,"proxies":null}"#));
        assert_eq!(call(api, "GET", "/proxies/c", "").await.status, 404, "nothing is created when validation fails");
        assert_eq!(call(api, "POST", "/populate", "[]").await.body, r#"{"proxies":null}"#);
    })
    .await;
}

#[tokio::test]
async fn reset_enables_everything_and_removes_every_toxic() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let proxy = create(api, "p", echo_server().await).await;
        call(
            api,
            "POST",
            "/proxies/p/toxics",
            r#"{"type":"latency","attributes":{"latency":60000}}"#,
        )
        .await;
        call(api, "POST", "/proxies/p", r#"{"enabled":false}"#).await;
        let reply = call(api, "POST", "/reset", "ignored").await;
        assert_eq!((reply.status, reply.body.as_str()), (204, ""));
        let p = json(&call(api, "GET", "/proxies/p", "").await);
        assert_eq!(
            (p["enabled"].clone(), p["toxics"].clone()),
            (true.into(), serde_json::json!([]))
        );
        echoes(proxy).await;
    })
    .await;
}

#[tokio::test]
async fn snags_own_faults_come_through_the_toxics_endpoint() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let proxy = create(api, "p", echo_server().await).await;
        let reply = call(api, "POST", "/proxies/p/toxics", r#"{"type":"down"}"#).await;
        assert_eq!(reply.body, r#"{"attributes":{},"name":"down_downstream","type":"down","stream":"downstream","toxicity":1}"#);
        common::refused(proxy).await;
        call(api, "DELETE", "/proxies/p/toxics/down_downstream", "").await;
        let loss = json(&call(api, "POST", "/proxies/p/toxics", r#"{"type":"loss","attributes":{"probability":0.25}}"#).await);
        assert_eq!(loss["attributes"], serde_json::json!({"probability": 0.25, "rto": 200, "segment": 1448}));
    })
    .await;
}

#[tokio::test]
async fn a_token_is_required_when_set() {
    within(5, async {
        let api = spawn_api(
            api::Settings {
                token: Some("s3cret".into()),
                ..api::Settings::default()
            },
            None,
        )
        .await;
        let reply = call(api, "GET", "/proxies", "").await;
        assert_eq!(
            (reply.status, reply.body.as_str()),
            (401, "{\"error\":\"unauthorized\",\"status\":401}\n")
        );
        let wrong = http(
            api,
            "GET",
            "/proxies",
            "",
            &[("Authorization", "Bearer s3cres")],
        )
        .await;
        assert_eq!(wrong.status, 401);
        let right = http(
            api,
            "GET",
            "/proxies",
            "",
            &[("Authorization", "Bearer s3cret")],
        )
        .await;
        assert_eq!((right.status, right.body.as_str()), (200, "{}"));
    })
    .await;
}

#[tokio::test]
async fn metrics_count_bytes_of_closed_connections_only_when_asked() {
    within(10, async {
        let plain = spawn_api(api::Settings::default(), None).await;
        assert_eq!(call(plain, "GET", "/metrics", "").await.status, 404);

        let api = spawn_api(api::Settings { metrics: api::Metrics { proxy: true, runtime: true }, ..api::Settings::default() }, None).await;
        let proxy = create(api, "p", echo_server().await).await;
        let mut c = TcpStream::connect(proxy).await.unwrap();
        c.write_all(b"hello").await.unwrap();
        c.read_exact(&mut [0; 5]).await.unwrap();
        let open = call(api, "GET", "/metrics", "").await.body;
        assert!(open.contains(&format!(
            "toxiproxy_proxy_received_bytes_total{{direction=\"upstream\",listener=\"{proxy}\",proxy=\"p\",upstream="
        )), "{open}");
        assert!(open.contains("} 0\n") && !open.contains("} 5\n"), "an open connection counts nothing yet: {open}");
        c.shutdown().await.unwrap();
        assert_eq!(c.read(&mut [0; 1]).await.unwrap(), 0);
        // The proxy adds the counts once both directions are done; wait for them.
        let counted = async {
            loop {
                let text = call(api, "GET", "/metrics", "").await.body;
                if text.matches("} 5\n").count() == 4 {
                    break text;
                }
                tokio::task::yield_now().await;
            }
        };
        let text = within(3, counted).await;
        assert!(text.contains("# TYPE toxiproxy_proxy_sent_bytes_total counter"), "{text}");
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
    })
    .await;
}

#[tokio::test]
async fn a_taken_port_is_a_500_with_gos_error_text_and_a_new_listen_moves_the_proxy() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let echo = echo_server().await;
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = taken.local_addr().unwrap().port();
        let body = format!(r#"{{"name":"p","listen":"127.0.0.1:{port}","upstream":"{echo}"}}"#);
        let reply = call(api, "POST", "/proxies", &body).await;
        let want = format!("{{\"error\":\"listen tcp 127.0.0.1:{port}: bind: address already in use\",\"status\":500}}\n");
        assert_eq!((reply.status, reply.body.as_str()), (500, want.as_str()));

        // Created disabled, the proxy keeps the literal address it was given.
        let off = json(&call(api, "POST", "/proxies", &format!(r#"{{"name":"q","listen":"127.0.0.1:0","upstream":"{echo}","enabled":false}}"#)).await);
        assert_eq!(off["listen"], "127.0.0.1:0");

        let old = create(api, "r", echo).await;
        let free = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let moved = json(&call(api, "POST", "/proxies/r", &format!(r#"{{"listen":"{free}"}}"#)).await);
        assert_eq!(moved["listen"], free.to_string());
        assert_eq!(TcpStream::connect(old).await.unwrap_err().kind(), io::ErrorKind::ConnectionRefused);
        echoes(free).await;
    })
    .await;
}

#[tokio::test]
async fn http_proxies_and_scoped_faults_come_through_the_api() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let (backend, _) = common::http_backend("fine").await;
        let body = format!(
            r#"{{"name":"web","listen":"127.0.0.1:0","upstream":"{backend}","mode":"http"}}"#
        );
        let created = json(&call(api, "POST", "/proxies", &body).await);
        assert_eq!(created["mode"], "http");
        let proxy: SocketAddr = created["listen"].as_str().unwrap().parse().unwrap();
        let toxic = call(
            api,
            "POST",
            "/proxies/web/toxics",
            r#"{"type":"http_status","scope":"probe","attributes":{"status":503}}"#,
        )
        .await;
        assert_eq!(toxic.status, 200, "{}", toxic.body);
        assert_eq!(json(&toxic)["scope"], "probe");
        assert_eq!(http(proxy, "GET", "/healthz", "", &[]).await.status, 503);
        assert_eq!(http(proxy, "GET", "/orders", "", &[]).await.status, 200);
        let wrong = call(
            api,
            "POST",
            "/proxies/web/toxics",
            r#"{"type":"limit_data","attributes":{"bytes":5}}"#,
        )
        .await;
        assert_eq!(wrong.status, 400);
        assert!(
            json(&wrong)["error"]
                .as_str()
                .unwrap()
                .contains("mode http"),
            "{}",
            wrong.body
        );
    })
    .await;
}

#[tokio::test]
async fn drains_and_stats_come_through_the_api() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let proxy = create(api, "p", echo_server().await).await;
        echoes(proxy).await;
        let bad = call(api, "POST", "/proxies/p/drain", r#"{"mode":"deadline"}"#).await;
        assert_eq!(
            (bad.status, json(&bad)["error"].clone()),
            (400, "a deadline drain needs timeout > 0 (ms)".into())
        );
        let reply = call(
            api,
            "POST",
            "/proxies/p/drain",
            r#"{"mode":"graceful","new":"refuse"}"#,
        )
        .await;
        assert_eq!(
            reply.body,
            r#"{"drain":{"mode":"graceful","timeout":0,"new":"refuse","rate":0,"grace":0}}"#
        );
        common::refused(proxy).await;
        assert_eq!(
            call(api, "DELETE", "/proxies/p/drain", "").await.status,
            204
        );
        let stats = json(&call(api, "GET", "/proxies/p/stats", "").await);
        assert!(stats["connections"].as_u64().unwrap() >= 1, "{stats}");
        assert_eq!(
            call(api, "GET", "/proxies/nope/stats", "").await.status,
            404
        );
    })
    .await;
}

#[tokio::test]
async fn an_api_proxy_can_have_a_probe_listener() {
    within(10, async {
        let api = spawn_api(api::Settings::default(), None).await;
        let echo = echo_server().await;
        let body = format!(r#"{{"name":"p","listen":"127.0.0.1:0","probe_listen":"127.0.0.1:0","upstream":"{echo}"}}"#);
        let created = json(&call(api, "POST", "/proxies", &body).await);
        let probes: SocketAddr = created["probe_listen"].as_str().unwrap().parse().unwrap();
        let data: SocketAddr = created["listen"].as_str().unwrap().parse().unwrap();
        assert_ne!(probes.port(), 0);
        call(api, "POST", "/proxies/p/toxics", r#"{"type":"down","scope":"probe"}"#).await;
        common::refused(probes).await;
        echoes(data).await;
    })
    .await;
}

/// `POST /load` is snag's own and off unless `serve --generator` asked for it; on,
/// it runs the shard it is sent against the target and answers the shard's result.
#[tokio::test]
async fn a_generator_api_runs_the_shard_it_is_sent() {
    within(20, async {
        let (backend, _) = common::http_backend("ok").await;
        let plan = snag::lab::load::Plan::new(snag::lab::load::Target {
            addr: backend,
            tls: false,
            host: backend.to_string(),
            path: "/".into(),
        });
        let mut plan = plan;
        plan.requests = Some(10);
        plan.duration = std::time::Duration::from_secs(5);
        let request = snag::lab::load::remote::ShardRequest {
            plan: snag::lab::load::remote::PlanWire::try_from(&plan).unwrap(),
            shard: "1/2".parse().unwrap(),
            start_at_ms: snag::lab::load::remote::unix_ms(std::time::SystemTime::now()),
            host: Some("g1".into()),
            run: None,
        };
        let body = serde_json::to_string(&request).unwrap();
        let off = spawn_api(api::Settings::default(), None).await;
        assert_eq!(call(off, "POST", "/load", &body).await.status, 404);
        let on = spawn_api(
            api::Settings {
                generator: true,
                ..api::Settings::default()
            },
            None,
        )
        .await;
        let reply = call(on, "POST", "/load", &body).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let result: snag::lab::load::ShardResult = serde_json::from_str(&reply.body).unwrap();
        assert_eq!((result.host.as_str(), result.shard.index), ("g1", 1));
        // Its half of ten transactions, every one answered.
        let raw = json(&reply);
        assert_eq!(
            (raw["tally"]["sent"].as_u64(), raw["tally"]["ok"].as_u64()),
            (Some(5), Some(5)),
            "{raw}"
        );
        let bad = call(on, "POST", "/load", r#"{"plan":{}}"#).await;
        assert_eq!(bad.status, 400, "{}", bad.body);
        assert!(
            json(&bad)["error"]
                .as_str()
                .unwrap()
                .contains("missing field"),
            "{}",
            bad.body
        );
        assert_eq!(call(on, "GET", "/load", "").await.status, 405);
        // A named run tells how far it has got while it runs, and is gone after.
        plan.requests = None;
        plan.duration = std::time::Duration::from_secs(2);
        let named = snag::lab::load::remote::ShardRequest {
            plan: snag::lab::load::remote::PlanWire::try_from(&plan).unwrap(),
            run: Some("r1".into()),
            ..request
        };
        let body = serde_json::to_string(&named).unwrap();
        let running = tokio::spawn(async move { call(on, "POST", "/load", &body).await });
        let told = common::eventually(10, "the run told a second of traffic", || async {
            let reply = call(on, "GET", "/load/r1", "").await;
            let told = (reply.status == 200).then(|| json(&reply))?;
            (told["second"].as_u64() >= Some(1)).then_some(told)
        })
        .await;
        assert!(told["sent"].as_u64().unwrap() > 0, "{told}");
        assert!(told["ok"].as_u64().unwrap() > 0, "{told}");
        let done = running.await.unwrap();
        assert_eq!(done.status, 200, "{}", done.body);
        let sent = json(&done)["tally"]["sent"].as_u64().unwrap();
        assert!(sent >= told["sent"].as_u64().unwrap(), "{sent} {told}");
        let gone = call(on, "GET", "/load/r1", "").await;
        assert_eq!(gone.status, 404, "{}", gone.body);
        assert_eq!(json(&gone)["error"], "load run not found");
        assert_eq!(call(on, "DELETE", "/load/r1", "").await.status, 405);
        assert_eq!(call(on, "GET", "/load/r1/x", "").await.status, 404);
    })
    .await;
}
