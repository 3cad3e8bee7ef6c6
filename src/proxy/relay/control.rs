//! The per-connection signal a relay watches besides its sockets.

use std::{
    future::{Future, poll_fn},
    sync::atomic::{AtomicU8, AtomicU32, Ordering},
    task::Poll,
};

use atomic_waker::AtomicWaker;

use super::End;

/// What a connection watches besides its sockets: one per connection, so waiting on
/// it never contends with other connections. Its owner (the proxy) signals it when
/// the fault list changes or the proxy shuts down; one direction signals it to stop
/// the other. It counts its signals, and each waiter reads the count before looking
/// at the state, then waits until it moves, with a waker of its own and no lock (a
/// tokio `Notify` takes its lock on every poll, and the relay polls its signal once
/// per read or write). Kept small: every connection, idle or not, holds one.
#[derive(Debug, Default)]
pub struct Control {
    state: AtomicU8,
    signals: AtomicU32,
    relay: AtomicWaker,
    http: AtomicWaker,
}

/// Who waits on a connection's signals; each waits from one task at a time.
#[derive(Debug, Clone, Copy)]
pub enum Waiter {
    /// The relay's two directions: [`super::run`] joins them in one task, so they
    /// share its waker.
    Relay,
    /// HTTP mode's watch beside hyper.
    Http,
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

    pub(super) fn abort(&self) {
        self.state.fetch_or(ABORTED, Ordering::Release);
        self.signal();
    }

    fn signal(&self) {
        self.signals.fetch_add(1, Ordering::AcqRel);
        self.relay.wake();
        self.http.wake();
    }

    /// Where the signals are: read it before looking at the state, then wait with
    /// [`Control::signalled`], and a signal between the two is not lost.
    pub fn seen(&self) -> u32 {
        self.signals.load(Ordering::Acquire)
    }

    /// Resolves once the connection was signalled after `seen` was read.
    pub fn signalled(&self, waiter: Waiter, seen: u32) -> impl Future<Output = ()> + '_ {
        let waker = match waiter {
            Waiter::Relay => &self.relay,
            Waiter::Http => &self.http,
        };
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
