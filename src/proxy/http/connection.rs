//! One client connection in HTTP mode: its TLS handshake, hyper serving it through
//! the HTTP/2 frame layer, and the drains, shutdowns, idle closes and GOAWAYs that
//! end it. Its exchanges are [`super::exchange`]'s.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper::{Request, Version, body::Incoming, header::HeaderName, service::service_fn};
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use tokio::{net::TcpStream, sync::mpsc};
use tokio_rustls::TlsAcceptor;
use tracing::debug;

use super::{exchange, frames, gated::Gated, goaway, keepalive, upstream::Upstreams};
use crate::{
    capture::{
        self, CLIENT_LEG, Record,
        tap::{Notes, Tapped},
        tcp::Peer,
    },
    fault::ConnId,
    fault::{Fault, Kind, Scope, config::ProxyConfig},
    proxy::{
        Proxy, RunContext,
        relay::{self, Control, Evidence, Faults, OnUpstreamError, Waiter},
        socket,
    },
    tls,
};

/// What HTTP mode needs besides the proxy's state: TLS for the client leg, and the
/// clients of the upstream leg. Made with the proxy, so that a bad certificate is
/// an error when it starts; each listener serves with its own copies
/// ([`Legs::for_listener`], one per worker thread), whose pooled upstream
/// connections end with it.
pub struct Legs {
    /// TLS on the listeners, if any.
    acceptor: Option<TlsAcceptor>,
    pub(super) upstreams: Upstreams,
    /// The proxy's transaction id headers, parsed once: a name given as a string is
    /// parsed again on every lookup.
    pub(super) id_headers: Arc<[HeaderName]>,
}

impl std::fmt::Debug for Legs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Legs")
            .field("tls", &self.acceptor.is_some())
            .finish()
    }
}

impl Legs {
    /// The legs `config` describes; `Err` says which setting cannot be used and why.
    pub fn new(config: &ProxyConfig, context: &RunContext) -> Result<Legs, String> {
        config.check_legs()?;
        let acceptor = match &config.tls {
            Some(listen) => {
                let identity = tls::Identity::of(listen).map_err(|e| format!("TLS: {e}"))?;
                let server =
                    tls::server(identity, context.key_log()).map_err(|e| format!("TLS: {e}"))?;
                Some(TlsAcceptor::from(server))
            }
            None => None,
        };
        let upstreams =
            Upstreams::new(config, context).map_err(|e| format!("upstream TLS: {e}"))?;
        let id_headers = config
            .id_headers
            .iter()
            .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
            .collect();
        Ok(Legs {
            acceptor,
            upstreams,
            id_headers,
        })
    }

    /// The same settings with no upstream connection yet: one listener's, so that
    /// its pooled connections (and the capture senders they hold) end with it.
    pub fn for_listener(&self) -> Legs {
        Legs {
            acceptor: self.acceptor.clone(),
            upstreams: self.upstreams.fresh(),
            id_headers: self.id_headers.clone(),
        }
    }
}

/// The longest a client's TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What one client connection's exchanges share.
pub(super) struct Conn {
    pub(super) proxy: Arc<Proxy>,
    /// The proxy's name, shared by every exchange's hooks.
    pub(super) name: Arc<str>,
    pub(super) faults: SeenFaults,
    pub(super) legs: Arc<Legs>,
    /// The client socket hyper serves: setting SO_LINGER 0 through it turns the
    /// close hyper makes into an RST.
    pub(super) socket: socket::Shared,
    /// Whether it carried an HTTP/2 request (a drain's GOAWAY is counted then).
    pub(super) h2: Arc<std::sync::atomic::AtomicBool>,
    /// Requests carried and in flight, and a close armed for when it is idle.
    pub(super) keepalive: Arc<keepalive::Keepalive>,
    /// HTTP/2: its streams, frames and `goaway`.
    pub(super) h2conn: Arc<goaway::H2Conn>,
    /// `Probe` when it came through the probe listener: every request is a probe.
    pub(super) class: Scope,
    /// The capture and this connection's key in it, if capturing.
    pub(super) tap: Option<(mpsc::Sender<Record>, u64)>,
    /// If capturing: comments for the next bytes written to the client.
    pub(super) notes: Option<Arc<Notes>>,
    /// What the proxy asks of it (shutdown, drain, reset).
    pub(super) control: Arc<Control>,
}

