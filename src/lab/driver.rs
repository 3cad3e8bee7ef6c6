//! Real balancers under test: HAProxy and nginx from Debian packages. snag writes
//! their configuration from the same [`balancer::Config`] the built-in balancer takes,
//! starts them as child processes in the foreground, waits until they listen, watches
//! their view of each backend, drains through their own mechanisms, and stops them by
//! PID.
//!
//! What a product lacks is refused with [`Unsupported`], never approximated: nginx
//! open source has no active health checks and no slow start.

use std::{
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpStream, UnixStream},
    process::{Child, Command},
    time::Instant,
};

use super::balancer::{self, HashKey, select::Strategy};
use crate::shutdown::Shutdown;

/// A balancer product snag can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Product {
    /// snag's own reference balancer, in process.
    Builtin,
    /// HAProxy (`haproxy` on PATH).
    Haproxy,
    /// nginx open source (`nginx` on PATH).
    Nginx,
}

impl Product {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Product::Builtin => "builtin",
            Product::Haproxy => "haproxy",
            Product::Nginx => "nginx",
        }
    }
}

impl std::str::FromStr for Product {
    type Err = String;
    fn from_str(s: &str) -> Result<Product, String> {
        match s {
            "builtin" => Ok(Product::Builtin),
            "haproxy" => Ok(Product::Haproxy),
            "nginx" => Ok(Product::Nginx),
            _ => Err(format!(
                "unknown balancer {s:?}; one of builtin, haproxy, nginx"
            )),
        }
    }
}

impl fmt::Display for Product {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A configuration the product cannot express; the case reports it as not supported.
#[derive(Debug, thiserror::Error)]
#[error("{product} cannot run this case: {why}")]
pub struct Unsupported {
    /// Which product.
    pub product: Product,
    /// What it lacks.
    pub why: String,
}

/// A backend's state change as the product reported it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When snag saw it.
    pub at: Instant,
    /// The backend.
    pub id: String,
    /// Its status before, in the product's words (`UP`, `DOWN`, `DRAIN` …).
    pub from: String,
    /// After.
    pub to: String,
}

/// A running HAProxy or nginx.
#[derive(Debug)]
pub struct External {
    /// Which product.
    pub product: Product,
    /// Where clients connect.
    pub addr: SocketAddr,
    config: balancer::Config,
    dir: PathBuf,
    child: tokio::sync::Mutex<Child>,
    seen: Arc<Mutex<Vec<Seen>>>,
    logged: Mutex<Vec<(Instant, String)>>,
    drained: Mutex<Vec<String>>,
    stop: Shutdown,
}

