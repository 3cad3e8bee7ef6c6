//! `snag backend` and `snag balancer`: the lab's parts from flags.

use anyhow::Context;
use tokio::net::TcpListener;

use crate::{
    cli::{BackendArgs, BalancerArgs},
    lab::{backend, balancer},
    shutdown::Shutdown,
};

/// `snag backend`: serves until `shutdown`.
pub async fn backend(args: BackendArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("could not bind {}", args.listen))?;
    let tls = match args.tls() {
        Some(listen) => {
            let identity =
                crate::tls::Identity::of(&listen).map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
            let server =
                crate::tls::server(identity, None).map_err(|e| anyhow::anyhow!("TLS: {e}"))?;
            Some(tokio_rustls::TlsAcceptor::from(server))
        }
        None => None,
    };
    let config = backend::Config {
        id: args.id,
        delay: args.delay,
        workers: args.workers.map(|n| n as usize),
        work: args.work,
        queue: args.queue.0,
        health_path: args.health_path,
        dependency_broken: args.dependency_broken,
    };
    let pool = match config.workers {
        Some(n) => format!(
            ", {n} workers × {:?}, queue {}",
            config.work,
            config.queue.map_or("unbounded".into(), |q| q.to_string())
        ),
        None => String::new(),
    };
    say!(
        "backend {} listening on {} (delay {:?}{pool}, health {}{}; gRPC: {} and the health check)",
        config.id,
        listener.local_addr()?,
        config.delay,
        config.health_path,
        if tls.is_some() { ", TLS" } else { "" },
        backend::GRPC_ECHO
    );
    backend::serve_tls(listener, backend::Backend::new(config), tls, shutdown).await;
    Ok(())
}

/// `snag balancer`: serves until `shutdown`.
pub async fn balancer(args: BalancerArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("could not bind {}", args.listen))?;
    let seed = args.seed.unwrap_or_else(crate::seed::fresh);
    let health = args.health_interval.map(|interval| balancer::HealthCheck {
        interval,
        timeout: args.health_timeout,
        rise: args.rise,
        fall: args.fall,
        path: args.health_path.clone(),
        expect_body: args.health_expect_body.clone(),
        grpc: args.health_grpc,
    });
    let config = balancer::Config {
        backends: args.backends,
        strategy: args.strategy,
        hash_key: args.hash_key,
        health,
        max_fails: args.max_fails,
        fail_timeout: args.fail_timeout,
        slow_start: args.slow_start,
        retries: args.retries,
        timeout: args.timeout,
        seed,
        protocol: args.backend_protocol,
        backend_ca: args.backend_ca,
    };
    let names: Vec<String> = config
        .backends
        .iter()
        .map(|b| format!("{}={}", b.id, b.addr))
        .collect();
    say!(
        "balancer listening on {} ({}, seed {seed}) → {}",
        listener.local_addr()?,
        config.strategy,
        names.join(" ")
    );
    let balancer = balancer::Balancer::new(config).map_err(anyhow::Error::msg)?;
    balancer::serve(listener, balancer, shutdown).await;
    Ok(())
}
