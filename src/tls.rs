//! TLS for HTTP mode's two legs: the listener's certificate (from files, or made for
//! the run with its CA written where a balancer can be told to trust it), the
//! upstream's verification (a CA file, the system's roots, or an explicit insecure
//! switch), ALPN, and the session keys written in the NSS key log format so that
//! Wireshark and tshark decrypt a capture.

mod keylog;

pub use self::keylog::{KeyLogFile, KeyLogs};

use std::{
    fmt,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use rustls::{
    ClientConfig, DigitallySignedStruct, KeyLog, RootCertStore, ServerConfig, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject};
use serde::Serialize;

/// ALPN's name for HTTP/2.
pub const H2: &[u8] = b"h2";
/// ALPN's name for HTTP/1.1.
pub const HTTP11: &[u8] = b"http/1.1";

/// Where the listener's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum ListenTls {
    /// A PEM certificate chain and its PEM private key.
    Files {
        /// The chain, leaf first.
        cert: PathBuf,
        /// The leaf's key (PKCS#8, PKCS#1 or SEC1).
        key: PathBuf,
    },
    /// A CA and a certificate it signs, made when the proxy starts; the CA's
    /// certificate is written to `ca_out` for the client to trust.
    Generated {
        /// Where the CA certificate goes (PEM).
        ca_out: PathBuf,
        /// The names the certificate is for, besides localhost, 127.0.0.1 and ::1.
        names: Vec<String>,
    },
}

impl ListenTls {
    /// What the command line's `--tls-cert FILE --tls-key FILE` or `--tls-generate
    /// CA_FILE [--tls-name NAME]…` ask for, if anything (clap has checked they go
    /// together).
    pub fn from_flags(
        cert: Option<&PathBuf>,
        key: Option<&PathBuf>,
        generate: Option<&PathBuf>,
        names: &[String],
    ) -> Option<ListenTls> {
        match (cert, key, generate) {
            (Some(cert), Some(key), _) => Some(ListenTls::Files {
                cert: cert.clone(),
                key: key.clone(),
            }),
            (_, _, Some(ca_out)) => Some(ListenTls::Generated {
                ca_out: ca_out.clone(),
                names: names.to_vec(),
            }),
            _ => None,
        }
    }
}

/// How snag speaks TLS to its upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct UpstreamTls {
    /// The name sent in SNI and checked against the certificate; `None`: the
    /// upstream's host.
    pub sni: Option<String>,
    /// Trust this CA (PEM) instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// Accept any certificate (the handshake's signatures are still checked).
    pub insecure: bool,
}

/// A TLS setting that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or holds nothing usable.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the settings (a certificate that does not match its key …).
    #[error("{0}")]
    Rustls(String),
    /// A name that can be neither a DNS name nor an IP address.
    #[error("`{0}` is not a DNS name or an IP address")]
    Name(String),
}

