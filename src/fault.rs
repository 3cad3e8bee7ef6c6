//! Faults: what they are (name, type, direction, toxicity, attributes), how they are
//! written inline, and the per-direction [`Chain`] of stages a connection runs them in.
//!
//! Stage faults act on bytes inside the relay (`stage` and one file per type); the
//! listener faults `down` and `syn_drop` act before a connection exists and live in
//! `proxy.rs`.

pub mod bandwidth;
pub mod file;
pub mod http;
pub mod latency;
pub mod limit_data;
pub mod loss;
pub mod reset_peer;
pub mod slicer;
pub mod slow_close;
pub mod stage;
pub mod timeout;

use std::{fmt, str::FromStr, sync::Arc};

use rand::{RngExt, rngs::SmallRng};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use self::{
    bandwidth::Bandwidth,
    http::{BadBody, DropRequest, HttpDelay, HttpStatus, ResetMidResponse},
    latency::Latency,
    limit_data::LimitData,
    loss::Loss,
    reset_peer::ResetPeer,
    slicer::Slicer,
    slow_close::SlowClose,
    stage::{Chunk, Stage, Step},
    timeout::Timeout,
};

/// Which way bytes flow: the same words as the `stream` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Client → server.
    Upstream,
    /// Server → client.
    Downstream,
}

impl Direction {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Upstream => "upstream",
            Direction::Downstream => "downstream",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Direction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "upstream" => Ok(Direction::Upstream),
            "downstream" => Ok(Direction::Downstream),
            _ => Err(format!("stream `{s}` is neither upstream nor downstream")),
        }
    }
}

/// A fault's type and its attributes.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// Hold each chunk.
    Latency(Latency),
    /// Pace to a rate.
    Bandwidth(Bandwidth),
    /// Cut into small delayed pieces.
    Slicer(Slicer),
    /// Close after N bytes.
    LimitData(LimitData),
    /// Swallow everything, close later.
    Timeout(Timeout),
    /// RST on first data.
    ResetPeer(ResetPeer),
    /// Hold the close.
    SlowClose(SlowClose),
    /// Retransmission stalls.
    Loss(Loss),
    /// Listener closed: connects are refused, open connections cut.
    Down,
    /// Listener kept but its accept queue full: SYNs are dropped.
    SynDrop,
    /// Answer in the backend's place (HTTP mode).
    HttpStatus(HttpStatus),
    /// Break the response body (HTTP mode).
    BadBody(BadBody),
    /// Hold the response (HTTP mode).
    HttpDelay(HttpDelay),
    /// Swallow the request (HTTP mode).
    DropRequest(DropRequest),
    /// RST partway through the response body (HTTP mode).
    ResetMidResponse(ResetMidResponse),
}

/// Every type name, for error messages.
pub const TYPES: &str = "latency, bandwidth, slicer, limit_data, timeout, reset_peer, slow_close, loss, down, syn_drop, \
     http_status, bad_body, http_delay, drop_request, reset_mid_response";

impl Kind {
    /// Builds a kind from its type name and attribute table, strictly, as fault files
    /// and the CLI want it: no jitter above latency, no empty slices. `Err` says what
    /// is wrong in words meant for the user (the caller adds where).
    pub fn new(type_name: &str, attributes: toml::Table) -> Result<Kind, String> {
        let kind = Kind::parse(type_name, attributes)?;
        kind.validate()?;
        Ok(kind)
    }

    /// Builds a kind as leniently as Toxiproxy's API does: whatever its stages can run
    /// (a jitter above the latency clamps at zero delay) is accepted.
    pub fn lenient(type_name: &str, attributes: toml::Table) -> Result<Kind, String> {
        let kind = Kind::parse(type_name, attributes)?;
        match &kind {
            Kind::Loss(l) if !(0.0..=1.0).contains(&l.probability) => {
                Err(format!("probability {} is outside 0.0–1.0", l.probability))
            }
            Kind::HttpStatus(h) if !(100..=999).contains(&h.status) => Err(format!(
                "status {} is not an HTTP status (100–999)",
                h.status
            )),
            _ => Ok(kind),
        }
    }

