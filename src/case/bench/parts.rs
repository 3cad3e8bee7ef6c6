//! The backends of a case and the interposer in front of each, started from the
//! case's fault file, and what their interposers relayed.

use super::{
    elsewhere::{BackendPart, Interposer, RemoteBackend, RemoteProxy},
    *,
};

/// One backend of the case, with the interposer in front of it.
#[derive(Debug, Clone)]
pub struct Part {
    /// Its name: the backend's id, the interposer's and the balancer's for it.
    pub name: String,
    /// The backend itself.
    pub backend: BackendPart,
    /// Where the backend listens.
    pub backend_addr: SocketAddr,
    /// The interposer.
    pub proxy: Interposer,
    /// Its data listener: where the balancer sends requests.
    pub data: SocketAddr,
    /// Its probe listener: where the balancer sends health checks.
    pub probe: SocketAddr,
}

impl Part {
    /// Its interposer's counters now.
    pub async fn stats(&self) -> anyhow::Result<crate::events::Stats> {
        self.proxy.stats().await
    }

    /// The counters of every interposer of `parts`, in their order.
    pub async fn stats_of(parts: &[Part]) -> anyhow::Result<Vec<crate::events::Stats>> {
        let mut all = Vec::with_capacity(parts.len());
        for p in parts {
            all.push(p.stats().await?);
        }
        Ok(all)
    }
}

/// Data requests each interposer had relayed, sampled every 100 ms.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    at_s: f64,
    data: Vec<u64>,
}

impl Bench {
    /// Starts one backend per id, each behind an interposer in HTTP mode with a probe
    /// listener; `faults` is a case file from `faults/` whose proxies, named after the
    /// backends, give their faults and timeline (played from now). Backends the file
    /// does not name get an interposer without faults. Parts the topology names run
    /// elsewhere: the case takes them as they are and makes their interposers there.
    pub async fn parts(
        &mut self,
        ids: &[&str],
        faults: Option<&'static str>,
        tune: impl Fn(&str, &mut backend::Config),
    ) -> anyhow::Result<Vec<Part>> {
        let file = match faults {
            Some(text) => {
                crate::fault::file::parse(&format!("faults/case-{}.toml", self.case.name), text)?
            }
            None => Scenario {
                seed: None,
                proxies: Vec::new(),
                capture: None,
            },
        };
        if let Some(stray) = file
            .proxies
            .iter()
            .find(|p| !ids.contains(&p.config.name.as_str()))
        {
            anyhow::bail!(
                "the case file names a proxy {:?} the case has no backend for",
                stray.config.name
            );
        }
        let mut backends = Vec::new();
        for id in ids {
            let mut config = backend::Config::new(id);
            tune(id, &mut config);
            if let Some(&addr) = self.topology.backends.get(*id) {
                let remote = RemoteBackend::take(addr, &config).await?;
                backends.push((
                    id.to_string(),
                    addr,
                    BackendPart::Elsewhere(Arc::new(remote)),
                ));
                continue;
            }
            let listener = self.ports.listener()?;
            let addr = listener.local_addr()?;
            let backend = Backend::new(config);
            tokio::spawn(backend::serve(
                listener,
                backend.clone(),
                self.shutdown.clone(),
            ));
            backends.push((id.to_string(), addr, BackendPart::Here(backend)));
        }
        let scale = self.length.factor(self.case);
        let mut scenario = Scenario {
            seed: None,
            proxies: Vec::new(),
            capture: None,
        };
        for (id, addr, _) in &backends {
            let any: std::net::SocketAddr = "127.0.0.1:0".parse().expect("valid");
            let mut spec = file
                .proxies
                .iter()
                .find(|p| &p.config.name == id)
                .cloned()
                .unwrap_or_else(|| ProxySpec {
                    config: ProxyConfig::new(id, any, ""),
                    timeline: Vec::new(),
                });
            // Every case's interposer: HTTP, a probe listener, in front of its backend.
            let config = &mut spec.config;
            config.upstream = addr.to_string();
            config.listen = self.ports.any()?;
            config.probe_listen = Some(self.ports.any()?);
            config.mode = Mode::Http;
            config.instance = Some(id.clone());
            if self.topology.interposers.contains_key(id) && self.protocol == BackendProtocol::H2 {
                return Err(Unsupported {
                    product: "this topology".into(),
                    why: format!(
                        "interposer {id} runs elsewhere, and HTTP/2 over TLS to it needs the \
                         run's certificate there: run it with --backend-protocol h2c or h1"
                    ),
                }
                .into());
            }
            if let Some((cert, key, _)) = self.run_tls()? {
                config.tls = Some(crate::tls::ListenTls::Files { cert, key });
            }
            for change in &mut spec.timeline {
                change.at = change.at.mul_f64(scale);
                let what = match &change.action {
                    Action::Add(f) => format!("{id}: add {} ({})", describe(f), scope(f)),
                    Action::Remove(name) => format!("{id}: remove {name}"),
                    Action::Drain(d) => format!("{id}: drain ({:?})", d.mode),
                    Action::Undrain => format!("{id}: undrain"),
                };
                let kind = match &change.action {
                    Action::Add(_) | Action::Remove(_) => EventKind::Fault,
                    Action::Drain(_) | Action::Undrain => EventKind::Action,
                };
                self.report.events.push(Event::new(
                    kind,
                    self.now_s() + change.at.as_secs_f64(),
                    what,
                ));
            }
            for f in &spec.config.faults {
                self.report.events.push(Event::new(
                    EventKind::Fault,
                    self.now_s(),
                    format!("{id}: {} ({}) from the start", describe(f), scope(f)),
                ));
            }
            scenario.proxies.push(spec);
        }
        self.parts_s = self.now_s();
        let context = RunContext::new(self.seed);
        // Those made elsewhere first, so their timelines start as close as can be to
        // those of the ones here.
        let (there, here): (Vec<_>, Vec<_>) = scenario
            .proxies
            .into_iter()
            .partition(|p| self.topology.interposers.contains_key(&p.config.name));
        let mut made = Vec::new();
        for spec in &there {
            let at = &self.topology.interposers[&spec.config.name];
            let upstream = self.topology.backends[&spec.config.name];
            let remote = Arc::new(RemoteProxy::make(spec, at, upstream).await?);
            self.report.notes.push(format!(
                "{}: interposer in the snag serve at {} (listening on {}, probes on {}), backend at {upstream}",
                spec.config.name, at.api, at.listen, at.probe_listen
            ));
            made.push((spec.config.name.clone(), remote, at.listen, at.probe_listen));
        }
        let t0 = tokio::time::Instant::now();
        for (spec, (_, remote, _, _)) in there.iter().zip(&made) {
            tokio::spawn(
                remote
                    .clone()
                    .play(spec.timeline.clone(), t0, self.shutdown.clone()),
            );
        }
        let here_scenario = Scenario {
            seed: None,
            proxies: here,
            capture: None,
        };
        let running = crate::proxy::start(&here_scenario, &context, &self.shutdown)?;
        let mut running = running.into_iter();
        for (name, backend_addr, backend) in backends {
            let (proxy, data, probe) = match made.iter().find(|(n, ..)| *n == name) {
                Some((_, remote, data, probe)) => {
                    (Interposer::Elsewhere(remote.clone()), *data, *probe)
                }
                None => {
                    let r = running.next().context("an interposer per backend")?;
                    let probe = r
                        .probe_addr
                        .context("the interposer has a probe listener")?;
                    (Interposer::Here(r.proxy), r.addr, probe)
                }
            };
            self.parts.push(Part {
                name,
                backend,
                backend_addr,
                proxy,
                data,
                probe,
            });
        }
        self.sample();
        Ok(self.parts.clone())
    }

