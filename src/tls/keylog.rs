//! The session keys of every TLS connection in the NSS key log format
//! (SSLKEYLOGFILE), to a file and to whoever else wants them (the capture).

use std::{
    fmt,
    io::Write as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use rustls::KeyLog;

use super::{Error, file_error};

/// The session secrets of every TLS connection, appended to one file in the NSS key
/// log format (as SSLKEYLOGFILE): Wireshark's `tls.keylog_file` decrypts both legs.
pub struct KeyLogFile {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl fmt::Debug for KeyLogFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyLogFile")
            .field("path", &self.path)
            .finish()
    }
}

impl KeyLogFile {
    /// Opens `path` for appending (made if missing).
    pub fn open(path: &Path) -> Result<Arc<KeyLogFile>, Error> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| file_error(path, format!("cannot open the key log: {e}")))?;
        Ok(Arc::new(KeyLogFile {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        }))
    }

    /// Where it writes.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl KeyLogFile {
    /// Appends one line; one write per line, so lines of concurrent handshakes never
    /// interleave.
    fn write_line(&self, line: &str) {
        if let Ok(mut file) = self.file.lock()
            && let Err(err) = file.write_all(line.as_bytes())
        {
            tracing::warn!(path = %self.path.display(), %err, "could not write a TLS key");
        }
    }
}

/// Somewhere besides the file that takes key log lines (with their newline).
type KeySink = Box<dyn Fn(&str) + Send + Sync>;

/// Where a run's TLS session keys go: the key log file, and any other sink (the
/// capture, as decryption secrets).
#[derive(Default)]
pub struct KeyLogs {
    file: Option<Arc<KeyLogFile>>,
    sinks: Vec<KeySink>,
}

impl fmt::Debug for KeyLogs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyLogs")
            .field("file", &self.file)
            .field("sinks", &self.sinks.len())
            .finish()
    }
}

impl KeyLogs {
    /// Keys to `file`, if any.
    pub fn new(file: Option<Arc<KeyLogFile>>) -> KeyLogs {
        KeyLogs {
            file,
            sinks: Vec::new(),
        }
    }

    /// Keys also to `sink`, a line (with its newline) at a time.
    pub fn also(mut self, sink: impl Fn(&str) + Send + Sync + 'static) -> KeyLogs {
        self.sinks.push(Box::new(sink));
        self
    }

    /// As rustls takes it; `None` if the keys go nowhere.
    pub fn into_key_log(self) -> Option<Arc<dyn KeyLog>> {
        (self.file.is_some() || !self.sinks.is_empty()).then(|| Arc::new(self) as Arc<dyn KeyLog>)
    }
}

impl KeyLog for KeyLogs {
    /// One line of the NSS key log format.
    fn log(&self, label: &str, client_random: &[u8], secret: &[u8]) {
        let mut line =
            String::with_capacity(label.len() + 2 * (client_random.len() + secret.len()) + 3);
        line.push_str(label);
        line.push(' ');
        hex(&mut line, client_random);
        line.push(' ');
        hex(&mut line, secret);
        line.push('\n');
        if let Some(file) = &self.file {
            file.write_line(&line);
        }
        for sink in &self.sinks {
            sink(&line);
        }
    }
}

fn hex(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::tests::temp;

    #[test]
    fn the_key_log_is_nss_format_one_line_per_secret_to_the_file_and_each_sink() {
        let dir = temp("keylog");
        let path = dir.join("keys.log");
        let _ = std::fs::remove_file(&path);
        let lines = Arc::new(Mutex::new(String::new()));
        let sink = lines.clone();
        let log = KeyLogs::new(Some(KeyLogFile::open(&path).unwrap()))
            .also(move |line| sink.lock().unwrap().push_str(line))
            .into_key_log()
            .unwrap();
        log.log("CLIENT_TRAFFIC_SECRET_0", &[0x01, 0xab], &[0xff, 0x00]);
        log.log("SERVER_TRAFFIC_SECRET_0", &[0x01, 0xab], &[0x10]);
        let want = "CLIENT_TRAFFIC_SECRET_0 01ab ff00\nSERVER_TRAFFIC_SECRET_0 01ab 10\n";
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
        assert_eq!(*lines.lock().unwrap(), want);
        assert!(
            KeyLogs::new(None).into_key_log().is_none(),
            "keys to nowhere"
        );
    }
}
