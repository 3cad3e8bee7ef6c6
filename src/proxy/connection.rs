//! One TCP connection in TCP mode: dial the upstream, relay through the faults, and
//! count how it ended.

use std::sync::{Arc, atomic::Ordering};

use tokio::{net::TcpStream, time::timeout};
use tracing::debug;

use super::{
    Proxy,
    relay::{self, Control, Ending, Faults, OnUpstreamError, Side},
    socket,
};
use crate::fault::{ConnId, Scope};

/// Relays `client`, connection number `conn` of `proxy`, to the upstream.
pub(super) async fn handle(
    mut client: TcpStream,
    conn: u64,
    proxy: Arc<Proxy>,
    faults: Faults,
    control: Arc<Control>,
    class: Scope,
) {
    let context = &proxy.context;
    let upstream_addr = proxy.upstream();
    let connect = timeout(context.connect_timeout, TcpStream::connect(&*upstream_addr)).await;
    let mut upstream = match connect {
        Ok(Ok(stream)) => stream,
        failed => {
            let why = match failed {
                Ok(Err(err)) => err.to_string(),
                _ => format!("no answer within {:?}", context.connect_timeout),
            };
            debug!(upstream = %upstream_addr, %why, "upstream connect failed");
            proxy.counters.upstream_error();
            proxy.event(
                "upstream_failed",
                serde_json::json!({ "connection": conn, "why": why }),
            );
            if context.on_upstream_error == OnUpstreamError::Reset {
                socket::reset_on_close(&client);
            }
            debug!(ending = ?Ending::Reset { by: Side::Upstream }, "connection done");
            proxy.unregister(conn);
            return;
        }
    };
    // Chunks are relayed as they come; Nagle would add its own delay to every fault's.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let id = ConnId {
        seed: context.seed,
        proxy: &proxy.name,
        conn,
        class,
    };
    let outcome = relay::run(
        &mut client,
        &mut upstream,
        &faults,
        &control,
        id,
        context.on_upstream_error,
        relay::Evidence {
            tap: proxy.tap(),
            snaplen: proxy.snaplen(),
            counters: Some(proxy.counters.clone()),
            notes: None,
        },
    )
    .await;
    proxy.unregister(conn);
    let counts = [
        outcome.received_up,
        outcome.received_down,
        outcome.sent_up,
        outcome.sent_down,
    ];
    if counts == [0; 4] && outcome.ending == Ending::Eof {
        proxy.counters.empty_connection();
    }
    if outcome.ending == (Ending::Reset { by: Side::Upstream }) && !outcome.fault_reset {
        proxy.counters.upstream_reset();
        proxy.event("upstream_reset", serde_json::json!({ "connection": conn }));
    }
    if outcome.fault_reset {
        proxy.counters.fault_reset();
        proxy.event(
            "fault_reset",
            serde_json::json!({ "connection": conn, "faults": outcome.applied }),
        );
    }
    for (counter, n) in proxy.traffic.iter().zip(counts) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
    debug!(
        sent_up = outcome.sent_up,
        sent_down = outcome.sent_down,
        faults = %outcome.applied.join(","),
        ending = ?outcome.ending,
        "connection done"
    );
}
