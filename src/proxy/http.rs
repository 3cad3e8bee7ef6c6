//! HTTP mode: snag terminates HTTP/1.1 and HTTP/2 from the client (in clear or
//! TLS; [`connection`]), forwards each request to the upstream over pooled
//! keep-alive connections (HTTP/1.1, h2c or h2; [`upstream`]) with bodies and
//! trailers streamed, and applies the HTTP faults one exchange at a time. Requests
//! are told apart as health probes or data by their path.

mod body;
mod connection;
mod frames;
mod gated;
mod goaway;
mod hits;
mod keepalive;
mod upstream;

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{
    HeaderMap, Request, Response, StatusCode, Uri, Version,
    body::Incoming,
    header::{self, HeaderName, HeaderValue},
    http::request,
};
use tracing::debug;

pub use self::connection::{Legs, handle};
use self::{
    body::{Faulted, ReplyBody, Source},
    connection::Conn,
    hits::{Hits, Seen},
    upstream::Route,
};
use crate::{
    events::Class,
    fault::{
        Fault, Scope,
        http::{Exchange, Reply},
    },
    proxy::Proxy,
};

/// Why an exchange or a response body ended early. A concrete type, not a boxed
/// error: hyper ends the connection (or resets the HTTP/2 stream) on either.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The upstream's body failed.
    #[error("upstream body: {0}")]
    Upstream(#[source] upstream::BoxError),
    /// A fault ended it on purpose.
    #[error("{0}")]
    Fault(String),
    /// A fault reset the HTTP/2 stream with this code: hyper finds it among the
    /// error's sources and sends it in the RST_STREAM.
    #[error("stream reset by a fault: {0}")]
    Stream(#[source] h2::Error),
}

async fn exchange(
    req: Request<Incoming>,
    conn: &Arc<Conn>,
    stream: Option<(u32, goaway::Turn)>,
) -> Result<Response<ReplyBody>, Failure> {
    let proxy = &conn.proxy;
    let number = proxy.next_request();
    let headers = req.headers();
    let class = if conn.class == Scope::Probe {
        Scope::Probe
    } else {
        proxy
            .config()
            .probe
            .classify(req.method().as_str(), req.uri().path(), |name| {
                headers.get(name).and_then(|v| v.to_str().ok())
            })
    };
    let faults: Vec<Arc<Fault>> = conn.faults.with(|on| {
        if on.is_empty() {
            return Vec::new();
        }
        // The name requests draw their toxicity under.
        let requests = format!("{}/requests", proxy.name);
        on.iter()
            .filter(|f| {
                f.kind.is_http()
                    && f.scope.covers(class)
                    && f.applies(proxy.seed(), &requests, number)
            })
            .cloned()
            .collect()
    });
    debug!(number, class = class.as_str(), path = %req.uri().path(), faults = faults.len(), "request");
    let counters = proxy.counters();
    let counted = if class == Scope::Probe {
        Class::Probe
    } else {
        Class::Data
    };
    counters.request(counted, proxy.draining().is_some());
    if req.version() == Version::HTTP_2 {
        conn.h2.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    // A probe whose request is dropped never gets a status: the guard records it
    // with status 0 when the client gives up and this future is dropped.
    let mut probe = (class == Scope::Probe).then(|| ProbeRecord {
        proxy: proxy.clone(),
        control: conn.control.clone(),
        path: req.uri().path().to_string(),
        arrived: tokio::time::Instant::now(),
        status: 0,
    });
    let (on_conn, _in_flight) = conn.keepalive.start();
    let mut cx = Exchange::new(proxy.seed(), conn.name.clone(), number, class);
    cx.on_conn = on_conn;
    cx.h2 = req.version() == Version::HTTP_2;
    let turn = stream.map(|(id, turn)| {
        // Stream order, not the order the exchanges happened to start in.
        (cx.stream, cx.on_conn) = (id, turn.number());
        turn
    });
    let reply = respond(req, conn, cx, faults, turn).await;
    let status = reply.as_ref().map_or(0, |r| r.status().as_u16());
    if status > 0 {
        counters.response(status);
    }
    if let Some(probe) = &mut probe {
        probe.status = status;
    }
    reply
}

/// A stream a GOAWAY declared unprocessed: it never reaches the upstream and gets
/// no answer; the connection's close ends it.
async fn unprocessed(conn: &Conn, stream: u32) -> Result<Response<ReplyBody>, Failure> {
    conn.proxy.counters().stream_unprocessed();
    conn.proxy.event(
        "stream_unprocessed",
        serde_json::json!({ "stream_id": stream }),
    );
    std::future::pending().await
}

/// One health probe, recorded in the counters and the event log when it ends.
struct ProbeRecord {
    proxy: Arc<Proxy>,
    /// Its connection's: whether snag itself shut the connection down.
    control: Arc<super::relay::Control>,
    path: String,
    arrived: tokio::time::Instant,
    /// 0 until a status is known.
    status: u16,
}

impl Drop for ProbeRecord {
    fn drop(&mut self) {
        let latency_ms = (self.arrived.elapsed().as_secs_f64() * 1e6).round() / 1e3;
        let (path, status) = (std::mem::take(&mut self.path), self.status);
        if status == 0 && self.control.is_shut_down() {
            // In flight when the interposer stopped (deleted, disabled, a signal):
            // the prober got no say, so it is neither answered nor lost.
            self.proxy.event(
                "probe",
                serde_json::json!({
                    "path": path, "status": 0, "latency_ms": latency_ms,
                    "cut": "the interposer stopped",
                }),
            );
            return;
        }
        self.proxy.event(
            "probe",
            serde_json::json!({ "path": path, "status": status, "latency_ms": latency_ms }),
        );
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.proxy.counters().probe(crate::events::Probe {
            unix_ms,
            path,
            status,
            latency_ms,
        });
    }
}

/// Forwards `req` through the hooks of `faults` (those that apply to it, in order):
/// the request hooks may answer in the backend's place, the response hooks change
/// the head, and the body hooks act frame by frame in [`Faulted`].
async fn respond(
    req: Request<Incoming>,
    conn: &Arc<Conn>,
    mut cx: Exchange,
    faults: Vec<Arc<Fault>>,
    mut turn: Option<goaway::Turn>,
) -> Result<Response<ReplyBody>, Failure> {
    let proxy = &conn.proxy;
    // HTTP/2: the streams of a connection decide in the order they opened whether
    // they go upstream, so that a GOAWAY's last-stream-id splits them cleanly.
    if let Some(turn) = &turn {
        turn.wait().await;
    }
    if conn.h2conn.unprocessed(cx.stream) {
        drop(turn);
        return unprocessed(conn, cx.stream).await;
    }
    if cx.class == Scope::Probe && proxy.unready() {
        // A readiness drain's first step: the backend says it is not ready.
        return Ok(plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "snag: draining: not ready (readiness drain)\n".into(),
        ));
    }
    // The head stays where it is from here on, changed in place: each move of it
    // (224 bytes) writes lines of this future that, with hundreds of connections,
    // are out of cache.
    let (mut head, body) = req.into_parts();
    let mut hits = Hits::new(conn.clone(), cx.stream);
    for fault in &faults {
        let Some(hooks) = fault.kind.http() else {
            continue;
        };
        let reply = hooks.request(&head, &mut cx);
        // A goaway acts only if none is under way on its connection: told below.
        if (reply.is_some() && !matches!(reply, Some(Reply::Goaway(_)))) || cx.max_streams.is_some()
        {
            hits.acted(fault);
        }
        match reply {
            None => {
                if let Some(max) = cx.max_streams.take() {
                    conn.h2conn.max_streams(max, &fault.name, proxy);
                }
            }
            Some(Reply::Answer(answer)) => {
                return Ok(answer.map(|bytes| ReplyBody::answer(bytes, None)));
            }
            Some(Reply::AnswerWithTrailers(answer, trailers)) => {
                return Ok(answer.map(|bytes| ReplyBody::answer(bytes, Some(trailers))));
            }
            Some(Reply::Goaway(plan)) => {
                // Streams take their turns in order: nothing plans between the two.
                if !conn.h2conn.planned() {
                    hits.acted(fault);
                }
                if conn
                    .h2conn
                    .start(plan, (cx.stream, cx.on_conn), &fault.name, proxy)
                {
                    drop((body, turn));
                    return unprocessed(conn, cx.stream).await;
                }
            }
            Some(Reply::Refuse) => {
                drop(body);
                proxy.counters().stream_refused();
                proxy.event("stream_refused", serde_json::json!({ "fault": fault.name }));
                return Err(Failure::Stream(h2::Reason::REFUSED_STREAM.into()));
            }
            Some(Reply::Drop(after)) => {
                drop((body, turn.take()));
                let Some(after) = after else {
                    // The client gives up first: it drops this future.
                    return std::future::pending().await;
                };
                tokio::time::sleep(after).await;
                conn.record_reset(&fault.name);
                conn.socket.reset_on_close();
                proxy.counters().fault_reset();
                proxy.event("fault_reset", serde_json::json!({ "fault": fault.name }));
                return Err(Failure::Fault(format!(
                    "{} `{}`: reset after {} ms",
                    hooks.type_name(),
                    fault.name,
                    after.as_millis()
                )));
            }
        }
    }
    // Transaction ids count when the request has gone upstream whole: a duplicate is
    // one the backend got twice, not one a fault answered, a GOAWAY left
    // unprocessed or the client cut short.
    let ids: Vec<String> = conn
        .legs
        .id_headers
        .iter()
        .filter_map(|name| head.headers.get(name)?.to_str().ok())
        .map(str::to_string)
        .collect();
    let h2 = head.version == Version::HTTP_2;
    let route = conn.legs.upstreams.route(proxy, head.version);
    if let Err(e) = outbound(&mut head, &route) {
        return Ok(plain(StatusCode::BAD_REQUEST, format!("snag: {e}\n")));
    }
    let forwarding = conn.h2conn.forward(cx.stream);
    drop(turn);
    let Some(processing) = forwarding else {
        return unprocessed(conn, cx.stream).await;
    };
    let on_whole = (!ids.is_empty()).then(|| -> upstream::OnWhole {
        let counted = proxy.clone();
        Box::new(move || ids.iter().for_each(|id| counted.counters().transaction(id)))
    });
    let body = upstream::Outbound::new(body, on_whole);
    let response = match route.request(head, body).await {
        Ok(r) => r,
        Err(err) => {
            let mut why = crate::causes(&*err);
            if route
                .answered_http1
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                why = format!(
                    "it answered HTTP/2's preface with HTTP/1.x: it does not speak h2c \
                     (use upstream protocol h1 or auto) ({why})"
                );
            }
            debug!(%why, "upstream request failed");
            proxy.counters().upstream_error();
            proxy.event(
                "upstream_failed",
                serde_json::json!({ "upstream": &*route.upstream, "why": why }),
            );
            return Ok(plain(
                StatusCode::BAD_GATEWAY,
                format!("snag: upstream {}: {why}\n", route.upstream),
            ));
        }
    };
    let (mut parts, body) = response.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if let Some(instance) = parts.headers.get(&X_INSTANCE).and_then(|v| v.to_str().ok()) {
        let expected = proxy.config().instance.as_deref().unwrap_or(&proxy.name);
        proxy.counters().instance(instance, expected);
    }
    let hooks = || faults.iter().filter_map(|f| f.kind.http());
    let whole = hooks().any(|h| h.whole_body());
    let mut trailers = None;
    let body = if whole {
        let collected = body.collect().await.map_err(Failure::Upstream)?;
        trailers = collected.trailers().cloned();
        let bytes = collected.to_bytes();
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        Source::Whole(http_body_util::Full::new(bytes))
    } else {
        Source::Streamed(body)
    };
    for fault in &faults {
        let Some(hook) = fault.kind.http() else {
            continue;
        };
        let before = Seen::of(&parts, &cx);
        hook.response(&mut parts, &mut cx);
        if Seen::of(&parts, &cx) != before {
            hits.acted(fault);
        }
    }
    if let Some(idle) = cx.close_if_idle {
        conn.keepalive.arm(idle);
    }
    if !cx.hold_head.is_zero() {
        tokio::time::sleep(cx.hold_head).await;
    }
    let faulted =
        Faulted::new(body, faults, cx, conn, h2, hits, processing).with_trailers(trailers);
    Ok(Response::from_parts(
        parts,
        ReplyBody::Forwarded(Box::new(faulted)),
    ))
}

