//! `snag serve` and `snag ctl` as processes: flags, configs, Toxiproxy's server flags.

mod common;

use std::{net::SocketAddr, path::PathBuf};

use common::{echo_server, http, process::Process, within};

/// Starts `program args`, waits for its "control API on http://ADDR" line.
async fn start_api(program: &std::path::Path, args: &[&str]) -> (Process, SocketAddr) {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    let mut process = Process::spawn(command);
    let addr = process
        .line(10, |line| {
            let rest = line.strip_prefix("control API on http://")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .await;
    (process, addr)
}

fn snag() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_snag"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("snag-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ctl(api: SocketAddr, args: &[&str]) -> (bool, String, String) {
    let api = api.to_string();
    let all: Vec<&str> = ["ctl", "--api", &api]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let (code, out, err) = common::process::output(&all);
    (code == 0, out, err)
}

#[test]
fn a_remote_api_needs_a_token_or_an_explicit_insecure_flag() {
    let (code, _, stderr) = common::process::output(&["serve", "--listen", "0.0.0.0:0"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("--listen 0.0.0.0:0") && stderr.contains("--token"),
        "{stderr}"
    );
}

#[tokio::test]
async fn toxiproxy_server_flags_and_json_config_work_unchanged() {
    within(20, async {
        let dir = scratch("toxiproxy-server");
        let link = dir.join("toxiproxy-server");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(snag(), &link).unwrap();
        let echo = echo_server().await;
        let config = dir.join("config.json");
        std::fs::write(
            &config,
            format!(r#"[{{"name":"redis","listen":"127.0.0.1:0","upstream":"{echo}"}}]"#),
        )
        .unwrap();
        let (_child, api) = start_api(
            &link,
            &[
                "-host=127.0.0.1",
                "-port",
                "0",
                &format!("-config={}", config.display()),
                "-seed=3",
            ],
        )
        .await;
        let reply = http(api, "GET", "/proxies/redis", "", &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(
            reply
                .body
                .contains(&format!(r#""upstream":"{echo}","enabled":true"#)),
            "{}",
            reply.body
        );
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test]
async fn a_toml_fault_file_as_config_starts_its_proxies_with_their_faults() {
    within(20, async {
        let dir = scratch("toml-config");
        let echo = echo_server().await;
        let config = dir.join("f.toml");
        let text = format!(
            "[[proxy]]\nname = \"api\"\nlisten = \"127.0.0.1:0\"\nupstream = \"{echo}\"\n\n[[proxy.fault]]\ntype = \"latency\"\nattributes = {{ latency = 50 }}\n"
        );
        std::fs::write(&config, text).unwrap();
        let (_child, api) = start_api(&snag(), &["serve", "--listen", "127.0.0.1:0", "--seed", "1", "--config", config.to_str().unwrap()]).await;
        let reply = http(api, "GET", "/proxies/api/toxics", "", &[]).await;
        assert_eq!(reply.body, r#"[{"attributes":{"latency":50,"jitter":0},"name":"latency_downstream","type":"latency","stream":"downstream","toxicity":1}]"#);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test]
async fn ctl_creates_lists_toggles_and_changes_faults() {
    within(30, async {
        let (_child, api) = start_api(
            &snag(),
            &["serve", "--listen", "127.0.0.1:0", "--seed", "1"],
        )
        .await;
        let echo = echo_server().await.to_string();
        let (ok, out, err) = ctl(api, &["create", "web", "--upstream", &echo]);
        assert!(
            ok && out.starts_with("created \"web\" listening on \"127.0.0.1:"),
            "{out}{err}"
        );
        let (ok, out, _) = ctl(api, &["add", "web", "latency:latency=100,stream=upstream"]);
        assert!(ok && out.contains("latency_upstream"), "{out}");
        let (ok, out, _) = ctl(api, &["list"]);
        let lines: Vec<&str> = out.lines().collect();
        assert!(ok && lines[0].starts_with("proxy  listen"), "{out}");
        assert!(
            lines[1].starts_with("web    127.0.0.1:")
                && lines[1].contains("yes")
                && lines[1].contains("latency_upstream (latency upstream)"),
            "{out}"
        );
        let (ok, out, _) = ctl(api, &["toggle", "web"]);
        assert!(ok && out.trim() == "web disabled", "{out}");
        let (ok, _, err) = ctl(api, &["remove", "web", "nope"]);
        assert!(!ok && err.contains("toxic not found"), "{err}");
        let (ok, _, _) = ctl(api, &["remove", "web", "latency_upstream"]);
        assert!(ok);
        let (ok, out, _) = ctl(api, &["delete", "web"]);
        assert!(ok && out.trim() == "deleted web", "{out}");
        let (ok, out, _) = ctl(api, &["list"]);
        assert!(ok && out.contains("(no proxies)"), "{out}");
    })
    .await;
}

#[tokio::test]
async fn toxiproxy_server_flags_work_after_snag_serve_too() {
    within(20, async {
        // `-host` once read as `-h`: help on stdout and exit 0, serving nothing.
        let (_child, api) =
            start_api(&snag(), &["serve", "-host", "127.0.0.1", "-port", "0"]).await;
        let reply = http(api, "GET", "/version", "", &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    })
    .await;
}

#[tokio::test]
async fn ctl_sends_every_field_of_a_fault_and_drives_what_the_api_has() {
    within(30, async {
        let (_child, api) = start_api(
            &snag(),
            &["serve", "--listen", "127.0.0.1:0", "--seed", "1"],
        )
        .await;
        let echo = echo_server().await.to_string();
        let (ok, out, err) = ctl(
            api,
            &[
                "create",
                "b",
                "--upstream",
                &echo,
                "--mode",
                "http",
                "--probe-listen",
                "127.0.0.1:0",
            ],
        );
        assert!(
            ok && out.contains("mode http") && out.contains("probes on 127.0.0.1:"),
            "{out}{err}"
        );

        // Once accepted with its scope dropped, so the fault hit b's data path.
        let (ok, out, err) = ctl(api, &["add", "b", "drop_request:scope=probe,toxicity=0.3"]);
        assert!(ok && out.contains("scope probe"), "{out}{err}");
        let reply = http(
            api,
            "GET",
            "/proxies/b/toxics/drop_request_downstream",
            "",
            &[],
        )
        .await;
        let toxic: serde_json::Value = serde_json::from_str(&reply.body).unwrap();
        assert_eq!(toxic["scope"], "probe", "{toxic}");
        assert!(
            (toxic["toxicity"].as_f64().unwrap() - 0.3).abs() < 1e-6,
            "{toxic}"
        );

        let (ok, out, err) = ctl(api, &["drain", "b", "deadline:timeout=5000,new=ignore"]);
        assert!(ok && out.contains("deadline 5000 ms"), "{out}{err}");
        let (ok, out, err) = ctl(api, &["stats", "b"]);
        assert!(
            ok && out.lines().any(|l| l.starts_with("connections ")),
            "{out}{err}"
        );
        // A window read: the counts so far, then a new window from zero.
        let connect = |c: &str| c.starts_with("connections ");
        let count = |out: &str| {
            out.lines()
                .find(|l| connect(l))
                .map(|l| l.split_whitespace().last().unwrap().to_string())
        };
        let (ok, out, err) = ctl(api, &["stats", "b", "--reset"]);
        assert!(ok && count(&out).is_some(), "{out}{err}");
        let (ok, out, err) = ctl(api, &["stats", "b"]);
        assert!(ok && count(&out).as_deref() == Some("0"), "{out}{err}");
        let (ok, out, err) = ctl(api, &["undrain", "b"]);
        assert!(ok && out.contains("accepting again"), "{out}{err}");
        let (ok, _, err) = ctl(api, &["drain", "b", "deadline"]);
        assert!(!ok && err.contains("timeout > 0"), "{err}");
    })
    .await;
}
