//! A product from its driver file: started in the foreground in its own process
//! group (or, for `snag watch`, attached to as it runs), ready when it listens (and
//! its ready URL answers), watched through its declared view, killed and stopped by
//! PID; [`super::act`] drains and reloads it.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use tokio::{
    net::TcpStream,
    process::{Child, Command},
    time::Instant,
};

use super::{Context, Driver, Seen, act::http};
use crate::{lab::balancer, shutdown::Shutdown};

/// A running product.
#[derive(Debug)]
pub struct External {
    /// Its driver.
    pub driver: Arc<Driver>,
    /// Where clients connect.
    pub addr: SocketAddr,
    pub(super) admin: SocketAddr,
    pub(super) config: balancer::Config,
    pub(super) dir: PathBuf,
    /// `None` for a product snag did not start (`snag watch`).
    pub(super) child: tokio::sync::Mutex<Option<Child>>,
    /// Its standard output and error, or the log file `snag watch` was given.
    pub(super) log: PathBuf,
    /// Requests each backend had served, where the view counts them: (read at, by id).
    pub(super) counts: Mutex<Vec<(Instant, std::collections::BTreeMap<String, u64>)>>,
    /// Each backend's state in its view at the last reading, in snag's words.
    pub(super) states: Mutex<std::collections::BTreeMap<String, String>>,
    /// Why the last reading of its view failed, if it did.
    pub(super) unread: Mutex<Option<String>>,
    pub(super) seen: Arc<Mutex<Vec<Seen>>>,
    pub(super) logged: Mutex<Vec<(Instant, String)>>,
    /// What snag did to it and how long the product took: (done at, what).
    pub(super) acted: Mutex<Vec<(Instant, String)>>,
    pub(super) drained: Mutex<Vec<String>>,
    /// The configuration it was last given, as written.
    pub(super) written: Mutex<String>,
    /// The first line its version command printed.
    pub version: Option<String>,
    pub(super) stop: Shutdown,
}

/// A real balancer a case started: what ran, as it ran.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProductRun {
    /// Its name.
    pub name: String,
    /// The driver file.
    pub driver: String,
    /// What its version command printed.
    pub version: Option<String>,
    /// The configuration it was last given, filled from the driver's template.
    pub config: String,
    /// The last lines of its standard error.
    pub log_tail: Vec<String>,
}

