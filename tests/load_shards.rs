//! `snag load --shard I/N` on several generators and `snag load merge`: shards
//! start together, split the work without overlapping, and the merge reports what
//! one generator would have, with each host's own port pool.

mod common;

use std::{collections::HashSet, path::Path, time::SystemTime};

use common::{
    http_backend,
    process::{Process, snag},
};

/// A directory of the test's own, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("snag-test-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn json_of(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Two seconds from now, as seconds since the epoch.
fn soon() -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();
    format!("{:.3}", now.as_secs_f64() + 2.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_split_the_work_and_merge_into_one_report() {
    let (backend, seen) = http_backend("hello").await;
    let url = format!("http://{backend}/x");
    let dir = Scratch::new("shards");
    let start = soon();
    let shard = |i: usize| {
        let result = dir.path().join(format!("shard{i}.json"));
        let mut command = snag(&[
            "load",
            &url,
            "-c",
            "3",
            "-n",
            "301",
            "-d",
            "30s",
            "--sessions",
            "8",
            "--txn-header",
            "x-txn",
            "--seed",
            "7",
            "--shard",
            &format!("{i}/2"),
            "--start-at",
            &start,
            "--host-name",
            &format!("gen{i}"),
            "--result",
            result.to_str().unwrap(),
        ]);
        command.env_remove("JOB_COMPLETION_INDEX");
        (Process::run(command, 60), result)
    };
    let ((a, first), (b, second)) = (shard(0), shard(1));
    let ((code_a, out_a), (code_b, out_b)) = tokio::join!(a, b);
    assert_eq!((code_a, code_b), (0, 0), "{out_a}\n{out_b}");
    assert!(out_a.contains("shard 0/2 (its share)"), "{out_a}");

    // Each sent its share of -n, on transaction ids the other never used.
    let (ra, rb) = (json_of(&first), json_of(&second));
    assert_eq!(ra["format"], "snag-load-result/1");
    assert_eq!(
        (ra["shard"]["index"].as_u64(), rb["shard"]["index"].as_u64()),
        (Some(0), Some(1))
    );
    let ok = |r: &serde_json::Value| r["tally"]["ok"].as_u64().unwrap();
    assert_eq!((ok(&ra), ok(&rb)), (150, 151));
    let seen = seen.lock().unwrap().clone();
    let ids: HashSet<&str> = seen
        .iter()
        .filter_map(|s| s.headers.iter().find(|(k, _)| k == "x-txn"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!((seen.len(), ids.len()), (301, 301));
    // Sessions: the shards' four each make the eight.
    let keys: HashSet<&str> = seen
        .iter()
        .filter_map(|s| s.headers.iter().find(|(k, _)| k == "x-session"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(keys.len(), 8, "{keys:?}");

    // They began at the instant asked, within a second of each other.
    let began = |r: &serde_json::Value| r["started_at_ms"].as_u64().unwrap() as i64;
    assert!((began(&ra) - began(&rb)).abs() < 1000, "{ra} {rb}");
    let asked = (start.parse::<f64>().unwrap() * 1000.0) as i64;
    assert!(began(&ra) >= asked && began(&rb) >= asked);

    // The merge: totals are the sums, rows add up to them, each host has its own line.
    let (a, b) = (first.to_str().unwrap(), second.to_str().unwrap());
    let merge = async |extra: &[&str]| {
        let args = [&["load", "merge", a, b][..], extra].concat();
        Process::run(snag(&args), 30).await
    };
    let (code, out) = merge(&["--json"]).await;
    assert_eq!(code, 0, "{out}");
    let merged: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(merged["ok"], 301);
    assert_eq!(merged["sent"], 301);
    assert_eq!(merged["errors"], 0);
    let row_ok: u64 = merged["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["ok"].as_u64().unwrap())
        .sum();
    assert_eq!(row_ok, 301);
    let hosts = merged["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 2);
    assert_eq!(
        (hosts[0]["host"].as_str(), hosts[0]["ok"].as_u64()),
        (Some("gen0"), Some(150))
    );
    assert_eq!(
        (hosts[1]["host"].as_str(), hosts[1]["ok"].as_u64()),
        (Some("gen1"), Some(151))
    );
    assert!(hosts[0]["ports"]["pool"].as_u64().unwrap() > 0, "{merged}");
    let latency = &merged["latency_ms"];
    let (p99, max) = (
        latency["p99"].as_f64().unwrap(),
        latency["max"].as_f64().unwrap(),
    );
    assert!(p99 > 0.0 && p99 <= max, "{latency}");

    // Two generators on one machine count its sockets twice over: their TIME_WAIT
    // is that machine's, not the sum. On two machines, or from results that do
    // not say (older versions), the counts add up.
    assert!(
        ra["sockets"].as_str().is_some_and(|t| t.contains("net:[")),
        "{ra}"
    );
    assert_eq!(ra["sockets"], rb["sockets"]);
    let counted = async |a_tw: u64, b_tw: u64, b_sockets: serde_json::Value| {
        let edited =
            [(&ra, a_tw, ra["sockets"].clone()), (&rb, b_tw, b_sockets)].map(|(r, tw, sockets)| {
                let mut r = r.clone();
                r["tally"]["seconds"][0]["time_wait"] = tw.into();
                r["sockets"] = sockets;
                r
            });
        let paths = ["one.json", "two.json"].map(|f| dir.path().join(f));
        for (path, r) in paths.iter().zip(&edited) {
            std::fs::write(path, r.to_string()).unwrap();
        }
        let paths = paths.map(|p| p.to_str().unwrap().to_string());
        let (code, out) =
            Process::run(snag(&["load", "merge", &paths[0], &paths[1], "--json"]), 30).await;
        assert_eq!(code, 0, "{out}");
        let merged: serde_json::Value = serde_json::from_str(&out).unwrap();
        merged["rows"][0]["time_wait"].as_u64()
    };
    assert_eq!(counted(10, 20, rb["sockets"].clone()).await, Some(20));
    assert_eq!(counted(10, 20, "elsewhere".into()).await, Some(30));
    assert_eq!(counted(10, 20, serde_json::Value::Null).await, Some(30));

    // And for people: the rows, then each host with its pool.
    let (code, out) = merge(&[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("snag load merge: 2 generators"), "{out}");
    assert!(out.contains("ok 301"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("gen1 ")), "{out}");

    // A shard missing, or one from another run, is refused saying which.
    let (code, stderr) = {
        let (code, _, stderr) =
            common::process::output(&["load", "merge", first.to_str().unwrap()]);
        (code, stderr)
    };
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("shard 1/2 missing"), "{stderr}");
    let (code, _, stderr) = common::process::output(&[
        "load",
        "merge",
        first.to_str().unwrap(),
        first.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("is there twice"), "{stderr}");
}

#[tokio::test]
async fn a_pod_of_an_indexed_job_takes_its_index_from_kubernetes() {
    let (backend, _) = http_backend("hello").await;
    let url = format!("http://{backend}/");
    let dir = Scratch::new("indexed-job");
    let result = dir.path().join("r.json");
    let mut command = snag(&[
        "load",
        &url,
        "-c",
        "4",
        "-n",
        "10",
        "--shard",
        "3",
        "--result",
        result.to_str().unwrap(),
    ]);
    command.env("JOB_COMPLETION_INDEX", "2");
    let (code, out) = Process::run(command, 30).await;
    assert_eq!(code, 0, "{out}");
    let r = json_of(&result);
    assert_eq!(
        (r["shard"]["index"].as_u64(), r["shard"]["count"].as_u64()),
        (Some(2), Some(3))
    );
    // 10 over 3 shards: the third sends 4 (3, 3, 4).
    assert_eq!(r["tally"]["ok"], 4);
}

#[test]
fn bad_shard_flags_say_which_and_why() {
    for (args, why) in [
        (
            &[
                "load",
                "http://127.0.0.1:1/",
                "--shard",
                "2/2",
                "--result",
                "/nonexistent/r.json",
            ][..],
            "below the count",
        ),
        (
            &["load", "http://127.0.0.1:1/", "--shard", "1/2"],
            "--result",
        ),
        (
            &[
                "load",
                "http://127.0.0.1:1/",
                "-c",
                "1",
                "--shard",
                "0/2",
                "--result",
                "/nonexistent/r.json",
            ],
            "1 connections cannot be spread over 2 shards",
        ),
        (
            &["load", "http://127.0.0.1:1/", "--start-at", "tomorrow"],
            "expected RFC 3339",
        ),
        (
            &["load", "http://127.0.0.1:1/", "--start-at", "1000"],
            "--start-at: the start was",
        ),
        (&["load", "merge"], "<RESULTS>"),
    ] {
        let (code, _, stderr) = common::process::output(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
}

/// Three hosts made of network namespaces of the test's own (a service and two
/// generators, each with ten ephemeral ports and no TIME_WAIT reuse), and a third
/// generator alone for comparison: one host runs out of ports after ten
/// connections, two run out after ten each, and the merge says so host by host.
#[test]
fn two_generator_hosts_have_a_port_pool_each() {
    let hosts = common::hosts::Namespaces::new(&["srv", "g0", "g1", "g2"]);
    let ns = &hosts.0;
    let dir = Scratch::new("hosts");
    let snag = env!("CARGO_BIN_EXE_snag");
    let (srv, out) = (&ns[0], dir.path().display());
    // The service at 10.213.0.1 in `srv`, generator host i at 10.213.(i+1).2 behind
    // a veth pair of its own. The backend binds and prints `listening`; the script
    // waits for that line (bounded) before any load.
    let script = format!(
        r#"set -e
ip -n {srv} link set lo up
ip -n {srv} addr add 10.213.0.1/32 dev lo
i=0
for g in {g0} {g1} {g2}; do
  i=$((i + 1))
  ip -n {srv} link add v$i type veth peer name uplink netns $g
  ip -n {srv} addr add 10.213.$i.1/30 dev v$i
  ip -n {srv} link set v$i up
  ip -n $g link set lo up
  ip -n $g addr add 10.213.$i.2/30 dev uplink
  ip -n $g link set uplink up
  ip -n $g route add 10.213.0.1/32 via 10.213.$i.1
  ip netns exec $g sysctl -qw net.ipv4.ip_local_port_range="40000 40009" net.ipv4.tcp_tw_reuse=0
done
ip netns exec {srv} {snag} backend --id a --listen 10.213.0.1:8080 > {out}/backend.out &
pid=$!
trap 'kill $pid' EXIT
for _ in $(seq 500); do grep -q listening {out}/backend.out && break; sleep 0.01; done
url=http://10.213.0.1:8080/
at=$(( $(date +%s) + 2 ))
shards=""
for s in 0 1; do
  g={g0}; [ $s = 1 ] && g={g1}
  ip netns exec $g {snag} load $url -c 2 -n 30 --new-connection --shard $s/2 --start-at $at \
    --host-name host$s --result {out}/shard$s.json --json > /dev/null &
  shards="$shards $!"
done
ip netns exec {g2} {snag} load $url -c 2 -n 30 --new-connection --json > {out}/alone.json
for p in $shards; do wait $p; done
{snag} load merge {out}/shard0.json {out}/shard1.json --json > {out}/merged.json
{snag} load merge {out}/shard0.json {out}/shard1.json"#,
        g0 = ns[1],
        g1 = ns[2],
        g2 = ns[3],
    );
    let stdout = common::hosts::bash(&script);
    let alone = json_of(&dir.path().join("alone.json"));
    let merged = json_of(&dir.path().join("merged.json"));
    let ports = |r: &serde_json::Value| r["errors_by_kind"]["ports exhausted (generator)"].clone();
    // One host: ten ports, ten connections, then none.
    assert_eq!(
        (alone["ok"].as_u64(), ports(&alone).as_u64()),
        (Some(10), Some(20)),
        "{alone:#}"
    );
    // Two hosts: ten each, and the totals are the sums of theirs.
    assert_eq!(
        (merged["ok"].as_u64(), ports(&merged).as_u64()),
        (Some(20), Some(10)),
        "{merged:#}"
    );
    assert_eq!(merged["service_errors"], 0);
    let hosts = merged["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 2);
    for (i, h) in hosts.iter().enumerate() {
        assert_eq!(h["host"], format!("host{i}"));
        assert_eq!(
            (h["ok"].as_u64(), h["generator_errors"].as_u64()),
            (Some(10), Some(5)),
            "{h}"
        );
        let p = &h["ports"];
        assert_eq!(
            (p["pool"].as_u64(), p["headroom_after"].as_i64()),
            (Some(10), Some(0)),
            "{h}"
        );
        // Every port still held after the run (TIME_WAIT, or the last still closing).
        assert_eq!(
            (p["peak_in_use"].as_u64(), p["in_use_after"].as_u64()),
            (Some(10), Some(10)),
            "{h}"
        );
    }
    let sum = |k: &str| hosts.iter().map(|h| h[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("ok"), 20);
    assert!(
        stdout.contains("ports exhausted (generator) 10"),
        "{stdout}"
    );
    assert!(stdout.lines().any(|l| l.starts_with("host1 ")), "{stdout}");
}
