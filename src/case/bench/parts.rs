//! The backends of a case and the interposer in front of each, started from the
//! case's fault file, and what their interposers relayed.

use super::*;

/// One backend of the case, with the interposer in front of it.
#[derive(Debug, Clone)]
pub struct Part {
    /// Its name: the backend's id, the interposer's and the balancer's for it.
    pub name: String,
    /// The backend itself.
    pub backend: Arc<Backend>,
    /// Where the backend listens.
    pub backend_addr: SocketAddr,
    /// The interposer.
    pub proxy: Arc<Proxy>,
    /// Its data listener: where the balancer sends requests.
    pub data: SocketAddr,
    /// Its probe listener: where the balancer sends health checks.
    pub probe: SocketAddr,
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
    /// does not name get an interposer without faults.
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
            let listener = self.ports.listener()?;
            let addr = listener.local_addr()?;
            let backend = Backend::new(config);
            tokio::spawn(backend::serve(
                listener,
                backend.clone(),
                self.shutdown.clone(),
            ));
            backends.push((id.to_string(), addr, backend));
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
        let running = crate::proxy::start(&scenario, &context, &self.shutdown)?;
        for ((name, backend_addr, backend), r) in backends.into_iter().zip(running) {
            self.parts.push(Part {
                name,
                backend,
                backend_addr,
                proxy: r.proxy,
                data: r.addr,
                probe: r
                    .probe_addr
                    .context("the interposer has a probe listener")?,
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
            loop {
                tokio::select! {
                    _ = shutdown.wait() => return,
                    _ = ticks.tick() => {}
                }
                let data = parts
                    .iter()
                    .map(|p| {
                        p.proxy
                            .counters()
                            .snapshot()
                            .requests
                            .get("data")
                            .copied()
                            .unwrap_or(0)
                    })
                    .collect();
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
