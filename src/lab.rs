//! The parts a case needs when the user brings nothing: self-naming backends
//! ([`backend`]), a reference balancer ([`balancer`]) and a load generator ([`load`]).

pub mod backend;
pub mod balancer;
pub mod driver;
pub mod listen;
pub mod load;

use std::{convert::Infallible, future::Future, net::SocketAddr, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, header, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use tokio::net::TcpListener;
use tracing::debug;

use crate::shutdown::Shutdown;

/// Serves HTTP/1.1 and HTTP/2 (prior knowledge) on `listener`, answering each request
/// with `handle(request, peer)`, until `shutdown`, which stops accepting and drops
/// every open connection at once, as a killed process would.
pub(crate) async fn serve_http<F, Fut, B>(listener: TcpListener, shutdown: Shutdown, handle: F)
where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_https(listener, None, shutdown, handle).await
}

/// [`serve_http`], over TLS when `tls` is given (ALPN says HTTP/2 or HTTP/1.1).
pub(crate) async fn serve_https<F, Fut, B>(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: Shutdown,
    handle: F,
) where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // EMFILE and friends: wait for descriptors to free up.
                debug!(%err, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (handle, shutdown, tls) = (handle.clone(), shutdown.clone(), tls.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let answer = handle(req, peer);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            let Some(tls) = tls else {
                let serving = builder.serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = shutdown.wait() => {}
                    _ = serving => {}
                }
                return;
            };
            let handshake = tokio::time::timeout(Duration::from_secs(10), tls.accept(stream));
            let stream = tokio::select! {
                _ = shutdown.wait() => return,
                done = handshake => match done {
                    Ok(Ok(stream)) => stream,
                    failed => {
                        debug!(?failed, "TLS handshake failed");
                        return;
                    }
                },
            };
            let serving = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = shutdown.wait() => {}
                _ = serving => {}
            }
        });
    }
}

/// A JSON response with one naming header (`x-instance`, `x-backend`).
fn json(
    status: StatusCode,
    (name, value): (&'static str, &str),
    body: &serde_json::Value,
) -> Response<Full<Bytes>> {
    let mut text = body.to_string();
    text.push('\n');
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    if let Ok(value) = header::HeaderValue::from_str(value) {
        headers.insert(name, value);
    }
    response
}
