//! The report as one self-contained HTML page: per case its checks, a per-second
//! chart of each run with the fault and balancer events on it, and share bars.

use std::fmt::Write as _;

use super::{CaseReport, Check, Run, side_by_side};
use crate::lab::load;

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

    #[test]
    fn html_escapes_what_cases_write() {
        assert_eq!(
            esc("<a href=\"x\">&</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
        );
    }
}
