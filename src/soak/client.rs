//! One soak connection's life: connect, rounds at a random pace, each reply checked
//! byte for byte at its offset; reconnect when a fault or a drain ends it.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rand::RngExt;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::Tally;
use crate::shutdown::Shutdown;

/// Bytes in the block every stream is cut from.
pub const BLOCK: usize = 1 << 20;

/// The block every stream is cut from.
pub fn block(seed: u64) -> Vec<u8> {
    let mut rng = crate::seed::rng(seed, &[b"soak block"]);
    let mut block = vec![0; BLOCK];
    rng.fill(&mut block[..]);
    block
}

/// What one client needs.
pub struct Client {
    pub addr: SocketAddr,
    pub index: u64,
    pub http: bool,
    /// Every round must succeed (the clean proxies).
    pub clean: bool,
    pub tally: Arc<[Tally; 4]>,
    pub which: usize,
    pub block: Arc<Vec<u8>>,
    pub mean_pause: Duration,
    pub start_after: Duration,
    pub seed: u64,
}

/// How a connection ended.
enum End {
    /// The load stopped.
    Stop,
    /// Reconnect.
    Again,
}

impl Client {
    fn tally(&self) -> &Tally {
        &self.tally[self.which]
    }

    /// The stream's bytes from `offset` into `into`; each connection (`generation`)
    /// starts at its own place in the block.
    fn fill(&self, generation: u64, offset: u64, into: &mut [u8]) {
        let start = (self.index * 7919 + generation * 104_729) % BLOCK as u64;
        let mut at = ((start + offset) % BLOCK as u64) as usize;
        let mut done = 0;
        while done < into.len() {
            let take = (into.len() - done).min(BLOCK - at);
            into[done..done + take].copy_from_slice(&self.block[at..at + take]);
            done += take;
            at = 0;
        }
    }

    fn pause(&self, rng: &mut impl rand::Rng) -> Duration {
        self.mean_pause.mul_f64(rng.random_range(0.5..1.5))
    }