    /// The attributes as JSON, every one present, in Toxiproxy's order.
    pub fn attributes_json(&self) -> serde_json::Value {
        let value = match self {
            Kind::Latency(a) => serde_json::to_value(a),
            Kind::Bandwidth(a) => serde_json::to_value(a),
            Kind::Slicer(a) => serde_json::to_value(a),
            Kind::LimitData(a) => serde_json::to_value(a),
            Kind::Timeout(a) => serde_json::to_value(a),
            Kind::ResetPeer(a) => serde_json::to_value(a),
            Kind::SlowClose(a) => serde_json::to_value(a),
            Kind::Loss(a) => serde_json::to_value(a),
            Kind::HttpStatus(a) => serde_json::to_value(a),
            Kind::BadBody(a) => serde_json::to_value(a),
            Kind::HttpDelay(a) => serde_json::to_value(a),
            Kind::DropRequest(a) => serde_json::to_value(a),
            Kind::ResetMidResponse(a) => serde_json::to_value(a),
            Kind::Down | Kind::SynDrop => Ok(serde_json::Value::Object(Default::default())),
        };
        value.expect("attribute structs of plain numbers always serialise")
    }

    fn parse(type_name: &str, attributes: toml::Table) -> Result<Kind, String> {
        fn attrs<T: serde::de::DeserializeOwned>(t: toml::Table) -> Result<T, String> {
            let whole = toml::Value::Table(t.clone()).try_into();
            whole.map_err(|e: toml::de::Error| {
                // serde does not say which field held a bad value; try each alone.
                let culprit = t.iter().find(|(k, v)| {
                    let one = toml::Table::from_iter([((*k).clone(), (*v).clone())]);
                    toml::Value::Table(one).try_into::<T>().is_err()
                });
                match culprit {
                    Some((key, _)) if !e.message().contains("unknown field") => {
                        format!("attribute `{key}`: {}", e.message().trim())
                    }
                    _ => e.message().trim().to_string(),
                }
            })
        }
        let kind = match type_name {
            "latency" => Kind::Latency(attrs(attributes)?),
            "bandwidth" => Kind::Bandwidth(attrs(attributes)?),
            "slicer" => Kind::Slicer(attrs(attributes)?),
            "limit_data" => Kind::LimitData(attrs(attributes)?),
            "timeout" => Kind::Timeout(attrs(attributes)?),
            "reset_peer" => Kind::ResetPeer(attrs(attributes)?),
            "slow_close" => Kind::SlowClose(attrs(attributes)?),
            "loss" => Kind::Loss(attrs(attributes)?),
            "http_status" => Kind::HttpStatus(attrs(attributes)?),
            "bad_body" => Kind::BadBody(attrs(attributes)?),
            "http_delay" => Kind::HttpDelay(attrs(attributes)?),
            "drop_request" => Kind::DropRequest(attrs(attributes)?),
            "reset_mid_response" => Kind::ResetMidResponse(attrs(attributes)?),
            "down" | "syn_drop" => {
                if let Some(key) = attributes.keys().next() {
                    return Err(format!("{type_name} takes no attributes, got `{key}`"));
                }
                if type_name == "down" {
                    Kind::Down
                } else {
                    Kind::SynDrop
                }
            }
            other => return Err(format!("unknown fault type `{other}` (known: {TYPES})")),
        };
        Ok(kind)
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            Kind::Latency(l) if l.jitter > l.latency => Err(format!(
                "jitter {} ms exceeds latency {} ms",
                l.jitter, l.latency
            )),
            Kind::Slicer(s) if s.average_size == 0 => {
                Err("average_size must be at least 1 byte".into())
            }
            Kind::Slicer(s) if s.size_variation >= s.average_size => Err(format!(
                "size_variation {} must be smaller than average_size {}",
                s.size_variation, s.average_size
            )),
            Kind::Loss(l) if !(0.0..=1.0).contains(&l.probability) => {
                Err(format!("probability {} is outside 0.0–1.0", l.probability))
            }
            Kind::Loss(l) if l.segment == 0 => Err("segment must be at least 1 byte".into()),
            Kind::BadBody(b) if b.mode == http::BadBodyMode::WrongLength && b.bytes == 0 => {
                Err("wrong_length needs bytes > 0: the length promised beyond the body".into())
            }
            _ => Ok(()),
        }
    }

    /// The wire name of the type.
    pub fn type_name(&self) -> &'static str {
        match self {
            Kind::Latency(_) => "latency",
            Kind::Bandwidth(_) => "bandwidth",
            Kind::Slicer(_) => "slicer",
            Kind::LimitData(_) => "limit_data",
            Kind::Timeout(_) => "timeout",
            Kind::ResetPeer(_) => "reset_peer",
            Kind::SlowClose(_) => "slow_close",
            Kind::Loss(_) => "loss",
            Kind::HttpStatus(_) => "http_status",
            Kind::BadBody(_) => "bad_body",
            Kind::HttpDelay(_) => "http_delay",
            Kind::DropRequest(_) => "drop_request",
            Kind::ResetMidResponse(_) => "reset_mid_response",
            Kind::Down => "down",
            Kind::SynDrop => "syn_drop",
        }
    }

    /// Whether it acts on the listener rather than on a connection's bytes.
    pub fn is_listener(&self) -> bool {
        matches!(self, Kind::Down | Kind::SynDrop)
    }

    /// Whether it acts on HTTP exchanges (mode http) rather than on TCP bytes.
    pub fn is_http(&self) -> bool {
        matches!(
            self,
            Kind::HttpStatus(_)
                | Kind::BadBody(_)
                | Kind::HttpDelay(_)
                | Kind::DropRequest(_)
                | Kind::ResetMidResponse(_)
        )
    }

    fn stage(&self, rng: SmallRng) -> Option<Box<dyn Stage>> {
        Some(match self {
            Kind::Latency(a) => Box::new(a.stage(rng)),
            Kind::Bandwidth(a) => Box::new(a.stage()),
            Kind::Slicer(a) => Box::new(a.stage(rng)),
            Kind::LimitData(a) => Box::new(a.stage()),
            Kind::Timeout(a) => Box::new(a.stage()),
            Kind::ResetPeer(a) => Box::new(a.stage()),
            Kind::SlowClose(a) => Box::new(a.stage()),
            Kind::Loss(a) => Box::new(a.stage(rng)),
            _ => return None,
        })
    }
}

