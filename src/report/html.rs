//! The report as one self-contained HTML page: per case its checks, a per-second
//! chart of each run with the faults and the case's actions marked and labelled on
//! it and a lane per backend with the balancer's view of it, and share bars.

use std::fmt::Write as _;

use super::{CaseReport, Change, Check, Event, EventKind, Run, side_by_side};
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
                "<tr><td>{:.2} s</td><td style=\"color:{}\">{}</td><td>{}</td></tr>",
                e.at_s,
                kind_color(e.kind),
                e.kind.word(),
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

/// One second of a run as the chart draws it: rates per second.
#[derive(Debug, Clone, PartialEq)]
struct Rates {
    offered: f64,
    sent: f64,
    ok: f64,
    errors: f64,
    depth: f64,
}

/// The rows of a run as rates per second. The last row covers only what was left
/// of the run after its last whole second: it is scaled to a rate, and left out
/// when under a fifth of a second (too little to be a rate), so that a run's end
/// is not drawn as a fall to zero.
fn rates(rows: &[load::Row], elapsed_s: f64) -> Vec<Rates> {
    let mut out: Vec<Rates> = rows
        .iter()
        .map(|r| Rates {
            offered: r.offered.unwrap_or(0.0),
            sent: r.sent as f64,
            ok: r.ok as f64,
            errors: r.errors.values().sum::<u64>() as f64,
            depth: r.depth.unwrap_or(0).max(0) as f64,
        })
        .collect();
    if let Some(last) = rows.last() {
        let covered = elapsed_s - last.second as f64;
        if covered < 0.2 {
            out.pop();
        } else if covered < 1.0 {
            let r = out.last_mut().expect("a row for each");
            for v in [&mut r.offered, &mut r.sent, &mut r.ok, &mut r.errors] {
                *v /= covered;
            }
        }
    }
    out
}

/// A stretch of time over which the balancer held one backend in one state.
#[derive(Debug, Clone, PartialEq)]
struct Span {
    from_s: f64,
    to_s: f64,
    state: String,
}

/// Each backend's states in the balancer's view over `[start, end]` seconds of the
/// case, from the events that changed them; a backend before its first change was
/// in that change's `from` state.
fn lanes(events: &[Event], start: f64, end: f64) -> Vec<(String, Vec<Span>)> {
    let mut out: Vec<(String, Vec<Span>)> = Vec::new();
    let mut changes: Vec<(f64, &Change)> = events
        .iter()
        .filter_map(|e| e.change.as_ref().map(|c| (e.at_s, c)))
        .collect();
    changes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut backends: Vec<&str> = changes.iter().map(|(_, c)| c.backend.as_str()).collect();
    backends.sort_unstable();
    backends.dedup();
    for backend in backends {
        let mine: Vec<&(f64, &Change)> = changes
            .iter()
            .filter(|(_, c)| c.backend == backend)
            .collect();
        let mut state = mine
            .iter()
            .rev()
            .find(|(at, _)| *at <= start)
            .map_or_else(|| mine[0].1.from.clone(), |(_, c)| c.to.clone());
        let mut spans = Vec::new();
        let mut from_s = start;
        for (at, c) in mine.iter().filter(|(at, _)| *at > start && *at < end) {
            spans.push(Span {
                from_s,
                to_s: *at,
                state: state.clone(),
            });
            state = c.to.clone();
            from_s = *at;
        }
        spans.push(Span {
            from_s,
            to_s: end,
            state,
        });
        // A lane that never leaves `up` tells nothing.
        if spans.iter().any(|s| s.state != "up") {
            out.push((backend.to_string(), spans));
        }
    }
    out
}

fn state_color(state: &str) -> &'static str {
    match state {
        "up" => "#2a9d3f",
        "down" => "#d0312d",
        "draining" | "drain" => "#e0a030",
        _ => "#888",
    }
}

fn kind_color(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Fault => "#b36b00",
        EventKind::Action => "#00838f",
        EventKind::Balancer => "#7a3fbf",
        EventKind::Log => "#888",
    }
}

/// A per-second line chart of one run: offered (open loop only), sent, ok, errors,
/// and queue depth (on its own scale); the faults put on and the case's actions as
/// numbered vertical lines listed under it; and a lane per backend with the
/// balancer's view of it over the run.
fn chart(out: &mut String, r: &CaseReport, run: &Run) {
    plot(
        out,
        &r.events,
        &Plot {
            label: &run.label,
            started_s: run.started_s,
            rows: &run.load.rows,
            elapsed_s: run.load.elapsed_s,
            open: run.load.offered.is_some(),
        },
    );
}

