//! The control path never accepts and ignores: what the API, `snag ctl` and fault
//! files are given reaches the running proxy, or is refused with the reason.

mod common;

use std::net::SocketAddr;

use clap::Parser;
use common::{call, echo_server, json, spawn_api, within};
use snag::api::Settings;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

async fn echo_once(addr: SocketAddr) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"ping").await.unwrap();
    let mut back = [0; 4];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
}

#[tokio::test]
async fn a_timeline_step_after_an_upstream_change_acts_on_the_live_proxy() {
    within(10, async {
        let (first, second) = (echo_server().await, echo_server().await);
        let api = spawn_api(
            Settings::default(),
            Some(&format!(
                r#"
            [[proxy]]
            name = "p"
            listen = "127.0.0.1:0"
            upstream = "{first}"

            [[proxy.timeline]]
            at = "400ms"
            add = {{ name = "late", type = "latency", attributes = {{ latency = 1 }} }}
            "#
            )),
        )
        .await;
        let listen: SocketAddr = json(&call(api, "GET", "/proxies/p", "").await)["listen"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        echo_once(listen).await;

        let moved = call(
            api,
            "POST",
            "/proxies/p",
            &format!(r#"{{"upstream":"{second}"}}"#),
        )
        .await;
        assert_eq!(moved.status, 200, "{}", moved.body);
        let listen: SocketAddr = json(&moved)["listen"].as_str().unwrap().parse().unwrap();
        echo_once(listen).await;

        // The timeline's step lands on the proxy the API shows, not on a replaced one.
        let shown = common::eventually(5, "the timeline's step on the live proxy", || async {
            let shown = json(&call(api, "GET", "/proxies/p", "").await);
            shown["toxics"]
                .as_array()
                .is_some_and(|t| !t.is_empty())
                .then_some(shown)
        })
        .await;
        assert_eq!(shown["toxics"][0]["name"], "late");
        assert_eq!(shown["upstream"], second.to_string());
        // Its counters carried on across the change: both connections are counted.
        let stats = json(&call(api, "GET", "/proxies/p/stats", "").await);
        assert_eq!(stats["connections"], 2, "{stats}");
    })
    .await;
}

#[tokio::test]
async fn fields_fixed_at_creation_are_refused_on_update_not_ignored() {
    within(10, async {
        let api = spawn_api(Settings::default(), None).await;
        let echo = echo_server().await;
        let body = format!(r#"{{"name":"b","listen":"127.0.0.1:0","upstream":"{echo}"}}"#);
        assert_eq!(call(api, "POST", "/proxies", &body).await.status, 201);

        for (change, field) in [
            (r#"{"capture":"b.pcapng"}"#, "capture"),
            (r#"{"mode":"http"}"#, "mode"),
            (r#"{"probe_listen":"127.0.0.1:0"}"#, "probe_listen"),
            (r#"{"instance":"other"}"#, "instance"),
            (r#"{"events":"b.jsonl"}"#, "events"),
        ] {
            let reply = call(api, "POST", "/proxies/b", change).await;
            assert_eq!(reply.status, 400, "{change}: {}", reply.body);
            assert!(
                json(&reply)["error"].as_str().unwrap().contains(field),
                "{change}: {}",
                reply.body
            );
        }
        // The same values as it has, as a client saving the whole proxy sends them: fine.
        let same = call(
            api,
            "POST",
            "/proxies/b",
            r#"{"mode":"tcp","enabled":true}"#,
        )
        .await;
        assert_eq!(same.status, 200, "{}", same.body);

        // A shared capture on a server that captures nothing is refused at creation.
        let body =
            format!(r#"{{"name":"c","listen":"127.0.0.1:0","upstream":"{echo}","capture":true}}"#);
        let reply = call(api, "POST", "/proxies", &body).await;
        assert_eq!(reply.status, 400, "{}", reply.body);
        assert!(reply.body.contains("captures nothing"), "{}", reply.body);
        // And so is switching on a capture that is not there; switching off is no news.
        let reply = call(api, "POST", "/proxies/b", r#"{"capture":true}"#).await;
        assert_eq!(reply.status, 400, "{}", reply.body);
        assert!(
            reply.body.contains("no capture to switch on"),
            "{}",
            reply.body
        );
        let reply = call(api, "POST", "/proxies/b", r#"{"capture":false}"#).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    })
    .await;
}

/// Every field a proxy can be given, as JSON the way the running proxy shows it.
fn every_field(listen: &str) -> serde_json::Value {
    serde_json::json!({
        "name": "full",
        "listen": listen,
        "upstream": "127.0.0.1:9",
        "mode": "http",
        "probe": { "paths": ["/hc"], "headers": { "user-agent": "kube" }, "methods": ["HEAD"] },
        "probe_listen": "127.0.0.1:0",
        "id_headers": ["x-txn"],
        "instance": "inst",
        "tls": null,
        "upstream_protocol": "h2c",
        "upstream_tls": null,
        "faults": [{
            "name": "slow", "type": "http_delay", "stream": "downstream", "toxicity": 0.5,
            "scope": "probe", "attributes": { "delay": 5, "at": "body" },
        }],
    })
}

#[tokio::test]
async fn every_field_the_cli_a_fault_file_and_the_api_accept_reaches_the_proxy() {
    within(10, async {
        // The CLI's flags.
        let cli = snag::cli::Cli::try_parse_from([
            "snag", "proxy", "--name", "full", "--listen", "127.0.0.1:0", "--upstream",
            "127.0.0.1:9", "--mode", "http", "--probe-path", "/hc", "--probe-header",
            "User-Agent=kube", "--probe-method", "HEAD", "--probe-listen", "127.0.0.1:0",
            "--id-header", "X-Txn", "--instance", "inst", "--upstream-protocol", "h2c", "--fault",
            "http_delay:delay=5,at=body,name=slow,toxicity=0.5,scope=probe",
        ])
        .unwrap();
        let snag::cli::Command::Proxy(args) = cli.command else {
            panic!("not proxy")
        };
        let from_cli = serde_json::to_value(args.config().unwrap()).unwrap();
        assert_eq!(from_cli, every_field("127.0.0.1:0"));

        // A fault file's [[proxy]].
        let file = snag::fault::file::parse(
            "full.toml",
            r#"
            [[proxy]]
            name = "full"
            listen = "127.0.0.1:0"
            upstream = "127.0.0.1:9"
            mode = "http"
            probe = { paths = ["/hc"], headers = { "user-agent" = "kube" }, methods = ["HEAD"] }
            probe_listen = "127.0.0.1:0"
            id_headers = ["X-Txn"]
            instance = "inst"
            upstream_protocol = "h2c"
            [[proxy.fault]]
            name = "slow"
            type = "http_delay"
            toxicity = 0.5
            scope = "probe"
            attributes = { delay = 5, at = "body" }
            "#,
        )
        .unwrap();
        let from_file = serde_json::to_value(&file.proxies[0].config).unwrap();
        assert_eq!(from_file, every_field("127.0.0.1:0"));

        // The API's JSON, read back from the running proxy.
        let api = spawn_api(Settings::default(), None).await;
        let body = serde_json::json!({
            "name": "full", "listen": "127.0.0.1:0", "upstream": "127.0.0.1:9",
            "mode": "http", "probe": { "paths": ["/hc"], "headers": { "user-agent": "kube" }, "methods": ["HEAD"] },
            "probe_listen": "127.0.0.1:0", "id_headers": ["X-Txn"], "instance": "inst",
            "upstream_protocol": "h2c",
        });
        let created = call(api, "POST", "/proxies", &body.to_string()).await;
        assert_eq!(created.status, 201, "{}", created.body);
        let toxic = r#"{"name":"slow","type":"http_delay","toxicity":0.5,"scope":"probe","attributes":{"delay":5,"at":"body"}}"#;
        let added = call(api, "POST", "/proxies/full/toxics", toxic).await;
        assert_eq!(added.status, 200, "{}", added.body);
        let live = json(&call(api, "GET", "/proxies/full/config", "").await);
        assert_eq!(live, every_field("127.0.0.1:0"));
    })
    .await;
}

#[tokio::test]
async fn stats_can_be_read_by_window_through_the_api() {
    within(10, async {
        let api = spawn_api(Settings::default(), None).await;
        let echo = echo_server().await;
        let body = format!(r#"{{"name":"p","listen":"127.0.0.1:0","upstream":"{echo}"}}"#);
        let created = json(&call(api, "POST", "/proxies", &body).await);
        let listen: SocketAddr = created["listen"].as_str().unwrap().parse().unwrap();
        echo_once(listen).await;
        echo_once(listen).await;
        let first = json(&call(api, "POST", "/proxies/p/stats/reset", "").await);
        assert_eq!(first["connections"], 2, "{first}");
        echo_once(listen).await;
        let second = json(&call(api, "POST", "/proxies/p/stats/reset", "").await);
        assert_eq!(second["connections"], 1, "{second}");
        let now = json(&call(api, "GET", "/proxies/p/stats", "").await);
        assert_eq!(now["connections"], 0, "{now}");
        assert_eq!(
            call(api, "GET", "/proxies/p/stats/reset", "").await.status,
            405
        );
        assert_eq!(
            call(api, "POST", "/proxies/nope/stats/reset", "")
                .await
                .status,
            404
        );
    })
    .await;
}
