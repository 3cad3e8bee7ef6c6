//! HTTP mode's upstream leg: pooled keep-alive connections speaking HTTP/1.1, h2c or
//! h2 (with TLS and ALPN) to the proxy's upstream, each new connection captured.
//! HTTP/1.1 goes through snag's own [`pool`], whose connections the exchanges drive;
//! HTTP/2, and TLS where ALPN chooses, through hyper-util's client.

mod h1;
mod outbound;
mod pool;

pub use self::outbound::{OnWhole, Outbound};

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use hyper::{
    Request, Response, Uri, Version,
    body::{Body, Frame, Incoming, SizeHint},
    http::request,
};
use hyper_util::{
    client::legacy::{
        Client,
        connect::{Connected, Connection, HttpConnector},
    },
    rt::{TokioExecutor, TokioIo, TokioTimer},
};
use rustls::ClientConfig;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tokio_rustls::{TlsConnector, client::TlsStream};
use tokio_util::either::Either;

use crate::{
    capture::{self, Record, UPSTREAM_LEG, tap::Tapped, tcp::Peer},
    fault::config::{ProxyConfig, UpstreamProtocol},
    proxy::{Proxy, RunContext},
    tls,
};

/// A pooled client to one upstream address.
pub type Client1 = Client<Connector, Outbound>;

/// The clients a proxy forwards through, made again when its upstream changes (open
/// connections to the old one finish what they carry). Shared by every connection
/// of a listener.
pub struct Upstreams {
    /// TLS to the upstream, set up once: the same for every address.
    tls: Option<Arc<ClientConfig>>,
    current: Mutex<Option<Current>>,
}

/// The upstream a listener sends to, as of one of its proxy's upstream changes.
struct Current {
    changes: u64,
    /// The listener's own copy: each request clones it, and a clone of the proxy's
    /// would write to a line the other workers write too.
    upstream: Arc<str>,
    clients: Clients,
}

use self::pool::{Driven, Pool};

/// What to send one request through.
pub struct Route {
    via: Via,
    /// The version the request goes with (HTTP/2 for h2c and h2; HTTP/1.1 otherwise,
    /// and also where ALPN may turn it into HTTP/2).
    pub version: Version,
    /// `https` or `http`.
    pub scheme: &'static str,
    /// The upstream, host:port.
    pub upstream: Arc<str>,
    /// Set once an HTTP/2 connection to it was answered with HTTP/1.x.
    pub answered_http1: Arc<AtomicBool>,
}

/// A pool of connections driven by the exchanges, or a client with its own tasks.
#[derive(Clone)]
enum Via {
    Pooled(Arc<Pool>),
    Client(Box<Client1>),
}

#[derive(Clone)]
struct Clients {
    /// HTTP/1.1, or what ALPN agrees when TLS is auto.
    h1: Option<Via>,
    /// HTTP/2 only (h2c or h2).
    h2: Option<Via>,
    answered_http1: Arc<AtomicBool>,
}

impl Upstreams {
    /// The clients for a proxy made from `config`, in run `context`; `Err` if its
    /// upstream TLS cannot be set up (an unreadable CA file …).
    pub fn new(config: &ProxyConfig, context: &RunContext) -> Result<Upstreams, tls::Error> {
        let tls = match &config.upstream_tls {
            Some(settings) => {
                let alpn: &[&[u8]] = match config.upstream_protocol {
                    UpstreamProtocol::H2 => &[tls::H2],
                    UpstreamProtocol::Auto => &[tls::H2, tls::HTTP11],
                    UpstreamProtocol::H1 | UpstreamProtocol::H2c => &[tls::HTTP11],
                };
                Some(tls::client(settings, alpn, context.key_log())?)
            }
            None => None,
        };
        Ok(Upstreams {
            tls,
            current: Mutex::new(None),
        })
    }

    /// The same settings, without clients yet.
    pub fn fresh(&self) -> Upstreams {
        Upstreams {
            tls: self.tls.clone(),
            current: Mutex::new(None),
        }
    }