/// Makes `parts` the request's head as it goes upstream on `route`: same method,
/// path and headers, minus hop-by-hop headers, in the route's version. The client's
/// Host (or HTTP/2 authority) is kept: as Host to HTTP/1.1, as `:authority` to
/// HTTP/2; the connection goes to the route's upstream whatever it names.
fn outbound(parts: &mut request::Parts, route: &Route) -> Result<(), String> {
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .is_some();
    let authority = |parts: &request::Parts| match parts
        .headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
    {
        Some(host) => host.to_string(),
        None => parts
            .uri
            .authority()
            .map_or_else(|| route.upstream.to_string(), |a| a.to_string()),
    };
    if route.origin_form() {
        // HTTP/1.1 to the origin: the target as the client sent it (the pool puts
        // an absolute one in origin form), the Host as it named it.
        if !host && let Ok(host) = HeaderValue::from_str(&authority(parts)) {
            parts.headers.insert(header::HOST, host);
        }
        strip_hop_by_hop(&mut parts.headers);
        parts.version = route.version;
        return Ok(());
    }
    let authority = authority(parts);
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = format!("{}://{authority}{path}", route.scheme)
        .parse::<Uri>()
        .map_err(|e| format!("bad request target: {e}"))?;
    // gRPC servers want `te: trailers`, the one TE value HTTP/2 allows.
    let te_trailers = parts
        .headers
        .get_all(header::TE)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("trailers")));
    strip_hop_by_hop(&mut parts.headers);
    parts.version = route.version;
    if route.version == Version::HTTP_2 {
        parts.headers.remove(header::HOST);
        if te_trailers {
            parts
                .headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
    } else if let Ok(host) = HeaderValue::from_str(&authority) {
        parts.headers.insert(header::HOST, host);
    }
    Ok(())
}

