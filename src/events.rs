//! Counters kept per proxy: the only source of the figures snag reports about HTTP
//! traffic, draining and transaction duplicates.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use serde::Serialize;

use self::tally::Tally;

mod tally;

/// How many distinct transaction ids a proxy remembers; past that, new ids are not
/// tracked (and `ids_untracked` counts them), so memory stays bounded on long runs.
pub const ID_LIMIT: usize = 1_000_000;

/// Distinct `x-instance` names kept apart; responses naming others beyond this count
/// under [`OTHER_INSTANCES`].
pub const INSTANCE_LIMIT: usize = 1000;

/// Where responses from instances beyond [`INSTANCE_LIMIT`] are counted.
pub const OTHER_INSTANCES: &str = "(other)";

/// How many seconds of new-connection rate the stats keep (an hour).
pub const SECONDS_KEPT: usize = 3600;

/// What a request was, for the counters: a health probe or a data request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A health probe.
    Probe,
    /// Anything else.
    Data,
}

/// One proxy's counters. Cheap to bump from any task.
#[derive(Debug, Default)]
pub struct Counters {
    connections: AtomicU64,
    active: AtomicU64,
    probe_requests: Tally,
    data_requests: Tally,
    /// Index 0 = 1xx … 4 = 5xx.
    statuses: [Tally; 5],
    upstream_errors: AtomicU64,
    upstream_resets: AtomicU64,
    bad_requests: AtomicU64,
    empty_connections: AtomicU64,
    after_drain: AtomicU64,
    drain_resets: AtomicU64,
    fault_resets: AtomicU64,
    goaways: AtomicU64,
    probes_unanswered: AtomicU64,
    probes_failed: AtomicU64,
    tls_failures: AtomicU64,
    streams_refused: AtomicU64,
    settings_sent: AtomicU64,
    streams_unprocessed: AtomicU64,
    ids: Mutex<Ids>,
}

#[derive(Debug)]
struct Ids {
    /// When the counters were made or last reset.
    born: tokio::time::Instant,
    /// New connections in each second since `born`.
    per_second: Vec<u64>,
    probes: std::collections::VecDeque<Probe>,
    seen: HashMap<String, u64>,
    untracked: u64,
    instances: BTreeMap<String, u64>,
    disagreements: u64,
    hits: BTreeMap<String, u64>,
}

/// How many recent probes the stats keep; the event log has every one.
pub const PROBES_KEPT: usize = 100;

/// One health probe as it crossed snag.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Probe {
    /// Milliseconds since the Unix epoch, when it arrived.
    pub unix_ms: u64,
    /// Its path.
    pub path: String,
    /// The status the prober got; 0 when it got none (dropped, reset).
    pub status: u16,
    /// From its arrival to the response head, ms.
    pub latency_ms: f64,
}

