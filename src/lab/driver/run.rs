//! A product running from its driver file: started in the foreground in its own
//! process group, ready when it listens (and its ready URL answers), watched through
//! its declared view, drained, reloaded, killed and stopped by PID.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use http_body_util::{BodyExt, Full};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpStream, UnixStream},
    process::{Child, Command},
    time::Instant,
};

use super::{Context, Driver, Seen, file::Action, rule};
use crate::{lab::balancer, shutdown::Shutdown};

/// A running product.
#[derive(Debug)]
pub struct External {
    /// Its driver.
    pub driver: Arc<Driver>,
    /// Where clients connect.
    pub addr: SocketAddr,
    admin: SocketAddr,
    pub(super) config: balancer::Config,
    pub(super) dir: PathBuf,
    /// `None` for a product snag did not start (`snag watch`).
    child: tokio::sync::Mutex<Option<Child>>,
    /// Its standard output and error, or the log file `snag watch` was given.
    pub(super) log: PathBuf,
    /// Requests each backend had served, where the view counts them: (read at, by id).
    pub(super) counts: Mutex<Vec<(Instant, std::collections::BTreeMap<String, u64>)>>,
    /// Each backend's state in its view at the last reading, in snag's words.
    pub(super) states: Mutex<std::collections::BTreeMap<String, String>>,
    pub(super) seen: Arc<Mutex<Vec<Seen>>>,
    pub(super) logged: Mutex<Vec<(Instant, String)>>,
    /// What snag did to it and how long the product took: (done at, what).
    acted: Mutex<Vec<(Instant, String)>>,
    drained: Mutex<Vec<String>>,
    /// The configuration it was last given, as written.
    written: Mutex<String>,
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

    /// Takes backend `id` out of rotation (`true`) or puts it back, by the driver's
    /// `[drain]`.
    pub async fn set_draining(&self, id: &str, draining: bool) -> anyhow::Result<()> {
        let action = self
            .driver
            .drain()
            .with_context(|| format!("{} has no [drain]", self.driver.origin))?;
        {
            let mut drained = self.drained.lock().expect("no code panics holding it");
            drained.retain(|d| d != id);
            if draining {
                drained.push(id.into());
            }
        }
        let mut context = self.context();
        context.backend = context.backends.iter().find(|b| b.id == id).cloned();
        anyhow::ensure!(context.backend.is_some(), "no backend {id:?}");
        context.draining = draining;
        let t0 = Instant::now();
        self.perform("drain", action, &context).await?;
        self.acted.lock().expect("no code panics holding it").push((
            Instant::now(),
            format!(
                "{} {id}: done in {:.0} ms",
                if draining { "drain" } else { "undrain" },
                t0.elapsed().as_secs_f64() * 1000.0
            ),
        ));
        Ok(())
    }

    /// After a drain, takes backend `id` out entirely by the driver's `[maintenance]`
    /// (HAProxy's `maint`: no checks, no traffic); without one the drain already did.
    pub async fn set_maintenance(&self, id: &str) -> anyhow::Result<()> {
        let Some(action) = self.driver.maintenance() else {
            return Ok(());
        };
        let mut context = self.context();
        context.backend = context.backends.iter().find(|b| b.id == id).cloned();
        context.draining = true;
        self.perform("maintenance", action, &context)
            .await
            .map(drop)
    }

