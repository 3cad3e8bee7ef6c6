//! Runtimes of one thread each, one per core, that HTTP-mode connections are handed
//! to in turn. On the shared work-stealing runtime a client connection, the pooled
//! upstream connection it borrows and the task that wakes on either often sat on
//! different threads; each such wake-up crossed cores, and at 256 connections the
//! slowest 1% of requests waited for it (p99 10–12 ms against HAProxy's 8 ms). Here
//! a connection, its upstream pool and their timers stay on one thread.

use std::{
    future::Future,
    io,
    sync::atomic::{AtomicUsize, Ordering},
};

use tokio::{net::TcpStream, runtime::Handle, sync::oneshot};
use tokio_util::task::TaskTracker;
use tracing::warn;

/// The worker threads of a run; they end when this is dropped (the tasks on them
/// with them).
#[derive(Debug)]
pub struct Workers {
    workers: Vec<Worker>,
    next: AtomicUsize,
}

#[derive(Debug)]
struct Worker {
    handle: Handle,
    /// Dropped with the worker: its thread's `block_on` returns, and the runtime
    /// with its tasks is dropped on that thread.
    _stop: oneshot::Sender<()>,
}

impl Workers {
    /// `threads` workers (at least one), each a thread with its own runtime; `Err`
    /// if the machine will not start one.
    pub fn start(threads: usize) -> io::Result<Workers> {
        let workers = (0..threads.max(1))
            .map(|i| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let handle = runtime.handle().clone();
                let (stop, stopped) = oneshot::channel::<()>();
                std::thread::Builder::new()
                    .name(format!("snag-http-{i}"))
                    .spawn(move || {
                        let _ = runtime.block_on(stopped);
                    })?;
                Ok(Worker {
                    handle,
                    _stop: stop,
                })
            })
            .collect::<io::Result<_>>()?;
        Ok(Workers {
            workers,
            next: AtomicUsize::new(0),
        })
    }

    /// As many workers as `SNAG_THREADS` says, or one per core.
    pub fn per_core() -> io::Result<Workers> {
        let threads = threads().map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
        Workers::start(
            threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        )
    }

    /// How many workers there are.
    pub(super) fn len(&self) -> usize {
        self.workers.len()
    }

    /// Tasks alive on the workers.
    pub fn alive_tasks(&self) -> usize {
        self.workers
            .iter()
            .map(|w| w.handle.metrics().num_alive_tasks())
            .sum()
    }

    /// The worker the next connection goes to.
    pub(super) fn next(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.workers.len()
    }

    /// Serves `stream` with `serve` on worker `i`, tracked by `tracker`. The stream
    /// moves to that worker's reactor; `serve` gets the error if it cannot be
    /// registered there (the connection is then closed).
    pub(super) fn hand_off<F, Fut>(
        &self,
        i: usize,
        stream: TcpStream,
        tracker: &TaskTracker,
        serve: F,
    ) where
        F: FnOnce(io::Result<TcpStream>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let stream = stream.into_std();
        self.workers[i]
            .handle
            .spawn(tracker.track_future(async move {
                let stream = stream.and_then(TcpStream::from_std).inspect_err(
                    |err| warn!(%err, "could not hand the connection to a worker; closing it"),
                );
                serve(stream).await
            }));
    }
}

/// The number of threads `SNAG_THREADS` asks for, if it is set to one: the
/// runtime's workers and the HTTP-mode workers both follow it.
/// `Err` says why when it is set to something else.
pub fn threads() -> Result<Option<usize>, String> {
    std::env::var_os("SNAG_THREADS")
        .map(|value| parse_threads(&value.to_string_lossy()))
        .transpose()
}

fn parse_threads(value: &str) -> Result<usize, String> {
    match value.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "SNAG_THREADS={value:?}: not a number of threads (a whole number from 1)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn a_thread_count_is_a_whole_number_from_one() {
        assert_eq!(parse_threads("4"), Ok(4));
        assert_eq!(parse_threads(" 1 "), Ok(1));
        for bad in ["0", "-1", "two", "", "1.5"] {
            let err = parse_threads(bad).unwrap_err();
            assert!(err.starts_with("SNAG_THREADS="), "{bad}: {err}");
            assert!(err.contains("from 1"), "{bad}: {err}");
        }
    }

    /// Connections go to the workers in turn, each served on its worker's thread,
    /// and the tracker sees them all end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn connections_are_served_on_the_workers_in_turn() {
        let workers = Workers::start(2).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tracker = TaskTracker::new();
        let mut clients = Vec::new();
        let mut names = Vec::new();
        for _ in 0..4 {
            clients.push(TcpStream::connect(addr).await.unwrap());
            let (stream, _) = listener.accept().await.unwrap();
            let (told, name) = oneshot::channel();
            workers.hand_off(workers.next(), stream, &tracker, move |stream| async move {
                let mut stream = stream.unwrap();
                let thread = std::thread::current().name().unwrap_or("").to_string();
                stream.write_all(thread.as_bytes()).await.unwrap();
                let _ = told.send(thread);
            });
            names.push(name.await.unwrap());
        }
        assert_eq!(
            names,
            ["snag-http-0", "snag-http-1", "snag-http-0", "snag-http-1"]
        );
        for (client, name) in clients.iter_mut().zip(&names) {
            let mut got = vec![0; name.len()];
            client.read_exact(&mut got).await.unwrap();
            assert_eq!(got, name.as_bytes());
        }
        settled(&workers, 0).await;
        // A connection being served counts as a worker's task until it ends.
        let mut held = TcpStream::connect(addr).await.unwrap();
        let (stream, _) = listener.accept().await.unwrap();
        workers.hand_off(workers.next(), stream, &tracker, |stream| async move {
            let mut stream = stream.unwrap();
            let _ = stream.read(&mut [0; 1]).await;
        });
        assert_eq!(workers.alive_tasks(), 1);
        held.shutdown().await.unwrap();
        tracker.close();
        tokio::time::timeout(Duration::from_secs(10), tracker.wait())
            .await
            .expect("the tracked tasks end");
        settled(&workers, 0).await;
    }

    /// Waits, up to 10 s, until `n` tasks are alive on `workers`.
    async fn settled(workers: &Workers, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while workers.alive_tasks() != n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} tasks alive on the workers, not {n}",
                workers.alive_tasks()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