    /// Where a request to `proxy` that came as `version` goes now.
    pub fn route(&self, proxy: &Proxy, version: Version) -> Route {
        let changes = proxy.upstream_changes();
        let (upstream, clients) = {
            let mut current = self
                .current
                .lock()
                .expect("no code panics holding the upstream clients");
            if current.as_ref().is_none_or(|now| now.changes != changes) {
                let upstream = proxy.upstream();
                match &mut *current {
                    // Set again to the same address: the clients stay.
                    Some(now) if *now.upstream == *upstream => now.changes = changes,
                    _ => {
                        let upstream: Arc<str> = Arc::from(&*upstream);
                        *current = Some(Current {
                            changes,
                            clients: self.clients(proxy, &upstream),
                            upstream,
                        });
                    }
                }
            }
            let now = current.as_ref().expect("made above when missing");
            (now.upstream.clone(), now.clients.clone())
        };
        let (via, version) = match (clients.h1, clients.h2) {
            (Some(h1), Some(h2)) => {
                if version == Version::HTTP_2 {
                    (h2, Version::HTTP_2)
                } else {
                    (h1, Version::HTTP_11)
                }
            }
            (Some(h1), None) => (h1, Version::HTTP_11),
            (None, Some(h2)) => (h2, Version::HTTP_2),
            (None, None) => unreachable!("clients() makes at least one"),
        };
        Route {
            via,
            version,
            scheme: if self.tls.is_some() { "https" } else { "http" },
            upstream,
            answered_http1: clients.answered_http1,
        }
    }

    fn clients(&self, proxy: &Proxy, upstream: &Arc<str>) -> Clients {
        let protocol = proxy.config().upstream_protocol;
        let answered_http1 = Arc::new(AtomicBool::new(false));
        let client = |h2_only: bool| {
            let sniff = h2_only.then(|| answered_http1.clone());
            let connector =
                self.connector(proxy, upstream, protocol == UpstreamProtocol::H2, sniff);
            if !h2_only && (protocol == UpstreamProtocol::H1 || self.tls.is_none()) {
                // Always HTTP/1.1 on the wire: no ALPN can turn it into HTTP/2.
                return Via::Pooled(Pool::new(connector));
            }
            let mut builder = Client::builder(TokioExecutor::new());
            builder
                .pool_idle_timeout(Duration::from_secs(90))
                .pool_timer(TokioTimer::new())
                .timer(TokioTimer::new())
                .http2_only(h2_only);
            Via::Client(Box::new(builder.build(connector)))
        };
        match (protocol, self.tls.is_some()) {
            (UpstreamProtocol::H1, _) | (UpstreamProtocol::Auto, true) => Clients {
                h1: Some(client(false)),
                h2: None,
                answered_http1,
            },
            (UpstreamProtocol::H2c | UpstreamProtocol::H2, _) => Clients {
                h1: None,
                h2: Some(client(true)),
                answered_http1,
            },
            (UpstreamProtocol::Auto, false) => Clients {
                h1: Some(client(false)),
                h2: Some(client(true)),
                answered_http1,
            },
        }
    }

    fn connector(
        &self,
        proxy: &Proxy,
        upstream: &Arc<str>,
        require_h2: bool,
        sniff: Option<Arc<AtomicBool>>,
    ) -> Connector {
        let context = proxy.context();
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(context.connect_timeout));
        let tls = self.tls.clone().map(|config| Tls {
            connector: TlsConnector::from(config),
            sni: proxy
                .config()
                .upstream_tls
                .as_ref()
                .and_then(|t| t.sni.clone()),
            require_h2,
        });
        Connector {
            http,
            target: upstream.clone(),
            tls,
            capture: context.capture.clone(),
            capturing: proxy.capture_switch(),
            name: Arc::from(format!("{}/upstream", proxy.name)),
            next: Default::default(),
            sniff,
        }
    }
}

impl Route {
    /// Whether the request goes with its target in origin form (`/path?query`), as
    /// HTTP/1.1 to the origin; otherwise absolute, with scheme and authority.
    pub fn origin_form(&self) -> bool {
        matches!(self.via, Via::Pooled(_))
    }

    /// Sends the request with `head` and `body` upstream; the response's body
    /// streams from the upstream.
    pub async fn request(
        &self,
        head: request::Parts,
        body: Outbound,
    ) -> Result<Response<UpstreamBody>, BoxError> {
        match &self.via {
            Via::Pooled(pool) => Ok(pool.send(&head, body).await?.map(UpstreamBody::Pooled)),
            Via::Client(client) => Ok(client
                .request(Request::from_parts(head, body))
                .await?
                .map(UpstreamBody::Client)),
        }
    }
}

/// A response body from the upstream.
pub enum UpstreamBody {
    /// From a connection of snag's pool, which the body drives.
    Pooled(Driven),
    /// From hyper-util's client.
    Client(Incoming),
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            UpstreamBody::Pooled(body) => Pin::new(body).poll_frame(cx),
            UpstreamBody::Client(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            UpstreamBody::Pooled(body) => body.is_end_stream(),
            UpstreamBody::Client(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            UpstreamBody::Pooled(body) => body.size_hint(),
            UpstreamBody::Client(body) => body.size_hint(),
        }
    }
}

/// TLS to the upstream on a connector.
#[derive(Clone)]
struct Tls {
    connector: TlsConnector,
    sni: Option<String>,
    require_h2: bool,
}

