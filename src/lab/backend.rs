//! Backends for tests and demos.

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use crate::shutdown::Shutdown;

/// Echoes every byte back on each accepted connection until `shutdown`; a client's
/// FIN is answered with FIN once everything before it was echoed.
pub async fn echo(listener: TcpListener, shutdown: Shutdown) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((mut stream, _)) = accepted else {
            continue;
        };
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut buf = vec![0; 16 * 1024];
            loop {
                let n = tokio::select! {
                    _ = shutdown.wait() => return,
                    n = stream.read(&mut buf) => match n {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    },
                };
                if stream.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            let _ = stream.shutdown().await;
        });
    }
}
