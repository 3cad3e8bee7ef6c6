//! snag: a fault-injection interposer and load-balancer test bench.
//!
//! # Layout
//!
//! - [`cli`]: clap types; [`run`] dispatches a parsed [`cli::Cli`].
//! - [`proxy`]: one listener per upstream, listener faults, and [`proxy::relay`], which
//!   moves bytes of one connection through the fault stages.
//! - [`fault`]: what a fault is, its inline form, the per-direction chain, one file
//!   per stage, and [`fault::file`] for `faults/*.toml`.
//! - [`api`]: the Toxiproxy-compatible control API (`snag serve`); [`ctl`], its client.
//! - [`case`]: the documented cases end to end (`snag case`, the README's main job),
//!   reported by [`report`] in the terminal, JSON and HTML.
//! - [`lab`]: self-naming backends, the reference balancer, the load generator, and
//!   [`lab::driver`] for HAProxy and nginx; [`demo`]: a fault timeline against echo.
//! - [`soak`]: thousands of connections through a `snag serve` process, faults
//!   changing, leaks and lost bytes looked for.
//! - [`capture`], [`events`], [`ports`]: the evidence; [`shutdown`], [`seed`]: leaves
//!   every long-lived task and random choice uses.

#![warn(missing_docs)]
#![deny(unsafe_code)]

/// `println!` that never panics: output to a closed pipe (`snag ports | head`) is
/// dropped instead of aborting the run.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub mod api;
pub mod capture;
pub mod case;
pub mod cli;
pub mod cmd;
pub mod events;
pub mod fault;
pub mod host;
pub mod lab;
pub mod ports;
pub mod proxy;
pub mod report;
pub mod seed;
pub mod shutdown;
pub mod soak;

use crate::{cli::Cli, shutdown::Shutdown};

/// Runs one subcommand until it is done or `shutdown` fires.
pub async fn run(cli: Cli, shutdown: Shutdown) -> anyhow::Result<()> {
    cmd::run(cli, shutdown).await
}

/// A command line whose values are each fine but do not go together.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Whether `err` is the user's input being wrong (exit code 2) rather than a failure.
pub fn is_usage_error(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|e| e.is::<fault::file::Error>() || e.is::<UsageError>())
}