/// What a proxy understands of the traffic it relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Bytes: the TCP fault stages.
    #[default]
    Tcp,
    /// HTTP/1.1 and HTTP/2 (cleartext) requests: the HTTP faults, probes told apart.
    Http,
}

impl Mode {
    /// Whether a fault of `kind` can act in this mode (listener faults act in both).
    pub fn takes(self, kind: &Kind) -> bool {
        kind.is_listener() || (self == Mode::Http) == kind.is_http()
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::Http => "http",
        }
    }
}

/// How HTTP mode tells a health probe from a data request: a request is a probe if
/// its path is one of `paths`, or one of `headers` contains the given text
/// (case-insensitive, e.g. `user-agent` containing `kube-probe`), or its method is one
/// of `methods`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProbeRules {
    /// Exact paths (no query).
    pub paths: Vec<String>,
    /// Header name → text its value contains.
    pub headers: std::collections::BTreeMap<String, String>,
    /// Methods, e.g. `HEAD`.
    pub methods: Vec<String>,
}

/// Paths whose requests count as health probes when no rule says otherwise.
pub const PROBE_PATHS: [&str; 4] = ["/health", "/healthz", "/ready", "/api/v1/health"];

impl Default for ProbeRules {
    fn default() -> Self {
        ProbeRules {
            paths: PROBE_PATHS.iter().map(|p| p.to_string()).collect(),
            headers: Default::default(),
            methods: Vec::new(),
        }
    }
}

