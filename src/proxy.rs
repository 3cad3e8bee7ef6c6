//! The interposer: one listener per upstream, an accept loop that applies the
//! listener faults (`down`, `syn_drop`), and one relay task per connection.

mod connection;
mod drain;
pub mod http;
mod listener;
pub mod relay;
pub mod scenario;
pub mod socket;
mod workers;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{net::TcpListener, sync::watch};
use tracing::info;

use self::relay::{Control, OnUpstreamError};
use crate::{
    events::{Counters, EventLog},
    fault::{Fault, Scope, config::ProxyConfig, drain::Drain},
    shutdown::Shutdown,
};

pub use self::{
    drain::SLOW_DRAIN,
    scenario::{Running, play, start},
    workers::{Workers, threads},
};
pub use crate::fault::Mode;

/// What every proxy of a run shares: the seed of its random choices, where its
/// evidence goes, and how it treats upstreams and shutdown. One constructor; the
/// fields are set after it.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// Drives every random choice of the run's faults.
    pub seed: u64,
    /// What the client gets when the upstream refuses or resets (TCP mode; HTTP
    /// mode answers 502).
    pub on_upstream_error: OnUpstreamError,
    /// How long a connect to the upstream may take before it counts as refused.
    pub connect_timeout: Duration,
    /// On shutdown, how long open connections may finish before they are reset;
    /// zero: they are closed at once.
    pub shutdown_timeout: Duration,
    /// Where events go (faults changed, drains, GOAWAYs, resets, probes), if anywhere.
    pub events: Option<Arc<EventLog>>,
    /// Where both legs of every connection are captured, if anywhere.
    pub capture: Option<Arc<crate::capture::Capture>>,
    /// Where the secrets of every TLS session go, if anywhere, so that a capture
    /// can be decrypted.
    pub keylog: Option<Arc<crate::tls::KeyLogFile>>,
    /// The threads HTTP-mode connections are served on, one runtime each; without
    /// them (tests on a paused clock) they are served on the caller's runtime.
    pub workers: Option<Arc<Workers>>,
}

impl RunContext {
    /// A run seeded with `seed`: upstream errors reset the client, connects wait
    /// 5 s, shutdown closes at once, no event log, no capture.
    pub fn new(seed: u64) -> RunContext {
        RunContext {
            seed,
            on_upstream_error: OnUpstreamError::Reset,
            connect_timeout: Duration::from_secs(5),
            shutdown_timeout: Duration::ZERO,
            events: None,
            capture: None,
            keylog: None,
            workers: None,
        }
    }

    /// Where TLS session keys go, as rustls takes it: the key log file, and the
    /// capture (decryption secrets, so the capture decrypts by itself).
    pub fn key_log(&self) -> Option<Arc<dyn rustls::KeyLog>> {
        let mut logs = crate::tls::KeyLogs::new(self.keylog.clone());
        if let Some(capture) = self.capture.as_ref().and_then(|c| c.sender()) {
            // Weak: the TLS configurations live as long as their proxy, and must not
            // keep the capture open after it was closed.
            let capture = capture.downgrade();
            logs = logs.also(move |line| {
                // The queue is full only when the writer falls far behind; then the
                // capture lacks the keys of this session, as it lacks its packets.
                if let Some(capture) = capture.upgrade() {
                    let _ = capture.try_send(crate::capture::Record::Secrets(line.to_string()));
                }
            });
        }
        logs.into_key_log()
    }
}

