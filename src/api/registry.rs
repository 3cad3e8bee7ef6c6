//! The proxies the control API manages, and the operations on them with Toxiproxy's
//! semantics: create, update (restart on a new listen or upstream), enable/disable,
//! populate, reset, and toxics.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Component, Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::{
    Error,
    toxic::{ToxicInput, go_float, merge},
};
use crate::{
    fault::{Direction, Fault, Kind},
    proxy::{self, Options, Proxy},
    shutdown::Shutdown,
};

/// One proxy under API control.
struct Entry {
    /// As given until the proxy first listens, then the address it is bound to.
    listen: String,
    enabled: bool,
    /// Like `listen`, for the probe listener, if the proxy has one.
    probe_listen: Option<String>,
    /// Never replaced: a timeline or a client holding it acts on the live proxy.
    proxy: Arc<Proxy>,
    /// Each toxic's `stream` as the client wrote it (Toxiproxy echoes "UPSTREAM").
    streams: BTreeMap<String, String>,
    running: Option<(Shutdown, tokio::task::JoinHandle<anyhow::Result<()>>)>,
    /// Files of its own named through the API: closed when it is deleted or the
    /// server stops.
    files: OwnFiles,
}

/// A proxy's own capture and event log, as named (inside the files directory).
#[derive(Default)]
struct OwnFiles {
    capture: Option<(String, Arc<crate::capture::Capture>)>,
    events: Option<(String, Arc<crate::events::EventLog>)>,
}

impl OwnFiles {
    /// Writes out what is queued and closes both; call once the proxy has stopped.
    fn close(&mut self, proxy: &str) {
        if let Some((name, capture)) = self.capture.take()
            && let Err(err) = capture.close()
        {
            tracing::warn!(proxy, file = name, %err, "could not finish the capture");
        }
        if let Some((name, log)) = self.events.take()
            && let Err(err) = log.close()
        {
            tracing::warn!(proxy, file = name, %err, "could not finish the event log");
        }
    }
}

/// Every proxy the API knows, by name.
pub struct Registry {
    seed: u64,
    options: Options,
    /// Where files named through the API go; `None`: nowhere.
    files: Option<PathBuf>,
    shutdown: Shutdown,
    entries: BTreeMap<String, Entry>,
}

/// A proxy as clients send it; every field optional, `null` meaning "default".
#[derive(Debug, Default, Deserialize)]
pub struct ProxyInput {
    /// Unique name.
    pub name: Option<String>,
    /// `host:port` to listen on.
    pub listen: Option<String>,
    /// `host:port` to relay to.
    pub upstream: Option<String>,
    /// Listening or not.
    pub enabled: Option<bool>,
    /// snag's own: `tcp` (default) or `http`.
    pub mode: Option<crate::fault::Mode>,
    /// snag's own: HTTP mode's probe rules (`paths`, `headers`, `methods`).
    pub probe: Option<crate::fault::ProbeRules>,
    /// snag's own: a second listener for health checks alone.
    pub probe_listen: Option<String>,
    /// snag's own: request headers carrying a transaction id.
    pub id_headers: Option<Vec<String>>,
    /// snag's own: the backend's expected `x-instance`.
    pub instance: Option<String>,
    /// snag's own: `false` leaves this proxy out of the server's capture
    /// (`serve --capture`); a file name gives it a capture of its own in the files
    /// directory; default: captured when the server captures.
    pub capture: Option<CaptureInput>,
    /// snag's own: a file name (in the files directory) for this proxy's own event log.
    pub events: Option<String>,
}

/// `capture` as clients send it: on or off, or a file of the proxy's own.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CaptureInput {
    /// In the server's capture or not.
    Shared(bool),
    /// A file name inside the files directory.
    File(String),
}

/// A proxy as Toxiproxy renders it, field order included.
#[derive(Debug, Serialize)]
pub struct ProxyView {
    name: String,
    listen: String,
    upstream: String,
    enabled: bool,
    /// Toxiproxy leaks an empty `Logger` object; clients receive it, so we send it too.
    #[serde(rename = "Logger")]
    logger: Map<String, Value>,
    toxics: Vec<ToxicView>,
    /// snag's own, shown only for HTTP proxies so TCP ones read as Toxiproxy's.
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<&'static str>,
    /// snag's own, shown only when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    probe_listen: Option<String>,
    /// snag's own, shown only when the proxy is captured.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    capture: bool,
    /// snag's own: the proxy's own capture file, as named.
    #[serde(skip_serializing_if = "Option::is_none")]
    capture_file: Option<String>,
    /// snag's own: the proxy's own event log, as named.
    #[serde(skip_serializing_if = "Option::is_none")]
    events_file: Option<String>,
}

