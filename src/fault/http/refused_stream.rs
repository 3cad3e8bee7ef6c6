//! `refused_stream`: refuse new HTTP/2 streams with RST_STREAM(REFUSED_STREAM), the
//! refusal RFC 9113 §8.7 makes safe to retry: the stream was not processed.

use hyper::{Version, http::request};
use serde::{Deserialize, Serialize};

use super::{Exchange, HttpFault, Reply};

/// `refused_stream` attributes: none; toxicity and scope choose the streams.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusedStream {}

impl HttpFault for RefusedStream {
    fn type_name(&self) -> &'static str {
        "refused_stream"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    /// HTTP/1.1 has no stream to refuse: its requests pass.
    fn request(&self, req: &request::Parts, _cx: &mut Exchange) -> Option<Reply> {
        (req.version == Version::HTTP_2).then_some(Reply::Refuse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::exchange;

    #[test]
    fn refuses_http2_streams_and_lets_http11_pass() {
        let h2 = hyper::Request::get("/")
            .version(Version::HTTP_2)
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let h1 = hyper::Request::get("/").body(()).unwrap().into_parts().0;
        assert!(matches!(
            RefusedStream {}.request(&h2, &mut exchange()),
            Some(Reply::Refuse)
        ));
        assert!(RefusedStream {}.request(&h1, &mut exchange()).is_none());
    }
}