impl External {
    /// Fills the driver's configuration for `config` into `dir`, starts the product on
    /// `at` (or a free loopback port from `ports`, as is its admin port), and waits (up to 10 s) until it accepts
    /// connections and its ready URL, if any, answers 200.
    pub async fn start(
        driver: Arc<Driver>,
        config: &balancer::Config,
        dir: &Path,
        at: Option<SocketAddr>,
        ports: &crate::lab::listen::Ports,
        shutdown: Shutdown,
    ) -> anyhow::Result<Arc<External>> {
        let addr = match at {
            Some(addr) => addr,
            None => ports.free()?,
        };
        let admin = ports.free()?;
        std::fs::create_dir_all(dir)?;
        let version =
            match driver.version_command() {
                Some([program, args @ ..]) => Command::new(program)
                    .args(args)
                    .output()
                    .await
                    .ok()
                    .map(|o| {
                        let text = [o.stdout, o.stderr].concat();
                        let first = String::from_utf8_lossy(&text)
                            .lines()
                            .next()
                            .unwrap_or_default()
                            .to_string();
                        first.split_whitespace().collect::<Vec<_>>().join(" ")
                    }),
                _ => None,
            };
        let context = Context::new(config, addr, admin, dir, driver.config_file(), &[]);
        let text = driver.config_text(&ctx(&context))?;
        write_atomically(&dir.join(driver.config_file()), &text)?;
        let command = driver.command(driver.start_command(), &ctx(&context))?;
        let (program, args) = command.split_first().context("[start] command is empty")?;
        let output = std::fs::File::create(dir.join("output.log"))?;
        let child = Command::new(program)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            // One file for both: products differ in which one they log to.
            .stdout(output.try_clone()?)
            .stderr(output)
            // Its own process group, so that a node failure takes its workers down
            // with their master.
            .process_group(0)
            .spawn()
            .with_context(|| {
                format!(
                    "could not start {program} for {} (scripts/install-deps.sh installs the bundled products)",
                    driver.origin
                )
            })?;
        let mut external = External::new(
            driver.clone(),
            config.clone(),
            dir,
            dir.join("output.log"),
            shutdown,
        );
        (external.addr, external.admin) = (addr, admin);
        external.child = tokio::sync::Mutex::new(Some(child));
        external.written = Mutex::new(text);
        external.version = version;
        let external = Arc::new(external);
        let deadline = Instant::now() + Duration::from_secs(10);
        let ready_url = match driver.ready_url() {
            Some(u) => Some(driver.string(u, &ctx(&context))?),
            None => None,
        };
        loop {
            let listening = TcpStream::connect(addr).await.is_ok();
            let ready = listening
                && match &ready_url {
                    Some(url) => matches!(http("GET", url, "").await, Ok((200, _))),
                    None => true,
                };
            if ready {
                break;
            }
            if let Some(status) = external
                .child
                .lock()
                .await
                .as_mut()
                .map(Child::try_wait)
                .transpose()?
                .flatten()
            {
                anyhow::bail!(
                    "{program} exited ({status}) before it was ready:\n{}",
                    external.output_tail()
                );
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "{program} was not ready within 10 s (listening on {addr}: {listening}{}):\n{}",
                    ready_url.map_or(String::new(), |u| format!(", {u} answering 200")),
                    external.output_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if driver.view().is_some() || driver.log().is_some() {
            tokio::spawn(super::watch::watch(external.clone()));
        }
        Ok(external)
    }

    /// Its record, nothing seen yet: not started, no address, no configuration
    /// written; the caller fills those in.
    fn new(
        driver: Arc<Driver>,
        config: balancer::Config,
        dir: &Path,
        log: PathBuf,
        stop: Shutdown,
    ) -> External {
        let nowhere = SocketAddr::from(([127, 0, 0, 1], 0));
        External {
            driver,
            addr: nowhere,
            admin: nowhere,
            config,
            dir: dir.into(),
            child: tokio::sync::Mutex::new(None),
            log,
            counts: Mutex::default(),
            states: Mutex::default(),
            unread: Mutex::default(),
            seen: Arc::default(),
            logged: Mutex::default(),
            acted: Mutex::default(),
            drained: Mutex::default(),
            written: Mutex::default(),
            version: None,
            stop,
        }
    }

    /// A product running already, set up by hand: its view read by `driver`'s
    /// `[view]` and `[log]` rules, filled with `admin` and `dir`, its log read from
    /// `log`; `backends` name the view's keys (none: the keys are the names).
    pub fn attach(
        driver: Arc<Driver>,
        backends: Vec<balancer::BackendSpec>,
        admin: SocketAddr,
        dir: &Path,
        log: PathBuf,
        shutdown: Shutdown,
    ) -> Arc<External> {
        let config = balancer::Config::new(backends, 0);
        let mut external = External::new(driver, config, dir, log, shutdown);
        (external.addr, external.admin) = (admin, admin);
        let external = Arc::new(external);
        tokio::spawn(super::watch::watch(external.clone()));
        external
    }

    /// Each backend's state in its view at the last reading.
    pub fn states(&self) -> std::collections::BTreeMap<String, String> {
        self.states
            .lock()
            .expect("no code panics holding it")
            .clone()
    }

    /// Why its view could not be read the last time, if it could not.
    pub fn unread(&self) -> Option<String> {
        self.unread
            .lock()
            .expect("no code panics holding it")
            .clone()
    }

    /// Each backend's request count as the view read it, over time.
    pub fn counts(&self) -> Vec<(Instant, std::collections::BTreeMap<String, u64>)> {
        self.counts
            .lock()
            .expect("no code panics holding it")
            .clone()
    }

    /// The last 30 lines of its output.
    fn output_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        // The end says why; a chatty product's whole log would bury it.
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &balancer::Config {
        &self.config
    }

    /// The product's configuration as last written (the filled template).
    pub fn config_text(&self) -> String {
        self.written
            .lock()
            .expect("no code panics holding it")
            .clone()
    }

    /// The template's context now: the drained backends marked.
    pub(super) fn context(&self) -> Context {
        let drained = self.drained.lock().expect("no code panics holding it");
        Context::new(
            &self.config,
            self.addr,
            self.admin,
            &self.dir,
            self.driver.config_file(),
            &drained,
        )
    }

    /// The lines of its output the driver marks, stamped when snag read them.
    pub fn logged(&self) -> Vec<(Instant, String)> {
        self.logged
            .lock()
            .expect("no code panics holding the log")
            .clone()
    }

    /// What snag did to it (drains, maintenance), stamped when the product had done
    /// it, with how long that took.
    pub fn acted(&self) -> Vec<(Instant, String)> {
        self.acted
            .lock()
            .expect("no code panics holding it")
            .clone()
    }

    /// The state changes seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .expect("no code panics holding the log")
            .clone()
    }

    /// Kills the product at once, as a node failure would: SIGKILL to its process
    /// group (the master and its workers, all started by snag).
    pub async fn kill_now(&self) {
        let mut child = self.child.lock().await;
        let Some(child) = child.as_mut() else {
            return;
        };
        if let Some(pid) = child.id() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.wait().await;
    }

    /// Stops the product by its PID — the driver's stop signal, so that a master
    /// takes its workers with it, then SIGKILL after 3 s — and waits for it.
    pub async fn stop(&self) {
        let mut child = self.child.lock().await;
        let Some(child) = child.as_mut() else {
            return; // not snag's to stop
        };
        if let Some(pid) = child.id() {
            signal(pid, self.driver.stop_signal());
            if tokio::time::timeout(Duration::from_secs(3), child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = child.start_kill();
        let _ = child.wait().await;
    }

    /// What ran: the product, its driver and version, the configuration it was last
    /// given and the end of its log (call after [`External::stop`]).
    pub fn run_record(&self) -> ProductRun {
        ProductRun {
            name: self.driver.name.clone(),
            driver: self.driver.origin.clone(),
            version: self.version.clone(),
            config: self.config_text(),
            log_tail: self.output_tail().lines().map(str::to_owned).collect(),
        }
    }

    /// Removes its configuration and logs (call after [`External::stop`]).
    pub fn clean(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for External {
    fn drop(&mut self) {
        // A case that failed before `stop`: the master must not leave workers behind.
        if let Some(pid) = self.child.get_mut().as_ref().and_then(Child::id) {
            signal(pid, self.driver.stop_signal());
        }
    }
}

pub(super) fn ctx(context: &Context) -> serde_json::Value {
    serde_json::to_value(context).expect("a context serializes")
}

/// A signal to a process snag started.
fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
}

/// Writes `path` by a rename, so that a product watching it never reads half a file.
pub(super) fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // A hidden name with another extension: a product loading a whole directory
    // skips it.
    let name = path
        .file_name()
        .map_or("config".into(), |n| n.to_string_lossy());
    let temp = path.with_file_name(format!(".{name}.snag-tmp"));
    std::fs::write(&temp, text)?;
    std::fs::rename(&temp, path)
}