/// A proxy's state shared by its accept loop, its connections and whoever changes
/// its faults (timeline, control API).
#[derive(Debug)]
pub struct Proxy {
    /// Unique name.
    pub name: String,
    /// Where new connections go, `host:port`; open ones stay where they are.
    upstream: std::sync::RwLock<Arc<str>>,
    /// Counts the changes of `upstream`: what an HTTP worker compares with the
    /// upstream it keeps (reading `upstream` takes its lock and clones its Arc, two
    /// writes to one cache line that every worker would make on every request).
    upstream_changes: AtomicU64,
    /// As it was made; its faults and upstream live on in the fields here.
    config: ProxyConfig,
    context: RunContext,
    faults: watch::Sender<Arc<Vec<Arc<Fault>>>>,
    next_conn: AtomicU64,
    next_request: AtomicU64,
    /// Open connections, to wake when faults change or the proxy shuts down.
    conns: Mutex<HashMap<u64, Arc<Control>>>,
    /// Bytes of closed connections: received up, received down, sent up, sent down.
    traffic: [AtomicU64; 4],
    counters: Arc<Counters>,
    /// The drain under way, and when it began.
    drain: watch::Sender<Option<(Drain, tokio::time::Instant)>>,
    /// Whether `drain` holds one: read first by [`Proxy::draining`], which every
    /// HTTP request and response frame calls (the watch's lock is a write to a line
    /// every worker shares).
    drain_on: AtomicBool,
    /// HTTP mode's TLS and upstream clients; `None` in TCP mode.
    http: Option<Arc<http::Legs>>,
    /// A readiness drain's first step: since when probes fail.
    unready: watch::Sender<Option<tokio::time::Instant>>,
    /// Whether new connections go into the capture (when there is one); shared
    /// with the HTTP upstream connectors, which open connections of their own.
    capturing: Arc<AtomicBool>,
}

/// Bytes relayed by a proxy's closed connections (open ones count once they close,
/// as Toxiproxy counts them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Read from clients.
    pub received_up: u64,
    /// Read from the upstream.
    pub received_down: u64,
    /// Written to the upstream.
    pub sent_up: u64,
    /// Written to clients.
    pub sent_down: u64,
}

/// A fault change that could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultError {
    /// Names are unique across both directions.
    #[error("fault `{0}` already exists")]
    Exists(String),
    /// A TCP fault on an HTTP proxy, or the reverse.
    #[error(
        "fault `{name}` ({kind}) cannot act on a proxy in mode {mode}{}",
        if *mode == "http" { crate::fault::file::HTTP_BYTES } else { "" }
    )]
    Mode {
        /// The fault.
        name: String,
        /// Its type.
        kind: &'static str,
        /// The proxy's mode.
        mode: &'static str,
    },
    /// No fault of that name.
    #[error("no fault `{0}`")]
    NotFound(String),
    /// Its TLS or upstream protocol cannot be set up (an unreadable key, a
    /// certificate that does not match it, h2 without TLS …).
    #[error("{0}")]
    Setup(String),
}

impl Proxy {
    /// The proxy `config` describes, in run `context`, with its faults on from the
    /// start; `Err` if one cannot act in its mode or two share a name.
    pub fn new(mut config: ProxyConfig, context: RunContext) -> Result<Arc<Proxy>, FaultError> {
        let faults = std::mem::take(&mut config.faults);
        let http = match config.mode {
            Mode::Http => Some(Arc::new(
                http::Legs::new(&config, &context).map_err(FaultError::Setup)?,
            )),
            Mode::Tcp => {
                config.check_legs().map_err(FaultError::Setup)?;
                None
            }
        };
        let proxy = Proxy {
            name: config.name.clone(),
            upstream: std::sync::RwLock::new(Arc::from(config.upstream.as_str())),
            upstream_changes: AtomicU64::new(0),
            config,
            context,
            faults: watch::Sender::new(Arc::new(Vec::new())),
            next_conn: AtomicU64::new(0),
            next_request: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            traffic: Default::default(),
            counters: Arc::default(),
            drain: watch::Sender::new(None),
            drain_on: AtomicBool::new(false),
            http,
            unready: watch::Sender::new(None),
            capturing: Arc::new(AtomicBool::new(true)),
        };
        for fault in faults {
            proxy.add_fault(fault)?;
        }
        Ok(Arc::new(proxy))
    }

    /// Where new connections go, `host:port`.
    pub fn upstream(&self) -> Arc<str> {
        self.upstream
            .read()
            .expect("no code panics while holding the upstream lock")
            .clone()
    }

    /// Sends new connections (and HTTP requests) to `upstream` from now on; the
    /// faults, counters and open connections stay as they are.
    pub fn set_upstream(&self, upstream: &str) {
        info!(proxy = %self.name, upstream, "upstream changed");
        self.event(
            "upstream_changed",
            serde_json::json!({ "upstream": upstream }),
        );
        *self
            .upstream
            .write()
            .expect("no code panics while holding the upstream lock") = Arc::from(upstream);
        self.upstream_changes.fetch_add(1, Ordering::Release);
    }