/// A toxic as Toxiproxy renders it, field order included.
#[derive(Debug, Serialize)]
pub struct ToxicView {
    attributes: Value,
    name: String,
    #[serde(rename = "type")]
    kind: String,
    stream: String,
    toxicity: Number,
    /// snag's own, shown only when not `any` so plain toxics read as Toxiproxy's.
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<&'static str>,
}

impl Registry {
    /// An empty registry whose proxies use `seed` and `options` and stop on
    /// `shutdown`; files named through the API go to `files`.
    pub fn new(
        seed: u64,
        options: Options,
        files: Option<PathBuf>,
        shutdown: Shutdown,
    ) -> Registry {
        Registry {
            seed,
            options,
            files,
            shutdown,
            entries: BTreeMap::new(),
        }
    }

    /// All proxies, keyed by name in sorted order.
    pub fn list(&self) -> BTreeMap<String, ProxyView> {
        self.entries
            .iter()
            .map(|(name, e)| (name.clone(), view(name, e)))
            .collect()
    }

    /// One proxy.
    pub fn get(&self, name: &str) -> Result<ProxyView, Error> {
        let entry = self.entries.get(name).ok_or(Error::ProxyNotFound)?;
        Ok(view(name, entry))
    }

    /// The live proxy behind a name.
    pub fn proxy(&self, name: &str) -> Result<Arc<Proxy>, Error> {
        Ok(self
            .entries
            .get(name)
            .ok_or(Error::ProxyNotFound)?
            .proxy
            .clone())
    }

    /// Checks the fields a new proxy needs.
    pub fn required(input: &ProxyInput) -> Result<(String, String), Error> {
        let name = input
            .name
            .clone()
            .filter(|n| !n.is_empty())
            .ok_or(Error::Missing("name"))?;
        let upstream = input
            .upstream
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or(Error::Missing("upstream"))?;
        Ok((name, upstream))
    }

    /// Creates a proxy and, unless `enabled` is false, starts it.
    pub async fn create(&mut self, input: ProxyInput) -> Result<ProxyView, Error> {
        let (name, upstream) = Self::required(&input)?;
        if self.entries.contains_key(&name) {
            return Err(Error::ProxyExists);
        }
        let mut options = self.options.clone();
        if let Some(mode) = input.mode {
            options.mode = mode;
        }
        if let Some(probe) = input.probe {
            options.probe = probe;
        }
        if let Some(headers) = &input.id_headers {
            options.id_headers = headers.iter().map(|h| h.to_ascii_lowercase()).collect();
        }
        options.instance = input.instance.clone();
        let mut files = OwnFiles::default();
        match &input.capture {
            Some(CaptureInput::Shared(false)) => options.capture = None,
            Some(CaptureInput::Shared(true)) if options.capture.is_none() => {
                return Err(Error::Invalid(
                    "capture: true, but this server captures nothing (snag serve --capture FILE); name a file of the proxy's own instead".into(),
                ));
            }
            Some(CaptureInput::File(name)) => {
                let path = self.confined(name)?;
                let settings = crate::capture::Settings {
                    path,
                    max_bytes: None,
                    snaplen: 0,
                };
                let capture = crate::capture::Capture::create(settings)
                    .map_err(|e| Error::Invalid(format!("capture file `{name}`: {e}")))?;
                let capture = Arc::new(capture);
                options.capture = Some(capture.clone());
                files.capture = Some((name.clone(), capture));
            }
            _ => {}
        }
        if let Some(name) = &input.events {
            let path = self.confined(name)?;
            let log = crate::events::EventLog::create(&path)
                .map_err(|e| Error::Invalid(format!("events file `{name}`: {e}")))?;
            options.events = Some(log.clone());
            files.events = Some((name.clone(), log));
        }
        if let Some(at) = &input.probe_listen {
            options.probe_listen = Some(resolve(at).await.map_err(Error::Listen)?);
        }
        let proxy = self.new_proxy(&name, &upstream, &options, Vec::new())?;
        let mut entry = Entry {
            listen: input.listen.unwrap_or_default(),
            enabled: false,
            probe_listen: input.probe_listen,
            proxy,
            streams: BTreeMap::new(),
            running: None,
            files,
        };
        if input.enabled.unwrap_or(true)
            && let Err(err) = self.start(&mut entry).await
        {
            entry.files.close(&name);
            return Err(err);
        }
        let shown = view(&name, &entry);
        self.entries.insert(name, entry);
        Ok(shown)
    }

