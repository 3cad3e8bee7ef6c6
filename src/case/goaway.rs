//! The GOAWAY cases (#16): what a balancer does when a backend it speaks HTTP/2 to
//! ends a connection with GOAWAY.

use super::Case;

/// The cases in this file.
pub const CASES: &[Case] = &[Case {
    name: "goaway-drain",
    source: "seeds/004",
    property: "LB-05 over HTTP/2 to the backends: b drained by the balancer, then a graceful GOAWAY on its connections under keep-alive GETs, POSTs with transaction ids and HTTP/2 streams: no client error, no duplicate, nothing new reaches b, and the balancer's view of b never turns DOWN",
    reference: "LB-05: no new connections (L4) or requests (L7); existing flows by policy; resets within the threshold — here the existing flows end by GOAWAY",
    quick: 0.5,
    run: |b| Box::pin(super::lb::drain::goaway_drain(b)),
}];
