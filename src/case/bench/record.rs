//! What a case records (checks, figures, notes, events) and how it ends: the
//! evidence gathered from every part, the verdict, and every part stopped.

use super::*;

impl Bench {
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

    /// Records something the case did at `at_s` seconds into it.
    pub fn report_event(&mut self, at_s: f64, what: impl Into<String>) {
        self.report
            .events
            .push(Event::new(EventKind::Action, at_s, what));
    }

    /// Records an event of `kind` now.
    pub fn event(&mut self, kind: EventKind, what: impl Into<String>) {
        let at_s = self.now_s();
        self.report.events.push(Event::new(kind, at_s, what));
    }

    /// Ends the case: gathers the balancer's transitions and the interposers'
    /// accounting, decides the verdict, and stops every part.
    pub async fn finish(mut self, result: anyhow::Result<()>) -> CaseReport {
        for external in &self.externals {
            external.stop().await;
        }
        for external in &self.externals {
            self.report.products.push(external.run_record());
            for (at, what) in external.acted() {
                self.report.events.push(Event::new(
                    EventKind::Action,
                    at.saturating_duration_since(self.t0).as_secs_f64(),
                    format!("{}: {what}", external.driver.name),
                ));
            }
            for (at, line) in external.logged() {
                self.report.events.push(Event::new(
                    EventKind::Log,
                    at.saturating_duration_since(self.t0).as_secs_f64(),
                    format!("{} log: {line}", external.driver.name),
                ));
            }
            external.clean();
        }
        self.tls = None;
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
                    let (id, from, to) = (
                        b["id"].as_str().unwrap_or("?"),
                        t["from"].as_str().unwrap_or("?"),
                        t["to"].as_str().unwrap_or("?"),
                    );
                    self.report.events.push(Event::change(
                        handle.started_s + t["at_ms"].as_f64().unwrap_or(0.0) / 1000.0,
                        format!(
                            "balancer: {id} {from} → {to} ({})",
                            t["why"].as_str().unwrap_or("")
                        ),
                        id,
                        from,
                        to,
                    ));
                }
            }
            self.report.balancer = stats;
        }
        for external in &self.externals {
            for seen in external.seen() {
                self.report.events.push(Event::change(
                    seen.at.saturating_duration_since(self.t0).as_secs_f64(),
                    format!(
                        "{}: {} {} → {}",
                        external.driver.name, seen.id, seen.from, seen.to
                    ),
                    &seen.id,
                    &seen.from,
                    &seen.to,
                ));
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
        let mut stats = Vec::new();
        for p in &self.parts {
            match p.stats().await {
                Ok(s) => stats.push((p.name.clone(), s)),
                Err(e) => self
                    .report
                    .notes
                    .push(format!("{}: no interposer stats at the end: {e:#}", p.name)),
            }
        }
        for p in &self.parts {
            if let Interposer::Elsewhere(remote) = &p.proxy {
                let (events, said) = remote.end().await;
                self.report.notes.extend(said);
                self.report
                    .interposer_events
                    .entry(p.name.clone())
                    .or_default()
                    .extend(events);
            }
        }
        self.report.interposers = stats
            .iter()
            .map(|(name, s)| (name.clone(), serde_json::to_value(s).unwrap_or_default()))
            .collect::<serde_json::Map<_, _>>()
            .into();
        if !stats.is_empty() {
            let stats: Vec<_> = stats.into_iter().map(|(_, s)| s).collect();
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
        for p in &self.parts {
            if let Some(lag) = p.backend.overslept().await {
                self.report.backends_overslept.push((p.name.clone(), lag));
            }
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
