//! One listener's accept loop: the listener faults (`down`, `syn_drop`), draining,
//! and a task per accepted connection.

use std::{
    collections::HashSet,
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use tokio::{
    net::{TcpListener, TcpStream},
    time::timeout,
};
use tokio_util::task::TaskTracker;
use tracing::{Instrument, info, info_span, warn};

use super::{Mode, Proxy, socket};
use crate::{
    fault::{
        Fault, Kind, Scope,
        drain::{Drain, NewConns},
    },
    shutdown::Shutdown,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listening {
    Accepting,
    Down,
    SynDrop,
    /// Draining without refusing: the listener stays, nothing is accepted.
    Paused,
}

pub(super) async fn serve(
    listener: TcpListener,
    proxy: Arc<Proxy>,
    class: Scope,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    let mut faults = proxy.faults.subscribe();
    let mut drains = proxy.drain.subscribe();
    let mut unready = proxy.unready_changes();
    let mut listener = Some(listener);
    let mut plugs = Plugs::default();
    let mut errors = socket::AcceptErrors::default();
    let mut retry_at: Option<tokio::time::Instant> = None;
    let what = format!("{} {addr}", proxy.name);
    let tracker = TaskTracker::new();
    // One copy of the legs per worker: a worker's connections share its pool.
    let workers = proxy.context.workers.as_deref();
    let http: Option<Vec<_>> = proxy.http_legs().map(|legs| {
        (0..workers.map_or(1, |w| w.len()))
            .map(|_| Arc::new(legs.for_listener()))
            .collect()
    });
    info!(proxy = %proxy.name, %addr, upstream = %proxy.upstream(), "listening");
    loop {
        let fault_state = fault_state(&faults.borrow_and_update(), class);
        let not_ready = unready.borrow_and_update().is_some();
        let state = match *drains.borrow_and_update() {
            Some((
                Drain {
                    new: NewConns::Refuse,
                    ..
                },
                _,
            )) => Listening::Down,
            Some((
                Drain {
                    new: NewConns::Ignore,
                    ..
                },
                _,
            )) => Listening::Paused,
            // A readiness drain's first step: a TCP probe listener refuses, as a
            // port with nothing ready behind it (HTTP answers its probes 503).
            None if class == Scope::Probe && proxy.config.mode == Mode::Tcp && not_ready => {
                Listening::Down
            }
            None => fault_state,
        };
        match state {
            Listening::Down if listener.is_some() => {
                listener = None;
                info!(proxy = %proxy.name, %addr, "listener closed (down)");
            }
            Listening::Accepting | Listening::SynDrop | Listening::Paused if listener.is_none() => {
                match socket::bind(addr) {
                    Ok(l) => {
                        info!(proxy = %proxy.name, %addr, "listening again");
                        listener = Some(l);
                    }
                    Err(err) => {
                        warn!(proxy = %proxy.name, %addr, %err, "could not listen again; waiting for the next change")
                    }
                }
            }
            _ => {}
        }
        if let Some(l) = &listener {
            if state == Listening::SynDrop && plugs.streams.is_empty() {
                plugs.fill(l, addr).await;
            } else if state != Listening::SynDrop && !plugs.streams.is_empty() {
                plugs.drain(l);
            }
        }
        let accepting = state == Listening::Accepting && listener.is_some() && retry_at.is_none();
        tokio::select! {
            biased;
            _ = shutdown.wait() => break,
            changed = faults.changed() => if changed.is_err() { break },
            _ = drains.changed() => {}
            _ = unready.changed() => {}
            _ = async { tokio::time::sleep_until(retry_at.expect("branch runs only when waiting")).await }, if retry_at.is_some() => retry_at = None,
            accepted = async { listener.as_ref().expect("branch runs only with a listener").accept().await }, if accepting => {
                match accepted {
                    Ok((stream, peer)) if plugs.addrs.remove(&peer) => drop(stream),
                    Ok((stream, peer)) => {
                        errors.accepted(&what);
                        let conn = proxy.next_conn.fetch_add(1, Ordering::Relaxed);
                        let span = info_span!("conn", proxy = %proxy.name, id = conn, %peer);
                        // Registered here, not in the task, so a shutdown that comes
                        // before the task first runs still reaches it.
                        let control = proxy.register(conn);
                        match &http {
                            Some(legs) => {
                                let worker = workers.map_or(0, |w| w.next());
                                let (proxy, faults, legs) = (proxy.clone(), faults.clone(), legs[worker].clone());
                                let serve = move |stream: std::io::Result<TcpStream>| async move {
                                    if let Ok(stream) = stream {
                                        super::http::handle(stream, proxy.clone(), faults, control, legs, class, conn).await;
                                    }
                                    proxy.unregister(conn);
                                }.instrument(span);
                                match workers {
                                    Some(w) => w.hand_off(worker, stream, &tracker, serve),
                                    None => { tracker.spawn(serve(Ok(stream))); }
                                }
                            }
                            None => {
                                tracker.spawn(super::connection::handle(stream, conn, proxy.clone(), faults.clone(), control, class).instrument(span));
                            }
                        }
                    }
                    Err(err) => retry_at = Some(tokio::time::Instant::now() + errors.failed(&what, &err)),
                }
            }
        }
    }
    drop(listener);
    tracker.close();
    // Closed at once (the API disabling a proxy), or no grace configured. A second
    // signal that came before this point resets below without waiting.
    let grace = if shutdown.is_closed() {
        Duration::ZERO
    } else {
        proxy.context.shutdown_timeout
    };
    if grace.is_zero() {
        proxy.each_conn(|c| c.shutdown());
    } else if !tracker.is_empty() {
        // As a graceful drain: HTTP connections close once idle, TCP ones when their
        // peers close them; whatever is open at the deadline is reset.
        let open = tracker.len();
        info!(proxy = %proxy.name, %addr, open, ?grace, "shutting down: open connections may finish");
        proxy.event(
            "shutdown_started",
            serde_json::json!({ "listener": addr, "open": open, "grace_ms": grace.as_millis() }),
        );
        proxy.each_conn(|c| c.drain());
        let finished = tokio::select! {
            _ = tracker.wait() => true,
            _ = tokio::time::sleep(grace) => false,
            _ = shutdown.wait_now() => false,
        };
        if !finished {
            let reset = proxy.reset_open();
            if reset > 0 {
                warn!(proxy = %proxy.name, %addr, reset, "shutting down: reset the connections still open");
                proxy.event(
                    "shutdown_reset",
                    serde_json::json!({ "listener": addr, "connections": reset }),
                );
            }
        }
    }
    tracker.wait().await;
    Ok(())
}

/// Connections snag makes to its own listener to fill the accept queue for `syn_drop`.
#[derive(Default)]
struct Plugs {
    streams: Vec<TcpStream>,
    addrs: HashSet<SocketAddr>,
}

impl Plugs {
    /// Shrinks the backlog to its minimum and connects to `addr` until the kernel's
    /// accept queue is full: from then on it drops new SYNs (Linux does so even with
    /// syncookies on), and clients see connect timeouts while the port stays open.
    async fn fill(&mut self, listener: &TcpListener, addr: SocketAddr) {
        if let Err(err) = socket::set_backlog(listener, 0) {
            warn!(%err, "could not shrink the backlog for syn_drop");
            return;
        }
        // Backlog 0 queues one connection; a few more tries cover connections that
        // were in the queue already. A connect that times out means the queue is full.
        for _ in 0..8 {
            match timeout(Duration::from_millis(100), TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    if let Ok(local) = stream.local_addr() {
                        self.addrs.insert(local);
                    }
                    self.streams.push(stream);
                }
                Ok(Err(err)) => {
                    warn!(%err, "syn_drop plug connect failed");
                    return;
                }
                Err(_) => return,
            }
        }
        warn!("accept queue did not fill after 8 connections; syn_drop may let some SYNs through");
    }

    fn drain(&mut self, listener: &TcpListener) {
        if let Err(err) = socket::set_backlog(listener, socket::BACKLOG) {
            warn!(%err, "could not restore the backlog after syn_drop");
        }
        // The server ends of the plugs are still queued; the accept loop discards
        // them by peer address.
        self.streams.clear();
    }
}

/// What the listener faults on now make of a listener of class `class`.
fn fault_state(faults: &[Arc<Fault>], class: Scope) -> Listening {
    let on = |kind: Kind| {
        faults
            .iter()
            .any(|f| f.kind == kind && f.acts_on_listener(class))
    };
    if on(Kind::Down) {
        Listening::Down
    } else if on(Kind::SynDrop) {
        Listening::SynDrop
    } else {
        Listening::Accepting
    }
}
