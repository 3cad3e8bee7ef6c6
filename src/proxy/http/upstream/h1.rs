//! HTTP/1.1 on a pooled upstream connection, snag's own: the request head written in
//! one piece, the response head parsed in place (its header values share the read
//! buffer), and the response body's framing — a length, chunks with their trailers,
//! or the connection's close (RFC 9112 §6).
//!
//! hyper's client spent about 14,000 instructions per request on this (its dispatch
//! channel, its parse, its body channel); this is the parsing half, without IO.

mod chunked;

pub use self::chunked::{Chunked, Piece};

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use hyper::{
    HeaderMap, Method, StatusCode, Version,
    header::{self, HeaderName, HeaderValue},
    http::request,
};

use crate::proxy::http::tokens;

/// Headers a response head may carry (hyper's client allows 100).
const MAX_HEADERS: usize = 100;
/// The longest response head, or chunk-size line or trailer section, accepted.
pub(super) const MAX_HEAD: usize = 64 * 1024;

/// What the upstream sent that is not HTTP/1.1, or not what snag can relay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the upstream's response head is malformed: {0}")]
    Head(String),
    #[error("the upstream's response head is longer than {MAX_HEAD} bytes")]
    HeadTooLong,
    #[error("the upstream's response has more than {MAX_HEADERS} headers")]
    TooManyHeaders,
    #[error("the upstream's Content-Length is not one number: {0:?}")]
    Length(String),
    #[error("the upstream answered 101 Switching Protocols, which snag does not relay")]
    Upgrade,
    #[error("the upstream's chunked body is malformed: {0}")]
    Chunk(&'static str),
}

/// How a response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body: HEAD, 1xx, 204, 304 (RFC 9112 §6.3 rules 1 and 2).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked, then trailers.
    Chunked,
    /// Until the upstream closes the connection; the connection is not reused.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
}

/// Parses a response head at the start of `buf`, for a request with `method`.
/// `Ok(None)`: incomplete, read more. An interim (1xx) response is consumed and
/// skipped, as a client that sent no `Expect` has no use for it.
pub fn parse_head(buf: &mut BytesMut, method: &Method) -> Result<Option<Head>, Error> {
    loop {
        // Left uninitialised: httparse writes the slots it fills, and zeroing all
        // 100 cost more than parsing a usual head.
        let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut response,
            buf,
            &mut slots,
        );
        let len = match parsed {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
                return Err(Error::HeadTooLong);
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(Error::TooManyHeaders),
            Err(e) => return Err(Error::Head(e.to_string())),
        };
        let code = response.code.expect("a complete head has a status");
        let status = StatusCode::from_u16(code)
            .map_err(|_| Error::Head(format!("status {code} is out of range")))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(Error::Upgrade);
        }
        if status.is_informational() {
            buf.advance(len);
            continue;
        }
        let version = match response.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        // Offsets first: the head's bytes become shared before the values are cut.
        // The framing is read from them too, before the map is made: a lookup in
        // it hashes the name.
        let spans = spans(response.headers, buf).map_err(Error::Head)?;
        let fields_of = Values {
            spans: &spans,
            from: buf,
        };
        let framing = framing(status, method, fields_of)?;
        let keep_alive = framing != Framing::Close && keeps_alive(version, fields_of);
        let headers = fields(spans, buf.split_to(len).freeze()).map_err(Error::Head)?;
        return Ok(Some(Head {
            status,
            version,
            headers,
            framing,
            keep_alive,
        }));
    }
}

/// The fields of a head as parsed, before they are put in a map.
#[derive(Clone, Copy)]
struct Values<'a> {
    spans: &'a [Span],
    from: &'a [u8],
}

impl<'a> Values<'a> {
    /// Whether a field is named `name`.
    fn has(self, name: &HeaderName) -> bool {
        self.spans.iter().any(|(n, _, _)| n == name)
    }

    /// The values of the fields named `name`, in order, as text; `None` for one that
    /// is not visible ASCII (where [`HeaderValue::to_str`] fails).
    fn texts(self, name: &'a HeaderName) -> impl DoubleEndedIterator<Item = Option<&'a str>> + 'a {
        self.spans
            .iter()
            .filter(move |(n, _, _)| n == name)
            .map(move |&(_, start, end)| {
                let value = &self.from[start..end];
                value
                    .iter()
                    .all(|&b| (32..127).contains(&b) || b == b'\t')
                    .then(|| std::str::from_utf8(value).ok())
                    .flatten()
            })
    }
}

