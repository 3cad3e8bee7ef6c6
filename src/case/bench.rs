//! The bench a case runs on: it starts the parts, keeps the evidence, and stops
//! everything it started when the case ends.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use tokio::{net::TcpListener, time::Instant};

mod balancers;
mod elsewhere;
mod parts;
mod record;
mod runs;

use self::parts::Sample;
pub use self::{
    balancers::{BalancerHandle, Lb, Restarted, Transition},
    elsewhere::{BackendPart, Interposer},
    parts::Part,
};
use super::Case;
use crate::{
    fault::{
        config::ProxyConfig,
        file::{Action, ProxySpec, Scenario},
    },
    lab::{
        backend::{self, Backend},
        balancer::{self, BackendProtocol, BackendSpec, Balancer},
        driver::{External, Feature, Product, Unsupported},
        listen::Ports,
        load::{self, Plan, Target},
    },
    proxy::{Mode, RunContext},
    report::{CaseReport, Check, Event, EventKind, Run, Verdict, state_word},
    shutdown::Shutdown,
};

/// The parts and evidence of one case.
pub struct Bench {
    case: &'static Case,
    /// Whether the case runs shortened.
    pub quick: bool,
    /// How long it runs.
    length: super::Length,
    /// Seed of every random choice.
    pub seed: u64,
    shutdown: Shutdown,
    t0: Instant,
    report: CaseReport,
    parts: Vec<Part>,
    balancers: Vec<BalancerHandle>,
    externals: Vec<Arc<External>>,
    product: Product,
    samples: Arc<Mutex<Vec<Sample>>>,
    parts_s: f64,
    /// What the balancer speaks to the interposers, and for h2 the run's
    /// certificate: (cert, key, CA).
    protocol: BackendProtocol,
    tls: Option<RunTls>,
    /// Where its parts listen.
    ports: Ports,
    /// What `--backend-protocol` asked for, if anything.
    asked: Option<BackendProtocol>,
    /// The parts that run elsewhere (`--topology`).
    topology: Arc<super::topology::Topology>,
    /// CPU times when the case began, to tell what other programs took.
    host: Option<crate::host::Mark>,
    on_progress: super::OnProgress,
}

impl Bench {
    /// A bench for `case`; `shutdown` stops it from outside (Ctrl-C).
    pub fn new(
        case: &'static Case,
        product: Product,
        seed: u64,
        length: super::Length,
        shutdown: Shutdown,
        on_progress: super::OnProgress,
    ) -> Bench {
        let quick = length == super::Length::Quick;
        Bench {
            length,
            case,
            quick,
            seed,
            t0: Instant::now(),
            report: CaseReport {
                name: case.name.into(),
                source: case.source.into(),
                property: case.property.into(),
                reference: case.reference.into(),
                verdict: Verdict::Pass,
                checks: Vec::new(),
                figures: Vec::new(),
                notes: Vec::new(),
                events: Vec::new(),
                shares: Vec::new(),
                runs: Vec::new(),
                interposers: serde_json::Value::Null,
                balancer: serde_json::Value::Null,
                elapsed_s: 0.0,
                seed,
                balancer_under_test: product.name().into(),
                products: Vec::new(),
                host: None,
                backends_overslept: Vec::new(),
                host_evidence: Vec::new(),
                interposer_events: Default::default(),
            },
            shutdown,
            parts: Vec::new(),
            balancers: Vec::new(),
            externals: Vec::new(),
            product,
            samples: Arc::default(),
            parts_s: 0.0,
            protocol: BackendProtocol::H1,
            tls: None,
            ports: Ports::default(),
            asked: None,
            topology: Arc::default(),
            host: crate::host::Mark::now(),
            on_progress,
        }
    }

    /// Seconds into the case of offset `at` (full-length seconds) on the fault
    /// file's timeline.
    pub fn timeline_s(&self, at: f64) -> f64 {
        self.parts_s + self.secs(at).as_secs_f64()
    }