    /// Applies a partial update: a new listen or upstream restarts the proxy (its
    /// connections are dropped); `enabled` opens or closes it.
    pub async fn update(&mut self, name: &str, input: ProxyInput) -> Result<ProxyView, Error> {
        let mut entry = self.entries.remove(name).ok_or(Error::ProxyNotFound)?;
        let result = self.apply(name, &mut entry, input).await;
        let shown = view(name, &entry);
        self.entries.insert(name.to_string(), entry);
        result.map(|()| shown)
    }

    async fn apply(
        &mut self,
        name: &str,
        entry: &mut Entry,
        input: ProxyInput,
    ) -> Result<(), Error> {
        if let Some(field) = fixed_field_changed(entry, &input) {
            return Err(Error::Invalid(format!(
                "proxy `{name}`: `{field}` is set when a proxy is created and cannot change; delete it and create it again"
            )));
        }
        let listen = input.listen.filter(|l| *l != entry.listen);
        let upstream = input
            .upstream
            .filter(|u| **u != *entry.proxy.upstream() && !u.is_empty());
        let enabled = input.enabled.unwrap_or(entry.enabled);
        if listen.is_some() || upstream.is_some() {
            // As Toxiproxy does: the listener restarts and open connections drop. The
            // proxy itself stays, with its faults, counters and timeline.
            stop(entry).await;
            if let Some(listen) = listen {
                entry.listen = listen;
            }
            if let Some(upstream) = upstream {
                entry.proxy.set_upstream(&upstream);
            }
        }
        match (enabled, entry.running.is_some()) {
            (true, false) => self.start(entry).await,
            (false, true) => {
                stop(entry).await;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Stops and forgets a proxy.
    pub async fn delete(&mut self, name: &str) -> Result<(), Error> {
        let mut entry = self.entries.remove(name).ok_or(Error::ProxyNotFound)?;
        stop(&mut entry).await;
        entry.files.close(name);
        Ok(())
    }

    /// `name` inside the files directory, if it stays there: a relative path without
    /// `..`, whose directory is inside the files directory once symlinks are
    /// resolved, and which is not itself a symlink.
    fn confined(&self, name: &str) -> Result<PathBuf, Error> {
        let dir = self.files.as_ref().ok_or_else(|| {
            Error::Invalid(format!(
                "file `{name}`: this server takes no file names (start it with --files-dir DIR)"
            ))
        })?;
        let refuse = |why: &str| {
            Error::Invalid(format!(
                "file `{name}`: {why}; give a name inside {}",
                dir.display()
            ))
        };
        let relative = Path::new(name);
        if name.is_empty()
            || !relative
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(refuse(
                "not a plain relative name (no `..`, no leading `/`)",
            ));
        }
        let path = dir.join(relative);
        let root = dir
            .canonicalize()
            .map_err(|e| Error::Invalid(format!("files directory {}: {e}", dir.display())))?;
        let parent = path
            .parent()
            .and_then(|p| p.canonicalize().ok())
            .ok_or_else(|| refuse("its directory does not exist"))?;
        if !parent.starts_with(&root) {
            return Err(refuse("it leaves the files directory through a symlink"));
        }
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(refuse("it is a symlink"));
        }
        Ok(path)
    }

    /// Creates or replaces each proxy in order; one whose listen and upstream are
    /// unchanged is kept as it is. `Err` carries the proxies done so far.
    pub async fn populate(
        &mut self,
        inputs: Vec<ProxyInput>,
    ) -> Result<Vec<ProxyView>, (Error, Vec<ProxyView>)> {
        for (i, input) in inputs.iter().enumerate() {
            if let Err(Error::Missing(field)) = Self::required(input) {
                return Err((Error::MissingAt(field, i + 1), Vec::new()));
            }
        }
        let mut done = Vec::new();
        for input in inputs {
            let (name, upstream) = Self::required(&input).expect("checked above");
            if let Some(entry) = self.entries.get(&name) {
                let same_listen = match (
                    resolve(input.listen.as_deref().unwrap_or("")).await,
                    entry.listen.parse::<SocketAddr>(),
                ) {
                    (Ok(new), Ok(old)) => new.port() != 0 && new == old,
                    _ => false,
                };
                if same_listen && *entry.proxy.upstream() == *upstream {
                    done.push(view(&name, entry));
                    continue;
                }
                self.delete(&name).await.expect("the entry exists");
            }
            match self.create(input).await {
                Ok(shown) => done.push(shown),
                Err(err) => return Err((err, done)),
            }
        }
        Ok(done)
    }

    /// Enables every proxy and removes every toxic.
    pub async fn reset(&mut self) -> Result<(), Error> {
        let names: Vec<String> = self.entries.keys().cloned().collect();
        for name in names {
            let mut entry = self.entries.remove(&name).expect("listed just now");
            entry.proxy.clear_faults();
            entry.streams.clear();
            let started = if entry.running.is_none() {
                self.start(&mut entry).await
            } else {
                Ok(())
            };
            self.entries.insert(name, entry);
            started?;
        }
        Ok(())
    }

    /// The toxics of a proxy: the upstream chain, then the downstream one.
    pub fn toxics(&self, proxy: &str) -> Result<Vec<ToxicView>, Error> {
        let entry = self.entries.get(proxy).ok_or(Error::ProxyNotFound)?;
        Ok(toxics(entry))
    }

    /// One toxic.
    pub fn toxic(&self, proxy: &str, toxic: &str) -> Result<ToxicView, Error> {
        let entry = self.entries.get(proxy).ok_or(Error::ProxyNotFound)?;
        toxics(entry)
            .into_iter()
            .find(|t| t.name == toxic)
            .ok_or(Error::ToxicNotFound)
    }

    /// Adds a toxic, checking in Toxiproxy's order: stream, type, name, attributes.
    pub fn add_toxic(&mut self, proxy: &str, body: &Value) -> Result<ToxicView, Error> {
        let entry = self.entries.get_mut(proxy).ok_or(Error::ProxyNotFound)?;
        let input = ToxicInput::from_json(body)?;
        let stream_sent = input.stream.unwrap_or_else(|| "downstream".to_string());
        let stream: Direction = stream_sent.parse().map_err(|_| Error::BadStream)?;
        let type_name = input.kind.ok_or(Error::BadType)?;
        let defaults = Kind::lenient(&type_name, toml::Table::new()).map_err(|_| Error::BadType)?;
        let name = input
            .name
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("{type_name}_{stream_sent}"));
        if entry.proxy.faults().iter().any(|f| f.name == name) {
            return Err(Error::ToxicExists);
        }
        let kind = merge(&defaults, input.attributes.as_ref())?;
        let toxicity = input.toxicity.unwrap_or(1.0).clamp(0.0, 1.0);
        let scope = input
            .scope
            .as_deref()
            .unwrap_or("any")
            .parse()
            .map_err(Error::Invalid)?;
        let fault = Fault::new(Some(name.clone()), kind, Some(stream), Some(toxicity))
            .and_then(|f| f.with_scope(scope))
            .map_err(Error::Invalid)?;
        entry.proxy.add_fault(fault).map_err(|e| match e {
            proxy::FaultError::Exists(_) => Error::ToxicExists,
            other => Error::Invalid(other.to_string()),
        })?;
        entry.streams.insert(name.clone(), stream_sent);
        toxics(entry)
            .into_iter()
            .find(|t| t.name == name)
            .ok_or(Error::ToxicNotFound)
    }