/// RFC 9112 §6.3: how the body of a response to `method` with `status` ends.
fn framing(status: StatusCode, method: &Method, fields: Values) -> Result<Framing, Error> {
    if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok(Framing::Empty);
    }
    if fields.has(&header::TRANSFER_ENCODING) {
        // Chunked only if it is the final coding; otherwise the close ends it.
        let last = fields
            .texts(&header::TRANSFER_ENCODING)
            .flatten()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .rfind(|t| !t.is_empty());
        return Ok(match last {
            Some(t) if t.eq_ignore_ascii_case("chunked") => Framing::Chunked,
            _ => Framing::Close,
        });
    }
    let mut length = None;
    for text in fields.texts(&header::CONTENT_LENGTH) {
        let text = text.unwrap_or_default();
        for part in text.split(',') {
            let part = part.trim();
            let n: u64 = (!part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
                .then(|| part.parse().ok())
                .flatten()
                .ok_or_else(|| Error::Length(text.to_string()))?;
            if length.is_some_and(|l| l != n) {
                return Err(Error::Length(text.to_string()));
            }
            length = Some(n);
        }
    }
    Ok(length.map_or(Framing::Close, Framing::Length))
}

/// Whether the connection stays open after the response: HTTP/1.1 unless it says
/// `close`, HTTP/1.0 only if it says `keep-alive`.
fn keeps_alive(version: Version, fields: Values) -> bool {
    let says = |option: &str| {
        tokens(fields.texts(&header::CONNECTION).flatten()).any(|t| t.eq_ignore_ascii_case(option))
    };
    if version == Version::HTTP_10 {
        says("keep-alive")
    } else {
        !says("close")
    }
}

/// How the request body goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sending {
    /// None: nothing follows the head.
    Nothing,
    /// The bytes as they come: the head has a Content-Length.
    Length,
    /// In chunks, the head says so.
    Chunked,
}

/// Writes the request head in origin form to `out`: how the body goes follows from
/// its headers and whether it has one (`body_ends_now`).
pub fn encode_request(parts: &request::Parts, body_ends_now: bool, out: &mut Vec<u8>) -> Sending {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .as_bytes(),
    );
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let sending = if parts.headers.contains_key(header::CONTENT_LENGTH) {
        Sending::Length
    } else if body_ends_now {
        Sending::Nothing
    } else {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        Sending::Chunked
    };
    out.extend_from_slice(b"\r\n");
    sending
}

/// Writes one chunk of a chunked request body.
pub fn encode_chunk(data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Ends a chunked request body, with `trailers` if any.
pub fn encode_last_chunk(trailers: Option<&HeaderMap>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"0\r\n");
    for (name, value) in trailers.into_iter().flatten() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A parsed field: its name, and where its value is in the bytes it was parsed from.
type Span = (HeaderName, usize, usize);

/// The names of the fields httparse found in `from`, and their values' places.
fn spans(parsed: &[httparse::Header], from: &[u8]) -> Result<Vec<Span>, String> {
    let base = from.as_ptr() as usize;
    let mut spans = Vec::with_capacity(parsed.len());
    for h in parsed {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| format!("bad header name {:?}", h.name))?;
        let start = h.value.as_ptr() as usize - base;
        spans.push((name, start, start + h.value.len()));
    }
    Ok(spans)
}