impl External {
    /// Writes the product's configuration for `config` into `dir`, starts it on `at`
    /// (or a free loopback port), and waits (up to 10 s) until it accepts connections.
    pub async fn start(
        product: Product,
        config: &balancer::Config,
        dir: &Path,
        at: Option<SocketAddr>,
        shutdown: Shutdown,
    ) -> anyhow::Result<Arc<External>> {
        // The product binds the port itself: take one the OS hands out, then free it.
        let addr = match at {
            Some(addr) => addr,
            None => std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?,
        };
        std::fs::create_dir_all(dir)?;
        let (program, args) = match product {
            Product::Haproxy => {
                let text = haproxy_config(config, addr, dir)?;
                std::fs::write(dir.join("haproxy.cfg"), text)?;
                let cfg = dir.join("haproxy.cfg").display().to_string();
                ("haproxy", vec!["-db".to_string(), "-f".into(), cfg])
            }
            Product::Nginx => {
                let text = nginx_config(config, addr, dir, &[])?;
                std::fs::write(dir.join("nginx.conf"), text)?;
                let cfg = dir.join("nginx.conf").display().to_string();
                let prefix = dir.display().to_string();
                ("nginx", vec!["-c".to_string(), cfg, "-p".into(), prefix])
            }
            Product::Builtin => anyhow::bail!("the built-in balancer runs in process"),
        };
        let child = Command::new(program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr.log"))?)
            // Its own process group, so that a node failure can take nginx's workers
            // down with their master.
            .process_group(0)
            .spawn()
            .with_context(|| {
                format!("could not start {program} (scripts/install-deps.sh installs it)")
            })?;
        let external = Arc::new(External {
            product,
            addr,
            config: config.clone(),
            dir: dir.into(),
            child: tokio::sync::Mutex::new(child),
            seen: Arc::default(),
            logged: Mutex::default(),
            drained: Mutex::default(),
            stop: shutdown,
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).await.is_err() {
            if let Some(status) = external.child.lock().await.try_wait()? {
                let log = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
                anyhow::bail!("{program} exited ({status}) before listening:\n{log}");
            }
            if Instant::now() >= deadline {
                anyhow::bail!("{program} did not listen on {addr} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if product == Product::Haproxy {
            tokio::spawn(watch_haproxy(external.clone()));
        }
        Ok(external)
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &balancer::Config {
        &self.config
    }

    /// HAProxy's own log lines about its servers (`Server be/b is DOWN, reason: …`),
    /// stamped when snag read them.
    pub fn logged(&self) -> Vec<(Instant, String)> {
        self.logged
            .lock()
            .expect("no code panics holding the log")
            .clone()
    }

    /// The state changes seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .expect("no code panics holding the log")
            .clone()
    }

    /// Takes backend `id` out of rotation (`true`) or puts it back, the product's way:
    /// HAProxy's runtime API (`set server be/ID state drain`), nginx's `down` flag and
    /// a graceful reload (SIGHUP to its master, by PID).
    pub async fn set_draining(&self, id: &str, draining: bool) -> anyhow::Result<()> {
        match self.product {
            Product::Haproxy => {
                let state = if draining { "drain" } else { "ready" };
                let answer = self
                    .admin(&format!("set server be/{id} state {state}"))
                    .await?;
                anyhow::ensure!(
                    answer.trim().is_empty(),
                    "haproxy refused the drain: {answer}"
                );
            }
            _ => {
                let down = {
                    let mut drained = self.drained.lock().expect("no code panics holding it");
                    drained.retain(|d| d != id);
                    if draining {
                        drained.push(id.into());
                    }
                    drained.clone()
                };
                let text = nginx_config(&self.config, self.addr, &self.dir, &down)?;
                std::fs::write(self.dir.join("nginx.conf"), text)?;
                let pid = self.child.lock().await.id().context("nginx has exited")?;
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGHUP,
                )?;
            }
        }
        Ok(())
    }

    /// After a drain, takes backend `id` out entirely: HAProxy's `maint` state (no
    /// checks, no traffic). nginx's `down` already is that.
    pub async fn set_maintenance(&self, id: &str) -> anyhow::Result<()> {
        if self.product == Product::Haproxy {
            let answer = self
                .admin(&format!("set server be/{id} state maint"))
                .await?;
            anyhow::ensure!(answer.trim().is_empty(), "haproxy refused maint: {answer}");
        }
        Ok(())
    }

    /// One command on HAProxy's admin socket; its answer.
    async fn admin(&self, command: &str) -> anyhow::Result<String> {
        let mut socket = UnixStream::connect(self.dir.join("admin.sock")).await?;
        socket.write_all(format!("{command}\n").as_bytes()).await?;
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    /// Kills the product at once, as a node failure would: SIGKILL to its process
    /// group (the master and its workers, all started by snag).
    pub async fn kill_now(&self) {
        let mut child = self.child.lock().await;
        if let Some(pid) = child.id() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.wait().await;
    }

    /// The requests HAProxy retried or redispatched to another server (`wretr` +
    /// `wredis` of its backend); `None` for nginx, which does not count them.
    pub async fn retries(&self) -> Option<u64> {
        if self.product != Product::Haproxy {
            return None;
        }
        let csv = self.admin("show stat").await.ok()?;
        let line = csv.lines().find(|l| l.starts_with("be,BACKEND,"))?;
        let fields: Vec<&str> = line.split(',').collect();
        let number = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Some(number(15) + number(16))
    }

    /// Stops the product by its PID — SIGTERM, so that nginx's master takes its
    /// workers with it, then SIGKILL after 3 s — and waits for it.
    pub async fn stop(&self) {
        let mut child = self.child.lock().await;
        if let Some(pid) = child.id() {
            terminate(pid);
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

    /// Removes its configuration and logs (call after [`External::stop`]).
    pub fn clean(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for External {
    fn drop(&mut self) {
        // A case that failed before `stop`: the master must not leave workers behind.
        if let Some(pid) = self.child.get_mut().id() {
            terminate(pid);
        }
    }
}

/// SIGTERM to a process snag started.
fn terminate(pid: u32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
}

/// Polls HAProxy's `show stat` every 50 ms and records each server's status changes,
/// and reads the lines it writes about its servers on stderr.
async fn watch_haproxy(external: Arc<External>) {
    let mut last: std::collections::BTreeMap<String, String> = Default::default();
    let mut read = 0;
    let mut ticks = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = external.stop.wait() => return,
            _ = ticks.tick() => {}
        }
        if let Ok(log) = std::fs::read(external.dir.join("stderr.log"))
            && log.len() > read
        {
            // Whole lines only: a line being written is read on the next tick.
            let end = log[read..]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(read, |i| read + i + 1);
            let now = Instant::now();
            for line in String::from_utf8_lossy(&log[read..end]).lines() {
                if let Some(at) = line.find("Server be/") {
                    external
                        .logged
                        .lock()
                        .expect("no code panics holding the log")
                        .push((now, line[at..].to_string()));
                }
            }
            read = end;
        }
        let Ok(csv) = external.admin("show stat").await else {
            continue;
        };
        for line in csv.lines().filter(|l| l.starts_with("be,")) {
            let fields: Vec<&str> = line.split(',').collect();
            let (Some(name), Some(status)) = (fields.get(1), fields.get(17)) else {
                continue;
            };
            if *name == "BACKEND" {
                continue;
            }
            // "UP 1/3" is still up, going down: only the state word counts. A server
            // without checks reads "no check": it is serving.
            let status = match status.split(' ').next().unwrap_or_default() {
                "no" => "UP".to_string(),
                word => word.to_string(),
            };
            let before = last.insert(name.to_string(), status.clone());
            if let Some(before) = before
                && before != status
            {
                external
                    .seen
                    .lock()
                    .expect("no code panics holding the log")
                    .push(Seen {
                        at: Instant::now(),
                        id: name.to_string(),
                        from: before,
                        to: status,
                    });
            }
        }
    }
}

fn ms(d: Duration) -> u128 {
    d.as_millis().max(1)
}

/// HAProxy's configuration for `config`, listening on `addr`.
pub fn haproxy_config(
    config: &balancer::Config,
    addr: SocketAddr,
    dir: &Path,
) -> Result<String, Unsupported> {
    let unsupported = |why: &str| Unsupported {
        product: Product::Haproxy,
        why: why.into(),
    };
    let key = match &config.hash_key {
        HashKey::Header(name) => format!("hdr({name})"),
        HashKey::Cookie(name) => format!("req.cook({name})"),
        HashKey::Source => "src".into(),
    };
    let balance = match config.strategy {
        Strategy::Rr | Strategy::Wrr => "balance roundrobin".to_string(),
        Strategy::Least => "balance leastconn".into(),
        Strategy::IpHash => "balance source\n  hash-type map-based".into(),
        Strategy::Hash => format!("balance {key}\n  hash-type map-based"),
        Strategy::Consistent => format!("balance {key}\n  hash-type consistent"),
        Strategy::Random2 => "balance random(2)".into(),
    };
    if matches!(config.strategy, Strategy::Hash | Strategy::Consistent)
        && matches!(config.hash_key, HashKey::Cookie(_))
    {
        // `balance` takes hdr(), url_param, rdp-cookie …: not an arbitrary cookie.
        return Err(unsupported(
            "balance on an HTTP cookie's value (it hashes headers, URL parameters and RDP cookies)",
        ));
    }
    let mut out = format!(
        "global\n  maxconn 4000\n  stats socket {}/admin.sock mode 600 level admin\n\
         defaults\n  mode http\n  timeout connect 2s\n  timeout client 60s\n  timeout server {}ms\n  timeout check {}ms\n  retries {}\n  option redispatch\n\
         frontend fe\n  bind {addr}\n  default_backend be\n\
         backend be\n  {balance}\n  http-response set-header x-backend %s\n",
        dir.display(),
        ms(config.timeout),
        config.health.as_ref().map_or(2000, |h| ms(h.timeout)),
        config.retries
    );
    let mut check = String::new();
    if let Some(h) = &config.health {
        if !h.path.is_empty() {
            out += &format!("  option httpchk GET {}\n", h.path);
            match &h.expect_body {
                Some(text) => {
                    out += &format!("  http-check expect string {}\n", text.replace(' ', "\\ "))
                }
                None => out += "  http-check expect status 200\n",
            }
        }
        check = format!(
            " check inter {}ms rise {} fall {}",
            ms(h.interval),
            h.rise,
            h.fall
        );
    }
    if config.max_fails > 0 {
        check += &format!(
            "{} observe layer7 error-limit {} on-error mark-down",
            if config.health.is_none() {
                " check inter 1s"
            } else {
                ""
            },
            config.max_fails
        );
    }
    for b in &config.backends {
        let probe = match (b.check, &config.health) {
            (Some(c), Some(_)) if c != b.addr => format!(" addr {} port {}", c.ip(), c.port()),
            _ => String::new(),
        };
        let slow = if config.slow_start.is_zero() {
            String::new()
        } else {
            format!(" slowstart {}ms", ms(config.slow_start))
        };
        out += &format!(
            "  server {} {} weight {}{check}{probe}{slow}\n",
            b.id, b.addr, b.weight
        );
    }
    Ok(out)
}

/// nginx's configuration for `config`, listening on `addr`, with `down` backends
/// marked so.
pub fn nginx_config(
    config: &balancer::Config,
    addr: SocketAddr,
    dir: &Path,
    down: &[String],
) -> Result<String, Unsupported> {
    let unsupported = |why: &str| Unsupported {
        product: Product::Nginx,
        why: why.into(),
    };
    if config.health.is_some() {
        return Err(unsupported(
            "active health checks (nginx open source has passive ones only: max_fails, fail_timeout)",
        ));
    }
    if !config.slow_start.is_zero() {
        return Err(unsupported("slow start (an nginx Plus feature)"));
    }
    let key = match &config.hash_key {
        HashKey::Header(name) => format!("$http_{}", name.as_str().replace('-', "_")),
        HashKey::Cookie(name) => format!("$cookie_{name}"),
        HashKey::Source => "$remote_addr".into(),
    };
    let method = match config.strategy {
        Strategy::Rr | Strategy::Wrr => String::new(),
        Strategy::Least => "least_conn;".into(),
        Strategy::IpHash => "ip_hash;".into(),
        Strategy::Hash => format!("hash {key};"),
        Strategy::Consistent => format!("hash {key} consistent;"),
        Strategy::Random2 => "random two least_conn;".into(),
    };
    let mut servers = String::new();
    let mut names = String::new();
    for b in &config.backends {
        // max_fails=0 turns nginx's passive marking off, as snag's 0 does.
        servers += &format!(
            "    server {} weight={} max_fails={} fail_timeout={}s{};\n",
            b.addr,
            b.weight,
            config.max_fails,
            // nginx reads fail_timeout in whole seconds.
            config.fail_timeout.as_secs_f64().ceil().max(1.0),
            if down.contains(&b.id) { " down" } else { "" }
        );
        names += &format!("    {} {};\n", b.addr, b.id);
    }
    let d = dir.display();
    Ok(format!(
        "daemon off;\nmaster_process on;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 8192; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};\n\
         \x20 map $upstream_addr $backend_last {{\n    \"~(?<last>[^ ,]+)$\" $last;\n  }}\n\
         \x20 map $backend_last $backend_name {{\n    default $backend_last;\n{names}  }}\n\
         \x20 upstream be {{\n    {method}\n{servers}    keepalive 64;\n  }}\n\
         \x20 server {{\n    listen {addr};\n    location / {{\n      proxy_pass http://be;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_connect_timeout {}ms;\n      proxy_read_timeout {}ms;\n      proxy_next_upstream error timeout;\n      proxy_next_upstream_tries {};\n      add_header x-backend $backend_name always;\n    }}\n  }}\n}}\n",
        ms(config.timeout),
        ms(config.timeout),
        config.retries + 1
    ))
}
