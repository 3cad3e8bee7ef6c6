//! `snag proxy` and `snag serve`: the interposer from flags, a fault file or the
//! control API, with the run's evidence (event log, capture) opened around it.

use std::sync::Arc;

use anyhow::Context;

use crate::{
    UsageError, api, capture,
    cli::{self, ProxyArgs, ServeArgs},
    events,
    fault::{
        self,
        file::{ProxySpec, Scenario},
    },
    proxy::{self, RunContext, Workers},
    seed,
    shutdown::Shutdown,
};

/// The event log and the capture of a run, opened before its proxies start and
/// closed, complete, after they stop.
struct Evidence {
    events: Option<Arc<events::EventLog>>,
    capture: Option<Arc<capture::Capture>>,
    keylog: Option<Arc<crate::tls::KeyLogFile>>,
}

impl Evidence {
    /// Opens what the flags ask for; a capture from the flags wins over a file's.
    fn open(
        args: &cli::EvidenceArgs,
        file_capture: Option<capture::Settings>,
    ) -> anyhow::Result<Evidence> {
        let events = match &args.events {
            Some(path) => Some(
                events::EventLog::create(path)
                    .with_context(|| format!("could not create {}", path.display()))?,
            ),
            None => None,
        };
        let capture = match args.capture().or(file_capture) {
            Some(settings) => {
                let path = settings.path.clone();
                let capture = capture::Capture::create(settings)
                    .with_context(|| format!("could not create {}", path.display()))?;
                Some(Arc::new(capture))
            }
            None => None,
        };
        let keylog = match &args.tls_keylog {
            Some(path) => Some(
                crate::tls::KeyLogFile::open(path)
                    .map_err(|e| UsageError(format!("--tls-keylog {e}")))?,
            ),
            None => None,
        };
        Ok(Evidence {
            events,
            capture,
            keylog,
        })
    }

    /// The run's context: `seed`, the flags' upstream and shutdown handling, events
    /// and captures sent here, and a worker thread per core for HTTP mode.
    fn context(&self, seed: u64, flags: &cli::RunArgs) -> anyhow::Result<RunContext> {
        let mut context = RunContext::new(seed);
        context.on_upstream_error = flags.on_upstream_error;
        context.connect_timeout = flags.connect_timeout;
        context.shutdown_timeout = flags.shutdown_timeout;
        context.events = self.events.clone();
        context.capture = self.capture.clone();
        context.keylog = self.keylog.clone();
        context.workers = Some(Arc::new(
            Workers::per_core().context("could not start the worker threads")?,
        ));
        Ok(context)
    }

    /// Writes out what is queued and closes both files.
    fn close(self) -> anyhow::Result<()> {
        if let Some(capture) = self.capture {
            capture.close().context("could not finish the capture")?;
        }
        if let Some(log) = self.events {
            log.close().context("could not finish the event log")?;
        }
        Ok(())
    }
}

/// `snag serve`: the control API and the proxies it creates, until `shutdown`.
pub async fn serve(args: ServeArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    if !args.listen.ip().is_loopback() && args.token.is_none() && !args.insecure_remote {
        return Err(UsageError(format!(
            "--listen {}: the control API would be reachable from other hosts; give --token TOKEN, or --insecure-remote if that is meant",
            args.listen
        ))
        .into());
    }
    let scenario = match &args.config {
        Some(path) if path.extension().is_some_and(|e| e == "json") => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("could not read {}", path.display()))?;
            let inputs: Vec<api::registry::ProxyInput> =
                serde_json::from_str(&text).map_err(|e| {
                    UsageError(format!(
                        "{}:{}:{}: {e}",
                        path.display(),
                        e.line(),
                        e.column()
                    ))
                })?;
            Some(Err(inputs))
        }
        Some(path) => Some(Ok(fault::file::load(path)?)),
        None => None,
    };
    let file_seed = match &scenario {
        Some(Ok(s)) => s.seed,
        _ => None,
    };
    let seed = args.seed.or(file_seed).unwrap_or_else(|| {
        let seed = seed::fresh();
        say!("seed {seed} (pass --seed {seed} to repeat this run's random choices)");
        seed
    });
    let file_capture = match &scenario {
        Some(Ok(s)) => s.capture.clone(),
        _ => None,
    };
    let evidence = Evidence::open(&args.evidence, file_capture)?;
    let context = evidence.context(seed, &args.run)?;
    let listener = proxy::socket::bind(args.listen)
        .with_context(|| format!("control API: could not bind {}", args.listen))?;
    let metrics = api::Metrics {
        proxy: args.proxy_metrics,
        runtime: args.runtime_metrics,
    };
    let settings = api::Settings {
        token: args.token.clone(),
        metrics,
        files: Some(args.files_dir.clone()),
        header_timeout: args.header_timeout,
        generator: args.generator,
    };
    let api = api::Api::new(context, settings, shutdown.clone());
    match scenario {
        Some(Err(inputs)) => api.populate(inputs).await.context("config")?,
        Some(Ok(scenario)) => api.load(&scenario, &shutdown).await.context("config")?,
        None => {}
    }
    say!(
        "control API on http://{} (Toxiproxy v2 compatible, version {})",
        listener.local_addr()?,
        api::VERSION
    );
    api::serve(listener, api, shutdown).await?;
    evidence.close()
}

/// `snag proxy`: the proxies of the flags or of a fault file, until `shutdown`.
pub async fn run(args: ProxyArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let scenario = match &args.file {
        Some(path) => fault::file::load(path)?,
        None => Scenario {
            seed: None,
            capture: None,
            proxies: vec![ProxySpec {
                config: args.config()?,
                timeline: Vec::new(),
            }],
        },
    };
    let seed = args.seed.or(scenario.seed).unwrap_or_else(|| {
        let seed = seed::fresh();
        say!("seed {seed} (pass --seed {seed} to repeat this run's random choices)");
        seed
    });
    let evidence = Evidence::open(&args.evidence, scenario.capture.clone())?;
    let context = evidence.context(seed, &args.run)?;
    let running = proxy::start(&scenario, &context, &shutdown)?;
    if let (Some(spec), Some(first)) = (args.drain, running.first()) {
        let proxy = first.proxy.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(spec.at) => proxy.drain(spec.drain),
                _ = shutdown.wait() => {}
            }
        });
    }
    let width = running
        .iter()
        .map(|r| r.proxy.name.len())
        .max()
        .unwrap_or(0)
        .max(5);
    say!(
        "{:width$}  {:21}  {:21}  faults",
        "proxy",
        "listen",
        "upstream"
    );
    for r in &running {
        let faults: Vec<String> = r.proxy.faults().iter().map(|f| f.name.clone()).collect();
        say!(
            "{:width$}  {:21}  {:21}  {}",
            r.proxy.name,
            r.addr.to_string(),
            r.proxy.upstream(),
            faults.join(", ")
        );
    }
    for r in running.iter().filter(|r| r.probe_addr.is_some()) {
        let at = r.probe_addr.map(|a| a.to_string()).unwrap_or_default();
        say!("{}: health probes on {at}", r.proxy.name);
    }
    let mut stats = std::collections::BTreeMap::new();
    for r in running {
        r.task.await.context("proxy task failed")??;
        stats.insert(r.proxy.name.clone(), r.proxy.counters().snapshot());
    }
    if let Some(path) = &args.stats {
        let text = serde_json::to_string_pretty(&stats).expect("stats serialise");
        std::fs::write(path, text + "\n")
            .with_context(|| format!("could not write {}", path.display()))?;
    }
    evidence.close()
}
