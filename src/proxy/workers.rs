//! Runtimes of one thread each, one per core, that HTTP-mode connections are handed
//! to in turn. On the shared work-stealing runtime a client connection, the pooled
//! upstream connection it borrows and the task that wakes on either often sat on
//! different threads; each such wake-up crossed cores, and at 256 connections the
//! slowest 1% of requests waited for it (p99 10–12 ms against HAProxy's 8 ms). Here
//! a connection, its upstream pool and their timers stay on one thread.
//!
//! With one worker per core, each is pinned to its own core. A busy worker rarely
//! sleeps, and the kernel would at times put both of a 2-core machine's workers on
//! one core beside a load generator on the other: `perf sched` showed them taking
//! turns in 5–6 ms slices, each stalling its connections for the other's turn (p99
//! at 32 connections 3.0 ms against HAProxy's 1.4 ms). Pinned, a worker shares its
//! core only with what sleeps often and is preempted briefly.

use std::{
    future::Future,
    io,
    sync::atomic::{AtomicUsize, Ordering},
};

use nix::{
    sched::{CpuSet, sched_getaffinity, sched_setaffinity},
    unistd::Pid,
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
        Workers::pinned(threads, &[])
    }

    /// `threads` workers, worker `i` pinned to `cores[i]` where there is one: a core
    /// that will not take it leaves the worker where the kernel puts it.
    fn pinned(threads: usize, cores: &[usize]) -> io::Result<Workers> {
        let workers = (0..threads.max(1))
            .map(|i| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let handle = runtime.handle().clone();
                let (stop, stopped) = oneshot::channel::<()>();
                let core = cores.get(i).copied();
                std::thread::Builder::new()
                    .name(format!("snag-http-{i}"))
                    .spawn(move || {
                        if let Some(core) = core
                            && let Err(err) = pin(core)
                        {
                            warn!(core, %err, "could not pin an HTTP worker to its core");
                        }
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

    /// As many workers as `SNAG_THREADS` says, or one per core; pinned when there
    /// is one for each core the process may run on.
    pub fn per_core() -> io::Result<Workers> {
        let threads = threads()
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        Workers::pinned(threads, pinning(threads, &allowed_cores()))
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

/// The cores worker threads are pinned to: one each, in order, when there are as
/// many workers as `allowed` cores. Otherwise none: fewer workers pinned would stay
/// off cores the kernel could give them, and more would share cores for good; a
/// CPU quota smaller than the allowed cores (a container) gives fewer workers.
fn pinning(threads: usize, allowed: &[usize]) -> &[usize] {
    if threads == allowed.len() {
        allowed
    } else {
        &[]
    }
}

/// The cores this process may run on (its affinity mask), in order; empty if the
/// mask cannot be read.
fn allowed_cores() -> Vec<usize> {
    let Ok(set) = sched_getaffinity(Pid::from_raw(0)) else {
        return Vec::new();
    };
    (0..CpuSet::count())
        .filter(|&core| set.is_set(core).unwrap_or(false))
        .collect()
}

/// Pins the calling thread to `core`.
fn pin(core: usize) -> nix::Result<()> {
    let mut set = CpuSet::new();
    set.set(core)?;
    sched_setaffinity(Pid::from_raw(0), &set)
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

    #[test]
    fn workers_are_pinned_only_when_there_is_one_per_allowed_core() {
        assert_eq!(pinning(2, &[0, 1]), &[0, 1]);
        assert_eq!(pinning(2, &[3, 5]), &[3, 5]);
        assert!(pinning(1, &[0, 1]).is_empty());
        assert!(pinning(4, &[0, 1]).is_empty());
        assert!(pinning(1, &[]).is_empty());
    }

    /// Each pinned worker runs on its core alone, read back from the kernel; an
    /// unpinned one keeps the process's cores.
    #[tokio::test]
    async fn pinned_workers_run_on_their_own_core() {
        let allowed = allowed_cores();
        assert!(!allowed.is_empty(), "the affinity mask is readable");
        let affinity = |workers: &Workers, i: usize| {
            workers.workers[i].handle.spawn(async { allowed_cores() })
        };
        let workers = Workers::pinned(allowed.len(), pinning(allowed.len(), &allowed)).unwrap();
        for (i, &core) in allowed.iter().enumerate() {
            assert_eq!(affinity(&workers, i).await.unwrap(), [core], "worker {i}");
        }
        let workers = Workers::start(allowed.len()).unwrap();
        assert_eq!(affinity(&workers, 0).await.unwrap(), allowed);
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
