//! The balancer's client to its backends: pooled keep-alive HTTP/1.1, or HTTP/2 in
//! clear (prior knowledge) or over TLS (ALPN `h2`, checked against a CA).

use std::{
    future::Future,
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Uri;
use hyper_util::{
    client::legacy::{
        Client,
        connect::{Connected, Connection, HttpConnector},
    },
    rt::{TokioExecutor, TokioIo},
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tokio_rustls::{TlsConnector, client::TlsStream};
use tokio_util::either::Either;

use super::{BackendProtocol, Config};

/// The pooled client.
pub(super) type Backends = Client<Connector, Full<Bytes>>;

/// How `config` dials its backends; `Err` says why its TLS cannot be set up.
pub(super) fn connector(config: &Config) -> Result<Connector, String> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_connect_timeout(Some(config.timeout));
    // The scheme says TLS or not; the connector dials the address either way.
    http.enforce_http(false);
    let tls = match config.protocol {
        BackendProtocol::H2 => {
            let trust = crate::tls::UpstreamTls {
                ca: config.backend_ca.clone(),
                ..crate::tls::UpstreamTls::default()
            };
            let client = crate::tls::client(&trust, &[crate::tls::H2], None)
                .map_err(|e| format!("TLS to the backends: {e}"))?;
            Some(TlsConnector::from(client))
        }
        _ => None,
    };
    Ok(Connector { http, tls })
}

/// The pooled client `config` asks for, dialling with `connector`.
pub(super) fn backends(config: &Config, connector: Connector) -> Backends {
    let mut builder = Client::builder(TokioExecutor::new());
    builder.pool_idle_timeout(Duration::from_secs(60));
    if config.protocol != BackendProtocol::H1 {
        builder.http2_only(true);
    }
    builder.build(connector)
}

/// Dials a backend, then TLS if the protocol is `h2`.
#[derive(Clone)]
pub(super) struct Connector {
    http: HttpConnector,
    tls: Option<TlsConnector>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Io>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
        let connecting = self.http.call(uri);
        let tls = self.tls.clone();
        Box::pin(async move {
            let tcp = connecting.await?.into_inner();
            let Some(tls) = tls else {
                return Ok(TokioIo::new(Io(Either::Left(tcp))));
            };
            let name = crate::tls::server_name(None, &authority)?;
            let stream = tls
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS to backend {authority}: {e}"))?;
            if stream.get_ref().1.alpn_protocol() != Some(crate::tls::H2) {
                return Err(format!(
                    "TLS to backend {authority}: it did not agree to h2 by ALPN: it does not speak HTTP/2 over TLS"
                )
                .into());
            }
            Ok(TokioIo::new(Io(Either::Right(Box::new(stream)))))
        })
    }
}

/// A backend connection, in clear or TLS.
pub(super) struct Io(Either<TcpStream, Box<TlsStream<TcpStream>>>);

impl Connection for Io {
    fn connected(&self) -> Connected {
        match &self.0 {
            Either::Left(tcp) => tcp.connected(),
            Either::Right(tls) => tls.get_ref().0.connected().negotiated_h2(),
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Whether a request failed because its pooled connection closed before any of the
/// answer came (hyper's incomplete message): the race of a backend's keep-alive
/// timeout with the reuse. An idempotent request may go again, on a fresh
/// connection, as Go's transport and browsers do.
pub(super) fn stale_connection(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
            return hyper.is_incomplete_message();
        }
        source = e.source();
    }
    false
}

/// Whether a failed request was never processed by the backend, as HTTP/2 says
/// (RFC 9113 §8.7): its stream was above a GOAWAY's last-stream-id, or refused
/// with REFUSED_STREAM. Such a request may go again whatever its method, and its
/// failure is the connection's lifecycle, not the backend's health.
/// Only the backend's own frames say so: a GOAWAY this client sent on finding a
/// protocol error fails every stream with the same kind of error, processed or not.
pub(super) fn unprocessed(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_remote()
                && (h2.is_go_away() || h2.reason() == Some(h2::Reason::REFUSED_STREAM));
        }
        source = e.source();
    }
    false
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("tls", &self.tls.is_some())
            .finish()
    }
}
