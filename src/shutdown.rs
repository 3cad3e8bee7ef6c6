//! The token every long-lived task takes: it says when to stop.

use tokio_util::sync::CancellationToken;

/// A cloneable "stop now" signal. Cheap to clone; every clone sees the trigger.
#[derive(Debug, Clone, Default)]
pub struct Shutdown(CancellationToken);

impl Shutdown {
    /// A token that only [`Shutdown::trigger`] fires.
    pub fn new() -> Shutdown {
        Shutdown(CancellationToken::new())
    }

    /// A token that never fires, for servers that live as long as a test.
    pub fn never() -> Shutdown {
        Shutdown::new()
    }

    /// A token fired by the first Ctrl-C or SIGTERM.
    pub fn on_signals() -> Shutdown {
        let token = Shutdown::new();
        let trigger = token.clone();
        tokio::spawn(async move {
            let term = async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(_) => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term => {}
            }
            tracing::info!("signal received, shutting down");
            trigger.trigger();
        });
        token
    }

    /// Fires the token for every clone.
    pub fn trigger(&self) {
        self.0.cancel();
    }

    /// Whether it has fired.
    pub fn is_triggered(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once the token fires. Cancel-safe.
    pub async fn wait(&self) {
        self.0.cancelled().await
    }

    /// A token that fires with this one, or on its own trigger without firing this one.
    pub fn child(&self) -> Shutdown {
        Shutdown(self.0.child_token())
    }
}
