//! HTTP faults: they act on requests and responses in `mode = "http"`, one exchange
//! at a time, where the TCP stages act on bytes. Each is a set of hooks, as a TCP
//! fault is a stage: no I/O, no clock, no global RNG. They say what should happen
//! (answer in the backend's place, hold the head, cut the body after a frame …) and
//! HTTP mode in `proxy/http` does it, with the sockets, timers and counters.
//!
//! ```text
//! request ─► [request hooks] ─► upstream ─► [response hooks] ─► head ─► [body hooks] ─► frames
//!               └─ Some(Reply): the upstream never sees it
//! ```
//!
//! Adding an HTTP fault is one file here and one line in [`REGISTRY`].

mod bad_body;
mod delay;
mod drop_request;
mod goaway;
pub mod grpc;
mod grpc_health;
mod grpc_status;
mod keepalive_close;
mod max_streams;
mod refused_stream;
mod reset_mid_response;
mod status;

use std::{fmt, sync::Arc, time::Duration};

use bytes::Bytes;
use hyper::{http::request, http::response};
use rand::rngs::SmallRng;
use serde::{Serialize, de::DeserializeOwned};

pub use self::{
    bad_body::{BadBody, BadBodyMode},
    delay::{DelayAt, HttpDelay},
    drop_request::DropRequest,
    goaway::{Close, Goaway, GoawayPlan, LastStream},
    grpc_health::{GrpcHealth, ServingStatus},
    grpc_status::GrpcStatus,
    keepalive_close::KeepaliveClose,
    max_streams::MaxStreams,
    refused_stream::RefusedStream,
    reset_mid_response::ResetMidResponse,
    status::HttpStatus,
};
use super::Scope;

/// The hooks of one HTTP fault. Each is called only on exchanges the fault applies
/// to (its scope covers the request and its toxicity draw said yes), in the order
/// the faults were added; each sees what the ones before it made of the exchange.
pub trait HttpFault: Send + Sync + fmt::Debug {
    /// Its wire name, e.g. `bad_body`.
    fn type_name(&self) -> &'static str;

    /// Its attributes as the API shows them, every one present.
    fn attributes(&self) -> serde_json::Value;

    /// Checks the attributes that go together; `Err` in words for the user.
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    /// Whether it must see the whole body at once: the body is then read before
    /// the head goes (so hooks may set its length), and passed as one final frame.
    fn whole_body(&self) -> bool {
        false
    }

    /// Before the request goes upstream. `Some` answers in the backend's place.
    fn request(&self, _req: &request::Parts, _cx: &mut Exchange) -> Option<Reply> {
        None
    }

    /// The response head on its way to the client; it may change it and add to
    /// `cx.hold_head` or `cx.hold_body`.
    fn response(&self, _res: &mut response::Parts, _cx: &mut Exchange) {}

    /// One body frame on its way to the client: pass, rewrite (in place), hold or
    /// cut. `end`: the body has no more frames; `frame` may be empty then, and may
    /// be filled. `cx.sent` counts the body bytes that went before this frame.
    fn body(&self, _frame: &mut Bytes, _end: bool, _cx: &mut Exchange) -> BodyStep {
        BodyStep::Pass
    }
}

/// What a request hook does instead of forwarding.
#[derive(Debug)]
pub enum Reply {
    /// This answer goes to the client.
    Answer(hyper::Response<Bytes>),
    /// This answer, then these trailers (a gRPC message and its status).
    AnswerWithTrailers(hyper::Response<Bytes>, hyper::HeaderMap),
    /// No answer at all; the connection is reset after the duration, or, with
    /// `None`, held until the client gives up.
    Drop(Option<Duration>),
    /// HTTP/2: RST_STREAM(REFUSED_STREAM) for this stream alone.
    Refuse,
    /// HTTP/2: the connection gets a GOAWAY and closes as planned; this request
    /// goes on, unless the plan declares it unprocessed.
    Goaway(GoawayPlan),
}

/// What a body hook asks for the frame it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyStep {
    /// Send it.
    Pass,
    /// Send it this much later.
    Hold(Duration),
    /// Send it, then end the body: HTTP/1.1 closes the connection (FIN, a short
    /// body), HTTP/2 resets the stream.
    Close,
    /// Send it, then reset: RST on the connection (RST_STREAM on HTTP/2).
    Reset,
}

/// One exchange as the hooks see it: who it is, and what has happened so far.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The request's number on its proxy, from 0.
    pub number: u64,
    /// Probe or data.
    pub class: Scope,
    /// Body bytes sent to the client so far.
    pub sent: u64,
    /// How long the response head waits before it goes (summed over hooks).
    pub hold_head: Duration,
    /// How long the body waits before its first frame (summed over hooks).
    pub hold_body: Duration,
    /// The request's number on its connection, from 1.
    pub on_conn: u64,
    /// The client spoke HTTP/2.
    pub h2: bool,
    /// HTTP/2: the id of the stream that carries it (0 on HTTP/1.1).
    pub stream: u32,
    /// HTTP/1.1: close the connection if no request follows this exchange within
    /// this long (the shortest a hook asked for).
    pub close_if_idle: Option<Duration>,
    /// HTTP/2: tell the client this MAX_CONCURRENT_STREAMS (a SETTINGS frame) while
    /// this exchange goes on.
    pub max_streams: Option<u32>,
    seed: u64,
    proxy: Arc<str>,
}