/// The header a self-naming backend answers with (snag's lab backends do).
static X_INSTANCE: HeaderName = HeaderName::from_static("x-instance");

/// Names, not strings: a string is parsed into a name on every removal.
/// Connection first: [`strip_hop_by_hop`] reads the names it lists only if it is there.
static HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes the headers that describe one hop (RFC 9110 §7.6.1), and those the
/// Connection header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most requests carry none and most responses one (`Connection: keep-alive`):
    // one pass over the names finds which, and only those are removed (a removal
    // hashes its name). A Connection token that is itself one of them, or
    // `close`, names nothing more to look for.
    let mut present = [false; HOP_BY_HOP.len()];
    for name in headers.keys() {
        if let Some(i) = hop_index(name.as_str()) {
            present[i] = true;
        }
    }
    if present[0] {
        // Almost always `keep-alive` or `close`: a match on the string says so; a
        // token naming some other header is rare, and only then is a name made.
        let values = headers.get_all(header::CONNECTION).iter();
        let named: Vec<HeaderName> = tokens(values.filter_map(|v| v.to_str().ok()))
            .filter(|token| !connection_option(token))
            .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for (name, _) in HOP_BY_HOP.iter().zip(present).filter(|(_, here)| *here) {
        headers.remove(name);
    }
}