fn file_error(path: &Path, why: impl fmt::Display) -> Error {
    Error::File {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

/// A certificate chain and its private key.
#[derive(Debug)]
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

/// A certificate made for the run, in PEM and ready to serve.
struct Minted {
    cert_pem: String,
    key_pem: String,
    ca_pem: String,
    identity: Identity,
}

impl Identity {
    /// Reads a PEM chain from `cert` and a PEM key from `key`.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Identity, Error> {
        let chain = certificates(cert)?;
        let bytes = std::fs::read(key).map_err(|e| file_error(key, format!("cannot read: {e}")))?;
        let key_der = PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                file_error(key, "no PRIVATE KEY block in it (PEM expected)")
            }
            other => file_error(key, format!("not a PEM private key: {other}")),
        })?;
        Ok(Identity {
            chain,
            key: key_der,
        })
    }

    /// Makes a CA and a certificate it signs for localhost, 127.0.0.1, ::1 and
    /// `names`, writes the CA's certificate to `ca_out` (PEM) and returns the
    /// certificate with its key. The CA's key is never written.
    pub fn generate(names: &[String], ca_out: &Path) -> Result<Identity, Error> {
        let minted = Identity::mint(names)?;
        std::fs::write(ca_out, &minted.ca_pem)
            .map_err(|e| file_error(ca_out, format!("cannot write the CA certificate: {e}")))?;
        Ok(minted.identity)
    }

    /// A CA and a certificate it signs for localhost, 127.0.0.1 and ::1, written to
    /// `dir` as `cert.pem` (leaf and CA), `key.pem` and `ca.pem`, for listeners
    /// that share one certificate and a client told to trust the CA: (cert, key, ca).
    pub fn generate_files(dir: &Path) -> Result<(PathBuf, PathBuf, PathBuf), Error> {
        let minted = Identity::mint(&[])?;
        let (cert, key, ca) = (
            dir.join("cert.pem"),
            dir.join("key.pem"),
            dir.join("ca.pem"),
        );
        for (path, text) in [
            (&cert, format!("{}{}", minted.cert_pem, minted.ca_pem)),
            (&key, minted.key_pem),
            (&ca, minted.ca_pem),
        ] {
            std::fs::write(path, text)
                .map_err(|e| file_error(path, format!("cannot write: {e}")))?;
        }
        Ok((cert, key, ca))
    }

    fn mint(names: &[String]) -> Result<Minted, Error> {
        let rcgen_error = |e: rcgen::Error| Error::Rustls(format!("making a certificate: {e}"));
        let mut ca_params =
            rcgen::CertificateParams::new(Vec::<String>::new()).map_err(rcgen_error)?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "snag run CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = rcgen::KeyPair::generate().map_err(rcgen_error)?;
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).map_err(rcgen_error)?;
        let mut all: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
        for name in names {
            if !all.contains(name) {
                all.push(name.clone());
            }
        }
        for name in &all {
            if name.parse::<IpAddr>().is_err() && ServerName::try_from(name.as_str()).is_err() {
                return Err(Error::Name(name.clone()));
            }
        }
        let mut params = rcgen::CertificateParams::new(all).map_err(rcgen_error)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "snag");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = rcgen::KeyPair::generate().map_err(rcgen_error)?;
        let cert = params.signed_by(&key, &ca).map_err(rcgen_error)?;
        Ok(Minted {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: ca.pem(),
            identity: Identity {
                chain: vec![cert.der().clone(), ca.der().clone()],
                key: PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            },
        })
    }

    /// The identity `tls` names.
    pub fn of(tls: &ListenTls) -> Result<Identity, Error> {
        match tls {
            ListenTls::Files { cert, key } => Identity::from_files(cert, key),
            ListenTls::Generated { ca_out, names } => Identity::generate(names, ca_out),
        }
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let bytes = std::fs::read(path).map_err(|e| file_error(path, format!("cannot read: {e}")))?;
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, format!("not a PEM certificate: {e}")))?;
    if chain.is_empty() {
        return Err(file_error(
            path,
            "no CERTIFICATE block in it (PEM expected)",
        ));
    }
    Ok(chain)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A listener's TLS: `identity`, ALPN `h2` then `http/1.1`, keys to `keylog`.
pub fn server(
    identity: Identity,
    keylog: Option<Arc<dyn KeyLog>>,
) -> Result<Arc<ServerConfig>, Error> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Rustls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(identity.chain, identity.key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                Error::Rustls("the certificate does not match the private key".into())
            }
            other => Error::Rustls(format!("the certificate or key cannot be used: {other}")),
        })?;
    config.alpn_protocols = vec![H2.to_vec(), HTTP11.to_vec()];
    if let Some(keylog) = keylog {
        config.key_log = keylog;
    }
    Ok(Arc::new(config))
}

/// A client's TLS to an upstream: verified as `tls` says, offering `alpn` in order.
pub fn client(
    tls: &UpstreamTls,
    alpn: &[&[u8]],
    keylog: Option<Arc<dyn KeyLog>>,
) -> Result<Arc<ClientConfig>, Error> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Rustls(e.to_string()))?;
    let mut config = if tls.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
            .with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        match &tls.ca {
            Some(path) => {
                for cert in certificates(path)? {
                    roots.add(cert).map_err(|e| {
                        file_error(path, format!("not a usable CA certificate: {e}"))
                    })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(Error::Rustls(
                        "no CA certificates found on this system: give the upstream's CA file, or the insecure switch".into(),
                    ));
                }
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    if let Some(keylog) = keylog {
        config.key_log = keylog;
    }
    Ok(Arc::new(config))
}

/// The name a client sends in SNI and checks the certificate against: `sni` if
/// given, else the host of `host_port`.
pub fn server_name(sni: Option<&str>, host_port: &str) -> Result<ServerName<'static>, Error> {
    let host = match sni {
        Some(name) => name,
        None => host_of(host_port),
    };
    ServerName::try_from(host.to_string()).map_err(|_| Error::Name(host.to_string()))
}

/// `host` of `host:port`, `[v6]:port` or a bare host.
fn host_of(host_port: &str) -> &str {
    if let Some(rest) = host_port.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host_port.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
        _ => host_port,
    }
}