impl Exchange {
    /// Exchange `number` of proxy `proxy` in a run seeded with `seed`.
    pub fn new(seed: u64, proxy: Arc<str>, number: u64, class: Scope) -> Exchange {
        Exchange {
            number,
            class,
            sent: 0,
            hold_head: Duration::ZERO,
            hold_body: Duration::ZERO,
            on_conn: 1,
            h2: false,
            stream: 0,
            close_if_idle: None,
            max_streams: None,
            seed,
            proxy,
        }
    }

    /// An RNG for `what` in this exchange: the same seed, proxy, request and label
    /// give the same bytes.
    pub fn rng(&self, what: &[u8]) -> SmallRng {
        crate::seed::rng(
            self.seed,
            &[
                format!("{}/requests", self.proxy).as_bytes(),
                &self.number.to_le_bytes(),
                what,
            ],
        )
    }
}

/// Builds one HTTP fault from its attribute table; `Err` says what is wrong.
type Build = fn(toml::Table) -> Result<Arc<dyn HttpFault>, String>;

/// Every HTTP fault by wire name.
pub const REGISTRY: &[(&str, Build)] = &[
    ("http_status", build::<HttpStatus>),
    ("bad_body", build::<BadBody>),
    ("http_delay", build::<HttpDelay>),
    ("drop_request", build::<DropRequest>),
    ("reset_mid_response", build::<ResetMidResponse>),
    ("refused_stream", build::<RefusedStream>),
    ("keepalive_close", build::<KeepaliveClose>),
    ("grpc_status", build::<GrpcStatus>),
    ("grpc_health", build::<GrpcHealth>),
    ("goaway", build::<Goaway>),
    ("max_streams", build::<MaxStreams>),
];

fn build<T: HttpFault + DeserializeOwned + 'static>(
    attributes: toml::Table,
) -> Result<Arc<dyn HttpFault>, String> {
    Ok(Arc::new(super::attrs::<T>(attributes)?))
}

/// An HTTP/2 connection fault's `after_streams`: it counts streams from 1.
fn check_after_streams(after_streams: u64) -> Result<(), String> {
    if after_streams == 0 {
        return Err("after_streams must be at least 1".into());
    }
    Ok(())
}

/// The exchange is the Nth stream of an HTTP/2 connection: where the connection
/// faults act, once per connection.
fn nth_http2_stream(cx: &Exchange, n: u64) -> bool {
    cx.h2 && cx.on_conn == n
}

/// Attributes as JSON, for [`HttpFault::attributes`].
fn json(attributes: &impl Serialize) -> serde_json::Value {
    serde_json::to_value(attributes).expect("attribute structs of plain values always serialise")
}

/// An HTTP fault inside a [`super::Kind`]: shared, compared by type and attributes.
#[derive(Debug, Clone)]
pub struct Hooks(Arc<dyn HttpFault>);

impl Hooks {
    /// The HTTP fault `type_name` built from `attributes`; `None` if no HTTP fault
    /// has that name.
    pub fn build(type_name: &str, attributes: toml::Table) -> Option<Result<Hooks, String>> {
        let (_, build) = REGISTRY.iter().find(|(name, _)| *name == type_name)?;
        Some(build(attributes).map(Hooks))
    }

    /// Its hooks.
    pub fn get(&self) -> &dyn HttpFault {
        &*self.0
    }
}

impl PartialEq for Hooks {
    fn eq(&self, other: &Hooks) -> bool {
        self.0.type_name() == other.0.type_name() && self.0.attributes() == other.0.attributes()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh exchange for hook tests.
    pub(crate) fn exchange() -> Exchange {
        Exchange::new(7, Arc::from("p"), 0, Scope::Data)
    }

    /// A 200 response head with `headers`.
    pub(crate) fn head(headers: &[(&str, &str)]) -> response::Parts {
        let mut builder = hyper::Response::builder().status(200);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(()).unwrap().into_parts().0
    }

    /// Runs `hooks`' body hook over `frames` then the end, as HTTP mode does, and
    /// returns what the client gets and the step that ended it, if any.
    pub(crate) fn run_body(
        hooks: &dyn HttpFault,
        cx: &mut Exchange,
        frames: &[&[u8]],
    ) -> (Vec<u8>, Vec<BodyStep>) {
        let mut out = Vec::new();
        let mut steps = Vec::new();
        let last = frames.len();
        for i in 0..=last {
            let (mut frame, end) = match frames.get(i) {
                Some(f) => (Bytes::copy_from_slice(f), false),
                None => (Bytes::new(), true),
            };
            let step = hooks.body(&mut frame, end, cx);
            cx.sent += frame.len() as u64;
            out.extend_from_slice(&frame);
            steps.push(step);
            if matches!(step, BodyStep::Close | BodyStep::Reset) {
                break;
            }
        }
        (out, steps)
    }

    #[test]
    fn every_registered_fault_builds_from_no_attributes_or_says_why() {
        for (name, build) in REGISTRY {
            match build(toml::Table::new()) {
                Ok(hooks) => assert_eq!(hooks.type_name(), *name),
                Err(why) => panic!("{name}: {why}"),
            }
        }
        assert!(Hooks::build("latency", toml::Table::new()).is_none());
    }

    #[test]
    fn an_exchanges_rng_repeats_for_the_same_request_only() {
        use rand::RngExt;
        let a: u64 = exchange().rng(b"x").random();
        let b: u64 = exchange().rng(b"x").random();
        let mut other = exchange();
        other.number = 1;
        assert_eq!(a, b);
        assert_ne!(a, other.rng(b"x").random::<u64>());
    }
}