impl ProbeRules {
    /// `Probe` or `Data` for a request.
    pub fn classify<'a>(
        &self,
        method: &str,
        path: &str,
        header: impl Fn(&str) -> Option<&'a str>,
    ) -> Scope {
        let by_header = self.headers.iter().any(|(name, text)| {
            header(name)
                .is_some_and(|v| v.to_ascii_lowercase().contains(&text.to_ascii_lowercase()))
        });
        if self.paths.iter().any(|p| p == path)
            || by_header
            || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method))
        {
            Scope::Probe
        } else {
            Scope::Data
        }
    }
}

/// Which requests (HTTP mode) a fault may touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every request.
    #[default]
    Any,
    /// Only requests the probe rules do not match: what clients send.
    Data,
    /// Only the balancer's health probes.
    Probe,
}

impl Scope {
    /// Whether a fault of this scope touches a request of class `class`
    /// (`Data` or `Probe`).
    pub fn covers(self, class: Scope) -> bool {
        self == Scope::Any || self == class
    }
}

impl Scope {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Any => "any",
            Scope::Data => "data",
            Scope::Probe => "probe",
        }
    }
}

impl FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "any" => Ok(Scope::Any),
            "data" => Ok(Scope::Data),
            "probe" => Ok(Scope::Probe),
            _ => Err(format!("scope `{s}` is not any, data or probe")),
        }
    }
}

/// One fault, as the fault files, the CLI and the control API describe it.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Unique within its proxy, across both directions. Default `<type>_<stream>`.
    pub name: String,
    /// Which direction it acts on. Default downstream.
    pub stream: Direction,
    /// Chance, 0.0–1.0, that it applies to a given connection; drawn once per
    /// connection from the run's seed.
    pub toxicity: f64,
    /// Type and attributes.
    pub kind: Kind,
    /// Which requests it may touch (HTTP faults); `Any` by default.
    pub scope: Scope,
}

impl Fault {
    /// A fault from its parts; `Err` in words for the user. Listener faults must have
    /// toxicity 1: a listener is either down or not.
    pub fn new(
        name: Option<String>,
        kind: Kind,
        stream: Option<Direction>,
        toxicity: Option<f64>,
    ) -> Result<Fault, String> {
        let stream = stream.unwrap_or(Direction::Downstream);
        let toxicity = toxicity.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&toxicity) {
            return Err(format!("toxicity {toxicity} is outside 0.0–1.0"));
        }
        if kind.is_listener() && toxicity != 1.0 {
            return Err(format!(
                "{} acts on the listener; toxicity must be 1, got {toxicity}",
                kind.type_name()
            ));
        }
        let name = name.unwrap_or_else(|| format!("{}_{}", kind.type_name(), stream));
        if name.is_empty() {
            return Err("name must not be empty".into());
        }
        Ok(Fault {
            name,
            stream,
            toxicity,
            kind,
            scope: Scope::Any,
        })
    }

    /// Sets the scope: which requests (HTTP faults), connections (TCP stages) or
    /// listeners (`down`, `syn_drop`) it may touch. Probes and data are told apart by
    /// HTTP mode's probe rules, or by a separate probe listener.
    pub fn with_scope(mut self, scope: Scope) -> Result<Fault, String> {
        self.scope = scope;
        Ok(self)
    }

    /// Whether a listener fault acts on a listener of class `listener` (`Any` for a
    /// proxy's single listener, which carries both).
    pub fn acts_on_listener(&self, listener: Scope) -> bool {
        self.kind.is_listener() && (listener == Scope::Any || self.scope.covers(listener))
    }

    /// Whether this fault applies to connection `conn` of proxy `proxy` in a run
    /// seeded with `seed`: the toxicity draw, the same for the same inputs.
    pub fn applies(&self, seed: u64, proxy: &str, conn: u64) -> bool {
        if self.toxicity >= 1.0 {
            return true;
        }
        let mut rng = crate::seed::rng(
            seed,
            &[
                proxy.as_bytes(),
                &conn.to_le_bytes(),
                self.name.as_bytes(),
                b"toxicity",
            ],
        );
        rng.random::<f64>() < self.toxicity
    }
}