/// The proxy's faults as one connection last read them. Each request looks at
/// them, and a read of the proxy's watch takes its lock: a write to one cache line
/// that every connection on every worker would make. The watch is read here only
/// when it has changed (a plain load); otherwise the copy is, under a lock of the
/// connection's own.
pub(super) struct SeenFaults(Mutex<(Faults, Arc<Vec<Arc<Fault>>>)>);

impl SeenFaults {
    fn new(mut watch: Faults) -> SeenFaults {
        let now = watch.borrow_and_update().clone();
        SeenFaults(Mutex::new((watch, now)))
    }

    /// What `f` makes of the faults on now, in the order they were added.
    pub(super) fn with<T>(&self, f: impl FnOnce(&[Arc<Fault>]) -> T) -> T {
        let mut seen = self
            .0
            .lock()
            .expect("no code panics holding a connection's faults");
        let (watch, now) = &mut *seen;
        // `Err`: the proxy is gone, and its faults with it; the last ones stay.
        if watch.has_changed().unwrap_or(false) {
            *now = watch.borrow_and_update().clone();
        }
        f(now)
    }
}

impl Conn {
    /// Records the RST snag is about to send the client, if capturing.
    pub(super) fn record_reset(&self, why: &str) {
        record_reset(&self.tap, &self.notes, why);
    }
}

/// Records an RST from snag on a client leg; a full queue drops it (resets are rare,
/// and the wait would have to happen where no await is possible). Where the relay
/// carries the client leg (`tap` is `None`), the reason goes with the RST it sends.
pub(super) fn record_reset(
    tap: &Option<(mpsc::Sender<Record>, u64)>,
    notes: &Option<Arc<Notes>>,
    why: &str,
) {
    if tap.is_none()
        && let Some(notes) = notes
    {
        notes.add(format!("snag: {why}"));
    }
    if let Some((tx, key)) = tap {
        let note = Some(format!("snag: {why}"));
        let _ = tx.try_send(Record::Rst {
            conn: *key,
            leg: CLIENT_LEG,
            from: Peer::Acceptor,
            note,
            at: capture::now(),
        });
    }
}

/// Serves one client connection in HTTP mode until it closes, the proxy goes down
/// or shuts down.
///
/// While the proxy has a TCP fault on, the connection's bytes go through the relay
/// and its stages first (client socket ⇄ relay ⇄ in-memory pipe ⇄ hyper): the
/// relay then carries the capture of the client leg, and a FIN or RST that HTTP
/// mode asks for reaches the client after what the faults still hold.
pub async fn handle(
    stream: TcpStream,
    proxy: Arc<Proxy>,
    faults: Faults,
    control: Arc<Control>,
    legs: Arc<Legs>,
    class: Scope,
    number: u64,
) {
    let _ = stream.set_nodelay(true);
    let staged = faults.borrow().iter().any(|f| f.kind.is_stage());
    if !staged {
        let socket = socket::Shared::new(stream);
        return http(
            socket,
            proxy,
            faults,
            control,
            legs,
            class,
            ClientLeg::Here(number),
        )
        .await;
    }
    let (socket, mut pipe) = socket::Shared::pipe();
    let mut client = stream;
    let name = proxy.name.clone();
    let tap = proxy.tap();
    let notes = tap.as_ref().map(|_| Arc::new(Notes::default()));
    let evidence = Evidence {
        tap,
        snaplen: proxy.snaplen(),
        counters: Some(proxy.counters.clone()),
        notes: notes.clone(),
    };
    let (faults_relayed, control_relayed) = (faults.clone(), control.clone());
    let id = ConnId {
        seed: proxy.seed(),
        proxy: &name,
        conn: number,
        class,
    };
    let relayed = async move {
        let outcome = relay::run(
            &mut client,
            &mut pipe,
            &faults_relayed,
            &control_relayed,
            id,
            OnUpstreamError::Reset,
            evidence,
        )
        .await;
        // Closed as soon as the relay ends: hyper then sees its end of the pipe
        // close, and the client its FIN or RST, without waiting for each other.
        drop((client, pipe));
        outcome
    };
    let served = http(
        socket,
        proxy.clone(),
        faults.clone(),
        control.clone(),
        legs,
        class,
        ClientLeg::Relayed(notes),
    );
    let (outcome, ()) = tokio::join!(relayed, served);
    if outcome.fault_reset {
        proxy.counters().fault_reset();
        proxy.event(
            "fault_reset",
            serde_json::json!({ "connection": number, "faults": outcome.hit }),
        );
    }
}

