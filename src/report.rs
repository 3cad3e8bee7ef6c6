//! What a case showed, for people and machines: a terminal table per case and a
//! summary, JSON per case, and one self-contained HTML page with inline SVG charts.
//! Every figure here was put in by a case from measured evidence.

mod html;

use std::{fmt::Write as _, path::Path};

pub(crate) use self::html::check_rows;
pub use self::html::{CHARTS_DRAWN, html};

use serde::Serialize;

use crate::lab::load;

/// Whether the property under test held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Every check held.
    Pass,
    /// A check failed, and the generator did not.
    Fail,
    /// A check failed while the generator itself failed (ports, descriptors,
    /// overload): the run says nothing about the service.
    GeneratorFailed,
    /// A check failed while the host was too busy to judge it (evidence in
    /// `host_evidence`: other programs took the CPU, or the generator fell behind its
    /// schedule): the run cannot tell the balancer's doing from the machine's.
    HostBusy,
    /// The case could not run.
    Error,
    /// The balancer under test lacks what the case needs (or snag does not drive it
    /// there yet); the note says which.
    Unsupported,
}

impl Verdict {
    /// The word in tables.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::GeneratorFailed => "GENERATOR",
            Verdict::HostBusy => "HOST",
            Verdict::Error => "ERROR",
            Verdict::Unsupported => "N/A",
        }
    }

    /// The HTML class: its JSON name.
    fn class(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::GeneratorFailed => "generator-failed",
            Verdict::HostBusy => "host-busy",
            Verdict::Error => "error",
            Verdict::Unsupported => "unsupported",
        }
    }
}

/// One assertion of the property, from evidence.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What must hold.
    pub what: String,
    /// Whether it did.
    pub passed: bool,
    /// The figures it was decided on.
    pub detail: String,
}

/// Something that happened during the case, at seconds from its start.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Seconds since the case started.
    pub at_s: f64,
    /// What.
    pub what: String,
    /// Whose doing it was, so that a chart tells them apart.
    pub kind: EventKind,
    /// A balancer's view of one backend that changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change: Option<Change>,
}

/// Whose doing an event was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// A fault put on or taken off, on an interposer or a backend.
    Fault,
    /// The balancer's own view of a backend changed.
    Balancer,
    /// Something the case did to a part: a drain, a kill, a restart, a spike.
    Action,
    /// A line of a product's own log.
    Log,
}

/// One backend's state in the balancer's view, before and after.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// The backend's id.
    pub backend: String,
    /// In the built-in balancer's words: up, down, draining …
    pub from: String,
    /// See `from`.
    pub to: String,
}

impl EventKind {
    /// Its name, as in the JSON.
    pub fn word(self) -> &'static str {
        match self {
            EventKind::Fault => "fault",
            EventKind::Balancer => "balancer",
            EventKind::Action => "action",
            EventKind::Log => "log",
        }
    }
}

impl Event {
    /// An event of `kind`.
    pub fn new(kind: EventKind, at_s: f64, what: impl Into<String>) -> Event {
        Event {
            at_s,
            what: what.into(),
            kind,
            change: None,
        }
    }

    /// The balancer's view of `backend` went from `from` to `to` (its own words,
    /// kept in `what`).
    pub fn change(at_s: f64, what: String, backend: &str, from: &str, to: &str) -> Event {
        Event {
            at_s,
            what,
            kind: EventKind::Balancer,
            change: Some(Change {
                backend: backend.into(),
                from: state_word(from),
                to: state_word(to),
            }),
        }
    }
}

/// A product's word for a backend's state, in the built-in balancer's words.
pub fn state_word(word: &str) -> String {
    match word {
        "UP" => "up".into(),
        "DOWN" => "down".into(),
        "DRAIN" | "NOLB" => "draining".into(),
        other => other.to_lowercase(),
    }
}

/// One run of the load generator within a case.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    /// Its label within the case ("health off", "phase 2" …).
    pub label: String,
    /// Seconds since the case started when it began.
    pub started_s: f64,
    /// What it measured.
    pub load: load::Report,
}

/// Everything a case reports.
#[derive(Debug, Clone, Serialize)]
pub struct CaseReport {
    /// The case's name.
    pub name: String,
    /// The seed document it comes from.
    pub source: String,
    /// The property under test.
    pub property: String,
    /// What the source measured, as the reference.
    pub reference: String,
    /// The outcome.
    pub verdict: Verdict,
    /// The assertions.
    pub checks: Vec<Check>,
    /// Figures, in the order the case gave them: (label, value with unit).
    pub figures: Vec<(String, String)>,
    /// Things a reader should know (a product's limit, a surprise).
    pub notes: Vec<String>,
    /// Fault changes, state transitions and other events.
    pub events: Vec<Event>,
    /// Share of answers per backend, percent, over the whole case.
    pub shares: Vec<(String, f64)>,
    /// The generator's runs.
    pub runs: Vec<Run>,
    /// Each interposer's accounting at the end.
    pub interposers: serde_json::Value,
    /// The balancer's `/lb-stats` at the end.
    pub balancer: serde_json::Value,
    /// How long the case took, seconds.
    pub elapsed_s: f64,
    /// The seed of every random choice.
    pub seed: u64,
    /// `builtin`, or the driver's product name.
    pub balancer_under_test: String,
    /// Each real balancer the case started (a restart is a second one).
    pub products: Vec<crate::lab::driver::ProductRun>,
    /// What else the machine did while the case ran, where `/proc` says.
    pub host: Option<crate::host::Load>,
    /// How late each backend's delays ended (backends that slept at all).
    pub backends_overslept: Vec<(String, load::Lag)>,
    /// Why the host was too busy to judge the case, if it was: with a failed check,
    /// the verdict is HOST.
    pub host_evidence: Vec<String>,
    /// The event log of each interposer that ran elsewhere (`--topology`), one JSON
    /// object per event, fetched from its server when the case ended.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub interposer_events: std::collections::BTreeMap<String, Vec<serde_json::Value>>,
}

