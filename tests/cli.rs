//! The real binary and the real files: fault files parse, bad input gets exit code 2
//! and a message that says where and why, and `snag proxy` relays.

mod common;

use std::{path::Path, time::Duration};

use clap::Parser;
use common::{
    echo_server,
    process::{self, Process},
    within,
};
use snag::cli::Cli;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    time::Instant,
};

/// `snag ARGS` to its end: exit code and stderr.
fn snag(args: &[&str]) -> (i32, String) {
    let (code, _, stderr) = process::output(args);
    (code, stderr)
}

fn toml_files(dir: &str) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn every_fault_file_parses() {
    let files = toml_files("faults");
    assert!(files.len() >= 10, "{files:?}");
    for path in files {
        let scenario = snag::fault::file::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(!scenario.proxies.is_empty(), "{}", path.display());
    }
}

#[test]
fn every_invalid_fixture_fails_naming_its_place_and_reason() {
    let files = toml_files("tests/fixtures/invalid");
    assert!(files.len() >= 8);
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let expect = text
            .lines()
            .next()
            .unwrap()
            .strip_prefix("# expect: ")
            .expect("first line says what to expect");
        let (code, stderr) = snag(&["proxy", "--file", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{}: {stderr}", path.display());
        let want = format!("{}{expect}", path.display());
        assert!(
            stderr.contains(&want),
            "{}:\n  want {want}\n  got  {stderr}",
            path.display()
        );
    }
}

#[test]
fn bad_flags_exit_2_and_name_the_flag() {
    let base = [
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "127.0.0.1:1",
    ];
    let cases: &[(&[&str], &str)] = &[
        (&["--fault", "latncy"], "unknown fault type `latncy`"),
        (
            &["--fault", "latency:latency=abc"],
            "attribute `latency`: invalid type",
        ),
        (
            &["--fault", "latency:toxicity=2"],
            "toxicity 2 is outside 0.0–1.0",
        ),
        (&["--fault", "bandwidth:rte=5"], "unknown field `rte`"),
        (&["--connect-timeout", "soon"], "--connect-timeout"),
    ];
    for (extra, want) in cases {
        let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        let (code, stderr) = snag(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: want {want:?} in {stderr}");
        assert!(
            stderr.contains("--fault") || stderr.contains("--connect-timeout"),
            "{stderr}"
        );
    }
    let (code, stderr) = snag(&[
        "proxy",
        "--listen",
        "nowhere:80",
        "--upstream",
        "127.0.0.1:1",
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--listen"), "{stderr}");
    let (code, stderr) = snag(&["proxy", "--listen", "127.0.0.1:0", "--upstream", "backend"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("--upstream") && stderr.contains("not host:port"),
        "{stderr}"
    );
    let (code, stderr) = snag(&["proxy", "--upstream", "127.0.0.1:1"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--listen"), "{stderr}");
    // TLS and protocols that cannot work: exit 2, the flag or the file named.
    let tls_cases: &[(&[&str], &str)] = &[
        (
            &[
                "--mode",
                "http",
                "--tls-cert",
                "/nonexistent/cert.pem",
                "--tls-key",
                "/nonexistent/key.pem",
            ],
            "/nonexistent/cert.pem: cannot read",
        ),
        (&["--upstream-ca", "ca.pem"], "need mode http"),
        (
            &["--mode", "http", "--upstream-protocol", "h3"],
            "--upstream-protocol",
        ),
    ];
    for (extra, want) in tls_cases {
        let args: Vec<&str> = base.iter().chain(extra.iter()).copied().collect();
        let (code, stderr) = snag(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: want {want:?} in {stderr}");
    }
    let (code, stderr) = snag(&["proxy", "--file", "/nonexistent.toml"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("/nonexistent.toml"), "{stderr}");
}

#[test]
fn the_cli_parses_inline_faults_in_order() {
    let cli = Cli::try_parse_from([
        "snag",
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        "127.0.0.1:1",
        "--fault",
        "latency:latency=5",
        "--fault",
        "reset_peer:stream=upstream,toxicity=0.25",
    ])
    .unwrap();
    let snag::cli::Command::Proxy(args) = cli.command else {
        panic!("not proxy")
    };
    let names: Vec<_> = args.faults.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["latency_downstream", "reset_peer_upstream"]);
    assert!(Cli::try_parse_from(["snag", "proxy", "--file", "f.toml", "--fault", "down"]).is_err());
}

#[tokio::test]
async fn snag_proxy_relays_with_its_inline_faults() {
    within(20, async {
        let backend = echo_server().await;
        let mut process = Process::spawn(process::snag(&[
            "proxy",
            "--listen",
            "127.0.0.1:0",
            "--upstream",
            &backend.to_string(),
            "--fault",
            "latency:latency=120",
            "--seed",
            "5",
        ]));
        // The table's second line names the bound address: ready once printed.
        let header = process.line(10, |l| Some(l.to_string())).await;
        assert!(header.starts_with("proxy"), "{header}");
        let row = process.line(10, |l| Some(l.to_string())).await;
        assert!(row.contains("latency_downstream"), "{row}");
        let addr = row.split_whitespace().nth(1).unwrap().to_string();
        let mut client = TcpStream::connect(addr.as_str()).await.unwrap();
        let t = Instant::now();
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0; 4];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        assert!(
            t.elapsed() >= Duration::from_millis(120),
            "{:?}",
            t.elapsed()
        );
    })
    .await;
}

#[test]
fn lab_commands_reject_bad_flags_saying_which_and_why() {
    for (args, why) in [
        (&["load", "ftp://x/"][..], "expected http://HOST:PORT/PATH"),
        (
            &["load", "http://127.0.0.1:1/", "--cacert", "ca.pem"],
            "--cacert and --insecure are for https:// targets",
        ),
        (
            &[
                "load",
                "https://127.0.0.1:1/",
                "--cacert",
                "/nonexistent/ca.pem",
            ],
            "/nonexistent/ca.pem",
        ),
        (
            &["load", "http://127.0.0.1:1/", "--shape", "step:5@1s..2s"],
            "--rate",
        ),
        (
            &[
                "load",
                "http://127.0.0.1:1/",
                "--rate",
                "10",
                "--shape",
                "step:5@1s",
            ],
            "expected step:PEAK@FROM..TO",
        ),
        (
            &["load", "http://127.0.0.1:1/", "-d", "5s", "--watch", "1s"],
            "--watch 1s is shorter than --duration 5s",
        ),
        (
            &["load", "http://127.0.0.1:1/", "--rate", "0"],
            "--rate 0: must be a number above 0",
        ),
        (
            &[
                "load",
                "http://127.0.0.1:1/",
                "--rate",
                "9",
                "-d",
                "2s",
                "--shape",
                "step:5@1s..3s",
            ],
            "after the traffic window",
        ),
        (
            &["load", "http://127.0.0.1:1/", "-H", "nocolon"],
            "expected `Name: value`",
        ),
        (&["balancer", "--backend", "a"], "expected id=ADDR:PORT"),
        (
            &["balancer", "--backend", "a=127.0.0.1:1,weight=0"],
            "weight \"0\" is not 1..=1000",
        ),
        (
            &[
                "balancer",
                "--backend",
                "a=127.0.0.1:1",
                "--strategy",
                "fair",
            ],
            "unknown strategy \"fair\"",
        ),
        (
            &[
                "balancer",
                "--backend",
                "a=127.0.0.1:1",
                "--hash-key",
                "query:x",
            ],
            "expected header:NAME, cookie:NAME or source",
        ),
        (
            &["backend", "--id", "a", "--workers", "2", "--queue", "lots"],
            "neither a number nor `unbounded`",
        ),
        (&["backend", "--id", "a", "--work", "5ms"], "--workers"),
    ] {
        let (code, stderr) = snag(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
}

#[test]
fn watch_says_why_it_cannot_read_a_products_view() {
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--balancer", "nginx"], 2, "the driver has no [view]"),
        (&["--balancer", "caddy"], 2, "give it with --log FILE"),
        (&["--balancer", "envoy"], 2, "not a bundled driver"),
        (&["--balancer", "./nowhere.toml"], 1, "nowhere.toml"),
        (
            &[
                "--balancer",
                "haproxy",
                "--dir",
                "/nonexistent-snag-dir",
                "--duration",
                "300ms",
            ],
            1,
            "could not connect to /nonexistent-snag-dir/admin.sock",
        ),
        (
            &["--balancer", "haproxy", "--port-range", "1-2"],
            2,
            "--port-range",
        ),
    ];
    for (extra, want_code, want) in cases {
        let args: Vec<&str> = ["watch"].iter().chain(extra.iter()).copied().collect();
        let (code, stderr) = snag(&args);
        assert_eq!(code, *want_code, "{args:?}: {stderr}");
        assert!(stderr.contains(want), "{args:?}: want {want:?} in {stderr}");
    }
}

#[test]
fn a_bad_port_range_or_backend_protocol_is_refused_by_name() {
    for (flag, value, want) in [
        (
            "--port-range",
            "41009-41000",
            "the first port is above the last",
        ),
        ("--port-range", "41000", "expected FIRST-LAST"),
        ("--backend-protocol", "h3", "expected h1, h2c or h2"),
    ] {
        let (code, stderr) = snag(&["case", "share-rr", flag, value]);
        assert_eq!(code, 2, "{flag} {value}: {stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(want),
            "{flag} {value}: {stderr}"
        );
    }
}

#[test]
fn a_bad_thread_count_is_refused_before_anything_starts() {
    for bad in ["0", "many"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_snag"))
            .args([
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--upstream",
                "127.0.0.1:9",
            ])
            .env("SNAG_THREADS", bad)
            .output()
            .expect("snag runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "SNAG_THREADS={bad}: {stderr}");
        assert!(
            stderr.contains(&format!("SNAG_THREADS=\"{bad}\"")) && stderr.contains("from 1"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
