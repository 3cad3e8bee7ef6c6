//! The proxies and toxics as Toxiproxy's clients send and see them, and the Go
//! error texts its clients expect.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use super::Entry;
use crate::{api::toxic::go_float, fault::Direction};

/// A proxy as clients send it; every field optional, `null` meaning "default".
#[derive(Debug, Default, Deserialize)]
pub struct ProxyInput {
    /// Unique name.
    pub name: Option<String>,
    /// `host:port` to listen on.
    pub listen: Option<String>,
    /// `host:port` to relay to.
    pub upstream: Option<String>,
    /// Listening or not.
    pub enabled: Option<bool>,
    /// snag's own: `tcp` (default) or `http`.
    pub mode: Option<crate::fault::Mode>,
    /// snag's own: HTTP mode's probe rules (`paths`, `headers`, `methods`).
    pub probe: Option<crate::fault::ProbeRules>,
    /// snag's own: a second listener for health checks alone.
    pub probe_listen: Option<String>,
    /// snag's own: request headers carrying a transaction id.
    pub id_headers: Option<Vec<String>>,
    /// snag's own: the backend's expected `x-instance`.
    pub instance: Option<String>,
    /// snag's own: `false` leaves this proxy out of the server's capture
    /// (`serve --capture`); a file name gives it a capture of its own in the files
    /// directory; default: captured when the server captures. On a running proxy,
    /// `true` or `false` switches its capture on or off for new connections.
    pub capture: Option<CaptureInput>,
    /// snag's own: a file name (in the files directory) for this proxy's own event log.
    pub events: Option<String>,
    /// snag's own: TLS on the listener, files named inside the files directory.
    pub tls: Option<TlsInput>,
    /// snag's own: `h1` (default), `h2c`, `h2` or `auto`.
    pub upstream_protocol: Option<crate::fault::config::UpstreamProtocol>,
    /// snag's own: TLS to the upstream.
    pub upstream_tls: Option<UpstreamTlsInput>,
}

/// `tls` as clients send it: `cert` and `key`, or `generate` (where the CA made for
/// the run is written) with more `names`; file names inside the files directory.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsInput {
    /// The PEM certificate chain.
    pub cert: Option<String>,
    /// Its PEM key.
    pub key: Option<String>,
    /// Make a certificate for the run; its CA goes to this file.
    pub generate: Option<String>,
    /// More names for the made certificate.
    #[serde(default)]
    pub names: Vec<String>,
}

/// `upstream_tls` as clients send it; `ca` a file name inside the files directory.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsInput {
    /// The name sent in SNI and checked.
    pub sni: Option<String>,
    /// The CA to trust.
    pub ca: Option<String>,
    /// Accept any certificate.
    #[serde(default)]
    pub insecure: bool,
}

/// `capture` as clients send it: on or off, or a file of the proxy's own.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CaptureInput {
    /// In the server's capture or not.
    Shared(bool),
    /// A file name inside the files directory.
    File(String),
}

/// A proxy as Toxiproxy renders it, field order included.
#[derive(Debug, Serialize)]
pub struct ProxyView {
    name: String,
    listen: String,
    upstream: String,
    enabled: bool,
    /// Toxiproxy leaks an empty `Logger` object; clients receive it, so we send it too.
    #[serde(rename = "Logger")]
    logger: Map<String, Value>,
    toxics: Vec<ToxicView>,
    /// snag's own, shown only for HTTP proxies so TCP ones read as Toxiproxy's.
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<&'static str>,
    /// snag's own, shown only when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    probe_listen: Option<String>,
    /// snag's own, shown only when the listener speaks TLS.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    tls: bool,
    /// snag's own, shown only when not `h1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream_protocol: Option<&'static str>,
    /// snag's own, shown only when the upstream leg speaks TLS.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    upstream_tls: bool,
    /// snag's own, shown only when the proxy is captured.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    capture: bool,
    /// snag's own: the proxy's own capture file, as named.
    #[serde(skip_serializing_if = "Option::is_none")]
    capture_file: Option<String>,
    /// snag's own: the proxy's own event log, as named.
    #[serde(skip_serializing_if = "Option::is_none")]
    events_file: Option<String>,
}

/// A toxic as Toxiproxy renders it, field order included.
#[derive(Debug, Serialize)]
pub struct ToxicView {
    attributes: Value,
    pub(super) name: String,
    #[serde(rename = "type")]
    kind: String,
    stream: String,
    toxicity: Number,
    /// snag's own, shown only when not `any` so plain toxics read as Toxiproxy's.
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<&'static str>,
}

