//! What the gRPC faults need of gRPC over HTTP/2: telling a gRPC call, the
//! length-prefixed message frame, and answers in the backend's place — trailers-only
//! (status in the head) or one message then the status in trailers.

use bytes::{BufMut, Bytes, BytesMut};
use hyper::{
    HeaderMap,
    header::{CONTENT_TYPE, HeaderValue},
    http::request,
};

/// The health check's path (grpc.health.v1); a probe by default.
pub const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// Whether a request is a gRPC call: `content-type: application/grpc[+proto…]`.
pub fn is_call(req: &request::Parts) -> bool {
    req.headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// A message in gRPC's framing: uncompressed flag, 4-byte big-endian length, bytes.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.put_slice(message);
    out.freeze()
}

/// `grpc-status` and, if not empty, `grpc-message` (percent-encoded as the
/// protocol asks), as headers.
pub fn status(code: u32, message: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("grpc-status", HeaderValue::from(code));
    if !message.is_empty() {
        let encoded = percent_encode(message);
        if let Ok(value) = HeaderValue::from_str(&encoded) {
            headers.insert("grpc-message", value);
        }
    }
    headers
}

/// An answer's head: 200 with gRPC's content type, plus `extra`.
pub fn head(body: Bytes, extra: HeaderMap) -> hyper::Response<Bytes> {
    let mut reply = hyper::Response::new(body);
    reply
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    reply.headers_mut().extend(extra);
    reply
}

/// Percent-encodes what gRPC's `grpc-message` may not carry as is: anything
/// outside printable ASCII, and `%` itself.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_statuses_and_calls_are_as_grpc_has_them() {
        assert_eq!(frame(&[0x08, 0x02]).as_ref(), [0, 0, 0, 0, 2, 0x08, 0x02]);
        let s = status(14, "down 100% – now");
        assert_eq!(s["grpc-status"], "14");
        assert_eq!(s["grpc-message"], "down 100%25 %E2%80%93 now");
        assert!(status(0, "").get("grpc-message").is_none());
        let call = hyper::Request::post("/a.B/C")
            .header("content-type", "application/grpc+proto")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let plain = hyper::Request::post("/a").body(()).unwrap().into_parts().0;
        assert!(is_call(&call) && !is_call(&plain));
    }
}
