//! Active health checks: one task per backend, each check a new connection.

use std::{net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::time::Instant;

use super::{Balancer, HealthCheck, client::Connector};
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
            let attempt = async {
                if rules.grpc {
                    grpc_check(target, &balancer.connector).await
                } else {
                    let tls = (balancer.config.protocol == super::BackendProtocol::H2)
                        .then_some(&balancer.connector);
                    check(target, &rules, tls).await
                }
            };
            let result = tokio::time::timeout(rules.timeout, attempt)
                .await
                .unwrap_or_else(|_| Err(format!("timeout after {:?}", rules.timeout)));
            balancer
                .lock()
                .checked(index, result, &rules, Instant::now());
        }
    });
}

/// One health check: a new connection, `GET path`, status 200 and the body text.
/// It speaks HTTP/1.1 in clear, or HTTP/2 over TLS when the backends speak h2 (as
/// HAProxy's `check-ssl` with ALPN h2 does); a transport check only connects.
pub(super) async fn check(
    target: SocketAddr,
    rules: &HealthCheck,
    tls: Option<&Connector>,
) -> Result<(), String> {
    if rules.path.is_empty() {
        tokio::net::TcpStream::connect(target)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        return Ok(());
    }
    let request = Request::get(rules.path.as_str())
        .header(header::HOST, target.to_string())
        .header(header::USER_AGENT, "snag-balancer-check")
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("request: {e}"))?;
    let response = ask(target, tls, request).await?;
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
}

/// `request` on a new connection to `target`: HTTP/2 through `http2`'s connector
/// (TLS when the backends speak h2), else HTTP/1.1 in clear, closed after.
async fn ask(
    target: SocketAddr,
    http2: Option<&Connector>,
    mut request: Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, String> {
    let Some(connector) = http2 else {
        let stream = tokio::net::TcpStream::connect(target)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        request.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        return sender
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"));
    };
    // HTTP/2 names the scheme and authority in the request itself.
    let uri: hyper::Uri = format!("http://{target}{}", request.uri())
        .parse()
        .map_err(|e| format!("address: {e}"))?;
    *request.uri_mut() = uri.clone();
    request.headers_mut().remove(header::HOST);
    let io = tower_service::Service::call(&mut connector.clone(), uri)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))
}

/// One gRPC health check: a new connection (TLS when the backends speak h2),
/// `grpc.health.v1.Health/Check` for the whole server, and `SERVING` in answer.
pub(super) async fn grpc_check(target: SocketAddr, connector: &Connector) -> Result<(), String> {
    use crate::fault::http::grpc;
    // An empty HealthCheckRequest: the server as a whole.
    let request = Request::post(grpc::HEALTH_CHECK)
        .header(header::CONTENT_TYPE, "application/grpc")
        .header(header::TE, "trailers")
        .header(header::USER_AGENT, "snag-balancer-check")
        .body(Full::new(grpc::frame(&[])))
        .map_err(|e| format!("request: {e}"))?;
    let response = ask(target, Some(connector), request).await?;
    let status = response.status();
    // A trailers-only answer carries its status in the head.
    let head = response.headers().get("grpc-status").cloned();
    let body = Limited::new(response.into_body(), 64 * 1024)
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?;
    if status != StatusCode::OK {
        return Err(format!("status {}", status.as_u16()));
    }
    let code = body
        .trailers()
        .and_then(|t| t.get("grpc-status").cloned())
        .or(head);
    match code.as_ref().and_then(|c| c.to_str().ok()) {
        Some("0") => {}
        Some(code) => return Err(format!("grpc-status {code}")),
        None => return Err("no grpc-status".into()),
    }
    serving(&body.to_bytes())
}

/// Whether one framed HealthCheckResponse says `SERVING` (field 1 = 1); why not.
fn serving(body: &[u8]) -> Result<(), String> {
    let message = match body {
        [0, len @ ..] if len.len() >= 4 => {
            let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            len.get(4..4 + n).ok_or("a short gRPC message")?
        }
        _ => return Err("no uncompressed gRPC message".into()),
    };
    // Field 1, varint; a proto3 default (UNKNOWN, 0) is left out altogether.
    let status = match message {
        [] => 0,
        [0x08, status, ..] => *status,
        _ => return Err("a HealthCheckResponse it cannot read".into()),
    };
    match status {
        1 => Ok(()),
        0 => Err("UNKNOWN".into()),
        2 => Err("NOT_SERVING".into()),
        3 => Err("SERVICE_UNKNOWN".into()),
        n => Err(format!("serving status {n}")),
    }
}

#[cfg(test)]
mod tests {
    use super::serving;

    #[test]
    fn reads_the_serving_status() {
        let framed = |m: &[u8]| [&[0, 0, 0, 0, m.len() as u8][..], m].concat();
        assert_eq!(serving(&framed(&[0x08, 1])), Ok(()));
        assert_eq!(serving(&framed(&[0x08, 2])), Err("NOT_SERVING".into()));
        assert_eq!(serving(&framed(&[])), Err("UNKNOWN".into()));
        assert_eq!(serving(&framed(&[0x08, 3])), Err("SERVICE_UNKNOWN".into()));
        assert!(serving(&[0, 0, 0, 0, 9, 0x08]).is_err());
        assert!(serving(&[1, 0, 0, 0, 2, 0x08, 1]).is_err());
        assert!(serving(&[]).is_err());
    }
}