/// A snapshot of a proxy's counters, as the API and `--stats` show it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct Stats {
    /// Connections accepted.
    pub connections: u64,
    /// Connections open now.
    pub active_connections: u64,
    /// Requests by scope.
    pub requests: BTreeMap<String, u64>,
    /// Responses sent to clients by status class ("2xx" …).
    pub responses: BTreeMap<String, u64>,
    /// New connections in each second of the run, from the first (at most an hour).
    pub new_connections_per_second: Vec<u64>,
    /// Connections (TCP mode) or requests (HTTP mode, answered 502) the upstream
    /// failed: refused, no answer within the connect timeout, reset or closed early.
    pub upstream_errors: u64,
    /// TCP-mode connections the upstream reset after they were relaying.
    pub upstream_resets: u64,
    /// Malformed requests (hyper answered 400 and closed).
    pub bad_requests: u64,
    /// TCP connections that closed without a byte either way: layer-4 health checks.
    pub empty_connections: u64,
    /// Requests that arrived on open connections after a drain began.
    pub requests_after_drain: u64,
    /// Connections reset by a drain's deadline or an abrupt drain.
    pub drain_resets: u64,
    /// Connections snag reset because a fault said so (reset_peer,
    /// reset_mid_response, drop_request).
    pub fault_resets: u64,
    /// HTTP/2 connections sent GOAWAY.
    pub goaways: u64,
    /// Probes the prober got no answer to: dropped, reset or closed (status 0).
    pub probes_unanswered: u64,
    /// Probes a checker counts as failed: unanswered, or answered 4xx or 5xx
    /// (HAProxy's and nginx's checks pass 2xx and 3xx only).
    pub probes_failed: u64,
    /// HTTP mode with TLS: client connections whose handshake failed (a client
    /// that does not trust the certificate, speaks no TLS, or gave up).
    pub tls_failures: u64,
    /// HTTP/2 streams refused by a fault (RST_STREAM with REFUSED_STREAM).
    pub streams_refused: u64,
    /// HTTP/2 streams a `goaway` declared unprocessed: never forwarded, never
    /// answered.
    pub streams_unprocessed: u64,
    /// HTTP/2 SETTINGS frames a `max_streams` fault sent mid-connection.
    pub settings_sent: u64,
    /// By fault name: the connections (TCP faults; `goaway`, `max_streams`) or
    /// requests (other HTTP faults) each fault actually acted on — a toxicity draw
    /// that said no, or a `latency=0`, hits nothing.
    pub fault_hits: BTreeMap<String, u64>,
    /// Transaction ids forwarded to the upstream more than once, with how many times.
    pub duplicates: BTreeMap<String, u64>,
    /// Transaction ids not tracked because the table was full.
    pub ids_untracked: u64,
    /// Responses by the backend's own name (`x-instance`).
    pub instances: BTreeMap<String, u64>,
    /// Responses whose `x-instance` differs from the name snag knows the backend by.
    pub instance_disagreements: u64,
    /// The last health probes, oldest first.
    pub probes: Vec<Probe>,
}

impl Default for Ids {
    fn default() -> Self {
        Ids {
            born: tokio::time::Instant::now(),
            per_second: Vec::new(),
            probes: Default::default(),
            seen: HashMap::new(),
            untracked: 0,
            instances: BTreeMap::new(),
            disagreements: 0,
            hits: BTreeMap::new(),
        }
    }
}

