//! `snag case --topology FILE`: which parts of a case run elsewhere, already
//! started, and how to reach them. Every part the file does not name starts here, as
//! without the file.
//!
//! ```toml
//! [backend.a]                      # `snag backend --id a --listen 10.0.2.2:9001`
//! address = "10.0.2.2:9001"
//!
//! [interposer.a]                   # a proxy `a` the case makes in `snag serve`
//! api = "10.0.1.2:8474"            # that server's control API
//! token_file = "/run/secrets/snag" # or token = "…"; neither: no token
//! listen = "10.0.1.2:7001"         # its data listener, where the balancer sends
//! probe_listen = "10.0.1.2:7002"   # its probe listener, where health checks go
//!
//! [generator.g1]                   # `snag serve --generator` on another host
//! api = "10.0.3.2:8474"
//! token = "…"
//!
//! [here]
//! address = "10.0.0.1"             # where the others reach this host
//! ```
//!
//! An interposer elsewhere needs its backend elsewhere too: a backend started here
//! listens on loopback, which another machine cannot reach. With generators
//! elsewhere, each load run of the case is split into one shard per generator,
//! started together, and merged; the parts started here listen on `here.address`,
//! so that the generators reach the balancer.

use std::{collections::BTreeMap, net::SocketAddr, path::Path};

use serde::Deserialize;

/// The parts that run elsewhere, by the name the case gives them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// Backends: where each serves.
    pub backends: BTreeMap<String, SocketAddr>,
    /// Interposers: the `snag serve` to make each in, and where it listens.
    pub interposers: BTreeMap<String, Interposer>,
    /// Generators: the `snag serve --generator` of each, by name.
    pub generators: BTreeMap<String, Api>,
    /// Where the other hosts reach this one; parts started here listen there.
    pub here: Option<std::net::IpAddr>,
}

/// A control API elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Api {
    /// Its address.
    pub api: SocketAddr,
    /// Its bearer token, if it asks for one.
    pub token: Option<String>,
}

