//! The load generator's runs within a case, each recorded in the report.

use super::*;

impl Bench {
    /// A plan against `addr` with the case's seed and a 2 s deadline, so that no
    /// request outlives the case.
    pub fn plan(&self, addr: SocketAddr, path: &str) -> Plan {
        let mut plan = Plan::new(Target {
            addr,
            tls: false,
            host: addr.to_string(),
            path: path.into(),
        });
        plan.seed = self.seed;
        plan.deadline = Some(Duration::from_secs(2));
        plan
    }

    /// `gets` as POSTs that carry a transaction id in `x-request-id` (the
    /// interposers count an id seen twice as a duplicate), on their own seed.
    pub fn posts_with_ids(&self, gets: &Plan) -> Plan {
        let mut posts = gets.clone();
        posts.method = hyper::Method::POST;
        posts.body = bytes::Bytes::from_static(b"{\"amount\":1}");
        posts.txn_header = Some("x-request-id".parse().expect("valid"));
        posts.seed = self.seed ^ 1;
        posts
    }

    /// Runs the generator, telling its progress once a second, and keeps its report;
    /// with generators elsewhere, one shard on each, merged.
    pub async fn load(&mut self, label: &str, plan: Plan) -> anyhow::Result<load::Report> {
        let started_s = self.now_s();
        let report = if self.topology.generators.is_empty() {
            self.here(label, plan).await
        } else {
            let sent = self.elsewhere(&plan)?;
            let report = self.watched(label, &plan, sent).await?;
            self.figure(format!("{label}: generators"), hosts(&report));
            report
        };
        self.report.runs.push(Run {
            label: label.into(),
            started_s,
            load: report.clone(),
        });
        Ok(report)
    }

    /// One run of the generator here, its progress told once a second.
    async fn here(&self, label: &str, plan: Plan) -> load::Report {
        let (case, total_s) = (self.case.name, plan.watch.max(plan.duration).as_secs_f64());
        let (mut sent, mut ok, mut errors) = (0, 0, 0);
        let on_progress = self.on_progress.clone();
        let report = load::run(plan, self.shutdown.clone(), |row| {
            sent += row.sent;
            ok += row.ok;
            errors += row.errors.values().sum::<u64>();
            on_progress(Some(&crate::case::Progress {
                case,
                label: label.into(),
                second: (row.second + 1).min(total_s.ceil() as usize),
                total_s,
                sent,
                ok,
                errors,
            }));
        })
        .await
        .report;
        (self.on_progress)(None);
        report
    }

    /// A run on generators elsewhere, merged when each answered its result; its
    /// progress told once a second from what they say of theirs (`GET /load/RUN`).
    async fn watched(&self, label: &str, plan: &Plan, sent: Sent) -> anyhow::Result<load::Report> {
        use crate::lab::load::remote::Progress;
        let (case, total_s) = (self.case.name, plan.watch.max(plan.duration).as_secs_f64());
        let Sent { run, shards, polls } = sent;
        let mut merging = std::pin::pin!(merged(shards));
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let path = format!("/load/{run}");
        let report = loop {
            tokio::select! {
                report = &mut merging => break report,
                _ = tick.tick() => {}
            }
            // The slowest generator's second; the counts of all. One that does
            // not answer within the second (not begun, or over) is left out.
            let asked = polls.iter().map(|client| {
                let (client, path) = (client.clone(), path.clone());
                async move {
                    let call = client.call(hyper::Method::GET, &path, None);
                    tokio::time::timeout(Duration::from_secs(1), call).await
                }
            });
            let mut told: Option<Progress> = None;
            for answer in futures_join(asked.collect()).await {
                let Ok(Ok(value)) = answer else { continue };
                let Ok(p) = serde_json::from_value::<Progress>(value) else {
                    continue;
                };
                let sum = told.get_or_insert(Progress {
                    second: p.second,
                    ..Progress::default()
                });
                sum.second = sum.second.min(p.second);
                sum.sent += p.sent;
                sum.ok += p.ok;
                sum.errors += p.errors;
            }
            if let Some(p) = told.filter(|p| p.second > 0) {
                (self.on_progress)(Some(&crate::case::Progress {
                    case,
                    label: label.into(),
                    second: p.second.min(total_s.ceil() as usize),
                    total_s,
                    sent: p.sent,
                    ok: p.ok,
                    errors: p.errors,
                }));
            }
        };
        (self.on_progress)(None);
        report
    }

