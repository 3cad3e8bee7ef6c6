//! Fault files (`faults/*.toml`): proxies, their faults, and a timeline that adds and
//! removes faults at set offsets so a scenario runs by itself.
//!
//! Parsing is strict (`deny_unknown_fields` on every table); validation is a second
//! pass over spanned values so every error names `file:line:col`.

use std::{collections::HashSet, net::SocketAddr, path::Path, time::Duration};

use serde::Deserialize;
use toml::Spanned;

use super::{
    Direction, Fault, Kind, Mode, ProbeRules,
    config::{ProxyConfig, UpstreamProtocol},
    drain::Drain,
};
use crate::tls::{ListenTls, UpstreamTls};

/// A fault file that could not be used: where, and why.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("{path}: {why}")]
    Read {
        /// The file.
        path: String,
        /// What the OS said (in the message, so not also a source to print twice).
        why: std::io::Error,
    },
    /// Syntax or validation error at a place in the file.
    #[error("{path}:{line}:{col}: {why}")]
    At {
        /// The file.
        path: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What is wrong there.
        why: String,
    },
}

/// A whole fault file, validated.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The run's seed, if the file fixes one.
    pub seed: Option<u64>,
    /// One interposer each.
    pub proxies: Vec<ProxySpec>,
    /// A capture of every proxy's connections, if the file asks for one.
    pub capture: Option<crate::capture::Settings>,
}

/// One proxy of a fault file.
#[derive(Debug, Clone)]
pub struct ProxySpec {
    /// The proxy, its first faults included.
    pub config: ProxyConfig,
    /// Changes at offsets from the start, sorted by offset.
    pub timeline: Vec<Change>,
}

/// One timeline entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// Offset from the start of the run.
    pub at: Duration,
    /// What happens then.
    pub action: Action,
}

