//! A part's interposer and backend, started here or running elsewhere (`--topology`):
//! the case reads and changes both the same way, through these.

use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use hyper::Method;
use serde_json::json;

use crate::{
    api::client::Client,
    events::Stats,
    fault::file::{Action, Change, ProxySpec},
    lab::{
        backend::{self, Backend},
        load::Lag,
    },
    proxy::Proxy,
    shutdown::Shutdown,
};

/// A part's interposer.
#[derive(Debug, Clone)]
pub enum Interposer {
    /// Started by the case, in this process.
    Here(Arc<Proxy>),
    /// Made by the case in a `snag serve` elsewhere, through its control API.
    Elsewhere(Arc<RemoteProxy>),
}

impl Interposer {
    /// Its counters now.
    pub async fn stats(&self) -> anyhow::Result<Stats> {
        match self {
            Interposer::Here(proxy) => Ok(proxy.counters().snapshot()),
            Interposer::Elsewhere(remote) => remote.stats().await,
        }
    }
}

/// A part's backend.
#[derive(Debug, Clone)]
pub enum BackendPart {
    /// Started by the case, in this process.
    Here(Arc<Backend>),
    /// A `snag backend` elsewhere, reached by its routes.
    Elsewhere(Arc<RemoteBackend>),
}

impl BackendPart {
    /// Data requests it served since the case took it.
    pub async fn served(&self) -> anyhow::Result<u64> {
        match self {
            BackendPart::Here(b) => Ok(b.served()),
            BackendPart::Elsewhere(r) => {
                let stats = r.client.call(Method::GET, "/stats", None).await?;
                Ok(count(&stats, "served")?.saturating_sub(r.served_before))
            }
        }
    }

    /// Adds `delay` to every data request from now.
    pub async fn set_delay(&self, delay: std::time::Duration) -> anyhow::Result<()> {
        match self {
            BackendPart::Here(b) => b.set_delay(delay),
            BackendPart::Elsewhere(r) => {
                let ms = delay.as_secs_f64() * 1000.0;
                r.client
                    .call(Method::POST, "/admin/delay", Some(json!({ "ms": ms })))
                    .await?;
            }
        }
        Ok(())
    }

    /// How late its timers woke, if they were measured; `None` too when a backend
    /// elsewhere does not answer.
    pub async fn overslept(&self) -> Option<Lag> {
        match self {
            BackendPart::Here(b) => b.overslept(),
            BackendPart::Elsewhere(r) => {
                let stats = r.client.call(Method::GET, "/stats", None).await.ok()?;
                serde_json::from_value(stats["overslept_ms"].clone()).ok()
            }
        }
    }
}

fn count(stats: &serde_json::Value, field: &str) -> anyhow::Result<u64> {
    stats[field]
        .as_u64()
        .with_context(|| format!("the backend's /stats has no count `{field}`: {stats}"))
}

/// A `snag backend` the case did not start.
#[derive(Debug)]
pub struct RemoteBackend {
    client: Client,
    /// What it had served when the case took it: counts are the case's own.
    served_before: u64,
}

impl RemoteBackend {
    /// Takes the backend at `addr` for a case that wants it as `wanted`: it must call
    /// itself by the case's name and have been started with the case's worker pool;
    /// its delay, health and dependency are set as the case wants them, whatever an
    /// earlier case left.
    pub async fn take(
        addr: std::net::SocketAddr,
        wanted: &backend::Config,
    ) -> anyhow::Result<RemoteBackend> {
        let client = Client::new(addr, None);
        let id = &wanted.id;
        let stats = client
            .call(Method::GET, "/stats", None)
            .await
            .with_context(|| format!("backend {id} at {addr}"))?;
        if stats["id"] != wanted.id.as_str() {
            bail!(
                "backend {id} at {addr} calls itself {}: start it with `snag backend --id {id}`",
                stats["id"]
            );
        }
        let started = Started {
            workers: stats["workers"].as_u64(),
            work_ms: stats["work_ms"].as_f64().unwrap_or(0.0),
            queue: stats["queue"].as_u64(),
            health_path: stats["health_path"].as_str().unwrap_or("").to_string(),
        };
        let want = Started {
            workers: wanted.workers.map(|n| n as u64),
            work_ms: wanted.work.as_secs_f64() * 1000.0,
            queue: wanted.queue.map(|n| n as u64),
            health_path: wanted.health_path.clone(),
        };
        if started != want {
            bail!(
                "backend {id} at {addr} was started as `snag backend {}`; this case needs \
                 `snag backend {}`",
                started.flags(id),
                want.flags(id)
            );
        }
        let served_before = count(&stats, "served")?;
        let ms = wanted.delay.as_secs_f64() * 1000.0;
        for (path, body) in [
            ("/admin/delay", json!({ "ms": ms })),
            ("/admin/health", json!({ "healthy": true })),
            (
                "/admin/dependency",
                json!({ "broken": wanted.dependency_broken }),
            ),
        ] {
            client
                .call(Method::POST, path, Some(body))
                .await
                .with_context(|| format!("backend {id} at {addr}"))?;
        }
        Ok(RemoteBackend {
            client,
            served_before,
        })
    }
}

/// How a backend was started, as far as a case cares: what its routes cannot change.
#[derive(Debug)]
struct Started {
    workers: Option<u64>,
    work_ms: f64,
    queue: Option<u64>,
    health_path: String,
}

impl PartialEq for Started {
    /// The work each request takes matters only with a pool of workers.
    fn eq(&self, other: &Started) -> bool {
        (self.workers, self.queue, &self.health_path)
            == (other.workers, other.queue, &other.health_path)
            && (self.workers.is_none() || self.work_ms == other.work_ms)
    }
}

