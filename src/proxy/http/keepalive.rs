//! One HTTP/1.1 connection's keep-alive as `keepalive_close` sees it: how many
//! requests it carried, how many are in flight, and a close armed for when it has
//! been idle long enough.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{sync::Notify, time::Instant};

/// Shared by a connection's exchanges and its serving loop.
#[derive(Debug, Default)]
pub(super) struct Keepalive {
    requests: AtomicU64,
    in_flight: AtomicU64,
    /// From when, and for how long, an idle connection may stay open.
    armed: Mutex<Option<(Instant, Duration)>>,
    changed: Notify,
}

/// A request in flight; dropping it ends it.
pub(super) struct InFlight<'a>(&'a Keepalive);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // The serving loop waits on `changed`: wake it only when this makes an
        // armed connection idle, not once per request (each wake re-polls the
        // whole connection).
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 && self.0.armed().is_some() {
            self.0.changed.notify_one();
        }
    }
}

impl Keepalive {
    /// A request arrived: any armed close is off. Returns its number on the
    /// connection (from 1) and the guard that ends it.
    pub(super) fn start(&self) -> (u64, InFlight<'_>) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let disarmed = self.lock().take().is_some();
        if disarmed {
            self.changed.notify_one();
        }
        (
            self.requests.fetch_add(1, Ordering::Relaxed) + 1,
            InFlight(self),
        )
    }

    /// Close the connection if no request arrives within `idle` from now.
    pub(super) fn arm(&self, idle: Duration) {
        *self.lock() = Some((Instant::now(), idle));
        self.changed.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, Duration)>> {
        self.armed
            .lock()
            .expect("no code panics holding the keep-alive")
    }

    fn armed(&self) -> Option<(Instant, Duration)> {
        *self.lock()
    }

    /// Resolves once the connection has been idle as long as an armed close allows;
    /// after `idle`, the wait it ended.
    pub(super) async fn expired(&self) -> Duration {
        loop {
            let woken = self.changed.notified();
            let armed = self.armed();
            match armed {
                Some((since, idle)) if self.in_flight.load(Ordering::SeqCst) == 0 => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(since + idle) => {
                            if self.armed() == armed && self.in_flight.load(Ordering::SeqCst) == 0 {
                                return idle;
                            }
                        }
                        _ = woken => {}
                    }
                }
                _ => woken.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_armed_close_waits_for_idle_and_a_new_request_disarms_it() {
        let k = Keepalive::default();
        let t0 = Instant::now();
        let (n, guard) = k.start();
        assert_eq!(n, 1);
        k.arm(Duration::from_millis(300));
        // In flight: not idle yet. The request ends 100 ms later.
        tokio::select! {
            _ = k.expired() => panic!("expired with a request in flight"),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        drop(guard);
        // Idle 300 ms from the arm: expires at 300 ms after t0.
        assert_eq!(k.expired().await, Duration::from_millis(300));
        assert_eq!(t0.elapsed(), Duration::from_millis(300));

        // A request within the idle time disarms it.
        let (n, guard) = k.start();
        assert_eq!(n, 2);
        k.arm(Duration::from_millis(200));
        drop(guard);
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (_, guard) = k.start();
        drop(guard);
        tokio::select! {
            _ = k.expired() => panic!("expired after a new request disarmed it"),
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }

    #[test]
    fn requests_wake_the_serving_loop_only_when_a_close_is_armed() {
        let k = Keepalive::default();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let woken = |k: &Keepalive, cx: &mut std::task::Context<'_>| {
            let mut notified = std::pin::pin!(k.changed.notified());
            notified.as_mut().enable();
            notified.poll(cx).is_ready()
        };
        // Unarmed: a request's start and end wake nothing.
        drop(k.start());
        assert!(!woken(&k, &mut cx));
        // Armed: its end, which leaves the connection idle, does.
        let (_, guard) = k.start();
        k.arm(Duration::from_secs(1));
        assert!(woken(&k, &mut cx));
        drop(guard);
        assert!(woken(&k, &mut cx));
        // And the next request, which disarms it.
        let (_, _guard) = k.start();
        assert!(woken(&k, &mut cx));
    }
}
