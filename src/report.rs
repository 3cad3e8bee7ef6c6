//! What a case showed, for people and machines: a terminal table per case and a
//! summary, JSON per case, and one self-contained HTML page with inline SVG charts.
//! Every figure here was put in by a case from measured evidence.

use std::{fmt::Write as _, path::Path};

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
    /// `builtin`, `haproxy` or `nginx`.
    pub balancer_under_test: String,
    /// What else the machine did while the case ran, where `/proc` says.
    pub host: Option<crate::host::Load>,
    /// Why the host was too busy to judge the case, if it was: with a failed check,
    /// the verdict is HOST.
    pub host_evidence: Vec<String>,
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
    /// judged: other programs' CPU, and a generator that fell behind its schedule.
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

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The whole report as one HTML page: no external files, no network.
pub fn html(reports: &[CaseReport]) -> String {
    let mut out = String::from(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>snag case report</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { padding: .2em .8em; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
.pass { color: #176b2c; font-weight: bold; } .fail, .error, .generator-failed { color: #b00020; font-weight: bold; } .host-busy { color: #8a5a00; font-weight: bold; }
section { border-top: 2px solid #444; margin-top: 2em; }
svg { background: #fafafa; border: 1px solid #ddd; }
td { white-space: nowrap; } td:last-child { white-space: normal; }
.legend span { margin-right: 1.2em; } code { background: #f2f2f2; padding: 0 .2em; }
</style></head><body>
<h1>snag case report</h1>
"#,
    );
    out += "<table><tr><th>case</th><th>verdict</th><th>checks</th><th>time</th><th>property</th></tr>\n";
    for r in reports {
        let passed = r.checks.iter().filter(|c| c.passed).count();
        let _ = writeln!(
            out,
            "<tr><td><a href=\"#{0}\">{0}</a></td><td class=\"{1}\">{2}</td><td>{3}/{4}</td><td>{5:.1} s</td><td>{6}</td></tr>",
            esc(&r.label()),
            r.verdict.class(),
            r.verdict.word(),
            passed,
            r.checks.len(),
            r.elapsed_s,
            esc(&r.property)
        );
    }
    out += "</table>\n";
    if reports
        .iter()
        .any(|r| r.balancer_under_test != reports[0].balancer_under_test)
    {
        let _ = writeln!(
            out,
            "<h2>Side by side</h2><pre>{}</pre>",
            esc(&side_by_side(reports))
        );
    }
    for r in reports {
        section(&mut out, r);
    }
    out += CHARTS_DRAWN;
    out += "</body></html>\n";
    out
}

/// One table row per check: its verdict, what it checks, and the figures.
pub(crate) fn check_rows(out: &mut String, checks: &[Check]) {
    for c in checks {
        let (class, word) = if c.passed {
            ("pass", "pass")
        } else {
            ("fail", "FAIL")
        };
        let _ = write!(
            out,
            "<tr><td class=\"{class}\">{word}</td><td>{}</td><td>{}</td></tr>",
            esc(&c.what),
            esc(&c.detail)
        );
    }
}

/// Proves in a browser that every chart drew lines: a test that loads the page
/// headless reads the mark this leaves on `<body>` (`data-charts="drawn/all"`).
pub const CHARTS_DRAWN: &str = r#"<script>
(function () {
  var lines = document.querySelectorAll('svg polyline');
  var drawn = 0;
  lines.forEach(function (l) { if (l.points.numberOfItems > 1 && l.getTotalLength() > 0) drawn++; });
  document.body.setAttribute('data-charts', drawn + '/' + lines.length);
})();
</script>
"#;

fn section(out: &mut String, r: &CaseReport) {
    let verdict_class = r.verdict.class();
    let _ = writeln!(
        out,
        "<section id=\"{0}\"><h2>{0} <span class=\"{1}\">{2}</span></h2><p><b>{3}</b> — {4}</p>",
        esc(&r.label()),
        verdict_class,
        r.verdict.word(),
        esc(&r.source),
        esc(&r.property)
    );
    *out += "<table>";
    check_rows(out, &r.checks);
    for (label, value) in &r.figures {
        let _ = write!(
            out,
            "<tr><td></td><td>{}</td><td>{}</td></tr>",
            esc(label),
            esc(value)
        );
    }
    *out += "</table>\n";
    for note in &r.notes {
        let _ = writeln!(out, "<p>Note: {}</p>", esc(note));
    }
    let _ = writeln!(out, "<p>Reference: {}</p>", esc(&r.reference));
    for run in &r.runs {
        chart(out, r, run);
    }
    if !r.shares.is_empty() {
        bars(out, &r.shares);
    }
    if !r.events.is_empty() {
        *out += "<details><summary>events</summary><table>";
        for e in &r.events {
            let _ = write!(
                out,
                "<tr><td>{:.2} s</td><td>{}</td></tr>",
                e.at_s,
                esc(&e.what)
            );
        }
        *out += "</table></details>\n";
    }
    let _ = writeln!(
        out,
        "<p>Seed {} · {:.1} s · JSON: <code>{}.json</code></p></section>",
        r.seed,
        r.elapsed_s,
        esc(&r.label())
    );
}

/// A per-second line chart of one run: offered, sent, ok, errors, and queue depth
/// (on its own scale) with the case's events as vertical lines.
fn chart(out: &mut String, r: &CaseReport, run: &Run) {
    let rows = &run.load.rows;
    if rows.len() < 2 {
        return; // under a second: the figures say it all
    }
    let (w, h, left, bottom, top) = (860.0, 260.0, 50.0, 30.0, 20.0);
    let n = rows.len().max(2) as f64;
    let errors = |row: &load::Row| row.errors.values().sum::<u64>() as f64;
    let series: [(&str, &str, Vec<f64>); 4] = [
        (
            "offered",
            "#999",
            rows.iter().map(|r| r.offered.unwrap_or(0.0)).collect(),
        ),
        (
            "sent",
            "#1f5fbf",
            rows.iter().map(|r| r.sent as f64).collect(),
        ),
        ("ok", "#2a9d3f", rows.iter().map(|r| r.ok as f64).collect()),
        ("errors", "#d0312d", rows.iter().map(errors).collect()),
    ];
    let depth: Vec<f64> = rows
        .iter()
        .map(|r| r.depth.unwrap_or(0).max(0) as f64)
        .collect();
    let max = series
        .iter()
        .flat_map(|(_, _, v)| v.iter().copied())
        .fold(1.0, f64::max);
    let max_depth = depth.iter().copied().fold(0.0, f64::max);
    let x = |i: usize| left + (w - left - 10.0) * i as f64 / (n - 1.0);
    let y = |v: f64, m: f64| top + (h - top - bottom) * (1.0 - v / m);
    let _ = writeln!(
        out,
        "<h3>{}</h3><svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">",
        esc(&run.label)
    );
    for k in 0..=4 {
        let v = max * k as f64 / 4.0;
        let _ = write!(
            out,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{1:.1}\" y2=\"{1:.1}\" stroke=\"#e4e4e4\"/><text x=\"4\" y=\"{2:.1}\" font-size=\"10\">{3:.0}</text>",
            w - 10.0,
            y(v, max),
            y(v, max) + 3.0,
            v
        );
    }
    for (i, _) in rows.iter().enumerate().step_by((rows.len() / 12).max(1)) {
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{}\" font-size=\"10\" text-anchor=\"middle\">{i} s</text>",
            x(i),
            h - 10.0
        );
    }
    // Events inside this run's window, shifted to its clock.
    let end = run.started_s + rows.len() as f64;
    for e in r
        .events
        .iter()
        .filter(|e| e.at_s >= run.started_s && e.at_s <= end)
    {
        let ex = left + (w - left - 10.0) * (e.at_s - run.started_s) / (n - 1.0);
        let _ = write!(
            out,
            "<line x1=\"{ex:.1}\" x2=\"{ex:.1}\" y1=\"{top}\" y2=\"{}\" stroke=\"#b36b00\" stroke-dasharray=\"3 3\"><title>{:.2} s: {}</title></line>",
            h - bottom,
            e.at_s,
            esc(&e.what)
        );
    }
    let mut polyline = |values: &[f64], m: f64, color: &str, dash: &str| {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v, m)))
            .collect();
        let _ = write!(
            out,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\" points=\"{}\"/>",
            points.join(" ")
        );
    };
    for (name, color, values) in &series {
        if *name == "offered" && run.load.offered.is_none() {
            continue;
        }
        polyline(
            values,
            max,
            color,
            if *name == "offered" { "6 4" } else { "" },
        );
    }
    if max_depth > 0.0 {
        polyline(&depth, max_depth, "#7a3fbf", "2 2");
    }
    *out += "</svg>\n<p class=\"legend\">";
    for (name, color, _) in &series {
        let _ = write!(out, "<span style=\"color:{color}\">■ {name}/s</span>");
    }
    if max_depth > 0.0 {
        let _ = write!(
            out,
            "<span style=\"color:#7a3fbf\">■ queue depth (max {max_depth:.0}, own scale)</span>"
        );
    }
    *out += "<span style=\"color:#b36b00\">┆ event (hover)</span></p>\n";
}

/// Horizontal bars of each backend's share.
fn bars(out: &mut String, shares: &[(String, f64)]) {
    let height = 24.0 * shares.len() as f64 + 10.0;
    let _ = writeln!(
        out,
        "<svg width=\"520\" height=\"{height}\" viewBox=\"0 0 520 {height}\" role=\"img\">"
    );
    for (i, (name, share)) in shares.iter().enumerate() {
        let yy = 5.0 + 24.0 * i as f64;
        let _ = write!(
            out,
            "<text x=\"4\" y=\"{:.1}\" font-size=\"12\">{}</text><rect x=\"80\" y=\"{yy:.1}\" width=\"{:.1}\" height=\"18\" fill=\"#1f5fbf\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{share:.1}%</text>",
            yy + 13.0,
            esc(name),
            3.6 * share,
            86.0 + 3.6 * share,
            yy + 13.0
        );
    }
    *out += "</svg>\n";
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

    #[test]
    fn html_escapes_what_cases_write() {
        assert_eq!(
            esc("<a href=\"x\">&</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
        );
    }
}
