//! A client of the control API (and of the lab backend's JSON routes): `snag ctl`
//! and a case driving parts it did not start both call through it. One connection,
//! kept alive and made again when it breaks, so a case sampling stats ten times a
//! second leaves no trail of TIME_WAIT sockets on the machine it measures.

use std::net::SocketAddr;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, client::conn::http1::SendRequest};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::{net::TcpStream, sync::Mutex};

/// The API at one address.
#[derive(Debug)]
pub struct Client {
    addr: SocketAddr,
    token: Option<String>,
    conn: Mutex<Option<SendRequest<Full<Bytes>>>>,
}

impl Client {
    /// The API at `addr`, with `token` sent as a bearer token when there is one.
    pub fn new(addr: SocketAddr, token: Option<String>) -> Client {
        Client {
            addr,
            token,
            conn: Mutex::new(None),
        }
    }

    /// Where it calls.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// One request; its answer as JSON. `Err` carries the API's own error text and
    /// the path. A kept connection the server closed meanwhile is made again once.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let bytes = self.fetch(method, path, body).await?;
        Ok(if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        })
    }

    /// [`Client::call`], its answer as bytes.
    pub async fn fetch(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Bytes> {
        let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let mut conn = self.conn.lock().await;
        let mut fresh = false;
        let res = loop {
            let sender = match conn.as_mut() {
                Some(sender) if sender.is_ready() => sender,
                _ => {
                    fresh = true;
                    conn.insert(self.connect().await?)
                }
            };
            match sender
                .send_request(self.request(&method, path, body.clone())?)
                .await
            {
                Ok(res) => break res,
                // Closed between two calls (an idle timeout): once more, on a new
                // one — unless a change may have reached the server already.
                Err(e) if !fresh && (method == Method::GET || e.is_canceled()) => *conn = None,
                Err(e) => {
                    *conn = None;
                    return Err(e).with_context(|| format!("{path} at {}", self.addr));
                }
            }
        };
        drop(conn);
        let status = res.status();
        let bytes = res
            .into_body()
            .collect()
            .await
            .with_context(|| format!("{path} at {}: the answer broke off", self.addr))?
            .to_bytes();
        if !status.is_success() {
            let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let why = value["error"].as_str().map_or_else(
                || String::from_utf8_lossy(&bytes).trim().to_string(),
                String::from,
            );
            bail!("{path}: {why} ({status})");
        }
        Ok(bytes)
    }

    async fn connect(&self) -> anyhow::Result<SendRequest<Full<Bytes>>> {
        let stream = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("could not connect to {}", self.addr))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(sender)
    }

    fn request(
        &self,
        method: &Method,
        path: &str,
        body: Bytes,
    ) -> anyhow::Result<Request<Full<Bytes>>> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header("host", self.addr.to_string())
            .header("user-agent", concat!("snag/", env!("CARGO_PKG_VERSION")))
            .header("content-type", "application/json");
        if let Some(token) = &self.token {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        Ok(req.body(Full::new(body))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers `answers` requests per connection, then closes it, and
    /// counts connections.
    async fn server(
        per_conn: usize,
    ) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use hyper::{Response, service::service_fn};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = conns.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        async move {
                            let mut res = Response::new(Full::new(Bytes::from(format!(
                                "{{\"path\":\"{}\",\"auth\":{:?}}}",
                                req.uri().path(),
                                req.headers()
                                    .get("authorization")
                                    .map(|v| v.to_str().unwrap().to_string())
                                    .unwrap_or_default()
                            ))));
                            if req.uri().path() == "/missing" {
                                *res.status_mut() = hyper::StatusCode::NOT_FOUND;
                                *res.body_mut() =
                                    Full::new(Bytes::from("{\"error\":\"proxy not found\"}"));
                            }
                            if n >= per_conn {
                                res.headers_mut()
                                    .insert("connection", "close".parse().unwrap());
                            }
                            Ok::<_, std::convert::Infallible>(res)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, conns)
    }

    #[tokio::test]
    async fn calls_share_one_connection_and_carry_the_token() {
        let (addr, conns) = server(usize::MAX).await;
        let client = Client::new(addr, Some("t0k".into()));
        for i in 0..5 {
            let v = client
                .call(Method::GET, &format!("/p{i}"), None)
                .await
                .unwrap();
            assert_eq!(v["path"], format!("/p{i}"));
            assert_eq!(v["auth"], "Bearer t0k");
        }
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_closed_connection_is_made_again() {
        let (addr, conns) = server(2).await;
        let client = Client::new(addr, None);
        for i in 0..6 {
            let v = client
                .call(Method::GET, &format!("/p{i}"), None)
                .await
                .unwrap();
            assert_eq!(v["path"], format!("/p{i}"));
        }
        assert_eq!(conns.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn an_error_says_the_path_and_the_api_s_words() {
        let (addr, _) = server(usize::MAX).await;
        let client = Client::new(addr, None);
        let err = client
            .call(Method::GET, "/missing", None)
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "/missing: proxy not found (404 Not Found)");
        let nobody = Client::new("127.0.0.1:1".parse().unwrap(), None);
        let err = nobody
            .call(Method::GET, "/proxies", None)
            .await
            .unwrap_err();
        assert_eq!(err.to_string(), "could not connect to 127.0.0.1:1");
    }
}
