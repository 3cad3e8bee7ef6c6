//! The balancer under test, built-in or a real product, started, stopped, killed
//! and restarted, and its view of each backend.

use super::*;

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
    /// A product snag started from its driver file.
    External(Arc<External>),
    /// A balancer someone else runs.
    Outside,
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
            Lb::Outside => Ok(crate::lab::driver::Outside::require(Feature::Drain)?),
        }
    }

    /// After a drain, takes backend `id` out entirely where the product has such a
    /// state (HAProxy's `maint`); elsewhere the drain already did.
    pub async fn set_maintenance(&self, id: &str) -> anyhow::Result<()> {
        match self {
            Lb::Builtin(_) => Ok(()),
            Lb::External(e) => e.set_maintenance(id).await,
            Lb::Outside => Ok(crate::lab::driver::Outside::require(Feature::Drain)?),
        }
    }

    /// Requests the balancer retried on another server; `None` where the product
    /// does not count them (nginx).
    pub async fn retries(&self) -> Option<u64> {
        match self {
            Lb::Builtin(b) => b.stats()["retries"].as_u64(),
            Lb::External(e) => e.retries().await,
            Lb::Outside => None,
        }
    }

    /// The built-in balancer's own figures, where the case reads them.
    pub fn builtin(&self) -> Option<&Arc<Balancer>> {
        match self {
            Lb::Builtin(b) => Some(b),
            Lb::External(_) | Lb::Outside => None,
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
                    why: format!("{} reported {}", external.driver.name, s.to),
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

    /// Starts the reference balancer over the parts: data to each interposer's data
    /// listener, health checks to its probe listener.
    pub async fn balancer(
        &mut self,
        tune: impl FnOnce(&mut balancer::Config),
    ) -> anyhow::Result<(SocketAddr, Lb)> {
        let mut config = self.balancer_config();
        tune(&mut config);
        self.product.check(&config)?;
        let driver = match &self.product {
            Product::Builtin => None,
            Product::File(driver) => Some(driver.clone()),
            Product::External(outside) => {
                let outside = outside.clone();
                let addr = self.await_outside(&outside, &config).await?;
                return Ok((addr, Lb::Outside));
            }
        };
        let Some(driver) = driver else {
            let listener = self.ports.listener()?;
            let (addr, balancer) = self.serve_balancer(listener, |c| *c = config)?;
            return Ok((addr, Lb::Builtin(balancer)));
        };
        let dir = std::env::temp_dir().join(format!(
            "snag-{}-{}-{}-{}",
            std::process::id(),
            self.case.name,
            self.product,
            self.t0.elapsed().as_nanos()
        ));
        let external = External::start(
            driver,
            &config,
            &dir,
            None,
            &self.ports,
            self.shutdown.child(),
        )
        .await?;
        self.externals.push(external.clone());
        Ok((external.addr, Lb::External(external)))
    }

    /// Tells the person running the case where to point their balancer and how the
    /// case configures it, then waits until a request to its URL reaches one of this
    /// case's interposers.
    async fn await_outside(
        &mut self,
        outside: &crate::lab::driver::Outside,
        config: &balancer::Config,
    ) -> anyhow::Result<SocketAddr> {
        let addr = outside.addr().await?;
        let width = self
            .parts
            .iter()
            .map(|p| p.name.len())
            .max()
            .unwrap_or(0)
            .max(7);
        let mut text = format!(
            "{}: point your balancer at these backends, then serve {} on {}\n  {:width$}  {:21}  {}\n",
            self.case.name,
            crate::lab::driver::strategy_name(config.strategy),
            outside.url,
            "backend",
            "data",
            "health checks (probe listener)"
        );
        for p in &self.parts {
            text += &format!(
                "  {:width$}  {:21}  {}\n",
                p.name,
                p.data.to_string(),
                p.probe
            );
        }
        text += &format!(
            "  checks: {}; passive marking: {}; retries {}; response timeout {} ms\n",
            config
                .health
                .as_ref()
                .map_or("off".to_string(), |h| format!(
                    "{} every {} ms, timeout {} ms, rise {}, fall {}",
                    if h.path.is_empty() {
                        "connect"
                    } else {
                        &h.path
                    },
                    h.interval.as_millis(),
                    h.timeout.as_millis(),
                    h.rise,
                    h.fall
                )),
            if config.max_fails == 0 {
                "off".to_string()
            } else {
                format!(
                    "{} failures in {} ms",
                    config.max_fails,
                    config.fail_timeout.as_millis()
                )
            },
            config.retries,
            config.timeout.as_millis()
        );
        text += &format!(
            "waiting up to {} s for {} to answer from them …",
            outside.wait.as_secs(),
            outside.url
        );
        (outside.announce)(&text);
        // The health path, which the interposers count as a probe: the case's data
        // accounting does not see the wait.
        async fn probes(parts: &[Part]) -> anyhow::Result<u64> {
            let stats = Part::stats_of(parts).await?;
            Ok(stats
                .iter()
                .map(|s| s.requests.get("probe").copied().unwrap_or(0))
                .sum())
        }
        let health = format!("http://{addr}/health");
        let deadline = Instant::now() + outside.wait;
        loop {
            let before = probes(&self.parts).await?;
            let answer = crate::lab::driver::http("GET", &health, "").await;
            if matches!(answer, Ok((200, _))) && probes(&self.parts).await? > before {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline && !self.shutdown.is_triggered(),
                "no request to {health} reached this case's backends within {} s (last: {})",
                outside.wait.as_secs(),
                match answer {
                    Ok((status, _)) => format!("answered {status} from elsewhere"),
                    Err(e) => format!("{e:#}"),
                }
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.note(format!(
            "the balancer under test ran outside snag at {}: its configuration is its operator's",
            outside.url
        ));
        Ok(addr)
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
        let mut config = balancer::Config::new(backends, self.seed);
        config.protocol = self.protocol;
        config.backend_ca = self.tls.as_ref().map(|t| t.2.clone());
        config
    }

    /// For h2, the run's certificate, key and CA, made once per bench.
    pub(super) fn run_tls(
        &mut self,
    ) -> anyhow::Result<Option<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)>> {
        if self.protocol != BackendProtocol::H2 {
            return Ok(None);
        }
        if self.tls.is_none() {
            let dir = std::env::temp_dir().join(format!(
                "snag-{}-{}-tls-{}",
                std::process::id(),
                self.case.name,
                self.t0.elapsed().as_nanos()
            ));
            std::fs::create_dir_all(&dir)?;
            let (cert, key, ca) = crate::tls::Identity::generate_files(&dir)?;
            self.tls = Some(RunTls(cert, key, ca));
        }
        Ok(self
            .tls
            .as_ref()
            .map(|t| (t.0.clone(), t.1.clone(), t.2.clone())))
    }

    fn serve_balancer(
        &mut self,
        listener: TcpListener,
        tune: impl FnOnce(&mut balancer::Config),
    ) -> anyhow::Result<(SocketAddr, Arc<Balancer>)> {
        let mut config = self.balancer_config();
        tune(&mut config);
        let addr = listener.local_addr()?;
        let balancer = Balancer::new(config).map_err(anyhow::Error::msg)?;
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
        self.product.require(Feature::Restart)?;
        if let Some(old) = self.externals.last().cloned() {
            let dir = std::env::temp_dir().join(format!(
                "snag-{}-{}-{}-again-{}",
                std::process::id(),
                self.case.name,
                self.product,
                self.t0.elapsed().as_nanos()
            ));
            let ports = self.ports.clone();
            return Ok(tokio::spawn(async move {
                tokio::time::sleep_until(kill).await;
                old.kill_now().await;
                tokio::time::sleep_until(back).await;
                let config = old.config().clone();
                let again = External::start(
                    old.driver.clone(),
                    &config,
                    &dir,
                    Some(old.addr),
                    &ports,
                    token,
                )
                .await?;
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
            let balancer = Balancer::new(config).map_err(anyhow::Error::msg)?;
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
        self.report.events.push(Event::new(
            EventKind::Action,
            at_s,
            "balancer started again",
        ));
        at_s
    }
}
