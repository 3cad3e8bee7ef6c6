//! A future polled only when something it waits on woke it, not on every wake of
//! the task it shares: a connection's serving loop is woken by its socket for
//! every request, while the waits beside it (drain, keep-alive, GOAWAY) fire
//! once in a connection's life, and polling each `Notified` takes its lock.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, Wake, Waker},
};

use atomic_waker::AtomicWaker;

/// Polls `F` on its first poll and then only after `F`'s own waker was woken.
pub(super) struct Gated<F> {
    inner: F,
    signal: Arc<Signal>,
    /// `signal` as the waker `inner` registers wherever it waits.
    waker: Waker,
}

struct Signal {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.task.wake();
    }
}

impl<F: Future + Unpin> Gated<F> {
    pub(super) fn new(inner: F) -> Gated<F> {
        let signal = Arc::new(Signal {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(signal.clone());
        Gated {
            inner,
            signal,
            waker,
        }
    }
}

impl<F: Future + Unpin> Future for Gated<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Registered before the flag is read: a wake in between is not lost.
        self.signal.task.register(cx.waker());
        if !self.signal.woken.swap(false, Ordering::SeqCst) {
            return Poll::Pending;
        }
        let this = &mut *self;
        Pin::new(&mut this.inner).poll(&mut Context::from_waker(&this.waker))
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::atomic::AtomicUsize, time::Duration};

    use super::*;

    /// Counts its polls; ready once `notify` fired.
    async fn counted(polls: &AtomicUsize, notify: &tokio::sync::Notify) -> &'static str {
        let mut woken = std::pin::pin!(notify.notified());
        std::future::poll_fn(|cx| {
            polls.fetch_add(1, Ordering::SeqCst);
            woken.as_mut().poll(cx)
        })
        .await;
        "notified"
    }

    #[tokio::test(start_paused = true)]
    async fn the_inner_future_is_polled_only_when_its_own_wait_woke() {
        let (polls, notify) = (AtomicUsize::new(0), tokio::sync::Notify::new());
        let side = std::pin::pin!(counted(&polls, &notify));
        let mut gated = Gated::new(side);
        let ticks = AtomicUsize::new(0);
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        // The task wakes 50 times for the ticks; the gated future sees none of it.
        let ended = loop {
            tokio::select! {
                done = &mut gated => break done,
                _ = tick.tick() => {
                    if ticks.fetch_add(1, Ordering::SeqCst) == 50 {
                        notify.notify_one();
                    }
                }
            }
        };
        assert_eq!(ended, "notified");
        assert_eq!(ticks.load(Ordering::SeqCst), 51);
        // Its first poll, and the one after the notification.
        assert_eq!(polls.load(Ordering::SeqCst), 2);
    }
}