    /// Runs several plans at once (progress shows the first) and keeps their reports.
    pub async fn loads(&mut self, plans: Vec<(String, Plan)>) -> anyhow::Result<Vec<load::Report>> {
        let started_s = self.now_s();
        let shutdown = self.shutdown.clone();
        let reports = if self.topology.generators.is_empty() {
            let runs = plans.iter().map(|(_, plan)| {
                let (plan, shutdown) = (plan.clone(), shutdown.clone());
                async move { load::run(plan, shutdown, |_| {}).await.report }
            });
            futures_join(runs.collect()).await
        } else {
            // Every plan's shards sent before any is waited for: they run at once.
            let mut runs = Vec::new();
            for (_, plan) in &plans {
                runs.push(self.elsewhere(plan)?);
            }
            let mut reports = Vec::new();
            for (i, (sent, (label, plan))) in runs.into_iter().zip(&plans).enumerate() {
                let report = if i == 0 {
                    self.watched(label, plan, sent).await?
                } else {
                    merged(sent.shards).await?
                };
                self.figure(format!("{label}: generators"), hosts(&report));
                reports.push(report);
            }
            reports
        };
        for ((label, _), report) in plans.iter().zip(&reports) {
            self.report.runs.push(Run {
                label: label.clone(),
                started_s,
                load: report.clone(),
            });
        }
        Ok(reports)
    }

    /// Sends `plan` as one shard to each generator elsewhere, to begin together a
    /// second from now: a task per generator, ending with its shard's result.
    fn elsewhere(&self, plan: &Plan) -> anyhow::Result<Sent> {
        use crate::lab::load::remote::{PlanWire, ShardRequest, unix_ms};
        let wire = PlanWire::try_from(plan).map_err(|why| Unsupported {
            product: "this topology".into(),
            why,
        })?;
        let generators = &self.topology.generators;
        let count = generators.len() as u64;
        let start_at_ms = unix_ms(std::time::SystemTime::now()) + 1000;
        let run = format!("{}-{:016x}", self.case.name, rand::random::<u64>());
        let (mut shards, mut polls) = (Vec::new(), Vec::new());
        for ((name, g), index) in generators.iter().zip(0..) {
            let request = ShardRequest {
                plan: wire.clone(),
                shard: load::Shard { index, count },
                start_at_ms,
                host: Some(name.clone()),
                run: Some(run.clone()),
            };
            let body = serde_json::to_value(&request)?;
            let client = crate::api::client::Client::new(g.api, g.token.clone());
            // Its own connection: the shard's holds its one call for the whole run.
            polls.push(Arc::new(crate::api::client::Client::new(
                g.api,
                g.token.clone(),
            )));
            let what = format!("generator {name} at {}", g.api);
            shards.push(tokio::spawn(async move {
                let value = client
                    .call(hyper::Method::POST, "/load", Some(body))
                    .await
                    .with_context(|| what.clone())?;
                serde_json::from_value::<load::ShardResult>(value)
                    .with_context(|| format!("{what}: not a shard result"))
            }));
        }
        Ok(Sent { run, shards, polls })
    }

    /// The instant `at_s` seconds into the case, for parts a case drives on its own.
    pub fn instant(&self, at_s: f64) -> Instant {
        self.t0 + Duration::from_secs_f64(at_s.max(0.0))
    }
}

/// A shard sent to a generator elsewhere: its result when the run is over.
type Shard = tokio::task::JoinHandle<anyhow::Result<load::ShardResult>>;

/// A plan sent to the generators elsewhere: the name they know its run by, a
/// shard on each, and a client for each to ask how far it has got.
struct Sent {
    run: String,
    shards: Vec<Shard>,
    polls: Vec<Arc<crate::api::client::Client>>,
}

/// The report one generator would have made, from every shard's result.
async fn merged(shards: Vec<Shard>) -> anyhow::Result<load::Report> {
    let mut results = Vec::new();
    for shard in shards {
        results.push(shard.await.context("a shard's task")??);
    }
    load::merge(results).map_err(anyhow::Error::msg)
}

/// What each generator of a merged run did, and how far apart they began.
fn hosts(r: &load::Report) -> String {
    let each: Vec<String> = r
        .hosts
        .iter()
        .map(|h| format!("{} {} ok, {} errors", h.host, h.ok, h.errors))
        .collect();
    let spread = r
        .hosts
        .iter()
        .map(|h| h.started_after_ms)
        .max()
        .unwrap_or(0);
    format!("{}; began within {spread} ms", each.join("; "))
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