impl CaseReport {
    /// The verdict the checks give: any failure is a FAIL, unless the generator
    /// failed, or other programs kept the machine busy.
    pub fn decide(&mut self) {
        let generator = self.runs.iter().any(|r| r.load.generator_errors > 0);
        self.host_evidence = self.host_evidence();
        let busy = !self.host_evidence.is_empty();
        self.verdict = verdict(self.verdict, &self.checks, generator, busy);
    }

    /// What says the host, not the balancer, was too busy for timing and shares to be
    /// judged: other programs' CPU, backends whose delays ran long, and a generator
    /// that fell behind its schedule.
    fn host_evidence(&self) -> Vec<String> {
        let mut evidence = Vec::new();
        if let Some(host) = self.host.filter(|h| h.busy()) {
            evidence.push(format!(
                "other programs used {:.2} of {} cores (from {:.2} is busy)",
                host.other_cores,
                host.cores,
                crate::host::BUSY_CORES
            ));
        }
        for (backend, lag) in self.backends_overslept.iter().filter(|(_, l)| l.late()) {
            evidence.push(format!(
                "backend {backend}'s delays ended {:.1} ms late at p99 (max {:.1} ms), from {:.0} ms is behind",
                lag.p99,
                lag.max,
                load::Lag::LATE_P99_MS
            ));
        }
        for run in &self.runs {
            if let Some(lag) = run.load.send_lag_ms.filter(|l| l.late()) {
                evidence.push(format!(
                    "the generator sent {:.1} ms late at p99 (max {:.1} ms) in {:?}, from {:.0} ms is behind",
                    lag.p99,
                    lag.max,
                    run.label,
                    crate::lab::load::Lag::LATE_P99_MS
                ));
            }
        }
        evidence
    }

    /// The case as a block of lines for the terminal.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "── {} ({}) ──", self.label(), self.source);
        let _ = writeln!(out, "   {}", self.property);
        let width = self
            .checks
            .iter()
            .map(|c| c.what.chars().count())
            .max()
            .unwrap_or(0);
        for c in &self.checks {
            let mark = if c.passed { "pass" } else { "FAIL" };
            let _ = writeln!(out, "   {mark}  {:width$}  {}", c.what, c.detail);
        }
        let width = self
            .figures
            .iter()
            .map(|(l, _)| l.chars().count())
            .max()
            .unwrap_or(0);
        for (label, value) in &self.figures {
            let _ = writeln!(out, "         {label:width$}  {value}");
        }
        if !self.shares.is_empty() {
            let shares: Vec<String> = self
                .shares
                .iter()
                .map(|(b, s)| format!("{b} {s:.1}%"))
                .collect();
            let _ = writeln!(out, "         shares  {}", shares.join(", "));
        }
        for note in &self.notes {
            let _ = writeln!(out, "   note  {note}");
        }
        let _ = writeln!(out, "   reference  {}", self.reference);
        for p in self.products.iter().take(1) {
            let _ = writeln!(
                out,
                "   product  {} ({}), configuration in the JSON report",
                p.version.as_deref().unwrap_or(&p.name),
                p.driver
            );
        }
        if let Some(host) = &self.host {
            let _ = writeln!(out, "   host  {}", host.describe());
        }
        for evidence in &self.host_evidence {
            let _ = writeln!(out, "   busy  {evidence}");
        }
        let _ = writeln!(
            out,
            "   {}  in {:.1} s (seed {})",
            self.verdict.word(),
            self.elapsed_s,
            self.seed
        );
        out
    }
}

/// The verdict of `checks`: an error stays an error, and so does a case that checked
/// nothing; a failed check is the generator's when it failed itself, and the host's
/// when other programs kept the machine busy.
fn verdict(current: Verdict, checks: &[Check], generator_failed: bool, host_busy: bool) -> Verdict {
    let failed = checks.iter().any(|c| !c.passed);
    match (current, failed) {
        (Verdict::Error, _) => Verdict::Error,
        (Verdict::Unsupported, _) => Verdict::Unsupported,
        (_, false) if !checks.is_empty() => Verdict::Pass,
        (_, false) => Verdict::Error,
        (_, true) if generator_failed => Verdict::GeneratorFailed,
        (_, true) if host_busy => Verdict::HostBusy,
        (_, true) => Verdict::Fail,
    }
}