/// The first of snag's own fields that `input` would change on an existing proxy:
/// they shape how the proxy was built, so an update that names a different value is
/// refused rather than answered 200 and ignored.
pub(super) fn fixed_field_changed(entry: &Entry, input: &ProxyInput) -> Option<&'static str> {
    let options = entry.proxy.config();
    if input.mode.is_some_and(|m| m != options.mode) {
        return Some("mode");
    }
    if input.probe.as_ref().is_some_and(|p| *p != options.probe) {
        return Some("probe");
    }
    if input
        .probe_listen
        .as_ref()
        .is_some_and(|p| Some(p) != entry.probe_listen.as_ref())
    {
        return Some("probe_listen");
    }
    if let Some(headers) = &input.id_headers {
        let lower: Vec<String> = headers.iter().map(|h| h.to_ascii_lowercase()).collect();
        if lower != options.id_headers {
            return Some("id_headers");
        }
    }
    if input.instance.is_some() && input.instance != options.instance {
        return Some("instance");
    }
    if input
        .upstream_protocol
        .is_some_and(|p| p != options.upstream_protocol)
    {
        return Some("upstream_protocol");
    }
    // Named files resolve to paths: compared by the names' last parts.
    let last = |p: &std::path::Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let named = |n: &Option<String>| n.as_deref().map(|n| last(std::path::Path::new(n)));
    if let Some(tls) = &input.tls {
        let same = match &options.tls {
            Some(crate::tls::ListenTls::Files { cert, key }) => {
                named(&tls.cert) == Some(last(cert))
                    && named(&tls.key) == Some(last(key))
                    && tls.generate.is_none()
            }
            Some(crate::tls::ListenTls::Generated { ca_out, names }) => {
                named(&tls.generate) == Some(last(ca_out)) && tls.names == *names
            }
            None => false,
        };
        if !same {
            return Some("tls");
        }
    }
    if let Some(up) = &input.upstream_tls {
        let same = options.upstream_tls.as_ref().is_some_and(|t| {
            t.sni == up.sni
                && t.insecure == up.insecure
                && named(&up.ca) == t.ca.as_deref().map(last)
        });
        if !same {
            return Some("upstream_tls");
        }
    }
    let own_capture = entry.files.capture.as_ref().map(|(n, _)| n.as_str());
    let capture_same = match &input.capture {
        None => true,
        Some(CaptureInput::File(name)) => own_capture == Some(name.as_str()),
        // Switched on or off in place (`Proxy::set_capturing`).
        Some(CaptureInput::Shared(_)) => true,
    };
    if !capture_same {
        return Some("capture");
    }
    let own_events = entry.files.events.as_ref().map(|(n, _)| n.as_str());
    if input
        .events
        .as_deref()
        .is_some_and(|e| Some(e) != own_events)
    {
        return Some("events");
    }
    None
}

pub(super) fn view(name: &str, entry: &Entry) -> ProxyView {
    ProxyView {
        name: name.to_string(),
        listen: entry.listen.clone(),
        upstream: entry.proxy.upstream().to_string(),
        enabled: entry.enabled,
        logger: Map::new(),
        toxics: toxics(entry),
        mode: (entry.proxy.config().mode == crate::fault::Mode::Http).then_some("http"),
        probe_listen: entry.probe_listen.clone(),
        tls: entry.proxy.config().tls.is_some(),
        upstream_protocol: Some(entry.proxy.config().upstream_protocol.as_str())
            .filter(|p| *p != "h1"),
        upstream_tls: entry.proxy.config().upstream_tls.is_some(),
        capture: entry.proxy.capturing(),
        capture_file: entry.files.capture.as_ref().map(|(n, _)| n.clone()),
        events_file: entry.files.events.as_ref().map(|(n, _)| n.clone()),
    }
}

pub(super) fn toxics(entry: &Entry) -> Vec<ToxicView> {
    let faults = entry.proxy.faults();
    let (up, down): (Vec<_>, Vec<_>) = faults
        .into_iter()
        .partition(|f| f.stream == Direction::Upstream);
    up.into_iter()
        .chain(down)
        .map(|f| ToxicView {
            attributes: f.kind.attributes_json(),
            stream: entry
                .streams
                .get(&f.name)
                .cloned()
                .unwrap_or_else(|| f.stream.to_string()),
            kind: f.kind.type_name().to_string(),
            toxicity: go_float(f.toxicity),
            scope: (f.scope != crate::fault::Scope::Any).then(|| f.scope.as_str()),
            name: f.name,
        })
        .collect()
}

/// A listen string as Toxiproxy takes it: `host:port`, an empty host or `localhost`
/// meaning 127.0.0.1 (snag never binds every interface unasked), `""` meaning `127.0.0.1:0`.
pub async fn resolve(listen: &str) -> Result<SocketAddr, String> {
    let listen = if listen.is_empty() { ":0" } else { listen };
    let (host, port) = listen
        .rsplit_once(':')
        .ok_or_else(|| format!("address {listen}: missing port in address"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("address {listen}: invalid port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || host == "localhost" {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(ip) = host.parse() {
        return Ok(SocketAddr::new(ip, port));
    }
    tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("lookup {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("lookup {host}: no such host"))
}

pub(super) fn go_listen_error(addr: SocketAddr, err: &std::io::Error) -> String {
    let why = match err.kind() {
        std::io::ErrorKind::AddrInUse => "address already in use".to_string(),
        std::io::ErrorKind::AddrNotAvailable => "cannot assign requested address".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => err.to_string(),
    };
    format!("listen tcp {addr}: bind: {why}")
}