/// Where the client leg is captured.
enum ClientLeg {
    /// Here, as connection `number` of the proxy, if a capture is on.
    Here(u64),
    /// By the relay that feeds the pipe hyper reads; it takes these comments.
    Relayed(Option<Arc<Notes>>),
}

/// HTTP on the client's socket or on the relay's pipe.
async fn http(
    socket: socket::Shared,
    proxy: Arc<Proxy>,
    faults: Faults,
    control: Arc<Control>,
    legs: Arc<Legs>,
    class: Scope,
    leg: ClientLeg,
) {
    let (stream, tap, notes) = match leg {
        ClientLeg::Relayed(notes) => (Tapped::plain(socket.clone()), None, notes),
        ClientLeg::Here(number) => {
            // A client leg of its own: upstream connections are pooled and shared.
            let tap = proxy
                .tap()
                .map(|tx| (tx, capture::key(&proxy.name, number)));
            let notes = tap.as_ref().map(|_| Arc::new(Notes::default()));
            let stream = match (&tap, socket.ends()) {
                (Some((tx, key)), Some(ends)) => {
                    let _ = tx
                        .send(Record::OpenLeg {
                            conn: *key,
                            leg: CLIENT_LEG,
                            ends,
                            at: capture::now(),
                        })
                        .await;
                    let notes = notes.clone().unwrap_or_default();
                    Tapped::new(socket.clone(), tx.clone(), *key, CLIENT_LEG, Peer::Acceptor)
                        .with_notes(notes)
                }
                _ => Tapped::plain(socket.clone()),
            };
            (stream, tap, notes)
        }
    };
    let conn = Arc::new(Conn {
        name: Arc::from(proxy.name.as_str()),
        proxy,
        faults: SeenFaults::new(faults.clone()),
        legs,
        socket,
        h2: Arc::default(),
        keepalive: Arc::default(),
        h2conn: Arc::default(),
        class,
        tap,
        notes,
        control: control.clone(),
    });
    over_tls(stream, conn, control, faults, class).await
}

/// The TLS handshake if the listener speaks TLS, then HTTP.
async fn over_tls(
    stream: Tapped<socket::Shared>,
    conn: Arc<Conn>,
    control: Arc<Control>,
    watched: Faults,
    class: Scope,
) {
    let Some(acceptor) = conn.legs.acceptor.clone() else {
        return serve(stream, conn, control, watched, class).await;
    };
    let handshake = tokio::select! {
        done = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)) => done,
        _ = ended(&control, &watched, true, class) => return,
    };
    match handshake {
        Ok(Ok(stream)) => serve(stream, conn, control, watched, class).await,
        failed => {
            let why = match failed {
                Ok(Err(err)) => err.to_string(),
                _ => format!("no handshake within {} s", HANDSHAKE_TIMEOUT.as_secs()),
            };
            debug!(%why, "TLS handshake failed");
            conn.proxy.counters().tls_failure();
            conn.proxy
                .event("tls_failed", serde_json::json!({ "why": why }));
        }
    }
}