    /// How many times the upstream changed: when this moves, [`Proxy::upstream`]
    /// has the new one.
    pub fn upstream_changes(&self) -> u64 {
        self.upstream_changes.load(Ordering::Acquire)
    }

    /// How it was made (its faults and upstream as they are now: [`Proxy::faults`],
    /// [`Proxy::upstream`]).
    pub fn config(&self) -> &ProxyConfig {
        &self.config
    }

    /// Its configuration as it is now: the upstream and faults of the moment.
    pub fn live_config(&self) -> ProxyConfig {
        ProxyConfig {
            upstream: self.upstream().to_string(),
            faults: self.faults(),
            ..self.config.clone()
        }
    }

    /// The run it belongs to.
    pub fn context(&self) -> &RunContext {
        &self.context
    }

    /// Whether new connections are captured now.
    pub fn capturing(&self) -> bool {
        self.context.capture.is_some() && self.capturing.load(Ordering::Relaxed)
    }

    /// Captures new connections from now on, or stops capturing them; a connection
    /// is captured whole or not at all, so open ones stay as they are. `Err` when
    /// there is no capture to switch on.
    pub fn set_capturing(&self, on: bool) -> Result<(), String> {
        if on && self.context.capture.is_none() {
            return Err(format!(
                "proxy `{}` has no capture to switch on (snag serve --capture FILE, or a file of its own when it is created)",
                self.name
            ));
        }
        if self.capturing.swap(on, Ordering::Relaxed) != on {
            info!(proxy = %self.name, on, "capture switched");
            self.event("capture_switched", serde_json::json!({ "on": on }));
        }
        Ok(())
    }

    /// The capture's sender for a new connection, if it is to be captured.
    pub fn tap(&self) -> Option<tokio::sync::mpsc::Sender<crate::capture::Record>> {
        if !self.capturing.load(Ordering::Relaxed) {
            return None;
        }
        self.context.capture.as_ref().and_then(|c| c.sender())
    }

    /// Bytes the capture keeps of each packet; 0 = all (or no capture).
    pub fn snaplen(&self) -> usize {
        self.context.capture.as_ref().map_or(0, |c| c.snaplen())
    }

    /// The switch [`Proxy::set_capturing`] turns, for code that opens connections
    /// of its own.
    pub(crate) fn capture_switch(&self) -> Arc<AtomicBool> {
        self.capturing.clone()
    }

    /// HTTP mode's legs; `None` in TCP mode.
    pub fn http_legs(&self) -> Option<Arc<http::Legs>> {
        self.http.clone()
    }

    /// Its counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Records an event, if the proxy has an event log.
    pub fn event(&self, kind: &str, fields: serde_json::Value) {
        if let Some(log) = &self.context.events {
            log.emit(&self.name, kind, fields);
        }
    }

    /// The seed of its random choices.
    pub fn seed(&self) -> u64 {
        self.context.seed
    }

    /// The number of the next HTTP request, from 0: what its faults' toxicity draws on.
    pub fn next_request(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }

    /// The faults now on, in the order they were added.
    pub fn faults(&self) -> Vec<Fault> {
        self.faults.borrow().iter().map(|f| (**f).clone()).collect()
    }

    /// Adds a fault at the end of its direction's chain; open connections get it
    /// before their next chunk.
    pub fn add_fault(&self, fault: Fault) -> Result<(), FaultError> {
        self.edit_faults(|faults| {
            if faults.iter().any(|f| f.name == fault.name) {
                return Err(FaultError::Exists(fault.name));
            }
            let mode = self.config.mode;
            if !mode.takes(&fault.kind) {
                return Err(FaultError::Mode { name: fault.name, kind: fault.kind.type_name(), mode: mode.as_str() });
            }
            info!(proxy = %self.name, fault = %fault.name, kind = fault.kind.type_name(), stream = %fault.stream, "fault added");
            self.event("fault_added", fault.to_json());
            faults.push(Arc::new(fault));
            Ok(())
        })
    }

