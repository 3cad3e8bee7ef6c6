//! What a fault may touch: the proxy's mode (bytes or HTTP), and the scope that tells
//! health probes from data, with the rules HTTP mode classifies requests by.

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::Kind;

/// What a proxy understands of the traffic it relays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Bytes: the TCP fault stages.
    #[default]
    Tcp,
    /// HTTP/1.1 and HTTP/2 (cleartext) requests: the HTTP faults, probes told apart.
    Http,
}

impl Mode {
    /// Whether a fault of `kind` can act in this mode: listener faults act in both,
    /// and HTTP mode runs some TCP faults on the client leg's bytes.
    pub fn takes(self, kind: &Kind) -> bool {
        kind.is_listener()
            || (self == Mode::Http) == kind.is_http()
            || (self == Mode::Http && kind.on_http_bytes())
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::Http => "http",
        }
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "tcp" => Ok(Mode::Tcp),
            "http" => Ok(Mode::Http),
            _ => Err(format!("mode `{s}` is neither tcp nor http")),
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
pub const PROBE_PATHS: [&str; 5] = [
    "/health",
    "/healthz",
    "/ready",
    "/api/v1/health",
    "/grpc.health.v1.Health/Check",
];

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
