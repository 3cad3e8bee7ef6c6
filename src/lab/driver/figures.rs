//! What a product's view of its backends adds up to over a watch: evictions, time
//! out of rotation, and the requests that went to the others meanwhile.

use std::collections::BTreeMap;

use serde::Serialize;

/// One backend's figures over a watch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    /// Its id, or the product's name for it.
    pub id: String,
    /// Its state when the watch ended, in the product's words.
    pub state: String,
    /// Times it went DOWN.
    pub evictions: usize,
    /// Seconds it was not UP (DOWN, DRAIN, MAINT …).
    pub out_s: f64,
    /// The longest of those stretches, seconds.
    pub longest_out_s: f64,
    /// Requests it served over the watch, where the view counts them.
    pub requests: Option<u64>,
    /// Requests served by the others while it was out that would have been its
    /// own at its share before each stretch, where the view counts requests.
    pub shifted: Option<u64>,
}

/// A change in the product's view: seconds into the watch, backend, from, to.
pub type Change = (f64, String, String, String);

/// Request counts read at seconds into the watch: served so far, by backend.
pub type Counts = (f64, BTreeMap<String, u64>);

/// The figures of every backend in `now` (its last state), from the `changes` over
/// a watch of `end_s` seconds and the `counts` read along the way.
pub fn derive(
    now: &BTreeMap<String, String>,
    changes: &[Change],
    counts: &[Counts],
    end_s: f64,
) -> Vec<Figures> {
    now.iter()
        .map(|(id, state)| {
            let mine: Vec<&Change> = changes.iter().filter(|c| &c.1 == id).collect();
            // Stretches out of rotation, [from, to).
            let mut outs: Vec<(f64, f64)> = Vec::new();
            let mut current = mine.first().map_or(state.as_str(), |c| c.2.as_str());
            let mut since = 0.0;
            for (at, _, _, to) in &mine {
                if current != "UP" && to == "UP" {
                    outs.push((since, *at));
                } else if current == "UP" && to != "UP" {
                    since = *at;
                }
                current = to;
            }
            if current != "UP" {
                outs.push((since, end_s));
            }
            let served = |at: f64| count_at(counts, at);
            let requests = match (counts.first(), counts.last()) {
                (Some((_, first)), Some((_, last))) => {
                    Some(last.get(id).copied().unwrap_or(0) - first.get(id).copied().unwrap_or(0))
                }
                _ => None,
            };
            let shifted = (!counts.is_empty()).then(|| {
                let mut shifted = 0.0;
                // Its share is taken from the watch's start or its last return.
                let mut back = 0.0;
                for (from, to) in &outs {
                    let (before, at_out, at_back) = (served(back), served(*from), served(*to));
                    let (Some(before), Some(at_out), Some(at_back)) = (before, at_out, at_back)
                    else {
                        continue;
                    };
                    let all = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
                    let mine = |m: &BTreeMap<String, u64>| m.get(id).copied().unwrap_or(0);
                    let (all_before, mine_before) = (
                        all(at_out).saturating_sub(all(before)),
                        mine(at_out).saturating_sub(mine(before)),
                    );
                    if all_before > 0 {
                        let share = mine_before as f64 / all_before as f64;
                        let others_while_out = (all(at_back) - mine(at_back))
                            .saturating_sub(all(at_out) - mine(at_out));
                        shifted += share * others_while_out as f64;
                    }
                    back = *to;
                }
                shifted.round() as u64
            });
            Figures {
                id: id.clone(),
                state: state.clone(),
                evictions: mine.iter().filter(|c| c.3 == "DOWN").count(),
                out_s: outs.iter().map(|(a, b)| b - a).fold(0.0, |t, d| t + d),
                longest_out_s: outs.iter().map(|(a, b)| b - a).fold(0.0, f64::max),
                requests,
                shifted,
            }
        })
        .collect()
}

/// The counts last read at or before `at`, else the first read.
fn count_at(counts: &[Counts], at: f64) -> Option<&BTreeMap<String, u64>> {
    counts
        .iter()
        .rev()
        .find(|(t, _)| *t <= at)
        .or(counts.first())
        .map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(at: f64, a: u64, b: u64) -> Counts {
        (at, [("a".to_string(), a), ("b".to_string(), b)].into())
    }

    #[test]
    fn an_eviction_is_counted_timed_and_its_traffic_found_at_the_others() {
        let now: BTreeMap<String, String> =
            [("a".into(), "UP".into()), ("b".into(), "UP".into())].into();
        let changes = [
            (2.0, "b".to_string(), "UP".to_string(), "DOWN".to_string()),
            (5.0, "b".to_string(), "DOWN".to_string(), "UP".to_string()),
        ];
        // 50/50 for two seconds, a alone for three, 50/50 again.
        let reads = [
            counts(0.0, 0, 0),
            counts(2.0, 100, 100),
            counts(5.0, 400, 100),
            counts(8.0, 550, 250),
        ];
        let f = derive(&now, &changes, &reads, 8.0);
        let b = &f[1];
        assert_eq!((b.evictions, b.out_s, b.longest_out_s), (1, 3.0, 3.0));
        assert_eq!(b.requests, Some(250));
        // a served 300 while b was out; b's share before was a half.
        assert_eq!(b.shifted, Some(150));
        let a = &f[0];
        assert_eq!((a.evictions, a.out_s, a.shifted), (0, 0.0, Some(0)));
    }

    #[test]
    fn a_backend_still_out_at_the_end_counts_to_the_end_and_no_counts_give_none() {
        let now: BTreeMap<String, String> = [("b".into(), "MAINT".into())].into();
        let changes = [
            (1.0, "b".to_string(), "UP".to_string(), "DRAIN".to_string()),
            (
                1.5,
                "b".to_string(),
                "DRAIN".to_string(),
                "MAINT".to_string(),
            ),
        ];
        let f = derive(&now, &changes, &[], 4.0);
        assert_eq!(f[0].evictions, 0);
        assert_eq!(f[0].out_s, 3.0);
        assert_eq!((f[0].requests, f[0].shifted), (None, None));
        // Out from the start: its first change's state counts from 0.
        let now: BTreeMap<String, String> = [("c".into(), "UP".into())].into();
        let changes = [(2.0, "c".to_string(), "DOWN".to_string(), "UP".to_string())];
        assert_eq!(derive(&now, &changes, &[], 4.0)[0].out_s, 2.0);
    }
}
