//! Serving clients: pick a backend, forward, retry, count, and the `/lb-stats` and
//! `/lb-admin` endpoints.

use std::{
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, combinators::BoxBody};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Body, Frame, Incoming, SizeHint},
    header::{self, HeaderName, HeaderValue},
};

use super::{BackendProtocol, Balancer, HashKey, client, select::Strategy};

type Reply = Response<BoxBody<Bytes, hyper::Error>>;

/// Client bodies larger than this are refused: the balancer keeps a body to retry it.
const BODY_LIMIT: usize = 16 << 20;

pub(super) async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    balancer: &Arc<Balancer>,
) -> Reply {
    let path = req.uri().path();
    if path == "/lb-stats" {
        return reply(StatusCode::OK, "none", &balancer.stats());
    }
    if let Some(rest) = path.strip_prefix("/lb-admin/backends/") {
        let draining = match *req.method() {
            Method::POST => true,
            Method::DELETE => false,
            _ => {
                let body =
                    serde_json::json!({"error": "POST or DELETE /lb-admin/backends/ID/drain"});
                return reply(StatusCode::METHOD_NOT_ALLOWED, "none", &body);
            }
        };
        let id = rest.strip_suffix("/drain").unwrap_or(rest);
        return if balancer.set_draining(id, draining) {
            reply(StatusCode::OK, id, &balancer.stats())
        } else {
            let body = serde_json::json!({"error": format!("no backend {id:?}")});
            reply(StatusCode::NOT_FOUND, "none", &body)
        };
    }
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, BODY_LIMIT).collect().await {
        Ok(body) => body.to_bytes(),
        Err(err) => {
            let body = serde_json::json!({"error": format!("could not read the body: {err}")});
            return reply(StatusCode::BAD_REQUEST, "none", &body);
        }
    };
    let key: Option<Vec<u8>> = match (balancer.config.strategy, &balancer.config.hash_key) {
        (Strategy::IpHash, _) | (_, HashKey::Source) => Some(peer.ip().to_string().into_bytes()),
        (_, HashKey::Header(name)) => parts.headers.get(name).map(|v| v.as_bytes().to_vec()),
        (_, HashKey::Cookie(name)) => cookie(&parts.headers, name),
    };
    let key = key.filter(|_| balancer.config.strategy.keyed());
    let idempotent = matches!(
        parts.method,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS
    );
    let n = balancer.config.backends.len();
    let mut tried = vec![false; n];
    let mut last: Option<(usize, StatusCode, String)> = None;
    balancer.lock().requests += 1;
    let scheme = if balancer.config.protocol == BackendProtocol::H2 {
        "https"
    } else {
        "http"
    };
    let (mut attempt, mut replays) = (0, 0);
    while attempt <= balancer.config.retries {
        let Some(index) = balancer.choose(key.as_deref(), &tried) else {
            break;
        };
        if attempt > 0 {
            balancer.lock().retries += 1;
        }
        attempt += 1;
        tried[index] = true;
        let spec = &balancer.config.backends[index];
        let mut upstream = Request::builder().method(parts.method.clone()).uri(format!(
            "{scheme}://{}{}",
            spec.addr,
            parts.uri.path_and_query().map_or("/", |p| p.as_str())
        ));
        for (name, value) in &parts.headers {
            // HTTP/2 has no connection-specific headers at all (RFC 9113 §8.2.2).
            let h1_only =
                balancer.config.protocol != BackendProtocol::H1 && H1_ONLY.contains(&name.as_str());
            if !HOP_BY_HOP.contains(name) && !h1_only {
                upstream = upstream.header(name, value);
            }
        }
        let upstream = upstream
            .header("x-forwarded-for", peer.ip().to_string())
            .body(Full::new(body.clone()))
            .expect("method, uri and headers come from a parsed request");
        let sent = tokio::time::timeout(balancer.config.timeout, balancer.client.request(upstream));
        match sent.await {
            Ok(Ok(response)) => {
                let (mut head, incoming) = response.into_parts();
                for name in HOP_BY_HOP {
                    head.headers.remove(name);
                }
                if let Ok(value) = HeaderValue::from_str(&spec.id) {
                    head.headers.insert("x-backend", value);
                }
                let body = Tracked {
                    body: incoming,
                    _guard: Guard {
                        balancer: balancer.clone(),
                        index,
                    },
                };
                return Response::from_parts(head, body.boxed());
            }
            Ok(Err(err))
                if replays < MAX_REPLAYS
                    && (client::unprocessed(&err)
                        || (idempotent && client::stale_connection(&err))) =>
            {
                // Never processed, or idempotent on a connection the backend had
                // closed: the same request again, to any backend, and no mark
                // against this one (its connection is ending, not failing).
                balancer.done(index);
                replays += 1;
                attempt -= 1;
                tried[index] = false;
                let mut pool = balancer.lock();
                if client::unprocessed(&err) {
                    pool.replays += 1;
                } else {
                    pool.stale_replays += 1;
                }
            }
            Ok(Err(err)) => {
                balancer.done(index);
                let connect = err.is_connect();
                let why = crate::causes(&err);
                balancer.failed(index, &why);
                last = Some((index, StatusCode::BAD_GATEWAY, why));
                if !(connect || idempotent) {
                    break;
                }
            }
            Err(_) => {
                balancer.done(index);
                let why = format!("no response within {:?}", balancer.config.timeout);
                balancer.failed(index, &why);
                last = Some((index, StatusCode::GATEWAY_TIMEOUT, why));
                if !idempotent {
                    break;
                }
            }
        }
    }
    match last {
        Some((index, status, why)) => {
            let id = &balancer.config.backends[index].id;
            reply(
                status,
                id,
                &serde_json::json!({"error": why, "backend": id}),
            )
        }
        None => {
            balancer.lock().no_backend += 1;
            reply(
                StatusCode::SERVICE_UNAVAILABLE,
                "none",
                &serde_json::json!({"error": "no backend available"}),
            )
        }
    }
}

/// How many times one request goes again after HTTP/2 said it was not processed:
/// enough for a backend rotating connections, not a loop against one refusing all.
const MAX_REPLAYS: u32 = 3;

/// HTTP/1.1's framing and connection headers that HTTP/2 forbids besides those.
const H1_ONLY: [&str; 3] = ["transfer-encoding", "keep-alive", "proxy-connection"];

/// Headers that belong to one connection, not to the request.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

fn cookie(headers: &hyper::HeaderMap, name: &str) -> Option<Vec<u8>> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_bytes().to_vec())
}

fn reply(status: StatusCode, backend: &str, body: &serde_json::Value) -> Reply {
    super::super::json(status, ("x-backend", backend), body)
        .map(|b| b.map_err(|never| match never {}).boxed())
}

/// Counts a request in flight on its backend until its response body is done.
struct Guard {
    balancer: Arc<Balancer>,
    index: usize,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.balancer.done(self.index);
    }
}

/// A backend's response body, streamed to the client, with its [`Guard`].
struct Tracked {
    body: Incoming,
    _guard: Guard,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Guard({})", self.index)
    }
}
