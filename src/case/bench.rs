//! The bench a case runs on: it starts the parts, keeps the evidence, and stops
//! everything it started when the case ends.

use std::{
    io::IsTerminal,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use tokio::{net::TcpListener, time::Instant};

use super::Case;
use crate::{
    fault::{
        ProbeRules,
        file::{Action, ProxySpec, Scenario},
    },
    lab::{
        backend::{self, Backend},
        balancer::{self, BackendSpec, Balancer},
        driver::{External, Product, Unsupported},
        load::{self, Plan, Target},
    },
    proxy::{Mode, Options, Proxy},
    report::{CaseReport, Check, Event, Run, Verdict},
    shutdown::Shutdown,
};

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
struct Sample {
    at_s: f64,
    data: Vec<u64>,
}

/// A running balancer, which a case may stop and start again.
#[derive(Debug)]
pub struct BalancerHandle {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its state.
    pub balancer: Arc<Balancer>,
    /// Seconds into the case when it started.
    pub started_s: f64,
    stop: Shutdown,
}

/// The parts and evidence of one case.
pub struct Bench {
    case: &'static Case,
    /// Whether the case runs shortened.
    pub quick: bool,
    /// Seed of every random choice.
    pub seed: u64,
    shutdown: Shutdown,
    t0: Instant,
    report: CaseReport,
    parts: Vec<Part>,
    balancers: Vec<BalancerHandle>,
    externals: Vec<Arc<External>>,
    product: Product,
    samples: Arc<Mutex<Vec<Sample>>>,
    parts_s: f64,
    /// CPU times when the case began, to tell what other programs took.
    host: Option<crate::host::Mark>,
}

/// A balancer started again by [`Bench::kill_and_restart`].
#[derive(Debug)]
pub enum Restarted {
    /// The built-in one.
    Builtin(BalancerHandle),
    /// HAProxy or nginx, and when it listened again (case seconds).
    External(Arc<External>, f64),
}

/// The balancer under test, whichever it is.
#[derive(Debug, Clone)]
pub enum Lb {
    /// snag's reference balancer, in process.
    Builtin(Arc<Balancer>),
    /// HAProxy or nginx.
    External(Arc<External>),
}

impl Lb {
    /// Takes backend `id` out of rotation, or puts it back, the product's way.
    pub async fn set_draining(&self, id: &str, draining: bool) -> anyhow::Result<()> {
        match self {
            Lb::Builtin(b) => {
                anyhow::ensure!(b.set_draining(id, draining), "no backend {id:?}");
                Ok(())
            }
            Lb::External(e) => e.set_draining(id, draining).await,
        }
    }

    /// After a drain, takes backend `id` out entirely where the product has such a
    /// state (HAProxy's `maint`); elsewhere the drain already did.
    pub async fn set_maintenance(&self, id: &str) -> anyhow::Result<()> {
        match self {
            Lb::Builtin(_) => Ok(()),
            Lb::External(e) => e.set_maintenance(id).await,
        }
    }

    /// Requests the balancer retried on another server; `None` where the product
    /// does not count them (nginx).
    pub async fn retries(&self) -> Option<u64> {
        match self {
            Lb::Builtin(b) => b.stats()["retries"].as_u64(),
            Lb::External(e) => e.retries().await,
        }
    }

    /// The built-in balancer's own figures, where the case reads them.
    pub fn builtin(&self) -> Option<&Arc<Balancer>> {
        match self {
            Lb::Builtin(b) => Some(b),
            Lb::External(_) => None,
        }
    }
}

/// A change of a backend's state, as the balancer logged it.
#[derive(Debug, Clone)]
pub struct Transition {
    /// Seconds into the case.
    pub at_s: f64,
    /// The state it left.
    pub from: String,
    /// The state it entered.
    pub to: String,
    /// Why.
    pub why: String,
}

impl Bench {
    /// A bench for `case`; `shutdown` stops it from outside (Ctrl-C).
    pub fn new(
        case: &'static Case,
        product: Product,
        seed: u64,
        quick: bool,
        shutdown: Shutdown,
    ) -> Bench {
        Bench {
            case,
            quick,
            seed,
            t0: Instant::now(),
            report: CaseReport {
                name: case.name.into(),
                source: case.source.into(),
                property: case.property.into(),
                reference: case.reference.into(),
                verdict: Verdict::Pass,
                checks: Vec::new(),
                figures: Vec::new(),
                notes: Vec::new(),
                events: Vec::new(),
                shares: Vec::new(),
                runs: Vec::new(),
                interposers: serde_json::Value::Null,
                balancer: serde_json::Value::Null,
                elapsed_s: 0.0,
                seed,
                balancer_under_test: product.name().into(),
                host: None,
            },
            shutdown,
            parts: Vec::new(),
            balancers: Vec::new(),
            externals: Vec::new(),
            product,
            samples: Arc::default(),
            parts_s: 0.0,
            host: crate::host::Mark::now(),
        }
    }

    /// Seconds into the case of offset `at` (full-length seconds) on the fault
    /// file's timeline.
    pub fn timeline_s(&self, at: f64) -> f64 {
        self.parts_s + self.secs(at).as_secs_f64()
    }

    /// Backend `name`'s state changes, as the latest balancer logged them.
    pub fn transitions(&self, name: &str) -> Vec<Transition> {
        if let Some(external) = self.externals.last() {
            return external
                .seen()
                .into_iter()
                .filter(|s| s.id == name)
                .map(|s| Transition {
                    at_s: s.at.saturating_duration_since(self.t0).as_secs_f64(),
                    from: state_word(&s.from),
                    to: state_word(&s.to),
                    why: format!("{} reported {}", external.product, s.to),
                })
                .collect();
        }
        let Some(handle) = self.balancers.last() else {
            return Vec::new();
        };
        let stats = handle.balancer.stats();
        stats["backends"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["id"] == name)
            .flat_map(|b| b["transitions"].as_array().cloned().unwrap_or_default())
            .map(|t| Transition {
                at_s: handle.started_s + t["at_ms"].as_f64().unwrap_or(0.0) / 1000.0,
                from: t["from"].as_str().unwrap_or_default().into(),
                to: t["to"].as_str().unwrap_or_default().into(),
                why: t["why"].as_str().unwrap_or_default().into(),
            })
            .collect()
    }

    /// A bench for one run within this case, on fresh parts, stopped with it.
    pub fn sub(&self) -> Bench {
        Bench::new(
            self.case,
            self.product,
            self.seed,
            self.quick,
            self.shutdown.child(),
        )
    }

    /// Ends `sub` and keeps its runs and events, on this case's clock.
    pub async fn absorb(&mut self, sub: Bench) {
        let offset = sub.t0.saturating_duration_since(self.t0).as_secs_f64();
        let report = sub.finish(Ok(())).await;
        for mut run in report.runs {
            run.started_s += offset;
            self.report.runs.push(run);
        }
        for mut event in report.events {
            event.at_s += offset;
            self.report.events.push(event);
        }
        self.report.checks.extend(report.checks);
        self.report.notes.extend(report.notes);
        if self.report.balancer.is_null() {
            self.report.balancer = report.balancer;
        }
    }

    /// The balancer under test.
    pub fn product(&self) -> Product {
        self.product
    }

    /// `seconds` of the full case, shortened by `--quick`.
    pub fn secs(&self, seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds * if self.quick { self.case.quick } else { 1.0 })
    }

    /// Seconds since the case started.
    pub fn now_s(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

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
            .find(|p| !ids.contains(&p.name.as_str()))
        {
            anyhow::bail!(
                "the case file names a proxy {:?} the case has no backend for",
                stray.name
            );
        }
        let mut backends = Vec::new();
        for id in ids {
            let mut config = backend::Config::new(id);
            tune(id, &mut config);
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let backend = Backend::new(config);
            tokio::spawn(backend::serve(
                listener,
                backend.clone(),
                self.shutdown.clone(),
            ));
            backends.push((id.to_string(), addr, backend));
        }
        let scale = if self.quick { self.case.quick } else { 1.0 };
        let mut scenario = Scenario {
            seed: None,
            proxies: Vec::new(),
            capture: None,
        };
        for (id, addr, _) in &backends {
            let mut spec = file
                .proxies
                .iter()
                .find(|p| &p.name == id)
                .cloned()
                .unwrap_or_else(|| ProxySpec {
                    name: id.clone(),
                    listen: "127.0.0.1:0".parse().expect("valid"),
                    upstream: String::new(),
                    faults: Vec::new(),
                    timeline: Vec::new(),
                    mode: Mode::Http,
                    probe: ProbeRules::default(),
                    probe_listen: None,
                    id_headers: None,
                    instance: None,
                });
            spec.upstream = addr.to_string();
            spec.listen = "127.0.0.1:0".parse().expect("valid");
            spec.probe_listen = Some("127.0.0.1:0".parse().expect("valid"));
            spec.mode = Mode::Http;
            spec.instance = Some(id.clone());
            for change in &mut spec.timeline {
                change.at = change.at.mul_f64(scale);
                let what = match &change.action {
                    Action::Add(f) => format!("{id}: add {} ({})", describe(f), scope(f)),
                    Action::Remove(name) => format!("{id}: remove {name}"),
                    Action::Drain(d) => format!("{id}: drain ({:?})", d.mode),
                    Action::Undrain => format!("{id}: undrain"),
                };
                self.report.events.push(Event {
                    at_s: self.now_s() + change.at.as_secs_f64(),
                    what,
                });
            }
            for f in &spec.faults {
                self.report.events.push(Event {
                    at_s: self.now_s(),
                    what: format!("{id}: {} ({}) from the start", describe(f), scope(f)),
                });
            }
            scenario.proxies.push(spec);
        }
        let options = Options::default();
        self.parts_s = self.now_s();
        let running = crate::proxy::start(&scenario, self.seed, &options, &self.shutdown)?;
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

    /// Starts the reference balancer over the parts: data to each interposer's data
    /// listener, health checks to its probe listener.
    pub async fn balancer(
        &mut self,
        tune: impl FnOnce(&mut balancer::Config),
    ) -> anyhow::Result<(SocketAddr, Lb)> {
        let mut config = self.balancer_config();
        tune(&mut config);
        if self.product == Product::Builtin {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let (addr, balancer) = self.serve_balancer(listener, |c| *c = config)?;
            return Ok((addr, Lb::Builtin(balancer)));
        }
        let dir = std::env::temp_dir().join(format!(
            "snag-{}-{}-{}-{}",
            std::process::id(),
            self.case.name,
            self.product,
            self.t0.elapsed().as_nanos()
        ));
        let external =
            External::start(self.product, &config, &dir, None, self.shutdown.child()).await?;
        self.externals.push(external.clone());
        Ok((external.addr, Lb::External(external)))
    }

    /// The balancer over the parts, before a case tunes it.
    fn balancer_config(&self) -> balancer::Config {
        let backends = self
            .parts
            .iter()
            .map(|p| BackendSpec {
                id: p.name.clone(),
                addr: p.data,
                weight: 1,
                check: Some(p.probe),
            })
            .collect();
        balancer::Config::new(backends, self.seed)
    }

    fn serve_balancer(
        &mut self,
        listener: TcpListener,
        tune: impl FnOnce(&mut balancer::Config),
    ) -> anyhow::Result<(SocketAddr, Arc<Balancer>)> {
        let mut config = self.balancer_config();
        tune(&mut config);
        let addr = listener.local_addr()?;
        let balancer = Balancer::new(config);
        let stop = self.shutdown.child();
        tokio::spawn(balancer::serve(listener, balancer.clone(), stop.clone()));
        self.balancers.push(BalancerHandle {
            addr,
            balancer: balancer.clone(),
            started_s: self.now_s(),
            stop,
        });
        Ok((addr, balancer))
    }

    /// Kills the balancer at `kill_s` (case seconds) as if its node died — the
    /// built-in one loses its listener and every client connection, HAProxy and nginx
    /// get SIGKILL — and starts the same configuration again on the same address at
    /// `back_s`, beside whatever the case does meanwhile. Await the handle, then give
    /// its result to [`Bench::adopt`].
    pub fn kill_and_restart(
        &self,
        kill_s: f64,
        back_s: f64,
    ) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<Restarted>>> {
        let (kill, back, token, t0) = (
            self.instant(kill_s),
            self.instant(back_s),
            self.shutdown.child(),
            self.t0,
        );
        if let Some(old) = self.externals.last().cloned() {
            let dir = std::env::temp_dir().join(format!(
                "snag-{}-{}-{}-again-{}",
                std::process::id(),
                self.case.name,
                self.product,
                self.t0.elapsed().as_nanos()
            ));
            return Ok(tokio::spawn(async move {
                tokio::time::sleep_until(kill).await;
                old.kill_now().await;
                tokio::time::sleep_until(back).await;
                let config = old.config().clone();
                let again =
                    External::start(old.product, &config, &dir, Some(old.addr), token).await?;
                Ok(Restarted::External(again, t0.elapsed().as_secs_f64()))
            }));
        }
        let old = self.balancers.last().context("no balancer to kill")?;
        let (addr, stop, config) = (old.addr, old.stop.clone(), old.balancer.config().clone());
        Ok(tokio::spawn(async move {
            tokio::time::sleep_until(kill).await;
            stop.trigger();
            tokio::time::sleep_until(back).await;
            // The old listener closes as its task ends: try for a second.
            let deadline = Instant::now() + Duration::from_secs(1);
            let listener = loop {
                match TcpListener::bind(addr).await {
                    Ok(listener) => break listener,
                    Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    Err(err) => {
                        return Err(err).with_context(|| format!("could not bind {addr} again"));
                    }
                }
            };
            let balancer = Balancer::new(config);
            tokio::spawn(balancer::serve(listener, balancer.clone(), token.clone()));
            Ok(Restarted::Builtin(BalancerHandle {
                addr,
                balancer,
                started_s: t0.elapsed().as_secs_f64(),
                stop: token,
            }))
        }))
    }

    /// Takes a balancer started outside the bench into its evidence; when it started.
    pub fn adopt(&mut self, restarted: Restarted) -> f64 {
        let at_s = match restarted {
            Restarted::Builtin(handle) => {
                let at_s = handle.started_s;
                self.balancers.push(handle);
                at_s
            }
            Restarted::External(external, at_s) => {
                self.externals.push(external);
                at_s
            }
        };
        self.report.events.push(Event {
            at_s,
            what: "balancer started again".into(),
        });
        at_s
    }

    /// A plan against `addr` with the case's seed and a 2 s deadline, so that no
    /// request outlives the case.
    pub fn plan(&self, addr: SocketAddr, path: &str) -> Plan {
        let mut plan = Plan::new(Target {
            addr,
            host: addr.to_string(),
            path: path.into(),
        });
        plan.seed = self.seed;
        plan.deadline = Some(Duration::from_secs(2));
        plan
    }

    /// Runs the generator, printing progress once a second, and keeps its report.
    pub async fn load(&mut self, label: &str, plan: Plan) -> load::Report {
        let started_s = self.now_s();
        let tty = std::io::stderr().is_terminal();
        let (name, total) = (self.case.name, plan.watch.max(plan.duration).as_secs_f64());
        let (mut sent, mut ok, mut errors) = (0, 0, 0);
        let report = load::run(plan, self.shutdown.clone(), |row| {
            sent += row.sent;
            ok += row.ok;
            errors += row.errors.values().sum::<u64>();
            let line = format!(
                "{name} · {label}: {:>3} of {total:.0} s, sent {sent}, ok {ok}, errors {errors}",
                (row.second + 1).min(total.ceil() as usize)
            );
            if tty {
                eprint!("\r{line:<78}");
            } else {
                eprintln!("{line}");
            }
        })
        .await;
        if tty {
            eprint!("\r{:78}\r", "");
        }
        self.report.runs.push(Run {
            label: label.into(),
            started_s,
            load: report.clone(),
        });
        report
    }

    /// Runs several plans at once (progress shows the first) and keeps their reports.
    pub async fn loads(&mut self, plans: Vec<(String, Plan)>) -> Vec<load::Report> {
        let started_s = self.now_s();
        let shutdown = self.shutdown.clone();
        let runs = plans
            .iter()
            .map(|(_, plan)| load::run(plan.clone(), shutdown.clone(), |_| {}));
        let reports = futures_join(runs.collect()).await;
        for ((label, _), report) in plans.iter().zip(&reports) {
            self.report.runs.push(Run {
                label: label.clone(),
                started_s,
                load: report.clone(),
            });
        }
        reports
    }

    /// The instant `at_s` seconds into the case, for parts a case drives on its own.
    pub fn instant(&self, at_s: f64) -> Instant {
        self.t0 + Duration::from_secs_f64(at_s.max(0.0))
    }

    /// Records an assertion of the property.
    pub fn check(&mut self, what: impl Into<String>, passed: bool, detail: impl Into<String>) {
        self.report.checks.push(Check {
            what: what.into(),
            passed,
            detail: detail.into(),
        });
    }

    /// Records a figure: a label and a value with its unit.
    pub fn figure(&mut self, label: impl Into<String>, value: impl Into<String>) {
        self.report.figures.push((label.into(), value.into()));
    }

    /// Records something a reader should know.
    pub fn note(&mut self, note: impl Into<String>) {
        self.report.notes.push(note.into());
    }

    /// Records an event at `at_s` seconds into the case.
    pub fn report_event(&mut self, at_s: f64, what: impl Into<String>) {
        self.report.events.push(Event {
            at_s,
            what: what.into(),
        });
    }

    /// Records an event now.
    pub fn event(&mut self, what: impl Into<String>) {
        let at_s = self.now_s();
        self.report.events.push(Event {
            at_s,
            what: what.into(),
        });
    }

    /// Ends the case: gathers the balancer's transitions and the interposers'
    /// accounting, decides the verdict, and stops every part.
    pub async fn finish(mut self, result: anyhow::Result<()>) -> CaseReport {
        for external in &self.externals {
            external.stop().await;
        }
        for external in &self.externals {
            for (at, line) in external.logged() {
                self.report.events.push(Event {
                    at_s: at.saturating_duration_since(self.t0).as_secs_f64(),
                    what: format!("{} log: {line}", external.product),
                });
            }
            external.clean();
        }
        if let Err(err) = result {
            if let Some(unsupported) = err.downcast_ref::<Unsupported>() {
                self.report.verdict = Verdict::Unsupported;
                self.report.notes.push(unsupported.to_string());
            } else {
                self.report.verdict = Verdict::Error;
                self.report
                    .notes
                    .push(format!("the case could not run: {err:#}"));
            }
        } else if self.shutdown.is_triggered() {
            self.report.verdict = Verdict::Error;
            self.report.notes.push("interrupted".into());
        }
        for handle in &self.balancers {
            let stats = handle.balancer.stats();
            for b in stats["backends"].as_array().into_iter().flatten() {
                for t in b["transitions"].as_array().into_iter().flatten() {
                    self.report.events.push(Event {
                        at_s: handle.started_s + t["at_ms"].as_f64().unwrap_or(0.0) / 1000.0,
                        what: format!(
                            "balancer: {} {} → {} ({})",
                            b["id"].as_str().unwrap_or("?"),
                            t["from"].as_str().unwrap_or("?"),
                            t["to"].as_str().unwrap_or("?"),
                            t["why"].as_str().unwrap_or("")
                        ),
                    });
                }
            }
            self.report.balancer = stats;
        }
        for external in &self.externals {
            for seen in external.seen() {
                self.report.events.push(Event {
                    at_s: seen.at.saturating_duration_since(self.t0).as_secs_f64(),
                    what: format!(
                        "{}: {} {} → {}",
                        external.product, seen.id, seen.from, seen.to
                    ),
                });
            }
        }
        self.report.events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        let mut shares: Vec<(String, u64)> = Vec::new();
        for run in &self.report.runs {
            for s in &run.load.backends {
                match shares.iter_mut().find(|(n, _)| *n == s.name) {
                    Some((_, n)) => *n += s.by_backend.max(s.by_instance),
                    None => shares.push((s.name.clone(), s.by_backend.max(s.by_instance))),
                }
            }
        }
        shares.retain(|(n, _)| n != "none");
        shares.sort();
        let total: u64 = shares.iter().map(|(_, n)| n).sum();
        self.report.shares = shares
            .into_iter()
            .map(|(n, c)| (n, 100.0 * c as f64 / total.max(1) as f64))
            .collect();
        self.report.interposers = self
            .parts
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    serde_json::to_value(p.proxy.counters().snapshot()).unwrap_or_default(),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into();
        if !self.parts.is_empty() {
            let stats: Vec<_> = self
                .parts
                .iter()
                .map(|p| p.proxy.counters().snapshot())
                .collect();
            let opened: u64 = stats.iter().map(|s| s.connections).sum();
            let peak = stats
                .iter()
                .flat_map(|s| s.new_connections_per_second.iter().copied())
                .max()
                .unwrap_or(0);
            self.report.figures.push((
                "connections".into(),
                format!("{opened} opened to the backends; at most {peak} new in one second at one backend"),
            ));
        }
        self.report.elapsed_s = self.now_s();
        if let (Some(start), Some(end)) = (self.host, crate::host::Mark::now()) {
            self.report.host = Some(start.until(&end));
        }
        self.report.decide();
        self.shutdown.trigger();
        self.report
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

/// Awaits every future, each in its own task so that they run at once.
async fn futures_join<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("a load run does not panic"));
    }
    out
}

/// A product's word for a backend's state, in the built-in balancer's words.
fn state_word(word: &str) -> String {
    match word {
        "UP" => "up".into(),
        "DOWN" => "down".into(),
        "DRAIN" | "NOLB" => "draining".into(),
        other => other.to_lowercase(),
    }
}
