//! One proxy as every front end describes it: `snag proxy`'s flags, a fault file's
//! `[[proxy]]`, the API's JSON and the cases all build a [`ProxyConfig`], and the
//! interposer is made from it alone. Run-wide settings (seed, events, capture,
//! timeouts) travel apart, in `proxy::RunContext`.

use std::net::SocketAddr;

use serde::{Serialize, Serializer};

use super::{Fault, Mode, ProbeRules};
use crate::tls::{ListenTls, UpstreamTls};

/// The request headers that carry a transaction id unless a proxy names others.
pub const ID_HEADERS: [&str; 2] = ["x-request-id", "idempotency-key"];

/// One proxy: where it listens and relays, how it reads traffic, its first faults.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProxyConfig {
    /// Unique among the run's proxies; also seeds its random choices.
    pub name: String,
    /// Where it listens; port 0 lets the OS choose.
    pub listen: SocketAddr,
    /// Where it connects, `host:port`.
    pub upstream: String,
    /// Bytes or HTTP.
    pub mode: Mode,
    /// HTTP mode: which requests are health probes.
    pub probe: ProbeRules,
    /// A second listener that carries only health probes, if any: it lets TCP
    /// faults and listener faults tell probes from data.
    pub probe_listen: Option<SocketAddr>,
    /// HTTP mode: request headers carrying a transaction id, lower case; a value
    /// seen twice is a duplicate transaction.
    pub id_headers: Vec<String>,
    /// HTTP mode: the name the backend should give in `x-instance`; `None`: the
    /// proxy's name.
    pub instance: Option<String>,
    /// HTTP mode: TLS on the listener(s), if any.
    pub tls: Option<ListenTls>,
    /// HTTP mode: the protocol spoken to the upstream.
    pub upstream_protocol: UpstreamProtocol,
    /// HTTP mode: TLS to the upstream, if any.
    pub upstream_tls: Option<UpstreamTls>,
    /// Faults on from the start, in order.
    #[serde(serialize_with = "faults_json")]
    pub faults: Vec<Fault>,
}

impl ProxyConfig {
    /// A TCP proxy from `listen` to `upstream` with the defaults and no fault.
    pub fn new(name: impl Into<String>, listen: SocketAddr, upstream: impl Into<String>) -> Self {
        ProxyConfig {
            name: name.into(),
            listen,
            upstream: upstream.into(),
            mode: Mode::Tcp,
            probe: ProbeRules::default(),
            probe_listen: None,
            id_headers: ID_HEADERS.map(String::from).to_vec(),
            instance: None,
            tls: None,
            upstream_protocol: UpstreamProtocol::H1,
            upstream_tls: None,
            faults: Vec::new(),
        }
    }

    /// Sets the transaction id headers, lower-cased as HTTP/2 and hyper keep them.
    pub fn set_id_headers(&mut self, headers: &[String]) {
        self.id_headers = headers.iter().map(|h| h.to_ascii_lowercase()).collect();
    }
}

/// The protocol HTTP mode speaks to its upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamProtocol {
    /// HTTP/1.1, over TLS if the upstream has TLS.
    #[default]
    H1,
    /// HTTP/2 in clear with prior knowledge.
    H2c,
    /// HTTP/2 over TLS, agreed by ALPN (an upstream that will not is an error).
    H2,
    /// Over TLS, what ALPN agrees (h2 or HTTP/1.1); in clear, what the client
    /// spoke (h2c or HTTP/1.1).
    Auto,
}

impl UpstreamProtocol {
    /// Its name, as flags and files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamProtocol::H1 => "h1",
            UpstreamProtocol::H2c => "h2c",
            UpstreamProtocol::H2 => "h2",
            UpstreamProtocol::Auto => "auto",
        }
    }

    /// The protocol named `s`.
    pub fn parse(s: &str) -> Result<UpstreamProtocol, String> {
        match s {
            "h1" | "http1" | "http/1.1" => Ok(UpstreamProtocol::H1),
            "h2c" => Ok(UpstreamProtocol::H2c),
            "h2" => Ok(UpstreamProtocol::H2),
            "auto" => Ok(UpstreamProtocol::Auto),
            other => Err(format!(
                "unknown upstream protocol `{other}` (one of h1, h2c, h2, auto)"
            )),
        }
    }
}

impl std::str::FromStr for UpstreamProtocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        UpstreamProtocol::parse(s)
    }
}

impl ProxyConfig {
    /// Whether the protocol and TLS settings go together: they need HTTP mode, h2
    /// needs TLS to the upstream and h2c needs its absence. `Err` says why not.
    pub fn check_legs(&self) -> Result<(), String> {
        let http_only = self.tls.is_some()
            || self.upstream_tls.is_some()
            || self.upstream_protocol != UpstreamProtocol::H1;
        if http_only && self.mode != Mode::Http {
            return Err("TLS and the upstream protocol need mode http".into());
        }
        match (self.upstream_protocol, &self.upstream_tls) {
            (UpstreamProtocol::H2, None) => {
                Err("upstream protocol h2 is HTTP/2 over TLS: it needs upstream TLS (h2c is HTTP/2 in clear)".into())
            }
            (UpstreamProtocol::H2c, Some(_)) => {
                Err("upstream protocol h2c is HTTP/2 in clear: with upstream TLS use h2 or auto".into())
            }
            _ => Ok(()),
        }
    }
}

fn faults_json<S: Serializer>(faults: &[Fault], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(faults.iter().map(Fault::to_json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_config_has_the_defaults_and_serialises_its_faults_as_the_api_does() {
        let mut config = ProxyConfig::new("p", "127.0.0.1:0".parse().unwrap(), "127.0.0.1:80");
        assert_eq!(config.mode, Mode::Tcp);
        assert_eq!(config.id_headers, ["x-request-id", "idempotency-key"]);
        config.set_id_headers(&["X-Txn".into()]);
        assert_eq!(config.id_headers, ["x-txn"]);
        config
            .faults
            .push("latency:latency=5,scope=probe".parse().unwrap());
        let json = serde_json::to_value(&config).unwrap();
        assert_eq!(json["faults"][0]["scope"], "probe");
        assert_eq!(json["faults"][0]["attributes"]["latency"], 5);
    }
}
