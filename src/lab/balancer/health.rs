//! Active health checks: one task per backend, each check a new connection.

use std::{net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::{Balancer, HealthCheck};
use crate::shutdown::Shutdown;

/// Checks backend `index` every interval until `shutdown`.
pub(super) fn spawn(balancer: Arc<Balancer>, index: usize, rules: HealthCheck, shutdown: Shutdown) {
    tokio::spawn(async move {
        let spec = &balancer.config.backends[index];
        let target = spec.check.unwrap_or(spec.addr);
        // The first check comes at a seeded point within the first interval, as
        // HAProxy spreads its checks: a failure then meets the checker at any phase,
        // not always just after a check.
        let mut rng = crate::seed::rng(balancer.config.seed, &[b"check", spec.id.as_bytes()]);
        let phase = rules
            .interval
            .mul_f64(rand::RngExt::random::<f64>(&mut rng));
        let mut ticks = tokio::time::interval_at(Instant::now() + phase, rules.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.wait() => return,
                _ = ticks.tick() => {}
            }
            let result = check(target, &rules).await;
            balancer
                .lock()
                .checked(index, result, &rules, Instant::now());
        }
    });
}

/// One health check: a new connection, `GET path`, status 200 and the body text.
pub(super) async fn check(target: SocketAddr, rules: &HealthCheck) -> Result<(), String> {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(target)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        if rules.path.is_empty() {
            return Ok(());
        }
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        let request = Request::get(rules.path.as_str())
            .header(header::HOST, target.to_string())
            .header(header::CONNECTION, "close")
            .header(header::USER_AGENT, "snag-balancer-check")
            .body(Full::new(Bytes::new()))
            .map_err(|e| format!("request: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), 64 * 1024)
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(format!("status {}", status.as_u16()));
        }
        if let Some(text) = &rules.expect_body
            && !String::from_utf8_lossy(&body).contains(text.as_str())
        {
            return Err(format!("body lacks {text:?}"));
        }
        Ok(())
    };
    tokio::time::timeout(rules.timeout, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("timeout after {:?}", rules.timeout)))
}