    /// Updates a toxic's attributes (merged into the current ones) and toxicity.
    pub fn update_toxic(
        &mut self,
        proxy: &str,
        toxic: &str,
        body: &Value,
    ) -> Result<ToxicView, Error> {
        let entry = self.entries.get_mut(proxy).ok_or(Error::ProxyNotFound)?;
        let current = entry
            .proxy
            .faults()
            .into_iter()
            .find(|f| f.name == toxic)
            .ok_or(Error::ToxicNotFound)?;
        let input = ToxicInput::from_json(body)?;
        let kind = merge(&current.kind, input.attributes.as_ref())?;
        let toxicity = input
            .toxicity
            .map_or(current.toxicity, |t| t.clamp(0.0, 1.0));
        let scope = match input.scope.as_deref() {
            Some(s) => s.parse().map_err(Error::Invalid)?,
            None => current.scope,
        };
        let fault = Fault::new(
            Some(current.name),
            kind,
            Some(current.stream),
            Some(toxicity),
        )
        .and_then(|f| f.with_scope(scope))
        .map_err(Error::Invalid)?;
        entry
            .proxy
            .replace_fault(fault)
            .map_err(|_| Error::ToxicNotFound)?;
        toxics(entry)
            .into_iter()
            .find(|t| t.name == toxic)
            .ok_or(Error::ToxicNotFound)
    }