impl CaseReport {
    /// What a summary shows of it: the figures of its first failed check, else of
    /// its first check, else its first note (why it did not run).
    pub fn key_figure(&self) -> String {
        let check = self
            .checks
            .iter()
            .find(|c| !c.passed)
            .or(self.checks.first())
            .map(|c| c.detail.clone())
            .or_else(|| self.notes.first().cloned())
            .unwrap_or_default();
        match (self.verdict, self.host_evidence.first()) {
            (Verdict::HostBusy, Some(evidence)) => format!("{evidence}; {check}"),
            _ => check,
        }
    }

    /// Its name with the balancer under test when that is not the built-in one:
    /// `share-rr`, `share-rr@haproxy`.
    pub fn label(&self) -> String {
        if self.balancer_under_test == "builtin" {
            self.name.clone()
        } else {
            format!("{}@{}", self.name, self.balancer_under_test)
        }
    }
}

/// Cases down, balancers across: each cell the verdict and the first failing (or
/// first) check's figures, shortened.
pub fn side_by_side(reports: &[CaseReport]) -> String {
    let mut products: Vec<&str> = Vec::new();
    let mut cases: Vec<&str> = Vec::new();
    for r in reports {
        if !products.contains(&r.balancer_under_test.as_str()) {
            products.push(&r.balancer_under_test);
        }
        if !cases.contains(&r.name.as_str()) {
            cases.push(&r.name);
        }
    }
    let width = cases.iter().map(|c| c.len()).max().unwrap_or(4).max(4);
    let cell = 34;
    let mut out = format!("{:width$}", "case");
    for p in &products {
        let _ = write!(out, "  {p:cell$}");
    }
    out.push('\n');
    for case in &cases {
        let _ = write!(out, "{case:width$}");
        for p in &products {
            let text = reports
                .iter()
                .find(|r| r.name == *case && r.balancer_under_test == *p)
                .map_or("-".to_string(), |r| {
                    let mut text = format!("{} {}", r.verdict.word(), r.key_figure());
                    if text.chars().count() > cell {
                        text = text.chars().take(cell - 1).collect::<String>() + "…";
                    }
                    text
                });
            let _ = write!(out, "  {text:cell$}");
        }
        out.push('\n');
    }
    out
}

/// The summary table for several cases.
pub fn summary(reports: &[CaseReport]) -> String {
    let width = reports
        .iter()
        .map(|r| r.label().len())
        .max()
        .unwrap_or(4)
        .max(4);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:width$}  {:9}  {:>6}  {:>7}  key figure",
        "case", "verdict", "checks", "time"
    );
    for r in reports {
        let passed = r.checks.iter().filter(|c| c.passed).count();
        let key = r.key_figure();
        let _ = writeln!(
            out,
            "{:width$}  {:9}  {:>6}  {:>5.1} s  {}",
            r.label(),
            r.verdict.word(),
            format!("{passed}/{}", r.checks.len()),
            r.elapsed_s,
            key
        );
    }
    let count = |v: Verdict| reports.iter().filter(|r| r.verdict == v).count();
    let _ = writeln!(
        out,
        "{} cases: {} pass, {} fail, {} generator failures, {} on a busy host, {} errors",
        reports.len(),
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::GeneratorFailed),
        count(Verdict::HostBusy),
        count(Verdict::Error)
    );
    out
}

/// Writes `NAME.json` per case and `index.html` for all of them into `dir`.
pub fn write(dir: &Path, reports: &[CaseReport]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for r in reports {
        let json = serde_json::to_string_pretty(r).expect("reports serialise");
        std::fs::write(dir.join(format!("{}.json", r.label())), json + "\n")?;
    }
    std::fs::write(dir.join("index.html"), html(reports))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks(results: &[bool]) -> Vec<Check> {
        results
            .iter()
            .map(|&passed| Check {
                what: "x".into(),
                passed,
                detail: String::new(),
            })
            .collect()
    }

    #[test]
    fn a_failed_check_is_the_generators_when_the_generator_failed() {
        let pass = checks(&[true, true]);
        let fail = checks(&[true, false]);
        assert_eq!(verdict(Verdict::Pass, &pass, false, false), Verdict::Pass);
        assert_eq!(verdict(Verdict::Pass, &pass, true, true), Verdict::Pass);
        assert_eq!(verdict(Verdict::Pass, &fail, false, false), Verdict::Fail);
        assert_eq!(
            verdict(Verdict::Pass, &fail, true, true),
            Verdict::GeneratorFailed
        );
        assert_eq!(verdict(Verdict::Error, &pass, false, false), Verdict::Error);
        assert_eq!(verdict(Verdict::Pass, &[], false, false), Verdict::Error);
    }

    #[test]
    fn a_failed_check_on_a_busy_host_is_the_hosts_and_says_so() {
        let fail = checks(&[false]);
        assert_eq!(
            verdict(Verdict::Pass, &fail, false, true),
            Verdict::HostBusy
        );
        assert_eq!(
            verdict(Verdict::Pass, &checks(&[true]), false, true),
            Verdict::Pass
        );
    }
}