    /// A bench for one run within this case, on fresh parts, stopped with it.
    pub fn sub(&self) -> Bench {
        let mut sub = Bench::new(
            self.case,
            self.product.clone(),
            self.seed,
            self.length,
            self.shutdown.child(),
            self.on_progress.clone(),
        );
        sub.protocol = self.protocol;
        sub.asked = self.asked;
        sub.ports = self.ports.clone();
        sub.topology = self.topology.clone();
        sub
    }

    /// Takes what the person running the cases chose: where the parts listen, and
    /// what the balancer speaks to the backends.
    pub fn set_up(&mut self, setup: super::Setup) {
        self.ports = match setup.topology.here {
            Some(ip) => setup.ports.on(ip),
            None => setup.ports,
        };
        self.asked = setup.protocol;
        self.topology = setup.topology;
        if let Some(protocol) = setup.protocol {
            self.protocol = protocol;
        }
    }

    /// What the balancer speaks to the backends' interposers (before `parts`), for
    /// a case whose point needs that protocol, whatever `--backend-protocol` asked
    /// (the report says so): h2 gives every interposer the run's certificate and the
    /// balancer its CA.
    pub fn speak(&mut self, protocol: BackendProtocol) {
        if let Some(asked) = self.asked
            && asked != protocol
        {
            self.note(format!(
                "the balancer speaks {} to the backends in this case, not {} as asked: the case is about {}",
                protocol_name(protocol),
                protocol_name(asked),
                protocol_name(protocol)
            ));
        }
        self.protocol = protocol;
    }

    /// HTTP/2 to the backends' interposers: over TLS when `--backend-protocol h2`
    /// asked for it, in clear (h2c) otherwise.
    pub fn speak_http2(&mut self) {
        let protocol = if self.asked == Some(BackendProtocol::H2) {
            BackendProtocol::H2
        } else {
            BackendProtocol::H2c
        };
        self.speak(protocol);
    }

    /// Ends `sub` and keeps its runs and events, on this case's clock.
    pub async fn absorb(&mut self, sub: Bench) {
        let offset = sub.t0.saturating_duration_since(self.t0).as_secs_f64();
        let report = sub.finish(Ok(())).await;
        for mut run in report.runs {
            run.started_s += offset;
            self.report.runs.push(run);
        }
        for mut event in report.events {
            event.at_s += offset;
            self.report.events.push(event);
        }
        self.report.checks.extend(report.checks);
        for (name, events) in report.interposer_events {
            self.report
                .interposer_events
                .entry(name)
                .or_default()
                .extend(events);
        }
        for note in report.notes {
            // Each run says where its parts ran; once is enough.
            if !self.report.notes.contains(&note) {
                self.report.notes.push(note);
            }
        }
        self.report
            .backends_overslept
            .extend(report.backends_overslept);
        self.report.products.extend(report.products);
        if self.report.balancer.is_null() {
            self.report.balancer = report.balancer;
        }
    }

    /// The balancer under test.
    pub fn product(&self) -> &Product {
        &self.product
    }

    /// `seconds` of the full case, shortened by `--quick`.
    pub fn secs(&self, seconds: f64) -> Duration {
        Duration::from_secs_f64(seconds * self.length.factor(self.case))
    }

    /// Seconds since the case started.
    pub fn now_s(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
}

/// The run's certificate, key and CA, in a directory of their own that goes when
/// the bench does: at its end, or when a case returns early and drops it.
struct RunTls(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf);

impl Drop for RunTls {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A protocol to the backends as people say it.
fn protocol_name(protocol: BackendProtocol) -> &'static str {
    match protocol {
        BackendProtocol::H1 => "HTTP/1.1",
        BackendProtocol::H2c => "HTTP/2 in clear (h2c)",
        BackendProtocol::H2 => "HTTP/2 over TLS (h2)",
    }
}