impl Counters {
    /// A connection was accepted.
    pub fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
        self.active.fetch_add(1, Ordering::Relaxed);
        let mut ids = self
            .ids
            .lock()
            .expect("no code panics holding the ids lock");
        let second = ids.born.elapsed().as_secs() as usize;
        if second < SECONDS_KEPT {
            if ids.per_second.len() <= second {
                ids.per_second.resize(second + 1, 0);
            }
            ids.per_second[second] += 1;
        }
    }

    /// A malformed request was refused.
    pub fn bad_request(&self) {
        self.bad_requests.fetch_add(1, Ordering::Relaxed);
    }

    /// A TCP connection closed having carried nothing.
    pub fn empty_connection(&self) {
        self.empty_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection ended.
    pub fn connection_closed(&self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
    }

    /// A request arrived: a health probe or data; `draining` if a drain had begun.
    pub fn request(&self, class: Class, draining: bool) {
        let counter = match class {
            Class::Probe => &self.probe_requests,
            Class::Data => &self.data_requests,
        };
        counter.add(1);
        if draining {
            self.after_drain.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A response of `status` went to the client.
    pub fn response(&self, status: u16) {
        if let Some(c) = self.statuses.get((status / 100).saturating_sub(1) as usize) {
            c.add(1);
        }
    }

    /// The upstream could not answer.
    pub fn upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The upstream reset a TCP-mode connection mid-stream.
    pub fn upstream_reset(&self) {
        self.upstream_resets.fetch_add(1, Ordering::Relaxed);
    }

    /// A drain reset a connection.
    pub fn drain_reset(&self) {
        self.drain_resets.fetch_add(1, Ordering::Relaxed);
    }

    /// A fault reset a connection.
    pub fn fault_reset(&self) {
        self.fault_resets.fetch_add(1, Ordering::Relaxed);
    }

    /// A GOAWAY went out on an HTTP/2 connection.
    pub fn goaway(&self) {
        self.goaways.fetch_add(1, Ordering::Relaxed);
    }

    /// A client's TLS handshake failed.
    pub fn tls_failure(&self) {
        self.tls_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A fault refused an HTTP/2 stream.
    pub fn stream_refused(&self) {
        self.streams_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// A fault sent a SETTINGS frame on an HTTP/2 connection.
    pub fn settings_sent(&self) {
        self.settings_sent.fetch_add(1, Ordering::Relaxed);
    }

    /// A GOAWAY declared a stream unprocessed.
    pub fn stream_unprocessed(&self) {
        self.streams_unprocessed.fetch_add(1, Ordering::Relaxed);
    }

    /// Fault `name` acted on a connection (TCP faults, and HTTP/2 connection faults)
    /// or an exchange (HTTP faults) for the first time.
    pub fn fault_hit(&self, name: &str) {
        let mut ids = self
            .ids
            .lock()
            .expect("no code panics holding the ids lock");
        match ids.hits.get_mut(name) {
            Some(n) => *n += 1,
            None => {
                ids.hits.insert(name.to_string(), 1);
            }
        }
    }

    /// A request carried transaction id `id`.
    pub fn transaction(&self, id: &str) {
        let mut ids = self
            .ids
            .lock()
            .expect("no code panics holding the ids lock");
        let full = ids.seen.len() >= ID_LIMIT;
        match ids.seen.get_mut(id) {
            Some(n) => *n += 1,
            None if full => ids.untracked += 1,
            None => {
                ids.seen.insert(id.to_string(), 1);
            }
        }
    }

    /// A response named its backend `instance`; snag knows that backend as `expected`.
    pub fn instance(&self, instance: &str, expected: &str) {
        let mut ids = self
            .ids
            .lock()
            .expect("no code panics holding the ids lock");
        // A backend names itself, so a misbehaving one could name itself anew on every
        // response: past the limit, new names are counted together.
        let name = if ids.instances.len() < INSTANCE_LIMIT || ids.instances.contains_key(instance) {
            instance
        } else {
            OTHER_INSTANCES
        };
        *ids.instances.entry(name.to_string()).or_default() += 1;
        if instance != expected {
            ids.disagreements += 1;
        }
    }

    /// A probe was answered (or not: status 0).
    pub fn probe(&self, probe: Probe) {
        if probe.status == 0 {
            self.probes_unanswered.fetch_add(1, Ordering::Relaxed);
        }
        if probe.status == 0 || probe.status >= 400 {
            self.probes_failed.fetch_add(1, Ordering::Relaxed);
        }
        let mut ids = self
            .ids
            .lock()
            .expect("no code panics holding the ids lock");
        if ids.probes.len() == PROBES_KEPT {
            ids.probes.pop_front();
        }
        ids.probes.push_back(probe);
    }

    /// Everything, now.
    pub fn snapshot(&self) -> Stats {
        let ids = self
            .ids
            .lock()
            .expect("no code panics holding the ids lock");
        self.read(&ids, false)
    }

    /// The counts since the last reset (or since they were made), and a new window
    /// from now: every count back to zero, the per-second timeline restarted, the
    /// transaction ids and recent probes forgotten. Connections open now stay counted
    /// as open. What happens during the reset lands in one window or the next.
    pub fn reset(&self) -> Stats {
        let mut ids = self
            .ids
            .lock()
            .expect("no code panics holding the ids lock");
        let stats = self.read(&ids, true);
        *ids = Ids::default();
        stats
    }

    /// The counts; `take`: zeroing each as it is read.
    fn read(&self, ids: &Ids, take: bool) -> Stats {
        let get = |c: &AtomicU64| {
            if take {
                c.swap(0, Ordering::Relaxed)
            } else {
                c.load(Ordering::Relaxed)
            }
        };
        let tally = |t: &Tally| if take { t.take() } else { t.get() };
        Stats {
            connections: get(&self.connections),
            active_connections: self.active.load(Ordering::Relaxed),
            requests: BTreeMap::from([
                ("data".to_string(), tally(&self.data_requests)),
                ("probe".to_string(), tally(&self.probe_requests)),
            ]),
            responses: ["1xx", "2xx", "3xx", "4xx", "5xx"]
                .into_iter()
                .map(String::from)
                .zip(self.statuses.iter().map(tally))
                .collect(),
            new_connections_per_second: ids.per_second.clone(),
            upstream_errors: get(&self.upstream_errors),
            upstream_resets: get(&self.upstream_resets),
            bad_requests: get(&self.bad_requests),
            empty_connections: get(&self.empty_connections),
            requests_after_drain: get(&self.after_drain),
            drain_resets: get(&self.drain_resets),
            fault_resets: get(&self.fault_resets),
            goaways: get(&self.goaways),
            probes_unanswered: get(&self.probes_unanswered),
            probes_failed: get(&self.probes_failed),
            tls_failures: get(&self.tls_failures),
            streams_refused: get(&self.streams_refused),
            streams_unprocessed: get(&self.streams_unprocessed),
            settings_sent: get(&self.settings_sent),
            duplicates: ids
                .seen
                .iter()
                .filter(|(_, n)| **n > 1)
                .map(|(id, n)| (id.clone(), *n))
                .collect(),
            fault_hits: ids.hits.clone(),
            ids_untracked: ids.untracked,
            instances: ids.instances.clone(),
            instance_disagreements: ids.disagreements,
            probes: ids.probes.iter().cloned().collect(),
        }
    }
}

/// An append-only log of what happened, one JSON object a line, written by its own
/// thread behind a bounded queue so no task ever waits on the disk.
pub struct EventLog {
    tx: Mutex<Option<std::sync::mpsc::SyncSender<String>>>,
    writer: Mutex<Option<std::thread::JoinHandle<std::io::Result<()>>>>,
    dropped: AtomicU64,
    start: std::time::Instant,
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog")
            .field("dropped", &self.dropped)
            .finish()
    }
}

/// Events queued before the writer falls behind and new ones are counted as dropped.
const EVENT_QUEUE: usize = 65_536;

impl EventLog {
    /// Creates (truncates) `path` and starts the writer.
    pub fn create(path: &std::path::Path) -> std::io::Result<std::sync::Arc<EventLog>> {
        use std::io::Write;
        let file = std::fs::File::create(path)?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<String>(EVENT_QUEUE);
        let writer = std::thread::Builder::new()
            .name("snag-events".into())
            .spawn(move || {
                let mut out = std::io::BufWriter::new(file);
                for line in rx {
                    out.write_all(line.as_bytes())?;
                    out.write_all(b"\n")?;
                }
                out.flush()
            })?;
        Ok(std::sync::Arc::new(EventLog {
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            dropped: AtomicU64::new(0),
            start: std::time::Instant::now(),
        }))
    }

    /// Records event `kind` of `proxy` with `fields` (a JSON object), stamped with
    /// the wall clock and the seconds since the log was opened.
    pub fn emit(&self, proxy: &str, kind: &str, fields: serde_json::Value) {
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut line = serde_json::json!({
            "t": (self.start.elapsed().as_secs_f64() * 1e6).round() / 1e6,
            "unix_ms": unix_ms,
            "proxy": proxy,
            "event": kind,
        });
        if let (Some(line), serde_json::Value::Object(extra)) = (line.as_object_mut(), fields) {
            line.extend(extra);
        }
        let tx = self
            .tx
            .lock()
            .expect("no code panics holding the event sender");
        let sent = tx.as_ref().map(|tx| tx.try_send(line.to_string()));
        if !matches!(sent, Some(Ok(()))) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes what is queued, notes any events dropped, and closes the file.
    pub fn close(&self) -> std::io::Result<()> {
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            self.emit(
                "",
                "events_dropped",
                serde_json::json!({ "count": dropped }),
            );
        }
        drop(
            self.tx
                .lock()
                .expect("no code panics holding the event sender")
                .take(),
        );
        match self
            .writer
            .lock()
            .expect("no code panics holding the writer")
            .take()
        {
            Some(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("event writer panicked"))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
