//! The per-connection signal a relay watches besides its sockets.

use std::sync::atomic::{AtomicU8, Ordering};

use tokio::sync::Notify;

use super::End;

/// What a connection watches besides its sockets: one per connection, so waiting on
/// it never contends with other connections. Its owner (the proxy) wakes it when the
/// fault list changes or the proxy shuts down; one direction wakes it to stop the other.
#[derive(Debug, Default)]
pub struct Control {
    pub(super) notify: Notify,
    state: AtomicU8,
}

const ABORTED: u8 = 1;
const SHUTDOWN: u8 = 2;
const DRAIN: u8 = 4;
const RESET: u8 = 8;

impl Control {
    /// Wakes the connection to look at the fault list again.
    pub fn poke(&self) {
        self.notify.notify_waiters();
    }

    /// Ends the connection with [`Ending::Shutdown`].
    pub fn shutdown(&self) {
        self.state.fetch_or(SHUTDOWN, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Asks the connection to finish gracefully (HTTP: `Connection: close`, GOAWAY).
    pub fn drain(&self) {
        self.state.fetch_or(DRAIN, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Ends the connection with an RST on both legs, now; whether it was not already
    /// being reset.
    pub fn reset(&self) -> bool {
        let before = self.state.fetch_or(RESET, Ordering::Release);
        self.notify.notify_waiters();
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
        self.notify.notify_waiters();
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
