//! A scenario's proxies started together, each playing its timeline: what
//! `snag proxy`, `snag serve` with a fault file, the demo and the cases run.

use std::sync::Arc;

use anyhow::Context;
use tokio::time::Instant;

use super::{Proxy, RunContext};
use crate::{
    fault::file::{Action, Change, Scenario},
    shutdown::Shutdown,
};

/// A proxy started by [`start`].
pub struct Running {
    /// Its shared state, for changing faults.
    pub proxy: Arc<Proxy>,
    /// The address it actually listens on.
    pub addr: std::net::SocketAddr,
    /// The address of its probe listener, if it has one.
    pub probe_addr: Option<std::net::SocketAddr>,
    /// Ends after `shutdown`, once its connections are closed.
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// Binds and serves every proxy of `scenario` in run `context`, and plays each one's
/// timeline from now.
pub fn start(
    scenario: &Scenario,
    context: &RunContext,
    shutdown: &Shutdown,
) -> anyhow::Result<Vec<Running>> {
    let mut running = Vec::new();
    let t0 = Instant::now();
    for spec in &scenario.proxies {
        let mut config = spec.config.clone();
        let name = &spec.config.name;
        let listener = super::socket::bind(config.listen)
            .with_context(|| format!("proxy `{name}`: could not bind {}", config.listen))?;
        let addr = listener.local_addr()?;
        let probes = match config.probe_listen {
            Some(at) => Some(super::socket::bind(at).with_context(|| {
                format!("proxy `{name}`: could not bind the probe listener {at}")
            })?),
            None => None,
        };
        let probe_addr = probes.as_ref().map(|l| l.local_addr()).transpose()?;
        // The addresses it is bound to, where port 0 let the OS choose.
        config.listen = addr;
        config.probe_listen = probe_addr;
        let proxy = Proxy::new(config, context.clone())
            .map_err(|e| crate::UsageError(format!("proxy `{name}`: {e}")))?;
        let task = tokio::spawn(super::serve_all(
            listener,
            probes,
            proxy.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(play(
            proxy.clone(),
            spec.timeline.clone(),
            t0,
            shutdown.clone(),
        ));
        running.push(Running {
            proxy,
            addr,
            probe_addr,
            task,
        });
    }
    Ok(running)
}

/// Applies `timeline` to `proxy` at its offsets from `t0`, until done or `shutdown`.
pub async fn play(proxy: Arc<Proxy>, timeline: Vec<Change>, t0: Instant, shutdown: Shutdown) {
    for change in timeline {
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = tokio::time::sleep_until(t0 + change.at) => {}
        }
        let done = match change.action {
            Action::Add(fault) => proxy.add_fault(fault),
            Action::Remove(name) => proxy.remove_fault(&name).map(drop),
            Action::Drain(drain) => {
                proxy.drain(drain);
                Ok(())
            }
            Action::Undrain => {
                proxy.undrain();
                Ok(())
            }
        };
        if let Err(err) = done {
            tracing::warn!(proxy = %proxy.name, %err, "timeline change not applied");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, sleep_until};

    use super::*;
    use crate::fault::{drain::DrainMode, file};

    /// Lets every task that is ready at this instant run.
    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    fn names(proxy: &Proxy) -> Vec<String> {
        proxy.faults().into_iter().map(|f| f.name).collect()
    }

    /// A proxy `p` to a port nobody serves, not listening, and `timeline` (TOML
    /// `[[proxy.timeline]]` tables) parsed as a fault file would have it.
    fn proxy_with(timeline: &str) -> (Arc<Proxy>, Vec<Change>) {
        let text = format!(
            "[[proxy]]\nname = \"p\"\nlisten = \"127.0.0.1:0\"\nupstream = \"127.0.0.1:1\"\n{timeline}"
        );
        let mut scenario = file::parse("t.toml", &text).unwrap();
        let spec = scenario.proxies.remove(0);
        let proxy = Proxy::new(spec.config, RunContext::new(1)).unwrap();
        (proxy, spec.timeline)
    }

    #[tokio::test(start_paused = true)]
    async fn the_timeline_applies_each_step_at_its_offset_and_not_before() {
        let (proxy, timeline) = proxy_with(
            r#"
            [[proxy.timeline]]
            at = "2s"
            add = { name = "cut", type = "reset_peer" }
            [[proxy.timeline]]
            at = "6s"
            remove = "cut"
            [[proxy.timeline]]
            at = "8s"
            drain = { mode = "graceful" }
            [[proxy.timeline]]
            at = "12s"
            undrain = true
            "#,
        );
        let t0 = Instant::now();
        tokio::spawn(play(proxy.clone(), timeline, t0, Shutdown::never()));
        let at = |ms: u64| t0 + Duration::from_millis(ms);

        sleep_until(at(1999)).await;
        settle().await;
        assert!(names(&proxy).is_empty());
        sleep_until(at(2000)).await;
        settle().await;
        assert_eq!(names(&proxy), ["cut"]);
        sleep_until(at(5999)).await;
        settle().await;
        assert_eq!(names(&proxy), ["cut"]);
        sleep_until(at(6000)).await;
        settle().await;
        assert!(names(&proxy).is_empty());
        sleep_until(at(8000)).await;
        settle().await;
        assert_eq!(proxy.draining().map(|d| d.mode), Some(DrainMode::Graceful));
        sleep_until(at(12_000)).await;
        settle().await;
        assert_eq!(proxy.draining(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_timeline_stops_on_shutdown_with_steps_left() {
        let (proxy, timeline) = proxy_with(
            r#"
            [[proxy.timeline]]
            at = "5s"
            add = { type = "down" }
            "#,
        );
        let stop = Shutdown::never().child();
        let t0 = Instant::now();
        let playing = tokio::spawn(play(proxy.clone(), timeline, t0, stop.clone()));
        sleep_until(t0 + Duration::from_secs(1)).await;
        stop.trigger();
        playing.await.unwrap();
        assert_eq!(Instant::now(), t0 + Duration::from_secs(1));
        assert!(names(&proxy).is_empty());
    }
}