/// Accepts any certificate; checks the handshake's signatures as usual.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of the test's own, removed when it ends.
    pub(super) struct Temp(PathBuf);

    impl std::ops::Deref for Temp {
        type Target = Path;

        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Temp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    pub(super) fn temp(name: &str) -> Temp {
        let dir = std::env::temp_dir().join(format!("snag-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Temp(dir)
    }

    #[test]
    fn a_generated_certificate_is_trusted_through_the_written_ca() {
        let dir = temp("gen");
        let ca = dir.join("ca.pem");
        let identity = Identity::generate(&["snag.test".into()], &ca).unwrap();
        assert_eq!(identity.chain.len(), 2);
        let server_config = server(identity, None).unwrap();
        assert_eq!(server_config.alpn_protocols, [H2.to_vec(), HTTP11.to_vec()]);
        let tls = UpstreamTls {
            ca: Some(ca),
            ..UpstreamTls::default()
        };
        let client_config = client(&tls, &[H2], None).unwrap();
        // A handshake in memory: the client verifies the chain against the CA file.
        for name in ["localhost", "snag.test", "127.0.0.1"] {
            let mut c = rustls::ClientConnection::new(
                client_config.clone(),
                server_name(Some(name), "x:1").unwrap(),
            )
            .unwrap();
            let mut s = rustls::ServerConnection::new(server_config.clone()).unwrap();
            handshake(&mut c, &mut s).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(c.alpn_protocol(), Some(H2));
        }
        let mut c = rustls::ClientConnection::new(
            client_config,
            server_name(Some("other.test"), "x:1").unwrap(),
        )
        .unwrap();
        let mut s = rustls::ServerConnection::new(server_config).unwrap();
        let err = handshake(&mut c, &mut s).unwrap_err();
        assert!(err.contains("NotValidForName"), "{err}");
    }

    fn handshake(
        c: &mut rustls::ClientConnection,
        s: &mut rustls::ServerConnection,
    ) -> Result<(), String> {
        for _ in 0..10 {
            let mut buf = Vec::new();
            c.write_tls(&mut buf).unwrap();
            s.read_tls(&mut buf.as_slice()).unwrap();
            s.process_new_packets()
                .map_err(|e| format!("server: {e:?}"))?;
            let mut buf = Vec::new();
            s.write_tls(&mut buf).unwrap();
            c.read_tls(&mut buf.as_slice()).unwrap();
            c.process_new_packets()
                .map_err(|e| format!("client: {e:?}"))?;
            if !c.is_handshaking() && !s.is_handshaking() {
                return Ok(());
            }
        }
        Err("no end to the handshake".into())
    }

    #[test]
    fn bad_files_say_which_file_and_why() {
        let dir = temp("bad");
        let missing = dir.join("missing.pem");
        let err = Identity::from_files(&missing, &missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.pem: cannot read"), "{err}");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "hello\n").unwrap();
        let err = Identity::from_files(&junk, &junk).unwrap_err().to_string();
        assert!(err.contains("junk.pem: no CERTIFICATE block"), "{err}");
        // A real certificate with another certificate's key.
        let (a, b) = (dir.join("a"), dir.join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let one = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let two = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        std::fs::write(a.join("cert.pem"), one.cert.pem()).unwrap();
        std::fs::write(b.join("key.pem"), two.signing_key.serialize_pem()).unwrap();
        let err = Identity::from_files(&a.join("cert.pem"), &junk)
            .unwrap_err()
            .to_string();
        assert!(err.contains("junk.pem: no PRIVATE KEY block"), "{err}");
        let identity = Identity::from_files(&a.join("cert.pem"), &b.join("key.pem")).unwrap();
        let err = server(identity, None).unwrap_err().to_string();
        assert_eq!(err, "the certificate does not match the private key");
        let err = Identity::generate(&["not a name".into()], &dir.join("ca.pem"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a DNS name"), "{err}");
    }

    #[test]
    fn the_server_name_is_the_sni_or_the_upstreams_host() {
        let name = |sni, hp| server_name(sni, hp).map(|n| n.to_str().into_owned());
        assert_eq!(name(None, "backend.test:443").unwrap(), "backend.test");
        assert_eq!(name(None, "127.0.0.1:8443").unwrap(), "127.0.0.1");
        assert_eq!(name(None, "[::1]:8443").unwrap(), "::1");
        assert_eq!(name(Some("api.test"), "127.0.0.1:1").unwrap(), "api.test");
        assert!(name(Some("bad name"), "x:1").is_err());
    }
}