/// What [`plot`] draws of one run.
struct Plot<'a> {
    label: &'a str,
    /// On the case's clock.
    started_s: f64,
    rows: &'a [load::Row],
    elapsed_s: f64,
    /// Open loop: it has an offered rate.
    open: bool,
}

fn plot(out: &mut String, events: &[Event], run: &Plot) {
    let rows = rates(run.rows, run.elapsed_s);
    if rows.len() < 2 {
        return; // under a second: the figures say it all
    }
    let open = run.open;
    let end = run.started_s + rows.len() as f64;
    let lanes = lanes(events, run.started_s, end);
    let (w, plot_h, left, bottom, top) = (860.0, 260.0, 50.0, 30.0, 20.0);
    let lane_h = 16.0;
    let h = plot_h + lanes.len() as f64 * lane_h + if lanes.is_empty() { 0.0 } else { 6.0 };
    let n = rows.len().max(2) as f64;
    let series: Vec<(&str, &str, Vec<f64>)> = [
        ("offered", "#999", rows.iter().map(|r| r.offered).collect()),
        ("sent", "#1f5fbf", rows.iter().map(|r| r.sent).collect()),
        ("ok", "#2a9d3f", rows.iter().map(|r| r.ok).collect()),
        ("errors", "#d0312d", rows.iter().map(|r| r.errors).collect()),
    ]
    .into_iter()
    .filter(|(name, _, _)| open || *name != "offered")
    .collect();
    let depth: Vec<f64> = rows.iter().map(|r| r.depth).collect();
    let max = series
        .iter()
        .flat_map(|(_, _, v)| v.iter().copied())
        .fold(1.0, f64::max);
    let max_depth = depth.iter().copied().fold(0.0, f64::max);
    let span = w - left - 10.0;
    let x = |i: usize| left + span * i as f64 / (n - 1.0);
    // A point of the case's clock on this chart's axis.
    let at_x = |at_s: f64| left + span * ((at_s - run.started_s) / (n - 1.0)).clamp(0.0, 1.0);
    let y = |v: f64, m: f64| top + (plot_h - top - bottom) * (1.0 - v / m);
    let _ = writeln!(
        out,
        "<h3>{}</h3><svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">",
        esc(run.label)
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
            plot_h - 10.0
        );
    }
    // Faults and actions inside this run's window, numbered on the chart and
    // listed under it; the balancer's view has its lanes, its log the table.
    let marked: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Fault | EventKind::Action))
        .filter(|e| e.at_s >= run.started_s && e.at_s <= end)
        .collect();
    for (k, e) in marked.iter().enumerate() {
        let ex = at_x(e.at_s);
        let color = kind_color(e.kind);
        let _ = write!(
            out,
            "<line x1=\"{ex:.1}\" x2=\"{ex:.1}\" y1=\"{top}\" y2=\"{}\" stroke=\"{color}\" stroke-dasharray=\"3 3\"><title>{:.2} s: {}</title></line><text x=\"{:.1}\" y=\"{}\" font-size=\"10\" fill=\"{color}\">{}</text>",
            plot_h - bottom,
            e.at_s,
            esc(&e.what),
            ex + 2.0,
            top - 6.0 + 9.0 * (k % 2) as f64,
            k + 1
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
    for (row, (backend, spans)) in lanes.iter().enumerate() {
        let ly = plot_h + 4.0 + row as f64 * lane_h;
        let _ = write!(
            out,
            "<text x=\"4\" y=\"{:.1}\" font-size=\"10\">{}</text>",
            ly + 11.0,
            esc(backend)
        );
        for s in spans {
            let (x1, x2) = (at_x(s.from_s), at_x(s.to_s));
            let _ = write!(
                out,
                "<rect x=\"{x1:.1}\" y=\"{ly:.1}\" width=\"{:.1}\" height=\"{}\" fill=\"{}\"><title>{}: {} from {:.2} s to {:.2} s</title></rect>",
                (x2 - x1).max(0.5),
                lane_h - 4.0,
                state_color(&s.state),
                esc(backend),
                esc(&s.state),
                s.from_s,
                s.to_s
            );
        }
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
    for kind in [EventKind::Fault, EventKind::Action] {
        if marked.iter().any(|e| e.kind == kind) {
            let _ = write!(
                out,
                "<span style=\"color:{}\">┆ {}</span>",
                kind_color(kind),
                kind.word()
            );
        }
    }
    if !lanes.is_empty() {
        *out += "<span>the balancer's view, per backend: ";
        for state in ["up", "down", "draining"] {
            let _ = write!(
                out,
                "<span style=\"color:{}\">■ {state}</span> ",
                state_color(state)
            );
        }
        *out += "</span>";
    }
    *out += "</p>\n";
    if !marked.is_empty() {
        *out += "<ol class=\"events\">";
        for e in &marked {
            let _ = write!(
                out,
                "<li style=\"color:{}\">{:.2} s — {}</li>",
                kind_color(e.kind),
                e.at_s - run.started_s,
                esc(&e.what)
            );
        }
        *out += "</ol>\n";
    }
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

    fn row(second: usize, ok: u64) -> load::Row {
        load::Row {
            second,
            offered: None,
            sent: ok,
            retries: 0,
            ok,
            errors: Default::default(),
            mean_ms: None,
            p99_ms: None,
            depth: None,
            time_wait: None,
        }
    }

    #[test]
    fn a_last_part_second_is_a_rate_or_left_out() {
        let rows = [row(0, 100), row(1, 100), row(2, 50)];
        // Half a second in the last row: 50 in it is 100 per second.
        let r = rates(&rows, 2.5);
        assert_eq!(r.len(), 3);
        assert_eq!(r[2].ok, 100.0);
        assert_eq!(r[2].sent, 100.0);
        // A tenth of a second is no rate: the row goes.
        let r = rates(&[row(0, 100), row(1, 100), row(2, 3)], 2.1);
        assert_eq!(r.len(), 2);
        // Whole seconds stay as they are.
        let r = rates(&rows, 3.0);
        assert_eq!(r[2].ok, 50.0);
    }

    fn change(at_s: f64, backend: &str, from: &str, to: &str) -> Event {
        Event::change(at_s, format!("{backend} {from} → {to}"), backend, from, to)
    }

    #[test]
    fn a_lane_follows_the_balancers_view_and_skips_backends_always_up() {
        let events = [
            change(1.0, "b", "up", "down"),
            change(3.0, "b", "down", "up"),
            Event::new(EventKind::Fault, 0.5, "b: add loss"),
            change(9.0, "c", "UP", "DRAIN"),
        ];
        let l = lanes(&events, 0.0, 5.0);
        assert_eq!(l.len(), 1, "{l:?}");
        let (name, spans) = &l[0];
        assert_eq!(name, "b");
        let states: Vec<(f64, f64, &str)> = spans
            .iter()
            .map(|s| (s.from_s, s.to_s, s.state.as_str()))
            .collect();
        assert_eq!(
            states,
            [(0.0, 1.0, "up"), (1.0, 3.0, "down"), (3.0, 5.0, "up")]
        );
        // A window after the change starts in the state it left.
        let l = lanes(&events, 9.5, 12.0);
        assert_eq!(l[0].0, "c");
        assert_eq!(l[0].1[0].state, "draining");
    }

    #[test]
    fn a_chart_labels_its_faults_and_actions_and_lists_offered_only_for_open_loop() {
        let rows = [row(0, 10), row(1, 10), row(2, 10), row(3, 10)];
        let events = [
            Event::new(EventKind::Fault, 1.0, "b: add drop_request (probe)"),
            Event::new(EventKind::Action, 2.0, "balancer: b set draining"),
            change(2.5, "b", "up", "down"),
            Event::new(EventKind::Log, 2.6, "haproxy log: b is DOWN"),
        ];
        let mut closed = String::new();
        let plot_of = |open| Plot {
            label: "run",
            started_s: 0.0,
            rows: &rows,
            elapsed_s: 4.0,
            open,
        };
        plot(&mut closed, &events, &plot_of(false));
        assert!(!closed.contains("offered"), "{closed}");
        // Numbered on the chart, listed under it, the log line left to the table.
        assert!(closed.contains(">1</text>") && closed.contains(">2</text>"));
        assert!(
            closed
                .contains("<li style=\"color:#b36b00\">1.00 s — b: add drop_request (probe)</li>")
        );
        assert!(
            closed.contains("<li style=\"color:#00838f\">2.00 s — balancer: b set draining</li>")
        );
        assert!(!closed.contains("haproxy log"));
        // The lane: b down from 2.5 s.
        assert!(closed.contains("b: down from 2.50 s to 4.00 s"), "{closed}");
        let mut open = String::new();
        plot(&mut open, &events, &plot_of(true));
        assert!(open.contains("offered/s"));
    }

    #[test]
    fn html_escapes_what_cases_write() {
        assert_eq!(
            esc("<a href=\"x\">&</a>"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
        );
    }
}
