//! `snag demo`: the README's main job until `snag case` exists. An echo backend, a
//! proxy playing a fault file's timeline, and a prober opening a fresh connection
//! every `--every` that sends 1 KiB and expects it back. Every figure it prints is
//! what the prober saw on its own sockets.

use std::{io, net::SocketAddr, time::Duration};

use anyhow::Context;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::mpsc,
    time::{Instant, timeout},
};

use crate::{
    cli::DemoArgs,
    fault::file::{self, Action},
    lab::backend,
    proxy::{RunContext, socket},
    shutdown::Shutdown,
};

const PAYLOAD: usize = 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const READ_TIMEOUT: Duration = Duration::from_millis(1000);

/// What one probe saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Ok(Duration),
    Refused,
    ConnectTimeout,
    Reset,
    Silent,
    Short,
}

/// Runs the demo; returns once the timeline has played and the last probe is back.
pub async fn run(args: DemoArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let mut scenario = file::load(&args.file)?;
    let seed = args
        .seed
        .or(scenario.seed)
        .unwrap_or_else(crate::seed::fresh);
    scenario.proxies.truncate(1);
    let spec = scenario
        .proxies
        .first_mut()
        .with_context(|| format!("{}: no [[proxy]] to play", args.file.display()))?;

    let stop = shutdown.child();
    let echo = socket::bind("127.0.0.1:0".parse().expect("a valid address"))?;
    spec.config.upstream = echo.local_addr()?.to_string();
    tokio::spawn(backend::echo(echo, stop.clone()));

    let mut bounds: Vec<Duration> = spec.timeline.iter().map(|c| c.at).collect();
    bounds.insert(0, Duration::ZERO);
    bounds.dedup();
    let end = *bounds.last().expect("bounds has at least one entry") + Duration::from_secs(2);
    bounds.push(end);
    let labels = phase_labels(spec, &bounds);

    let running = crate::proxy::start(&scenario, &RunContext::new(seed), &stop)?;
    let target = running[0].addr;
    say!(
        "snag demo: echo backend {} ← proxy {target} ({}), seed {seed}",
        scenario.proxies[0].config.upstream,
        args.file.display()
    );
    say!(
        "a fresh connection every {:?} sends {PAYLOAD} B and waits for it back\n",
        args.every
    );

    let (tx, mut rx) = mpsc::channel(1024);
    let t0 = Instant::now();
    let prober = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut tick = tokio::time::interval(args.every);
            while t0.elapsed() < end && !stop.is_triggered() {
                tick.tick().await;
                let tx = tx.clone();
                let at = t0.elapsed();
                tokio::spawn(async move {
                    let _ = tx.send((at, probe(target).await)).await;
                });
            }
        }
    });

    let mut seen: Vec<(Duration, Seen)> = Vec::new();
    // A probe takes at most CONNECT_TIMEOUT + READ_TIMEOUT, so a second's row is
    // complete that long after the second ends; rows come once a second, that late.
    let settle = CONNECT_TIMEOUT + READ_TIMEOUT;
    let mut second: u64 = 1;
    say!(
        "one row a second, printed {:.1} s after its second, when all its probes are back:",
        settle.as_secs_f64()
    );
    header("time");
    loop {
        let deadline = t0 + Duration::from_secs(second) + settle;
        let got = tokio::select! {
            _ = shutdown.wait() => break,
            got = tokio::time::timeout_at(deadline, rx.recv()) => got,
        };
        match got {
            Ok(Some(p)) => seen.push(p),
            Ok(None) => break,
            Err(_) => {
                let from = Duration::from_secs(second - 1);
                let row = in_window(&seen, from, from + Duration::from_secs(1));
                let phase = bounds
                    .iter()
                    .rposition(|b| *b <= from)
                    .unwrap_or(0)
                    .min(labels.len() - 1);
                say!("{}  {}", line(&format!("{second} s"), &row), labels[phase]);
                second += 1;
            }
        }
    }
    prober.await.context("prober failed")?;
    stop.trigger();

    say!("\nby phase (each probe counted in the phase it started in):");
    header("phase");
    for (i, label) in labels.iter().enumerate() {
        let row = in_window(&seen, bounds[i], bounds[i + 1]);
        let span = format!(
            "{:.0}–{:.0} s",
            bounds[i].as_secs_f64(),
            bounds[i + 1].as_secs_f64()
        );
        say!("{}  {label}", line(&span, &row));
    }
    Ok(())
}

