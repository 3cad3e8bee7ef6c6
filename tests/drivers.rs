//! HAProxy and nginx under the same cases as the built-in balancer, through the real
//! binary in `--quick` mode: their configuration written by snag, started and stopped
//! by PID, their own view of each backend read back into the report.

mod common;

use std::path::Path;

/// Runs `snag case` against `balancer`; the report directory.
fn run(cases: &str, balancer: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("snag-drivers-{balancer}-{}", std::process::id()));
    let mut command = common::process::snag(&[
        "case",
        cases,
        "--balancer",
        balancer,
        "--quick",
        "--seed",
        "11",
    ]);
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

fn assert_pass(r: &serde_json::Value) {
    assert_eq!(
        r["verdict"], "pass",
        "{}: {:#}\n{:#}",
        r["name"], r["checks"], r["notes"]
    );
}

/// One test, so that the products never run at the same time and compete for the
/// two cores the cases' timings assume.
#[test]
fn haproxy_and_nginx_run_the_cases_they_can() {
    haproxy_runs_the_cases_it_can_and_its_own_view_is_in_the_report();
    nginx_runs_share_and_kill_and_refuses_what_it_lacks();
}

fn haproxy_runs_the_cases_it_can_and_its_own_view_is_in_the_report() {
    let cases = "share-rr,sticky,health-exclude,kill-during-run,LB-03,LB-05,probe-loss";
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
    let dir = run("share-rr,kill-during-run,health-exclude", "nginx");
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
