//! One proxy as every front end describes it: `snag proxy`'s flags, a fault file's
//! `[[proxy]]`, the API's JSON and the cases all build a [`ProxyConfig`], and the
//! interposer is made from it alone. Run-wide settings (seed, events, capture,
//! timeouts) travel apart, in `proxy::RunContext`.

use std::net::SocketAddr;

use serde::{Serialize, Serializer};

use super::{Fault, Mode, ProbeRules};

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
            faults: Vec::new(),
        }
    }

    /// Sets the transaction id headers, lower-cased as HTTP/2 and hyper keep them.
    pub fn set_id_headers(&mut self, headers: &[String]) {
        self.id_headers = headers.iter().map(|h| h.to_ascii_lowercase()).collect();
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
