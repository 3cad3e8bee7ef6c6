//! `snag soak`: the settings from the flags, a row a second while it runs, the checks
//! at the end.

use anyhow::bail;

use crate::{
    cli::SoakArgs,
    shutdown::Shutdown,
    soak::{self, Note, Settings},
};

/// Runs the soak; `Err` if a check failed.
pub async fn run(args: SoakArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        let seed = crate::seed::fresh();
        say!("seed {seed} (pass --seed {seed} to repeat this run's random choices)");
        seed
    });
    let settings = Settings {
        duration: args.duration,
        connections: args.connections,
        rate: args.rate,
        drain_every: args.drain_every,
        report_dir: args.report_dir,
        seed,
    };
    let findings = soak::run(&settings, shutdown, &mut print).await?;
    say!();
    let width = findings
        .checks
        .iter()
        .map(|c| c.what.len())
        .max()
        .unwrap_or(0);
    for c in &findings.checks {
        say!(
            "{}  {:width$}  {}",
            if c.passed { "PASS" } else { "FAIL" },
            c.what,
            c.detail
        );
    }
    say!(
        "figures: {}  chart: {}",
        findings.figures.display(),
        findings.chart.display()
    );
    let failed = findings.checks.iter().filter(|c| !c.passed).count();
    if failed > 0 {
        bail!("{failed} of {} soak checks failed", findings.checks.len());
    }
    Ok(())
}

fn print(note: Note) {
    match note {
        Note::Descriptors { was, now } if was < now => say!(
            "descriptors: limit raised from {was} to {now}, the hard limit (snag serve inherits it)"
        ),
        Note::Descriptors { now, .. } => say!("descriptors: limit {now}, the hard limit"),
        Note::TargetUp {
            pid,
            proxies,
            baseline,
        } => say!(
            "snag serve (pid {pid}) with {proxies} proxies: {:.1} MiB, {} descriptors, {} tasks before the load",
            baseline.rss_mib,
            baseline.fds,
            baseline.tasks
        ),
        Note::LoadBegins {
            connections,
            proxies,
            rate,
            drain_for,
            drain_every,
            duration,
        } => {
            say!(
                "{connections} connections ({} per proxy), {rate} rounds/s in all, faults changing every second, a {} s drain every {} s, for {} s",
                connections / proxies,
                drain_for.as_secs(),
                drain_every.as_secs(),
                duration.as_secs()
            );
            say!(
                "{:>5}  {:>11}  {:>8}  {:>7}  {:>7}  {:>8}  {:>12}  {:>7}  {:>6}",
                "t s",
                "connections",
                "RSS MiB",
                "fds",
                "tasks",
                "ok/s",
                "verified MiB",
                "ended",
                "failed"
            );
        }
        Note::SampleMissed(miss) => say!("{:>5.0}  no sample: {}", miss.t, miss.error),
        Note::Second(row) => {
            let s = &row.sample;
            say!(
                "{:>5.0}  {:>11}  {:>8.1}  {:>7}  {:>7}  {:>8}  {:>12.1}  {:>7}  {:>6}",
                s.t,
                s.connections,
                s.rss_mib,
                s.fds,
                s.tasks,
                s.ok_per_s,
                row.verified_bytes as f64 / (1 << 20) as f64,
                row.ended,
                row.failed
            );
        }
    }
}