/// The fields, their values sharing `bytes` (what [`spans`] read them from).
fn fields(spans: Vec<Span>, bytes: Bytes) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::with_capacity(spans.len());
    for (name, start, end) in spans {
        // httparse let through only bytes a field value may hold.
        let value = HeaderValue::from_maybe_shared(bytes.slice(start..end))
            .map_err(|_| format!("bad value of header {name}"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8], method: Method) -> (Result<Option<Head>, Error>, BytesMut) {
        let mut buf = BytesMut::from(bytes);
        (parse_head(&mut buf, &method), buf)
    }

    #[test]
    fn a_head_is_parsed_in_place_and_its_framing_known() {
        let wire = b"HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Length: 5\r\nConnection: keep-alive\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello";
        let (head, rest) = parse(wire, Method::GET);
        let head = head.unwrap().unwrap();
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.version, Version::HTTP_11);
        assert_eq!(head.framing, Framing::Length(5));
        assert!(head.keep_alive);
        assert_eq!(head.headers["server"], "nginx");
        let a: Vec<_> = head.headers.get_all("x-a").iter().collect();
        assert_eq!(a, ["1", "2"]);
        assert_eq!(&rest[..], b"hello", "the body stays in the buffer");
        // However the bytes are cut, a head is complete only once it all came.
        for cut in 1..wire.len() - 5 {
            let (head, rest) = parse(&wire[..cut], Method::GET);
            assert!(head.unwrap().is_none(), "cut {cut}");
            assert_eq!(rest.len(), cut);
        }
    }

    #[test]
    fn the_body_ends_as_rfc_9112_says() {
        let framing = |head: &str, method: Method| {
            let wire = format!("{head}\r\n\r\n");
            let (head, _) = parse(wire.as_bytes(), method);
            head.map(|h| h.map(|h| (h.framing, h.keep_alive)))
        };
        let ok = |h: &str| framing(h, Method::GET).unwrap().unwrap();
        assert_eq!(ok("HTTP/1.1 204 No Content"), (Framing::Empty, true));
        assert_eq!(
            ok("HTTP/1.1 304 Not Modified\r\ncontent-length: 9"),
            (Framing::Empty, true)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 9", Method::HEAD)
                .unwrap()
                .unwrap(),
            (Framing::Empty, true)
        );
        assert_eq!(
            ok("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked"),
            (Framing::Chunked, true)
        );
        assert_eq!(
            ok("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 4"),
            (Framing::Chunked, true),
            "Transfer-Encoding wins"
        );
        assert_eq!(
            ok("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip"),
            (Framing::Close, false)
        );
        assert_eq!(ok("HTTP/1.1 200 OK"), (Framing::Close, false));
        assert_eq!(
            ok("HTTP/1.1 200 OK\r\ncontent-length: 3, 3"),
            (Framing::Length(3), true)
        );
        assert_eq!(
            ok("HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close"),
            (Framing::Length(0), false)
        );
        assert_eq!(
            ok("HTTP/1.0 200 OK\r\ncontent-length: 2"),
            (Framing::Length(2), false)
        );
        assert_eq!(
            ok("HTTP/1.0 200 OK\r\ncontent-length: 2\r\nconnection: Keep-Alive"),
            (Framing::Length(2), true)
        );
        // A value that is not visible ASCII is no length, and names no coding.
        let (head, _) = parse(
            b"HTTP/1.1 200 OK\r\ncontent-length: 5\xff\r\n\r\n",
            Method::GET,
        );
        assert_eq!(head.unwrap_err(), Error::Length(String::new()));
        let wire =
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: g\xffzip\r\n\r\n";
        let (head, _) = parse(wire, Method::GET);
        assert_eq!(head.unwrap().unwrap().framing, Framing::Chunked);
        for bad in ["3, 4", "-1", "0x10", "", "1 2", "99999999999999999999999"] {
            let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}");
            assert_eq!(
                framing(&head, Method::GET).unwrap_err(),
                Error::Length(bad.to_string()),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn interim_responses_are_skipped_and_an_upgrade_refused() {
        let wire = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n";
        let (head, rest) = parse(wire, Method::POST);
        assert_eq!(head.unwrap().unwrap().status, StatusCode::CREATED);
        assert!(rest.is_empty());
        let (head, _) = parse(b"HTTP/1.1 101 Switching Protocols\r\n\r\n", Method::GET);
        assert_eq!(head.unwrap_err(), Error::Upgrade);
    }

    #[test]
    fn a_malformed_head_says_why() {
        let err = |wire: &[u8]| parse(wire, Method::GET).0.unwrap_err().to_string();
        assert!(err(b"HTTP/1.1 2000 OK\r\n\r\n").contains("malformed"));
        assert!(err(b"SSH-2.0-OpenSSH\r\n\r\n").contains("malformed"));
        assert!(err(b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n").contains("malformed"));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: 1\r\n")).collect();
        assert!(
            err(format!("HTTP/1.1 200 OK\r\n{many}\r\n").as_bytes())
                .contains("more than 100 headers")
        );
        let long = vec![b'a'; MAX_HEAD + 1];
        let mut wire = b"HTTP/1.1 200 OK\r\nx: ".to_vec();
        wire.extend(long);
        assert!(err(&wire).contains("longer than"));
    }

    #[test]
    fn a_request_head_says_how_its_body_goes() {
        let mut parts = hyper::Request::post("http://a/p?q=1")
            .header("host", "a")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let mut out = Vec::new();
        assert_eq!(encode_request(&parts, true, &mut out), Sending::Nothing);
        assert_eq!(out, b"POST /p?q=1 HTTP/1.1\r\nhost: a\r\n\r\n");
        out.clear();
        assert_eq!(encode_request(&parts, false, &mut out), Sending::Chunked);
        assert_eq!(
            out,
            b"POST /p?q=1 HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        parts
            .headers
            .insert("content-length", HeaderValue::from_static("3"));
        out.clear();
        assert_eq!(encode_request(&parts, false, &mut out), Sending::Length);
        out.clear();
        encode_chunk(b"hello", &mut out);
        encode_chunk(b"", &mut out);
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        encode_last_chunk(Some(&trailers), &mut out);
        assert_eq!(out, b"5\r\nhello\r\n0\r\ngrpc-status: 0\r\n\r\n");
    }
}
