//! `snag case`: the catalogue of DESIGN.md run end to end with the lab's parts —
//! backends, an interposer in front of each (data and probe paths), the reference
//! balancer and the load generator — with each case's faults from `faults/case-*.toml`
//! played on their timeline, and a report of whether the property held.
//!
//! A case is a function over a [`Bench`], which starts the parts on OS-chosen loopback
//! ports, records evidence, and stops everything it started when the case ends,
//! fails or is interrupted.

pub mod bench;
mod goaway;
mod health;
mod lb;
mod share;
mod spike;
mod strategies;
pub mod topology;

use std::{future::Future, pin::Pin};

pub use self::bench::Bench;
use crate::{lab::driver::Product, report::CaseReport, shutdown::Shutdown};

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
        goaway::CASES,
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Where a case's load runs tell their progress, once a second; `None` when a run is
/// over. The command shows it.
pub type OnProgress = std::sync::Arc<dyn Fn(Option<&Progress>) + Send + Sync>;

/// One second of a load run within a case.
#[derive(Debug, Clone)]
pub struct Progress {
    /// The case.
    pub case: &'static str,
    /// The run within it.
    pub label: String,
    /// Seconds done.
    pub second: usize,
    /// Seconds it runs.
    pub total_s: f64,
    /// Requests sent so far.
    pub sent: u64,
    /// Answered well so far.
    pub ok: u64,
    /// Failed so far.
    pub errors: u64,
}

/// How long a case runs: its durations and timeline offsets as written, shortened
/// by the case's own `quick` factor, or stretched ten times, for what shows only in
/// minutes (a rare false eviction, a slow leak).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Length {
    /// `--quick`.
    Quick,
    /// As written.
    Full,
    /// `--long`: ten times as written.
    Long,
}

impl Length {
    /// What every duration of `case` is multiplied by.
    pub fn factor(self, case: &Case) -> f64 {
        match self {
            Length::Quick => case.quick,
            Length::Full => 1.0,
            Length::Long => 10.0,
        }
    }
}

/// What the person running the cases chose for all of them.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// Where the parts listen (`--port-range`).
    pub ports: crate::lab::listen::Ports,
    /// What the balancer speaks to the backends (`--backend-protocol`) in the cases
    /// that leave it open; the HTTP/2 cases take `h2` from it, and h2c otherwise.
    pub protocol: Option<crate::lab::balancer::BackendProtocol>,
    /// The parts that run elsewhere (`--topology`); empty: every part here.
    pub topology: std::sync::Arc<topology::Topology>,
}

/// Runs `case` once against `product`, to its report; every part it started is
/// stopped when it returns.
pub async fn run(
    case: &'static Case,
    product: Product,
    seed: u64,
    length: Length,
    setup: Setup,
    shutdown: Shutdown,
    on_progress: OnProgress,
) -> CaseReport {
    let mut bench = Bench::new(case, product, seed, length, shutdown, on_progress);
    bench.set_up(setup);
    let result = (case.run)(&mut bench).await;
    bench.finish(result).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_scales_every_duration_of_a_case() {
        let case = catalogue().into_iter().find(|c| c.name == "LB-05").unwrap();
        assert_eq!(Length::Quick.factor(case), case.quick);
        assert_eq!(Length::Full.factor(case), 1.0);
        assert_eq!(Length::Long.factor(case), 10.0);
    }
}