    pub async fn run(self, stop: Shutdown) {
        tokio::select! {
            _ = stop.wait() => return,
            _ = tokio::time::sleep(self.start_after) => {}
        }
        let mut rng = crate::seed::rng(self.seed, &[b"soak client", &self.index.to_le_bytes()]);
        for generation in 0.. {
            let connected = tokio::select! {
                _ = stop.wait() => return,
                c = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(self.addr)) => c,
            };
            let stream = match connected {
                Ok(Ok(stream)) => stream,
                _ => {
                    // A drain closed the listener: come back shortly.
                    Tally::add(&self.tally().refused, 1);
                    tokio::select! {
                        _ = stop.wait() => return,
                        _ = tokio::time::sleep(Duration::from_millis(100 + rng.random_range(0..200))) => {}
                    }
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            Tally::add(&self.tally().connections, 1);
            let end = if self.http {
                self.http_rounds(stream, generation, &mut rng, &stop).await
            } else {
                self.tcp_rounds(stream, generation, &mut rng, &stop).await
            };
            if let End::Stop = end {
                return;
            }
        }
    }

    /// Echo rounds on one TCP connection, until the load stops or the connection ends.
    async fn tcp_rounds(
        &self,
        mut stream: TcpStream,
        generation: u64,
        rng: &mut impl rand::Rng,
        stop: &Shutdown,
    ) -> End {
        let mut offset = 0u64;
        let mut out = Vec::new();
        let mut back = vec![0u8; 4096];
        let mut expected = Vec::new();
        loop {
            tokio::select! {
                _ = stop.wait() => return End::Stop,
                _ = tokio::time::sleep(self.pause(rng)) => {}
            }
            let len = rng.random_range(256..=4096usize);
            out.resize(len, 0);
            self.fill(generation, offset, &mut out);
            let round = async {
                stream.write_all(&out).await?;
                let mut got = 0;
                while got < len {
                    let n = stream.read(&mut back[..len - got]).await?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    expected.resize(n, 0);
                    self.fill(generation, offset + got as u64, &mut expected);
                    if back[..n] != expected[..] {
                        Tally::add(&self.tally().corrupted, 1);
                        return Err(std::io::ErrorKind::InvalidData.into());
                    }
                    Tally::add(&self.tally().verified, n as u64);
                    got += n;
                }
                std::io::Result::Ok(())
            };
            let done = tokio::select! {
                _ = stop.wait() => return End::Stop,
                done = tokio::time::timeout(Duration::from_secs(30), round) => done,
            };
            match done {
                Ok(Ok(())) => {
                    Tally::add(&self.tally().ok, 1);
                    offset += len as u64;
                }
                Ok(Err(err)) if err.kind() == std::io::ErrorKind::InvalidData => return End::Again,
                _ if self.clean => {
                    Tally::add(&self.tally().failed, 1);
                    return End::Again;
                }
                _ => {
                    Tally::add(&self.tally().ended, 1);
                    return End::Again;
                }
            }
        }
    }

    /// POST rounds on one HTTP/1.1 connection (the backend echoes the body).
    async fn http_rounds(
        &self,
        stream: TcpStream,
        generation: u64,
        rng: &mut impl rand::Rng,
        stop: &Shutdown,
    ) -> End {
        let Ok((mut sender, connection)) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await
        else {
            return End::Again;
        };
        let driving = tokio::spawn(connection);
        let mut offset = 0u64;
        let end = loop {
            tokio::select! {
                _ = stop.wait() => break End::Stop,
                _ = tokio::time::sleep(self.pause(rng)) => {}
            }
            if sender.ready().await.is_err() {
                // Closed between requests (a drain, Connection: close): not a round.
                break End::Again;
            }
            let len = rng.random_range(64..=2048usize);
            let mut body = vec![0; len];
            self.fill(generation, offset, &mut body);
            offset += len as u64;
            let request = hyper::Request::post("/echo")
                .header("host", "soak")
                .body(Full::new(Bytes::from(body.clone())))
                .expect("a valid request");
            let round = async {
                let response = sender
                    .send_request(request)
                    .await
                    .map_err(|e| (Stage::Head, e))?;
                let status = response.status();
                let got = response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| (Stage::Body, e))?
                    .to_bytes();
                Ok::<_, (Stage, hyper::Error)>((status, got))
            };
            let done = tokio::select! {
                _ = stop.wait() => break End::Stop,
                done = tokio::time::timeout(Duration::from_secs(30), round) => done,
            };
            match done {
                Ok(Ok((status, got))) if status == 200 && got[..] == body[..] => {
                    Tally::add(&self.tally().ok, 1);
                    Tally::add(&self.tally().verified, len as u64);
                }
                Ok(Ok((status, got))) if self.clean => {
                    tracing::warn!(%status, sent = len, got = got.len(), "soak: a clean answer differed");
                    Tally::add(&self.tally().failed, 1);
                    break End::Again;
                }
                // A fault's answer (503, a broken body) on a connection that goes on.
                Ok(Ok(_)) => Tally::add(&self.tally().ended, 1),
                // A request the drain's close crossed: nothing came back, nothing
                // was half-delivered. A close with the request unread in snag's
                // socket is an RST (the keep-alive race, wider on a busy machine).
                // Any other failure on a clean proxy counts.
                Ok(Err((Stage::Head, err))) if self.clean && crossed_by_close(&err) => {
                    Tally::add(&self.tally().ended, 1);
                    break End::Again;
                }
                failed if self.clean => {
                    let why = match failed {
                        Ok(Err((stage, err))) => format!("{stage:?}: {err:?}"),
                        _ => "no answer within 30 s".into(),
                    };
                    tracing::warn!(%why, "soak: a clean request failed");
                    Tally::add(&self.tally().failed, 1);
                    break End::Again;
                }
                _ => {
                    Tally::add(&self.tally().ended, 1);
                    break End::Again;
                }
            }
        };
        drop(sender);
        driving.abort();
        end
    }
}

/// Where an HTTP round failed: before the response head, or in its body.
#[derive(Debug, Clone, Copy)]
enum Stage {
    Head,
    Body,
}

/// Whether `err` is a connection closed under a request before any answer: the
/// close of a drain crossing it, not a broken relay.
fn crossed_by_close(err: &hyper::Error) -> bool {
    use std::error::Error as _;
    let reset = err
        .source()
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            )
        });
    err.is_incomplete_message() || err.is_canceled() || reset
}