/// An interposer made through the control API of a `snag serve` elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interposer {
    /// The control API.
    pub api: SocketAddr,
    /// Its bearer token, if it asks for one.
    pub token: Option<String>,
    /// The data listener, as the balancer reaches it.
    pub listen: SocketAddr,
    /// The probe listener, as the balancer's health checks reach it.
    pub probe_listen: SocketAddr,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDef {
    #[serde(default)]
    backend: BTreeMap<String, BackendDef>,
    #[serde(default)]
    interposer: BTreeMap<String, InterposerDef>,
    #[serde(default)]
    generator: BTreeMap<String, GeneratorDef>,
    here: Option<HereDef>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GeneratorDef {
    api: SocketAddr,
    token: Option<String>,
    token_file: Option<std::path::PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HereDef {
    address: std::net::IpAddr,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BackendDef {
    address: SocketAddr,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InterposerDef {
    api: SocketAddr,
    token: Option<String>,
    token_file: Option<std::path::PathBuf>,
    listen: SocketAddr,
    probe_listen: SocketAddr,
}

impl Topology {
    /// Reads and checks the file at `path`; a relative `token_file` is taken from
    /// the file's directory.
    pub fn load(path: &Path) -> Result<Topology, crate::UsageError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            crate::UsageError(format!(
                "topology {}: could not read it: {e}",
                path.display()
            ))
        })?;
        Topology::parse(path, &text)
    }

    /// Parses topology `text`; `path` names it in messages and anchors `token_file`.
    pub fn parse(path: &Path, text: &str) -> Result<Topology, crate::UsageError> {
        let at = |span: Option<std::ops::Range<usize>>, why: &str| {
            let (line, col) = crate::fault::file::line_col(text, span.map_or(0, |s| s.start));
            crate::UsageError(format!("topology {}:{line}:{col}: {why}", path.display()))
        };
        let def: FileDef = toml::from_str(text).map_err(|e| at(e.span(), e.message().trim()))?;
        let whole = |why: String| crate::UsageError(format!("topology {}: {why}", path.display()));
        let mut topology = Topology {
            backends: def
                .backend
                .into_iter()
                .map(|(n, b)| (n, b.address))
                .collect(),
            interposers: BTreeMap::new(),
            generators: BTreeMap::new(),
            here: def.here.map(|h| h.address),
        };
        let token = |what: &str, token: Option<String>, file: Option<std::path::PathBuf>| match (
            token, file,
        ) {
            (Some(_), Some(_)) => Err(whole(format!(
                "{what}: token and token_file both given; keep one"
            ))),
            (Some(t), None) => Ok(Some(t)),
            (None, Some(file)) => {
                let file = path.parent().unwrap_or(Path::new(".")).join(file);
                let token = std::fs::read_to_string(&file).map_err(|e| {
                    whole(format!(
                        "{what}: could not read token_file {}: {e}",
                        file.display()
                    ))
                })?;
                Ok(Some(token.trim().to_string()))
            }
            (None, None) => Ok(None),
        };
        for (name, g) in def.generator {
            let token = token(&format!("generator {name}"), g.token, g.token_file)?;
            topology.generators.insert(name, Api { api: g.api, token });
        }
        if !topology.generators.is_empty() && topology.here.is_none() {
            return Err(whole(
                "generators elsewhere send to the balancer here, which must listen where \
                 they reach it: give [here] address"
                    .into(),
            ));
        }
        for (name, i) in def.interposer {
            let token = token(&format!("interposer {name}"), i.token, i.token_file)?;
            if !topology.backends.contains_key(&name) {
                return Err(whole(format!(
                    "interposer {name} runs elsewhere but backend {name} does not: give \
                     [backend.{name}] an address the interposer can reach (a backend started \
                     here listens on loopback)"
                )));
            }
            if i.listen == i.probe_listen {
                return Err(whole(format!(
                    "interposer {name}: listen and probe_listen are both {}; the probe \
                     listener needs a port of its own",
                    i.listen
                )));
            }
            topology.interposers.insert(
                name,
                Interposer {
                    api: i.api,
                    token,
                    listen: i.listen,
                    probe_listen: i.probe_listen,
                },
            );
        }
        Ok(topology)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Topology, String> {
        Topology::parse(Path::new("/etc/topo.toml"), text).map_err(|e| e.0)
    }

    #[test]
    fn a_file_names_backends_and_the_interposers_in_front_of_them() {
        let t = parse(
            r#"
            [backend.a]
            address = "10.0.2.2:9001"
            [backend.b]
            address = "10.0.2.2:9002"
            [interposer.a]
            api = "10.0.1.2:8474"
            token = "s3cret"
            listen = "10.0.1.2:7001"
            probe_listen = "10.0.1.2:7002"
            "#,
        )
        .unwrap();
        assert_eq!(t.backends["b"], "10.0.2.2:9002".parse().unwrap());
        assert_eq!(
            t.interposers["a"],
            Interposer {
                api: "10.0.1.2:8474".parse().unwrap(),
                token: Some("s3cret".into()),
                listen: "10.0.1.2:7001".parse().unwrap(),
                probe_listen: "10.0.1.2:7002".parse().unwrap(),
            }
        );
        assert!(!t.interposers.contains_key("b"));
        assert_eq!(parse("").unwrap(), Topology::default());
    }

    #[test]
    fn a_token_file_is_read_beside_the_topology() {
        let dir = std::env::temp_dir().join(format!("snag-topo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("token"), "abc\n").unwrap();
        let text = r#"
            backend.a.address = "10.0.2.2:9001"
            [interposer.a]
            api = "10.0.1.2:8474"
            token_file = "token"
            listen = "10.0.1.2:7001"
            probe_listen = "10.0.1.2:7002"
        "#;
        let t = Topology::parse(&dir.join("topo.toml"), text).unwrap();
        assert_eq!(t.interposers["a"].token.as_deref(), Some("abc"));
        std::fs::remove_dir_all(&dir).unwrap();
        let err = Topology::parse(&dir.join("topo.toml"), text).unwrap_err().0;
        assert!(err.contains("could not read token_file"), "{err}");
    }

    #[test]
    fn mistakes_say_where_and_why() {
        let err = parse("[backend.a]\naddress = \"somewhere\"\n").unwrap_err();
        assert!(err.starts_with("topology /etc/topo.toml:2:11: "), "{err}");
        assert!(err.contains("socket address"), "{err}");
        let err = parse("[backend.a]\nadress = \"10.0.0.1:1\"\n").unwrap_err();
        assert!(
            err.starts_with("topology /etc/topo.toml:2:1: unknown field `adress`"),
            "{err}"
        );
        let lone = r#"
            [interposer.a]
            api = "10.0.1.2:8474"
            listen = "10.0.1.2:7001"
            probe_listen = "10.0.1.2:7002"
        "#;
        let err = parse(lone).unwrap_err();
        assert!(
            err.contains("interposer a runs elsewhere but backend a does not"),
            "{err}"
        );
        let same = r#"
            backend.a.address = "10.0.2.2:9001"
            [interposer.a]
            api = "10.0.1.2:8474"
            listen = "10.0.1.2:7001"
            probe_listen = "10.0.1.2:7001"
        "#;
        let err = parse(same).unwrap_err();
        assert!(err.contains("needs a port of its own"), "{err}");
        let both = r#"
            backend.a.address = "10.0.2.2:9001"
            [interposer.a]
            api = "10.0.1.2:8474"
            token = "x"
            token_file = "t"
            listen = "10.0.1.2:7001"
            probe_listen = "10.0.1.2:7002"
        "#;
        assert!(parse(both).unwrap_err().contains("keep one"));
    }
}
