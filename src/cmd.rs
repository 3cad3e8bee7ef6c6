//! The commands: the only code that reads clap's types or prints to the terminal.
//! Each file turns one subcommand's flags into the layers below and says what
//! happened; [`run`] dispatches.

pub mod case;
pub mod ctl;
pub mod demo;
pub mod lab;
pub mod load;
pub mod ports;
pub mod proxy;
pub mod soak;
pub mod watch;

use crate::{
    cli::{Cli, Command},
    shutdown::Shutdown,
};

/// Runs one subcommand until it is done or `shutdown` fires.
pub async fn run(cli: Cli, shutdown: Shutdown) -> anyhow::Result<()> {
    match cli.command {
        Command::Proxy(args) => proxy::run(*args, shutdown).await,
        Command::Demo(args) => demo::run(args, shutdown).await,
        Command::Serve(args) => proxy::serve(args, shutdown).await,
        Command::Ctl(args) => ctl::run(args).await,
        Command::Ports(args) => ports::run(args, shutdown).await,
        Command::Backend(args) => lab::backend(args, shutdown).await,
        Command::Balancer(args) => lab::balancer(*args, shutdown).await,
        Command::Load(args) => load::run(*args, shutdown).await,
        Command::Case(args) => case::run(args, shutdown).await,
        Command::Soak(args) => soak::run(args, shutdown).await,
        Command::Watch(args) => watch::run(args, shutdown).await,
    }
}

/// A long run's line of progress on stderr: rewritten in place on a terminal, a line
/// of its own otherwise; `None` clears the terminal's line when the run is over.
fn progress_line(line: Option<&str>) {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    match line {
        Some(line) if tty => eprint!("\r{line:<78}"),
        Some(line) => eprintln!("{line}"),
        None if tty => eprint!("\r{:78}\r", ""),
        None => {}
    }
}
