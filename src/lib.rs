//! snag: a fault-injection interposer and load-balancer test bench.
//!
//! # Layout
//!
//! Layers, each using only the ones below it (`shared/tools/module-cycles.py src`
//! prints `none`):
//!
//! 1. Commands: [`cmd`] (one file per subcommand) and [`cli`] (clap types). The only
//!    code that reads flags or prints for people; [`run`] dispatches to [`cmd`].
//! 2. Cases and the soak: [`case`] (the documented cases end to end, reported by
//!    [`report`] in the terminal, JSON and HTML) and [`soak`].
//! 3. The lab and the control API: [`lab`] (self-naming backends, the reference
//!    balancer, the load generator, [`lab::driver`] for real balancers from driver files) and [`api`]
//!    (Toxiproxy-compatible, `snag serve`).
//! 4. The interposer: [`proxy`] (listeners and listener faults, [`proxy::relay`] for
//!    TCP, [`proxy::http`] for HTTP mode: TLS, the upstream clients, an HTTP/2 frame
//!    layer of its own; [`proxy::scenario`]'s timelines).
//! 5. Faults: [`fault`] (what a fault is, TCP stages one per file, HTTP hooks in
//!    [`fault::http`], drains, fault files). Plain data and pure logic, no I/O.
//! 6. Leaves, the evidence and what every task uses: [`capture`], [`events`],
//!    [`ports`], [`host`], [`shutdown`], [`seed`], [`tls`].

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
pub mod tls;

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

/// An error and its causes, each once, joined by `: `.
pub fn causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}
