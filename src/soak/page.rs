//! The soak's HTML page: its checks and four per-second charts, in the case
//! report's style (one file, no network).

use std::fmt::Write as _;

use super::Sample;
use crate::report::Check;

/// A chart's title, colour, and what it plots.
type Series = (&'static str, &'static str, fn(&Sample) -> f64);

/// The page: checks, then connections, RSS, descriptors and tasks against time, with
/// the drains as vertical lines.
pub fn html(
    samples: &[Sample],
    drains: &[f64],
    checks: &[Check],
    report: &serde_json::Value,
) -> String {
    let mut out = String::from(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>snag soak</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: .5em 0; }
td, th { padding: .2em .8em; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top; }
.pass { color: #176b2c; font-weight: bold; } .fail { color: #b00020; font-weight: bold; }
svg { background: #fafafa; border: 1px solid #ddd; display: block; margin: .5em 0 1.5em; }
</style></head><body>
<h1>snag soak</h1>
"#,
    );
    let _ = writeln!(
        out,
        "<p>{} connections, {} rounds/s, {:.0} s, seed {}. Drains (dashed) at {}.</p>",
        report["connections"],
        report["rate"],
        report["duration_s"].as_f64().unwrap_or(0.0),
        report["seed"],
        if drains.is_empty() {
            "none".to_string()
        } else {
            drains
                .iter()
                .map(|d| format!("{d:.0} s"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    out += "<table>";
    crate::report::check_rows(&mut out, checks);
    out += "</table>\n";
    let series: [Series; 4] = [
        ("connections open in snag", "#1f5fbf", |s| {
            s.connections as f64
        }),
        ("resident memory, MiB", "#d0312d", |s| s.rss_mib),
        ("open descriptors", "#2a9d3f", |s| s.fds as f64),
        ("tasks alive in its runtime", "#7a4fb0", |s| s.tasks as f64),
    ];
    for (title, colour, value) in series {
        chart(&mut out, title, colour, samples, value, drains);
    }
    out += crate::report::CHARTS_DRAWN;
    out += "</body></html>\n";
    out
}

fn chart(
    out: &mut String,
    title: &str,
    colour: &str,
    samples: &[Sample],
    value: fn(&Sample) -> f64,
    drains: &[f64],
) {
    let (w, h, left, bottom, top) = (860.0, 160.0, 60.0, 24.0, 22.0);
    let end = samples.last().map_or(1.0, |s| s.t).max(1.0);
    let max = samples.iter().map(value).fold(0.0, f64::max).max(1.0) * 1.05;
    let x = |t: f64| left + (w - left - 10.0) * t / end;
    let y = |v: f64| h - bottom - (h - bottom - top) * v / max;
    let _ = writeln!(
        out,
        "<svg width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{title}\">"
    );
    let _ = writeln!(
        out,
        "<text x=\"{left}\" y=\"14\" font-size=\"12\">{title}</text>"
    );
    let _ = writeln!(
        out,
        "<line x1=\"{left}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#888\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{0}\" stroke=\"#888\"/>",
        h - bottom,
        w - 10.0
    );
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"end\">{:.0}</text>",
        left - 4.0,
        top + 4.0,
        max
    );
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"end\">0</text>",
        left - 4.0,
        h - bottom
    );
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"end\">{end:.0} s</text>",
        w - 10.0,
        h - 8.0
    );
    for d in drains {
        let _ = writeln!(
            out,
            "<line x1=\"{0:.1}\" y1=\"{top}\" x2=\"{0:.1}\" y2=\"{1}\" stroke=\"#e08a00\" stroke-dasharray=\"4 3\"/>",
            x(*d),
            h - bottom
        );
    }
    let points: Vec<String> = samples
        .iter()
        .map(|s| format!("{:.1},{:.1}", x(s.t), y(value(s))))
        .collect();
    let _ = writeln!(
        out,
        "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/></svg>",
        points.join(" ")
    );
}