/// Serves HTTP on one client connection, in clear or TLS.
async fn serve<S>(stream: S, conn: Arc<Conn>, control: Arc<Control>, watched: Faults, class: Scope)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let watched_proxy = conn.proxy.clone();
    let (h2, socket, tap) = (conn.h2.clone(), conn.socket.clone(), conn.tap.clone());
    let notes = conn.notes.clone();
    let keepalive = conn.keepalive.clone();
    let h2conn = conn.h2conn.clone();
    let wire = frames::Wire::new(stream, h2conn.frames.clone());
    let service = service_fn(move |req: Request<Incoming>| {
        // Here, not in the future: hyper calls this in the order the streams opened,
        // the order the frame layer read their ids in.
        let stream = if req.version() == Version::HTTP_2 {
            conn.h2conn.next_stream()
        } else {
            None
        };
        let conn = conn.clone();
        async move { exchange(req, &conn, stream).await }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let serving = builder.serve_connection(TokioIo::new(wire.shim()), service);
    let mut serving = std::pin::pin!(serving);
    let mut drained = false;
    let mut closing = false;
    loop {
        // The waits beside hyper, polled only when one of them was woken: the
        // socket wakes this task for every request, they fire once in a while.
        let (watch_idle, seen_drain) = (!closing && !drained, drained);
        let side = std::pin::pin!(async {
            tokio::select! {
                never = h2conn.inject(&wire) => match never {},
                () = h2conn.closing(&wire, &watched_proxy) => Side::GoawayClose,
                idle = keepalive.expired(), if watch_idle => Side::Idle(idle),
                why = ended(&control, &watched, seen_drain, class) => Side::Stop(why),
            }
        });
        let side = tokio::select! {
            side = Gated::new(side) => side,
            done = serving.as_mut() => {
                if let Err(err) = done {
                    if err.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_parse) {
                        watched_proxy.counters().bad_request();
                    }
                    debug!(%err, "http connection ended");
                }
                if drained || closing {
                    socket.close_lingering();
                }
                return;
            }
        };
        match side {
            Side::GoawayClose => {
                // The streams are answered, but their last frames may still be in
                // h2's buffers: let hyper write until nothing more leaves (at most
                // 1 s), so the close cuts no answer short.
                let deadline = tokio::time::Instant::now() + SETTLE_MAX;
                loop {
                    let before = socket.written();
                    tokio::select! {
                        _ = serving.as_mut() => break,
                        _ = tokio::time::sleep(SETTLE_TICK) => {}
                    }
                    if socket.written() == before || tokio::time::Instant::now() >= deadline {
                        break;
                    }
                }
                debug!("http/2 connection closed by a goaway fault");
                socket.close_lingering();
                return;
            }
            Side::Idle(idle) => {
                // An idle HTTP/1.1 connection closes at once (FIN).
                closing = true;
                watched_proxy.event(
                    "keepalive_closed",
                    serde_json::json!({ "idle_ms": idle.as_millis() as u64 }),
                );
                serving.as_mut().graceful_shutdown();
            }
            Side::Stop(Stop::Drain) => {
                // hyper closes idle HTTP/1.1 connections, marks responses in flight
                // `Connection: close`, and sends HTTP/2 connections a GOAWAY (the
                // two-step of RFC 9113 §6.8: first the maximum stream id, then
                // after a PING the last stream it will process).
                drained = true;
                if h2.load(std::sync::atomic::Ordering::Relaxed) {
                    watched_proxy.counters().goaway();
                    watched_proxy.event("goaway", serde_json::json!({}));
                }
                serving.as_mut().graceful_shutdown();
            }
            Side::Stop(Stop::Reset) => {
                record_reset(&tap, &notes, "drain");
                socket.reset_on_close();
                debug!("http connection reset by a drain");
                return;
            }
            Side::Stop(Stop::Close) => {
                debug!("http connection closed by snag");
                return;
            }
        }
    }
}

/// What the waits beside hyper ask of a connection.
enum Side {
    /// A `goaway` fault has played out: close it.
    GoawayClose,
    /// Idle as long as an armed `keepalive_close` allows.
    Idle(Duration),
    Stop(Stop),
}

/// How long a connection a GOAWAY fault closes gets to write what hyper still
/// holds, and the pause that says nothing more is coming.
const SETTLE_MAX: Duration = Duration::from_secs(1);
const SETTLE_TICK: Duration = Duration::from_millis(5);

/// Why snag ends or winds down an HTTP connection.
enum Stop {
    /// Finish gracefully.
    Drain,
    /// RST now.
    Reset,
    /// Close now (shutdown, or the proxy went `down`).
    Close,
}

/// Resolves when snag must act on the connection; `drained`: the drain was seen.
async fn ended(control: &Control, faults: &Faults, drained: bool, class: Scope) -> Stop {
    loop {
        let seen = control.seen();
        if control.is_reset() {
            return Stop::Reset;
        }
        if control.is_shut_down()
            || faults
                .borrow()
                .iter()
                .any(|f| f.kind == Kind::Down && f.acts_on_listener(class))
        {
            return Stop::Close;
        }
        if control.is_draining() && !drained {
            return Stop::Drain;
        }
        control.signalled(Waiter::Http, seen).await;
    }
}