/// `TYPE[:key=value,...]`: the inline form of `--fault`. `name`, `stream` and
/// `toxicity` are the fault's own fields; every other key is an attribute, e.g.
/// `latency:latency=50,jitter=10,stream=upstream,toxicity=0.5`.
impl FromStr for Fault {
    type Err = String;
    fn from_str(spec: &str) -> Result<Fault, String> {
        let (type_name, rest) = spec.split_once(':').unwrap_or((spec, ""));
        let (mut name, mut stream, mut toxicity, mut scope) = (None, None, None, Scope::Any);
        let mut attributes = toml::Table::new();
        for pair in rest.split(',').filter(|p| !p.trim().is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("`{pair}` is not key=value"))?;
            let (key, value) = (key.trim(), value.trim());
            match key {
                "name" => name = Some(value.to_string()),
                "stream" => stream = Some(value.parse()?),
                "scope" => scope = value.parse()?,
                "toxicity" => {
                    toxicity = Some(
                        value
                            .parse()
                            .map_err(|_| format!("toxicity `{value}` is not a number"))?,
                    )
                }
                _ => {
                    let value = if let Ok(i) = value.parse::<i64>() {
                        toml::Value::Integer(i)
                    } else if let Ok(f) = value.parse::<f64>() {
                        toml::Value::Float(f)
                    } else {
                        toml::Value::String(value.to_string())
                    };
                    if attributes.insert(key.to_string(), value).is_some() {
                        return Err(format!("attribute `{key}` given twice"));
                    }
                }
            }
        }
        let kind = Kind::new(type_name.trim(), attributes)?;
        Fault::new(name, kind, stream, toxicity)?.with_scope(scope)
    }
}

/// One fault in one direction of one connection: its stage, or `None` when the
/// toxicity draw left this connection alone.
#[derive(Debug)]
struct Slot {
    fault: Arc<Fault>,
    stage: Option<Box<dyn Stage>>,
}

/// What identifies a connection to its faults' RNGs.
#[derive(Debug, Clone, Copy)]
pub struct ConnId<'a> {
    /// The run's seed.
    pub seed: u64,
    /// The proxy's name.
    pub proxy: &'a str,
    /// The connection's number within its proxy, from 0.
    pub conn: u64,
    /// What the listener it came through carries: `Probe` on a probe listener,
    /// `Data` beside one, `Any` when the proxy has a single listener.
    pub class: Scope,
}

/// The stages of one direction of one connection, in the order the faults were added.
#[derive(Debug, Default)]
pub struct Chain {
    slots: Vec<Slot>,
    scratch: Vec<Step>,
}

impl Chain {
    /// Whether no stage acts on this direction (the relay may take its fast path).
    pub fn is_empty(&self) -> bool {
        self.slots.iter().all(|s| s.stage.is_none())
    }

    /// Names of the faults that apply to this connection.
    pub fn applied(&self) -> impl Iterator<Item = &str> {
        self.slots
            .iter()
            .filter(|s| s.stage.is_some())
            .map(|s| s.fault.name.as_str())
    }