    /// Removes a toxic.
    pub fn delete_toxic(&mut self, proxy: &str, toxic: &str) -> Result<(), Error> {
        let entry = self.entries.get_mut(proxy).ok_or(Error::ProxyNotFound)?;
        entry
            .proxy
            .remove_fault(toxic)
            .map_err(|_| Error::ToxicNotFound)?;
        entry.streams.remove(toxic);
        Ok(())
    }

    /// The Prometheus text for the families `metrics` selects.
    pub fn metrics(&self, metrics: super::Metrics) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        if metrics.proxy {
            let families = [
                (
                    "received",
                    "The total bytes received from a given direction",
                ),
                ("sent", "The total bytes sent to a given direction"),
            ];
            for (what, help) in families {
                let family = format!("toxiproxy_proxy_{what}_bytes_total");
                let _ = writeln!(out, "# HELP {family} {help}\n# TYPE {family} counter");
                for (name, entry) in &self.entries {
                    let t = entry.proxy.traffic();
                    let (up, down) = if what == "received" {
                        (t.received_up, t.received_down)
                    } else {
                        (t.sent_up, t.sent_down)
                    };
                    for (direction, n) in [("downstream", down), ("upstream", up)] {
                        let _ = writeln!(
                            out,
                            "{family}{{direction=\"{direction}\",listener=\"{}\",proxy=\"{}\",upstream=\"{}\"}} {n}",
                            label(&entry.listen),
                            label(name),
                            label(&entry.proxy.upstream())
                        );
                    }
                }
            }
        }
        if metrics.runtime {
            let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            let rss_kib: u64 = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            let fds = std::fs::read_dir("/proc/self/fd")
                .map(|d| d.count())
                .unwrap_or(0);
            let _ = writeln!(
                out,
                "# HELP process_resident_memory_bytes Resident memory size in bytes.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}",
                rss_kib * 1024
            );
            let _ = writeln!(
                out,
                "# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {fds}"
            );
            let tasks = tokio::runtime::Handle::current()
                .metrics()
                .num_alive_tasks();
            let _ = writeln!(
                out,
                "# HELP snag_tasks Tasks alive in snag's runtime (connections, listeners, timers).\n# TYPE snag_tasks gauge\nsnag_tasks {tasks}"
            );
        }
        out
    }

    /// Waits for every proxy to stop, once the server's shutdown has fired: each
    /// gives its open connections the shutdown grace period.
    pub async fn stop_all(&mut self) {
        for (name, entry) in &mut self.entries {
            entry.enabled = false;
            if let Some((_, task)) = entry.running.take() {
                let _ = task.await;
            }
            entry.files.close(name);
        }
    }

    fn new_proxy(
        &self,
        name: &str,
        upstream: &str,
        options: &Options,
        faults: Vec<Fault>,
    ) -> Result<Arc<Proxy>, Error> {
        Proxy::new(
            name.to_string(),
            upstream.to_string(),
            self.seed,
            options.clone(),
            faults,
        )
        .map_err(|e| Error::Invalid(e.to_string()))
    }

    async fn start(&self, entry: &mut Entry) -> Result<(), Error> {
        let addr = resolve(&entry.listen).await.map_err(Error::Listen)?;
        let listener =
            proxy::socket::bind(addr).map_err(|e| Error::Listen(go_listen_error(addr, &e)))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::Listen(e.to_string()))?;
        let probes = match &entry.probe_listen {
            Some(at) => {
                let addr = resolve(at).await.map_err(Error::Listen)?;
                let listener = proxy::socket::bind(addr)
                    .map_err(|e| Error::Listen(go_listen_error(addr, &e)))?;
                let bound = listener
                    .local_addr()
                    .map_err(|e| Error::Listen(e.to_string()))?;
                entry.probe_listen = Some(bound.to_string());
                Some(listener)
            }
            None => None,
        };
        let stop = self.shutdown.child();
        let task = tokio::spawn(proxy::serve_all(
            listener,
            probes,
            entry.proxy.clone(),
            stop.clone(),
        ));
        entry.listen = bound.to_string();
        entry.enabled = true;
        entry.running = Some((stop, task));
        Ok(())
    }
}