    /// Does `action` (the driver's table `table`) with `context`; its answer.
    pub(super) async fn perform(
        &self,
        table: &str,
        action: &Action,
        context: &Context,
    ) -> anyhow::Result<String> {
        let c = ctx(context);
        let d = &self.driver;
        let answer = if let (Some(socket), Some(send)) = (&action.socket, &action.send) {
            let path = d.string(socket, &c)?;
            let mut socket = UnixStream::connect(&path)
                .await
                .with_context(|| format!("[{table}]: could not connect to {path}"))?;
            socket
                .write_all(format!("{}\n", d.string(send, &c)?).as_bytes())
                .await?;
            let mut answer = String::new();
            socket.read_to_string(&mut answer).await?;
            answer
        } else if let Some(url) = &action.url {
            let url = d.string(url, &c)?;
            let body = match &action.body {
                Some(b) => d.string(b, &c)?,
                None => String::new(),
            };
            let method = action.method.as_deref().unwrap_or("GET");
            let (status, answer) = http(method, &url, &body)
                .await
                .with_context(|| format!("[{table}]: {method} {url}"))?;
            anyhow::ensure!(
                (200..300).contains(&status),
                "[{table}]: {method} {url} answered {status}: {answer}"
            );
            answer
        } else if let Some(command) = &action.command {
            let command = d.command(command, &c)?;
            let (program, args) = command.split_first().context("empty command")?;
            let out = Command::new(program)
                .args(args)
                .current_dir(&self.dir)
                .output()
                .await
                .with_context(|| format!("[{table}]: could not run {program}"))?;
            anyhow::ensure!(
                out.status.success(),
                "[{table}]: {program} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        } else if let Some(signal) = &action.signal {
            let signal = super::file::signal_by_name(signal).map_err(anyhow::Error::msg)?;
            let pid = self
                .child
                .lock()
                .await
                .as_ref()
                .and_then(Child::id)
                .context("the product has exited, or snag did not start it")?;
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)?;
            String::new()
        } else if action.watched {
            // The product reads the file it watches; `applied_url` tells when.
            String::new()
        } else {
            // `reload = true`: the configuration again, then the driver's [reload].
            let text = d.config_text(&c)?;
            write_atomically(&self.dir.join(d.config_file()), &text)?;
            *self.written.lock().expect("no code panics holding it") = text.clone();
            let reload = d.reload().context("no [reload]")?;
            let mut context = context.clone();
            context.config = text;
            Box::pin(self.perform("reload", reload, &context)).await?
        };
        if let Some(expect) = &action.expect {
            anyhow::ensure!(
                answer.trim() == expect.trim(),
                "[{table}]: {} answered {:?}, not {expect:?}",
                d.name,
                answer.trim()
            );
        }
        if let Some(url) = &action.applied_url {
            self.applied(url, action.applied_when.as_ref(), context)
                .await
                .with_context(|| format!("[{table}]"))?;
        }
        Ok(answer)
    }

    /// Waits (up to 10 s) for `url` to answer 200 with a body for which `when`
    /// renders `true`.
    async fn applied(
        &self,
        url: &toml::Spanned<String>,
        when: Option<&toml::Spanned<String>>,
        context: &Context,
    ) -> anyhow::Result<()> {
        let url = self.driver.string(url, &ctx(context))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let last = http("GET", &url, "").await;
            if let Ok((200, body)) = &last {
                let Some(when) = when else { return Ok(()) };
                let mut c = context.clone();
                c.answer = body.clone();
                // Jinja prints a true test as `True`.
                if self
                    .driver
                    .string(when, &ctx(&c))?
                    .trim()
                    .eq_ignore_ascii_case("true")
                {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "the product did not take the new configuration within 10 s: GET {url} gave {}",
                    match last {
                        Ok((status, body)) => format!("{status}, {body}"),
                        Err(e) => format!("{e:#}"),
                    }
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

    /// The requests the product retried on another server, by the driver's
    /// `[retries]`; `None` where it does not count them.
    pub async fn retries(&self) -> Option<u64> {
        let counter = self.driver.retries()?;
        let text = self
            .perform("retries", &counter.query(), &self.context())
            .await
            .ok()?;
        match (&counter.csv, &counter.prometheus) {
            (Some(csv), _) => Some(rule::csv_count(csv, &text)),
            (_, Some(prom)) => Some(rule::prom_count(prom, &text)),
            _ => None,
        }
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

fn ctx(context: &Context) -> serde_json::Value {
    serde_json::to_value(context).expect("a context serializes")
}

/// A signal to a process snag started.
fn signal(pid: u32, signal: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
}

/// Writes `path` by a rename, so that a product watching it never reads half a file.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
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

/// One HTTP/1.1 request to a product's API on loopback: its status and body.
pub async fn http(method: &str, url: &str, body: &str) -> anyhow::Result<(u16, String)> {
    let uri: hyper::Uri = url.parse().with_context(|| format!("{url:?} is no URL"))?;
    anyhow::ensure!(
        uri.scheme_str() == Some("http"),
        "{url}: only http:// reaches a product's API"
    );
    let authority = uri.authority().context("a URL needs a host")?.clone();
    let port = authority.port_u16().unwrap_or(80);
    let stream = tokio::time::timeout(
        Duration::from_secs(2),
        TcpStream::connect((authority.host().trim_matches(['[', ']']), port)),
    )
    .await
    .context("connect timed out")??;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let request = hyper::Request::builder()
        .method(method)
        .uri(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(hyper::header::HOST, authority.as_str())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(bytes::Bytes::from(body.to_string())))?;
    let response = tokio::time::timeout(Duration::from_secs(5), async {
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    })
    .await
    .context("no answer within 5 s")??;
    Ok(response)
}
