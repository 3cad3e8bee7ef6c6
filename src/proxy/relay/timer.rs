//! When a staged chunk or reset leaves. tokio's timer wheel rounds every deadline up
//! to its next millisecond tick, which shaped every fault: `latency=1` added 1–2 ms,
//! `slicer` pieces left in pairs a millisecond apart. Where bytes meet a real socket
//! a direction waits on one precise timer thread instead: a futex wait with no timer
//! slack, and a wake-up of the waiting task, a little ahead to make up for how
//! late woken tasks run ([`next_lead`]). Between in-memory pipes, which the tests
//! drive under paused time, it waits on the runtime's timer, whose clock they control.

use std::{
    collections::BTreeMap,
    future::Future,
    pin::Pin,
    sync::{
        Condvar, Mutex, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

use tokio::time::Instant;

/// Which clock a direction's due times are kept by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// The precise timer thread.
    Precise,
    /// The runtime's timer wheel (paused time in tests).
    Runtime,
}

impl Timer {
    /// Waits until `due`.
    pub(super) async fn until(self, due: Instant) {
        match self {
            Timer::Precise => {
                Deadline {
                    due: due.into_std(),
                    key: None,
                    early: false,
                }
                .await
            }
            // Boxed: only the tests' pipes take it, and a `Sleep` is large to keep
            // in every faulted direction's future.
            Timer::Runtime => Box::pin(tokio::time::sleep_until(centred(due))).await,
        }
    }
}

/// The wheel rounds a deadline up to its next 1 ms tick, so aiming half a tick early
/// centres the error on zero: a chunk leaves within ±0.5 ms of its due time.
fn centred(due: Instant) -> Instant {
    due.checked_sub(Duration::from_micros(500)).unwrap_or(due)
}

/// The waiting tasks, by the time to wake them (and a number that tells equal
/// times apart).
struct Wheel {
    waiting: Mutex<BTreeMap<(std::time::Instant, u64), Waker>>,
    /// Signalled when a new earliest deadline arrives.
    sooner: Condvar,
    next_key: AtomicU64,
    /// How long before its due time a task is woken, in ns: see [`next_lead`].
    lead: AtomicU64,
}

fn wheel() -> &'static Wheel {
    static WHEEL: OnceLock<&'static Wheel> = OnceLock::new();
    WHEEL.get_or_init(|| {
        let wheel: &'static Wheel = Box::leak(Box::new(Wheel {
            waiting: Mutex::new(BTreeMap::new()),
            sooner: Condvar::new(),
            next_key: AtomicU64::new(0),
            lead: AtomicU64::new(0),
        }));
        std::thread::Builder::new()
            .name("snag-timer".into())
            .spawn(move || wheel.run())
            .expect("the timer thread starts");
        wheel
    })
}

