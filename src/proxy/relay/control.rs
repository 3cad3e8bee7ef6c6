//! The per-connection signal a relay watches besides its sockets.

use std::{
    future::{Future, poll_fn},
    sync::atomic::{AtomicU8, AtomicU32, Ordering},
    task::Poll,
};

use atomic_waker::AtomicWaker;
use tokio::sync::Notify;

use super::End;
use crate::fault::Direction;

/// What a connection watches besides its sockets: one per connection, so waiting on
/// it never contends with other connections. Its owner (the proxy) wakes it when the
/// fault list changes or the proxy shuts down; one direction wakes it to stop the other.
#[derive(Debug, Default)]
pub struct Control {
    /// For waiters outside the relay (HTTP mode's).
    notify: Notify,
    state: AtomicU8,
    /// Counts the signals, so each direction of the relay waits on it with a waker
    /// of its own and no lock: a `Notified` takes the `Notify`'s lock on every poll,
    /// and the relay polls its signal once per read or write.
    signals: AtomicU32,
    /// The task of each direction, [`Direction::Upstream`] first.
    directions: [AtomicWaker; 2],
}

const ABORTED: u8 = 1;
const SHUTDOWN: u8 = 2;
const DRAIN: u8 = 4;
const RESET: u8 = 8;

impl Control {
    /// Wakes the connection to look at the fault list again.
    pub fn poke(&self) {
        self.signal();
    }

    /// Ends the connection with [`Ending::Shutdown`].
    pub fn shutdown(&self) {
        self.state.fetch_or(SHUTDOWN, Ordering::Release);
        self.signal();
    }

    /// Asks the connection to finish gracefully (HTTP: `Connection: close`, GOAWAY).
    pub fn drain(&self) {
        self.state.fetch_or(DRAIN, Ordering::Release);
        self.signal();
    }

    /// Ends the connection with an RST on both legs, now; whether it was not already
    /// being reset.
    pub fn reset(&self) -> bool {
        let before = self.state.fetch_or(RESET, Ordering::Release);
        self.signal();
        before & RESET == 0
    }

    /// Whether a drain asked this connection to finish.
    pub fn is_draining(&self) -> bool {
        self.state.load(Ordering::Acquire) & DRAIN != 0
    }

    /// Whether the connection is to be reset.
    pub fn is_reset(&self) -> bool {
        self.state.load(Ordering::Acquire) & RESET != 0
    }

    /// Whether the proxy shut this connection down.
    pub fn is_shut_down(&self) -> bool {
        self.state.load(Ordering::Acquire) & SHUTDOWN != 0
    }

    /// Resolves on the next poke or shutdown after it was first polled (or enabled).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    pub(super) fn abort(&self) {
        self.state.fetch_or(ABORTED, Ordering::Release);
        self.signal();
    }

    fn signal(&self) {
        self.signals.fetch_add(1, Ordering::AcqRel);
        for direction in &self.directions {
            direction.wake();
        }
        self.notify.notify_waiters();
    }

    /// Where the signals are: read it before looking at the state, then wait with
    /// [`Control::signalled`], and a signal between the two is not lost.
    pub(super) fn seen(&self) -> u32 {
        self.signals.load(Ordering::Acquire)
    }

    /// Resolves once the connection was signalled after `seen` was read; only
    /// `direction`'s flow waits on it, from one task at a time.
    pub(super) fn signalled(&self, direction: Direction, seen: u32) -> impl Future<Output = ()> {
        let waker = &self.directions[match direction {
            Direction::Upstream => 0,
            Direction::Downstream => 1,
        }];
        poll_fn(move |cx| {
            if self.seen() == seen {
                waker.register(cx.waker());
                // Signalled while registering: its wake may have found no waker.
                if self.seen() == seen {
                    return Poll::Pending;
                }
            }
            Poll::Ready(())
        })
    }

    /// Why the connection must stop, if it must: a cheap atomic load.
    pub(super) fn stopped(&self) -> Option<End> {
        let state = self.state.load(Ordering::Acquire);
        if state & RESET != 0 {
            Some(End::Drained)
        } else if state & SHUTDOWN != 0 {
            Some(End::Shutdown)
        } else if state & ABORTED != 0 {
            Some(End::Aborted)
        } else {
            None
        }
    }
}
