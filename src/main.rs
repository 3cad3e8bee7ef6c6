use std::process::ExitCode;

use clap::Parser;
use snag::{cli::Cli, shutdown::Shutdown};

/// Warnings, less h2's note of a PING answer it did not ask for: the `goaway`
/// fault's PING is snag's, written beside hyper, and its answer reaches hyper too.
const DEFAULT_LOG: &str = "warn,h2::proto::ping_pong=error";

fn main() -> ExitCode {
    let cli = Cli::parse_from(snag::cli::args(std::env::args().collect()));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| DEFAULT_LOG.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    match snag::proxy::threads() {
        Ok(Some(n)) => {
            runtime.worker_threads(n);
        }
        Ok(None) => {}
        Err(why) => {
            eprintln!("snag: {why}");
            return ExitCode::from(2);
        }
    }
    let runtime = runtime
        .enable_all()
        .build()
        .expect("a runtime can be built on this machine");
    match runtime.block_on(async { snag::run(cli, Shutdown::on_signals()).await }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("snag: {err:#}");
            ExitCode::from(if snag::is_usage_error(&err) { 2 } else { 1 })
        }
    }
}

/// jemalloc, not glibc's malloc: it hands memory back after connections close, where
/// glibc kept a soak's peak (the 60 s soak: +0.9% over the plateau after the load
/// against glibc's +3.5% to +10.9%), and a fault's per-connection memory stays
/// bounded over open/close cycles instead of growing with each. mimalloc, measured
/// beside both by `scripts/bench.sh --allocators` (figures in the commit that added
/// it), is built with `--features mimalloc`.
#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at its start. By default it returns freed pages
/// only when later allocations pass by, ten seconds on: an interposer whose
/// connections have closed stays at its peak. A background thread returns them
/// within a second whatever the traffic (5,000 connections under a fault: 5.8 KiB
/// of each still held after the close with the defaults, 0.5–1.3 KiB with these).
#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 = &b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0];

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
