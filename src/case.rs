//! `snag case`: the catalogue of DESIGN.md run end to end with the lab's parts —
//! backends, an interposer in front of each (data and probe paths), the reference
//! balancer and the load generator — with each case's faults from `faults/case-*.toml`
//! played on their timeline, and a report of whether the property held.
//!
//! A case is a function over a [`Bench`], which starts the parts on OS-chosen loopback
//! ports, records evidence, and stops everything it started when the case ends,
//! fails or is interrupted.

pub mod bench;
mod health;
mod lb;
mod share;
mod spike;
mod strategies;

use std::{future::Future, pin::Pin};

use anyhow::Context;

pub use self::bench::Bench;
use crate::{UsageError, cli::CaseArgs, report, shutdown::Shutdown};

/// A case's body.
pub type Body =
    for<'a> fn(&'a mut Bench) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send + 'a>>;

/// One documented case.
pub struct Case {
    /// Its name on the command line.
    pub name: &'static str,
    /// The seed document it comes from.
    pub source: &'static str,
    /// The property under test.
    pub property: &'static str,
    /// What the source measured.
    pub reference: &'static str,
    /// `--quick` multiplies every duration and timeline offset by this.
    pub quick: f64,
    /// What it does.
    pub run: Body,
}

/// Every case, in the order `all` runs them.
pub fn catalogue() -> Vec<&'static Case> {
    [
        share::CASES,
        health::CASES,
        spike::CASES,
        strategies::CASES,
        lb::CASES,
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Runs `snag case`.
pub async fn run(args: CaseArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let all = catalogue();
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
    let seed = args.seed.unwrap_or_else(|| {
        let seed = crate::seed::fresh();
        say!("seed {seed} (pass --seed {seed} to repeat this run's random choices)");
        seed
    });
    let mut reports = Vec::new();
    for product in &args.balancer {
        for case in &chosen {
            if shutdown.is_triggered() {
                break;
            }
            let mut bench = Bench::new(case, *product, seed, args.quick, shutdown.child());
            let result = (case.run)(&mut bench).await;
            let report = bench.finish(result).await;
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
