//! Draining a proxy: new connections refused or ignored, open ones finished as the
//! drain's mode says, and what is still open at its deadline reset.

use std::sync::{Arc, atomic::Ordering};

use tokio::sync::watch;
use tracing::info;

use super::Proxy;
use crate::fault::{
    Fault, Kind, Mode,
    drain::{Drain, DrainMode},
};

/// The name of the bandwidth fault a slow drain puts on a TCP proxy.
pub const SLOW_DRAIN: &str = "drain_slow";

impl Proxy {
    /// The drain under way, if any.
    pub fn draining(&self) -> Option<Drain> {
        if !self.drain_on.load(Ordering::Acquire) {
            return None;
        }
        self.drain.borrow().map(|(d, _)| d)
    }

    /// Starts draining: new connections are refused or ignored, open ones finish as
    /// `drain.mode` says. A deadline resets what is still open after the timeout.
    pub fn drain(self: &Arc<Self>, drain: Drain) {
        if let Some((grace, then)) = drain.readiness() {
            info!(proxy = %self.name, ?grace, "readiness drain: probes fail first");
            self.event("probes_failing", serde_json::json!({ "drain": drain }));
            self.unready.send_replace(Some(tokio::time::Instant::now()));
            let proxy = self.clone();
            let mut changed = self.unready.subscribe();
            changed.mark_unchanged();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(grace) => proxy.drain(then),
                    // Undrained (or drained again) first: this step no longer holds.
                    _ = changed.changed() => {}
                }
            });
            return;
        }
        info!(proxy = %self.name, mode = ?drain.mode, "drain started");
        self.event("drain_started", serde_json::json!({ "drain": drain }));
        self.drain
            .send_replace(Some((drain, tokio::time::Instant::now())));
        self.drain_on.store(true, Ordering::Release);
        if drain.mode == DrainMode::Abrupt {
            self.reset_all();
            return;
        }
        self.each_conn(|c| c.drain());
        if drain.mode == DrainMode::Slow && self.config.mode == Mode::Tcp {
            // TCP has no responses to pace one by one: the downstream bytes of every
            // open connection are, by a bandwidth fault everyone can see in the list.
            let pace = Fault::new(
                Some(SLOW_DRAIN.into()),
                Kind::Bandwidth(crate::fault::bandwidth::Bandwidth { rate: drain.rate }),
                None,
                None,
            );
            if let Ok(pace) = pace {
                let _ = self.remove_fault(SLOW_DRAIN);
                let _ = self.add_fault(pace);
            }
        }
        if let Some(grace) = drain.deadline() {
            let proxy = self.clone();
            let mut changed = self.drain.subscribe();
            changed.mark_unchanged();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(grace) => proxy.reset_all(),
                    // Ended or replaced first: this deadline no longer holds.
                    _ = changed.changed() => {}
                }
            });
        }
    }

    /// Ends the drain: the listener accepts again.
    pub fn undrain(&self) {
        self.unready.send_replace(None);
        let _ = self.remove_fault(SLOW_DRAIN);
        info!(proxy = %self.name, "drain ended");
        self.event("drain_ended", serde_json::json!({}));
        self.drain.send_replace(None);
        self.drain_on.store(false, Ordering::Release);
    }

    /// Whether a readiness drain has health probes failing (its first step).
    pub fn unready(&self) -> bool {
        self.unready.borrow().is_some()
    }

    /// Wakes when probes start or stop failing.
    pub(crate) fn unready_changes(&self) -> watch::Receiver<Option<tokio::time::Instant>> {
        self.unready.subscribe()
    }

    fn reset_all(&self) {
        let n = self.reset_open();
        self.event("drain_reset", serde_json::json!({ "connections": n }));
    }

    /// Resets every open connection not already being reset, counting each as a
    /// drain reset; how many. A proxy's two listeners may both call it.
    pub(super) fn reset_open(&self) -> u64 {
        let mut n = 0;
        self.each_conn(|c| {
            if c.reset() {
                self.counters.drain_reset();
                n += 1;
            }
        });
        n
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, sleep_until};

    use super::*;
    use crate::fault::drain::NewConns;
    use crate::{fault::config::ProxyConfig, proxy::RunContext};

    fn proxy() -> Arc<Proxy> {
        let config = ProxyConfig::new("p", "127.0.0.1:0".parse().unwrap(), "127.0.0.1:1");
        Proxy::new(config, RunContext::new(1)).unwrap()
    }

    fn deadline(ms: u64) -> Drain {
        Drain {
            mode: DrainMode::Deadline,
            timeout: ms,
            new: NewConns::Refuse,
            rate: 0,
            grace: 0,
        }
    }

    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_drain_resets_what_is_open_exactly_at_its_deadline() {
        let proxy = proxy();
        let (a, b) = (proxy.register(1), proxy.register(2));
        let t0 = Instant::now();
        proxy.drain(deadline(2000));
        settle().await;
        assert!(a.is_draining() && !a.is_reset());
        sleep_until(t0 + Duration::from_millis(1999)).await;
        settle().await;
        assert!(!a.is_reset() && !b.is_reset());
        sleep_until(t0 + Duration::from_millis(2000)).await;
        settle().await;
        assert!(a.is_reset() && b.is_reset());
        assert_eq!(proxy.counters().snapshot().drain_resets, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn ending_or_replacing_a_drain_cancels_its_deadline() {
        let proxy = proxy();
        let a = proxy.register(1);
        let t0 = Instant::now();
        proxy.drain(deadline(1000));
        sleep_until(t0 + Duration::from_millis(500)).await;
        proxy.undrain();
        sleep_until(t0 + Duration::from_millis(1500)).await;
        settle().await;
        assert!(!a.is_reset());

        // A second drain's deadline counts from when it began; the first no longer holds.
        let t1 = Instant::now();
        proxy.drain(deadline(1000));
        sleep_until(t1 + Duration::from_millis(200)).await;
        proxy.drain(deadline(3000));
        sleep_until(t1 + Duration::from_millis(1100)).await;
        settle().await;
        assert!(!a.is_reset(), "the replaced deadline fired");
        sleep_until(t1 + Duration::from_millis(3200)).await;
        settle().await;
        assert!(a.is_reset());
    }
}
