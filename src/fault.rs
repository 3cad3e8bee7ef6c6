//! Faults: what they are (name, type, direction, toxicity, attributes), how they are
//! written inline, and the per-direction [`Chain`] of stages a connection runs them in.
//!
//! Stage faults act on bytes inside the relay (`stage` and one file per type); the
//! listener faults `down` and `syn_drop` act before a connection exists and live in
//! `proxy.rs`.

pub mod bandwidth;
pub mod chain;
pub mod config;
pub mod drain;
pub mod file;
pub mod http;
pub mod latency;
pub mod limit_data;
pub mod loss;
pub mod reset_peer;
pub mod scope;
pub mod slicer;
pub mod slow_close;
pub mod stage;
pub mod timeout;

use std::{fmt, str::FromStr};

use rand::{RngExt, rngs::SmallRng};
use serde::{Deserialize, Serialize};

use self::{
    bandwidth::Bandwidth, latency::Latency, limit_data::LimitData, loss::Loss,
    reset_peer::ResetPeer, slicer::Slicer, slow_close::SlowClose, stage::Stage, timeout::Timeout,
};
pub use self::{
    chain::{Chain, ConnId},
    scope::{Mode, PROBE_PATHS, ProbeRules, Scope},
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
    /// An HTTP fault (mode http): its hooks, one of [`http::REGISTRY`].
    Http(http::Hooks),
}

/// The TCP and listener faults' type names; the HTTP ones are in [`http::REGISTRY`].
const TCP_TYPES: &str =
    "latency, bandwidth, slicer, limit_data, timeout, reset_peer, slow_close, loss, down, syn_drop";

/// Every type name, for error messages.
pub fn types() -> String {
    let http: Vec<&str> = http::REGISTRY.iter().map(|(name, _)| *name).collect();
    format!("{TCP_TYPES}, {}", http.join(", "))
}

/// An attribute table as the attribute struct `T`, strictly: unknown keys and bad
/// values are named.
pub(crate) fn attrs<T: serde::de::DeserializeOwned>(t: toml::Table) -> Result<T, String> {
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
            Kind::Http(h) => h.get().validate().map(|()| kind),
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
            Kind::Http(h) => Ok(h.get().attributes()),
            Kind::Down | Kind::SynDrop => Ok(serde_json::Value::Object(Default::default())),
        };
        value.expect("attribute structs of plain numbers always serialise")
    }

    fn parse(type_name: &str, attributes: toml::Table) -> Result<Kind, String> {
        let kind = match type_name {
            "latency" => Kind::Latency(attrs(attributes)?),
            "bandwidth" => Kind::Bandwidth(attrs(attributes)?),
            "slicer" => Kind::Slicer(attrs(attributes)?),
            "limit_data" => Kind::LimitData(attrs(attributes)?),
            "timeout" => Kind::Timeout(attrs(attributes)?),
            "reset_peer" => Kind::ResetPeer(attrs(attributes)?),
            "slow_close" => Kind::SlowClose(attrs(attributes)?),
            "loss" => Kind::Loss(attrs(attributes)?),
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
            other => match http::Hooks::build(other, attributes) {
                Some(hooks) => Kind::Http(hooks?),
                None => {
                    return Err(format!("unknown fault type `{other}` (known: {})", types()));
                }
            },
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
            Kind::Http(h) => h.get().validate(),
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
            Kind::Http(h) => h.get().type_name(),
            Kind::Down => "down",
            Kind::SynDrop => "syn_drop",
        }
    }

    /// Whether it acts on the listener rather than on a connection's bytes.
    pub fn is_listener(&self) -> bool {
        matches!(self, Kind::Down | Kind::SynDrop)
    }

    /// Whether it is a stage on a connection's bytes (the relay runs it).
    pub fn is_stage(&self) -> bool {
        !self.is_listener() && !self.is_http()
    }

    /// Whether HTTP mode runs it on the client leg's bytes too: the faults that
    /// mean something under HTTP (time, pace, pieces, a reset). The others cut or
    /// hold bytes HTTP needs whole; the HTTP faults say those things per request.
    pub fn on_http_bytes(&self) -> bool {
        matches!(
            self,
            Kind::Latency(_) | Kind::Bandwidth(_) | Kind::Slicer(_) | Kind::ResetPeer(_)
        )
    }

    /// Whether it acts on HTTP exchanges (mode http) rather than on TCP bytes.
    pub fn is_http(&self) -> bool {
        matches!(self, Kind::Http(_))
    }

    /// Its hooks, if it is an HTTP fault.
    pub fn http(&self) -> Option<&dyn http::HttpFault> {
        match self {
            Kind::Http(h) => Some(h.get()),
            _ => None,
        }
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

    /// Every field as the API's JSON has it (`scope` included): what the event log
    /// records and what `snag ctl` sends, so neither can leave a field behind.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "type": self.kind.type_name(),
            "stream": self.stream.as_str(),
            "toxicity": self.toxicity,
            "scope": self.scope.as_str(),
            "attributes": self.kind.attributes_json(),
        })
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

#[cfg(test)]
pub(crate) mod tests;
