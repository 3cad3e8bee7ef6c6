//! Tests of faults' inline form, toxicity draws and chains; shared helpers for the
//! stage tests.

use std::sync::Arc;

use tokio::time::Instant;

use super::{
    stage::{Chunk, Step},
    *,
};
use bytes::Bytes;

pub fn chunk_at(due: Instant, data: &[u8]) -> Chunk {
    Chunk {
        data: Bytes::copy_from_slice(data),
        due,
    }
}

pub fn sends(steps: &[Step]) -> Vec<Chunk> {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Send(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn inline_spec_parses_fields_and_attributes() {
    let f: Fault = "latency:latency=50,jitter=10,stream=upstream,toxicity=0.5"
        .parse()
        .unwrap();
    assert_eq!(f.name, "latency_upstream");
    assert_eq!(f.stream, Direction::Upstream);
    assert_eq!(f.toxicity, 0.5);
    assert_eq!(
        f.kind,
        Kind::Latency(Latency {
            latency: 50,
            jitter: 10
        })
    );
    let f: Fault = "down".parse().unwrap();
    assert_eq!((f.name.as_str(), f.kind), ("down_downstream", Kind::Down));
}

#[test]
fn inline_spec_errors_say_what_is_wrong() {
    let err = |s: &str| s.parse::<Fault>().unwrap_err();
    assert!(err("latncy:latency=5").contains("unknown fault type `latncy`"));
    assert!(
        err("latency:latncy=5").contains("unknown field `latncy`"),
        "{}",
        err("latency:latncy=5")
    );
    assert!(err("latency:latency=-5").contains("attribute `latency`: invalid value: integer `-5`"));
    assert!(err("latency:latency=x").contains("attribute `latency`: invalid type"));
    assert!(err("latency:latency=5,toxicity=1.5").contains("toxicity 1.5 is outside"));
    assert!(err("latency:latency=5,stream=sideways").contains("sideways"));
    assert!(err("latency:latency").contains("not key=value"));
    assert!(err("latency:latency=5,jitter=9").contains("jitter 9 ms exceeds latency 5 ms"));
    assert!(err("down:toxicity=0.5").contains("toxicity must be 1"));
}

#[test]
fn probe_rules_match_paths_headers_or_methods() {
    let mut rules = ProbeRules::default();
    let none = |_: &str| None;
    assert_eq!(rules.classify("GET", "/healthz", none), Scope::Probe);
    assert_eq!(rules.classify("GET", "/healthz/deep", none), Scope::Data);
    rules
        .headers
        .insert("user-agent".into(), "kube-probe".into());
    rules.methods.push("HEAD".into());
    let kube = |name: &str| (name == "user-agent").then_some("Kube-Probe/1.29");
    assert_eq!(rules.classify("GET", "/", kube), Scope::Probe);
    assert_eq!(rules.classify("head", "/", none), Scope::Probe);
    assert_eq!(rules.classify("GET", "/", |_| Some("curl/8")), Scope::Data);
}

#[test]
fn toxicity_draw_is_reproducible_and_near_its_rate() {
    let f: Fault = "latency:latency=1,toxicity=0.5".parse().unwrap();
    let hits: Vec<u64> = (0..1000).filter(|c| f.applies(9, "p", *c)).collect();
    let again: Vec<u64> = (0..1000).filter(|c| f.applies(9, "p", *c)).collect();
    assert_eq!(hits, again);
    assert!((430..570).contains(&hits.len()), "{}", hits.len());
    let other_seed = (0..1000)
        .filter(|c| f.applies(10, "p", *c))
        .collect::<Vec<_>>();
    assert_ne!(hits, other_seed);
}

#[test]
fn chain_composes_in_order_and_keeps_unchanged_stages() {
    let t0 = Instant::now();
    let id = ConnId {
        seed: 1,
        proxy: "p",
        conn: 0,
        class: Scope::Any,
    };
    let lat: Arc<Fault> = Arc::new("latency:latency=10".parse().unwrap());
    let limit: Arc<Fault> = Arc::new("limit_data:bytes=3".parse().unwrap());
    let mut chain = Chain::default();
    let mut out = Vec::new();
    chain.sync(
        &[lat.clone(), limit.clone()],
        Direction::Downstream,
        id,
        t0,
        &mut out,
    );
    chain.chunk(chunk_at(t0, b"ab"), &mut out);
    // Re-syncing with the same Arcs keeps limit_data's count of 2 bytes sent.
    chain.sync(
        &[lat.clone(), limit.clone()],
        Direction::Downstream,
        id,
        t0,
        &mut out,
    );
    chain.chunk(chunk_at(t0, b"cd"), &mut out);
    let at = t0 + std::time::Duration::from_millis(10);
    let steps: Vec<Step> = out.iter().map(|s| s.step.clone()).collect();
    assert_eq!(
        steps,
        [
            Step::Send(chunk_at(at, b"ab")),
            Step::Send(chunk_at(at, b"c")),
            Step::Finish { at }
        ]
    );
    // Each step names the faults that acted on it: latency delayed all three;
    // limit_data let "ab" through whole, cut "cd" and added the FIN.
    let by: Vec<Vec<String>> = out
        .iter()
        .map(|s| s.by.as_ref().map_or(Vec::new(), |b| b.names.clone()))
        .collect();
    assert_eq!(
        by,
        [
            vec![lat.name.clone()],
            vec![lat.name.clone(), limit.name.clone()],
            vec![lat.name.clone(), limit.name.clone()],
        ]
    );
    // latency=0 passes every chunk as it came: it acts on nothing.
    let zero: Arc<Fault> = Arc::new("latency:latency=0".parse().unwrap());
    let mut idle = Chain::default();
    let mut passed = Vec::new();
    idle.sync(&[zero], Direction::Downstream, id, t0, &mut passed);
    idle.chunk(chunk_at(t0, b"ab"), &mut passed);
    idle.eof(t0, &mut passed);
    assert_eq!(passed.len(), 2);
    assert!(passed.iter().all(|s| s.by.is_none()), "{passed:?}");
    // An upstream-only list leaves this direction empty.
    chain.sync(&[], Direction::Downstream, id, t0, &mut out);
    assert!(chain.is_empty());
}
