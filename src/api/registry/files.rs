//! Files named through the API (a proxy's own capture and event log): confined to
//! the files directory, opened when the proxy is made, closed when it goes.

use std::{
    path::{Component, Path, PathBuf},
    sync::Arc,
};

use super::{CaptureInput, ProxyInput, Registry};
use crate::{
    api::Error,
    fault::config::ProxyConfig,
    proxy::RunContext,
    tls::{ListenTls, UpstreamTls},
};

/// A proxy's own capture and event log, as named (inside the files directory).
#[derive(Default)]
pub(super) struct OwnFiles {
    pub(super) capture: Option<(String, Arc<crate::capture::Capture>)>,
    pub(super) events: Option<(String, Arc<crate::events::EventLog>)>,
    /// Created with `"capture": false` beside the server's capture: it starts
    /// switched off, and can be switched on.
    pub(super) capture_off: bool,
}

impl OwnFiles {
    /// Writes out what is queued and closes both; call once the proxy has stopped.
    pub(super) fn close(&mut self, proxy: &str) {
        if let Some((name, capture)) = self.capture.take()
            && let Err(err) = capture.close()
        {
            tracing::warn!(proxy, file = name, %err, "could not finish the capture");
        }
        if let Some((name, log)) = self.events.take()
            && let Err(err) = log.close()
        {
            tracing::warn!(proxy, file = name, %err, "could not finish the event log");
        }
    }
}

impl Registry {
    /// The run context of a new proxy: the server's, with the capture and event
    /// log `input` asks for of its own.
    pub(super) fn own_files(&self, input: &ProxyInput) -> Result<(RunContext, OwnFiles), Error> {
        let mut context = self.context.clone();
        let mut files = OwnFiles::default();
        match &input.capture {
            Some(CaptureInput::Shared(false)) => files.capture_off = true,
            Some(CaptureInput::Shared(true)) if context.capture.is_none() => {
                return Err(Error::Invalid(
                    "capture: true, but this server captures nothing (snag serve --capture FILE); name a file of the proxy's own instead".into(),
                ));
            }
            Some(CaptureInput::File(name)) => {
                let path = self.confined(name)?;
                let settings = crate::capture::Settings {
                    path,
                    max_bytes: None,
                    snaplen: 0,
                };
                let capture = crate::capture::Capture::create(settings)
                    .map_err(|e| Error::Invalid(format!("capture file `{name}`: {e}")))?;
                let capture = Arc::new(capture);
                context.capture = Some(capture.clone());
                files.capture = Some((name.clone(), capture));
            }
            _ => {}
        }
        if let Some(name) = &input.events {
            let path = self.confined(name)?;
            let log = crate::events::EventLog::create(&path)
                .map_err(|e| Error::Invalid(format!("events file `{name}`: {e}")))?;
            context.events = Some(log.clone());
            files.events = Some((name.clone(), log));
        }
        Ok((context, files))
    }

    /// The TLS and upstream protocol `input` asks for, its files named inside the
    /// files directory, set on `config`.
    pub(super) fn legs(&self, input: &ProxyInput, config: &mut ProxyConfig) -> Result<(), Error> {
        if let Some(protocol) = input.upstream_protocol {
            config.upstream_protocol = protocol;
        }
        if let Some(tls) = &input.tls {
            config.tls = Some(match (&tls.cert, &tls.key, &tls.generate) {
                (Some(cert), Some(key), None) => ListenTls::Files {
                    cert: self.confined(cert)?,
                    key: self.confined(key)?,
                },
                (None, None, Some(ca_out)) => ListenTls::Generated {
                    ca_out: self.confined(ca_out)?,
                    names: tls.names.clone(),
                },
                _ => {
                    return Err(Error::Invalid(
                        "tls: give `cert` and `key`, or `generate` (the file the run's CA is written to), not both".into(),
                    ));
                }
            });
        }
        if let Some(up) = &input.upstream_tls {
            config.upstream_tls = Some(UpstreamTls {
                sni: up.sni.clone(),
                ca: up.ca.as_deref().map(|n| self.confined(n)).transpose()?,
                insecure: up.insecure,
            });
        }
        config.check_legs().map_err(Error::Invalid)
    }

    /// `name` inside the files directory, if it stays there: a relative path without
    /// `..`, whose directory is inside the files directory once symlinks are
    /// resolved, and which is not itself a symlink.
    /// The file `name` in the files directory, whole; one too large to answer in
    /// one body is refused with where to find it.
    pub fn file(&self, name: &str) -> Result<Vec<u8>, Error> {
        const LIMIT: u64 = 256 << 20;
        let path = self.confined(name)?;
        let meta = std::fs::metadata(&path).map_err(|_| Error::FileNotFound)?;
        if !meta.is_file() {
            return Err(Error::FileNotFound);
        }
        if meta.len() > LIMIT {
            return Err(Error::Invalid(format!(
                "file `{name}`: {} bytes, more than the API sends ({LIMIT}); copy it from {}",
                meta.len(),
                path.display()
            )));
        }
        std::fs::read(&path).map_err(|e| Error::Invalid(format!("file `{name}`: {e}")))
    }

    fn confined(&self, name: &str) -> Result<PathBuf, Error> {
        let dir = self.files.as_ref().ok_or_else(|| {
            Error::Invalid(format!(
                "file `{name}`: this server takes no file names (start it with --files-dir DIR)"
            ))
        })?;
        let refuse = |why: &str| {
            Error::Invalid(format!(
                "file `{name}`: {why}; give a name inside {}",
                dir.display()
            ))
        };
        let relative = Path::new(name);
        if name.is_empty()
            || !relative
                .components()
                .all(|c| matches!(c, Component::Normal(_)))
        {
            return Err(refuse(
                "not a plain relative name (no `..`, no leading `/`)",
            ));
        }
        let path = dir.join(relative);
        let root = dir
            .canonicalize()
            .map_err(|e| Error::Invalid(format!("files directory {}: {e}", dir.display())))?;
        let parent = path
            .parent()
            .and_then(|p| p.canonicalize().ok())
            .ok_or_else(|| refuse("its directory does not exist"))?;
        if !parent.starts_with(&root) {
            return Err(refuse("it leaves the files directory through a symlink"));
        }
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(refuse("it is a symlink"));
        }
        Ok(path)
    }
}
