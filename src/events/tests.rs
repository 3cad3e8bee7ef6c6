use super::*;

#[test]
fn an_id_seen_twice_is_one_duplicate() {
    let c = Counters::default();
    for id in ["a", "b", "a", "c", "a"] {
        c.transaction(id);
    }
    c.instance("backend-a", "backend-a");
    c.instance("backend-b", "backend-a");
    c.response(200);
    c.response(503);
    let s = c.snapshot();
    assert_eq!(s.duplicates, BTreeMap::from([("a".to_string(), 3)]));
    assert_eq!(
        (
            s.instance_disagreements,
            s.responses["2xx"],
            s.responses["5xx"]
        ),
        (1, 1, 1)
    );
}

#[test]
fn a_backend_naming_itself_anew_each_time_cannot_grow_the_stats_without_bound() {
    let c = Counters::default();
    for i in 0..INSTANCE_LIMIT + 500 {
        c.instance(&format!("b{i}"), "b0");
    }
    c.instance("b1", "b0");
    let s = c.snapshot();
    assert_eq!(s.instances.len(), INSTANCE_LIMIT + 1);
    assert_eq!(s.instances[OTHER_INSTANCES], 500);
    assert_eq!(s.instances["b1"], 2, "names already kept go on counting");
    assert_eq!(s.instance_disagreements, (INSTANCE_LIMIT + 500) as u64);
}

fn probe(status: u16) -> Probe {
    Probe {
        unix_ms: 0,
        path: "/health".into(),
        status,
        latency_ms: 1.0,
    }
}

#[test]
fn probes_unanswered_and_failed_are_counted_beside_the_recent_list() {
    let c = Counters::default();
    for status in [200, 301, 0, 503, 404, 0, 200] {
        c.probe(probe(status));
    }
    let s = c.snapshot();
    assert_eq!((s.probes_unanswered, s.probes_failed), (2, 4));
    assert_eq!(s.probes.len(), 7);
}

#[test]
fn a_reset_returns_the_window_and_starts_a_new_one_keeping_what_is_open() {
    let c = Counters::default();
    c.connection_opened();
    c.connection_opened();
    c.connection_closed();
    c.request(Class::Data, false);
    c.response(503);
    c.transaction("t1");
    c.transaction("t1");
    c.probe(probe(0));
    let window = c.reset();
    assert_eq!(window.connections, 2);
    assert_eq!(window.active_connections, 1);
    assert_eq!(window.requests["data"], 1);
    assert_eq!(window.responses["5xx"], 1);
    assert_eq!(window.duplicates["t1"], 2);
    assert_eq!(window.new_connections_per_second, [2]);
    assert_eq!((window.probes_unanswered, window.probes.len()), (1, 1));
    let after = c.snapshot();
    assert_eq!(after.connections, 0);
    assert_eq!(after.active_connections, 1, "still open");
    assert_eq!(after.requests["data"], 0);
    assert_eq!(after.responses["5xx"], 0);
    assert!(after.duplicates.is_empty() && after.probes.is_empty());
    assert!(after.new_connections_per_second.is_empty());
    assert_eq!(after.probes_unanswered, 0);
    // The same id after the reset is new to the new window.
    c.transaction("t1");
    assert!(c.snapshot().duplicates.is_empty());
}