impl Wheel {
    fn run(&self) {
        // The kernel makes a sleeping thread up to its timer slack late (50 µs by
        // default) to batch wake-ups; this thread exists to be on time.
        let _ = nix::sys::prctl::set_timerslack(1);
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = std::time::Instant::now();
            let due: Vec<Waker> = {
                let later = waiting.split_off(&(now, u64::MAX));
                std::mem::replace(&mut *waiting, later)
                    .into_values()
                    .collect()
            };
            if !due.is_empty() {
                drop(waiting);
                due.into_iter().for_each(Waker::wake);
                waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            waiting = match waiting.first_key_value() {
                Some(((at, _), _)) => {
                    let left = at.saturating_duration_since(now);
                    self.sooner
                        .wait_timeout(waiting, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.sooner.wait(waiting).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

/// Deadlines nearer than this are waited for by spinning.
const NEAR: Duration = Duration::from_micros(10);

/// The most a task is woken ahead of its due time.
const MAX_LEAD: Duration = Duration::from_micros(100);

/// How long before its due time to wake a task, given the lead so far and how long
/// after its wake time a task just ran (ns). A woken task runs tens of µs late on
/// a VM whose idle vCPUs halt: the timer thread's own wake-up, then the worker's
/// (`latency=1` added 1.07–1.10 ms where a 1 ms sleep costs 1.03). Woken that much
/// early, it waits out the rest in the runtime's queue and leaves on time. The lead
/// follows a low quantile of those delays, falling fast and rising slowly, so that
/// little of it is left to wait; it never passes [`MAX_LEAD`].
fn next_lead(lead: u64, ran_after: u64) -> u64 {
    let next = if ran_after < lead {
        lead - (lead - ran_after) / 4
    } else {
        lead + (ran_after - lead) / 16
    };
    next.min(MAX_LEAD.as_nanos() as u64)
}

/// Ready at `due`, never before; registered with the timer thread while pending,
/// removed when dropped early (a read or a fault change won the race).
struct Deadline {
    due: std::time::Instant,
    /// When the timer thread wakes this task, and its number there.
    key: Option<(std::time::Instant, u64)>,
    /// The timer thread woke it; the rest of the lead is left to wait.
    early: bool,
}

impl Future for Deadline {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let now = std::time::Instant::now();
        if let Some((at, _)) = self.key
            && now >= at
        {
            // Woken: how late this task ran sets the next lead.
            let lead = &wheel().lead;
            let ran_after = (now - at).as_nanos() as u64;
            lead.store(
                next_lead(lead.load(Ordering::Relaxed), ran_after),
                Ordering::Relaxed,
            );
            self.unregister();
            self.early = true;
        }
        if now >= self.due {
            self.unregister();
            return Poll::Ready(());
        }
        if self.early {
            // Woken ahead on purpose: the rest of the lead passes in the runtime's
            // queue, behind whatever else is ready on this worker.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if self.due - now < NEAR {
            // Sooner than the timer thread and this worker could each be woken, and
            // cheaper to spin for than the two context switches: a `bandwidth` far
            // above the link makes every chunk due a microsecond ahead, and those
            // round trips cost it a third of its bulk throughput (yielding to the
            // runtime instead cost an epoll_wait each and half the gain).
            while std::time::Instant::now() < self.due {
                std::hint::spin_loop();
            }
            self.unregister();
            return Poll::Ready(());
        }
        let wheel = wheel();
        let due = self.due;
        let key = *self.key.get_or_insert_with(|| {
            let lead = Duration::from_nanos(wheel.lead.load(Ordering::Relaxed));
            let at = due.checked_sub(lead).map_or(now, |at| at.max(now));
            (at, wheel.next_key.fetch_add(1, Ordering::Relaxed))
        });
        let mut waiting = wheel.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let first = waiting.first_key_value().is_none_or(|(k, _)| key < *k);
        waiting.insert(key, cx.waker().clone());
        drop(waiting);
        if first {
            wheel.sooner.notify_one();
        }
        Poll::Pending
    }
}

impl Deadline {
    fn unregister(&mut self) {
        if let Some(key) = self.key.take() {
            let wheel = wheel();
            let mut waiting = wheel.waiting.lock().unwrap_or_else(|e| e.into_inner());
            waiting.remove(&key);
        }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        self.unregister();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lower bounds only, on a real clock: never early, whatever the machine's load.
    #[tokio::test]
    async fn a_precise_deadline_is_never_early() {
        for micros in [0, 50, 200, 1_000, 3_000] {
            let start = Instant::now();
            Timer::Precise
                .until(start + Duration::from_micros(micros))
                .await;
            assert!(
                start.elapsed() >= Duration::from_micros(micros),
                "{micros} µs"
            );
        }
    }

    #[tokio::test]
    async fn a_near_deadline_is_never_early_and_never_reaches_the_timer_thread() {
        for micros in [1, 5, 9] {
            let start = Instant::now();
            let mut deadline = Deadline {
                due: start.into_std() + Duration::from_micros(micros),
                key: None,
                early: false,
            };
            std::future::poll_fn(|cx| {
                let polled = Pin::new(&mut deadline).poll(cx);
                assert!(deadline.key.is_none(), "{micros} µs: registered");
                polled
            })
            .await;
            assert!(
                start.elapsed() >= Duration::from_micros(micros),
                "{micros} µs"
            );
        }
    }

    #[test]
    fn the_lead_follows_a_low_quantile_of_wake_delays_and_is_capped() {
        let us = |n: u64| n * 1_000;
        // Woken tasks that run 60–80 µs late: the lead settles in the low end of
        // that, so that little is left to wait after the wake.
        let mut lead = 0;
        for i in 0..2_000 {
            lead = next_lead(lead, us(60 + (i * 7) % 21));
        }
        assert!((us(58)..=us(66)).contains(&lead), "{lead} ns");
        // Faster wakes pull it down within a few.
        for _ in 0..10 {
            lead = next_lead(lead, us(5));
        }
        assert!(lead < us(10), "{lead} ns");
        // A busy worker runs tasks milliseconds late: the lead stops at the cap.
        for _ in 0..1_000 {
            lead = next_lead(lead, us(5_000));
        }
        assert_eq!(lead, MAX_LEAD.as_nanos() as u64);
    }

    /// Woken ahead by the largest lead, the task still waits out its due time.
    #[tokio::test]
    async fn a_deadline_woken_ahead_is_never_early() {
        let start = Instant::now();
        for micros in [20, 150, 400, 1_000] {
            wheel()
                .lead
                .store(MAX_LEAD.as_nanos() as u64, Ordering::Relaxed);
            let due = Instant::now() + Duration::from_micros(micros);
            Timer::Precise.until(due).await;
            assert!(Instant::now() >= due, "{micros} µs");
        }
        assert!(start.elapsed() >= Duration::from_micros(1_570));
    }

    #[tokio::test]
    async fn many_deadlines_wake_each_task() {
        let start = Instant::now();
        let tasks: Vec<_> = (0..200u64)
            .map(|i| {
                tokio::spawn(async move {
                    let due = start + Duration::from_micros(100 + (i * 37) % 2_000);
                    Timer::Precise.until(due).await;
                    assert!(Instant::now() >= due);
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_dropped_deadline_leaves_the_timer_thread() {
        let far = Instant::now() + Duration::from_secs(3600);
        let pending = tokio::time::timeout(Duration::from_millis(5), Timer::Precise.until(far));
        assert!(pending.await.is_err());
        let waiting = wheel().waiting.lock().unwrap();
        assert!(
            !waiting.keys().any(|(at, _)| *at == far.into_std()),
            "the dropped deadline is still registered"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_runtime_timer_follows_paused_time() {
        let start = Instant::now();
        Timer::Runtime.until(start + Duration::from_secs(30)).await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(29_499) && waited <= Duration::from_secs(30),
            "{waited:?}"
        );
    }
}