const LABEL: usize = 11;

fn header(first: &str) {
    say!(
        "{first:>LABEL$}  {:>6}  {:>5}  {:>8}  {:>7}  {:>7}  {:>6}  {:>5}  faults on",
        "probes",
        "ok",
        "p50 rtt",
        "refused",
        "timeout",
        "reset",
        "short"
    );
}

/// What the probes that started in `[from, to)` saw.
fn in_window(seen: &[(Duration, Seen)], from: Duration, to: Duration) -> Vec<Seen> {
    seen.iter()
        .filter(|(at, _)| *at >= from && *at < to)
        .map(|s| s.1)
        .collect()
}

fn line(label: &str, row: &[Seen]) -> String {
    let count = |want: Seen| row.iter().filter(|s| **s == want).count();
    let mut rtts: Vec<Duration> = row
        .iter()
        .filter_map(|s| if let Seen::Ok(d) = s { Some(*d) } else { None })
        .collect();
    rtts.sort();
    let p50 = rtts.get(rtts.len() / 2).map_or("–".to_string(), |d| {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    });
    format!(
        "{label:>LABEL$}  {:>6}  {:>5}  {p50:>8}  {:>7}  {:>7}  {:>6}  {:>5}",
        row.len(),
        rtts.len(),
        count(Seen::Refused),
        count(Seen::ConnectTimeout) + count(Seen::Silent),
        count(Seen::Reset),
        count(Seen::Short),
    )
}

/// The faults on during each phase, by replaying the timeline.
fn phase_labels(spec: &file::ProxySpec, bounds: &[Duration]) -> Vec<String> {
    let mut on: Vec<String> = spec.config.faults.iter().map(describe).collect();
    let mut names: Vec<String> = spec.config.faults.iter().map(|f| f.name.clone()).collect();
    let mut labels = Vec::new();
    for window in bounds.windows(2) {
        for change in spec.timeline.iter().filter(|c| c.at == window[0]) {
            match &change.action {
                Action::Add(f) => {
                    names.push(f.name.clone());
                    on.push(describe(f));
                }
                Action::Remove(n) => {
                    if let Some(i) = names.iter().position(|m| m == n) {
                        names.remove(i);
                        on.remove(i);
                    }
                }
                Action::Drain(d) => {
                    names.push("(drain)".into());
                    on.push(format!("drain {:?}", d.mode).to_lowercase());
                }
                Action::Undrain => {
                    if let Some(i) = names.iter().position(|m| m == "(drain)") {
                        names.remove(i);
                        on.remove(i);
                    }
                }
            }
        }
        labels.push(if on.is_empty() {
            "(none)".to_string()
        } else {
            on.join(", ")
        });
    }
    labels
}

fn describe(f: &crate::fault::Fault) -> String {
    let toxicity = if f.toxicity < 1.0 {
        format!(" at toxicity {}", f.toxicity)
    } else {
        String::new()
    };
    if f.kind.is_listener() {
        format!("{}{toxicity}", f.kind.type_name())
    } else {
        format!("{} {}{toxicity}", f.kind.type_name(), f.stream)
    }
}

async fn probe(target: SocketAddr) -> Seen {
    let started = Instant::now();
    let mut stream = match timeout(CONNECT_TIMEOUT, TcpStream::connect(target)).await {
        Err(_) => return Seen::ConnectTimeout,
        Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionRefused => return Seen::Refused,
        Ok(Err(_)) => return Seen::Reset,
        Ok(Ok(s)) => s,
    };
    let _ = stream.set_nodelay(true);
    let payload = [0x5a; PAYLOAD];
    if let Err(e) = stream.write_all(&payload).await {
        return kind_of(&e);
    }
    let mut got = 0;
    let mut buf = [0; PAYLOAD];
    while got < PAYLOAD {
        match timeout(READ_TIMEOUT, stream.read(&mut buf[got..])).await {
            Err(_) => return Seen::Silent,
            Ok(Ok(0)) => return Seen::Short,
            Ok(Ok(n)) => got += n,
            Ok(Err(e)) => return kind_of(&e),
        }
    }
    Seen::Ok(started.elapsed())
}

fn kind_of(e: &io::Error) -> Seen {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => Seen::Refused,
        io::ErrorKind::TimedOut => Seen::Silent,
        _ => Seen::Reset,
    }
}