/// hyper-util's connector, always to one upstream (whatever the request's authority
/// says), each new connection captured and, with TLS, wrapped after the capture so
/// the capture holds what crossed the wire.
#[derive(Clone)]
pub struct Connector {
    http: HttpConnector,
    target: Arc<str>,
    tls: Option<Tls>,
    capture: Option<Arc<capture::Capture>>,
    /// The proxy's switch: off, new connections are not captured.
    capturing: Arc<AtomicBool>,
    name: Arc<str>,
    next: Arc<AtomicU64>,
    /// HTTP/2-only clients: set if an upstream answers the preface with HTTP/1.x.
    sniff: Option<Arc<AtomicBool>>,
}

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Leg>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let target = self.target.clone();
        let to: Result<Uri, _> = format!("http://{target}/").parse();
        let connecting = to.map(|to| self.http.call(to));
        let this = self.clone();
        Box::pin(async move {
            let stream = connecting
                .map_err(|e| format!("upstream `{target}` is not host:port: {e}"))?
                .await?
                .into_inner();
            let stream = this.tapped(stream).await?;
            let sniff = this.sniff.clone();
            let Some(tls) = &this.tls else {
                return Ok(TokioIo::new(Leg::plain(stream, sniff)));
            };
            let name = tls::server_name(tls.sni.as_deref(), &target)?;
            let not_h2 = |chose: &str| {
                format!(
                    "TLS to {target}: the upstream did not agree to h2 by ALPN ({chose}); \
                     it does not speak HTTP/2 over TLS: use upstream protocol h1 or auto"
                )
            };
            let stream = match tls.connector.connect(name, stream).await {
                Ok(stream) => stream,
                Err(err) => {
                    let text = err.to_string();
                    if tls.require_h2 && text.contains("NoApplicationProtocol") {
                        return Err(not_h2("it refused it: no_application_protocol alert").into());
                    }
                    return Err(format!("TLS to {target}: {text}").into());
                }
            };
            let alpn = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
            if tls.require_h2 && alpn.as_deref() != Some(tls::H2) {
                let chose = match &alpn {
                    Some(p) => format!("it chose `{}`", String::from_utf8_lossy(p)),
                    None => "it chose none".to_string(),
                };
                return Err(not_h2(&chose).into());
            }
            Ok(TokioIo::new(Leg::tls(
                stream,
                alpn.as_deref() == Some(tls::H2),
                sniff,
            )))
        })
    }
}

impl Connector {
    async fn tapped(&self, stream: TcpStream) -> io::Result<Tapped<TcpStream>> {
        let tap = self
            .capture
            .as_ref()
            .filter(|_| self.capturing.load(Ordering::Relaxed))
            .and_then(|c| c.sender());
        let Some(tx) = &tap else {
            return Ok(Tapped::plain(stream));
        };
        let key = capture::key(&self.name, self.next.fetch_add(1, Ordering::Relaxed));
        let ends = (stream.local_addr()?, stream.peer_addr()?);
        let _ = tx
            .send(Record::OpenLeg {
                conn: key,
                leg: UPSTREAM_LEG,
                ends,
                at: capture::now(),
            })
            .await;
        Ok(Tapped::new(
            stream,
            tx.clone(),
            key,
            UPSTREAM_LEG,
            Peer::Initiator,
        ))
    }
}

/// One upstream connection: plain or TLS, with what its first bytes said.
pub struct Leg {
    io: Either<Tapped<TcpStream>, Box<TlsStream<Tapped<TcpStream>>>>,
    h2: bool,
    /// Set if the first bytes read are an HTTP/1.x status line.
    sniff: Option<Arc<AtomicBool>>,
}

impl Leg {
    fn plain(stream: Tapped<TcpStream>, sniff: Option<Arc<AtomicBool>>) -> Leg {
        Leg {
            io: Either::Left(stream),
            h2: false,
            sniff,
        }
    }

    fn tls(stream: TlsStream<Tapped<TcpStream>>, h2: bool, sniff: Option<Arc<AtomicBool>>) -> Leg {
        Leg {
            io: Either::Right(Box::new(stream)),
            h2,
            sniff,
        }
    }
}

impl Connection for Leg {
    fn connected(&self) -> Connected {
        let tcp = match &self.io {
            Either::Left(s) => s.get_ref(),
            Either::Right(s) => s.get_ref().0.get_ref(),
        };
        let connected = tcp.connected();
        if self.h2 {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

impl AsyncRead for Leg {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled
            && buf.filled().len() > before
            && let Some(flag) = this.sniff.take()
            && buf.filled()[before..].starts_with(b"HTTP/1.")
        {
            flag.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Leg {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
