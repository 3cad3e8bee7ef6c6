//! Acting on a running product through its driver's declared actions: a line on a
//! Unix socket, an HTTP request, a command, a signal, or a rewritten watched file —
//! drains, maintenance, reloads and the counters it keeps.

use std::time::Duration;

use anyhow::Context as _;
use http_body_util::{BodyExt, Full};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpStream, UnixStream},
    process::{Child, Command},
    time::Instant,
};

use super::{
    Context, External,
    file::Action,
    rule,
    run::{ctx, write_atomically},
};

impl External {
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
