//! The token every long-lived task takes: it says when to stop.

use tokio_util::sync::CancellationToken;

/// A cloneable stop signal in two steps. Cheap to clone; every clone sees the trigger.
/// The first step, [`Shutdown::trigger`], stops accepting: what is open may finish
/// within its grace period. The second, [`Shutdown::now`], resets what is still open.
/// [`Shutdown::close`] is both at once with plain closes, as a proxy the API disables.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    stop: CancellationToken,
    now: CancellationToken,
    close: CancellationToken,
}

impl Shutdown {
    /// A token that only [`Shutdown::trigger`] fires.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// A token that never fires, for servers that live as long as a test.
    pub fn never() -> Shutdown {
        Shutdown::new()
    }

    /// A token whose first step the first SIGINT or SIGTERM fires and whose second
    /// step the second fires. A third exits the process at once (status 130), for
    /// whatever would not end.
    pub fn on_signals() -> Shutdown {
        use tokio::signal::unix::{SignalKind, signal};
        let token = Shutdown::new();
        let trigger = token.clone();
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            tracing::warn!("could not watch for SIGINT and SIGTERM");
            return token;
        };
        tokio::spawn(async move {
            for step in 1.. {
                tokio::select! {
                    _ = int.recv() => {}
                    _ = term.recv() => {}
                }
                match step {
                    1 => {
                        tracing::warn!(
                            "signal received: no new connections, open ones may finish (a second signal ends them now)"
                        );
                        trigger.trigger();
                    }
                    2 => {
                        tracing::warn!("second signal: ending every connection now");
                        trigger.now();
                    }
                    _ => std::process::exit(130),
                }
            }
        });
        token
    }

    /// The first step, for every clone: stop accepting.
    pub fn trigger(&self) {
        self.stop.cancel();
    }

    /// Both steps, for every clone: stop accepting and end what is open.
    pub fn now(&self) {
        self.stop.cancel();
        self.now.cancel();
    }

    /// Whether the first step has fired.
    pub fn is_triggered(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Stops accepting and closes what is open at once, with no grace period.
    pub fn close(&self) {
        self.close.cancel();
        self.stop.cancel();
    }

    /// Whether [`Shutdown::close`] fired.
    pub fn is_closed(&self) -> bool {
        self.close.is_cancelled()
    }

    /// Resolves once the first step fires. Cancel-safe.
    pub async fn wait(&self) {
        self.stop.cancelled().await
    }

    /// Resolves once the second step fires. Cancel-safe.
    pub async fn wait_now(&self) {
        self.now.cancelled().await
    }

    /// A token that fires with this one, or on its own trigger without firing this one.
    pub fn child(&self) -> Shutdown {
        Shutdown {
            stop: self.stop.child_token(),
            now: self.now.child_token(),
            close: self.close.child_token(),
        }
    }
}
