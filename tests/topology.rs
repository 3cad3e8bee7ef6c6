//! `snag case --topology`: cases whose interposers run in a `snag serve` on another
//! host, whose backends on a third and whose load comes from two generator hosts —
//! hosts made of network namespaces of the test's own — reach the same verdicts as
//! with every part on this one.

mod common;

use std::path::Path;

/// The cases run both ways: timeline faults on the probe path (probe-loss), the
/// client, balancer, interposer and backend counts agreeing (share-rr), a backend
/// slowed through its admin route mid-case (slow-rr).
const CASES: &str = "probe-loss,share-rr,slow-rr";

fn reports(dir: &Path, cases: &str) -> Vec<(String, serde_json::Value)> {
    cases
        .split(',')
        .map(|case| {
            let path = dir.join(format!("{case}.json"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (case.to_string(), serde_json::from_str(&text).unwrap())
        })
        .collect()
}

/// Passed, or not judged because other programs took the CPU (said with the
/// evidence): what a busy machine may turn a pass into.
fn passed(report: &serde_json::Value) -> bool {
    match report["verdict"].as_str() {
        Some("pass") => true,
        Some("host-busy") => !report["host_evidence"].as_array().unwrap().is_empty(),
        _ => false,
    }
}

/// Every load run of `report` came from generators g0 and g1, merged: each sent,
/// and the totals are the sums of theirs.
fn from_both_generators(case: &str, report: &serde_json::Value) {
    let runs = report["runs"].as_array().unwrap();
    assert!(!runs.is_empty(), "{case}");
    for r in runs {
        let hosts: Vec<_> = r["load"]["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h["host"].as_str().unwrap(), h["ok"].as_u64().unwrap()))
            .collect();
        assert!(
            hosts.len() == 2 && hosts[0].0 == "g0" && hosts[1].0 == "g1",
            "{case}: {hosts:?}"
        );
        assert!(hosts[0].1 > 0 && hosts[1].1 > 0, "{case}: {hosts:?}");
        let ok = r["load"]["ok"].as_u64().unwrap();
        assert_eq!(ok, hosts[0].1 + hosts[1].1, "{case}");
    }
}

#[test]
fn cases_over_parts_on_other_hosts_reach_the_local_verdicts() {
    let hosts = common::hosts::Namespaces::new(&["run", "ifc", "be", "g0", "g1"]);
    let ns = &hosts.0;
    let dir = std::env::temp_dir().join(format!("snag-test-{}-topology", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    struct Scratch(std::path::PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _scratch = Scratch(dir.clone());
    std::fs::write(dir.join("token"), "t0ken\n").unwrap();
    let mut topology = String::new();
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        topology += &format!(
            "[backend.{id}]\naddress = \"10.214.2.2:{}\"\n\n\
             [interposer.{id}]\napi = \"10.214.1.2:8474\"\ntoken_file = \"token\"\n\
             listen = \"10.214.1.2:{}\"\nprobe_listen = \"10.214.1.2:{}\"\n\n",
            9001 + i,
            7001 + i,
            7101 + i
        );
    }
    topology += "[here]\naddress = \"10.214.1.1\"\n\n";
    for g in 0..2 {
        topology += &format!(
            "[generator.g{g}]\napi = \"10.214.{}.2:8474\"\ntoken_file = \"token\"\n\n",
            3 + g
        );
    }
    std::fs::write(dir.join("topo.toml"), topology).unwrap();
    let snag = env!("CARGO_BIN_EXE_snag");
    let (run, ifc, be, g0, g1, out) = (&ns[0], &ns[1], &ns[2], &ns[3], &ns[4], dir.display());
    // The runner (the case and the balancer, at 10.214.1.1) in `run`, the
    // interposers' server in `ifc` (10.214.1.2, routing on to the backends), the
    // backends in `be` (10.214.2.2), generator i in `gi` (10.214.(3+i).2, linked to
    // `run`). Each server prints a line once it listens; the script waits for it,
    // bounded, before the case.
    let script = format!(
        r#"set -e
for n in {run} {ifc} {be} {g0} {g1}; do ip -n $n link set lo up; done
ip -n {run} link add r0 type veth peer name i0 netns {ifc}
ip -n {ifc} link add i1 type veth peer name b0 netns {be}
ip -n {run} addr add 10.214.1.1/30 dev r0
ip -n {ifc} addr add 10.214.1.2/30 dev i0
ip -n {ifc} addr add 10.214.2.1/30 dev i1
ip -n {be} addr add 10.214.2.2/30 dev b0
ip -n {run} link set r0 up; ip -n {ifc} link set i0 up; ip -n {ifc} link set i1 up; ip -n {be} link set b0 up
ip -n {run} route add 10.214.2.0/30 via 10.214.1.2
ip -n {be} route add 10.214.1.0/30 via 10.214.2.1
ip netns exec {ifc} sysctl -qw net.ipv4.ip_forward=1
pids=""
trap 'kill $pids 2>/dev/null' EXIT
i=0
for g in {g0} {g1}; do
  n=$((3 + i))
  ip -n {run} link add gv$i type veth peer name uplink netns $g
  ip -n {run} addr add 10.214.$n.1/30 dev gv$i
  ip -n {run} link set gv$i up
  ip -n $g addr add 10.214.$n.2/30 dev uplink
  ip -n $g link set uplink up
  ip -n $g route add 10.214.1.0/30 via 10.214.$n.1
  ip netns exec $g {snag} serve --listen 10.214.$n.2:8474 --token t0ken --generator > {out}/gen$i.out 2>&1 &
  pids="$pids $!"
  i=$((i + 1))
done
ip netns exec {ifc} {snag} serve --listen 10.214.1.2:8474 --token t0ken --files-dir {out} > {out}/serve.out 2>&1 &
pids="$pids $!"
i=0
for id in a b c; do
  ip netns exec {be} {snag} backend --id $id --listen 10.214.2.2:900$((i + 1)) > {out}/backend-$id.out 2>&1 &
  pids="$pids $!"
  i=$((i + 1))
done
for f in serve backend-a backend-b backend-c gen0 gen1; do
  for _ in $(seq 1000); do grep -qE 'listening|control API on' {out}/$f.out && break; sleep 0.01; done
  grep -qE 'listening|control API on' {out}/$f.out || {{ echo "$f did not start"; cat {out}/$f.out; exit 1; }}
done
ip netns exec {run} {snag} case {CASES} --quick --seed 7 --topology {out}/topo.toml --report-dir {out}/there 2> {out}/there.err || true
ip netns exec {run} {snag} case share-rr --balancer haproxy --quick --seed 7 --topology {out}/topo.toml --report-dir {out}/haproxy || true
ip netns exec {run} {snag} ctl --api 10.214.1.2:8474 --token t0ken list > {out}/left.txt
for i in 1 2 3; do ip netns exec {run} curl -sf http://10.214.2.2:900$i/stats > {out}/stats-$i.json; done
"#
    );
    let stdout = common::hosts::bash(&script);
    let (code, here_out) = common::process::run_blocking(
        common::process::snag(&[
            "case",
            CASES,
            "--quick",
            "--seed",
            "7",
            "--report-dir",
            dir.join("here").to_str().unwrap(),
        ]),
        300,
    );
    let here = reports(&dir.join("here"), CASES);
    let there = reports(&dir.join("there"), CASES);
    for ((case, h), (_, t)) in here.iter().zip(&there) {
        assert!(passed(h), "{case} here: {h:#}\n{here_out} (exit {code})");
        assert!(passed(t), "{case} elsewhere: {t:#}\n{stdout}");
        // The parts elsewhere were the ones used: the report says where each was,
        // and their interposers relayed the data requests.
        let notes = t["notes"].to_string();
        for id in ["a", "b", "c"] {
            assert!(
                notes.contains(&format!(
                    "{id}: interposer in the snag serve at 10.214.1.2:8474"
                )),
                "{case}: {notes}"
            );
        }
        // A case of several runs keeps its interposers' counts in each run's own.
        if let Some(by_name) = t["interposers"].as_object().filter(|m| !m.is_empty()) {
            let relayed: u64 = by_name
                .values()
                .map(|s| s["requests"]["data"].as_u64().unwrap())
                .sum();
            assert!(relayed > 0, "{case}: {by_name:#?}");
        }
        assert!(!notes.contains("not applied"), "{case}: {notes}");
        // Each interposer's event log came back from its server: every probe it
        // relayed, those the fault dropped among them (status 0). A probe in flight
        // when the case deleted the interposer is marked cut, and lost to no fault.
        for id in ["a", "b", "c"] {
            let probes: Vec<u64> = t["interposer_events"][id]
                .as_array()
                .unwrap_or_else(|| panic!("{case}: no event log of {id}"))
                .iter()
                .filter(|e| e["event"] == "probe" && e.get("cut").is_none())
                .map(|e| e["status"].as_u64().unwrap())
                .collect();
            if case == "probe-loss" {
                let lost = probes.iter().filter(|s| **s == 0).count();
                assert!(!probes.is_empty(), "{case}: {id}");
                assert_eq!(lost > 0, id == "b", "{case}: {id}: {probes:?}");
            }
        }
        from_both_generators(case, t);
    }
    // The runs on generators elsewhere told their progress once a second, from
    // what the generators said of theirs.
    let err = std::fs::read_to_string(dir.join("there.err")).unwrap();
    let sent = |line: &str| {
        let (_, rest) = line.split_once(", sent ")?;
        rest.split(',').next()?.parse::<u64>().ok()
    };
    assert!(
        err.lines()
            .any(|l| l.contains(" of ") && sent(l).is_some_and(|n| n > 0)),
        "{err}"
    );
    // The backends on their host served the data requests, by their own count.
    for i in 1..=3 {
        let stats: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(format!("stats-{i}.json"))).unwrap())
                .unwrap();
        assert!(stats["served"].as_u64().unwrap() > 100, "{stats}");
    }
    // A real balancer, started here by its driver, in front of the same parts.
    let haproxy = reports(&dir.join("haproxy"), "share-rr@haproxy");
    let (_, h) = &haproxy[0];
    assert!(passed(h), "share-rr with HAProxy: {h:#}\n{stdout}");
    assert_eq!(h["balancer_under_test"], "haproxy");
    from_both_generators("share-rr with HAProxy", h);
    // Each case deleted the interposers it made when it ended.
    let left = std::fs::read_to_string(dir.join("left.txt")).unwrap();
    assert!(!left.contains("10.214.1.2:700"), "{left}");
}

#[test]
fn a_bad_topology_says_where_and_why() {
    let dir = std::env::temp_dir().join(format!("snag-test-{}-bad-topology", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("topo.toml");
    std::fs::write(&file, "[backend.a]\naddress = \"nowhere\"\n").unwrap();
    let (code, _, stderr) = common::process::output(&[
        "case",
        "share-rr",
        "--quick",
        "--topology",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "topology {}:2:11: invalid socket address",
            file.display()
        )),
        "{stderr}"
    );
    std::fs::write(
        &file,
        "[interposer.a]\napi = \"127.0.0.1:8474\"\nlisten = \"127.0.0.1:7001\"\nprobe_listen = \"127.0.0.1:7002\"\n",
    )
    .unwrap();
    let (code, _, stderr) = common::process::output(&[
        "case",
        "share-rr",
        "--quick",
        "--topology",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("interposer a runs elsewhere but backend a does not"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// spike-step run with `topology`: it ends in an error, and the report's notes say why.
async fn spike_with(topology: &Path, report_dir: &Path) -> String {
    let (code, stdout) = common::process::Process::run(
        common::process::snag(&[
            "case",
            "spike-step",
            "--quick",
            "--topology",
            topology.to_str().unwrap(),
            "--report-dir",
            report_dir.to_str().unwrap(),
        ]),
        60,
    )
    .await;
    assert_eq!(code, 1, "{stdout}");
    let path = report_dir.join("spike-step.json");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(report["verdict"], "error", "{stdout}");
    report["notes"].to_string()
}

/// A backend elsewhere that cannot be what the case needs, or cannot be reached: the
/// case ends in an error that says which backend and what to start instead.
#[tokio::test]
async fn a_backend_elsewhere_must_be_what_the_case_needs() {
    let dir =
        std::env::temp_dir().join(format!("snag-test-{}-backend-topology", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // spike-step's backend has a pool of 8 workers of 25 ms; this one has none.
    let mut backend = common::process::Process::spawn(common::process::snag(&[
        "backend",
        "--id",
        "s",
        "--listen",
        "127.0.0.1:0",
    ]));
    let addr = backend
        .line(10, |l| {
            let rest = l.split(" listening on ").nth(1)?;
            Some(rest.split_whitespace().next()?.to_string())
        })
        .await;
    let file = dir.join("topo.toml");
    std::fs::write(&file, format!("[backend.s]\naddress = \"{addr}\"\n")).unwrap();
    let notes = spike_with(&file, &dir.join("report")).await;
    assert!(
        notes.contains(&format!(
            "backend s at {addr} was started as `snag backend --id s --health-path /health`;"
        )) && notes.contains(
            "this case needs `snag backend --id s --health-path /health --workers 8 --work 25ms`"
        ),
        "{notes}"
    );
    drop(backend);
    // Nobody there.
    std::fs::write(&file, "[backend.s]\naddress = \"127.0.0.1:1\"\n").unwrap();
    let notes = spike_with(&file, &dir.join("report")).await;
    assert!(
        notes.contains("backend s at 127.0.0.1:1: could not connect to 127.0.0.1:1"),
        "{notes}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