impl Started {
    /// As `snag backend` flags.
    fn flags(&self, id: &str) -> String {
        let mut flags = format!("--id {id} --health-path {}", self.health_path);
        if let Some(n) = self.workers {
            flags += &format!(" --workers {n} --work {}ms", self.work_ms);
            if let Some(q) = self.queue {
                flags += &format!(" --queue {q}");
            }
        }
        flags
    }
}

/// A proxy the case made in a `snag serve` elsewhere.
#[derive(Debug)]
pub struct RemoteProxy {
    name: String,
    client: Client,
    /// Its event log, a file in its server's files directory.
    events: String,
    /// Timeline changes the server refused, for the report.
    refused: Arc<Mutex<Vec<String>>>,
}

impl RemoteProxy {
    /// Makes `spec`'s proxy (its HTTP mode, probe rules, faults from the start) in
    /// the server whose API `at` names, listening where `at` says, in front of
    /// `upstream`; a proxy of that name left there by an earlier run is replaced.
    pub async fn make(
        spec: &ProxySpec,
        at: &crate::case::topology::Interposer,
        upstream: std::net::SocketAddr,
    ) -> anyhow::Result<RemoteProxy> {
        let config = &spec.config;
        let name = config.name.clone();
        let client = Client::new(at.api, at.token.clone());
        let context = || {
            format!(
                "interposer {} through the control API at {}",
                config.name, at.api
            )
        };
        client
            .call(Method::GET, "/version", None)
            .await
            .with_context(context)?;
        // A proxy of this name may be left from a run that was killed; gone is fine.
        let _ = client
            .call(Method::DELETE, &format!("/proxies/{name}"), None)
            .await;
        // Unique to this run, so that runs sharing a server never share a log.
        let events = format!(
            "snag-case-{name}-{}-{}.jsonl",
            std::process::id(),
            crate::lab::load::remote::unix_ms(std::time::SystemTime::now())
        );
        let body = json!({
            "events": events,
            "name": name,
            "listen": at.listen.to_string(),
            "upstream": upstream.to_string(),
            "enabled": true,
            "mode": config.mode.as_str(),
            "probe": config.probe,
            "probe_listen": at.probe_listen.to_string(),
            "id_headers": config.id_headers,
            "instance": config.instance,
            "upstream_protocol": config.upstream_protocol,
        });
        client
            .call(Method::POST, "/proxies", Some(body))
            .await
            .with_context(context)?;
        let remote = RemoteProxy {
            name,
            client,
            events,
            refused: Arc::default(),
        };
        for fault in &config.faults {
            remote.add(fault).await.with_context(context)?;
        }
        Ok(remote)
    }

    async fn add(&self, fault: &crate::fault::Fault) -> anyhow::Result<()> {
        let path = format!("/proxies/{}/toxics", self.name);
        self.client
            .call(Method::POST, &path, Some(fault.to_json()))
            .await
            .map(drop)
    }

    async fn stats(&self) -> anyhow::Result<Stats> {
        let path = format!("/proxies/{}/stats", self.name);
        let value = self.client.call(Method::GET, &path, None).await?;
        serde_json::from_value(value).with_context(|| {
            format!(
                "{path} at {}: not the stats of a snag interposer",
                self.client.addr()
            )
        })
    }

    /// Applies `timeline` through the API at its offsets from `t0`, until done or
    /// `shutdown`, as a proxy here plays its own.
    pub async fn play(
        self: Arc<Self>,
        timeline: Vec<Change>,
        t0: tokio::time::Instant,
        shutdown: Shutdown,
    ) {
        let name = &self.name;
        for change in timeline {
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = tokio::time::sleep_until(t0 + change.at) => {}
            }
            let done = match &change.action {
                Action::Add(fault) => self.add(fault).await,
                Action::Remove(fault) => {
                    let path = format!("/proxies/{name}/toxics/{fault}");
                    self.client
                        .call(Method::DELETE, &path, None)
                        .await
                        .map(drop)
                }
                Action::Drain(drain) => {
                    let path = format!("/proxies/{name}/drain");
                    let body = serde_json::to_value(drain).expect("a drain serialises");
                    self.client
                        .call(Method::POST, &path, Some(body))
                        .await
                        .map(drop)
                }
                Action::Undrain => {
                    let path = format!("/proxies/{name}/drain");
                    self.client
                        .call(Method::DELETE, &path, None)
                        .await
                        .map(drop)
                }
            };
            if let Err(err) = done {
                self.refused
                    .lock()
                    .expect("no code panics holding the refusals")
                    .push(format!(
                        "interposer {name}: the change at {:.1} s was not applied: {err:#}",
                        change.at.as_secs_f64()
                    ));
            }
        }
    }

    /// Deletes it from its server (which closes its event log) and fetches that log:
    /// its events, and what went wrong while it ran.
    pub async fn end(&self) -> (Vec<serde_json::Value>, Vec<String>) {
        let mut said = std::mem::take(
            &mut *self
                .refused
                .lock()
                .expect("no code panics holding the refusals"),
        );
        let path = format!("/proxies/{}", self.name);
        if let Err(err) = self.client.call(Method::DELETE, &path, None).await {
            said.push(format!(
                "interposer {}: could not delete it from the server at {}: {err:#}",
                self.name,
                self.client.addr()
            ));
        }
        let path = format!("/files/{}", self.events);
        let events = match self.client.fetch(Method::GET, &path, None).await {
            Ok(bytes) => bytes
                .split(|b| *b == b'\n')
                .filter_map(|line| serde_json::from_slice(line).ok())
                .collect(),
            Err(err) => {
                said.push(format!(
                    "interposer {}: its event log could not be fetched: {err:#}",
                    self.name
                ));
                Vec::new()
            }
        };
        (events, said)
    }
}