    /// Brings the chain in line with `faults` (the proxy's whole list) for direction
    /// `dir`. A fault that is still the same `Arc` keeps its stage and its state; a
    /// new or changed one gets a new stage and a new toxicity draw, started at `now`.
    /// Steps the new stages schedule go to `out`.
    pub fn sync(
        &mut self,
        faults: &[Arc<Fault>],
        dir: Direction,
        id: ConnId<'_>,
        now: Instant,
        out: &mut Vec<Step>,
    ) {
        let mut old = std::mem::take(&mut self.slots);
        // A single listener carries probes too, but a layer-4 probe sends no bytes for
        // a stage to act on: stages there act as on data.
        let class = if id.class == Scope::Any {
            Scope::Data
        } else {
            id.class
        };
        for fault in faults
            .iter()
            .filter(|f| f.stream == dir && !f.kind.is_listener() && f.scope.covers(class))
        {
            if let Some(i) = old.iter().position(|s| Arc::ptr_eq(&s.fault, fault)) {
                self.slots.push(old.swap_remove(i));
                continue;
            }
            let stage = fault.applies(id.seed, id.proxy, id.conn).then(|| {
                let rng = crate::seed::rng(
                    id.seed,
                    &[
                        id.proxy.as_bytes(),
                        &id.conn.to_le_bytes(),
                        fault.name.as_bytes(),
                    ],
                );
                fault.kind.stage(rng)
            });
            tracing::trace!(fault = %fault.name, applies = stage.is_some(), "toxicity draw");
            self.slots.push(Slot {
                fault: fault.clone(),
                stage: stage.flatten(),
            });
            let index = self.slots.len() - 1;
            let mut started = Vec::new();
            if let Some(stage) = &mut self.slots[index].stage {
                stage.start(now, &mut started);
            }
            self.run(index + 1, started, out);
        }
    }

    /// Passes a chunk read from the source through every stage.
    pub fn chunk(&mut self, chunk: Chunk, out: &mut Vec<Step>) {
        self.run(0, vec![Step::Send(chunk)], out);
    }

    /// Passes the source's FIN through every stage.
    pub fn eof(&mut self, at: Instant, out: &mut Vec<Step>) {
        self.run(0, vec![Step::Finish { at }], out);
    }

