//! `http_status`: answer in the backend's place, without contacting it.

use std::collections::BTreeMap;

use bytes::Bytes;
use hyper::{
    StatusCode,
    header::{HeaderName, HeaderValue},
    http::request,
};
use serde::{Deserialize, Serialize};

use super::{Exchange, HttpFault, Reply};

/// `http_status` attributes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpStatus {
    /// The status code, 100–599.
    pub status: u16,
    /// The response body.
    pub body: String,
    /// Extra response headers.
    pub headers: BTreeMap<String, String>,
}

impl Default for HttpStatus {
    fn default() -> Self {
        HttpStatus {
            status: 503,
            body: String::new(),
            headers: BTreeMap::new(),
        }
    }
}

impl HttpFault for HttpStatus {
    fn type_name(&self) -> &'static str {
        "http_status"
    }

    fn attributes(&self) -> serde_json::Value {
        super::json(self)
    }

    /// RFC 9110 defines the classes 1xx to 5xx only, and hyper would send 600–999
    /// as they are; a header that cannot be sent is named rather than dropped.
    fn validate(&self) -> Result<(), String> {
        if !(100..=599).contains(&self.status) {
            return Err(format!(
                "status {} is not an HTTP status (100–599)",
                self.status
            ));
        }
        for (name, value) in &self.headers {
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("headers: `{name}` is not a header name"))?;
            HeaderValue::from_str(value)
                .map_err(|_| format!("headers: the value of `{name}` cannot be sent"))?;
        }
        Ok(())
    }

    fn request(&self, _req: &request::Parts, _cx: &mut Exchange) -> Option<Reply> {
        let mut reply = hyper::Response::new(Bytes::from(self.body.clone()));
        *reply.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        for (name, value) in &self.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                reply.headers_mut().insert(n, v);
            }
        }
        Some(Reply::Answer(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::http::tests::exchange;

    fn request() -> request::Parts {
        hyper::Request::get("/x").body(()).unwrap().into_parts().0
    }

    #[test]
    fn answers_in_the_backends_place_with_its_status_body_and_headers() {
        let fault = HttpStatus {
            status: 429,
            body: "slow down".into(),
            headers: [("retry-after".to_string(), "2".to_string())].into(),
        };
        let Some(Reply::Answer(reply)) = fault.request(&request(), &mut exchange()) else {
            panic!("no answer");
        };
        assert_eq!(reply.status(), 429);
        assert_eq!(reply.headers()["retry-after"], "2");
        assert_eq!(reply.body().as_ref(), b"slow down");
    }

    #[test]
    fn statuses_outside_the_five_classes_and_unsendable_headers_are_refused() {
        for status in [99, 600, 999] {
            let fault = HttpStatus {
                status,
                ..HttpStatus::default()
            };
            assert!(fault.validate().unwrap_err().contains("100–599"));
        }
        assert!(HttpStatus::default().validate().is_ok());
        let fault = HttpStatus {
            headers: [("bad name".to_string(), "x".to_string())].into(),
            ..HttpStatus::default()
        };
        assert!(fault.validate().unwrap_err().contains("`bad name`"));
    }
}