/// The first of snag's own fields that `input` would change on an existing proxy:
/// they shape how the proxy was built, so an update that names a different value is
/// refused rather than answered 200 and ignored.
fn fixed_field_changed(entry: &Entry, input: &ProxyInput) -> Option<&'static str> {
    let options = entry.proxy.options();
    if input.mode.is_some_and(|m| m != options.mode) {
        return Some("mode");
    }
    if input.probe.as_ref().is_some_and(|p| *p != options.probe) {
        return Some("probe");
    }
    if input
        .probe_listen
        .as_ref()
        .is_some_and(|p| Some(p) != entry.probe_listen.as_ref())
    {
        return Some("probe_listen");
    }
    if let Some(headers) = &input.id_headers {
        let lower: Vec<String> = headers.iter().map(|h| h.to_ascii_lowercase()).collect();
        if lower != options.id_headers {
            return Some("id_headers");
        }
    }
    if input.instance.is_some() && input.instance != options.instance {
        return Some("instance");
    }
    let own_capture = entry.files.capture.as_ref().map(|(n, _)| n.as_str());
    let capture_same = match &input.capture {
        None => true,
        Some(CaptureInput::File(name)) => own_capture == Some(name.as_str()),
        Some(CaptureInput::Shared(on)) => own_capture.is_none() && *on == options.capture.is_some(),
    };
    if !capture_same {
        return Some("capture");
    }
    let own_events = entry.files.events.as_ref().map(|(n, _)| n.as_str());
    if input
        .events
        .as_deref()
        .is_some_and(|e| Some(e) != own_events)
    {
        return Some("events");
    }
    None
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Closes the listener and every connection, and waits until they are closed.
async fn stop(entry: &mut Entry) {
    entry.enabled = false;
    if let Some((stop, task)) = entry.running.take() {
        stop.close();
        let _ = task.await;
    }
}

fn view(name: &str, entry: &Entry) -> ProxyView {
    ProxyView {
        name: name.to_string(),
        listen: entry.listen.clone(),
        upstream: entry.proxy.upstream().to_string(),
        enabled: entry.enabled,
        logger: Map::new(),
        toxics: toxics(entry),
        mode: (entry.proxy.options().mode == crate::fault::Mode::Http).then_some("http"),
        probe_listen: entry.probe_listen.clone(),
        capture: entry.proxy.options().capture.is_some(),
        capture_file: entry.files.capture.as_ref().map(|(n, _)| n.clone()),
        events_file: entry.files.events.as_ref().map(|(n, _)| n.clone()),
    }
}

fn toxics(entry: &Entry) -> Vec<ToxicView> {
    let faults = entry.proxy.faults();
    let (up, down): (Vec<_>, Vec<_>) = faults
        .into_iter()
        .partition(|f| f.stream == Direction::Upstream);
    up.into_iter()
        .chain(down)
        .map(|f| ToxicView {
            attributes: f.kind.attributes_json(),
            stream: entry
                .streams
                .get(&f.name)
                .cloned()
                .unwrap_or_else(|| f.stream.to_string()),
            kind: f.kind.type_name().to_string(),
            toxicity: go_float(f.toxicity),
            scope: (f.scope != crate::fault::Scope::Any).then(|| f.scope.as_str()),
            name: f.name,
        })
        .collect()
}

/// A listen string as Toxiproxy takes it: `host:port`, an empty host or `localhost`
/// meaning 127.0.0.1 (snag never binds every interface unasked), `""` meaning `127.0.0.1:0`.
pub async fn resolve(listen: &str) -> Result<SocketAddr, String> {
    let listen = if listen.is_empty() { ":0" } else { listen };
    let (host, port) = listen
        .rsplit_once(':')
        .ok_or_else(|| format!("address {listen}: missing port in address"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("address {listen}: invalid port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host == "localhost" {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(ip) = host.parse() {
        return Ok(SocketAddr::new(ip, port));
    }
    tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("lookup {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("lookup {host}: no such host"))
}

fn go_listen_error(addr: SocketAddr, err: &std::io::Error) -> String {
    let why = match err.kind() {
        std::io::ErrorKind::AddrInUse => "address already in use".to_string(),
        std::io::ErrorKind::AddrNotAvailable => "cannot assign requested address".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => err.to_string(),
    };
    format!("listen tcp {addr}: bind: {why}")
}