/// What a timeline entry does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Add this fault.
    Add(Fault),
    /// Remove the fault of this name.
    Remove(String),
    /// Start draining.
    Drain(Drain),
    /// Stop draining: accept new connections again.
    Undrain,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDef {
    seed: Option<u64>,
    capture: Option<CaptureDef>,
    #[serde(default)]
    proxy: Vec<Spanned<ProxyDef>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaptureDef {
    path: String,
    max_bytes: Option<u64>,
    #[serde(default)]
    snaplen: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProxyDef {
    name: Spanned<String>,
    listen: Spanned<String>,
    upstream: Spanned<String>,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    probe: ProbeRules,
    probe_listen: Option<Spanned<String>>,
    id_headers: Option<Vec<String>>,
    instance: Option<String>,
    tls: Option<Spanned<TlsDef>>,
    upstream_protocol: Option<Spanned<String>>,
    upstream_tls: Option<UpstreamTlsDef>,
    #[serde(default)]
    fault: Vec<Spanned<FaultDef>>,
    #[serde(default)]
    timeline: Vec<Spanned<ChangeDef>>,
}

/// `[proxy.tls]`: `cert` and `key` files, or `generate` = where the run's CA goes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsDef {
    cert: Option<String>,
    key: Option<String>,
    generate: Option<String>,
    #[serde(default)]
    names: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamTlsDef {
    sni: Option<String>,
    ca: Option<String>,
    #[serde(default)]
    insecure: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultDef {
    name: Option<String>,
    #[serde(rename = "type")]
    type_name: Spanned<String>,
    stream: Option<Spanned<String>>,
    toxicity: Option<Spanned<toml::Value>>,
    scope: Option<Spanned<String>>,
    attributes: Option<Spanned<toml::Table>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeDef {
    at: Spanned<String>,
    add: Option<Spanned<FaultDef>>,
    remove: Option<Spanned<String>>,
    drain: Option<Spanned<Drain>>,
    undrain: Option<bool>,
}

/// Reads and validates the fault file at `path`.
pub fn load(path: &Path) -> Result<Scenario, Error> {
    let text = std::fs::read_to_string(path).map_err(|why| Error::Read {
        path: path.display().to_string(),
        why,
    })?;
    parse(&path.display().to_string(), &text)
}

/// The line and column (from 1) of byte `offset` of `text`, for messages about
/// TOML files.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Parses and validates fault-file `text`; `path` is only for messages.
pub fn parse(path: &str, text: &str) -> Result<Scenario, Error> {
    let at = |span: std::ops::Range<usize>, why: String| {
        let (line, col) = line_col(text, span.start);
        Error::At {
            path: path.to_string(),
            line,
            col,
            why,
        }
    };
    let def: FileDef = toml::from_str(text)
        .map_err(|e| at(e.span().unwrap_or(0..0), e.message().trim().to_string()))?;
    if def.proxy.is_empty() {
        // Running nothing and exiting 0 would look like a run that went well.
        return Err(at(
            0..0,
            "no [[proxy]]: a fault file describes at least one proxy (faults/README.md)".into(),
        ));
    }
    let mut names = HashSet::new();
    let mut proxies = Vec::new();
    for proxy in def.proxy {
        let proxy = proxy.into_inner();
        let name = proxy.name.get_ref().clone();
        let name_span = proxy.name.span();
        if name.is_empty() || !names.insert(name.clone()) {
            return Err(at(
                proxy.name.span(),
                format!("proxy name `{name}` is empty or used twice"),
            ));
        }
        let listen = proxy.listen.get_ref().parse().map_err(|_| {
            at(
                proxy.listen.span(),
                format!(
                    "proxy `{name}`: listen `{}` is not an IP:port address",
                    proxy.listen.get_ref()
                ),
            )
        })?;
        let probe_listen = match &proxy.probe_listen {
            Some(p) => Some(p.get_ref().parse::<SocketAddr>().map_err(|_| {
                at(
                    p.span(),
                    format!(
                        "proxy `{name}`: probe_listen `{}` is not an IP:port address",
                        p.get_ref()
                    ),
                )
            })?),
            None => None,
        };
        let upstream = host_port(proxy.upstream.get_ref()).map_err(|why| {
            at(
                proxy.upstream.span(),
                format!("proxy `{name}`: upstream {why}"),
            )
        })?;
        let mut faults = Vec::new();
        for f in proxy.fault {
            let (span, f) = (f.span(), f.into_inner());
            let fault = fault(f, &name).map_err(|(s, why)| at(s.unwrap_or(span.clone()), why))?;
            if faults.iter().any(|g: &Fault| g.name == fault.name) {
                return Err(at(
                    span,
                    format!("proxy `{name}`: fault `{}` is defined twice", fault.name),
                ));
            }
            if !proxy.mode.takes(&fault.kind) {
                return Err(at(span, mode_error(&name, &fault, proxy.mode)));
            }
            faults.push(fault);
        }
        let mut timeline = Vec::new();
        for c in proxy.timeline {
            let (span, c) = (c.span(), c.into_inner());
            let offset = humantime::parse_duration(c.at.get_ref()).map_err(|e| {
                at(
                    c.at.span(),
                    format!(
                        "proxy `{name}`: at `{}` is not a duration like 2s or 150ms ({e})",
                        c.at.get_ref()
                    ),
                )
            })?;
            let action = match (c.add, c.remove, c.drain, c.undrain) {
                (None, None, Some(drain), None) => {
                    let s = drain.span();
                    let drain = drain.into_inner();
                    drain
                        .validate()
                        .map_err(|why| at(s, format!("proxy `{name}`: {why}")))?;
                    Action::Drain(drain)
                }
                (None, None, None, Some(true)) => Action::Undrain,
                (Some(add), None, None, None) => {
                    let s = add.span();
                    Action::Add(
                        fault(add.into_inner(), &name)
                            .map_err(|(inner, why)| at(inner.unwrap_or(s), why))?,
                    )
                }
                (None, Some(remove), None, None) => Action::Remove(remove.into_inner()),
                _ => {
                    return Err(at(
                        span,
                        format!(
                            "proxy `{name}`: a timeline entry needs exactly one of add, remove, drain or undrain = true"
                        ),
                    ));
                }
            };
            timeline.push((span, Change { at: offset, action }));
        }
        timeline.sort_by_key(|(_, c)| c.at);
        // Replay the timeline so a remove of a fault that is not there, or an add of one
        // that is, fails here and not halfway through a run.
        let mut live: Vec<String> = faults.iter().map(|f| f.name.clone()).collect();
        for (span, change) in &timeline {
            match &change.action {
                Action::Add(f) if live.contains(&f.name) => {
                    return Err(at(
                        span.clone(),
                        format!(
                            "proxy `{name}`: fault `{}` is already on at {:?}",
                            f.name, change.at
                        ),
                    ));
                }
                Action::Add(f) if !proxy.mode.takes(&f.kind) => {
                    return Err(at(span.clone(), mode_error(&name, f, proxy.mode)));
                }
                Action::Add(f) => live.push(f.name.clone()),
                Action::Remove(n) if !live.contains(n) => {
                    return Err(at(
                        span.clone(),
                        format!(
                            "proxy `{name}`: no fault `{n}` is on at {:?} to remove",
                            change.at
                        ),
                    ));
                }
                Action::Remove(n) => live.retain(|l| l != n),
                Action::Drain(_) | Action::Undrain => {}
            }
        }
        let mut config = ProxyConfig::new(name.clone(), listen, upstream);
        config.mode = proxy.mode;
        config.probe = proxy.probe;
        config.probe_listen = probe_listen;
        if let Some(headers) = &proxy.id_headers {
            config.set_id_headers(headers);
        }
        config.instance = proxy.instance;
        if let Some(tls) = proxy.tls {
            let span = tls.span();
            let tls = tls.into_inner();
            config.tls = Some(match (tls.cert, tls.key, tls.generate) {
                (Some(cert), Some(key), None) => ListenTls::Files {
                    cert: cert.into(),
                    key: key.into(),
                },
                (None, None, Some(ca_out)) => ListenTls::Generated {
                    ca_out: ca_out.into(),
                    names: tls.names,
                },
                _ => {
                    return Err(at(
                        span,
                        format!(
                            "proxy `{name}`: tls needs `cert` and `key`, or `generate` (where the run's CA is written), not both"
                        ),
                    ));
                }
            });
        }
        if let Some(protocol) = &proxy.upstream_protocol {
            config.upstream_protocol = UpstreamProtocol::parse(protocol.get_ref())
                .map_err(|why| at(protocol.span(), format!("proxy `{name}`: {why}")))?;
        }
        config.upstream_tls = proxy.upstream_tls.map(|t| UpstreamTls {
            sni: t.sni,
            ca: t.ca.map(Into::into),
            insecure: t.insecure,
        });
        if let Err(why) = config.check_legs() {
            return Err(at(name_span, format!("proxy `{name}`: {why}")));
        }
        config.faults = faults;
        proxies.push(ProxySpec {
            config,
            timeline: timeline.into_iter().map(|(_, c)| c).collect(),
        });
    }
    let capture = def.capture.map(|c| crate::capture::Settings {
        path: c.path.into(),
        max_bytes: c.max_bytes,
        snaplen: c.snaplen,
    });
    Ok(Scenario {
        seed: def.seed,
        proxies,
        capture,
    })
}

fn mode_error(proxy: &str, fault: &Fault, mode: Mode) -> String {
    let needs = if fault.kind.is_http() { "http" } else { "tcp" };
    format!(
        "proxy `{proxy}`: fault `{}` ({}) needs mode = \"{needs}\", the proxy is in mode \"{}\"{}",
        fault.name,
        fault.kind.type_name(),
        mode.as_str(),
        if mode == Mode::Http { HTTP_BYTES } else { "" }
    )
}

/// What HTTP mode offers instead of the TCP faults it does not run.
pub const HTTP_BYTES: &str = " (mode http runs latency, bandwidth, slicer and reset_peer on the \
    client's bytes; bad_body, drop_request and http_delay do the rest per request)";

/// Checks that `addr` reads as `host:port` with a port from 1 to 65535; the host is
/// resolved at each connect. `Err` says why in words for the user.
pub fn host_port(addr: &str) -> Result<String, String> {
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {
            Ok(addr.to_string())
        }
        _ => Err(format!("`{addr}` is not host:port (e.g. 127.0.0.1:8080)")),
    }
}

type Span = std::ops::Range<usize>;

/// Builds one fault; `Err` carries the span of the offending value when it has one.
fn fault(def: FaultDef, proxy: &str) -> Result<Fault, (Option<Span>, String)> {
    let label = def
        .name
        .clone()
        .unwrap_or_else(|| def.type_name.get_ref().clone());
    let why = |what: String| format!("proxy `{proxy}`: fault `{label}`: {what}");
    let stream = match &def.stream {
        Some(s) => Some(
            s.get_ref()
                .parse::<Direction>()
                .map_err(|e| (Some(s.span()), why(e)))?,
        ),
        None => None,
    };
    let toxicity = match &def.toxicity {
        Some(t) => Some(match t.get_ref() {
            toml::Value::Float(f) => *f,
            toml::Value::Integer(i) => *i as f64,
            other => {
                return Err((
                    Some(t.span()),
                    why(format!("toxicity must be a number, got {other}")),
                ));
            }
        }),
        None => None,
    };
    let (attr_span, attributes) = match def.attributes {
        Some(a) => (Some(a.span()), a.into_inner()),
        None => (None, toml::Table::new()),
    };
    let kind = Kind::new(def.type_name.get_ref(), attributes).map_err(|e| {
        let span = if e.starts_with("unknown fault type") {
            Some(def.type_name.span())
        } else {
            attr_span
        };
        (span, why(e))
    })?;
    let fault = Fault::new(def.name, kind, stream, toxicity).map_err(|e| {
        let span = if e.starts_with("toxicity") {
            def.toxicity.as_ref().map(|t| t.span())
        } else {
            None
        };
        (span, why(e))
    })?;
    match &def.scope {
        Some(s) => {
            let scope = s.get_ref().parse().map_err(|e| (Some(s.span()), why(e)))?;
            fault
                .with_scope(scope)
                .map_err(|e| (Some(s.span()), why(e)))
        }
        None => Ok(fault),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
seed = 7

[[proxy]]
name = "api"
listen = "127.0.0.1:0"
upstream = "localhost:8080"

[[proxy.fault]]
type = "latency"
attributes = { latency = 50, jitter = 10 }

[[proxy.timeline]]
at = "2s"
add = { name = "cut", type = "reset_peer", stream = "upstream", toxicity = 0.5 }

[[proxy.timeline]]
at = "1s"
remove = "latency_downstream"
"#;

    #[test]
    fn a_good_file_parses_with_its_timeline_sorted() {
        let s = parse("good.toml", GOOD).unwrap();
        assert_eq!(s.seed, Some(7));
        let p = &s.proxies[0];
        assert_eq!(p.config.faults[0].name, "latency_downstream");
        assert_eq!(
            p.timeline[0],
            Change {
                at: Duration::from_secs(1),
                action: Action::Remove("latency_downstream".into())
            }
        );
        assert!(
            matches!(&p.timeline[1].action, Action::Add(f) if f.name == "cut" && f.toxicity == 0.5)
        );
    }

    fn err(text: &str) -> String {
        parse("f.toml", text).unwrap_err().to_string()
    }

    #[test]
    fn errors_name_the_line_and_column_and_the_reason() {
        let base =
            "[[proxy]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:1\"\n";
        let e = err(&format!(
            "{base}[[proxy.fault]]\ntype = \"latency\"\nattributes = {{ latency = 5, jiter = 1 }}\n"
        ));
        assert!(
            e.starts_with("f.toml:7:") && e.contains("unknown field `jiter`"),
            "{e}"
        );
        let e = err(&format!(
            "{base}[[proxy.fault]]\ntype = \"latency\"\ntoxicity = 2\n"
        ));
        assert!(
            e.starts_with("f.toml:7:12:") && e.contains("toxicity 2 is outside"),
            "{e}"
        );
        let e = err(&format!("{base}[[proxy.fault]]\ntype = \"latensy\"\n"));
        assert!(
            e.starts_with("f.toml:6:8:") && e.contains("unknown fault type `latensy`"),
            "{e}"
        );
        let e = err(&format!(
            "{base}[[proxy.timeline]]\nat = \"2s\"\nremove = \"ghost\"\n"
        ));
        assert!(
            e.starts_with("f.toml:5:") && e.contains("no fault `ghost`"),
            "{e}"
        );
        let e = err(&format!(
            "{base}[[proxy.timeline]]\nat = \"soon\"\nremove = \"x\"\n"
        ));
        assert!(
            e.starts_with("f.toml:6:6:") && e.contains("not a duration"),
            "{e}"
        );
        let e = err("[[proxy]]\nname = \"p\"\nlisten = \"nowhere\"\nupstream = \"a:1\"\n");
        assert!(
            e.starts_with("f.toml:3:10:") && e.contains("not an IP:port"),
            "{e}"
        );
        let e = err(
            "[[proxy]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\nupstream = \"a:1\"\ncolour = 1\n",
        );
        assert!(
            e.starts_with("f.toml:5:1:") && e.contains("unknown field `colour`"),
            "{e}"
        );
        let e = err("[[proxy]\n");
        assert!(e.starts_with("f.toml:1:"), "{e}");
    }
}