/// The options Connection header `values` list (RFC 9110 §7.6.1), trimmed, in order.
pub(in crate::proxy::http) fn tokens<'a>(
    values: impl Iterator<Item = &'a str>,
) -> impl Iterator<Item = &'a str> {
    values
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Whether a Connection token names nothing to remove besides what is removed
/// anyway: `close`, or one of [`HOP_BY_HOP`], in any case.
fn connection_option(token: &str) -> bool {
    if token == "close" || hop_index(token).is_some() {
        return true;
    }
    token.eq_ignore_ascii_case("close")
        || HOP_BY_HOP
            .iter()
            .any(|hop| token.eq_ignore_ascii_case(hop.as_str()))
}

/// Where `name` (lower case, as header names are) is in [`HOP_BY_HOP`]: a match on
/// the string, cheaper than comparing seven names.
fn hop_index(name: &str) -> Option<usize> {
    Some(match name {
        "connection" => 0,
        "keep-alive" => 1,
        "proxy-connection" => 2,
        "te" => 3,
        "trailer" => 4,
        "transfer-encoding" => 5,
        "upgrade" => 6,
        _ => return None,
    })
}

fn plain(status: StatusCode, text: String) -> Response<ReplyBody> {
    let mut reply = Response::new(ReplyBody::answer(Bytes::from(text), None));
    *reply.status_mut() = status;
    reply.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (HeaderName::from_static(k), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn hop_index_knows_each_hop_by_hop_name_and_its_place() {
        for (i, name) in HOP_BY_HOP.iter().enumerate() {
            assert_eq!(hop_index(name.as_str()), Some(i), "{name}");
        }
        assert_eq!(hop_index("content-length"), None);
    }

    #[test]
    fn hop_by_hop_headers_go_and_the_rest_stay_in_order() {
        let end_to_end = [
            ("content-type", "text/plain"),
            ("x-a", "1"),
            ("date", "now"),
        ];
        let mut plain = headers(&end_to_end);
        strip_hop_by_hop(&mut plain);
        assert_eq!(plain, headers(&end_to_end));

        let mut hop = headers(&[
            ("content-type", "text/plain"),
            ("connection", "x-a, Keep-Alive"),
            ("keep-alive", "timeout=5"),
            ("x-a", "1"),
            ("te", "trailers"),
            ("x-b", "2"),
        ]);
        strip_hop_by_hop(&mut hop);
        assert_eq!(
            hop,
            headers(&[("content-type", "text/plain"), ("x-b", "2")])
        );

        // `close` is an option, not a name; upper case names a header all the same.
        let mut close = headers(&[("connection", "close, X-B"), ("x-a", "1"), ("x-b", "2")]);
        strip_hop_by_hop(&mut close);
        assert_eq!(close, headers(&[("x-a", "1")]));

        // Options in any case, empty list elements, no space after a comma.
        let mut odd = headers(&[
            ("connection", "CLOSE, ,Keep-Alive,x-c"),
            ("x-c", "3"),
            ("x-a", "1"),
        ]);
        strip_hop_by_hop(&mut odd);
        assert_eq!(odd, headers(&[("x-a", "1")]));

        // One hop-by-hop header alone, without Connection naming it.
        let mut upgrade = headers(&[("upgrade", "websocket"), ("x-a", "1")]);
        strip_hop_by_hop(&mut upgrade);
        assert_eq!(upgrade, headers(&[("x-a", "1")]));
    }
}
