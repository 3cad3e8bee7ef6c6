//! The `snag serve` under test: started as our child, sampled from /proc and its
//! API, stopped by its PID.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::PROXIES;

/// One second of the target process, as sampled.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Sample {
    /// Seconds since the load began.
    pub t: f64,
    /// Connections snag has open (its stats).
    pub connections: u64,
    /// Resident memory, MiB.
    pub rss_mib: f64,
    /// Open descriptors.
    pub fds: u64,
    /// OS threads.
    pub threads: u64,
    /// Tasks alive in its runtime.
    pub tasks: u64,
    /// Rounds that came back right in this second, all proxies.
    pub ok_per_s: u64,
}

/// The `snag serve` under test: our child, ended by its PID.
pub(super) struct Target {
    child: tokio::process::Child,
    pub(super) pid: u32,
    pub(super) api: Api,
    pub(super) stderr: PathBuf,
}

/// A client of the target's control API, shared by the sampler, the fault churn
/// and the drains.
#[derive(Clone)]
pub(super) struct Api {
    addr: SocketAddr,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
}

impl Api {
    /// One call; the status and the body, within 10 s.
    pub(super) async fn call(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> anyhow::Result<(u16, String)> {
        let request = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))?;
        let call = async {
            let response = self.client.request(request).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
        };
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .with_context(|| format!("{method} {path}: no answer within 10 s"))?
    }

    /// A call that must succeed; what went wrong, in a line, if it did not.
    pub(super) async fn expect_2xx(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> Result<(), String> {
        match self.call(method, path, body).await {
            Ok((status, _)) if (200..300).contains(&status) => Ok(()),
            Ok((status, reply)) => Err(format!("{method} {path}: {status} {}", reply.trim())),
            Err(err) => Err(format!("{err:#}")),
        }
    }
}

impl Target {
    pub(super) async fn start(dir: &Path, seed: u64) -> anyhow::Result<Target> {
        let stderr = dir.join("snag.stderr.log");
        let exe = std::env::current_exe().context("where is this snag")?;
        let mut child = tokio::process::Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--runtime-metrics"])
            .args(["--seed", &seed.to_string(), "--shutdown-timeout", "3s"])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&stderr).context("the log file")?)
            .kill_on_drop(true)
            // Its own process group: a Ctrl-C at the terminal stops the soak, and the
            // soak stops snag serve, rather than both at once.
            .process_group(0)
            .spawn()
            .context("could not start snag serve")?;
        let pid = child.id().context("snag serve exited at once")?;
        let mut lines = BufReader::new(child.stdout.take().context("its stdout")?).lines();
        let api = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix("control API on http://") {
                    let addr = rest.split_whitespace().next().unwrap_or_default();
                    return addr.parse::<SocketAddr>().context("its address");
                }
            }
            bail!("snag serve ended before it listened")
        })
        .await
        .context("snag serve did not listen within 20 s")??;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        Ok(Target {
            child,
            pid,
            api: Api { addr: api, client },
            stderr,
        })
    }

    /// Its memory, descriptors, threads (from /proc), tasks and open connections
    /// (from its API).
    pub(super) async fn sample(&self) -> anyhow::Result<Sample> {
        let proc = PathBuf::from(format!("/proc/{}", self.pid));
        let status = std::fs::read_to_string(proc.join("status")).context("snag is gone")?;
        let rss_kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let count = |dir: &str| std::fs::read_dir(proc.join(dir)).map_or(0, |d| d.count() as u64);
        // At once: on a busy machine each call can take a second, and a sample is
        // due every second.
        let paths = PROXIES.map(|(name, _, _)| format!("/proxies/{name}/stats"));
        let stats = |i: usize| self.api.call("GET", &paths[i], "");
        let (metrics, a, b, c, d) = tokio::join!(
            self.api.call("GET", "/metrics", ""),
            stats(0),
            stats(1),
            stats(2),
            stats(3)
        );
        let stats = [a, b, c, d];
        let tasks = metrics?
            .1
            .lines()
            .find_map(|l| l.strip_prefix("snag_tasks "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        let mut connections = 0;
        for answer in stats {
            let stats: serde_json::Value = serde_json::from_str(&answer?.1)?;
            connections += stats["active_connections"].as_u64().unwrap_or(0);
        }
        Ok(Sample {
            connections,
            rss_mib: rss_kib / 1024.0,
            fds: count("fd"),
            threads: count("task"),
            tasks,
            ..Sample::default()
        })
    }

    pub(super) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then its exit status within `secs`.
    pub(super) async fn stop(&mut self, secs: u64) -> anyhow::Result<std::process::ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        tokio::time::timeout(Duration::from_secs(secs), self.child.wait())
            .await
            .with_context(|| format!("snag serve did not exit within {secs} s of SIGTERM"))?
            .context("waiting for snag serve")
    }
}

/// Raises this process's descriptor limit to its hard limit (children inherit it);
/// the soft limit it had, and the hard limit it got.
pub(super) fn raise_nofile() -> anyhow::Result<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok((soft, hard))
}

/// snag's idle connections to the HTTP backend: its pool keeps them for 90 s,
/// and they are not a leak.
pub(super) fn pooled_upstreams(http_backend: SocketAddr) -> u64 {
    crate::ports::sockets()
        .map(|sockets| {
            sockets
                .iter()
                .filter(|s| s.state == "ESTABLISHED" && s.remote == http_backend)
                .count() as u64
        })
        .unwrap_or(0)
}
