//! The proxies the control API manages, and the operations on them with Toxiproxy's
//! semantics: create, update (restart on a new listen or upstream), enable/disable,
//! populate, reset, and toxics.

mod files;
mod metrics;
mod wire;

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc};

use serde_json::Value;

use super::{
    Error,
    toxic::{ToxicInput, merge},
};
use crate::{
    fault::config::ProxyConfig,
    fault::{Direction, Fault, Kind},
    proxy::{self, Proxy, RunContext},
    shutdown::Shutdown,
};

pub use self::wire::{
    CaptureInput, ProxyInput, ProxyView, TlsInput, ToxicView, UpstreamTlsInput, resolve,
};
use self::{
    files::OwnFiles,
    wire::{fixed_field_changed, go_listen_error, toxics, view},
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

/// Every proxy the API knows, by name.
pub struct Registry {
    context: RunContext,
    /// Where files named through the API go; `None`: nowhere.
    files: Option<PathBuf>,
    shutdown: Shutdown,
    entries: BTreeMap<String, Entry>,
}

impl Registry {
    /// An empty registry whose proxies run in `context` and stop on `shutdown`;
    /// files named through the API go to `files`.
    pub fn new(context: RunContext, files: Option<PathBuf>, shutdown: Shutdown) -> Registry {
        Registry {
            context,
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
        let listen_text = input.listen.clone().unwrap_or_default();
        let listen = resolve(&listen_text).await.map_err(Error::Listen)?;
        let mut config = ProxyConfig::new(&name, listen, upstream);
        if let Some(mode) = input.mode {
            config.mode = mode;
        }
        if let Some(probe) = input.probe.clone() {
            config.probe = probe;
        }
        if let Some(headers) = &input.id_headers {
            config.set_id_headers(headers);
        }
        config.instance = input.instance.clone();
        if let Some(at) = &input.probe_listen {
            config.probe_listen = Some(resolve(at).await.map_err(Error::Listen)?);
        }
        self.legs(&input, &mut config)?;
        let (context, files) = self.own_files(&input)?;
        let enabled = input.enabled.unwrap_or(true);
        self.insert(
            config,
            context,
            files,
            listen_text,
            input.probe_listen,
            enabled,
        )
        .await
    }

    /// Creates a proxy from `config` (a fault file's, faults included) and starts it.
    pub async fn create_config(&mut self, config: ProxyConfig) -> Result<ProxyView, Error> {
        if self.entries.contains_key(&config.name) {
            return Err(Error::ProxyExists);
        }
        let listen = config.listen.to_string();
        let probe_listen = config.probe_listen.map(|a| a.to_string());
        let context = self.context.clone();
        self.insert(
            config,
            context,
            OwnFiles::default(),
            listen,
            probe_listen,
            true,
        )
        .await
    }

    async fn insert(
        &mut self,
        config: ProxyConfig,
        context: RunContext,
        mut files: OwnFiles,
        listen: String,
        probe_listen: Option<String>,
        enabled: bool,
    ) -> Result<ProxyView, Error> {
        let name = config.name.clone();
        let proxy = match Proxy::new(config, context) {
            Ok(proxy) => proxy,
            Err(e) => {
                files.close(&name);
                return Err(Error::Invalid(e.to_string()));
            }
        };
        if files.capture_off {
            proxy
                .set_capturing(false)
                .expect("switching a capture off always works");
        }
        let mut entry = Entry {
            listen,
            enabled: false,
            probe_listen,
            proxy,
            streams: BTreeMap::new(),
            running: None,
            files,
        };
        if enabled && let Err(err) = self.start(&mut entry).await {
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
        if let Some(CaptureInput::Shared(on)) = input.capture {
            entry.proxy.set_capturing(on).map_err(Error::Invalid)?;
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

/// Closes the listener and every connection, and waits until they are closed.
async fn stop(entry: &mut Entry) {
    entry.enabled = false;
    if let Some((stop, task)) = entry.running.take() {
        stop.close();
        let _ = task.await;
    }
}
