//! What a shard writes when its run ends, and the merge of several: the report one
//! generator would have printed, plus each host's own port pool.

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

use super::{
    report::{Host, Ports, Report},
    shard::Shard,
    tally::{Machine, Saved, Tally},
};

/// What a generator writes with `--result`: enough to merge it with the others.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShardResult {
    /// [`FORMAT`].
    pub format: String,
    /// The host it ran on.
    pub host: String,
    /// Its share.
    pub shard: Shard,
    /// When its traffic began, ms since the Unix epoch.
    pub started_at_ms: u64,
    /// The URL.
    pub target: String,
    /// Open loop (or closed).
    pub open: bool,
    /// How long its run took, traffic and watch, s.
    pub elapsed_s: f64,
    /// How long it sent traffic, s.
    pub traffic_s: f64,
    /// Transactions in flight when it ended.
    pub unfinished: u64,
    /// Its own host's port pool towards the target.
    pub ports: Option<Ports>,
    /// The socket table its port counts read ([`crate::ports::socket_table`]):
    /// shards with the same one counted the same sockets. Absent from results
    /// of older versions, which are then taken as each on a machine of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets: Option<String>,
    /// Its counts and histograms.
    pub tally: Saved,
}

/// The `format` of a result this version writes and reads.
pub const FORMAT: &str = "snag-load-result/1";

/// The report of `results` taken together. `Err` says which result does not
/// belong with the others, or which shard is missing.
pub fn merge(mut results: Vec<ShardResult>) -> Result<Report, String> {
    // In shard order, so that the hosts are listed so.
    results.sort_by_key(|r| r.shard.index);
    let first = results.first().ok_or("no results to merge")?;
    let (target, open, count) = (first.target.clone(), first.open, first.shard.count);
    let mut seen = BTreeMap::new();
    for r in &results {
        if r.format != FORMAT {
            return Err(format!(
                "shard {} on {}: format {:?}, this snag reads {FORMAT:?}",
                r.shard, r.host, r.format
            ));
        }
        if r.target != target || r.open != open || r.shard.count != count {
            return Err(format!(
                "shard {} on {} ran {} ({} loop, {} shards), shard {} on {} ran {} ({} loop, {} shards): not one run",
                first.shard,
                first.host,
                target,
                if open { "open" } else { "closed" },
                count,
                r.shard,
                r.host,
                r.target,
                if r.open { "open" } else { "closed" },
                r.shard.count
            ));
        }
        if let Some(host) = seen.insert(r.shard.index, &r.host) {
            return Err(format!(
                "shard {} is there twice (from {host} and {})",
                r.shard, r.host
            ));
        }
    }
    let missing: Vec<String> = (0..count)
        .filter(|i| !seen.contains_key(i))
        .map(|i| format!("{i}/{count}"))
        .collect();
    if !missing.is_empty() {
        return Err(format!("shard {} missing", missing.join(", ")));
    }
    let start = results.iter().map(|r| r.started_at_ms).min().unwrap_or(0);
    // Shards that read one socket table each counted all of its sockets: theirs
    // are merged first, as one machine's; then the machines' add up.
    let mut machines: Vec<(Option<&str>, Tally)> = Vec::new();
    let mut hosts = Vec::new();
    for r in &results {
        let tally = Tally::restore(&r.tally)
            .map_err(|e| format!("shard {} on {}: {e}", r.shard, r.host))?;
        let own = tally.report(
            &target,
            open,
            secs(r.elapsed_s),
            secs(r.traffic_s),
            r.unfinished,
            None,
        );
        hosts.push(Host {
            host: r.host.clone(),
            shard: r.shard.to_string(),
            ok: own.ok,
            errors: own.errors,
            generator_errors: own.generator_errors,
            started_after_ms: r.started_at_ms - start,
            ports: r.ports.clone(),
        });
        let table = r.sockets.as_deref();
        match machines
            .iter_mut()
            .find(|(t, _)| table.is_some() && *t == table)
        {
            Some((_, machine)) => machine.merge(tally, Machine::Same),
            None => machines.push((table, tally)),
        }
    }
    let mut machines = machines.into_iter().map(|(_, tally)| tally);
    let mut whole = machines.next().expect("at least one result");
    for machine in machines {
        whole.merge(machine, Machine::Other);
    }
    let longest = |f: fn(&ShardResult) -> f64| secs(results.iter().map(f).fold(0.0, f64::max));
    let mut report = whole.report(
        &target,
        open,
        longest(|r| r.elapsed_s),
        longest(|r| r.traffic_s),
        results.iter().map(|r| r.unfinished).sum(),
        None,
    );
    report.hosts = hosts;
    Ok(report)
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).unwrap_or_default()
}
