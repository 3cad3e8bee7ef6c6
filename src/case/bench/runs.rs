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

    /// Runs the generator, telling its progress once a second, and keeps its report.
    pub async fn load(&mut self, label: &str, plan: Plan) -> load::Report {
        let started_s = self.now_s();
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
        let runs = plans.iter().map(|(_, plan)| {
            let (plan, shutdown) = (plan.clone(), shutdown.clone());
            async move { load::run(plan, shutdown, |_| {}).await.report }
        });
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