    /// Samples every interposer's data requests every 100 ms until the case ends.
    fn sample(&self) {
        let (parts, samples, shutdown, t0) = (
            self.parts.clone(),
            self.samples.clone(),
            self.shutdown.clone(),
            self.t0,
        );
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(100));
            'ticks: loop {
                tokio::select! {
                    _ = shutdown.wait() => return,
                    _ = ticks.tick() => {}
                }
                let mut data = Vec::with_capacity(parts.len());
                for p in &parts {
                    // An interposer elsewhere that did not answer: no sample this time.
                    let Ok(stats) = p.proxy.stats().await else {
                        continue 'ticks;
                    };
                    data.push(stats.requests.get("data").copied().unwrap_or(0));
                }
                samples
                    .lock()
                    .expect("no code panics holding the samples")
                    .push(Sample {
                        at_s: t0.elapsed().as_secs_f64(),
                        data,
                    });
            }
        });
    }

    /// Data requests interposer `name` relayed between `from_s` and `to_s` (seconds
    /// into the case), as far as 100 ms samples tell: the samples nearest inside.
    pub fn data_between(&self, name: &str, from_s: f64, to_s: f64) -> u64 {
        let index = self
            .parts
            .iter()
            .position(|p| p.name == name)
            .expect("a part of this case");
        let samples = self
            .samples
            .lock()
            .expect("no code panics holding the samples");
        let first = samples.iter().find(|s| s.at_s >= from_s);
        let last = samples.iter().rev().find(|s| s.at_s <= to_s);
        match (first, last) {
            (Some(a), Some(b)) if b.at_s >= a.at_s => b.data[index] - a.data[index],
            _ => 0,
        }
    }
}

fn describe(f: &crate::fault::Fault) -> String {
    let attributes = f.kind.attributes_json();
    let attributes = match attributes.as_object() {
        Some(map) if !map.is_empty() => {
            let parts: Vec<String> = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!(" {}", parts.join(" "))
        }
        _ => String::new(),
    };
    let toxicity = if f.toxicity < 1.0 {
        format!(" toxicity={}", f.toxicity)
    } else {
        String::new()
    };
    format!("{}{attributes}{toxicity}", f.name)
}

fn scope(f: &crate::fault::Fault) -> &'static str {
    match f.scope {
        crate::fault::Scope::Any => "any path",
        crate::fault::Scope::Data => "data path",
        crate::fault::Scope::Probe => "probe path",
    }
}
