//! `snag watch`: a running product's own view of its backends, read by its driver
//! file, printed as it changes and summed up at the end.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use tokio::time::Instant;

use crate::{
    UsageError,
    cli::WatchArgs,
    lab::driver::{External, figures, file::Driver},
    report::{Event, EventKind},
    shutdown::Shutdown,
};

/// Runs `snag watch`.
pub async fn run(args: WatchArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let driver = match Driver::bundled(&args.balancer) {
        Some(bundled) => bundled?,
        None if args.balancer.ends_with(".toml") || args.balancer.contains('/') => {
            Driver::load(std::path::Path::new(&args.balancer))?
        }
        None => {
            return Err(UsageError(format!(
                "--balancer {:?}: not a bundled driver (haproxy, nginx, caddy, traefik) nor a driver file's path",
                args.balancer
            ))
            .into());
        }
    };
    let Some(view) = driver.view() else {
        return Err(UsageError(format!(
            "{}: the driver has no [view]: snag cannot read this product's view of its backends",
            driver.origin
        ))
        .into());
    };
    if view.log.is_some() && args.log.is_none() {
        return Err(UsageError(format!(
            "{}: its view is read from the product's log: give it with --log FILE",
            driver.origin
        ))
        .into());
    }
    let every = view.every_ms;
    let name = driver.name.clone();
    let log = args
        .log
        .clone()
        .unwrap_or_else(|| args.dir.join("output.log"));
    let stop = Shutdown::new();
    let started = Instant::now();
    let external = External::attach(
        Arc::new(driver),
        args.backends.clone(),
        args.admin,
        &args.dir,
        log,
        stop.clone(),
    );
    say!(
        "watching {name}'s view of its backends every {every} ms{} — {}",
        if args.backends.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                args.backends
                    .iter()
                    .map(|b| format!("{}={}", b.id, b.addr))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        match args.duration {
            Some(d) => format!("for {}", humantime::format_duration(d)),
            None => "Ctrl-C ends".into(),
        }
    );
    let end = args.duration.map(|d| started + d);
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.tick().await;
    let (mut told, mut told_log) = (0, 0);
    loop {
        let over = async {
            match end {
                Some(end) => tokio::time::sleep_until(end).await,
                None => std::future::pending().await,
            }
        };
        let done = tokio::select! {
            _ = shutdown.wait() => true,
            _ = over => true,
            _ = ticks.tick() => false,
        };
        // Each change and marked log line once, as it came.
        let seen = external.seen();
        for s in &seen[told..] {
            let at = s.at.saturating_duration_since(started).as_secs_f64();
            say!("{at:>8.2} s  {}  {} → {}", s.id, s.from, s.to);
        }
        told = seen.len();
        let logged = external.logged();
        for (at, line) in &logged[told_log..] {
            let at = at.saturating_duration_since(started).as_secs_f64();
            say!("{at:>8.2} s  {name} log: {line}");
        }
        told_log = logged.len();
        if done {
            break;
        }
        let states = external.states();
        let line = format!(
            "{:>4} s  {}",
            started.elapsed().as_secs(),
            if let Some(why) = external.unread() {
                format!("cannot read {name}'s view: {why}")
            } else if states.is_empty() {
                format!("no backend read from {name}'s view yet")
            } else {
                states
                    .iter()
                    .map(|(id, s)| format!("{id} {s}"))
                    .collect::<Vec<_>>()
                    .join(" · ")
            }
        );
        super::progress_line(Some(&line));
    }
    super::progress_line(None);
    stop.trigger();
    let end_s = started.elapsed().as_secs_f64();
    let at = |i: Instant| i.saturating_duration_since(started).as_secs_f64();
    let changes: Vec<figures::Change> = external
        .seen()
        .into_iter()
        .map(|s| (at(s.at), s.id, s.from, s.to))
        .collect();
    let counts: Vec<figures::Counts> = external
        .counts()
        .into_iter()
        .map(|(i, m)| (at(i), m))
        .collect();
    let states = external.states();
    let figures = figures::derive(&states, &changes, &counts, end_s);
    if figures.is_empty() {
        anyhow::bail!(
            "no backend was read from {name}'s view in {end_s:.1} s{}",
            external
                .unread()
                .map_or(String::new(), |why| format!(": {why}"))
        );
    }
    say!("{}", table(&figures, end_s, &name));
    if let Some(path) = &args.report {
        let mut events: Vec<Event> = changes
            .iter()
            .map(|(at_s, id, from, to)| {
                Event::change(*at_s, format!("{name}: {id} {from} → {to}"), id, from, to)
            })
            .collect();
        events.extend(
            external
                .logged()
                .into_iter()
                .map(|(i, line)| Event::new(EventKind::Log, at(i), format!("{name} log: {line}"))),
        );
        events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        let json = serde_json::json!({
            "product": name,
            "driver": external.driver.origin,
            "watched_s": end_s,
            "events": events,
            "figures": figures,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
            .with_context(|| format!("could not write {}", path.display()))?;
        say!("report: {}", path.display());
    }
    Ok(())
}

/// The figures as an aligned table.
fn table(figures: &[figures::Figures], end_s: f64, name: &str) -> String {
    let mut rows = vec![[
        "backend".to_string(),
        "now".into(),
        "evictions".into(),
        "out of rotation".into(),
        "longest out".into(),
        "requests".into(),
        "shifted to others".into(),
    ]];
    for f in figures {
        rows.push([
            f.id.clone(),
            f.state.clone(),
            f.evictions.to_string(),
            format!(
                "{:.1} s ({:.0}%)",
                f.out_s,
                100.0 * f.out_s / end_s.max(f64::EPSILON)
            ),
            if f.longest_out_s > 0.0 {
                format!("{:.1} s", f.longest_out_s)
            } else {
                "—".into()
            },
            f.requests.map_or("—".into(), |n| n.to_string()),
            f.shifted.map_or("—".into(), |n| format!("≈ {n}")),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = format!("{name} over {end_s:.1} s:\n");
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out += &format!("  {}\n", cells.join("  ").trim_end());
    }
    if figures.iter().all(|f| f.requests.is_none()) {
        out += &format!(
            "  ({name}'s view counts no requests per backend: its driver's [view] has no `requests`)\n"
        );
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_aligned_with_units() {
        let f = figures::Figures {
            id: "b".into(),
            state: "UP".into(),
            evictions: 2,
            out_s: 3.0,
            longest_out_s: 2.0,
            requests: Some(250),
            shifted: Some(150),
        };
        let t = table(&[f], 10.0, "haproxy");
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "haproxy over 10.0 s:");
        assert!(lines[1].starts_with("  backend  now  evictions  out of rotation  longest out"));
        assert!(
            lines[2].contains("3.0 s (30%)") && lines[2].contains("≈ 150"),
            "{t}"
        );
        // Columns line up.
        assert_eq!(lines[1].find("evictions"), lines[2].find('2'));
    }
}
