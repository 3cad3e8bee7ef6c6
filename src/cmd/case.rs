//! `snag case`: which cases against which balancers, each report as it ends, the
//! summary, and the report files.

use std::sync::Arc;

use anyhow::Context;

use crate::{
    UsageError,
    case::{self, Case},
    cli::CaseArgs,
    lab::driver::{Outside, Product},
    report,
    shutdown::Shutdown,
};

/// Runs `snag case`.
pub async fn run(args: CaseArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let all = case::catalogue();
    if args.name == "list" {
        let width = all.iter().map(|c| c.name.len()).max().unwrap_or(4);
        let source = all.iter().map(|c| c.source.len()).max().unwrap_or(6);
        say!("{:width$}  {:source$}  property", "case", "source");
        for c in &all {
            say!("{:width$}  {:source$}  {}", c.name, c.source, c.property);
        }
        return Ok(());
    }
    let chosen: Vec<&Case> = if args.name == "all" {
        all.clone()
    } else {
        args.name
            .split(',')
            .map(|name| {
                all.iter().copied().find(|c| c.name == name).ok_or_else(|| {
                    let names: Vec<_> = all.iter().map(|c| c.name).collect();
                    UsageError(format!(
                        "no case {name:?}; `snag case list` shows them: {}",
                        names.join(", ")
                    ))
                })
            })
            .collect::<Result<_, _>>()?
    };
    let topology = Arc::new(match &args.topology {
        Some(path) => case::topology::Topology::load(path)?,
        None => case::topology::Topology::default(),
    });
    let seed = args.seed.unwrap_or_else(|| {
        let seed = crate::seed::fresh();
        say!("seed {seed} (pass --seed {seed} to repeat this run's random choices)");
        seed
    });
    let balancers: Vec<Product> = args
        .balancer
        .iter()
        .map(|p| match p {
            Product::External(_) => Product::External(Arc::new(Outside {
                url: args.external_url.clone(),
                wait: args.external_wait,
                // Where to point it, for the person running the case.
                announce: Arc::new(|text| say!("{text}")),
            })),
            other => other.clone(),
        })
        .collect();
    let mut reports = Vec::new();
    for product in &balancers {
        for case in &chosen {
            if shutdown.is_triggered() {
                break;
            }
            let report = case::run(
                case,
                product.clone(),
                seed,
                if args.quick {
                    case::Length::Quick
                } else if args.long {
                    case::Length::Long
                } else {
                    case::Length::Full
                },
                case::Setup {
                    ports: args.port_range.clone(),
                    protocol: args.backend_protocol,
                    topology: topology.clone(),
                },
                shutdown.child(),
                std::sync::Arc::new(progress),
            )
            .await;
            say!("{}", report.text());
            reports.push(report);
        }
    }
    if reports.len() > 1 {
        say!("{}", report::summary(&reports));
    }
    if args.balancer.len() > 1 {
        say!("{}", report::side_by_side(&reports));
    }
    report::write(&args.report_dir, &reports).with_context(|| {
        format!(
            "could not write the report to {}",
            args.report_dir.display()
        )
    })?;
    say!(
        "report: {} (one JSON file per case beside it)",
        args.report_dir.join("index.html").display()
    );
    let failed = reports
        .iter()
        .filter(|r| matches!(r.verdict, report::Verdict::Fail | report::Verdict::Error))
        .count();
    if failed > 0 {
        anyhow::bail!("{failed} of {} cases did not pass", reports.len());
    }
    Ok(())
}

/// A load run's progress on stderr: one line rewritten in place on a terminal, a line
/// a second otherwise.
fn progress(p: Option<&case::Progress>) {
    match p {
        Some(p) => {
            // Rows go on while the last answers come in, past the traffic window.
            let when = if p.second as f64 <= p.total_s {
                format!("{:>3} of {:.0} s", p.second, p.total_s)
            } else {
                format!("{:>3} s, after {:.0} s of traffic", p.second, p.total_s)
            };
            let line = format!(
                "{} · {}: {when}, sent {}, ok {}, errors {}",
                p.case, p.label, p.sent, p.ok, p.errors
            );
            super::progress_line(Some(&line));
        }
        None => super::progress_line(None),
    }
}