    /// Removes a fault by name; what it was holding is released at once.
    pub fn remove_fault(&self, name: &str) -> Result<Fault, FaultError> {
        self.edit_faults(|faults| {
            let index = position(faults, name)?;
            info!(proxy = %self.name, fault = %name, "fault removed");
            self.event("fault_removed", serde_json::json!({ "name": name }));
            Ok((*faults.remove(index)).clone())
        })
    }

    /// Puts `fault` in the place of the fault of the same name: a new stage (and a new
    /// toxicity draw) on open connections, at the same place in the chain.
    pub fn replace_fault(&self, fault: Fault) -> Result<(), FaultError> {
        self.edit_faults(|faults| {
            let index = position(faults, &fault.name)?;
            info!(proxy = %self.name, fault = %fault.name, "fault changed");
            self.event("fault_changed", fault.to_json());
            faults[index] = Arc::new(fault);
            Ok(())
        })
    }

    /// Bytes relayed by connections that have closed.
    pub fn traffic(&self) -> Traffic {
        let [ru, rd, su, sd] = self.traffic.each_ref().map(|c| c.load(Ordering::Relaxed));
        Traffic {
            received_up: ru,
            received_down: rd,
            sent_up: su,
            sent_down: sd,
        }
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        let _ = self.edit_faults(|faults| {
            faults.clear();
            Ok(())
        });
    }

    /// Applies `change` to a copy of the fault list and publishes it if it succeeds,
    /// then wakes the open connections. The watch channel's lock makes the
    /// check-then-change atomic against concurrent edits.
    fn edit_faults<T>(
        &self,
        change: impl FnOnce(&mut Vec<Arc<Fault>>) -> Result<T, FaultError>,
    ) -> Result<T, FaultError> {
        let mut result = None;
        self.faults.send_if_modified(|current| {
            let mut next = (**current).clone();
            let done = change(&mut next);
            let ok = done.is_ok();
            if ok {
                *current = Arc::new(next);
            }
            result = Some(done);
            ok
        });
        let result = result.expect("send_if_modified runs its closure once");
        if result.is_ok() {
            self.each_conn(|c| c.poke());
        }
        result
    }

    fn each_conn(&self, mut f: impl FnMut(&Control)) {
        let conns = self
            .conns
            .lock()
            .expect("no code panics while holding the conns lock");
        conns.values().for_each(|c| f(c));
    }

    fn register(&self, conn: u64) -> Arc<Control> {
        let control = Arc::new(Control::default());
        let mut conns = self
            .conns
            .lock()
            .expect("no code panics while holding the conns lock");
        conns.insert(conn, control.clone());
        self.counters.connection_opened();
        control
    }

    fn unregister(&self, conn: u64) {
        let mut conns = self
            .conns
            .lock()
            .expect("no code panics while holding the conns lock");
        if conns.remove(&conn).is_some() {
            self.counters.connection_closed();
        }
    }
}

fn position(faults: &[Arc<Fault>], name: &str) -> Result<usize, FaultError> {
    faults
        .iter()
        .position(|f| f.name == name)
        .ok_or_else(|| FaultError::NotFound(name.to_string()))
}

/// Serves `proxy` on `listener` until `shutdown`, then waits for its connections to
/// end (they end on the same signal). Errors only if the listener cannot be set up;
/// accept errors (EMFILE …) back off and retry.
pub async fn serve(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let class = if proxy.config.probe_listen.is_some() {
        Scope::Data
    } else {
        Scope::Any
    };
    listener::serve(listener, proxy, class, shutdown).await
}

/// Serves `proxy` on its data listener and, if given, its probe listener, until
/// `shutdown`; the first error of either is returned once both have ended.
pub async fn serve_all(
    listener: TcpListener,
    probes: Option<TcpListener>,
    proxy: Arc<Proxy>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    match probes {
        Some(probes) => {
            let (a, b) = tokio::join!(
                serve(listener, proxy.clone(), shutdown.clone()),
                serve_probes(probes, proxy, shutdown)
            );
            a.and(b)
        }
        None => serve(listener, proxy, shutdown).await,
    }
}

/// Serves `proxy`'s separate probe listener: every connection (and request) on it is
/// a probe, and faults scoped `probe` act on it alone.
pub async fn serve_probes(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    listener::serve(listener, proxy, Scope::Probe, shutdown).await
}