    /// Runs `steps` through the stages from `from` on and appends the result to `out`.
    fn run(&mut self, from: usize, mut steps: Vec<Step>, out: &mut Vec<Step>) {
        let mut next = std::mem::take(&mut self.scratch);
        let from = from.min(self.slots.len());
        for slot in &mut self.slots[from..] {
            let Some(stage) = &mut slot.stage else {
                continue;
            };
            for step in steps.drain(..) {
                match step {
                    Step::Send(chunk) => stage.chunk(chunk, &mut next),
                    Step::Finish { at } => stage.eof(at, &mut next),
                    reset @ Step::Reset { .. } => next.push(reset),
                }
            }
            std::mem::swap(&mut steps, &mut next);
        }
        out.append(&mut steps);
        self.scratch = next;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::Bytes;

    pub fn chunk_at(due: Instant, data: &[u8]) -> Chunk {
        Chunk {
            data: Bytes::copy_from_slice(data),
            due,
        }
    }

    pub fn sends(steps: &[Step]) -> Vec<Chunk> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Send(c) => Some(c.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn inline_spec_parses_fields_and_attributes() {
        let f: Fault = "latency:latency=50,jitter=10,stream=upstream,toxicity=0.5"
            .parse()
            .unwrap();
        assert_eq!(f.name, "latency_upstream");
        assert_eq!(f.stream, Direction::Upstream);
        assert_eq!(f.toxicity, 0.5);
        assert_eq!(
            f.kind,
            Kind::Latency(Latency {
                latency: 50,
                jitter: 10
            })
        );
        let f: Fault = "down".parse().unwrap();
        assert_eq!((f.name.as_str(), f.kind), ("down_downstream", Kind::Down));
    }

    #[test]
    fn inline_spec_errors_say_what_is_wrong() {
        let err = |s: &str| s.parse::<Fault>().unwrap_err();
        assert!(err("latncy:latency=5").contains("unknown fault type `latncy`"));
        assert!(
            err("latency:latncy=5").contains("unknown field `latncy`"),
            "{}",
            err("latency:latncy=5")
        );
        assert!(
            err("latency:latency=-5").contains("attribute `latency`: invalid value: integer `-5`")
        );
        assert!(err("latency:latency=x").contains("attribute `latency`: invalid type"));
        assert!(err("latency:latency=5,toxicity=1.5").contains("toxicity 1.5 is outside"));
        assert!(err("latency:latency=5,stream=sideways").contains("sideways"));
        assert!(err("latency:latency").contains("not key=value"));
        assert!(err("latency:latency=5,jitter=9").contains("jitter 9 ms exceeds latency 5 ms"));
        assert!(err("down:toxicity=0.5").contains("toxicity must be 1"));
    }

    #[test]
    fn probe_rules_match_paths_headers_or_methods() {
        let mut rules = ProbeRules::default();
        let none = |_: &str| None;
        assert_eq!(rules.classify("GET", "/healthz", none), Scope::Probe);
        assert_eq!(rules.classify("GET", "/healthz/deep", none), Scope::Data);
        rules
            .headers
            .insert("user-agent".into(), "kube-probe".into());
        rules.methods.push("HEAD".into());
        let kube = |name: &str| (name == "user-agent").then_some("Kube-Probe/1.29");
        assert_eq!(rules.classify("GET", "/", kube), Scope::Probe);
        assert_eq!(rules.classify("head", "/", none), Scope::Probe);
        assert_eq!(rules.classify("GET", "/", |_| Some("curl/8")), Scope::Data);
    }

    #[test]
    fn toxicity_draw_is_reproducible_and_near_its_rate() {
        let f: Fault = "latency:latency=1,toxicity=0.5".parse().unwrap();
        let hits: Vec<u64> = (0..1000).filter(|c| f.applies(9, "p", *c)).collect();
        let again: Vec<u64> = (0..1000).filter(|c| f.applies(9, "p", *c)).collect();
        assert_eq!(hits, again);
        assert!((430..570).contains(&hits.len()), "{}", hits.len());
        let other_seed = (0..1000)
            .filter(|c| f.applies(10, "p", *c))
            .collect::<Vec<_>>();
        assert_ne!(hits, other_seed);
    }

    #[test]
    fn chain_composes_in_order_and_keeps_unchanged_stages() {
        let t0 = Instant::now();
        let id = ConnId {
            seed: 1,
            proxy: "p",
            conn: 0,
            class: Scope::Any,
        };
        let lat: Arc<Fault> = Arc::new("latency:latency=10".parse().unwrap());
        let limit: Arc<Fault> = Arc::new("limit_data:bytes=3".parse().unwrap());
        let mut chain = Chain::default();
        let mut out = Vec::new();
        chain.sync(
            &[lat.clone(), limit.clone()],
            Direction::Downstream,
            id,
            t0,
            &mut out,
        );
        chain.chunk(chunk_at(t0, b"ab"), &mut out);
        // Re-syncing with the same Arcs keeps limit_data's count of 2 bytes sent.
        chain.sync(
            &[lat.clone(), limit.clone()],
            Direction::Downstream,
            id,
            t0,
            &mut out,
        );
        chain.chunk(chunk_at(t0, b"cd"), &mut out);
        let at = t0 + std::time::Duration::from_millis(10);
        assert_eq!(
            out,
            [
                Step::Send(chunk_at(at, b"ab")),
                Step::Send(chunk_at(at, b"c")),
                Step::Finish { at }
            ]
        );
        // An upstream-only list leaves this direction empty.
        chain.sync(&[], Direction::Downstream, id, t0, &mut out);
        assert!(chain.is_empty());
    }
}
